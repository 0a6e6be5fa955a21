"""When training is interrupted or fails: SIGTERM as a flag, the errors and their exit codes (the contract is
components/stepcli.py's), the marker that makes retries of a permanent failure fail fast, and the durable
checkpoint directory of a task."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import sys
import threading
import time
from typing import Callable, Iterator

from components.dataio import data
from components.stepcli import EXIT_PERMANENT, EXIT_RETRY
from components.train.cluster import cluster_role

log = logging.getLogger(__name__)

FAILED_MARKER = "FAILED.json"


class NonFiniteLossError(RuntimeError):
    """The loss became NaN or infinite: the settings or the data are wrong, retrying cannot help."""

    exit_code = EXIT_PERMANENT


class Preempted(RuntimeError):
    """SIGTERM arrived (a checkpoint was saved) or a peer worker was lost: a retry resumes."""

    exit_code = EXIT_RETRY


class PermanentFailure(RuntimeError):
    """An earlier attempt of this task failed in a way retrying cannot fix."""

    exit_code = EXIT_PERMANENT


class PreemptionWatch:
    """Turns SIGTERM into a flag the training loop checks between steps (handlers only run in the main thread)."""

    def __init__(self):
        self.signalled = threading.Event()
        self._previous = None

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGTERM, self._handle)
        return self

    def _handle(self, signum, frame):
        log.warning("train: SIGTERM received: saving a checkpoint at the next step boundary, then exiting")
        self.signalled.set()

    def __exit__(self, *exc):
        if self._previous is not None:
            signal.signal(signal.SIGTERM, self._previous)
        return False



@contextlib.contextmanager
def peer_loss_is_preemption(where: Callable[[], str], is_peer_loss: Callable[[Exception], bool]) -> Iterator[None]:
    """Turns the framework's errors for a peer worker gone away (those `is_peer_loss` recognises: a preempted node,
    a restarted pod; its collective ops fail) into Preempted, so the attempt exits EXIT_RETRY and the whole job restarts and resumes,
    rather than 1, which a JobSet failure policy or a TFJob's ExitCode restart policy takes as permanent. `where()`
    names the phase (or step) for the message."""
    try:
        yield
    except Exception as e:
        if not is_peer_loss(e):
            raise
        raise Preempted(f"Lost contact with a peer worker in {where()}: {str(e).splitlines()[0]}") from e


def check_not_failed_before(backup_dir: str | None) -> None:
    if not backup_dir:
        return
    marker = data.join(backup_dir, FAILED_MARKER)
    if data.gfile().exists(marker):
        with data.gfile().GFile(marker) as f:
            reason = json.load(f).get("error", "unknown")
        raise PermanentFailure(f"An earlier attempt of this task failed permanently ({reason}); not retrying. "
                               f"Fix the cause and start a new run (or delete {marker}).")


def mark_failed(backup_dir: str | None, error: BaseException) -> None:
    """Records a permanent failure, so a KFP retry of the task fails fast instead of training again (the chief
    records it; the other workers of a multi-worker job see the same failure)."""
    if not backup_dir or not cluster_role(os.environ.get("TF_CONFIG")).is_chief:
        return
    try:
        data.gfile().makedirs(backup_dir)
        data.write_json(data.join(backup_dir, FAILED_MARKER), {"error": f"{type(error).__name__}: {error}",
                                                               "time": time.time()})
    except Exception as e:  # the original error matters more than the marker
        log.warning("train: could not write %s in %s: %s", FAILED_MARKER, backup_dir, e)


def backup_dir_for(checkpoint_root: str, pipeline_root: str, run_id: str, task_name: str) -> str:
    """The task's checkpoint directory: durable (the pipeline root unless `checkpoint_root` is given) and keyed by
    run and task, so a retry of the task or a replacement pod resumes, and a new run starts clean."""
    root = (checkpoint_root or pipeline_root or "").rstrip("/")
    if not root:
        raise ValueError("No durable place for checkpoints: give checkpoint_root or run with a pipeline root")
    if not run_id or not task_name:
        raise ValueError("The checkpoint directory needs the pipeline run id and the task name")
    return data.join(root, "checkpoints", run_id, task_name)


def attempt(train_fn, backup_dir: str | None):
    """Runs `train_fn()` as one attempt of a retried task: a preemption exits with EXIT_RETRY (retry resumes),
    any other failure is recorded in `backup_dir` so that retries fail fast, then re-raised."""
    try:
        return train_fn()
    except Preempted as e:
        print(f"preempted: {e}", file=sys.stderr, flush=True)
        raise SystemExit(EXIT_RETRY) from None
    except PermanentFailure:
        raise
    except Exception as e:
        mark_failed(backup_dir, e)
        raise
