"""A stand-in for Vertex AI's CustomJob REST endpoints (v1), on 127.0.0.1.

    POST /v1/projects/{p}/locations/{l}/customJobs              create (state JOB_STATE_PENDING)
    GET  /v1/projects/{p}/locations/{l}/customJobs/{id}         read
    POST /v1/projects/{p}/locations/{l}/customJobs/{id}:cancel  cancel (CANCELLING, then CANCELLED)

As on Vertex AI, each worker pool's replicas run the pool's container command with the `TF_CONFIG` Vertex
sets (pool 0 is the chief, pool 1 the workers); here they are local processes on 127.0.0.1 (the image is not
pulled). The job succeeds when the replicas of pool 0 exit 0 and fails, with Vertex's message, when any
replica exits otherwise. `google.cloud.aiplatform_v1.JobServiceClient(transport="rest")` talks to it
unchanged, with `client_options={"api_endpoint": standin.url}`.
"""

from __future__ import annotations

import datetime as _dt
import http.server
import json
import re
import threading
import time
import urllib.parse

from tests.standins.pods import Pod, free_port

TERMINAL = ("JOB_STATE_SUCCEEDED", "JOB_STATE_FAILED", "JOB_STATE_CANCELLED")
POOL_TASK_TYPES = ("chief", "worker", "ps", "evaluator")


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class CustomJob:
    def __init__(self, name: str, body: dict, run_containers: bool):
        self.body = {**body, "name": name, "state": "JOB_STATE_PENDING", "createTime": _now(), "updateTime": _now()}
        self.pods: list[Pod] = []
        self.lock = threading.Lock()
        self.cancelled = threading.Event()
        if run_containers:
            threading.Thread(target=self._run, daemon=True).start()

    def _set(self, state: str, error: str = "", code: int = 0) -> None:
        with self.lock:
            if self.body["state"] in TERMINAL:
                return
            self.body.update(state=state, updateTime=_now())
            if state == "JOB_STATE_RUNNING":
                self.body["startTime"] = _now()
            if state in TERMINAL:
                self.body["endTime"] = _now()
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
                self.pods.append(Pod(f"workerpool{i}-{index}", POOL_TASK_TYPES[i], index, spec,
                                     {"TF_CONFIG": json.dumps(tf_config), "CLOUD_ML_JOB_ID": self.body["name"]}))
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


class VertexJobsStandIn:
    """Start with `with VertexJobsStandIn() as vertex:`; point the REST client at `vertex.url`."""

    def __init__(self, run_containers: bool = True):
        self.run_containers = run_containers
        self.jobs: dict[str, CustomJob] = {}
        self.created_bodies: list[dict] = []
        self.cancelled: list[str] = []
        self.requests: list[tuple[str, str]] = []
        self._next_id = 1000
        self._server: http.server.ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self) -> "VertexJobsStandIn":
        standin = self

        class Handler(_Handler):
            state = standin

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        for job in self.jobs.values():
            job.cancelled.set()
            for pod in job.pods:
                pod.stop()
        self._server.shutdown()
        self._server.server_close()

    def wait_for(self, predicate, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while not predicate():
            if time.monotonic() > deadline:
                raise TimeoutError("condition not reached in the Vertex AI stand-in")
            time.sleep(0.05)


def _error(code: int, status: str, message: str) -> dict:
    return {"error": {"code": code, "message": message, "status": status}}


class _Handler(http.server.BaseHTTPRequestHandler):
    state: VertexJobsStandIn
    protocol_version = "HTTP/1.1"

    def log_message(self, *args) -> None:
        pass

    def _send(self, code: int, body: dict) -> None:
        raw = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)

    def _body(self) -> dict:
        raw = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        return json.loads(raw) if raw else {}

    def do_POST(self) -> None:
        path = urllib.parse.urlsplit(self.path).path
        self.state.requests.append(("POST", path))
        create = re.fullmatch(r"/v1/(projects/[^/]+/locations/[^/]+)/customJobs", path)
        cancel = re.fullmatch(r"/v1/(projects/[^/]+/locations/[^/]+/customJobs/[^/:]+):cancel", path)
        if create:
            body = self._body()
            problems = _validate(body)
            if problems:
                return self._send(400, _error(400, "INVALID_ARGUMENT", "; ".join(problems)))
            self.state.created_bodies.append(json.loads(json.dumps(body)))
            self.state._next_id += 1
            name = f"{create.group(1)}/customJobs/{self.state._next_id}"
            job = CustomJob(name, body, self.state.run_containers)
            self.state.jobs[name] = job
            return self._send(200, job.snapshot())
        if cancel:
            self._body()
            job = self.state.jobs.get(cancel.group(1))
            if job is None:
                return self._send(404, _error(404, "NOT_FOUND", f"CustomJob {cancel.group(1)} not found"))
            self.state.cancelled.append(cancel.group(1))
            job.cancel()
            return self._send(200, {})
        self._send(404, _error(404, "NOT_FOUND", f"no such method {path}"))

    def do_GET(self) -> None:
        path = urllib.parse.urlsplit(self.path).path
        self.state.requests.append(("GET", path))
        match = re.fullmatch(r"/v1/(projects/[^/]+/locations/[^/]+/customJobs/[^/:]+)", path)
        job = self.state.jobs.get(match.group(1)) if match else None
        if job is None:
            return self._send(404, _error(404, "NOT_FOUND", f"CustomJob {path} not found"))
        self._send(200, job.snapshot())


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
