"""Does augmentation help? The reference model trained on Fashion-MNIST without and with augmentation policies,
at the same epoch budget; test accuracy side by side.

    python -m tests.benchmarks.augment [--limit N] [--epochs 12] [--online flip] [--offline shift,cutout]

Two kinds of arms, each against its own control:
  - online POLICY: every epoch sees freshly augmented images and never the originals; the same number of
    steps as `none`;
  - offline POLICY: one augmented copy of every image is added to the originals (copies=1), so an epoch has
    twice the steps; its control is `offline duplicate`, the same with an identity policy (the originals
    twice), so the only difference is the augmentation.
`--limit` caps the images per source split (0: the full 60k train / 10k test); epochs default to the
reference recipe's 12 (its learning-rate steps at epochs 3 and 7 included). Every arm starts from the same
seed (weights and shuffling). One seed per arm: differences of a few tenths of a point are within
seed-to-seed variation of this model.
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
    "identity": {"rotation_degrees": 0, "shift_fraction": 0, "zoom_range": 0, "seed": 1},
    # Label-preserving for clothes, but the dataset's shoes all point left: flipped ones are off-distribution.
    "flip": {"rotation_degrees": 0, "shift_fraction": 0, "zoom_range": 0, "horizontal_flip": True, "seed": 1},
    "flip+shift": {"rotation_degrees": 0, "shift_fraction": 0.06, "zoom_range": 0, "horizontal_flip": True,
                   "seed": 1},
    "shift": {"rotation_degrees": 0, "shift_fraction": 0.05, "zoom_range": 0, "seed": 1},
    "cutout": {"rotation_degrees": 0, "shift_fraction": 0, "zoom_range": 0, "cutout_fraction": 0.25, "seed": 1},
    "default": {"seed": 1},  # rotation 10 degrees, shift 0.08, zoom 0.08
    "geometric+elastic": {"rotation_degrees": 8, "shift_fraction": 0.06, "zoom_range": 0.06, "elastic_alpha": 8,
                          "elastic_sigma": 4, "seed": 1},
}


def test_accuracy(model_dir: str, dataset_dir: str) -> float:
    import keras

    from components.dataio import data

    images, labels = data.load_split_arrays(dataset_dir, "test")
    model = keras.models.load_model(os.path.join(model_dir, "model.keras"), compile=False)
    logits = model.predict(images.astype(np.float32), batch_size=1024, verbose=0)
    return float((logits.argmax(axis=1) == labels).mean())


def train_arm(dataset_dir: str, workdir: str, name: str, policy: dict | None, mode: str, epochs: int,
              seed: int) -> dict:
    import keras

    from components import augment, train

    augmented = None
    if policy is not None:
        augmented = os.path.join(workdir, f"aug-{mode}-{name}")
        augment.augment(dataset_dir, augmented, mode=mode, copies=1 if mode == "offline" else 0,
                        policy=augment.AugmentPolicy.from_json(policy))
    keras.utils.set_random_seed(seed)
    model_dir = os.path.join(workdir, f"model-{mode}-{name}")
    start = time.monotonic()
    result = train.train(dataset_dir, model_dir, augmented_dir=augmented, epochs=epochs)
    if augmented:
        shutil.rmtree(augmented, ignore_errors=True)
    return {"mode": mode, "policy": policy, "test_accuracy": test_accuracy(model_dir, dataset_dir),
            "train_accuracy": result.history["accuracy"][-1], "val_accuracy": result.history["val_accuracy"][-1],
            "seconds": round(time.monotonic() - start, 1)}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--limit", type=int, default=0, help="images per source split (0: all)")
    parser.add_argument("--epochs", type=int, default=12)
    parser.add_argument("--online", default="flip", help=f"online policies, from {', '.join(POLICIES)} ('': none)")
    parser.add_argument("--offline", default="shift,cutout", help="offline policies (copies=1), same names")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")  # one line per epoch
    from components.dataio import data
    from components.preprocess import preprocess

    plan = [("none", None, "online")]
    plan += [(name, POLICIES[name], "online") for name in filter(None, args.online.split(","))]
    offline = list(filter(None, args.offline.split(",")))
    if offline:
        plan += [("duplicate", POLICIES["identity"], "offline")] + [(n, POLICIES[n], "offline") for n in offline]
    workdir = tempfile.mkdtemp(prefix="augment-bench-")
    arms = {}
    try:
        dataset = os.path.join(workdir, "dataset")
        prep = preprocess(data.DEFAULT_SOURCE, dataset, limit=args.limit or None)
        for name, policy, mode in plan:
            label = name if name == "none" else f"{mode} {name}"
            arms[label] = train_arm(dataset, workdir, name, policy, mode, args.epochs, args.seed)
            print(f"{label}: {json.dumps(arms[label])}", flush=True)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)

    print(f"\nReference model on Fashion-MNIST: {prep.counts['train']} train / {prep.counts['test']} test images, "
          f"{args.epochs} epochs each, seed {args.seed}")
    print(f"{'arm':26} {'steps/epoch':>11} {'test acc':>9} {'vs control':>11} {'train acc':>10} {'seconds':>8}")
    for label, arm in arms.items():
        control = arms["offline duplicate" if arm["mode"] == "offline" else "none"]
        delta = 100 * (arm["test_accuracy"] - control["test_accuracy"])
        print(f"{label:26} {'2x' if arm['mode'] == 'offline' else '1x':>11} {arm['test_accuracy']:9.4f} "
              f"{delta:+9.2f}pp {arm['train_accuracy']:10.4f} {arm['seconds']:8.0f}")
    helped = {label: 100 * (arm["test_accuracy"] - arms["offline duplicate" if arm["mode"] == "offline"
                                                         else "none"]["test_accuracy"])
              for label, arm in arms.items() if label not in ("none", "offline duplicate")}
    best = max(helped, key=helped.get) if helped else None
    best = best if best and helped[best] > 0 else None
    if best:
        print(f"best: {best}, {helped[best]:+.2f}pp over its control (one seed per arm)")
    else:
        print("no policy beat its control at this epoch budget (one seed per arm)")
    return {"train_images": prep.counts["train"], "test_images": prep.counts["test"], "epochs": args.epochs,
            "seed": args.seed, "arms": arms, "gain_pp_over_control": helped, "best": best}


if __name__ == "__main__":
    print(json.dumps(main(), indent=2))
