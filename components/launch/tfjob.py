"""Kubeflow TFJob (Kubeflow Training Operator v1, `kubeflow.org/v1`): the manifest for a chief + workers, its status,
and the launcher (a custom resource).

Legacy: Training Operator v1 only gets maintenance releases (Kubeflow Trainer v2 replaced it, and Kueue is
deprecating its v1 integration). It stays for clusters that still run it; a new cluster runs Trainer v2's TrainJob
(trainjob.py).

Replicas use `restartPolicy: ExitCode`, so a preempted replica (exit 143 after its checkpoint, or 137 when
killed) is restarted and resumes from the checkpoints in durable storage, while a bug or bad input (exit 1 or
2) fails the job at once (see components/stepcli.py for the codes).
"""

from __future__ import annotations

import json
import logging

from components import gcp
from components.launch import local_ssd
from components.launch.frameworks import setup
from components.launch.job import LaunchError, TrainingJob
from components.launch.k8s import CustomResourceLauncher, api_reason, failed_pods
from components.launch.network import check_network
from components.launch.placement import KUEUE_QUEUE_LABEL

log = logging.getLogger(__name__)

OPERATOR_GROUP, OPERATOR_VERSION = "kubeflow.org", "v1"  # Training Operator v1's jobs (TFJob, PyTorchJob)
TFJOB_GROUP, TFJOB_VERSION, TFJOB_PLURAL = OPERATOR_GROUP, OPERATOR_VERSION, "tfjobs"
CONTAINER_NAME = "tensorflow"  # the container the training operator looks for
# The labels the operator gives a replica's pod (pkg/apis/kubeflow.org/v1/common_types.go:25-37 at v1.9.4; set in
# pkg/controller.v1/common/pod.go:402-407: the job's name, the replica type in lower case, the replica's index)
JOB_NAME_LABEL = "training.kubeflow.org/job-name"
REPLICA_TYPE_LABEL = "training.kubeflow.org/replica-type"
REPLICA_INDEX_LABEL = "training.kubeflow.org/replica-index"
TFJOB_PHASES = {"Succeeded": gcp.Phase.SUCCEEDED, "Failed": gcp.Phase.FAILED}  # other conditions: still going


def tfjob_manifest(job: TrainingJob, namespace: str) -> dict:
    """The kubeflow.org/v1 TFJob for `job`: chief + workers, same image and command, ExitCode restarts."""
    runs_on = setup(job.framework).launchers
    if "tfjob" not in runs_on:
        raise ValueError(f"a TFJob trains with TensorFlow, not {job.framework}: use another launcher "
                         f"({', '.join(runs_on)})")
    container = {"name": CONTAINER_NAME, "image": job.image, "command": list(job.command), "env": job.env_list(),
                 "resources": job.container_resources()}
    return operator_job_manifest(job, namespace, kind="TFJob", container=container, primary="Chief",
                                 replica_specs="tfReplicaSpecs")


def operator_job_manifest(job: TrainingJob, namespace: str, *, kind: str, container: dict, primary: str,
                          replica_specs: str, spec: dict | None = None) -> dict:
    """A Training Operator v1 job, the shape TFJob and PyTorchJob share: one `primary` replica (Chief, Master) and
    `job.workers` Worker replicas of one pod running `container`, `restartPolicy: ExitCode`, the job's labels (and
    its Kueue queue), the run policy; `spec`'s fields (the kind's own) go before the replica specs."""
    check_network(job.network, job.placement, launcher=kind.lower())
    labels = job.pod_labels()
    pod_spec = {"containers": [container], **job.pod_placement()}
    if job.local_ssd:  # the staged data's emptyDir (local_ssd.py)
        container["volumeMounts"] = local_ssd.mounts(job.local_ssd)
        pod_spec["volumes"] = local_ssd.volumes(job.local_ssd)

    def replicas(count: int) -> dict:
        return {"replicas": count, "restartPolicy": "ExitCode",
                "template": {"metadata": {"labels": dict(labels)}, "spec": json.loads(json.dumps(pod_spec))}}

    specs = {primary: replicas(1)}
    if job.workers:
        specs["Worker"] = replicas(job.workers)
    metadata = {"name": job.name, "namespace": namespace, "labels": dict(labels)}
    if job.kueue_queue:
        metadata["labels"][KUEUE_QUEUE_LABEL] = job.kueue_queue  # Kueue admits (un-suspends) the job
    return {
        "apiVersion": f"{OPERATOR_GROUP}/{OPERATOR_VERSION}",
        "kind": kind,
        "metadata": metadata,
        "spec": {"runPolicy": {"backoffLimit": job.backoff_limit, "cleanPodPolicy": "Running"}, **(spec or {}),
                 replica_specs: specs},
    }


def tfjob_status(tfjob: dict) -> gcp.JobStatus:
    """The job's current condition: the last condition whose status is True (Pending before any)."""
    conditions = [c for c in tfjob.get("status", {}).get("conditions", []) if c.get("status") == "True"]
    if not conditions:
        return gcp.JobStatus("Pending")
    state = conditions[-1]["type"]
    return gcp.JobStatus(state, TFJOB_PHASES.get(state, gcp.Phase.RUNNING), conditions[-1].get("message", ""))


class OperatorJobLauncher(CustomResourceLauncher):
    """A Training Operator v1 job's launcher: follows the primary replica's log (pod `{job}-{primary}-0`) and the
    job's conditions (tfjob_status, the same on every kind of the operator); a subclass names the kind."""

    primary = ""  # the primary replica type, lowercase as in its pods' names

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._restarts: dict[str, int] = {}  # job uid -> the restarts seen
        self._restarting: dict[str, str] = {}  # job uid -> its Restarting condition on the last poll ("": none)

    def log_pod(self, name: str) -> str:
        return f"{name}-{self.primary}-0"

    def create(self, manifest: dict) -> str:
        if manifest["metadata"].get("labels", {}).get(KUEUE_QUEUE_LABEL):
            self.check_kueue(manifest)
        return super().create(manifest)

    def failure_detail(self, name: str) -> str:
        """Which replicas failed with which exit code, first failure first (the operator's Failed message names
        the replica type only, `"Chief" replica(s) failed`), then the end of the primary replica's log. The step's
        service account needs list on pods."""
        from kubernetes.client.rest import ApiException

        try:
            pods = self.core.list_namespaced_pod(self.namespace, label_selector=f"{JOB_NAME_LABEL}={name}").items
        except ApiException as e:
            pods = []
            log.warning("launch: cannot list the pods of %s: %s", name, api_reason(e))
        detail = ""
        for pod, code in failed_pods(pods, self.container):
            labels = pod.metadata.labels or {}
            detail += (f"\n{labels.get(REPLICA_TYPE_LABEL, '?')} {labels.get(REPLICA_INDEX_LABEL, '?')} "
                       f"(pod {pod.metadata.name}) exited with code {code}")
        return detail + super().failure_detail(name)

    def check_kueue(self, manifest: dict) -> None:
        """Refuses (LaunchError, one line) a job for a Kueue queue that this cluster's Kueue would not queue: since
        Kueue v0.19 its default configuration leaves the Training Operator v1 integrations out
        (kubernetes-sigs/kueue#12606; config/components/manager/controller_manager_config.yaml:53-57 at v0.19.2),
        and then the queue label does nothing: the job starts at once, outside the queue's quota. A server-side dry
        run of the create answers what the webhooks make of the job: Kueue's own, for an enabled integration,
        suspends a job that names a queue (spec.runPolicy.suspend; pkg/controller/jobframework/base_webhook.go:77,
        defaults.go:42-44, kubeflowjob_controller.go:54-56), the noop one it installs for a disabled integration
        changes nothing (jobframework/setup.go:108-111). Goes on, with a warning, where the dry run cannot answer;
        a job that exists already (a retried launcher) was checked when it was created."""
        from kubernetes.client.rest import ApiException

        name, queue = manifest["metadata"]["name"], manifest["metadata"]["labels"][KUEUE_QUEUE_LABEL]
        integration = f"{self.group}/{self.kind.lower()}"  # Kueue's FrameworkName (tfjob_controller.go:37)
        try:
            answered = self._api("create", body=manifest, dry_run="All", field_validation="Strict")
        except ApiException as e:
            if e.status == 409:
                return
            if e.status in (400, 403, 422):  # 403: the operator's validating webhook denied it (or RBAC did)
                raise LaunchError(f"Could not create {self.what(name)}: {api_reason(e)}") from None
            log.warning("launch: a dry run of %s failed (%s); creating it without checking that Kueue manages %s",
                        self.what(name), api_reason(e), integration)
            return
        if not (answered.get("spec", {}).get("runPolicy") or {}).get("suspend"):
            raise LaunchError(
                f"Kueue on this cluster does not manage {integration} (a server-side dry run of {self.what(name)} "
                f"came back unsuspended), so queue {queue!r} would not hold it: it would start at once, outside the "
                f"queue's quota. Enable the integration (add \"{integration}\" to integrations.frameworks in the "
                "kueue-system/kueue-manager-config ConfigMap and restart Kueue: docs/multi-node-training.md), use the "
                "trainjob or jobset launcher, which Kueue manages by default, or leave out --kueue-queue.")
        log.info("launch: Kueue manages %s: %s waits for queue %s", integration, self.what(name), queue)

    def status(self, resource: dict | None) -> gcp.JobStatus:
        """The job's condition; Failed, after deleting the job, once it has restarted more often than its
        runPolicy.backoffLimit: the operator restarts an ExitCode replica by deleting its pod and creating it
        again, whose containers' restartCount is 0, and counts only those restartCounts against the limit
        (pkg/core/job.go:95-133 at v1.9.4), so a replica that keeps exiting 128-255 (killed for memory, a
        crash) would restart, holding its GPUs, until someone deletes the job."""
        current = super().status(resource)
        limit = ((resource or {}).get("spec", {}).get("runPolicy") or {}).get("backoffLimit")
        if current.done or limit is None or self.restarts(resource) <= limit:
            return current
        name = resource["metadata"]["name"]
        self.delete(name)
        return gcp.JobStatus("Failed", gcp.Phase.FAILED,
                             f"restarted {self.restarts(resource)} times, more than its runPolicy.backoffLimit "
                             f"({limit}), which the Training Operator does not apply to restartPolicy ExitCode; "
                             "the launcher deleted it")

    def resource_status(self, resource: dict) -> gcp.JobStatus:
        uid = resource.get("metadata", {}).get("uid", "")
        restarting = next((json.dumps(c, sort_keys=True) for c in resource.get("status", {}).get("conditions", [])
                           if c.get("type") == "Restarting" and c.get("status") == "True"), "")
        if restarting and restarting != self._restarting.get(uid, ""):
            self._restarts[uid] = self._restarts.get(uid, 0) + 1
        self._restarting[uid] = restarting
        return tfjob_status(resource)

    def restarts(self, job: dict | None) -> int:
        """The restarts seen while following the job: the operator keeps one Restarting condition and drops it
        once the job runs again (pkg/util/status.go:103-140 at v1.9.4), so its final status shows none; each
        Restarting condition seen on a poll counts once (a restart over within one poll can go unseen)."""
        if not job:
            return 0
        self.resource_status(job)
        return self._restarts.get(job.get("metadata", {}).get("uid", ""), 0)


class TFJobLauncher(OperatorJobLauncher):
    """Creates a TFJob through the Kubernetes API, follows it and the chief's log to the end, deletes it when
    stopped (see CustomResourceLauncher)."""

    kind = "TFJob"
    group, version, plural = TFJOB_GROUP, TFJOB_VERSION, TFJOB_PLURAL
    container = CONTAINER_NAME
    primary = "chief"
