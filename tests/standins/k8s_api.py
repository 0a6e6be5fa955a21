"""A stand-in for the parts of the Kubernetes API that the launchers call, on 127.0.0.1.

It follows the public definitions: the Kubeflow training operator's TFJob CRD (kubeflow.org/v1, the
`kubeflow/training-operator` v1 API types and CRD manifest) and PyTorchJob (its v1.9.4 CRD, vendored), Kubeflow
Trainer v2.3.0's TrainJob and ClusterTrainingRuntime (trainer.kubeflow.org/v1alpha1) and JobSet v0.12.0
(jobset.x-k8s.io/v1alpha2), whose CRDs are vendored under tests/schemas/ and whose controllers are in trainer.py and
jobsets.py, and the Kubernetes core/v1 REST API reference for pods and pod logs; errors are meta/v1 `Status` objects,
as the API server writes them (shared stand-in base, base.py).

Endpoints, as the `kubernetes` Python client calls them:

    POST   /apis/kubeflow.org/v1/namespaces/{ns}/tfjobs             create (201; 409 AlreadyExists; 422 Invalid;
                                                                    ?dryRun=All: the job as the webhooks left it,
                                                                    nothing kept)
    GET    /apis/kubeflow.org/v1/namespaces/{ns}/tfjobs/{name}      read, with .status (404 NotFound)
    DELETE /apis/kubeflow.org/v1/namespaces/{ns}/tfjobs/{name}      delete (200 Status), stops its pods
    POST/GET/DELETE /apis/kubeflow.org/v1/namespaces/{ns}/pytorchjobs[/{name}]  the same for PyTorchJobs (422:
                                                                    the vendored CRD; 403: the operator's webhook)
    POST   /apis/trainer.kubeflow.org/v1alpha1/clustertrainingruntimes          create (cluster-scoped)
    GET    /apis/trainer.kubeflow.org/v1alpha1/clustertrainingruntimes/{name}   read
    POST   /apis/trainer.kubeflow.org/v1alpha1/namespaces/{ns}/trainjobs        create (422 Invalid: CRD schema;
                                                                                403: Trainer's webhook denied it)
    GET    /apis/trainer.kubeflow.org/v1alpha1/namespaces/{ns}/trainjobs/{name} read, with .status
    DELETE /apis/trainer.kubeflow.org/v1alpha1/namespaces/{ns}/trainjobs/{name} delete, with its JobSet and pods
    POST/GET/DELETE /apis/jobset.x-k8s.io/v1alpha2/namespaces/{ns}/jobsets[/{name}]  the same for JobSets
    GET    /api/v1/namespaces/{ns}/pods?labelSelector=k=v,...       list the JobSets' and the TFJobs' and
                                                                    PyTorchJobs' pods (equality selectors)
    GET    /api/v1/namespaces/{ns}/pods/{pod}/log?container=&follow=&tailLines=  pod log (follow streams until exit)

Behind the TFJob endpoints runs a small local "training operator": each replica of a created TFJob becomes a process
running the container's `command` + `args` (pods.py: the image is not pulled, the test's own environment stands in for
it), with the `TF_CONFIG` the operator would inject (chief/worker addresses on 127.0.0.1) and the container's `env`.
Pods are named `{job}-{type}-{index}` as the operator names them. With `restartPolicy: ExitCode`, a replica exiting
128-255 is restarted (up to `runPolicy.backoffLimit` restarts for the job), 1-127 fails the job; the job succeeds when
the chief (or worker 0 without a chief) exits 0. Conditions follow the operator's: Created, Running, Restarting,
Succeeded, Failed. A PyTorchJob runs the same way with a Master instead of a Chief and the env of the operator's
v1.9.4 PyTorch controller instead of TF_CONFIG (`PyTorchJob`). Behind the TrainJob and JobSet endpoints run the
"trainer" and "JobSet" controllers of trainer.py and jobsets.py; `preempt(namespace, pod)` shuts a JobSet pod's node
down as a Spot VM preemption does. With `kueue_flavors`, Kueue admits queued TrainJobs to a ResourceFlavor first
(kueue.py); with `kueue_frameworks`, the kinds Kueue's configuration manages (default: v0.19.2's, which leave out
TFJob and PyTorchJob), whose queued jobs its webhook suspends (kueue.py). With `admission_plugins`, the API server's mutating plugins (admission.py: GKE's
ExtendedResourceToleration) change each JobSet pod as it is created.
"""

from __future__ import annotations

import json
import re
import threading
import time
import uuid
from typing import Callable

from tests.standins.base import ApiError, Request, StandIn, Stream, kubernetes_status, route
from tests.standins.jobsets import (DNS1035, JOBSET_GROUP, JOBSET_VERSION, JobSetPod, JobSetRun, invalid,
                                    jobset_problems)
from tests.standins.kueue import (DEFAULT_FRAMEWORKS, JOB_UID_LABEL, QUEUE_LABEL, admit_operator_job,
                                  admit_trainjob, default_operator_job, hold_trainjob, left_out_on_write_back,
                                  quota_shortfall, workload)
from tests.standins.trainer import (FRAMEWORK_POLICIES, SIMULATED_POLICIES, TRAINER_GROUP, TRAINER_VERSION,
                                    TrainJobRun, runtime_problems, trainjob_jobset, trainjob_problems)
from tests.standins.pods import Pod, free_port
from tests.standins.validation import crd_problems

GROUP, VERSION, PLURAL = "kubeflow.org", "v1", "tfjobs"
_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


class TFJob:
    """One TFJob and the operator loop that runs its replicas."""

    kind, specs_key, container_name, chief_type = "TFJob", "tfReplicaSpecs", "tensorflow", "chief"
    port_name, default_port = "tfjob-port", 2222  # tensorflow_defaults.go, tfjob_types.go
    restart_seconds = 0.5  # from a replica's failure to its recreated pod running (a cluster: seconds or more)

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
        self._condition("Created", f"{self.kind}Created", f"{self.kind} {self.name} is created.")
        if run_containers and not body["spec"].get("runPolicy", {}).get("suspend"):  # suspended: Kueue's to start
            threading.Thread(target=self._operate, daemon=True).start()

    def _condition(self, kind: str, reason: str, message: str) -> None:
        """The operator's setCondition (v1.9.4 pkg/util/status.go:103-140): nothing changes once the job failed or
        when the condition is already there with that reason; else it replaces the condition of its type,
        Restarting and Running replace each other, and Succeeded or Failed turn Running False."""
        with self.lock:
            conditions = self.body["status"]["conditions"]
            if any(c["type"] == "Failed" and c["status"] == "True" for c in conditions) or any(
                    c["type"] == kind and c["status"] == "True" and c["reason"] == reason for c in conditions):
                return
            kept = [c for c in conditions if c["type"] != kind and {c["type"], kind} != {"Running", "Restarting"}]
            for c in kept:
                if kind in ("Succeeded", "Failed") and c["type"] == "Running":
                    c["status"] = "False"
            conditions[:] = kept + [{"type": kind, "status": "True", "reason": reason, "message": message,
                                     "lastUpdateTime": self.now(), "lastTransitionTime": self.now()}]
            if kind == "Running" and "startTime" not in self.body["status"]:
                self.body["status"]["startTime"] = self.now()
            if kind in ("Succeeded", "Failed"):
                self.body["status"]["completionTime"] = self.now()
            self.body["metadata"]["resourceVersion"] = str(int(self.body["metadata"]["resourceVersion"]) + 1)

    def replica_env(self, specs: dict, rtype: str, index: int, addresses: dict) -> dict:
        """What the operator adds to a running replica's env here: TF_CONFIG (chief/worker addresses on
        127.0.0.1)."""
        return self.cluster_env(specs, rtype, index, addresses)

    def cluster_env(self, specs: dict, rtype: str, index: int, addresses: dict) -> dict:
        """What the operator adds to a replica's env, given each replica type's `host:port` addresses: TF_CONFIG,
        as compact JSON (pkg/controller.v1/tensorflow/tensorflow.go:112-155 at v1.9.4)."""
        tf_config = {"cluster": addresses, "task": {"type": rtype.lower(), "index": index}, "environment": "cloud"}
        return {"TF_CONFIG": json.dumps(tf_config, separators=(",", ":"))}

    def port(self, spec: dict) -> int:
        """The replica's port: its container's port named `port_name`, else the kind's default (TFJob:
        tensorflow.go:157-185 GetPortFromTFJob, tensorflow_defaults.go:53-70)."""
        return next((p["containerPort"] for c in spec["template"]["spec"]["containers"]
                     if c["name"] == self.container_name for p in c.get("ports", [])
                     if p.get("name") == self.port_name), self.default_port)

    def pod_spec(self, rtype: str, index: int) -> dict:
        """The spec of the pod the operator creates for replica `rtype` `index` in a cluster, where the stand-in
        runs a local process instead (v1.9.4 pkg/controller.v1/common/pod.go:400-470 createNewPod): the replica's
        template; its container's port defaulted to the kind's (`port_name`, apis/kubeflow.org/v1/*_defaults.go);
        the operator's env appended to the container's, with each replica's address its headless Service
        `{job}-{type}-{i}` in the job's namespace (tensorflow.go:157-185; pytorch/master.go:33-62); the pod's
        restartPolicy the replica's, ExitCode as Never: the operator, not the kubelet, restarts a replica
        (pkg/core/pod.go SetRestartPolicy)."""
        specs = self.body["spec"][self.specs_key]
        addresses = {t.lower(): [f"{self.name}-{t.lower()}-{i}.{self.namespace}.svc:{self.port(spec)}"
                                 for i in range(int(spec.get("replicas", 1)))] for t, spec in specs.items()}
        pod = json.loads(json.dumps(specs[rtype]["template"]["spec"]))
        container = next(c for c in pod["containers"] if c["name"] == self.container_name)
        if not any(p.get("name") == self.port_name for p in container.get("ports", [])):
            container.setdefault("ports", []).append({"name": self.port_name, "containerPort": self.default_port})
        container["env"] = [*container.get("env", []), *({"name": k, "value": v} for k, v in
                                                           self.cluster_env(specs, rtype, index, addresses).items())]
        policy = specs[rtype].get("restartPolicy", "Never")
        pod["restartPolicy"] = "Never" if policy == "ExitCode" else policy
        return pod

    def _operate(self) -> None:
        specs = self.body["spec"][self.specs_key]
        addresses = {rtype.lower(): [f"127.0.0.1:{free_port()}" for _ in range(int(spec.get("replicas", 1)))]
                     for rtype, spec in specs.items()}
        policies = {}
        for rtype, spec in specs.items():
            container = next(c for c in spec["template"]["spec"]["containers"] if c["name"] == self.container_name)
            policies[rtype.lower()] = spec.get("restartPolicy", "Never")
            for index in range(int(spec.get("replicas", 1))):
                name = f"{self.name}-{rtype.lower()}-{index}"
                self.pods[name] = Pod(name, rtype.lower(), index, container,
                                      self.replica_env(specs, rtype, index, addresses))
        for pod in self.pods.values():
            pod.start()
        self._condition("Running", f"{self.kind}Running", self.message("running"))
        backoff_limit = self.body["spec"].get("runPolicy", {}).get("backoffLimit")
        restarts = 0
        chief = next((p for p in self.pods.values() if p.replica_type == self.chief_type),
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
                        self._finish(self.message("succeeded"), succeeded=True)
                        return
                    continue
                # common/pod.go:349-371: ExitCode restarts 128-255 (train_util.go:24-26) by deleting and
                # recreating the pod, whose restartCount is 0 again, so runPolicy.backoffLimit does not bound these
                # restarts: pkg/core/job.go:95-133 counts the containers' restartCount on running pods, which
                # only Always and OnFailure (the kubelet restarting the container) raise
                policy = policies[pod.replica_type]
                retryable = policy == "ExitCode" and 128 <= code <= 255 or policy in ("Always", "OnFailure")
                counted = policy in ("Always", "OnFailure")
                if retryable and (not counted or backoff_limit is None or restarts < backoff_limit):
                    restarts += counted
                    pod.restarts += 1
                    self._condition("Restarting", f"{self.kind}Restarting",
                                    f"job {self.name} is restarting because {pod.replica_type.capitalize()} "
                                    "replica(s) failed.")
                    # the recreated pod is scheduled and started before the operator sees it running and sets
                    # Running, which drops Restarting (pytorchjob_controller.go:385-388; pkg/util/status.go)
                    self.deleted.wait(self.restart_seconds)
                    pod.start()
                    self._condition("Running", f"{self.kind}Running", self.message("running"))
                    continue
                if retryable:  # common/job.go:205-211
                    message = f"Job {self.name} has failed because it has reached the specified backoff limit"
                else:
                    message = (f'job "{self.name}" is failing because "{pod.replica_type.capitalize()}" '
                               "replica(s) failed.")
                self._finish(message, succeeded=False)
                return

    def api_pods(self) -> list[dict]:
        """Its replicas' pods, but those deleted, as core/v1 Pod JSON: the replica template's labels and those the
        operator adds (v1.9.4 pkg/controller.v1/common/pod.go:402-407 and job_controller.go:236-242: its name, the
        job's, the replica type in lower case, the index, job-role master on the primary), its container's state."""
        specs = self.body["spec"][self.specs_key]
        pods = []
        for pod in list(self.pods.values()):
            if pod.deleted:
                continue
            rtype = next(t for t in specs if t.lower() == pod.replica_type)
            labels = {**specs[rtype]["template"].get("metadata", {}).get("labels", {}),
                      "training.kubeflow.org/operator-name": f"{self.kind.lower()}-controller",
                      "training.kubeflow.org/job-name": self.name, "training.kubeflow.org/replica-type": pod.replica_type,
                      "training.kubeflow.org/replica-index": str(pod.index)}
            if pod.replica_type == self.chief_type:
                labels["training.kubeflow.org/job-role"] = "master"
            pods.append({"apiVersion": "v1", "kind": "Pod", "metadata": {
                "name": pod.name, "namespace": self.namespace, "labels": labels,
                "uid": str(uuid.uuid5(uuid.NAMESPACE_DNS, f"{self.body['metadata']['uid']}/{pod.name}"))},
                "spec": self.pod_spec(rtype, pod.index), "status": pod.api_status(pod.started, pod.ended)})
        return pods

    def message(self, state: str) -> str:
        """The Running and Succeeded conditions' messages of a job with a chief (tfjob_controller.go:447-452)."""
        return f"{self.kind} {self.namespace}/{self.name} " + {"running": "is running.",
                                                             "succeeded": "successfully completed."}[state]

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
        self._condition("Succeeded" if succeeded else "Failed",
                        f"{self.kind}Succeeded" if succeeded else f"{self.kind}Failed", message)

    def delete(self) -> None:
        self.deleted.set()
        for pod in list(self.pods.values()):  # a copy: the operator's thread may still be adding pods
            pod.stop()

    def snapshot(self) -> dict:
        with self.lock:
            return json.loads(json.dumps(self.body))


class PyTorchJob(TFJob):
    """One PyTorchJob (Training Operator v1.9.4) and the operator loop that runs its replicas: the TFJob's loop
    (ExitCode restarts, conditions), a Master instead of a Chief, and the env of
    pkg/controller.v1/pytorch/envvar.go:43-127 and master.go:33-62 instead of TF_CONFIG.

    In a cluster MASTER_ADDR and PET_MASTER_ADDR name the master's Service (`{job}-master-0`) and MASTER_PORT and
    PET_MASTER_PORT its container port `pytorchjob-port`; on loopback the replicas get 127.0.0.1 and a free port
    for them. `declared_env[pod]` keeps what the operator sets, as a cluster's pod spec would show it."""

    kind, specs_key, container_name, chief_type = "PyTorchJob", "pytorchReplicaSpecs", "pytorch", "master"
    port_name, default_port = "pytorchjob-port", 23456  # pytorch_defaults.go, pytorch_types.go:25-29

    def __init__(self, body: dict, namespace: str, run_containers: bool, now: Callable[[], str]):
        self.declared_env: dict[str, dict] = {}
        self.loopback_port = free_port()
        super().__init__(body, namespace, run_containers, now)

    def cluster_env(self, specs: dict, rtype: str, index: int, addresses: dict) -> dict:
        spec = self.body["spec"]
        replicas = sum(int(s.get("replicas", 1)) for s in specs.values())  # envvar.go:142-148
        nproc = spec.get("nprocPerNode")
        world = replicas * (int(nproc) if str(nproc).isdigit() else 1)  # envvar.go:62-64, 132-140
        env = {"PYTHONUNBUFFERED": "1"}  # envvar.go:56-60
        if "Master" in specs:  # envvar.go:67-97; master.go:36-59
            port = self.port(specs["Master"])
            rank = index + 1 if rtype == "Worker" else index
            env.update({"MASTER_PORT": str(port), "PET_MASTER_PORT": str(port),
                        "MASTER_ADDR": f"{self.name}-master-0", "PET_MASTER_ADDR": f"{self.name}-master-0",
                        "WORLD_SIZE": str(world), "RANK": str(rank), "PET_NODE_RANK": str(rank)})
        if nproc is not None:  # envvar.go:99-104
            env["PET_NPROC_PER_NODE"] = str(nproc)
        if spec.get("elasticPolicy") is None:  # envvar.go:117-123 (elastic mode is not simulated)
            env["PET_NNODES"] = str(replicas)
        return env

    def replica_env(self, specs: dict, rtype: str, index: int, addresses: dict) -> dict:
        env = self.cluster_env(specs, rtype, index, addresses)
        self.declared_env[f"{self.name}-{rtype.lower()}-{index}"] = dict(env)
        loopback = {"MASTER_ADDR": "127.0.0.1", "PET_MASTER_ADDR": "127.0.0.1",
                    "MASTER_PORT": str(self.loopback_port), "PET_MASTER_PORT": str(self.loopback_port)}
        return {**env, **{k: v for k, v in loopback.items() if k in env}}

    def message(self, state: str) -> str:
        """The Running and Succeeded conditions' messages of a job with a master (pytorchjob_controller.go:
        385-392)."""
        return f"PyTorchJob {self.name} " + {"running": "is running.", "succeeded": "is successfully completed."}[state]

    def pod_spec(self, rtype: str, index: int) -> dict:
        """TFJob.pod_spec, and on each Worker of a job with a Master the init container that waits for the
        master's Service to resolve (pytorch/initcontainer.go:30-48, 105-135; the operator's default
        --pytorch-init-container-image and -max-tries, cmd/training-operator.v1/main.go:104-109,
        pkg/config/config.go:26-33), which the stand-in does not run."""
        pod = super().pod_spec(rtype, index)
        if rtype == "Worker" and "Master" in self.body["spec"][self.specs_key]:
            pod.setdefault("initContainers", []).append({
                "name": "init-pytorch", "image": "alpine:3.10", "imagePullPolicy": "IfNotPresent",
                "resources": {"limits": {"cpu": "100m", "memory": "20Mi"},
                              "requests": {"cpu": "50m", "memory": "10Mi"}},
                "command": ["sh", "-c", f"err=1;for i in $(seq 100); do if nslookup {self.name}-master-0; then err=0 "
                                        "&& break; fi;echo waiting for master; sleep 2; done; exit $err"]})
        return pod


def default_pytorchjob(body: dict) -> None:
    """The operator's defaulting webhook, for the fields the stand-in reads (pytorch_defaults.go:31-36, 68-95):
    replicas 1, the master port `pytorchjob-port` 23456, nprocPerNode `auto` without an elastic policy."""
    spec = body.setdefault("spec", {})
    for rspec in (spec.get("pytorchReplicaSpecs") or {}).values():
        rspec.setdefault("replicas", 1)
        rspec.setdefault("restartPolicy", "OnFailure")
        for container in rspec.get("template", {}).get("spec", {}).get("containers", []):
            if container.get("name") == "pytorch" and not any(p.get("name") == "pytorchjob-port"
                                                              for p in container.get("ports", [])):
                container.setdefault("ports", []).append({"name": "pytorchjob-port", "containerPort": 23456})
    if spec.get("elasticPolicy") is None:
        spec.setdefault("nprocPerNode", "auto")


def _validate_pytorchjob(body: dict) -> list[str]:
    """The operator's validating webhook (pkg/webhooks/pytorch/pytorchjob_webhook.go:75-160) for the fields we
    use, after the CRD's schema (vendored, validation.py) has passed."""
    problems = []
    name = body.get("metadata", {}).get("name", "")
    if not DNS1035.match(name) or len(name) > 63:
        problems.append(f"metadata.name: Invalid value: {name!r}: should match: a DNS-1035 label")
    specs = body.get("spec", {}).get("pytorchReplicaSpecs")
    if not specs:
        problems.append("spec.pytorchReplicaSpecs: Required value: must be required")
    for rtype, rspec in (specs or {}).items():
        where = f"spec.pytorchReplicaSpecs[{rtype}]"
        if rtype not in ("Master", "Worker"):
            problems.append(f'{where}: Unsupported value: "{rtype}": supported values: "Master", "Worker"')
        containers = (rspec or {}).get("template", {}).get("spec", {}).get("containers", [])
        for index, container in enumerate(containers):
            if not container.get("image"):
                problems.append(f"{where}.template.spec.containers[{index}].image: Required value: must be required")
        if not any(c.get("name") == "pytorch" for c in containers):
            problems.append(f"{where}.template.spec.containers: Required value: must have at least one container "
                            "with name pytorch")
        replicas = (rspec or {}).get("replicas")
        if rtype == "Master" and replicas != 1:
            problems.append(f"{where}.replicas: Forbidden: must be 1")
        elif replicas is not None and replicas < 1:
            problems.append(f"{where}.replicas: Forbidden: must be at least 1")
    return problems


class KubernetesStandIn(StandIn):
    """Start with `with KubernetesStandIn() as k8s:`; point the client at `k8s.url`."""

    name = "Kubernetes"

    def __init__(self, run_containers: bool = True, kueue_flavors: dict[str, dict] | None = None,
                 admission_plugins: tuple[str, ...] = (), kueue_frameworks: frozenset[str] = DEFAULT_FRAMEWORKS,
                 kueue_quotas: dict[str, dict] | None = None):
        super().__init__()
        self.run_containers = run_containers
        self.admission_plugins = tuple(admission_plugins)  # mutating plugins run on each pod created (admission.py)
        self.kueue_flavors = kueue_flavors or {}  # Kueue's LocalQueue name -> its ResourceFlavor's spec (kueue.py)
        self.kueue_quotas = kueue_quotas or {}  # LocalQueue name -> its ClusterQueue's flavor and quota (kueue.py)
        self.workloads: dict[tuple[str, str], dict] = {}  # Kueue's Workload of each queued TrainJob
        self.kueue_frameworks = frozenset(kueue_frameworks)  # the kinds Kueue's configuration manages (kueue.py)
        self.dry_runs: list[dict] = []  # TFJobs and PyTorchJobs as a server-side dry run answered them
        self.jobs: dict[tuple[str, str], TFJob] = {}
        self.pytorchjobs: dict[tuple[str, str], PyTorchJob] = {}
        self.trainjobs: dict[tuple[str, str], TrainJobRun] = {}
        self.jobsets: dict[tuple[str, str], JobSetRun] = {}
        self.runtimes: dict[str, dict] = {}
        self.deleted: list[tuple[str, str]] = []  # (namespace, name) of the TFJobs, TrainJobs and JobSets deleted
        self.created_bodies: list[dict] = []  # TFJobs, TrainJobs and JobSets as sent, in order

    def routes(self) -> list:
        jobs = rf"/apis/{GROUP}/{VERSION}/namespaces/(?P<namespace>[^/]+)/{PLURAL}"
        pytorchjobs = rf"/apis/{GROUP}/{VERSION}/namespaces/(?P<namespace>[^/]+)/pytorchjobs"
        trainjobs = rf"/apis/{TRAINER_GROUP}/{TRAINER_VERSION}/namespaces/(?P<namespace>[^/]+)/trainjobs"
        runtimes = rf"/apis/{TRAINER_GROUP}/{TRAINER_VERSION}/clustertrainingruntimes"
        jobsets = rf"/apis/{JOBSET_GROUP}/{JOBSET_VERSION}/namespaces/(?P<namespace>[^/]+)/jobsets"
        name = "/(?P<name>[^/]+)"
        return [
            route("POST", jobs, "createKubeflowOrgV1NamespacedTFJob", self._create),
            route("GET", jobs + name, "readKubeflowOrgV1NamespacedTFJob", self._read),
            route("DELETE", jobs + name, "deleteKubeflowOrgV1NamespacedTFJob", self._delete),
            route("POST", pytorchjobs, "createKubeflowOrgV1NamespacedPyTorchJob", self._create_pytorchjob),
            route("GET", pytorchjobs + name, "readKubeflowOrgV1NamespacedPyTorchJob", self._read_pytorchjob),
            route("DELETE", pytorchjobs + name, "deleteKubeflowOrgV1NamespacedPyTorchJob", self._delete_pytorchjob),
            route("POST", runtimes, "createTrainerV1alpha1ClusterTrainingRuntime", self._create_runtime),
            route("GET", runtimes + name, "readTrainerV1alpha1ClusterTrainingRuntime", self._read_runtime),
            route("POST", trainjobs, "createTrainerV1alpha1NamespacedTrainJob", self._create_trainjob),
            route("GET", trainjobs + name, "readTrainerV1alpha1NamespacedTrainJob", self._read_trainjob),
            route("DELETE", trainjobs + name, "deleteTrainerV1alpha1NamespacedTrainJob", self._delete_trainjob),
            route("POST", jobsets, "createJobsetV1alpha2NamespacedJobSet", self._create_jobset),
            route("GET", jobsets + name, "readJobsetV1alpha2NamespacedJobSet", self._read_jobset),
            route("DELETE", jobsets + name, "deleteJobsetV1alpha2NamespacedJobSet", self._delete_jobset),
            route("GET", r"/api/v1/namespaces/(?P<namespace>[^/]+)/pods", "listCoreV1NamespacedPod", self._list_pods),
            route("GET", r"/apis/kueue.x-k8s.io/v1beta2/namespaces/(?P<namespace>[^/]+)/workloads",
                  "listKueueXK8sIoV1beta2NamespacedWorkload", self._list_workloads),
            route("GET", r"/api/v1/namespaces/(?P<namespace>[^/]+)/pods/(?P<pod>[^/]+)/log",
                  "readCoreV1NamespacedPodLog", self._log),
        ]

    def error_body(self, error: ApiError, request: Request) -> dict:
        return kubernetes_status(error)

    def no_route(self, request: Request, path_known: bool) -> ApiError:
        return ApiError("NOT_FOUND", "the server could not find the requested resource")

    def stop(self) -> None:
        for job in [*self.jobs.values(), *self.pytorchjobs.values(), *self.jobsets.values()]:
            job.delete()
        super().stop()

    def job(self, namespace: str, name: str) -> TFJob:
        return self.jobs[(namespace, name)]

    def pytorchjob(self, namespace: str, name: str) -> PyTorchJob:
        return self.pytorchjobs[(namespace, name)]

    def jobset(self, namespace: str, name: str) -> JobSetRun:
        """A JobSet, created directly or by a TrainJob of the same name."""
        return self.jobsets[(namespace, name)]

    def jobset_pods(self, namespace: str) -> list[JobSetPod]:
        return [pod for (ns, _), jobset in list(self.jobsets.items()) if ns == namespace for pod in jobset.pods()]

    def preempt(self, namespace: str, pod_name: str) -> None:
        """The pod's node shuts down (a Spot VM preemption): DisruptionTarget, SIGTERM, SIGKILL after the grace."""
        next(pod for pod in self.jobset_pods(namespace) if pod.name == pod_name).preempt()

    def add_runtime(self, runtime: dict) -> None:
        """Installs a ClusterTrainingRuntime, as `kubectl apply` would (checked as the API server checks it)."""
        problems = runtime_problems(runtime)
        if problems:
            raise ValueError(f"ClusterTrainingRuntime is invalid: {'; '.join(problems)}")
        self.runtimes[runtime["metadata"]["name"]] = json.loads(json.dumps(runtime))

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
        if self._kueue_webhook(request, body, "TFJob"):
            return 201, self.dry_runs[-1]
        self.created_bodies.append(json.loads(json.dumps(body)))
        job = TFJob(body, namespace, self.run_containers, lambda: self.now(0))
        self.jobs[(namespace, name)] = job
        return 201, job.snapshot()

    def _kueue_webhook(self, request: Request, body: dict, kind: str) -> bool:
        """Kueue's webhook on a Training Operator v1 job (kueue.py), then, on a dry run (`dryRun=All`), the answer
        kept in `dry_runs` and True: the API server persists nothing. On a real create, a job Kueue suspended is
        admitted at once when its queue is one of `kueue_flavors`, and stays suspended (no pods) otherwise."""
        suspended = default_operator_job(body, kind, self.kueue_frameworks)
        if request.arg("dryRun") == "All":
            self.dry_runs.append(json.loads(json.dumps(body)))
            return True
        if suspended and body["metadata"]["labels"][QUEUE_LABEL] in self.kueue_flavors:
            admit_operator_job(body)
        return False

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
        return _deleted(key[1], GROUP, PLURAL, job.body["metadata"]["uid"])

    def _create_pytorchjob(self, request: Request) -> tuple[int, dict]:
        namespace, body = request.params["namespace"], request.json()
        name = body.get("metadata", {}).get("name", "")
        problems = crd_problems(body)  # the API server's schema check, before the webhooks see the defaults
        if problems:
            raise invalid("PyTorchJob", GROUP, name, problems)
        default_pytorchjob(body)
        problems = _validate_pytorchjob(body)
        if problems:  # the operator's webhook: a field.ErrorList's aggregate (k8s.io/apimachinery util/errors)
            raise _denied(problems[0] if len(problems) == 1 else f"[{', '.join(problems)}]",
                          "validator.pytorchjob.training-operator.kubeflow.org")
        if (namespace, name) in self.pytorchjobs:
            raise ApiError("ALREADY_EXISTS", f'pytorchjobs.{GROUP} "{name}" already exists')
        if self._kueue_webhook(request, body, "PyTorchJob"):
            return 201, self.dry_runs[-1]
        self.created_bodies.append(json.loads(json.dumps(body)))
        job = PyTorchJob(body, namespace, self.run_containers, lambda: self.now(0))
        self.pytorchjobs[(namespace, name)] = job
        return 201, job.snapshot()

    def _read_pytorchjob(self, request: Request) -> dict:
        job = self.pytorchjobs.get((request.params["namespace"], request.params["name"]))
        if job is None:
            raise ApiError("NOT_FOUND", f'pytorchjobs.{GROUP} "{request.params["name"]}" not found')
        return job.snapshot()

    def _delete_pytorchjob(self, request: Request) -> dict:
        key = (request.params["namespace"], request.params["name"])
        job = self.pytorchjobs.pop(key, None)
        if job is None:
            raise ApiError("NOT_FOUND", f'pytorchjobs.{GROUP} "{key[1]}" not found')
        job.delete()
        self.deleted.append(key)
        return _deleted(key[1], GROUP, "pytorchjobs", job.body["metadata"]["uid"])

    def _create_runtime(self, request: Request) -> tuple[int, dict]:
        body = request.json()
        name = body.get("metadata", {}).get("name", "")
        problems = runtime_problems(body)
        if problems:
            raise invalid("ClusterTrainingRuntime", TRAINER_GROUP, name, problems)
        if name in self.runtimes:
            raise ApiError("ALREADY_EXISTS", f'clustertrainingruntimes.{TRAINER_GROUP} "{name}" already exists')
        self.runtimes[name] = body
        return 201, body

    def _read_runtime(self, request: Request) -> dict:
        runtime = self.runtimes.get(request.params["name"])
        if runtime is None:
            raise ApiError("NOT_FOUND", f'clustertrainingruntimes.{TRAINER_GROUP} "{request.params["name"]}" '
                                        "not found")
        return runtime

    def _create_trainjob(self, request: Request) -> tuple[int, dict]:
        namespace, body = request.params["namespace"], request.json()
        name = body.get("metadata", {}).get("name", "")
        problems, runtime = trainjob_problems(body, self.runtimes)
        if problems:
            raise invalid("TrainJob", TRAINER_GROUP, name, problems)
        if (namespace, name) in self.trainjobs:
            raise ApiError("ALREADY_EXISTS", f'trainjobs.{TRAINER_GROUP} "{name}" already exists')
        ref = body["spec"]["runtimeRef"]
        if runtime is None:
            raise _denied(f"spec.RuntimeRef: Invalid value: {json.dumps(ref)}: clustertrainingruntimes."
                          f'{TRAINER_GROUP} "{ref.get("name")}" not found: specified clusterTrainingRuntime must be '
                          "created before the TrainJob is created")
        policies = [p for p in FRAMEWORK_POLICIES if p in (runtime["spec"].get("mlPolicy") or {})
                    and p not in SIMULATED_POLICIES]
        if policies:
            raise ApiError("UNIMPLEMENTED", f"the stand-in runs plain, torch and jax runtimes only ({ref['name']} "
                                            f"has a {policies[0]} policy)")
        self.created_bodies.append(json.loads(json.dumps(body)))
        body["metadata"]["uid"] = str(uuid.uuid4())
        queue = body["metadata"].get("labels", {}).get(QUEUE_LABEL)
        held = False
        if queue in self.kueue_flavors:
            held_because = quota_shortfall(body, **self.kueue_quotas[queue]) if queue in self.kueue_quotas else ""
            # admitted, but never resumed, when Trainer refuses Kueue's write-back (left_out_on_write_back)
            held = bool(held_because or left_out_on_write_back(body["spec"].get("trainer") or {}))
            if held:
                hold_trainjob(body)
            else:
                admit_trainjob(body, runtime, self.kueue_flavors[queue])
            self.workloads[(namespace, name)] = workload({**body, "metadata": {**body["metadata"],
                                                                               "namespace": namespace}},
                                                         held_because)
        if held:  # suspended: Trainer's JobSet would be suspended too, with no pods; none is made here
            trainjob = TrainJobRun(body, namespace, None, lambda: self.now(0))
            self.trainjobs[(namespace, name)] = trainjob
            return 201, trainjob.snapshot()
        jobset_body, problems = trainjob_jobset(body, runtime)
        if problems:
            raise _denied("; ".join(problems))
        problems = jobset_problems({**jobset_body, "metadata": {**jobset_body["metadata"], "namespace": namespace}})
        if problems:  # the trainer would fail to create it later; the stand-in says so at once
            raise invalid("TrainJob", TRAINER_GROUP, name, [f"the JobSet it makes is invalid: {p}" for p in problems])
        jobset = JobSetRun(jobset_body, namespace, self.run_containers, lambda: self.now(0), self.admission_plugins)
        self.jobsets[(namespace, name)] = jobset
        trainjob = TrainJobRun(body, namespace, jobset, lambda: self.now(0))
        self.trainjobs[(namespace, name)] = trainjob
        return 201, trainjob.snapshot()

    def _read_trainjob(self, request: Request) -> dict:
        trainjob = self.trainjobs.get((request.params["namespace"], request.params["name"]))
        if trainjob is None:
            raise ApiError("NOT_FOUND", f'trainjobs.{TRAINER_GROUP} "{request.params["name"]}" not found')
        return trainjob.snapshot()

    def _delete_trainjob(self, request: Request) -> dict:
        key = (request.params["namespace"], request.params["name"])
        trainjob = self.trainjobs.pop(key, None)
        if trainjob is None:
            raise ApiError("NOT_FOUND", f'trainjobs.{TRAINER_GROUP} "{key[1]}" not found')
        self.jobsets.pop(key, None)
        if trainjob.jobset is not None:
            trainjob.jobset.delete()  # its owner reference: the JobSet, and with it the pods, go too
        self.deleted.append(key)
        return _deleted(key[1], TRAINER_GROUP, "trainjobs", trainjob.body["metadata"]["uid"])

    def _create_jobset(self, request: Request) -> tuple[int, dict]:
        namespace, body = request.params["namespace"], request.json()
        name = body.get("metadata", {}).get("name", "")
        problems = jobset_problems(body)
        if problems:
            raise invalid("JobSet", JOBSET_GROUP, name, problems)
        if (namespace, name) in self.jobsets:
            raise ApiError("ALREADY_EXISTS", f'jobsets.{JOBSET_GROUP} "{name}" already exists')
        self.created_bodies.append(json.loads(json.dumps(body)))
        jobset = JobSetRun(body, namespace, self.run_containers, lambda: self.now(0), self.admission_plugins)
        self.jobsets[(namespace, name)] = jobset
        return 201, jobset.snapshot()

    def _read_jobset(self, request: Request) -> dict:
        jobset = self.jobsets.get((request.params["namespace"], request.params["name"]))
        if jobset is None:
            raise ApiError("NOT_FOUND", f'jobsets.{JOBSET_GROUP} "{request.params["name"]}" not found')
        return jobset.snapshot()

    def _delete_jobset(self, request: Request) -> dict:
        key = (request.params["namespace"], request.params["name"])
        jobset = self.jobsets.pop(key, None)
        if jobset is None:
            raise ApiError("NOT_FOUND", f'jobsets.{JOBSET_GROUP} "{key[1]}" not found')
        jobset.delete()
        self.deleted.append(key)
        return _deleted(key[1], JOBSET_GROUP, "jobsets", jobset.uid)

    def _list_pods(self, request: Request) -> dict:
        wanted = [term.partition("=")[::2] for term in request.arg("labelSelector").split(",") if term]
        if any(not key or "!" in key for key, _ in wanted):
            raise ApiError("INVALID_ARGUMENT", "the stand-in answers equality label selectors (k=v,...) only")
        namespace = request.params["namespace"]
        pods = [pod for pod in [*(pod.to_api() for pod in self.jobset_pods(namespace)),
                                *(pod for (ns, _), job in [*self.jobs.items(), *self.pytorchjobs.items()]
                                  if ns == namespace for pod in job.api_pods())]
                if all(pod["metadata"]["labels"].get(key) == value for key, value in wanted)]
        return {"apiVersion": "v1", "kind": "PodList", "metadata": {"resourceVersion": "1"}, "items": pods}

    def _list_workloads(self, request: Request) -> dict:
        wanted = [term.partition("=")[::2] for term in request.arg("labelSelector").split(",") if term]
        if any(key != JOB_UID_LABEL for key, _ in wanted):
            raise ApiError("INVALID_ARGUMENT", f"the stand-in selects Workloads by {JOB_UID_LABEL}=UID only")
        items = [w for (ns, _), w in self.workloads.items() if ns == request.params["namespace"]
                 and all(w["metadata"]["labels"].get(key) == value for key, value in wanted)]
        return {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "WorkloadList", "metadata": {"resourceVersion": "1"},
                "items": json.loads(json.dumps(items))}

    def _log(self, request: Request) -> Stream:
        namespace, pod_name = request.params["namespace"], request.params["pod"]
        pod = next((job.pods[pod_name] for (ns, _), job in [*self.jobs.items(), *self.pytorchjobs.items()]
                    if ns == namespace and pod_name in job.pods), None) or next(
            (pod for pod in self.jobset_pods(namespace) if pod.name == pod_name), None)
        if pod is None:
            raise ApiError("NOT_FOUND", f'pods "{pod_name}" not found')
        if pod.process is None:
            raise ApiError("INVALID_ARGUMENT", f'container "{pod.container.get("name")}" in pod "{pod_name}" is '
                                               "waiting to start: ContainerCreating")
        follow, timestamps = _bool(request.arg("follow")), _bool(request.arg("timestamps"))
        tail = int(request.arg("tailLines") or 0) or None
        return Stream(_follow(pod, follow, timestamps, tail))


def _denied(message: str, webhook: str = "validator.trainjob.trainer.kubeflow.org") -> ApiError:
    """A validating admission webhook's denial (controller-runtime answers a plain error with 403 Forbidden)."""
    return ApiError("PERMISSION_DENIED", f'admission webhook "{webhook}" denied the request: {message}',
                    reason="Forbidden")


def _deleted(name: str, group: str, plural: str, uid: str) -> dict:
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success",
            "details": {"name": name, "group": group, "kind": plural, "uid": uid}}


def _follow(pod: Pod, follow: bool, timestamps: bool, tail: int | None = None):
    """The log of the pod's current container instance (a restart starts a new one), until it ends when following;
    `tail`: only its last lines so far."""
    sent = max(0, len(pod.lines) - tail) if tail else 0
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
