"""Does augmentation help? The reference model trained on Fashion-MNIST without augmentation and with policies,
online (each epoch sees fresh augmented copies), at the same epoch budget; test accuracy side by side.

    python -m tests.benchmarks.augment [--limit N] [--epochs 12] [--policies NAME,...] [--seed 0]

`--limit` caps the images per source split (0: the full 60k train / 10k test); epochs default to the
reference recipe's 12 (its learning-rate steps at epochs 3 and 7 included). Every arm starts from the same
seed (weights and shuffling), so the difference is the augmentation. One seed per arm: differences of a
few tenths of a point are within seed-to-seed variation of this model; the table says so.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import tempfile
import time

import numpy as np

POLICIES = {
    # Clothes are left-right symmetric: a mirrored shirt is still a shirt (unlike digits).
    "flip": {"rotation_degrees": 0, "shift_fraction": 0, "zoom_range": 0, "horizontal_flip": True, "seed": 1},
    "flip+shift": {"rotation_degrees": 0, "shift_fraction": 0.06, "zoom_range": 0, "horizontal_flip": True,
                   "seed": 1},
    "geometric+elastic": {"rotation_degrees": 8, "shift_fraction": 0.06, "zoom_range": 0.06, "horizontal_flip": True,
                          "elastic_alpha": 8, "elastic_sigma": 4, "seed": 1},
}


def test_accuracy(model_dir: str, dataset_dir: str) -> float:
    import keras

    from components import data

    images, labels = data.load_split_arrays(dataset_dir, "test")
    model = keras.models.load_model(os.path.join(model_dir, "model.keras"), compile=False)
    logits = model.predict(images.astype(np.float32), batch_size=1024, verbose=0)
    return float((logits.argmax(axis=1) == labels).mean())


def train_arm(dataset_dir: str, workdir: str, name: str, policy: dict | None, epochs: int, seed: int) -> dict:
    import keras

    from components import augment, train

    augmented = None
    if policy is not None:
        augmented = os.path.join(workdir, f"aug-{name}")
        augment.augment(dataset_dir, augmented, mode="online", policy=augment.AugmentPolicy.from_json(policy))
    keras.utils.set_random_seed(seed)
    model_dir = os.path.join(workdir, f"model-{name}")
    start = time.monotonic()
    result = train.train(dataset_dir, model_dir, augmented_dir=augmented, epochs=epochs)
    return {"policy": policy, "test_accuracy": test_accuracy(model_dir, dataset_dir),
            "train_accuracy": result.history["accuracy"][-1], "val_accuracy": result.history["val_accuracy"][-1],
            "seconds": round(time.monotonic() - start, 1)}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--limit", type=int, default=0, help="images per source split (0: all)")
    parser.add_argument("--epochs", type=int, default=12)
    parser.add_argument("--policies", default="flip,flip+shift", help=f"from {', '.join(POLICIES)}")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")  # one line per epoch
    from components import data
    from components.preprocess import preprocess

    workdir = tempfile.mkdtemp(prefix="augment-bench-")
    try:
        dataset = os.path.join(workdir, "dataset")
        prep = preprocess(data.DEFAULT_SOURCE, dataset, limit=args.limit or None)
        arms = {"none": train_arm(dataset, workdir, "none", None, args.epochs, args.seed)}
        print(f"none: {arms['none']}", flush=True)
        for name in args.policies.split(","):
            arms[name] = train_arm(dataset, workdir, name, POLICIES[name], args.epochs, args.seed)
            print(f"{name}: {arms[name]}", flush=True)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)

    base = arms["none"]["test_accuracy"]
    print(f"\nReference model on Fashion-MNIST: {prep.counts['train']} train / {prep.counts['test']} test images, "
          f"{args.epochs} epochs each, seed {args.seed}, online augmentation")
    print(f"{'policy':20} {'test acc':>9} {'vs none':>9} {'train acc':>10} {'seconds':>8}")
    for name, arm in arms.items():
        print(f"{name:20} {arm['test_accuracy']:9.4f} {100 * (arm['test_accuracy'] - base):+8.2f}pp "
              f"{arm['train_accuracy']:10.4f} {arm['seconds']:8.0f}")
    best = max(arms, key=lambda n: arms[n]["test_accuracy"])
    print(f"best: {best}" + ("" if best == "none" else f" ({100 * (arms[best]['test_accuracy'] - base):+.2f}pp; "
                                                       "one seed per arm, so small gaps are within noise)"))
    return {"train_images": prep.counts["train"], "test_images": prep.counts["test"], "epochs": args.epochs,
            "seed": args.seed, "arms": arms, "best": best}


if __name__ == "__main__":
    print(json.dumps(main(), indent=2))
