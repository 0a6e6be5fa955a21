"""preprocess_runner=dataflow: the Beam pipeline of components/preprocess/beam.py as a Dataflow job.

What runs where: the preprocess step (a small pod) lists the source, writes the numbered inputs beside the output,
builds the job, submits it, prints its console URL and follows it; Dataflow's workers (the project's CPU image as
the SDK container, so their dependencies are the pipeline's) decode and write the shards straight into the step's
output (gs://); when the job has succeeded, the step writes rejected.jsonl, the manifest and the card from the
job's small side outputs, exactly as the in-process runner does.

The job is built offline: Beam's DataflowRunner translates the graph with `dry_run` (no API call, no upload),
the step stages the portable pipeline proto itself (`pipeline.pb` under the staging location: nothing else is
staged, the container holds the code), and submits the `Job` through the Dataflow v1b3 jobs API with the
`google-cloud-dataflow-client` library Beam itself uses (`dataflow_v1beta3.JobsV1Beta3Client`, REST). Owning
create/get/update instead of calling `pipeline.run()` is what lets the job go through components/gcp/jobs.py
`follow_job` like every other remote job (same polling, progress lines, SIGTERM -> cancel, terminal states ->
errors and exit codes), and lets the tests drive it against a loopback stand-in (tests/standins/dataflow.py).
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import re
import time
from typing import Any, Callable

from components.dataio import data
from components.gcp.errors import JobError
from components.gcp.jobs import Followed, JobStatus, Phase, follow_job, sigterm_stops

log = logging.getLogger(__name__)

DATAFLOW_ENDPOINT = "dataflow.googleapis.com"
# The pipeline parameters (components/params.py) a Dataflow run reads, with the setting each fills.
PARAMETERS = {"project": "project", "location": "region", "dataflow_temp_location": "temp_location",
              "dataflow_staging_location": "staging_location", "dataflow_service_account": "service_account",
              "dataflow_network": "network", "dataflow_subnetwork": "subnetwork",
              "dataflow_max_workers": "max_workers", "dataflow_machine_type": "machine_type"}

# Dataflow's JobState by phase; the others (pending, queued, running, cancelling, draining, ...) are running.
JOB_PHASES = {
    "JOB_STATE_DONE": Phase.SUCCEEDED,
    "JOB_STATE_FAILED": Phase.FAILED,
    # Drained: stopped before all input was read, so the dataset would be incomplete.
    "JOB_STATE_DRAINED": Phase.FAILED,
    "JOB_STATE_CANCELLED": Phase.CANCELLED,
    "JOB_STATE_UPDATED": Phase.CANCELLED,  # replaced by another job
}
_PROJECT_RE = re.compile(r"^[a-z][a-z0-9-]{4,28}[a-z0-9]$")
_REGION_RE = re.compile(r"^[a-z]+-[a-z]+\d+$")
_EMAIL_RE = re.compile(r"^[^@\s]+@[^@\s]+\.[^@\s]+$")
_SUBNETWORK_RE = re.compile(r"^(https://www\.googleapis\.com/compute/v1/projects/[^/]+/)?regions/(?P<region>[^/]+)/"
                            r"subnetworks/[^/]+$")


@dataclasses.dataclass
class DataflowSettings:
    """Where and how the Dataflow job runs (the pipeline's project, location and dataflow_* parameters)."""

    project: str
    region: str
    temp_location: str
    staging_location: str = ""  # empty: TEMP_LOCATION/staging
    service_account: str = ""  # empty: the project's Compute Engine default service account
    network: str = ""
    subnetwork: str = ""  # regions/REGION/subnetworks/NAME, or its full URL
    max_workers: int = 0  # 0: Dataflow's autoscaling limit
    machine_type: str = ""  # empty: Dataflow's default
    sdk_container_image: str = ""  # the project's CPU image (pipelines/config.py), set by the pipeline
    api_endpoint: str = DATAFLOW_ENDPOINT  # tests: a stand-in's http://127.0.0.1:PORT
    poll_seconds: float = 30.0

    @classmethod
    def from_parameters(cls, values: dict, **more) -> "DataflowSettings":
        return cls(**{field: values[name] for name, field in PARAMETERS.items() if name in values}, **more)

    @property
    def staging(self) -> str:
        return self.staging_location or data.join(self.temp_location, "staging")

    def problems(self) -> list[str]:
        """What stops a Dataflow job from being built, each naming the parameter to fix."""
        found = []
        if not self.project:
            found.append("project is required with preprocess_runner=dataflow (the Google Cloud project the job "
                         "runs in)")
        elif not _PROJECT_RE.match(self.project):
            found.append(f"project {self.project!r} is not a Google Cloud project ID (6-30 lower-case letters, "
                         "digits and hyphens)")
        if not _REGION_RE.match(self.region or ""):
            found.append(f"location must be a Google Cloud region for Dataflow, e.g. us-central1 (got {self.region!r})")
        if not self.temp_location.startswith("gs://"):
            found.append(f"dataflow_temp_location must be a gs:// folder the job's service account can write (got "
                         f"{self.temp_location!r})")
        if self.staging_location and not self.staging_location.startswith("gs://"):
            found.append(f"dataflow_staging_location must be a gs:// folder (got {self.staging_location!r})")
        if self.service_account and not _EMAIL_RE.match(self.service_account):
            found.append(f"dataflow_service_account must be a service account email, e.g. "
                         f"preprocess@{self.project or 'PROJECT'}.iam.gserviceaccount.com (got "
                         f"{self.service_account!r})")
        if self.subnetwork:
            m = _SUBNETWORK_RE.match(self.subnetwork)
            if not m:
                found.append(f"dataflow_subnetwork must be regions/REGION/subnetworks/NAME or its full URL (got "
                             f"{self.subnetwork!r})")
            elif _REGION_RE.match(self.region or "") and m.group("region") != self.region:
                found.append(f"dataflow_subnetwork is in region {m.group('region')} but the job runs in "
                             f"{self.region} (location)")
        if self.max_workers < 0:
            found.append(f"dataflow_max_workers must be >= 0, 0 for Dataflow's default (got {self.max_workers})")
        if self.machine_type and not re.match(r"^[a-z0-9]+-[a-z0-9-]+$", self.machine_type):
            found.append(f"dataflow_machine_type must be a Compute Engine machine type, e.g. n2-standard-4 (got "
                         f"{self.machine_type!r})")
        return found

    def check(self, *, source: str = "", output_dir: str = "") -> None:
        found = self.problems()
        if not self.sdk_container_image:
            found.append("the workers' container image is not set (the pipeline passes its CPU image)")
        found += location_problems(("data", source), ("the dataset output", output_dir))
        if found:
            raise data.DataError("Cannot run preprocess on Dataflow:\n  " + "\n  ".join(found))

    def pipeline_options(self, job_name: str):
        """Beam's options for this job (DataflowRunner, translated offline with dry_run)."""
        from apache_beam.options.pipeline_options import PipelineOptions

        argv = ["--runner=DataflowRunner", f"--project={self.project}", f"--region={self.region}",
                f"--temp_location={self.temp_location}", f"--staging_location={self.staging}",
                f"--job_name={job_name}", f"--sdk_container_image={self.sdk_container_image}",
                "--sdk_location=container",  # the image holds Beam and the project: nothing to stage but the graph
                "--dry_run=True"]
        optional = {"service_account_email": self.service_account, "network": self.network,
                    "subnetwork": self.subnetwork, "max_num_workers": self.max_workers or "",
                    "machine_type": self.machine_type}
        argv += [f"--{name}={value}" for name, value in optional.items() if value]
        return PipelineOptions(argv)


def parameter_problems(values: dict) -> list[str]:
    """components/params.py's cross-parameter check: Dataflow's settings, when preprocess_runner=dataflow."""
    if values.get("preprocess_runner") != "dataflow":
        return []
    return DataflowSettings.from_parameters(values).problems() + location_problems(("data", values.get("data", "")))


def location_problems(*paths: tuple[str, str]) -> list[str]:
    """(what, path) pairs that Dataflow's workers cannot reach: anything not on gs:// (empty: not given)."""
    return [f"{what} must be on gs:// for preprocess_runner=dataflow: Dataflow's workers cannot read {path} (use "
            "preprocess_runner=local, or copy it to Cloud Storage)" for what, path in paths
            if path and not path.startswith("gs://")]


def job_name_for(output_dir: str) -> str:
    """A Dataflow job name (lower-case letters, digits, hyphens; starts with a letter), unique per run."""
    tail = re.sub(r"[^a-z0-9]+", "-", output_dir.lower()).strip("-")[-30:].strip("-")
    return f"preprocess-{tail}-{time.strftime('%Y%m%d-%H%M%S')}".replace("--", "-")


def console_url(project: str, region: str, job_id: str) -> str:
    return f"https://console.cloud.google.com/dataflow/jobs/{region}/{job_id}?project={project}"


def dataflow_job_status(job: Any) -> JobStatus:
    state = getattr(job.current_state, "name", str(job.current_state))
    return JobStatus(state, JOB_PHASES.get(state, Phase.RUNNING))


class DataflowJobs:
    """Dataflow v1b3 jobs (create, get, cancel) and their error messages, through google-cloud-dataflow-client."""

    def __init__(self, project: str, region: str, *, api_endpoint: str = DATAFLOW_ENDPOINT, credentials: Any = None):
        from google.cloud import dataflow_v1beta3 as dataflow

        from components.gcp.clients import google_client

        self.project, self.region, self.dataflow = project, region, dataflow
        self.jobs = google_client(dataflow.JobsV1Beta3Client, api_endpoint, credentials=credentials)
        self.messages = google_client(dataflow.MessagesV1Beta3Client, api_endpoint, credentials=credentials)

    def create(self, job) -> Any:
        return self.jobs.create_job(request=self.dataflow.CreateJobRequest(
            project_id=self.project, location=self.region, job=job))

    def get(self, job_id: str) -> Any:
        return self.jobs.get_job(request=self.dataflow.GetJobRequest(
            project_id=self.project, location=self.region, job_id=job_id, view=self.dataflow.JobView.JOB_VIEW_SUMMARY))

    def cancel(self, job_id: str) -> Any:
        return self.jobs.update_job(request=self.dataflow.UpdateJobRequest(
            project_id=self.project, location=self.region, job_id=job_id,
            job=self.dataflow.Job(requested_state=self.dataflow.JobState.JOB_STATE_CANCELLED)))

    def errors(self, job_id: str, limit: int = 3) -> list[str]:
        """The job's last error messages (what the console shows under "Errors")."""
        pages = self.messages.list_job_messages(request=self.dataflow.ListJobMessagesRequest(
            project_id=self.project, location=self.region, job_id=job_id,
            minimum_importance=self.dataflow.JobMessageImportance.JOB_MESSAGE_ERROR))
        return [m.message_text for m in pages.job_messages][-limit:]


def build_job(pipeline, settings: DataflowSettings):
    """The Dataflow `Job` of a Beam pipeline, built offline: translated by DataflowRunner (dry run), its pipeline
    proto staged under the staging location, its environment (workers' image, service account, network, workers)
    from the options. Returns (job, the staged pipeline's URL)."""
    from apache_beam.runners.dataflow.internal import apiclient
    from apache_beam.runners.internal import names

    result = pipeline.run()
    job = result.job
    serialized = job.proto_pipeline.SerializeToString()
    url = data.join(settings.staging, names.STAGED_PIPELINE_FILENAME)
    data.gfile().makedirs(settings.staging)
    with data.gfile().GFile(url, "wb") as f:
        f.write(serialized)
    job.proto.environment = apiclient.Environment(
        packages=[], options=job.options, environment_version=apiclient._FNAPI_ENVIRONMENT_MAJOR_VERSION,
        proto_pipeline_staged_url=url, proto_pipeline=job.proto_pipeline,
        pipeline_proto_hash=hashlib.sha256(serialized).hexdigest()).proto
    return job.proto, url


def launch(pipeline, settings: DataflowSettings, jobs: DataflowJobs, *, sleep: Callable[[float], None] | None = None,
           timeout_seconds: float | None = None) -> Followed:
    """Builds, submits and follows the job to its end (see components/gcp/jobs.py follow_job: SIGTERM or a failure
    of this step cancels it); raises a JobError when it does not succeed, quoting Dataflow's error messages."""
    job, _ = build_job(pipeline, settings)
    with sigterm_stops():
        created = jobs.create(job)
        url = console_url(settings.project, settings.region, created.id)
        if created.client_request_id and created.client_request_id != job.client_request_id:
            # A name clash: Dataflow answers with the active job of that name instead of creating ours. Beam's
            # apiclient tells them apart by the clientRequestId it set (apache/beam v2.77.0, sdks/python/
            # apache_beam/runners/dataflow/internal/apiclient.py:476-479 and :911-923); so do we, and neither
            # follow nor cancel a job that is someone else's.
            raise JobError(f"Dataflow did not create the job: there is already an active job named {created.name} "
                           f"({created.id}, {url}), submitted by someone else. It was left alone; run the step "
                           f"again (its job name carries the time) or wait for that job to end.")
        log.info("preprocess: Dataflow job %s (%s) submitted; follow it at %s", created.name, created.id, url)

        def describe(current, status: JobStatus) -> str:
            try:
                errors = jobs.errors(created.id)
            except Exception as e:  # the job's failure is what matters; its messages are a courtesy
                errors = [f"(its error messages could not be read: {e})"]
            said = ("; Dataflow says: " + " | ".join(errors)) if errors else ""
            return f"Dataflow job {created.name} ({created.id}) ended {status.state}{said} (see {url})"

        return follow_job(lambda: jobs.get(created.id), lambda: jobs.cancel(created.id), status=dataflow_job_status,
                          what=f"Dataflow job {created.name} ({created.id})", poll_seconds=settings.poll_seconds,
                          max_poll_seconds=max(settings.poll_seconds, 60.0), job=created, where=url,
                          describe=describe, sleep=sleep, timeout_seconds=timeout_seconds)
