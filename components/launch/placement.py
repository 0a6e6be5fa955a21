"""GPU placement: where a training pod may run (node selector, tolerations, GPU count).

Shared by the single-pod path of the pipeline (the placement step checks the run's choice and hands its node
selector and tolerations to the training task) and by the launchers' replicas: GKE's accelerator node label and
the GPU toleration, Spot VMs (`cloud.google.com/gke-spot`), a named node pool, and Kueue's queue label for
clusters that queue GPU work. The accelerators are those of components/gcp/accelerators.py.
"""

from __future__ import annotations

import dataclasses
import re

from components.gcp.accelerators import MAX_GPUS_PER_REPLICA

# GKE and Kubernetes API facts; pipelines/config.py reads them from here.
ACCELERATOR_NODE_LABEL = "cloud.google.com/gke-accelerator"
GPU_RESOURCE = "nvidia.com/gpu"
SPOT_NODE_LABEL = "cloud.google.com/gke-spot"
NODE_POOL_LABEL = "cloud.google.com/gke-nodepool"
KUEUE_QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
DNS_LABEL_CHARS = re.compile(r"[^a-z0-9-]+")


@dataclasses.dataclass(frozen=True)
class Placement:
    """Where a training pod may run: its node selector, tolerations and GPU limit."""

    node_selector: dict[str, str]
    tolerations: list[dict]
    gpus: int
    accelerator: str

    def to_json(self) -> dict:
        return dataclasses.asdict(self)

    @property
    def gpu_limit(self) -> str:
        """The GPU count as a KFP task's accelerator limit takes it from a step's output: a string, since the KFP
        driver reads the limit's placeholder as a string and resolves a number to nothing (kubeflow/pipelines
        2.17.0, backend/src/v2/driver/resolve.go:825); empty for none, which sets no GPU limit at all
        (driver.go:440), so that a CPU pod asks for no GPU resource."""
        return str(self.gpus) if self.gpus else ""


CPU_ONLY = Placement({}, [], 0, "")


def gpu_placement(accelerator: str, gpus: int, *, known_accelerators, spot: bool = False,
                  node_pool: str = "") -> Placement:
    """Validates a per-run GPU choice and turns it into node selector + tolerations.

    `accelerator` is a GKE accelerator label value (nvidia-tesla-t4, nvidia-l4, ...); with `gpus=0` the pod runs
    on CPU nodes and the accelerator is ignored. Spot adds the `cloud.google.com/gke-spot` selector and its
    toleration (GKE taints Spot pools when asked to, and the toleration is harmless when it does not).
    """
    known = list(known_accelerators)
    if not isinstance(gpus, int) or isinstance(gpus, bool) or not 0 <= gpus <= MAX_GPUS_PER_REPLICA:
        raise ValueError(f"GPU count must be an integer from 0 to {MAX_GPUS_PER_REPLICA}, got {gpus!r}")
    if gpus and accelerator not in known:
        raise ValueError(f"Unknown accelerator {accelerator!r}; known GKE accelerators: {', '.join(known)}")
    if node_pool and (len(node_pool) > 40 or DNS_LABEL_CHARS.search(node_pool)):
        raise ValueError(f"Node pool {node_pool!r} is not a GKE node pool name (lowercase letters, digits, '-')")
    selector: dict[str, str] = {}
    tolerations: list[dict] = []
    if gpus:
        selector[ACCELERATOR_NODE_LABEL] = accelerator
        tolerations.append({"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"})
    if spot:
        selector[SPOT_NODE_LABEL] = "true"
        tolerations.append({"key": SPOT_NODE_LABEL, "operator": "Equal", "value": "true", "effect": "NoSchedule"})
    if node_pool:
        selector[NODE_POOL_LABEL] = node_pool
    return Placement(selector, tolerations, gpus, accelerator if gpus else "")


def node_resources(cpu: str = "", memory: str = "", gpus: str = "") -> dict:
    """A node's Kubernetes ResourceRequirements from a pipeline task's values: CPU and memory requested, and the
    GPU limit as the placement step writes it (a string, empty for none)."""
    requests = {name: value for name, value in (("cpu", cpu), ("memory", memory)) if value}
    limits = {GPU_RESOURCE: str(gpus)} if str(gpus or "").strip() not in ("", "0") else {}
    return {key: value for key, value in (("limits", limits), ("requests", requests)) if value}


def placement_from_task_config(task_config: dict | None,
                               resources: dict | None = None) -> tuple[Placement, dict] | None:
    """The placement, CPU and memory a pipeline task carries (KFP's TaskConfig passthrough, `dataclasses.asdict`
    of `dsl.TaskConfig`: `node_selector`, `tolerations`, and `resources` as a Kubernetes ResourceRequirements when
    the task passes them through), for a launcher to give its replicas. `resources`, when given, are the nodes'
    instead of the TaskConfig's (a launcher whose own pod keeps the task's resources gets the nodes' as values).
    None when no TaskConfig reached the task (kfp.local, a backend before KFP 2.15): the driver's TaskConfig always
    has `resources` ({} when not passed through; kubeflow/pipelines 2.17.0 backend/src/v2/driver/driver.go:112-120,
    container.go:283-310), so its absence tells. The second value holds `cpu`/`memory` when requested."""
    if not task_config or all(value is None for value in task_config.values()):
        return None
    resources = resources if resources is not None else (task_config.get("resources") or {})
    selector = dict(task_config.get("node_selector") or {})
    tolerations = [dict(t) for t in task_config.get("tolerations") or []]
    limits, requests = resources.get("limits") or {}, resources.get("requests") or {}
    count = limits.get(GPU_RESOURCE, requests.get(GPU_RESOURCE, 0)) or 0
    try:
        gpus = int(float(count))
    except (TypeError, ValueError):
        raise ValueError(f"The task's {GPU_RESOURCE} limit {count!r} is not a GPU count") from None
    if not 0 <= gpus <= MAX_GPUS_PER_REPLICA:
        raise ValueError(f"GPU count must be an integer from 0 to {MAX_GPUS_PER_REPLICA}, got {gpus}")
    sizes = {name: str(requests[name]) for name in ("cpu", "memory") if requests.get(name)}
    return Placement(selector, tolerations, gpus, selector.get(ACCELERATOR_NODE_LABEL, "") if gpus else ""), sizes
