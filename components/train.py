"""Train: the image classifier under a tf.distribute strategy, resumable to the step after a preemption.

Distribution. The strategy comes from the machine: `TF_CONFIG` naming several workers ->
MultiWorkerMirroredStrategy; several local GPUs -> MirroredStrategy; otherwise the default strategy (one
device). The global batch is the per-replica batch times the replicas, and the learning rate is scaled with it
(linear scaling, ramped up over the recipe's warm-up epochs; `scale_lr=False` turns it off). Each worker reads
its own share of the training shards (shard by file, see `TrainInput`), and only the chief writes the model,
the metrics and the TensorBoard logs; the other workers write theirs to scratch space and delete it.

Fault tolerance. Checkpoints (weights, optimizer state, step, the epoch's running metrics and the history) go
to `backup_dir`, which the pipeline keys by run and task in durable storage: at the end of every epoch, every
`checkpoint_seconds` within one, and when SIGTERM arrives (a Spot VM preemption or a pod eviction). A new
attempt with the same `backup_dir` resumes from the last checkpoint, mid-epoch, on the same batches it would
have seen, and runs exactly the planned number of steps. Exit codes of `main()` (and of the pipeline step):

    0    trained (or found already trained in backup_dir: the model is written again)
    143  preempted (SIGTERM; a checkpoint was saved) or a peer worker was lost: retry, it resumes
    137  killed (SIGKILL, out of memory): retry, it resumes from the last periodic checkpoint
    2    bad input or settings, or the loss became NaN/inf: permanent, retrying cannot help
    1    an unexpected error (a bug): permanent

Codes 128-255 are what a Kubeflow TFJob with `restartPolicy: ExitCode` restarts, and 1-127 what it does not.
A KFP task retry restarts on any failure, so a permanent failure leaves `FAILED.json` in `backup_dir`: a
retried attempt finds it and fails at once with the original reason instead of spending GPU time again.

Outputs in `model_dir`: `model.keras` (Keras, float32), `saved_model/` (TF SavedModel returning class
probabilities, what Vertex AI's TensorFlow serving containers load), `training.json` (recipe, class names,
image shape, per-epoch history, steps, timings, throughput).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import logging
import math
import os
import shutil
import signal
import sys
import tempfile
import threading
import time

from components import augment as augment_lib
from components import data

log = logging.getLogger(__name__)

TRAINING_INFO = "training.json"
FAILED_MARKER = "FAILED.json"

EXIT_OK = 0
EXIT_BUG = 1
EXIT_PERMANENT = 2
EXIT_PREEMPTED = 143  # 128 + SIGTERM, what a TFJob's ExitCode policy and a KFP retry restart
EXIT_KILLED = 137  # 128 + SIGKILL: set by the kernel, not by us; listed for the docs and the launcher
RETRYABLE_EXIT_CODES = frozenset(range(128, 256))

# Up to this many bytes of a worker's training images are held in memory as one array (fast, exactly
# resumable); larger datasets stream from the shards.
MEMORY_INPUT_LIMIT_BYTES = 2 << 30


@dataclasses.dataclass(frozen=True)
class Recipe:
    """How to train: the model is always the reference CNN; these are the knobs around it."""

    epochs: int = 12
    batch_size: int = 64  # per replica
    learning_rate: float = 1e-3  # for one replica; scaled by the number of replicas when scale_lr is on
    lr_schedule: str = "steps"  # "steps": factors from lr_steps; "cosine": cosine decay to zero after warm-up
    # Stepped schedule: (first epoch, factor of learning_rate), epochs counted from 0.
    lr_steps: tuple[tuple[int, float], ...] = ((0, 1.0), (3, 0.1), (7, 0.01))
    scale_lr: bool = True  # linear scaling rule: learning rate x replicas
    warmup_epochs: float = 1.0  # ramp from the one-replica rate to the scaled one (Goyal et al., 2017)
    label_smoothing: float = 0.0  # share of the target spread over the other classes (training loss only)
    shuffle_buffer: int = 10_000  # streamed input only; in-memory input shuffles the whole split
    steps_per_execution: int = 1  # training steps per call into the TF runtime
    precision: str = "auto"  # auto (bf16/fp16 on GPUs that have them, else float32), float32, mixed_*
    jit_compile: str = "auto"  # auto (XLA on GPU, not on CPU where it made this model slower), on, off
    seed: int = 0  # initial weights and data order

    def validate(self) -> "Recipe":
        problems = []
        if self.epochs < 1:
            problems.append(f"epochs must be >= 1, got {self.epochs}")
        if self.batch_size < 1:
            problems.append(f"batch_size must be >= 1, got {self.batch_size}")
        if not self.learning_rate > 0:
            problems.append(f"learning_rate must be > 0, got {self.learning_rate}")
        if self.lr_schedule not in ("steps", "cosine"):
            problems.append(f"lr_schedule must be steps or cosine, got {self.lr_schedule!r}")
        if self.steps_per_execution < 1:
            problems.append(f"steps_per_execution must be >= 1, got {self.steps_per_execution}")
        if self.precision not in PRECISIONS:
            problems.append(f"precision must be one of {', '.join(PRECISIONS)}, got {self.precision!r}")
        if self.jit_compile not in ("auto", "on", "off"):
            problems.append(f"jit_compile must be auto, on or off, got {self.jit_compile!r}")
        if not 0 <= self.label_smoothing < 1:
            problems.append(f"label_smoothing must be in [0, 1), got {self.label_smoothing}")
        if self.warmup_epochs < 0:
            problems.append(f"warmup_epochs must be >= 0, got {self.warmup_epochs}")
        if problems:
            raise ValueError("Invalid training recipe: " + "; ".join(problems))
        return self


PRECISIONS = ("auto", "float32", "mixed_bfloat16", "mixed_float16")

RECIPES = {
    # The classic recipe, as written: batch 64, Adam 1e-3 -> 1e-4 from epoch 3 -> 1e-5 from epoch 7, 12 epochs.
    "reference": Recipe(),
    # Same model, at least the same accuracy, a fraction of the time (see `make bench`): twice the batch at twice
    # the rate with cosine decay, 8 epochs, 16 steps per call into the runtime, bf16 where the hardware has it.
    "fast": Recipe(epochs=8, batch_size=128, learning_rate=2e-3, lr_schedule="cosine", steps_per_execution=16),
}
DEFAULT_RECIPE = "fast"


def resolve_recipe(name: str, **overrides) -> Recipe:
    """The named preset with the given overrides (None values are ignored), validated."""
    if name not in RECIPES:
        raise ValueError(f"Unknown recipe {name!r}; known: {', '.join(sorted(RECIPES))}")
    given = {k: v for k, v in overrides.items() if v is not None}
    unknown = sorted(set(given) - {f.name for f in dataclasses.fields(Recipe)})
    if unknown:
        raise ValueError(f"Unknown recipe settings {unknown}")
    return dataclasses.replace(RECIPES[name], **given).validate()


@dataclasses.dataclass
class TrainResult:
    model_dir: str
    epochs: int
    steps: int  # optimizer steps taken in all attempts together: always epochs x steps_per_epoch
    steps_per_epoch: int
    global_batch_size: int
    replicas: int
    workers: int
    strategy: str
    learning_rate: float  # peak rate after scaling
    precision: str
    jit_compile: bool
    input_mode: str
    resumed_from_step: int
    history: dict
    train_seconds: float  # this attempt: from the first to the last step, validation included
    images_per_second: float  # this attempt's training images per second of train_seconds

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


class NonFiniteLossError(RuntimeError):
    pass


class Preempted(RuntimeError):
    """SIGTERM arrived; a checkpoint was saved and the process should exit with EXIT_PREEMPTED."""


class PermanentFailure(RuntimeError):
    """An earlier attempt of this task failed in a way retrying cannot fix."""


# ---------------------------------------------------------------------------------------------- cluster


@dataclasses.dataclass(frozen=True)
class ClusterRole:
    workers: int  # training processes (chief + workers)
    is_chief: bool
    task: str  # e.g. "chief/0", "worker/1", "local"


def cluster_role(tf_config: str | None) -> ClusterRole:
    """Who this process is in `TF_CONFIG`: the chief is `chief/0`, or `worker/0` when there is no chief."""
    config = json.loads(tf_config or "{}")
    cluster = config.get("cluster", {})
    workers = sum(len(cluster.get(role, [])) for role in ("chief", "worker"))
    task = config.get("task", {})
    task_type, index = task.get("type", ""), int(task.get("index", 0))
    if workers <= 1:
        return ClusterRole(1, True, "local" if not task_type else f"{task_type}/{index}")
    if task_type not in ("chief", "worker"):
        raise ValueError(f"TF_CONFIG task type {task_type!r} is not supported (chief and worker are)")
    is_chief = task_type == "chief" or (task_type == "worker" and index == 0 and not cluster.get("chief"))
    return ClusterRole(workers, is_chief, f"{task_type}/{index}")


def strategy_name(strategy) -> str:
    import tensorflow as tf

    if isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):  # the class is CollectiveAllReduceStrategy
        return "MultiWorkerMirroredStrategy"
    if isinstance(strategy, tf.distribute.MirroredStrategy):
        return "MirroredStrategy"
    return "DefaultStrategy"


def choose_strategy(tf_config: str | None = None):
    """MultiWorkerMirrored when TF_CONFIG names several workers, Mirrored over several local GPUs, else default."""
    import tensorflow as tf

    if cluster_role(tf_config if tf_config is not None else os.environ.get("TF_CONFIG")).workers > 1:
        return tf.distribute.MultiWorkerMirroredStrategy()
    if len(tf.config.list_physical_devices("GPU")) > 1:
        return tf.distribute.MirroredStrategy()
    return tf.distribute.get_strategy()


# ---------------------------------------------------------------------------------------------- model


def check_gpus_visible(gpus: list, device_dir: str = "/dev") -> None:
    """Fails fast when the pod was given GPUs (the device plugin mounts /dev/nvidiaN) but TensorFlow sees none:
    a driver/CUDA mismatch in the image would otherwise train on the CPU of a GPU node, silently and slowly."""
    try:
        devices = [n for n in os.listdir(device_dir) if n.startswith("nvidia") and n[len("nvidia"):].isdigit()]
    except OSError:
        return
    if devices and not gpus:
        raise RuntimeError(f"This machine has GPU devices ({', '.join(sorted(devices))} in {device_dir}) but "
                           "TensorFlow sees none: the image's CUDA/cuDNN does not match the node's driver. Check "
                           "with: python3 -c \"import tensorflow as tf; print(tf.config.list_physical_devices('GPU'))\"")


def build_model(image_shape: list[int] | tuple[int, ...], num_classes: int, dtype_policy: str = "float32"):
    """The reference CNN. Pixel scaling is part of the model, so serving takes raw 0-255 pixels."""
    import keras

    policy = keras.DTypePolicy(dtype_policy)
    return keras.Sequential([
        keras.Input(shape=tuple(image_shape), name="image"),
        keras.layers.Rescaling(1.0 / 255, dtype=policy),
        keras.layers.Conv2D(32, 3, activation="relu", dtype=policy),
        keras.layers.MaxPooling2D(dtype=policy),
        keras.layers.Flatten(dtype=policy),
        keras.layers.Dense(64, activation="relu", dtype=policy),
        keras.layers.Dense(num_classes, name="logits", dtype="float32"),  # softmax/loss stay in float32
    ], name="classifier")


def cpu_has_bf16() -> bool:
    """Whether the CPU computes in bfloat16 natively (AVX512-BF16 or AMX): then bf16 training is faster on it."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((line for line in f if line.startswith("flags")), "").split()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def resolve_precision(requested: str, gpus: list) -> str:
    """bf16 on GPUs with compute capability >= 8 (A100, L4, H100, H200), fp16 on 7.x (T4, V100); on CPUs, bf16
    where they compute it natively (measured ~20% faster for this model), else float32."""
    if requested != "auto":
        return requested
    if not gpus:
        return "mixed_bfloat16" if cpu_has_bf16() else "float32"
    import tensorflow as tf

    capability = tf.config.experimental.get_device_details(gpus[0]).get("compute_capability", (0, 0))
    if capability >= (8, 0):
        return "mixed_bfloat16"
    if capability >= (7, 0):
        return "mixed_float16"
    return "float32"


def resolve_jit(requested: str, gpus: list) -> bool:
    return requested == "on" or (requested == "auto" and bool(gpus))


# ---------------------------------------------------------------------------------------------- schedule


def peak_learning_rate(recipe: Recipe, replicas: int) -> float:
    return recipe.learning_rate * (replicas if recipe.scale_lr else 1)


def learning_rate_for(epoch: float, recipe: Recipe, replicas: int = 1) -> float:
    """The rate at a (fractional) epoch: warm-up from the one-replica rate, then steps or cosine decay."""
    peak = peak_learning_rate(recipe, replicas)
    if epoch < recipe.warmup_epochs and peak != recipe.learning_rate:
        return recipe.learning_rate + (peak - recipe.learning_rate) * epoch / recipe.warmup_epochs
    if recipe.lr_schedule == "cosine":
        start = recipe.warmup_epochs if peak != recipe.learning_rate else 0.0
        progress = min(1.0, max(0.0, (epoch - start) / max(recipe.epochs - start, 1e-9)))
        return peak * 0.5 * (1.0 + math.cos(math.pi * progress))
    factor = 1.0
    for first_epoch, step_factor in recipe.lr_steps:
        if epoch >= first_epoch:
            factor = step_factor
    return peak * factor


def _schedule(recipe: Recipe, replicas: int, steps_per_epoch: int):
    """`learning_rate_for` as a Keras schedule on the optimizer's step (restored with the checkpoint)."""
    import keras
    import tensorflow as tf

    peak = peak_learning_rate(recipe, replicas)
    warmup_steps = recipe.warmup_epochs * steps_per_epoch if peak != recipe.learning_rate else 0.0
    total_steps = recipe.epochs * steps_per_epoch

    class RecipeSchedule(keras.optimizers.schedules.LearningRateSchedule):
        def __call__(self, step):
            step = tf.cast(step, tf.float32)
            warm = recipe.learning_rate + (peak - recipe.learning_rate) * step / max(warmup_steps, 1.0)
            if recipe.lr_schedule == "cosine":
                progress = tf.clip_by_value((step - warmup_steps) / max(total_steps - warmup_steps, 1.0), 0.0, 1.0)
                after = peak * 0.5 * (1.0 + tf.cos(math.pi * progress))
            else:
                epoch = tf.floor(step / steps_per_epoch)
                factor = tf.constant(1.0)
                for first_epoch, step_factor in recipe.lr_steps:
                    factor = tf.where(epoch >= first_epoch, tf.constant(step_factor, tf.float32), factor)
                after = peak * factor
            return tf.where(step < warmup_steps, warm, after)

        def get_config(self):
            return {"recipe": dataclasses.asdict(recipe), "replicas": replicas, "steps_per_epoch": steps_per_epoch}

    return RecipeSchedule()


# ---------------------------------------------------------------------------------------------- input


def _parse_fn(image_shape):
    import tensorflow as tf

    height, width, channels = image_shape
    spec = {"image": tf.io.FixedLenFeature([], tf.string), "label": tf.io.FixedLenFeature([], tf.int64)}

    def parse(record):
        ex = tf.io.parse_single_example(record, spec)
        image = tf.reshape(tf.io.decode_raw(ex["image"], tf.uint8), [height, width, channels])
        return image, tf.cast(ex["label"], tf.int32)

    return parse


def _read_files(files: list[str], image_shape, *, seed: int | None = None):
    """(image uint8, label int32) records of some shard files, in a fixed order (or a seeded file order)."""
    import tensorflow as tf

    ds = tf.data.Dataset.from_tensor_slices(files)
    if seed is not None:
        ds = ds.shuffle(len(files), seed=seed)
    ds = ds.interleave(tf.data.TFRecordDataset, cycle_length=min(len(files), 8),
                       num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    return ds.map(_parse_fn(image_shape), num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)


class TrainInput:
    """The training batches of one input pipeline (one per worker), seekable to any step of any epoch.

    Sharding: worker i of n reads shard files i, i+n, i+2n, ... (shard by file, as tf.data's FILE auto-shard
    policy does); with fewer files than workers it falls back to every n-th record. Every worker takes the same
    number of steps per epoch (from the split's total count), cycling through its share as needed: with
    uneven shares, a worker running dry mid-epoch would otherwise leave its peers waiting in the all-reduce.

    Order: epoch e's order is a pure function of (seed, e, worker), so an attempt that resumes at step k of
    epoch e sees exactly the batches the interrupted one would have seen.

    "memory" holds the worker's share as one uint8 array and gathers each batch from a seeded permutation
    (no per-record work after loading, a full shuffle). "stream" reads the shards every epoch through a
    seeded shuffle buffer, for data larger than memory; resuming skips the batches already taken.
    """

    def __init__(self, train_dir: str, image_shape, *, pipeline_id: int, num_pipelines: int, recipe: Recipe,
                 online_policy: dict | None, mode: str = "auto"):
        self.image_shape = list(image_shape)
        self.recipe = recipe
        self.seed = recipe.seed * 1_000_003 + pipeline_id
        self.policy = augment_lib.AugmentPolicy.from_json(online_policy) if online_policy else None
        files = data.split_files(train_dir, "train")
        self.total_count = data.read_manifest(train_dir)["splits"]["train"]["count"]
        if len(files) >= num_pipelines:
            self.files, self.record_shard = files[pipeline_id::num_pipelines], None
        else:
            log.warning("train: %d training shard(s) for %d workers: each worker reads all and keeps every %d-th "
                        "record (preprocess with min_shards >= %d to shard by file)", len(files), num_pipelines,
                        num_pipelines, num_pipelines)
            self.files, self.record_shard = files, (pipeline_id, num_pipelines)
        share_bytes = self.total_count / num_pipelines * math.prod(self.image_shape)
        if mode == "auto":
            mode = "memory" if share_bytes <= MEMORY_INPUT_LIMIT_BYTES else "stream"
        if mode not in ("memory", "stream"):
            raise ValueError(f"input mode must be auto, memory or stream, got {mode!r}")
        self.mode = mode
        self.images = self.labels = None  # tensors in host memory (memory mode)
        if mode == "memory":
            self._load()

    def _records(self, seed: int | None = None):
        ds = _read_files(self.files, self.image_shape, seed=seed)
        if self.record_shard:
            ds = ds.shard(self.record_shard[1], self.record_shard[0])
        return ds

    def _load(self):
        import numpy as np
        import tensorflow as tf

        height, width, channels = self.image_shape
        spec = {"image": tf.io.FixedLenFeature([], tf.string), "label": tf.io.FixedLenFeature([], tf.int64)}

        def parse_batch(records):  # whole batches at once: loading is a few times faster than record by record
            ex = tf.io.parse_example(records, spec)
            images = tf.reshape(tf.io.decode_raw(ex["image"], tf.uint8), [-1, height, width, channels])
            return images, tf.cast(ex["label"], tf.int32)

        records = tf.data.Dataset.from_tensor_slices(self.files).interleave(
            tf.data.TFRecordDataset, cycle_length=min(len(self.files), 8), num_parallel_calls=tf.data.AUTOTUNE,
            deterministic=True)  # the order of data.read_split, so online augmentation matches offline copies
        if self.record_shard:
            records = records.shard(self.record_shard[1], self.record_shard[0])
        images, labels = [], []
        for image_batch, label_batch in records.batch(8192).map(parse_batch).as_numpy_iterator():
            images.append(image_batch)
            labels.append(label_batch)
        if not images:
            raise data.DataError(f"This worker's share of the training shards is empty ({len(self.files)} files)")
        with tf.device("/CPU:0"):  # host memory: the input pipeline runs on the CPU and feeds the accelerators
            self.images, self.labels = tf.constant(np.concatenate(images)), tf.constant(np.concatenate(labels))
        log.info("train: %d training images held in memory (%.0f MB)", int(self.labels.shape[0]),
                 self.images.shape.num_elements() / 1e6)

    def dataset(self, epoch: int, first_batch: int, num_batches: int, batch: int):
        """Batches [first_batch, first_batch + num_batches) of `epoch`, each of `batch` examples."""
        import tensorflow as tf

        if self.mode == "memory":
            images, labels = self.images, self.labels
            count = int(labels.shape[0])
            order = tf.random.experimental.stateless_shuffle(tf.range(count, dtype=tf.int64),
                                                             seed=[self.seed, epoch])

            def gather(index):
                picks = tf.gather(order, (index * batch + tf.range(batch, dtype=tf.int64)) % count)
                x = tf.gather(images, picks)
                if self.policy is not None:
                    x = tf.map_fn(lambda args: augment_lib.augment_image(args[0], args[1], epoch + 1, self.policy),
                                  (x, picks), fn_output_signature=tf.uint8)
                return tf.cast(x, tf.float32), tf.gather(labels, picks)

            ds = tf.data.Dataset.range(first_batch, first_batch + num_batches).map(
                gather, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
        else:
            ds = self._records(seed=self.seed + epoch).enumerate()
            if self.policy is not None:
                ds = ds.map(lambda i, ex: (augment_lib.augment_image(ex[0], i, epoch + 1, self.policy), ex[1]),
                            num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
            else:
                ds = ds.map(lambda i, ex: ex)
            ds = (ds.shuffle(self.recipe.shuffle_buffer, seed=self.seed * 7919 + epoch, reshuffle_each_iteration=False)
                  .repeat().map(lambda x, y: (tf.cast(x, tf.float32), y), num_parallel_calls=tf.data.AUTOTUNE,
                                deterministic=True)
                  .batch(batch, drop_remainder=True).skip(first_batch).take(num_batches))
        options = tf.data.Options()
        options.deterministic = True
        options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
        return ds.prefetch(tf.data.AUTOTUNE).with_options(options)


def make_eval_dataset(dataset_dir: str, split: str, batch: int):
    import tensorflow as tf

    ds = data.read_split(dataset_dir, split)
    return ds.map(lambda image, label: (tf.cast(image, tf.float32), label),
                  num_parallel_calls=tf.data.AUTOTUNE).cache().batch(batch).prefetch(tf.data.AUTOTUNE)


# ---------------------------------------------------------------------------------------------- preemption


class PreemptionWatch:
    """Turns SIGTERM into a flag the training loop checks between steps (handlers only run in the main thread)."""

    def __init__(self):
        self.signalled = threading.Event()
        self._previous = None

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGTERM, self._handle)
        return self

    def _handle(self, signum, frame):
        log.warning("train: SIGTERM received: saving a checkpoint at the next step boundary, then exiting")
        self.signalled.set()

    def __exit__(self, *exc):
        if self._previous is not None:
            signal.signal(signal.SIGTERM, self._previous)
        return False


# ---------------------------------------------------------------------------------------------- training


def _check_not_failed_before(backup_dir: str | None) -> None:
    if not backup_dir:
        return
    marker = data.join(backup_dir, FAILED_MARKER)
    if data.gfile().exists(marker):
        with data.gfile().GFile(marker) as f:
            reason = json.load(f).get("error", "unknown")
        raise PermanentFailure(f"An earlier attempt of this task failed permanently ({reason}); not retrying. "
                               f"Fix the cause and start a new run (or delete {marker}).")


def mark_failed(backup_dir: str | None, error: BaseException) -> None:
    """Records a permanent failure, so a KFP retry of the task fails fast instead of training again (the chief
    records it; the other workers of a multi-worker job see the same failure)."""
    if not backup_dir or not cluster_role(os.environ.get("TF_CONFIG")).is_chief:
        return
    try:
        data.gfile().makedirs(backup_dir)
        data.write_json(data.join(backup_dir, FAILED_MARKER), {"error": f"{type(error).__name__}: {error}",
                                                               "time": time.time()})
    except Exception as e:  # the original error matters more than the marker
        log.warning("train: could not write %s in %s: %s", FAILED_MARKER, backup_dir, e)


def _setup_json(recipe: Recipe, global_batch: int, steps_per_epoch: int, train_count: int, workers: int) -> str:
    return json.dumps({"recipe": dataclasses.asdict(recipe), "global_batch": global_batch,
                       "steps_per_epoch": steps_per_epoch, "train_count": train_count, "workers": workers},
                      sort_keys=True)


def train(dataset_dir: str, model_dir: str, *, augmented_dir: str | None = None, recipe: str = DEFAULT_RECIPE,
          epochs: int | None = None, batch_size: int | None = None, learning_rate: float | None = None,
          scale_lr: bool | None = None, steps_per_execution: int | None = None, precision: str | None = None,
          jit_compile: str | None = None, seed: int | None = None, backup_dir: str | None = None,
          tensorboard_dir: str | None = None, checkpoint_seconds: float = 120.0, input_mode: str = "auto",
          validate: bool = True, tf_config: str | None = None, epoch_callback=None) -> TrainResult:
    """Trains the classifier on `dataset_dir` (train from `augmented_dir` when given) and writes `model_dir`.

    `backup_dir` (durable, one per run and task) makes the training resumable; `checkpoint_seconds` bounds the
    work a SIGKILL can cost. `tf_config` defaults to the `TF_CONFIG` environment variable. `epoch_callback(epoch,
    logs, predict)`, when given, is called on the chief after each epoch (epoch counted from 0) with that epoch's
    logs and a function mapping a batch of images to logits (for tuning services and benchmarks).
    Raises NonFiniteLossError, data.DataError/ValueError (bad input), Preempted (SIGTERM; checkpoint saved),
    PermanentFailure (an earlier attempt failed for good).
    """
    import keras
    import tensorflow as tf

    chosen = resolve_recipe(recipe, epochs=epochs, batch_size=batch_size, learning_rate=learning_rate,
                            scale_lr=scale_lr, steps_per_execution=steps_per_execution, precision=precision,
                            jit_compile=jit_compile, seed=seed)
    tf_config = os.environ.get("TF_CONFIG") if tf_config is None else tf_config
    role = cluster_role(tf_config)
    _check_not_failed_before(backup_dir)
    manifest = data.read_manifest(dataset_dir)
    class_names = manifest["class_names"]
    image_shape = manifest["image_shape"]
    train_dir, online_policy = augment_lib.train_files(dataset_dir, augmented_dir)

    # The strategy first: MultiWorkerMirroredStrategy must configure the runtime before any other TF op.
    strategy = choose_strategy(tf_config)
    gpus = tf.config.list_physical_devices("GPU")
    check_gpus_visible(gpus)
    precision_used = resolve_precision(chosen.precision, gpus)
    use_jit = resolve_jit(chosen.jit_compile, gpus)
    replicas = strategy.num_replicas_in_sync
    global_batch = chosen.batch_size * replicas
    train_count = data.read_manifest(train_dir)["splits"]["train"]["count"]
    if train_count < 1:
        raise data.DataError(f"The training split of {train_dir} is empty")
    steps_per_epoch = max(1, math.ceil(train_count / global_batch))
    total_steps = chosen.epochs * steps_per_epoch
    peak_lr = peak_learning_rate(chosen, replicas)
    keras.utils.set_random_seed(chosen.seed)
    log.info("train: %s on %s, %d replica(s) in %d worker(s), global batch %d, peak learning rate %g, %s, XLA %s, "
             "recipe %s", strategy_name(strategy), role.task, replicas, role.workers, global_batch, peak_lr,
             precision_used, "on" if use_jit else "off", recipe)

    inputs: dict[int, TrainInput] = {}

    def input_for(context) -> TrainInput:
        if context.input_pipeline_id not in inputs:
            inputs[context.input_pipeline_id] = TrainInput(
                train_dir, image_shape, pipeline_id=context.input_pipeline_id,
                num_pipelines=context.num_input_pipelines, recipe=chosen, online_policy=online_policy,
                mode=input_mode)
        return inputs[context.input_pipeline_id]

    def distributed_batches(epoch: int, first_step: int):
        def dataset_fn(context):
            per_replica = context.get_per_replica_batch_size(global_batch)
            per_pipeline = replicas // context.num_input_pipelines  # replicas fed by this pipeline
            return input_for(context).dataset(epoch, first_step * per_pipeline,
                                              (steps_per_epoch - first_step) * per_pipeline, per_replica)

        return iter(strategy.distribute_datasets_from_function(dataset_fn))

    with strategy.scope():
        model = build_model(image_shape, len(class_names), precision_used)
        schedule = _schedule(chosen, replicas, steps_per_epoch)
        optimizer = keras.optimizers.Adam(schedule)
        if precision_used == "mixed_float16":
            optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
        optimizer.build(model.trainable_variables)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=None)
    if chosen.label_smoothing:
        smoothed = keras.losses.CategoricalCrossentropy(from_logits=True, label_smoothing=chosen.label_smoothing,
                                                        reduction=None)

        def train_loss_fn(labels, logits):
            return smoothed(tf.one_hot(labels, len(class_names)), logits)
    else:
        train_loss_fn = loss_fn

    # The epoch's running sums (loss, correct, count) and the finished epochs' history travel with the weights.
    setup = _setup_json(chosen, global_batch, steps_per_epoch, train_count, role.workers)
    with tf.device("/CPU:0"):  # host-side bookkeeping (strings cannot live on a GPU)
        epoch_sums = tf.Variable(tf.zeros([3], tf.float64), trainable=False)
        history_var = tf.Variable("{}", dtype=tf.string, trainable=False)
        setup_var = tf.Variable(setup, dtype=tf.string, trainable=False)
    checkpoint = tf.train.Checkpoint(model=model, optimizer=optimizer, epoch_sums=epoch_sums,
                                     history=history_var, setup=setup_var)
    # The other workers write what the chief writes (checkpoints, model) to scratch space, deleted at the end.
    scratch = None if role.is_chief else tempfile.mkdtemp(prefix="train-scratch-")
    checkpoint_dir = backup_dir if role.is_chief else os.path.join(scratch, "checkpoints")
    manager = tf.train.CheckpointManager(checkpoint, checkpoint_dir, max_to_keep=2) if backup_dir else None
    resumed_from = 0
    if backup_dir and tf.train.latest_checkpoint(backup_dir):
        latest = tf.train.latest_checkpoint(backup_dir)
        checkpoint.restore(latest).assert_existing_objects_matched()
        if setup_var.numpy().decode() != setup:
            raise ValueError(f"{backup_dir} holds checkpoints of a different training setup "
                             f"({setup_var.numpy().decode()}); use a new backup directory for new settings")
        resumed_from = int(optimizer.iterations.numpy())
        log.info("train: resuming from step %d of %d (epoch %d, step %d) from %s", resumed_from, total_steps,
                 resumed_from // steps_per_epoch + 1, resumed_from % steps_per_epoch, latest)
    history: dict[str, list[float]] = json.loads(history_var.numpy().decode())

    def replica_step(images, labels):
        with tf.GradientTape() as tape:
            logits = model(images, training=True)
            per_example = train_loss_fn(labels, logits)
            loss = tf.reduce_sum(per_example) / global_batch
            scaled = optimizer.scale_loss(loss)
        grads = tape.gradient(scaled, model.trainable_variables)
        optimizer.apply(grads, model.trainable_variables)
        correct = tf.reduce_sum(tf.cast(tf.equal(tf.argmax(logits, -1, output_type=tf.int32), labels), tf.float32))
        return tf.stack([tf.reduce_sum(per_example), correct, tf.cast(tf.size(labels), tf.float32)])

    step_fn = tf.function(replica_step, jit_compile=True) if use_jit else replica_step

    @tf.function
    def run_steps(iterator, count):
        sums = tf.TensorArray(tf.float32, size=count)
        for i in tf.range(count):
            images, labels = next(iterator)
            sums = sums.write(i, strategy.reduce("SUM", strategy.run(step_fn, args=(images, labels)), axis=None))
        return sums.stack()

    @tf.function
    def agree(flags):
        # Every worker must take the same decision (save, stop) at the same step, or the all-reduces hang.
        return strategy.reduce("SUM", strategy.run(lambda: tf.identity(flags)), axis=None)  # > 0: anyone

    @tf.function
    def predict_logits(images):
        return model(images, training=False)

    def evaluate_split(dataset) -> tuple[float, float]:
        total_loss = correct = count = 0.0
        for images, labels in dataset:
            logits = predict_logits(images)
            total_loss += float(tf.reduce_sum(loss_fn(labels, logits)))
            correct += float(tf.reduce_sum(tf.cast(tf.equal(tf.argmax(logits, -1, output_type=tf.int32), labels),
                                                   tf.float32)))
            count += int(tf.size(labels))
        return total_loss / max(count, 1), correct / max(count, 1)

    def save(reason: str) -> None:
        if manager is None:
            return
        history_var.assign(json.dumps(history))
        path = manager.save(checkpoint_number=int(optimizer.iterations.numpy()))
        if role.is_chief:
            log.info("train: checkpoint %s (%s)", path, reason)

    val_ds = make_eval_dataset(dataset_dir, "validation", max(global_batch, 256)) if validate and role.is_chief \
        else None
    writer = tf.summary.create_file_writer(tensorboard_dir) if tensorboard_dir and role.is_chief \
        else tf.summary.create_noop_writer()

    step = int(optimizer.iterations.numpy())
    start = time.monotonic()
    last_save = time.monotonic()
    try:
        with PreemptionWatch() as watch, writer.as_default():
            log.info("train: starting at step %d of %d", step, total_steps)
            while step < total_steps:
                epoch, in_epoch = divmod(step, steps_per_epoch)
                epoch_start = time.monotonic()
                if in_epoch == 0:
                    epoch_sums.assign(tf.zeros([3], tf.float64))
                iterator = distributed_batches(epoch, in_epoch)
                while in_epoch < steps_per_epoch:
                    count = min(chosen.steps_per_execution, steps_per_epoch - in_epoch)
                    sums = run_steps(iterator, tf.constant(count)).numpy()
                    losses = sums[:, 0] / sums[:, 2]
                    bad = [i for i, value in enumerate(losses) if not math.isfinite(value)]
                    if bad:
                        raise NonFiniteLossError(
                            f"Loss became {losses[bad[0]]} at epoch {epoch + 1}, step {in_epoch + bad[0] + 1} "
                            f"(global step {step + bad[0] + 1}): training stopped. Lower the learning rate or "
                            "check the input data for corrupt values.")
                    epoch_sums.assign_add(tf.constant(sums.sum(axis=0), tf.float64))
                    step += count
                    in_epoch += count
                    want_save = role.is_chief and time.monotonic() - last_save >= checkpoint_seconds
                    flags = [float(watch.signalled.is_set()), float(want_save)]
                    if role.workers > 1:
                        flags = agree(tf.constant(flags)).numpy().tolist()
                    if flags[0]:
                        save("preempted")
                        raise Preempted(f"Preempted at step {step} of {total_steps}; a retry resumes from here")
                    if flags[1] and in_epoch < steps_per_epoch:
                        save(f"epoch {epoch + 1}, step {in_epoch}")
                        last_save = time.monotonic()
                loss_sum, correct, seen = epoch_sums.numpy()
                logs = {"loss": loss_sum / seen, "accuracy": correct / seen,
                        "learning_rate": float(schedule(step - 1))}  # the rate of the epoch's last step
                if val_ds is not None:
                    logs["val_loss"], logs["val_accuracy"] = evaluate_split(val_ds)
                for name, value in logs.items():
                    history.setdefault(name, []).append(float(value))
                    tf.summary.scalar(f"epoch_{name}", value, step=step)
                log.info("epoch %d/%d (%.1fs) %s", epoch + 1, chosen.epochs, time.monotonic() - epoch_start,
                         " ".join(f"{k}={v:.4f}" for k, v in sorted(logs.items())))
                if epoch_callback is not None and role.is_chief:
                    epoch_callback(epoch, dict(logs), predict_logits)
                save(f"end of epoch {epoch + 1}")
                last_save = time.monotonic()
    except (tf.errors.UnavailableError, tf.errors.AbortedError, tf.errors.DeadlineExceededError,
            tf.errors.CancelledError) as e:
        # A peer worker went away (preempted node, restarted pod): the whole job restarts and resumes.
        raise Preempted(f"Lost contact with a peer worker at step {step}: {str(e).splitlines()[0]}") from e
    train_seconds = time.monotonic() - start
    steps_run = step - resumed_from
    if steps_run == 0:
        log.info("train: %s already holds the finished training (%d steps); writing the model again", backup_dir,
                 step)

    # Only the chief's model counts; the others save theirs to scratch (the standard multi-worker pattern,
    # as saving reads the distributed variables on every worker) and delete it.
    output_dir = model_dir if role.is_chief else os.path.join(scratch, "model")
    result = TrainResult(model_dir, chosen.epochs, step, steps_per_epoch, global_batch, replicas, role.workers,
                         strategy_name(strategy), peak_lr, precision_used, use_jit, next(iter(inputs.values())).mode
                         if inputs else input_mode, resumed_from, history, train_seconds,
                         steps_run * global_batch / max(train_seconds, 1e-9))
    _write_model(model, image_shape, len(class_names), output_dir)
    if role.is_chief:
        data.write_json(data.join(model_dir, TRAINING_INFO), {
            **result.to_json(), "recipe": recipe, "recipe_settings": dataclasses.asdict(chosen),
            "class_names": class_names, "image_shape": image_shape, "train_count": train_count,
        })
        writer.flush()
    if scratch:
        shutil.rmtree(scratch, ignore_errors=True)
    log.info("train: %d steps (%d in this attempt) in %.1fs, %.0f images/s; model in %s", step, steps_run,
             train_seconds, result.images_per_second, model_dir)
    return result


def _write_model(model, image_shape, num_classes: int, model_dir: str) -> None:
    """Writes model.keras and saved_model/ in float32, whatever precision training used."""
    import keras
    import tensorflow as tf

    export = build_model(image_shape, num_classes, "float32")
    export.set_weights([w.numpy() if hasattr(w, "numpy") else w for w in model.get_weights()])
    tf.io.gfile.makedirs(model_dir)
    export.save(data.join(model_dir, "model.keras"))
    inference = keras.Sequential([export, keras.layers.Softmax(name="probabilities")], name="inference")
    with contextlib.redirect_stdout(sys.stderr):
        inference.export(data.join(model_dir, "saved_model"), verbose=False)


def log_to_kfp(info: dict, metrics, model) -> None:
    """Per-epoch and final metrics, timings and throughput into a KFP Metrics artifact; facts onto the Model."""
    for name, values in info["history"].items():
        for epoch, value in enumerate(values, start=1):
            metrics.log_metric(f"epoch{epoch:02d}_{name}", round(value, 6))
        if values:
            metrics.log_metric(f"final_{name}", round(values[-1], 6))
    metrics.log_metric("train_seconds", round(info["train_seconds"], 2))
    metrics.log_metric("images_per_second", round(info["images_per_second"], 1))
    metrics.log_metric("steps", info["steps"])
    metrics.log_metric("resumed_from_step", info["resumed_from_step"])
    model.metadata.update({"framework": "tensorflow", "strategy": info["strategy"], "replicas": info["replicas"],
                           "workers": info["workers"], "global_batch_size": info["global_batch_size"]})


def backup_dir_for(checkpoint_root: str, pipeline_root: str, run_id: str, task_name: str) -> str:
    """The task's checkpoint directory: durable (the pipeline root unless `checkpoint_root` is given) and keyed by
    run and task, so a retry of the task or a replacement pod resumes, and a new run starts clean."""
    root = (checkpoint_root or pipeline_root or "").rstrip("/")
    if not root:
        raise ValueError("No durable place for checkpoints: give checkpoint_root or run with a pipeline root")
    if not run_id or not task_name:
        raise ValueError("The checkpoint directory needs the pipeline run id and the task name")
    return data.join(root, "checkpoints", run_id, task_name)


def attempt(train_fn, backup_dir: str | None):
    """Runs `train_fn()` as one attempt of a retried task: a preemption exits with EXIT_PREEMPTED (retry resumes),
    any other failure is recorded in `backup_dir` so that retries fail fast, then re-raised."""
    try:
        return train_fn()
    except Preempted as e:
        print(f"preempted: {e}", file=sys.stderr, flush=True)
        raise SystemExit(EXIT_PREEMPTED) from None
    except PermanentFailure:
        raise
    except Exception as e:
        mark_failed(backup_dir, e)
        raise


def run(args: argparse.Namespace) -> int:
    """Trains with the parsed arguments and returns the documented exit code."""
    try:
        result = attempt(lambda: train(
            args.dataset_dir, args.model_dir, augmented_dir=args.augmented_dir, recipe=args.recipe,
            epochs=args.epochs, batch_size=args.batch_size, learning_rate=args.learning_rate, scale_lr=args.scale_lr,
            steps_per_execution=args.steps_per_execution, precision=args.precision, jit_compile=args.jit_compile,
            seed=args.seed, backup_dir=args.backup_dir, tensorboard_dir=args.tensorboard_dir,
            checkpoint_seconds=args.checkpoint_seconds, input_mode=args.input_mode), args.backup_dir)
    except SystemExit as e:
        return int(e.code)
    except (PermanentFailure, data.DataError, ValueError, NonFiniteLossError) as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_PERMANENT
    json.dump(result.to_json(), sys.stdout, indent=2)
    print()
    return EXIT_OK


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description="Train the image classifier (one worker of several when TF_CONFIG "
                                                 "names a cluster).")
    parser.add_argument("--dataset-dir", required=True, help="output of preprocess")
    parser.add_argument("--augmented-dir", help="output of augment (optional)")
    parser.add_argument("--model-dir", required=True)
    parser.add_argument("--recipe", default=DEFAULT_RECIPE, choices=sorted(RECIPES),
                        help="preset (default: %(default)s; reference: the classic 12-epoch recipe)")
    parser.add_argument("--epochs", type=int)
    parser.add_argument("--batch-size", type=int, help="per replica")
    parser.add_argument("--learning-rate", type=float, help="for one replica")
    parser.add_argument("--no-scale-lr", dest="scale_lr", action="store_const", const=False,
                        help="keep the learning rate when replicas are added")
    parser.add_argument("--steps-per-execution", type=int)
    parser.add_argument("--precision", choices=PRECISIONS)
    parser.add_argument("--jit-compile", choices=("auto", "on", "off"))
    parser.add_argument("--seed", type=int)
    parser.add_argument("--backup-dir", help="durable checkpoint directory, one per run and task")
    parser.add_argument("--checkpoint-seconds", type=float, default=120.0,
                        help="checkpoint within an epoch at most this often (default: %(default)s)")
    parser.add_argument("--input-mode", choices=("auto", "memory", "stream"), default="auto")
    parser.add_argument("--tensorboard-dir")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    return run(args)


if __name__ == "__main__":
    raise SystemExit(main())
