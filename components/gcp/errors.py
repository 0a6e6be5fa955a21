"""The errors of remote calls and remote jobs, and the exit codes they map to.

Every failure this layer reports is a `RemoteError` whose message says what to do about it. Each class states
its exit code (`exit_code`) in the contract of components/stepcli.py, which every step CLI and launcher applies
with `stepcli.exit_code_for`: 143 (retry) for a stopped follower (SIGTERM), a busy service (quota, outage) or a
job lost track of; 2 (permanent) for permission, region, a rejected request, a job that failed, was cancelled
by someone else or timed out.
"""

from __future__ import annotations

from typing import Any

from components.stepcli import EXIT_PERMANENT, EXIT_RETRY


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
