"""The Google Cloud layer (components/gcp/): follow_job with an injected clock, the error-to-exit-code contract,
client construction and the accelerator table.

follow_job is exercised with scripted jobs (a `get` that returns the next status); the launchers, batch prediction,
the registry and the pipeline watchers exercise it again against the API stand-ins in their own tests.
"""

import logging
import os
import signal

import pytest

from components import gcp, stepcli
from components.gcp import JobStatus, Phase

RUNNING = JobStatus("RUNNING")
QUEUED = JobStatus("QUEUED")
DONE = JobStatus("DONE", Phase.SUCCEEDED)


class ScriptedJob:
    """A remote job whose polls answer `statuses` in turn (the last one forever); records polls and cancels."""

    def __init__(self, *statuses, errors=()):
        self.statuses = list(statuses)
        self.errors = list(errors)  # raised by the first polls, before any status
        self.polls = 0
        self.cancels = 0
        self.sleeps: list[float] = []

    def get(self):
        self.polls += 1
        if self.errors:
            raise self.errors.pop(0)
        return self.statuses.pop(0) if len(self.statuses) > 1 else self.statuses[0]

    def cancel(self):
        self.cancels += 1

    def follow(self, owned=True, **kwargs):
        options = dict(status=lambda s: s, what="job j-1", poll_seconds=10, sleep=self.sleeps.append)
        options.update(kwargs)
        return gcp.follow_job(self.get, self.cancel if owned else None, **options)


def test_success_returns_the_job_and_logs_each_state_once(caplog):
    caplog.set_level(logging.INFO, logger="components.gcp.jobs")
    job = ScriptedJob(QUEUED, QUEUED, RUNNING, RUNNING, RUNNING, DONE)
    followed = job.follow()
    assert followed.status == DONE and followed.job is DONE
    assert job.polls == 6 and job.sleeps == [10] * 5 and job.cancels == 0
    assert [r.getMessage() for r in caplog.records] == ["job j-1 is QUEUED", "job j-1 is RUNNING", "job j-1 is DONE"]
    assert followed.seconds == 50  # time passes as slept when only `sleep` is injected


def test_the_job_as_created_is_read_before_the_first_poll():
    job = ScriptedJob(DONE)
    assert job.follow(job=QUEUED).status == DONE
    assert job.polls == 1 and job.sleeps == [10]


def test_polls_back_off_up_to_a_limit():
    job = ScriptedJob(*[RUNNING] * 6, DONE)
    job.follow(poll_seconds=5, max_poll_seconds=60)
    assert job.sleeps == [5, 10, 20, 40, 60, 60]


def test_failure_raises_with_the_jobs_message_and_does_not_cancel():
    job = ScriptedJob(RUNNING, JobStatus("JOB_STATE_FAILED", Phase.FAILED, "replica 0 exited with 2"))
    with pytest.raises(gcp.JobFailed, match="job j-1 ended JOB_STATE_FAILED: replica 0 exited with 2") as error:
        job.follow(where="https://console/j-1")
    assert "(see https://console/j-1)" in str(error.value)
    assert error.value.status.state == "JOB_STATE_FAILED" and job.cancels == 0
    assert stepcli.exit_code_for(error.value) == 2


def test_a_caller_describes_failures_and_drains_before_the_message():
    drained = []
    job = ScriptedJob(JobStatus("Failed", Phase.FAILED, "chief failed"))
    with pytest.raises(gcp.JobFailed, match="chief failed; last log lines: a, b"):
        job.follow(on_done=lambda: drained.append("a, b"),
                   describe=lambda j, st: f"{st.message}; last log lines: {drained[0]}")


def test_cancelled_by_someone_else_is_an_error_and_not_cancelled_again():
    job = ScriptedJob(RUNNING, JobStatus("JOB_STATE_CANCELLED", Phase.CANCELLED))
    with pytest.raises(gcp.JobCancelled, match="ended JOB_STATE_CANCELLED: no message"):
        job.follow()
    assert job.cancels == 0


def test_timeout_cancels_an_owned_job():
    job = ScriptedJob(RUNNING)
    with pytest.raises(gcp.JobTimedOut, match="job j-1 did not finish within 30s; it was cancelled") as error:
        job.follow(timeout_seconds=30)
    assert job.cancels == 1 and isinstance(error.value, TimeoutError)
    assert stepcli.exit_code_for(error.value) == 2


def test_cancel_none_leaves_a_watched_job_running():
    job = ScriptedJob(RUNNING)
    with pytest.raises(gcp.JobTimedOut, match="is still RUNNING after 30s; it goes on running \\(see URL\\)"):
        job.follow(owned=False, timeout_seconds=30, where="URL")
    assert job.cancels == 0


def test_sigterm_cancels_an_owned_job_and_restores_the_handler():
    before = signal.getsignal(signal.SIGTERM)
    job = ScriptedJob(RUNNING)
    with pytest.raises(gcp.JobStopped, match="Stopped while job j-1 was running; it was cancelled") as error:
        job.follow(sleep=lambda s: os.kill(os.getpid(), signal.SIGTERM))
    assert job.cancels == 1 and job.polls == 1
    assert signal.getsignal(signal.SIGTERM) is before
    assert stepcli.exit_code_for(error.value) == 143


def test_a_sigterm_while_the_job_is_created_cancels_it_once_followed():
    before = signal.getsignal(signal.SIGTERM)
    job = ScriptedJob(RUNNING)
    with gcp.sigterm_stops():
        os.kill(os.getpid(), signal.SIGTERM)  # arrives while the job is being created
        with pytest.raises(gcp.JobStopped):
            job.follow()
    assert job.cancels == 1 and job.polls == 0
    assert signal.getsignal(signal.SIGTERM) is before


def test_a_watcher_installs_no_sigterm_handler():
    before = signal.getsignal(signal.SIGTERM)
    seen = []
    job = ScriptedJob(RUNNING, DONE)
    job.follow(owned=False, sleep=lambda s: seen.append(signal.getsignal(signal.SIGTERM)))
    assert seen == [before]


def test_the_follower_failing_cancels_the_owned_job():
    job = ScriptedJob(RUNNING, errors=[KeyError("a bug in the status reader's input")])
    with pytest.raises(KeyError):
        job.follow()
    assert job.cancels == 1


def test_transient_poll_failures_are_ridden_out_then_lose_track():
    job = ScriptedJob(DONE, errors=[ConnectionError("reset")] * 2)
    assert job.follow().status == DONE and job.polls == 3 and job.cancels == 0

    job = ScriptedJob(DONE, errors=[ConnectionError("reset")] * 5)
    with pytest.raises(gcp.LostTrack, match="after 5 failed polls.*it was cancelled") as error:
        job.follow()
    assert job.cancels == 1 and stepcli.exit_code_for(error.value) == 143


def test_vertex_job_states():
    from google.cloud import aiplatform_v1 as v1

    def status(state, message=""):
        return gcp.vertex_job_status(v1.CustomJob(state=state, error={"message": message}))

    assert status(v1.JobState.JOB_STATE_QUEUED).phase is Phase.RUNNING
    assert status(v1.JobState.JOB_STATE_SUCCEEDED).phase is Phase.SUCCEEDED
    assert status(v1.JobState.JOB_STATE_EXPIRED, "too long").phase is Phase.FAILED
    assert status(v1.JobState.JOB_STATE_FAILED, "oom") == JobStatus("JOB_STATE_FAILED", Phase.FAILED, "oom")
    assert status(v1.JobState.JOB_STATE_CANCELLED).phase is Phase.CANCELLED
    assert set(gcp.jobs.VERTEX_JOB_PHASES) <= {s.name for s in v1.JobState}


@pytest.mark.parametrize("error, code", [
    (gcp.JobStopped("sigterm"), 143), (gcp.QuotaExhausted("429"), 143), (gcp.Unavailable("503"), 143),
    (gcp.LostTrack("polls"), 143), (gcp.JobFailed("failed"), 2), (gcp.JobCancelled("cancelled"), 2),
    (gcp.JobTimedOut("slow"), 2), (gcp.PermissionDenied("403"), 2), (gcp.RegionMismatch("region"), 2),
    (gcp.Rejected("400"), 2), (gcp.RemoteError("?"), 2), (ValueError("bad input"), 2), (KeyError("bug"), 1),
])
def test_exit_codes_follow_the_training_contract(error, code):
    assert stepcli.exit_code_for(error) == code


def test_clients_are_regional_rest_and_anonymous_for_http():
    from google.auth.credentials import AnonymousCredentials

    assert gcp.api_endpoint_for("europe-west4") == "europe-west4-aiplatform.googleapis.com"
    with pytest.raises(gcp.RegionMismatch, match="serves region us-central1, but the location is europe-west4"):
        gcp.api_endpoint_for("europe-west4", "https://us-central1-aiplatform.googleapis.com")
    client = gcp.job_client("us-central1", api_endpoint="http://127.0.0.1:9")
    assert type(client._transport).__name__ == "JobServiceRestTransport"
    assert isinstance(client._transport._credentials, AnonymousCredentials)
    with pytest.raises(ValueError, match="transport"):
        gcp.VertexConnection("p", "us-central1", transport="http")


def test_missing_credentials_say_how_to_provide_them(monkeypatch, tmp_path):
    from google.cloud import aiplatform_v1

    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(tmp_path / "missing.json"))
    with pytest.raises(gcp.PermissionDenied, match="gcloud auth application-default login"):
        gcp.vertex_client(aiplatform_v1.JobServiceClient, "us-central1")


def test_the_accelerator_table_names_real_vertex_types():
    from google.cloud.aiplatform_v1 import AcceleratorType

    assert set(gcp.ACCELERATORS.values()) <= {a.name for a in AcceleratorType}
    assert set(gcp.VERTEX_MACHINES) == set(gcp.ACCELERATORS)
    assert gcp.vertex_machine_type("nvidia-l4", 2) == "g2-standard-24"
    assert gcp.vertex_machine_type("nvidia-l4", 0) == gcp.accelerators.VERTEX_CPU_MACHINE
