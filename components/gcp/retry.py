"""One retry/backoff policy for Google Cloud calls, and the messages for refusals a user can fix.

`RetryPolicy.call(what, fn, ...)` runs one API call:

- HTTP 429 / RESOURCE_EXHAUSTED (quota, rate limits) is retried with exponential backoff and full jitter (each
  wait drawn uniformly below the doubling ceiling, as google-api-core's own retries do:
  google/api_core/retry/retry_base.py:118-121, exponential_sleep_generator, at v2.44.0), so that the many
  steps a quota refusal stops at once do not all come back at the same second; waiting at least the delay the
  server suggests (google.rpc.RetryInfo); a 429 means the request was refused, so every call may be
  retried. After `max_attempts` it becomes `QuotaExhausted`, naming the quota page.
- Transient failures (5xx, deadline exceeded, a dropped connection) are retried the same way, but only for
  calls marked `idempotent` (reads, polls): a create that timed out may have happened. Then `Unavailable`.
- 403 becomes `PermissionDenied` naming the role to grant (roles/aiplatform.user, and
  roles/iam.serviceAccountUser when the call runs something as a service account) and the permission the
  API's ErrorInfo names; 401 says how to provide credentials.
- 400 that mentions a location or region becomes `RegionMismatch`; any other 400 becomes `Rejected`.
- Everything else (404, 409, ...) is raised as the client raised it: what "not found" or "already exists"
  means is the caller's business.

`is_transient(exc)` is the same judgement for anything polled (Kubernetes and KFP API errors too), so the job
follower (components/gcp/jobs.py) rides out the same blips.
"""

from __future__ import annotations

import dataclasses
import logging
import random
import re
import time
from typing import Any, Callable

from components.gcp.errors import PermissionDenied, QuotaExhausted, Rejected, RegionMismatch, Unavailable

log = logging.getLogger(__name__)

REQUIRED_ROLE = "roles/aiplatform.user"
ACT_AS_ROLE = "roles/iam.serviceAccountUser"
ACT_AS_PERMISSION = "iam.serviceAccounts.actAs"


def is_transient(exc: BaseException) -> bool:
    """Whether `exc` is a failure that the same request may not meet again: a 5xx, a timeout, a dropped link."""
    if isinstance(exc, (ConnectionError, TimeoutError)):
        return True
    try:
        from google.api_core import exceptions as gexc

        if isinstance(exc, (gexc.ServerError, gexc.DeadlineExceeded)):
            return True
        if isinstance(exc, gexc.GoogleAPICallError):
            return False
    except ImportError:
        pass
    try:
        import requests

        if isinstance(exc, (requests.exceptions.ConnectionError, requests.exceptions.Timeout)):
            return True
    except ImportError:
        pass
    try:
        import urllib3

        if isinstance(exc, urllib3.exceptions.HTTPError):  # what the kubernetes and KFP clients' transport raises
            return True
    except ImportError:
        pass
    status = getattr(exc, "status", None)  # kubernetes' and kfp_server_api's ApiException
    return isinstance(status, int) and status >= 500


def retry_delay(error: Any) -> float:
    """The server's suggested delay (google.rpc.RetryInfo) in seconds, or 0."""
    for detail in getattr(error, "details", None) or []:
        delay = detail.get("retryDelay") if isinstance(detail, dict) else getattr(detail, "retry_delay", None)
        if isinstance(delay, str) and delay.endswith("s"):
            try:
                return float(delay[:-1])
            except ValueError:
                return 0.0
        if delay is not None and hasattr(delay, "seconds"):
            return delay.seconds + getattr(delay, "nanos", 0) / 1e9
    return 0.0


def permission_message(what: str, error: Any, *, parent: str, credentials: Any = None, service_account: str = "",
                       artifact_uri: str = "") -> str:
    """What to grant after a 403: the role, the missing permission, the run-as account, the artifacts' bucket."""
    permission = (getattr(error, "metadata", None) or {}).get("permission", "")
    project = parent.split("/")[1] if parent.startswith("projects/") else parent
    identity = getattr(credentials, "service_account_email", None)
    caller = (f"the caller ({identity})" if identity else
              "the caller (your Application Default Credentials; in a pipeline step, its service account)")
    text = getattr(error, "message", None) or str(error)
    if permission == ACT_AS_PERMISSION or ACT_AS_PERMISSION in text:
        account = service_account or "the run-as service account"
        return (f"Permission denied to {what}: {text} Runs execute as {account}, and {caller} may only launch them "
                f"with {ACT_AS_ROLE} (Service Account User) on that account: `gcloud iam service-accounts "
                f"add-iam-policy-binding {account} --member=user:YOU@EXAMPLE.COM --role={ACT_AS_ROLE}` (or "
                f"--member=serviceAccount:CALLER for a service account).")
    message = (f"Permission denied when trying to {what} in {parent}: {text} Grant {caller} {REQUIRED_ROLE} "
               f"(Vertex AI User) on project {project}")
    if permission:
        message += f"; the missing permission is {permission}"
    if service_account:
        message += (f"; to run as {service_account} the caller also needs {ACT_AS_ROLE} on that service account, "
                    f"which itself needs {REQUIRED_ROLE} and write access (roles/storage.objectAdmin) to the "
                    f"Cloud Storage paths the run writes")
    if artifact_uri:
        bucket = artifact_uri[len("gs://"):].split("/", 1)[0]
        message += (f". Registering also needs read access to the model artifacts: roles/storage.objectViewer "
                    f"on gs://{bucket} for {caller} and for the Vertex AI Service Agent "
                    f"(service-PROJECT_NUMBER@gcp-sa-aiplatform.iam.gserviceaccount.com), which serves them")
    return message + "."


@dataclasses.dataclass
class RetryPolicy:
    """How every Google Cloud call is retried: `max_attempts` tries, each wait drawn by `uniform(0, ceiling)`
    (full jitter) under a ceiling doubling from `initial_backoff_s` up to `max_backoff_s`, and at least the
    server's suggested delay; `sleep` and `uniform` are injectable so tests never wait and know each wait."""

    max_attempts: int = 5
    initial_backoff_s: float = 1.0
    max_backoff_s: float = 32.0
    sleep: Callable[[float], None] = time.sleep
    uniform: Callable[[float, float], float] = random.uniform

    def __post_init__(self):
        if self.max_attempts < 1:
            raise ValueError("max_attempts must be at least 1")

    def call(self, what: str, fn: Callable[[], Any], *, parent: str, api_endpoint: str = "", credentials: Any = None,
             idempotent: bool = False, service_account: str = "", artifact_uri: str = "") -> Any:
        """Returns `fn()`; `what` completes "trying to ..." in messages, `parent` is projects/P/locations/L."""
        from google.api_core import exceptions as gexc

        delay = self.initial_backoff_s
        location = parent.rsplit("/", 1)[-1]
        for attempt in range(1, self.max_attempts + 1):
            try:
                return fn()
            except gexc.TooManyRequests as e:  # HTTP 429 / RESOURCE_EXHAUSTED: quota or rate limit
                if attempt == self.max_attempts:
                    raise QuotaExhausted(
                        f"Vertex AI refused to {what} for quota (RESOURCE_EXHAUSTED) {self.max_attempts} times in "
                        f"{parent}; the last answer was: {e.message} Wait and retry, or ask for more Vertex AI "
                        f"quota (IAM & Admin > Quotas, service aiplatform.googleapis.com, region {location}).") from e
                wait = min(self.max_backoff_s, max(self.uniform(0.0, delay), retry_delay(e)))
                log.warning("Vertex AI quota refusal (%s) on attempt %d/%d to %s; retrying in %.1fs", e.message,
                            attempt, self.max_attempts, what, wait)
            except gexc.Forbidden as e:  # HTTP 403 / PERMISSION_DENIED
                raise PermissionDenied(permission_message(what, e, parent=parent, credentials=credentials,
                                                          service_account=service_account,
                                                          artifact_uri=artifact_uri)) from e
            except gexc.Unauthorized as e:  # HTTP 401
                raise PermissionDenied(
                    f"Vertex AI could not authenticate the call to {what}: {e.message} Provide credentials: "
                    f"Application Default Credentials (`gcloud auth application-default login` locally; Workload "
                    f"Identity on GKE; the pipeline's service account on Vertex AI Pipelines).") from e
            except gexc.BadRequest as e:  # HTTP 400 / INVALID_ARGUMENT, FAILED_PRECONDITION
                if re.search(r"\b(location|region)", e.message or "", re.IGNORECASE):
                    raise RegionMismatch(
                        f"Vertex AI rejected the call to {what} in {parent} ({api_endpoint or 'default endpoint'}): "
                        f"{e.message} The location in the call, the API endpoint's region and the resources named "
                        f"in the call must agree.") from e
                raise Rejected(f"Vertex AI rejected the request to {what} in {parent}: {e.message}") from e
            except Exception as e:
                if not (idempotent and is_transient(e)):
                    raise
                if attempt == self.max_attempts:
                    raise Unavailable(f"Vertex AI did not answer the call to {what} in {parent} after "
                                      f"{self.max_attempts} attempts (the last error: {e}); retry later.") from e
                wait = self.uniform(0.0, delay)
                log.warning("Vertex AI call to %s failed (%s) on attempt %d/%d; retrying in %.1fs", what, e,
                            attempt, self.max_attempts, wait)
            self.sleep(wait)
            delay = min(self.max_backoff_s, delay * 2)
        raise AssertionError("unreachable")
