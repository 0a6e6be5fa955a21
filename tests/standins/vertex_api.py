"""A local stand-in for the Vertex AI v1 REST API: the Model Registry calls we use, plus batch prediction jobs.

Tests point the real client (`google.cloud.aiplatform_v1`, `transport="rest"`) at it:

    with VertexStandIn() as vertex:
        client = aiplatform_v1.ModelServiceClient(
            transport="rest", credentials=AnonymousCredentials(),
            client_options={"api_endpoint": vertex.api_endpoint})  # http://127.0.0.1:PORT

It is stdlib only, keeps its state in memory and serves one region, like a regional endpoint
(`{location}-aiplatform.googleapis.com`). What it implements, following the public v1 REST reference:

- `POST v1/{parent=projects/*/locations/*}/models:upload` -> a long-running Operation named
  `projects/NUMBER/locations/L/models/ID/operations/OP`, not done; the upload takes effect when the operation
  is polled (`GET v1/{name}` or `GET ui/{name}`: the generated REST client polls through the `ui/` binding)
  and the done operation carries an `UploadModelResponse` (`model`, `modelVersionId`). `parentModel` adds a
  version to that model; `modelId` picks the new model's id (409 ALREADY_EXISTS when taken). The first
  version of a model always gets the `default` alias; a later one only when its `versionAliases` ask for it.
- `GET v1/{name=projects/*/locations/*/models/*}`, with `ID`, `ID@VERSION` or `ID@ALIAS`; no version means
  the default version.
- `GET v1/{parent}/models` with `filter` (`model`, `display_name`/`displayName`, `labels.KEY`, `labels`
  presence with `:`, `=` and `!=`, terms joined by `AND`), `pageSize`, `pageToken`; one entry per model: its
  default version.
- `GET v1/{name=.../models/ID}:listVersions` with a `labels` filter and paging.
- `POST v1/{name=.../models/ID@VERSION}:mergeVersionAliases`: an alias moves to this version (it leaves the
  version that had it); `-alias` removes it; `default` may move but not be removed; adding and removing the
  same alias in one request cancel out.
- `POST v1/{parent}/batchPredictionJobs`, `GET v1/{name=.../batchPredictionJobs/*}`: the job runs
  PENDING -> RUNNING -> SUCCEEDED as it is polled.
- PipelineService: `POST v1/{parent}/pipelineJobs` (`pipelineJobId` optional: a numeric id otherwise; 409 when
  taken), `GET v1/{name=.../pipelineJobs/*}`. The body is checked as Vertex AI Pipelines checks it: a
  `pipelineSpec` with `pipelineInfo.name` and `root`, `runtimeConfig.gcsOutputDirectory` a gs:// path (or the
  spec's `defaultPipelineRoot`), `parameterValues` naming only root input parameters, with every parameter that
  has no default given, in the parameter's type; accelerator types that Vertex AI knows (`NVIDIA_TESLA_T4`, ...,
  not GKE's `nvidia.com/gpu`); a service account email; valid labels. The job runs
  `PIPELINE_STATE_PENDING -> RUNNING -> SUCCEEDED` as it is polled (`pipeline_polls`), or ends FAILED with the
  error body Vertex AI writes when `fail_next_pipeline(task=...)` scripted it; `jobDetail.taskDetails` lists the
  tasks. The service adds the `vertex-ai-pipelines-run-billing-id` label, like the real one.
- ScheduleService: `POST v1/{parent}/schedules`, `GET v1/{name=.../schedules/*}`, `GET v1/{parent}/schedules`
  (`filter` on `display_name` with `=`, `!=` and `:` wildcards, `state`, `create_pipeline_job_request:*`, terms
  joined by `AND`; `orderBy` `create_time [desc]`, newest first by default; paging; list items carry no
  `updateTime`, as the real list answers), `PATCH v1/{schedule.name}?updateMask=...` (camelCase or snake_case
  paths; output-only paths ignored; a non-empty field cannot be unset; only ACTIVE or PAUSED schedules),
  `POST ...:pause` (ACTIVE only), `POST ...:resume` (PAUSED only, `catchUp`), `DELETE` (a done Operation with
  `DeleteOperationMetadata`, as the real API answers). Schedule ids are numeric; `nextRunTime` is computed from
  the cron (with its `TZ=`/`CRON_TZ=` prefix). `schedule_request_updatable=False` makes `UpdateSchedule` refuse
  the `create_pipeline_job_request` path (INVALID_ARGUMENT), for clients that must cope with that.
  `trigger_schedule(name)` starts the run a cron tick would start (a pipeline job with `scheduleName`).
- `deny_act_as(service_account)`: creating a job or schedule that runs as that service account answers 403
  `iam.serviceAccounts.actAs`, as it does for a caller without roles/iam.serviceAccountUser on it.

Resource names in responses use the project number, as Vertex does, whichever of id or number the request
used. Requests for another region than the one served, or naming resources in another region, get 400
INVALID_ARGUMENT. Errors use Google's JSON error body (`{"error": {"code", "message", "status", "details"}}`),
and `fail_next()` scripts errors (403 PERMISSION_DENIED, 429 RESOURCE_EXHAUSTED, ...) for the next calls, or
for the outcome of the next upload operations.
Every request is recorded in `requests`. No authentication is checked (tests use anonymous credentials).
"""

from __future__ import annotations

import base64
import contextlib
import copy
import dataclasses
import datetime as _dt
import http.server
import json
import re
import threading
import urllib.parse
from typing import Any

API = "type.googleapis.com/google.cloud.aiplatform.v1"

HTTP_STATUS = {
    "INVALID_ARGUMENT": 400, "FAILED_PRECONDITION": 400, "OUT_OF_RANGE": 400, "UNAUTHENTICATED": 401,
    "PERMISSION_DENIED": 403, "NOT_FOUND": 404, "ALREADY_EXISTS": 409, "ABORTED": 409,
    "RESOURCE_EXHAUSTED": 429, "CANCELLED": 499, "INTERNAL": 500, "UNIMPLEMENTED": 501, "UNAVAILABLE": 503,
    "DEADLINE_EXCEEDED": 504,
}
STATUS_FOR_HTTP = {400: "INVALID_ARGUMENT", 401: "UNAUTHENTICATED", 403: "PERMISSION_DENIED", 404: "NOT_FOUND",
                   409: "ALREADY_EXISTS", 429: "RESOURCE_EXHAUSTED", 500: "INTERNAL", 501: "UNIMPLEMENTED",
                   503: "UNAVAILABLE", 504: "DEADLINE_EXCEEDED"}
RPC_CODE = {"OK": 0, "CANCELLED": 1, "UNKNOWN": 2, "INVALID_ARGUMENT": 3, "DEADLINE_EXCEEDED": 4, "NOT_FOUND": 5,
            "ALREADY_EXISTS": 6, "PERMISSION_DENIED": 7, "RESOURCE_EXHAUSTED": 8, "FAILED_PRECONDITION": 9,
            "ABORTED": 10, "OUT_OF_RANGE": 11, "UNIMPLEMENTED": 12, "INTERNAL": 13, "UNAVAILABLE": 14,
            "UNAUTHENTICATED": 16}

# The IAM permission each call needs (what a real PERMISSION_DENIED names).
PERMISSIONS = {
    "UploadModel": "aiplatform.models.upload", "UploadModel:operation": "storage.objects.get", "GetModel": "aiplatform.models.get",
    "ListModels": "aiplatform.models.list", "ListModelVersions": "aiplatform.models.list",
    "MergeVersionAliases": "aiplatform.models.update", "GetOperation": "aiplatform.operations.list",
    "CreateBatchPredictionJob": "aiplatform.batchPredictionJobs.create",
    "GetBatchPredictionJob": "aiplatform.batchPredictionJobs.get",
    "CreatePipelineJob": "aiplatform.pipelineJobs.create", "GetPipelineJob": "aiplatform.pipelineJobs.get",
    "CreateSchedule": "aiplatform.schedules.create", "GetSchedule": "aiplatform.schedules.get",
    "ListSchedules": "aiplatform.schedules.list", "UpdateSchedule": "aiplatform.schedules.update",
    "PauseSchedule": "aiplatform.schedules.pause", "ResumeSchedule": "aiplatform.schedules.resume",
    "DeleteSchedule": "aiplatform.schedules.delete",
}

# Accelerator types of Vertex AI machine specs (google.cloud.aiplatform.v1.AcceleratorType) for GPUs.
VERTEX_ACCELERATORS = {
    "NVIDIA_TESLA_K80", "NVIDIA_TESLA_P100", "NVIDIA_TESLA_V100", "NVIDIA_TESLA_P4", "NVIDIA_TESLA_T4",
    "NVIDIA_TESLA_A100", "NVIDIA_A100_80GB", "NVIDIA_L4", "NVIDIA_H100_80GB", "NVIDIA_H100_MEGA_80GB",
    "NVIDIA_H200_141GB", "NVIDIA_B200", "NVIDIA_GB200", "NVIDIA_RTX_PRO_6000",
}
# Enum values (google.cloud.aiplatform.v1 protos) for answers to `$alt=json;enum-encoding=int`, which the
# generated REST clients ask for: the real service then writes enums as numbers.
PIPELINE_STATES = ("PIPELINE_STATE_UNSPECIFIED", "PIPELINE_STATE_QUEUED", "PIPELINE_STATE_PENDING",
                   "PIPELINE_STATE_RUNNING", "PIPELINE_STATE_SUCCEEDED", "PIPELINE_STATE_FAILED",
                   "PIPELINE_STATE_CANCELLING", "PIPELINE_STATE_CANCELLED", "PIPELINE_STATE_PAUSED")
TASK_STATES = ("STATE_UNSPECIFIED", "PENDING", "RUNNING", "SUCCEEDED", "CANCEL_PENDING", "CANCELLING", "CANCELLED",
               "FAILED", "SKIPPED", "NOT_TRIGGERED")
SCHEDULE_STATES = ("STATE_UNSPECIFIED", "ACTIVE", "PAUSED", "COMPLETED")
PIPELINE_RPCS = {"CreatePipelineJob", "GetPipelineJob", "CreateSchedule", "GetSchedule", "ListSchedules",
                 "UpdateSchedule", "PauseSchedule", "ResumeSchedule", "DeleteSchedule"}
PIPELINE_JOB_ID_RE = re.compile(r"^[a-z][-a-z0-9]{0,127}$")
SERVICE_ACCOUNT_RE = re.compile(r"^[^@\s]+@[^@\s]+\.gserviceaccount\.com$")
PIPELINE_TERMINAL = ("PIPELINE_STATE_SUCCEEDED", "PIPELINE_STATE_FAILED", "PIPELINE_STATE_CANCELLED")
# Schedule fields UpdateSchedule takes (snake_case; camelCase paths are accepted too) and its output-only ones.
SCHEDULE_UPDATABLE = ("display_name", "start_time", "end_time", "cron", "max_run_count", "max_concurrent_run_count",
                      "max_concurrent_active_run_count", "allow_queueing", "create_pipeline_job_request")
SCHEDULE_OUTPUT_ONLY = ("name", "state", "create_time", "update_time", "next_run_time", "started_run_count",
                        "last_pause_time", "last_resume_time", "catch_up", "last_scheduled_run_response")
CRON_FIELDS = (("minute", 0, 59, {}), ("hour", 0, 23, {}), ("day of month", 1, 31, {}),
               ("month", 1, 12, {m: i + 1 for i, m in enumerate(
                   "JAN FEB MAR APR MAY JUN JUL AUG SEP OCT NOV DEC".split())}),
               ("day of week", 0, 7, {d: i for i, d in enumerate("SUN MON TUE WED THU FRI SAT".split())}))

# fail_next(rpc=UPLOAD_RESULT): the upload's operation finishes with that error instead of a new version.
UPLOAD_RESULT = "UploadModel:operation"

ALIAS_RE = re.compile(r"^[a-z][a-zA-Z0-9-]{0,126}[a-z0-9-]$")
MODEL_ID_RE = re.compile(r"^[a-z_][a-z0-9_-]{0,62}$")
LABEL_KEY_RE = re.compile(r"^[a-z][a-z0-9_-]{0,62}$")
LABEL_VALUE_RE = re.compile(r"^[a-z0-9_-]{0,63}$")

ROUTES = [
    ("POST", re.compile(r"^v1/projects/(?P<project>[^/]+)/locations/(?P<location>[^/]+)/models:upload$"), "UploadModel"),
    ("GET", re.compile(r"^v1/projects/(?P<project>[^/]+)/locations/(?P<location>[^/]+)/models$"), "ListModels"),
    ("GET", re.compile(r"^v1/projects/(?P<project>[^/]+)/locations/(?P<location>[^/]+)/models/(?P<model>[^/:]+):listVersions$"),
     "ListModelVersions"),
    ("POST", re.compile(r"^v1/projects/(?P<project>[^/]+)/locations/(?P<location>[^/]+)/models/(?P<model>[^/:]+):mergeVersionAliases$"),
     "MergeVersionAliases"),
    ("GET", re.compile(r"^v1/projects/(?P<project>[^/]+)/locations/(?P<location>[^/]+)/models/(?P<model>[^/:]+)$"), "GetModel"),
    ("GET", re.compile(r"^(?:v1|ui)/projects/(?P<project>[^/]+)/locations/(?P<location>[^/]+)/"
                       r"(?:(?:models/(?P<model>[^/:@]+)|schedules/(?P<schedule_of_op>[^/:]+))/)?"
                       r"operations/(?P<operation>[^/:]+)$"), "GetOperation"),
    ("POST", re.compile(r"^v1/projects/(?P<project>[^/]+)/locations/(?P<location>[^/]+)/batchPredictionJobs$"),
     "CreateBatchPredictionJob"),
    ("GET", re.compile(r"^v1/projects/(?P<project>[^/]+)/locations/(?P<location>[^/]+)/batchPredictionJobs/(?P<job>[^/:]+)$"),
     "GetBatchPredictionJob"),
    ("POST", re.compile(r"^v1/projects/(?P<project>[^/]+)/locations/(?P<location>[^/]+)/pipelineJobs$"),
     "CreatePipelineJob"),
    ("GET", re.compile(r"^v1/projects/(?P<project>[^/]+)/locations/(?P<location>[^/]+)/pipelineJobs/(?P<job>[^/:]+)$"),
     "GetPipelineJob"),
    ("POST", re.compile(r"^v1/projects/(?P<project>[^/]+)/locations/(?P<location>[^/]+)/schedules$"), "CreateSchedule"),
    ("GET", re.compile(r"^v1/projects/(?P<project>[^/]+)/locations/(?P<location>[^/]+)/schedules$"), "ListSchedules"),
    ("GET", re.compile(r"^v1/projects/(?P<project>[^/]+)/locations/(?P<location>[^/]+)/schedules/(?P<schedule>[^/:]+)$"),
     "GetSchedule"),
    ("PATCH", re.compile(r"^v1/projects/(?P<project>[^/]+)/locations/(?P<location>[^/]+)/schedules/(?P<schedule>[^/:]+)$"),
     "UpdateSchedule"),
    ("POST", re.compile(r"^v1/projects/(?P<project>[^/]+)/locations/(?P<location>[^/]+)/schedules/(?P<schedule>[^/:]+):pause$"),
     "PauseSchedule"),
    ("POST", re.compile(r"^v1/projects/(?P<project>[^/]+)/locations/(?P<location>[^/]+)/schedules/(?P<schedule>[^/:]+):resume$"),
     "ResumeSchedule"),
    ("DELETE", re.compile(r"^v1/projects/(?P<project>[^/]+)/locations/(?P<location>[^/]+)/schedules/(?P<schedule>[^/:]+)$"),
     "DeleteSchedule"),
]


class ApiError(Exception):
    def __init__(self, status: str, message: str, details: list | None = None, http_status: int | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.details = details or []
        self.http_status = http_status or HTTP_STATUS.get(status, 500)

    def body(self) -> dict:
        error = {"code": self.http_status, "message": self.message, "status": self.status}
        if self.details:
            error["details"] = self.details
        return {"error": error}


@dataclasses.dataclass
class RecordedRequest:
    method: str
    path: str  # without the query string, e.g. /v1/projects/p/locations/us-central1/models
    query: dict[str, list[str]]
    body: Any
    headers: dict[str, str]
    rpc: str  # e.g. "UploadModel", or "" when no route matched
    status: int = 0  # the HTTP status answered


@dataclasses.dataclass
class _ScriptedError:
    remaining: int
    status: str
    http_status: int
    message: str | None
    rpc: str | None
    details: list | None


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="microseconds").replace("+00:00", "Z")


def _encode_token(offset: int) -> str:
    return base64.urlsafe_b64encode(json.dumps({"o": offset}).encode()).decode()


def _decode_token(token: str) -> int:
    try:
        return int(json.loads(base64.urlsafe_b64decode(token.encode()))["o"])
    except Exception:
        raise ApiError("INVALID_ARGUMENT", f"Invalid page token: {token}") from None


def _parse_filter(text: str, allowed: set[str]) -> list[tuple[str, str, str | None]]:
    """Parses an AIP-160 filter of `field OP value` terms joined by AND into (field, op, value) triples."""
    terms = []
    text = (text or "").strip()
    if not text:
        return terms
    for part in re.split(r"\s+AND\s+", text):
        m = re.match(r'^\s*(?P<field>labels\."[^"]+"|[A-Za-z_][A-Za-z0-9_.\-]*)\s*(?P<op>!=|=|:)\s*(?P<value>.*?)\s*$', part)
        if not m:
            raise ApiError("INVALID_ARGUMENT", f"Invalid filter: {text!r}")
        field, op, value = m.group("field"), m.group("op"), m.group("value")
        if value.startswith('"') and value.endswith('"') and len(value) >= 2:
            value = value[1:-1].replace('\\"', '"')
        elif re.search(r"\s", value) or not value:
            raise ApiError("INVALID_ARGUMENT", f"Invalid filter: {text!r}")
        base = field.split(".", 1)[0]
        canonical = {"displayName": "display_name", "baseModelName": "base_model_name"}.get(base, base)
        if canonical not in allowed:
            raise ApiError("INVALID_ARGUMENT", f"Unsupported filter field {field!r} in {text!r}")
        if canonical == "labels":
            if field == "labels":  # labels:key -- key presence
                if op != ":":
                    raise ApiError("INVALID_ARGUMENT", f"Invalid filter: {text!r}")
                terms.append(("labels." + value, ":", None))
                continue
            key = field.split(".", 1)[1]
            if key.startswith('"'):
                key = key[1:-1]
            if op == ":" and value != "*":
                raise ApiError("INVALID_ARGUMENT", f"Invalid filter: {text!r}")
            terms.append(("labels." + key, op, None if op == ":" else value))
        else:
            if op == ":":
                raise ApiError("INVALID_ARGUMENT", f"Operator ':' is not supported for {field!r}")
            terms.append((canonical, op, value))
    return terms


def _matches(model: dict, terms: list[tuple[str, str, str | None]], model_id: str) -> bool:
    for field, op, value in terms:
        if field.startswith("labels."):
            labels = model.get("labels", {})
            key = field[len("labels."):]
            if op == ":":
                ok = key in labels
            else:
                ok = (labels.get(key) == value) if op == "=" else (labels.get(key) != value)
        else:
            actual = {"display_name": model.get("displayName", ""), "model": model_id,
                      "base_model_name": ""}[field]
            ok = (actual == value) if op == "=" else (actual != value)
        if not ok:
            return False
    return True


class VertexStandIn:
    """The stand-in server. Use as a context manager; `api_endpoint` is what the client's api_endpoint takes."""

    def __init__(self, project: str = "test-project", project_number: str = "123456789012",
                 location: str = "us-central1", *, polls_until_done: int = 1, max_page_size: int = 100,
                 job_polls: tuple[int, int] = (1, 1), pipeline_polls: tuple[int, int] = (1, 1),
                 schedule_request_updatable: bool = True):
        self.project = project
        self.project_number = project_number
        self.location = location
        self.polls_until_done = polls_until_done  # operation GETs before an upload is done (>= 1)
        self.max_page_size = max_page_size  # the server caps page sizes, like the real one may
        self.job_polls = job_polls  # GETs a batch job spends PENDING, then RUNNING
        self.requests: list[RecordedRequest] = []
        self._lock = threading.RLock()
        self._scripted: list[_ScriptedError] = []
        self._models: dict[str, dict] = {}  # model id -> {"versions": {id: Model JSON}, "next": int, ...}
        self._operations: dict[str, dict] = {}
        self._jobs: dict[str, dict] = {}
        self.pipeline_polls = pipeline_polls  # GETs a pipeline job spends PENDING, then RUNNING
        self.schedule_request_updatable = schedule_request_updatable
        self._pipeline_jobs: dict[str, dict] = {}  # job id -> {"job": PipelineJob JSON, "polls", "outcome"}
        self._pipeline_outcomes: list[dict] = []  # scripted outcomes for the next pipeline jobs
        self._schedules: dict[str, dict] = {}  # schedule id -> Schedule JSON
        self._act_as_denied: set[str] = set()
        self._counter = 0
        self._server: http.server.ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # -- lifecycle -------------------------------------------------------------------------------------

    def __enter__(self) -> "VertexStandIn":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self) -> None:
        standin = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = True  # headers and body go out in separate writes

            def do_GET(self):
                standin._handle(self, "GET")

            def do_POST(self):
                standin._handle(self, "POST")

            def do_DELETE(self):
                standin._handle(self, "DELETE")

            def do_PATCH(self):
                standin._handle(self, "PATCH")

            def log_message(self, *args):
                pass

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.05,), name="vertex-standin", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    @property
    def api_endpoint(self) -> str:
        assert self._server is not None, "start the stand-in first"
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    # -- test controls ---------------------------------------------------------------------------------

    def fail_next(self, code: int | str = 403, count: int = 1, *, rpc: str | None = None,
                  message: str | None = None, details: list | None = None) -> None:
        """Answers the next `count` calls (of `rpc`, e.g. "UploadModel", or any) with an error.

        `code` is an HTTP status (403, 429, ...) or a status name ("PERMISSION_DENIED"). Without `message`,
        the message and details are shaped like the real ones (the missing IAM permission, the quota).
        `rpc=UPLOAD_RESULT` makes the next upload operations finish with the error (`done` with `error`)
        rather than failing a call."""
        status = code if isinstance(code, str) else STATUS_FOR_HTTP.get(code, "UNKNOWN")
        http_status = HTTP_STATUS.get(status, 500) if isinstance(code, str) else code
        with self._lock:
            self._scripted.append(_ScriptedError(count, status, http_status, message, rpc, details))

    def calls(self, rpc: str | None = None) -> list[RecordedRequest]:
        with self._lock:
            return [r for r in self.requests if rpc is None or r.rpc == rpc]

    def versions(self, model_id: str) -> list[dict]:
        """The stored versions of a model (Model JSON), oldest first."""
        with self._lock:
            return [copy.deepcopy(v) for _, v in sorted(self._models[model_id]["versions"].items(), key=lambda kv: int(kv[0]))]

    def model_ids(self) -> list[str]:
        with self._lock:
            return list(self._models)

    def fail_next_pipeline(self, task: str = "train-op", message: str | None = None, count: int = 1) -> None:
        """The next `count` pipeline jobs created end PIPELINE_STATE_FAILED, `task` being the failed task."""
        with self._lock:
            self._pipeline_outcomes.extend([{"task": task, "message": message}] * count)

    def deny_act_as(self, service_account: str) -> None:
        """Jobs and schedules that run as `service_account` are refused (403 iam.serviceAccounts.actAs)."""
        with self._lock:
            self._act_as_denied.add(service_account)

    def pipeline_jobs(self) -> list[dict]:
        """The stored pipeline jobs (PipelineJob JSON), oldest first."""
        with self._lock:
            return [copy.deepcopy(s["job"]) for s in self._pipeline_jobs.values()]

    def schedules(self) -> list[dict]:
        """The stored schedules (Schedule JSON), oldest first."""
        with self._lock:
            return [copy.deepcopy(s) for s in self._schedules.values()]

    def trigger_schedule(self, name: str) -> dict:
        """Starts the run a cron tick of an ACTIVE schedule would start; returns its PipelineJob JSON."""
        with self._lock:
            schedule = self._schedules[name.rsplit("/", 1)[-1]]
            if schedule["state"] != "ACTIVE":
                raise ValueError(f"schedule {name} is {schedule['state']}; only an ACTIVE schedule starts runs")
            request = schedule["createPipelineJobRequest"]
            stamp = _dt.datetime.now(_dt.timezone.utc)
            base = re.sub(r"[^-a-z0-9]+", "-", request["pipelineJob"]["pipelineSpec"]["pipelineInfo"]["name"].lower())
            job_id = f"{base.strip('-')}-{stamp.strftime('%Y%m%d%H%M%S')}{len(self._pipeline_jobs):03d}"
            job = self._new_pipeline_job(job_id, copy.deepcopy(request["pipelineJob"]))
            job["scheduleName"] = schedule["name"]
            schedule["startedRunCount"] = str(int(schedule.get("startedRunCount", "0")) + 1)
            schedule["lastScheduledRunResponse"] = {"scheduledRunTime": _now(), "runResponse": job["name"]}
            return copy.deepcopy(job)

    # -- HTTP plumbing ---------------------------------------------------------------------------------

    def _handle(self, handler: http.server.BaseHTTPRequestHandler, method: str) -> None:
        url = urllib.parse.urlsplit(handler.path)
        path = urllib.parse.unquote(url.path)
        query = urllib.parse.parse_qs(url.query, keep_blank_values=True)
        length = int(handler.headers.get("Content-Length") or 0)
        raw = handler.rfile.read(length) if length else b""
        record = RecordedRequest(method=method, path=path, query=query, body=None, headers=dict(handler.headers.items()),
                                 rpc="")
        status, payload = 500, {}
        try:
            try:
                record.body = json.loads(raw) if raw else None
            except ValueError:
                raise ApiError("INVALID_ARGUMENT", "Invalid JSON payload received.") from None
            rpc, params = self._route(method, path.lstrip("/"))
            record.rpc = rpc
            with self._lock:
                self.requests.append(record)
                self._check_scripted(rpc, params)
                self._check_location(params)
                payload = getattr(self, "_" + rpc)(params, query, record.body or {})
            status = 200
        except ApiError as e:
            status, payload = e.http_status, e.body()
            if record not in self.requests:
                with self._lock:
                    self.requests.append(record)
        except Exception as e:  # a bug in the stand-in: answer like a server error, keep serving
            status, payload = 500, ApiError("INTERNAL", f"stand-in error: {e!r}").body()
        record.status = status
        if record.rpc in PIPELINE_RPCS and status == 200 and "enum-encoding=int" in (query.get("$alt") or [""])[0]:
            payload = _int_enums(payload)
        data = json.dumps(payload).encode()
        handler.send_response(status)
        handler.send_header("Content-Type", "application/json; charset=UTF-8")
        handler.send_header("Content-Length", str(len(data)))
        handler.end_headers()
        handler.wfile.write(data)

    def _route(self, method: str, path: str) -> tuple[str, dict]:
        for route_method, pattern, rpc in ROUTES:
            m = pattern.match(path)
            if m and route_method == method:
                return rpc, {k: v for k, v in m.groupdict().items() if v is not None}
        raise ApiError("NOT_FOUND", f"The requested URL /{path} was not found on this server.")

    def _check_scripted(self, rpc: str, params: dict) -> None:
        error = self._take_scripted(rpc, params)
        if error is not None:
            raise error

    def _take_scripted(self, rpc: str, params: dict) -> ApiError | None:
        for scripted in self._scripted:
            if scripted.remaining > 0 and (scripted.rpc == rpc or (scripted.rpc is None and rpc != UPLOAD_RESULT)):
                scripted.remaining -= 1
                message, details = scripted.message, scripted.details
                if message is None:
                    message, default_details = self._default_error(scripted.status, rpc, params)
                    details = details if details is not None else default_details
                return ApiError(scripted.status, message, details, http_status=scripted.http_status)
        return None

    def _default_error(self, status: str, rpc: str, params: dict) -> tuple[str, list]:
        resource = f"projects/{params.get('project', self.project)}/locations/{params.get('location', self.location)}"
        if status == "PERMISSION_DENIED":
            permission = PERMISSIONS.get(rpc, "aiplatform.models.get")
            return (f"Permission '{permission}' denied on resource '//aiplatform.googleapis.com/{resource}' "
                    f"(or it may not exist).",
                    [{"@type": "type.googleapis.com/google.rpc.ErrorInfo", "reason": "IAM_PERMISSION_DENIED",
                      "domain": "aiplatform.googleapis.com",
                      "metadata": {"permission": permission, "resource": resource}}])
        if status == "RESOURCE_EXHAUSTED":
            return ("Quota exceeded for quota metric 'Resource management (CRUD) requests' and limit 'Resource "
                    "management (CRUD) requests per minute per region' of service 'aiplatform.googleapis.com' "
                    f"for consumer 'project_number:{self.project_number}'.",
                    [{"@type": "type.googleapis.com/google.rpc.ErrorInfo", "reason": "RATE_LIMIT_EXCEEDED",
                      "domain": "googleapis.com",
                      "metadata": {"service": "aiplatform.googleapis.com",
                                   "consumer": f"projects/{self.project_number}"}}])
        return f"Scripted {status} error.", []

    def _check_location(self, params: dict) -> None:
        project, location = params.get("project"), params.get("location")
        if project not in (self.project, self.project_number):
            raise ApiError("PERMISSION_DENIED",
                           f"Permission denied on resource project {project} (or it may not exist).")
        if location != self.location:
            raise ApiError("INVALID_ARGUMENT",
                           f"Request is for location '{location}', but this is the regional endpoint of "
                           f"'{self.location}' ({self.location}-aiplatform.googleapis.com).")

    # -- resource helpers ------------------------------------------------------------------------------

    def _location_path(self) -> str:
        return f"projects/{self.project_number}/locations/{self.location}"

    def _next_id(self) -> str:
        self._counter += 1
        return str(4_000_000_000_000_000_000 + self._counter * 7919)

    def _parse_model_name(self, name: str, what: str) -> str:
        """The model id from a full model resource name (checks project and location)."""
        m = re.match(r"^projects/([^/]+)/locations/([^/]+)/models/([^/@]+)$", name or "")
        if not m:
            raise ApiError("INVALID_ARGUMENT", f"Invalid {what}: {name!r}; expected projects/*/locations/*/models/*.")
        if m.group(1) not in (self.project, self.project_number):
            raise ApiError("PERMISSION_DENIED", f"Permission denied on resource project {m.group(1)}.")
        if m.group(2) != self.location:
            raise ApiError("INVALID_ARGUMENT", f"{what} {name} is in location '{m.group(2)}', but the request is "
                                               f"for location '{self.location}'.")
        return m.group(3)

    def _model(self, model_id: str) -> dict:
        model = self._models.get(model_id)
        if model is None or not model["versions"]:
            raise ApiError("NOT_FOUND", f"Model {self._location_path()}/models/{model_id} does not exist.")
        return model

    def _resolve_version(self, model_id: str, ref: str | None) -> dict:
        model = self._model(model_id)
        ref = ref or "default"
        if ref in model["versions"]:
            return model["versions"][ref]
        for version in model["versions"].values():
            if ref in version["versionAliases"]:
                return version
        raise ApiError("NOT_FOUND", f"Model {self._location_path()}/models/{model_id}@{ref} does not exist.")

    def _split_model_ref(self, ref: str) -> tuple[str, str | None]:
        model_id, _, version = ref.partition("@")
        return model_id, (version or None)

    @staticmethod
    def _validate_labels(labels: Any) -> dict:
        if labels is None:
            return {}
        if not isinstance(labels, dict) or len(labels) > 64:
            raise ApiError("INVALID_ARGUMENT", "labels must be a map of at most 64 entries.")
        for key, value in labels.items():
            if not isinstance(value, str) or not LABEL_KEY_RE.match(key) or not LABEL_VALUE_RE.match(value):
                raise ApiError("INVALID_ARGUMENT",
                               f"Invalid label {key!r}: {value!r}. Label keys must start with a lowercase letter; keys "
                               f"and values may contain only lowercase letters, digits, '_' and '-', at most 63 "
                               f"characters.")
        return dict(labels)

    @staticmethod
    def _validate_alias(alias: str) -> None:
        if not isinstance(alias, str) or not ALIAS_RE.match(alias):
            raise ApiError("INVALID_ARGUMENT", f"Invalid version alias {alias!r}: must match "
                                               f"[a-z][a-zA-Z0-9-]{{0,126}}[a-z-0-9].")

    def _page(self, items: list, query: dict, key: str) -> dict:
        size = int((query.get("pageSize") or query.get("page_size") or ["0"])[0] or 0)
        if size < 0:
            raise ApiError("INVALID_ARGUMENT", "page_size must not be negative.")
        size = min(size or 100, self.max_page_size)
        token = (query.get("pageToken") or query.get("page_token") or [""])[0]
        start = _decode_token(token) if token else 0
        page = items[start:start + size]
        response: dict = {}
        if page:
            response[key] = [copy.deepcopy(item) for item in page]
        if start + size < len(items):
            response["nextPageToken"] = _encode_token(start + size)
        return response

    @staticmethod
    def _filter_text(query: dict) -> str:
        return (query.get("filter") or [""])[0]

    # -- ModelService ----------------------------------------------------------------------------------

    def _UploadModel(self, params: dict, query: dict, body: dict) -> dict:
        model = body.get("model")
        if not isinstance(model, dict):
            raise ApiError("INVALID_ARGUMENT", "model is required.")
        if not model.get("displayName"):
            raise ApiError("INVALID_ARGUMENT", "model.display_name is required.")
        image = (model.get("containerSpec") or {}).get("imageUri")
        if not image:
            raise ApiError("INVALID_ARGUMENT", "model.container_spec.image_uri is required for a custom model.")
        artifact_uri = model.get("artifactUri", "")
        if artifact_uri and not artifact_uri.startswith("gs://"):
            raise ApiError("INVALID_ARGUMENT", f"model.artifact_uri must be a Cloud Storage URI (gs://...), got "
                                               f"{artifact_uri!r}.")
        labels = self._validate_labels(model.get("labels"))
        aliases = list(model.get("versionAliases") or [])
        for alias in aliases:
            if alias != "default":
                self._validate_alias(alias)
        if len(set(aliases)) != len(aliases):
            raise ApiError("INVALID_ARGUMENT", "model.version_aliases must not repeat an alias.")
        parent_model = body.get("parentModel", "")
        model_id = body.get("modelId", "")
        if parent_model and model_id:
            raise ApiError("INVALID_ARGUMENT", "model_id cannot be set together with parent_model.")
        if parent_model:
            model_id = self._parse_model_name(parent_model, "parent_model")
            self._model(model_id)  # must exist
            new_model = False
        else:
            if model_id:
                if not MODEL_ID_RE.match(model_id):
                    raise ApiError("INVALID_ARGUMENT", f"Invalid model_id {model_id!r}: at most 63 characters of "
                                                       f"[a-z0-9_-], not starting with a digit or '-'.")
                if model_id in self._models:
                    raise ApiError("ALREADY_EXISTS", f"Model {self._location_path()}/models/{model_id} already exists.")
            else:
                model_id = self._next_id()
            self._models[model_id] = {"versions": {}, "next": 1, "createTime": _now()}  # reserved until done
            new_model = True
        operation_id = self._next_id()
        name = f"{self._location_path()}/models/{model_id}/operations/{operation_id}"
        now = _now()
        self._operations[operation_id] = {
            "name": name, "done": False, "polls_left": max(1, self.polls_until_done), "kind": "upload",
            "model_id": model_id, "new_model": new_model, "labels": labels, "aliases": aliases,
            "model": model, "createTime": now,
        }
        return {"name": name, "metadata": {"@type": f"{API}.UploadModelOperationMetadata",
                                           "genericMetadata": {"createTime": now, "updateTime": now}}}

    def _finish_upload(self, op: dict) -> dict:
        stored = self._models[op["model_id"]]
        version_id = str(stored["next"])
        stored["next"] += 1
        now = _now()
        first = not stored["versions"]
        aliases = list(op["aliases"])
        if first and "default" not in aliases:
            aliases.append("default")
        for other in stored["versions"].values():  # an alias names one version
            moved = [a for a in other["versionAliases"] if a in aliases]
            if moved:
                other["versionAliases"] = [a for a in other["versionAliases"] if a not in aliases]
                other["versionUpdateTime"] = now
        model = op["model"]
        version = {
            "name": f"{self._location_path()}/models/{op['model_id']}",
            "displayName": model["displayName"],
            "description": model.get("description", ""),
            "versionId": version_id,
            "versionAliases": aliases,
            "versionCreateTime": now,
            "versionUpdateTime": now,
            "versionDescription": model.get("versionDescription", ""),
            "artifactUri": model.get("artifactUri", ""),
            "containerSpec": copy.deepcopy(model["containerSpec"]),
            "labels": dict(op["labels"]),
            "createTime": stored["createTime"],
            "updateTime": now,
            "etag": base64.b64encode(f"{op['model_id']}@{version_id}:{now}".encode()).decode(),
        }
        stored["versions"][version_id] = version
        return {"@type": f"{API}.UploadModelResponse", "model": version["name"], "modelVersionId": version_id}

    def _GetOperation(self, params: dict, query: dict, body: dict) -> dict:
        op = self._operations.get(params["operation"])
        if op is None or (params.get("model") and f"/models/{params['model']}/" not in op["name"]):
            raise ApiError("NOT_FOUND", f"Operation {params['operation']} not found.")
        if op["kind"] != "upload":
            return copy.deepcopy(op["result"])
        if not op["done"]:
            op["polls_left"] -= 1
            if op["polls_left"] <= 0:
                op["done"] = True
                op["updateTime"] = _now()
                error = self._take_scripted(UPLOAD_RESULT, params)
                if error is not None:
                    op["error"] = {"code": RPC_CODE.get(error.status, 2), "message": error.message}
                    if error.details:
                        op["error"]["details"] = error.details
                    if op["new_model"]:
                        del self._models[op["model_id"]]
                else:
                    op["response"] = self._finish_upload(op)
        result = {"name": op["name"], "metadata": {
            "@type": f"{API}.UploadModelOperationMetadata",
            "genericMetadata": {"createTime": op["createTime"], "updateTime": op.get("updateTime", op["createTime"])}}}
        if op["done"]:
            result["done"] = True
            result.update({k: copy.deepcopy(op[k]) for k in ("response", "error") if k in op})
        return result

    def _GetModel(self, params: dict, query: dict, body: dict) -> dict:
        model_id, ref = self._split_model_ref(params["model"])
        return copy.deepcopy(self._resolve_version(model_id, ref))

    def _ListModels(self, params: dict, query: dict, body: dict) -> dict:
        terms = _parse_filter(self._filter_text(query), {"model", "display_name", "labels", "base_model_name"})
        items = []
        for model_id, stored in self._models.items():
            if not stored["versions"]:
                continue
            default = self._resolve_version(model_id, "default")
            if _matches(default, terms, model_id):
                items.append(default)
        items.sort(key=lambda m: m["createTime"])
        return self._page(items, query, "models")

    def _ListModelVersions(self, params: dict, query: dict, body: dict) -> dict:
        model_id, ref = self._split_model_ref(params["model"])
        if ref:
            raise ApiError("INVALID_ARGUMENT", "ListModelVersions takes a model name without a version.")
        stored = self._model(model_id)
        terms = _parse_filter(self._filter_text(query), {"labels"})
        items = [v for _, v in sorted(stored["versions"].items(), key=lambda kv: int(kv[0]))
                 if _matches(v, terms, model_id)]
        return self._page(items, query, "models")

    def _MergeVersionAliases(self, params: dict, query: dict, body: dict) -> dict:
        model_id, ref = self._split_model_ref(params["model"])
        if not ref:
            raise ApiError("INVALID_ARGUMENT", "The model name must name a version: models/{model}@{version}.")
        target = self._resolve_version(model_id, ref)
        requested = body.get("versionAliases")
        if not requested or not isinstance(requested, list):
            raise ApiError("INVALID_ARGUMENT", "version_aliases is required.")
        add, remove = set(), set()
        for item in requested:
            alias = item[1:] if isinstance(item, str) and item.startswith("-") else item
            if alias != "default":
                self._validate_alias(alias)
            (remove if item.startswith("-") else add).add(alias)
        both = add & remove  # adding and removing the same alias cancel out
        add, remove = add - both, remove - both
        if "default" in remove:
            raise ApiError("INVALID_ARGUMENT", "The default alias cannot be removed; move it to another version by "
                                               "adding it there.")
        now = _now()
        for version in self._models[model_id]["versions"].values():
            if version is target:
                continue
            if any(a in version["versionAliases"] for a in add):
                version["versionAliases"] = [a for a in version["versionAliases"] if a not in add]
                version["versionUpdateTime"] = now
        aliases = [a for a in target["versionAliases"] if a not in remove]
        aliases += sorted(a for a in add if a not in aliases)
        target["versionAliases"] = aliases
        target["versionUpdateTime"] = now
        return copy.deepcopy(target)

    # -- JobService (batch prediction) -----------------------------------------------------------------

    def _CreateBatchPredictionJob(self, params: dict, query: dict, body: dict) -> dict:
        if not body.get("displayName"):
            raise ApiError("INVALID_ARGUMENT", "batch_prediction_job.display_name is required.")
        m = re.match(r"^(projects/[^/]+/locations/[^/]+/models/[^/@]+)(?:@(.+))?$", body.get("model", ""))
        if not m:
            raise ApiError("INVALID_ARGUMENT", "batch_prediction_job.model must be a model resource name.")
        model_id = self._parse_model_name(m.group(1), "batch_prediction_job.model")
        version = self._resolve_version(model_id, m.group(2))
        source = ((body.get("inputConfig") or {}).get("gcsSource") or {}).get("uris") or []
        if not source or not all(u.startswith("gs://") for u in source):
            raise ApiError("INVALID_ARGUMENT", "input_config.gcs_source.uris must list gs:// URIs.")
        prefix = ((body.get("outputConfig") or {}).get("gcsDestination") or {}).get("outputUriPrefix", "")
        if not prefix.startswith("gs://"):
            raise ApiError("INVALID_ARGUMENT", "output_config.gcs_destination.output_uri_prefix must be a gs:// URI.")
        job_id = self._next_id()
        now = _now()
        job = copy.deepcopy(body)
        job.update({"name": f"{self._location_path()}/batchPredictionJobs/{job_id}",
                    "model": f"{self._location_path()}/models/{model_id}",
                    "modelVersionId": version["versionId"], "state": "JOB_STATE_PENDING",
                    "createTime": now, "updateTime": now})
        self._jobs[job_id] = {"job": job, "polls": 0}
        return copy.deepcopy(job)

    def _GetBatchPredictionJob(self, params: dict, query: dict, body: dict) -> dict:
        stored = self._jobs.get(params["job"])
        if stored is None:
            raise ApiError("NOT_FOUND", f"BatchPredictionJob {params['job']} does not exist.")
        stored["polls"] += 1
        job, now = stored["job"], _now()
        pending, running = self.job_polls
        if job["state"] == "JOB_STATE_PENDING" and stored["polls"] >= pending:
            job.update(state="JOB_STATE_RUNNING", startTime=now, updateTime=now)
        elif job["state"] == "JOB_STATE_RUNNING" and stored["polls"] >= pending + running:
            stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y_%m_%dT%H_%M_%S_%fZ")
            prefix = job["outputConfig"]["gcsDestination"]["outputUriPrefix"].rstrip("/")
            job.update(state="JOB_STATE_SUCCEEDED", endTime=now, updateTime=now,
                       outputInfo={"gcsOutputDirectory": f"{prefix}/prediction-{job['displayName']}-{stamp}"},
                       completionStats={"successfulCount": "0"})
        return copy.deepcopy(job)

    # -- PipelineService -------------------------------------------------------------------------------

    def _check_act_as(self, service_account: str) -> None:
        if service_account in self._act_as_denied:
            raise ApiError("PERMISSION_DENIED",
                           f"Permission 'iam.serviceAccounts.actAs' denied on service account {service_account} (or "
                           f"it may not exist).",
                           [{"@type": "type.googleapis.com/google.rpc.ErrorInfo", "reason": "IAM_PERMISSION_DENIED",
                             "domain": "iam.googleapis.com",
                             "metadata": {"permission": "iam.serviceAccounts.actAs",
                                          "resource": f"projects/-/serviceAccounts/{service_account}"}}])

    def _validate_pipeline_job(self, job: Any, what: str = "pipeline_job") -> None:
        """Checks a PipelineJob body the way Vertex AI Pipelines does before it accepts the job."""
        if not isinstance(job, dict):
            raise ApiError("INVALID_ARGUMENT", f"{what} is required.")
        spec = job.get("pipelineSpec")
        if not isinstance(spec, dict) or not spec:
            if job.get("templateUri"):
                raise ApiError("INVALID_ARGUMENT", "template_uri is not supported by this endpoint; send pipeline_spec.")
            raise ApiError("INVALID_ARGUMENT", f"{what}.pipeline_spec is required.")
        if not (spec.get("pipelineInfo") or {}).get("name") or not isinstance(spec.get("root"), dict):
            raise ApiError("INVALID_ARGUMENT", f"{what}.pipeline_spec must be a KFP PipelineSpec with pipelineInfo.name "
                                               f"and root.")
        runtime = job.get("runtimeConfig") or {}
        root_dir = runtime.get("gcsOutputDirectory") or spec.get("defaultPipelineRoot", "")
        if not root_dir:
            raise ApiError("INVALID_ARGUMENT", f"{what}.runtime_config.gcs_output_directory is required: the pipeline "
                                               f"root where Vertex AI Pipelines writes artifacts.")
        if not re.match(r"^gs://[a-z0-9][a-z0-9._-]{1,221}[a-z0-9](/.*)?$", root_dir):
            raise ApiError("INVALID_ARGUMENT", f"The pipeline root {root_dir!r} must be a Cloud Storage path "
                                               f"(gs://BUCKET/PATH).")
        declared = ((spec["root"].get("inputDefinitions") or {}).get("parameters")) or {}
        values = runtime.get("parameterValues") or {}
        if runtime.get("parameters"):
            raise ApiError("INVALID_ARGUMENT", "runtime_config.parameters is for pipeline schema 2.0.0; a KFP v2 "
                                               "pipeline takes runtime_config.parameter_values.")
        for name, value in values.items():
            if name not in declared:
                raise ApiError("INVALID_ARGUMENT", f"The pipeline parameter {name} is not found in the pipeline job "
                                                   f"input definitions.")
            kind = declared[name].get("parameterType", "")
            ok = {"STRING": lambda v: isinstance(v, str),
                  "NUMBER_INTEGER": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and float(v).is_integer(),
                  "NUMBER_DOUBLE": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
                  "BOOLEAN": lambda v: isinstance(v, bool), "LIST": lambda v: isinstance(v, list),
                  "STRUCT": lambda v: isinstance(v, dict)}.get(kind, lambda v: True)(value)
            if not ok:
                raise ApiError("INVALID_ARGUMENT", f"The value of pipeline parameter {name} is {value!r}, which does not "
                                                   f"match its type {kind}.")
        for name, definition in declared.items():
            if name not in values and "defaultValue" not in definition and not definition.get("isOptional"):
                raise ApiError("INVALID_ARGUMENT", f"The pipeline parameter {name} has no default value; its value "
                                                   f"must be given in runtime_config.parameter_values.")
        for executor_name, executor in ((spec.get("deploymentSpec") or {}).get("executors") or {}).items():
            accelerator = (((executor.get("container") or {}).get("resources") or {}).get("accelerator")) or {}
            kind = accelerator.get("resourceType") or accelerator.get("type")
            if kind and kind not in VERTEX_ACCELERATORS:
                raise ApiError("INVALID_ARGUMENT", f"Executor {executor_name} asks for accelerator type {kind!r}, which "
                                                   f"Vertex AI does not support; use one of "
                                                   f"{', '.join(sorted(VERTEX_ACCELERATORS))}.")
        service_account = job.get("serviceAccount", "")
        if service_account:
            if not SERVICE_ACCOUNT_RE.match(service_account):
                raise ApiError("INVALID_ARGUMENT", f"Invalid service account {service_account!r}: expected the email of "
                                                   f"a service account (NAME@PROJECT.iam.gserviceaccount.com).")
            self._check_act_as(service_account)
        self._validate_labels(job.get("labels"))

    def _new_pipeline_job(self, job_id: str, body: dict) -> dict:
        now = _now()
        job = copy.deepcopy(body)
        labels = dict(job.get("labels") or {})
        labels["vertex-ai-pipelines-run-billing-id"] = str(self._next_id())
        for output_only in ("name", "state", "createTime", "startTime", "endTime", "updateTime", "error", "jobDetail",
                            "scheduleName"):
            job.pop(output_only, None)
        job.update({"name": f"{self._location_path()}/pipelineJobs/{job_id}",
                    "displayName": job.get("displayName") or job_id, "labels": labels,
                    "state": "PIPELINE_STATE_PENDING", "createTime": now, "updateTime": now})
        outcome = self._pipeline_outcomes.pop(0) if self._pipeline_outcomes else None
        self._pipeline_jobs[job_id] = {"job": job, "polls": 0, "outcome": outcome}
        return job

    def _CreatePipelineJob(self, params: dict, query: dict, body: dict) -> dict:
        job_id = (query.get("pipelineJobId") or query.get("pipeline_job_id") or [""])[0]
        if job_id:
            if not PIPELINE_JOB_ID_RE.match(job_id):
                raise ApiError("INVALID_ARGUMENT", f"Invalid pipeline_job_id {job_id!r}: at most 128 characters of "
                                                   f"[a-z0-9-], starting with a letter.")
            if job_id in self._pipeline_jobs:
                raise ApiError("ALREADY_EXISTS", f"PipelineJob {self._location_path()}/pipelineJobs/{job_id} already "
                                                 f"exists.")
        else:
            job_id = self._next_id()
        self._validate_pipeline_job(body)
        return copy.deepcopy(self._new_pipeline_job(job_id, body))

    def _GetPipelineJob(self, params: dict, query: dict, body: dict) -> dict:
        stored = self._pipeline_jobs.get(params["job"])
        if stored is None:
            raise ApiError("NOT_FOUND", f"PipelineJob {self._location_path()}/pipelineJobs/{params['job']} does not "
                                        f"exist.")
        job = stored["job"]
        if job["state"] not in PIPELINE_TERMINAL:
            stored["polls"] += 1
            pending, running = self.pipeline_polls
            now = _now()
            tasks = list(((job["pipelineSpec"].get("root") or {}).get("dag") or {}).get("tasks") or {})
            if job["state"] == "PIPELINE_STATE_PENDING" and stored["polls"] >= pending:
                job.update(state="PIPELINE_STATE_RUNNING", startTime=now, updateTime=now, jobDetail={
                    "pipelineContext": {"name": f"{self._location_path()}/metadataStores/default/contexts/"
                                                f"{job['pipelineSpec']['pipelineInfo']['name']}"},
                    "pipelineRunContext": {"name": f"{self._location_path()}/metadataStores/default/contexts/"
                                                   f"{job['name'].rsplit('/', 1)[-1]}"}})
            elif job["state"] == "PIPELINE_STATE_RUNNING" and stored["polls"] >= pending + running:
                outcome = stored["outcome"]
                details = []
                for index, task in enumerate(tasks):
                    detail = {"taskId": str(1000 + index), "taskName": task, "createTime": job["startTime"],
                              "startTime": job["startTime"], "endTime": now, "state": "SUCCEEDED"}
                    if outcome and task == outcome["task"]:
                        detail["state"] = "FAILED"
                        detail["error"] = {"code": 9, "message": outcome["message"] or
                                           "The replica workerpool0-0 exited with a non-zero status of 1."}
                    details.append(detail)
                job["jobDetail"]["taskDetails"] = details
                job.update(endTime=now, updateTime=now)
                if outcome:
                    job_id = job["name"].rsplit("/", 1)[-1]
                    job["state"] = "PIPELINE_STATE_FAILED"
                    job["error"] = {"code": 9, "message": (
                        f"The DAG failed because some tasks failed. The failed tasks are: [{outcome['task']}].; Job "
                        f"(project_id = {self.project}, job_id = {job_id}) is failed due to the above error.; Failed "
                        f"to handle the job: {{project_number = {self.project_number}, job_id = {job_id}}}")}
                else:
                    job["state"] = "PIPELINE_STATE_SUCCEEDED"
        return copy.deepcopy(job)

    # -- ScheduleService -------------------------------------------------------------------------------

    def _schedule(self, schedule_id: str) -> dict:
        schedule = self._schedules.get(schedule_id)
        if schedule is None:
            raise ApiError("NOT_FOUND", f"Schedule {self._location_path()}/schedules/{schedule_id} does not exist.")
        return schedule

    def _validate_schedule_request(self, request: Any) -> dict:
        if not isinstance(request, dict) or not request:
            raise ApiError("INVALID_ARGUMENT", "The schedule needs a request: create_pipeline_job_request.")
        parent = request.get("parent", "")
        m = re.match(r"^projects/([^/]+)/locations/([^/]+)$", parent)
        if not m:
            raise ApiError("INVALID_ARGUMENT", "create_pipeline_job_request.parent is required (format: "
                                               "projects/{project}/locations/{location}).")
        if m.group(1) not in (self.project, self.project_number):
            raise ApiError("PERMISSION_DENIED", f"Permission denied on resource project {m.group(1)}.")
        if m.group(2) != self.location:
            raise ApiError("INVALID_ARGUMENT", f"create_pipeline_job_request.parent is in location '{m.group(2)}', "
                                               f"but the schedule is in '{self.location}'.")
        job_id = request.get("pipelineJobId", "")
        if job_id:
            raise ApiError("INVALID_ARGUMENT", "create_pipeline_job_request.pipeline_job_id must not be set: every "
                                               "scheduled run gets its own id.")
        self._validate_pipeline_job(request.get("pipelineJob"), "create_pipeline_job_request.pipeline_job")
        return copy.deepcopy(request)

    @staticmethod
    def _int64(value: Any, what: str) -> int:
        try:
            return int(value)
        except (TypeError, ValueError):
            raise ApiError("INVALID_ARGUMENT", f"Invalid value for {what}: {value!r}.") from None

    def _CreateSchedule(self, params: dict, query: dict, body: dict) -> dict:
        if not body.get("displayName"):
            raise ApiError("INVALID_ARGUMENT", "schedule.display_name is required.")
        if len(body["displayName"]) > 128:
            raise ApiError("INVALID_ARGUMENT", "schedule.display_name must be at most 128 characters.")
        if not body.get("cron"):
            raise ApiError("INVALID_ARGUMENT", "The schedule needs a time specification: cron.")
        _cron_next(body["cron"], _dt.datetime.now(_dt.timezone.utc))  # validates
        if "createNotebookExecutionJobRequest" in body:
            raise ApiError("INVALID_ARGUMENT", "This stand-in schedules pipeline jobs only.")
        request = self._validate_schedule_request(body.get("createPipelineJobRequest"))
        concurrent = self._int64(body.get("maxConcurrentRunCount", 0), "max_concurrent_run_count")
        if concurrent <= 0:
            raise ApiError("INVALID_ARGUMENT", "schedule.max_concurrent_run_count must be greater than 0.")
        schedule_id = self._next_id()
        now = _dt.datetime.now(_dt.timezone.utc)
        stamp = _now()
        schedule = {
            "name": f"{self._location_path()}/schedules/{schedule_id}",
            "displayName": body["displayName"], "cron": body["cron"], "createPipelineJobRequest": request,
            "maxConcurrentRunCount": str(concurrent), "startTime": body.get("startTime") or stamp,
            "createTime": stamp, "updateTime": stamp, "state": "ACTIVE",
            "nextRunTime": _cron_next(body["cron"], now),
        }
        for key in ("endTime", "maxRunCount", "maxConcurrentActiveRunCount"):
            if body.get(key):
                schedule[key] = str(body[key]) if key != "endTime" else body[key]
        if body.get("allowQueueing"):
            schedule["allowQueueing"] = True
        self._schedules[schedule_id] = schedule
        return copy.deepcopy(schedule)

    def _GetSchedule(self, params: dict, query: dict, body: dict) -> dict:
        return copy.deepcopy(self._schedule(params["schedule"]))

    def _ListSchedules(self, params: dict, query: dict, body: dict) -> dict:
        terms = _parse_schedule_filter(self._filter_text(query))
        items = [s for s in self._schedules.values() if all(term(s) for term in terms)]
        order = ((query.get("orderBy") or query.get("order_by") or [""])[0] or "create_time desc").strip()
        keys = []
        for part in reversed([p.strip() for p in order.split(",") if p.strip()]):
            field, _, direction = part.partition(" ")
            json_field = {"create_time": "createTime", "start_time": "startTime", "end_time": "endTime",
                          "next_run_time": "nextRunTime"}.get(field)
            if json_field is None or direction.strip() not in ("", "desc", "asc"):
                raise ApiError("INVALID_ARGUMENT", f"Unsupported order_by {order!r}; supported fields: create_time, "
                                                   f"start_time, end_time, next_run_time.")
            keys.append((json_field, direction.strip() == "desc"))
        for json_field, descending in keys:  # stable sorts, last key first
            items.sort(key=lambda s: (s.get(json_field, ""), int(s["name"].rsplit("/", 1)[-1])), reverse=descending)
        listed = []
        for schedule in items:
            item = copy.deepcopy(schedule)
            item.pop("updateTime", None)  # the real list leaves updateTime out
            listed.append(item)
        return self._page(listed, query, "schedules")

    def _UpdateSchedule(self, params: dict, query: dict, body: dict) -> dict:
        schedule = self._schedule(params["schedule"])
        mask = (query.get("updateMask") or query.get("update_mask") or [""])[0]
        paths = [p.strip() for p in mask.split(",") if p.strip()]
        if not paths:
            raise ApiError("INVALID_ARGUMENT", "update_mask is required.")
        if schedule["state"] not in ("ACTIVE", "PAUSED"):
            raise ApiError("FAILED_PRECONDITION", f"Schedule {schedule['name']} is {schedule['state']}; only an ACTIVE "
                                                  f"or PAUSED schedule can be updated.")
        updated = copy.deepcopy(schedule)
        for path in paths:
            snake = re.sub(r"([A-Z])", lambda m: "_" + m.group(1).lower(), path)
            if snake in SCHEDULE_OUTPUT_ONLY:
                continue
            if snake not in SCHEDULE_UPDATABLE:
                raise ApiError("INVALID_ARGUMENT", f"Invalid update_mask path {path!r} for Schedule.")
            if snake == "create_pipeline_job_request" and not self.schedule_request_updatable:
                raise ApiError("INVALID_ARGUMENT", "Updating create_pipeline_job_request of a schedule is not supported.")
            key = re.sub(r"_([a-z])", lambda m: m.group(1).upper(), snake)
            value = body.get(key)
            if snake == "allow_queueing":  # a flag: false is a value, not an unset field
                updated.pop(key, None)
                if value:
                    updated[key] = True
                continue
            if value in (None, "", {}, [], 0, "0"):
                if updated.get(key) not in (None, "", False):
                    raise ApiError("INVALID_ARGUMENT", f"schedule.{snake} cannot be unset.")
                continue
            if snake == "cron":
                _cron_next(value, _dt.datetime.now(_dt.timezone.utc))
            elif snake == "create_pipeline_job_request":
                value = self._validate_schedule_request(value)
            elif snake in ("max_run_count", "max_concurrent_run_count", "max_concurrent_active_run_count"):
                if self._int64(value, snake) <= 0:
                    raise ApiError("INVALID_ARGUMENT", f"schedule.{snake} must be greater than 0.")
                value = str(int(value))
            elif snake == "display_name" and len(value) > 128:
                raise ApiError("INVALID_ARGUMENT", "schedule.display_name must be at most 128 characters.")
            updated[key] = value
        updated["updateTime"] = _now()
        if updated["state"] == "ACTIVE":
            updated["nextRunTime"] = _cron_next(updated["cron"], _dt.datetime.now(_dt.timezone.utc))
        self._schedules[params["schedule"]] = updated
        return copy.deepcopy(updated)

    def _PauseSchedule(self, params: dict, query: dict, body: dict) -> dict:
        schedule = self._schedule(params["schedule"])
        if schedule["state"] != "ACTIVE":
            raise ApiError("FAILED_PRECONDITION", f"Schedule {schedule['name']} is {schedule['state']}; only an ACTIVE "
                                                  f"schedule can be paused.")
        now = _now()
        schedule.update(state="PAUSED", lastPauseTime=now, updateTime=now)
        return {}

    def _ResumeSchedule(self, params: dict, query: dict, body: dict) -> dict:
        schedule = self._schedule(params["schedule"])
        if schedule["state"] != "PAUSED":
            raise ApiError("FAILED_PRECONDITION", f"Schedule {schedule['name']} is {schedule['state']}; only a PAUSED "
                                                  f"schedule can be resumed.")
        now = _now()
        schedule.update(state="ACTIVE", lastResumeTime=now, updateTime=now,
                        nextRunTime=_cron_next(schedule["cron"], _dt.datetime.now(_dt.timezone.utc)))
        if body.get("catchUp"):
            schedule["catchUp"] = True
        else:
            schedule.pop("catchUp", None)
        return {}

    def _DeleteSchedule(self, params: dict, query: dict, body: dict) -> dict:
        self._schedule(params["schedule"])
        del self._schedules[params["schedule"]]
        operation_id = self._next_id()
        now = _now()
        result = {"name": f"{self._location_path()}/operations/{operation_id}", "done": True,
                  "metadata": {"@type": f"{API}.DeleteOperationMetadata",
                               "genericMetadata": {"createTime": now, "updateTime": now}},
                  "response": {"@type": "type.googleapis.com/google.protobuf.Empty"}}
        self._operations[operation_id] = {"name": result["name"], "kind": "delete", "result": result}
        return copy.deepcopy(result)


def _int_enums(payload: Any) -> Any:
    """A PipelineJob / Schedule answer (or a list of schedules) with its enums as numbers."""
    payload = copy.deepcopy(payload)

    def job(j: dict) -> None:
        if j.get("state") in PIPELINE_STATES:
            j["state"] = PIPELINE_STATES.index(j["state"])
        for task in (j.get("jobDetail") or {}).get("taskDetails") or []:
            task["state"] = TASK_STATES.index(task["state"])

    def schedule(s: dict) -> None:
        if s.get("state") in SCHEDULE_STATES:
            s["state"] = SCHEDULE_STATES.index(s["state"])

    if isinstance(payload.get("schedules"), list):
        for item in payload["schedules"]:
            schedule(item)
    elif "createPipelineJobRequest" in payload:
        schedule(payload)
    elif "pipelineSpec" in payload:
        job(payload)
    return payload


def _parse_schedule_filter(text: str) -> list:
    """ListSchedules filters: display_name (=, !=, : with * wildcards), state (=, !=), create_pipeline_job_request:*,
    terms joined by AND. Anything else is refused, so a client cannot rely on what the stand-in does not check."""
    terms = []
    text = (text or "").strip()
    if not text:
        return terms
    for part in re.split(r"\s+AND\s+", text):
        m = re.match(r'^\s*(?P<field>[A-Za-z_]+)\s*(?P<op>!=|=|:)\s*(?P<value>"(?:[^"\\]|\\.)*"|\S+)\s*$', part)
        if not m:
            raise ApiError("INVALID_ARGUMENT", f"Invalid filter: {text!r}")
        field, op, value = m.group("field"), m.group("op"), m.group("value")
        if value.startswith('"'):
            value = re.sub(r'\\(.)', r'\1', value[1:-1])
        field = {"displayName": "display_name", "createPipelineJobRequest": "create_pipeline_job_request"}.get(field, field)
        if field == "display_name":
            if op == ":":
                pattern = re.compile("^" + ".*".join(re.escape(p) for p in value.split("*")) + "$")
                terms.append(lambda s, p=pattern: bool(p.match(s["displayName"])))
            else:
                terms.append(lambda s, v=value, eq=(op == "="): (s["displayName"] == v) == eq)
        elif field == "state" and op in ("=", "!="):
            if value not in ("ACTIVE", "PAUSED", "COMPLETED", "STATE_UNSPECIFIED"):
                raise ApiError("INVALID_ARGUMENT", f"Invalid state {value!r} in filter {text!r}")
            terms.append(lambda s, v=value, eq=(op == "="): (s["state"] == v) == eq)
        elif field == "create_pipeline_job_request" and op == ":" and value == "*":
            terms.append(lambda s: "createPipelineJobRequest" in s)
        else:
            raise ApiError("INVALID_ARGUMENT", f"Unsupported filter term {part.strip()!r} in {text!r}")
    return terms


def _cron_values(text: str, what: str, low: int, high: int, names: dict) -> set[int]:
    values: set[int] = set()

    def number(token: str) -> int:
        token = token.upper()
        if token in names:
            return names[token]
        if not token.isdigit():
            raise ApiError("INVALID_ARGUMENT", f"Invalid cron {what} value {token!r}.")
        return int(token)

    for item in text.split(","):
        spec, _, step_text = item.partition("/")
        step = 1
        if step_text:
            if not step_text.isdigit() or int(step_text) == 0:
                raise ApiError("INVALID_ARGUMENT", f"Invalid cron step {item!r} in the {what} field.")
            step = int(step_text)
        if spec == "*":
            start, end = low, high
        elif "-" in spec:
            first, _, last = spec.partition("-")
            start, end = number(first), number(last)
        else:
            start = number(spec)
            end = high if step_text else start
        if not (low <= start <= high and low <= end <= high) or start > end:
            raise ApiError("INVALID_ARGUMENT", f"Cron {what} {item!r} is out of range {low}-{high}.")
        values.update(range(start, end + 1, step))
    return values


def _cron_next(cron: str, after: _dt.datetime) -> str:
    """The next time (RFC 3339, UTC) after `after` that a cron with an optional TZ=/CRON_TZ= prefix fires."""
    import zoneinfo

    text = cron.strip()
    zone = _dt.timezone.utc
    m = re.match(r"^(?:CRON_TZ|TZ)=(\S+)\s+(.*)$", text)
    if m:
        try:
            zone = zoneinfo.ZoneInfo(m.group(1))
        except (zoneinfo.ZoneInfoNotFoundError, ValueError):
            raise ApiError("INVALID_ARGUMENT", f"Invalid time zone {m.group(1)!r} in cron {cron!r}.") from None
        text = m.group(2)
    fields = text.split()
    if len(fields) != 5:
        raise ApiError("INVALID_ARGUMENT", f"Invalid cron {cron!r}: expected 5 fields (minute hour day-of-month month "
                                           f"day-of-week), optionally after TZ=ZONE.")
    minutes, hours, days, months, weekdays = (
        _cron_values(f, what, low, high, names) for f, (what, low, high, names) in zip(fields, CRON_FIELDS))
    weekdays = {d % 7 for d in weekdays}
    any_day, any_weekday = fields[2] == "*", fields[4] == "*"
    start = after.astimezone(zone).replace(second=0, microsecond=0) + _dt.timedelta(minutes=1)
    day = start.date()
    for _ in range(366 * 8):
        weekday = (day.weekday() + 1) % 7  # cron counts from Sunday
        if any_day or any_weekday:
            day_ok = (day.day in days) and (weekday in weekdays)
        else:  # both restricted: either matches (standard cron)
            day_ok = day.day in days or weekday in weekdays
        if day.month in months and day_ok:
            for hour in sorted(hours):
                for minute in sorted(minutes):
                    moment = _dt.datetime(day.year, day.month, day.day, hour, minute, tzinfo=zone)
                    if moment >= start:
                        return moment.astimezone(_dt.timezone.utc).isoformat().replace("+00:00", "Z")
        day += _dt.timedelta(days=1)
    raise ApiError("INVALID_ARGUMENT", f"Cron {cron!r} never fires.")


@contextlib.contextmanager
def vertex_standin(**kwargs) -> Any:
    """`with vertex_standin(location="europe-west4") as vertex: ...`"""
    with VertexStandIn(**kwargs) as standin:
        yield standin
