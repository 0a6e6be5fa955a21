"""Preemption: kill the training process (SIGKILL and SIGTERM) at random points, resume, and finish exactly.

Each attempt is a real `python -m components.train` process sharing one backup directory, as the attempts of a
retried pipeline task do. The kills land after a random number (1-3) of periodic checkpoints plus a random
delay, so they hit mid-epoch as well as epoch boundaries, during steps, saves and validation.
"""

import json
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time

import pytest

from components import train
from tests.conftest import accuracy_of
from tests.test_distributed import free_ports

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EPOCHS, BATCH = 6, 8  # ~1000 small steps: long enough to be interrupted several times, quick to run


class Attempt:
    """One training process; collects its log lines as they come."""

    def __init__(self, args: list[str], env: dict | None = None):
        self.process = subprocess.Popen([sys.executable, "-m", "components.train", *args], cwd=REPO_ROOT,
                                        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", **(env or {})})
        self.lines: list[str] = []
        self.changed = threading.Condition()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.process.stderr:
            with self.changed:
                self.lines.append(line.rstrip("\n"))
                self.changed.notify_all()
        with self.changed:
            self.changed.notify_all()

    def wait_for_checkpoints(self, count: int, timeout: float = 120.0) -> bool:
        """Waits until `count` checkpoints were written in this attempt; False if the process ended first."""
        return self.wait_until(lambda: len(self.saved_steps()) >= count, timeout)

    def wait_until(self, condition, timeout: float = 120.0) -> bool:
        """Waits until `condition()` holds (read under the lines' lock); False if the process ended first."""
        deadline = time.monotonic() + timeout
        with self.changed:
            while not condition():
                if self.process.poll() is not None or time.monotonic() > deadline:
                    return False
                self.changed.wait(0.1)
        return True

    def finish(self, timeout: float = 300.0) -> int:
        code = self.process.wait(timeout)
        self.process.stdout.read()
        time.sleep(0.1)  # the reader thread drains stderr
        return code

    def saved_steps(self) -> list[int]:
        return [int(m.group(1)) for line in self.lines for m in [re.search(r"train: checkpoint \S*ckpt-(\d+)", line)]
                if m]

    def resumed_from(self) -> int:
        for line in self.lines:
            m = re.search(r"resuming from step (\d+)", line)
            if m:
                return int(m.group(1))
        return 0


def test_attempt_log_parsing():
    """The helpers read the log lines the trainer writes."""
    attempt = Attempt.__new__(Attempt)
    attempt.lines = ["... INFO train: resuming from step 120 of 400 (epoch 2, step 20) from /b/ckpt-120",
                     "... INFO train: checkpoint /b/ckpt-140 (epoch 2, step 40)"]
    assert attempt.resumed_from() == 120 and attempt.saved_steps() == [140]


@pytest.mark.slow
def test_killed_and_preempted_training_resumes_to_the_exact_step_count(small_dataset, tmp_path):
    rng = random.Random(os.environ.get("PYTEST_SEED", "kills"))
    common = ["--dataset-dir", small_dataset, "--epochs", str(EPOCHS), "--batch-size", str(BATCH),
              "--learning-rate", "1e-3", "--steps-per-execution", "1", "--input-mode", "memory"]

    uninterrupted = Attempt([*common, "--model-dir", str(tmp_path / "reference"), "--backup-dir",
                             str(tmp_path / "reference-backup")])
    assert uninterrupted.finish() == 0, "\n".join(uninterrupted.lines[-20:])

    backup = str(tmp_path / "backup")
    args = [*common, "--model-dir", str(tmp_path / "model"), "--backup-dir", backup, "--checkpoint-seconds", "0.25"]
    kills = [signal.SIGKILL, signal.SIGTERM, signal.SIGKILL, signal.SIGTERM]
    last_saved, resumes = 0, []
    for kill in kills:
        attempt = Attempt(args)
        if not attempt.wait_for_checkpoints(rng.randint(1, 3)):
            pytest.fail("training ended before it could be interrupted:\n" + "\n".join(attempt.lines[-20:]))
        time.sleep(rng.uniform(0.0, 0.2))
        attempt.process.send_signal(kill)
        code = attempt.finish()
        resumes.append(attempt.resumed_from())
        assert attempt.resumed_from() == last_saved, "each attempt resumes from the previous attempt's last checkpoint"
        if kill == signal.SIGTERM:
            assert code == train.EXIT_RETRY, "\n".join(attempt.lines[-20:])
            assert any("(preempted)" in line for line in attempt.lines), "SIGTERM saves a checkpoint before exiting"
        else:
            assert code == -signal.SIGKILL
        last_saved = attempt.saved_steps()[-1]

    final = Attempt(args)
    assert final.finish() == 0, "\n".join(final.lines[-20:])
    assert final.resumed_from() == last_saved > 0

    with open(tmp_path / "model" / train.TRAINING_INFO) as f:
        info = json.load(f)
    with open(tmp_path / "reference" / train.TRAINING_INFO) as f:
        reference = json.load(f)
    assert info["steps"] == reference["steps"] == EPOCHS * info["steps_per_epoch"]  # no more, no less
    assert all(len(values) == EPOCHS for values in info["history"].values())
    resumes.append(final.resumed_from())
    assert any(step % info["steps_per_epoch"] for step in resumes if step), f"no mid-epoch resume in {resumes}"

    resumed_accuracy = accuracy_of(str(tmp_path / "model"), small_dataset)
    reference_accuracy = accuracy_of(str(tmp_path / "reference"), small_dataset)
    print(f"resumed from steps {resumes} of {info['steps']}; test accuracy {resumed_accuracy:.4f} resumed, "
          f"{reference_accuracy:.4f} uninterrupted")
    assert abs(resumed_accuracy - reference_accuracy) <= 0.005, (resumed_accuracy, reference_accuracy)


@pytest.mark.slow
def test_a_peer_lost_before_the_epoch_loop_is_retryable(small_dataset, tmp_path):
    """Two workers on loopback; worker 1 is killed as soon as its strategy is up, so the chief loses it while
    building the model under the strategy (its first collective op), outside the epoch loop. The chief must exit
    EXIT_RETRY, which a JobSet failure policy and a TFJob restart, not 1, and leave no FAILED marker.
    (MultiWorkerMirroredStrategy's health check notices the lost peer within about a minute.)"""
    addresses = [f"127.0.0.1:{port}" for port in free_ports(2)]
    args = ["--dataset-dir", small_dataset, "--epochs", "1", "--batch-size", str(BATCH), "--model-dir",
            str(tmp_path / "model"), "--backup-dir", str(tmp_path / "backup")]
    workers = [Attempt(args, env={"TF_CONFIG": json.dumps({"cluster": {"worker": addresses},
                                                           "task": {"type": "worker", "index": index}})})
               for index in range(2)]
    try:
        up = workers[1].wait_until(lambda: any("MultiWorkerMirroredStrategy on" in line for line in workers[1].lines))
        assert up, "\n".join(workers[1].lines[-20:])
        workers[1].process.kill()
        code = workers[0].finish(timeout=300)
    finally:
        for worker in workers:
            if worker.process.poll() is None:
                worker.process.kill()
    log = "\n".join(workers[0].lines[-20:])
    assert code == train.EXIT_RETRY, log
    assert re.search(r"preempted: Lost contact with a peer worker in (build|restore)", log), log
    assert "starting at step" not in "\n".join(workers[0].lines), "the chief was lost outside the epoch loop"
    assert not os.path.exists(tmp_path / "backup" / train.FAILED_MARKER)
