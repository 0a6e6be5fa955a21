"""GPU utilization and memory over a training run, read from NVML, whatever framework trains.

`GpuUsageSampler` reads every GPU this process can use every `interval_seconds` on a background thread:
utilization.gpu (the share of the last sample period in which a kernel ran), utilization.memory (the share in
which device memory was read or written), memory used / total and the power draw where the card reports it. It
keeps a bounded summary per GPU, for the run and for each epoch: mean, p50, p95 and max utilization (exact:
NVML reports whole percents, so a 101-bin histogram holds every sample), the seconds spent at 90% or more, the
mean and max memory used, the mean and max power, and the number of samples. `end_epoch()` closes an epoch and
hands its summary to a writer (`TensorBoardScalars`: the same tags on every framework); `stop()` returns the
run's summary for training.json's "gpu_usage".

The reader is injected (`GpuReader`): `NvmlReader` talks to the driver through `pynvml` (the `nvidia-ml-py`
package, imported when the sampler starts); tests hand the sampler a reader with scripted values. Where NVML
cannot be used (no `pynvml`, no NVIDIA driver, no GPU visible) where the framework trains on a GPU, the sampler says
once in the log why GPU utilization is not recorded and records nothing; training on the CPU asks NVML nothing and
says nothing (`start_for_training`). Nothing here ever fails training: a reader that breaks
mid-run is logged once and the samples so far are kept.

Which GPUs: those the framework sees. NVML ignores CUDA_VISIBLE_DEVICES, so `visible_devices` maps it onto
NVML's devices: UUIDs (`GPU-...`, or a unique prefix, as CUDA accepts) by UUID, indices by NVML's index, which is
the PCI bus order (CUDA's own order with CUDA_DEVICE_ORDER=PCI_BUS_ID, and on any machine of one GPU model such
as a GKE node); as CUDA does, the list ends at the first entry that names no device. Without
CUDA_VISIBLE_DEVICES, NVIDIA_VISIBLE_DEVICES (the container runtime's) is taken when it holds UUIDs; its indices
or `all` were already applied by the runtime, whose container shows NVML only those devices.

A MIG slice (a GKE node pool with a gpu-partition-size): NVML shows the container the parent GPU, whose utilization
it does not report in MIG mode (nvmlDeviceGetUtilizationRates returns NVML_ERROR_NOT_SUPPORTED on MIG-enabled GPUs,
NVML API reference), so the sampler says "not available on a MIG slice" and records nothing. It tells by the GPU's
MIG mode (nvmlDeviceGetMigMode; pynvml.py:6089-6095 and NVML_DEVICE_MIG_ENABLE at 2795, nvidia-ml-py 13.615.71) or
a MIG instance named in CUDA_VISIBLE_DEVICES or NVIDIA_VISIBLE_DEVICES.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import threading
import time
from typing import Callable, Protocol

log = logging.getLogger(__name__)

INTERVAL_SECONDS = 2.0  # NVML's own utilization period is 1/6 s to 1 s, depending on the card; a read is ~0.1 ms
BUSY_PERCENT = 90  # "seconds at 90% or more": the time the GPU was kept busy
GIB = float(1 << 30)
NVML_DEVICE_MIG_ENABLE = 1  # pynvml's, the current mode nvmlDeviceGetMigMode returns for a GPU in MIG mode
MIG_SLICE = "not available on a MIG slice (NVML does not report the utilization of a GPU in MIG mode)"


@dataclasses.dataclass(frozen=True)
class GpuDevice:
    index: int  # the framework's index (cuda:N): the position among the visible devices
    uuid: str
    name: str
    memory_total_bytes: int


@dataclasses.dataclass(frozen=True)
class GpuSample:
    utilization: int  # percent, utilization.gpu
    memory_utilization: int  # percent, utilization.memory
    memory_used_bytes: int
    power_watts: float | None = None  # None where the card does not report it


class GpuReader(Protocol):
    """What the sampler needs from NVML."""

    def devices(self) -> list[GpuDevice]: ...

    def sample(self, device: GpuDevice) -> GpuSample: ...

    def close(self) -> None: ...


class GpuUsageUnavailable(Exception):
    """GPU utilization cannot be recorded here; the message says why, for the log."""


# ---------------------------------------------------------------------------------------------- NVML


def visible_devices(nvml_uuids: list[str], environ: dict | None = None) -> list[int]:
    """The NVML indices of the GPUs the framework uses, in the framework's order (see the module docstring)."""
    environ = os.environ if environ is None else environ
    cuda = environ.get("CUDA_VISIBLE_DEVICES")
    if cuda is None:
        runtime = (environ.get("NVIDIA_VISIBLE_DEVICES") or "").strip()
        if runtime.lower() in ("none", "void"):
            return []
        if not runtime.upper().startswith(("GPU-", "MIG-")):  # all, or indices the runtime already applied
            return list(range(len(nvml_uuids)))
        cuda = runtime
    chosen: list[int] = []
    for entry in (part.strip() for part in cuda.split(",")):
        if entry.isdigit():
            found = [int(entry)] if int(entry) < len(nvml_uuids) else []
        elif entry.upper().startswith("GPU-"):
            found = [i for i, uuid in enumerate(nvml_uuids) if uuid.upper().startswith(entry.upper())]
        else:  # empty, -1, a MIG instance (NVML reports no utilization for one): CUDA stops here too
            found = []
        if len(found) != 1 or found[0] in chosen:
            break
        chosen.append(found[0])
    return chosen


class NvmlReader:
    """`GpuReader` on NVML through `pynvml`; `NvmlReader.open()` raises GpuUsageUnavailable saying why not."""

    def __init__(self, nvml, handles: list, devices: list[GpuDevice]):
        self._nvml = nvml
        self._handles = handles
        self._devices = devices
        self._power = [True] * len(devices)  # False once a card said it does not report power

    @classmethod
    def open(cls, environ: dict | None = None, nvml=None) -> "NvmlReader":
        """`nvml` is the `pynvml` module, imported here when not given."""
        if nvml is None:
            try:
                import pynvml as nvml
            except ImportError:
                raise GpuUsageUnavailable("pynvml is not installed (the nvidia-ml-py package: the gpu and torch "
                                          "extras bring it)") from None
        try:
            nvml.nvmlInit()
        except nvml.NVMLError as error:
            raise GpuUsageUnavailable(f"NVML did not start ({error}): no NVIDIA driver that this process "
                                      "can reach") from None
        try:
            if names_mig_instance(environ):
                raise GpuUsageUnavailable(MIG_SLICE)
            handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(nvml.nvmlDeviceGetCount())]
            uuids = [_text(nvml.nvmlDeviceGetUUID(handle)) for handle in handles]
            chosen = visible_devices(uuids, environ)
            if any(in_mig_mode(nvml, handles[i]) for i in chosen):
                raise GpuUsageUnavailable(MIG_SLICE)
            if not chosen:
                raise GpuUsageUnavailable(
                    f"no GPU is visible to this process (NVML sees {len(handles)}; CUDA_VISIBLE_DEVICES="
                    f"{(os.environ if environ is None else environ).get('CUDA_VISIBLE_DEVICES')!r})")
            devices = [GpuDevice(position, uuids[i], _text(nvml.nvmlDeviceGetName(handles[i])),
                                 int(nvml.nvmlDeviceGetMemoryInfo(handles[i]).total))
                       for position, i in enumerate(chosen)]
            return cls(nvml, [handles[i] for i in chosen], devices)
        except nvml.NVMLError as error:
            nvml.nvmlShutdown()
            raise GpuUsageUnavailable(f"NVML could not list the GPUs ({error})") from None
        except GpuUsageUnavailable:
            nvml.nvmlShutdown()
            raise

    def devices(self) -> list[GpuDevice]:
        return list(self._devices)

    def sample(self, device: GpuDevice) -> GpuSample:
        nvml, handle = self._nvml, self._handles[device.index]
        rates = nvml.nvmlDeviceGetUtilizationRates(handle)
        power = None
        if self._power[device.index]:
            try:
                power = nvml.nvmlDeviceGetPowerUsage(handle) / 1000.0  # milliwatts
            except nvml.NVMLError:
                self._power[device.index] = False
        return GpuSample(int(rates.gpu), int(rates.memory), int(nvml.nvmlDeviceGetMemoryInfo(handle).used), power)

    def close(self) -> None:
        self._nvml.nvmlShutdown()


def names_mig_instance(environ: dict | None = None) -> bool:
    """Whether CUDA_VISIBLE_DEVICES (or, without it, NVIDIA_VISIBLE_DEVICES) starts with a MIG instance's UUID."""
    environ = os.environ if environ is None else environ
    devices = environ.get("CUDA_VISIBLE_DEVICES")
    devices = environ.get("NVIDIA_VISIBLE_DEVICES", "") if devices is None else devices
    return devices.strip().upper().startswith("MIG-")


def in_mig_mode(nvml, handle) -> bool:
    """Whether the GPU is in MIG mode; False where NVML cannot say (a GPU without MIG answers Not Supported)."""
    try:
        return nvml.nvmlDeviceGetMigMode(handle)[0] == NVML_DEVICE_MIG_ENABLE
    except nvml.NVMLError:
        return False


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


# ---------------------------------------------------------------------------------------------- summaries


class UsageSummary:
    """Bounded statistics of one GPU's samples over a span (an epoch, the run)."""

    def __init__(self):
        self.histogram = [0] * 101  # samples per whole percent of utilization
        self.samples = 0
        self.seconds = 0.0
        self.busy_seconds = 0.0
        self.utilization_sum = self.memory_utilization_sum = 0.0
        self.memory_used_sum = self.memory_used_max = 0
        self.power_sum = 0.0
        self.power_samples = 0
        self.power_max = 0.0

    def add(self, sample: GpuSample, seconds: float) -> None:
        utilization = min(100, max(0, int(sample.utilization)))
        self.histogram[utilization] += 1
        self.samples += 1
        self.seconds += seconds
        if utilization >= BUSY_PERCENT:
            self.busy_seconds += seconds
        self.utilization_sum += utilization
        self.memory_utilization_sum += sample.memory_utilization
        self.memory_used_sum += sample.memory_used_bytes
        self.memory_used_max = max(self.memory_used_max, sample.memory_used_bytes)
        if sample.power_watts is not None:
            self.power_sum += sample.power_watts
            self.power_samples += 1
            self.power_max = max(self.power_max, sample.power_watts)

    def percentile(self, share: float) -> int:
        """The nearest-rank percentile of the utilization samples (whole percents, exact)."""
        rank, seen = max(1, math.ceil(share * self.samples)), 0
        for percent, count in enumerate(self.histogram):
            seen += count
            if seen >= rank:
                return percent
        return 100

    def to_json(self) -> dict:
        if not self.samples:
            return {"samples": 0}
        summary = {
            "samples": self.samples, "seconds": round(self.seconds, 1),
            "utilization_mean": round(self.utilization_sum / self.samples, 1),
            "utilization_p50": self.percentile(0.50), "utilization_p95": self.percentile(0.95),
            "utilization_max": max(p for p, count in enumerate(self.histogram) if count),
            f"seconds_at_least_{BUSY_PERCENT}": round(self.busy_seconds, 1),
            "memory_utilization_mean": round(self.memory_utilization_sum / self.samples, 1),
            "memory_used_gib_mean": round(self.memory_used_sum / self.samples / GIB, 3),
            "memory_used_gib_max": round(self.memory_used_max / GIB, 3),
        }
        if self.power_samples:
            summary["power_watts_mean"] = round(self.power_sum / self.power_samples, 1)
            summary["power_watts_max"] = round(self.power_max, 1)
        return summary


# ---------------------------------------------------------------------------------------------- the sampler


class GpuUsageSampler:
    """Samples the GPUs while training runs; see the module docstring.

    `reader_factory()` returns a GpuReader or raises GpuUsageUnavailable (default: `NvmlReader.open`).
    `writer`, when given, gets `write(step, devices, summaries)` at each `end_epoch` and `close()` at the stop
    (TensorBoardScalars).
    `clock` is injectable so that tests can give each sample its duration.
    """

    def __init__(self, reader_factory: Callable[[], GpuReader] = NvmlReader.open, *,
                 interval_seconds: float = INTERVAL_SECONDS, writer=None,
                 clock: Callable[[], float] = time.monotonic):
        if interval_seconds <= 0:
            raise ValueError(f"interval_seconds must be positive, not {interval_seconds}")
        self.reader_factory = reader_factory
        self.interval_seconds = interval_seconds
        self.writer = writer
        self.clock = clock
        self.reader: GpuReader | None = None
        self.devices: list[GpuDevice] = []
        self.reason = ""  # why nothing is recorded, when nothing is
        self.run = {}
        self.epoch = {}
        self.epochs: list[dict] = []  # {"epoch", "step", "gpus": {index: summary}}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._last = 0.0

    def open(self) -> bool:
        """Opens the reader without starting the thread (start() calls it); False, logged once, when it cannot."""
        try:
            reader = self.reader_factory()
            devices = reader.devices()
        except GpuUsageUnavailable as why:
            self.reason = str(why)
            log.info("train: GPU utilization is not recorded: %s", self.reason)
            return False
        except Exception as error:  # a reader that breaks in its own way: still no reason to stop training
            self.reason = f"reading the GPUs failed ({type(error).__name__}: {error})"
            log.warning("train: GPU utilization is not recorded: %s", self.reason)
            return False
        if not devices:
            _close(reader)
            self.reason = "no GPU is visible to this process"
            log.info("train: GPU utilization is not recorded: %s", self.reason)
            return False
        self.reader, self.devices = reader, devices
        self.run = {d.index: UsageSummary() for d in devices}
        self.epoch = {d.index: UsageSummary() for d in devices}
        self._last = self.clock()
        log.info("train: recording GPU utilization every %gs: %s", self.interval_seconds,
                 ", ".join(f"GPU {d.index} {d.name} ({d.memory_total_bytes / GIB:.0f} GiB)" for d in devices))
        return True

    def start(self) -> "GpuUsageSampler":
        if self.open():
            self._thread = threading.Thread(target=self._loop, name="gpu-usage", daemon=True)
            self._thread.start()
        return self

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_seconds):
            self.sample_once()

    def sample_once(self) -> None:
        """One sample of every GPU, counted for the time since the previous one."""
        reader = self.reader
        if reader is None:
            return
        try:
            samples = [(d.index, reader.sample(d)) for d in self.devices]
        except Exception as error:  # monitoring must never fail training: say so once, keep what was recorded
            with self._lock:
                first, self.reader = self.reader is reader, None  # the thread and end_epoch may both sample
            if first:
                log.warning("train: GPU utilization: reading NVML failed (%s: %s); no more samples this run",
                            type(error).__name__, error)
                self.reason = f"reading NVML failed mid-run: {error}"
                _close(reader)
            return
        now = self.clock()
        with self._lock:
            seconds, self._last = max(0.0, now - self._last), now
            for index, sample in samples:
                self.run[index].add(sample, seconds)
                self.epoch[index].add(sample, seconds)

    def end_epoch(self, epoch: int, step: int) -> dict | None:
        """Samples once more and closes epoch `epoch` (from 0) at global step `step`: its summary per GPU, logged
        and handed to the writer; None when nothing is recorded."""
        if not self.run:
            return None
        self.sample_once()  # the epoch's last moments, and a sample for an epoch shorter than the interval
        with self._lock:
            closed, self.epoch = self.epoch, {d.index: UsageSummary() for d in self.devices}
        entry = {"epoch": epoch + 1, "step": step, "gpus": {index: s.to_json() for index, s in closed.items()}}
        self.epochs.append(entry)
        line = describe(self.devices, entry["gpus"])
        if line:
            log.info("epoch %d %s", epoch + 1, line)
        if self.writer is not None:
            try:
                self.writer.write(step, self.devices, entry["gpus"])
            except Exception as error:  # TensorBoard is a view: a full disk there must not stop training
                log.warning("train: GPU utilization: writing TensorBoard failed (%s); not written again", error)
                self.writer = None
        return entry

    def stop(self) -> dict:
        """Stops sampling (idempotent) and returns the run's summary, training.json's "gpu_usage"."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.interval_seconds + 5)
            self._thread = None
        self._close_reader()
        if self.writer is not None:
            try:
                self.writer.close()
            except Exception as error:
                log.warning("train: GPU utilization: closing TensorBoard failed (%s)", error)
            self.writer = None
        return self.summary()

    def __enter__(self) -> "GpuUsageSampler":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def _close_reader(self) -> None:
        with self._lock:
            reader, self.reader = self.reader, None
        if reader is not None:
            _close(reader)

    def summary(self) -> dict:
        if not self.run:
            return {"recorded": False, "reason": self.reason}
        with self._lock:
            return {"recorded": True, "interval_seconds": self.interval_seconds, "busy_percent": BUSY_PERCENT,
                    **({"stopped_early": self.reason} if self.reason else {}),
                    "gpus": [{"index": d.index, "uuid": d.uuid, "name": d.name,
                              "memory_total_gib": round(d.memory_total_bytes / GIB, 2),
                              "run": self.run[d.index].to_json(),
                              "epochs": [{"epoch": e["epoch"], **e["gpus"][d.index]} for e in self.epochs]}
                             for d in self.devices]}


def _close(reader: GpuReader) -> None:
    try:
        reader.close()
    except Exception as error:  # nothing left to record: a failed shutdown only needs saying
        log.warning("train: GPU utilization: closing NVML failed (%s)", error)


def describe(devices: list[GpuDevice], summaries: dict) -> str:
    """One line: "GPU 0: mean 87% (p95 99%), memory 12.1/80 GiB; GPU 1: ..."; "" without samples."""
    parts = []
    for device in devices:
        s = summaries.get(device.index) or {}
        if s.get("samples"):
            parts.append(f"GPU {device.index}: mean {s['utilization_mean']:.0f}% (p95 {s['utilization_p95']}%), "
                         f"memory {s['memory_used_gib_max']:.1f}/{device.memory_total_bytes / GIB:.0f} GiB")
    return "; ".join(parts)


def describe_summary(gpu_usage: dict | None) -> str:
    """The run's line from training.json's "gpu_usage" (for the console and the run page)."""
    if not gpu_usage:
        return ""
    if not gpu_usage.get("recorded"):
        return f"GPU utilization not recorded: {gpu_usage.get('reason') or 'unknown reason'}"
    devices = [GpuDevice(g["index"], g.get("uuid", ""), g.get("name", ""), int(g["memory_total_gib"] * GIB))
               for g in gpu_usage.get("gpus", [])]
    return describe(devices, {g["index"]: g["run"] for g in gpu_usage.get("gpus", [])})


# ---------------------------------------------------------------------------------------------- TensorBoard


class TensorBoardScalars:
    """Each epoch's GPU summary as TensorBoard scalars, without TensorFlow: `tensorboard.summary.Writer` writes
    the event files itself (with TensorFlow installed it goes through tf.io.gfile, so gs:// works; without,
    through TensorBoard's own file layer). The events go to `<logdir>/gpu`, a run of their own beside the
    framework's (one writer per directory: TensorBoard reads the files of a directory one after the other).

    Tags, per GPU N: gpu/N/utilization (mean %), gpu/N/utilization_p95, gpu/N/memory_utilization (mean %),
    gpu/N/memory_used_gib (max), gpu/N/power_watts (mean, where reported); the step is the global step, as the
    epoch_* scalars'.
    """

    SUBDIR = "gpu"

    def __init__(self, logdir: str):
        self.logdir = logdir.rstrip("/") + "/" + self.SUBDIR
        self._writer = None

    def write(self, step: int, devices: list[GpuDevice], summaries: dict) -> None:
        if self._writer is None:
            from tensorboard.summary import Writer

            self._writer = Writer(self.logdir)
        for device in devices:
            s = summaries.get(device.index) or {}
            if not s.get("samples"):
                continue
            prefix = f"gpu/{device.index}/"
            for tag, key in (("utilization", "utilization_mean"), ("utilization_p95", "utilization_p95"),
                             ("memory_utilization", "memory_utilization_mean"),
                             ("memory_used_gib", "memory_used_gib_max"), ("power_watts", "power_watts_mean")):
                if key in s:
                    self._writer.add_scalar(prefix + tag, s[key], step)
        self._writer.flush()

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None


ON_THE_CPU = "trained on the CPU"  # the reason recorded where the framework was given no GPU


def start_for_training(tensorboard_dir: str | None, *, chief: bool, gpus: int = 1,
                       reader_factory: Callable[[], GpuReader] = NvmlReader.open,
                       interval_seconds: float = INTERVAL_SECONDS) -> GpuUsageSampler:
    """The sampler a training loop starts: on the chief, with TensorBoard scalars when it writes TensorBoard logs;
    on the other workers an idle one (only the chief records, as it alone writes logs and training.json). `gpus`
    is how many GPUs the framework trains on: with none (a CPU machine, a local run) nothing is expected, so NVML
    is not asked and the log says nothing; training.json records ON_THE_CPU as the reason."""
    if not chief or gpus < 1:
        sampler = GpuUsageSampler(reader_factory, interval_seconds=interval_seconds)
        sampler.reason = ON_THE_CPU if chief else "recorded by the chief only"
        return sampler
    writer = TensorBoardScalars(tensorboard_dir) if tensorboard_dir else None
    return GpuUsageSampler(reader_factory, interval_seconds=interval_seconds, writer=writer).start()
