"""A local stand-in for Vertex AI's JobService batch prediction REST API (v1), which also runs the jobs.

Tests point the real client at it:

    with VertexBatchStandIn(storage_root=tmp_path / "gcs", serve=serve) as vertex:
        client = aiplatform_v1.JobServiceClient(transport="rest", credentials=AnonymousCredentials(),
                                                client_options={"api_endpoint": vertex.api_endpoint})

What it implements, following the public v1 REST reference for `projects.locations.batchPredictionJobs`:

- `POST v1/{parent=projects/*/locations/*}/batchPredictionJobs`: checks the request as the service does for a
  custom-trained model (display name; a model resource name, optionally `@version` or `@alias`, of a model
  it knows, else 404; `inputConfig.instancesFormat` and `gcsSource.uris` on gs://; `outputConfig` with
  `predictionsFormat` and a gs:// `gcsDestination.outputUriPrefix`; `dedicatedResources.machineSpec.machineType`,
  which custom-trained models require; `instanceConfig.keyField` only with object instances) and answers the
  job in `JOB_STATE_PENDING`, named with the project number.
- `GET v1/{name=projects/*/locations/*/batchPredictionJobs/*}`: the job moves PENDING -> RUNNING -> SUCCEEDED as
  it is polled (`polls`). On success it has run: it read the JSONL instances, sent them (without the key
  field) to `serve`, the model server, and wrote `prediction.results-00000-of-00001` under
  `OUTPUT_PREFIX/prediction-MODEL_DISPLAY_NAME-TIMESTAMP/`, one line per instance, `{"key": K, "prediction":
  P}` with a key field (`{"instance": I, "prediction": P}` without), `{"key": K, "error": {"message": M}}` for an
  instance the server refused; `completionStats` counts them. `fail_next_job(message)` makes the next job end
  `JOB_STATE_FAILED` with that error instead.
- `POST v1/{name=...}:cancel`: a job not yet ended becomes `JOB_STATE_CANCELLED`.

gs:// is a folder here: gs://BUCKET/PATH is STORAGE_ROOT/BUCKET/PATH (as Vertex AI Pipelines' /gcs mount
shows it). Errors use Google's JSON error body. Requests are recorded in `requests`; no authentication is checked.
"""

from __future__ import annotations

import copy
import datetime as _dt
import http.server
import json
import os
import re
import threading
import urllib.parse
from typing import Callable

HTTP_STATUS = {"INVALID_ARGUMENT": 400, "FAILED_PRECONDITION": 400, "NOT_FOUND": 404, "INTERNAL": 500}
JOBS = r"v1/projects/(?P<project>[^/]+)/locations/(?P<location>[^/]+)/batchPredictionJobs"
ROUTES = [
    ("POST", re.compile(rf"^{JOBS}$"), "CreateBatchPredictionJob"),
    ("GET", re.compile(rf"^{JOBS}/(?P<job>[^/:]+)$"), "GetBatchPredictionJob"),
    ("POST", re.compile(rf"^{JOBS}/(?P<job>[^/:]+):cancel$"), "CancelBatchPredictionJob"),
]
INSTANCE_FORMATS = {"jsonl", "csv", "tf-record", "tf-record-gzip", "file-list", "bigquery"}
PREDICTION_FORMATS = {"jsonl", "csv", "bigquery"}


class ApiError(Exception):
    def __init__(self, status: str, message: str):
        super().__init__(message)
        self.status, self.message = status, message

    def body(self) -> dict:
        return {"error": {"code": HTTP_STATUS[self.status], "message": self.message, "status": self.status}}


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="microseconds").replace("+00:00", "Z")


class VertexBatchStandIn:
    """Serves one project and region; `serve(list of instances) -> list of predictions` is the model server
    (it raises ValueError to refuse an instance)."""

    def __init__(self, storage_root: str, serve: Callable[[list], list], *, project: str = "test-project",
                 project_number: str = "123456789012", location: str = "us-central1", polls: tuple[int, int] = (1, 1)):
        self.storage_root, self.serve = str(storage_root), serve
        self.project, self.project_number, self.location = project, project_number, location
        self.polls = polls  # polls spent PENDING, then RUNNING
        self.models: dict[str, dict] = {}
        self.jobs: dict[str, dict] = {}
        self.requests: list[dict] = []
        self._failures: list[str] = []
        self._lock = threading.Lock()
        self._next = 1000
        self._server: http.server.ThreadingHTTPServer | None = None

    # -- test controls ---------------------------------------------------------------------------------

    def add_model(self, model_id: str, display_name: str, versions: tuple[str, ...] = ("1",),
                  aliases: dict[str, str] | None = None) -> str:
        """Registers a model (as the Model Registry would hold it); returns its resource name."""
        self.models[model_id] = {"displayName": display_name, "versions": set(versions),
                                 "aliases": dict(aliases or {"default": versions[-1]})}
        return f"projects/{self.project}/locations/{self.location}/models/{model_id}"

    def fail_next_job(self, message: str) -> None:
        self._failures.append(message)

    @property
    def api_endpoint(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self) -> "VertexBatchStandIn":
        standin = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                standin._handle(self, "GET")

            def do_POST(self):
                standin._handle(self, "POST")

            def log_message(self, *args):
                pass

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        self._server.shutdown()
        self._server.server_close()

    # -- HTTP ------------------------------------------------------------------------------------------

    def _handle(self, handler: http.server.BaseHTTPRequestHandler, method: str) -> None:
        url = urllib.parse.urlsplit(handler.path)
        path = urllib.parse.unquote(url.path).lstrip("/")
        length = int(handler.headers.get("Content-Length") or 0)
        raw = handler.rfile.read(length) if length else b""
        try:
            body = json.loads(raw) if raw else {}
            rpc, params = next(((rpc, m.groupdict()) for verb, pattern, rpc in ROUTES
                                if verb == method and (m := pattern.match(path))), (None, None))
            with self._lock:
                self.requests.append({"rpc": rpc, "method": method, "path": path, "body": body})
            if rpc is None:
                raise ApiError("NOT_FOUND", f"The requested URL /{path} was not found on this server.")
            if params["project"] not in (self.project, self.project_number) or params["location"] != self.location:
                raise ApiError("INVALID_ARGUMENT", f"Request is for projects/{params['project']}/locations/"
                                                   f"{params['location']}; this endpoint serves {self.location}.")
            with self._lock:
                status, payload = 200, getattr(self, "_" + rpc)(params, body)
        except ApiError as e:
            status, payload = HTTP_STATUS[e.status], e.body()
        except ValueError:
            status, payload = 400, ApiError("INVALID_ARGUMENT", "Invalid JSON payload received.").body()
        raw = json.dumps(payload).encode()
        handler.send_response(status)
        handler.send_header("Content-Type", "application/json; charset=UTF-8")
        handler.send_header("Content-Length", str(len(raw)))
        handler.end_headers()
        handler.wfile.write(raw)

    # -- JobService ------------------------------------------------------------------------------------

    def _local(self, uri: str) -> str:
        return os.path.join(self.storage_root, uri[len("gs://"):])

    def _CreateBatchPredictionJob(self, params: dict, body: dict) -> dict:
        if not body.get("displayName"):
            raise ApiError("INVALID_ARGUMENT", "BatchPredictionJob.display_name is required.")
        found = re.match(r"^projects/([^/]+)/locations/([^/]+)/models/([^/@]+)(?:@(.+))?$", body.get("model", ""))
        if not found:
            raise ApiError("INVALID_ARGUMENT", f"Invalid resource name for model: {body.get('model')!r}.")
        model_id, ref = found.group(3), found.group(4)
        model = self.models.get(model_id)
        if found.group(1) not in (self.project, self.project_number) or model is None:
            raise ApiError("NOT_FOUND", f"The Model does not exist: {body['model']}")
        version = model["aliases"].get(ref, ref) if ref else model["aliases"]["default"]
        if version not in model["versions"]:
            raise ApiError("NOT_FOUND", f"The Model version does not exist: {body['model']}")
        source = body.get("inputConfig") or {}
        if source.get("instancesFormat") not in INSTANCE_FORMATS:
            raise ApiError("INVALID_ARGUMENT", f"Unsupported instances format {source.get('instancesFormat')!r}.")
        uris = (source.get("gcsSource") or {}).get("uris") or []
        if not uris or not all(u.startswith("gs://") for u in uris):
            raise ApiError("INVALID_ARGUMENT", "input_config.gcs_source.uris must list Cloud Storage (gs://) URIs.")
        output = body.get("outputConfig") or {}
        prefix = (output.get("gcsDestination") or {}).get("outputUriPrefix", "")
        if output.get("predictionsFormat") not in PREDICTION_FORMATS or not prefix.startswith("gs://"):
            raise ApiError("INVALID_ARGUMENT", "output_config needs a predictions_format and a gs:// "
                                               "gcs_destination.output_uri_prefix.")
        spec = ((body.get("dedicatedResources") or {}).get("machineSpec") or {})
        if not spec.get("machineType"):
            raise ApiError("INVALID_ARGUMENT", "BatchPredictionJob.dedicated_resources.machine_spec.machine_type "
                                               "must be set: this model supports only dedicated resources.")
        instance_config = body.get("instanceConfig") or {}
        if instance_config.get("keyField") and instance_config.get("instanceType", "object") != "object":
            raise ApiError("INVALID_ARGUMENT", "instance_config.key_field needs object instances.")
        self._next += 1
        job_id = str(self._next)
        now = _now()
        job = copy.deepcopy(body)
        job.update(name=f"projects/{self.project_number}/locations/{self.location}/batchPredictionJobs/{job_id}",
                   model=f"projects/{self.project_number}/locations/{self.location}/models/{model_id}",
                   modelVersionId=version, state="JOB_STATE_PENDING", createTime=now, updateTime=now)
        self.jobs[job_id] = {"job": job, "polls": 0, "fail": self._failures.pop(0) if self._failures else None,
                             "model_display_name": model["displayName"]}
        return copy.deepcopy(job)

    def _GetBatchPredictionJob(self, params: dict, body: dict) -> dict:
        stored = self.jobs.get(params["job"])
        if stored is None:
            raise ApiError("NOT_FOUND", f"BatchPredictionJob {params['job']} does not exist.")
        stored["polls"] += 1
        job, now = stored["job"], _now()
        pending, running = self.polls
        if job["state"] == "JOB_STATE_PENDING" and stored["polls"] >= pending:
            job.update(state="JOB_STATE_RUNNING", startTime=now, updateTime=now)
        elif job["state"] == "JOB_STATE_RUNNING" and stored["polls"] >= pending + running:
            if stored["fail"]:
                job.update(state="JOB_STATE_FAILED", endTime=now, updateTime=now,
                           error={"code": 3, "message": stored["fail"]})
            else:
                self._run(job, stored["model_display_name"])
                job.update(state="JOB_STATE_SUCCEEDED", endTime=now, updateTime=now)
        return copy.deepcopy(job)

    def _CancelBatchPredictionJob(self, params: dict, body: dict) -> dict:
        stored = self.jobs.get(params["job"])
        if stored is None:
            raise ApiError("NOT_FOUND", f"BatchPredictionJob {params['job']} does not exist.")
        job = stored["job"]
        if job["state"] in ("JOB_STATE_PENDING", "JOB_STATE_RUNNING"):
            job.update(state="JOB_STATE_CANCELLED", endTime=_now(), updateTime=_now())
        return {}

    def _run(self, job: dict, model_display_name: str) -> None:
        """What the service does for a jsonl job: instances in, one results file out."""
        key_field = (job.get("instanceConfig") or {}).get("keyField")
        stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y_%m_%dT%H_%M_%S_%fZ")[:-4] + "Z"
        prefix = job["outputConfig"]["gcsDestination"]["outputUriPrefix"].rstrip("/")
        directory = f"{prefix}/prediction-{model_display_name}-{stamp}"
        os.makedirs(self._local(directory), exist_ok=True)
        succeeded = failed = 0
        with open(os.path.join(self._local(directory), "prediction.results-00000-of-00001"), "w") as out:
            for uri in job["inputConfig"]["gcsSource"]["uris"]:
                with open(self._local(uri)) as f:
                    for line in f:
                        if not line.strip():
                            continue
                        instance = json.loads(line)
                        key = instance.pop(key_field, None) if key_field else None
                        head = {"key": key} if key_field else {"instance": instance}
                        try:
                            prediction = self.serve([instance])[0]
                        except ValueError as e:
                            out.write(json.dumps({**head, "error": {"code": 3, "message": str(e)}}) + "\n")
                            failed += 1
                        else:
                            out.write(json.dumps({**head, "prediction": prediction}) + "\n")
                            succeeded += 1
        job["outputInfo"] = {"gcsOutputDirectory": directory}
        job["completionStats"] = {"successfulCount": str(succeeded), "failedCount": str(failed)}

