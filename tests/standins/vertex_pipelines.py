"""Vertex AI PipelineService and ScheduleService, as parts of the Vertex AI stand-in (vertex_api.py).

Follows the public v1 REST reference for `projects.locations.pipelineJobs` and `projects.locations.schedules` and
the google.cloud.aiplatform.v1 protos (googleapis/googleapis at f8291d2b, google/cloud/aiplatform/v1/:
pipeline_service.proto:112-130 the routes, :357-359 the job id rule; schedule_service.proto:45-126 the routes,
:160 the list filter, :298-311 UpdateSchedule's rules):

- PipelineService: `POST v1/{parent}/pipelineJobs` (`pipelineJobId` optional: a numeric id otherwise; 409 when
  taken), `GET v1/{name=.../pipelineJobs/*}`. The body is checked as Vertex AI Pipelines checks it: a
  `pipelineSpec` with `pipelineInfo.name` and `root`, `runtimeConfig.gcsOutputDirectory` a gs:// path (or the
  spec's `defaultPipelineRoot`), `parameterValues` naming only root input parameters, with every parameter that
  has no default given, in the parameter's type; accelerator types that Vertex AI knows (the API's
  AcceleratorType enum, `NVIDIA_TESLA_T4`, ..., not GKE's `nvidia.com/gpu`); a service account email; valid
  labels. The job runs `PIPELINE_STATE_PENDING -> RUNNING -> SUCCEEDED` as it is polled (`pipeline_polls`), or
  ends FAILED with the error body Vertex AI writes when `fail_next_pipeline(task=...)` scripted it;
  `jobDetail.taskDetails` lists the tasks. The service adds the `vertex-ai-pipelines-run-billing-id` label, like
  the real one. Enums are the API's own (google.cloud.aiplatform_v1), not copies.
- ScheduleService: `POST v1/{parent}/schedules`, `GET v1/{name=.../schedules/*}`, `GET v1/{parent}/schedules`
  (`filter` on `display_name` with `=`, `!=` and `:` wildcards, `state`, `create_pipeline_job_request:*`, terms
  joined by `AND`; `orderBy` `create_time [desc]`, newest first by default; paging; list items carry no
  `updateTime`, as the real list answers), `PATCH v1/{schedule.name}?updateMask=...` (camelCase or snake_case
  paths; output-only paths ignored; a non-empty field cannot be unset; only ACTIVE or PAUSED schedules),
  `POST ...:pause` (ACTIVE only), `POST ...:resume` (PAUSED only, `catchUp`), `DELETE` (a done Operation with
  `DeleteOperationMetadata`, as the real API answers). Schedule ids are numeric; `nextRunTime` is computed from
  the cron (with its `TZ=`/`CRON_TZ=` prefix). `schedule_request_updatable=False` makes `UpdateSchedule` refuse
  the `create_pipeline_job_request` path (INVALID_ARGUMENT, with the text in `schedule_request_refusal`: the
  service's wording is not published, so clients must not depend on it), for clients that must cope with that.
  `trigger_schedule(name)` starts the run a cron tick would start (a pipeline job with `scheduleName`).
- `deny_act_as(service_account)`: creating a job or schedule that runs as that service account answers 403
  `iam.serviceAccounts.actAs`, as it does for a caller without roles/iam.serviceAccountUser on it.
"""

from __future__ import annotations

import copy
import datetime as _dt
import functools
import re
from typing import Any

from tests.standins.base import ApiError, Request, route
from tests.standins.vertex_common import API, LOCATION, VertexService, filter_terms

# Answers whose enums are written as numbers when the client asks for `$alt=json;enum-encoding=int`.
PIPELINE_RPCS = {"CreatePipelineJob", "GetPipelineJob", "CreateSchedule", "GetSchedule", "ListSchedules",
                 "UpdateSchedule", "PauseSchedule", "ResumeSchedule", "DeleteSchedule"}
# "less than 128 characters, and valid characters are /[a-z][0-9]-/" (googleapis/googleapis,
# google/cloud/aiplatform/v1/pipeline_service.proto:357-359 at f8291d2b).
PIPELINE_JOB_ID_RE = re.compile(r"^[a-z][-a-z0-9]{0,126}$")
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


class PipelineService(VertexService):
    """The pipeline job and schedule part of VertexStandIn (see the module docstring)."""

    def _init_pipelines(self, pipeline_polls: tuple[int, int], schedule_request_updatable: bool) -> None:
        self.pipeline_polls = pipeline_polls  # GETs a pipeline job spends PENDING, then RUNNING
        self.schedule_request_updatable = schedule_request_updatable
        # The service's text for such a refusal is not published; clients must not depend on it (tests vary it).
        self.schedule_request_refusal = "Updating create_pipeline_job_request of a schedule is not supported."
        self._pipeline_jobs: dict[str, dict] = {}  # job id -> {"job": PipelineJob JSON, "polls", "outcome"}
        self._pipeline_outcomes: list[dict] = []  # scripted outcomes for the next pipeline jobs
        self._schedules: dict[str, dict] = {}  # schedule id -> Schedule JSON
        self._act_as_denied: set[str] = set()

    def _pipeline_routes(self) -> list:
        jobs, schedules = LOCATION + "/pipelineJobs", LOCATION + "/schedules"
        schedule = schedules + r"/(?P<schedule>[^/:]+)"
        return [
            route("POST", jobs, "CreatePipelineJob", self._CreatePipelineJob),
            route("GET", jobs + r"/(?P<job>[^/:]+)", "GetPipelineJob", self._GetPipelineJob),
            route("POST", schedules, "CreateSchedule", self._CreateSchedule),
            route("GET", schedules, "ListSchedules", self._ListSchedules),
            route("GET", schedule, "GetSchedule", self._GetSchedule),
            route("PATCH", schedule, "UpdateSchedule", self._UpdateSchedule),
            route("POST", schedule + ":pause", "PauseSchedule", self._PauseSchedule),
            route("POST", schedule + ":resume", "ResumeSchedule", self._ResumeSchedule),
            route("DELETE", schedule, "DeleteSchedule", self._DeleteSchedule),
        ]

    # -- test controls ---------------------------------------------------------------------------------

    def fail_next_pipeline(self, task: str = "train-op", message: str | None = None, count: int = 1) -> None:
        """The next `count` pipeline jobs created end PIPELINE_STATE_FAILED, `task` being the failed task."""
        with self.lock:
            self._pipeline_outcomes.extend([{"task": task, "message": message}] * count)

    def deny_act_as(self, service_account: str) -> None:
        """Jobs and schedules that run as `service_account` are refused (403 iam.serviceAccounts.actAs)."""
        with self.lock:
            self._act_as_denied.add(service_account)

    def pipeline_jobs(self) -> list[dict]:
        """The stored pipeline jobs (PipelineJob JSON), oldest first."""
        with self.lock:
            return [copy.deepcopy(s["job"]) for s in self._pipeline_jobs.values()]

    def schedules(self) -> list[dict]:
        """The stored schedules (Schedule JSON), oldest first."""
        with self.lock:
            return [copy.deepcopy(s) for s in self._schedules.values()]

    def trigger_schedule(self, name: str) -> dict:
        """Starts the run a cron tick of an ACTIVE schedule would start; returns its PipelineJob JSON."""
        with self.lock:
            schedule = self._schedules[name.rsplit("/", 1)[-1]]
            if schedule["state"] != "ACTIVE":
                raise ValueError(f"schedule {name} is {schedule['state']}; only an ACTIVE schedule starts runs")
            request = schedule["createPipelineJobRequest"]
            stamp = self._moment()
            base = re.sub(r"[^-a-z0-9]+", "-", request["pipelineJob"]["pipelineSpec"]["pipelineInfo"]["name"].lower())
            suffix = f"-{stamp.strftime('%Y%m%d%H%M%S')}{len(self._pipeline_jobs):03d}"
            job_id = f"{base.strip('-')[:127 - len(suffix)]}{suffix}"
            job = self._new_pipeline_job(job_id, copy.deepcopy(request["pipelineJob"]))
            job["scheduleName"] = schedule["name"]
            schedule["startedRunCount"] = str(int(schedule.get("startedRunCount", "0")) + 1)
            schedule["lastScheduledRunResponse"] = {"scheduledRunTime": self.now(), "runResponse": job["name"]}
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
            if kind and kind not in _accelerator_types():
                raise ApiError("INVALID_ARGUMENT", f"Executor {executor_name} asks for accelerator type {kind!r}, which "
                                                   f"Vertex AI does not support; use one of "
                                                   f"{', '.join(sorted(_accelerator_types()))}.")
        service_account = job.get("serviceAccount", "")
        if service_account:
            if not SERVICE_ACCOUNT_RE.match(service_account):
                raise ApiError("INVALID_ARGUMENT", f"Invalid service account {service_account!r}: expected the email of "
                                                   f"a service account (NAME@PROJECT.iam.gserviceaccount.com).")
            self._check_act_as(service_account)
        self._validate_labels(job.get("labels"))

    def _new_pipeline_job(self, job_id: str, body: dict) -> dict:
        now = self.now()
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

    def _CreatePipelineJob(self, req: Request) -> dict:
        body = req.json()
        job_id = req.arg("pipelineJobId") or req.arg("pipeline_job_id")
        if job_id:
            if not PIPELINE_JOB_ID_RE.match(job_id):
                raise ApiError("INVALID_ARGUMENT", f"Invalid pipeline_job_id {job_id!r}: less than 128 characters of "
                                                   f"[a-z0-9-], starting with a letter.")
            if job_id in self._pipeline_jobs:
                raise ApiError("ALREADY_EXISTS", f"PipelineJob {self._location_path()}/pipelineJobs/{job_id} already "
                                                 f"exists.")
        else:
            job_id = self._next_id()
        self._validate_pipeline_job(body)
        return copy.deepcopy(self._new_pipeline_job(job_id, body))

    def _GetPipelineJob(self, req: Request) -> dict:
        stored = self._pipeline_jobs.get(req.params["job"])
        if stored is None:
            raise ApiError("NOT_FOUND", f"PipelineJob {self._location_path()}/pipelineJobs/{req.params['job']} does not "
                                        f"exist.")
        job = stored["job"]
        if job["state"] not in PIPELINE_TERMINAL:
            stored["polls"] += 1
            pending, running = self.pipeline_polls
            now = self.now()
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

    def _CreateSchedule(self, req: Request) -> dict:
        body = req.json()
        if not body.get("displayName"):
            raise ApiError("INVALID_ARGUMENT", "schedule.display_name is required.")
        if len(body["displayName"]) > 128:
            raise ApiError("INVALID_ARGUMENT", "schedule.display_name must be at most 128 characters.")
        if not body.get("cron"):
            raise ApiError("INVALID_ARGUMENT", "The schedule needs a time specification: cron.")
        _cron_next(body["cron"], self._moment())  # validates
        if "createNotebookExecutionJobRequest" in body:
            raise ApiError("INVALID_ARGUMENT", "This stand-in schedules pipeline jobs only.")
        request = self._validate_schedule_request(body.get("createPipelineJobRequest"))
        concurrent = self._int64(body.get("maxConcurrentRunCount", 0), "max_concurrent_run_count")
        if concurrent <= 0:
            raise ApiError("INVALID_ARGUMENT", "schedule.max_concurrent_run_count must be greater than 0.")
        schedule_id = self._next_id()
        now = self._moment()
        stamp = self.now()
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

    def _GetSchedule(self, req: Request) -> dict:
        return copy.deepcopy(self._schedule(req.params["schedule"]))

    def _ListSchedules(self, req: Request) -> dict:
        terms = _parse_schedule_filter(req.arg("filter"))
        items = [s for s in self._schedules.values() if all(term(s) for term in terms)]
        order = (req.arg("orderBy") or req.arg("order_by") or "create_time desc").strip()
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
        return self._page(listed, req, "schedules")

    def _UpdateSchedule(self, req: Request) -> dict:
        body = req.json()
        schedule = self._schedule(req.params["schedule"])
        mask = req.arg("updateMask") or req.arg("update_mask")
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
                raise ApiError("INVALID_ARGUMENT", self.schedule_request_refusal)
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
                _cron_next(value, self._moment())
            elif snake == "create_pipeline_job_request":
                value = self._validate_schedule_request(value)
            elif snake in ("max_run_count", "max_concurrent_run_count", "max_concurrent_active_run_count"):
                if self._int64(value, snake) <= 0:
                    raise ApiError("INVALID_ARGUMENT", f"schedule.{snake} must be greater than 0.")
                value = str(int(value))
            elif snake == "display_name" and len(value) > 128:
                raise ApiError("INVALID_ARGUMENT", "schedule.display_name must be at most 128 characters.")
            updated[key] = value
        updated["updateTime"] = self.now()
        if updated["state"] == "ACTIVE":
            updated["nextRunTime"] = _cron_next(updated["cron"], self._moment())
        self._schedules[req.params["schedule"]] = updated
        return copy.deepcopy(updated)

    def _PauseSchedule(self, req: Request) -> dict:
        schedule = self._schedule(req.params["schedule"])
        if schedule["state"] != "ACTIVE":
            raise ApiError("FAILED_PRECONDITION", f"Schedule {schedule['name']} is {schedule['state']}; only an ACTIVE "
                                                  f"schedule can be paused.")
        now = self.now()
        schedule.update(state="PAUSED", lastPauseTime=now, updateTime=now)
        return {}

    def _ResumeSchedule(self, req: Request) -> dict:
        body = req.json()
        schedule = self._schedule(req.params["schedule"])
        if schedule["state"] != "PAUSED":
            raise ApiError("FAILED_PRECONDITION", f"Schedule {schedule['name']} is {schedule['state']}; only a PAUSED "
                                                  f"schedule can be resumed.")
        now = self.now()
        schedule.update(state="ACTIVE", lastResumeTime=now, updateTime=now,
                        nextRunTime=_cron_next(schedule["cron"], self._moment()))
        if body.get("catchUp"):
            schedule["catchUp"] = True
        else:
            schedule.pop("catchUp", None)
        return {}

    def _DeleteSchedule(self, req: Request) -> dict:
        self._schedule(req.params["schedule"])
        del self._schedules[req.params["schedule"]]
        operation_id = self._next_id()
        now = self.now()
        result = {"name": f"{self._location_path()}/operations/{operation_id}", "done": True,
                  "metadata": {"@type": f"{API}.DeleteOperationMetadata",
                               "genericMetadata": {"createTime": now, "updateTime": now}},
                  "response": {"@type": "type.googleapis.com/google.protobuf.Empty"}}
        self._operations[operation_id] = {"name": result["name"], "kind": "delete", "result": result}
        return copy.deepcopy(result)


@functools.cache
def _accelerator_types() -> frozenset[str]:
    """The accelerator types a Vertex AI machine spec takes: the API's own enum, not a copy of it."""
    from google.cloud.aiplatform_v1 import AcceleratorType

    return frozenset(name for name in AcceleratorType.__members__ if name != "ACCELERATOR_TYPE_UNSPECIFIED")


def int_enums(payload: Any) -> Any:
    """A PipelineJob / Schedule answer (or a list of schedules) with its enums as numbers (the API's enum values)."""
    from google.cloud.aiplatform_v1 import PipelineState, PipelineTaskDetail, Schedule

    payload = copy.deepcopy(payload)

    def job(j: dict) -> None:
        if j.get("state") in PipelineState.__members__:
            j["state"] = PipelineState[j["state"]].value
        for task in (j.get("jobDetail") or {}).get("taskDetails") or []:
            task["state"] = PipelineTaskDetail.State[task["state"]].value

    def schedule(s: dict) -> None:
        if s.get("state") in Schedule.State.__members__:
            s["state"] = Schedule.State[s["state"]].value

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
    from google.cloud.aiplatform_v1 import Schedule

    terms = []
    for part, field, op, value in filter_terms(text, r"[A-Za-z_]+"):
        field = {"displayName": "display_name", "createPipelineJobRequest": "create_pipeline_job_request"}.get(field, field)
        if field == "display_name":
            if op == ":":
                pattern = re.compile("^" + ".*".join(re.escape(p) for p in value.split("*")) + "$")
                terms.append(lambda s, p=pattern: bool(p.match(s["displayName"])))
            else:
                terms.append(lambda s, v=value, eq=(op == "="): (s["displayName"] == v) == eq)
        elif field == "state" and op in ("=", "!="):
            if value not in Schedule.State.__members__:
                raise ApiError("INVALID_ARGUMENT", f"Invalid state {value!r} in filter {text!r}")
            terms.append(lambda s, v=value, eq=(op == "="): (s["state"] == v) == eq)
        elif field == "create_pipeline_job_request" and op == ":" and value == "*":
            terms.append(lambda s: "createPipelineJobRequest" in s)
        else:
            raise ApiError("INVALID_ARGUMENT", f"Unsupported filter term {part!r} in {text!r}")
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
