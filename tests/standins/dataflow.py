"""A stand-in for the Dataflow jobs REST API (v1b3), on 127.0.0.1.

It follows the public Dataflow REST reference, v1b3, for `projects.locations.jobs` (create, get, update) and
`projects.locations.jobs.messages` (list), with its `Job` resource and `JobState` values (googleapis/googleapis at
f8291d2b, google/dataflow/v1beta3/jobs.proto:55-95 the routes, :781 JobState; messages.proto:46 the route, :73
JobMessageImportance); errors use Google's JSON error body (shared stand-in base, base.py).

    POST /v1b3/projects/{p}/locations/{l}/jobs                    create (JOB_STATE_QUEUED, then as scripted)
    GET  /v1b3/projects/{p}/locations/{l}/jobs/{id}               get
    PUT  /v1b3/projects/{p}/locations/{l}/jobs/{id}               update: requestedState JOB_STATE_CANCELLED
                                                                  -> JOB_STATE_CANCELLING, then JOB_STATE_CANCELLED
    GET  /v1b3/projects/{p}/locations/{l}/jobs/{id}/messages      list (minimumImportance filters)

No job really runs: each `get` moves a job one step along its script (`script`: the states it goes through,
JOB_STATE_PENDING -> JOB_STATE_RUNNING -> JOB_STATE_DONE by default; a test sets another, e.g. one that ends
JOB_STATE_FAILED with `error_messages`). Create checks what Dataflow refuses: no name or a bad one, no environment; a
job name that is already active gets that job back, with its own `clientRequestId` (the field: googleapis/googleapis
google/dataflow/v1beta3/jobs.proto:232-239 at f8291d2b; the clash answer: see `_create`).
`google.cloud.dataflow_v1beta3.JobsV1Beta3Client(transport="rest")` talks to it unchanged, with
`client_options={"api_endpoint": standin.url}`.
"""

from __future__ import annotations

import json
import re

from tests.standins.base import ApiError, Request, StandIn, route

TERMINAL = ("JOB_STATE_DONE", "JOB_STATE_FAILED", "JOB_STATE_CANCELLED", "JOB_STATE_UPDATED", "JOB_STATE_DRAINED")
# JobMessageImportance: its numbers (what clients send with `$alt=json;enum-encoding=int`) and its order of
# importance, which differ (BASIC is 5 but ranks below WARNING).
IMPORTANCE_NUMBERS = {"JOB_MESSAGE_IMPORTANCE_UNKNOWN": 0, "JOB_MESSAGE_DEBUG": 1, "JOB_MESSAGE_DETAILED": 2,
                      "JOB_MESSAGE_BASIC": 5, "JOB_MESSAGE_WARNING": 3, "JOB_MESSAGE_ERROR": 4}
IMPORTANCE = ["JOB_MESSAGE_IMPORTANCE_UNKNOWN", "JOB_MESSAGE_DEBUG", "JOB_MESSAGE_DETAILED", "JOB_MESSAGE_BASIC",
              "JOB_MESSAGE_WARNING", "JOB_MESSAGE_ERROR"]
# JobState in number order (clients may send numbers: `$alt=json;enum-encoding=int`).
JOB_STATES = ["JOB_STATE_UNKNOWN", "JOB_STATE_STOPPED", "JOB_STATE_RUNNING", "JOB_STATE_DONE", "JOB_STATE_FAILED",
              "JOB_STATE_CANCELLED", "JOB_STATE_UPDATED", "JOB_STATE_DRAINING", "JOB_STATE_DRAINED",
              "JOB_STATE_PENDING",
              "JOB_STATE_CANCELLING", "JOB_STATE_QUEUED", "JOB_STATE_RESOURCE_CLEANING_UP", "JOB_STATE_PAUSING",
              "JOB_STATE_PAUSED"]
JOB_NAME_RE = re.compile(r"^[a-z]([-a-z0-9]{0,1022}[a-z0-9])?$")


class DataflowStandIn(StandIn):
    """Start with `with DataflowStandIn() as dataflow:`; point the REST client at `dataflow.url`."""

    name = "Dataflow"

    def __init__(self, script: tuple[str, ...] = ("JOB_STATE_PENDING", "JOB_STATE_RUNNING", "JOB_STATE_DONE"),
                 error_messages: tuple[str, ...] = ()):
        super().__init__()
        self.script, self.error_messages = list(script), list(error_messages)
        self.jobs: dict[str, dict] = {}
        self.steps: dict[str, list[str]] = {}
        self.created: list[dict] = []
        self.cancelled: list[str] = []
        self._next_id = 0

    def routes(self) -> list:
        parent = r"/v1b3/projects/(?P<project>[^/]+)/locations/(?P<location>[^/]+)/jobs"
        job = parent + r"/(?P<id>[^/:]+)"
        return [
            route("POST", parent, "CreateJob", self._create),
            route("GET", job, "GetJob", self._get),
            route("PUT", job, "UpdateJob", self._update),
            route("GET", job + "/messages", "ListJobMessages", self._messages),
        ]

    def _job(self, request: Request) -> dict:
        job = self.jobs.get(request.params["id"])
        where = (request.params["project"], request.params["location"])
        if job is None or (job["projectId"], job["location"]) != where:
            raise ApiError("NOT_FOUND", f"(job {request.params['id']}) not found in project "
                                        f"{request.params['project']}, location {request.params['location']}")
        return job

    def _create(self, request: Request) -> dict:
        body = request.json()
        name = body.get("name", "")
        if not JOB_NAME_RE.match(name):
            raise ApiError("INVALID_ARGUMENT", f"(job name {name!r}) The job name must match the regular expression "
                                               "[a-z]([-a-z0-9]{0,1022}[a-z0-9])?")
        if not body.get("environment"):
            raise ApiError("INVALID_ARGUMENT", "The workflow could not be created: the job has no environment")
        running = [j for j in self.jobs.values() if j["name"] == name and j["currentState"] not in TERMINAL]
        if running:
            # The service answers a name clash with the active job of that name, not an error: Beam's apiclient
            # notices it only by its clientRequestId differing from the one it sent (apache/beam v2.77.0,
            # sdks/python/apache_beam/runners/dataflow/internal/apiclient.py:911-923).
            return running[0]
        self.created.append(json.loads(json.dumps(body)))
        self._next_id += 1
        job_id = f"2026-11-24_00_00_00-{self._next_id:019d}"
        job = {**body, "id": job_id, "projectId": request.params["project"], "location": request.params["location"],
               "currentState": "JOB_STATE_QUEUED", "currentStateTime": self.now(), "createTime": self.now()}
        self.jobs[job_id] = job
        self.steps[job_id] = list(self.script)
        return job

    def _get(self, request: Request) -> dict:
        job = self._job(request)
        steps = self.steps[job["id"]]
        if job["currentState"] not in TERMINAL and steps:
            job.update(currentState=steps.pop(0), currentStateTime=self.now())
        return job

    def _update(self, request: Request) -> dict:
        job = self._job(request)
        requested = request.json().get("requestedState", "")
        if isinstance(requested, int) and 0 <= requested < len(JOB_STATES):
            requested = JOB_STATES[requested]
        if requested not in ("JOB_STATE_CANCELLED", "JOB_STATE_DRAINED", "JOB_STATE_DONE"):
            raise ApiError("INVALID_ARGUMENT", f"requested state {requested!r} cannot be set by clients")
        if job["currentState"] in TERMINAL:
            raise ApiError("FAILED_PRECONDITION", f"Workflow modification failed: the job is {job['currentState']}")
        self.cancelled.append(job["id"])
        job.update(requestedState=requested, currentState="JOB_STATE_CANCELLING", currentStateTime=self.now())
        self.steps[job["id"]] = ["JOB_STATE_CANCELLED"]
        return job

    def _messages(self, request: Request) -> dict:
        job = self._job(request)
        minimum = request.arg("minimumImportance", "JOB_MESSAGE_IMPORTANCE_UNKNOWN")
        if minimum.isdigit():
            minimum = next((name for name, number in IMPORTANCE_NUMBERS.items() if number == int(minimum)), "")
        if minimum not in IMPORTANCE:
            raise ApiError("INVALID_ARGUMENT", f"Invalid value for minimumImportance: {minimum!r}")
        messages = [{"id": str(i), "time": self.now(), "messageText": text, "messageImportance": "JOB_MESSAGE_ERROR"}
                    for i, text in enumerate(self.error_messages if job["currentState"] == "JOB_STATE_FAILED" else [])]
        return {"jobMessages": [m for m in messages
                                if IMPORTANCE.index(m["messageImportance"]) >= IMPORTANCE.index(minimum)]}
