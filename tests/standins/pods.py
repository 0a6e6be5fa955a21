"""Containers as local processes, for the stand-ins that run jobs (k8s_api.py's TFJobs, vertex_jobs.py's CustomJobs).

A container is read as the Kubernetes core/v1 `Container` API reference defines the fields used here (`command`,
`args`, `env` name/value; Vertex AI's `ContainerSpec` has the same three). The image is not pulled: the test's own
environment stands in for it, so `command` + `args` run with this Python first on PATH, from the repository root,
with the container's `env` plus what the platform injects (`TF_CONFIG`). Output is kept line by line with the
timestamp a container runtime gives it; `stop()` sends SIGTERM to the process group and SIGKILL after the grace
period, as the kubelet does.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time

from tests.standins.base import LOOPBACK, rfc3339

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def free_port() -> int:
    with socket.socket() as s:
        s.bind((LOOPBACK, 0))
        return s.getsockname()[1]


class Pod:
    """One replica's container: its command as a process, its log, its exit code (128 + N when killed by signal N)."""

    def __init__(self, name: str, replica_type: str, index: int, container: dict, env: dict):
        self.name, self.replica_type, self.index = name, replica_type, index
        self.container, self.env = container, env
        self.lines: list[tuple[str, str]] = []  # (timestamp, line)
        self.process: subprocess.Popen | None = None
        self.exit_code: int | None = None
        self.restarts = 0
        self.started = self.ended = ""  # the container's startedAt and finishedAt (RFC 3339)
        self.changed = threading.Condition()
        self.deleted = False

    @property
    def running(self) -> bool:
        return self.process is not None and self.exit_code is None

    def api_status(self, started: str, finished: str = "") -> dict:
        """The pod's core/v1 PodStatus as the kubelet reports it: its phase and its one container's state."""
        if self.exit_code is not None:
            phase, state = ("Succeeded" if self.exit_code == 0 else "Failed"), {"terminated": {
                "exitCode": self.exit_code, "reason": "Completed" if self.exit_code == 0 else "Error",
                "startedAt": started, "finishedAt": finished or started}}
        elif self.process is not None:
            phase, state = "Running", {"running": {"startedAt": started}}
        else:
            phase, state = "Pending", {"waiting": {"reason": "ContainerCreating"}}
        return {"phase": phase, "containerStatuses": [{
            "name": self.container.get("name", "node"), "image": self.container.get("image", ""), "imageID": "",
            "ready": phase == "Running", "restartCount": 0, "state": state}]}

    def start(self) -> None:
        command = list(self.container.get("command", [])) + list(self.container.get("args", []))
        env = {**os.environ, **{e["name"]: e.get("value", "") for e in self.container.get("env", [])}, **self.env}
        # The test's environment stands in for the image: its `python` is the one running the tests.
        env["PATH"] = os.pathsep.join([os.path.dirname(sys.executable), env.get("PATH", "")])
        with self.changed:
            self.exit_code = None
            self.started, self.ended = rfc3339(time.time(), 6), ""
            self.lines = []
            self.process = subprocess.Popen(command, cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE,
                                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
            self.changed.notify_all()
            threading.Thread(target=self._pump, args=(self.process,), daemon=True).start()

    def _pump(self, process: subprocess.Popen) -> None:
        lines = self.lines
        for line in process.stdout:
            stamp = rfc3339(time.time(), 9, trim=True)  # as the container runtime stamps log lines (RFC3339Nano)
            with self.changed:
                lines.append((stamp, line))
                self.changed.notify_all()
        code = process.wait()
        with self.changed:
            if self.process is process:
                self.exit_code = code if code >= 0 else 128 - code  # killed by signal N: 128 + N, as in a container
                self.ended = rfc3339(time.time(), 6)
            self.changed.notify_all()

    def stop(self, grace_seconds: float = 5.0) -> None:
        self.deleted = True
        process = self.process
        if process is None or process.poll() is not None:
            return
        signal_group(process, signal.SIGTERM)
        try:
            process.wait(grace_seconds)
        except subprocess.TimeoutExpired:
            signal_group(process, signal.SIGKILL)
            process.wait()


def signal_group(process: subprocess.Popen, signum: int) -> None:
    """Sends `signum` to the process's group (its own session: the container's processes), unless all of them have
    exited since the caller looked (then there is nothing to stop)."""
    try:
        os.killpg(process.pid, signum)
    except ProcessLookupError:
        pass
