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
}

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
                       r"(?:models/(?P<model>[^/:@]+)/)?operations/(?P<operation>[^/:]+)$"), "GetOperation"),
    ("POST", re.compile(r"^v1/projects/(?P<project>[^/]+)/locations/(?P<location>[^/]+)/batchPredictionJobs$"),
     "CreateBatchPredictionJob"),
    ("GET", re.compile(r"^v1/projects/(?P<project>[^/]+)/locations/(?P<location>[^/]+)/batchPredictionJobs/(?P<job>[^/:]+)$"),
     "GetBatchPredictionJob"),
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
                 job_polls: tuple[int, int] = (1, 1)):
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


@contextlib.contextmanager
def vertex_standin(**kwargs) -> Any:
    """`with vertex_standin(location="europe-west4") as vertex: ...`"""
    with VertexStandIn(**kwargs) as standin:
        yield standin
