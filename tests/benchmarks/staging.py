"""Staged reading against streaming from gs://, over several epochs, in one run, on the same shards: Fashion-MNIST
records (components/dataio/records.py's framing) in a bucket of the Cloud Storage stand-in (tests/standins/gcs.py),
read with google-cloud-storage's real client.

  - streaming: every epoch reads every shard from gs:// (records.iter_records: ranged reads, both checksums of
    every record checked), as training without --stage-dir does;
  - staged: components/train/staging.stage copies the shards to a local directory once (in parallel, verified),
    then every epoch reads the local files the same way; the first epoch's figure includes the staging;
  - resumed: stage again onto the copies already there (a resumed attempt on the same node): verified, nothing
    downloaded.

Each figure is the min, median and max of --repeats runs, the two sides in turn within each run. The stand-in is
a Python HTTP server on the loopback interface: its bytes per second are not Cloud Storage's (a GKE node reads one
object at a few hundred MB/s, and many at once at up to its NIC's rate), so what carries over to a cluster is the
shape of the figures: staging costs one pass over the data (faster than one streamed epoch where it downloads in
parallel) and every later epoch reads at local-disk speed. docs/training.md#staging-the-data-on-local-ssd quotes
them.

    python -m tests.benchmarks.staging [--records 60000] [--shards 8] [--epochs 3] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time

from tests.benchmarks.spread import spread


def _read_epoch(files: list[str]) -> int:
    from components.dataio import records

    return sum(1 for f in files for _ in records.iter_records(f))


def write_dataset(directory: str, records_count: int, shards: int) -> int:
    """A dataset of `shards` train shards of Fashion-MNIST records with its manifest; returns the bytes."""
    from tests.benchmarks.shards import _fashion, _write

    payloads = _fashion(records_count)
    os.makedirs(os.path.join(directory, "train"))
    for shard in range(shards):
        _write(os.path.join(directory, "train", f"train-{shard:05d}-of-{shards:05d}.tfrecord"), payloads[shard::shards])
    manifest = {"splits": {"train": {"path": "train", "pattern": "train-*.tfrecord", "count": len(payloads)},
                           "validation": {"path": "validation", "pattern": "validation-*.tfrecord", "count": 0}}}
    with open(os.path.join(directory, "dataset.json"), "w") as f:
        json.dump(manifest, f)
    return sum(os.path.getsize(os.path.join(directory, "train", n)) for n in os.listdir(os.path.join(directory,
                                                                                                      "train")))


def measure(source: str, local_root: str, epochs: int, repeats: int) -> dict:
    from components.dataio import records
    from components.train import staging

    remote = records.split_files(source, "train")
    runs: dict[str, list[float]] = {}

    def add(figure: str, value: float) -> None:
        runs.setdefault(figure, []).append(value)

    for repeat in range(repeats + 1):  # the first round warms up (imports, connections, the page cache)
        streamed = []
        for _ in range(epochs):
            start = time.perf_counter()
            _read_epoch(remote)
            streamed.append(time.perf_counter() - start)
        local_dir = os.path.join(local_root, f"run-{repeat}")
        start = time.perf_counter()
        staged = staging.stage(source, local_dir)
        stage_seconds = time.perf_counter() - start
        local = records.split_files(staged.dataset_dir, "train")
        local_epochs = []
        for _ in range(epochs):
            start = time.perf_counter()
            _read_epoch(local)
            local_epochs.append(time.perf_counter() - start)
        start = time.perf_counter()
        resumed = staging.stage(source, local_dir)
        resume_seconds = time.perf_counter() - start
        assert resumed.downloaded_files == 0, "a resumed staging downloaded again"
        shutil.rmtree(local_dir, ignore_errors=True)
        if repeat:
            add("stream_epoch_s", statistics.median(streamed))
            add("stream_total_s", sum(streamed))
            add("stage_s", stage_seconds)
            add("staged_first_epoch_s", stage_seconds + local_epochs[0])
            add("local_epoch_s", statistics.median(local_epochs[1:] or local_epochs))
            add("staged_total_s", stage_seconds + sum(local_epochs))
            add("resume_check_s", resume_seconds)
            add("total_ratio", sum(streamed) / (stage_seconds + sum(local_epochs)))
            add("later_epoch_ratio", statistics.median(streamed) / statistics.median(local_epochs[1:] or local_epochs))
    return {figure: spread(values) for figure, values in runs.items()}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=60000, help="Fashion-MNIST records")
    parser.add_argument("--shards", type=int, default=8)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import storage as gcs_storage

    from components.dataio import gcs, storage
    from tests.standins.gcs import GcsStandIn

    workdir = tempfile.mkdtemp(prefix="staging-bench-")
    try:
        data_bytes = write_dataset(os.path.join(workdir, "gcs", "bucket", "dataset"), args.records, args.shards)
        with GcsStandIn(os.path.join(workdir, "gcs")) as server:
            gcs.set_client(gcs_storage.Client(project="bench", credentials=AnonymousCredentials(),
                                              client_options={"api_endpoint": server.url}))
            storage.use_tensorflow_io(False)
            try:
                figures = measure("gs://bucket/dataset", os.path.join(workdir, "local"), args.epochs, args.repeats)
            finally:
                storage.use_tensorflow_io(True)
                gcs.set_client(None)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    result = {"records": args.records, "shards": args.shards, "bytes": data_bytes, "epochs": args.epochs,
              "repeats": args.repeats, "figures": figures}
    print(f"\nstaging: {args.records} records in {args.shards} shards, {data_bytes / 1e6:.1f} MB, {args.epochs} "
          f"epochs; min / median / max of {args.repeats} runs, streaming and staging in turn within each run")
    rows = [("streamed epoch, s", "stream_epoch_s"), (f"streamed, {args.epochs} epochs, s", "stream_total_s"),
            ("staging (download + verify), s", "stage_s"), ("staged first epoch (with staging), s",
                                                             "staged_first_epoch_s"),
            ("local epoch after staging, s", "local_epoch_s"), (f"staged, {args.epochs} epochs, s", "staged_total_s"),
            ("resumed staging (verify only), s", "resume_check_s"),
            (f"ratio streamed / staged, {args.epochs} epochs", "total_ratio"),
            ("ratio streamed / local, a later epoch", "later_epoch_ratio")]
    for label, key in rows:
        print(f"  {label:40} " + " / ".join(f"{figures[key][k]:.2f}" for k in ("min", "median", "max")))
    return result


if __name__ == "__main__":
    main()
