"""The training input without TensorFlow (components/train/portable_input.py, what torch and JAX train from) side by
side with the TensorFlow one (components/train/inputs.py TrainInput), in one run, on the same shards:

  - Fashion-MNIST (raw 28x28 records, memory mode, batch 64): without augmentation, and with the default online
    policy (rotation, shift, zoom);
  - camera photos (source records: JPEGs from 320x240 to 4000x3000 made from Debian's photographs, the photos
    benchmark's tree) with the photo recipe at 224x224 (random resized crop decoded from each file, flip), batch
    32, in memory and stream modes.

Both sides hand batches to nobody (the input alone is measured): TensorFlow's as tensors, ours as numpy arrays.
Each figure is over a whole epoch after a first one (loading, tracing): images/s (best of the repeats) and CPU ms
per image over all the process's threads (least of the repeats; steadier than rates on a shared machine).

    python -m tests.benchmarks.portable_input [--fashion 20000] [--photos 156] [--repeats 2] [--workdir DIR]
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time

FASHION_POLICY = {"rotation_degrees": 10.0, "shift_fraction": 0.08, "zoom_range": 0.08}


def _rate(make, batches) -> tuple[float, float]:
    """(images/s, CPU ms per image over all the process's threads) of the second pass over `batches` (the first one
    warms up). The CPU time is steadier than the rate on a shared machine."""
    pipeline = make()
    for _ in range(2):
        start, cpu = time.monotonic(), time.process_time()
        count = sum(int(labels.shape[0]) for _, labels in batches(pipeline, _))
        rate, cpu_ms = count / (time.monotonic() - start), (time.process_time() - cpu) * 1e3 / count
    return rate, cpu_ms


def _sides(dataset: str, shape, policy, mode: str, batch: int) -> tuple[tuple[float, float], tuple[float, float]]:
    from components.dataio import records
    from components.train.inputs import TrainInput
    from components.train.portable_input import PortableTrainInput
    from components.train.recipes import RECIPES

    steps = records.read_manifest(dataset)["splits"]["train"]["count"] // batch
    settings = dict(pipeline_id=0, num_pipelines=1, recipe=RECIPES["reference"], online_policy=policy, mode=mode)
    theirs = _rate(lambda: TrainInput(dataset, shape, **settings),
                   lambda p, epoch: p.dataset(epoch, 0, steps, batch))
    ours = _rate(lambda: PortableTrainInput(dataset, shape, **settings),
                 lambda p, epoch: p.batches(epoch, 0, steps, batch))
    return ours, theirs


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fashion", type=int, default=20000, help="Fashion-MNIST images preprocessed")
    parser.add_argument("--photos", type=int, default=156, help="camera-sized JPEGs (the photos benchmark's tree)")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--workdir", help="where the shards go (default: a temporary directory, removed)")
    args = parser.parse_args(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    from components.dataio import data
    from components import preprocess as pp
    from components.dataio.images import available_cpus
    from tests.benchmarks import photos as photos_bench

    workdir = args.workdir or tempfile.mkdtemp(prefix="portable-input-bench-")
    cases = []
    try:
        fashion = os.path.join(workdir, "fashion")
        if not os.path.exists(os.path.join(fashion, data.MANIFEST)):
            pp.preprocess(data.DEFAULT_SOURCE, fashion, limit=args.fashion, min_shards=2)
        cases += [("Fashion-MNIST, no augmentation", fashion, [28, 28, 1], None, "memory", 64),
                  ("Fashion-MNIST, rotation/shift/zoom", fashion, [28, 28, 1], FASHION_POLICY, "memory", 64)]
        if photos_bench.real_photos():
            cache = os.path.join(os.path.expanduser("~"), ".cache", "photos-bench")
            root = photos_bench.make_camera_tree(os.path.join(cache, f"camera{args.photos}"), args.photos)
            photo_set = os.path.join(workdir, "photos")
            if not os.path.exists(os.path.join(photo_set, data.MANIFEST)):
                pp.preprocess(root, photo_set, image_size=224, channels=3, min_shards=2, validation_fraction=0.0,
                              test_fraction=0.1)
            for mode in ("memory", "stream"):
                cases.append((f"camera photos, photo recipe, {mode}", photo_set, [224, 224, 3], {"preset": "photo"},
                              mode, 32))
        else:
            print(f"photos skipped: {photos_bench.MISSING}")
        results = {}
        for name, dataset, shape, policy, mode, batch in cases:
            runs = [_sides(dataset, shape, policy, mode, batch) for _ in range(args.repeats)]
            results[name] = {"ours": max(r[0][0] for r in runs), "tensorflow": max(r[1][0] for r in runs),
                             "ours_cpu_ms": min(r[0][1] for r in runs), "tensorflow_cpu_ms": min(r[1][1] for r in runs)}
    finally:
        if not args.workdir:
            shutil.rmtree(workdir, ignore_errors=True)
    print(f"\ntraining input ({available_cpus()} CPUs; best of {args.repeats}; the input alone): images/s, and CPU ms "
          "per image (all threads; steadier on a shared machine)")
    print(f"{'':40} {'no TF':>9} {'TF':>9} {'ratio':>6} {'no TF ms':>9} {'TF ms':>8}")
    for name, r in results.items():
        print(f"{name:40} {r['ours']:9.0f} {r['tensorflow']:9.0f} {r['ours'] / r['tensorflow']:5.2f}x "
              f"{r['ours_cpu_ms']:9.3f} {r['tensorflow_cpu_ms']:8.3f}")
    return results


if __name__ == "__main__":
    main()
