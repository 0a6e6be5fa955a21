"""The image-classification pipeline: it only composes the steps and says where each one runs."""


import functools
import inspect

from kfp import compiler, dsl
from kfp.dsl.pipeline_channel import PipelineChannel  # noqa: F401 (in annotations: a step's output as an image)

from components import ops, params
from components.step_images import step_images
from components.params import DEFAULT_SOURCE  # noqa: F401 (installed in the images from Debian's dataset-fashion-mnist)
from pipelines import config

PIPELINE_NAME = "image-classification"
# What the training pod, or each node of a cluster job, requests; and a job launcher's own pod, which only creates
# and follows the job and copies its outputs (a request of its own, so the node does not evict it first).
TRAIN_NODE_CPU, TRAIN_NODE_MEMORY = "4", "16G"
LAUNCHER_REQUEST = ("1", "2G")
# What the KFP UI shows above the parameters, whose descriptions come from components/params.py.
PIPELINE_DOC = ("Trains an image classifier, evaluates it against the registry's champion, predicts a folder of "
                "images and registers the model when it is blessed.")


def on_gpu(task: dsl.PipelineTask, settings: config.PipelineSettings, accelerator: str, count: int,
           image: "str | PipelineChannel") -> None:
    """Puts a task on a GPU node pool: GKE node selector + toleration (kfp), or Vertex machine selection."""
    task.set_container_image(image)
    if count == 0:
        return
    if settings.target == "vertex":
        task.set_accelerator_type(config.ACCELERATORS[accelerator]).set_accelerator_limit(count)
        return
    from kfp import kubernetes

    kubernetes.add_node_selector(task, label_key=config.ACCELERATOR_NODE_LABEL, label_value=accelerator)
    kubernetes.add_toleration(task, key=config.GPU_RESOURCE, operator="Exists", effect="NoSchedule")
    task.set_accelerator_type(config.GPU_RESOURCE).set_accelerator_limit(count)
    queue_on_kueue(task, settings)


def on_shared_gpu(task: dsl.PipelineTask, shared: config.SharedGpu) -> None:
    """A step's own pod on a share of one GPU (settings.check refused what GKE would not schedule): the node
    pool's labels, and where other pods use the GPU's memory too, every framework's setting that makes it take
    memory as it needs it (the run's framework reads its own; components/train/frameworks)."""
    if not shared:
        return
    from kfp import kubernetes

    from components.train.frameworks import shared_gpu_env

    for label, value in shared.node_selector().items():
        kubernetes.add_node_selector(task, label_key=label, label_value=value)
    if shared.shares_memory:
        for name, value in shared_gpu_env().items():
            task.set_env_variable(name, value)


def placement_workers(launcher: str | None, workers):
    """The machines besides the first that a run of `launcher` trains on, as the placement step checks them: the
    run's train_workers on a multi-node launcher, none in the training pod, unknown (None) with no launcher."""
    if launcher is None:
        return None
    return 0 if launcher in ("pod", "vertex") else workers


def queue_on_kueue(task: dsl.PipelineTask, settings: config.PipelineSettings) -> None:
    """Labels a GPU pod with its Kueue queue, so clusters that queue GPU work admit it in turn."""
    if settings.kueue_queue and settings.target == "kfp":
        from kfp import kubernetes

        kubernetes.add_pod_label(task, config.KUEUE_QUEUE_LABEL, settings.kueue_queue)


def on_train_gpu(task: dsl.PipelineTask, settings: config.PipelineSettings, placement: dsl.PipelineTask,
                 image: "str | PipelineChannel") -> None:
    """The training pod's placement, chosen per run: the checked node selector and tolerations (accelerator,
    Spot, node pool) through kfp-kubernetes' `_json` forms, which take the placement step's outputs."""
    task.set_container_image(image)
    if settings.target == "vertex":
        # Vertex AI picks the machine from a fixed accelerator type, so on Vertex the GPU is chosen when compiling
        # (--train-accelerator/--train-gpus); pipectl refuses the per-run GPU parameters there. 0: a CPU machine.
        if settings.train_gpus:
            task.set_accelerator_type(config.ACCELERATORS[settings.train_accelerator])
            task.set_accelerator_limit(settings.train_gpus)
        return
    place_training(task, placement)
    queue_on_kueue(task, settings)


def place_training(task: dsl.PipelineTask, placement: dsl.PipelineTask, *, gpus_on_task: bool = True) -> None:
    """Where training runs on GKE: the node selector and tolerations that the placement step checked, and (for the
    training pod) its GPUs. The training pod gets them; a cluster job's launcher passes the node selector and
    tolerations on to its nodes (TaskConfig) and takes the GPU count as a value. The GPU limit is the step's
    string output, not the integer parameter: the KFP driver resolves a number placeholder to no limit at all
    (pipelines/backend/kfp_driver.py), and an empty string (0 GPUs) to none."""
    from kfp import kubernetes

    kubernetes.add_node_selector_json(task, placement.outputs["node_selector"])
    kubernetes.add_toleration_json(task, placement.outputs["tolerations"])
    if gpus_on_task:
        task.set_accelerator_type(config.GPU_RESOURCE).set_accelerator_limit(placement.outputs["gpu_limit"])


def on_cpu(task: dsl.PipelineTask, settings: config.PipelineSettings, cpu: str, memory: str,
           image: "str | PipelineChannel | None" = None) -> dsl.PipelineTask:
    return task.set_container_image(image or settings.images.cpu).set_cpu_request(cpu).set_memory_request(memory)


def choose_images(settings: config.PipelineSettings, framework) -> dict:
    """The images of training, evaluation and batch prediction. On a KFP backend a step picks them for the run's
    framework from the pinned ones (components/step_images.py) and the driver starts those pods on its outputs
    (pipelines/backend/kfp_driver.py); on Vertex AI, which documents no image taken from a step's output, the same rule
    picks them here, for the framework fixed when compiling."""
    if settings.target != "kfp":
        return step_images(settings.compiled_framework, settings.images.pinned()).to_json()
    chosen = ops.step_images_op(framework=framework, images=settings.images.pinned())
    on_cpu(chosen.set_display_name("Choose images"), settings, "0.5", "512M")
    return {role: chosen.outputs[role] for role in ("train", "evaluate", "predict")}


def on_data(task: dsl.PipelineTask, settings: config.PipelineSettings) -> dsl.PipelineTask:
    """A data-heavy step: with --gcs-fuse-pvc, the bucket's PersistentVolumeClaim mounted at --gcs-fuse-mount and
    the annotation that has GKE add the GCS FUSE CSI driver's sidecar. The KFP driver turns the mount into the pod's
    volume and volumeMount (backend/src/v2/driver/k8s.go:156-172, makeVolumeMountPatch 1111-1170 at 2.17.0); the
    Argo compiler puts the annotation on the pod (compiler/argocompiler/container.go:744-787 extendPodMetadata,
    called at :590-592). With --gcs-fuse-cache, the file cache's volume: an emptyDir named gke-gcsfuse-cache
    (k8s.go:589-613 makes the pod's emptyDir with its sizeLimit)."""
    if settings.gcs_fuse_pvc:
        from kfp import kubernetes

        kubernetes.mount_pvc(task, pvc_name=settings.gcs_fuse_pvc, mount_path=settings.gcs_fuse_mount)
        kubernetes.add_pod_annotation(task, *config.GCS_FUSE_ANNOTATION)
        if settings.gcs_fuse_cache:  # the driver (k8s.go:589-613) also mounts it in the step, where it is unused
            kubernetes.empty_dir_mount(task, volume_name=config.GCS_FUSE_CACHE_VOLUME,
                                       mount_path=config.GCS_FUSE_CACHE_MOUNT, size_limit=settings.gcs_fuse_cache)
    return task


def task_names(settings: config.PipelineSettings | None = None) -> dict[str, str]:
    """Each step's KFP task name, by role. KFP names a task after its component (preprocess_op ->
    "preprocess-op"), and a run keeps each task's artifacts under that name (kfp.local: RUN_DIR/TASK/OUTPUT)."""
    settings = settings or config.PipelineSettings()
    train = {"pod": ops.train_op, "vertex-job": ops.train_job_op}.get(settings.train_launcher,
                                                                      ops.train_cluster_job_op)
    return {"preprocess": ops.preprocess_op.name, "augment": ops.augment_op.name,
            "placement": ops.placement_op.name, "images": ops.step_images_op.name, "train": train.name,
            "evaluate": ops.evaluate_op.name, "predict": ops.predict_op.name, "register": ops.register_op.name}


def build_pipeline(settings: config.PipelineSettings | None = None):
    """Returns the @dsl.pipeline function for these compile-time settings."""
    settings = settings or config.PipelineSettings()

    def image_classification(
        data: str = params.default("data"),
        validation_fraction: float = params.default("validation_fraction"),
        test_fraction: float = params.default("test_fraction"),
        image_size: int = params.default("image_size"),
        channels: int = params.default("channels"),
        limit: int = params.default("limit"),
        min_shards: int = params.default("min_shards"),
        classes: str = params.default("classes"),
        augment_copies: int = params.default("augment_copies"),
        augment_mode: str = params.default("augment_mode"),
        augment_policy: str = params.default("augment_policy"),
        recipe: str = params.default("recipe"),
        framework: str = params.default("framework"),
        epochs: int = params.default("epochs"),
        batch_size: int = params.default("batch_size"),
        learning_rate: float = params.default("learning_rate"),
        checkpoint_root: str = params.default("checkpoint_root"),
        train_accelerator_type: str = settings.train_accelerator,  # compile-time default (pipectl compile)
        train_gpu_count: int = settings.train_gpus,
        train_node_pool: str = params.default("train_node_pool"),
        train_spot: bool = params.default("train_spot"),
        train_workers: int = params.default("train_workers"),
        train_gpu_partition: str = params.default("train_gpu_partition"),
        train_gpu_sharing: str = params.default("train_gpu_sharing"),
        train_max_shared_clients: int = params.default("train_max_shared_clients"),
        train_network: str = params.default("train_network"),
        train_stage_data: bool = params.default("train_stage_data"),
        min_accuracy: float = params.default("min_accuracy"),
        min_class_recall: float = params.default("min_class_recall"),
        tolerance: float = params.default("tolerance"),
        data_root: str = settings.default_data_root,  # compile-time default: a folder of the GCS FUSE mount
        predict_images: str = params.default("predict_images"),
        registry: str = params.default("registry"),
        registry_root: str = params.default("registry_root"),
        model_name: str = params.default("model_name"),
        project: str = params.default("project"),
        location: str = params.default("location"),
        model: str = params.default("model"),
        pretrained: str = params.default("pretrained"),
        weights_cache: str = params.default("weights_cache"),
        freeze_epochs: int = params.default("freeze_epochs"),
        fine_tune_layers: int = params.default("fine_tune_layers"),
        fine_tune_lr_factor: float = params.default("fine_tune_lr_factor"),
        preprocess_runner: str = params.default("preprocess_runner"),
        dataflow_temp_location: str = params.default("dataflow_temp_location"),
        dataflow_staging_location: str = params.default("dataflow_staging_location"),
        dataflow_service_account: str = params.default("dataflow_service_account"),
        dataflow_network: str = params.default("dataflow_network"),
        dataflow_subnetwork: str = params.default("dataflow_subnetwork"),
        dataflow_max_workers: int = params.default("dataflow_max_workers"),
        dataflow_machine_type: str = params.default("dataflow_machine_type"),
    ):
        # With preprocess_runner=dataflow the step submits and follows a Dataflow job whose workers run the CPU image.
        prep = ops.preprocess_op(
            source=data, validation_fraction=validation_fraction, test_fraction=test_fraction, image_size=image_size,
            channels=channels, limit=limit, min_shards=min_shards, classes=classes, runner=preprocess_runner,
            image=settings.images.cpu, project=project, location=location,
            dataflow_temp_location=dataflow_temp_location, dataflow_staging_location=dataflow_staging_location,
            dataflow_service_account=dataflow_service_account, dataflow_network=dataflow_network,
            dataflow_subnetwork=dataflow_subnetwork, dataflow_max_workers=dataflow_max_workers,
            dataflow_machine_type=dataflow_machine_type, data_root=data_root, by_reference=settings.by_reference)
        on_data(on_cpu(prep.set_display_name("Preprocess"), settings, "2", "4G"), settings)

        aug = ops.augment_op(dataset=prep.outputs["dataset"], copies=augment_copies, mode=augment_mode,
                             policy=augment_policy, data_root=data_root, by_reference=settings.by_reference)
        on_data(on_cpu(aug.set_display_name("Augment"), settings, "2", "4G"), settings)

        launcher = settings.train_placement_launcher
        placement = ops.placement_op(accelerator=train_accelerator_type, gpus=train_gpu_count, spot=train_spot,
                                     node_pool=train_node_pool, known_accelerators=config.ACCELERATORS,
                                     gpu_partition=train_gpu_partition, gpu_sharing=train_gpu_sharing,
                                     max_shared_clients=train_max_shared_clients,
                                     other_nodes=placement_workers(launcher, train_workers), created_by=launcher,
                                     network=train_network, stage_data=train_stage_data)
        on_cpu(placement.set_display_name("Check GPU choice"), settings, "0.5", "512M")
        images = choose_images(settings, framework)

        training_inputs = dict(
            dataset=prep.outputs["dataset"], augmented=aug.outputs["augmented"], recipe=recipe, epochs=epochs,
            batch_size=batch_size, learning_rate=learning_rate, checkpoint_root=checkpoint_root,
            pipeline_root=dsl.PIPELINE_ROOT_PLACEHOLDER, run_id=dsl.PIPELINE_JOB_ID_PLACEHOLDER,
            task_name=dsl.PIPELINE_TASK_NAME_PLACEHOLDER, network=model, pretrained=pretrained,
            freeze_epochs=freeze_epochs, fine_tune_layers=fine_tune_layers, fine_tune_lr_factor=fine_tune_lr_factor,
            weights_cache=weights_cache, framework=framework)
        if settings.train_launcher == "pod":
            # On Vertex AI the placement step refuses a shared GPU: the training pod there is told of none.
            shared = {"shared_gpu": placement.outputs["shared_gpu"]} if settings.target == "kfp" else {}
            train = ops.train_op(**training_inputs, **shared)
            train.set_display_name("Train").set_cpu_request(TRAIN_NODE_CPU).set_memory_request(TRAIN_NODE_MEMORY)
            on_train_gpu(train, settings, placement, images["train"])
            on_data(train, settings)
        elif settings.train_launcher in config.CLUSTER_LAUNCHERS:
            # The task says where the nodes run as the training pod's task does; KFP hands the node selector and
            # tolerations to the launcher (dsl.TaskConfig passthrough) instead of applying them to the launcher's
            # own small pod, which keeps its own CPU and memory request; each node's size comes as values.
            train = ops.train_cluster_job_op(
                **training_inputs, launcher=settings.train_launcher, image=images["train"], workers=train_workers,
                kueue_queue=settings.kueue_queue, namespace=settings.train_namespace, runtime=settings.train_runtime,
                node_cpu=TRAIN_NODE_CPU, node_memory=TRAIN_NODE_MEMORY, node_gpus=placement.outputs["gpu_limit"],
                shared_gpu=placement.outputs["shared_gpu"], gpudirect=train_network, stage_data=train_stage_data)
            on_cpu(train.set_display_name(f"Train ({settings.train_launcher})"), settings, *LAUNCHER_REQUEST)
            place_training(train, placement, gpus_on_task=False)
        else:
            # The task only launches and follows the Vertex AI job; the chief and workers get the GPUs.
            train = ops.train_job_op(
                **training_inputs, launcher=settings.train_launcher, image=images["train"],
                workers=train_workers, accelerator=train_accelerator_type, gpus=train_gpu_count, spot=train_spot,
                node_pool=train_node_pool, kueue_queue=settings.kueue_queue,
                namespace=settings.train_namespace, project=project, location=location,
                stage_data=train_stage_data)
            on_cpu(train.set_display_name(f"Train ({settings.train_launcher})"), settings, *LAUNCHER_REQUEST)
            train.after(placement)
        # Retries resume from the task's checkpoints, so a preempted (Spot) node costs minutes; a permanent
        # failure (bad input, NaN loss, a bug) is recorded and makes the retries fail at once.
        if settings.train_retries:
            train.set_retry(num_retries=settings.train_retries, backoff_duration="60s", backoff_factor=2.0,
                            backoff_max_duration="3600s")

        evaluate = ops.evaluate_op(
            model=train.outputs["model"], dataset=prep.outputs["dataset"], min_accuracy=min_accuracy,
            min_class_recall=min_class_recall, tolerance=tolerance, registry=registry, registry_root=registry_root,
            model_name=model_name, project=project, location=location)
        # Evaluation reads the registry's current champion: never serve it from the cache.
        on_data(on_cpu(evaluate.set_display_name("Evaluate"), settings, "2", "8G", images["evaluate"]), settings)
        evaluate.set_caching_options(False)

        predict = ops.predict_op(model=train.outputs["model"], dataset=prep.outputs["dataset"],
                                 images=predict_images, data_root=data_root, by_reference=settings.by_reference)
        on_data(predict.set_display_name("Batch predict").set_cpu_request("4").set_memory_request("16G"), settings)
        on_gpu(predict, settings, settings.predict_accelerator, settings.predict_gpus, images["predict"])
        on_shared_gpu(predict, settings.predict_shared_gpu)

        with dsl.If(evaluate.outputs["Output"] == True, name="blessed"):  # noqa: E712 (a pipeline condition)
            register = ops.register_op(
                model=train.outputs["model"], evaluation=evaluate.outputs["evaluation"], registry=registry,
                registry_root=registry_root, model_name=model_name, project=project, location=location,
                run_id=dsl.PIPELINE_JOB_ID_PLACEHOLDER, serving_image=settings.images.serving)
            on_cpu(register.set_display_name("Register model"), settings, "1", "2G").set_caching_options(False)

    pipeline_func = image_classification if settings.target == "kfp" else \
        with_fixed_framework(image_classification, settings.compiled_framework)
    pipeline_func.__doc__ = PIPELINE_DOC + "\n\n" + params.docstring_args(
        inspect.signature(pipeline_func).parameters)
    return dsl.pipeline(name=PIPELINE_NAME)(pipeline_func)


def with_fixed_framework(pipeline_func, framework: str):
    """The pipeline without its `framework` parameter, training on `framework`: on Vertex AI the images are fixed
    when compiling, so a run parameter could only contradict them. The Vertex AI SDK refuses a parameter that the
    pipeline does not declare ("The pipeline parameter framework is not found in the pipeline job input
    definitions": google-cloud-aiplatform 1.165.1, google/cloud/aiplatform/utils/pipeline_utils.py:240-243), so no
    run can set it and have it ignored; pipectl says why first (pipelines/vertexai/vertex_checks.py). KFP reads the
    parameters from the signature and passes them in its order (kfp 2.17.3, kfp/dsl/graph_component.py:50-64)."""
    signature = inspect.signature(pipeline_func)
    kept = [p for name, p in signature.parameters.items() if name != "framework"]

    @functools.wraps(pipeline_func)
    def fixed(*args, **kwargs):
        return pipeline_func(**dict(zip((p.name for p in kept), args)), **kwargs, framework=framework)

    fixed.__signature__ = signature.replace(parameters=kept)
    return fixed


def compile_pipeline(output_path: str, settings: config.PipelineSettings | None = None) -> str:
    """Compiles the pipeline to KFP IR YAML (what the KFP UI, KFP API and Vertex AI Pipelines accept)."""
    compiler.Compiler().compile(build_pipeline(settings), package_path=output_path)
    return output_path
