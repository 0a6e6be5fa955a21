"""The KFP components: one short `@dsl.component` per step, calling the step's logic.

Each body imports its step module inside the function: the component runs in the project's image (or, with
kfp.local, in the project's environment), and compiling the pipeline needs no TensorFlow. The images are set
per task when the pipeline is compiled (pipelines/config.py), not here.
"""

from typing import NamedTuple

from kfp import dsl
from kfp.dsl import (HTML, Artifact, ClassificationMetrics, Dataset, Input, Markdown, Metrics, Model, Output)

# Replaced on every task by the pipeline (task.set_container_image); a task left on it fails loudly at import.
UNSET_IMAGE = "python:3.11-slim"


@dsl.component(base_image=UNSET_IMAGE, install_kfp_package=False)
def preprocess_op(source: str, validation_fraction: float, test_fraction: float, image_size: int, channels: int,
                  limit: int, min_shards: int, dataset: Output[Dataset], stats: Output[Metrics],
                  card: Output[HTML], classes: str = "", runner: str = "local", image: str = "", project: str = "",
                  location: str = "", dataflow_temp_location: str = "", dataflow_staging_location: str = "",
                  dataflow_service_account: str = "", dataflow_network: str = "", dataflow_subnetwork: str = "",
                  dataflow_max_workers: int = 0, dataflow_machine_type: str = "", data_root: str = "",
                  by_reference: bool = False) -> NamedTuple(
        "Counts", train=int, validation=int, test=int, rejected=int):
    """Reads the source (idx files, an image folder, a CSV/JSONL manifest or tfds:NAME) into sharded TFRecords for
    train/validation/test; unusable inputs are listed in rejected.jsonl and counted per reason. With
    runner=dataflow the same preprocessing runs as an Apache Beam job on Dataflow (workers on `image`), followed
    and cancelled with the run, writing to the same dataset. With `data_root` or `by_reference` the shards are
    written outside the artifact, which holds their manifest (components/dataio/datadir.py)."""
    import collections

    from components import stepcli
    from components.dataio import datadir
    from components.preprocess import dataset_card, preprocess

    stepcli.setup_logging(force=True)
    dataflow = None
    if runner == "dataflow":
        from components.preprocess import DataflowSettings

        dataflow = DataflowSettings(
            project=project, region=location, temp_location=dataflow_temp_location,
            staging_location=dataflow_staging_location, service_account=dataflow_service_account,
            network=dataflow_network, subnetwork=dataflow_subnetwork, max_workers=dataflow_max_workers,
            machine_type=dataflow_machine_type, sdk_container_image=image)
    where = datadir.bulk_dir(dataset.uri, dataset.path, data_root=data_root, by_reference=by_reference)
    # Dataflow's workers write the dataset themselves: its gs:// URI, not this pod's mount of it.
    result = preprocess(source, dataset.uri if dataflow and where == dataset.path else where,
                        validation_fraction=validation_fraction,
                        test_fraction=test_fraction, image_size=image_size, channels=channels, limit=limit or None,
                        min_shards=min_shards, classes=classes or None, runner=runner, dataflow=dataflow)
    if where != dataset.path:
        datadir.publish_dataset(where, dataset.path)
    for split, count in result.counts.items():
        stats.log_metric(f"images_{split}", count)
    stats.log_metric("rejected", result.rejected)
    for reason, count in result.rejected_by_reason.items():
        stats.log_metric(f"rejected: {reason}", count)
    for field in ("groups", "images", "test_images_shared"):
        stats.log_metric(f"near-duplicate {field.replace('_', ' ')}", result.near_duplicates[field])
    # the decode plans measured on this run's files, median rates (records built), and how often the run switched
    for label, measured in result.decode_plan.get("plans", {}).items():
        stats.log_metric(f"decode images/s: {label}", measured["median_per_s"])
    if result.decode_plan.get("measured"):
        stats.log_metric("decode plan switches", len(result.decode_plan["switches"]))
    with open(card.path, "w") as f:
        f.write(dataset_card(dataset.path))
    dataset.metadata.update({"class_names": result.class_names, "image_shape": result.image_shape, **result.counts,
                             "data_dir": where})
    Counts = collections.namedtuple("Counts", ["train", "validation", "test", "rejected"])
    return Counts(result.counts["train"], result.counts["validation"], result.counts["test"], result.rejected)


@dsl.component(base_image=UNSET_IMAGE, install_kfp_package=False)
def augment_op(dataset: Input[Dataset], copies: int, mode: str, policy: str, augmented: Output[Dataset],
               preview: Output[HTML], data_root: str = "", by_reference: bool = False):
    """Writes augmented training shards (offline), or hands the policy to training (online); the preview shows
    originals next to their augmented copies. With `data_root` or `by_reference` the shards are written outside
    the artifact, which holds their manifest (components/dataio/datadir.py)."""
    from components import stepcli
    from components.dataio import datadir
    from components.augment import AugmentPolicy, augment, policy_preview

    stepcli.setup_logging(force=True)
    chosen = AugmentPolicy.from_json(policy)
    where = datadir.bulk_dir(augmented.uri, augmented.path, data_root=data_root, by_reference=by_reference)
    result = augment(dataset.path, where, copies=copies, mode=mode, policy=chosen)
    if where != augmented.path:
        datadir.publish_dataset(where, augmented.path)
    with open(preview.path, "w") as f:
        f.write(policy_preview(dataset.path, chosen, note="" if mode == "online" or copies else
                               "Not applied in this run: offline mode with 0 copies passes the data through."))
    augmented.metadata.update({"mode": mode, "copies": copies, "train": result.train_count, "data_dir": where})


@dsl.component(base_image=UNSET_IMAGE, install_kfp_package=False)
def placement_op(accelerator: str, gpus: int, spot: bool, node_pool: str, known_accelerators: dict,
                 gpu_partition: str = "", gpu_sharing: str = "", max_shared_clients: int = 0,
                 other_nodes: int = 0, created_by: str = "pod", network: str = "",
                 stage_data: bool = False) -> NamedTuple(
        "Placement", node_selector=dict, tolerations=list, vertex_accelerator=str, gpu_limit=str, shared_gpu=str):
    """Checks the run's GPU choice (a known GKE accelerator, a sane count, a MIG partition or GPU sharing that GKE
    would schedule for pods that `created_by` (a train launcher) makes on `other_nodes` nodes besides the first,
    a GPUDirect `network` those pods can carry on those machines, data staged on nodes that get room for it)
    and turns it into the training pod's node
    selector, tolerations (accelerator, Spot VMs, node pool, shared GPU) and GPU limit (a string, empty for none:
    the form the KFP driver reads), and what training is told of a shared GPU."""
    import collections

    from components.launch import SharedGpu, check_network, check_staging, gpu_placement

    placement = gpu_placement(accelerator, gpus, known_accelerators=known_accelerators, spot=spot,
                              node_pool=node_pool, shared=SharedGpu(gpu_partition, gpu_sharing, max_shared_clients),
                              workers=other_nodes, launcher=created_by)
    check_network(network, placement, launcher=created_by, flag="--train-launcher")
    check_staging(stage_data, launcher=created_by)
    Placement = collections.namedtuple("Placement", ["node_selector", "tolerations", "vertex_accelerator",
                                                     "gpu_limit", "shared_gpu"])
    return Placement(placement.node_selector, placement.tolerations,
                     known_accelerators.get(placement.accelerator, "") if gpus else "", placement.gpu_limit,
                     placement.shared_gpu)


@dsl.component(base_image=UNSET_IMAGE, install_kfp_package=False)
def step_images_op(framework: str, images: dict) -> NamedTuple("StepImages", train=str, evaluate=str, predict=str):
    """Picks the images that run training, evaluation and batch prediction for the run's framework from the
    pipeline's pinned images (cpu, gpu, torch): PyTorch and JAX run all three in the TensorFlow-free image
    (images/Dockerfile, target torch), TensorFlow as before."""
    import collections

    from components.step_images import step_images

    chosen = step_images(framework, images)
    StepImages = collections.namedtuple("StepImages", ["train", "evaluate", "predict"])
    return StepImages(chosen.train, chosen.evaluate, chosen.predict)


@dsl.component(base_image=UNSET_IMAGE, install_kfp_package=False)
def train_op(dataset: Input[Dataset], augmented: Input[Dataset], recipe: str, epochs: int, batch_size: int,
             learning_rate: float, checkpoint_root: str, pipeline_root: str, run_id: str, task_name: str,
             model: Output[Model], metrics: Output[Metrics], tensorboard: Output[Artifact],
             network: str = "reference-cnn", pretrained: str = "none", freeze_epochs: int = -1,
             fine_tune_layers: int = 0, fine_tune_lr_factor: float = 0.0, weights_cache: str = "",
             framework: str = "tensorflow", shared_gpu: str = "") -> float:
    """Trains the classifier (`network`: the pipeline's `model` parameter) on `framework` (tensorflow: a
    tf.distribute strategy; torch: DDP; jax; components/train/frameworks), from
    `pretrained` weights when given (head first, then fine-tuning); resumes from checkpoints when the task is retried.
    On a share of one GPU (`shared_gpu`, the GPU check's "time-sharing 4", "mps 2", "mig 1g.10gb") whose memory other
    pods use too, the framework takes memory as it needs it.

    Exits 143 when preempted (SIGTERM: a checkpoint is saved, the retry resumes from it); a permanent failure
    (bad input, NaN loss, a bug) is recorded so that retries fail at once. Returns the wall time of fitting,
    in seconds.
    """
    from components import stepcli
    from components.train import TrainingLoop, TrainSettings, attempt, backup_dir_for, log_to_kfp

    stepcli.setup_logging(force=True)
    settings = TrainSettings.from_pipeline(
        dataset.path, model.path, augmented_dir=augmented.path, recipe=recipe, epochs=epochs, batch_size=batch_size,
        learning_rate=learning_rate, tensorboard_dir=tensorboard.path, model=network, pretrained=pretrained,
        freeze_epochs=freeze_epochs, fine_tune_layers=fine_tune_layers, fine_tune_lr_factor=fine_tune_lr_factor,
        weights_cache=weights_cache, framework=framework, shared_gpu=shared_gpu,
        # Keyed by run and task in durable storage, so a retry of this task resumes and a new run starts clean.
        backup_dir=backup_dir_for(checkpoint_root, pipeline_root, run_id, task_name))
    result = attempt(TrainingLoop(settings).run, settings.backup_dir)
    log_to_kfp(result.to_json(), metrics, model)
    return result.train_seconds


@dsl.component(base_image=UNSET_IMAGE, install_kfp_package=False)
def train_job_op(dataset: Input[Dataset], augmented: Input[Dataset], recipe: str, epochs: int, batch_size: int,
                 learning_rate: float, checkpoint_root: str, pipeline_root: str, run_id: str, task_name: str,
                 launcher: str, image: str, workers: int, accelerator: str, gpus: int, spot: bool, node_pool: str,
                 kueue_queue: str, namespace: str, project: str, location: str,
                 model: Output[Model], metrics: Output[Metrics], tensorboard: Output[Artifact],
                 network: str = "reference-cnn", pretrained: str = "none", freeze_epochs: int = -1,
                 fine_tune_layers: int = 0, fine_tune_lr_factor: float = 0.0, weights_cache: str = "",
                 framework: str = "tensorflow", stage_data: bool = False) -> float:
    """Trains on a chief and `workers` more machines placed by this task's parameters: creates a Vertex AI CustomJob
    (launcher=vertex-job; or a Kubernetes job, see train_cluster_job_op) running the training image with
    `framework` (torch and JAX: their variables from Vertex's CLUSTER_SPEC), follows it, and
    cancels it when the run is cancelled. The job reads and writes the pipeline root directly (gs://). Returns the
    job's training seconds.
    """
    from components import stepcli
    from components.launch import LaunchSettings, launch_pipeline_training
    from components.train import log_to_kfp

    stepcli.setup_logging(force=True)
    where = LaunchSettings(launcher, image, workers=workers, accelerator=accelerator, gpus=gpus, spot=spot,
                           node_pool=node_pool, kueue_queue=kueue_queue, namespace=namespace, project=project,
                           location=location, framework=framework, stage_data=stage_data)
    # The replicas read and write the pipeline root directly (gs://): URIs, not this pod's local paths.
    info = launch_pipeline_training(
        where, dataset_uri=dataset.uri, augmented_uri=augmented.uri, model_uri=model.uri, model_path=model.path,
        tensorboard_path=tensorboard.path, recipe=recipe, epochs=epochs, batch_size=batch_size,
        learning_rate=learning_rate, checkpoint_root=checkpoint_root, pipeline_root=pipeline_root, run_id=run_id,
        task_name=task_name, model=network, pretrained=pretrained, freeze_epochs=freeze_epochs,
        fine_tune_layers=fine_tune_layers, fine_tune_lr_factor=fine_tune_lr_factor, weights_cache=weights_cache,
        framework=framework)
    log_to_kfp(info, metrics, model)
    return info["train_seconds"]


# The task's node selector and tolerations are handed to the op (dsl.TaskConfig), not applied to the op's own pod:
# the nodes go to the GPU pool. Its resources are applied to the op's own pod too (apply_to_task): they are the
# launcher's own small CPU and memory request; the nodes' size comes as values (node_cpu, node_memory, node_gpus).
# (The SDK refuses resources on a task whose component does not list RESOURCES.)
NODE_PLACEMENT = [dsl.TaskConfigPassthrough(field=dsl.TaskConfigField.RESOURCES, apply_to_task=True),
                  dsl.TaskConfigField.KUBERNETES_NODE_SELECTOR, dsl.TaskConfigField.KUBERNETES_TOLERATIONS]


@dsl.component(base_image=UNSET_IMAGE, install_kfp_package=False, task_config_passthroughs=NODE_PLACEMENT)
def train_cluster_job_op(dataset: Input[Dataset], augmented: Input[Dataset], recipe: str, epochs: int,
                         batch_size: int, learning_rate: float, checkpoint_root: str, pipeline_root: str, run_id: str,
                         task_name: str, launcher: str, image: str, workers: int, kueue_queue: str, namespace: str,
                         runtime: str, node_cpu: str, node_memory: str, node_gpus: str, task_config: dsl.TaskConfig,
                         model: Output[Model], metrics: Output[Metrics],
                         tensorboard: Output[Artifact], network: str = "reference-cnn", pretrained: str = "none",
                         freeze_epochs: int = -1, fine_tune_layers: int = 0,
                         fine_tune_lr_factor: float = 0.0, weights_cache: str = "",
                         framework: str = "tensorflow", shared_gpu: str = "", gpudirect: str = "",
                         stage_data: bool = False) -> float:
    """Trains on a chief and `workers` more nodes of this cluster: creates a Kubeflow Trainer v2 TrainJob on the
    ClusterTrainingRuntime `runtime` (launcher=trainjob), a JobSet (jobset) or a legacy TFJob (tfjob) or PyTorchJob
    (pytorchjob) running the training image with `framework` (torch: torchrun on every node), follows it, and
    deletes it when the run is cancelled. Each node requests `node_cpu`, `node_memory` and `node_gpus` GPUs (empty:
    none) and gets the node selector and tolerations set on this task (KFP passes them on instead of applying them
    to this pod). The job reads and writes the pipeline root directly (gs://); each node is told of a shared GPU
    (`shared_gpu`) as the training pod is. On a GPUDirect network (`gpudirect`: rdma, tcpxo; the launcher's
    --network) the nodes also carry its interfaces, volumes and NCCL settings. With `stage_data` each node stages
    the shards on its local disk first (an emptyDir sized from them). Returns the job's training seconds.
    """
    import dataclasses

    from components import stepcli
    from components.launch import LaunchSettings, launch_pipeline_training, node_resources
    from components.train import log_to_kfp

    stepcli.setup_logging(force=True)
    where = LaunchSettings(launcher, image, workers=workers, kueue_queue=kueue_queue, namespace=namespace,
                           runtime=runtime, task_config=dataclasses.asdict(task_config),
                           node_resources=node_resources(node_cpu, node_memory, node_gpus), framework=framework,
                           network=gpudirect, stage_data=stage_data)
    info = launch_pipeline_training(
        where, dataset_uri=dataset.uri, augmented_uri=augmented.uri, model_uri=model.uri, model_path=model.path,
        tensorboard_path=tensorboard.path, recipe=recipe, epochs=epochs, batch_size=batch_size,
        learning_rate=learning_rate, checkpoint_root=checkpoint_root, pipeline_root=pipeline_root, run_id=run_id,
        task_name=task_name, model=network, pretrained=pretrained, freeze_epochs=freeze_epochs,
        fine_tune_layers=fine_tune_layers, fine_tune_lr_factor=fine_tune_lr_factor, weights_cache=weights_cache,
        framework=framework, shared_gpu=shared_gpu)
    log_to_kfp(info, metrics, model)
    return info["train_seconds"]


@dsl.component(base_image=UNSET_IMAGE, install_kfp_package=False)
def evaluate_op(model: Input[Model], dataset: Input[Dataset], min_accuracy: float, min_class_recall: float,
                tolerance: float, registry: str, registry_root: str, model_name: str, project: str, location: str,
                metrics: Output[Metrics], confusion: Output[ClassificationMetrics], decision: Output[Markdown],
                evaluation: Output[Artifact], report: Output[HTML]) -> bool:
    """Scores the model on the test split, compares it with the registry's champion, and decides if it is blessed.
    The evaluation records which champion version it compared against (none: no champion) and the test set."""
    import json

    from components import stepcli
    from components.evaluate import decision_markdown, evaluate, log_to_kfp, write_report
    from components.registry import open_registry

    stepcli.setup_logging(force=True)
    champion = open_registry(registry, root=registry_root, project=project, location=location).champion(model_name)
    result = evaluate(model.path, dataset.path, min_accuracy=min_accuracy,
                      min_class_recall=min_class_recall if min_class_recall >= 0 else None,
                      champion_model_dir=champion.uri if champion else None,
                      champion_version=champion.version if champion else "", tolerance=tolerance)
    log_to_kfp(result, metrics, confusion)
    with open(decision.path, "w") as f:
        f.write(decision_markdown(result))
    with open(evaluation.path, "w") as f:
        json.dump(result.to_json(), f, indent=2)
    # The champion the gate compared against: registration moves the alias only if it is still that one.
    evaluation.metadata.update({"blessed": result.blessed, "compared_with": result.compared_with or "",
                                "test_set": result.test_set})
    write_report(result, model.path, dataset.path, report.path)
    return result.blessed


@dsl.component(base_image=UNSET_IMAGE, install_kfp_package=False)
def predict_op(model: Input[Model], dataset: Input[Dataset], images: str, predictions: Output[Dataset],
               data_root: str = "", by_reference: bool = False) -> int:
    """Classifies every image of a folder, glob, manifest or TFRecord shards (local or gs://), streamed in
    chunks written as they finish; with no source, 10 test images per class. With `data_root` or `by_reference`
    the predictions are written outside the artifact, which holds their summary (components/dataio/datadir.py).

    Returns the number of predictions.
    """
    from components import stepcli
    from components.dataio import data, datadir
    from components.predict import export_samples, predict

    stepcli.setup_logging(force=True)
    where = datadir.bulk_dir(predictions.uri, predictions.path, data_root=data_root, by_reference=by_reference)
    if not images:
        images = data.join(where, "inputs")
        export_samples(dataset.path, images, per_class=10)
    result = predict(model.path, images, where)
    if where != predictions.path:
        datadir.publish_predictions(where, predictions.path)
    predictions.metadata.update({"count": result.count, "errors": result.errors, "source": images,
                                 "data_dir": where})
    return result.count


@dsl.component(base_image=UNSET_IMAGE, install_kfp_package=False)
def register_op(model: Input[Model], evaluation: Input[Artifact], registry: str, registry_root: str,
                model_name: str, project: str, location: str, run_id: str, registration: Output[Artifact],
                serving_image: str = "") -> str:
    """Registers the blessed model as a new version and moves the `champion` alias to it, if the champion is still
    the one evaluation compared against; if another run moved it since, the gate is applied again against the new
    champion, and a model it does not prefer is registered without the alias.

    Returns the registered version.
    """
    import json

    from components import stepcli
    from components.register import evaluation_metrics, gate_from_evaluation, register
    from components.registry import open_registry

    stepcli.setup_logging(force=True)
    with open(evaluation.path) as f:
        evaluated = json.load(f)
    # The digest is taken from the local files; Vertex reads the same model from its gs:// URI.
    opened = open_registry(registry, root=registry_root, project=project, location=location,
                           serving_image=serving_image)
    result = register(model.path, opened, model_name=model_name, metrics=evaluation_metrics(evaluated),
                      labels={"pipeline_run": run_id}, artifact_uri=model.uri if model.uri.startswith("gs://") else None,
                      gate=gate_from_evaluation(evaluated))
    with open(registration.path, "w") as f:
        json.dump(result.to_json(), f, indent=2)
    registration.metadata.update({"registry": registry, "model": model_name, "version": result.version.version,
                                  "new_version": result.new_version,
                                  "network": result.version.lineage.get("name", ""),
                                  "promotion": result.promotion, "champion_changed": result.champion_changed})
    return result.version.version


# The output each data-heavy step writes by reference (components/dataio/datadir.py): its bulk goes where
# datadir.bulk_dir says, its artifact holds a manifest. pipelines/backend/explain.py shows what that means for each pod.
BY_REFERENCE = {preprocess_op.name: "dataset", augment_op.name: "augmented", predict_op.name: "predictions"}
