"""The driver check of the GPU steps (components/gpu_driver.py): the version read through NVML (the pynvml stand-in,
tests/standins/nvml.py, as the real module answers on a GPU node and on a machine without a driver), NVIDIA's
minimum per CUDA release, and the one line a step on a too-old driver ends with (stepcli's exit code 2)."""

from __future__ import annotations

import pytest

from components import gpu_driver, stepcli
from components.gpu_driver import DriverTooOld, check_driver, minimum_driver, nvml_driver_version
from tests.standins.nvml import Gpu, NvmlStandIn

T4 = Gpu("GPU-0a0a", "Tesla T4", 16 * (1 << 30))


def test_nvml_reports_the_driver_and_is_shut_down_after():
    nvml = NvmlStandIn([T4], driver_version="535.274.02")
    assert nvml_driver_version(nvml) == "535.274.02"
    assert nvml.initialized == 0


def test_where_nvml_cannot_start_there_is_no_driver_to_read():
    nvml = NvmlStandIn([], library=False)  # a CPU machine, or a pod the device plugin gave no GPU
    assert nvml_driver_version(nvml) is None
    assert nvml.initialized == 0


def test_nvidias_minimum_driver_per_cuda_release():
    assert [minimum_driver(v) for v in ("13.0", "13.2", "12.5.1", "12", "11.8", "14.0", "")] == \
        [580, 580, 525, 525, 450, None, None]


@pytest.mark.parametrize("driver", ["535.274.02", "575.57.08"])
def test_a_cuda_13_framework_on_an_older_driver_stops_in_one_line_saying_what_to_do(driver):
    with pytest.raises(DriverTooOld) as raised:
        check_driver("13.0", framework="torch 2.13.0+cu130",
                     read_version=lambda: nvml_driver_version(NvmlStandIn([T4], driver_version=driver)))
    message = str(raised.value)
    assert "\n" not in message
    assert f"driver is {driver}" in message and "needs driver 580 or newer" in message
    assert "torch 2.13.0+cu130" in message and "CUDA 13.0" in message
    assert "--accelerator type=...,count=...,gpu-driver-version=latest" in message


@pytest.mark.parametrize("driver", ["580.65.06", "580.95.05", "590.44.01"])
def test_a_new_enough_driver_passes_is_returned_and_logged(driver, caplog):
    with caplog.at_level("INFO", logger=gpu_driver.__name__):
        assert check_driver("13.0", framework="JAX 0.10.2",
                            read_version=lambda: nvml_driver_version(NvmlStandIn([T4], driver_version=driver))) \
            == driver
    assert caplog.messages == [f"NVIDIA driver {driver}: JAX 0.10.2 is built for CUDA 13.0, which needs 580 or newer"]


def test_the_tensorflow_image_on_cuda_12_runs_on_r535():
    reader = lambda: "535.274.02"  # noqa: E731
    assert check_driver("12.5.1", framework="TensorFlow 2.21.0", read_version=reader) == "535.274.02"
    with pytest.raises(DriverTooOld, match="needs driver 525 or newer"):
        check_driver("12.5.1", framework="TensorFlow 2.21.0", read_version=lambda: "470.256.02")


def test_nothing_is_checked_for_a_cpu_build_or_without_a_driver():
    read = []

    def reader():
        read.append(1)
        return "535.274.02"

    assert check_driver(None, framework="torch 2.13.0+cpu", read_version=reader) is None
    assert read == []  # a CPU build does not even ask NVML
    assert check_driver("13.0", framework="torch", read_version=lambda: None) is None
    assert check_driver("13.0", framework="torch", read_version=lambda: "unknown") == "unknown"


def test_the_step_exits_permanent_with_the_line_on_stderr(capsys):
    code = stepcli.run(lambda: check_driver("13.0", framework="torch", read_version=lambda: "535.274.02"),
                       prog="train")
    err = capsys.readouterr().err.strip()
    assert code == stepcli.EXIT_PERMANENT == DriverTooOld.exit_code
    assert err.startswith("train: error: The GPU node's NVIDIA driver is 535.274.02") and len(err.splitlines()) == 1
    assert gpu_driver.NODE_POOL_FLAG in err
