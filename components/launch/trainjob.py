"""Kubeflow Trainer v2 (`trainer.kubeflow.org/v1alpha1`, pinned at TRAINER_RELEASE): the TrainJob, the
ClusterTrainingRuntimes it runs on (one per framework), the status reader and `TrainJobLauncher`.

TensorFlow's runtime (`runtime_manifest`, shipped as manifests/trainer/tensorflow-multiworker.yaml) has no framework
policy: its `mlPolicy` only sets `numNodes`, so Trainer's PlainML plugin takes the node count and the env from the
TrainJob and adds nothing of its own; the TensorFlow cluster comes from our env (frameworks/tensorflow.py). The torch
and JAX runtimes (torch-multinode.yaml, jax-multinode.yaml) carry Trainer's torch or jax policy instead, whose plugins
give the nodes torchrun's PET_* or jax.distributed's JAX_* (frameworks/); the TrainJob then sets none of them. Its
JobSet template is jobset.py's `node` replicated job with the failure rules, so a TrainJob restarts and fails exactly
as the JobSet launcher's JobSet does (retryable exit codes restart all nodes, which resume from the checkpoints; 1-127
fail at once).

Per job, the TrainJob sets `trainer.numNodes` (chief + workers), `image`, `command`, `env` and `resourcesPerNode`
(CPU, memory, GPUs), and one runtime patch (`runtimePatches`, manager RUNTIME_PATCH_MANAGER) for the `node` pods:
the run's node selector and tolerations (GPU, Spot, node pool), the service account and the pipeline's labels (the
grace period is the runtime's, RUNTIME_GRACE_SECONDS: see there). With Kueue, the TrainJob carries the queue label; Kueue's webhook suspends it (status
Suspended) until the queue admits it, then adds a runtime patch of its own, whose ResourceFlavor tolerations
replace ours: the launcher stops the job if that drops the Spot (or any other) toleration (`dropped_tolerations`,
docs/kueue-trainjob.md). A dropped GPU toleration is put back on every node pod by the API server's
ExtendedResourceToleration admission plugin, which GKE runs (`readded_by_admission`): a warning, not a stop.

The step's service account needs create/get/delete on trainjobs, get/list on pods and get on pods/log in the
namespace, and get on clustertrainingruntimes (manifests/trainer/launcher-rbac.yaml): the launcher reads the
runtime first, so that a missing or unsuitable runtime is reported before anything is created.
"""

from __future__ import annotations

import logging

from components import gcp
from components.launch import local_ssd
from components.launch.job import LaunchError, TrainingJob
from components.launch.frameworks import DEFAULT_FRAMEWORK, FRAMEWORKS, check_framework, setup
from components.launch.jobset import (MAX_RESTARTS, NODE, NodePodsLauncher, check_name, jobset_spec,
                                      node_job_template, node_ports, restart_attempt)
from components.launch.k8s import api_reason
from components.launch.network import TCPXO, check_network, pod_network
from components.launch.placement import KUEUE_QUEUE_LABEL

log = logging.getLogger(__name__)

TRAINER_RELEASE = "v2.3.0"
TRAINER_GROUP, TRAINER_VERSION = "trainer.kubeflow.org", "v1alpha1"
TRAINJOB_PLURAL, RUNTIME_PLURAL = "trainjobs", "clustertrainingruntimes"
# The runtimes shipped in manifests/trainer/, one per framework (its launch facts): the plain one for TensorFlow, and
# for torch and JAX runtimes with Trainer's own torch and JAX policies (upstream's torch-distributed and
# jax-distributed runtimes, manifests/base/runtimes/ at v2.3.0, with the failure rules of jobset.py added).
RUNTIMES = {framework: setup(framework).runtime for framework in FRAMEWORKS}
RUNTIME_NAME = RUNTIMES[DEFAULT_FRAMEWORK]  # the default framework's: the plain ClusterTrainingRuntime
# GPUDirect-TCPXO's runtimes (network.py): the framework's, with the tcpxo-daemon sidecar, which a TrainJob's
# runtime patch cannot add.
TCPXO_RUNTIMES = {framework: f"{name}-{TCPXO}" for framework, name in RUNTIMES.items()}
SHIPPED_RUNTIMES = (*RUNTIMES.values(), *TCPXO_RUNTIMES.values())
FRAMEWORK_LABEL = "kfp-image-classification/framework"  # on the TrainJob: which runtime policy it needs
ANCESTOR_LABEL = "trainer.kubeflow.org/trainjob-ancestor-step"  # marks the replicated job Trainer's trainer step is
# Who owns our runtime patch: Trainer's webhook wants a domain-prefixed path; the project's name stands in for it.
RUNTIME_PATCH_MANAGER = "kfp-image-classification/launcher"
# Kueue's own runtime patch (kubernetes-sigs/kueue v0.19.2, pkg/controller/jobs/trainjob/trainjob_controller.go:76).
KUEUE_PATCH_MANAGER = "kueue.x-k8s.io/manager"
FRAMEWORK_POLICIES = ("torch", "mpi", "jax", "xgboost", "flux")  # MLPolicySource members in v2.3.0
TRAINJOB_PHASES = {"Complete": gcp.Phase.SUCCEEDED, "Failed": gcp.Phase.FAILED}
TRAINING = {framework: setup(framework).training for framework in FRAMEWORKS}


# The node pods' grace period is the runtime's, not the TrainJob's: a pod-template patch's
# terminationGracePeriodSeconds is new in Trainer v2.3.0, and Kueue v0.19.2, built on Trainer v2.2.1's types
# (go.mod:14), writes the whole TrainJob back when it admits it (trainjob_controller.go:283, an Update), which
# would drop that field.
RUNTIME_GRACE_SECONDS = 30


def runtime_file(framework: str = DEFAULT_FRAMEWORK, network: str = "") -> str:
    return f"manifests/trainer/{runtime_for(framework, network=network)}.yaml"


def runtime_for(framework: str, runtime: str = RUNTIME_NAME, *, network: str = "") -> str:
    """The ClusterTrainingRuntime a TrainJob of `framework` runs on: a shipped runtime's name stands for the shipped
    runtime of that framework and network (so that choosing torch or TCPXO needs no second setting); another name
    is the user's own."""
    shipped = TCPXO_RUNTIMES if network == TCPXO else RUNTIMES
    return shipped[check_framework(framework)] if runtime in SHIPPED_RUNTIMES else runtime


def runtime_network(runtime: str) -> str:
    """The GPUDirect network a shipped runtime carries itself (tcpxo), empty for the others."""
    return TCPXO if runtime in TCPXO_RUNTIMES.values() else ""


def runtime_manifest(name: str = "", *, max_restarts: int = MAX_RESTARTS, framework: str = DEFAULT_FRAMEWORK,
                     network: str = "") -> dict:
    """The shipped ClusterTrainingRuntime of `framework`: one `node` replicated job, no image or command of its own
    (every TrainJob brings them), the failure rules of jobset.py. TensorFlow's is plain (mlPolicy numNodes only:
    Trainer's PlainML plugin); torch's and JAX's carry Trainer's torch or jax policy, whose plugins give every node
    torchrun's PET_* or jax.distributed's JAX_* and the port 29500 (kubeflow/trainer v2.3.0
    pkg/runtime/framework/plugins/torch/torch.go:145-203, jax/jax.go:76-100), as upstream's torch-distributed and
    jax-distributed runtimes do. With `network` tcpxo, the node pods are also GPUDirect-TCPXO's (network.py):
    its interfaces, devices, volumes and the tcpxo-daemon sidecar; the TrainJob brings the NCCL settings."""
    container: dict = {"name": NODE}
    policy: dict = {"numNodes": 1}
    trainer_policy = setup(framework).trainer_policy
    if trainer_policy:
        policy[trainer_policy] = {}  # its plugin adds the port
    else:
        container["ports"] = node_ports(framework)
    pod_spec: dict = {"terminationGracePeriodSeconds": RUNTIME_GRACE_SECONDS}
    annotations = {}
    if network:
        if network != TCPXO:
            raise ValueError(f"only GPUDirect-TCPXO needs a runtime of its own ({TCPXO}), not {network!r}: a "
                             "TrainJob carries the others in its runtime patch")
        gpudirect = pod_network(network)
        container["volumeMounts"] = gpudirect.mounts
        pod_spec.update(initContainers=gpudirect.sidecars, volumes=gpudirect.volumes)
        annotations = gpudirect.annotations
    template = node_job_template(container, job_labels={ANCESTOR_LABEL: "trainer"}, pod_spec=pod_spec,
                                 pod_annotations=annotations)
    return {"apiVersion": f"{TRAINER_GROUP}/{TRAINER_VERSION}", "kind": "ClusterTrainingRuntime",
            "metadata": {"name": name or runtime_for(framework, network=network),
                         "labels": {"app.kubernetes.io/part-of": "kfp-image-classification"}},
            "spec": {"mlPolicy": policy, "template": {"spec": jobset_spec(template, max_restarts)}}}


def trainjob_manifest(job: TrainingJob, namespace: str, runtime: str = RUNTIME_NAME) -> dict:
    """The TrainJob for `job` on the ClusterTrainingRuntime `runtime` (see the module docstring). On a GPUDirect
    network (network.py) the nodes get its NCCL settings through `trainer` (a runtime patch may not set the node
    container's env); RDMA's interfaces and volumes go into the runtime patch, TCPXO's are its runtime's."""
    check_name(job)
    check_network(job.network, job.placement, launcher="trainjob")
    if job.network == TCPXO and runtime != TCPXO_RUNTIMES[job.framework]:
        raise ValueError(f"GPUDirect-TCPXO's tcpxo-daemon sidecar comes with the runtime "
                         f"{TCPXO_RUNTIMES[job.framework]!r} ({runtime_file(job.framework, TCPXO)}), not "
                         f"{runtime!r}: a TrainJob's runtime patch cannot add a container")
    # TensorFlow's nodes build TF_CONFIG from our variables; torch's and JAX's get theirs from the runtime's policy.
    facts = setup(job.framework)
    env = job.env_list() + facts.trainjob_env(job.name, job.nodes, job.processes_per_node)
    command = list(job.command)
    gpudirect = pod_network(job.network) if job.network else None
    if gpudirect:
        env, command = env + gpudirect.env, gpudirect.node_command(command)
    trainer = {"numNodes": job.nodes, "image": job.image, "command": command,
               "resourcesPerNode": job.container_resources()}
    if env:  # never `env: []`: Kueue writes the TrainJob back when it admits it (trainjob_controller.go:283, an
        # Update) from Go types that leave an empty list out, and Trainer's CEL rule on spec.trainer (self ==
        # oldSelf) then refuses the change: the TrainJob would stay suspended for ever
        trainer["env"] = env
    if facts.process_count_env:  # else "auto": a CPU node would start one process per CPU (torch.go:121-135)
        trainer["numProcPerNode"] = job.processes_per_node
    placement = job.pod_placement()
    grace = placement.pop("terminationGracePeriodSeconds", RUNTIME_GRACE_SECONDS)
    if grace != RUNTIME_GRACE_SECONDS:
        raise ValueError(f"The TrainJob launcher's node pods get the grace period of the runtime "
                         f"{runtime!r} ({RUNTIME_GRACE_SECONDS} s), not {grace} s; use the JobSet launcher for "
                         f"another one.")
    node_pods = {"metadata": {"labels": job.pod_labels()}, "spec": placement}
    volumes, volume_mounts = local_ssd.volumes(job.local_ssd), local_ssd.mounts(job.local_ssd)
    if gpudirect and gpudirect.network != TCPXO:
        node_pods["metadata"]["annotations"] = gpudirect.annotations
        volumes, volume_mounts = gpudirect.volumes + volumes, gpudirect.mounts + volume_mounts
    if volumes:  # (TCPXO's own volumes and mounts are its runtime's)
        placement.update(volumes=volumes, containers=[{"name": NODE, "volumeMounts": volume_mounts}])
    patch = {"manager": RUNTIME_PATCH_MANAGER, "trainingRuntimeSpec": {"template": {"spec": {"replicatedJobs": [
        {"name": NODE, "template": {"spec": {"template": node_pods}}}]}}}}
    labels = {**job.pod_labels(), FRAMEWORK_LABEL: job.framework}
    if job.kueue_queue:
        labels[KUEUE_QUEUE_LABEL] = job.kueue_queue  # Kueue's webhook suspends it until the queue admits it
    return {"apiVersion": f"{TRAINER_GROUP}/{TRAINER_VERSION}", "kind": "TrainJob",
            "metadata": {"name": job.name, "namespace": namespace, "labels": labels},
            "spec": {"runtimeRef": {"name": runtime, "apiGroup": TRAINER_GROUP, "kind": "ClusterTrainingRuntime"},
                     "trainer": trainer, "runtimePatches": [patch]}}


def _node_pod_patch(patch: dict) -> dict | None:
    for rjob in patch.get("trainingRuntimeSpec", {}).get("template", {}).get("spec", {}).get("replicatedJobs", []):
        if rjob.get("name") == NODE:
            return rjob.get("template", {}).get("spec", {}).get("template", {}).get("spec", {})
    return None


def _tolerates(given: dict, wanted: dict) -> bool:
    """Whether toleration `given` tolerates every taint that `wanted` tolerates (core/v1 Toleration semantics:
    an empty key with Exists matches every key, an empty effect every effect)."""
    if given.get("effect") and given.get("effect") != wanted.get("effect"):
        return False
    if given.get("operator") == "Exists":
        return not given.get("key") or given.get("key") == wanted.get("key")
    return (given.get("key") == wanted.get("key") and wanted.get("operator", "Equal") == "Equal"
            and given.get("value", "") == wanted.get("value", ""))


def dropped_tolerations(trainjob: dict) -> list[dict]:
    """Our node pods' tolerations (GPU, Spot, ...) that the TrainJob's later runtime patches take away.

    Trainer merges the runtime patches in order as strategic merge patches, and a pod's tolerations are one atomic
    list (kubeflow/trainer v2.3.0 pkg/runtime/core/trainingruntime.go:251-272). Kueue's patch comes last and, once
    the TrainJob is admitted, carries the ResourceFlavor's tolerations (kueue v0.19.2 trainjob_controller.go:253-273,
    pkg/podset/podset.go:87-88): a flavor with tolerations replaces ours, unless its own tolerate the same taints;
    a flavor without any leaves ours alone. See docs/kueue-trainjob.md."""
    effective, ours = None, []
    for patch in trainjob.get("spec", {}).get("runtimePatches", []):
        pod = _node_pod_patch(patch)
        if pod is None or "tolerations" not in pod:
            continue
        if patch.get("manager") == RUNTIME_PATCH_MANAGER:
            ours = pod["tolerations"]
        effective = pod["tolerations"]
    return [t for t in ours if not any(_tolerates(given, t) for given in effective or [])]


def readded_by_admission(trainjob: dict) -> list[dict]:
    """The tolerations the ExtendedResourceToleration admission plugin adds to each node pod of the TrainJob: one
    `{key: <resource>, operator: Exists, effect: NoSchedule}` per extended resource the nodes request (kubernetes
    plugin/pkg/admission/extendedresourcetoleration/admission.go `Admit`; a pod's limits are its requests by then,
    SetDefaults_Pod). GKE runs the plugin ("GKE automatically applies the corresponding tolerations to Pods
    requesting GPUs by running the ExtendedResourceToleration admission controller",
    cloud.google.com/kubernetes-engine/docs/how-to/gpus); a cluster may not. tests/standins/admission.py follows it."""
    resources = trainjob.get("spec", {}).get("trainer", {}).get("resourcesPerNode") or {}
    names = {*(resources.get("limits") or {}), *(resources.get("requests") or {})}
    extended = sorted(n for n in names if "/" in n and "kubernetes.io/" not in n and not n.startswith("requests."))
    return [{"key": name, "operator": "Exists", "effect": "NoSchedule"} for name in extended]


def trainjob_status(trainjob: dict) -> gcp.JobStatus:
    """Complete or Failed (the JobSet's condition, with its message) end it; Suspended (waiting for Kueue) and
    Running (a node Job active) or Created do not. Trainer v2 has no Running condition: jobsStatus tells."""
    status = trainjob.get("status", {})
    conditions = {c["type"]: c for c in status.get("conditions", []) if c.get("status") == "True"}
    for state in ("Failed", "Complete"):
        if state in conditions:
            return gcp.JobStatus(state, TRAINJOB_PHASES[state], conditions[state].get("message", ""))
    if "Suspended" in conditions:
        return gcp.JobStatus("Suspended", gcp.Phase.RUNNING, conditions["Suspended"].get("message", ""))
    active = sum(int(j.get("active", 0)) for j in status.get("jobsStatus", []))
    return gcp.JobStatus("Running" if active else "Created")


def runtime_problems(runtime: dict, framework: str = DEFAULT_FRAMEWORK) -> tuple[list[str], list[str]]:
    """What makes a ClusterTrainingRuntime unfit for multi-node training with `framework` (errors), and what only
    weakens it (warnings): TensorFlow needs a plain runtime (a framework policy would inject its own launcher/env),
    torch and JAX need Trainer's torch or jax policy (which gives the nodes their PET_* or JAX_*); a custom
    subdomain breaks the node addresses; a runtime without the failure rules restarts and fails by its own policy."""
    errors, warnings = [], []
    spec = runtime.get("spec", {})
    policies = [p for p in FRAMEWORK_POLICIES if p in (spec.get("mlPolicy") or {})]
    wanted = setup(framework).trainer_policy
    if not wanted and policies:
        errors.append(f"it has a {policies[0]} policy (a plain runtime has none)")
    elif wanted and policies != [wanted]:
        has = f"a {policies[0]} policy" if policies else "no framework policy"
        errors.append(f"it has {has} (a {wanted} runtime has mlPolicy.{wanted})")
    jobset = spec.get("template", {}).get("spec", {})
    if jobset.get("network", {}).get("subdomain"):
        errors.append("it sets network.subdomain (the nodes find each other in the subdomain named after the job)")
    if jobset.get("network", {}).get("enableDNSHostnames") is False:
        errors.append("it turns network.enableDNSHostnames off (the nodes find each other by hostname)")
    trainer_jobs = [r for r in jobset.get("replicatedJobs", [])
                    if r.get("name") == NODE and r.get("template", {}).get("metadata", {}).get("labels", {}).get(
                        ANCESTOR_LABEL) == "trainer"]
    if not trainer_jobs:
        errors.append(f"it has no replicated job {NODE!r} labelled {ANCESTOR_LABEL}: trainer")
    elif "podFailurePolicy" not in trainer_jobs[0]["template"].get("spec", {}) or "failurePolicy" not in jobset:
        warnings.append(f"it has no podFailurePolicy/failurePolicy: exit codes are not told apart (retryable "
                        f"128-255, permanent 1-127) as {runtime_file(framework)} does")
    return errors, warnings


class TrainJobLauncher(NodePodsLauncher):
    """Creates a TrainJob through the Kubernetes API after checking its runtime, follows it and node 0's log to
    the end, deletes it (and so its JobSet and pods) when stopped (see CustomResourceLauncher)."""

    kind = "TrainJob"
    group, version, plural = TRAINER_GROUP, TRAINER_VERSION, TRAINJOB_PLURAL

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._warned_readded: set[str] = set()  # TrainJobs whose re-added GPU toleration was already reported

    def check_runtime(self, name: str, framework: str = DEFAULT_FRAMEWORK) -> None:
        """Refuses a runtime that is missing or unfit for `framework` (LaunchError naming what to apply); goes on,
        with a warning, when the service account may not read cluster-scoped runtimes."""
        from kubernetes.client.rest import ApiException

        try:
            runtime = self.custom.get_cluster_custom_object(TRAINER_GROUP, TRAINER_VERSION, RUNTIME_PLURAL, name)
        except ApiException as e:
            if e.status == 404:
                raise LaunchError(f"ClusterTrainingRuntime {name!r} is not installed: apply it with `kubectl apply "
                                  f"--server-side -f {runtime_file(framework, runtime_network(name))}` (or name an "
                                  f"installed "
                                  f"{setup(framework).runtime_kind} runtime)") from None
            if e.status == 403:
                log.warning("launch: cannot read ClusterTrainingRuntime %s (%s); creating the TrainJob unchecked",
                            name, api_reason(e))
                return
            raise
        errors, warnings = runtime_problems(runtime, framework)
        if errors:
            raise LaunchError(f"ClusterTrainingRuntime {name!r} cannot run {TRAINING[framework]}: "
                              f"{'; '.join(errors)}. Use {runtime_for(framework, network=runtime_network(name))!r} "
                              f"({runtime_file(framework, runtime_network(name))}).")
        for warning in warnings:
            log.warning("launch: ClusterTrainingRuntime %s: %s", name, warning)

    def create(self, manifest: dict) -> str:
        self.check_runtime(manifest["spec"]["runtimeRef"]["name"],
                           manifest["metadata"].get("labels", {}).get(FRAMEWORK_LABEL, DEFAULT_FRAMEWORK))
        return super().create(manifest)

    def resource_status(self, resource: dict) -> gcp.JobStatus:
        dropped = dropped_tolerations(resource)
        readded = readded_by_admission(resource)
        put_back = [t for t in dropped if any(_tolerates(given, t) for given in readded)]
        lost = [t for t in dropped if t not in put_back]
        kueue = next((p for p in resource["spec"].get("runtimePatches", [])
                      if p.get("manager") == KUEUE_PATCH_MANAGER), None)
        given = (_node_pod_patch(kueue) or {}).get("tolerations") if kueue else None
        by = f"Kueue's ResourceFlavor (its tolerations: {given})" if given is not None else "a later runtime patch"
        name = resource["metadata"]["name"]
        if lost:  # the pods would wait for nodes they may not run on (Spot, node pool taints), for ever
            raise LaunchError(
                f"TrainJob {name}: {by} replaces the node pods' tolerations and drops {lost}, so the pods cannot "
                f"run on the nodes the run chose. Add these tolerations to the ResourceFlavor's spec.tolerations, "
                f"or give it none (docs/kueue-trainjob.md). The TrainJob was deleted.")
        if put_back and name not in self._warned_readded:
            self._warned_readded.add(name)
            log.warning("launch: TrainJob %s: %s drops %s from the node pods; the nodes request %s, so the API "
                        "server's ExtendedResourceToleration admission plugin (GKE runs it) adds it back to each "
                        "pod. On a cluster without that plugin the pods cannot be scheduled on the GPU nodes: add "
                        "it to the ResourceFlavor's spec.tolerations (docs/kueue-trainjob.md).", name, by, put_back,
                        ", ".join(t["key"] for t in put_back))
        return trainjob_status(resource)

    def restarts(self, trainjob: dict | None) -> int:
        """Whole-group restarts: the TrainJob does not count them, its JobSet's pods carry the attempt."""
        from kubernetes.client.rest import ApiException

        if not trainjob:
            return 0
        try:
            return max((restart_attempt(pod) for pod in self.node_pods(trainjob["metadata"]["name"])), default=0)
        except ApiException:
            return 0
