"""`follow_job`: the one loop that follows a remote job to its end.

Every launcher and every remote job in the project goes through it: the TFJob and the Vertex AI CustomJob
launchers (components/launch/), Vertex AI batch prediction (components/predict/vertex.py), the Model Registry's upload
operation (components/registry/vertex.py), and the watchers of whole pipeline runs on Vertex AI Pipelines and KFP
(pipelines/vertexai/vertex.py, pipelines/hosts/publish.py). Modelled on Google Cloud Pipeline Components'
`job_remote_runner` (poll until a terminal state, ride out connection errors, cancel the job when the step is
cancelled). It gives them all the same behaviour:

- polling: one `get()` right away (or, when the caller passes the job it just created, after one interval), then
  every `poll_seconds`, optionally growing by `backoff` up to `max_poll_seconds`;
- progress: one log line per state change (`what` is STATE (message)), not one per poll;
- transient errors while polling (see retry.is_transient) are ridden out; `max_failed_polls` in a row give
  `LostTrack`;
- ownership: with a `cancel`, the job is ours. It is cancelled when SIGTERM arrives (a cancelled pipeline run
  sends SIGTERM to the step's pod: the job must not outlive the run that asked for it), when the timeout
  passes, and when the follower itself fails (an exception, Ctrl-C). Creating the job inside `sigterm_stops()`
  extends this to a SIGTERM that arrives while the job is being created. With `cancel=None` the job is only
  watched (a whole pipeline run that `pipectl run --wait` started: it is not owned by the terminal that
  started it): nothing is ever cancelled, no SIGTERM handler is installed (the process's default applies and
  the run goes on), and a timeout says the job goes on running;
- endings: succeeded -> a `Followed` (the job as last read, its status, the seconds taken); failed or expired
  -> `JobFailed` quoting the job's own message; cancelled or deleted by someone else -> `JobCancelled`;
  timeout -> `JobTimedOut`; SIGTERM -> `JobStopped`. Their exit codes are in components/gcp/errors.py.

Adding a kind of job means writing `get`, `cancel` and a `status` reader that turns the platform's job into a
`JobStatus` (see `vertex_job_status`, and components/launch/ for Kubernetes custom resources).
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import logging
import signal
import threading
import time
from typing import Any, Callable, Generic, Iterator, TypeVar

from components.gcp.errors import JobCancelled, JobFailed, JobStopped, JobTimedOut, LostTrack
from components.gcp.retry import is_transient

log = logging.getLogger(__name__)

T = TypeVar("T")


class Phase(enum.Enum):
    """Where a job is, whatever the platform calls its states."""

    RUNNING = "running"  # includes queued, pending, restarting: anything not yet over
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"  # by someone else: cancelled, deleted, paused for good


@dataclasses.dataclass(frozen=True)
class JobStatus:
    """A job's state as the platform names it (logged and quoted as is), its phase and its message."""

    state: str
    phase: Phase = Phase.RUNNING
    message: str = ""

    @property
    def done(self) -> bool:
        return self.phase is not Phase.RUNNING


@dataclasses.dataclass(frozen=True)
class Followed(Generic[T]):
    """A job that succeeded: as last read, its status, and the seconds it was followed."""

    job: T
    status: JobStatus
    seconds: float


# Vertex AI's JobState (CustomJob, BatchPredictionJob, HyperparameterTuningJob) by phase; other states run.
VERTEX_JOB_PHASES = {
    "JOB_STATE_SUCCEEDED": Phase.SUCCEEDED,
    "JOB_STATE_FAILED": Phase.FAILED,
    "JOB_STATE_EXPIRED": Phase.FAILED,
    # Some results are missing: failing says so, where succeeding would lose them silently.
    "JOB_STATE_PARTIALLY_SUCCEEDED": Phase.FAILED,
    "JOB_STATE_CANCELLED": Phase.CANCELLED,
}


def vertex_job_status(job: Any) -> JobStatus:
    """The status of a Vertex AI job resource (`state` is a JobState, `error` a google.rpc.Status)."""
    state = getattr(job.state, "name", str(job.state))
    error = getattr(job, "error", None)
    return JobStatus(state, VERTEX_JOB_PHASES.get(state, Phase.RUNNING), (error.message if error else "") or "")


@contextlib.contextmanager
def sigterm_stops(enabled: bool = True) -> Iterator[threading.Event]:
    """While inside: SIGTERM sets the yielded event (and wakes follow_job's wait) instead of ending the process.

    Wrap the creation of a job and its follow in one block, so a SIGTERM that arrives while the job is being
    created still cancels it: follow_job inside the block shares the event. Only the main thread can install a
    signal handler; elsewhere (or with `enabled=False`) the process's own handling stays. The previous handler
    is restored on the way out."""
    current = signal.getsignal(signal.SIGTERM)
    if isinstance(getattr(current, "stop_event", None), threading.Event):  # nested: share the outer block's
        yield current.stop_event
        return
    event = threading.Event()
    if not enabled or threading.current_thread() is not threading.main_thread():
        yield event
        return

    def stop(*_):
        event.set()

    stop.stop_event = event
    previous = signal.signal(signal.SIGTERM, stop)
    try:
        yield event
    finally:
        signal.signal(signal.SIGTERM, previous)


def _seconds(value: float) -> str:
    return f"{value:.0f}s" if value >= 1 or value == 0 else f"{value:g}s"


def follow_job(get: Callable[[], T], cancel: Callable[[], Any] | None, *, status: Callable[[T], JobStatus],
               what: str, poll_seconds: float, max_poll_seconds: float | None = None, backoff: float = 2.0,
               timeout_seconds: float | None = None, job: T | None = None, where: str = "",
               describe: Callable[[T, JobStatus], str] | None = None, on_done: Callable[[], Any] | None = None,
               max_failed_polls: int = 5, sleep: Callable[[float], None] | None = None,
               monotonic: Callable[[], float] | None = None) -> Followed[T]:
    """Follows a job until it ends; returns it when it succeeded, raises a JobError otherwise (see the module).

    get: reads the job once (one API call); a transient error is retried at the next poll.
    cancel: cancels (or deletes) the job; None when the job is only watched, never cancelled.
    status: the job's JobStatus.
    what: the job in messages, e.g. "CustomJob projects/p/locations/l/customJobs/1".
    poll_seconds, max_poll_seconds, backoff: the wait between polls; without max_poll_seconds it stays fixed.
    timeout_seconds: give up after this long (None: never).
    job: the job as its creation returned it; then the first poll waits one interval.
    where: a place to look at the job (a console URL), quoted in failures and timeouts.
    describe: the failure message for a job that ended without success (default: "WHAT ended STATE: MESSAGE").
    on_done: called once the job has ended, before the outcome (e.g. to drain a log stream the message quotes).
    sleep, monotonic: the clock. By default the wait is woken at once by SIGTERM; with only `sleep` given (tests),
        time passes as slept, so a test of a timeout never waits.
    """
    waited = [0.0]

    def slept_time() -> float:
        return waited[0]

    clock = monotonic or (time.monotonic if sleep is None else slept_time)
    started = clock()
    see = f" (see {where})" if where else ""
    finished = False
    with sigterm_stops(enabled=cancel is not None) as stopped:
        try:
            interval, failures, last_state, current = poll_seconds, 0, None, job
            while True:
                if stopped.is_set():
                    raise JobStopped(f"Stopped while {what} was running; "
                                     + ("it was cancelled" if cancel else f"it goes on{see}"))
                if current is None:
                    try:
                        current = get()
                        failures = 0
                    except Exception as e:
                        if not is_transient(e):
                            raise
                        failures += 1
                        if failures >= max_failed_polls:
                            goes_on = "it was cancelled" if cancel else f"it goes on{see}"
                            raise LostTrack(f"Lost track of {what} after {failures} failed polls ({e}); "
                                            f"{goes_on}") from e
                        log.warning("polling %s failed (%s); retrying", what, e)
                if current is not None:
                    st = status(current)
                    if st.state != last_state:
                        log.info("%s is %s%s", what, st.state, f" ({st.message})" if st.message else "")
                        last_state = st.state
                    if st.done:
                        finished = True
                        if on_done is not None:
                            on_done()
                        if st.phase is Phase.SUCCEEDED:
                            return Followed(current, st, clock() - started)
                        message = (describe(current, st) if describe else
                                   f"{what} ended {st.state}: {st.message or 'no message'}{see}")
                        raise (JobFailed if st.phase is Phase.FAILED else JobCancelled)(message, current, st)
                if timeout_seconds is not None and clock() - started >= timeout_seconds:
                    if cancel is not None:
                        raise JobTimedOut(f"{what} did not finish within {_seconds(timeout_seconds)}; it was "
                                          f"cancelled")
                    raise JobTimedOut(f"{what} is still {last_state or 'unknown'} after {_seconds(timeout_seconds)}; "
                                      f"it goes on running{see}")
                if sleep is None:
                    stopped.wait(interval)
                else:
                    sleep(interval)
                waited[0] += interval
                if current is not None and max_poll_seconds is not None:
                    interval = min(max_poll_seconds, interval * backoff)
                current = None
        finally:
            if not finished and cancel is not None:
                _cancel(cancel, what)


def _cancel(cancel: Callable[[], Any], what: str) -> None:
    """Cancels a job we leave behind; a failure to do so is logged, never hides why we are leaving."""
    try:
        cancel()
        log.info("cancelled %s", what)
    except Exception as e:  # the original error (or SIGTERM) is what the caller must see
        log.error("could not cancel %s (%s): cancel it by hand", what, e)
