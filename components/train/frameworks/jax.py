"""JAX under the training loop: Keras models on Keras' JAX backend, trained by a jitted stateless step (what
keras/src/backend/jax/trainer.py's train_step does: `model.stateless_call`, `jax.value_and_grad`,
`optimizer.stateless_apply`), with Keras' distribution API.

Distribution: `keras.distribution.DataParallel` over every device of the job, one mesh axis "batch": the variables
are replicated, each batch is split over the devices, and XLA sums the gradients over them (the all-reduce is part
of the compiled step). Several processes (one per host) join through `jax.distributed.initialize`, told by
JAX_COORDINATOR_ADDRESS (host:port of process 0, JAX's own variable), JAX_NUM_PROCESSES and JAX_PROCESS_ID; each
reads its own shard files and hands its part of the global batch to the step (`jax.make_array_from_process_local_data`).
CPUs exchange through gloo. Process 0 is the chief.
"""

from __future__ import annotations

import logging
import os
import socket
import zlib

import numpy as np

from components import gpu_driver
from components.train.cluster import ClusterRole
from components.train.frameworks import base, events, portable
from components.train.model import check_gpus_visible, write_keras_model

log = logging.getLogger(__name__)

COORDINATOR_ENV, PROCESSES_ENV, PROCESS_ID_ENV = "JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID"


def cuda_version() -> str | None:
    """The CUDA JAX's GPU plugin was built for ("13.0"), read without a GPU as images/gpu_libs.py reads it at build
    time; None without the plugin (a CPU install)."""
    try:
        from jax_cuda13_plugin import _versions
    except ImportError:
        return None
    cuda = _versions.cuda_runtime_build_version()  # 13000
    return f"{cuda // 1000}.{cuda % 1000 // 10}"


class Backend(base.Backend):
    name = "jax"
    # JAX's GPU client preallocates 75% of the GPU's memory when it starts; without preallocation it allocates as
    # needed (https://docs.jax.dev/en/latest/gpu_memory_allocation.html). Read when the GPU client is made.
    SHARED_GPU_ENV = {"XLA_PYTHON_CLIENT_PREALLOCATE": "false"}

    def __init__(self, settings):
        super().__init__(settings)
        self.processes, self.process_id = 1, 0
        self.local_processes = 1  # of the job's processes, those on this host: they share its CPUs
        self.input = None
        self.data_sharding = None

    # ------------------------------------------------------------------------------- prepare

    def role(self, tf_config):
        self.processes = int(os.environ.get(PROCESSES_ENV, "1"))
        self.process_id = int(os.environ.get(PROCESS_ID_ENV, "0"))
        if not 0 <= self.process_id < self.processes:
            raise ValueError(f"{PROCESS_ID_ENV}={self.process_id} is outside {PROCESSES_ENV}={self.processes}")
        if self.processes > 1 and not os.environ.get(COORDINATOR_ENV):
            raise ValueError(f"{PROCESSES_ENV}={self.processes} needs {COORDINATOR_ENV} (host:port of process 0)")
        task = f"process/{self.process_id}" if self.processes > 1 else "local"
        return ClusterRole(self.processes, self.process_id == 0, task)

    def start(self, role):
        import jax

        gpu_driver.check_driver(cuda_version(), framework=f"JAX {jax.__version__}")  # before CUDA starts
        if self.processes > 1:
            jax.config.update("jax_cpu_collectives_implementation", "gloo")
            jax.distributed.initialize(os.environ[COORDINATOR_ENV], self.processes, self.process_id)
            self.local_processes = self._processes_on_this_host()
        import keras

        devices = jax.devices()
        gpus = [d for d in devices if d.platform == "gpu"]
        check_gpus_visible(gpus, framework="JAX", probe="python3 -c \"import jax; print(jax.devices())\"")
        self.gpus = gpus
        distribution = keras.distribution.DataParallel(devices=devices)
        keras.distribution.set_distribution(distribution)
        mesh = jax.sharding.Mesh(np.array(devices), ("batch",))
        self.data_sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("batch"))
        return base.Runtime(len(devices), f"DataParallel({len(devices)} devices, {self.processes} processes)",
                            len(jax.local_devices()) if gpus else 0)

    def gpu_capability(self):
        if not self.gpus:
            return None
        return tuple(int(n) for n in str(getattr(self.gpus[0], "compute_capability", "0.0")).split(".")[:2])

    def _processes_on_this_host(self) -> int:
        """How many of the job's processes share this host. jax.distributed has no local count (its rule is one
        process per host, but several can share one, as in the two-process tests): the processes exchange a key of
        their host name (one small all-gather at the start)."""
        from jax.experimental import multihost_utils

        key = np.int32(zlib.crc32(socket.gethostname().encode()) & 0x7FFFFFFF)
        keys = np.asarray(multihost_utils.process_allgather(key)).reshape(-1)
        return int((keys == key).sum())

    def resolve_jit(self, requested):
        return True  # a JAX step is always compiled by XLA

    # ------------------------------------------------------------------------------- build

    def step_function(self, model, optimizer, variables, loss_fn, global_batch, use_jit):
        import jax
        import jax.numpy as jnp

        trainable = list(variables)
        trainable_ids = {id(v) for v in trainable}
        # Every model variable that is not trained in this phase (frozen layers, statistics, dropout seeds).
        others = [v for v in model.variables if id(v) not in trainable_ids]

        def loss_and_updates(trainable_values, other_values, images, labels):
            # model.stateless_call takes (trainable, non-trainable) in the model's own split; rebuild it.
            values = {id(v): value for v, value in zip(trainable, trainable_values)}
            values.update({id(v): value for v, value in zip(others, other_values)})
            logits, non_trainable_updates = model.stateless_call(
                [values[id(v)] for v in model.trainable_variables],
                [values[id(v)] for v in model.non_trainable_variables], images, training=True)
            updated = dict(zip((id(v) for v in model.non_trainable_variables), non_trainable_updates))
            per_example = loss_fn(labels, logits)
            return jnp.sum(per_example) / global_batch, (per_example, logits,
                                                         [updated.get(id(v), values[id(v)]) for v in others])

        grad_fn = jax.value_and_grad(loss_and_updates, has_aux=True)

        @jax.jit
        def train_step(state, images, labels):
            trainable_values, other_values, optimizer_values = state
            (_, (per_example, logits, other_values)), grads = grad_fn(trainable_values, other_values, images, labels)
            trainable_values, optimizer_values = optimizer.stateless_apply(optimizer_values, grads, trainable_values)
            sums = jnp.stack([jnp.sum(per_example.astype("float32")),
                              jnp.sum((jnp.argmax(logits, -1) == labels).astype("float32")),
                              jnp.asarray(labels.shape[0], "float32")])
            return (trainable_values, other_values, optimizer_values), sums

        def run(iterator, count):
            state = ([v.value for v in trainable], [v.value for v in others], [v.value for v in optimizer.variables])
            sums = []
            for _ in range(count):
                images, labels = next(iterator)
                state, step_sums = train_step(state, self._global(images), self._global(labels.astype("int32")))
                sums.append(step_sums)
            # Back into the Keras variables: checkpoints, validation and the learning rate read them.
            for group, values in zip((trainable, others, optimizer.variables), state):
                for variable, value in zip(group, values):
                    variable.assign(value)
            return np.asarray(jnp.stack(sums))

        return run

    def _global(self, local):
        """This process's part of the global batch as one array over every device of the job."""
        import jax

        return jax.make_array_from_process_local_data(self.data_sharding, np.asarray(local))

    def predict_function(self, model):
        import jax

        @jax.jit
        def logits(trainable_values, non_trainable_values, images):
            return model.stateless_call(trainable_values, non_trainable_values, images, training=False)[0]

        def predict(images):
            return logits([v.value for v in model.trainable_variables],
                          [v.value for v in model.non_trainable_variables], np.asarray(images, np.float32))

        return predict

    def checkpoint(self, model, optimizers, *, backup_dir, scratch, is_chief, setup):
        if not backup_dir:
            return None
        return portable.NumpyCheckpoint(model, optimizers, backup_dir=backup_dir,
                                        checkpoint_dir=portable.scratch_checkpoint_dir(backup_dir, scratch, is_chief),
                                        rng_state=dict, set_rng_state=lambda state: None)  # JAX keeps no global RNG

    def agree(self, flags):
        from jax.experimental import multihost_utils

        return np.asarray(multihost_utils.process_allgather(np.asarray(flags, np.float32))).reshape(
            -1, len(flags)).sum(axis=0).tolist()

    # ------------------------------------------------------------------------------- run epochs

    def batches(self, spec, epoch, first_step):
        if self.input is None:
            self.input = portable.train_input(spec, pipeline_id=self.process_id, num_pipelines=self.processes,
                                              local_processes=self.local_processes)
        per_process = spec.global_batch // self.processes
        return iter(self.input.batches(epoch, first_step, spec.steps_per_epoch - first_step, per_process))

    def input_mode(self):
        return self.input.mode if self.input is not None else None

    def eval_batches(self, dataset_dir, split, batch):
        return portable.Deferred(lambda: self.input.eval_batches(dataset_dir, split, batch))

    def recalibration_batches(self, dataset_dir):
        return portable.Deferred(lambda: portable.recalibration_sample(
            self.input.stream_batches(dataset_dir, "train", 256)), once=True)

    def summary_writer(self, logdir):
        return events.EventWriter(logdir)

    # ------------------------------------------------------------------------------- export

    def write_model(self, model, image_shape, num_classes, model_dir, model_name):
        write_keras_model(model, image_shape, num_classes, model_dir, model_name)
        return {"framework": self.name, "serving_format": "keras+saved_model",
                **portable.export_saved_model(model_dir, image_shape, model_name)}
