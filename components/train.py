"""Train: the image classifier under a tf.distribute strategy, with checkpoints that survive a retry.

Strategy from the machine: `TF_CONFIG` naming several workers -> MultiWorkerMirroredStrategy; several local
GPUs -> MirroredStrategy; otherwise the default strategy (one device). The global batch is the per-replica
batch times the replicas.

Checkpoints: Keras BackupAndRestore writes to `backup_dir` (durable storage keyed by run and task), so a
retried task resumes where the failed attempt stopped instead of starting over.

Outputs in `model_dir`: `model.keras` (Keras), `saved_model/` (TF SavedModel returning class probabilities,
what Vertex AI's TensorFlow serving containers load), `training.json` (recipe, class names, image shape,
per-epoch history, timings).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import math
import os
import sys
import time

from components import augment as augment_lib
from components import data

log = logging.getLogger(__name__)

TRAINING_INFO = "training.json"


@dataclasses.dataclass(frozen=True)
class Recipe:
    """How to train: the model is always the reference CNN; these are the knobs around it."""

    epochs: int = 12
    batch_size: int = 64  # per replica
    learning_rate: float = 1e-3
    # Stepped schedule: (first epoch, factor of learning_rate), epochs counted from 0.
    lr_steps: tuple[tuple[int, float], ...] = ((0, 1.0), (3, 0.1), (7, 0.01))
    shuffle_buffer: int = 10_000
    steps_per_execution: int = 1


RECIPES = {
    # The classic recipe, as written: batch 64, Adam 1e-3 -> 1e-4 from epoch 3 -> 1e-5 from epoch 7.
    "reference": Recipe(),
}
DEFAULT_RECIPE = "reference"


@dataclasses.dataclass
class TrainResult:
    model_dir: str
    epochs: int
    global_batch_size: int
    replicas: int
    strategy: str
    history: dict
    train_seconds: float
    images_per_second: float

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


def choose_strategy():
    """MultiWorkerMirrored when TF_CONFIG names several workers, Mirrored over several local GPUs, else default."""
    import tensorflow as tf

    tf_config = json.loads(os.environ.get("TF_CONFIG") or "{}")
    cluster = tf_config.get("cluster", {})
    workers = sum(len(cluster.get(role, [])) for role in ("chief", "worker"))
    if workers > 1:
        return tf.distribute.MultiWorkerMirroredStrategy()
    if len(tf.config.list_physical_devices("GPU")) > 1:
        return tf.distribute.MirroredStrategy()
    return tf.distribute.get_strategy()


def build_model(image_shape: list[int] | tuple[int, ...], num_classes: int):
    """The reference CNN. Pixel scaling is part of the model, so serving takes raw 0-255 pixels."""
    import keras

    return keras.Sequential([
        keras.Input(shape=tuple(image_shape), name="image"),
        keras.layers.Rescaling(1.0 / 255),
        keras.layers.Conv2D(32, 3, activation="relu"),
        keras.layers.MaxPooling2D(),
        keras.layers.Flatten(),
        keras.layers.Dense(64, activation="relu"),
        keras.layers.Dense(num_classes, name="logits"),
    ], name="classifier")


def learning_rate_for(epoch: int, recipe: Recipe, base_lr: float) -> float:
    factor = 1.0
    for first_epoch, step_factor in recipe.lr_steps:
        if epoch >= first_epoch:
            factor = step_factor
    return base_lr * factor


class NonFiniteLossError(RuntimeError):
    pass


def _stop_on_non_finite_loss():
    import keras

    class StopOnNonFiniteLoss(keras.callbacks.Callback):
        """Fails training at the first NaN/inf loss: a garbage model must never reach evaluation."""

        def on_epoch_begin(self, epoch, logs=None):
            self.epoch = epoch

        def on_train_batch_end(self, batch, logs=None):
            loss = (logs or {}).get("loss")
            if loss is not None and not math.isfinite(float(loss)):
                raise NonFiniteLossError(
                    f"Loss became {float(loss)} at epoch {self.epoch + 1}, step {batch + 1}: training stopped. "
                    "Lower the learning rate or check the input data for corrupt values.")

    return StopOnNonFiniteLoss()


class _Progress:
    """Logs one line per epoch (fit's own progress bar is unreadable in pipeline logs)."""

    def __new__(cls, epochs: int):
        import keras

        class Progress(keras.callbacks.Callback):
            def on_epoch_begin(self, epoch, logs=None):
                self.start = time.monotonic()

            def on_epoch_end(self, epoch, logs=None):
                shown = " ".join(f"{k}={v:.4f}" for k, v in sorted((logs or {}).items()) if isinstance(v, float))
                log.info("epoch %d/%d (%.1fs) %s", epoch + 1, epochs, time.monotonic() - self.start, shown)

        return Progress()


def make_train_dataset(train_dir: str, recipe: Recipe, global_batch: int, online_policy: dict | None):
    """The training input pipeline, and (with an online policy) the variable that tells it the epoch."""
    import tensorflow as tf

    ds = data.read_split(train_dir, "train")
    epoch_counter = None
    if online_policy:
        policy = augment_lib.AugmentPolicy.from_json(online_policy)
        epoch_counter = tf.Variable(0, dtype=tf.int64, trainable=False)
        ds = ds.enumerate().map(
            lambda i, ex: (augment_lib.augment_image(ex[0], i, epoch_counter + 1, policy), ex[1]),
            num_parallel_calls=tf.data.AUTOTUNE)
    ds = ds.map(lambda image, label: (tf.cast(image, tf.float32), label), num_parallel_calls=tf.data.AUTOTUNE)
    if not online_policy:
        ds = ds.cache()
    ds = ds.shuffle(recipe.shuffle_buffer).batch(global_batch).prefetch(tf.data.AUTOTUNE)
    return ds, epoch_counter


def _set_epoch(counter):
    """Feeds the epoch into the online augmentation, so epoch k draws what offline copy k holds."""
    import keras

    class SetEpoch(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            counter.assign(epoch)

    return SetEpoch()


def make_eval_dataset(dataset_dir: str, split: str, batch: int):
    import tensorflow as tf

    ds = data.read_split(dataset_dir, split)
    return ds.map(lambda image, label: (tf.cast(image, tf.float32), label),
                  num_parallel_calls=tf.data.AUTOTUNE).cache().batch(batch).prefetch(tf.data.AUTOTUNE)


def train(dataset_dir: str, model_dir: str, *, augmented_dir: str | None = None, recipe: str = DEFAULT_RECIPE,
          epochs: int | None = None, batch_size: int | None = None, learning_rate: float | None = None,
          backup_dir: str | None = None, tensorboard_dir: str | None = None) -> TrainResult:
    """Trains the classifier on `dataset_dir` (train from `augmented_dir` when given) and writes `model_dir`."""
    import keras
    import tensorflow as tf

    if recipe not in RECIPES:
        raise ValueError(f"Unknown recipe {recipe!r}; known: {', '.join(sorted(RECIPES))}")
    base = RECIPES[recipe]
    chosen = dataclasses.replace(base, **{k: v for k, v in
                                          {"epochs": epochs, "batch_size": batch_size, "learning_rate": learning_rate}
                                          .items() if v is not None})
    if chosen.epochs < 1:
        raise ValueError(f"epochs must be >= 1, got {chosen.epochs}")
    manifest = data.read_manifest(dataset_dir)
    class_names = manifest["class_names"]
    image_shape = manifest["image_shape"]
    train_dir, online_policy = augment_lib.train_files(dataset_dir, augmented_dir)

    strategy = choose_strategy()
    replicas = strategy.num_replicas_in_sync
    global_batch = chosen.batch_size * replicas
    log.info("train: %s with %d replica(s), global batch %d, recipe %s", type(strategy).__name__, replicas,
             global_batch, recipe)
    train_ds, epoch_counter = make_train_dataset(train_dir, chosen, global_batch, online_policy)
    val_ds = make_eval_dataset(dataset_dir, "validation", global_batch)
    with strategy.scope():
        model = build_model(image_shape, len(class_names))
        model.compile(optimizer=keras.optimizers.Adam(chosen.learning_rate),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      metrics=["accuracy"], steps_per_execution=chosen.steps_per_execution)

    callbacks = [
        keras.callbacks.LearningRateScheduler(lambda epoch: learning_rate_for(epoch, chosen, chosen.learning_rate)),
        _stop_on_non_finite_loss(),
        _Progress(chosen.epochs),
    ]
    if epoch_counter is not None:
        callbacks.append(_set_epoch(epoch_counter))
    if backup_dir:
        callbacks.append(keras.callbacks.BackupAndRestore(backup_dir))
    if tensorboard_dir:
        callbacks.append(keras.callbacks.TensorBoard(log_dir=tensorboard_dir))

    start = time.monotonic()
    history = model.fit(train_ds, validation_data=val_ds, epochs=chosen.epochs, callbacks=callbacks, verbose=0)
    train_seconds = time.monotonic() - start
    history_json = {k: [float(v) for v in values] for k, values in history.history.items()}
    epochs_run = len(history_json.get("loss", []))
    train_count = data.read_manifest(train_dir)["splits"]["train"]["count"]

    tf.io.gfile.makedirs(model_dir)
    model.save(data.join(model_dir, "model.keras"))
    inference = keras.Sequential([model, keras.layers.Softmax(name="probabilities")], name="inference")
    inference.export(data.join(model_dir, "saved_model"), verbose=False)
    result = TrainResult(model_dir, chosen.epochs, global_batch, replicas, type(strategy).__name__, history_json,
                         train_seconds, train_count * epochs_run / max(train_seconds, 1e-9))
    data.write_json(data.join(model_dir, TRAINING_INFO), {
        **result.to_json(), "recipe": recipe, "recipe_settings": dataclasses.asdict(chosen),
        "class_names": class_names, "image_shape": image_shape,
    })
    log.info("train: %d epochs in %.1fs (%.0f images/s); model in %s", epochs_run, train_seconds,
             result.images_per_second, model_dir)
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Train the image classifier.")
    parser.add_argument("--dataset-dir", required=True, help="output of preprocess")
    parser.add_argument("--augmented-dir", help="output of augment (optional)")
    parser.add_argument("--model-dir", required=True)
    parser.add_argument("--recipe", default=DEFAULT_RECIPE, choices=sorted(RECIPES))
    parser.add_argument("--epochs", type=int)
    parser.add_argument("--batch-size", type=int, help="per replica")
    parser.add_argument("--learning-rate", type=float)
    parser.add_argument("--backup-dir")
    parser.add_argument("--tensorboard-dir")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    try:
        result = train(args.dataset_dir, args.model_dir, augmented_dir=args.augmented_dir, recipe=args.recipe,
                       epochs=args.epochs, batch_size=args.batch_size, learning_rate=args.learning_rate,
                       backup_dir=args.backup_dir, tensorboard_dir=args.tensorboard_dir)
    except (data.DataError, ValueError, NonFiniteLossError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    json.dump(result.to_json(), sys.stdout, indent=2)
    print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
