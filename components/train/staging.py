"""Staging a run's shards onto the node's local disk before the first epoch: the datasets (preprocess's and
augment's) copied from gs:// in parallel, every shard's records verified, and the manifests rewritten so that
training reads the local copy. Later epochs, evaluation and a resumed attempt on the same node then read local
files; an attempt on another node (an empty emptyDir) stages again. Checkpoints, the model and TensorBoard logs
stay where the settings put them (GCS): only the input is staged.

On GKE the staging directory is an emptyDir: on a node pool created with `--ephemeral-storage-local-ssd count=N`
emptyDirs and ephemeral storage live on the machine's local NVMe SSDs
(https://cloud.google.com/kubernetes-engine/docs/concepts/local-ssd). The launchers size the emptyDir
(`sizeLimit`) and the pod's ephemeral-storage request from the datasets' bytes (`size_limit`), so that the
scheduler places the pod on a node with room for it and the kubelet evicts nothing else for it.

The copy is storage.LocalFiles' copy of one file (for gs://, components/dataio/gcs.py's download with
google-cloud-storage, the client records.py reads gs:// with whatever the framework); the check is
records.iter_records with both checksums of every record (a corrupt or truncated shard raises DataError). A shard
already present with the source's size and verified records is kept (a resumed attempt downloads nothing); one
that fails is fetched again once, and a source that is itself corrupt is refused naming the file.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import json
import logging
import math
import os
import time

from components.dataio import records
from components.dataio.storage import DataError, LocalFiles, locate

log = logging.getLogger(__name__)

MANIFEST = "dataset.json"
PASSTHROUGH = "passthrough"  # augment.PASSTHROUGH: a split that is the dataset's own (staged with the dataset)
DEFAULT_PARALLEL = 16  # files downloaded at once
GIB = 1 << 30
# Room beside the shards in the emptyDir: the manifests, and the slack of a filesystem's blocks.
HEADROOM_FRACTION, HEADROOM_BYTES = 0.05, 1 * GIB


@dataclasses.dataclass(frozen=True)
class StagedDataset:
    """What `stage` did: the local copies to train from, and what it cost."""

    dataset_dir: str  # the local copy of the dataset (its manifest points at local shards)
    augmented_dir: str | None
    files: int  # shards in the local copies
    bytes: int
    downloaded_files: int  # of them fetched in this attempt (0: all were present and verified)
    downloaded_bytes: int
    refetched_files: int  # present but failing their check, fetched again
    seconds: float

    def metrics(self) -> dict:
        """The step's record of the staging (training.json's "staging")."""
        return {"files": self.files, "bytes": self.bytes, "downloaded_files": self.downloaded_files,
                "downloaded_bytes": self.downloaded_bytes, "refetched_files": self.refetched_files,
                "seconds": round(self.seconds, 3),
                "megabytes_per_second": round(self.downloaded_bytes / 1e6 / self.seconds, 1) if self.seconds else 0.0}


def _split_shards(dataset_dir: str, manifest: dict) -> dict[str, tuple[str, list[str]]]:
    """Each split's base directory and shard files, as training finds them (records.split_files), passthrough
    splits (the dataset's own shards, staged with the dataset) left out."""
    shards = {}
    for split, info in manifest.get("splits", {}).items():
        if info.get(PASSTHROUGH) or not info.get("count", 1):
            continue
        shards[split] = (locate(dataset_dir, info["path"]), records.split_files(dataset_dir, split, manifest))
    return shards


def _sources(dataset_dir: str, augmented_dir: str | None) -> list[tuple[str, str, dict]]:
    """(name, source directory, manifest) of each dataset to stage."""
    sources = [("dataset", dataset_dir, records.read_manifest(dataset_dir))]
    if augmented_dir:
        sources.append(("augmented", augmented_dir, records.read_manifest(augmented_dir)))
    return sources


def dataset_bytes(dataset_dir: str, augmented_dir: str | None = None) -> int:
    """The bytes of the shards that `stage` copies (every split of the dataset and of the augmented dataset)."""
    return sum(LocalFiles.stat(path).length for _, source, manifest in _sources(dataset_dir, augmented_dir)
               for _, paths in _split_shards(source, manifest).values() for path in paths)


def size_limit(data_bytes: int) -> str:
    """The emptyDir's sizeLimit and the pod's ephemeral-storage request for `data_bytes` of shards: the bytes plus
    5% and 1 GiB (manifests, filesystem blocks), in whole GiB (a Kubernetes quantity)."""
    if data_bytes < 0:
        raise ValueError(f"data_bytes must be >= 0, got {data_bytes}")
    return f"{math.ceil((data_bytes * (1 + HEADROOM_FRACTION) + HEADROOM_BYTES) / GIB)}Gi"


def _verified(path: str, size: int) -> bool:
    """Whether the local file `path` is a whole copy: the source's size and every record's checksums."""
    if not os.path.isfile(path) or os.path.getsize(path) != size:
        return False
    try:
        for _ in records.iter_records(path, verify=True):
            pass
    except DataError:
        return False
    return True


def _stage_file(source: str, target: str) -> tuple[int, int, int]:
    """Copies one shard unless a verified copy is there; (bytes, bytes downloaded, 1 if it was fetched again)."""
    size = LocalFiles.stat(source).length
    present = os.path.exists(target)
    if _verified(target, size):
        return size, 0, 0
    for attempt in (1, 2):
        partial = f"{target}.part"
        try:
            LocalFiles.copy(source, partial, overwrite=True)
        except Exception as e:  # google-cloud-storage's DataCorruption: the body failed the object's hash
            if type(e).__name__ != "DataCorruption":
                raise
            log.warning("staging: %s: %s", source, str(e).splitlines()[0])
        if _verified(partial, size):
            os.replace(partial, target)
            return size, size, int(present or attempt > 1)
        log.warning("staging: %s failed its check after download %d of 2", source, attempt)
    if os.path.exists(partial):
        os.remove(partial)
    # The source itself: say what is wrong with it (records' message names the file and the byte offset).
    for _ in records.iter_records(source, verify=True):
        pass
    raise DataError(f"{source} changed while it was staged ({size} bytes expected): stage again")


def stage(dataset_dir: str, local_dir: str, *, augmented_dir: str | None = None,
          parallel: int = DEFAULT_PARALLEL) -> StagedDataset:
    """Copies the shards of `dataset_dir` (and `augmented_dir`) under `local_dir`, verified, and writes manifests
    that point at them; returns where the local copies are and what it took. DataError for a shard that stays
    corrupt, naming it."""
    start = time.monotonic()
    jobs, manifests = [], {}
    for name, source, manifest in _sources(dataset_dir, augmented_dir):
        local = os.path.join(local_dir, name)
        rewritten = json.loads(json.dumps(manifest))
        for split, (base, paths) in _split_shards(source, manifest).items():
            prefix = base.rstrip("/") + "/"
            for path in paths:
                relative = path[len(prefix):] if path.startswith(prefix) else os.path.basename(path)
                jobs.append((path, os.path.join(local, split, relative)))
            rewritten["splits"][split]["path"] = split
        for info in rewritten.get("splits", {}).values():
            if info.get(PASSTHROUGH):  # the dataset's train split: its local copy
                info["path"] = os.path.join(local_dir, "dataset", "train")
        manifests[local] = rewritten
    for _, target in jobs:
        os.makedirs(os.path.dirname(target), exist_ok=True)
    with concurrent.futures.ThreadPoolExecutor(max(1, min(parallel, len(jobs) or 1))) as pool:
        done = list(pool.map(lambda job: _stage_file(*job), jobs))
    for local, manifest in manifests.items():  # last: a manifest is there only once its shards are
        os.makedirs(local, exist_ok=True)
        with open(os.path.join(local, MANIFEST), "w") as f:
            json.dump(manifest, f, indent=2)
    staged = StagedDataset(
        dataset_dir=os.path.join(local_dir, "dataset"),
        augmented_dir=os.path.join(local_dir, "augmented") if augmented_dir else None,
        files=len(done), bytes=sum(d[0] for d in done), downloaded_files=sum(1 for d in done if d[1]),
        downloaded_bytes=sum(d[1] for d in done), refetched_files=sum(d[2] for d in done),
        seconds=time.monotonic() - start)
    log.info("staging: %d shard(s), %.1f MB under %s in %.1fs (%d downloaded, %d fetched again)", staged.files,
             staged.bytes / 1e6, local_dir, staged.seconds, staged.downloaded_files, staged.refetched_files)
    return staged


def main(argv: list[str] | None = None) -> int:
    """`python -m components.train.staging DATASET [AUGMENTED]`: the bytes to stage and the emptyDir size."""
    import argparse

    parser = argparse.ArgumentParser(description="The bytes of a run's shards and the local-SSD emptyDir they need.")
    parser.add_argument("dataset_dir")
    parser.add_argument("augmented_dir", nargs="?")
    args = parser.parse_args(argv)
    data_bytes = dataset_bytes(args.dataset_dir, args.augmented_dir)
    print(json.dumps({"bytes": data_bytes, "size_limit": size_limit(data_bytes)}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
