"""`launch_training`: the train step's multi-node path. Runs the training CLI (components/train/) on a chief and
workers as a Kubeflow Trainer v2 TrainJob, a JobSet, a (legacy) Kubeflow TFJob or a Vertex AI CustomJob, then
copies what the replicas wrote into the step's outputs.

What is trained is one `TrainSettings` (the same value the single-pod path trains with; each replica's command
is `settings.command()`); where it runs is one `LaunchSettings`. `job_manifests` is the one place a Kubernetes
launcher's manifests are built: the launch and the dry run (`python -m components.launch --dry-run`) both use it."""

from __future__ import annotations

import dataclasses
import json
import logging

from components import gcp
from components.dataio import storage
from components.gcp.accelerators import ACCELERATORS
from components.launch import local_ssd
from components.launch.frameworks import DEFAULT_FRAMEWORK, check_framework, legacy_launchers, setup
from components.launch.job import LaunchError, TrainingJob, job_name
from components.launch.jobset import JobSetLauncher, jobset_manifest, max_name_length
from components.launch.k8s import kubernetes_client
from components.launch.network import check_network
from components.launch.placement import SharedGpu, gpu_placement, placement_from_task_config
from components.launch.pytorchjob import PyTorchJobLauncher, pytorchjob_manifest
from components.launch.tfjob import TFJobLauncher, tfjob_manifest
from components.launch.trainjob import (RUNTIME_NAME, SHIPPED_RUNTIMES, TrainJobLauncher, runtime_for,
                                        runtime_manifest, runtime_network, trainjob_manifest)
from components.launch.vertex import VertexJobLauncher, custom_job
from components.train import staging
from components.train.settings import TrainSettings

log = logging.getLogger(__name__)

# trainjob: Kubeflow Trainer v2 (what a Kubeflow install has); jobset: the JobSet beneath it, for clusters with
# JobSet but no Trainer v2; tfjob and pytorchjob: Kubeflow Training Operator v1 (legacy); vertex-job: Vertex AI.
KUBERNETES_LAUNCHERS = {"trainjob": TrainJobLauncher, "jobset": JobSetLauncher, "tfjob": TFJobLauncher,
                        "pytorchjob": PyTorchJobLauncher}
LAUNCHERS = (*KUBERNETES_LAUNCHERS, "vertex-job")
# The launchers that run some frameworks only (the others run all of frameworks.FRAMEWORKS): the frameworks' legacy
# job kinds.
LAUNCHER_FRAMEWORKS = legacy_launchers()


def job_manifests(launcher: str, job: TrainingJob, namespace: str, *, runtime: str = RUNTIME_NAME) -> list[dict]:
    """What a Kubernetes launcher creates for `job`, last; before it, what the cluster needs that the repository
    ships (the TrainJob's ClusterTrainingRuntime for `job`'s framework, when it is ours), for a dry run to show."""
    if launcher == "trainjob":
        runtime = runtime_for(job.framework, runtime, network=job.network)
        shipped = [runtime_manifest(framework=job.framework, network=runtime_network(runtime))] \
            if runtime in SHIPPED_RUNTIMES else []
        return [*shipped, trainjob_manifest(job, namespace, runtime)]
    if launcher == "jobset":
        return [jobset_manifest(job, namespace)]
    if launcher == "tfjob":
        return [tfjob_manifest(job, namespace)]
    if launcher == "pytorchjob":
        return [pytorchjob_manifest(job, namespace)]
    raise ValueError(f"{launcher!r} is not a Kubernetes launcher ({', '.join(KUBERNETES_LAUNCHERS)})")


def copy_tree(source: str, destination: str) -> int:
    """Copies a training job's output tree between local paths and gs:// (storage.copy_tree); returns the number
    of files."""
    if not storage.gfile().isdir(source):
        raise LaunchError(f"The training job finished but wrote nothing to {source}")
    return storage.copy_tree(source, destination)


@dataclasses.dataclass(frozen=True)
class LaunchSettings:
    """Where and on what a multi-node training job runs; what the job itself trains is a TrainSettings."""

    launcher: str  # one of LAUNCHERS
    image: str  # the training image every replica runs
    workers: int = 1  # replicas besides the chief
    accelerator: str = ""  # GKE accelerator label value (see components/gcp/accelerators.py)
    gpus: int = 0  # per replica
    spot: bool = False
    node_pool: str = ""
    kueue_queue: str = ""  # Kueue LocalQueue that admits the job (empty: not queued)
    namespace: str = "kubeflow"  # Kubernetes launchers
    runtime: str = RUNTIME_NAME  # trainjob: the ClusterTrainingRuntime (a shipped name: the framework's, trainjob.py)
    framework: str = DEFAULT_FRAMEWORK  # what the nodes train with (frameworks/): their command and how they meet
    network: str = ""  # GPUDirect network of the nodes (network.py: rdma, tcpxo), checked with the placement
    # Stage the datasets' shards onto each node's local disk before the first epoch (components/train/staging.py):
    # an emptyDir (on local SSD where the node pool has it) sized from the datasets, a larger boot disk on Vertex.
    stage_data: bool = False
    # The pipeline task's own resources, node selector and tolerations (KFP's TaskConfig passthrough, as
    # `dataclasses.asdict(dsl.TaskConfig)`): when given, they place the nodes instead of
    # accelerator/gpus/spot/node_pool, so that the pipeline says where training runs in one place.
    task_config: dict | None = None
    # The nodes' resources (Kubernetes ResourceRequirements) with task_config, when the task keeps its own
    # resources for the launcher's pod and hands the nodes' over as values (placement.node_resources).
    node_resources: dict | None = None
    project: str = ""  # Vertex AI
    location: str = ""  # Vertex AI

    def __post_init__(self):
        if self.launcher not in LAUNCHERS:
            raise ValueError(f"launcher must be one of {', '.join(LAUNCHERS)}, got {self.launcher!r}")
        check_framework(self.framework)
        if self.framework not in LAUNCHER_FRAMEWORKS.get(self.launcher, (self.framework,)):
            others = [name for name in LAUNCHERS if self.framework in LAUNCHER_FRAMEWORKS.get(name, (self.framework,))]
            raise ValueError(f"launcher={self.launcher} runs {' or '.join(LAUNCHER_FRAMEWORKS[self.launcher])} only; "
                             f"for {self.framework} use {', '.join(others)}")
        if self.launcher == "vertex-job" and not self.project:
            raise ValueError("launcher=vertex-job needs the Google Cloud project")
        if self.launcher == "vertex-job" and self.task_config is not None:
            raise ValueError("launcher=vertex-job picks machines from accelerator/gpus, not from a task's config")


def training_job(launch: LaunchSettings, command: list[str], *, run_id: str, task_name: str,
                 stage_size: str = "") -> TrainingJob:
    """The job `launch` runs the training command `command` as: each node runs it as its framework starts a node
    (torchrun for torch, frameworks/); its replicas placed by the pipeline task's config (KFP's TaskConfig
    passthrough) when given, else by launch's accelerator, GPUs, Spot and node pool. `stage_size`: the room for each
    node's staged data (local_ssd.py)."""
    if launch.task_config is not None:
        from_task = placement_from_task_config(launch.task_config, launch.node_resources)
        if from_task is None:
            raise ValueError("The training task received no TaskConfig (KFP's TaskConfig passthrough, KFP 2.15 or "
                             "newer): the nodes' node selector and tolerations are unknown. Upgrade KFP, or "
                             "compile with --train-launcher pod")
        placement, sizes = from_task
    else:
        placement, sizes = gpu_placement(launch.accelerator, launch.gpus, known_accelerators=ACCELERATORS,
                                         spot=launch.spot, node_pool=launch.node_pool), {}
    # Nodes on a share of a GPU (the task's node selector): one GPU on one node, MPS only where hostIPC is set.
    SharedGpu.from_node_selector(placement.node_selector).check(placement.accelerator, placement.gpus,
                                                                workers=launch.workers, launcher=launch.launcher)
    check_network(launch.network, placement, launcher=launch.launcher)
    # JobSet-based jobs name their pods after themselves: their names leave room for that.
    longest = max_name_length(launch.workers + 1) if launch.launcher in ("trainjob", "jobset") else 63
    return TrainingJob(name=job_name("train", run_id, task_name, max_length=longest), image=launch.image,
                       command=setup(launch.framework).node_command(command), workers=launch.workers,
                       placement=placement, kueue_queue=launch.kueue_queue, framework=launch.framework,
                       network=launch.network, local_ssd=stage_size, **sizes,
                       labels={"pipeline-run": job_name("", run_id)[:63], "pipeline-task": job_name("", task_name)})


def staged_input(settings: TrainSettings, launch: LaunchSettings) -> tuple[TrainSettings, str]:
    """With `launch.stage_data`: the settings that stage the datasets on each node (where the launcher mounts room
    for them), and that room, sized from the datasets' bytes (staging.size_limit); else `settings` and ""."""
    if not launch.stage_data:
        return settings, ""
    size = staging.size_limit(staging.dataset_bytes(settings.dataset_dir, settings.augmented_dir))
    staged = dataclasses.replace(settings, stage_dir=local_ssd.stage_dir(launch.launcher))
    log.info("launch: each node stages the datasets into %s (%s)", staged.stage_dir, size)
    return staged, size


def launch_training(settings: TrainSettings, launch: LaunchSettings, *, model_path: str, tensorboard_path: str,
                    staging_dir: str, run_id: str, task_name: str, api_client=None, vertex_client=None,
                    poll_seconds: float | None = None) -> dict:
    """Runs the training CLI with `settings` on a chief + `launch.workers` (as `launch.launcher` says) and returns
    its training.json. The replicas write the model and TensorBoard logs under `staging_dir` (durable
    storage they can reach), whatever `settings` says; they are then copied into the step's own output paths
    `model_path` and `tensorboard_path`."""
    import tensorflow as tf

    for uri in (settings.dataset_dir, staging_dir, settings.backup_dir or ""):
        if uri.startswith(("minio://", "s3://")):
            raise ValueError(f"The training job's replicas cannot read or write {uri}: run the pipeline with a gs:// "
                             "pipeline root (or a checkpoint_root and pipeline root they can reach)")
    staged_model, staged_logs = f"{staging_dir.rstrip('/')}/model", f"{staging_dir.rstrip('/')}/tensorboard"
    staged = dataclasses.replace(settings, model_dir=staged_model, tensorboard_dir=staged_logs)
    staged, size = staged_input(staged, launch)
    job = training_job(launch, staged.command(), run_id=run_id, task_name=task_name, stage_size=size)
    polling = {"poll_seconds": poll_seconds} if poll_seconds else {}
    if launch.launcher in KUBERNETES_LAUNCHERS:
        launcher = KUBERNETES_LAUNCHERS[launch.launcher](api_client or kubernetes_client(), launch.namespace, **polling)
        outcome = launcher.run(job_manifests(launch.launcher, job, launch.namespace, runtime=launch.runtime)[-1])
    else:
        client = vertex_client or gcp.job_client(launch.location)
        outcome = VertexJobLauncher(client, launch.project, launch.location, **polling).run(
            custom_job(job, vertex_accelerators=ACCELERATORS, spot=launch.spot))
    log.info("launch: %s %s after %.0fs", outcome.name, outcome.state, outcome.seconds)
    copy_tree(staged_model, model_path)
    if tf.io.gfile.isdir(staged_logs):
        copy_tree(staged_logs, tensorboard_path)
    with tf.io.gfile.GFile(f"{model_path.rstrip('/')}/training.json") as f:
        return json.load(f)


def launch_pipeline_training(launch: LaunchSettings, *, dataset_uri: str, augmented_uri: str, model_uri: str,
                             model_path: str, tensorboard_path: str, recipe: str, epochs: int, batch_size: int,
                             learning_rate: float, checkpoint_root: str, pipeline_root: str, run_id: str,
                             task_name: str, model: str = "reference-cnn", pretrained: str = "none",
                             freeze_epochs: int = -1, fine_tune_layers: int = 0,
                             fine_tune_lr_factor: float = 0.0, weights_cache: str = "",
                             framework: str = DEFAULT_FRAMEWORK, shared_gpu: str = "") -> dict:
    """`launch_training` from the pipeline's values (0 for "the recipe's"), as the train step's ops call it: the
    replicas read and write the artifacts' URIs (gs://), keep checkpoints per run and task, and stage under
    `{pipeline_root}/jobs/{run_id}/{task_name}`. `framework` trains; `launch` must start its nodes for it.
    `shared_gpu`: the share of a GPU the node trains on (SharedGpu.describe), for the framework's memory setting."""
    from components.train.faults import backup_dir_for

    if framework != launch.framework:
        raise ValueError(f"The job's nodes are started for {launch.framework} but train with {framework}: give the "
                         "launch settings the training's framework")
    # The training command names the framework, where the training settings have one.
    trains_with = {"framework": framework} if "framework" in {
        field.name for field in dataclasses.fields(TrainSettings)} else {}
    settings = TrainSettings.from_pipeline(
        dataset_uri, model_uri, augmented_dir=augmented_uri, recipe=recipe, epochs=epochs, batch_size=batch_size,
        learning_rate=learning_rate, backup_dir=backup_dir_for(checkpoint_root, pipeline_root, run_id, task_name),
        model=model, pretrained=pretrained, freeze_epochs=freeze_epochs, fine_tune_layers=fine_tune_layers,
        fine_tune_lr_factor=fine_tune_lr_factor, weights_cache=weights_cache, shared_gpu=shared_gpu, **trains_with)
    return launch_training(settings, launch, model_path=model_path, tensorboard_path=tensorboard_path,
                           staging_dir=f"{pipeline_root.rstrip('/')}/jobs/{run_id}/{task_name}", run_id=run_id,
                           task_name=task_name)

