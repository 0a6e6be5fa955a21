"""GPU placement: where a training pod may run (node selector, tolerations, GPU count).

Shared by the single-pod path of the pipeline (the placement step checks the run's choice and hands its node
selector and tolerations to the training task) and by the launchers' replicas: GKE's accelerator node label and
the GPU toleration, Spot VMs (`cloud.google.com/gke-spot`), a named node pool, and Kueue's queue label for
clusters that queue GPU work. The accelerators are those of components/gcp/accelerators.py.

Shared GPUs (`SharedGpu`): a pod on a GKE node pool whose GPUs are split into MIG partitions, or time-shared or
shared through NVIDIA MPS, selects the pool's labels and still asks for `nvidia.com/gpu: 1`, which on such a node is
one slice or one share. GKE's device plugin refuses a time-shared pod asking for more at admission
(ValidateRequest, pkg/gpu/nvidia/gpusharing/gpusharing.go:40-50, called from Allocate in beta_plugin.go:56-62 of
GoogleCloudPlatform/container-engine-accelerators at 992db81257553607f1477945f1b3219632991829: the pod ends in
UnexpectedAdmissionError), so every check happens here first.
"""

from __future__ import annotations

import dataclasses
import re

from components.gcp.accelerators import MAX_GPUS_PER_REPLICA, MIG_PROFILES

# GKE and Kubernetes API facts; pipelines/config.py reads them from here.
ACCELERATOR_NODE_LABEL = "cloud.google.com/gke-accelerator"
GPU_RESOURCE = "nvidia.com/gpu"
SPOT_NODE_LABEL = "cloud.google.com/gke-spot"
NODE_POOL_LABEL = "cloud.google.com/gke-nodepool"
KUEUE_QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
DNS_LABEL_CHARS = re.compile(r"[^a-z0-9-]+")
# The node labels of GKE's shared GPUs (https://cloud.google.com/kubernetes-engine/docs/how-to/gpus-multi,
# .../timesharing-gpus, .../nvidia-mps-gpus); the strategies are the device plugin's own names
# (gpusharing.go:25-29).
GPU_PARTITION_LABEL = "cloud.google.com/gke-gpu-partition-size"
GPU_SHARING_LABEL = "cloud.google.com/gke-gpu-sharing-strategy"
MAX_SHARED_CLIENTS_LABEL = "cloud.google.com/gke-max-shared-clients-per-gpu"
SHARING_STRATEGIES = ("time-sharing", "mps")
MAX_SHARED_CLIENTS = 48  # GKE's limit on a pool's max-shared-clients-per-gpu
# Where the pods can carry `hostIPC: true`, which GKE's MPS example pod sets to reach the node's MPS control daemon:
# not a pipeline's own pod (kfp-kubernetes' KubernetesExecutorConfig has no such field), only a pod spec of ours.
HOST_IPC_LAUNCHERS = ("jobset",)
VERTEX_LAUNCHERS = ("vertex", "vertex-job")  # a step's pod on Vertex AI Pipelines, a Vertex AI CustomJob


@dataclasses.dataclass(frozen=True)
class SharedGpu:
    """A share of one GPU: a MIG partition size (1g.10gb), or a sharing strategy (time-sharing, mps) with the
    pool's max shared clients per GPU. Empty: a whole GPU."""

    partition: str = ""
    sharing: str = ""
    max_shared_clients: int = 0

    def __bool__(self) -> bool:
        return bool(self.partition or self.sharing)

    @classmethod
    def from_node_selector(cls, node_selector: dict | None) -> "SharedGpu":
        """The share a node selector asks for (a launcher's nodes, placed by the pipeline task's TaskConfig)."""
        selector = node_selector or {}
        clients = str(selector.get(MAX_SHARED_CLIENTS_LABEL, "0"))
        return cls(selector.get(GPU_PARTITION_LABEL, ""), selector.get(GPU_SHARING_LABEL, ""),
                   int(clients) if clients.isdigit() else -1)

    @property
    def shares_memory(self) -> bool:
        """Whether other pods use the same GPU memory: time-sharing and MPS. A MIG slice has memory of its own."""
        return bool(self.sharing)

    def describe(self) -> str:
        """What the training step is told (TrainSettings.shared_gpu) and the logs say: "mig 1g.10gb",
        "time-sharing 4", "mps 2"; empty for a whole GPU."""
        if self.partition:
            return f"mig {self.partition}"
        return f"{self.sharing} {self.max_shared_clients}" if self.sharing else ""

    def node_selector(self) -> dict[str, str]:
        if self.partition:
            return {GPU_PARTITION_LABEL: self.partition}
        if self.sharing:
            return {GPU_SHARING_LABEL: self.sharing, MAX_SHARED_CLIENTS_LABEL: str(self.max_shared_clients)}
        return {}

    def check(self, accelerator: str, gpus: int, *, workers: int | None = 0, launcher: str | None = "pod",
              what: str = "training") -> None:
        """ValueError, in one line, for a share GKE would not schedule or this pipeline cannot run: `workers` are
        the machines besides the first (a multi-node launcher's), `launcher` what creates the pod ("pod": the
        pipeline's own); None for either: not known here (pipectl before a run of an uploaded pipeline), checked
        by the placement step."""
        if not self:
            if self.max_shared_clients:
                raise ValueError(f"{what}: max shared clients per GPU ({self.max_shared_clients}) goes with a GPU "
                                 "sharing strategy (time-sharing or mps)")
            return
        name = f"{what} on a shared GPU ({self.describe()})"
        if launcher in VERTEX_LAUNCHERS:
            raise ValueError(f"{name}: Vertex AI machines have whole GPUs; GKE's MIG partitions and GPU sharing need "
                             "a KFP backend on GKE (--target kfp)")
        if self.partition and self.sharing:
            raise ValueError(f"{what}: choose a MIG partition size ({self.partition}) or a GPU sharing strategy "
                             f"({self.sharing}), not both")
        if gpus != 1:
            raise ValueError(f"{name} asks for exactly one nvidia.com/gpu, which is one slice or share (GKE's device "
                             f"plugin refuses more at admission); got a GPU count of {gpus}")
        if workers:
            raise ValueError(f"{name} runs on a single node: a MIG slice has no peer-to-peer and a shared GPU no "
                             f"bandwidth of its own for collectives; got {workers} worker(s) besides the chief")
        if self.partition:
            profiles = MIG_PROFILES.get(accelerator)
            if not profiles:
                raise ValueError(f"{name}: {accelerator} has no MIG partitions on GKE; MIG runs on "
                                 f"{', '.join(MIG_PROFILES)}")
            if self.partition not in profiles:
                raise ValueError(f"{name}: {self.partition!r} is not a MIG partition size of {accelerator}; GKE "
                                 f"offers {', '.join(profiles)}")
            return
        if self.sharing not in SHARING_STRATEGIES:
            raise ValueError(f"{what}: GPU sharing strategy must be one of {', '.join(SHARING_STRATEGIES)}, got "
                             f"{self.sharing!r}")
        if not 2 <= self.max_shared_clients <= MAX_SHARED_CLIENTS:
            raise ValueError(f"{name}: max shared clients per GPU must be the node pool's, from 2 to "
                             f"{MAX_SHARED_CLIENTS}; got {self.max_shared_clients}")
        if self.sharing == "mps" and launcher is not None and launcher not in HOST_IPC_LAUNCHERS:
            where = "kfp-kubernetes cannot set on a pipeline's own pod" if launcher == "pod" else \
                f"the {launcher} launcher's pods do not carry"
            instead = "time-sharing" if what != "training" else \
                f"--train-launcher {' or '.join(HOST_IPC_LAUNCHERS)}, or time-sharing"
            raise ValueError(f"{name}: an MPS pod needs hostIPC, which {where}; use {instead}")


@dataclasses.dataclass(frozen=True)
class Placement:
    """Where a training pod may run: its node selector, tolerations and GPU limit."""

    node_selector: dict[str, str]
    tolerations: list[dict]
    gpus: int
    accelerator: str
    shared_gpu: str = ""  # SharedGpu.describe(): what the training step is told of its GPU's share

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
                  node_pool: str = "", shared: SharedGpu = SharedGpu(), workers: int | None = 0,
                  launcher: str | None = "pod") -> Placement:
    """Validates a per-run GPU choice and turns it into node selector + tolerations.

    `accelerator` is a GKE accelerator label value (nvidia-tesla-t4, nvidia-l4, ...); with `gpus=0` the pod runs
    on CPU nodes and the accelerator is ignored. Spot adds the `cloud.google.com/gke-spot` selector and its
    toleration (GKE taints Spot pools when asked to, and the toleration is harmless when it does not). A `shared`
    GPU adds its pool's labels (SharedGpu.check says what it refuses; `workers` and `launcher` as there).
    """
    known = list(known_accelerators)
    if not isinstance(gpus, int) or isinstance(gpus, bool) or not 0 <= gpus <= MAX_GPUS_PER_REPLICA:
        raise ValueError(f"GPU count must be an integer from 0 to {MAX_GPUS_PER_REPLICA}, got {gpus!r}")
    if gpus and accelerator not in known:
        raise ValueError(f"Unknown accelerator {accelerator!r}; known GKE accelerators: {', '.join(known)}")
    if node_pool and (len(node_pool) > 40 or DNS_LABEL_CHARS.search(node_pool)):
        raise ValueError(f"Node pool {node_pool!r} is not a GKE node pool name (lowercase letters, digits, '-')")
    shared.check(accelerator, gpus, workers=workers, launcher=launcher)
    selector: dict[str, str] = {}
    tolerations: list[dict] = []
    if gpus:
        selector[ACCELERATOR_NODE_LABEL] = accelerator
        tolerations.append({"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"})
        selector.update(shared.node_selector())
    if spot:
        selector[SPOT_NODE_LABEL] = "true"
        tolerations.append({"key": SPOT_NODE_LABEL, "operator": "Equal", "value": "true", "effect": "NoSchedule"})
    if node_pool:
        selector[NODE_POOL_LABEL] = node_pool
    return Placement(selector, tolerations, gpus, accelerator if gpus else "", shared.describe())


def mps_pod_fields(node_selector: dict) -> dict:
    """The pod spec fields a pod on an MPS-shared GPU needs: `hostIPC: true`, as GKE's MPS example pod sets it
    (https://cloud.google.com/kubernetes-engine/docs/how-to/nvidia-mps-gpus), for the CUDA clients to reach the
    node's MPS control daemon (whose pipe directory the device plugin mounts, /tmp/nvidia-mps: manager.go:59 and
    :408-413 at 992db81257553607f1477945f1b3219632991829); {} on other nodes."""
    return {"hostIPC": True} if (node_selector or {}).get(GPU_SHARING_LABEL) == "mps" else {}


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
