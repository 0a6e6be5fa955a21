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
        recipe: str = "reference",
        epochs: int = 12,
        batch_size: int = 0,
        learning_rate: float = 0.0,
        checkpoint_root: str = "",
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
            recipe: Training recipe preset; reference is the classic 12-epoch recipe.
            epochs: Training epochs.
            batch_size: Batch size per replica (0: the recipe's).
            learning_rate: Base learning rate (0: the recipe's).
            checkpoint_root: Durable directory for training checkpoints (empty: the pipeline root).
            min_accuracy: A model below this test accuracy is not blessed.
            min_class_recall: Minimum recall for every class (negative: no such check).
            tolerance: A model may trail the champion's accuracy by this much and still be blessed.
            predict_images: Folder of images to classify (empty: 10 test images per class).
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

        train = ops.train_op(
            dataset=prep.outputs["dataset"], augmented=aug.outputs["augmented"], recipe=recipe, epochs=epochs,
            batch_size=batch_size, learning_rate=learning_rate, checkpoint_root=checkpoint_root,
            pipeline_root=dsl.PIPELINE_ROOT_PLACEHOLDER, run_id=dsl.PIPELINE_JOB_ID_PLACEHOLDER,
            task_name=dsl.PIPELINE_TASK_NAME_PLACEHOLDER)
        train.set_display_name("Train").set_cpu_request("4").set_memory_request("16G")
        on_gpu(train, settings, settings.train_accelerator, settings.train_gpus)
        # Retries resume from the task's checkpoints (BackupAndRestore), so a preempted node costs minutes.
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
