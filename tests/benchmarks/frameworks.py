"""The training step on each framework, side by side in one run: TensorFlow, PyTorch and JAX train the same model
with the same recipe through `components.train.train(framework=...)`.

    python -m tests.benchmarks.frameworks [--data DIR] [--dataset-dir PREPROCESSED] [--recipe reference]
                                          [--epochs N] [--photos PREPROCESSED_PHOTOS] [--frameworks tensorflow torch jax]

Cases: the reference CNN on Fashion-MNIST (the reference recipe, 12 epochs, unless --epochs), and, with --photos
(a preprocessed photo set, e.g. 128 px), mobilenet-v3-small on it. Each run is its own process (a process holds
Keras on one backend). Reported per run: images/s and seconds per epoch (training only: the test split is scored
after every epoch off the clock), and the final test accuracy; a framework that is not installed is skipped and
said so. The goal: torch and JAX reach TensorFlow's test accuracy within 0.01.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time

FRAMEWORKS = ("tensorflow", "torch", "jax")
ACCURACY_TOLERANCE = 0.01


def measure(framework: str, dataset_dir: str, model: str, recipe: str, epochs: int | None) -> dict:
    """One training run in this process (KERAS_BACKEND is set by train() before keras is imported)."""
    from components import data, train
    from components.train import frameworks
    from tests.benchmarks.train import _Probe

    frameworks.use(framework)  # before anything imports keras (reading the test split with tf.data would)
    test_images, test_labels = data.load_split_arrays(dataset_dir, "test")
    start = time.monotonic()
    probe = _Probe(test_images.astype("float32"), test_labels, start)
    result = train.train(dataset_dir, tempfile.mkdtemp(prefix="bench-frameworks-"), framework=framework,
                         model=model, recipe=recipe, epochs=epochs,
                         epoch_callback=lambda epoch, logs, predict: probe(predict))
    seconds = probe.epochs[-1]["seconds"]
    train_count = data.read_manifest(dataset_dir)["splits"]["train"]["count"]
    return {"framework": framework, "model": model, "recipe": recipe, "epochs": result.epochs,
            "precision": result.precision, "global_batch": result.global_batch_size, "train_seconds": seconds,
            "seconds_per_epoch": seconds / result.epochs, "images_per_second": train_count * result.epochs / seconds,
            "test_accuracy": probe.epochs[-1]["test_accuracy"], "per_epoch": probe.epochs}


def _run_child(framework: str, dataset_dir: str, model: str, recipe: str, epochs: int | None) -> dict:
    command = [sys.executable, "-m", "tests.benchmarks.frameworks", "--measure", framework, "--dataset-dir",
               dataset_dir, "--model", model, "--recipe", recipe, *(["--epochs", str(epochs)] if epochs else [])]
    done = subprocess.run(command, capture_output=True, text=True, check=False,
                          env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"})
    if done.returncode != 0:
        raise RuntimeError(f"{framework} run failed ({done.returncode}):\n{done.stderr[-4000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def table(runs: list[dict]) -> str:
    rows = [("framework", "precision", "s/epoch", "images/s", "test accuracy")]
    rows += [(r["framework"], r["precision"], f"{r['seconds_per_epoch']:.1f}", f"{r['images_per_second']:.0f}",
              f"{r['test_accuracy']:.4f}") for r in runs]
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", default="/usr/share/datasets/fashion-mnist", help="source for preprocess")
    parser.add_argument("--dataset-dir", help="an already preprocessed Fashion-MNIST (skips preprocess)")
    parser.add_argument("--photos", help="a preprocessed photo set (e.g. 128 px): also mobilenet-v3-small on it")
    parser.add_argument("--recipe", default="reference")
    parser.add_argument("--epochs", type=int, help="default: the recipe's")
    parser.add_argument("--model", default="reference-cnn", help=argparse.SUPPRESS)
    parser.add_argument("--frameworks", nargs="+", default=list(FRAMEWORKS), choices=FRAMEWORKS)
    parser.add_argument("--measure", choices=FRAMEWORKS, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    if args.measure:  # one run, in its own process
        measured = measure(args.measure, args.dataset_dir, args.model, args.recipe, args.epochs)
        print(json.dumps(measured))
        return measured

    dataset_dir = args.dataset_dir
    if not dataset_dir:
        from components.preprocess import preprocess

        dataset_dir = tempfile.mkdtemp(prefix="bench-frameworks-data-")
        preprocess(args.data, dataset_dir)
    cases = [("reference-cnn", dataset_dir)] + ([("mobilenet-v3-small", args.photos)] if args.photos else [])
    results = {}
    for model, data_dir in cases:
        runs = []
        for framework in args.frameworks:
            if importlib.util.find_spec(framework) is None:
                print(f"{framework}: not installed, skipped (make run FRAMEWORK={framework} installs it)")
                continue
            runs.append(_run_child(framework, data_dir, model, args.recipe, args.epochs))
        print(f"\n{model}, recipe {args.recipe}, {os.cpu_count()} CPU(s), load average {os.getloadavg()[0]:.1f}")
        print(table(runs))
        reference = next((r for r in runs if r["framework"] == "tensorflow"), None)
        if reference:
            for run in runs[1:]:
                gap = reference["test_accuracy"] - run["test_accuracy"]
                print(f"{run['framework']}: {gap:+.4f} below TensorFlow's test accuracy "
                      f"(goal <= {ACCURACY_TOLERANCE}): {'met' if gap <= ACCURACY_TOLERANCE else 'NOT met'}")
        results[model] = runs
    return results


if __name__ == "__main__":
    main()
