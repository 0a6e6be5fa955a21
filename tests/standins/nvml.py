"""A stand-in for the `pynvml` module (PyPI's nvidia-ml-py), holding GPUs whose readings a test sets.

Source: it follows pynvml.py of nvidia-ml-py 13.615.71 (the wheel's single module), for the calls
components/train/gpu_usage.py makes:
- `nvmlInit()` raises an NVMLError subclass when the library or driver is missing (`_LoadNvmlLibrary`,
  `NVML_ERROR_LIBRARY_NOT_FOUND` = 12 at line 235, "NVML Shared Library Not Found": the messages at 1037-1061);
  `nvmlShutdown()` undoes it.
- `nvmlDeviceGetCount()`, `nvmlDeviceGetHandleByIndex(i)` enumerate the devices NVML sees, in PCI bus order; NVML
  does not read CUDA_VISIBLE_DEVICES.
- `nvmlDeviceGetUUID` and `nvmlDeviceGetName` return str (`@convertStrBytes`, lines 3428-3431 and 3585-3588).
- `nvmlDeviceGetUtilizationRates` returns a `c_nvmlUtilization_t` with `gpu` and `memory` in whole percents (line
  1500); `nvmlDeviceGetMemoryInfo` (version None: v1) a `c_nvmlMemory_t` with `total`, `free`, `used` in bytes
  (lines 1386 and 3993).
- `nvmlDeviceGetPowerUsage` returns milliwatts as an int (line 3962) and raises NVMLError_NotSupported (code 3)
  on a card that does not report its power.
- `nvmlSystemGetDriverVersion()` returns the driver's version as str ("580.95.05": `@convertStrBytes`, lines
  3255-3261), what components/gpu_driver.py reads.
- `nvmlDeviceGetMigMode(handle)` returns `[current, pending]` (lines 6089-6095; NVML_DEVICE_MIG_ENABLE = 1 at
  2795); on a GPU in MIG mode `nvmlDeviceGetUtilizationRates` raises NVMLError_NotSupported (the NVML API reference:
  "On MIG-enabled GPUs, querying device utilization rates is not currently supported"), and a GPU without MIG
  answers the mode query with NVMLError_NotSupported.
- `NVMLError(value)`: `str()` is the code's text; `NVMLError(3)` is an `NVMLError_NotSupported` (`__new__` at lines
  1062-1071 and the classes `_extractNVMLErrorsAsClasses` makes, 1087-1110).
"""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_GPU_IS_LOST = 15
MESSAGES = {NVML_ERROR_UNINITIALIZED: "Uninitialized", NVML_ERROR_NOT_SUPPORTED: "Not Supported",
            NVML_ERROR_LIBRARY_NOT_FOUND: "NVML Shared Library Not Found", NVML_ERROR_GPU_IS_LOST: "GPU is lost"}


class NVMLError(Exception):
    def __new__(cls, value):
        subclass = {NVML_ERROR_NOT_SUPPORTED: NVMLError_NotSupported,
                    NVML_ERROR_LIBRARY_NOT_FOUND: NVMLError_LibraryNotFound,
                    NVML_ERROR_GPU_IS_LOST: NVMLError_GpuIsLost}.get(value, cls)
        return Exception.__new__(subclass)

    def __init__(self, value):
        self.value = value

    def __str__(self):
        return MESSAGES.get(self.value, f"Unknown Error {self.value}")


class NVMLError_NotSupported(NVMLError):  # noqa: N801 (pynvml's names)
    pass


class NVMLError_LibraryNotFound(NVMLError):  # noqa: N801
    pass


class NVMLError_GpuIsLost(NVMLError):  # noqa: N801
    pass


@dataclasses.dataclass
class Gpu:
    uuid: str
    name: str
    memory_total: int
    utilization: int = 0
    memory_utilization: int = 0
    memory_used: int = 0
    power_milliwatts: int | None = None  # None: the card does not report it
    lost: bool = False
    mig: bool | None = False  # in MIG mode; None: a GPU without MIG (a T4, an L4)


class NvmlStandIn:
    """Pass it where gpu_usage takes the `pynvml` module; `gpus` are in NVML's (PCI bus) order."""

    NVMLError = NVMLError

    def __init__(self, gpus: list[Gpu], *, library: bool = True, driver_version: str = "580.95.05"):
        self.gpus = gpus
        self.library = library
        self.driver_version = driver_version
        self.initialized = 0  # nvmlInit minus nvmlShutdown
        self.power_reads = 0

    def nvmlInit(self):
        if not self.library:
            raise NVMLError(NVML_ERROR_LIBRARY_NOT_FOUND)
        self.initialized += 1

    def nvmlShutdown(self):
        self.initialized -= 1

    def nvmlSystemGetDriverVersion(self):
        if self.initialized < 1:
            raise NVMLError(NVML_ERROR_UNINITIALIZED)
        return self.driver_version

    def nvmlDeviceGetCount(self):
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index):
        return self.gpus[index]

    def nvmlDeviceGetUUID(self, handle):
        return handle.uuid

    def nvmlDeviceGetName(self, handle):
        return handle.name

    def _check(self, handle):
        if handle.lost:
            raise NVMLError(NVML_ERROR_GPU_IS_LOST)

    def nvmlDeviceGetMigMode(self, handle):
        self._check(handle)
        if handle.mig is None:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        mode = 1 if handle.mig else 0
        return [mode, mode]

    def nvmlDeviceGetUtilizationRates(self, handle):
        self._check(handle)
        if handle.mig:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return SimpleNamespace(gpu=handle.utilization, memory=handle.memory_utilization)

    def nvmlDeviceGetMemoryInfo(self, handle, version=None):
        self._check(handle)
        return SimpleNamespace(total=handle.memory_total, free=handle.memory_total - handle.memory_used,
                               used=handle.memory_used)

    def nvmlDeviceGetPowerUsage(self, handle):
        self._check(handle)
        self.power_reads += 1
        if handle.power_milliwatts is None:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return handle.power_milliwatts
