"""Batch prediction: ours against the reference Keras loop, side by side in one run.

The baseline is the classic batch prediction, as written: `keras.utils.image_dataset_from_directory` over the
folder, `model.predict`, softmax, and one print per file. Ours is `components.predict.predict` (it also writes
predictions.jsonl/.csv, errors.jsonl and its shards). Each contender runs in a fresh child process; the model
is loaded before the clock starts in both, so the timed phase is listing + reading + decoding + predicting +
output. Both children's stdout goes to /dev/null: the baseline prints its 20k lines there, ours its first 1000.

Throughput is measured on 20k PNGs (real Fashion-MNIST images, 28x28, in folders of 1000), and peak RSS
(the child's ru_maxrss) on 20k and 80k images: ours must stay flat, as it streams.

    python -m tests.benchmarks.predict [--images 20000] [--memory-images 80000] [--repeats 2] [--work DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

FASHION_DIR = "/usr/share/datasets/fashion-mnist"


def make_images(folder: str, count: int) -> str:
    """`count` real Fashion-MNIST PNGs under folder/NNNN/ (1000 per folder); reused when already there."""
    import numpy as np
    from PIL import Image

    from components.dataio import data

    marker = os.path.join(folder, f".complete-{count}")
    if os.path.exists(marker):
        return folder
    shutil.rmtree(folder, ignore_errors=True)
    images = data.read_idx(os.path.join(FASHION_DIR, "train-images-idx3-ubyte.gz"))
    for i in range(count):
        directory = os.path.join(folder, f"{i // 1000:04d}")
        if i % 1000 == 0:
            os.makedirs(directory, exist_ok=True)
        image = images[i % len(images)]
        if i >= len(images):  # beyond 60k: a shifted copy, so that no two files are the same
            image = np.roll(image, i // len(images), axis=1)
        Image.fromarray(image).save(os.path.join(directory, f"{i:07d}.png"), compress_level=1)
    open(marker, "w").close()
    return folder


def make_model(work: str) -> str:
    """The reference model, trained for one epoch on a slice (accuracy does not matter for throughput)."""
    from components.preprocess import preprocess
    from components.train import train

    model_dir = os.path.join(work, "model")
    if os.path.exists(os.path.join(model_dir, "training.json")):
        return model_dir
    dataset_dir = os.path.join(work, "dataset")
    shutil.rmtree(dataset_dir, ignore_errors=True)
    preprocess(FASHION_DIR, dataset_dir, limit=3000, min_shards=2)
    train(dataset_dir, model_dir, epochs=1)
    return model_dir


# ---------------------------------------------------------------------------------------------- children


def child_baseline(model_dir: str, folder: str) -> dict:
    """The reference batch prediction, as written (stdout is /dev/null)."""
    import keras
    import numpy as np
    import tensorflow as tf

    with open(os.path.join(model_dir, "training.json")) as f:
        info = json.load(f)
    class_names = info["class_names"]
    height, width, channels = info["image_shape"]
    model = keras.models.load_model(os.path.join(model_dir, "model.keras"))
    start, cpu_start = time.monotonic(), cpu_seconds()
    dataset = keras.utils.image_dataset_from_directory(
        folder, labels=None, color_mode="grayscale" if channels == 1 else "rgb", image_size=(height, width),
        shuffle=False, batch_size=32, verbose=False)
    predictions = model.predict(dataset, verbose=0)
    scores = tf.nn.softmax(predictions)
    for path, score in zip(dataset.file_paths, scores):
        print(f"The image {os.path.basename(path)} is {class_names[np.argmax(score)]} with a "
              f"{100 * np.max(score):.2f} percent confidence.")
    return {"seconds": time.monotonic() - start, "images": len(dataset.file_paths),
            "phase_cpu_seconds": cpu_seconds() - cpu_start}


def child_ours(model_dir: str, folder: str, output: str) -> dict:
    from components.dataio import data
    from components.predict import predict

    classifier = data.load_classifier(model_dir)
    start, cpu_start = time.monotonic(), cpu_seconds()
    result = predict(model_dir, folder, output, classifier=classifier)
    return {"seconds": time.monotonic() - start, "images": result.count, "errors": result.errors,
            "phase_cpu_seconds": cpu_seconds() - cpu_start}


def cpu_seconds() -> float:
    """CPU time of this process, all threads (the machine may be shared: this is what the work itself cost)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def run_child(kind: str, model_dir: str, folder: str, output: str) -> dict:
    """Runs one contender in a fresh interpreter; returns its timing, peak RSS and wall time."""
    result_path = output + ".result.json"
    shutil.rmtree(output, ignore_errors=True)
    command = [sys.executable, "-m", "tests.benchmarks.predict", "--child", kind, "--model", model_dir,
               "--folder", folder, "--output", output, "--result", result_path]
    started = time.monotonic()
    with open(os.devnull, "w") as devnull:
        completed = subprocess.run(command, stdout=devnull, stderr=subprocess.PIPE, text=True)
    wall = time.monotonic() - started
    if completed.returncode != 0:
        raise RuntimeError(f"{kind} failed ({completed.returncode}):\n{completed.stderr[-3000:]}")
    with open(result_path) as f:
        result = json.load(f)
    result["process_seconds"] = wall
    result["images_per_second"] = result["images"] / result["seconds"]
    return result


def peak_rss_mb() -> float:
    """This process's peak resident memory. VmHWM rather than ru_maxrss, which Linux carries over from the
    parent across fork + exec (it would report the benchmark driver's own peak)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def child_main(args: argparse.Namespace) -> int:
    if args.child == "baseline":
        result = child_baseline(args.model, args.folder)
    else:
        result = child_ours(args.model, args.folder, args.output)
    usage = resource.getrusage(resource.RUSAGE_SELF)
    result["peak_rss_mb"] = peak_rss_mb()
    result["cpu_seconds"] = usage.ru_utime + usage.ru_stime
    with open(args.result, "w") as f:
        json.dump(result, f)
    return 0


# ---------------------------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=20_000, help="images for the throughput race")
    parser.add_argument("--memory-images", type=int, default=80_000, help="images for the second memory point")
    parser.add_argument("--repeats", type=int, default=2, help="runs of each contender on the small set, interleaved "
                        "(the best of each is kept: the machine may be shared) (default: %(default)s)")
    parser.add_argument("--work", help="where images, model and outputs go (default: a temporary folder)")
    parser.add_argument("--child", choices=["baseline", "ours"], help=argparse.SUPPRESS)
    parser.add_argument("--model", help=argparse.SUPPRESS)
    parser.add_argument("--folder", help=argparse.SUPPRESS)
    parser.add_argument("--output", help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        return child_main(args)

    work = args.work or tempfile.mkdtemp(prefix="bench-predict-")
    os.makedirs(work, exist_ok=True)
    print(f"preparing {args.images} and {args.memory_images} PNGs and a 1-epoch model under {work} ...", flush=True)
    model_dir = make_model(work)
    small = make_images(os.path.join(work, f"images-{args.images}"), args.images)
    large = make_images(os.path.join(work, f"images-{args.memory_images}"), args.memory_images)

    runs: dict[str, list[dict]] = {"baseline": [], "ours": []}
    for _ in range(max(1, args.repeats)):  # interleaved, so both see the same machine
        for kind in ("baseline", "ours"):
            runs[kind].append(run_child(kind, model_dir, small, os.path.join(work, f"out-{kind}")))
    best = {kind: max(r, key=lambda x: x["images_per_second"]) for kind, r in runs.items()}
    large_runs = {kind: run_child(kind, model_dir, large, os.path.join(work, f"out-{kind}-large"))
                  for kind in ("baseline", "ours")}

    speedup = best["ours"]["images_per_second"] / best["baseline"]["images_per_second"]
    growth = {kind: large_runs[kind]["peak_rss_mb"] - best[kind]["peak_rss_mb"] for kind in best}
    rows = [
        (f"images/s ({args.images // 1000}k)", *(f"{best[k]['images_per_second']:.0f}" for k in ("baseline", "ours")), f"{speedup:.2f}x"),
        ("timed phase s", *(f"{best[k]['seconds']:.2f}" for k in ("baseline", "ours")), ""),
        ("process wall s", *(f"{best[k]['process_seconds']:.2f}" for k in ("baseline", "ours")), "incl. imports, model"),
        ("CPU s (timed phase)", *(f"{best[k]['phase_cpu_seconds']:.2f}" for k in ("baseline", "ours")),
         f"{best['baseline']['phase_cpu_seconds'] / best['ours']['phase_cpu_seconds']:.2f}x less CPU"),
        ("CPU s (process)", *(f"{best[k]['cpu_seconds']:.1f}" for k in ("baseline", "ours")), ""),
        (f"peak RSS MB {args.images // 1000}k", *(f"{best[k]['peak_rss_mb']:.0f}" for k in ("baseline", "ours")), ""),
        (f"peak RSS MB {args.memory_images // 1000}k",
         *(f"{large_runs[k]['peak_rss_mb']:.0f}" for k in ("baseline", "ours")), ""),
        ("RSS growth MB", *(f"{growth[k]:+.0f}" for k in ("baseline", "ours")), f"for {args.memory_images - args.images} more images"),
        (f"images/s ({args.memory_images // 1000}k)",
         *(f"{large_runs[k]['images_per_second']:.0f}" for k in ("baseline", "ours")),
         f"{large_runs['ours']['images_per_second'] / large_runs['baseline']['images_per_second']:.2f}x"),
    ]
    print(f"\nbatch prediction, {os.cpu_count()} CPU cores, stdout of both to /dev/null")
    print(f"{'':22}{'keras baseline':>16}{'ours':>10}  ratio")
    for label, base, ours, note in rows:
        print(f"{label:22}{base:>16}{ours:>10}  {note}")
    load = os.getloadavg()[0]
    print(f"(load average {load:.1f} on {os.cpu_count()} cores at the end: other work shares this machine)")
    result = {"images": args.images, "memory_images": args.memory_images, "speedup": speedup, "load_average": load,
              "baseline": best["baseline"], "ours": best["ours"], "large": large_runs, "rss_growth_mb": growth,
              "cpu_count": os.cpu_count()}
    if not args.work:
        shutil.rmtree(work, ignore_errors=True)
    return result


if __name__ == "__main__":
    outcome = main()
    raise SystemExit(outcome if isinstance(outcome, int) else 0)
