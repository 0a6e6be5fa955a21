"""Training speed: our default recipe against the classic reference recipe, side by side in one run.

    python -m tests.benchmarks.train [--data DIR] [--dataset-dir PREPROCESSED] [--epochs N]

The baseline is the reference recipe written the classic way: the seed CNN, Adam 1e-3 stepped down 10x at
epochs 3 and 7, `map(scale).cache().shuffle(10000).batch(64)`, `model.fit` for 12 epochs with per-epoch
validation. "Ours" is `components.train.train` with its defaults. Both train on the same preprocessed split and
are scored on the same test split after every epoch (scoring time is excluded from both clocks).

Each run is its own process, one after the other, so peak memory is per run and neither inherits the other's
TensorFlow state. Training time runs from the call to fit()/train() to the end of the last epoch: data loading
and validation count, writing the model does not (the baseline writes none). The goal: ours reaches the
baseline's final test accuracy in at most a third of the baseline's training time; the whole default training
run is reported beside it.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time

GOAL_SPEEDUP = 3.0


class _Probe:
    """Scores the test split after each epoch; keeps the training clock free of the scoring time."""

    def __init__(self, test_images, test_labels, start: float):
        self.test_images, self.test_labels = test_images, test_labels
        self.start = start
        self.scoring = 0.0
        self.epochs: list[dict] = []

    def __call__(self, predict) -> None:
        import numpy as np

        reached = time.monotonic()
        correct = 0
        for i in range(0, len(self.test_labels), 1000):
            logits = np.asarray(predict(self.test_images[i:i + 1000]))
            correct += int((logits.argmax(-1) == self.test_labels[i:i + 1000]).sum())
        self.epochs.append({"seconds": reached - self.start - self.scoring,
                            "test_accuracy": correct / len(self.test_labels)})
        self.scoring += time.monotonic() - reached


def measure_baseline(dataset_dir: str, epochs: int) -> dict:
    """The reference recipe, as a user would write it from the classic tutorial."""
    import keras
    import tensorflow as tf

    from components.dataio import data

    keras.utils.set_random_seed(0)
    test_images, test_labels = data.load_split_arrays(dataset_dir, "test")

    def scale(image, label):
        return tf.cast(image, tf.float32) / 255.0, label

    train_ds = data.read_split(dataset_dir, "train").map(scale).cache().shuffle(10000).batch(64)
    val_ds = data.read_split(dataset_dir, "validation").map(scale).cache().batch(64)
    model = keras.Sequential([
        keras.Input(shape=tuple(test_images.shape[1:])),
        keras.layers.Conv2D(32, 3, activation="relu"),
        keras.layers.MaxPooling2D(),
        keras.layers.Flatten(),
        keras.layers.Dense(64, activation="relu"),
        keras.layers.Dense(10),
    ])
    model.compile(optimizer=keras.optimizers.Adam(1e-3),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
    predict = tf.function(lambda images: model(tf.cast(images, tf.float32) / 255.0, training=False))

    start = time.monotonic()
    probe = _Probe(test_images, test_labels, start)

    class Score(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            probe(predict)

    schedule = keras.callbacks.LearningRateScheduler(lambda epoch: 1e-3 if epoch < 3 else 1e-4 if epoch < 7 else 1e-5)
    model.fit(train_ds, validation_data=val_ds, epochs=epochs, callbacks=[schedule, Score()], verbose=0)
    train_count = data.read_manifest(dataset_dir)["splits"]["train"]["count"]
    return {"run": "baseline", "recipe": "reference (classic fit)", "epochs": epochs, "global_batch": 64,
            "train_count": train_count, "per_epoch": probe.epochs}


def measure_ours(dataset_dir: str, epochs: int | None, recipe: str | None) -> dict:
    from components import train
    from components.dataio import data

    test_images, test_labels = data.load_split_arrays(dataset_dir, "test")
    model_dir = tempfile.mkdtemp(prefix="bench-model-")
    start = time.monotonic()
    probe = _Probe(test_images.astype("float32"), test_labels, start)
    result = train.train(dataset_dir, model_dir, recipe=recipe or train.DEFAULT_RECIPE, epochs=epochs,
                         epoch_callback=lambda epoch, logs, predict: probe(predict))
    return {"run": "ours", "recipe": recipe or train.DEFAULT_RECIPE, "epochs": result.epochs,
            "global_batch": result.global_batch_size,
            "train_count": data.read_manifest(dataset_dir)["splits"]["train"]["count"], "per_epoch": probe.epochs,
            "call_seconds": time.monotonic() - start - probe.scoring, "precision": result.precision,
            "jit_compile": result.jit_compile}


def _finish(measured: dict) -> dict:
    per_epoch = measured["per_epoch"]
    seconds = per_epoch[-1]["seconds"]
    measured.update(train_seconds=seconds, test_accuracy=per_epoch[-1]["test_accuracy"],
                    images_per_second=measured["train_count"] * measured["epochs"] / seconds,
                    peak_memory_mb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
    return measured


def _run_child(kind: str, dataset_dir: str, epochs: int | None, recipe: str | None) -> dict:
    command = [sys.executable, "-m", "tests.benchmarks.train", "--measure", kind, "--dataset-dir", dataset_dir]
    if epochs:
        command += ["--epochs", str(epochs)]
    if recipe:
        command += ["--recipe", recipe]
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    done = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"benchmark run {kind} failed ({done.returncode}):\n{done.stderr[-4000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def seconds_to(per_epoch: list[dict], accuracy: float) -> float | None:
    return next((e["seconds"] for e in per_epoch if e["test_accuracy"] >= accuracy), None)


def table(baseline: dict, ours: dict) -> str:
    target = baseline["test_accuracy"]
    rows = [("", "baseline", "ours")]
    rows.append(("recipe", baseline["recipe"], ours["recipe"]))
    rows.append(("epochs x global batch", f"{baseline['epochs']} x {baseline['global_batch']}",
                 f"{ours['epochs']} x {ours['global_batch']}"))
    rows.append(("training seconds", f"{baseline['train_seconds']:.1f}", f"{ours['train_seconds']:.1f}"))
    rows.append(("images/s", f"{baseline['images_per_second']:.0f}", f"{ours['images_per_second']:.0f}"))
    rows.append(("final test accuracy", f"{baseline['test_accuracy']:.4f}", f"{ours['test_accuracy']:.4f}"))
    rows.append((f"seconds to {target:.4f}", *(f"{r['seconds_to_target']:.1f}" if r["seconds_to_target"] else "never"
                                              for r in (baseline, ours))))
    rows.append(("peak memory MB", f"{baseline['peak_memory_mb']:.0f}", f"{ours['peak_memory_mb']:.0f}"))
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", default="/usr/share/datasets/fashion-mnist", help="source for preprocess")
    parser.add_argument("--dataset-dir", help="an already preprocessed dataset (skips preprocess)")
    parser.add_argument("--epochs", type=int, help="epochs for ours (default: the recipe's)")
    parser.add_argument("--baseline-epochs", type=int, default=12)
    parser.add_argument("--recipe", help="our recipe (default: the default recipe)")
    parser.add_argument("--measure", choices=("baseline", "ours"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    if args.measure:  # one side, in its own process
        measured = measure_baseline(args.dataset_dir, args.baseline_epochs) if args.measure == "baseline" \
            else measure_ours(args.dataset_dir, args.epochs, args.recipe)
        print(json.dumps(_finish(measured)))
        return measured

    dataset_dir = args.dataset_dir
    if not dataset_dir:
        from components.preprocess import preprocess

        dataset_dir = tempfile.mkdtemp(prefix="bench-train-data-")
        preprocess(args.data, dataset_dir)
    load_before = os.getloadavg()[0]
    baseline = _run_child("baseline", dataset_dir, None, None)
    ours = _run_child("ours", dataset_dir, args.epochs, args.recipe)
    for run in (baseline, ours):
        run["seconds_to_target"] = seconds_to(run["per_epoch"], baseline["test_accuracy"])
    print(f"Training: reference recipe (baseline) vs our defaults, {baseline['train_count']} training images, "
          f"{os.cpu_count()} CPU(s), load average {load_before:.1f} -> {os.getloadavg()[0]:.1f}")
    print(table(baseline, ours))
    speedup = baseline["train_seconds"] / ours["train_seconds"]
    to_target = ours["seconds_to_target"]
    speedup_to_target = baseline["train_seconds"] / to_target if to_target else 0.0
    met = ours["test_accuracy"] >= baseline["test_accuracy"] and speedup_to_target >= GOAL_SPEEDUP
    print(f"time to the baseline's final accuracy: {speedup_to_target:.2f}x faster than the baseline's training "
          f"(goal >= {GOAL_SPEEDUP:.0f}x): {'met' if met else 'NOT met'}")
    print(f"whole default training ({ours['epochs']} epochs, final accuracy {ours['test_accuracy']:.4f}): "
          f"{speedup:.2f}x faster")
    return {"baseline": baseline, "ours": ours, "speedup": speedup, "speedup_to_target": speedup_to_target,
            "goal_met": met}


if __name__ == "__main__":
    main()
