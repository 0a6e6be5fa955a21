"""TensorFlow under the training loop: a tf.distribute strategy (components/train/cluster.py), tf.data input
(components/train/inputs.py), compiled step functions (tf.function, XLA on GPUs), tf.train.Checkpoint, tf.summary.
The default framework, and what the training step did before there was a choice."""

from __future__ import annotations

from components import gpu_driver
from components.train import batchnorm
from components.train.cluster import ClusterRole, choose_strategy, cluster_role, strategy_name
from components.train.frameworks import base
from components.train.inputs import TrainInput, make_eval_dataset
from components.train.model import check_gpus_visible, resolve_jit, tf_gpu_capability, write_model


class _TfSummaryWriter(base.SummaryWriter):
    def __init__(self, logdir: str | None):
        import tensorflow as tf

        self.writer = tf.summary.create_file_writer(logdir) if logdir else tf.summary.create_noop_writer()

    def scalar(self, name: str, value: float, step: int) -> None:
        import tensorflow as tf

        with self.writer.as_default():
            tf.summary.scalar(name, value, step=step)

    def flush(self) -> None:
        self.writer.flush()


class _TfCheckpoint(base.Checkpoint):
    """tf.train.Checkpoint through a CheckpointManager (the newest two kept); the extras are string and float64
    variables on the host, as they were before the framework choice, so older checkpoints still restore."""

    def __init__(self, model, optimizers: dict, backup_dir: str, checkpoint_dir: str, setup: str):
        import tensorflow as tf

        self.backup_dir = backup_dir
        with tf.device("/CPU:0"):  # host-side bookkeeping (strings cannot live on a GPU)
            self.variables = {"epoch_sums": tf.Variable(tf.zeros([3], tf.float64), trainable=False),
                              "history": tf.Variable("{}", dtype=tf.string, trainable=False),
                              "setup": tf.Variable(setup, dtype=tf.string, trainable=False),
                              "best": tf.Variable("{}", dtype=tf.string, trainable=False)}
        self.checkpoint = tf.train.Checkpoint(model=model, **optimizers, **self.variables)
        self.manager = tf.train.CheckpointManager(self.checkpoint, checkpoint_dir, max_to_keep=2)

    def restore_latest(self):
        import tensorflow as tf

        latest = tf.train.latest_checkpoint(self.backup_dir)
        if not latest:
            return None
        self.checkpoint.restore(latest).assert_existing_objects_matched()
        extras = {name: variable.numpy() for name, variable in self.variables.items()}
        return latest, {name: value.decode() if isinstance(value, bytes) else value.tolist()
                        for name, value in extras.items()}

    def save(self, step: int, extras: dict) -> str:
        for name, value in extras.items():
            self.variables[name].assign(value)
        return self.manager.save(checkpoint_number=step)


class Backend(base.Backend):
    name = "tensorflow"
    CPU_BF16_FASTER = True  # oneDNN's bf16 kernels: the reference CNN 5-50% faster than float32 on this machine
    # TensorFlow maps nearly all of a GPU's memory when it first uses it; memory growth maps it as allocations need
    # it: the same setting as tf.config.experimental.set_memory_growth on every GPU, read when the GPU device is
    # created (https://www.tensorflow.org/guide/gpu, "Limiting GPU memory growth").
    SHARED_GPU_ENV = {"TF_FORCE_GPU_ALLOW_GROWTH": "true"}

    def __init__(self, settings):
        super().__init__(settings)
        self.strategy = None
        self.gpus: list = []
        self.inputs: dict[int, TrainInput] = {}  # one per input pipeline (per worker), made on first use
        self._agree = None

    def role(self, tf_config: str | None) -> ClusterRole:
        self.tf_config = tf_config
        return cluster_role(tf_config)

    def start(self, role: ClusterRole) -> base.Runtime:
        import tensorflow as tf

        build = tf.sysconfig.get_build_info()
        gpu_driver.check_driver(build.get("cuda_version") if build.get("is_cuda_build") else None,
                                framework=f"TensorFlow {tf.__version__}")  # before CUDA starts
        # The strategy first: MultiWorkerMirroredStrategy must configure the runtime before any other TF op.
        self.strategy = choose_strategy(self.tf_config)
        self.gpus = tf.config.list_physical_devices("GPU")
        check_gpus_visible(self.gpus)
        return base.Runtime(self.strategy.num_replicas_in_sync, strategy_name(self.strategy), len(self.gpus))

    def gpu_capability(self):
        return tf_gpu_capability(self.gpus)

    def resolve_jit(self, requested: str) -> bool:
        return resolve_jit(requested, self.gpus)

    def scope(self):
        return self.strategy.scope()

    def step_function(self, model, optimizer, variables, loss_fn, global_batch, use_jit):
        import tensorflow as tf

        def replica_step(images, labels):
            """One optimizer step on one replica's batch; returns its (loss sum, correct, count)."""
            with tf.GradientTape() as tape:
                logits = model(images, training=True)
                per_example = loss_fn(labels, logits)
                loss = tf.reduce_sum(per_example) / global_batch
                scaled = optimizer.scale_loss(loss)
            grads = tape.gradient(scaled, variables)
            optimizer.apply(grads, variables)
            correct = tf.reduce_sum(tf.cast(tf.equal(tf.argmax(logits, -1, output_type=tf.int32), labels),
                                            tf.float32))
            return tf.stack([tf.reduce_sum(per_example), correct, tf.cast(tf.size(labels), tf.float32)])

        if use_jit:
            replica_step = tf.function(replica_step, jit_compile=True)
        strategy = self.strategy

        def steps(iterator, count):
            """`count` steps on every replica in one call into the runtime; the per-step sums over all replicas."""
            sums = tf.TensorArray(tf.float32, size=count)
            for i in tf.range(count):
                images, labels = next(iterator)
                sums = sums.write(i, strategy.reduce("SUM", strategy.run(replica_step, args=(images, labels)),
                                                     axis=None))
            return sums.stack()

        compiled = tf.function(steps)
        return lambda iterator, count: compiled(iterator, tf.constant(count)).numpy()

    def predict_function(self, model):
        import tensorflow as tf

        return tf.function(lambda images: model(images, training=False))

    def checkpoint(self, model, optimizers, *, backup_dir, scratch, is_chief, setup):
        import os

        if not backup_dir:
            return None
        # The other workers write what the chief writes to scratch space, deleted at the end.
        checkpoint_dir = backup_dir if is_chief else os.path.join(scratch, "checkpoints")
        return _TfCheckpoint(model, optimizers, backup_dir, checkpoint_dir, setup)

    def agree(self, flags):
        # Every worker must take the same decision (save, stop) at the same step, or the all-reduces hang.
        import tensorflow as tf

        if self._agree is None:
            strategy = self.strategy
            self._agree = tf.function(
                lambda values: strategy.reduce("SUM", strategy.run(lambda: tf.identity(values)), axis=None))
        return self._agree(tf.constant(flags)).numpy().tolist()

    def batches(self, spec, epoch, first_step):
        def dataset_fn(context):
            per_replica = context.get_per_replica_batch_size(spec.global_batch)
            per_pipeline = spec.replicas // context.num_input_pipelines  # replicas fed by this pipeline
            return self._input_for(spec, context).dataset(epoch, first_step * per_pipeline,
                                                          (spec.steps_per_epoch - first_step) * per_pipeline,
                                                          per_replica)

        return iter(self.strategy.distribute_datasets_from_function(dataset_fn))

    def _input_for(self, spec, context) -> TrainInput:
        if context.input_pipeline_id not in self.inputs:
            self.inputs[context.input_pipeline_id] = TrainInput(
                spec.train_dir, spec.image_shape, pipeline_id=context.input_pipeline_id,
                num_pipelines=context.num_input_pipelines, recipe=spec.recipe, online_policy=spec.online_policy,
                mode=spec.mode)
        return self.inputs[context.input_pipeline_id]

    def input_mode(self):
        return next(iter(self.inputs.values())).mode if self.inputs else None

    def eval_batches(self, dataset_dir, split, batch):
        return make_eval_dataset(dataset_dir, split, batch)

    def recalibration_batches(self, dataset_dir):
        return batchnorm.recalibration_images(dataset_dir)

    def summary_writer(self, logdir):
        return _TfSummaryWriter(logdir)

    def is_peer_loss(self, error):
        # A peer gone away (a preempted node, a restarted pod): its collective ops fail, or
        # MultiWorkerMirroredStrategy's health check aborts them.
        import tensorflow as tf

        return isinstance(error, (tf.errors.UnavailableError, tf.errors.AbortedError, tf.errors.DeadlineExceededError,
                                  tf.errors.CancelledError))

    def write_model(self, model, image_shape, num_classes, model_dir, model_name):
        write_model(model, image_shape, num_classes, model_dir, model_name)
        return {"framework": self.name, "serving_format": "keras+saved_model"}

