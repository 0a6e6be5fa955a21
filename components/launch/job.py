"""What every launcher shares: the training job's description, its stable name, its outcome, and `Launcher`,
which runs a job on top of components/gcp's `follow_job`.

A launcher is a manifest (or request) builder plus four small methods: `create`, `get`, `cancel` and `status`
(the platform's job as a `JobStatus`). `Launcher.run` does the rest the same way for every kind: follows the
job, logs its state changes, cancels it when the launcher is stopped (SIGTERM), times out or fails, and raises
the layer's errors (whose exit codes the CLI returns).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
from typing import Any, Callable, Iterator

from components import gcp
from components.launch import local_ssd
from components.launch.frameworks import DEFAULT_FRAMEWORK, check_framework
from components.launch.placement import CPU_ONLY, DNS_LABEL_CHARS, GPU_RESOURCE, Placement

# The launchers' errors are the layer's job errors, under the names callers catch.
LaunchError = gcp.JobError
Cancelled = gcp.JobStopped


def job_name(prefix: str, run_id: str, task: str = "", *, max_length: int = 63) -> str:
    """A DNS-1123 name (<= `max_length` chars) that is the same for every attempt of one run's task, so a retried
    launcher finds the job its previous attempt created instead of starting a second one. (A JobSet's name must
    leave room for its pods' names, which it extends: see jobset.max_name_length.)"""
    base = DNS_LABEL_CHARS.sub("-", f"{prefix}-{run_id}-{task}".lower()).strip("-")
    if len(base) > max_length:
        digest = hashlib.sha256(base.encode()).hexdigest()[:8]
        base = f"{base[:max_length - 9].rstrip('-')}-{digest}"
    return base


@dataclasses.dataclass(frozen=True)
class TrainingJob:
    """A multi-worker training job: one chief and `workers` more replicas, all running `command` in `image`."""

    name: str
    image: str
    command: list[str]
    workers: int = 1  # in addition to the chief
    placement: Placement = CPU_ONLY
    cpu: str = "4"
    memory: str = "16Gi"
    kueue_queue: str = ""
    labels: dict = dataclasses.field(default_factory=dict)
    env: dict = dataclasses.field(default_factory=dict)
    backoff_limit: int = 6  # replica restarts (preemptions) before the job fails
    service_account: str = ""
    grace_seconds: int = 30  # SIGTERM to SIGKILL: time to write the preemption checkpoint
    framework: str = DEFAULT_FRAMEWORK  # what the nodes train with: how they find each other (frameworks/)
    network: str = ""  # GPUDirect: rdma or tcpxo (network.py); empty: the pod network only
    local_ssd: str = ""  # the staged data's emptyDir size (local_ssd.py), e.g. 12Gi; empty: nothing staged

    def __post_init__(self):
        check_framework(self.framework)
        if self.local_ssd:
            local_ssd.check_size(self.local_ssd)
        if self.workers < 0:
            raise ValueError(f"workers must be >= 0, got {self.workers}")
        if not self.command:
            raise ValueError("the training command is empty")

    @property
    def nodes(self) -> int:
        """Machines in all: the chief and the workers."""
        return self.workers + 1

    @property
    def processes_per_node(self) -> int:
        """torchrun's processes on each node: one per GPU, one on a CPU node."""
        return self.placement.gpus or 1

    def container_resources(self) -> dict:
        """Each replica's container resources: CPU and memory requested (and the staged data's ephemeral storage),
        the GPUs as a limit."""
        resources = {"requests": {"cpu": self.cpu, "memory": self.memory, **local_ssd.requests(self.local_ssd)}}
        if self.placement.gpus:
            resources["limits"] = {GPU_RESOURCE: str(self.placement.gpus)}
        return resources

    def env_list(self) -> list[dict]:
        """`env` as a container's env list, sorted by name."""
        return [{"name": k, "value": str(v)} for k, v in sorted(self.env.items())]

    def pod_placement(self) -> dict:
        """The replicas' pod spec fields for where and how long: the run's node selector and tolerations, the grace
        period for the SIGTERM checkpoint, the service account."""
        spec: dict = {"terminationGracePeriodSeconds": self.grace_seconds}
        if self.placement.node_selector:
            spec["nodeSelector"] = dict(self.placement.node_selector)
        if self.placement.tolerations:
            spec["tolerations"] = [dict(t) for t in self.placement.tolerations]
        if self.service_account:
            spec["serviceAccountName"] = self.service_account
        return spec

    def pod_labels(self) -> dict:
        return {**self.labels, "app.kubernetes.io/component": "training"}


@dataclasses.dataclass
class JobOutcome:
    name: str
    state: str
    message: str
    seconds: float
    restarts: int = 0


class Launcher:
    """Runs one kind of job to its end. Subclasses say how to create, read, cancel and judge their job."""

    kind = "job"

    def __init__(self, *, poll_seconds: float, timeout_seconds: float | None = None,
                 sleep: Callable[[float], None] | None = None):
        self.poll_seconds = poll_seconds
        self.timeout_seconds = timeout_seconds
        self.sleep = sleep  # None: real waits, woken at once by SIGTERM

    # -- what a kind of job defines --------------------------------------------------------------------

    def create(self, spec: Any) -> str:
        """Creates the job (or finds the one an earlier attempt created); returns its name."""
        raise NotImplementedError

    def get(self, name: str) -> Any:
        """The job as the platform reports it now."""
        raise NotImplementedError

    def cancel(self, name: str) -> None:
        raise NotImplementedError

    def status(self, job: Any) -> gcp.JobStatus:
        raise NotImplementedError

    def what(self, name: str) -> str:
        return f"{self.kind} {name}"

    # -- optional hooks --------------------------------------------------------------------------------

    @contextlib.contextmanager
    def watching(self, name: str) -> Iterator[None]:
        """Around the follow (e.g. stream the chief's log)."""
        yield

    def on_done(self, name: str) -> None:
        """The job has ended (e.g. drain the log stream before its tail is quoted)."""

    def failure_detail(self, name: str) -> str:
        """Added to the message of a job that did not succeed (e.g. the last lines of the chief's log)."""
        return ""

    def restarts(self, job: Any) -> int:
        return 0

    # -- the same for every kind -----------------------------------------------------------------------

    def run(self, spec: Any) -> JobOutcome:
        """Creates the job and blocks until it succeeds; raises LaunchError kinds (gcp.JobError) otherwise, and
        `Cancelled` (gcp.JobStopped) on SIGTERM, after cancelling the job."""
        with gcp.sigterm_stops():  # a SIGTERM while the job is being created cancels it too
            name = self.create(spec)
            what = self.what(name)

            def failure(job: Any, status: gcp.JobStatus) -> str:
                return f"{what} ended {status.state}: {status.message or 'no message'}" + self.failure_detail(name)

            with self.watching(name):
                followed = gcp.follow_job(lambda: self.get(name), lambda: self.cancel(name), status=self.status,
                                          what=what, poll_seconds=self.poll_seconds,
                                          timeout_seconds=self.timeout_seconds, describe=failure,
                                          on_done=lambda: self.on_done(name), sleep=self.sleep)
        return JobOutcome(name, followed.status.state, followed.status.message, followed.seconds,
                          self.restarts(followed.job))
