"""A stand-in for Vertex AI's CustomJob REST endpoints (v1), on 127.0.0.1.

It follows the public Vertex AI v1 REST reference for `projects.locations.customJobs` (create, get, cancel) and
its `CustomJob` / `WorkerPoolSpec` resources; errors use Google's JSON error body (shared stand-in base, base.py).

    POST /v1/projects/{p}/locations/{l}/customJobs              create (state JOB_STATE_PENDING)
    GET  /v1/projects/{p}/locations/{l}/customJobs/{id}         read
    POST /v1/projects/{p}/locations/{l}/customJobs/{id}:cancel  cancel (CANCELLING, then CANCELLED)

As on Vertex AI, each worker pool's replicas run the pool's container command with the `TF_CONFIG` and `CLUSTER_SPEC`
Vertex sets (pool 0 is the chief, pool 1 the workers; CLUSTER_SPEC names the pools `workerpool0`, `workerpool1`, ...
and the task by its pool and index: cloud.google.com/vertex-ai/docs/training/distributed-training, "In your training
code, you can use the CLUSTER_SPEC or TF_CONFIG environment variables", #cluster-variables); here they are local
processes on 127.0.0.1 (pods.py: the image is not pulled). The job succeeds when the replicas of pool 0 exit 0 and
fails, with Vertex's message, when any replica exits otherwise.
`google.cloud.aiplatform_v1.JobServiceClient(transport="rest")` talks to it unchanged, with
`client_options={"api_endpoint": standin.url}`.
"""

from __future__ import annotations

import json
import threading
import time
from typing import Callable

from tests.standins.base import ApiError, Request, StandIn, route
from tests.standins.pods import Pod, free_port

TERMINAL = ("JOB_STATE_SUCCEEDED", "JOB_STATE_FAILED", "JOB_STATE_CANCELLED")
POOL_TASK_TYPES = ("chief", "worker", "ps", "evaluator")


class CustomJob:
    def __init__(self, name: str, body: dict, run_containers: bool, now: Callable[[], str]):
        self.now = now
        self.body = {**body, "name": name, "state": "JOB_STATE_PENDING", "createTime": now(), "updateTime": now()}
        self.pods: list[Pod] = []
        self.lock = threading.Lock()
        self.cancelled = threading.Event()
        if run_containers:
            threading.Thread(target=self._run, daemon=True).start()

    def _set(self, state: str, error: str = "", code: int = 0) -> None:
        with self.lock:
            if self.body["state"] in TERMINAL:
                return
            self.body.update(state=state, updateTime=self.now())
            if state == "JOB_STATE_RUNNING":
                self.body["startTime"] = self.now()
            if state in TERMINAL:
                self.body["endTime"] = self.now()
            if error:
                self.body["error"] = {"code": code, "message": error}

    def _run(self) -> None:
        pools = self.body["jobSpec"]["workerPoolSpecs"]
        cluster = {POOL_TASK_TYPES[i]: [f"127.0.0.1:{free_port()}" for _ in range(int(p.get("replicaCount", 1)))]
                   for i, p in enumerate(pools)}
        for i, pool in enumerate(pools):
            container = pool["containerSpec"]
            spec = {"name": "tensorflow", "command": container.get("command", []), "args": container.get("args", []),
                    "env": container.get("env", [])}
            for index in range(int(pool.get("replicaCount", 1))):
                tf_config = {"cluster": cluster, "task": {"type": POOL_TASK_TYPES[i], "index": index, "trial": ""},
                             "job": self.body["jobSpec"], "environment": "cloud"}
                cluster_spec = {"cluster": {f"workerpool{k}": cluster[POOL_TASK_TYPES[k]] for k in range(len(pools))},
                                "task": {"type": f"workerpool{i}", "index": index, "trial": ""},
                                "job": json.dumps(self.body["jobSpec"]), "environment": "cloud"}
                self.pods.append(Pod(f"workerpool{i}-{index}", POOL_TASK_TYPES[i], index, spec,
                                     {"TF_CONFIG": json.dumps(tf_config), "CLUSTER_SPEC": json.dumps(cluster_spec),
                                      "CLOUD_ML_JOB_ID": self.body["name"]}))
        time.sleep(0.1)  # PENDING is observable, as provisioning takes a while on Vertex AI
        if self.cancelled.is_set():
            return
        for pod in self.pods:
            pod.start()
        self._set("JOB_STATE_RUNNING")
        primary = [p for p in self.pods if p.replica_type == "chief"]
        while not self.cancelled.is_set():
            time.sleep(0.05)
            failed = next((p for p in self.pods if p.exit_code not in (None, 0) and not p.deleted), None)
            if failed:
                for pod in self.pods:
                    pod.stop()
                pool = POOL_TASK_TYPES.index(failed.replica_type)
                self._set("JOB_STATE_FAILED", f"The replica workerpool{pool}-{failed.index} exited with a non-zero "
                                              f"status of {failed.exit_code}. Termination reason: Error.", code=3)
                return
            if all(p.exit_code == 0 for p in primary):
                for pod in self.pods:
                    pod.stop()
                self._set("JOB_STATE_SUCCEEDED")
                return

    def cancel(self) -> None:
        self._set("JOB_STATE_CANCELLING")
        self.cancelled.set()
        for pod in self.pods:
            pod.stop()
        self._set("JOB_STATE_CANCELLED", "CANCELED", code=1)

    def snapshot(self) -> dict:
        with self.lock:
            return json.loads(json.dumps(self.body))

    def log_text(self) -> str:
        return "".join(line for pod in self.pods for _, line in pod.lines)


class VertexJobsStandIn(StandIn):
    """Start with `with VertexJobsStandIn() as vertex:`; point the REST client at `vertex.url`."""

    name = "Vertex AI CustomJob"

    def __init__(self, run_containers: bool = True):
        super().__init__()
        self.run_containers = run_containers
        self.jobs: dict[str, CustomJob] = {}
        self.created_bodies: list[dict] = []
        self.cancelled: list[str] = []
        self._next_id = 1000

    def routes(self) -> list:
        parent = r"/v1/(?P<parent>projects/[^/]+/locations/[^/]+)"
        job = parent + r"/customJobs/(?P<id>[^/:]+)"
        return [
            route("POST", parent + "/customJobs", "CreateCustomJob", self._create),
            route("GET", job, "GetCustomJob", self._get),
            route("POST", job + ":cancel", "CancelCustomJob", self._cancel),
        ]

    def stop(self) -> None:
        for job in self.jobs.values():
            job.cancelled.set()
            for pod in job.pods:
                pod.stop()
        super().stop()

    def _job(self, request: Request) -> tuple[str, CustomJob]:
        name = f"{request.params['parent']}/customJobs/{request.params['id']}"
        if name not in self.jobs:
            raise ApiError("NOT_FOUND", f"CustomJob {name} not found")
        return name, self.jobs[name]

    def _create(self, request: Request) -> dict:
        body = request.json()
        problems = _validate(body)
        if problems:
            raise ApiError("INVALID_ARGUMENT", "; ".join(problems))
        self.created_bodies.append(json.loads(json.dumps(body)))
        self._next_id += 1
        name = f"{request.params['parent']}/customJobs/{self._next_id}"
        self.jobs[name] = CustomJob(name, body, self.run_containers, self.now)
        return self.jobs[name].snapshot()

    def _get(self, request: Request) -> dict:
        return self._job(request)[1].snapshot()

    def _cancel(self, request: Request) -> dict:
        name, job = self._job(request)
        self.cancelled.append(name)
        job.cancel()
        return {}


def _validate(body: dict) -> list[str]:
    """The checks Vertex AI makes on the fields a training CustomJob uses."""
    problems = []
    if not body.get("displayName"):
        problems.append("CustomJob.display_name is required")
    pools = body.get("jobSpec", {}).get("workerPoolSpecs", [])
    if not pools:
        problems.append("job_spec.worker_pool_specs must not be empty")
    for i, pool in enumerate(pools):
        if not pool.get("machineSpec", {}).get("machineType"):
            problems.append(f"worker_pool_specs[{i}].machine_spec.machine_type is required")
        if not pool.get("containerSpec", {}).get("imageUri"):
            problems.append(f"worker_pool_specs[{i}].container_spec.image_uri is required")
        if int(pool.get("replicaCount", 0)) < 1:
            problems.append(f"worker_pool_specs[{i}].replica_count must be >= 1")
    if pools and int(pools[0].get("replicaCount", 0)) != 1:
        problems.append("worker_pool_specs[0] (the chief) must have replica_count 1")
    return problems
