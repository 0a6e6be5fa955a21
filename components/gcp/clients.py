"""Vertex AI clients, built in one place.

Every `google.cloud.aiplatform_v1` client in the project comes from `vertex_client` (or `job_client`), and the
Dataflow clients (components/preprocess/dataflow.py) from `google_client`, with the same rules:

- the regional endpoint `{location}-aiplatform.googleapis.com` unless `api_endpoint` names another; a regional
  endpoint of another region than `location` is refused before any call (`RegionMismatch`);
- the REST transport by default (what the tests exercise against the stand-ins; "grpc" is accepted);
- `AnonymousCredentials` for an `http://` endpoint (a local emulator or stand-in), so no real credentials ever
  travel unencrypted; otherwise the given credentials, or Application Default Credentials;
- no ADC where some are needed becomes a `PermissionDenied` that says how to provide them.

`VertexConnection` bundles that with the retry policy (components/gcp/retry.py) for a project and region:
the registry and the Vertex AI Pipelines client each hold one. The generated clients are imported lazily, so
importing this module stays cheap.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import re
import time
from typing import Any, Callable

from components.gcp.errors import PermissionDenied, RegionMismatch
from components.gcp.retry import RetryPolicy

ENDPOINT_REGION_RE = re.compile(r"^(?:https?://)?(?P<region>[a-z]+-[a-z]+\d+)-aiplatform\.googleapis\.com(?::\d+)?/?$")
TRANSPORTS = ("rest", "grpc")


def api_endpoint_for(location: str, api_endpoint: str | None = None) -> str:
    """The endpoint for `location`: `api_endpoint` when given (checked against the region), else the regional one."""
    endpoint = api_endpoint or f"{location}-aiplatform.googleapis.com"
    m = ENDPOINT_REGION_RE.match(endpoint)
    if m and m.group("region") != location:
        raise RegionMismatch(f"api_endpoint {endpoint} serves region {m.group('region')}, but the location is "
                             f"{location}; use {location}-aiplatform.googleapis.com or location={m.group('region')}.")
    return endpoint


def credentials_for(api_endpoint: str, credentials: Any = None) -> Any:
    """The credentials to send: anonymous ones to an http:// endpoint, else `credentials` (None: ADC)."""
    if credentials is None and api_endpoint.startswith("http://"):
        from google.auth.credentials import AnonymousCredentials

        return AnonymousCredentials()
    return credentials


def google_client(client_class: type, api_endpoint: str, *, credentials: Any = None, transport: str = "rest") -> Any:
    """A generated Google Cloud client (`client_class`, e.g. aiplatform_v1's `ModelServiceClient` or dataflow_v1beta3's
    `JobsV1Beta3Client`) for one endpoint, with the credentials rules above."""
    if transport not in TRANSPORTS:
        raise ValueError(f"transport must be 'rest' or 'grpc', got {transport!r}")
    from google.api_core.client_options import ClientOptions
    from google.auth import exceptions as auth_exceptions

    try:
        return client_class(transport=transport, credentials=credentials_for(api_endpoint, credentials),
                            client_options=ClientOptions(api_endpoint=api_endpoint))
    except auth_exceptions.DefaultCredentialsError as e:
        raise PermissionDenied(
            f"No Google Cloud credentials found ({e}). Locally run `gcloud auth application-default login`; on GKE "
            f"use Workload Identity (a Kubernetes service account bound to a Google service account); on Vertex AI "
            f"the job's service account is used.") from e


def vertex_client(client_class: type, location: str, *, api_endpoint: str | None = None, credentials: Any = None,
                  transport: str = "rest") -> Any:
    """An `aiplatform_v1` client (`client_class`, e.g. `ModelServiceClient`) for one region."""
    return google_client(client_class, api_endpoint_for(location, api_endpoint), credentials=credentials,
                         transport=transport)


def job_client(location: str, *, api_endpoint: str | None = None, credentials: Any = None) -> Any:
    """A `JobServiceClient` (CustomJobs, BatchPredictionJobs) for one region."""
    from google.cloud import aiplatform_v1

    return vertex_client(aiplatform_v1.JobServiceClient, location, api_endpoint=api_endpoint, credentials=credentials)


def location_of(resource_name: str) -> tuple[str, str]:
    """(project, location) of a resource name `projects/P/locations/L/...`; ValueError for anything else."""
    m = re.match(r"^projects/([^/]+)/locations/([^/]+)(?:/|$)", resource_name or "")
    if not m:
        raise ValueError(f"Not a Vertex AI resource name: {resource_name!r} (expected projects/PROJECT/locations/"
                         f"REGION/...)")
    return m.group(1), m.group(2)


def rfc3339(value: Any, *, timespec: str = "auto") -> str:
    """A timestamp from an API answer (a datetime, naive ones being UTC, or text) as RFC 3339 in UTC (`...Z`)."""
    if not value:
        return ""
    if isinstance(value, _dt.datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=_dt.timezone.utc)
        return value.astimezone(_dt.timezone.utc).isoformat(timespec=timespec).replace("+00:00", "Z")
    return str(value)


@dataclasses.dataclass
class VertexConnection:
    """One project and region of Vertex AI: where calls go and how they are made (one retry policy).

    project, location: the resources live under `projects/{project}/locations/{location}`.
    api_endpoint: defaults to `{location}-aiplatform.googleapis.com`; tests pass a stand-in's
        `http://127.0.0.1:PORT`. A regional endpoint of another region is refused.
    credentials: google.auth credentials; None means Application Default Credentials (anonymous for http://).
    transport: "rest" (default) or "grpc".
    retry: how calls are retried and their refusals explained (see RetryPolicy).
    """

    project: str
    location: str
    api_endpoint: str | None = None
    credentials: Any = None
    transport: str = "rest"
    retry: RetryPolicy = dataclasses.field(default_factory=RetryPolicy)

    def __post_init__(self):
        if self.transport not in TRANSPORTS:
            raise ValueError(f"transport must be 'rest' or 'grpc', got {self.transport!r}")
        self.api_endpoint = api_endpoint_for(self.location, self.api_endpoint)

    @property
    def parent(self) -> str:
        return f"projects/{self.project}/locations/{self.location}"

    def client(self, client_class: type) -> Any:
        return vertex_client(client_class, self.location, api_endpoint=self.api_endpoint,
                             credentials=self.credentials, transport=self.transport)

    def call(self, what: str, fn: Callable[[], Any], *, idempotent: bool = False, service_account: str = "",
             artifact_uri: str = "") -> Any:
        """`fn()` under the retry policy, with refusals explained for this project and region."""
        return self.retry.call(what, fn, parent=self.parent, api_endpoint=self.api_endpoint,
                               credentials=self.credentials, idempotent=idempotent,
                               service_account=service_account, artifact_uri=artifact_uri)


class VertexService:
    """Base of the classes that work in one project and region of Vertex AI (the Model Registry, Vertex AI
    Pipelines): their connection (`vertex`), its names, and the clock they back off and wait with."""

    def __init__(self, project: str, location: str, *, api_endpoint: str | None, credentials: Any, transport: str,
                 retry: RetryPolicy, monotonic: Callable[[], float] = time.monotonic):
        self.vertex = VertexConnection(project, location, api_endpoint=api_endpoint, credentials=credentials,
                                       transport=transport, retry=retry)
        self.project, self.location = project, location
        self.parent, self.api_endpoint = self.vertex.parent, self.vertex.api_endpoint
        self._sleep, self._monotonic = retry.sleep, monotonic
