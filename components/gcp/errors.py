"""The errors of remote calls and remote jobs, and the exit codes they map to.

Every failure this layer reports is a `RemoteError` whose message says what to do about it. The exit codes are
the contract documented in components/train.py, which the step CLIs and the launchers share:

    0    ok
    143  retry: preempted or stopped (SIGTERM), or the service is busy (quota, outage); a retry can succeed
    137  killed (SIGKILL): set by the kernel, never returned here; listed for completeness
    2    bad input or a permanent failure (permission, region, a job that failed or was cancelled, a timeout)
    1    a bug: anything this module does not know

`exit_code_for(exc)` applies it; each error class carries its code, so a new error states its own.
"""

from __future__ import annotations

from typing import Any

EXIT_OK = 0
EXIT_BUG = 1
EXIT_PERMANENT = 2
EXIT_KILLED = 137
EXIT_RETRY = 143  # 128 + SIGTERM: what a TFJob's ExitCode restart policy and a KFP retry restart


class RemoteError(RuntimeError):
    """A call to a remote API, or a remote job, failed; the message says what to do about it."""

    exit_code = EXIT_PERMANENT


class PermissionDenied(RemoteError, PermissionError):
    """The caller lacks a role or credentials (HTTP 401/403); the message names the role to grant."""


class QuotaExhausted(RemoteError):
    """Refused for quota (HTTP 429) on every attempt; waiting (or more quota) helps."""

    exit_code = EXIT_RETRY


class Unavailable(RemoteError):
    """The service kept failing with transient errors (5xx, timeouts, dropped connections)."""

    exit_code = EXIT_RETRY


class RegionMismatch(RemoteError, ValueError):
    """The endpoint's region, the resource's location and the call disagree."""


class Rejected(RemoteError):
    """The service refused the request as invalid (HTTP 400); retrying the same request cannot help."""


class JobError(RemoteError):
    """A remote job could not be created, or did not end in success."""


class JobEnded(JobError):
    """A followed job reached a terminal state other than success; `job` is its last state as read."""

    def __init__(self, message: str, job: Any = None, status: Any = None):
        super().__init__(message)
        self.job = job
        self.status = status


class JobFailed(JobEnded):
    """The job ended failed (or expired); the message quotes the job's own error."""


class JobCancelled(JobEnded):
    """Someone else cancelled (or deleted) the job while it was followed."""


class JobTimedOut(JobError, TimeoutError):
    """The job did not finish in the time allowed: cancelled when it was ours, left running when watched."""


class JobStopped(JobError):
    """The follower got SIGTERM (a cancelled pipeline run stops its step's pod); the job was cancelled."""

    exit_code = EXIT_RETRY


class LostTrack(JobError):
    """Polling the job kept failing with transient errors; the job may still be running."""

    exit_code = EXIT_RETRY


def exit_code_for(exc: BaseException) -> int:
    """The documented exit code for an exception: the layer's errors carry theirs, a ValueError is bad input (2),
    anything else is a bug (1)."""
    if isinstance(exc, RemoteError):
        return exc.exit_code
    if isinstance(exc, ValueError):
        return EXIT_PERMANENT
    return EXIT_BUG
