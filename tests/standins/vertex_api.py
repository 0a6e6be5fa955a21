"""A local stand-in for the Vertex AI v1 REST API: the Model Registry, batch prediction, pipeline jobs, schedules.

Tests point the real client (`google.cloud.aiplatform_v1`, `transport="rest"`) at it:

    with VertexStandIn() as vertex:
        client = aiplatform_v1.ModelServiceClient(
            transport="rest", credentials=AnonymousCredentials(),
            client_options={"api_endpoint": vertex.api_endpoint})  # http://127.0.0.1:PORT

It is stdlib only (on the shared stand-in base, base.py), keeps its state in memory and serves one region, like a
regional endpoint (`{location}-aiplatform.googleapis.com`). It follows the public Vertex AI v1 REST reference
(`projects.locations.models`, `.batchPredictionJobs`, `.pipelineJobs`, `.schedules`, `.operations`) and the
google.cloud.aiplatform.v1 protos; one class serves them all, as one endpoint does, each service in its own
module: ModelService here, BatchPredictionService in vertex_batch.py, PipelineService (pipeline jobs and schedules)
in vertex_pipelines.py, what they share in vertex_common.py.

ModelService:
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
  version that had it: `ID@ALIAS` names one version); `-alias` removes it; `default` may move but not be
  removed; adding and removing the same alias in one request cancel out. The request is the version's name and
  the aliases, nothing else: no etag or expected holder, so the move is unconditional, whoever holds the alias
  (googleapis/googleapis at f8291d2b, google/cloud/aiplatform/v1/model_service.proto:157-164 the route,
  :619-646 MergeVersionAliasesRequest; GetModel's `@alias`: :326-338; UpdateModel cannot set aliases:
  :549-550; `Model.etag` is for UpdateModel: model.proto:431-433). A registry that must not move an alias
  someone else moved reads it (`GET ...@ALIAS`) right before merging, as components/registry/vertex.py does.
- `add_model(...)` registers a model as earlier uploads would have, for tests that start from one.

Resource names in responses use the project number, as Vertex does, whichever of id or number the request
used. Requests for another region than the one served, or naming resources in another region, get 400
INVALID_ARGUMENT. Errors use Google's JSON error body (`{"error": {"code", "message", "status", "details"}}`),
and `fail_next()` scripts errors (403 PERMISSION_DENIED, 429 RESOURCE_EXHAUSTED, ...) for the next calls, or
(`rpc=UPLOAD_RESULT`, `rpc=BATCH_RESULT`) for the outcome of the next upload operations or batch jobs.
Every request is recorded in `requests`. No authentication is checked (tests use anonymous credentials).
"""

from __future__ import annotations

import base64
import copy
import re
import time
from typing import Any, Callable

from tests.standins.base import ApiError, Request, route
from tests.standins.vertex_batch import BATCH_RESULT, BatchPredictionService
from tests.standins.vertex_common import API, LOCATION, VertexService, filter_terms
from tests.standins.vertex_pipelines import PIPELINE_RPCS, PipelineService, int_enums

__all__ = ["BATCH_RESULT", "UPLOAD_RESULT", "VertexStandIn"]

# Artifact Registry (LOCATION-docker.pkg.dev) and Container Registry (gcr.io, REGION.gcr.io) image hosts.
CONTAINER_REGISTRY_RE = re.compile(r"^([a-z0-9-]+-docker\.pkg\.dev|([a-z]+\.)?gcr\.io)/[^\s]+$")
# fail_next(rpc=UPLOAD_RESULT): the upload's operation finishes with that error instead of a new version.
UPLOAD_RESULT = "UploadModel:operation"

ALIAS_RE = re.compile(r"^[a-z][a-zA-Z0-9-]{0,126}[a-z0-9-]$")
MODEL_ID_RE = re.compile(r"^[a-z_][a-z0-9_-]{0,62}$")


def _parse_filter(text: str, allowed: set[str]) -> list[tuple[str, str, str | None]]:
    """A models filter as (field, op, value) triples: `model`, `display_name`, `base_model_name` with `=` and `!=`;
    `labels.KEY` with `=`, `!=` and `:*` (presence); `labels:KEY` (presence); only the fields in `allowed`."""
    terms = []
    for _, field, op, value in filter_terms(text, r'labels\."[^"]+"|[A-Za-z_][A-Za-z0-9_.\-]*'):
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


class ModelService(VertexService):
    """The Model Registry part of VertexStandIn (see the module docstring)."""

    _models: dict[str, dict]  # model id -> {"versions": {version id: Model JSON}, "next": int, "createTime"}
    _operations: dict[str, dict]
    polls_until_done: int

    def _model_routes(self) -> list:
        models = LOCATION + "/models"
        return [
            route("POST", models + ":upload", "UploadModel", self._UploadModel),
            route("GET", models, "ListModels", self._ListModels),
            route("GET", models + r"/(?P<model>[^/:]+):listVersions", "ListModelVersions", self._ListModelVersions),
            route("POST", models + r"/(?P<model>[^/:]+):mergeVersionAliases", "MergeVersionAliases",
                  self._MergeVersionAliases),
            route("GET", models + r"/(?P<model>[^/:]+)", "GetModel", self._GetModel),
            route("GET", r"/(?:v1|ui)/projects/(?P<project>[^/]+)/locations/(?P<location>[^/]+)/"
                         r"(?:(?:models/(?P<model>[^/:@]+)|schedules/(?P<schedule_of_op>[^/:]+))/)?"
                         r"operations/(?P<operation>[^/:]+)", "GetOperation", self._GetOperation),
        ]

    # -- test controls ---------------------------------------------------------------------------------

    def add_model(self, model_id: str, display_name: str, versions: tuple[str, ...] = ("1",),
                  aliases: dict[str, str] | None = None, *, artifact_uri: str = "") -> str:
        """Registers a model as uploads would have: `versions`, each alias on the version it names (`default` on
        the last one unless `aliases` says otherwise). Returns its resource name."""
        aliases = {"default": versions[-1], **(aliases or {})}
        if not set(aliases.values()) <= set(versions):
            raise ValueError(f"aliases {aliases} must name versions among {versions}")
        with self.lock:
            if model_id in self._models:
                raise ValueError(f"model {model_id} exists already")
            now = self.now()
            self._models[model_id] = {"versions": {}, "next": max(int(v) for v in versions) + 1, "createTime": now}
            for version_id in versions:
                self._models[model_id]["versions"][version_id] = {
                    "name": f"{self._location_path()}/models/{model_id}", "displayName": display_name,
                    "versionId": version_id, "versionAliases": sorted(a for a, v in aliases.items() if v == version_id),
                    "versionCreateTime": now, "versionUpdateTime": now, "artifactUri": artifact_uri,
                    "createTime": now, "updateTime": now}
        return f"projects/{self.project}/locations/{self.location}/models/{model_id}"

    def versions(self, model_id: str) -> list[dict]:
        """The stored versions of a model (Model JSON), oldest first."""
        with self.lock:
            return [copy.deepcopy(v) for _, v in sorted(self._models[model_id]["versions"].items(),
                                                        key=lambda kv: int(kv[0]))]

    def model_ids(self) -> list[str]:
        with self.lock:
            return list(self._models)

    # -- helpers ---------------------------------------------------------------------------------------

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
    def _validate_alias(alias: str) -> None:
        if not isinstance(alias, str) or not ALIAS_RE.match(alias):
            raise ApiError("INVALID_ARGUMENT", f"Invalid version alias {alias!r}: must match "
                                               f"[a-z][a-zA-Z0-9-]{{0,126}}[a-z-0-9].")

    # -- ModelService ----------------------------------------------------------------------------------

    def _UploadModel(self, req: Request) -> dict:
        body = req.json()
        model = body.get("model")
        if not isinstance(model, dict):
            raise ApiError("INVALID_ARGUMENT", "model is required.")
        if not model.get("displayName"):
            raise ApiError("INVALID_ARGUMENT", "model.display_name is required.")
        image = (model.get("containerSpec") or {}).get("imageUri")
        if not image:
            raise ApiError("INVALID_ARGUMENT", "model.container_spec.image_uri is required for a custom model.")
        if not CONTAINER_REGISTRY_RE.match(image):
            # ModelContainerSpec.image_uri: "This URI must identify an image in Artifact Registry or Container
            # Registry" (google/cloud/aiplatform/v1/model.proto).
            raise ApiError("INVALID_ARGUMENT", f"model.container_spec.image_uri must name an image in Artifact "
                                               f"Registry or Container Registry, got {image!r}.")
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
            self._models[model_id] = {"versions": {}, "next": 1, "createTime": self.now()}  # reserved until done
            new_model = True
        operation_id = self._next_id()
        name = f"{self._location_path()}/models/{model_id}/operations/{operation_id}"
        now = self.now()
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
        now = self.now()
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

    def _GetOperation(self, req: Request) -> dict:
        op = self._operations.get(req.params["operation"])
        if op is None or (req.params.get("model") and f"/models/{req.params['model']}/" not in op["name"]):
            raise ApiError("NOT_FOUND", f"Operation {req.params['operation']} not found.")
        if op["kind"] != "upload":
            return copy.deepcopy(op["result"])
        if not op["done"]:
            op["polls_left"] -= 1
            if op["polls_left"] <= 0:
                op["done"] = True
                op["updateTime"] = self.now()
                error = self.take_failure(UPLOAD_RESULT, req)
                if error is not None:
                    op["error"] = {"code": error.code, "message": error.message}
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

    def _GetModel(self, req: Request) -> dict:
        model_id, ref = self._split_model_ref(req.params["model"])
        return copy.deepcopy(self._resolve_version(model_id, ref))

    def _ListModels(self, req: Request) -> dict:
        terms = _parse_filter(req.arg("filter"), {"model", "display_name", "labels", "base_model_name"})
        items = []
        for model_id, stored in self._models.items():
            if not stored["versions"]:
                continue
            default = self._resolve_version(model_id, "default")
            if _matches(default, terms, model_id):
                items.append(default)
        items.sort(key=lambda m: m["createTime"])
        return self._page(items, req, "models")

    def _ListModelVersions(self, req: Request) -> dict:
        model_id, ref = self._split_model_ref(req.params["model"])
        if ref:
            raise ApiError("INVALID_ARGUMENT", "ListModelVersions takes a model name without a version.")
        stored = self._model(model_id)
        terms = _parse_filter(req.arg("filter"), {"labels"})
        items = [v for _, v in sorted(stored["versions"].items(), key=lambda kv: int(kv[0]))
                 if _matches(v, terms, model_id)]
        return self._page(items, req, "models")

    def _MergeVersionAliases(self, req: Request) -> dict:
        """model_service.proto:619-646 at f8291d2b: `name` with a version, `version_aliases`; no precondition."""
        body = req.json()
        model_id, ref = self._split_model_ref(req.params["model"])
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
        now = self.now()
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


class VertexStandIn(ModelService, BatchPredictionService, PipelineService):
    """The stand-in server. Use as a context manager; `api_endpoint` is what the client's api_endpoint takes.

    `storage_root` is the folder gs:// paths live in (gs://BUCKET/PATH is STORAGE_ROOT/BUCKET/PATH) and `serve`
    the model server batch prediction jobs send instances to (vertex_batch.py)."""

    scripted_outcomes = (UPLOAD_RESULT, BATCH_RESULT)

    def __init__(self, project: str = "test-project", project_number: str = "123456789012",
                 location: str = "us-central1", *, polls_until_done: int = 1, max_page_size: int = 100,
                 batch_polls: tuple[int, int] = (1, 1), pipeline_polls: tuple[int, int] = (1, 1),
                 schedule_request_updatable: bool = True, storage_root: str | None = None,
                 serve: Callable[[list], list] | None = None, clock: Callable[[], float] = time.time):
        super().__init__(clock=clock)
        self.project = project
        self.project_number = project_number
        self.location = location
        self.polls_until_done = polls_until_done  # operation GETs before an upload is done (>= 1)
        self.max_page_size = max_page_size  # the server caps page sizes, like the real one may
        self._counter = 0
        self._models = {}
        self._operations = {}
        self._init_batch(storage_root, serve, batch_polls)
        self._init_pipelines(pipeline_polls, schedule_request_updatable)

    def routes(self) -> list:
        return self._model_routes() + self._batch_routes() + self._pipeline_routes()

    def render(self, request: Request, payload: Any) -> Any:
        # The generated REST clients ask for `$alt=json;enum-encoding=int`: the real service then writes the
        # enums of these answers as numbers.
        if request.rpc in PIPELINE_RPCS and "enum-encoding=int" in request.arg("$alt"):
            return int_enums(payload)
        return payload
