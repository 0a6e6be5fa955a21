"""What the training loop asks of a framework: `Backend`, implemented once per framework (tensorflow.py, torch.py,
jax.py). The loop (components/train/loop.py) keeps everything else: the plan, the model and its transfer-learning
phases, the optimizers (Keras optimizers run on every backend), the learning rate, the epoch's sums and history,
SIGTERM, validation, the best epoch, BatchNormalization re-estimation, training.json.

Batches cross the seam as whatever the backend's model takes (numpy arrays or the framework's tensors); what
comes back to the loop is numpy or Python numbers.
"""

from __future__ import annotations

import abc
import contextlib
import dataclasses
import logging
import os
from typing import Any, Callable, Iterable, Iterator

from components.train import models
from components.train.cluster import ClusterRole
from components.train.model import cpu_has_bf16, precision_for

log = logging.getLogger(__name__)
# The shares of a GPU whose memory other pods use too (placement.SharedGpu.describe: "time-sharing 4", "mps 2");
# a MIG slice ("mig 1g.10gb") has memory of its own, which the framework may take as on a whole GPU.
MEMORY_SHARING = ("time-sharing", "mps")


@dataclasses.dataclass(frozen=True)
class Runtime:
    """What `Backend.start` found: how many replicas train together, and what to call the distribution."""

    replicas: int  # model replicas in the job: global batch = per-replica batch x replicas
    distribution: str  # e.g. MultiWorkerMirroredStrategy, DistributedDataParallel(gloo), DataParallel
    accelerators: int  # GPUs this process trains on (0: the CPU)


@dataclasses.dataclass(frozen=True)
class InputSpec:
    """What a training input is made of: the loop's plan, as the backends need it."""

    train_dir: str
    image_shape: list
    recipe: Any  # recipes.Recipe
    online_policy: dict | None
    mode: str  # settings.input_mode
    replicas: int
    global_batch: int
    steps_per_epoch: int


class Checkpoint(abc.ABC):
    """The training state in `backup_dir`: weights, the optimizers' state (their step counters included) and
    `extras` (the epoch's running sums and the JSON texts of history, setup and best epoch), step-exact."""

    @abc.abstractmethod
    def restore_latest(self) -> tuple[str, dict] | None:
        """Loads the newest checkpoint into the model and optimizers; returns (its name, its extras), or None."""

    @abc.abstractmethod
    def save(self, step: int, extras: dict) -> str:
        """Writes a checkpoint numbered `step` (every process calls it; only the chief's lands in backup_dir);
        returns its path."""


class SummaryWriter(abc.ABC):
    """TensorBoard scalars (the chief's; the others get one that writes nothing)."""

    @abc.abstractmethod
    def scalar(self, name: str, value: float, step: int) -> None: ...

    @abc.abstractmethod
    def flush(self) -> None: ...


class Backend(abc.ABC):
    """One framework under the training loop. Made once per attempt with the run's settings (TrainSettings)."""

    name: str  # tensorflow, torch, jax: what training.json, the registry and the run page call it
    # auto precision on a CPU with native bf16: whether this framework's CPU kernels train faster in it
    CPU_BF16_FASTER = False
    # The framework's variables that make it take GPU memory as it needs it, for a GPU whose memory other pods
    # share (time-sharing has no memory isolation; MPS limits each client to its share): each framework's own.
    SHARED_GPU_ENV: dict[str, str] = {}

    def __init__(self, settings):
        self.settings = settings
        self.shared_gpu_env = self.share_gpu_memory(getattr(settings, "shared_gpu", None))

    @classmethod
    def share_gpu_memory(cls, shared_gpu: str | None, environ=None) -> dict[str, str]:
        """On a GPU whose memory is shared, sets SHARED_GPU_ENV in `environ` (os.environ) before the framework
        starts CUDA, leaving a value the pod already sets; returns what it set."""
        environ = os.environ if environ is None else environ
        if not shared_gpu or shared_gpu.split()[0] not in MEMORY_SHARING:
            return {}
        applied = {name: value for name, value in cls.SHARED_GPU_ENV.items() if name not in environ}
        environ.update(applied)
        log.info("train: the GPU is shared (%s): %s", shared_gpu,
                 ", ".join(f"{k}={v}" for k, v in applied.items()) or "the pod's own memory settings kept")
        return applied

    # ------------------------------------------------------------------------------- prepare

    @abc.abstractmethod
    def role(self, tf_config: str | None) -> ClusterRole:
        """Who this process is in the job (its framework's variables: TF_CONFIG, torchrun's RANK/WORLD_SIZE, ...)."""

    @abc.abstractmethod
    def start(self, role: ClusterRole) -> Runtime:
        """Starts the distribution (the collective runtime) and checks the accelerators are visible."""

    def resolve_precision(self, requested: str) -> str:
        """The Keras dtype policy for `requested` (auto: bf16/fp16 on GPUs that compute it fast; on CPUs float32,
        or bf16 where the framework's CPU kernels gain from it; model.precision_for, one rule for every framework)."""
        if requested != "auto":
            return requested
        return precision_for(requested, self.gpu_capability(), self.CPU_BF16_FASTER and cpu_has_bf16())

    @abc.abstractmethod
    def gpu_capability(self) -> tuple[int, int] | None:
        """The CUDA compute capability of the GPU this process trains on (the first, if several); None on a CPU."""

    @abc.abstractmethod
    def resolve_jit(self, requested: str) -> bool:
        """Whether the step is compiled (XLA, or the framework's compiler)."""

    # ------------------------------------------------------------------------------- build

    @staticmethod
    def native_model(name: str, built, image_shape: tuple, num_classes: int):
        """The Keras model training uses for `built`, what a bring-your-own builder returned when it is not a
        keras.Model: a model of this framework's own (a torch.nn.Module on torch) wrapped in Keras, checked on a
        batch of two images; ModelError otherwise, saying what the builder must return. Called under the run's
        Keras dtype policy (models.build)."""
        return models.check_output(name, built, image_shape, num_classes)

    @staticmethod
    def check_native(name: str, built, image_shape: tuple, num_classes: int) -> None:
        """What pipectl checks of the same, where Keras may run on another backend: ModelError when `built`
        is not a model this framework trains, or its output is not (batch, num_classes)."""
        models.check_output(name, built, image_shape, num_classes)

    def scope(self) -> contextlib.AbstractContextManager:
        """Where the model and optimizers are made (tf.distribute's strategy scope; nothing elsewhere)."""
        return contextlib.nullcontext()

    @abc.abstractmethod
    def step_function(self, model, optimizer, variables: list, loss_fn: Callable, global_batch: int,
                      use_jit: bool) -> Callable[[Iterator, int], Any]:
        """`run(batches, count)`: `count` optimizer steps of `optimizer` on `variables` (gradients of
        sum(loss_fn(labels, logits)) / global_batch, summed over the replicas), each on the next item of `batches`;
        returns a numpy array [count, 3] of each step's (loss sum, correct, count) over all replicas."""

    @abc.abstractmethod
    def predict_function(self, model) -> Callable:
        """images -> logits (inference mode), for validation and the epoch callback."""

    @abc.abstractmethod
    def checkpoint(self, model, optimizers: dict, *, backup_dir: str | None, scratch: str | None,
                   is_chief: bool, setup: str) -> Checkpoint | None:
        """The checkpoint of this training (None without a backup_dir). `optimizers` by name: "optimizer" (the
        fine-tuning, or only, phase's) and "head_optimizer" when there is a frozen phase."""

    @abc.abstractmethod
    def agree(self, flags: list[float]) -> list[float]:
        """Each flag summed over the processes of the job (> 0: some process raised it)."""

    # ------------------------------------------------------------------------------- run epochs

    @abc.abstractmethod
    def batches(self, spec: InputSpec, epoch: int, first_step: int) -> Iterator:
        """The batches this process trains on in `epoch`, from its step `first_step` to its end, for
        `step_function`'s run (seekable: a resumed attempt sees the batches the interrupted one would have)."""

    @abc.abstractmethod
    def input_mode(self) -> str | None:
        """memory or stream: what the training input chose (None before it was made)."""

    @abc.abstractmethod
    def eval_batches(self, dataset_dir: str, split: str, batch: int) -> Iterable:
        """(images float32 0-255, labels int32) batches of a split, in order (validation)."""

    @abc.abstractmethod
    def recalibration_batches(self, dataset_dir: str) -> Iterable:
        """The fixed sample of training images BatchNormalization statistics are re-estimated over
        (components/train/batchnorm.py)."""

    @abc.abstractmethod
    def summary_writer(self, logdir: str | None) -> SummaryWriter:
        """TensorBoard scalars into `logdir` (None: a writer that writes nothing)."""

    def is_peer_loss(self, error: Exception) -> bool:
        """Whether `error` is the framework's for a peer process gone away, in any phase: a retry resumes
        (faults.py)."""
        return False

    # ------------------------------------------------------------------------------- export

    @abc.abstractmethod
    def write_model(self, model, image_shape, num_classes: int, model_dir: str, model_name: str) -> dict:
        """Writes the float32 model (model.keras, and the SavedModel serving loads: components/train/model.py;
        TorchScript for a torch.nn.Module on torch); returns what training.json records about it ({"framework",
        "serving_format", ...})."""

    def finish(self) -> None:
        """Ends the distribution (process groups), after the export."""
