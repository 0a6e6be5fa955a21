"""One way to talk to Google Cloud, and to follow any remote job.

- clients.py: Vertex AI clients built in one place (regional endpoint, REST transport, anonymous credentials
  for http:// endpoints, an actionable message when there are no credentials), and `VertexConnection`, a
  project and region with its retry policy.
- retry.py: the one retry/backoff policy (quota refusals with the server's delay, transient errors on reads)
  and the IAM-role messages for refusals.
- errors.py: one family of errors (`RemoteError` and its kinds), each stating its exit code.
- jobs.py: `follow_job`, the one loop that follows a remote job to its end and cancels what we own.
- accelerators.py: the GPU table (GKE label, Vertex AI accelerator type, Vertex AI machine shapes).

`follow_job` is not Google-specific (the TFJob launcher follows a Kubernetes resource with it, pipectl a KFP
run) but lives here: most jobs it follows are Google Cloud's, it is modelled on Google Cloud Pipeline Components'
job runner, and it belongs with the errors and exit codes it raises. Whoever adds a launcher finds it next to
the clients they need.

Importing this package is cheap: the Google client libraries are imported inside the functions that use them.
"""

from components.gcp.accelerators import ACCELERATORS, VERTEX_MACHINES, vertex_machine_type
from components.gcp.clients import (ENDPOINT_REGION_RE, VertexConnection, VertexService, api_endpoint_for,
                                    job_client, location_of, rfc3339, vertex_client)
from components.gcp.errors import (JobCancelled, JobEnded, JobError, JobFailed, JobStopped, JobTimedOut, LostTrack,
                                   PermissionDenied, QuotaExhausted, Rejected, RegionMismatch, RemoteError,
                                   Unavailable)
from components.gcp.jobs import Followed, JobStatus, Phase, follow_job, sigterm_stops, vertex_job_status
from components.gcp.retry import ACT_AS_ROLE, REQUIRED_ROLE, RetryPolicy, is_transient

__all__ = [
    "ACCELERATORS", "ACT_AS_ROLE", "ENDPOINT_REGION_RE", "Followed", "JobCancelled", "JobEnded", "JobError",
    "JobFailed", "JobStatus", "JobStopped", "JobTimedOut", "LostTrack", "PermissionDenied", "Phase", "QuotaExhausted",
    "REQUIRED_ROLE", "Rejected", "RegionMismatch", "RemoteError", "RetryPolicy", "Unavailable", "VERTEX_MACHINES",
    "VertexConnection", "VertexService", "api_endpoint_for", "follow_job", "is_transient", "job_client",
    "location_of", "rfc3339", "sigterm_stops", "vertex_client", "vertex_job_status", "vertex_machine_type",
]
