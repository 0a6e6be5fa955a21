"""A stand-in for the parts of the Kubernetes API that the TFJob launcher calls, on 127.0.0.1.

Endpoints, as the `kubernetes` Python client calls them:

    POST   /apis/kubeflow.org/v1/namespaces/{ns}/tfjobs             create (201; 409 AlreadyExists; 422 Invalid)
    GET    /apis/kubeflow.org/v1/namespaces/{ns}/tfjobs/{name}      read, with .status (404 NotFound)
    DELETE /apis/kubeflow.org/v1/namespaces/{ns}/tfjobs/{name}      delete (200 Status), stops its pods
    GET    /api/v1/namespaces/{ns}/pods/{pod}/log?container=&follow=  pod log (follow streams until exit)

Behind them runs a small local "training operator": each replica of a created TFJob becomes a process
running the container's `command` + `args` (the image is not pulled: the test's own environment stands in
for it), with the `TF_CONFIG` the operator would inject (chief/worker addresses on 127.0.0.1) and the
container's `env`. Pods are named `{job}-{type}-{index}` as the operator names them. With
`restartPolicy: ExitCode`, a replica exiting 128-255 is restarted (up to `runPolicy.backoffLimit` restarts
for the job), 1-127 fails the job; the job succeeds when the chief (or worker 0 without a chief) exits 0.
Conditions follow the operator's: Created, Running, Restarting, Succeeded, Failed.
"""

from __future__ import annotations

import datetime as _dt
import http.server
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.parse
import uuid

GROUP, VERSION, PLURAL = "kubeflow.org", "v1", "tfjobs"
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Pod:
    def __init__(self, name: str, replica_type: str, index: int, container: dict, env: dict):
        self.name, self.replica_type, self.index = name, replica_type, index
        self.container, self.env = container, env
        self.lines: list[str] = []
        self.process: subprocess.Popen | None = None
        self.exit_code: int | None = None
        self.restarts = 0
        self.changed = threading.Condition()
        self.deleted = False

    @property
    def running(self) -> bool:
        return self.process is not None and self.exit_code is None

    def start(self) -> None:
        command = list(self.container.get("command", [])) + list(self.container.get("args", []))
        env = {**os.environ, **{e["name"]: e.get("value", "") for e in self.container.get("env", [])}, **self.env}
        # The test's environment stands in for the image: its `python` is the one running the tests.
        env["PATH"] = os.pathsep.join([os.path.dirname(sys.executable), env.get("PATH", "")])
        with self.changed:
            self.exit_code = None
            self.lines = []
            self.process = subprocess.Popen(command, cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE,
                                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
            self.changed.notify_all()
            threading.Thread(target=self._pump, args=(self.process,), daemon=True).start()

    def _pump(self, process: subprocess.Popen) -> None:
        lines = self.lines
        for line in process.stdout:
            stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%f").rstrip("0").rstrip(".") + "Z"
            with self.changed:
                lines.append((stamp, line))
                self.changed.notify_all()
        code = process.wait()
        with self.changed:
            if self.process is process:
                self.exit_code = code if code >= 0 else 128 - code  # killed by signal N: 128 + N, as in a container
            self.changed.notify_all()

    def stop(self, grace_seconds: float = 5.0) -> None:
        self.deleted = True
        process = self.process
        if process is None or process.poll() is not None:
            return
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(grace_seconds)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


class TFJob:
    """One TFJob and the operator loop that runs its replicas."""

    def __init__(self, body: dict, namespace: str, run_containers: bool):
        self.body = body
        self.namespace = namespace
        self.name = body["metadata"]["name"]
        body["metadata"].update(namespace=namespace, uid=str(uuid.uuid4()), creationTimestamp=_now(),
                                resourceVersion="1", generation=1)
        body["status"] = {"conditions": [], "replicaStatuses": {}}
        self.pods: dict[str, Pod] = {}
        self.lock = threading.Lock()
        self.deleted = threading.Event()
        self._condition("Created", "TFJobCreated", f"TFJob {namespace}/{self.name} is created.")
        if run_containers:
            threading.Thread(target=self._operate, daemon=True).start()

    def _condition(self, kind: str, reason: str, message: str) -> None:
        with self.lock:
            conditions = self.body["status"]["conditions"]
            for c in conditions:
                if c["type"] in ("Running", "Restarting") and kind in ("Running", "Restarting", "Succeeded",
                                                                       "Failed"):
                    c["status"] = "False"
            conditions.append({"type": kind, "status": "True", "reason": reason, "message": message,
                               "lastUpdateTime": _now(), "lastTransitionTime": _now()})
            if kind == "Running" and "startTime" not in self.body["status"]:
                self.body["status"]["startTime"] = _now()
            if kind in ("Succeeded", "Failed"):
                self.body["status"]["completionTime"] = _now()
            self.body["metadata"]["resourceVersion"] = str(int(self.body["metadata"]["resourceVersion"]) + 1)

    def _operate(self) -> None:
        specs = self.body["spec"]["tfReplicaSpecs"]
        addresses = {rtype.lower(): [f"127.0.0.1:{free_port()}" for _ in range(int(spec.get("replicas", 1)))]
                     for rtype, spec in specs.items()}
        policies = {}
        for rtype, spec in specs.items():
            container = next(c for c in spec["template"]["spec"]["containers"] if c["name"] == "tensorflow")
            policies[rtype.lower()] = spec.get("restartPolicy", "Never")
            for index in range(int(spec.get("replicas", 1))):
                tf_config = {"cluster": addresses, "task": {"type": rtype.lower(), "index": index},
                             "environment": "cloud"}
                name = f"{self.name}-{rtype.lower()}-{index}"
                self.pods[name] = Pod(name, rtype.lower(), index, container, {"TF_CONFIG": json.dumps(tf_config)})
        for pod in self.pods.values():
            pod.start()
        self._condition("Running", "TFJobRunning", f"TFJob {self.namespace}/{self.name} is running.")
        backoff_limit = self.body["spec"].get("runPolicy", {}).get("backoffLimit")
        restarts = 0
        chief = next((p for p in self.pods.values() if p.replica_type == "chief"),
                     next((p for p in self.pods.values() if p.replica_type == "worker" and p.index == 0), None))
        while not self.deleted.is_set():
            time.sleep(0.05)
            self._update_replica_statuses()
            for pod in list(self.pods.values()):
                if pod.exit_code is None or pod.deleted:
                    continue
                code = pod.exit_code
                if code == 0:
                    if pod is chief:
                        self._finish(f"TFJob {self.namespace}/{self.name} successfully completed.", succeeded=True)
                        return
                    continue
                retryable = policies[pod.replica_type] in ("ExitCode",) and 128 <= code <= 255 \
                    or policies[pod.replica_type] in ("Always", "OnFailure")
                if retryable and (backoff_limit is None or restarts < backoff_limit):
                    restarts += 1
                    pod.restarts += 1
                    self._condition("Restarting", "TFJobRestarting",
                                    f"TFJob {self.name} is restarting because {pod.replica_type} replica(s) "
                                    f"exited with code {code}.")
                    pod.start()
                    self._condition("Running", "TFJobRunning", f"TFJob {self.namespace}/{self.name} is running.")
                    continue
                reason = "exceeded the backoff limit" if retryable else f"exited with code {code}"
                self._finish(f"TFJob {self.namespace}/{self.name} has failed because {pod.replica_type} replica "
                             f"{pod.index} {reason}.", succeeded=False)
                return

    def _update_replica_statuses(self) -> None:
        statuses: dict[str, dict] = {}
        for pod in self.pods.values():
            s = statuses.setdefault(pod.replica_type.capitalize(), {"active": 0, "succeeded": 0, "failed": 0})
            s["active" if pod.running else "succeeded" if pod.exit_code == 0 else "failed"] += 1
        with self.lock:
            self.body["status"]["replicaStatuses"] = statuses

    def _finish(self, message: str, *, succeeded: bool) -> None:
        policy = self.body["spec"].get("runPolicy", {}).get("cleanPodPolicy", "Running")
        for pod in self.pods.values():
            if policy in ("Running", "All") and pod.running:
                pod.stop()
        self._update_replica_statuses()
        self._condition("Succeeded" if succeeded else "Failed", "TFJobSucceeded" if succeeded else "TFJobFailed",
                        message)

    def delete(self) -> None:
        self.deleted.set()
        for pod in self.pods.values():
            pod.stop()

    def snapshot(self) -> dict:
        with self.lock:
            return json.loads(json.dumps(self.body))


class KubernetesStandIn:
    """Start with `with KubernetesStandIn() as k8s:`; point the client at `k8s.url`."""

    def __init__(self, run_containers: bool = True):
        self.run_containers = run_containers
        self.jobs: dict[tuple[str, str], TFJob] = {}
        self.deleted: list[tuple[str, str]] = []
        self.requests: list[tuple[str, str]] = []
        self.created_bodies: list[dict] = []
        self._server: http.server.ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self) -> "KubernetesStandIn":
        standin = self

        class Handler(_Handler):
            state = standin

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        for job in list(self.jobs.values()):
            job.delete()
        self._server.shutdown()
        self._server.server_close()

    def job(self, namespace: str, name: str) -> TFJob:
        return self.jobs[(namespace, name)]

    def wait_for(self, predicate, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while not predicate():
            if time.monotonic() > deadline:
                raise TimeoutError("condition not reached in the Kubernetes stand-in")
            time.sleep(0.05)


def _status(code: int, reason: str, message: str) -> dict:
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": message,
            "reason": reason, "code": code}


class _Handler(http.server.BaseHTTPRequestHandler):
    state: KubernetesStandIn
    protocol_version = "HTTP/1.1"

    def log_message(self, *args) -> None:  # keep test output clean
        pass

    def _send(self, code: int, body: dict) -> None:
        raw = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)

    def _route(self):
        url = urllib.parse.urlsplit(self.path)
        self.state.requests.append((self.command, url.path))
        query = {k: v[-1] for k, v in urllib.parse.parse_qs(url.query).items()}
        jobs = re.fullmatch(rf"/apis/{GROUP}/{VERSION}/namespaces/([^/]+)/{PLURAL}(?:/([^/]+))?", url.path)
        log = re.fullmatch(r"/api/v1/namespaces/([^/]+)/pods/([^/]+)/log", url.path)
        return jobs, log, query

    def do_POST(self) -> None:
        jobs, _, _ = self._route()
        if not jobs or jobs.group(2):
            return self._send(404, _status(404, "NotFound", "the server could not find the requested resource"))
        namespace = jobs.group(1)
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
        problems = _validate_tfjob(body)
        if problems:
            return self._send(422, _status(422, "Invalid", f"TFJob.kubeflow.org is invalid: {'; '.join(problems)}"))
        name = body["metadata"]["name"]
        if (namespace, name) in self.state.jobs:
            return self._send(409, _status(409, "AlreadyExists", f'tfjobs.kubeflow.org "{name}" already exists'))
        self.state.created_bodies.append(json.loads(json.dumps(body)))
        job = TFJob(body, namespace, self.state.run_containers)
        self.state.jobs[(namespace, name)] = job
        self._send(201, job.snapshot())

    def do_GET(self) -> None:
        jobs, log, query = self._route()
        if jobs and jobs.group(2):
            job = self.state.jobs.get((jobs.group(1), jobs.group(2)))
            if job is None:
                return self._send(404, _status(404, "NotFound", f'tfjobs.kubeflow.org "{jobs.group(2)}" not found'))
            return self._send(200, job.snapshot())
        if log:
            return self._log(log.group(1), log.group(2), query)
        self._send(404, _status(404, "NotFound", "the server could not find the requested resource"))

    def do_DELETE(self) -> None:
        jobs, _, _ = self._route()
        if not jobs or not jobs.group(2):
            return self._send(404, _status(404, "NotFound", "the server could not find the requested resource"))
        key = (jobs.group(1), jobs.group(2))
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        job = self.state.jobs.pop(key, None)
        if job is None:
            return self._send(404, _status(404, "NotFound", f'tfjobs.kubeflow.org "{key[1]}" not found'))
        job.delete()
        self.state.deleted.append(key)
        self._send(200, {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success",
                         "details": {"name": key[1], "group": GROUP, "kind": PLURAL, "uid": job.body["metadata"]["uid"]}})

    def _log(self, namespace: str, pod_name: str, query: dict) -> None:
        pod = next((job.pods[pod_name] for (ns, _), job in list(self.state.jobs.items())
                    if ns == namespace and pod_name in job.pods), None)
        if pod is None:
            return self._send(404, _status(404, "NotFound", f'pods "{pod_name}" not found'))
        if pod.process is None:
            return self._send(400, _status(400, "BadRequest", f'container "tensorflow" in pod "{pod_name}" is '
                                                              "waiting to start: ContainerCreating"))
        follow, timestamps = _bool(query.get("follow")), _bool(query.get("timestamps"))
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        sent = 0
        process, lines = pod.process, pod.lines  # this container instance's log (a restart starts a new one)

        def ended() -> bool:
            return pod.process is not process or pod.exit_code is not None or pod.deleted

        while True:
            with pod.changed:
                while follow and sent == len(lines) and not ended():
                    pod.changed.wait(0.5)
                new, sent = lines[sent:], len(lines)
                finished = (not follow or ended()) and sent == len(lines)
            for stamp, line in new:
                raw = (f"{stamp} {line}" if timestamps else line).encode()
                try:
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(raw), raw))
                    self.wfile.flush()
                except (BrokenPipeError, ConnectionResetError):
                    return
            if finished:
                break
        try:
            self.wfile.write(b"0\r\n\r\n")
        except (BrokenPipeError, ConnectionResetError):
            pass


def _bool(value: str | None) -> bool:
    """Query booleans as the API server parses them (Go's strconv.ParseBool)."""
    return value in ("1", "t", "T", "true", "TRUE", "True")


def _validate_tfjob(body: dict) -> list[str]:
    """The checks the TFJob CRD schema and the operator's admission webhook make, for the fields we use."""
    problems = []
    if body.get("apiVersion") != f"{GROUP}/{VERSION}" or body.get("kind") != "TFJob":
        problems.append(f"apiVersion/kind must be {GROUP}/{VERSION} TFJob")
    name = body.get("metadata", {}).get("name", "")
    if not name or len(name) > 63 or not _NAME.match(name):
        problems.append(f"metadata.name {name!r} must be a DNS-1123 label of at most 63 characters")
    specs = body.get("spec", {}).get("tfReplicaSpecs") or {}
    if not specs:
        problems.append("spec.tfReplicaSpecs is required")
    for rtype, spec in specs.items():
        if rtype not in ("Chief", "Worker", "PS", "Evaluator", "Master"):
            problems.append(f"spec.tfReplicaSpecs.{rtype}: unknown replica type")
        if spec.get("restartPolicy", "Never") not in ("Always", "OnFailure", "Never", "ExitCode"):
            problems.append(f"spec.tfReplicaSpecs.{rtype}.restartPolicy: unsupported value")
        containers = spec.get("template", {}).get("spec", {}).get("containers", [])
        if not any(c.get("name") == "tensorflow" for c in containers):
            problems.append(f"spec.tfReplicaSpecs.{rtype}: one container must be named tensorflow")
        for c in containers:
            if not c.get("image"):
                problems.append(f"spec.tfReplicaSpecs.{rtype}: container {c.get('name')} needs an image")
    return problems
