"""`launch_training`: the train step's multi-node path. Runs components/train.py on a chief and workers as a
TFJob or a Vertex AI CustomJob, then copies what the replicas wrote into the step's outputs."""

from __future__ import annotations

import json
import logging

from components import gcp
from components.launch.job import LaunchError, TrainingJob, job_name
from components.launch.k8s import kubernetes_client
from components.launch.placement import gpu_placement
from components.launch.tfjob import TFJobLauncher, tfjob_manifest
from components.launch.vertex import VertexJobLauncher, custom_job

log = logging.getLogger(__name__)

LAUNCHERS = ("tfjob", "vertex-job")


def training_command(dataset: str, model_dir: str, backup_dir: str, *, recipe: str, epochs: int = 0,
                     batch_size: int = 0, learning_rate: float = 0.0, augmented: str = "",
                     tensorboard_dir: str = "") -> list[str]:
    """The command every replica runs: components/train.py's CLI (TF_CONFIG tells it its role)."""
    command = ["python", "-m", "components.train", "--dataset-dir", dataset, "--model-dir", model_dir,
               "--backup-dir", backup_dir, "--recipe", recipe]
    for flag, value in (("--augmented-dir", augmented), ("--epochs", epochs), ("--batch-size", batch_size),
                        ("--learning-rate", learning_rate), ("--tensorboard-dir", tensorboard_dir)):
        if value:
            command += [flag, str(value)]
    return command


def copy_tree(source: str, destination: str) -> int:
    """Copies a directory tree between local paths and gs:// (tf.io.gfile); returns the number of files."""
    import tensorflow as tf

    if not tf.io.gfile.isdir(source):
        raise LaunchError(f"The training job finished but wrote nothing to {source}")
    copied = 0
    for directory, _, files in tf.io.gfile.walk(source):
        relative = directory[len(source.rstrip("/")):].lstrip("/")
        target = "/".join(p for p in (destination.rstrip("/"), relative) if p)
        tf.io.gfile.makedirs(target)
        for name in files:
            tf.io.gfile.copy(f"{directory.rstrip('/')}/{name}", f"{target}/{name}", overwrite=True)
            copied += 1
    return copied


def launch_training(*, launcher: str, dataset_uri: str, augmented_uri: str, model_path: str, tensorboard_path: str,
                    staging_dir: str, backup_dir: str, recipe: str, epochs: int, batch_size: int,
                    learning_rate: float, image: str, workers: int, accelerator: str, gpus: int, spot: bool,
                    node_pool: str, known_accelerators: dict, kueue_queue: str, namespace: str, project: str,
                    location: str, run_id: str, task_name: str, api_client=None, vertex_client=None,
                    poll_seconds: float | None = None) -> dict:
    """Runs components/train.py on a chief + `workers` as a TFJob or a Vertex AI CustomJob and returns its
    training.json. The replicas write the model and TensorBoard logs under `staging_dir` (durable storage they
    can reach); they are then copied into the step's own output paths."""
    import tensorflow as tf

    if launcher not in LAUNCHERS:
        raise ValueError(f"launcher must be tfjob or vertex-job, got {launcher!r}")
    for uri in (dataset_uri, staging_dir, backup_dir):
        if uri.startswith(("minio://", "s3://")):
            raise ValueError(f"The training job's replicas cannot read or write {uri}: run the pipeline with a gs:// "
                             "pipeline root (or a checkpoint_root and pipeline root they can reach)")
    placement = gpu_placement(accelerator, gpus, known_accelerators=known_accelerators, spot=spot,
                              node_pool=node_pool)
    staged_model, staged_logs = f"{staging_dir.rstrip('/')}/model", f"{staging_dir.rstrip('/')}/tensorboard"
    command = training_command(dataset_uri, staged_model, backup_dir, recipe=recipe, epochs=epochs,
                               batch_size=batch_size, learning_rate=learning_rate, augmented=augmented_uri,
                               tensorboard_dir=staged_logs)
    job = TrainingJob(name=job_name("train", run_id, task_name), image=image, command=command, workers=workers,
                      placement=placement, kueue_queue=kueue_queue,
                      labels={"pipeline-run": job_name("", run_id)[:63], "pipeline-task": job_name("", task_name)})
    polling = {"poll_seconds": poll_seconds} if poll_seconds else {}
    if launcher == "tfjob":
        outcome = TFJobLauncher(api_client or kubernetes_client(), namespace, **polling).run(
            tfjob_manifest(job, namespace))
    else:
        if not project:
            raise ValueError("launcher=vertex-job needs the Google Cloud project")
        client = vertex_client or gcp.job_client(location)
        outcome = VertexJobLauncher(client, project, location, **polling).run(
            custom_job(job, vertex_accelerators=known_accelerators, spot=spot))
    log.info("launch: %s %s after %.0fs", outcome.name, outcome.state, outcome.seconds)
    copy_tree(staged_model, model_path)
    if tf.io.gfile.isdir(staged_logs):
        copy_tree(staged_logs, tensorboard_path)
    with tf.io.gfile.GFile(f"{model_path.rstrip('/')}/training.json") as f:
        return json.load(f)
