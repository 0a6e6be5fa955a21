"""In-memory stand-in for the Kubeflow Pipelines v2beta1 REST API (the part pipectl uses).

Why it exists: the KFP API server cannot be reached from tests, yet the code under test must be
exercised through the real ``kfp.Client`` and its generated ``kfp_server_api`` package, not a mock.
So this serves the same URLs, query parameters, JSON shapes, status codes and error bodies over
HTTP on 127.0.0.1 (the shared stand-in base, base.py; PyYAML, a dependency of kfp itself, parses
the uploaded packages the way the real server does). It follows the public API definition, the
v2beta1 protos and their swagger (backend/api/v2beta1/*.proto, backend/api/v2beta1/swagger/ in
kubeflow/pipelines); routes are named after their RPCs (``CreateRun``, ``UploadPipelineVersion``...).

Behaviour copied from the KFP backend (kubeflow/pipelines; file:line at tag 2.17.0, under backend/src/):

- JSON uses proto field names and leaves out empty/zero fields; the one exception is
  ``ListRecurringRunsResponse.recurringRuns``, which is camelCase in the proto itself.
- gRPC-gateway endpoints answer errors as ``{"code": <grpc code>, "message", "details"}`` with the
  HTTP status of that code (ALREADY_EXISTS -> 409, INVALID_ARGUMENT -> 400, NOT_FOUND -> 404: the codes of
  common/util/error.go:185-197); the two multipart upload endpoints answer ``{"error_message", "error_details"}``
  instead (apiserver/server/pipeline_upload_server.go:426).
- Pipeline names are unique, version names are unique within their pipeline (409 otherwise:
  apiserver/storage/pipeline_store.go:757, :966). ``POST /pipelines/upload`` names the first version after the
  pipeline; ``POST /pipelines`` creates a pipeline without any version.
- ``created_at`` has one-second resolution (``CreatedAtInSec``, apiserver/model/pipeline.go:35); sorting breaks
  ties by id, as the SQL store does.
- A "Default" experiment exists from the start; runs without an experiment land there
  (apiserver/resource/resource_manager.go:2009, :2107).
- Recurring runs: display names are not unique; a ``pipeline_version_reference`` without a version
  id means "latest version at each trigger" (KFP >= 2.5); cron is parsed like robfig/cron v1
  ``Parse`` (crd/controller/scheduledworkflow/util/cron_schedule.go:84): 5 or 6 fields with seconds FIRST, so a
  standard 5-field cron is silently read as "sec min hour dom month"; name filters are case-insensitive (the
  MySQL columns' default collation).
- Run parameters are checked against the pipeline spec's root inputs (unknown or missing -> 400).
- List filters are URL-unescaped once more after the query string is decoded (Go's ``url.QueryUnescape``:
  ``+`` is a space, a stray ``%`` is a 400), as ``parseAPIFilter`` does (apiserver/server/
  list_request_util.go:139-165).

Test hooks (not part of KFP): ``requests`` records every request and ``fail_next`` scripts errors
(base.py); ``run_outcomes`` maps a run's display name to its final state, reached over successive
GETs (PENDING -> RUNNING -> final); ``require_token`` makes every call without ``Authorization:
Bearer <token>`` fail with 401, as the auth proxy in front of KFP does; ``clock`` supplies creation
times.

Not modelled: multi-user mode (namespaces are ignored, as in single-user KFP), .zip/.tar.gz
packages, archiving, run execution, logs and artifacts.
"""

from __future__ import annotations

import base64
import datetime as _dt
import email.parser
import email.policy
import json
import re
import time
import uuid
from typing import Any, Callable
from urllib.parse import unquote_plus

from tests.standins.base import ApiError, Request, StandIn, grpc_gateway_error, rfc3339, route

_FILTER_OPS = {1: "EQUALS", 2: "NOT_EQUALS", 3: "GREATER_THAN", 5: "GREATER_THAN_EQUALS",
               6: "LESS_THAN", 7: "LESS_THAN_EQUALS", 8: "IN", 9: "IS_SUBSTRING"}
_TERMINAL = {"SUCCEEDED", "SKIPPED", "FAILED", "CANCELED"}
_DEFAULT_PAGE_SIZE, _MAX_PAGE_SIZE = 20, 200


_STRUCT_FIELDS = {"pipeline_spec", "platform_spec", "parameters"}  # google.protobuf.Struct: kept verbatim


def _clean(obj: Any) -> Any:
    """Drop private keys and proto3 default values, as protojson does without EmitUnpopulated."""
    if isinstance(obj, dict):
        out = {k: v if k in _STRUCT_FIELDS else _clean(v) for k, v in obj.items() if not k.startswith("_")}
        return {k: v for k, v in out.items() if v is not None and v is not False and v not in ("", [], {}, 0)}
    if isinstance(obj, list):
        return [_clean(v) for v in obj]
    return obj


# --- cron, as robfig/cron v1 Parse reads it (Second|Minute|Hour|Dom|Month|DowOptional|Descriptor)
_MONTHS = {m: i + 1 for i, m in enumerate("JAN FEB MAR APR MAY JUN JUL AUG SEP OCT NOV DEC".split())}
_DAYS = {d: i for i, d in enumerate("SUN MON TUE WED THU FRI SAT".split())}
_CRON_BOUNDS = [(0, 59, {}), (0, 59, {}), (0, 23, {}), (1, 31, {}), (1, 12, _MONTHS), (0, 6, _DAYS)]
_DESCRIPTORS = {"@yearly", "@annually", "@monthly", "@weekly", "@daily", "@midnight", "@hourly"}


def _cron_error(spec: str) -> str | None:
    """Return why robfig/cron v1 would reject ``spec``, or None when it parses."""
    if spec.startswith("@"):
        if spec in _DESCRIPTORS or re.fullmatch(r"@every \d+(ns|us|ms|s|m|h)(\d+(ns|us|ms|s|m|h))*", spec):
            return None
        return f"Unrecognized descriptor: {spec}"
    fields = spec.split()
    if not 5 <= len(fields) <= 6:
        return f"Expected 5 to 6 fields, found {len(fields)}: {spec}"
    for field, (lo, hi, names) in zip(fields, _CRON_BOUNDS):
        for part in field.split(","):
            m = re.fullmatch(r"(\*|\?|\w+)(?:-(\w+))?(?:/(\d+))?", part)
            if not m:
                return f"Failed to parse int from {part}"
            if m[3] is not None and int(m[3]) == 0:
                return f"Step of range should be a positive number: {part}"
            if m[1] in ("*", "?"):
                if m[2]:
                    return f"Failed to parse {part}"
                continue
            try:
                a, b = (names[x.upper()] if x.upper() in names else int(x) for x in (m[1], m[2] or m[1]))
            except ValueError:
                return f"Failed to parse int from {part}"
            if a < lo or b > hi or a > b:
                return f"Beginning of range ({a}) below minimum ({lo}) or end ({b}) above maximum ({hi}): {part}"
    return None


class KfpStandIn(StandIn):
    """The fake KFP API server; use as a context manager, then point ``kfp.Client(host=url)`` at it."""

    name = "KFP API"

    def __init__(self, *, require_token: str | None = None, clock: Callable[[], float] = time.time,
                 tag_name: str = "2.17.0"):
        super().__init__(clock=clock)
        self.require_token = require_token
        self.tag_name = tag_name  # the release the server reports (TAG_NAME; "unknown" when a build left it unset)
        self.run_outcomes: dict[str, str] = {}
        self.pipelines: dict[str, dict] = {}
        self.versions: dict[str, dict] = {}
        self.experiments: dict[str, dict] = {}
        self.runs: dict[str, dict] = {}
        self.recurring_runs: dict[str, dict] = {}
        self.default_experiment_id = self._new_experiment(
            "Default", "All runs created without specifying an experiment will be grouped here.")["experiment_id"]

    # --- HTTP ------------------------------------------------------------------------------------
    def routes(self) -> list:
        return [route(method, _P + path, rpc, getattr(self, handler)) for method, path, rpc, handler in _ROUTES]

    def authorize(self, request: Request) -> None:
        token = self.require_token
        if token is not None and request.headers.get("authorization") != f"Bearer {token}":
            raise ApiError("UNAUTHENTICATED", "Unauthenticated: missing or invalid bearer token")

    def no_route(self, request: Request, path_known: bool) -> ApiError:
        if path_known:
            return ApiError("UNIMPLEMENTED", "Method Not Allowed", http_status=405)
        return ApiError("NOT_FOUND", "Not Found")

    def error_body(self, error: ApiError, request: Request) -> dict:
        if request.rpc in _UPLOADS:  # plain HTTP handlers in KFP, not grpc-gateway
            return {"error_message": error.message, "error_details": error.message}
        return grpc_gateway_error(error)

    def render(self, request: Request, payload: Any) -> Any:
        return _clean(payload)

    # --- helpers ---------------------------------------------------------------------------------
    def _seconds(self) -> int:
        return int(self.clock())

    def _new_experiment(self, display_name: str, description: str = "") -> dict:
        created = self._seconds()
        exp = {"experiment_id": str(uuid.uuid4()), "display_name": display_name, "description": description,
               "created_at": rfc3339(created, 0), "storage_state": "AVAILABLE", "_created": created}
        self.experiments[exp["experiment_id"]] = exp
        return exp

    @staticmethod
    def _found(store: dict, key: str, getting: str, kind: str) -> dict:
        """``store[key]``, or NOT_FOUND worded as the API server words it."""
        if key not in store:
            raise ApiError("NOT_FOUND", f"Failed to get {getting}: ResourceNotFoundError: {kind} {key} not found")
        return store[key]

    def _pipeline(self, pipeline_id: str) -> dict:
        return self._found(self.pipelines, pipeline_id, f"pipeline {pipeline_id}", "Pipeline")

    def _version(self, pipeline_id: str, version_id: str) -> dict:
        version = self.versions.get(version_id)
        if version is None or version["pipeline_id"] != pipeline_id:
            raise ApiError("NOT_FOUND", f"Failed to get pipeline version {version_id}: ResourceNotFoundError: "
                                        f"PipelineVersion {version_id} not found")
        return version

    def _experiment(self, experiment_id: str) -> dict:
        return self._found(self.experiments, experiment_id, f"experiment {experiment_id}", "Experiment")

    def _pipeline_versions(self, pipeline_id: str) -> list[dict]:
        return [v for v in self.versions.values() if v["pipeline_id"] == pipeline_id]

    def _latest_version(self, pipeline_id: str) -> dict | None:
        versions = self._pipeline_versions(pipeline_id)
        return max(versions, key=lambda v: (v["_created"], v["pipeline_version_id"])) if versions else None

    @staticmethod
    def _version_json(version: dict) -> dict:
        out = dict(version)
        spec, platform = version["_spec"], version["_platform_spec"]
        out["pipeline_spec"] = {"pipeline_spec": spec, "platform_spec": platform} if platform else spec
        return out

    def _add_pipeline(self, name: str, display_name: str, description: str, *, upload: bool) -> dict:
        if any(p["name"] == name for p in self.pipelines.values()):
            message = (f"Failed to create a new pipeline. The name {name} already exist. Please specify a new name")
            raise ApiError("ALREADY_EXISTS",
                           "Failed to create a pipeline and a pipeline version" if upload else message)
        created = self._seconds()
        pipeline = {"pipeline_id": str(uuid.uuid4()), "name": name, "display_name": display_name or name,
                    "description": description, "created_at": rfc3339(created, 0), "_created": created}
        self.pipelines[pipeline["pipeline_id"]] = pipeline
        return pipeline

    def _add_version(self, pipeline: dict, name: str, display_name: str, description: str,
                     package: tuple[dict, dict | None]) -> dict:
        if any(v["name"] == name for v in self._pipeline_versions(pipeline["pipeline_id"])):
            raise ApiError("ALREADY_EXISTS", "Failed to create a pipeline version")
        created = self._seconds()
        version = {"pipeline_id": pipeline["pipeline_id"], "pipeline_version_id": str(uuid.uuid4()),
                   "name": name, "display_name": display_name or name, "description": description,
                   "created_at": rfc3339(created, 0), "_created": created,
                   "_spec": package[0], "_platform_spec": package[1]}
        self.versions[version["pipeline_version_id"]] = version
        return version

    # --- pipelines -------------------------------------------------------------------------------
    def healthz(self, req) -> dict:
        # kubeflow/pipelines 2.17.0, backend/src/apiserver/main.go:465-491 (newHealthzResponse, served on
        # /apis/v2beta1/healthz at :510): commit and tag from COMMIT_SHA/TAG_NAME, "unknown" when unset.
        return {"commit_sha": "unknown", "tag_name": self.tag_name, "multi_user": False,
                "pipeline_store": "database"}

    def upload_pipeline(self, req) -> dict:
        filename, package = _upload_file(req, "Failed to read a pipeline spec file")
        name = _build_name(req.arg("name"), req.arg("display_name"), filename)
        pipeline = self._add_pipeline(name, req.arg("display_name"), req.arg("description"), upload=True)
        try:
            self._add_version(pipeline, pipeline["name"], pipeline["display_name"], pipeline["description"], package)
        except ApiError:
            del self.pipelines[pipeline["pipeline_id"]]
            raise
        return pipeline

    def upload_pipeline_version(self, req) -> dict:
        filename, package = _upload_file(req, "Failed to create a pipeline version")
        pipeline = self.pipelines.get(req.arg("pipelineid"))
        if pipeline is None:
            raise ApiError("INVALID_ARGUMENT", "Failed to create a pipeline version")
        name = _build_name(req.arg("name"), req.arg("display_name"), filename)
        version = self._add_version(pipeline, name, req.arg("display_name"), req.arg("description"), package)
        return self._version_json(version)

    def create_pipeline(self, req) -> dict:
        body = req.json()
        name = body.get("name") or body.get("display_name") or ""
        if not name:
            raise ApiError("INVALID_ARGUMENT", "Failed to create a pipeline due to server error: name is required")
        return self._add_pipeline(name, body.get("display_name", ""), body.get("description", ""), upload=False)

    def list_pipelines(self, req) -> dict:
        fields = {"pipeline_id": "pipeline_id", "id": "pipeline_id", "name": "name", "display_name": "display_name",
                  "created_at": "_created", "description": "description"}
        page, token, total = _paginate(req, list(self.pipelines.values()), fields, "pipeline_id")
        return {"pipelines": page, "total_size": total, "next_page_token": token}

    def get_pipeline(self, req) -> dict:
        pipeline_id = req.params["pipeline"]
        return self._pipeline(pipeline_id)

    def get_pipeline_by_name(self, req) -> dict:
        name = req.params["name"]
        for pipeline in self.pipelines.values():
            if pipeline["name"] == name:
                return pipeline
        raise ApiError("NOT_FOUND", f"Failed to get a pipeline with name {name} and namespace : "
                                    f"ResourceNotFoundError: Pipeline {name} not found")

    def delete_pipeline(self, req) -> dict:
        pipeline_id = req.params["pipeline"]
        self._pipeline(pipeline_id)
        versions = self._pipeline_versions(pipeline_id)
        if versions and req.arg("cascade", "false") != "true":
            raise ApiError("FAILED_PRECONDITION", f"Failed to delete pipeline {pipeline_id}. Check error stack: "
                                                  f"pipeline has {len(versions)} versions; delete them or set cascade")
        for version in versions:
            del self.versions[version["pipeline_version_id"]]
        del self.pipelines[pipeline_id]
        return {}

    def list_pipeline_versions(self, req) -> dict:
        pipeline_id = req.params["pipeline"]
        self._pipeline(pipeline_id)
        fields = {"pipeline_version_id": "pipeline_version_id", "id": "pipeline_version_id", "name": "name",
                  "display_name": "display_name", "created_at": "_created", "description": "description"}
        versions = [self._version_json(v) for v in self._pipeline_versions(pipeline_id)]
        page, token, total = _paginate(req, versions, fields, "pipeline_version_id")
        return {"pipeline_versions": page, "total_size": total, "next_page_token": token}

    def get_pipeline_version(self, req) -> dict:
        return self._version_json(self._version(req.params["pipeline"], req.params["version"]))

    def delete_pipeline_version(self, req) -> dict:
        pipeline_id, version_id = req.params["pipeline"], req.params["version"]
        self._version(pipeline_id, version_id)
        del self.versions[version_id]
        return {}

    # --- experiments -----------------------------------------------------------------------------
    def create_experiment(self, req) -> dict:
        body = req.json()
        name = body.get("display_name", "")
        if not name:
            raise ApiError("INVALID_ARGUMENT", "Failed to create an experiment: Experiment name is empty. "
                                               "Please specify a valid experiment name")
        if any(e["display_name"] == name for e in self.experiments.values()):
            raise ApiError("ALREADY_EXISTS", f"Failed to create a new experiment. The name {name} already exists. "
                                             f"Please specify a new name")
        return self._new_experiment(name, body.get("description", ""))

    def list_experiments(self, req) -> dict:
        fields = {"experiment_id": "experiment_id", "id": "experiment_id", "name": "display_name",
                  "display_name": "display_name", "created_at": "_created", "description": "description"}
        page, token, total = _paginate(req, list(self.experiments.values()), fields, "experiment_id")
        return {"experiments": page, "total_size": total, "next_page_token": token}

    def get_experiment(self, req) -> dict:
        return self._experiment(req.params["experiment"])

    # --- runs ------------------------------------------------------------------------------------
    def _resolve_source(self, body: dict) -> tuple[dict | None, dict]:
        """Validate a run's or recurring run's pipeline source; return (reference, root inputs)."""
        ref, spec = body.get("pipeline_version_reference"), body.get("pipeline_spec")
        if bool(ref) == bool(spec):
            raise ApiError("INVALID_ARGUMENT", "Invalid input error: either pipeline_spec or "
                                               "pipeline_version_reference must be set, not both")
        if spec:
            root_spec = spec.get("pipeline_spec", spec)
            return None, root_spec.get("root", {}).get("inputDefinitions", {}).get("parameters", {})
        pipeline = self._pipeline(ref.get("pipeline_id", ""))
        if ref.get("pipeline_version_id"):
            version = self._version(pipeline["pipeline_id"], ref["pipeline_version_id"])
        else:
            version = self._latest_version(pipeline["pipeline_id"])
            if version is None:
                raise ApiError("NOT_FOUND", f"Pipeline {pipeline['pipeline_id']} has no versions")
        return dict(ref), version["_spec"].get("root", {}).get("inputDefinitions", {}).get("parameters", {})

    @staticmethod
    def _check_parameters(params: dict, inputs: dict) -> None:
        unknown = sorted(set(params) - set(inputs))
        if unknown:
            raise ApiError("INVALID_ARGUMENT", f"Invalid input error: Unrecognized input parameter: {unknown[0]}")
        missing = sorted(n for n, d in inputs.items()
                         if n not in params and "defaultValue" not in d and not d.get("isOptional"))
        if missing:
            raise ApiError("INVALID_ARGUMENT", f"Invalid input error: parameter {missing[0]} is required")

    def _experiment_of(self, body: dict) -> str:
        experiment_id = body.get("experiment_id") or self.default_experiment_id
        self._experiment(experiment_id)
        return experiment_id

    def create_run(self, req) -> dict:
        body = req.json()
        if not body.get("display_name"):
            raise ApiError("INVALID_ARGUMENT", "Failed to create a run: Run name cannot be empty")
        ref, inputs = self._resolve_source(body)
        runtime_config = body.get("runtime_config") or {}
        self._check_parameters(runtime_config.get("parameters") or {}, inputs)
        if ref is not None and not ref.get("pipeline_version_id"):
            ref["pipeline_version_id"] = self._latest_version(ref["pipeline_id"])["pipeline_version_id"]
        created = self._seconds()
        run = {"run_id": str(uuid.uuid4()), "display_name": body["display_name"],
               "description": body.get("description", ""), "experiment_id": self._experiment_of(body),
               "pipeline_version_reference": ref, "pipeline_spec": body.get("pipeline_spec"),
               "runtime_config": runtime_config, "service_account": body.get("service_account", ""),
               "storage_state": "AVAILABLE", "created_at": rfc3339(created, 0), "scheduled_at": rfc3339(created, 0),
               "state": "PENDING", "state_history": [{"update_time": rfc3339(created, 0), "state": "PENDING"}],
               "_created": created}
        self.runs[run["run_id"]] = run
        return run

    def get_run(self, req) -> dict:
        run = self._found(self.runs, req.params["run"], "a run", "Run")
        if run["state"] not in _TERMINAL:  # each GET moves the run one step: PENDING -> RUNNING -> outcome
            final = self.run_outcomes.get(run["display_name"], "SUCCEEDED")
            run["state"] = "RUNNING" if run["state"] == "PENDING" else final
            now = rfc3339(self._seconds(), 0)
            run["state_history"].append({"update_time": now, "state": run["state"]})
            if run["state"] in _TERMINAL:
                run["finished_at"] = now
                if run["state"] == "FAILED":
                    run["error"] = {"code": 13, "message": "Run failed: a task exited with a non-zero status"}
        return run

    def list_runs(self, req) -> dict:
        fields = {"run_id": "run_id", "id": "run_id", "name": "display_name", "display_name": "display_name",
                  "created_at": "_created", "description": "description"}
        runs = [r for r in self.runs.values()
                if not req.arg("experiment_id") or r["experiment_id"] == req.arg("experiment_id")]
        page, token, total = _paginate(req, runs, fields, "run_id")
        return {"runs": page, "total_size": total, "next_page_token": token}

    # --- recurring runs --------------------------------------------------------------------------
    def create_recurring_run(self, req) -> dict:
        body = req.json()
        if not body.get("display_name"):
            raise ApiError("INVALID_ARGUMENT", "Invalid input error: The recurring run name is empty. "
                                               "Please specify a valid name")
        ref, inputs = self._resolve_source(body)
        runtime_config = body.get("runtime_config") or {}
        self._check_parameters(runtime_config.get("parameters") or {}, inputs)
        try:
            max_concurrency = int(body.get("max_concurrency") or 0)
        except (TypeError, ValueError):
            raise ApiError("INVALID_ARGUMENT", f"invalid value for int64 field max_concurrency: "
                                               f"{body.get('max_concurrency')!r}") from None
        if not 1 <= max_concurrency <= 10:
            raise ApiError("INVALID_ARGUMENT", f"Invalid input error: Max concurrency of a recurring run must be "
                                               f"at least 1 and at most 10. Received {max_concurrency}")
        trigger = body.get("trigger") or {}
        cron = (trigger.get("cron_schedule") or {}).get("cron")
        periodic = trigger.get("periodic_schedule")
        if cron is None and not periodic:
            raise ApiError("INVALID_ARGUMENT", "Invalid input error: a trigger (cron or periodic) is required")
        if cron is not None and (why := _cron_error(cron)):
            raise ApiError("INVALID_ARGUMENT", f"Invalid input error: Schedule cron is not a supported "
                                               f"format(https://godoc.org/github.com/robfig/cron). Error: {why}")
        if periodic and int(periodic.get("interval_second") or 0) < 1:
            raise ApiError("INVALID_ARGUMENT", "Invalid input error: Found invalid period schedule interval")
        mode = body.get("mode", "MODE_UNSPECIFIED")
        created = self._seconds()
        recurring_run = {
            "recurring_run_id": str(uuid.uuid4()), "display_name": body["display_name"],
            "description": body.get("description", ""), "pipeline_version_reference": ref,
            "pipeline_spec": body.get("pipeline_spec"), "runtime_config": runtime_config,
            "service_account": body.get("service_account", ""), "max_concurrency": str(max_concurrency),
            "trigger": trigger, "mode": mode, "created_at": rfc3339(created, 0), "updated_at": rfc3339(created, 0),
            "status": "DISABLED" if mode == "DISABLE" else "ENABLED", "no_catchup": bool(body.get("no_catchup")),
            "experiment_id": self._experiment_of(body), "_created": created}
        self.recurring_runs[recurring_run["recurring_run_id"]] = recurring_run
        return recurring_run

    def _recurring_run(self, recurring_run_id: str) -> dict:
        return self._found(self.recurring_runs, recurring_run_id, "a recurring run", "Job")

    def list_recurring_runs(self, req) -> dict:
        fields = {"recurring_run_id": "recurring_run_id", "id": "recurring_run_id", "name": "display_name",
                  "display_name": "display_name", "created_at": "_created", "description": "description"}
        experiment_id = req.arg("experiment_id")
        runs = [r for r in self.recurring_runs.values() if not experiment_id or r["experiment_id"] == experiment_id]
        page, token, total = _paginate(req, runs, fields, "recurring_run_id",
                                       case_insensitive={"name", "display_name", "description"})
        return {"recurringRuns": page, "total_size": total, "next_page_token": token}

    def get_recurring_run(self, req) -> dict:
        return self._recurring_run(req.params["recurring_run"])

    def delete_recurring_run(self, req) -> dict:
        recurring_run_id = req.params["recurring_run"]
        self._recurring_run(recurring_run_id)
        del self.recurring_runs[recurring_run_id]
        return {}

    def enable_recurring_run(self, req) -> dict:
        return self._switch_recurring_run(req, enable=True)

    def disable_recurring_run(self, req) -> dict:
        return self._switch_recurring_run(req, enable=False)

    def _switch_recurring_run(self, req, *, enable: bool) -> dict:
        recurring_run = self._recurring_run(req.params["recurring_run"])
        recurring_run["mode"] = "ENABLE" if enable else "DISABLE"
        recurring_run["status"] = "ENABLED" if enable else "DISABLED"
        recurring_run["updated_at"] = rfc3339(self._seconds(), 0)
        return {}


_P, _ID = "/apis/v2beta1", r"[^/:]+"
# (method, path under /apis/v2beta1, RPC, handler method)
_ROUTES = [
    ("GET", "/healthz", "GetHealthz", "healthz"),
    ("POST", "/pipelines/upload", "UploadPipeline", "upload_pipeline"),
    ("POST", "/pipelines/upload_version", "UploadPipelineVersion", "upload_pipeline_version"),
    ("GET", f"/pipelines/names/(?P<name>{_ID})", "GetPipelineByName", "get_pipeline_by_name"),
    ("POST", "/pipelines", "CreatePipeline", "create_pipeline"),
    ("GET", "/pipelines", "ListPipelines", "list_pipelines"),
    ("GET", f"/pipelines/(?P<pipeline>{_ID})", "GetPipeline", "get_pipeline"),
    ("DELETE", f"/pipelines/(?P<pipeline>{_ID})", "DeletePipeline", "delete_pipeline"),
    ("GET", f"/pipelines/(?P<pipeline>{_ID})/versions", "ListPipelineVersions", "list_pipeline_versions"),
    ("GET", f"/pipelines/(?P<pipeline>{_ID})/versions/(?P<version>{_ID})", "GetPipelineVersion",
     "get_pipeline_version"),
    ("DELETE", f"/pipelines/(?P<pipeline>{_ID})/versions/(?P<version>{_ID})", "DeletePipelineVersion",
     "delete_pipeline_version"),
    ("POST", "/experiments", "CreateExperiment", "create_experiment"),
    ("GET", "/experiments", "ListExperiments", "list_experiments"),
    ("GET", f"/experiments/(?P<experiment>{_ID})", "GetExperiment", "get_experiment"),
    ("POST", "/runs", "CreateRun", "create_run"),
    ("GET", "/runs", "ListRuns", "list_runs"),
    ("GET", f"/runs/(?P<run>{_ID})", "GetRun", "get_run"),
    ("POST", "/recurringruns", "CreateRecurringRun", "create_recurring_run"),
    ("GET", "/recurringruns", "ListRecurringRuns", "list_recurring_runs"),
    ("GET", f"/recurringruns/(?P<recurring_run>{_ID})", "GetRecurringRun", "get_recurring_run"),
    ("DELETE", f"/recurringruns/(?P<recurring_run>{_ID})", "DeleteRecurringRun", "delete_recurring_run"),
    ("POST", f"/recurringruns/(?P<recurring_run>{_ID}):enable", "EnableRecurringRun", "enable_recurring_run"),
    ("POST", f"/recurringruns/(?P<recurring_run>{_ID}):disable", "DisableRecurringRun", "disable_recurring_run"),
]
_UPLOADS = ("UploadPipeline", "UploadPipelineVersion")


def _build_name(name: str, display_name: str, filename: str) -> str:
    """Pipeline/version name from the query, else the display name, else the file name (server rule)."""
    return name or display_name or re.sub(r"\.(ya?ml|zip|tar\.gz|tgz)$", "", filename)


def _parse_package(filename: str, data: bytes, fallback: str) -> tuple[dict, dict | None]:
    """Read a compiled pipeline YAML (pipeline spec, optional platform spec) or answer 400 like KFP."""
    import yaml  # kfp's own dependency; only YAML packages are modelled

    if not filename.endswith((".yaml", ".yml")):
        raise ApiError("INVALID_ARGUMENT", fallback)
    try:
        docs = [d for d in yaml.safe_load_all(data) if d]
    except yaml.YAMLError:
        raise ApiError("INVALID_ARGUMENT", fallback) from None
    if not docs or not isinstance(docs[0], dict) or "pipelineInfo" not in docs[0] or "root" not in docs[0]:
        raise ApiError("INVALID_ARGUMENT", fallback)
    return docs[0], (docs[1] if len(docs) > 1 else None)


def _parse_filter(raw: str) -> list[tuple[str, str, Any]]:
    """Decode a v2beta1 Filter into (key, op, value) triples as the API server does: the decoded query value is
    URL-unescaped once more, Go's ``url.QueryUnescape`` (``+`` is a space, a ``%`` not followed by two hex digits
    is an error), then read as JSON (kubeflow/pipelines 2.17.0, backend/src/apiserver/server/
    list_request_util.go:139-165 ``parseAPIFilter``; pipeline_server.go:555 does the same for pipelines)."""
    if not raw:
        return []
    if re.search(r"%(?![0-9A-Fa-f]{2})", raw):
        raise ApiError("INVALID_ARGUMENT", f"Invalid input error: failed to parse valid filter from {raw!r}: "
                                           f"invalid URL escape")
    try:
        spec = json.loads(unquote_plus(raw))
    except ValueError:
        raise ApiError("INVALID_ARGUMENT", f"Invalid input error: failed to parse valid filter from {raw!r}") from None
    predicates = []
    for p in spec.get("predicates", []):
        op = p.get("operation")
        op = _FILTER_OPS.get(op, op) if isinstance(op, int) else op
        if op not in _FILTER_OPS.values():
            raise ApiError("INVALID_ARGUMENT", f"Invalid filter operation: {p.get('operation')!r}")
        value: Any = None
        for camel, snake in (("stringValue", "string_value"), ("intValue", "int_value"),
                             ("longValue", "long_value"), ("timestampValue", "timestamp_value")):
            if camel in p or snake in p:
                value = p.get(camel, p.get(snake))
        for camel, snake in (("stringValues", "string_values"), ("intValues", "int_values"),
                             ("longValues", "long_values")):
            if camel in p or snake in p:
                value = (p.get(camel) or p.get(snake) or {}).get("values", [])
        if isinstance(value, str) and p.get("key") == "created_at":
            value = int(_dt.datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp())
        predicates.append((p.get("key", ""), op, value))
    return predicates


def _matches(item_value: Any, op: str, value: Any) -> bool:
    if op == "EQUALS":
        return item_value == value
    if op == "NOT_EQUALS":
        return item_value != value
    if op == "IN":
        return item_value in value
    if op == "IS_SUBSTRING":
        return str(value) in str(item_value)
    item_value, value = int(item_value), int(value)
    return {"GREATER_THAN": item_value > value, "GREATER_THAN_EQUALS": item_value >= value,
            "LESS_THAN": item_value < value, "LESS_THAN_EQUALS": item_value <= value}[op]


def _paginate(req, items: list[dict], fields: dict[str, str], id_field: str,
              case_insensitive: set[str] = frozenset()) -> tuple[list[dict], str, int]:
    """Filter, sort and page ``items`` the way KFP's list.Options does (opaque page tokens)."""
    if req.arg("page_token"):
        try:
            state = json.loads(base64.urlsafe_b64decode(req.arg("page_token").encode()))
        except ValueError:
            raise ApiError("INVALID_ARGUMENT", "Invalid input error: invalid page token") from None
    else:
        state = {"offset": 0, "sort_by": req.arg("sort_by"), "filter": req.arg("filter")}

    def field(key: str) -> str:
        if key not in fields:
            raise ApiError("INVALID_ARGUMENT", f"Invalid input error: {key!r} is not a valid field")
        return fields[key]

    def norm(key: str, v: Any) -> Any:
        return v.lower() if key in case_insensitive and isinstance(v, str) else v

    for key, op, value in _parse_filter(state["filter"]):
        name = field(key)
        value = [norm(key, v) for v in value] if isinstance(value, list) else norm(key, value)
        items = [i for i in items if _matches(norm(key, i.get(name)), op, value)]

    sort_key, _, direction = state["sort_by"].partition(" ")
    if direction.strip() not in ("", "asc", "desc"):
        raise ApiError("INVALID_ARGUMENT", f"Invalid input error: invalid sort_by {state['sort_by']!r}")
    name = field(sort_key) if sort_key else "_created"
    items = sorted(items, key=lambda i: (i[name] if i.get(name) is not None else "", i[id_field]),
                   reverse=direction.strip() == "desc")

    size = int(req.arg("page_size") or 0) or _DEFAULT_PAGE_SIZE
    size = min(size, _MAX_PAGE_SIZE)
    start = state["offset"]
    page = items[start:start + size]
    token = ""
    if start + size < len(items):
        token = base64.urlsafe_b64encode(json.dumps({**state, "offset": start + size}).encode()).decode()
    return page, token, len(items)


def _upload_file(req: Request, fallback: str) -> tuple[str, tuple[dict, dict | None]]:
    """The ``uploadfile`` part of a multipart/form-data body, parsed as a pipeline package."""
    ctype = req.headers.get("content-type", "")
    if not ctype.startswith("multipart/form-data"):
        raise ApiError("INVALID_ARGUMENT", fallback)
    message = email.parser.BytesParser(policy=email.policy.HTTP).parsebytes(
        f"Content-Type: {ctype}\r\n\r\n".encode() + req.raw)
    for part in message.iter_parts():
        if part.get_param("name", header="content-disposition") == "uploadfile":
            filename = part.get_filename() or ""
            return filename, _parse_package(filename, part.get_payload(decode=True) or b"", fallback)
    raise ApiError("INVALID_ARGUMENT", fallback)
