"""The image-classification pipeline: it only composes the steps and says where each one runs."""


from kfp import compiler, dsl

from components import ops
from pipelines import config

PIPELINE_NAME = "image-classification"
DEFAULT_SOURCE = "/usr/share/datasets/fashion-mnist"  # installed in the images from Debian's dataset-fashion-mnist


def on_gpu(task: dsl.PipelineTask, settings: config.PipelineSettings, accelerator: str, count: int) -> None:
    """Puts a task on a GPU node pool: GKE node selector + toleration (kfp), or Vertex machine selection."""
    task.set_container_image(settings.images.gpu)
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


def queue_on_kueue(task: dsl.PipelineTask, settings: config.PipelineSettings) -> None:
    """Labels a GPU pod with its Kueue queue, so clusters that queue GPU work admit it in turn."""
    if settings.kueue_queue and settings.target == "kfp":
        from kfp import kubernetes

        kubernetes.add_pod_label(task, config.KUEUE_QUEUE_LABEL, settings.kueue_queue)


def on_train_gpu(task: dsl.PipelineTask, settings: config.PipelineSettings, placement: dsl.PipelineTask,
                 gpus) -> None:
    """The training pod's placement, chosen per run: the checked node selector and tolerations (accelerator,
    Spot, node pool) through kfp-kubernetes' `_json` forms, which take the placement step's outputs."""
    task.set_container_image(settings.images.gpu)
    if settings.target == "vertex":
        # Vertex AI picks the machine from a fixed accelerator type, so on Vertex the GPU is chosen when compiling
        # (--train-accelerator/--train-gpus); pipectl refuses the per-run GPU parameters there.
        task.set_accelerator_type(config.ACCELERATORS[settings.train_accelerator])
        task.set_accelerator_limit(settings.train_gpus)
        return
    from kfp import kubernetes

    kubernetes.add_node_selector_json(task, placement.outputs["node_selector"])
    kubernetes.add_toleration_json(task, placement.outputs["tolerations"])
    task.set_accelerator_type(config.GPU_RESOURCE).set_accelerator_limit(gpus)
    queue_on_kueue(task, settings)


def on_cpu(task: dsl.PipelineTask, settings: config.PipelineSettings, cpu: str, memory: str) -> dsl.PipelineTask:
    return task.set_container_image(settings.images.cpu).set_cpu_request(cpu).set_memory_request(memory)


def build_pipeline(settings: config.PipelineSettings | None = None):
    """Returns the @dsl.pipeline function for these compile-time settings."""
    settings = settings or config.PipelineSettings()

    @dsl.pipeline(name=PIPELINE_NAME)
    def image_classification(
        data: str = DEFAULT_SOURCE,
        validation_fraction: float = 0.1,
        test_fraction: float = 0.1,
        image_size: int = 28,
        channels: int = 1,
        limit: int = 0,
        min_shards: int = 2,
        classes: str = "",
        augment_copies: int = 0,
        augment_mode: str = "offline",
        augment_policy: str = "{}",
        recipe: str = "fast",  # components.train.DEFAULT_RECIPE
        epochs: int = 0,
        batch_size: int = 0,
        learning_rate: float = 0.0,
        checkpoint_root: str = "",
        train_accelerator_type: str = settings.train_accelerator,
        train_gpu_count: int = settings.train_gpus,
        train_node_pool: str = "",
        train_spot: bool = False,
        train_workers: int = 1,
        min_accuracy: float = 0.88,
        min_class_recall: float = -1.0,
        tolerance: float = 0.005,
        predict_images: str = "",
        registry: str = "local",
        registry_root: str = "",
        model_name: str = "image-classifier",
        project: str = "",
        location: str = "us-central1",
    ):
        """Trains an image classifier, evaluates it against the registry's champion, predicts a folder of images
        and registers the model when it is blessed.

        Args:
            data: Image source: an idx directory, a class-per-folder image tree (local or gs://), or tfds:NAME[:SPLIT].
            validation_fraction: Share of the training images held out for validation (by content hash).
            test_fraction: Share held out for test when the source has no test split of its own.
            image_size: Images are resized to image_size x image_size.
            channels: 1 for grayscale, 3 for RGB.
            limit: At most this many images per source split (0: all); for quick runs.
            min_shards: At least this many shards per split (one per training worker that reads them).
            classes: Comma-separated allowed class names, in label order (empty: any class the source has).
            augment_copies: Augmented copies of each training image (offline mode; 0 passes the data through).
            augment_mode: offline (materialise copies) or online (training augments on the fly).
            augment_policy: JSON augmentation policy (rotation_degrees, shift_fraction, zoom_range, ..., seed).
            recipe: Training recipe preset: fast (the default) or reference (the classic 12-epoch recipe).
            epochs: Training epochs (0: the recipe's).
            batch_size: Batch size per replica (0: the recipe's).
            learning_rate: Base learning rate (0: the recipe's).
            checkpoint_root: Durable directory for training checkpoints (empty: the pipeline root).
            train_accelerator_type: GKE accelerator for training (nvidia-tesla-t4, nvidia-l4, nvidia-tesla-a100,
                nvidia-a100-80gb, nvidia-h100-80gb, nvidia-h200-141gb).
            train_gpu_count: GPUs per training machine (0: train on CPU nodes).
            train_node_pool: GKE node pool to train on (empty: any pool with the accelerator).
            train_spot: Train on Spot VMs (cheaper, preemptible: training resumes from its checkpoints).
            train_workers: Machines besides the chief, when compiled with a multi-worker train launcher.
            min_accuracy: A model below this test accuracy is not blessed.
            min_class_recall: Minimum recall for every class (negative: no such check).
            tolerance: A model may trail the champion's accuracy by this much and still be blessed.
            predict_images: Images to classify: a folder, glob, manifest or TFRecord shards, local or gs://
                (empty: 10 test images per class).
            registry: local or vertex.
            registry_root: Directory of the local registry.
            model_name: The registered model's name.
            project: Google Cloud project (registry=vertex).
            location: Google Cloud region (registry=vertex).
        """
        prep = ops.preprocess_op(
            source=data, validation_fraction=validation_fraction, test_fraction=test_fraction, image_size=image_size,
            channels=channels, limit=limit, min_shards=min_shards, classes=classes)
        on_cpu(prep.set_display_name("Preprocess"), settings, "2", "4G")

        aug = ops.augment_op(dataset=prep.outputs["dataset"], copies=augment_copies, mode=augment_mode,
                             policy=augment_policy)
        on_cpu(aug.set_display_name("Augment"), settings, "2", "4G")

        placement = ops.placement_op(accelerator=train_accelerator_type, gpus=train_gpu_count, spot=train_spot,
                                     node_pool=train_node_pool, known_accelerators=config.ACCELERATORS)
        on_cpu(placement.set_display_name("Check GPU choice"), settings, "0.5", "512M")

        training_inputs = dict(
            dataset=prep.outputs["dataset"], augmented=aug.outputs["augmented"], recipe=recipe, epochs=epochs,
            batch_size=batch_size, learning_rate=learning_rate, checkpoint_root=checkpoint_root,
            pipeline_root=dsl.PIPELINE_ROOT_PLACEHOLDER, run_id=dsl.PIPELINE_JOB_ID_PLACEHOLDER,
            task_name=dsl.PIPELINE_TASK_NAME_PLACEHOLDER)
        if settings.train_launcher == "pod":
            train = ops.train_op(**training_inputs)
            train.set_display_name("Train").set_cpu_request("4").set_memory_request("16G")
            on_train_gpu(train, settings, placement, train_gpu_count)
        else:
            # The task only launches and follows the job; the chief and workers get the GPUs.
            train = ops.train_job_op(
                **training_inputs, launcher=settings.train_launcher, image=settings.images.gpu,
                workers=train_workers, accelerator=train_accelerator_type, gpus=train_gpu_count, spot=train_spot,
                node_pool=train_node_pool, kueue_queue=settings.kueue_queue,
                namespace=settings.train_namespace, project=project, location=location)
            on_cpu(train.set_display_name(f"Train ({settings.train_launcher})"), settings, "1", "2G")
            train.after(placement)
        # Retries resume from the task's checkpoints, so a preempted (Spot) node costs minutes; a permanent
        # failure (bad input, NaN loss, a bug) is recorded and makes the retries fail at once.
        train.set_retry(num_retries=settings.train_retries, backoff_duration="60s", backoff_factor=2.0,
                        backoff_max_duration="3600s")

        evaluate = ops.evaluate_op(
            model=train.outputs["model"], dataset=prep.outputs["dataset"], min_accuracy=min_accuracy,
            min_class_recall=min_class_recall, tolerance=tolerance, registry=registry, registry_root=registry_root,
            model_name=model_name, project=project, location=location)
        # Evaluation reads the registry's current champion: never serve it from the cache.
        on_cpu(evaluate.set_display_name("Evaluate"), settings, "2", "8G").set_caching_options(False)

        predict = ops.predict_op(model=train.outputs["model"], dataset=prep.outputs["dataset"],
                                 images=predict_images)
        predict.set_display_name("Batch predict").set_cpu_request("4").set_memory_request("16G")
        on_gpu(predict, settings, settings.predict_accelerator, settings.predict_gpus)

        with dsl.If(evaluate.outputs["Output"] == True, name="blessed"):  # noqa: E712 (a pipeline condition)
            register = ops.register_op(
                model=train.outputs["model"], evaluation=evaluate.outputs["evaluation"], registry=registry,
                registry_root=registry_root, model_name=model_name, project=project, location=location,
                run_id=dsl.PIPELINE_JOB_ID_PLACEHOLDER)
            on_cpu(register.set_display_name("Register model"), settings, "1", "2G").set_caching_options(False)

    return image_classification


def compile_pipeline(output_path: str, settings: config.PipelineSettings | None = None) -> str:
    """Compiles the pipeline to KFP IR YAML (what the KFP UI, KFP API and Vertex AI Pipelines accept)."""
    compiler.Compiler().compile(build_pipeline(settings), package_path=output_path)
    return output_path
