"""Runs and schedules the compiled pipeline on Vertex AI Pipelines.

The input is the YAML that `pipectl compile --target vertex` writes (KFP IR without a kfp-kubernetes platform
config; GPUs as Vertex AI accelerator types). It is sent the way the Vertex AI SDK sends it: the YAML loaded as
the `pipelineSpec` of a `PipelineJob`, with `runtimeConfig.gcsOutputDirectory` (the pipeline root) and
`runtimeConfig.parameterValues`. The clients are the generated `google.cloud.aiplatform_v1` PipelineServiceClient
and ScheduleServiceClient (REST transport by default), imported lazily; nothing here touches `aiplatform.init`'s
global state, so two projects or regions can be used side by side.

- `submit_pipeline_job(...)` creates a PipelineJob and, with `wait=True`, follows it to a terminal state
  (`PipelineJobFailed` names the failed tasks and the console page).
- `schedule_pipeline_job(...)` keeps one PipelineJobSchedule per name (the pipeline name by default): it creates
  it, or updates the existing one in place (`UpdateSchedule`), so re-deploying never leaves two schedules running.
  `pause_schedule`, `resume_schedule`, `delete_schedule` and `find_schedules` work by that name.

Everything a user can get wrong is checked before the first request (a gs:// pipeline root, a 5-field cron with
an optional `TZ=` prefix, parameter names and types against the pipeline's inputs, a service account email, a
YAML compiled for Vertex AI). Refusals from the API come back as `VertexPipelineError`s that say what to do, e.g. a
403 names `roles/aiplatform.user` and, for the run-as service account, `roles/iam.serviceAccountUser`.

Production: `VertexPipelines(project="my-project", location="us-central1")` uses Application Default Credentials
and `https://us-central1-aiplatform.googleapis.com`. Tests pass `api_endpoint="http://127.0.0.1:PORT"` and
`credentials=AnonymousCredentials()`.
"""

from __future__ import annotations

import copy
import dataclasses
import datetime as _dt
import logging
import re
import time
from typing import Any, Callable

log = logging.getLogger(__name__)

REQUIRED_ROLE = "roles/aiplatform.user"
ACT_AS_ROLE = "roles/iam.serviceAccountUser"
CONSOLE_RUN_URL = "https://console.cloud.google.com/vertex-ai/locations/{location}/pipelines/runs/{job_id}?project={project}"
CONSOLE_SCHEDULE_URL = ("https://console.cloud.google.com/vertex-ai/locations/{location}/pipelines/schedules/"
                        "{schedule_id}?project={project}")

JOB_ID_RE = re.compile(r"^[a-z][-a-z0-9]{0,127}$")
GCS_URI_RE = re.compile(r"^gs://(?P<bucket>[a-z0-9][a-z0-9._-]{1,221}[a-z0-9])(?:/(?P<path>.*))?$")
SERVICE_ACCOUNT_RE = re.compile(r"^[^@\s]+@[^@\s]+\.gserviceaccount\.com$")
ENDPOINT_REGION_RE = re.compile(r"^(?:https?://)?(?P<region>[a-z]+-[a-z]+\d+)-aiplatform\.googleapis\.com(?::\d+)?/?$")
LABEL_KEY_RE = re.compile(r"^[a-z][a-z0-9_-]{0,62}$")
LABEL_VALUE_RE = re.compile(r"^[a-z0-9_-]{0,63}$")

SUCCEEDED = "PIPELINE_STATE_SUCCEEDED"
# The states after which a job does not change any more (PAUSED as the Vertex AI SDK counts it).
TERMINAL_STATES = ("PIPELINE_STATE_SUCCEEDED", "PIPELINE_STATE_FAILED", "PIPELINE_STATE_CANCELLED",
                   "PIPELINE_STATE_PAUSED")

# Cron fields: name, lowest and highest value, names allowed in place of numbers.
_CRON_FIELDS = (
    ("minute", 0, 59, ()), ("hour", 0, 23, ()), ("day of month", 1, 31, ()),
    ("month", 1, 12, ("JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC")),
    ("day of week", 0, 7, ("SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT")),
)
_CRON_TZ_RE = re.compile(r"^(?:CRON_TZ|TZ)=(?P<zone>\S+)\s+(?P<rest>.*)$")
_TRANSIENT_RETRIES = 5


class VertexPipelineError(RuntimeError):
    """A Vertex AI Pipelines call failed; the message says what to do about it."""


class VertexPermissionError(VertexPipelineError, PermissionError):
    pass


class PipelineJobFailed(VertexPipelineError):
    """The pipeline job ended in another state than SUCCEEDED; `run` is its last state."""

    def __init__(self, message: str, run: "PipelineRun"):
        super().__init__(message)
        self.run = run


class ScheduleNotFound(VertexPipelineError, LookupError):
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
        return self.state in TERMINAL_STATES

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


# ---------------------------------------------------------------------------------------------- checks


def check_pipeline_root(pipeline_root: str) -> str:
    """The pipeline root as Vertex AI takes it: a gs:// path (a bucket the pipeline's service account can write)."""
    root = (pipeline_root or "").strip()
    if not GCS_URI_RE.match(root):
        raise ValueError(
            f"The pipeline root must be a Cloud Storage path gs://BUCKET[/PATH] (Vertex AI Pipelines writes every "
            f"artifact there; bucket names are 3-63 characters of a-z, 0-9, '-', '_' and '.'), got "
            f"{pipeline_root!r}. Use a bucket in the run's region that the pipeline's service "
            f"account can write (roles/storage.objectAdmin on the bucket).")
    return root.rstrip("/")


def check_cron(cron: str) -> str:
    """A standard 5-field cron (minute hour day-of-month month day-of-week), optionally after `TZ=Area/City ` or
    `CRON_TZ=Area/City ` (without it, Vertex AI reads the cron in UTC)."""
    import zoneinfo

    text = " ".join((cron or "").split())
    m = _CRON_TZ_RE.match(text)
    body = text
    if m:
        zone = m.group("zone")
        try:
            zoneinfo.ZoneInfo(zone)
        except (zoneinfo.ZoneInfoNotFoundError, ValueError):
            raise ValueError(f"Unknown time zone {zone!r} in cron {cron!r}; use an IANA name such as "
                             f"TZ=America/New_York or TZ=Europe/Berlin.") from None
        body = m.group("rest")
    fields = body.split()
    if len(fields) != 5:
        hint = " (6-field crons with seconds, and @daily-style macros, are not accepted)" if fields else ""
        raise ValueError(f"Invalid cron {cron!r}: expected 5 fields, minute hour day-of-month month day-of-week, "
                         f"e.g. '0 3 * * *' or 'TZ=Europe/Berlin 0 3 * * MON-FRI'{hint}.")
    for value, (what, low, high, names) in zip(fields, _CRON_FIELDS):
        for item in value.split(","):
            spec, slash, step = item.partition("/")
            if slash and not (step.isdigit() and int(step) > 0):
                raise ValueError(f"Invalid cron {cron!r}: bad step {item!r} in the {what} field.")
            if spec == "*":
                continue
            bounds = spec.split("-")
            if len(bounds) > 2:
                raise ValueError(f"Invalid cron {cron!r}: bad range {item!r} in the {what} field.")
            numbers = []
            for bound in bounds:
                if bound.upper() in names:
                    numbers.append(names.index(bound.upper()) + low)
                elif bound.isdigit() and low <= int(bound) <= high:
                    numbers.append(int(bound))
                else:
                    raise ValueError(f"Invalid cron {cron!r}: {bound!r} in the {what} field is not in {low}-{high}"
                                     + (f" or {names[0]}-{names[-1]}" if names else "") + ".")
            if len(numbers) == 2 and numbers[0] > numbers[1]:
                raise ValueError(f"Invalid cron {cron!r}: the range {item!r} in the {what} field runs backwards.")
    return text


def check_service_account(service_account: str) -> str:
    if not SERVICE_ACCOUNT_RE.match(service_account or ""):
        raise ValueError(f"The service account must be an email such as "
                         f"pipelines@PROJECT.iam.gserviceaccount.com, got {service_account!r}.")
    return service_account


def check_labels(labels: dict | None) -> dict:
    labels = dict(labels or {})
    for key, value in labels.items():
        if not LABEL_KEY_RE.match(str(key)) or not isinstance(value, str) or not LABEL_VALUE_RE.match(value):
            raise ValueError(f"Invalid label {key}={value!r}: keys start with a lowercase letter; keys and values hold "
                             f"at most 63 lowercase letters, digits, '_' and '-'.")
    return labels


def load_pipeline_spec(package_path: str) -> dict:
    """The compiled pipeline (KFP IR YAML or JSON, or a PipelineJob JSON) as the `pipelineSpec` dict to send.

    Refuses a package compiled for KFP on GKE: Vertex AI Pipelines takes no kfp-kubernetes platform config, and
    GPUs must be requested as Vertex AI accelerator types."""
    import yaml

    try:
        with open(package_path) as f:
            # libyaml's loader when PyYAML has it: the pure-Python one takes about a second on this spec.
            documents = [d for d in yaml.load_all(f, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
                         if d is not None]
    except FileNotFoundError:
        raise ValueError(f"No compiled pipeline at {package_path}; write it with `pipectl compile --target vertex "
                         f"-o {package_path}`.") from None
    except yaml.YAMLError as e:
        raise ValueError(f"{package_path} is not a compiled pipeline (YAML/JSON): {e}") from None
    compile_hint = f"recompile it with `pipectl compile --target vertex -o {package_path}`"
    if len(documents) != 1 or not isinstance(documents[0], dict):
        platforms = [d for d in documents[1:] if isinstance(d, dict) and "platforms" in d]
        if platforms:
            raise ValueError(f"{package_path} carries a Kubernetes platform config (node selectors, tolerations: "
                             f"compiled with --target kfp), which Vertex AI Pipelines does not take; {compile_hint}.")
        raise ValueError(f"{package_path} must hold one pipeline spec document, found {len(documents)}.")
    document = documents[0]
    spec = document.get("pipelineSpec", document)  # a PipelineJob JSON carries the spec under pipelineSpec
    if not isinstance(spec, dict) or not (spec.get("pipelineInfo") or {}).get("name") or "root" not in spec:
        raise ValueError(f"{package_path} is not a compiled KFP pipeline (no pipelineInfo.name / root).")
    from google.cloud.aiplatform_v1.types import AcceleratorType

    vertex_accelerators = {a.name for a in AcceleratorType if a.name != "ACCELERATOR_TYPE_UNSPECIFIED"}
    for name, executor in ((spec.get("deploymentSpec") or {}).get("executors") or {}).items():
        accelerator = (((executor.get("container") or {}).get("resources") or {}).get("accelerator")) or {}
        kind = accelerator.get("resourceType") or accelerator.get("type")
        if kind and kind not in vertex_accelerators:
            raise ValueError(f"Executor {name} in {package_path} asks for accelerator {kind!r}, which is not a Vertex AI "
                             f"accelerator type (NVIDIA_TESLA_T4, NVIDIA_H100_80GB, ...); {compile_hint}.")
    return spec


def pipeline_parameters(spec: dict) -> dict[str, dict]:
    """The pipeline's input parameters: name -> {"parameterType", "defaultValue"?, "isOptional"?}."""
    return dict(((spec.get("root") or {}).get("inputDefinitions") or {}).get("parameters") or {})


def runtime_config(spec: dict, pipeline_root: str | None, parameter_values: dict | None) -> dict:
    """`runtimeConfig` for the job: the pipeline root and the parameter values, checked against the pipeline's
    inputs (names, types, required ones), as the Vertex AI SDK's runtime-config builder does."""
    root = pipeline_root or spec.get("defaultPipelineRoot")
    if not root:
        raise ValueError("A pipeline root is needed: pass --pipeline-root gs://BUCKET/PATH (a bucket in the run's "
                         "region that the pipeline's service account can write, roles/storage.objectAdmin).")
    root = check_pipeline_root(root)
    declared = pipeline_parameters(spec)
    values = dict(parameter_values or {})
    unknown = sorted(set(values) - set(declared))
    if unknown:
        raise ValueError(f"Unknown pipeline parameter(s) {unknown}; the pipeline takes: {', '.join(declared)}")
    checked: dict[str, Any] = {}
    for name, value in values.items():
        kind = declared[name].get("parameterType", "")
        if kind == "NUMBER_DOUBLE" and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        ok = {"STRING": isinstance(value, str),
              "NUMBER_INTEGER": isinstance(value, int) and not isinstance(value, bool),
              "NUMBER_DOUBLE": isinstance(value, float),
              "BOOLEAN": isinstance(value, bool),
              "LIST": isinstance(value, list),
              "STRUCT": isinstance(value, dict)}.get(kind, True)
        if not ok:
            raise ValueError(f"Pipeline parameter {name} is {kind}, got {value!r} ({type(value).__name__}).")
        checked[name] = value
    missing = sorted(n for n, d in declared.items()
                     if n not in checked and "defaultValue" not in d and not d.get("isOptional"))
    if missing:
        raise ValueError(f"The pipeline needs values for {missing} (they have no defaults).")
    return {"gcsOutputDirectory": root, "parameterValues": checked}


def set_caching(spec: dict, enable_caching: bool | None) -> dict:
    """A copy of `spec` with task caching switched: None keeps what the pipeline compiled; False turns caching off
    for every task (a fresh run); True turns it on for every task that the pipeline does not keep uncached on
    purpose (evaluation and registration read the registry's current state, so they stay uncached)."""
    spec = copy.deepcopy(spec)
    if enable_caching is None:
        return spec
    for component in [spec["root"], *(spec.get("components") or {}).values()]:
        for task in ((component.get("dag") or {}).get("tasks") or {}).values():
            options = task.get("cachingOptions")
            if enable_caching is False:
                task["cachingOptions"] = {"enableCache": False}
            elif options is None or options.get("enableCache"):
                task["cachingOptions"] = {"enableCache": True}
    return spec


def make_job_id(pipeline_name: str, now: _dt.datetime | None = None) -> str:
    """`{pipeline-name}-{YYYYMMDDHHMMSS}` (UTC), the id the Vertex AI SDK gives a run."""
    now = now or _dt.datetime.now(_dt.timezone.utc)
    base = re.sub(r"[^-0-9a-z]+", "-", pipeline_name.lower()).strip("-") or "pipeline"
    if not base[0].isalpha():
        base = "p-" + base
    return f"{base[:113]}-{now.strftime('%Y%m%d%H%M%S')}"


def vertex_run_parameters(parameter_values: dict | None, *, project: str, location: str) -> dict:
    """This project's pipeline on Vertex AI: the model registry is Vertex AI's, in the run's project and region,
    unless the parameters say otherwise. The local registry is a directory on one machine, and every Vertex AI
    Pipelines step runs on a VM of its own, so it is refused."""
    params = dict(parameter_values or {})
    params.setdefault("registry", "vertex")
    if params["registry"] == "local":
        raise ValueError("registry=local keeps the model registry in a directory of one machine; on Vertex AI "
                         "Pipelines every step runs on its own VM, so registrations would be lost. Use "
                         "--registry vertex (the Vertex AI Model Registry).")
    if params["registry"] == "vertex":
        params.setdefault("project", project)
        params.setdefault("location", location)
    return params


def _short_id(resource_name: str) -> str:
    return resource_name.rsplit("/", 1)[-1]


def _rfc3339(value: Any) -> str:
    if not value:
        return ""
    if isinstance(value, _dt.datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=_dt.timezone.utc)
        return value.astimezone(_dt.timezone.utc).isoformat().replace("+00:00", "Z")
    return str(value)


# ---------------------------------------------------------------------------------------------- client


class VertexPipelines:
    """Vertex AI Pipelines in one project and region: runs and schedules."""

    def __init__(self, project: str, location: str, *, api_endpoint: str | None = None, credentials: Any = None,
                 transport: str = "rest", pipeline_client: Any = None, schedule_client: Any = None,
                 sleep: Callable[[float], None] = time.sleep, monotonic: Callable[[], float] = time.monotonic,
                 max_attempts: int = 5, initial_backoff_s: float = 2.0, max_backoff_s: float = 60.0):
        """
        project, location: where the runs and schedules live (`projects/{project}/locations/{location}`).
        api_endpoint: defaults to `{location}-aiplatform.googleapis.com`; tests pass the stand-in's
            `http://127.0.0.1:PORT`. A regional endpoint of another region than `location` is refused.
        credentials: google.auth credentials; None means Application Default Credentials.
        pipeline_client, schedule_client: ready `aiplatform_v1` clients, instead of building them.
        sleep, monotonic: injectable clock for waiting on runs and backing off on quota refusals.
        max_attempts, initial_backoff_s, max_backoff_s: retries of calls refused for quota (HTTP 429) and of
            transient failures while following a run.
        """
        if not project:
            raise ValueError("A Google Cloud project is needed (--project).")
        if not location or location == "global" or not re.fullmatch(r"[a-z]+-[a-z]+\d+", location):
            raise ValueError(f"Vertex AI Pipelines needs a region such as us-central1 (--region), got {location!r}.")
        if transport not in ("rest", "grpc"):
            raise ValueError(f"transport must be 'rest' or 'grpc', got {transport!r}")
        self.project = project
        self.location = location
        self.parent = f"projects/{project}/locations/{location}"
        self.api_endpoint = api_endpoint or f"{location}-aiplatform.googleapis.com"
        m = ENDPOINT_REGION_RE.match(self.api_endpoint)
        if m and m.group("region") != location:
            raise ValueError(f"api_endpoint {self.api_endpoint} serves region {m.group('region')}, but the location is "
                             f"{location}; use {location}-aiplatform.googleapis.com.")
        self.credentials = credentials
        self.transport = transport
        self._pipeline_client = pipeline_client
        self._schedule_client = schedule_client
        self._sleep = sleep
        self._monotonic = monotonic
        self.max_attempts = max(1, max_attempts)
        self.initial_backoff_s = initial_backoff_s
        self.max_backoff_s = max_backoff_s

    # -- plumbing --------------------------------------------------------------------------------------

    def _client_options(self):
        from google.api_core.client_options import ClientOptions

        return ClientOptions(api_endpoint=self.api_endpoint)

    @property
    def pipeline_client(self):
        if self._pipeline_client is None:
            from google.cloud.aiplatform_v1.services.pipeline_service import PipelineServiceClient

            self._pipeline_client = self._build(PipelineServiceClient)
        return self._pipeline_client

    @property
    def schedule_client(self):
        if self._schedule_client is None:
            from google.cloud.aiplatform_v1.services.schedule_service import ScheduleServiceClient

            self._schedule_client = self._build(ScheduleServiceClient)
        return self._schedule_client

    def _build(self, client_class):
        from google.auth import exceptions as auth_exceptions

        try:
            return client_class(transport=self.transport, credentials=self.credentials,
                                client_options=self._client_options())
        except auth_exceptions.DefaultCredentialsError as e:
            raise VertexPermissionError(
                f"No Google Cloud credentials found ({e}). Locally run `gcloud auth application-default login`; on "
                f"GKE use Workload Identity (a Kubernetes service account bound to a Google service account).") from e

    def _call(self, what: str, fn: Callable[[], Any], *, service_account: str = "") -> Any:
        """Calls `fn`, retrying quota refusals with backoff, and turns refusals into errors users can act on."""
        from google.api_core import exceptions as gexc

        delay = self.initial_backoff_s
        for attempt in range(1, self.max_attempts + 1):
            try:
                return fn()
            except gexc.TooManyRequests as e:
                if attempt == self.max_attempts:
                    raise VertexPipelineError(
                        f"Vertex AI refused to {what} for quota (RESOURCE_EXHAUSTED) {self.max_attempts} times in "
                        f"{self.parent}: {e.message} Wait and retry, or ask for more quota (IAM & Admin > Quotas, "
                        f"service aiplatform.googleapis.com, region {self.location}).") from e
                log.warning("Vertex AI quota refusal on attempt %d/%d to %s; retrying in %.0fs", attempt,
                            self.max_attempts, what, delay)
                self._sleep(delay)
                delay = min(self.max_backoff_s, delay * 2)
            except gexc.Forbidden as e:
                raise VertexPermissionError(self._permission_message(what, e, service_account)) from e
            except gexc.Unauthorized as e:
                raise VertexPermissionError(
                    f"Vertex AI could not authenticate the call to {what}: {e.message} Run `gcloud auth "
                    f"application-default login` locally; on GKE, check the Workload Identity binding of the pod's "
                    f"Kubernetes service account.") from e
            except gexc.BadRequest as e:
                raise VertexPipelineError(f"Vertex AI rejected the request to {what} in {self.parent}: "
                                          f"{e.message}") from e
            except gexc.Conflict as e:
                raise VertexPipelineError(f"Could not {what}: {e.message} Pick another id (--job-id), or leave it out "
                                          f"to get a fresh one.") from e
        raise AssertionError("unreachable")

    def _permission_message(self, what: str, error: Any, service_account: str) -> str:
        permission = (getattr(error, "metadata", None) or {}).get("permission", "")
        identity = getattr(self.credentials, "service_account_email", None)
        caller = f"the caller ({identity})" if identity else "the caller (your Application Default Credentials)"
        if permission == "iam.serviceAccounts.actAs" or "iam.serviceAccounts.actAs" in (error.message or ""):
            account = service_account or "the run-as service account"
            return (f"Permission denied to {what}: {error.message} Runs execute as {account}, and {caller} may only "
                    f"launch them with {ACT_AS_ROLE} (Service Account User) on that account: `gcloud iam "
                    f"service-accounts add-iam-policy-binding {account} --member=user:YOU@EXAMPLE.COM "
                    f"--role={ACT_AS_ROLE}` (or --member=serviceAccount:CALLER for a service account).")
        message = (f"Permission denied to {what} in {self.parent}: {error.message} Grant {caller} {REQUIRED_ROLE} "
                   f"(Vertex AI User) on project {self.project}")
        if permission:
            message += f" (the missing permission is {permission})"
        if service_account:
            message += (f"; to run as {service_account} the caller also needs {ACT_AS_ROLE} on that service account, "
                        f"which itself needs {REQUIRED_ROLE} and roles/storage.objectAdmin on the pipeline root's "
                        f"bucket")
        return message + "."

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
            next_run_time=_rfc3339(schedule.next_run_time), action=action, removed=removed,
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
               wait: bool = False, poll_interval_s: float = 5.0, timeout_s: float | None = None) -> PipelineRun:
        """Creates a PipelineJob from the compiled package; with `wait`, follows it to the end (see `wait`)."""
        job, pipeline_name = self._prepare(
            package_path, pipeline_root=pipeline_root, parameter_values=parameter_values, display_name=display_name,
            service_account=service_account, labels=labels, enable_caching=enable_caching, network=network)
        job_id = job_id or make_job_id(pipeline_name)
        if not JOB_ID_RE.match(job_id):
            raise ValueError(f"Invalid job id {job_id!r}: at most 128 characters of a-z, 0-9 and '-', starting with a "
                             f"letter.")
        created = self._call(f"create pipeline job {job_id}", lambda: self.pipeline_client.create_pipeline_job(
            parent=self.parent, pipeline_job=job, pipeline_job_id=job_id), service_account=service_account or "")
        run = self._run(created)
        log.info("submitted %s: %s", run.name, run.console_url)
        return self.wait(run.name, poll_interval_s=poll_interval_s, timeout_s=timeout_s) if wait else run

    def get_run(self, name: str) -> PipelineRun:
        name = name if "/" in name else f"{self.parent}/pipelineJobs/{name}"
        return self._run(self._call(f"get pipeline job {_short_id(name)}",
                                    lambda: self.pipeline_client.get_pipeline_job(name=name)))

    def wait(self, name: str, *, poll_interval_s: float = 5.0, max_poll_interval_s: float = 60.0,
             timeout_s: float | None = None) -> PipelineRun:
        """Follows a run until it ends. Returns it when it SUCCEEDED; raises `PipelineJobFailed` (failed tasks,
        error, console page) for FAILED, CANCELLED or PAUSED, and `TimeoutError` after `timeout_s`. Transient
        errors while polling (503, 500, 504, 429) are retried, so a long run survives a blip."""
        import requests
        from google.api_core import exceptions as gexc

        started = self._monotonic()
        interval = poll_interval_s
        last_state, failures = "", 0
        while True:
            try:
                run = self.get_run(name)
                failures = 0
            except (gexc.ServiceUnavailable, gexc.InternalServerError, gexc.GatewayTimeout, gexc.DeadlineExceeded,
                    requests.exceptions.ConnectionError) as e:
                failures += 1
                if failures >= _TRANSIENT_RETRIES:
                    raise VertexPipelineError(f"Lost track of {name} after {failures} failed polls ({e}); the run "
                                              f"goes on: follow it in the console.") from e
                log.warning("polling %s failed (%s); retrying", name, e)
                self._sleep(interval)
                continue
            if run.state != last_state:
                log.info("%s is %s", run.job_id, run.state.removeprefix("PIPELINE_STATE_"))
                last_state = run.state
            if run.done:
                if run.state == SUCCEEDED:
                    return run
                tasks = f" Failed tasks: {', '.join(run.failed_tasks)}." if run.failed_tasks else ""
                raise PipelineJobFailed(f"Pipeline run {run.job_id} ended {run.state.removeprefix('PIPELINE_STATE_')}."
                                        f"{tasks} {run.error} Logs and task details: {run.console_url}".replace("  ", " "),
                                        run)
            if timeout_s is not None and self._monotonic() - started >= timeout_s:
                raise TimeoutError(f"Pipeline run {run.job_id} is still {run.state} after {timeout_s:.0f}s; it goes on "
                                   f"running: {run.console_url}")
            self._sleep(interval)
            interval = min(max_poll_interval_s, interval * 2)

    # -- schedules -------------------------------------------------------------------------------------

    def find_schedules(self, name: str) -> list:
        """The schedules with display name `name` (`aiplatform_v1.Schedule`), oldest first."""
        if not name:
            raise ValueError("A schedule name is needed.")
        escaped = name.replace("\\", "\\\\").replace('"', '\\"')
        schedules = self._call(f"list schedules named {name!r}", lambda: list(self.schedule_client.list_schedules(
            request={"parent": self.parent, "filter": f'display_name="{escaped}"', "order_by": "create_time"})))
        return sorted((s for s in schedules if s.display_name == name), key=lambda s: _rfc3339(s.create_time))

    def schedule(self, package_path: str, *, cron: str, pipeline_root: str | None, name: str | None = None,
                 parameter_values: dict | None = None, service_account: str | None = None,
                 max_concurrent_run_count: int = 1, allow_queueing: bool = False, max_run_count: int | None = None,
                 start_time: _dt.datetime | None = None, end_time: _dt.datetime | None = None,
                 enable_caching: bool | None = None, labels: dict | None = None,
                 network: str | None = None) -> ScheduleInfo:
        """Creates the schedule `name` (default: the pipeline's name) or updates it in place.

        An existing schedule keeps its id, history and state (a PAUSED one stays paused) and gets the new cron,
        pipeline, parameters and run settings through `UpdateSchedule`. Should the API refuse to change the
        pipeline of a schedule, the old one is paused, a new one is created, then the old one is deleted
        (`action="replaced"`). Other schedules with the same name (made by hand) are deleted, so one remains."""
        cron = check_cron(cron)
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
            # The refusal names the field or the mask; any other 400 (a bad cron, ...) is the user's to fix.
            refused_field = isinstance(e.__cause__, gexc.BadRequest) and re.search(
                r"create_?pipeline_?job_?request|update_?mask|field_?mask", e.__cause__.message or "", re.IGNORECASE)
            if not refused_field:
                raise
            # The API will not swap the pipeline of a schedule: replace it without two ever running together.
            log.warning("Vertex AI refused to change the pipeline of schedule %s in place; replacing it", target.name)
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
                result = self._call("get schedule", lambda: self.schedule_client.get_schedule(name=result.name))
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
            fresh = self._call(f"get schedule {name!r}", lambda: self.schedule_client.get_schedule(name=schedule.name))
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
            fresh = self._call(f"get schedule {name!r}", lambda: self.schedule_client.get_schedule(name=schedule.name))
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
                        poll_interval_s: float = 5.0, timeout_s: float | None = None, **client_kwargs) -> PipelineRun:
    """Submits the compiled pipeline as a Vertex AI PipelineJob (see `VertexPipelines.submit`)."""
    return _connection(project, location, api_endpoint, credentials, **client_kwargs).submit(
        package_path, pipeline_root=pipeline_root, parameter_values=parameter_values, service_account=service_account,
        display_name=display_name, job_id=job_id, enable_caching=enable_caching, labels=labels, network=network,
        wait=wait, poll_interval_s=poll_interval_s, timeout_s=timeout_s)


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
