"""Shards without TensorFlow (components/dataio/records.py, what torch and JAX read) beside TensorFlow's own reader and
parser, in one run, on the same files:

  - verified reads: every record of the shards, both checksums checked, records/s and MB/s: records.iter_records
    against tf.data.TFRecordDataset (batches of 4096 handed to Python as numpy);
  - tf.train.Example parsing, us a record: records.parse_example (every feature) and records.image_label (the two
    the training input takes), against TensorFlow's generated tf.train.Example.FromString (protobuf's upb, without
    turning the message into Python values).

Two kinds of record: Fashion-MNIST's (a raw 28x28 image, about 850 bytes) and photo records (the food photos' JPEG
bytes, 20-40 KB), written with records.encode_example and records.frame. Each figure is the min, median and max
of --repeats runs (the spread on a shared machine). The same module runs on an older checkout of records.py (it
uses only iter_records, parse_example and image_label): `--before REV` loads records.py of that revision with
git and measures it in the same run, in turn with the code now, also with its numpy crc32c (where google-crc32c's
C extension is missing).

    python -m tests.benchmarks.shards [--fashion 60000] [--photo-records 4000] [--repeats 5] [--before REV]
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import tempfile
import time

from tests.benchmarks.spread import spread

# The last revision whose records.py had the numpy crc32c (checking records in batches) and the
# hand-written tf.train.Example parser: the 'before' of docs/benchmarks.md#shards.
BEFORE = "ec2ee34c1399b9f469ee1b7dc4639d8188aa5f8c"


def _write(path: str, payloads) -> int:
    from components.dataio import records

    count = 0
    with open(path, "wb") as f:
        for image, label, uri in payloads:
            f.write(records.frame(records.encode_example(image, label, uri)))
            count += 1
    return count


def _fashion(limit: int):
    from components.dataio import data

    images = data.read_idx(os.path.join(data.DEFAULT_SOURCE, "train-images-idx3-ubyte.gz"))[:limit]
    labels = data.read_idx(os.path.join(data.DEFAULT_SOURCE, "train-labels-idx1-ubyte.gz"))[:limit]
    return [(image.tobytes(), int(label), f"fashion/train/{i}.png") for i, (image, label) in
            enumerate(zip(images, labels))]


def _photos(count: int):
    from tests import photos

    root = photos.installed()
    if root is None:
        return []
    files = sorted(os.path.join(d, f) for d, _, names in os.walk(root) for f in names
                   if f.lower().endswith((".jpg", ".jpeg")))
    contents = []
    for path in files:
        with open(path, "rb") as f:
            contents.append(f.read())
    return [(contents[i % len(contents)], i % 12, f"photos/{i}.jpg") for i in range(count)]


def _seconds(run) -> float:
    start = time.perf_counter()
    run()
    return time.perf_counter() - start


def previous_records(revision: str):
    """records.py as it was at `revision` (git show), loaded as a module of its own: the code before, measured in the
    same run as the code now. None where git or that revision is not at hand."""
    import importlib.util
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    source = None
    # Revisions before the data layer moved into components/dataio/ kept the module at the top of components/.
    for path in ("components/dataio/records.py", "/".join(("components", "records.py"))):
        try:
            source = subprocess.run(["git", "-C", root, "show", f"{revision}:{path}"], capture_output=True,
                                    check=True).stdout
            break
        except (OSError, subprocess.CalledProcessError):
            continue
    if source is None:
        return None
    # Its imports of the helpers beside it are pointed at where they are now.
    source = re.sub(rb"\bcomponents([./])(storage|gcs)\b", rb"components\1dataio\1\2", source)
    path = os.path.join(tempfile.mkdtemp(prefix="records-before-"), "records_before.py")
    with open(path, "wb") as f:
        f.write(source)
    spec = importlib.util.spec_from_file_location("records_before", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["records_before"] = module
    spec.loader.exec_module(module)
    return module


def measure(files: list[str], repeats: int, sides: dict) -> dict:
    """Each side (name -> a records module) timed in turn within each repeat, so that they share the machine's
    load; TensorFlow's reader and parser beside them where TensorFlow is installed."""
    from components.dataio import records

    held = [record for f in files for record in records.iter_records(f)]
    count, size = len(held), sum(os.path.getsize(f) for f in files)
    runs: dict[str, dict[str, list[float]]] = {}

    def add(side: str, figure: str, value: float) -> None:
        runs.setdefault(side, {}).setdefault(figure, []).append(value)

    try:
        import tensorflow as tf
    except ImportError:
        tf = None
    for repeat in range(repeats + 1):  # the first round warms up (page cache, imports, message classes)
        for side, module in sides.items():
            read = _seconds(lambda: sum(1 for f in files for _ in module.iter_records(f)))
            parse = _seconds(lambda: [module.parse_example(r) for r in held])
            image_label = _seconds(lambda: [module.image_label(r) for r in held])
            if repeat:
                add(side, "read_records_per_s", count / read)
                add(side, "read_mb_per_s", size / read / 1e6)
                add(side, "parse_example_us", parse / count * 1e6)
                add(side, "image_label_us", image_label / count * 1e6)
        if tf is not None:
            read = _seconds(lambda: sum(len(b) for b in tf.data.TFRecordDataset(files).batch(4096).as_numpy_iterator()))
            parse = _seconds(lambda: [tf.train.Example.FromString(r) for r in held])
            if repeat:
                add("tensorflow", "read_records_per_s", count / read)
                add("tensorflow", "read_mb_per_s", size / read / 1e6)
                add("tensorflow", "parse_example_us", parse / count * 1e6)
    return {"records": count, "bytes": size,
            "sides": {side: {figure: spread(values) for figure, values in figures.items()}
                      for side, figures in runs.items()}}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fashion", type=int, default=60000, help="Fashion-MNIST records (4 shards)")
    parser.add_argument("--photo-records", type=int, default=4000, help="photo records (4 shards; food photos)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--before", default=BEFORE, help="the revision whose records.py is measured as 'before' "
                        "(default: the last with the numpy crc32c and the hand-written Example parser); '' for none")
    args = parser.parse_args(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    from components.dataio import records

    sides = {"now": records}
    before = previous_records(args.before) if args.before else None
    if before is not None and hasattr(before, "_crc32c_c"):
        sides["before"] = before
        # the same code where google-crc32c's C extension is missing (the GPU machines' torch/JAX installs, which
        # now carry its wheel): its numpy crc32c
        numpy_crc = previous_records(args.before)
        numpy_crc._crc32c_c = lambda: None
        sides["before, numpy crc32c"] = numpy_crc
    elif args.before:
        print(f"no 'before' side: records.py at {args.before} could not be read (git, or the revision, is missing)")
    workdir = tempfile.mkdtemp(prefix="shards-bench-")
    results = {}
    try:
        for name, payloads in (("Fashion-MNIST records", _fashion(args.fashion)),
                               ("photo records", _photos(args.photo_records))):
            if not payloads:
                print(f"{name} skipped: the food photos are not installed (make photos)")
                continue
            files = []
            for shard in range(4):
                files.append(os.path.join(workdir, f"{name.split()[0].lower()}-{shard:05d}-of-00004.tfrecord"))
                _write(files[-1], payloads[shard::4])
            results[name] = measure(files, args.repeats, sides)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    print(f"\nshards: min / median / max of {args.repeats} runs, the sides in turn within each run")
    rows = [("verified read, records/s", "read_records_per_s", "{:,.0f}"),
            ("verified read, MB/s", "read_mb_per_s", "{:,.0f}"),
            ("parse_example, us a record", "parse_example_us", "{:.2f}"),
            ("image_label, us a record", "image_label_us", "{:.2f}")]
    for name, r in results.items():
        print(f"{name}: {r['records']} records, {r['bytes'] / 1e6:.1f} MB")
        for label, key, form in rows:
            for side, figures in r["sides"].items():
                if key in figures:
                    print(f"  {label:28} {side:22} "
                          + " / ".join(form.format(figures[key][k]) for k in ("min", "median", "max")))
    return results


if __name__ == "__main__":
    main()
