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
"""

from __future__ import annotations

import copy

QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
KUEUE_PATCH_MANAGER = "kueue.x-k8s.io/manager"


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
