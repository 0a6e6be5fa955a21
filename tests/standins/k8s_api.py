"""A stand-in for the parts of the Kubernetes API that the TFJob launcher calls, on 127.0.0.1.

It follows the public definitions: the Kubeflow training operator's TFJob CRD (kubeflow.org/v1, the
`kubeflow/training-operator` v1 API types and CRD manifest) and the Kubernetes core/v1 REST API reference for pod
logs; errors are meta/v1 `Status` objects, as the API server writes them (shared stand-in base, base.py).

Endpoints, as the `kubernetes` Python client calls them:

    POST   /apis/kubeflow.org/v1/namespaces/{ns}/tfjobs             create (201; 409 AlreadyExists; 422 Invalid)
    GET    /apis/kubeflow.org/v1/namespaces/{ns}/tfjobs/{name}      read, with .status (404 NotFound)
    DELETE /apis/kubeflow.org/v1/namespaces/{ns}/tfjobs/{name}      delete (200 Status), stops its pods
    GET    /api/v1/namespaces/{ns}/pods/{pod}/log?container=&follow=  pod log (follow streams until exit)

Behind them runs a small local "training operator": each replica of a created TFJob becomes a process
running the container's `command` + `args` (pods.py: the image is not pulled, the test's own environment stands
in for it), with the `TF_CONFIG` the operator would inject (chief/worker addresses on 127.0.0.1) and the
container's `env`. Pods are named `{job}-{type}-{index}` as the operator names them. With
`restartPolicy: ExitCode`, a replica exiting 128-255 is restarted (up to `runPolicy.backoffLimit` restarts
for the job), 1-127 fails the job; the job succeeds when the chief (or worker 0 without a chief) exits 0.
Conditions follow the operator's: Created, Running, Restarting, Succeeded, Failed.
"""

from __future__ import annotations

import json
import re
import threading
import time
import uuid
from typing import Callable

from tests.standins.base import ApiError, Request, StandIn, Stream, kubernetes_status, route
from tests.standins.pods import Pod, free_port

GROUP, VERSION, PLURAL = "kubeflow.org", "v1", "tfjobs"
_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


class TFJob:
    """One TFJob and the operator loop that runs its replicas."""

    def __init__(self, body: dict, namespace: str, run_containers: bool, now: Callable[[], str]):
        self.body = body
        self.now = now
        self.namespace = namespace
        self.name = body["metadata"]["name"]
        body["metadata"].update(namespace=namespace, uid=str(uuid.uuid4()), creationTimestamp=now(),
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
                               "lastUpdateTime": self.now(), "lastTransitionTime": self.now()})
            if kind == "Running" and "startTime" not in self.body["status"]:
                self.body["status"]["startTime"] = self.now()
            if kind in ("Succeeded", "Failed"):
                self.body["status"]["completionTime"] = self.now()
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


class KubernetesStandIn(StandIn):
    """Start with `with KubernetesStandIn() as k8s:`; point the client at `k8s.url`."""

    name = "Kubernetes"

    def __init__(self, run_containers: bool = True):
        super().__init__()
        self.run_containers = run_containers
        self.jobs: dict[tuple[str, str], TFJob] = {}
        self.deleted: list[tuple[str, str]] = []
        self.created_bodies: list[dict] = []

    def routes(self) -> list:
        jobs = rf"/apis/{GROUP}/{VERSION}/namespaces/(?P<namespace>[^/]+)/{PLURAL}"
        return [
            route("POST", jobs, "createKubeflowOrgV1NamespacedTFJob", self._create),
            route("GET", jobs + "/(?P<name>[^/]+)", "readKubeflowOrgV1NamespacedTFJob", self._read),
            route("DELETE", jobs + "/(?P<name>[^/]+)", "deleteKubeflowOrgV1NamespacedTFJob", self._delete),
            route("GET", r"/api/v1/namespaces/(?P<namespace>[^/]+)/pods/(?P<pod>[^/]+)/log",
                  "readCoreV1NamespacedPodLog", self._log),
        ]

    def error_body(self, error: ApiError, request: Request) -> dict:
        return kubernetes_status(error)

    def no_route(self, request: Request, path_known: bool) -> ApiError:
        return ApiError("NOT_FOUND", "the server could not find the requested resource")

    def stop(self) -> None:
        for job in list(self.jobs.values()):
            job.delete()
        super().stop()

    def job(self, namespace: str, name: str) -> TFJob:
        return self.jobs[(namespace, name)]

    # -- handlers --------------------------------------------------------------------------------------

    def _create(self, request: Request) -> tuple[int, dict]:
        namespace, body = request.params["namespace"], request.json()
        problems = _validate_tfjob(body)
        if problems:
            raise ApiError("INVALID_ARGUMENT", f"TFJob.kubeflow.org is invalid: {'; '.join(problems)}",
                           http_status=422)
        name = body["metadata"]["name"]
        if (namespace, name) in self.jobs:
            raise ApiError("ALREADY_EXISTS", f'tfjobs.kubeflow.org "{name}" already exists')
        self.created_bodies.append(json.loads(json.dumps(body)))
        job = TFJob(body, namespace, self.run_containers, lambda: self.now(0))
        self.jobs[(namespace, name)] = job
        return 201, job.snapshot()

    def _read(self, request: Request) -> dict:
        job = self.jobs.get((request.params["namespace"], request.params["name"]))
        if job is None:
            raise ApiError("NOT_FOUND", f'tfjobs.kubeflow.org "{request.params["name"]}" not found')
        return job.snapshot()

    def _delete(self, request: Request) -> dict:
        key = (request.params["namespace"], request.params["name"])
        job = self.jobs.pop(key, None)
        if job is None:
            raise ApiError("NOT_FOUND", f'tfjobs.kubeflow.org "{key[1]}" not found')
        job.delete()
        self.deleted.append(key)
        return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success",
                "details": {"name": key[1], "group": GROUP, "kind": PLURAL, "uid": job.body["metadata"]["uid"]}}

    def _log(self, request: Request) -> Stream:
        namespace, pod_name = request.params["namespace"], request.params["pod"]
        pod = next((job.pods[pod_name] for (ns, _), job in self.jobs.items()
                    if ns == namespace and pod_name in job.pods), None)
        if pod is None:
            raise ApiError("NOT_FOUND", f'pods "{pod_name}" not found')
        if pod.process is None:
            raise ApiError("INVALID_ARGUMENT", f'container "tensorflow" in pod "{pod_name}" is waiting to start: '
                                               "ContainerCreating")
        follow, timestamps = _bool(request.arg("follow")), _bool(request.arg("timestamps"))
        return Stream(_follow(pod, follow, timestamps))


def _follow(pod: Pod, follow: bool, timestamps: bool):
    """The log of the pod's current container instance (a restart starts a new one), until it ends when following."""
    sent = 0
    process, lines = pod.process, pod.lines

    def ended() -> bool:
        return pod.process is not process or pod.exit_code is not None or pod.deleted

    while True:
        with pod.changed:
            while follow and sent == len(lines) and not ended():
                pod.changed.wait(0.5)
            new, sent = lines[sent:], len(lines)
            finished = (not follow or ended()) and sent == len(lines)
        for stamp, line in new:
            yield (f"{stamp} {line}" if timestamps else line).encode()
        if finished:
            return


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
