"""GPUDirect networking for multi-node training on A3 Ultra and A4 (GPUDirect RDMA) and A3 Mega (GPUDirect-TCPXO):
what a node pod needs to reach the GPU NICs, for the launchers that build their own pods (trainjob, jobset).

Followed from the reference manifests of GoogleCloudPlatform/container-engine-accelerators at CEA_COMMIT (and
https://cloud.google.com/kubernetes-engine/docs/how-to/gpu-bandwidth-gpudirect-tcpx and the AI Hypercomputer pages
for GKE's A3 Ultra and A4 clusters); tests/test_gpudirect.py holds the fragments compared against:

- RDMA (gpudirect-rdma/nccl-test.yaml:39-89, the same in nccl-test-a4.yaml): the pod selects the default network
  on eth0 and the eight `rdma-0`..`rdma-7` networks (`networking.gke.io/interfaces`); mounts the host's
  /home/kubernetes/bin/nvidia at /usr/local/nvidia and /home/kubernetes/bin/gib at /usr/local/gib (where the
  RDMA installer DaemonSet, nccl-rdma-installer.yaml:57-77, copies the gIB NCCL plugin and its scripts), a memory
  emptyDir at /dev/shm; sets LD_LIBRARY_PATH=/usr/local/nvidia/lib64 and sources
  /usr/local/gib/scripts/set_nccl_env.sh before NCCL starts. No sidecar.
- TCPXO (gpudirect-tcpxo/nccl-test-latest.yaml:40-160): eight more networks `vpc1`..`vpc8` on eth1..eth8; the
  `tcpxo-daemon` container (the receive data path manager) with NET_ADMIN and NET_BIND_SERVICE, the host's /sys and
  /proc/sys, and the GPU device nodes given to it by the `devices.gke.io/container.tcpxo-daemon` annotation; the
  training container mounts the NCCL plugin directory (the TCPXO installer, nccl-tcpxo-installer.yaml:71-91, copies
  the plugin and its NCCL into /home/kubernetes/bin/nvidia/lib64), /dev/shm and /dev/aperture_devices and sets
  LD_LIBRARY_PATH and NCCL_FASTRAK_LLCM_DEVICE_DIRECTORY. The NCCL settings are the installer's own profile,
  `source ${NCCL_LIB_DIR}/nccl-env-profile.sh` (gpudirect-tcpxo/README.md:25-35), so that they move with the
  installed plugin instead of a copy here. Upstream's test pod runs the daemon as a second container, which never
  exits; here it is a native sidecar (an init container with `restartPolicy: Always`, Kubernetes 1.29+), so that a
  node's Job pod completes when training does. A TrainJob's runtime patch cannot add a container (its container
  patches name containers the runtime has, and carry only env, volumeMounts and securityContext: the TrainJob CRD,
  tests/schemas/trainer.kubeflow.org_trainjobs.yaml:1736-1988), so TCPXO comes with its own
  ClusterTrainingRuntimes (manifests/trainer/*-tcpxo.yaml).

Each node takes all 8 GPUs (and so all 8 GPU NICs) of its machine: the machine shapes hold 8
(components/gcp/accelerators.py), and a pod with fewer GPUs would still use every NIC's network.
"""

from __future__ import annotations

import dataclasses

from components.launch.placement import Placement

CEA_REPOSITORY = "GoogleCloudPlatform/container-engine-accelerators"
CEA_COMMIT = "992db81257553607f1477945f1b3219632991829"
RDMA, TCPXO = "rdma", "tcpxo"
NETWORKS = (RDMA, TCPXO)
# The machines of each network, by GKE accelerator label (the RDMA installer's node affinity,
# nccl-rdma-installer.yaml:40-44; A3 Mega's H100 is nvidia-h100-mega-80gb on GKE).
NETWORK_ACCELERATORS = {RDMA: ("nvidia-h200-141gb", "nvidia-b200"), TCPXO: ("nvidia-h100-mega-80gb",)}
MACHINES = {"nvidia-h200-141gb": "A3 Ultra", "nvidia-b200": "A4", "nvidia-h100-mega-80gb": "A3 Mega"}
GPUS_PER_NODE = 8
NETWORK_LAUNCHERS = ("trainjob", "jobset")  # the launchers whose node pods are ours to build

INTERFACES_ANNOTATION = "networking.gke.io/interfaces"
DEFAULT_INTERFACE_ANNOTATION = "networking.gke.io/default-interface"
TCPXO_DAEMON = "tcpxo-daemon"
TCPXO_DEVICES_ANNOTATION = f"devices.gke.io/container.{TCPXO_DAEMON}"
# The daemon of the installer release upstream's manifests pin together (gpudirect-tcpxo/README.md:57-65, Jan 9,
# 2026: installer nccl-plugin-gpudirecttcpx-dev:v1.0.15, daemon v1.0.21; the two move together, README.md:18-20).
TCPXO_DAEMON_IMAGE = "us-docker.pkg.dev/gce-ai-infra/gpudirect-tcpxo/tcpgpudmarxd-dev:v1.0.21"
NVIDIA_LIB64 = "/usr/local/nvidia/lib64"
RDMA_NCCL_ENV_SCRIPT = "/usr/local/gib/scripts/set_nccl_env.sh"
TCPXO_NCCL_ENV_SCRIPT = "${NCCL_LIB_DIR}/nccl-env-profile.sh"


def interfaces(network: str) -> str:
    """The `networking.gke.io/interfaces` annotation: eth0 on the default network, then the GPU NICs' networks."""
    nics = ([(f"eth{k + 2}", f"rdma-{k}") for k in range(8)] if network == RDMA else
            [(f"eth{k}", f"vpc{k}") for k in range(1, 9)])
    rows = [{"interfaceName": "eth0", "network": "default"}] + [{"interfaceName": i, "network": n} for i, n in nics]
    return "[\n" + ",\n".join('  {"interfaceName":"%s","network":"%s"}' % (r["interfaceName"], r["network"])
                               for r in rows) + "\n]\n"


@dataclasses.dataclass(frozen=True)
class PodNetwork:
    """What a node pod gets for `network`: pod annotations and volumes, the node container's mounts, env and the
    script it sources before training, and sidecars (native: init containers that keep running)."""

    network: str
    annotations: dict
    volumes: list
    mounts: list
    env: list
    env_script: str
    sidecars: list

    def node_command(self, command: list[str]) -> list[str]:
        """`command` run after the network's NCCL settings are sourced into its environment."""
        return ["/bin/bash", "-c", f'source {self.env_script} && exec "$@"', f"gpudirect-{self.network}",
                *command]


def _host(name: str, path: str) -> dict:
    return {"name": name, "hostPath": {"path": path}}


def pod_network(network: str) -> PodNetwork:
    """The pod fields of `network` (rdma or tcpxo; see the module docstring for their sources)."""
    annotations = {DEFAULT_INTERFACE_ANNOTATION: "eth0", INTERFACES_ANNOTATION: interfaces(network)}
    if network == RDMA:
        return PodNetwork(
            RDMA, annotations,
            volumes=[_host("library-dir-host", "/home/kubernetes/bin/nvidia"), _host("gib", "/home/kubernetes/bin/gib"),
                     {"name": "shared-memory", "emptyDir": {"medium": "Memory", "sizeLimit": "250Gi"}}],
            mounts=[{"name": "library-dir-host", "mountPath": "/usr/local/nvidia"},
                    {"name": "gib", "mountPath": "/usr/local/gib"},
                    {"name": "shared-memory", "mountPath": "/dev/shm"}],
            env=[{"name": "LD_LIBRARY_PATH", "value": NVIDIA_LIB64}],
            env_script=RDMA_NCCL_ENV_SCRIPT, sidecars=[])
    if network != TCPXO:
        raise ValueError(f"network must be one of {', '.join(NETWORKS)}, got {network!r}")
    devices = [f"/dev/nvidia{k}" for k in range(GPUS_PER_NODE)] + ["/dev/nvidiactl", "/dev/nvidia-uvm",
                                                                   "/dev/dmabuf_import_helper"]
    annotations = {TCPXO_DEVICES_ANNOTATION: "".join(f"- path: {d}\n" for d in devices), **annotations}
    daemon = {"name": TCPXO_DAEMON, "image": TCPXO_DAEMON_IMAGE, "restartPolicy": "Always",
              "command": ["/bin/sh", "-c"],
              "args": ["set -ex\nchmod 755 /fts/entrypoint_rxdm_container.sh\n"
                       "/fts/entrypoint_rxdm_container.sh --num_hops=2\n"],
              "securityContext": {"capabilities": {"add": ["NET_ADMIN", "NET_BIND_SERVICE"]}},
              "volumeMounts": [{"name": "nvidia", "mountPath": NVIDIA_LIB64},
                               {"name": "sys", "mountPath": "/hostsysfs"},
                               {"name": "proc-sys", "mountPath": "/hostprocsysfs"}],
              "env": [{"name": "LD_LIBRARY_PATH", "value": NVIDIA_LIB64}]}
    return PodNetwork(
        TCPXO, annotations,
        volumes=[_host("nvidia", "/home/kubernetes/bin/nvidia/lib64"),
                 {"name": "shared-memory", "emptyDir": {"medium": "Memory", "sizeLimit": "1Gi"}},
                 _host("sys", "/sys"), _host("proc-sys", "/proc/sys"),
                 _host("aperture-devices", "/dev/aperture_devices")],
        mounts=[{"name": "nvidia", "mountPath": NVIDIA_LIB64}, {"name": "shared-memory", "mountPath": "/dev/shm"},
                {"name": "aperture-devices", "mountPath": "/dev/aperture_devices"}],
        env=[{"name": "LD_LIBRARY_PATH", "value": NVIDIA_LIB64}, {"name": "NCCL_LIB_DIR", "value": NVIDIA_LIB64},
             {"name": "NCCL_FASTRAK_LLCM_DEVICE_DIRECTORY", "value": "/dev/aperture_devices"}],
        env_script=TCPXO_NCCL_ENV_SCRIPT, sidecars=[daemon])


# What creates the pods of a launcher that cannot carry a network, where "the {launcher} launcher's pods" would not
# say it: a pipeline step's own pod (placement.py's "pod"), one on Vertex AI Pipelines ("vertex").
POD_CREATORS = {"pod": "a pipeline step's own pod", "vertex": "a pipeline step's pod on Vertex AI Pipelines"}


def check_network(network: str, placement: Placement, *, launcher: str, flag: str = "--launcher") -> None:
    """ValueError, in one line, for a GPUDirect choice the nodes cannot use: a launcher that cannot carry it, a
    machine without that network, fewer than all 8 GPUs of a node. `flag`: the option that picks the launcher
    where the caller reads it (pipectl's is --train-launcher)."""
    if not network:
        return
    if network not in NETWORKS:
        raise ValueError(f"network must be one of {', '.join(NETWORKS)} (or empty: the pod network), got "
                         f"{network!r}")
    name = "GPUDirect RDMA" if network == RDMA else "GPUDirect-TCPXO"
    if launcher not in NETWORK_LAUNCHERS:
        pods = POD_CREATORS.get(launcher, f"the {launcher} launcher's pods")
        instead = f"{flag} {' or '.join(NETWORK_LAUNCHERS)}"
        if launcher == "vertex":
            instead = f"a KFP backend on GKE (--target kfp) with {instead}"
        raise ValueError(f"{name}: {pods} cannot carry the GPU NICs' networks and volumes; use {instead}")
    wanted = NETWORK_ACCELERATORS[network]
    if placement.accelerator not in wanted:
        machines = " or ".join(f"{MACHINES[a]} ({a})" for a in wanted)
        raise ValueError(f"{name} runs on {machines} nodes, not on {placement.accelerator or 'CPU nodes'}")
    if placement.gpus != GPUS_PER_NODE:
        raise ValueError(f"{name}: each node takes all {GPUS_PER_NODE} GPUs of its {MACHINES[placement.accelerator]}"
                         f" machine (and with them all its GPU NICs); got {placement.gpus} GPU(s) per node")
