"""The GPUs this project knows: the GKE accelerator label value, Vertex AI's accelerator type, and the Vertex AI
machine shapes that hold 1, 2, 4, ... of them. The one table: pipelines/config.py (compile-time choices and the
pipeline's `known_accelerators`), the launchers' GPU placement and the Vertex AI CustomJob launcher read it.

The Vertex AI names are members of `google.cloud.aiplatform_v1.AcceleratorType` (tests check that).
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Accelerator:
    gke: str  # the `cloud.google.com/gke-accelerator` node label value
    vertex: str  # aiplatform_v1.AcceleratorType name
    machines: dict[int, str]  # Vertex AI machine type for N GPUs per replica: the smallest holding that many
    # MIG partition sizes (empty: no MIG on GKE): GoogleCloudPlatform/container-engine-accelerators'
    # gpuPartitionSizeMaxCount, whose comments name the accelerator of each size (pkg/gpu/nvidia/mig/mig.go:36-69 at
    # 992db81257553607f1477945f1b3219632991829); GKE's "Running multi-instance GPUs" lists A100 40GB and 80GB, H100
    # 80GB, H200 141GB and B200.
    mig_profiles: tuple[str, ...] = ()


TABLE = (
    Accelerator("nvidia-tesla-t4", "NVIDIA_TESLA_T4", {1: "n1-standard-8", 2: "n1-standard-16", 4: "n1-standard-32"}),
    Accelerator("nvidia-l4", "NVIDIA_L4", {1: "g2-standard-8", 2: "g2-standard-24", 4: "g2-standard-48",
                                           8: "g2-standard-96"}),
    Accelerator("nvidia-tesla-a100", "NVIDIA_TESLA_A100", {1: "a2-highgpu-1g", 2: "a2-highgpu-2g", 4: "a2-highgpu-4g",
                                                           8: "a2-highgpu-8g", 16: "a2-megagpu-16g"},
                ("1g.5gb", "2g.10gb", "3g.20gb", "7g.40gb")),
    Accelerator("nvidia-a100-80gb", "NVIDIA_A100_80GB", {1: "a2-ultragpu-1g", 2: "a2-ultragpu-2g",
                                                         4: "a2-ultragpu-4g", 8: "a2-ultragpu-8g"},
                ("1g.10gb", "2g.20gb", "3g.40gb", "7g.80gb")),
    Accelerator("nvidia-h100-80gb", "NVIDIA_H100_80GB", {1: "a3-highgpu-1g", 2: "a3-highgpu-2g", 4: "a3-highgpu-4g",
                                                         8: "a3-highgpu-8g"},
                ("1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb", "7g.80gb")),
    Accelerator("nvidia-h200-141gb", "NVIDIA_H200_141GB", {8: "a3-ultragpu-8g"},
                ("1g.18gb", "1g.35gb", "2g.35gb", "3g.71gb", "4g.71gb", "7g.141gb")),
    # A3 Mega (8 x H100 80GB, GPUDirect-TCPXO) and A4 (8 x B200, GPUDirect RDMA, as A3 Ultra above) come in one
    # shape each, all 8 GPUs (https://cloud.google.com/compute/docs/accelerator-optimized-machines); GKE's label
    # values are those of container-engine-accelerators' GPUDirect installers (components/launch/network.py).
    Accelerator("nvidia-h100-mega-80gb", "NVIDIA_H100_MEGA_80GB", {8: "a3-megagpu-8g"}),
    Accelerator("nvidia-b200", "NVIDIA_B200", {8: "a4-highgpu-8g"},
                ("1g.23gb", "1g.45gb", "2g.45gb", "3g.90gb", "4g.90gb", "7g.180gb")),
)

# GKE accelerator (label value) -> Vertex AI accelerator type: what a pipeline passes as `known_accelerators`.
ACCELERATORS = {a.gke: a.vertex for a in TABLE}
# GKE accelerator -> the MIG partition sizes GKE offers on it (only those with MIG).
MIG_PROFILES = {a.gke: a.mig_profiles for a in TABLE if a.mig_profiles}
# GKE accelerator -> {GPUs per replica: Vertex AI machine type}.
VERTEX_MACHINES = {a.gke: dict(a.machines) for a in TABLE}
VERTEX_CPU_MACHINE = "n1-standard-8"
MAX_GPUS_PER_REPLICA = max(n for a in TABLE for n in a.machines)  # 16: a2-megagpu-16g, the largest GKE GPU shape


def vertex_machine_type(accelerator: str, gpus: int) -> str:
    """The Vertex AI machine type for `gpus` x `accelerator` (a GKE label value), or the CPU machine for 0 GPUs."""
    if not gpus:
        return VERTEX_CPU_MACHINE
    shapes = VERTEX_MACHINES.get(accelerator, {})
    if gpus not in shapes:
        raise ValueError(f"Vertex AI has no machine with {gpus} x {accelerator}; choose one of "
                         f"{sorted(shapes) or 'none'} GPUs (or pass machine_type)")
    return shapes[gpus]
