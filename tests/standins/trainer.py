"""Kubeflow Trainer v2 behind the Kubernetes API stand-in: what its webhooks check and how its controller turns a
TrainJob into a JobSet (which jobsets.py then runs).

Follows Kubeflow Trainer v2.3.0 (kubeflow/trainer: pkg/apis/trainer/v1alpha1; pkg/runtime/core/trainingruntime.go;
pkg/runtime/framework/plugins/plainml and jobset (builder.go, Status); pkg/webhooks): a TrainJob on a
ClusterTrainingRuntime becomes a JobSet of the same name: the runtime's template with the runtime patches merged (by
name, as a strategic merge patch merges these lists), the `trainer` ancestor's replicated job set to 1 replica and
`numNodes` pods, its `node` container given the TrainJob's image, command, args, env and resourcesPerNode. The
TrainJob's Complete/Failed conditions are the JobSet's Completed/Failed, and `jobsStatus` its replicated jobs'
counts. The webhooks' checks: the runtime must exist, runtime patches must name known jobs and containers with a
domain-prefixed manager, a runtime's trainer job has 1 replica and a `node` container. Bodies are validated against
the vendored CRDs (validation.py).

The torch and JAX plugins are followed too (pkg/runtime/framework/plugins/torch/torch.go:56-87 and 110-204,
jax/jax.go:56-104; constants in pkg/constants/constants.go): the torch webhook refuses a TrainJob whose trainer env
sets torchrun's reserved PET_* names; the torch plugin gives the `node` container PET_NNODES (numNodes),
PET_NPROC_PER_NODE (trainer.numProcPerNode, else "auto", which on a node without GPUs becomes its CPU request,
rounded up as Quantity.Value does; GPUs are counted as pkg/runtime/runtime.go:279-298 counts them: requests first,
then limits, any resource name containing "gpu"), PET_NODE_RANK (the completion index, Downward API), PET_MASTER_ADDR
(`{trainjob}-node-0-0.{trainjob}`), PET_MASTER_PORT (29500) and the port 29500; the JAX plugin JAX_NUM_PROCESSES,
JAX_PROCESS_ID (the completion index) and JAX_COORDINATOR_ADDRESS (`{trainjob}-node-0-0.{trainjob}:29500`) and the
same port.

Not simulated: the other framework plugins (mpi, xgboost, flux: k8s_api.py refuses such runtimes), torchtune's
command rewriting, envInjection targets, the initializer steps, suspension.
"""

from __future__ import annotations

import copy
import json
from typing import Callable

from tests.standins.jobsets import DNS1035, JOBSET_GROUP, JOBSET_VERSION, SUBDOMAIN, JobSetRun
from tests.standins.validation import crd_problems

TRAINER_GROUP, TRAINER_VERSION = "trainer.kubeflow.org", "v1alpha1"
ANCESTOR_LABEL = "trainer.kubeflow.org/trainjob-ancestor-step"
FRAMEWORK_POLICIES = ("torch", "mpi", "jax", "xgboost", "flux")
SIMULATED_POLICIES = ("torch", "jax")
TRAINER_PORT = 29500  # constants.go:72 ContainerTrainerPort
TORCH_RESERVED_ENV = ("PET_NNODES", "PET_NPROC_PER_NODE", "PET_NODE_RANK", "PET_MASTER_ADDR", "PET_MASTER_PORT")
COMPLETION_INDEX_FIELD = "metadata.annotations['batch.kubernetes.io/job-completion-index']"  # constants.go:297


def _merge(base, patch):
    """A strategic merge patch for the JobSet spec's types: maps merge, lists of named items merge by name
    (replicatedJobs, containers, env, volumes, volumeMounts), other lists are replaced (tolerations are atomic)."""
    if isinstance(base, dict) and isinstance(patch, dict):
        merged = dict(base)
        for key, value in patch.items():
            merged[key] = _merge(base[key], value) if key in base else copy.deepcopy(value)
        return merged
    if isinstance(base, list) and isinstance(patch, list) and all(
            isinstance(item, dict) and "name" in item for item in base + patch):
        merged = [copy.deepcopy(item) for item in base]
        names = [item["name"] for item in merged]
        for item in patch:
            if item["name"] in names:
                merged[names.index(item["name"])] = _merge(merged[names.index(item["name"])], item)
            else:
                merged.append(copy.deepcopy(item))
        return merged
    return copy.deepcopy(patch)


def _upsert_env(env: list[dict], updates: list[dict]) -> list[dict]:
    by_name = {var["name"]: dict(var) for var in env}
    order = [var["name"] for var in env]
    for var in updates:
        if var["name"] not in by_name:
            order.append(var["name"])
        by_name[var["name"]] = dict(var)
    return [by_name[name] for name in order]


def _quantity_value(quantity) -> int:
    """A quantity as resource.Quantity.Value() gives it: rounded up to a whole number."""
    text = str(quantity)
    if text.endswith("m"):
        return -(-int(text[:-1]) // 1000)
    return int(-(-float(text) // 1))


def _gpus_per_node(resources: dict) -> int:
    """runtime.go:279-298 (GetNumGPUPerNode, numGPU): the requests' count, else the limits'; of the first resource
    whose name contains "gpu" in any case (nvidia.com/gpu, amd.com/gpu, ...). Go ranges over the map in random
    order where several such names are set; this takes them in the order given."""

    def count(resource_list: dict | None) -> int:
        for name, quantity in (resource_list or {}).items():
            if "gpu" in name.lower():
                return _quantity_value(quantity)
        return 0

    return count(resources.get("requests")) or count(resources.get("limits"))


def _framework_env(policy: str, trainjob: dict, nodes: int, resources: dict) -> list[dict]:
    """What Trainer's torch or JAX plugin upserts into the `node` container's env."""
    name = trainjob["metadata"]["name"]
    master = f"{name}-node-0-0.{name}"
    rank = {"valueFrom": {"fieldRef": {"fieldPath": COMPLETION_INDEX_FIELD}}}
    if policy == "jax":  # jax.go:76-97
        return [{"name": "JAX_NUM_PROCESSES", "value": str(nodes)}, {"name": "JAX_PROCESS_ID", **rank},
                {"name": "JAX_COORDINATOR_ADDRESS", "value": f"{master}:{TRAINER_PORT}"}]
    trainer = trainjob["spec"].get("trainer") or {}
    procs = trainer.get("numProcPerNode", "auto")  # torch.go:121-124
    # torch.go:131-135: no GPU, so one process per CPU (getNumCPUPerNode: the request, else the limit)
    if procs == "auto" and not _gpus_per_node(resources):
        cpu = (resources.get("requests") or {}).get("cpu") or (resources.get("limits") or {}).get("cpu") or 0
        procs = max(1, _quantity_value(cpu))
    return [{"name": "PET_NNODES", "value": str(nodes)}, {"name": "PET_NPROC_PER_NODE", "value": str(procs)},
            {"name": "PET_NODE_RANK", **rank}, {"name": "PET_MASTER_ADDR", "value": master},
            {"name": "PET_MASTER_PORT", "value": str(TRAINER_PORT)}]


def runtime_problems(body: dict) -> list[str]:
    """What the ClusterTrainingRuntime CRD and Trainer's runtime webhook refuse."""
    problems = crd_problems(body)
    for index, rjob in enumerate(body.get("spec", {}).get("template", {}).get("spec", {}).get("replicatedJobs", [])):
        ancestor = rjob.get("template", {}).get("metadata", {}).get("labels", {}).get(ANCESTOR_LABEL)
        if ancestor == "trainer":
            if int(rjob.get("replicas", 1)) != 1:
                problems.append(f"spec.template.spec.replicatedJobs[{index}].replicas: Invalid value: must be 1")
            containers = rjob["template"].get("spec", {}).get("template", {}).get("spec", {}).get("containers", [])
            if not any(c.get("name") == "node" for c in containers):
                problems.append(f"spec.template.spec.replicatedJobs[{index}]: must have a container named node")
    return problems


def trainjob_jobset(trainjob: dict, runtime: dict) -> tuple[dict, list[str]]:
    """The JobSet Trainer makes for `trainjob` on `runtime`, and what its webhook refuses in the TrainJob."""
    problems = []
    spec = trainjob.get("spec", {})
    template = copy.deepcopy(runtime["spec"].get("template", {}))
    jobset_spec = template.get("spec", {})
    labels = dict(template.get("metadata", {}).get("labels", {}))
    # The webhook's runtime-patch checks (pkg/runtime/framework/plugins/jobset/jobset.go:174-204) look up each
    # patched job and container among the runtime's template with the TrainJob's own patches already merged in
    # (pkg/runtime/core/trainingruntime.go:315 newRuntimeInfo, which merges them at :162; jobset.go:91-110): a
    # patch's new job or container is in it, so v2.3.0 never refuses one ("doesn't exist in the runtime job"), and
    # neither does the stand-in (tests/test_trainer_controllers.py holds it to the real webhook).
    for patch in spec.get("runtimePatches", []):
        manager = patch.get("manager", "")
        host, slash, path = manager.partition("/")
        if not slash or not path or not SUBDOMAIN.match(host):
            problems.append(f"spec.runtimePatches.manager: Invalid value: {json.dumps(manager)}: must be a "
                            "domain-prefixed path (such as \"acme.io/foo\")")
        runtime_patch = patch.get("trainingRuntimeSpec", {}).get("template", {})
        labels.update(runtime_patch.get("metadata", {}).get("labels", {}))
        for rjob_patch in runtime_patch.get("spec", {}).get("replicatedJobs", []):
            pod_patch = rjob_patch.get("template", {}).get("spec", {}).get("template", {}).get("spec", {})
            if any(c.get("env") and c["name"] == "node" for c in pod_patch.get("containers", [])):
                problems.append("spec.runtimePatches: must not have envs for the dataset-initializer, "
                                "model-initializer, node containers")
        jobset_spec = _merge(jobset_spec, runtime_patch.get("spec", {}))
    ml_policy = runtime["spec"].get("mlPolicy")
    trainer = spec.get("trainer") or {}
    policy = next((p for p in SIMULATED_POLICIES if p in (ml_policy or {})), None)
    reserved = sorted({var["name"] for var in trainer.get("env") or []} & set(TORCH_RESERVED_ENV))
    if policy == "torch" and reserved:  # torch.go:65-77
        problems.append(f"spec.trainer.env: Invalid value: must not have reserved envs, invalid envs configured: "
                        f"[{' '.join(reserved)}]")
    for rjob in jobset_spec.get("replicatedJobs", []):
        if rjob["template"].get("metadata", {}).get("labels", {}).get(ANCESTOR_LABEL) != "trainer":
            continue
        rjob["replicas"] = 1
        job_spec = rjob["template"]["spec"]
        if ml_policy is not None:
            nodes = trainer.get("numNodes", ml_policy.get("numNodes", 1))
            job_spec["parallelism"] = job_spec["completions"] = nodes
        for container in job_spec["template"]["spec"]["containers"]:
            if container["name"] != "node":
                continue
            for field in ("image", "command", "args"):
                if trainer.get(field) is not None:
                    container[field] = copy.deepcopy(trainer[field])
            if trainer.get("env"):
                container["env"] = _upsert_env(container.get("env", []), trainer["env"])
            if ml_policy is not None and trainer.get("resourcesPerNode"):
                container["resources"] = _merge(container.get("resources", {}), trainer["resourcesPerNode"])
            if policy is not None:
                container["env"] = _upsert_env(container.get("env", []), _framework_env(
                    policy, trainjob, job_spec["parallelism"], container.get("resources", {})))
                if not any(p.get("containerPort") == TRAINER_PORT for p in container.get("ports", [])):
                    container["ports"] = [*container.get("ports", []), {"containerPort": TRAINER_PORT}]
    body = {"apiVersion": f"{JOBSET_GROUP}/{JOBSET_VERSION}", "kind": "JobSet",
            "metadata": {"name": trainjob["metadata"]["name"], "labels": labels, "ownerReferences": [
                {"apiVersion": f"{TRAINER_GROUP}/{TRAINER_VERSION}", "kind": "TrainJob",
                 "name": trainjob["metadata"]["name"], "uid": trainjob["metadata"].get("uid", ""),
                 "controller": True, "blockOwnerDeletion": True}]},
            "spec": jobset_spec}
    return body, problems


class TrainJobRun:
    """One TrainJob: its JobSet, and its status read from the JobSet's (Trainer's jobset plugin Status); `jobset`
    None: suspended (Kueue holds it), with the Suspended condition Trainer gives it (v2.3.0
    pkg/constants/constants.go:77-79, reason Suspended)."""

    def __init__(self, body: dict, namespace: str, jobset: JobSetRun | None, now: Callable[[], str]):
        self.body, self.namespace, self.jobset = body, namespace, jobset
        self.name = body["metadata"]["name"]
        body["metadata"].update(namespace=namespace, creationTimestamp=now(), resourceVersion="1", generation=1)
        body["spec"].setdefault("suspend", False)
        body["spec"].setdefault("managedBy", "trainer.kubeflow.org/trainjob-controller")

    def snapshot(self) -> dict:
        if self.jobset is None:
            status = {"conditions": [{"type": "Suspended", "status": "True", "reason": "Suspended",
                                      "message": "TrainJob is suspended"}]}
            return json.loads(json.dumps({**self.body, "status": status}))
        jobset = self.jobset.snapshot()
        conditions = []
        for condition in jobset["status"]["conditions"]:
            renamed = {"Completed": "Complete", "Failed": "Failed"}.get(condition["type"])
            if renamed and condition["status"] == "True":
                conditions.append({**condition, "type": renamed})
        jobs = [{key: r[key] for key in ("name", "ready", "succeeded", "failed", "active", "suspended")}
                for r in jobset["status"]["replicatedJobsStatus"]]
        status = {"conditions": conditions, "jobsStatus": jobs} if conditions or jobs else {}
        return json.loads(json.dumps({**self.body, "status": status}))


def trainjob_problems(body: dict, runtimes: dict[str, dict]) -> tuple[list[str], dict | None]:
    """The TrainJob CRD's and Trainer's webhook's checks; the runtime when it is found, else None and why not."""
    problems = crd_problems(body)
    name = body.get("metadata", {}).get("name", "")
    if not DNS1035.match(name) or len(name) > 63:
        problems.append("metadata.name must match RFC 1035 DNS label format and be no more than 63 characters")
    ref = body.get("spec", {}).get("runtimeRef", {})
    runtime = runtimes.get(ref.get("name", "")) if ref.get("kind", "ClusterTrainingRuntime") == \
        "ClusterTrainingRuntime" else None
    return problems, runtime
