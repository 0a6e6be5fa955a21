"""Staging a run's shards onto local disk (components/train/staging.py): from gs:// on the Cloud Storage stand-in
with google-cloud-storage's real client, verified record by record; a resumed attempt that finds its verified
copies downloads nothing; a bad local copy is fetched again; a corrupt object is refused naming it; and the size
the launchers give the emptyDir."""

from __future__ import annotations

import json
import os
import shutil

import pytest

from components.dataio import gcs, records, storage
from components.dataio.storage import DataError
from components.train import staging
from tests.conftest import preprocessed_slice
from tests.standins.gcs import GcsStandIn


@pytest.fixture(scope="module")
def dataset(fashion_dir, tmp_path_factory) -> str:
    return preprocessed_slice(fashion_dir, tmp_path_factory, "staging_dataset", limit=400)


@pytest.fixture
def bucket(tmp_path, dataset, loopback_only):
    """gs://bucket/run/dataset: the preprocessed slice on the stand-in, read through google-cloud-storage."""
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import storage as gcs_storage

    root = tmp_path / "gcs"
    shutil.copytree(dataset, root / "bucket" / "run" / "dataset")
    with GcsStandIn(root) as server:
        gcs.set_client(gcs_storage.Client(project="test", credentials=AnonymousCredentials(),
                                          client_options={"api_endpoint": server.url}))
        storage.use_tensorflow_io(False)  # gs:// through components/dataio/gcs.py, as the torch and JAX images read it
        server.bucket_dir = root / "bucket"
        try:
            yield server
        finally:
            storage.use_tensorflow_io(True)
            gcs.set_client(None)


SOURCE = "gs://bucket/run/dataset"


def shards(dataset_dir: str) -> list[str]:
    manifest = records.read_manifest(dataset_dir)
    return [path for split, info in manifest["splits"].items() if info["count"]
            for path in records.split_files(dataset_dir, split, manifest)]


def test_the_shards_are_staged_verified_and_training_reads_the_local_copy(bucket, dataset, tmp_path):
    staged = staging.stage(SOURCE, str(tmp_path / "ssd"))
    local = shards(staged.dataset_dir)
    assert local and all(path.startswith(str(tmp_path / "ssd" / "dataset")) for path in local)
    originals = shards(dataset)
    assert [os.path.relpath(p, staged.dataset_dir) for p in local] == \
        [os.path.relpath(p, dataset) for p in originals]
    assert all(open(a, "rb").read() == open(b, "rb").read() for a, b in zip(local, originals))
    size = sum(os.path.getsize(p) for p in originals)
    assert (staged.files, staged.bytes, staged.downloaded_files, staged.downloaded_bytes) == \
        (len(originals), size, len(originals), size)
    assert staging.dataset_bytes(SOURCE) == size
    metrics = staged.metrics()
    assert metrics["bytes"] == size and metrics["seconds"] > 0 and metrics["megabytes_per_second"] > 0
    # the rest of the manifest is the dataset's own
    kept = json.loads(open(os.path.join(dataset, "dataset.json")).read())
    rewritten = records.read_manifest(staged.dataset_dir)
    assert rewritten["class_names"] == kept["class_names"] and rewritten["splits"]["train"]["count"] == \
        kept["splits"]["train"]["count"]


def test_a_resumed_attempt_finds_its_verified_copies_and_a_bad_one_is_fetched_again(bucket, tmp_path):
    first = staging.stage(SOURCE, str(tmp_path / "ssd"))
    again = staging.stage(SOURCE, str(tmp_path / "ssd"))
    assert (again.files, again.bytes, again.downloaded_files, again.refetched_files) == \
        (first.files, first.bytes, 0, 0)
    # a copy cut short (a node that lost power mid-write) and one with a flipped byte: both fetched again
    local = shards(first.dataset_dir)
    with open(local[0], "r+b") as f:
        f.truncate(os.path.getsize(local[0]) - 7)
    with open(local[-1], "r+b") as f:
        f.seek(200)
        byte = f.read(1)
        f.seek(200)
        f.write(bytes([byte[0] ^ 0xFF]))
    repaired = staging.stage(SOURCE, str(tmp_path / "ssd"))
    assert (repaired.downloaded_files, repaired.refetched_files) == (2, 2)
    for path in local:
        for _ in records.iter_records(path):
            pass


def test_a_download_corrupted_on_the_way_is_fetched_again(bucket, tmp_path):
    bucket.corrupt_next, bucket.corrupt_suffix = 1, ".tfrecord"  # the first shard's body has a byte flipped
    staged = staging.stage(SOURCE, str(tmp_path / "ssd"), parallel=1)
    assert staged.refetched_files == 1 and staged.downloaded_files == staged.files


def test_a_corrupt_shard_in_the_bucket_is_refused_naming_it(bucket, tmp_path):
    name = sorted(os.listdir(bucket.bucket_dir / "run" / "dataset" / "train"))[0]
    path = bucket.bucket_dir / "run" / "dataset" / "train" / name
    raw = bytearray(path.read_bytes())
    raw[100] ^= 0xFF
    path.write_bytes(bytes(raw))
    with pytest.raises(DataError, match=f"{SOURCE}/train/{name} is corrupt"):
        staging.stage(SOURCE, str(tmp_path / "ssd"))
    assert not os.path.exists(tmp_path / "ssd" / "dataset" / "dataset.json")  # no manifest of a partial copy


@pytest.mark.parametrize("data_bytes, limit", [(0, "1Gi"), (100 << 20, "2Gi"), (10 << 30, "12Gi"),
                                               (int(0.95 * (1 << 30)), "2Gi")])
def test_the_empty_dir_holds_the_shards_with_room_to_spare(data_bytes, limit):
    assert staging.size_limit(data_bytes) == limit


def test_a_negative_size_is_refused():
    with pytest.raises(ValueError, match="data_bytes must be >= 0"):
        staging.size_limit(-1)


def test_training_reads_the_staged_copy_and_a_resumed_attempt_downloads_nothing(bucket, tmp_path):
    """The training step with --stage-dir on a gs:// dataset: the shards staged before the first epoch and recorded
    in training.json; the checkpoints stay in backup_dir; a second attempt of the same task (same node, its staged
    copies there) finds them verified and downloads nothing."""
    from components.train import train

    stage_dir, backup_dir = tmp_path / "ssd", tmp_path / "backup"
    train(SOURCE, str(tmp_path / "model"), epochs=1, stage_dir=str(stage_dir), backup_dir=str(backup_dir))
    info = json.loads((tmp_path / "model" / "training.json").read_text())
    files = len(shards(SOURCE))
    assert (info["staging"]["files"], info["staging"]["downloaded_files"]) == (files, files)
    assert info["train_count"] == records.read_manifest(str(stage_dir / "dataset"))["splits"]["train"]["count"]
    assert os.listdir(backup_dir) and not any(name.endswith(".tfrecord") for _, _, names in os.walk(backup_dir)
                                              for name in names)
    storage.use_tensorflow_io(False)  # (training chose TensorFlow's file functions for its framework)
    train(SOURCE, str(tmp_path / "model-again"), epochs=1, stage_dir=str(stage_dir), backup_dir=str(backup_dir))
    again = json.loads((tmp_path / "model-again" / "training.json").read_text())
    assert (again["staging"]["files"], again["staging"]["downloaded_files"]) == (files, 0)
