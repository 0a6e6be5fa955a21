"""Kueue admitting a TrainJob, as far as the placement of its pods goes, behind the Kubernetes API stand-in.

Source: Kueue v0.19.2 (kubernetes-sigs/kueue, built against kubeflow/trainer v2.2.1: go.mod:14), and the TrainJob
CRD of tests/schemas/ that it patches:

- Its TrainJob webhook (`Default`, pkg/controller/jobs/trainjob/trainjob_webhook.go:70-103) suspends a queued
  TrainJob (:100) and appends an empty runtime patch of its own, manager `kueue.x-k8s.io/manager`
  (trainjob_controller.go:76), after the TrainJob's own patches (:102).
- On admission, `RunWithPodSetsInfo` (trainjob_controller.go:243-290) fills that patch with one replicated-job
  patch per pod set (each replicated job of the runtime): the pod set's labels, annotations, node selector and
  tolerations (:253-273), which `podset.FromAssignment` takes from the assigned ResourceFlavor's `nodeLabels` and
  `tolerations` (pkg/podset/podset.go:58-92, :87-88), then unsuspends it (:288).
- Trainer merges the runtime patches in their order as strategic merge patches (kubeflow/trainer v2.2.1,
  pkg/runtime/core/trainingruntime.go:203-236; v2.3.0 :251-272). A pod's `tolerations` list is atomic
  (tests/schemas/jobset.x-k8s.io_jobsets.yaml:7211-7251, `x-kubernetes-list-type: atomic`; core/v1 PodSpec has no
  patch merge key for it), so Kueue's patch, coming last, replaces the tolerations of the patches before it when
  the flavor has any; a flavor without tolerations leaves them out of the patch (`omitempty`) and changes nothing.
  trainer.py's `_merge` already merges this way.

Admission here is immediate (no quota, no waiting in the queue): the TrainJob is created admitted, with Kueue's
patch filled and `suspend: false`. `KubernetesStandIn(kueue_flavors={QUEUE: FLAVOR_SPEC})` admits the TrainJobs
labelled with that queue to a flavor with that spec (`{"nodeLabels": {...}, "tolerations": [...]}`).

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

QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
KUEUE_PATCH_MANAGER = "kueue.x-k8s.io/manager"
DEFAULT_FRAMEWORKS = frozenset({
    "batch/job", "kubeflow.org/mpijob", "ray.io/rayjob", "ray.io/raycluster", "ray.io/rayservice",
    "jobset.x-k8s.io/jobset", "workload.codeflare.dev/appwrapper", "trainer.kubeflow.org/trainjob", "pod",
    "deployment", "statefulset", "leaderworkerset.x-k8s.io/leaderworkerset"})
OPERATOR_FRAMEWORKS = {"TFJob": "kubeflow.org/tfjob", "PyTorchJob": "kubeflow.org/pytorchjob"}


def admit_trainjob(body: dict, runtime: dict, flavor: dict) -> None:
    """Kueue's webhook and its admission to `flavor` (a ResourceFlavor spec), applied to the TrainJob `body`."""
    spec = body["spec"]
    pod_spec = {}
    if flavor.get("nodeLabels"):
        pod_spec["nodeSelector"] = dict(flavor["nodeLabels"])
    if flavor.get("tolerations"):
        pod_spec["tolerations"] = copy.deepcopy(flavor["tolerations"])
    replicated_jobs = [{"name": rjob["name"], "template": {"spec": {"template": {"spec": copy.deepcopy(pod_spec)}}}}
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
