"""Stopping a follower the way a cancelled pipeline run stops its step: SIGTERM to a child process.

Used by the tests that check an owned job is cancelled when its follower is interrupted (TFJob, CustomJob,
Vertex AI batch prediction).
"""

import os
import signal
import subprocess
import time
from typing import Any, Callable

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_then_sigterm(argv: list[str], ready: Callable[[], Any], *,
                     timeout: float = 60.0) -> tuple[Any, subprocess.CompletedProcess]:
    """Runs `argv` from the repository root, waits until `ready()` returns something true (the child's job is
    being followed), sends SIGTERM and waits for the child to exit. Returns what `ready()` returned and the
    completed process. The child is killed if anything goes wrong, so a failing test leaves nothing running."""
    child = subprocess.Popen(argv, cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + timeout
        while not (seen := ready()):
            if child.poll() is not None or time.monotonic() > deadline:
                _, stderr = child.communicate(timeout=timeout)
                raise AssertionError(f"the child did not get its job going (exit {child.returncode}): "
                                     f"{stderr[-3000:]}")
            time.sleep(0.05)
        child.send_signal(signal.SIGTERM)
        stdout, stderr = child.communicate(timeout=timeout)
    finally:
        if child.poll() is None:
            child.kill()
            child.communicate()
    return seen, subprocess.CompletedProcess(argv, child.returncode, stdout, stderr)
