"""Runs and schedules the compiled pipeline on Vertex AI Pipelines.

The input is the YAML that `pipectl compile --target vertex` writes (KFP IR without a kfp-kubernetes platform
config; GPUs as Vertex AI accelerator types). It is sent the way the Vertex AI SDK sends it: the YAML loaded as
the `pipelineSpec` of a `PipelineJob`, with `runtimeConfig.gcsOutputDirectory` (the pipeline root) and
`runtimeConfig.parameterValues`. The clients are the generated `google.cloud.aiplatform_v1` PipelineServiceClient
and ScheduleServiceClient, built and called through the Google Cloud layer (components/gcp/: regional endpoint,
REST transport, one retry policy), imported lazily; nothing here touches `aiplatform.init`'s global state, so two
projects or regions can be used side by side.

- `submit_pipeline_job(...)` creates a PipelineJob and, with `wait=True`, follows it to a terminal state with
  the layer's `follow_job` (`PipelineJobFailed` names the failed tasks and the console page). The run is only
  watched: interrupting or timing out the watcher never cancels it.
- `schedule_pipeline_job(...)` keeps one PipelineJobSchedule per name (the pipeline name by default): it creates
  it, or updates the existing one in place (`UpdateSchedule`), so re-deploying never leaves two schedules running.
  `pause_schedule`, `resume_schedule`, `delete_schedule` and `find_schedules` work by that name.

Everything a user can get wrong is checked before the first request (pipelines/vertexai/vertex_checks.py: a gs://
pipeline root, parameter names and types against the pipeline's inputs, a service account email, a YAML compiled for
Vertex AI; pipelines/cron.py: a 5-field cron with an optional `TZ=` prefix). Refusals from the API come back as
`VertexPipelineError`s (the layer's `RemoteError`) that say what to do, e.g. a 403 names `roles/aiplatform.user`
and, for the run-as service account, `roles/iam.serviceAccountUser`.

Production: `VertexPipelines(project="my-project", location="us-central1")` uses Application Default Credentials
and `https://us-central1-aiplatform.googleapis.com`. Tests pass `api_endpoint="http://127.0.0.1:PORT"` (an http://
endpoint gets anonymous credentials).
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import logging
import random
import re
import time
from typing import Any, Callable

from components import gcp
from pipelines.cron import parse_cron
from pipelines.vertexai.vertex_checks import (JOB_ID_RE, check_labels, check_service_account, load_pipeline_spec,
                                     make_job_id, runtime_config, set_caching)
from pipelines.vertexai.vertex_checks import vertex_run_parameters  # noqa: F401  (pipectl's entry to the checks)

log = logging.getLogger(__name__)

CONSOLE_RUN_URL = "https://console.cloud.google.com/vertex-ai/locations/{location}/pipelines/runs/{job_id}?project={project}"
CONSOLE_SCHEDULE_URL = ("https://console.cloud.google.com/vertex-ai/locations/{location}/pipelines/schedules/"
                        "{schedule_id}?project={project}")

# Pipeline states by phase (PAUSED ends a wait, as the Vertex AI SDK counts it); the others are still running.
PIPELINE_PHASES = {
    "PIPELINE_STATE_SUCCEEDED": gcp.Phase.SUCCEEDED,
    "PIPELINE_STATE_FAILED": gcp.Phase.FAILED,
    "PIPELINE_STATE_CANCELLED": gcp.Phase.CANCELLED,
    "PIPELINE_STATE_PAUSED": gcp.Phase.CANCELLED,
}

# The layer's errors (one family, one set of exit codes), under the names callers catch.
VertexPipelineError = gcp.RemoteError
VertexPermissionError = gcp.PermissionDenied


class PipelineJobFailed(gcp.JobFailed):
    """The pipeline job ended in another state than SUCCEEDED; `run` is its last state."""

    @property
    def run(self) -> "PipelineRun":
        return self.job


class ScheduleNotFound(gcp.RemoteError, LookupError):
    pass


@dataclasses.dataclass(frozen=True)
class PipelineRun:
    """A Vertex AI PipelineJob as pipectl reports it."""

    name: str  # projects/NUMBER/locations/REGION/pipelineJobs/JOB_ID
    job_id: str
    display_name: str
    state: str  # PIPELINE_STATE_PENDING, ..._RUNNING, ..._SUCCEEDED, ..._FAILED, ...
    console_url: str
    error: str = ""
    failed_tasks: tuple[str, ...] = ()
    schedule: str = ""  # the schedule that started it, if any

    @property
    def done(self) -> bool:
        return self.state in PIPELINE_PHASES

    def status(self) -> gcp.JobStatus:
        return gcp.JobStatus(self.state, PIPELINE_PHASES.get(self.state, gcp.Phase.RUNNING), self.error)

    def to_json(self) -> dict:
        return dataclasses.asdict(self) | {"failed_tasks": list(self.failed_tasks)}


@dataclasses.dataclass(frozen=True)
class ScheduleInfo:
    """A Vertex AI PipelineJobSchedule, and what `schedule_pipeline_job` did to it."""

    name: str  # projects/NUMBER/locations/REGION/schedules/ID
    display_name: str
    state: str  # ACTIVE, PAUSED, COMPLETED
    cron: str
    next_run_time: str
    console_url: str
    action: str = ""  # created | updated | replaced | paused | resumed | deleted | unchanged
    removed: tuple[str, ...] = ()  # other schedules of the same name that were deleted

    def to_json(self) -> dict:
        return dataclasses.asdict(self) | {"removed": list(self.removed)}


def _short_id(resource_name: str) -> str:
    return resource_name.rsplit("/", 1)[-1]


# ---------------------------------------------------------------------------------------------- client


class VertexPipelines(gcp.VertexService):
    """Vertex AI Pipelines in one project and region: runs and schedules."""

    def __init__(self, project: str, location: str, *, api_endpoint: str | None = None, credentials: Any = None,
                 transport: str = "rest", pipeline_client: Any = None, schedule_client: Any = None,
                 sleep: Callable[[float], None] = time.sleep, monotonic: Callable[[], float] = time.monotonic,
                 max_attempts: int = 5, initial_backoff_s: float = 2.0, max_backoff_s: float = 60.0,
                 uniform: Callable[[float, float], float] = random.uniform):
        """
        project, location: where the runs and schedules live (`projects/{project}/locations/{location}`).
        api_endpoint, credentials, transport: where and how calls go (see components/gcp/clients.py); a
            regional endpoint of another region than `location` is refused.
        pipeline_client, schedule_client: ready `aiplatform_v1` clients, instead of building them.
        sleep, monotonic: injectable clock for waiting on runs and backing off on quota refusals.
        max_attempts, initial_backoff_s, max_backoff_s, uniform: the retry policy (components/gcp/retry.py);
            `uniform` draws each wait's jitter.
        """
        if not project:
            raise ValueError("A Google Cloud project is needed (--project).")
        if not location or location == "global" or not re.fullmatch(r"[a-z]+-[a-z]+\d+", location):
            raise ValueError(f"Vertex AI Pipelines needs a region such as us-central1 (--region), got {location!r}.")
        super().__init__(project, location, api_endpoint=api_endpoint, credentials=credentials, transport=transport,
                         retry=gcp.RetryPolicy(max(1, max_attempts), initial_backoff_s, max_backoff_s, sleep, uniform),
                         monotonic=monotonic)
        self._pipeline_client = pipeline_client
        self._schedule_client = schedule_client

    # -- plumbing --------------------------------------------------------------------------------------

    @property
    def pipeline_client(self):
        if self._pipeline_client is None:
            from google.cloud.aiplatform_v1.services.pipeline_service import PipelineServiceClient

            self._pipeline_client = self.vertex.client(PipelineServiceClient)
        return self._pipeline_client

    @property
    def schedule_client(self):
        if self._schedule_client is None:
            from google.cloud.aiplatform_v1.services.schedule_service import ScheduleServiceClient

            self._schedule_client = self.vertex.client(ScheduleServiceClient)
        return self._schedule_client

    def _call(self, what: str, fn: Callable[[], Any], *, service_account: str = "", idempotent: bool = False) -> Any:
        """`fn()` under the layer's retry policy; an id already taken (409) says to pick another."""
        from google.api_core import exceptions as gexc

        try:
            return self.vertex.call(what, fn, idempotent=idempotent, service_account=service_account)
        except gexc.Conflict as e:
            raise VertexPipelineError(f"Could not {what}: {e.message} Pick another id (--job-id), or leave it out "
                                      f"to get a fresh one.") from e

    def _run(self, job: Any) -> PipelineRun:
        job_id = _short_id(job.name)
        failed = tuple(t.task_name for t in job.job_detail.task_details if t.state.name == "FAILED")
        return PipelineRun(
            name=job.name, job_id=job_id, display_name=job.display_name, state=job.state.name,
            console_url=CONSOLE_RUN_URL.format(location=self.location, job_id=job_id, project=self.project),
            error=job.error.message if job.error and job.error.message else "", failed_tasks=failed,
            schedule=job.schedule_name)

    def _schedule_info(self, schedule: Any, action: str = "", removed: tuple[str, ...] = ()) -> ScheduleInfo:
        return ScheduleInfo(
            name=schedule.name, display_name=schedule.display_name, state=schedule.state.name, cron=schedule.cron,
            next_run_time=gcp.rfc3339(schedule.next_run_time), action=action, removed=removed,
            console_url=CONSOLE_SCHEDULE_URL.format(location=self.location, schedule_id=_short_id(schedule.name),
                                                    project=self.project))

    def pipeline_job(self, package_path: str, *, pipeline_root: str | None, parameter_values: dict | None = None,
                     display_name: str | None = None, service_account: str | None = None,
                     labels: dict | None = None, enable_caching: bool | None = None, network: str | None = None):
        """The `aiplatform_v1.PipelineJob` for a compiled package (checked; nothing sent)."""
        return self._prepare(package_path, pipeline_root=pipeline_root, parameter_values=parameter_values,
                             display_name=display_name, service_account=service_account, labels=labels,
                             enable_caching=enable_caching, network=network)[0]

    def _prepare(self, package_path: str, *, pipeline_root: str | None, parameter_values: dict | None,
                 display_name: str | None, service_account: str | None, labels: dict | None,
                 enable_caching: bool | None, network: str | None) -> tuple[Any, str]:
        from google.cloud import aiplatform_v1

        spec = load_pipeline_spec(package_path)
        config = runtime_config(spec, pipeline_root, parameter_values)
        if service_account:
            check_service_account(service_account)
        job = aiplatform_v1.PipelineJob(
            display_name=display_name or spec["pipelineInfo"]["name"],
            pipeline_spec=set_caching(spec, enable_caching),
            runtime_config=aiplatform_v1.PipelineJob.RuntimeConfig(
                gcs_output_directory=config["gcsOutputDirectory"], parameter_values=config["parameterValues"]),
            labels=check_labels(labels))
        if service_account:
            job.service_account = service_account
        if network:
            job.network = network
        return job, spec["pipelineInfo"]["name"]

    # -- runs ------------------------------------------------------------------------------------------

    def submit(self, package_path: str, *, pipeline_root: str | None, parameter_values: dict | None = None,
               service_account: str | None = None, display_name: str | None = None, job_id: str | None = None,
               enable_caching: bool | None = None, labels: dict | None = None, network: str | None = None,
               wait: bool = False, poll_seconds: float = 5.0, timeout_seconds: float | None = None) -> PipelineRun:
        """Creates a PipelineJob from the compiled package; with `wait`, follows it to the end (see `wait`)."""
        job, pipeline_name = self._prepare(
            package_path, pipeline_root=pipeline_root, parameter_values=parameter_values, display_name=display_name,
            service_account=service_account, labels=labels, enable_caching=enable_caching, network=network)
        job_id = job_id or make_job_id(pipeline_name)
        if not JOB_ID_RE.match(job_id):
            raise ValueError(f"Invalid job id {job_id!r}: Vertex AI takes at most 127 characters of a-z, 0-9 and '-', "
                             f"starting with a letter.")
        created = self._call(f"create pipeline job {job_id}", lambda: self.pipeline_client.create_pipeline_job(
            parent=self.parent, pipeline_job=job, pipeline_job_id=job_id), service_account=service_account or "")
        run = self._run(created)
        log.info("submitted %s: %s", run.name, run.console_url)
        return self.wait(run.name, poll_seconds=poll_seconds, timeout_seconds=timeout_seconds) if wait else run

    def get_run(self, name: str) -> PipelineRun:
        name = name if "/" in name else f"{self.parent}/pipelineJobs/{name}"
        return self._run(self._call(f"get pipeline job {_short_id(name)}",
                                    lambda: self.pipeline_client.get_pipeline_job(name=name), idempotent=True))

    def wait(self, name: str, *, poll_seconds: float = 5.0, max_poll_seconds: float = 60.0,
             timeout_seconds: float | None = None) -> PipelineRun:
        """Follows a run until it ends, polling less often as it goes on. Returns it when it SUCCEEDED; raises
        `PipelineJobFailed` (failed tasks, error, console page) for FAILED, CANCELLED or PAUSED, and
        `components.gcp.JobTimedOut` (a TimeoutError) after `timeout_seconds`. The run is watched, not owned: a
        timeout or an interrupted watcher leaves it running. Transient errors while polling are retried."""
        name = name if "/" in name else f"{self.parent}/pipelineJobs/{name}"
        job_id = _short_id(name)

        def failure(run: PipelineRun, status: gcp.JobStatus) -> str:
            tasks = f" Failed tasks: {', '.join(run.failed_tasks)}." if run.failed_tasks else ""
            return (f"Pipeline run {run.job_id} ended {run.state.removeprefix('PIPELINE_STATE_')}.{tasks} {run.error} "
                    f"Logs and task details: {run.console_url}").replace("  ", " ")

        try:
            followed = gcp.follow_job(
                lambda: self.get_run(name), None, status=PipelineRun.status, what=f"Pipeline run {job_id}",
                poll_seconds=poll_seconds, max_poll_seconds=max_poll_seconds, timeout_seconds=timeout_seconds,
                where=CONSOLE_RUN_URL.format(location=self.location, job_id=job_id, project=self.project),
                describe=failure, sleep=self._sleep, monotonic=self._monotonic)
        except gcp.JobEnded as e:
            raise PipelineJobFailed(str(e), e.job, e.status) from None
        return followed.job

    # -- schedules -------------------------------------------------------------------------------------

    def find_schedules(self, name: str) -> list:
        """The schedules with display name `name` (`aiplatform_v1.Schedule`), oldest first."""
        if not name:
            raise ValueError("A schedule name is needed.")
        escaped = name.replace("\\", "\\\\").replace('"', '\\"')
        schedules = self._call(f"list schedules named {name!r}", lambda: list(self.schedule_client.list_schedules(
            request={"parent": self.parent, "filter": f'display_name="{escaped}"', "order_by": "create_time"})),
            idempotent=True)
        return sorted((s for s in schedules if s.display_name == name), key=lambda s: gcp.rfc3339(s.create_time))

    def schedule(self, package_path: str, *, cron: str, pipeline_root: str | None, name: str | None = None,
                 parameter_values: dict | None = None, service_account: str | None = None,
                 max_concurrent_run_count: int = 1, allow_queueing: bool = False, max_run_count: int | None = None,
                 start_time: _dt.datetime | None = None, end_time: _dt.datetime | None = None,
                 enable_caching: bool | None = None, labels: dict | None = None,
                 network: str | None = None) -> ScheduleInfo:
        """Creates the schedule `name` (default: the pipeline's name) or updates it in place.

        An existing schedule keeps its id, history and state (a PAUSED one stays paused) and gets the new cron,
        pipeline, parameters and run settings through `UpdateSchedule`. Should the API refuse the update
        (INVALID_ARGUMENT or FAILED_PRECONDITION, whatever its message says), the old one is paused, a new one is
        created, then the old one is deleted (`action="replaced"`); a refused create resumes the old one. Other
        schedules with the same name (made by hand) are deleted, so one remains."""
        cron = parse_cron(cron).text
        if max_concurrent_run_count < 1:
            raise ValueError("max_concurrent_run_count must be at least 1")
        if max_run_count is not None and max_run_count < 1:
            raise ValueError("max_run_count must be at least 1")
        job, pipeline_name = self._prepare(
            package_path, pipeline_root=pipeline_root, parameter_values=parameter_values, display_name=name,
            service_account=service_account, labels=labels, enable_caching=enable_caching, network=network)
        name = name or pipeline_name
        if len(name) > 128:
            raise ValueError(f"A schedule name holds at most 128 characters, got {len(name)}.")
        from google.cloud import aiplatform_v1

        schedule = aiplatform_v1.Schedule(
            display_name=name, cron=cron, max_concurrent_run_count=max_concurrent_run_count,
            allow_queueing=allow_queueing,
            create_pipeline_job_request=aiplatform_v1.CreatePipelineJobRequest(parent=self.parent, pipeline_job=job))
        mask = ["cron", "max_concurrent_run_count", "allow_queueing", "create_pipeline_job_request"]
        for field, value in (("max_run_count", max_run_count), ("start_time", start_time), ("end_time", end_time)):
            if value is not None:
                setattr(schedule, field, value)
                mask.append(field)
        sa = service_account or ""

        existing = self.find_schedules(name)
        completed = [s for s in existing if s.state.name == "COMPLETED"]
        live = [s for s in existing if s.state.name != "COMPLETED"]
        removed = []
        for old in completed:  # a completed schedule starts nothing more; it only holds the name
            self._delete(old.name)
            removed.append(old.name)
        if not live:
            created = self._call(f"create schedule {name!r}", lambda: self.schedule_client.create_schedule(
                parent=self.parent, schedule=schedule), service_account=sa)
            log.info("created schedule %s (%s)", created.name, cron)
            return self._schedule_info(created, "created", tuple(removed))

        target, duplicates = live[0], live[1:]
        schedule.name = target.name
        from google.api_core import exceptions as gexc
        from google.protobuf import field_mask_pb2

        try:
            result = self._call(f"update schedule {name!r}", lambda: self.schedule_client.update_schedule(
                schedule=schedule, update_mask=field_mask_pb2.FieldMask(paths=mask)), service_account=sa)
            action = "updated"
        except VertexPipelineError as e:
            # Decided by the status, never by the wording of the message, which the API does not promise: any
            # INVALID_ARGUMENT / FAILED_PRECONDITION on the update (e.g. a service that will not swap the pipeline
            # of a schedule) goes the replacement way, where CreateSchedule validates the same schedule afresh. If
            # that refuses it too, the old schedule is resumed and the create's error, the user's to fix, raised.
            if not isinstance(e.__cause__, (gexc.BadRequest, gexc.FailedPrecondition)):
                raise
            # Replace the schedule without two ever running together.
            log.warning("Vertex AI refused to update schedule %s in place (%s); replacing it", target.name,
                        e.__cause__.message)
            if target.state.name == "ACTIVE":
                self._call(f"pause schedule {target.name}", lambda: self.schedule_client.pause_schedule(
                    name=target.name))
            schedule.name = ""
            try:
                result = self._call(f"create schedule {name!r}", lambda: self.schedule_client.create_schedule(
                    parent=self.parent, schedule=schedule), service_account=sa)
            except VertexPipelineError:
                if target.state.name == "ACTIVE":
                    self._call(f"resume schedule {target.name}", lambda: self.schedule_client.resume_schedule(
                        name=target.name))
                raise
            if target.state.name == "PAUSED":  # keep the user's pause
                self._call(f"pause schedule {result.name}", lambda: self.schedule_client.pause_schedule(
                    name=result.name))
                result = self._call("get schedule", lambda: self.schedule_client.get_schedule(name=result.name),
                                    idempotent=True)
            self._delete(target.name)
            removed.append(target.name)
            action = "replaced"
        for duplicate in duplicates:
            log.warning("deleting schedule %s: another schedule named %r (only one is kept)", duplicate.name, name)
            self._delete(duplicate.name)
            removed.append(duplicate.name)
        log.info("%s schedule %s (%s)", action, result.name, cron)
        return self._schedule_info(result, action, tuple(removed))

    def _delete(self, schedule_name: str) -> None:
        from google.api_core import exceptions as gexc

        try:
            operation = self._call(f"delete schedule {schedule_name}",
                                   lambda: self.schedule_client.delete_schedule(name=schedule_name))
            operation.result(timeout=300)
        except gexc.NotFound:
            pass  # gone already: what we wanted

    def _named(self, name: str) -> list:
        schedules = self.find_schedules(name)
        if not schedules:
            raise ScheduleNotFound(f"No Vertex AI schedule named {name!r} in {self.parent}; create it with "
                                   f"`pipectl schedule --vertex --cron ...`.")
        return schedules

    def pause(self, name: str) -> list[ScheduleInfo]:
        """Pauses the schedule(s) named `name`; already paused or completed ones are left as they are."""
        results = []
        for schedule in self._named(name):
            if schedule.state.name != "ACTIVE":
                results.append(self._schedule_info(schedule, "unchanged"))
                continue
            self._call(f"pause schedule {name!r}", lambda: self.schedule_client.pause_schedule(name=schedule.name))
            fresh = self._call(f"get schedule {name!r}", lambda: self.schedule_client.get_schedule(name=schedule.name),
                               idempotent=True)
            results.append(self._schedule_info(fresh, "paused"))
        return results

    def resume(self, name: str, *, catch_up: bool = False) -> list[ScheduleInfo]:
        """Resumes the paused schedule(s) named `name`; `catch_up` also starts the runs missed while paused."""
        results = []
        for schedule in self._named(name):
            if schedule.state.name != "PAUSED":
                results.append(self._schedule_info(schedule, "unchanged"))
                continue
            self._call(f"resume schedule {name!r}", lambda: self.schedule_client.resume_schedule(
                name=schedule.name, catch_up=catch_up))
            fresh = self._call(f"get schedule {name!r}", lambda: self.schedule_client.get_schedule(name=schedule.name),
                               idempotent=True)
            results.append(self._schedule_info(fresh, "resumed"))
        return results

    def delete(self, name: str) -> list[ScheduleInfo]:
        """Deletes the schedule(s) named `name` (runs already started go on)."""
        results = []
        for schedule in self._named(name):
            self._delete(schedule.name)
            results.append(self._schedule_info(schedule, "deleted"))
        return results


# ---------------------------------------------------------------------------------------------- functions


def _connection(project: str, location: str, api_endpoint: str | None, credentials: Any,
                **kwargs) -> VertexPipelines:
    return VertexPipelines(project, location, api_endpoint=api_endpoint, credentials=credentials, **kwargs)


def submit_pipeline_job(package_path: str, *, project: str, location: str, pipeline_root: str | None,
                        parameter_values: dict | None = None, service_account: str | None = None,
                        display_name: str | None = None, job_id: str | None = None,
                        enable_caching: bool | None = None, labels: dict | None = None, network: str | None = None,
                        api_endpoint: str | None = None, credentials: Any = None, wait: bool = False,
                        poll_seconds: float = 5.0, timeout_seconds: float | None = None,
                        **client_kwargs) -> PipelineRun:
    """Submits the compiled pipeline as a Vertex AI PipelineJob (see `VertexPipelines.submit`)."""
    return _connection(project, location, api_endpoint, credentials, **client_kwargs).submit(
        package_path, pipeline_root=pipeline_root, parameter_values=parameter_values, service_account=service_account,
        display_name=display_name, job_id=job_id, enable_caching=enable_caching, labels=labels, network=network,
        wait=wait, poll_seconds=poll_seconds, timeout_seconds=timeout_seconds)


def schedule_pipeline_job(package_path: str, *, cron: str, project: str, location: str, pipeline_root: str | None,
                          name: str | None = None, parameter_values: dict | None = None,
                          service_account: str | None = None, max_concurrent_run_count: int = 1,
                          allow_queueing: bool = False, max_run_count: int | None = None,
                          start_time: _dt.datetime | None = None, end_time: _dt.datetime | None = None,
                          enable_caching: bool | None = None, labels: dict | None = None, network: str | None = None,
                          api_endpoint: str | None = None, credentials: Any = None, **client_kwargs) -> ScheduleInfo:
    """Creates or updates the one PipelineJobSchedule named `name` (see `VertexPipelines.schedule`)."""
    return _connection(project, location, api_endpoint, credentials, **client_kwargs).schedule(
        package_path, cron=cron, pipeline_root=pipeline_root, name=name, parameter_values=parameter_values,
        service_account=service_account, max_concurrent_run_count=max_concurrent_run_count,
        allow_queueing=allow_queueing, max_run_count=max_run_count, start_time=start_time, end_time=end_time,
        enable_caching=enable_caching, labels=labels, network=network)


def pause_schedule(name: str, *, project: str, location: str, api_endpoint: str | None = None,
                   credentials: Any = None, **client_kwargs) -> list[ScheduleInfo]:
    return _connection(project, location, api_endpoint, credentials, **client_kwargs).pause(name)


def resume_schedule(name: str, *, project: str, location: str, catch_up: bool = False,
                    api_endpoint: str | None = None, credentials: Any = None, **client_kwargs) -> list[ScheduleInfo]:
    return _connection(project, location, api_endpoint, credentials, **client_kwargs).resume(name, catch_up=catch_up)


def delete_schedule(name: str, *, project: str, location: str, api_endpoint: str | None = None,
                    credentials: Any = None, **client_kwargs) -> list[ScheduleInfo]:
    return _connection(project, location, api_endpoint, credentials, **client_kwargs).delete(name)
