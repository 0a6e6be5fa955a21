"""Near-copies across the split: what the test accuracy says when every image has near-copies.

    python -m tests.benchmarks.near_copies [--originals 2000] [--copies 12] [--epochs 2] [--workdir DIR]

A class-per-folder tree of real Fashion-MNIST images (train, then test), each with `copies` near-copies that differ
in two corner pixels, is preprocessed twice in the same run: as preprocess does it (near-copies grouped, each group
in one split), and with the grouping taken out (each image split by its own bytes, as before: copies of most test
images land in training). The same model (the reference CNN, `epochs` epochs) is trained on each and scored on its
own test split, beside the clean reference: the originals alone, trained for as many steps (`epochs` x (copies + 1)
epochs). Each model is also scored on 5,000 fresh images (Fashion-MNIST test images that are in no form in the
source): grouped, the test accuracy should be what the model scores on those, as the clean one's is; ungrouped, it
measures memory.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time

import numpy as np

from components.dataio import data
from components import preprocess as pp
from tests.benchmarks.ingest import without_near_grouping

CORNERS = ((0, 0), (0, -1), (-1, 0), (-1, -1))
FRESH = 5000


def make_tree(root: str, originals: int, copies: int, seed: int = 0) -> dict[str, int]:
    """The tree, and for each file the original it copies."""
    from PIL import Image

    images, labels = [], []
    for prefix in ("train", "t10k"):
        images.append(data.read_idx(os.path.join(data.DEFAULT_SOURCE, f"{prefix}-images-idx3-ubyte.gz")))
        labels.append(data.read_idx(os.path.join(data.DEFAULT_SOURCE, f"{prefix}-labels-idx1-ubyte.gz")))
    images, labels = np.concatenate(images)[:originals], np.concatenate(labels)[:originals]
    rng = np.random.default_rng(seed)
    names = rng.permutation(originals * (copies + 1))  # copies listed apart from their original
    origin, position = {}, 0
    for index, (image, label) in enumerate(zip(images, labels)):
        for copy in range(copies + 1):
            pixels = image.copy()
            if copy:
                for corner in rng.choice(len(CORNERS), 2, replace=False):
                    pixels[CORNERS[corner]] = rng.integers(0, 256)
            folder = os.path.join(root, data.FASHION_MNIST_CLASSES[label].replace("/", "-"))
            os.makedirs(folder, exist_ok=True)
            path = os.path.join(folder, f"{names[position]:07d}.png")
            Image.fromarray(pixels).save(path)
            origin[path] = index
            position += 1
    return origin


def leaked(dataset_dir: str, origin: dict[str, int]) -> int:
    """Test images whose original also has a copy in training or validation."""
    held = {split: [origin[uri.decode()] for _, _, uri in
                    data.read_split(dataset_dir, split, with_uri=True).as_numpy_iterator()] for split in data.SPLITS}
    seen = set(held["train"]) | set(held["validation"])
    return sum(1 for o in held["test"] if o in seen)


def accuracy(dataset_dir: str, model_dir: str, epochs: int) -> tuple[float, float]:
    """Trains the model; its accuracy on the dataset's test split, and on FRESH images that are in no form in the
    source (the last 5,000 of Fashion-MNIST's test set: the originals are its first training images)."""
    from components.train import train
    from tests.conftest import accuracy_of

    train(dataset_dir, model_dir, epochs=epochs)
    fresh = data.read_idx(os.path.join(data.DEFAULT_SOURCE, "t10k-images-idx3-ubyte.gz"))[-FRESH:, ..., None]
    fresh_labels = data.read_idx(os.path.join(data.DEFAULT_SOURCE, "t10k-labels-idx1-ubyte.gz"))[-FRESH:]
    classifier = data.load_classifier(model_dir)
    # the model's classes are the tree's folders, in sorted order: back to Fashion-MNIST's label of each
    folders = [name.replace("/", "-") for name in data.FASHION_MNIST_CLASSES]
    label_of = np.array([folders.index(name) for name in classifier.class_names])
    predicted = label_of[classifier.predict_proba(fresh.astype("float32")).argmax(1)]
    fresh_accuracy = float((predicted == fresh_labels).mean())
    return accuracy_of(model_dir, dataset_dir), fresh_accuracy


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--originals", type=int, default=2000)
    parser.add_argument("--copies", type=int, default=12)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--workdir")
    args = parser.parse_args(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    workdir = args.workdir or tempfile.mkdtemp(prefix="near-copies-")
    results = {}
    try:
        origin = make_tree(os.path.join(workdir, "tree"), args.originals, args.copies)
        clean_root = os.path.join(workdir, "clean")
        first_files = {}
        for path, index in origin.items():  # the originals alone: each one's first file is not a copy
            first_files.setdefault(index, path)
        clean_origin = {}
        for index, path in first_files.items():
            target = os.path.join(clean_root, os.path.basename(os.path.dirname(path)), os.path.basename(path))
            os.makedirs(os.path.dirname(target), exist_ok=True)
            shutil.copy(path, target)
            clean_origin[target] = index
        for name, root, mapping, epochs, grouping in (
                ("grouped", os.path.join(workdir, "tree"), origin, args.epochs, True),
                ("ungrouped (before)", os.path.join(workdir, "tree"), origin, args.epochs, False),
                ("clean originals", clean_root, clean_origin, args.epochs * (args.copies + 1), True)):
            out = os.path.join(workdir, name.split()[0])
            start = time.monotonic()
            if grouping:
                result = pp.preprocess(root, out + "-data")
            else:
                with without_near_grouping():
                    result = pp.preprocess(root, out + "-data")
            test_accuracy, fresh_accuracy = accuracy(out + "-data", out + "-model", epochs)
            results[name] = {"counts": result.counts, "near_duplicates": {
                k: result.near_duplicates.get(k) for k in ("groups", "images", "test_groups_shared")},
                "test_images_with_a_copy_in_training": leaked(out + "-data", mapping),
                "test_accuracy": round(test_accuracy, 4), "fresh_accuracy": round(fresh_accuracy, 4),
                "epochs": epochs,
                "seconds": round(time.monotonic() - start, 1)}
            print(name, json.dumps(results[name]), flush=True)
    finally:
        if not args.workdir:
            shutil.rmtree(workdir, ignore_errors=True)
    print(f"\n{args.originals} Fashion-MNIST images, each with {args.copies} near-copies (two corner pixels)")
    print(f"{'':22} {'train':>7} {'val':>6} {'test':>6} {'test with a copy in training':>30} {'test accuracy':>14} "
          f"{f'on {FRESH} fresh images':>22}")
    for name, r in results.items():
        c = r["counts"]
        print(f"{name:22} {c['train']:7d} {c['validation']:6d} {c['test']:6d} "
              f"{r['test_images_with_a_copy_in_training']:30d} {r['test_accuracy']:14.4f} {r['fresh_accuracy']:22.4f}")
    return results


if __name__ == "__main__":
    print(json.dumps(main(), indent=2))
