"""Frameworks side by side on this CPU: TensorFlow, PyTorch and JAX training the same models with the pipeline's own
training step, in one run.

    python -m tests.benchmarks.frameworks [--frameworks tensorflow,torch,jax] [--fashion-limit 6000]
        [--fashion-epochs 2] [--photos DIR] [--image-size 128] [--photo-epochs 2] [--batch-size 32]
        [--precision float32]

Two workloads, each trained once per framework:
  - the reference CNN on Fashion-MNIST (the reference recipe: batch 64, Adam with its stepped rate), the first
    `--fashion-limit` images of each source split preprocessed into shards by the preprocess step;
  - mobilenet-v3-small from scratch on real photos (`make photos`' food photos, 12 classes) preprocessed at
    `--image-size` px RGB, batch `--batch-size`.

Each framework trains in its own process (`--measure FRAMEWORK`): the framework is chosen before Keras is first
imported (KERAS_BACKEND), and peak memory is that process's. The process runs `components.train`'s TrainingLoop with
`framework=` set, as the training step's CLI does, and times it from the outside: each epoch from the loop's
epoch callback, the test split scored after each epoch with the step's own predict function (scoring time is kept
out of every clock), and, in a subclass that only adds clocks around the loop's `take_steps`, the time spent in
optimizer steps and, on torch and JAX, the part of it spent waiting for the input's next batch (TensorFlow's step
reads its input inside the compiled function, out of a Python clock's reach).

Figures per framework: images/s (training images over the epochs' time, validation and the BatchNormalization
re-estimation included, as training.json's images_per_second), epoch seconds (the first, which includes tracing
and compiling, and the mean of the others), test accuracy after the last epoch, and peak memory.
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

FRAMEWORKS = ("tensorflow", "torch", "jax")
FASHION_MNIST = "/usr/share/datasets/fashion-mnist"


# ------------------------------------------------------------------------------------------ one framework, one process

class StepClock:
    """Seconds in the loop's optimizer steps, and the part of them spent waiting for the input's next batch."""

    def __init__(self):
        self.step_seconds = 0.0
        self.wait_seconds = 0.0
        self.batches = 0

    def iterate(self, iterator):
        clock = self

        class Timed:
            def __iter__(self):
                return self

            def __next__(self):
                start = time.perf_counter()
                try:
                    return next(iterator)
                finally:
                    clock.wait_seconds += time.perf_counter() - start
                    clock.batches += 1

        return Timed()


# Frameworks whose step takes the batches from the iterator in Python, where a clock can wait with it. TensorFlow's
# step reads its tf.data iterator inside the compiled function (a Python wrapper would make it retrace every call).
INPUT_CLOCKED = ("torch", "jax")


def timed_loop(settings, clock: StepClock, epoch_callback):
    """components.train's TrainingLoop with clocks around `take_steps` (what the loop runs, unchanged)."""
    from components.train.loop import TrainingLoop

    clocked = settings.framework in INPUT_CLOCKED

    class TimedLoop(TrainingLoop):
        def take_steps(self, iterator, count, epoch, in_epoch):
            start = time.perf_counter()
            try:
                super().take_steps(clock.iterate(iterator) if clocked else iterator, count, epoch, in_epoch)
            finally:
                clock.step_seconds += time.perf_counter() - start

    return TimedLoop(settings, epoch_callback=epoch_callback)


def model_flops(model) -> int:
    """Forward FLOPs of one image (a multiply-add counts 2), from the Keras model's layers: convolutions (grouped
    and depthwise too) and dense layers, the work a GPU's matrix units do; normalisation, activations and pooling
    are left out (a few percent of these models)."""
    import math

    import keras

    total = 0
    for layer in _layers(model):
        if isinstance(layer, keras.layers.DepthwiseConv2D):
            out = layer.output.shape  # N, H, W, C x multiplier
            total += 2 * math.prod(layer.kernel_size) * math.prod(out[1:])
        elif isinstance(layer, keras.layers.Conv2D):
            out = layer.output.shape
            in_channels = layer.input.shape[-1]
            total += 2 * math.prod(layer.kernel_size) * (in_channels // layer.groups) * math.prod(out[1:])
        elif isinstance(layer, keras.layers.Dense):
            out = layer.output.shape
            total += 2 * layer.input.shape[-1] * math.prod(out[1:])
    return int(total)


def _layers(model):
    for layer in model.layers:
        if hasattr(layer, "layers") and layer.layers:  # a nested model (a backbone)
            yield from _layers(layer)
        else:
            yield layer


def measure(framework: str, dataset_dir: str, *, model: str, recipe: str, epochs: int, batch_size: int | None,
            precision: str | None = None, score_test: bool = True, report=None) -> dict:
    """Trains `model` on `dataset_dir` with the training step on `framework` in this process; `report(dict)` is
    called after each epoch with what is measured so far (a parent that stops a run at its time budget keeps it)."""
    from components.train import frameworks

    frameworks.use(framework)  # before anything imports keras
    # Keras' backend before TensorFlow, which reading the test split imports where it is installed: torch's triton,
    # loaded after TensorFlow in one process, crashes it (a segmentation fault in triton._C.libtriton's import).
    import keras  # noqa: F401

    from components.dataio import data
    from components.train.settings import TrainSettings

    test = data.load_split_arrays(dataset_dir, "test") if score_test else None
    model_dir = tempfile.mkdtemp(prefix=f"bench-{framework}-")
    settings = TrainSettings(dataset_dir, model_dir, framework=framework, recipe=recipe, model=model, epochs=epochs,
                             batch_size=batch_size, precision=precision)
    clock = StepClock()
    train_count = data.read_manifest(dataset_dir)["splits"]["train"]["count"]
    measured = {"framework": framework, "model": model, "recipe": recipe, "train_count": train_count,
                "epochs": [], "step_seconds": 0.0, "input_wait_seconds": None}
    start = time.monotonic()
    scoring = [0.0]

    def at_epoch_end(epoch, logs, predict):
        import numpy as np

        reached = time.monotonic()
        entry = {"epoch": epoch + 1, "seconds": reached - start - scoring[0],
                 "val_accuracy": logs.get("val_accuracy"), "loss": logs["loss"]}
        if test is not None:
            images, labels = test
            correct = 0
            for i in range(0, len(labels), 500):
                logits = np.asarray(predict(images[i:i + 500].astype("float32")), np.float32)
                correct += int((logits.argmax(-1) == labels[i:i + 500]).sum())
            entry["test_accuracy"] = correct / len(labels)
        measured["epochs"].append(entry)
        if "flops_per_image" not in measured:
            measured.update(flops_per_image=model_flops(loop.model), global_batch=loop.plan.global_batch,
                            precision=loop.plan.precision, jit=loop.plan.use_jit)
        measured.update(step_seconds=clock.step_seconds, batches=clock.batches, peak_memory_mb=_peak_memory_mb(),
                        input_wait_seconds=clock.wait_seconds if framework in INPUT_CLOCKED else None)
        scoring[0] += time.monotonic() - reached
        if report is not None:
            report(measured)

    loop = timed_loop(settings, clock, at_epoch_end)
    result = loop.run()
    measured.update(distribution=result.strategy, step_images_per_second_reported=result.images_per_second,
                    train_seconds=result.train_seconds, peak_memory_mb=_peak_memory_mb(), finished=True)
    return measured


def _peak_memory_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def summarize(measured: dict) -> dict:
    """Epoch seconds (first, mean of the rest), images/s over the epochs, the last epoch's accuracies."""
    epochs = measured["epochs"]
    seconds = [b["seconds"] - a["seconds"] for a, b in zip([{"seconds": 0.0}] + epochs, epochs)]
    rest = seconds[1:] or seconds
    images = measured["train_count"] * len(epochs)
    step_images = measured.get("batches", 0) and measured.get("global_batch", 0) * measured["batches"]
    return {"epochs_done": len(epochs), "first_epoch_seconds": seconds[0] if seconds else None,
            "epoch_seconds": sum(rest) / len(rest) if rest else None,
            "images_per_second": images / epochs[-1]["seconds"] if epochs else None,
            "step_images_per_second": step_images / measured["step_seconds"] if step_images else None,
            "input_wait_share": measured["input_wait_seconds"] / measured["step_seconds"]
            if measured["step_seconds"] and measured["input_wait_seconds"] is not None else None,
            "test_accuracy": epochs[-1].get("test_accuracy") if epochs else None,
            "val_accuracy": epochs[-1].get("val_accuracy") if epochs else None}


def _child(framework: str, args: list[str]) -> dict:
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    done = subprocess.run([sys.executable, "-m", "tests.benchmarks.frameworks", "--measure", framework, *args],
                          capture_output=True, text=True, env=env, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{framework} run {args} failed ({done.returncode}):\n{done.stderr[-4000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


# ------------------------------------------------------------------------------------------ the side-by-side run

def table(title: str, runs: list[dict]) -> str:
    rows = [(title, *(r["framework"] for r in runs))]

    def row(name, fmt, key):
        rows.append((name, *(fmt.format(r[key]) if r.get(key) is not None else "-" for r in runs)))

    rows.append(("epochs x global batch", *(f"{r['epochs_done']} x {r['global_batch']}" for r in runs)))
    row("images/s", "{:.0f}", "images_per_second")
    row("first epoch s (tracing)", "{:.1f}", "first_epoch_seconds")
    row("epoch s (the others)", "{:.1f}", "epoch_seconds")
    row("test accuracy", "{:.4f}", "test_accuracy")
    row("input wait / step time", "{:.0%}", "input_wait_share")
    row("peak memory MB", "{:.0f}", "peak_memory_mb")
    rows.append(("precision, XLA", *(f"{r['precision']}, {'on' if r['jit'] else 'off'}" for r in runs)))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--frameworks", default=",".join(FRAMEWORKS))
    parser.add_argument("--data", default=FASHION_MNIST, help="Fashion-MNIST (idx files)")
    parser.add_argument("--fashion-limit", type=int, default=6000, help="images per source split")
    parser.add_argument("--fashion-epochs", type=int, default=2)
    parser.add_argument("--photos", help="class folders of photos (default: `make photos`' food photos)")
    parser.add_argument("--image-size", type=int, default=128)
    parser.add_argument("--photo-epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=32, help="the photos' batch")
    parser.add_argument("--precision", default="float32", help="every run's (auto is float32 for torch and JAX on a CPU; "
                        "mixed_bfloat16 on this 2-core machine made torch's and JAX's first epoch 4-6x slower)")
    parser.add_argument("--workdir", help="keep the preprocessed shards here (reused when present)")
    parser.add_argument("--measure", choices=FRAMEWORKS, help=argparse.SUPPRESS)  # one framework, own process
    parser.add_argument("--dataset-dir", help=argparse.SUPPRESS)
    parser.add_argument("--model", help=argparse.SUPPRESS)
    parser.add_argument("--recipe", help=argparse.SUPPRESS)
    parser.add_argument("--epochs", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    if args.measure:
        batch = None if args.recipe == "reference" else args.batch_size
        measured = measure(args.measure, args.dataset_dir, model=args.model, recipe=args.recipe, epochs=args.epochs,
                           batch_size=batch, precision=args.precision)
        print(json.dumps(measured))
        return measured

    chosen = [name.strip() for name in args.frameworks.split(",") if name.strip()]
    unknown = sorted(set(chosen) - set(FRAMEWORKS))
    if unknown:
        raise SystemExit(f"unknown framework(s) {unknown}; known: {', '.join(FRAMEWORKS)}")
    from tests import photos

    photos_dir = args.photos or photos.installed()
    work = args.workdir or tempfile.mkdtemp(prefix="bench-frameworks-")
    workloads = [("reference-cnn", "reference", "fashion", args.fashion_epochs)]
    if photos_dir:
        workloads.append(("mobilenet-v3-small", "fast", "photos", args.photo_epochs))
    else:
        print(f"no photos: the mobilenet-v3-small runs are skipped (`make photos`: npm's {photos.PACKAGE}, or "
              "--photos DIR)", flush=True)
    datasets = {"fashion": os.path.join(work, f"fashion-{args.fashion_limit}"),
                "photos": os.path.join(work, f"photos-{args.image_size}")}
    from components.dataio import data
    from components.preprocess import preprocess

    for name, _, source, _ in workloads:
        target = datasets[source]
        if not os.path.exists(os.path.join(target, data.MANIFEST)):
            print(f"preprocessing {source} into {target} ...", flush=True)
            if source == "fashion":
                preprocess(args.data, target, limit=args.fashion_limit)
            else:
                preprocess(photos_dir, target, image_size=args.image_size, channels=3)

    load_before = os.getloadavg()[0]
    results = {}
    for model, recipe, source, epochs in workloads:
        runs = []
        for framework in chosen:
            print(f"training {model} on {source} with {framework} ...", flush=True)
            measured = _child(framework, ["--dataset-dir", datasets[source], "--model", model, "--recipe", recipe,
                                          "--epochs", str(epochs), "--batch-size", str(args.batch_size),
                                          "--precision", args.precision])
            runs.append({**measured, **summarize(measured)})
        results[source] = runs
    print(f"\nFrameworks on this CPU ({os.cpu_count()} CPU(s), load average {load_before:.1f} -> "
          f"{os.getloadavg()[0]:.1f}), the training step on each, one process each:")
    for (model, recipe, source, _), runs in zip(workloads, results.values()):
        manifest = data.read_manifest(datasets[source])
        shape = "x".join(map(str, manifest["image_shape"]))
        print(f"\n{model} on {source} ({shape}, {manifest['splits']['train']['count']} training images, "
              f"{manifest['splits']['test']['count']} test, recipe {recipe}):")
        print(table(model, runs))
    return results


if __name__ == "__main__":
    main()
