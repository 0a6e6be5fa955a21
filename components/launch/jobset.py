"""JobSet (kubernetes-sigs/jobset, `jobset.x-k8s.io/v1alpha2`, pinned at JOBSET_RELEASE): the engine beneath
Kubeflow Trainer v2. What the two launchers on it share (the TrainJob's runtime in trainjob.py, and the JobSet that
`JobSetLauncher` creates directly where Trainer v2 is not installed), and that launcher.

Why a JobSet launcher as well: many GKE clusters have JobSet (and Kueue, which queues JobSets natively) without a
Kubeflow install; a TrainJob is a JobSet template plus per-job values, so the direct JobSet is the same pods and the
same failure rules from the same builders below, and costs a manifest function and a status reader.

The pods. One replicated job `node` (Trainer v2 overrides the Job and the container of that name: its trainer
step), 1 replica, `parallelism = completions = nodes`, `completionMode: Indexed`. JobSet names pod k's host
`{jobset}-node-0-{k}` in the subdomain `{jobset}` (its headless Service), and Kubernetes gives the pod the
annotation `batch.kubernetes.io/job-completion-index: k`. `node_env` turns that into what the job's framework
reads (its launch facts, frameworks/): for TensorFlow TRAINING_NODE_HOSTS and TRAINING_NODE_INDEX (`cluster_env`),
from which each pod builds its own TF_CONFIG (components/train/cluster.py); for torch torchrun's PET_* and for JAX
the JAX_*, the same values Trainer's torch and JAX plugins set. Node 0 is the chief: its log is the one streamed.

Failures. MultiWorkerMirroredStrategy (and a DDP or JAX process group alike) cannot take one replaced worker back
into a running collective, so a
retryable failure restarts the whole group, which resumes from the chief's checkpoints (components/train/):
- the node Job's `podFailurePolicy` (Kubernetes Job API; needs `restartPolicy: Never` and `backoffLimit: 0`):
  1. a pod with the `DisruptionTarget` condition (preempted, evicted, its node shut down) is counted, whatever its
     exit code: the Job fails with reason `BackoffLimitExceeded`, which is retryable below;
  2. exit codes 1-127 of the `node` container fail the Job at once with reason `PodFailurePolicy`: permanent
     (bad input, NaN loss, a bug; components/stepcli.py);
  any other failure (128-255: SIGTERM after a checkpoint, SIGKILL) is counted: `BackoffLimitExceeded`.
- the JobSet's `failurePolicy`: the rule `permanent` fails the JobSet on `PodFailurePolicy`; anything else takes
  JobSet's default action, RestartJobSet, up to `maxRestarts` times. `restartStrategy: BlockingRecreate`: every
  old pod is gone (its checkpoint written) before the new ones start.
JobSet judges the first Job to fail, so a worker that dies because its preempted peer went away does not turn a
preemption into a permanent failure.
"""

from __future__ import annotations

import logging

from components import gcp
from components.launch import local_ssd
from components.launch.frameworks import NODE, setup
from components.launch.frameworks.tensorflow import cluster_env, node_hosts  # noqa: F401 (the TF nodes' env)
from components.launch.job import TrainingJob
from components.launch.k8s import CustomResourceLauncher, api_reason, failed_pods
from components.launch.network import check_network, pod_network
from components.launch.placement import KUEUE_QUEUE_LABEL, mps_pod_fields

log = logging.getLogger(__name__)

JOBSET_RELEASE = "v0.12.0"  # the JobSet Kubeflow Trainer v2.3.0 installs (its manifests/third-party/jobset)
JOBSET_GROUP, JOBSET_VERSION, JOBSET_PLURAL = "jobset.x-k8s.io", "v1alpha2", "jobsets"
MAX_RESTARTS = 6  # whole-group restarts (preemptions) before the job fails, as a TFJob's backoffLimit

# Labels and annotations JobSet (sigs.k8s.io/jobset/api/jobset/v1alpha2, pkg/constants) and the Job controller
# (k8s.io/api/batch/v1) put on the pods.
JOBSET_NAME_LABEL = "jobset.sigs.k8s.io/jobset-name"
REPLICATED_JOB_LABEL = "jobset.sigs.k8s.io/replicatedjob-name"
RESTART_ATTEMPT_LABEL = "jobset.sigs.k8s.io/restart-attempt"
COMPLETION_INDEX_ANNOTATION = "batch.kubernetes.io/job-completion-index"
PERMANENT_EXIT_CODES = tuple(range(1, 128))  # components/stepcli.py: 1 a bug, 2 bad input or a permanent failure
POD_NAME_SUFFIX = len("-abcde")  # the Job controller's random suffix on a pod's name
JOBSET_PHASES = {"Completed": gcp.Phase.SUCCEEDED, "Failed": gcp.Phase.FAILED}


def max_name_length(nodes: int) -> int:
    """The longest JobSet (or TrainJob) name whose pods' names stay DNS labels: JobSet's webhook refuses a
    JobSet whose longest pod name, `{name}-node-0-{nodes-1}-xxxxx`, exceeds 63 characters."""
    return 63 - len(f"-{NODE}-0-{nodes - 1}") - POD_NAME_SUFFIX


def node_env(job: TrainingJob) -> list[dict]:
    """What each node needs to find the others, for the framework `job` trains with (its launch facts): the TF node
    addresses, torchrun's PET_* or jax.distributed's JAX_*, from the JobSet's hostnames and the completion index."""
    return setup(job.framework).jobset_env(job.name, job.nodes, job.processes_per_node)


def node_ports(framework: str) -> list[dict]:
    """The node container's port for the nodes' own traffic: TensorFlow's gRPC port, or the port Trainer v2 gives
    torch's rendezvous and JAX's coordinator."""
    return setup(framework).ports()


def pod_failure_policy() -> dict:
    """The node Job's podFailurePolicy (see the module docstring): disruptions retry, 1-127 fail at once."""
    return {"rules": [
        {"action": "Count", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]},
        {"action": "FailJob", "onExitCodes": {"containerName": NODE, "operator": "In",
                                              "values": list(PERMANENT_EXIT_CODES)}},
    ]}


def failure_policy(max_restarts: int) -> dict:
    """The JobSet's failurePolicy: a permanent failure fails the JobSet, anything else restarts all the nodes."""
    return {"maxRestarts": max_restarts, "restartStrategy": "BlockingRecreate",
            "rules": [{"name": "permanent", "action": "FailJobSet", "onJobFailureReasons": ["PodFailurePolicy"],
                       "targetReplicatedJobs": [NODE]}]}


def node_job_template(container: dict, *, pod_spec: dict | None = None, pod_labels: dict | None = None,
                      pod_annotations: dict | None = None, nodes: int | None = None,
                      job_labels: dict | None = None) -> dict:
    """The `node` replicated job's Job template: Indexed, no pod restarts of its own (the JobSet restarts them
    all), the failure rules above. `nodes` None leaves the count to Trainer v2 (a runtime's template)."""
    pod = {"spec": {"restartPolicy": "Never", "containers": [container], **(pod_spec or {})}}
    metadata = {key: dict(value) for key, value in (("labels", pod_labels), ("annotations", pod_annotations))
                if value}
    if metadata:
        pod = {"metadata": metadata, **pod}
    spec = {"backoffLimit": 0, "completionMode": "Indexed", "podFailurePolicy": pod_failure_policy(),
            "template": pod}
    if nodes is not None:
        spec = {"parallelism": nodes, "completions": nodes, **spec}
    return {"metadata": {"labels": dict(job_labels)}, "spec": spec} if job_labels else {"spec": spec}


def jobset_spec(job_template: dict, max_restarts: int) -> dict:
    """A JobSet spec of the one `node` replicated job, reachable by hostname, restarted as a group."""
    return {"network": {"enableDNSHostnames": True, "publishNotReadyAddresses": True},
            "successPolicy": {"operator": "All", "targetReplicatedJobs": [NODE]},
            "failurePolicy": failure_policy(max_restarts),
            "replicatedJobs": [{"name": NODE, "replicas": 1, "template": job_template}]}


def check_name(job: TrainingJob) -> None:
    limit = max_name_length(job.nodes)
    if len(job.name) > limit:
        raise ValueError(f"Job name {job.name!r} is longer than {limit} characters, too long for the pod names of "
                         f"{job.nodes} nodes; make it shorter (job_name(..., max_length={limit}))")


def jobset_manifest(job: TrainingJob, namespace: str, *, max_restarts: int | None = None) -> dict:
    """The JobSet for `job`, for clusters with JobSet but without Kubeflow Trainer v2: the same pods a TrainJob
    on the runtime in manifests/trainer/ gets, and the same failure rules. On a GPU shared through MPS the pods
    also share the node's IPC namespace (`mps_pod_fields`), which a pipeline's own pod cannot. On a GPUDirect
    network (network.py) they carry its interfaces, volumes, NCCL settings and sidecar; with staged data
    (local_ssd.py), its emptyDir."""
    check_name(job)
    check_network(job.network, job.placement, launcher="jobset")
    container = {"name": NODE, "image": job.image, "command": list(job.command),
                 "env": job.env_list() + node_env(job), "ports": node_ports(job.framework),
                 "resources": job.container_resources()}
    pod_spec = {**job.pod_placement(), **mps_pod_fields(job.placement.node_selector)}
    annotations, volumes, volume_mounts = {}, local_ssd.volumes(job.local_ssd), local_ssd.mounts(job.local_ssd)
    if job.network:
        gpudirect = pod_network(job.network)
        container.update(command=gpudirect.node_command(job.command), env=container["env"] + gpudirect.env)
        volumes, volume_mounts = gpudirect.volumes + volumes, gpudirect.mounts + volume_mounts
        if gpudirect.sidecars:
            pod_spec["initContainers"] = gpudirect.sidecars
        annotations = gpudirect.annotations
    if volumes:
        container["volumeMounts"], pod_spec["volumes"] = volume_mounts, volumes
    template = node_job_template(container, pod_spec=pod_spec, pod_labels=job.pod_labels(),
                                 pod_annotations=annotations, nodes=job.nodes)
    labels = job.pod_labels()
    if job.kueue_queue:
        labels[KUEUE_QUEUE_LABEL] = job.kueue_queue  # Kueue's JobSet integration admits (un-suspends) it
    return {"apiVersion": f"{JOBSET_GROUP}/{JOBSET_VERSION}", "kind": "JobSet",
            "metadata": {"name": job.name, "namespace": namespace, "labels": labels},
            "spec": jobset_spec(template, job.backoff_limit if max_restarts is None else max_restarts)}


def _true_conditions(resource: dict) -> dict[str, dict]:
    return {c["type"]: c for c in resource.get("status", {}).get("conditions", []) if c.get("status") == "True"}


def jobset_status(jobset: dict) -> gcp.JobStatus:
    """Completed or Failed (with JobSet's message) end it; Suspended (waiting for Kueue), RestartingJobSet,
    Running (a node Job active) and Pending do not."""
    conditions = _true_conditions(jobset)
    for state in ("Failed", "Completed"):
        if state in conditions:
            return gcp.JobStatus(state, JOBSET_PHASES[state], conditions[state].get("message", ""))
    for state in ("Suspended", "RestartingJobSet"):
        if state in conditions:
            return gcp.JobStatus(state, gcp.Phase.RUNNING, conditions[state].get("message", ""))
    active = sum(int(r.get("active", 0)) for r in jobset.get("status", {}).get("replicatedJobsStatus", []))
    return gcp.JobStatus("Running" if active else "Pending")


class NodePodsLauncher(CustomResourceLauncher):
    """A launcher whose resource runs as a JobSet named like it: streams node 0's log (moving to the new pod when
    the JobSet restarts), and says which nodes failed how when the job fails. The step's service account also
    needs list on pods."""

    container = NODE

    def node_pods(self, name: str) -> list:
        """The JobSet's node pods (V1Pod), newest restart attempt last."""
        pods = self.core.list_namespaced_pod(
            self.namespace, label_selector=f"{JOBSET_NAME_LABEL}={name},{REPLICATED_JOB_LABEL}={NODE}").items
        return sorted(pods, key=lambda pod: (restart_attempt(pod), str(pod.metadata.creation_timestamp or "")))

    def log_pod(self, name: str):
        warned = []

        def node_zero() -> str | None:
            from kubernetes.client.rest import ApiException

            try:
                zeros = [pod for pod in self.node_pods(name) if completion_index(pod) == 0]
            except ApiException as e:
                if not warned:
                    warned.append(e)
                    log.warning("launch: cannot list the pods of %s (%s): no log to stream", name, api_reason(e))
                return None
            return zeros[-1].metadata.name if zeros else None

        return node_zero

    def failure_detail(self, name: str) -> str:
        """Which nodes failed with which exit code (the reason a permanent failure is permanent), and the end of
        the first failed node's log when it is not node 0's, whose tail follows."""
        from kubernetes.client.rest import ApiException

        detail = ""
        try:  # the nodes that failed by themselves, first failure first (a failed Job's others are deleted)
            failed = failed_pods(self.node_pods(name), NODE)
        except ApiException as e:
            failed = []
            log.warning("launch: cannot list the pods of %s: %s", name, api_reason(e))
        if failed:
            detail = "\n" + "\n".join(f"node {completion_index(pod)} (pod {pod.metadata.name}) exited with code {code}"
                                      for pod, code in failed)
            first = failed[0][0]
            if completion_index(first) != 0:
                try:
                    text = self.core.read_namespaced_pod_log(first.metadata.name, self.namespace,
                                                             container=NODE, tail_lines=20)
                    detail += f"\nLast lines of node {completion_index(first)}'s log:\n{text.rstrip()}"
                except ApiException as e:
                    log.warning("launch: cannot read the log of %s: %s", first.metadata.name, api_reason(e))
        return detail + super().failure_detail(name)


def restart_attempt(pod) -> int:
    return int((pod.metadata.labels or {}).get(RESTART_ATTEMPT_LABEL, 0))


def completion_index(pod) -> int:
    return int((pod.metadata.annotations or {}).get(COMPLETION_INDEX_ANNOTATION, -1))


class JobSetLauncher(NodePodsLauncher):
    """Creates a JobSet through the Kubernetes API, follows it and node 0's log to the end, deletes it (and so
    its pods) when stopped (see CustomResourceLauncher)."""

    kind = "JobSet"
    group, version, plural = JOBSET_GROUP, JOBSET_VERSION, JOBSET_PLURAL

    def resource_status(self, resource: dict) -> gcp.JobStatus:
        return jobset_status(resource)

    def restarts(self, jobset: dict | None) -> int:
        return int((jobset or {}).get("status", {}).get("restarts", 0))
