"""Multi-worker training for real: two processes on loopback with TF_CONFIG train one model together.

They run MultiWorkerMirroredStrategy over gRPC on 127.0.0.1, each reading its own shard file, with the global
batch doubled and the learning rate scaled (with warm-up). The model must match a single-process run of the
same command within one point of test accuracy, and only the chief may write the model, logs and checkpoints.
"""

import glob
import json
import os
import re
import socket
import subprocess
import sys

import pytest

from components import train
from components.dataio import data
from tests.conftest import accuracy_of, preprocessed_slice

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EPOCHS, BATCH = 6, 64


def free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    for s in sockets:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


@pytest.fixture(scope="module")
def sharded_dataset(fashion_dir, tmp_path_factory) -> str:
    """6000 source images: ~5400 train in 2 shards (one per worker), 6000 test."""
    return preprocessed_slice(fashion_dir, tmp_path_factory, "sharded_dataset", limit=6000)


@pytest.mark.slow
def test_two_workers_on_loopback_match_a_single_process(sharded_dataset, tmp_path):
    common = ["--dataset-dir", sharded_dataset, "--epochs", str(EPOCHS), "--batch-size", str(BATCH)]
    # Every replica gets the same command, as in a TFJob: same model, backup and TensorBoard directories.
    shared = ["--model-dir", str(tmp_path / "multi"), "--backup-dir", str(tmp_path / "multi-backup"),
              "--tensorboard-dir", str(tmp_path / "multi-logs")]
    addresses = [f"127.0.0.1:{port}" for port in free_ports(2)]
    workers = []
    for index in range(2):
        tf_config = {"cluster": {"worker": addresses}, "task": {"type": "worker", "index": index}}
        env = {**os.environ, "TF_CONFIG": json.dumps(tf_config), "TF_CPP_MIN_LOG_LEVEL": "2"}
        workers.append(subprocess.Popen([sys.executable, "-m", "components.train", *common, *shared], cwd=REPO_ROOT,
                                        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    logs = []
    try:
        for worker in workers:
            _, stderr = worker.communicate(timeout=600)
            logs.append(stderr)
    finally:
        for worker in workers:
            if worker.poll() is None:
                worker.kill()
    for worker, log in zip(workers, logs):
        assert worker.returncode == 0, log[-3000:]

    single = train.train(sharded_dataset, str(tmp_path / "single"), epochs=EPOCHS, batch_size=BATCH)

    with open(tmp_path / "multi" / train.TRAINING_INFO) as f:
        multi = json.load(f)
    assert multi["strategy"] == "MultiWorkerMirroredStrategy" and multi["workers"] == 2 and multi["replicas"] == 2
    assert multi["global_batch_size"] == 2 * BATCH == 2 * single.global_batch_size
    assert multi["learning_rate"] == pytest.approx(2 * single.learning_rate)  # linear scaling
    assert multi["steps"] == EPOCHS * multi["steps_per_epoch"]

    # Each worker read its own shard file: together exactly the training split.
    held = [int(re.search(r"(\d+) training images held in memory", log).group(1)) for log in logs]
    assert sum(held) == data.read_manifest(sharded_dataset)["splits"]["train"]["count"] and min(held) > 0

    # Only the chief wrote: one TensorBoard event file, checkpoints only in the shared backup directory.
    assert len(glob.glob(str(tmp_path / "multi-logs" / "events.out.tfevents.*"))) == 1
    assert sorted(os.listdir(tmp_path / "multi")) == ["model.keras", "saved_model", "training.json"]
    assert "train: checkpoint" in logs[0] and "train: checkpoint" not in logs[1]

    multi_accuracy = accuracy_of(str(tmp_path / "multi"), sharded_dataset)
    single_accuracy = accuracy_of(str(tmp_path / "single"), sharded_dataset)
    print(f"test accuracy: 2 workers {multi_accuracy:.4f}, 1 process {single_accuracy:.4f}")
    assert multi_accuracy > 0.8
    assert abs(multi_accuracy - single_accuracy) <= 0.01, (multi_accuracy, single_accuracy)
