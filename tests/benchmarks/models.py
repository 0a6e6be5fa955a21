"""Models benchmark: the reference CNN against two real backbones trained from scratch, and the input pipeline.

    python -m tests.benchmarks.models [--limit 6000] [--image-size 64] [--epochs 3] [--models a,b,c]

One run, on Fashion-MNIST resized to 64x64 RGB (preprocess writes those shards with encoded images, as it does
for every size of 64 and above), measures side by side on the same CPUs:
  - for each model (`reference-cnn`, `mobilenet-v3-small`, `efficientnet-v2-b0`, no pretrained weights): test
    accuracy after the same epochs, training images/s (the training step's own count: the steps' images over
    the time from the first to the last step) and peak memory; each model trains in its own process;
  - the input pipeline alone: the training input in stream mode (read the encoded shards, decode in parallel,
    shuffle, batch), iterated for as many images as one epoch, with no model attached.
The input pipeline must deliver at least the fastest model's training rate: otherwise training would wait for
its data. Timings on a shared machine are noisy; compare the ratios of one run.
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

MODELS = ("reference-cnn", "mobilenet-v3-small", "efficientnet-v2-b0")


def measure_model(dataset_dir: str, model: str, epochs: int, batch_size: int) -> dict:
    """Trains `model` from scratch with the project's training step; test accuracy is scored after the last
    epoch, outside the training clock."""
    import numpy as np

    from components import data, train

    test_images, test_labels = data.load_split_arrays(dataset_dir, "test")
    scores: list[float] = []

    def score(epoch, logs, predict):
        if epoch + 1 < epochs:
            return
        correct = 0
        for i in range(0, len(test_labels), 500):
            logits = np.asarray(predict(test_images[i:i + 500].astype("float32")))
            correct += int((logits.argmax(-1) == test_labels[i:i + 500]).sum())
        scores.append(correct / len(test_labels))

    model_dir = tempfile.mkdtemp(prefix=f"bench-{model}-")
    result = train.train(dataset_dir, model_dir, model=model, pretrained="none", epochs=epochs,
                         batch_size=batch_size, validate=False, epoch_callback=score)
    return {"model": model, "epochs": result.epochs, "global_batch": result.global_batch_size,
            "train_seconds": result.train_seconds, "images_per_second": result.images_per_second,
            "test_accuracy": scores[-1] if scores else None, "precision": result.precision,
            "jit_compile": result.jit_compile, "input_mode": result.input_mode,
            "peak_memory_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def measure_input(dataset_dir: str, batch_size: int) -> dict:
    """The training input alone, streamed from the encoded shards: one epoch's images, twice (the first pass
    warms the file cache and tf.data's autotuning; the second is timed)."""
    from components import data
    from components.train.inputs import TrainInput
    from components.train.recipes import resolve_recipe

    manifest = data.read_manifest(dataset_dir)
    count = manifest["splits"]["train"]["count"]
    recipe = resolve_recipe("fast", batch_size=batch_size)
    source = TrainInput(dataset_dir, manifest["image_shape"], pipeline_id=0, num_pipelines=1, recipe=recipe,
                        online_policy=None, mode="stream")
    batches = count // batch_size
    rates = []
    for epoch in range(2):
        start = time.monotonic()
        seen = sum(int(labels.shape[0]) for _, labels in source.dataset(epoch, 0, batches, batch_size))
        rates.append(seen / (time.monotonic() - start))
    return {"images_per_second": rates[-1], "images": batches * batch_size,
            "image_encoding": manifest.get("image_encoding", "raw"),
            "peak_memory_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def _child(args: list[str]) -> dict:
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    done = subprocess.run([sys.executable, "-m", "tests.benchmarks.models", *args], capture_output=True, text=True,
                          env=env, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"benchmark child {args} failed ({done.returncode}):\n{done.stderr[-4000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def shard_bytes_per_image(dataset_dir: str) -> float:
    from components import data

    manifest = data.read_manifest(dataset_dir)
    train = manifest["splits"]["train"]
    return train["bytes"] / max(1, train["count"])


def table(models: list[dict], pipeline: dict) -> str:
    rows = [("", "test accuracy", "training images/s", "peak memory MB")]
    for m in models:
        rows.append((m["model"], f"{m['test_accuracy']:.4f}", f"{m['images_per_second']:.0f}",
                     f"{m['peak_memory_mb']:.0f}"))
    rows.append(("input pipeline (stream)", "", f"{pipeline['images_per_second']:.0f}",
                 f"{pipeline['peak_memory_mb']:.0f}"))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", default="/usr/share/datasets/fashion-mnist", help="source for preprocess")
    parser.add_argument("--dataset-dir", help="an already preprocessed dataset (skips preprocess)")
    parser.add_argument("--limit", type=int, default=6000, help="images per source split (default: %(default)s)")
    parser.add_argument("--image-size", type=int, default=64)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--models", default=",".join(MODELS), help="comma-separated (default: %(default)s)")
    parser.add_argument("--measure", help=argparse.SUPPRESS)  # one model, or "input", in its own process
    args = parser.parse_args(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

    if args.measure:
        measured = measure_input(args.dataset_dir, args.batch_size) if args.measure == "input" \
            else measure_model(args.dataset_dir, args.measure, args.epochs, args.batch_size)
        print(json.dumps(measured))
        return measured

    dataset_dir = args.dataset_dir
    if not dataset_dir:
        from components.preprocess import preprocess

        dataset_dir = tempfile.mkdtemp(prefix="bench-models-data-")
        print(f"preprocessing {args.limit} images per split at {args.image_size}x{args.image_size} RGB ...",
              flush=True)
        preprocess(args.data, dataset_dir, image_size=args.image_size, channels=3, limit=args.limit)
    common = ["--dataset-dir", dataset_dir, "--epochs", str(args.epochs), "--batch-size", str(args.batch_size)]
    load_before = os.getloadavg()[0]
    models = []
    for name in args.models.split(","):
        print(f"training {name} ...", flush=True)
        models.append(_child([*common, "--measure", name]))
    pipeline = _child([*common, "--measure", "input"])
    per_image = shard_bytes_per_image(dataset_dir)
    raw = args.image_size * args.image_size * 3
    print(f"Models from scratch on Fashion-MNIST as {args.image_size}x{args.image_size} RGB, {args.epochs} epochs, "
          f"batch {args.batch_size}, {os.cpu_count()} CPU(s), load average {load_before:.1f} -> "
          f"{os.getloadavg()[0]:.1f}; shards: {pipeline['image_encoding']}, {per_image:.0f} bytes per image "
          f"({per_image / raw:.2f} of raw)")
    print(table(models, pipeline))
    fastest = max(models, key=lambda m: m["images_per_second"])
    ratio = pipeline["images_per_second"] / fastest["images_per_second"]
    met = ratio >= 1.0
    print(f"input pipeline / fastest model ({fastest['model']}): {ratio:.2f}x (goal >= 1x): "
          f"{'met' if met else 'NOT met'}")
    return {"models": models, "input_pipeline": pipeline, "bytes_per_image": per_image,
            "input_over_fastest": ratio, "goal_met": met}


if __name__ == "__main__":
    main()
