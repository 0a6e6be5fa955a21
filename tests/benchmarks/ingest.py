"""Ingestion benchmark: preprocess over a folder of PNGs against keras.utils.image_dataset_from_directory.

    python -m tests.benchmarks.ingest [--images 20000] [--memory 10000,40000] [--workdir DIR]

One run measures, on the same files and machine:
  - throughput (images/s) on a class-per-folder tree of real Fashion-MNIST PNGs: our preprocess (decode,
    hash, split, write TFRecord shards; the decode plan measured as the step does) against the baseline,
    `image_dataset_from_directory` iterated once (decode only, nothing written); plus decode-only rates of
    each plan the step measures (one worker, threads, processes, TensorFlow batches), and the Beam runner
    of the same preprocessing on Beam's in-process runner;
  - the same on camera-sized JPEGs (480x480), where decoding at a reduced DCT scale pays off;
  - peak memory of a preprocess child process over 10k and 40k images (main process, and main plus its
    decode workers): it must stay flat as the number of images grows;
  - the cost of grouping near-copies (components/preprocess/step.py): preprocess with it against the same
    preprocess with it taken out (each image split by its own bytes, as before), interleaved in the same run;
    and its parts per image at a million images: the near keys of kept pixels, in the step's batches, and the
    grouping of a million keys where every image has 12 near-copies.
Timings on a shared machine are noisy: runs are interleaved and repeated, each figure is reported as min /
median / max over the repeats (tests/benchmarks/spread.py), with the decode plan each preprocess run chose (and
any switch during the run); the medians' ratios are what to compare.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np

from components.dataio import data
from components import preprocess as pp
from components.preprocess.decoding import available_cpus, parallel_decode
from components.preprocess.inputs import Item
from tests.benchmarks.spread import spread, text


def make_png_tree(root: str, count: int) -> str:
    """`count` real Fashion-MNIST images (train, then test) as PNGs in one folder per class."""
    from PIL import Image

    marker = root.rstrip("/") + ".complete"  # beside the tree, not in it (it would be a stray file)
    if os.path.exists(marker) and os.path.isdir(root):
        return root
    shutil.rmtree(root, ignore_errors=True)
    images, labels = [], []
    for prefix in ("train", "t10k"):
        images.append(data.read_idx(os.path.join(data.DEFAULT_SOURCE, f"{prefix}-images-idx3-ubyte.gz")))
        labels.append(data.read_idx(os.path.join(data.DEFAULT_SOURCE, f"{prefix}-labels-idx1-ubyte.gz")))
    images, labels = np.concatenate(images)[:count], np.concatenate(labels)[:count]
    for name in data.FASHION_MNIST_CLASSES:
        os.makedirs(os.path.join(root, name.replace("/", "-")), exist_ok=True)
    for i, (image, label) in enumerate(zip(images, labels)):
        Image.fromarray(image).save(os.path.join(root, data.FASHION_MNIST_CLASSES[label].replace("/", "-"),
                                                 f"{i:06d}.png"))
    with open(marker, "w") as f:
        f.write(str(count))
    return root


def make_photo_tree(root: str, count: int, size: int = 480) -> str:
    """`count` camera-sized JPEGs (size x size RGB, quality 90): Fashion-MNIST images scaled up, tinted and
    given sensor-like noise, so that they compress like photos rather than flat drawings."""
    from PIL import Image

    marker = root.rstrip("/") + ".complete"
    if os.path.exists(marker) and os.path.isdir(root):
        return root
    shutil.rmtree(root, ignore_errors=True)
    images = data.read_idx(os.path.join(data.DEFAULT_SOURCE, "t10k-images-idx3-ubyte.gz"))[:count]
    labels = data.read_idx(os.path.join(data.DEFAULT_SOURCE, "t10k-labels-idx1-ubyte.gz"))[:count]
    rng = np.random.default_rng(0)
    for name in data.FASHION_MNIST_CLASSES:
        os.makedirs(os.path.join(root, name.replace("/", "-")), exist_ok=True)
    for i, (image, label) in enumerate(zip(images, labels)):
        big = np.asarray(Image.fromarray(image).resize((size, size), Image.Resampling.BICUBIC), np.float32)
        tint = rng.uniform(0.6, 1.0, 3)
        rgb = big[..., None] * tint + rng.normal(0, 6, (size, size, 3)) + 20
        Image.fromarray(rgb.clip(0, 255).astype(np.uint8)).save(
            os.path.join(root, data.FASHION_MNIST_CLASSES[label].replace("/", "-"), f"{i:06d}.jpg"), quality=90)
    with open(marker, "w") as f:
        f.write(str(count))
    return root


def baseline_rate(root: str) -> tuple[float, int]:
    """keras.utils.image_dataset_from_directory, iterated once: images/s and the count it saw."""
    import keras

    start = time.monotonic()
    ds = keras.utils.image_dataset_from_directory(root, image_size=(28, 28), color_mode="grayscale",
                                                  batch_size=256, shuffle=False, verbose=False)
    count = sum(int(labels.shape[0]) for _, labels in ds)
    return count / (time.monotonic() - start), count


def preprocess_rate(root: str, out: str, workers: int, runner: str = "local") -> tuple[float, int, str]:
    """Images/s, images kept, and the decode plan the run took ("A" or "A, then B" where it switched)."""
    shutil.rmtree(out, ignore_errors=True)
    start = time.monotonic()
    result = pp.preprocess(root, out, workers=workers, min_shards=2, runner=runner)
    return (sum(result.counts.values()) / (time.monotonic() - start), sum(result.counts.values()),
            plan_taken(result.decode_plan))


def plan_taken(report: dict) -> str:
    """The plans a run decoded with, from PreprocessResult.decode_plan: "A", or "A, then B at input N"."""
    if not report:
        return "none (not decoded in process)"
    return ", then ".join([report["chosen"]] + [f"{s['to']} at input {s['at_input']}" for s in report["switches"]])


def decode_rate(root: str, workers: int, use_processes: bool, use_tensorflow: bool = False) -> float:
    """Decode-only rate (read, hash, decode, resize) of the files under root."""
    def items():
        for folder in sorted(os.listdir(root)):
            if os.path.isdir(os.path.join(root, folder)):
                for uri in data.list_files(os.path.join(root, folder)):
                    yield Item(uri, 0, None)

    start = time.monotonic()
    count = sum(1 for _ in parallel_decode(items, height=28, width=28, channels=1, check_extension=True,
                                           workers=workers, use_processes=use_processes,
                                           use_tensorflow=use_tensorflow))
    return count / (time.monotonic() - start)


class without_near_grouping:
    """Within it, the in-process runner splits each image by its own bytes, with no near keys and no groups, as
    it did before near-copies were grouped: the baseline of the grouping's cost."""

    def __enter__(self):
        from components.preprocess import step

        self.saved = step._near_keys, step._near_groups
        step._near_keys = lambda pending: [0] * len(pending)
        step._near_groups = lambda near, keys: (keys, [])

    def __exit__(self, *exc):
        from components.preprocess import step

        step._near_keys, step._near_groups = self.saved


def near_grouping_parts(images: int = 1_000_000, copies: int = 12) -> dict:
    """Microseconds per image of the grouping's parts at `images` images: the near keys of 28x28 pixels in the
    step's batches (SPOOL_BATCH; real Fashion-MNIST images, each used several times), and `_near_groups` over
    `images` keys in groups of copies + 1 (the originals' content keys random)."""
    import array

    from components.preprocess import step

    pixels = np.concatenate([data.read_idx(os.path.join(data.DEFAULT_SOURCE, f"{prefix}-images-idx3-ubyte.gz"))
                             for prefix in ("train", "t10k")])[..., None]
    batches = [list(pixels[i:i + step.SPOOL_BATCH]) for i in range(0, len(pixels), step.SPOOL_BATCH)]
    start = time.monotonic()
    hashed = 0
    while hashed < images:
        for batch in batches:
            step._near_keys(batch)
            hashed += len(batch)
            if hashed >= images:
                break
    keys_us = (time.monotonic() - start) / hashed * 1e6
    rng = np.random.default_rng(0)
    groups = -(-images // (copies + 1))
    near = array.array("Q", np.repeat(rng.integers(0, 2 ** 63, groups, dtype=np.int64).astype(np.uint64),
                                      copies + 1)[:images].tobytes())
    content = array.array("Q", rng.integers(0, 2 ** 63, images, dtype=np.int64).astype(np.uint64).tobytes())
    start = time.monotonic()
    _, found = step._near_groups(near, content)
    grouping_us = (time.monotonic() - start) / images * 1e6
    return {"images": images, "near_keys_us_per_image": round(keys_us, 2),
            "grouping_us_per_image": round(grouping_us, 2), "groups": len(found)}


def peak_memory(root: str, out: str, extra_args: list[str] = ()) -> dict:
    """Runs preprocess in a child process and samples the RSS of it and its decode workers every 20 ms."""
    import psutil

    shutil.rmtree(out, ignore_errors=True)
    child = subprocess.Popen([sys.executable, "-m", "components.preprocess", "--source", root, "--output-dir", out,
                              *extra_args],
                             stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    proc = psutil.Process(child.pid)
    peak = {"main_mb": 0.0, "total_mb": 0.0}
    done = threading.Event()

    def sample():
        while not done.is_set():
            try:
                main = proc.memory_info().rss
                workers = sum(c.memory_info().rss for c in proc.children(recursive=True))
            except psutil.Error:
                continue
            peak["main_mb"] = max(peak["main_mb"], main / 2**20)
            peak["total_mb"] = max(peak["total_mb"], (main + workers) / 2**20)
            time.sleep(0.02)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    start = time.monotonic()
    stdout, _ = child.communicate()
    seconds = time.monotonic() - start
    done.set()
    sampler.join()
    if child.returncode != 0:
        raise RuntimeError(f"preprocess failed on {root} (exit {child.returncode})")
    result = json.loads(stdout)
    return {**{k: round(v, 1) for k, v in peak.items()}, "images": sum(result["counts"].values()),
            "seconds": round(seconds, 1)}


def print_memory(memory: dict[int, dict], what: str) -> float:
    """Prints peak_memory results by count; returns the growth (MB) from the first count to the last."""
    print(f"{what:>8} {'main':>8} {'main+workers':>13} {'seconds':>8}")
    for n, m in memory.items():
        print(f"{n:8d} {m['main_mb']:8.0f} {m['total_mb']:13.0f} {m['seconds']:8.1f}")
    counts = list(memory)
    first, last = memory[counts[0]], memory[counts[-1]]
    growth = last["total_mb"] - first["total_mb"]
    main_growth = last["main_mb"] - first["main_mb"]
    print(f"growth from {counts[0]} to {counts[-1]} {what}: main process {main_growth:+.0f} MB "
          f"({100 * main_growth / first['main_mb']:+.1f}%), with workers {growth:+.0f} MB "
          f"({100 * growth / first['total_mb']:+.1f}%; the decode plan may pick worker processes for the larger run)")
    return growth


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=20_000, help="PNGs in the throughput folder")
    parser.add_argument("--memory", default="10000,40000", help="image counts for the peak-memory runs")
    parser.add_argument("--repeats", type=int, default=3,
                        help="interleaved runs of each; min / median / max reported (default: %(default)s)")
    parser.add_argument("--photos", type=int, default=2000, help="480x480 JPEGs for the photo run (0: skip)")
    parser.add_argument("--workdir", help="where the PNG trees go (default: a temporary directory, removed)")
    parser.add_argument("--near-images", type=int, default=1_000_000,
                        help="images for the near-copy grouping's parts (default: %(default)s)")
    args = parser.parse_args(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    workdir = args.workdir or tempfile.mkdtemp(prefix="ingest-bench-")
    memory_counts = [int(n) for n in args.memory.split(",")]
    cpus = available_cpus()
    try:
        print(f"generating PNG trees in {workdir} ...", flush=True)
        trees = {n: make_png_tree(os.path.join(workdir, f"png{n}"), n) for n in sorted({args.images, *memory_counts})}
        root = trees[args.images]
        # Interleaved repeats, the spread of each: other load on a shared machine comes and goes within a run.
        runs = {"baseline": [], "ours": [], "1 worker": [], f"{cpus} threads": [], f"{cpus} processes": [],
                f"TensorFlow batches x{cpus}": [], "ours without near-copy grouping": []}
        for _ in range(args.repeats):
            runs["baseline"].append(baseline_rate(root))
            runs["ours"].append(preprocess_rate(root, os.path.join(workdir, "out"), workers=cpus))
            with without_near_grouping():
                runs["ours without near-copy grouping"].append(
                    preprocess_rate(root, os.path.join(workdir, "out"), workers=cpus))
            runs["1 worker"].append((decode_rate(root, 1, False), 0))
            runs[f"{cpus} threads"].append((decode_rate(root, cpus, False), 0))
            runs[f"{cpus} processes"].append((decode_rate(root, cpus, True), 0))
            runs[f"TensorFlow batches x{cpus}"].append((decode_rate(root, cpus, False, True), 0))
        rates = {name: spread([run[0] for run in taken]) for name, taken in runs.items()}
        baseline_count, ours_count = runs["baseline"][0][1], runs["ours"][0][1]
        plans = [run[2] for run in runs["ours"]]
        baseline, ours = rates["baseline"]["median"], rates["ours"]["median"]
        ungrouped = rates["ours without near-copy grouping"]["median"]
        decode = {name: rates[name] for name in list(runs)[2:-1]}
        near_parts = near_grouping_parts(args.near_images)
        beam_rate = preprocess_rate(root, os.path.join(workdir, "out-beam"), workers=cpus, runner="beam")[0]
        memory = {n: peak_memory(trees[n], os.path.join(workdir, f"out{n}")) for n in memory_counts}
        photos = {}
        if args.photos:
            photo_root = make_photo_tree(os.path.join(workdir, f"jpeg{args.photos}"), args.photos)
            taken = {"baseline": [], "ours": [], "plans": []}
            for _ in range(args.repeats):
                taken["baseline"].append(baseline_rate(photo_root)[0])
                rate, _, plan = preprocess_rate(photo_root, os.path.join(workdir, "out-photos"), workers=cpus)
                taken["ours"].append(rate)
                taken["plans"].append(plan)
            photos = {"baseline": spread(taken["baseline"]), "ours": spread(taken["ours"]), "plans": taken["plans"]}
    finally:
        if not args.workdir:
            shutil.rmtree(workdir, ignore_errors=True)

    print(f"\nIngestion of {args.images} Fashion-MNIST PNGs (28x28), {cpus} CPUs available, "
          f"{args.repeats} interleaved runs: min / median / max, and the medians' ratio")
    print(f"{'':44} {'images/s':>28} {'vs baseline':>12}")

    def row(name: str, figures: dict, note: str = "") -> None:
        print(f"{name:44} {text(figures, '{:,.0f}'):>28} {figures['median'] / baseline:11.2f}x   {note}".rstrip())

    row("baseline: image_dataset_from_directory x1", rates["baseline"], f"({baseline_count} images)")
    row("ours: preprocess (decode+split+write shards)", rates["ours"], f"({ours_count} images)")
    row("ours without near-copy grouping", rates["ours without near-copy grouping"],
        f"(grouping: {1e6 / ours - 1e6 / ungrouped:+.1f} us per image, {100 * (ungrouped / ours - 1):+.1f}%)")
    for name, figures in decode.items():
        row("  decode only, " + name, figures)
    print(f"{'ours, Beam runner (in process, one run)':44} {beam_rate:28,.0f} {beam_rate / baseline:11.2f}x")
    print("decode plan of each preprocess run: " + "; ".join(plans))
    if photos:
        print(f"\nIngestion of {args.photos} camera-sized JPEGs (480x480 RGB) to 28x28 grayscale")
        print(f"{'baseline: image_dataset_from_directory x1':44} {text(photos['baseline'], '{:,.0f}'):>28} "
              f"{1.0:11.2f}x")
        print(f"{'ours: preprocess (decode+split+write shards)':44} {text(photos['ours'], '{:,.0f}'):>28} "
              f"{photos['ours']['median'] / photos['baseline']['median']:11.2f}x")
        print("decode plan of each preprocess run: " + "; ".join(photos["plans"]))
    print(f"\nNear-copy grouping's parts at {near_parts['images']} images: near keys of 28x28 pixels "
          f"{near_parts['near_keys_us_per_image']} us per image (in the step's batches, one core), grouping "
          f"{near_parts['grouping_us_per_image']} us per image ({near_parts['groups']} groups of 13)")
    print("\nPeak memory of a preprocess process (RSS, MB)")
    growth = print_memory(memory, "images")
    return {"images": args.images, "cpus": cpus, "repeats": args.repeats,
            "baseline_images_per_s": rates["baseline"], "ours_images_per_s": rates["ours"],
            "ours_decode_plans": plans, "speedup": round(ours / baseline, 2),
            "decode_only_images_per_s": decode,
            "beam_runner_images_per_s": round(beam_rate, 1),
            "without_near_grouping_images_per_s": rates["ours without near-copy grouping"],
            "near_grouping_us_per_image": round(1e6 / ours - 1e6 / ungrouped, 2), "near_grouping_parts": near_parts,
            "peak_memory": {str(n): m for n, m in memory.items()}, "memory_growth_mb": round(growth, 1),
            "photos": photos}


if __name__ == "__main__":
    print(json.dumps(main(), indent=2))
