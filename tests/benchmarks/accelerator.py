"""Accelerator benchmark: the catalogue's backbones on a GPU, at photo size, in bf16.

    python -m tests.benchmarks.accelerator [--models mobilenet-v3-small,resnet50] [--image-size 224]
                                            [--batch-size 128] [--steps 40] [--precision mixed_bfloat16]

It needs a GPU and is not part of the default `make bench`. It measures, for each model of the catalogue
(`components.train.models.build`, the same networks the training step builds, heads included):
  - training images/s (an optimizer step on a fixed batch of raw 0-255 pixels, after a warm-up);
  - inference images/s (`model.predict` on batches of raw pixels, as batch prediction feeds the exported model);
  - fine-tuning: the time of phase 1 (backbone frozen, the head trains) and phase 2 (the whole backbone at a tenth of
    the rate, BatchNorm frozen) over the same images, through `models.set_phase` as the training step does.
Images are synthetic on purpose: this measures what the model costs on the accelerator, and so what rate the input
pipeline must deliver to keep it busy. With `--photos DIR` (JPEG photos, any size) it also measures the other side on
this machine's CPUs: photos/s decoded to the model's size with every core, by full decode + resize and by the
cheapest decode (libjpeg's DCT scaling, as Pillow's `draft` and TensorFlow's `decode_jpeg(ratio=)` use it).

It runs on whichever Keras backend is installed (KERAS_BACKEND): TensorFlow in the trainer image, or another
backend where TensorFlow's GPU build cannot be installed, which the output names.
"""

from __future__ import annotations

import argparse
import json
import os
import time


def _sync() -> None:
    """Waits for the accelerator's queued work, so the clock measures computation, not its submission."""
    import keras

    if keras.backend.backend() == "torch":
        import torch

        torch.cuda.synchronize()


def _device() -> str:
    import keras

    if keras.backend.backend() == "torch":
        import torch

        return torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"
    if keras.backend.backend() == "tensorflow":
        import tensorflow as tf

        gpus = tf.config.list_physical_devices("GPU")
        return tf.config.experimental.get_device_details(gpus[0]).get("device_name", "gpu") if gpus else "cpu"
    return keras.backend.backend()


def measure(name: str, image_size: int, num_classes: int, batch_size: int, steps: int, precision: str) -> dict:
    import keras
    import numpy as np

    from components.train import models

    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (batch_size * 4, image_size, image_size, 3), dtype=np.uint8).astype("float32")
    labels = rng.integers(0, num_classes, batch_size * 4).astype("int32")
    model = models.build(name, (image_size, image_size, 3), num_classes, precision)
    timed = _torch_steps if keras.backend.backend() == "torch" else _keras_fit
    row = {"model": name, "image_size": image_size, "batch_size": batch_size, "precision": precision}
    row["train_images_per_second"] = round(timed(model, images, labels, batch_size, steps, 1e-3), 1)

    model.predict(images, batch_size=batch_size * 2, verbose=0)  # warm-up (tracing, allocation)
    _sync()
    start = time.perf_counter()
    for _ in range(max(1, steps // 4)):
        model.predict(images, batch_size=batch_size * 2, verbose=0)
    _sync()
    row["predict_images_per_second"] = round(max(1, steps // 4) * len(images) / (time.perf_counter() - start), 1)

    for phase, rate in ((1, 1e-3), (2, 1e-4)):
        models.set_phase(model, phase)
        row[f"phase{phase}_images_per_second"] = round(timed(model, images, labels, batch_size, steps, rate), 1)
    return row


def _keras_fit(model, images, labels, batch_size: int, steps: int, rate: float) -> float:
    """Training images/s through model.fit (4 batches an epoch); the first call (tracing, autotuning) untimed."""
    import keras

    model.compile(optimizer=keras.optimizers.Adam(rate),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.fit(images, labels, batch_size=batch_size, epochs=1, verbose=0, shuffle=False)
    _sync()
    epochs = max(1, steps // 4)
    start = time.perf_counter()
    model.fit(images, labels, batch_size=batch_size, epochs=epochs, verbose=0, shuffle=False)
    _sync()
    return epochs * len(images) / (time.perf_counter() - start)


def _torch_steps(model, images, labels, batch_size: int, steps: int, rate: float) -> float:
    """On Keras' torch backend model.fit runs its per-step bookkeeping eagerly in Python, which dominates on a fast
    GPU; this optimizer loop over the same Keras model, on batches already on the GPU, measures the model's cost."""
    import torch

    batches = [(torch.as_tensor(images[i:i + batch_size]).cuda(), torch.as_tensor(labels[i:i + batch_size]).long()
                .cuda()) for i in range(0, len(images), batch_size)]
    optimizer = torch.optim.Adam([v.value for v in model.trainable_variables], lr=rate)

    def step(x, y):
        loss = torch.nn.functional.cross_entropy(model(x, training=True).float(), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    for x, y in batches:  # warm-up: cuDNN's algorithm choice, allocation
        step(x, y)
    _sync()
    start = time.perf_counter()
    for i in range(steps):
        step(*batches[i % len(batches)])
    _sync()
    return steps * batch_size / (time.perf_counter() - start)


def _decode_one(task) -> int:
    from PIL import Image

    path, size, scaled = task
    with Image.open(path) as image:
        if scaled:
            image.draft("RGB", (size, size))  # the smallest DCT scale still at least size x size
        image = image.convert("RGB").resize((size, size), Image.BILINEAR)
    return image.size[0]


def measure_decode(photos_dir: str, size: int, seconds: float = 4.0) -> list[dict]:
    """Photos/s decoded and resized to `size` with one process per CPU, per source size and decode method."""
    import multiprocessing

    from PIL import Image

    by_size: dict[str, list[str]] = {}
    for name in sorted(os.listdir(photos_dir)):
        path = os.path.join(photos_dir, name)
        with Image.open(path) as image:
            by_size.setdefault(f"{image.width}x{image.height}", []).append(path)
    rows = []
    workers = os.cpu_count() or 1
    with multiprocessing.Pool(workers) as pool:
        for source_size, paths in by_size.items():
            for scaled in (False, True):
                count, start = 0, time.perf_counter()
                while time.perf_counter() - start < seconds:
                    batch = [(paths[i % len(paths)], size, scaled) for i in range(workers * 4)]
                    count += len(pool.map(_decode_one, batch))
                rate = count / (time.perf_counter() - start)
                rows.append({"source": source_size, "decode": "dct-scaled" if scaled else "full",
                             "workers": workers, "photos_per_second": round(rate, 1)})
                print(json.dumps(rows[-1]), flush=True)
    return rows


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="mobilenet-v3-small,resnet50")
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--num-classes", type=int, default=12)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--precision", default="mixed_bfloat16")
    parser.add_argument("--photos", default="", help="a folder of JPEG photos: also measure decoding on the CPUs")
    args = parser.parse_args(argv)
    import keras

    results = {"backend": keras.backend.backend(), "keras": keras.__version__, "device": _device(), "models": []}
    print(f"Keras {keras.__version__} on {results['backend']}, device: {results['device']}", flush=True)
    for name in args.models.split(","):
        try:
            row = measure(name, args.image_size, args.num_classes, args.batch_size, args.steps, args.precision)
        except Exception as e:  # one model failing must not hide the others' numbers
            row = {"model": name, "error": f"{type(e).__name__}: {e}"}
        print(json.dumps(row), flush=True)
        results["models"].append(row)
    if args.photos:
        results["decode"] = measure_decode(args.photos, args.image_size)
    out = os.environ.get("BENCH_JSON")
    if out:
        with open(out, "w") as f:
            json.dump(results, f, indent=2)
    return results


if __name__ == "__main__":
    main()
