"""Is the GPU node's NVIDIA driver new enough for the CUDA this process's framework was built for?

A framework built for a newer CUDA than the node's driver supports does not fail: it sees no GPU, logs a warning
deep in its start-up, and the step trains or predicts on the node's CPU, or fails later with a message that names
neither the driver nor the fix. The image for PyTorch and JAX (target torch) is built for CUDA 13, which needs
driver 580 or newer; GKE's `default` driver has been the older R535 branch (rapidsai/deployment#656). So the
training and prediction steps read the driver's version through NVML before the framework touches the GPU, and
stop in one line naming the driver, the minimum and the node pool flag that fixes it (`check_driver`).

The minimum per CUDA major release is NVIDIA's: CUDA 11.x needs >= 450, 12.x >= 525, 13.x >= 580 (CUDA
Compatibility guide, "Minor Version Compatibility", Table 1, docs.nvidia.com/deploy/cuda-compatibility). The
framework says what it was built for (torch.version.cuda, JAX's CUDA plugin, TensorFlow's build info), as
images/gpu_libs.py reads it at build time. Where NVML cannot be reached (no pynvml, no driver: a CPU machine or a
pod without a GPU) nothing is checked: the framework then finds no GPU either, and `check_gpus_visible` in
components/train/model.py says so where the pod was given one.

The version reader is injected (`read_version`); `nvml_driver_version` is the real one, on the `pynvml` module
(nvidia-ml-py, in the gpu and torch extras) or a stand-in passed as `nvml`.
"""

from __future__ import annotations

import logging
from typing import Callable

from components.stepcli import EXIT_PERMANENT

log = logging.getLogger(__name__)

# The oldest driver branch each CUDA major release runs on (NVIDIA's minor version compatibility table).
MINIMUM_DRIVER = {11: 450, 12: 525, 13: 580}
# How GKE installs a driver new enough: the node pool's accelerator flag (docs/cluster-setup.md, step 2).
NODE_POOL_FLAG = "--accelerator type=...,count=...,gpu-driver-version=latest"


class DriverTooOld(RuntimeError):
    """The node's driver is older than the framework's CUDA needs; the message is one line saying what to do. A
    retry on the same node pool cannot help: the step exits EXIT_PERMANENT (components/stepcli.py)."""

    exit_code = EXIT_PERMANENT


def nvml_driver_version(nvml=None) -> str | None:
    """The NVIDIA driver's version as NVML reports it ("580.95.05"), or None where NVML cannot be reached. `nvml` is
    the `pynvml` module, imported here when not given (nvmlSystemGetDriverVersion returns str: pynvml.py of
    nvidia-ml-py 13.615.71, lines 3255-3261)."""
    if nvml is None:
        try:
            import pynvml as nvml
        except ImportError:
            return None
    try:
        nvml.nvmlInit()
    except nvml.NVMLError:
        return None
    try:
        version = nvml.nvmlSystemGetDriverVersion()
    except nvml.NVMLError:
        return None
    finally:
        nvml.nvmlShutdown()
    return version.decode() if isinstance(version, bytes) else str(version)


def minimum_driver(cuda_version: str) -> int | None:
    """The oldest driver branch that runs CUDA `cuda_version` ("13.0", "12.5.1"); None for a release not listed."""
    try:
        return MINIMUM_DRIVER.get(int(str(cuda_version).split(".")[0]))
    except ValueError:
        return None


def check_driver(cuda_version: str | None, *, framework: str,
                 read_version: Callable[[], str | None] = nvml_driver_version) -> str | None:
    """Raises DriverTooOld when the node's driver cannot run `framework`'s CUDA `cuda_version` (None: a CPU build,
    nothing to check); returns the driver's version, or None where there is none to read."""
    if not cuda_version:
        return None
    minimum = minimum_driver(cuda_version)
    found = read_version()
    if minimum is None or not found:
        return found
    try:
        branch = int(found.split(".")[0])
    except ValueError:
        return found  # a version NVML wrote in a form we do not know: the framework will say what it makes of it
    if branch < minimum:
        raise DriverTooOld(
            f"The GPU node's NVIDIA driver is {found}, and {framework} here is built for CUDA {cuda_version}, "
            f"which needs driver {minimum} or newer: on GKE, create the GPU node pool with {NODE_POOL_FLAG} "
            "(docs/cluster-setup.md, step 2)")
    log.info("NVIDIA driver %s: %s is built for CUDA %s, which needs %d or newer", found, framework, cuda_version,
             minimum)
    return found
