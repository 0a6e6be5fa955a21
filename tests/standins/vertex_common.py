"""What the services of the Vertex AI stand-in (vertex_api.py) share: the regional endpoint and its resource names.

`VertexService` is the base of each service's part of `VertexStandIn` (ModelService in vertex_api.py,
BatchPredictionService in vertex_batch.py, PipelineService in vertex_pipelines.py). It holds what the public v1 REST
reference says of every call: requests name `projects/{project}/locations/{location}/...` and a regional endpoint
serves one location (another one is INVALID_ARGUMENT, an unknown project PERMISSION_DENIED); resource names in
answers use the project number; errors are Google's JSON error body, and a scripted PERMISSION_DENIED or
RESOURCE_EXHAUSTED is worded as the real ones are (the IAM permission the call needs, the quota); lists page with
opaque tokens (AIP-158) and filter with `FIELD OP VALUE` terms joined by AND (AIP-160); labels follow the
resource label rules.
"""

from __future__ import annotations

import base64
import copy
import datetime as _dt
import json
import re
from typing import Any

from tests.standins.base import ApiError, Request, StandIn

API = "type.googleapis.com/google.cloud.aiplatform.v1"

# The IAM permission each call needs (what a real PERMISSION_DENIED names).
PERMISSIONS = {
    "UploadModel": "aiplatform.models.upload", "UploadModel:operation": "storage.objects.get",
    "GetModel": "aiplatform.models.get", "ListModels": "aiplatform.models.list",
    "ListModelVersions": "aiplatform.models.list", "MergeVersionAliases": "aiplatform.models.update",
    "GetOperation": "aiplatform.operations.list",
    "CreateBatchPredictionJob": "aiplatform.batchPredictionJobs.create",
    "GetBatchPredictionJob": "aiplatform.batchPredictionJobs.get",
    "CancelBatchPredictionJob": "aiplatform.batchPredictionJobs.cancel",
    "CreatePipelineJob": "aiplatform.pipelineJobs.create", "GetPipelineJob": "aiplatform.pipelineJobs.get",
    "CreateSchedule": "aiplatform.schedules.create", "GetSchedule": "aiplatform.schedules.get",
    "ListSchedules": "aiplatform.schedules.list", "UpdateSchedule": "aiplatform.schedules.update",
    "PauseSchedule": "aiplatform.schedules.pause", "ResumeSchedule": "aiplatform.schedules.resume",
    "DeleteSchedule": "aiplatform.schedules.delete",
}

LABEL_KEY_RE = re.compile(r"^[a-z][a-z0-9_-]{0,62}$")
LABEL_VALUE_RE = re.compile(r"^[a-z0-9_-]{0,63}$")
LOCATION = r"/v1/projects/(?P<project>[^/]+)/locations/(?P<location>[^/]+)"  # the start of every resource path


def filter_terms(text: str, field: str) -> list[tuple[str, str, str, str]]:
    """The terms of an AIP-160 filter (`FIELD OP VALUE`, joined by AND; OP one of `=`, `!=`, `:`; VALUE a word or a
    double-quoted string with backslash escapes) as (term, field, op, value) with the value unquoted. `field` is a
    regex of the field names the caller takes; anything else is INVALID_ARGUMENT."""
    text = (text or "").strip()
    if not text:
        return []
    terms = []
    for part in re.split(r"\s+AND\s+", text):
        m = re.fullmatch(rf'\s*(?P<field>{field})\s*(?P<op>!=|=|:)\s*(?P<value>"(?:[^"\\]|\\.)*"|[^\s"]+)\s*', part)
        if not m:
            raise ApiError("INVALID_ARGUMENT", f"Invalid filter: {text!r}")
        value = m.group("value")
        if value.startswith('"'):
            value = re.sub(r"\\(.)", r"\1", value[1:-1])
        terms.append((part.strip(), m.group("field"), m.group("op"), value))
    return terms


class VertexService(StandIn):
    """The part of `VertexStandIn` every service uses (the state it reads is set up by VertexStandIn)."""

    name = "Vertex AI"
    content_type = "application/json; charset=UTF-8"
    project: str
    project_number: str
    location: str
    max_page_size: int
    _counter: int

    # -- the endpoint ----------------------------------------------------------------------------------

    def check(self, request: Request) -> None:
        project, location = request.params.get("project"), request.params.get("location")
        if project not in (self.project, self.project_number):
            raise ApiError("PERMISSION_DENIED",
                           f"Permission denied on resource project {project} (or it may not exist).")
        if location != self.location:
            raise ApiError("INVALID_ARGUMENT",
                           f"Request is for location '{location}', but this is the regional endpoint of "
                           f"'{self.location}' ({self.location}-aiplatform.googleapis.com).")

    def scripted_error(self, status: str, rpc: str, request: Request) -> tuple[str, list]:
        params = request.params
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
        return super().scripted_error(status, rpc, request)

    # -- resources -------------------------------------------------------------------------------------

    def _location_path(self) -> str:
        return f"projects/{self.project_number}/locations/{self.location}"

    def _next_id(self) -> str:
        self._counter += 1
        return str(4_000_000_000_000_000_000 + self._counter * 7919)

    def _moment(self) -> _dt.datetime:
        return _dt.datetime.fromtimestamp(self.clock(), _dt.timezone.utc)

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
    def _int64(value: Any, what: str) -> int:
        try:
            return int(value)
        except (TypeError, ValueError):
            raise ApiError("INVALID_ARGUMENT", f"Invalid value for {what}: {value!r}.") from None

    # -- lists -----------------------------------------------------------------------------------------

    def _page(self, items: list, request: Request, key: str) -> dict:
        size = int(request.arg("pageSize") or request.arg("page_size") or 0)
        if size < 0:
            raise ApiError("INVALID_ARGUMENT", "page_size must not be negative.")
        size = min(size or 100, self.max_page_size)
        token = request.arg("pageToken") or request.arg("page_token")
        start = _decode_token(token) if token else 0
        page = items[start:start + size]
        response: dict = {}
        if page:
            response[key] = [copy.deepcopy(item) for item in page]
        if start + size < len(items):
            response["nextPageToken"] = _encode_token(start + size)
        return response


def _encode_token(offset: int) -> str:
    return base64.urlsafe_b64encode(json.dumps({"o": offset}).encode()).decode()


def _decode_token(token: str) -> int:
    try:
        return int(json.loads(base64.urlsafe_b64decode(token.encode()))["o"])
    except Exception:
        raise ApiError("INVALID_ARGUMENT", f"Invalid page token: {token}") from None
