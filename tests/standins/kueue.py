"""Kueue admitting a TrainJob, as far as the placement of its pods goes, behind the Kubernetes API stand-in.

Source: Kueue v0.19.2 (kubernetes-sigs/kueue, built against kubeflow/trainer v2.2.1: go.mod:14), and the TrainJob
CRD of tests/schemas/ that it patches:

- Its TrainJob webhook (`Default`, pkg/controller/jobs/trainjob/trainjob_webhook.go:70-103) suspends a queued
  TrainJob (:100) and appends an empty runtime patch of its own, manager `kueue.x-k8s.io/manager`
  (trainjob_controller.go:76), after the TrainJob's own patches (:102).
- On admission, `RunWithPodSetsInfo` (trainjob_controller.go:243-290) fills that patch with one replicated-job
  patch per pod set (each replicated job of the runtime): the pod set's labels, annotations, node selector and
  tolerations (:253-273), which `podset.FromAssignment` takes from the assigned ResourceFlavor's `nodeLabels` and
  `tolerations` (pkg/podset/podset.go:58-92, :87-88), then unsuspends it (:288). The labels are the pod set's name
  and, with the AssignQueueLabelsForPods feature (on by default since v0.17, pkg/features/kube_features.go:817-819),
  the LocalQueue's and ClusterQueue's names; the annotation, with TopologyAwareScheduling (on by default since
  v0.14, :683-685), is the Workload's name (pkg/controller/jobframework/reconciler.go:1745-1788), which
  `workload_name` makes as Kueue does (workload_names.go:64-118).
- Trainer merges the runtime patches in their order as strategic merge patches (kubeflow/trainer v2.2.1,
  pkg/runtime/core/trainingruntime.go:203-236; v2.3.0 :251-272). A pod's `tolerations` list is atomic
  (tests/schemas/jobset.x-k8s.io_jobsets.yaml:7211-7251, `x-kubernetes-list-type: atomic`; core/v1 PodSpec has no
  patch merge key for it), so Kueue's patch, coming last, replaces the tolerations of the patches before it when
  the flavor has any; a flavor without tolerations leaves them out of the patch (`omitempty`) and changes nothing.
  trainer.py's `_merge` already merges this way.

Admission here is immediate (no waiting in the queue): the TrainJob is created admitted, with Kueue's patch
filled and `suspend: false`. `KubernetesStandIn(kueue_flavors={QUEUE: FLAVOR_SPEC})` admits the TrainJobs
labelled with that queue to a flavor with that spec (`{"nodeLabels": {...}, "tolerations": [...]}`).

With `kueue_quotas={QUEUE: {"flavor": NAME, "nominalQuota": {RESOURCE: QUANTITY}}}` (its ClusterQueue's one flavor,
nothing else admitted, no cohort), a TrainJob whose pods request more than that is held instead, as Kueue's
scheduler holds it: the webhook's part only (`suspend: true`, Kueue's patch empty: `hold_trainjob`), and its
Workload (`workload`) pending with the flavor assigner's reason (`quota_shortfall`). tests/test_kueue_controllers.py
runs the launcher against both.

Which kinds Kueue manages is its configuration's `integrations.frameworks` (`KubernetesStandIn(kueue_frameworks=)`;
default DEFAULT_FRAMEWORKS, v0.19.2's config/components/manager/controller_manager_config.yaml:46-64, where
`kubeflow.org/tfjob` and `kubeflow.org/pytorchjob` are commented out since kubernetes-sigs/kueue#12606). For a
Training Operator v1 job (`default_operator_job`): Kueue registers its webhook either way, the real one for an
enabled integration and a noop one for a disabled one (pkg/controller/jobframework/setup.go:76-111,
pkg/util/webhook/noop_webhook.go:37-40). The real one's `Default` (jobframework/base_webhook.go:69-82) suspends a
job that names a queue (`ApplyDefaultForSuspend`, defaults.go:36-46; `WorkloadShouldBeSuspended`,
utils.go:147-150): `KubeflowJob.Suspend` sets `spec.runPolicy.suspend: true` (kubeflow/kubeflowjob/
kubeflowjob_controller.go:54-56). Its webhooks declare `sideEffects=None` (tfjob_controller.go:50,
pytorchjob_controller.go:50), so the API server calls them on a server-side dry run too. Admission
(`RunWithPodSetsInfo`, kubeflowjob_controller.go:58-59) sets `suspend: false`; the flavor's node labels and
tolerations are not modelled for these kinds.
"""

from __future__ import annotations

import copy
import hashlib
from decimal import Decimal

QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
KUEUE_PATCH_MANAGER = "kueue.x-k8s.io/manager"
# the pod-set labels and the Workload annotation of an admitted job's pods (pkg/controller/constants/constants.go,
# apis/kueue/v1beta2/topology_types.go:80)
PODSET_LABEL, LOCAL_QUEUE_LABEL = "kueue.x-k8s.io/podset", "kueue.x-k8s.io/local-queue-name"
CLUSTER_QUEUE_LABEL, WORKLOAD_ANNOTATION = "kueue.x-k8s.io/cluster-queue-name", "kueue.x-k8s.io/workload"
JOB_UID_LABEL = "kueue.x-k8s.io/job-uid"  # on the Workload (reconciler.go:1618-1621)
CLUSTER_QUEUE = "gpu"  # the ClusterQueue of docs/multi-node-training.md, which its LocalQueues point at
DEFAULT_FRAMEWORKS = frozenset({
    "batch/job", "kubeflow.org/mpijob", "ray.io/rayjob", "ray.io/raycluster", "ray.io/rayservice",
    "jobset.x-k8s.io/jobset", "workload.codeflare.dev/appwrapper", "trainer.kubeflow.org/trainjob", "pod",
    "deployment", "statefulset", "leaderworkerset.x-k8s.io/leaderworkerset"})
OPERATOR_FRAMEWORKS = {"TFJob": "kubeflow.org/tfjob", "PyTorchJob": "kubeflow.org/pytorchjob"}


def workload_name(kind: str, group: str, name: str, uid: str) -> str:
    """The name of the Workload Kueue makes for a job (GetWorkloadNameForOwnerWithGVK: the lower-case kind, the
    name, and 5 hex digits of a SHA-1 of kind, group, name and uid; 253 characters at most)."""
    digest = hashlib.sha1(f"{kind}\n{group}\n{name}\n{uid}".encode()).hexdigest()
    return f"{f'{kind.lower()}-{name}'[:253 - 1 - 5]}-{digest[:5]}"


def admit_trainjob(body: dict, runtime: dict, flavor: dict, cluster_queue: str = CLUSTER_QUEUE) -> None:
    """Kueue's webhook and its admission to `flavor` (a ResourceFlavor spec) in `cluster_queue`, applied to the
    TrainJob `body`."""
    spec = body["spec"]
    metadata = body["metadata"]
    pod_spec = {}
    if flavor.get("nodeLabels"):
        pod_spec["nodeSelector"] = dict(flavor["nodeLabels"])
    if flavor.get("tolerations"):
        pod_spec["tolerations"] = copy.deepcopy(flavor["tolerations"])
    workload = workload_name("TrainJob", "trainer.kubeflow.org", metadata["name"], metadata.get("uid", ""))
    replicated_jobs = [{"name": rjob["name"], "template": {"spec": {"template": {
        "metadata": {"annotations": {WORKLOAD_ANNOTATION: workload},
                     "labels": {CLUSTER_QUEUE_LABEL: cluster_queue, LOCAL_QUEUE_LABEL: metadata["labels"][QUEUE_LABEL],
                                PODSET_LABEL: rjob["name"]}},
        "spec": copy.deepcopy(pod_spec)}}}}
        for rjob in runtime["spec"]["template"]["spec"].get("replicatedJobs", [])]
    spec.setdefault("runtimePatches", []).append(
        {"manager": KUEUE_PATCH_MANAGER, "trainingRuntimeSpec": {"template": {"spec": {
            "replicatedJobs": replicated_jobs}}}})
    spec["suspend"] = False


def default_operator_job(body: dict, kind: str, frameworks: frozenset[str] | set[str]) -> bool:
    """Kueue's mutating webhook on a Training Operator v1 job of `kind` (see the module docstring): suspends it when
    the integration is among `frameworks` and the job names a queue. Returns whether it did."""
    if OPERATOR_FRAMEWORKS[kind] not in frameworks or not body.get("metadata", {}).get("labels", {}).get(QUEUE_LABEL):
        return False
    run_policy = body.setdefault("spec", {}).setdefault("runPolicy", {})
    if not run_policy.get("suspend"):
        run_policy["suspend"] = True
    return True


def admit_operator_job(body: dict) -> None:
    """Kueue's admission of a suspended Training Operator v1 job (RunWithPodSetsInfo): it runs."""
    body["spec"]["runPolicy"]["suspend"] = False


def pod_set_requests(trainjob: dict) -> dict[str, Decimal]:
    """The TrainJob's one pod set's requests, all nodes together: `resourcesPerNode` per node (a limit without a
    request counts as the request, as the API server defaults it) times `numNodes`, as Kueue's Workload has them
    (status.resourceRequests)."""
    from kubernetes.utils import parse_quantity

    trainer = trainjob["spec"].get("trainer") or {}
    per_node = trainer.get("resourcesPerNode") or {}
    requests = {**(per_node.get("limits") or {}), **(per_node.get("requests") or {})}
    return {name: parse_quantity(value) * int(trainer.get("numNodes", 1)) for name, value in requests.items()}


def quota_shortfall(trainjob: dict, flavor: str, nominalQuota: dict) -> str:  # noqa: N803 (the API's name)
    """Why Kueue's scheduler cannot reserve quota for the TrainJob in a ClusterQueue with one flavor `flavor` of
    `nominalQuota` and nothing admitted: "" when it fits, else the QuotaReserved message
    (pkg/scheduler/flavorassigner/flavorassigner.go: Assignment.Message :228-246 on the pod set `node`, the
    fitsResourceQuota reason :1349-1357 for each resource over its quota, sorted and joined by Status.Message
    :353-362). Quantities are written as whole numbers, as Kueue writes these."""
    from kubernetes.utils import parse_quantity

    reasons = sorted(
        f"insufficient quota for {name} in flavor {flavor}, previously considered podsets requests (0) + current "
        f"podset request ({_quantity(wanted)}) > maximum capacity ({_quantity(parse_quantity(nominalQuota[name]))})"
        for name, wanted in pod_set_requests(trainjob).items()
        if name in nominalQuota and wanted > parse_quantity(nominalQuota[name]))
    return f"couldn't assign flavors to pod set node: {', '.join(reasons)}" if reasons else ""


def _quantity(value: Decimal) -> str:
    return str(int(value)) if value == int(value) else str(value)


def hold_trainjob(body: dict) -> None:
    """Kueue's webhook on a queued TrainJob (trainjob_webhook.go:91-102): suspended, its own patch empty until
    admission."""
    body["spec"]["suspend"] = True
    body["spec"].setdefault("runtimePatches", []).append(
        {"manager": KUEUE_PATCH_MANAGER, "trainingRuntimeSpec": {"template": {"spec": {}}}})


def workload(trainjob: dict, held_because: str, cluster_queue: str = CLUSTER_QUEUE) -> dict:
    """The Workload Kueue makes for the TrainJob: pending with `held_because`, else admitted to `cluster_queue`
    (the conditions: pkg/workload/workload.go:888-902 and admissionchecks.go:63 at v0.19.2)."""
    metadata = trainjob["metadata"]
    if held_because:
        conditions = [{"type": "QuotaReserved", "status": "False", "reason": "Pending", "message": held_because}]
    else:
        conditions = [{"type": "QuotaReserved", "status": "True", "reason": "QuotaReserved",
                       "message": f"Quota reserved in ClusterQueue {cluster_queue}"},
                      {"type": "Admitted", "status": "True", "reason": "Admitted",
                       "message": "The workload is admitted"}]
    return {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "Workload",
            "metadata": {"name": workload_name("TrainJob", "trainer.kubeflow.org", metadata["name"], metadata["uid"]),
                         "namespace": metadata.get("namespace", ""), "labels": {JOB_UID_LABEL: metadata["uid"]}},
            "spec": {"queueName": metadata["labels"][QUEUE_LABEL]},
            "status": {"conditions": conditions}}


def left_out_on_write_back(trainer: dict, path: str = ".spec.trainer") -> list[str]:
    """The fields of a TrainJob's spec.trainer that Kueue's write-back on admission leaves out (trainjob_controller.go
    :283, an Update of the TrainJob as Trainer v2.2.1's Go types hold it, whose lists and maps are `omitempty`):
    the empty lists and maps. Trainer's rule on spec.trainer (`self == oldSelf`, tests/schemas/
    trainer.kubeflow.org_trainjobs.yaml) then refuses the update ("field is immutable") on every retry, and the
    TrainJob stays suspended although its Workload is admitted."""
    found = []
    for key, value in trainer.items():
        if isinstance(value, (list, dict)) and not value:
            found.append(f"{path}.{key}")
        elif isinstance(value, dict):
            found += left_out_on_write_back(value, f"{path}.{key}")
    return found
