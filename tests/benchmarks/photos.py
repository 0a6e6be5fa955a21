"""Camera photos, side by side with Keras' own input pipeline in one run: preprocess, the training input with the
photo recipe, and batch prediction, on JPEGs from 320x240 to 4000x3000 made from real photographs.

    python -m tests.benchmarks.photos [--photos 360] [--memory 10000,100000] [--repeats 2] [--workdir DIR]

The photographs are those Debian's mate-backgrounds package ships (/usr/share/backgrounds/mate: 12 nature
photos, 1280x1024 to 2560x1920, and the 5640x3172 elephants): `apt-get install mate-backgrounds`. Each benchmark
photo is a random crop (a quarter to all of the area, 4:3) of one of them, resized to one of the camera sizes in
turn and saved as a quality-90 JPEG; its class is the photograph it came from (13 classes). Sizes above a source
photo's own are upsampled (they compress a little better than a camera's sensor noise would).

  - preprocess to 224x224 RGB (decode check, hash, split, shards of the files' bytes) against
    keras.utils.image_dataset_from_directory(image_size=(224, 224)) iterated once; and the shards' bytes
    against the sources';
  - two epochs of the training input with the photo recipe (random resized crop from the source pixels, flip;
    memory mode; the first epoch includes loading the shards and tracing) against image_dataset_from_directory
    with the same
    augmentation as Keras layers (RandomZoom in by up to 0.72 of each side, the recipe's 8% of the area, and
    RandomFlip), which crop the 224x224 thumbnail;
  - batch prediction of the folder (components.predict) against image_dataset_from_directory + model.predict,
    with the same small model (a convolution, pooling and a dense layer: the input pipeline is what is measured);
  - for preprocess and prediction, the CPU time per photo of each side as well (all threads and worker
    processes): steadier than the rates on a shared machine;
  - ceilings: decoding alone with every core (each file at 1/8 scale, the entropy decoding any check of a JPEG
    pays; and at the rule's DCT scale, what prediction decodes), against the same baselines;
  - peak memory of a preprocess process over 10k and 100k 320x240 photos (one JPEG per photo, each made unique
    by a JPEG comment: cheap to write, decoded like any other).
"""

from __future__ import annotations

import argparse
import io
import json
import os
import random
import shutil
import tempfile
import time


from tests.benchmarks.ingest import peak_memory, print_memory

PHOTO_DIR = "/usr/share/backgrounds/mate"
CAMERA_SIZES = ((320, 240), (640, 480), (1024, 768), (1600, 1200), (2048, 1536), (4000, 3000))
IMAGE_SIZE = 224


MISSING = (f"No photographs under {PHOTO_DIR}: install Debian's mate-backgrounds (make photos, or "
           "sudo apt-get install mate-backgrounds)")


def real_photos() -> list[str]:
    """The photographs, or [] when the package is not installed."""
    nature = os.path.join(PHOTO_DIR, "nature")
    found = sorted(os.path.join(nature, n) for n in os.listdir(nature) if n.endswith(".jpg")) \
        if os.path.isdir(nature) else []
    elephants = os.path.join(PHOTO_DIR, "abstract", "Elephants_5640x3172.jpg")
    return found + [elephants] if found and os.path.exists(elephants) else []


def make_camera_tree(root: str, count: int, sizes=CAMERA_SIZES, seed: int = 0) -> str:
    """`count` JPEGs in one folder per source photograph, cycling through `sizes` (see the module docstring)."""
    from PIL import Image

    marker = root.rstrip("/") + ".complete"
    if os.path.exists(marker) and os.path.isdir(root):
        return root
    shutil.rmtree(root, ignore_errors=True)
    rng = random.Random(seed)
    sources = real_photos()
    if not sources:
        raise SystemExit(MISSING)
    opened = [Image.open(path).convert("RGB") for path in sources]
    for path in sources:
        os.makedirs(os.path.join(root, os.path.splitext(os.path.basename(path))[0]), exist_ok=True)
    for i in range(count):
        which = i % len(sources)
        photo, (width, height) = opened[which], sizes[i // len(sources) % len(sizes)]
        area = rng.uniform(0.25, 1.0) * photo.width * photo.height
        crop_w = min(photo.width, int((area * 4 / 3) ** 0.5))
        crop_h = min(photo.height, crop_w * 3 // 4)
        left, top = rng.randint(0, photo.width - crop_w), rng.randint(0, photo.height - crop_h)
        image = photo.crop((left, top, left + crop_w, top + crop_h)).resize((width, height), Image.Resampling.BILINEAR)
        folder = os.path.splitext(os.path.basename(sources[which]))[0]
        image.save(os.path.join(root, folder, f"{i:06d}.jpg"), quality=90)
    with open(marker, "w") as f:
        f.write(str(count))
    return root


def make_unique_copies(root: str, count: int, base: str) -> str:
    """`count` distinct files from the JPEGs under `base`: each a JPEG with a comment (COM segment) naming it,
    so every file hashes differently and decodes to its original's pixels."""
    marker = root.rstrip("/") + ".complete"
    if os.path.exists(marker) and os.path.isdir(root):
        return root
    shutil.rmtree(root, ignore_errors=True)
    originals = []
    for folder in sorted(os.listdir(base)):
        for name in sorted(os.listdir(os.path.join(base, folder))):
            with open(os.path.join(base, folder, name), "rb") as f:
                originals.append((folder, f.read()))
    for folder in {f for f, _ in originals}:
        os.makedirs(os.path.join(root, folder), exist_ok=True)
    for i in range(count):
        folder, contents = originals[i % len(originals)]
        comment = f"copy {i}".encode()
        segment = b"\xff\xfe" + (len(comment) + 2).to_bytes(2, "big") + comment
        with open(os.path.join(root, folder, f"{i:07d}.jpg"), "wb") as f:
            f.write(contents[:2] + segment + contents[2:])
    with open(marker, "w") as f:
        f.write(str(count))
    return root


def decode_floor(root: str, at_least: int | None) -> float:
    """Photos/s of decoding alone, every core, nothing else: each file at 1/8 scale (at_least None: the entropy
    decoding that checking a JPEG costs whatever else is skipped, preprocess's floor), or at the smallest DCT
    scale that keeps both sides >= at_least (what prediction's rule decodes before resizing). A ceiling for
    each side's ratio against its baseline, which decodes the same bytes."""
    import concurrent.futures

    from PIL import Image

    from components.dataio.images import available_cpus

    paths = [os.path.join(d, n) for d, _, names in os.walk(root) for n in sorted(names)]

    def decode(part: list[str]) -> None:
        for path in part:
            with Image.open(path) as img:
                want = (img.width // 8, img.height // 8) if at_least is None else (at_least, at_least)
                img.draft("RGB", want)
                img.load()

    cpus = available_cpus()
    start = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(cpus) as pool:
        list(pool.map(decode, [paths[i::cpus] for i in range(cpus)]))
    return len(paths) / (time.monotonic() - start)


def cpu_timed(cpu: dict, key: str, photos: int, fn, *args):
    """fn(*args), recording the CPU milliseconds per photo it took (this process's threads and its reaped worker
    processes) under cpu[key]: steadier than rates on a shared machine, where the other work takes cores."""
    import resource

    def used() -> float:
        return sum(u.ru_utime + u.ru_stime for u in (resource.getrusage(resource.RUSAGE_SELF),
                                                     resource.getrusage(resource.RUSAGE_CHILDREN)))

    start = used()
    result = fn(*args)
    cpu.setdefault(key, []).append((used() - start) / photos * 1e3)
    return result


def folder_bytes(root: str) -> int:
    return sum(os.path.getsize(os.path.join(d, n)) for d, _, names in os.walk(root) for n in names)


def baseline_ingest(root: str) -> float:
    import keras

    start = time.monotonic()
    ds = keras.utils.image_dataset_from_directory(root, image_size=(IMAGE_SIZE, IMAGE_SIZE), batch_size=64,
                                                  shuffle=False, verbose=False)
    count = sum(int(labels.shape[0]) for _, labels in ds)
    return count / (time.monotonic() - start)


def ours_ingest(root: str, out: str) -> tuple[float, int]:
    from components.dataio import data
    from components import preprocess as pp

    shutil.rmtree(out, ignore_errors=True)
    start = time.monotonic()
    result = pp.preprocess(root, out, image_size=IMAGE_SIZE, channels=3, min_shards=2)
    seconds = time.monotonic() - start
    shards = sum(os.path.getsize(f) for s in data.SPLITS for f in data.split_files(out, s))
    return sum(result.counts.values()) / seconds, shards


def baseline_train_input(root: str, batch: int = 32) -> tuple[float, float]:
    """(images/s of the first epoch, of the second): the first pays the tracing of the Keras layers."""
    import keras
    import tensorflow as tf

    augment = keras.Sequential([keras.layers.RandomZoom((-0.72, 0.0), seed=1),
                                keras.layers.RandomFlip("horizontal", seed=2)])
    ds = keras.utils.image_dataset_from_directory(root, image_size=(IMAGE_SIZE, IMAGE_SIZE), batch_size=batch,
                                                  shuffle=True, seed=3, verbose=False)
    ds = ds.map(lambda x, y: (augment(x, training=True), y), num_parallel_calls=tf.data.AUTOTUNE)
    rates = []
    for _ in range(2):
        start = time.monotonic()
        count = sum(int(labels.shape[0]) for _, labels in ds.prefetch(tf.data.AUTOTUNE))
        rates.append(count / (time.monotonic() - start))
    return rates[0], rates[1]


def ours_train_input(dataset: str, batch: int = 32) -> tuple[float, float]:
    """(images/s of the first epoch with the shards' loading into memory, of the second)."""
    from components import augment as augment_lib
    from components import train
    from components.dataio import data
    from components.train.inputs import TrainInput

    start = time.monotonic()
    pipeline = TrainInput(dataset, [IMAGE_SIZE, IMAGE_SIZE, 3], pipeline_id=0, num_pipelines=1,
                          recipe=train.RECIPES["fast"], online_policy=augment_lib.AugmentPolicy.from_json("photo")
                          .to_json(), mode="memory")
    steps = data.read_manifest(dataset)["splits"]["train"]["count"] // batch
    rates = []
    for epoch in range(2):
        count = sum(int(labels.shape[0]) for _, labels in pipeline.dataset(epoch, 0, steps, batch))
        rates.append(count / (time.monotonic() - start))
        start = time.monotonic()
    return rates[0], rates[1]


def make_model(work: str, class_names: list[str]) -> str:
    import keras

    model_dir = os.path.join(work, "model")
    os.makedirs(model_dir, exist_ok=True)
    model = keras.Sequential([keras.Input((IMAGE_SIZE, IMAGE_SIZE, 3)), keras.layers.Rescaling(1 / 255),
                              keras.layers.Conv2D(8, 4, strides=4, activation="relu"),
                              keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(len(class_names))])
    model.save(os.path.join(model_dir, "model.keras"))
    with open(os.path.join(model_dir, "training.json"), "w") as f:
        json.dump({"image_shape": [IMAGE_SIZE, IMAGE_SIZE, 3], "class_names": class_names}, f)
    return model_dir


def baseline_predict(model_dir: str, root: str) -> float:
    import contextlib

    import keras
    import tensorflow as tf

    model = keras.models.load_model(os.path.join(model_dir, "model.keras"), compile=False)
    start = time.monotonic()
    ds = keras.utils.image_dataset_from_directory(root, labels=None, image_size=(IMAGE_SIZE, IMAGE_SIZE),
                                                  batch_size=64, shuffle=False, verbose=False)
    with contextlib.redirect_stdout(io.StringIO()):
        probabilities = tf.nn.softmax(model.predict(ds, verbose=0)).numpy()
    lines = [f"{path}: {p.argmax()} ({p.max():.3f})" for path, p in zip(ds.file_paths, probabilities)]
    return len(lines) / (time.monotonic() - start)


def ours_predict(model_dir: str, root: str, out: str) -> float:
    import contextlib

    from components.dataio import data
    from components.predict import predict

    classifier = data.load_classifier(model_dir)
    shutil.rmtree(out, ignore_errors=True)
    start = time.monotonic()
    with contextlib.redirect_stdout(io.StringIO()):
        result = predict(model_dir, root, out, classifier=classifier)
    return result.count / (time.monotonic() - start)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--photos", type=int, default=720, help="camera-sized JPEGs (cycling through the sizes)")
    parser.add_argument("--memory", default="10000,100000", help="320x240 photo counts for the peak-memory runs")
    parser.add_argument("--repeats", type=int, default=2, help="interleaved runs of each; the best is reported")
    parser.add_argument("--workdir", help="where the photos and outputs go (default: the camera photos in "
                        "~/.cache/photos-bench, kept for the next run; the rest in a temporary directory, removed)")
    args = parser.parse_args(argv)
    if not real_photos():  # `make bench` goes on with the other benchmarks
        print(f"skipped: {MISSING}")
        return {"skipped": MISSING}
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    workdir = args.workdir or tempfile.mkdtemp(prefix="photos-bench-")
    memory_counts = [int(n) for n in args.memory.split(",") if n]
    cpu: dict[str, list[float]] = {}  # CPU ms per photo of each side, all threads and worker processes
    runs: dict[str, list[float]] = {k: [] for k in ("ingest base", "ingest ours", "train base", "train ours",
                                                   "train-1 base", "train-1 ours", "predict base", "predict ours",
                                                   "check floor", "rule floor")}
    try:
        # The camera photos are kept between runs (making them takes a minute and a half); the rest is per run.
        cache = os.path.join(os.path.expanduser("~"), ".cache", "photos-bench") if not args.workdir else workdir
        print(f"camera-sized JPEGs: {args.photos} in {cache} (made once, then reused) ...", flush=True)
        root = make_camera_tree(os.path.join(cache, f"camera{args.photos}"), args.photos)
        source_bytes = folder_bytes(root)
        dataset = os.path.join(workdir, "dataset")
        model_dir = make_model(workdir, sorted(os.listdir(root)))
        shard_bytes = 0
        for _ in range(args.repeats):
            runs["ingest base"].append(cpu_timed(cpu, "ingest base", args.photos, baseline_ingest, root))
            rate, shard_bytes = cpu_timed(cpu, "ingest ours", args.photos, ours_ingest, root, dataset)
            runs["ingest ours"].append(rate)
            for side, rates in (("base", baseline_train_input(root)), ("ours", ours_train_input(dataset))):
                runs[f"train-1 {side}"].append(rates[0])
                runs[f"train {side}"].append(rates[1])
            runs["predict base"].append(cpu_timed(cpu, "predict base", args.photos, baseline_predict, model_dir,
                                                  root))
            runs["predict ours"].append(cpu_timed(cpu, "predict ours", args.photos, ours_predict, model_dir, root,
                                                  os.path.join(workdir, "predictions")))
            runs["check floor"].append(decode_floor(root, None))
            runs["rule floor"].append(decode_floor(root, IMAGE_SIZE))
        memory = {}
        if memory_counts:
            small = make_camera_tree(os.path.join(workdir, "small"), 130, sizes=((320, 240),), seed=1)
            for n in memory_counts:
                tree = make_unique_copies(os.path.join(workdir, f"copies{n}"), n, small)
                memory[n] = peak_memory(tree, os.path.join(workdir, f"out{n}"),
                                        ["--image-size", str(IMAGE_SIZE), "--channels", "3"])
                shutil.rmtree(tree, ignore_errors=True)
                os.remove(tree.rstrip("/") + ".complete")
                shutil.rmtree(os.path.join(workdir, f"out{n}"), ignore_errors=True)
    finally:
        if not args.workdir:
            shutil.rmtree(workdir, ignore_errors=True)
    best = {k: max(v) for k, v in runs.items()}
    sizes = ", ".join(f"{w}x{h}" for w, h in CAMERA_SIZES)
    print(f"\n{args.photos} JPEGs made from real photographs ({sizes}; {source_bytes / 1e6:.1f} MB), to "
          f"{IMAGE_SIZE}x{IMAGE_SIZE} RGB, best of {args.repeats} interleaved runs")
    print(f"{'':58} {'images/s':>9} {'baseline':>9} {'ratio':>7}")
    for name, key, base in (("preprocess vs image_dataset_from_directory", "ingest", "ingest base"),
                            ("training input, photo recipe vs idfd + Keras layers", "train", "train base"),
                            ("  its first epoch (loading, tracing)", "train-1", "train-1 base"),
                            ("batch prediction vs idfd + model.predict", "predict", "predict base")):
        print(f"{name:58} {best[key + ' ours']:9.1f} {best[base]:9.1f} {best[key + ' ours'] / best[base]:6.2f}x")
    print("CPU ms per photo (all threads and workers; the least of the runs): ours, baseline, baseline / ours")
    for name, key in (("  preprocess", "ingest"), ("  batch prediction", "predict")):
        base, ours = min(cpu[key + " base"]), min(cpu[key + " ours"])
        print(f"{name:58} {ours:9.2f} {base:9.2f} {base / ours:6.2f}x")
    print("ceilings: decoding alone, every core, against the same baselines (each side decodes every byte too)")
    for name, key, base in (("  check decode at 1/8 (preprocess's floor) vs idfd", "check floor", "ingest base"),
                            ("  the rule's DCT-scaled decode (prediction's floor) vs idfd + predict", "rule floor",
                             "predict base")):
        print(f"{name:58} {best[key]:9.1f} {best[base]:9.1f} {best[key] / best[base]:6.2f}x")
    print(f"shards: {shard_bytes / 1e6:.1f} MB for {source_bytes / 1e6:.1f} MB of sources "
          f"({shard_bytes / source_bytes:.3f}x)")
    growth = None
    if memory:
        print("\nPeak memory of a preprocess process on 320x240 photos to 224x224 (RSS, MB)")
        growth = print_memory(memory, "photos")
    return {"photos": args.photos, "source_mb": round(source_bytes / 1e6, 1), "shard_mb": round(shard_bytes / 1e6, 1),
            "images_per_s": {k: round(v, 1) for k, v in best.items()},
            "ratios": {k: round(best[k + " ours"] / best[k + " base"], 2)
                       for k in ("ingest", "train", "train-1", "predict")},
            "cpu_ms_per_photo": {k: round(min(v), 2) for k, v in cpu.items()},
            "ceilings": {"ingest": round(best["check floor"] / best["ingest base"], 2),
                         "predict": round(best["rule floor"] / best["predict base"], 2)},
            "peak_memory": {str(n): m for n, m in memory.items()}, "memory_growth_mb": growth}


if __name__ == "__main__":
    print(json.dumps(main(), indent=2))
