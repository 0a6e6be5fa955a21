"""The node pods' local disk for staged training data (components/train/staging.py): an emptyDir of the run's size
mounted where the training command's `--stage-dir` points, and the same size requested as ephemeral storage.

On a GKE node pool created with `--ephemeral-storage-local-ssd count=N` a pod's emptyDirs and ephemeral storage are
on the machine's local NVMe SSDs (https://cloud.google.com/kubernetes-engine/docs/concepts/local-ssd); A3 machines
come with them. The emptyDir's `sizeLimit` makes the kubelet evict a pod that writes more than that
(https://kubernetes.io/docs/concepts/storage/volumes/#emptydir), and the container's `ephemeral-storage` request
makes the scheduler place it on a node with that much free. Both come from the datasets' bytes
(staging.size_limit), so each node of a multi-node job gets the room to stage the run's shards itself.

A Vertex AI CustomJob has no emptyDir and no local SSD for its workers: what it offers is the boot disk's type and
size (DiskSpec: boot_disk_type pd-ssd, the default, pd-standard or hyperdisk-balanced; boot_disk_size_gb, 100 by
default: google/cloud/aiplatform/v1/machine_resources.proto). There the staging directory is on the boot disk, made
larger by the staged bytes (`vertex_boot_disk_gb`).
"""

from __future__ import annotations

import math
import re

VOLUME = "staged-data"
MOUNT_PATH = "/mnt/staged-data"  # the training command's --stage-dir on a Kubernetes node
VERTEX_STAGE_DIR = "/tmp/staged-data"  # on a Vertex AI worker: the boot disk
VERTEX_BOOT_DISK_GB = 100  # DiskSpec's default boot_disk_size_gb
EPHEMERAL_STORAGE = "ephemeral-storage"
_QUANTITY = re.compile(r"([1-9][0-9]*)(Ki|Mi|Gi|Ti)")
_UNITS = {"Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "Ti": 1 << 40}


def check_size(size_limit: str, what: str = "the local-SSD size") -> str:
    """`size_limit` if it is a whole number of Ki, Mi, Gi or Ti (what staging.size_limit writes); ValueError
    otherwise, in one line saying `what` it is."""
    if not _QUANTITY.fullmatch(size_limit):
        raise ValueError(f"{what} must be a Kubernetes quantity such as 20Gi (a whole number of Ki, Mi, "
                         f"Gi or Ti), got {size_limit!r}")
    return size_limit


def size_bytes(size_limit: str) -> int:
    number, unit = _QUANTITY.fullmatch(check_size(size_limit)).groups()
    return int(number) * _UNITS[unit]


def volumes(size_limit: str) -> list[dict]:
    """The node pod's volumes for staging: none without a size."""
    return [{"name": VOLUME, "emptyDir": {"sizeLimit": check_size(size_limit)}}] if size_limit else []


def mounts(size_limit: str) -> list[dict]:
    """The node container's mounts for staging: none without a size."""
    return [{"name": VOLUME, "mountPath": MOUNT_PATH}] if size_limit else []


def requests(size_limit: str) -> dict:
    """The node container's resource requests for staging: ephemeral storage of the emptyDir's size."""
    return {EPHEMERAL_STORAGE: check_size(size_limit)} if size_limit else {}


def vertex_boot_disk_gb(size_limit: str) -> int:
    """A Vertex AI worker's boot disk with room for the staged shards: the default 100 GB and the size, in GB."""
    return VERTEX_BOOT_DISK_GB + math.ceil(size_bytes(size_limit) / 1e9)


# The launchers whose nodes get room for staged data: the node pods they build, a Vertex AI worker's boot disk.
STAGING_LAUNCHERS = ("trainjob", "jobset", "tfjob", "pytorchjob", "vertex-job")


def check_staging(stage_data: bool, *, launcher: str, flag: str = "--train-launcher") -> None:
    """ValueError, in one line, for staging where the training pod is a pipeline step's own: its emptyDir could only
    be sized when compiling, before the data exists, and KFP sets no ephemeral-storage request."""
    if stage_data and launcher not in STAGING_LAUNCHERS:
        raise ValueError(f"train_stage_data: a pipeline step's own training pod gets no room sized from the data (an "
                         f"emptyDir's size is fixed when compiling, and KFP requests no ephemeral storage); use "
                         f"{flag} {', '.join(STAGING_LAUNCHERS)}, or the GCS FUSE file cache (--gcs-fuse-cache)")


def stage_dir(launcher: str) -> str:
    """Where the training command stages its shards under `launcher`."""
    return VERTEX_STAGE_DIR if launcher == "vertex-job" else MOUNT_PATH
