"""images/gpu_libs.py, the GPU images' library check, on a scratch install of each GPU extra's real wheels
(tests/gpu_wheels.py): every CUDA library TensorFlow, torch and JAX load opens by its soname once the folders that
`gpu_libs.py register` writes are the linker's paths, and the check fails, naming the library, when one folder is
left out. The image registers the folders with ldconfig; here they become LD_LIBRARY_PATH, which the dynamic
linker searches the same way and which needs no root. No GPU is needed: the driver's libcuda.so.1 is the one
library the check lets wait for the node.

The wheels are GBs (see tests/gpu_wheels.py); `make test` fetches them once into ~/.cache/gpu-wheels.
Deselect with -m "not gpu_wheels".
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from tests import gpu_wheels

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CHECK = os.path.join(ROOT, "images", "gpu_libs.py")

sys.path.insert(0, os.path.join(ROOT, "images"))
import gpu_libs  # noqa: E402  (images/ is the Docker build context's folder of build tools, not a package)

sys.path.pop(0)


def run_check(framework: str, site: str, lib_dirs: list[str]) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "LD_"))}
    env.update(PYTHONPATH=site, LD_LIBRARY_PATH=":".join(lib_dirs), TF_CPP_MIN_LOG_LEVEL="3")
    return subprocess.run([sys.executable, CHECK, "check", framework, "--site", site], capture_output=True, text=True,
                          timeout=900, env=env, cwd=ROOT)


def registered(site: str, tmp_path) -> list[str]:
    """The folders `gpu_libs.py register` writes for the image's ldconfig."""
    conf = tmp_path / "nvidia-wheels.conf"
    result = subprocess.run([sys.executable, CHECK, "register", str(conf), "--site", site], capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return conf.read_text().splitlines()


# ----------------------------------------------------------------------------------------------- no wheels needed


def test_a_library_outside_the_linker_paths_fails_with_the_linkers_error():
    library = gpu_libs.load("libcusolver.so.11", env={"PATH": os.environ.get("PATH", "")})
    assert library.status == "failed" and "libcusolver.so.11: cannot open shared object file" in library.detail
    assert gpu_libs.load("libz.so.1").status == "loaded"  # a system library: found through ld.so.cache


def test_a_library_waits_for_the_driver_only_when_nothing_else_is_missing(tmp_path):
    """dlopen names only the first dependency it cannot find: a library that needs libcuda.so.1 and, after it, a
    library from a folder left out fails on libcuda.so.1 alone. The check loads it again with a stand-in
    libcuda.so.1, which shows the other one missing. The libraries are real ELF objects the dynamic linker loads,
    written as the stand-in is."""
    folder = tmp_path / "lib"
    folder.mkdir()
    for soname, needed in (("libneedsdriver.so.1", ("libcuda.so.1", "libz.so.1")),
                           ("libneedsmore.so.1", ("libcuda.so.1", "libleftout.so.3")),
                           ("libneedsmorefirst.so.1", ("libleftout.so.3", "libcuda.so.1"))):
        gpu_libs.write_shared_object(str(folder / soname), soname, needed)
    env = {"PATH": os.environ.get("PATH", ""), "LD_LIBRARY_PATH": str(folder)}
    loaded, first_error = gpu_libs._run_loader("libneedsmore.so.1", env)
    assert not loaded and "libcuda.so.1: cannot open shared object file" in first_error
    assert "libleftout" not in first_error  # what the check alone saw before it loaded the stand-in
    assert gpu_libs.load("libneedsdriver.so.1", env).status == "driver"
    for soname in ("libneedsmore.so.1", "libneedsmorefirst.so.1"):
        library = gpu_libs.load(soname, env)
        assert library.status == "failed" and "libleftout.so.3: cannot open shared object file" in library.detail
    report = gpu_libs.Report("torch", [str(folder)], [gpu_libs.load("libneedsmore.so.1", env)], [], [])
    assert not report.ok and report.lines()[1].startswith("  FAILED  libneedsmore.so.1")


def test_the_stand_in_driver_is_a_shared_object_the_linker_loads(tmp_path):
    path = tmp_path / "libcuda.so.1"
    gpu_libs.write_shared_object(str(path), "libcuda.so.1")
    with open(sys.executable, "rb") as program, open(path, "rb") as stand_in:
        assert stand_in.read(20)[18:] == program.read(20)[18:]  # this machine's e_machine
    library = gpu_libs.load("libcuda.so.1", env={"PATH": "", "LD_LIBRARY_PATH": str(tmp_path)})
    assert library.status == "loaded" and library.detail == str(path)


def test_sonames_are_read_from_the_wheel_folders(tmp_path):
    cudnn, runtime = tmp_path / "cudnn" / "lib", tmp_path / "cuda_runtime" / "lib"
    for folder, names in ((cudnn, ["libcudnn.so.9", "libcudnn_ops.so.9", "libcudnn_cnn.so.9"]),
                          (runtime, ["libcudart.so.12", "libcudart_static.a", "libcudadevrt.a"])):
        folder.mkdir(parents=True)
        for name in names:
            (folder / name).write_bytes(b"")
    dirs = [str(cudnn), str(runtime)]
    assert gpu_libs.sonames("cudnn", dirs) == ["libcudnn.so.9", "libcudnn_cnn.so.9", "libcudnn_ops.so.9"]
    assert gpu_libs.sonames("cudart", dirs) == ["libcudart.so.12"]
    assert gpu_libs.sonames("cusolver", dirs) == []
    assert gpu_libs.soname_major(["libcudart.so.12"], "cudart") == "12"


def test_a_version_mismatch_or_a_missing_wheel_fails_the_report():
    loaded = [gpu_libs.Library("libcudart.so.12", "loaded", "/x"), gpu_libs.Library("libcudnn.so.9", "loaded", "/y")]
    good = gpu_libs.Report("tensorflow", ["/x"], loaded, [("CUDA", "12.5.1", "libcudart.so.12", True)], [])
    assert good.ok and good.lines()[-1] == "ok"
    mismatch = gpu_libs.Report("tensorflow", ["/x"], loaded, [("cuDNN", "8", "libcudnn.so.9", False)], [])
    assert not mismatch.ok and any("MISMATCH" in line and "cuDNN" in line for line in mismatch.lines())
    missing = gpu_libs.Report("tensorflow", ["/x"], loaded, [], ["cusolver"])
    assert not missing.ok and any("libcusolver.so.*" in line for line in missing.lines())
    driver = gpu_libs.Report("tensorflow", ["/x"], [gpu_libs.Library("libcudnn_x.so.9", "driver", "")], [], [])
    assert driver.ok, "the driver's libcuda is the one exception"


def test_check_says_what_to_do_without_nvidia_wheels(tmp_path):
    result = subprocess.run([sys.executable, CHECK, "check", "tensorflow", "--site", str(tmp_path)],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and "the NVIDIA wheels are not installed" in result.stderr


def test_the_conv2d_fit_check_trains_here_and_refuses_without_a_gpu_when_one_is_required():
    """The GPU image's build runs `gpu_libs.py fit tensorflow` (no GPU there: the CPU); the first GPU run runs it
    with --require-gpu on a node. This machine has TensorFlow (the [cpu] extra) and no GPU."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    env.update(TF_CPP_MIN_LOG_LEVEL="3", CUDA_VISIBLE_DEVICES="")
    ran = subprocess.run([sys.executable, CHECK, "fit", "tensorflow"], capture_output=True, text=True, timeout=600,
                         env=env, cwd=ROOT)
    assert ran.returncode == 0, ran.stderr[-3000:]
    line = ran.stdout.strip().splitlines()[-1]
    assert re.fullmatch(r"Conv2D fit\(\) under XLA: ok on the CPU \(no GPU here: run it with --require-gpu on a GPU "
                        r"node\), loss \d+\.\d{3}", line), line
    required = subprocess.run([sys.executable, CHECK, "fit", "tensorflow", "--require-gpu"], capture_output=True,
                              text=True, timeout=600, env=env, cwd=ROOT)
    assert required.returncode == 2 and not required.stdout
    assert required.stderr.strip().splitlines()[-1] == (
        "gpu_libs.py: error: TensorFlow registers no GPU here (is this a GPU node, and did `gpu_libs.py check "
        "tensorflow` pass?): the Conv2D fit() check needs one")


# ----------------------------------------------------------------------------------------------- scratch installs

# The folders TensorFlow 2.21's RUNPATH misses (cusolver, nvjitlink, curand, nvrtc); for torch, which has no
# RUNPATH, and JAX, which loads them by path, cuDNN's and the CUDA 13 wheels' shared one.
LEFT_OUT = {"tensorflow": {"cusolver": "libcusolver.so.11", "nvjitlink": "libnvJitLink.so.12",
                           "curand": "libcurand.so.10", "cuda_nvrtc": "libnvrtc.so.12"},
            "torch": {"cudnn": "libcudnn.so.9", "cu13": "libcublas.so.13"},
            "jax": {"cudnn": "libcudnn.so.9", "cu13": "libcublas.so.13"}}


@pytest.fixture(scope="module", params=sorted(gpu_wheels.IMAGES))
def scratch(request):
    return request.param, gpu_wheels.prepare(request.param)


@pytest.mark.gpu_wheels
def test_every_gpu_library_loads_by_soname_and_the_versions_match(scratch, tmp_path):
    framework, site = scratch
    lib_dirs = registered(site, tmp_path)
    assert lib_dirs == gpu_libs.nvidia_lib_dirs([site]) and lib_dirs
    result = run_check(framework, site, lib_dirs)
    print(result.stdout)  # the report: every library and where it loaded from (pytest -s shows it)
    assert result.returncode == 0, result.stdout + result.stderr[-3000:]
    lines = result.stdout.splitlines()
    assert lines[-1] == "ok" and not [line for line in lines if "FAILED" in line or "MISSING" in line]
    loaded = {line.split()[1] for line in lines if line.startswith("  loaded  ")}
    for name in gpu_libs.LIBRARIES[framework]:
        assert gpu_libs.sonames(name, lib_dirs)[0] in loaded, name
    assert [line.split(":")[0].split()[-1] for line in lines if line.startswith("  match")] == ["CUDA", "cuDNN"]
    waiting = [line for line in lines if line.startswith("  driver  ")]
    assert all("libcuda.so.1" in line for line in waiting)


@pytest.mark.gpu_wheels
def test_the_check_fails_when_a_folder_is_left_out_of_the_linker_paths(scratch, tmp_path):
    framework, site = scratch
    lib_dirs = registered(site, tmp_path)
    for folder, soname in LEFT_OUT[framework].items():
        kept = [d for d in lib_dirs if os.path.basename(os.path.dirname(d)) != folder]
        assert len(kept) == len(lib_dirs) - 1, f"{folder} is not one of {lib_dirs}"
        result = run_check(framework, site, kept)
        assert result.returncode == 1, result.stdout + result.stderr[-2000:]
        failed = [line for line in result.stdout.splitlines() if line.startswith("  FAILED")]
        assert any(f"{soname}: cannot open shared object file" in line for line in failed), result.stdout
        assert result.stdout.splitlines()[-1].startswith("FAILED: the GPU would not be registered")
