"""GPU utilization over training (components/train/gpu_usage.py): the summaries from a reader with scripted
values (the sampler's seam, as a real NVML reader is on a GPU machine), the epoch boundaries, the TensorBoard
scalars read back with TensorBoard's own EventAccumulator, training.json, the KFP metrics, the console line and
the run page; and on this machine, which has no NVML, a real training run that says once why nothing is recorded."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from components.train import gpu_usage
from components.train.gpu_usage import (GIB, GpuDevice, GpuSample, GpuUsageSampler, GpuUsageUnavailable,
                                        TensorBoardScalars, visible_devices)
from tests.conftest import REPO_ROOT

H100 = GpuDevice(0, "GPU-11111111-2222-3333-4444-555555555555", "NVIDIA H100 80GB HBM3", 80 * (1 << 30))
L4 = GpuDevice(1, "GPU-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee", "NVIDIA L4", 24 * (1 << 30))


class ScriptedReader:
    """A GpuReader that returns the next scripted sample of each device, then raises `then` if given."""

    def __init__(self, script: dict[int, list[GpuSample]], devices=(H100,), then: Exception | None = None):
        self._devices = list(devices)
        self.script = {index: list(samples) for index, samples in script.items()}
        self.then = then
        self.closed = 0
        self.lock = threading.Lock()

    def devices(self):
        return list(self._devices)

    def sample(self, device):
        with self.lock:
            if not self.script[device.index]:
                if self.then is not None:
                    raise self.then
                return GpuSample(0, 0, 0)
            return self.script[device.index].pop(0)

    def close(self):
        self.closed += 1


class Clock:
    """Monotonic time that moves only when told."""

    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def sample(utilization, memory_gib=10.0, power=None, memory_utilization=None):
    return GpuSample(utilization, utilization // 2 if memory_utilization is None else memory_utilization,
                     int(memory_gib * GIB), power)


def nearest_rank(values, share):
    return int(np.percentile(values, 100 * share, method="inverted_cdf"))


# ---------------------------------------------------------------------------------------------- summaries


def test_the_run_summary_is_right_for_scripted_samples():
    utilizations = [0, 12, 55, 89, 90, 91, 97, 99, 100, 100, 64, 93, 88, 100, 71, 95, 98, 99, 40, 92]
    memory = [4.0 + i / 2 for i in range(len(utilizations))]
    power = [100.0 + 10 * i for i in range(len(utilizations))]
    seconds = [2.0, 1.5, 2.5, 2.0, 3.0] * 4  # each sample counts for the time since the previous one
    clock = Clock()
    reader = ScriptedReader({0: [sample(u, m, p) for u, m, p in zip(utilizations, memory, power)]})
    sampler = GpuUsageSampler(lambda: reader, interval_seconds=2.0, clock=clock)
    assert sampler.open()
    for duration in seconds:
        clock.now += duration
        sampler.sample_once()
    usage = sampler.stop()
    assert reader.closed == 1
    run = usage["gpus"][0]["run"]
    assert usage["recorded"] and usage["interval_seconds"] == 2.0
    assert usage["gpus"][0] | {"run": None, "epochs": None} == {
        "index": 0, "uuid": H100.uuid, "name": H100.name, "memory_total_gib": 80.0, "run": None, "epochs": None}
    assert run["samples"] == 20
    assert run["seconds"] == pytest.approx(sum(seconds))
    assert run["utilization_mean"] == pytest.approx(np.mean(utilizations), abs=0.05)
    assert run["utilization_p50"] == nearest_rank(utilizations, 0.5) == 91
    assert run["utilization_p95"] == nearest_rank(utilizations, 0.95) == 100
    assert run["utilization_max"] == 100
    busy = sum(s for u, s in zip(utilizations, seconds) if u >= 90)
    assert run["seconds_at_least_90"] == pytest.approx(busy)
    assert run["memory_utilization_mean"] == pytest.approx(np.mean([u // 2 for u in utilizations]), abs=0.05)
    assert run["memory_used_gib_max"] == pytest.approx(max(memory))
    assert run["memory_used_gib_mean"] == pytest.approx(np.mean(memory), abs=1e-3)
    assert run["power_watts_mean"] == pytest.approx(np.mean(power), abs=0.05)
    assert run["power_watts_max"] == max(power)
    json.dumps(usage)  # training.json takes it as it is


def test_the_summary_stays_bounded_and_exact_over_many_samples():
    rng = np.random.default_rng(7)
    utilizations = rng.integers(0, 101, 50_000).tolist()
    reader = ScriptedReader({0: [sample(u) for u in utilizations]})
    sampler = GpuUsageSampler(lambda: reader, clock=Clock())
    sampler.open()
    for _ in utilizations:
        sampler.sample_once()
    summary = sampler.run[0]
    assert len(summary.histogram) == 101  # the same size after 50,000 samples
    run = summary.to_json()
    assert run["samples"] == 50_000
    assert (run["utilization_p50"], run["utilization_p95"]) == (nearest_rank(utilizations, 0.5),
                                                                nearest_rank(utilizations, 0.95))
    assert "power_watts_mean" not in run  # none of the samples reported power


def test_epochs_take_the_samples_between_their_boundaries():
    clock = Clock()
    first, second = [50, 60, 70], [95, 100]
    reader = ScriptedReader({0: [sample(u) for u in first + [80] + second + [90]],
                             1: [sample(u, 2.0) for u in first + [80] + second + [90]]}, devices=(H100, L4))
    sampler = GpuUsageSampler(lambda: reader, interval_seconds=1.0, clock=clock)
    sampler.open()
    for _ in first:
        clock.now += 1
        sampler.sample_once()
    clock.now += 0.5
    one = sampler.end_epoch(0, step=10)  # samples once more: 80, for the epoch's last half second
    for _ in second:
        clock.now += 1
        sampler.sample_once()
    clock.now += 0.25
    two = sampler.end_epoch(1, step=20)
    usage = sampler.stop()
    assert (one["epoch"], one["step"], two["epoch"], two["step"]) == (1, 10, 2, 20)
    assert one["gpus"][0]["samples"] == 4 and one["gpus"][0]["seconds"] == pytest.approx(3.5)
    assert one["gpus"][0]["utilization_mean"] == pytest.approx(np.mean(first + [80]))
    assert two["gpus"][0]["samples"] == 3 and two["gpus"][0]["seconds"] == pytest.approx(2.2, abs=0.06)
    assert two["gpus"][0]["utilization_mean"] == pytest.approx(np.mean(second + [90]), abs=0.05)
    assert two["gpus"][0]["seconds_at_least_90"] == pytest.approx(2.2, abs=0.06)
    assert one["gpus"][1]["memory_used_gib_max"] == 2.0
    gpus = usage["gpus"]
    assert [g["index"] for g in gpus] == [0, 1] and gpus[1]["name"] == "NVIDIA L4"
    assert [e["epoch"] for e in gpus[0]["epochs"]] == [1, 2]
    assert gpus[0]["epochs"][1]["utilization_mean"] == two["gpus"][0]["utilization_mean"]
    assert gpus[0]["run"]["samples"] == 7
    assert gpus[0]["run"]["utilization_mean"] == pytest.approx(np.mean(first + [80] + second + [90]), abs=0.05)


def test_an_epoch_shorter_than_the_interval_still_gets_a_sample():
    reader = ScriptedReader({0: [sample(77)]})
    sampler = GpuUsageSampler(lambda: reader, interval_seconds=60.0).start()
    entry = sampler.end_epoch(0, step=3)
    sampler.stop()
    assert entry["gpus"][0]["samples"] == 1 and entry["gpus"][0]["utilization_mean"] == 77


def test_the_thread_samples_every_interval_and_stops():
    reader = ScriptedReader({0: [sample(88)] * 10_000})
    sampler = GpuUsageSampler(lambda: reader, interval_seconds=0.01).start()
    deadline = time.monotonic() + 10
    while sampler.run[0].samples < 5 and time.monotonic() < deadline:
        time.sleep(0.01)
    usage = sampler.stop()
    assert usage["gpus"][0]["run"]["samples"] >= 5
    assert not any(t.name == "gpu-usage" for t in threading.enumerate())
    assert reader.closed == 1
    assert sampler.stop() == usage  # idempotent: nothing sampled after the stop


def test_the_epoch_line_reads_as_the_console_shows_it(caplog):
    reader = ScriptedReader({0: [sample(80, 12.1), sample(99, 12.1), sample(82, 12.1)]})
    sampler = GpuUsageSampler(lambda: reader, clock=Clock())
    sampler.open()
    sampler.sample_once()
    sampler.sample_once()
    with caplog.at_level(logging.INFO, logger=gpu_usage.__name__):
        sampler.end_epoch(2, step=30)
    assert "epoch 3 GPU 0: mean 87% (p95 99%), memory 12.1/80 GiB" in caplog.messages
    assert gpu_usage.describe_summary(sampler.stop()) == "GPU 0: mean 87% (p95 99%), memory 12.1/80 GiB"


# ---------------------------------------------------------------------------------------------- TensorBoard


def test_tensorboard_scalars_are_written_without_tensorflow_and_read_back(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.util import tensor_util

    reader = ScriptedReader({0: [sample(u, 10.0 + u / 10, power=300.0) for u in (40, 60, 90, 100)],
                             1: [sample(u, 3.0) for u in (10, 20, 30, 40)]}, devices=(H100, L4))
    sampler = GpuUsageSampler(lambda: reader, clock=Clock(), writer=TensorBoardScalars(str(tmp_path)))
    sampler.open()
    sampler.sample_once()
    sampler.end_epoch(0, step=16)  # 40, 60
    sampler.sample_once()
    sampler.end_epoch(1, step=32)  # 90, 100
    sampler.stop()

    events = EventAccumulator(str(tmp_path / "gpu"))
    events.Reload()
    tags = set(events.Tags()["tensors"])
    assert tags == {f"gpu/0/{name}" for name in ("utilization", "utilization_p95", "memory_utilization",
                                                 "memory_used_gib", "power_watts")} | {
        f"gpu/1/{name}" for name in ("utilization", "utilization_p95", "memory_utilization", "memory_used_gib")}

    def series(tag):
        return [(e.step, round(float(tensor_util.make_ndarray(e.tensor_proto)), 3)) for e in events.Tensors(tag)]

    assert series("gpu/0/utilization") == [(16, 50.0), (32, 95.0)]
    assert series("gpu/0/utilization_p95") == [(16, 60.0), (32, 100.0)]
    assert series("gpu/0/memory_used_gib") == [(16, 16.0), (32, 20.0)]
    assert series("gpu/0/power_watts") == [(16, 300.0), (32, 300.0)]
    assert series("gpu/1/utilization") == [(16, 15.0), (32, 35.0)]
    assert events.SummaryMetadata("gpu/0/utilization").plugin_data.plugin_name == "scalars"


# ---------------------------------------------------------------------------------------------- no NVML


def test_where_nvml_is_missing_it_says_why_once_and_records_nothing(tmp_path, caplog):
    def unavailable():
        raise GpuUsageUnavailable("NVML did not start (NVML Shared Library Not Found): no NVIDIA driver")

    with caplog.at_level(logging.INFO, logger=gpu_usage.__name__):
        sampler = GpuUsageSampler(unavailable, writer=TensorBoardScalars(str(tmp_path))).start()
        for epoch in range(3):
            assert sampler.end_epoch(epoch, step=epoch) is None
        usage = sampler.stop()
    assert usage == {"recorded": False, "reason": "NVML did not start (NVML Shared Library Not Found): "
                                                  "no NVIDIA driver"}
    assert [m for m in caplog.messages if "GPU utilization" in m] == [
        "train: GPU utilization is not recorded: " + usage["reason"]]
    assert not (tmp_path / "gpu").exists()


def test_a_reader_that_breaks_mid_run_keeps_what_it_had_and_training_goes_on(caplog):
    reader = ScriptedReader({0: [sample(70), sample(90)]}, then=RuntimeError("GPU is lost"))
    sampler = GpuUsageSampler(lambda: reader, clock=Clock())
    sampler.open()
    with caplog.at_level(logging.WARNING, logger=gpu_usage.__name__):
        for _ in range(5):
            sampler.sample_once()
        entry = sampler.end_epoch(0, step=1)
    usage = sampler.stop()
    assert entry["gpus"][0]["samples"] == 2
    assert usage["gpus"][0]["run"]["samples"] == 2 and "GPU is lost" in usage["stopped_early"]
    assert len([m for m in caplog.messages if "reading NVML failed" in m]) == 1
    assert reader.closed == 1


def test_the_real_nvml_reader_says_why_it_cannot_run_here():
    try:
        import pynvml  # noqa: F401
        expected = "NVML did not start"
    except ImportError:
        expected = "pynvml is not installed"
    with pytest.raises(GpuUsageUnavailable, match=expected):
        gpu_usage.NvmlReader.open()


# ---------------------------------------------------------------------------------------------- which GPUs


UUIDS = ["GPU-aa11", "GPU-bb22", "GPU-cc33", "GPU-cd44"]


@pytest.mark.parametrize("environ, expected", [
    ({}, [0, 1, 2, 3]),
    ({"CUDA_VISIBLE_DEVICES": "2,0"}, [2, 0]),  # the framework's cuda:0 is NVML's 2
    ({"CUDA_VISIBLE_DEVICES": ""}, []),
    ({"CUDA_VISIBLE_DEVICES": "1,7,2"}, [1]),  # CUDA stops at the first entry that names no device
    ({"CUDA_VISIBLE_DEVICES": "0,-1,1"}, [0]),
    ({"CUDA_VISIBLE_DEVICES": "GPU-bb22,GPU-aa"}, [1, 0]),  # a unique prefix is enough
    ({"CUDA_VISIBLE_DEVICES": "GPU-c"}, []),  # ambiguous
    ({"CUDA_VISIBLE_DEVICES": "1,1"}, [1]),
    ({"CUDA_VISIBLE_DEVICES": "MIG-0f0f0f0f"}, []),  # NVML has no utilization for a MIG instance
    ({"NVIDIA_VISIBLE_DEVICES": "all"}, [0, 1, 2, 3]),
    ({"NVIDIA_VISIBLE_DEVICES": "3"}, [0, 1, 2, 3]),  # applied by the runtime: NVML sees only those
    ({"NVIDIA_VISIBLE_DEVICES": "GPU-cd44"}, [3]),
    ({"NVIDIA_VISIBLE_DEVICES": "none"}, []),
    ({"NVIDIA_VISIBLE_DEVICES": "GPU-cd44", "CUDA_VISIBLE_DEVICES": "0"}, [0]),  # CUDA's wins
])
def test_visible_devices_follow_what_the_framework_sees(environ, expected):
    assert visible_devices(UUIDS, environ) == expected


# ---------------------------------------------------------------------------------------------- KFP, the page


def recorded_usage() -> dict:
    reader = ScriptedReader({0: [sample(u, 12.1, power=350.0) for u in (80, 99, 82, 95, 97)]})
    clock = Clock()
    sampler = GpuUsageSampler(lambda: reader, clock=clock)
    sampler.open()
    for epoch in range(2):
        clock.now += 2
        sampler.sample_once()
        clock.now += 2
        sampler.end_epoch(epoch, step=10 * (epoch + 1))
    clock.now += 2
    sampler.sample_once()
    return sampler.stop()


def test_the_kfp_metrics_and_the_steps_console_line_carry_it(tmp_path):
    from kfp import dsl

    from components.train.results import log_to_kfp
    from pipelines.local.steplogs import key_figures

    info = {"history": {"loss": [0.5, 0.4]}, "train_seconds": 12.0, "images_per_second": 900.0, "steps": 20,
            "resumed_from_step": 0, "exported_epoch": 2, "strategy": "default", "replicas": 1, "workers": 1,
            "global_batch_size": 128, "gpu_usage": recorded_usage()}
    metrics = dsl.Metrics(name="metrics", uri=str(tmp_path / "metrics"), metadata={})
    model = dsl.Model(name="model", uri=str(tmp_path / "model"), metadata={})
    log_to_kfp(info, metrics, model)
    assert metrics.metadata["gpu0_utilization_mean"] == pytest.approx(90.6)
    assert metrics.metadata["gpu0_utilization_p95"] == 99
    outputs = {"artifacts": {"metrics": {"artifacts": [{"metadata": metrics.metadata}]}}}
    assert key_figures("train", outputs) == "2 epochs, 12.0s fitting; GPU 0: mean 91% (p95 99%), memory 12.1/80 GiB"
    without = {"artifacts": {"metrics": {"artifacts": [{"metadata": {
        k: v for k, v in metrics.metadata.items() if not k.startswith("gpu")}}]}}}
    assert key_figures("train", without) == "2 epochs, 12.0s fitting"


def page_for(tmp_path, training_info: dict) -> str:
    from pipelines.local import runpage

    model = tmp_path / "model"
    model.mkdir()
    (model / "training.json").write_text(json.dumps(training_info))
    return runpage._gpu_usage({"artifacts": {"train": {"model": str(model)}}})


def test_the_run_page_shows_each_gpu_with_its_epochs(tmp_path):
    page = page_for(tmp_path, {"history": {}, "gpu_usage": recorded_usage()})
    assert "<h3>GPU 0 NVIDIA H100 80GB HBM3 (80 GiB)</h3>" in page
    assert "mean 91% (p50 95%, p95 99%, max 99%), at 90% or more for 6s of 10s; memory up to 12.1 of 80 GiB" in page
    assert page.count("<polyline") == 1 and "<title>mean utilization per epoch" in page
    rows = [row.split("</td>")[0] for row in page.split("<tr><td class='n'>")[1:]]
    assert rows == ["1", "2"]
    assert "<td class='n'>90%</td><td class='n'>99%</td><td class='n'>99%</td>" in page  # epoch 1: 80, 99
    assert "350 W" in page


def test_the_run_page_says_why_nothing_was_recorded(tmp_path):
    page = page_for(tmp_path, {"history": {}, "gpu_usage": {"recorded": False, "reason": "no <driver>"}})
    assert page == "<p>Not recorded: no &lt;driver&gt;.</p>"


# ---------------------------------------------------------------------------------------------- a real run here


def test_training_on_the_cpu_here_records_why_and_says_nothing(small_dataset, tmp_path, caplog):
    """No GPU was given to this machine's training, so none was expected: the log has no word on GPU utilization
    (not "pynvml is not installed"), training.json and the run page say it trained on the CPU."""
    from components import train

    logs = tmp_path / "logs"
    with caplog.at_level(logging.INFO):
        result = train.train(small_dataset, str(tmp_path / "model"), epochs=2, validate=False,
                             tensorboard_dir=str(logs))
    assert result.steps == 2 * result.steps_per_epoch
    with open(tmp_path / "model" / "training.json") as f:
        usage = json.load(f)["gpu_usage"]
    assert usage == {"recorded": False, "reason": gpu_usage.ON_THE_CPU}
    assert [r.getMessage() for r in caplog.records if "GPU" in r.getMessage() or "pynvml" in r.getMessage()] == []
    (tmp_path / "page").mkdir()
    assert page_for(tmp_path / "page", {"gpu_usage": usage}) == "<p>Not recorded: trained on the CPU.</p>"
    assert os.listdir(logs) and not (logs / "gpu").exists()  # TensorFlow's own scalars, no empty GPU run


def test_where_a_gpu_trains_and_nvml_is_missing_it_says_why_once(caplog):
    def unavailable():
        raise GpuUsageUnavailable("pynvml is not installed (the nvidia-ml-py package: the gpu and torch extras "
                                  "bring it)")

    asked = []

    def on_the_cpu():
        asked.append(1)
        raise AssertionError("NVML is not asked where no GPU trains")

    with caplog.at_level(logging.INFO, logger=gpu_usage.__name__):
        cpu = gpu_usage.start_for_training(None, chief=True, gpus=0, reader_factory=on_the_cpu)
        assert caplog.messages == [] and asked == []
        gpu = gpu_usage.start_for_training(None, chief=True, gpus=1, reader_factory=unavailable)
    assert cpu.stop() == {"recorded": False, "reason": "trained on the CPU"}
    assert gpu.stop() == {"recorded": False, "reason": "pynvml is not installed (the nvidia-ml-py package: the "
                                                       "gpu and torch extras bring it)"}
    assert caplog.messages == ["train: GPU utilization is not recorded: pynvml is not installed (the nvidia-ml-py "
                               "package: the gpu and torch extras bring it)"]


# ---------------------------------------------------------------------------------------------- the NVML reader


def nvml_with(**overrides):
    from tests.standins.nvml import Gpu, NvmlStandIn

    gpus = [Gpu("GPU-0a0a", "NVIDIA H100 80GB HBM3", 80 * (1 << 30), 97, 41, 30 * (1 << 30), 512_345),
            Gpu("GPU-1b1b", "NVIDIA H100 80GB HBM3", 80 * (1 << 30), 12, 3, 2 * (1 << 30), None),
            Gpu("GPU-2c2c", "NVIDIA H100 80GB HBM3", 80 * (1 << 30), 55, 20, 10 * (1 << 30), 300_000)]
    return NvmlStandIn(gpus, **overrides)


def test_the_nvml_reader_reads_the_visible_gpus_in_the_frameworks_order():
    nvml = nvml_with()
    reader = gpu_usage.NvmlReader.open({"CUDA_VISIBLE_DEVICES": "2,GPU-1b"}, nvml=nvml)
    devices = reader.devices()
    assert [(d.index, d.uuid) for d in devices] == [(0, "GPU-2c2c"), (1, "GPU-1b1b")]
    assert devices[0].memory_total_bytes == 80 * (1 << 30) and devices[0].name == "NVIDIA H100 80GB HBM3"
    assert reader.sample(devices[0]) == GpuSample(55, 20, 10 * (1 << 30), 300.0)  # milliwatts to watts
    assert reader.sample(devices[1]) == GpuSample(12, 3, 2 * (1 << 30), None)  # no power on this card
    reads = nvml.power_reads
    reader.sample(devices[1])
    assert nvml.power_reads == reads  # not asked again
    reader.close()
    assert nvml.initialized == 0


def test_the_nvml_reader_says_why_not_and_leaves_nvml_shut():
    with pytest.raises(GpuUsageUnavailable, match=r"NVML did not start \(NVML Shared Library Not Found\)"):
        gpu_usage.NvmlReader.open({}, nvml=nvml_with(library=False))
    nvml = nvml_with()
    with pytest.raises(GpuUsageUnavailable, match=r"no GPU is visible to this process \(NVML sees 3; "
                                                  r"CUDA_VISIBLE_DEVICES=''\)"):
        gpu_usage.NvmlReader.open({"CUDA_VISIBLE_DEVICES": ""}, nvml=nvml)
    assert nvml.initialized == 0


def test_a_gpu_lost_mid_run_ends_the_sampling_not_the_training(caplog):
    nvml = nvml_with()
    sampler = GpuUsageSampler(lambda: gpu_usage.NvmlReader.open({}, nvml=nvml), clock=Clock())
    assert sampler.open()
    sampler.sample_once()
    nvml.gpus[1].lost = True
    with caplog.at_level(logging.WARNING, logger=gpu_usage.__name__):
        sampler.sample_once()
        sampler.sample_once()
    usage = sampler.stop()
    assert [g["run"]["samples"] for g in usage["gpus"]] == [1, 1, 1]
    assert usage["gpus"][0]["run"]["power_watts_mean"] == pytest.approx(512.3, abs=0.05)
    assert usage["stopped_early"] == "reading NVML failed mid-run: GPU is lost"
    assert [m for m in caplog.messages if "reading NVML failed" in m] == [
        "train: GPU utilization: reading NVML failed (NVMLError_GpuIsLost: GPU is lost); no more samples this run"]
    assert nvml.initialized == 0


def test_the_tensorboard_scalars_need_no_tensorflow(tmp_path):
    """As on the PyTorch image, where `import tensorflow` fails: TensorBoard writes through its own file layer."""
    script = (
        "import sys; sys.modules['tensorflow'] = None\n"
        "from components.train.gpu_usage import GpuDevice, TensorBoardScalars\n"
        f"writer = TensorBoardScalars({str(tmp_path)!r})\n"
        "writer.write(7, [GpuDevice(0, 'GPU-1', 'card', 1 << 30)], {0: {'samples': 1, 'utilization_mean': 42.0}})\n"
        "writer.close()\n"
        "from tensorboard.compat import tf\n"
        "print(tf.__name__)\n")
    done = subprocess.run([sys.executable, "-c", script], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": REPO_ROOT})
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "tensorboard.compat.tensorflow_stub"

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.util import tensor_util

    events = EventAccumulator(str(tmp_path / "gpu"))
    events.Reload()
    assert [(e.step, float(tensor_util.make_ndarray(e.tensor_proto))) for e in events.Tensors("gpu/0/utilization")] \
        == [(7, 42.0)]


def test_a_reader_that_fails_to_list_its_gpus_does_not_stop_training(caplog):
    class Broken(ScriptedReader):
        def devices(self):
            raise OSError("permission denied on /dev/nvidiactl")

    with caplog.at_level(logging.INFO, logger=gpu_usage.__name__):
        sampler = GpuUsageSampler(lambda: Broken({0: []})).start()
        usage = sampler.stop()
    assert usage == {"recorded": False,
                     "reason": "reading the GPUs failed (OSError: permission denied on /dev/nvidiactl)"}
    assert caplog.messages == ["train: GPU utilization is not recorded: " + usage["reason"]]


def test_the_run_page_leaves_out_power_where_no_card_reported_it(tmp_path):
    reader = ScriptedReader({0: [sample(60), sample(70)]})
    sampler = GpuUsageSampler(lambda: reader, clock=Clock())
    sampler.open()
    sampler.end_epoch(0, step=5)
    page = page_for(tmp_path, {"gpu_usage": sampler.stop()})
    assert "power" not in page and "<td class='n'>60%</td>" in page


def test_on_a_mig_slice_it_says_not_available_and_training_goes_on(caplog):
    """GKE's MIG pod sees the parent GPU in MIG mode, whose utilization NVML does not report: the sampler says so
    once and records nothing, where sampling it would fail with Not Supported."""
    from tests.standins.nvml import NVMLError_NotSupported

    nvml = nvml_with()
    for gpu in nvml.gpus:
        gpu.mig = True
    with pytest.raises(NVMLError_NotSupported):
        nvml.nvmlDeviceGetUtilizationRates(nvml.gpus[0])  # what sampling would meet
    sampler = GpuUsageSampler(lambda: gpu_usage.NvmlReader.open({}, nvml=nvml), clock=Clock())
    with caplog.at_level(logging.INFO, logger=gpu_usage.__name__):
        assert not sampler.open()
    assert sampler.reason == gpu_usage.MIG_SLICE
    assert [m for m in caplog.messages if "not recorded" in m] == [
        "train: GPU utilization is not recorded: not available on a MIG slice (NVML does not report the "
        "utilization of a GPU in MIG mode)"]
    assert nvml.initialized == 0


def test_a_mig_instance_named_to_cuda_is_a_mig_slice_and_a_gpu_without_mig_is_sampled():
    nvml = nvml_with()
    with pytest.raises(GpuUsageUnavailable, match="not available on a MIG slice"):
        gpu_usage.NvmlReader.open({"NVIDIA_VISIBLE_DEVICES": "MIG-5c6a1e3e-aaaa-bbbb-cccc-0123456789ab"}, nvml=nvml)
    assert nvml.initialized == 0
    for gpu in nvml.gpus:
        gpu.mig = None  # a card without MIG answers the mode query with Not Supported
    reader = gpu_usage.NvmlReader.open({"CUDA_VISIBLE_DEVICES": "0"}, nvml=nvml)
    assert reader.sample(reader.devices()[0]).utilization == 97
    reader.close()
