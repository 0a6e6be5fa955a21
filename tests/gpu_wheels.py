"""A scratch install of a GPU extra's framework and NVIDIA wheels, for tests/test_gpu_libs.py: the wheels the GPU
images install, read from their locks (images/locks/gpu.txt, images/locks/torch.txt: the versions and hashes the
images install), downloaded once from PyPI with those hashes (`--isolated` leaves out this machine's local wheel
folders, whose torch is a +cpu build) and unpacked into a site folder that nothing imports unless asked. Once a
lock's wheels are here, nothing is asked of PyPI again: a test run reads the lock and finds the folder.

    python -m tests.gpu_wheels [tensorflow|torch|jax ...]      (`make gpu-wheels`)

Sizes, measured on a 2-core machine: the [gpu] extra's tensorflow and 12 nvidia-*-cu12 wheels, 3.2 GB downloaded
(26 s), 6.0 GB unpacked (66 s); the [torch] extra's torch and 16 NVIDIA CUDA 13 wheels, 2.4 GB (29 s), 3.9 GB
(58 s); the [jax-cuda] extra's JAX, its CUDA 13 plugin and the NVIDIA wheels it shares with torch (locked
together, in the torch image's lock). All stay under GPU_WHEELS_DIR (default ~/.cache/gpu-wheels) and are reused
while the locks pin the same.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "images"))
import locks  # noqa: E402  (images/locks.py: the images' locks)

sys.path.pop(0)

# framework -> the image whose lock holds it (JAX rides in the TensorFlow-free image, on torch's NVIDIA wheels)
IMAGES = {"tensorflow": "gpu", "torch": "torch", "jax": "torch"}
# Besides the framework and nvidia-*: what the check imports (JAX's CUDA 13 plugin holds its build versions).
PLUGINS = {"jax": ("jax-cuda13-plugin",)}


def default_dir() -> str:
    return os.environ.get("GPU_WHEELS_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "gpu-wheels")


def _pip(*args: str) -> list[str]:
    return [sys.executable, "-m", "pip", "--isolated", "--disable-pip-version-check", "--no-input", *args]


def pinned(framework: str) -> list[locks.Pin]:
    """The framework's and every nvidia-* wheel's pin in its image's lock (Linux x86_64, as the images)."""
    wanted = {framework, *PLUGINS.get(framework, ())}
    return sorted((pin for pin in locks.read(IMAGES[framework]).pins
                   if pin.name in wanted or pin.name.startswith("nvidia-")), key=lambda pin: pin.name)


def prepare(framework: str, base: str | None = None) -> str:
    """The site folder holding the framework and its NVIDIA wheels (nvidia/*/lib), made once per set of pins."""
    base = base or default_dir()
    pins = pinned(framework)
    key = hashlib.sha256("\n".join(pin.requirement() for pin in pins).encode()).hexdigest()[:12]
    site = os.path.join(base, f"{framework}-{key}")
    if os.path.exists(site + ".complete"):
        return site
    wheels = os.path.join(base, "wheels")
    os.makedirs(wheels, exist_ok=True)
    with tempfile.TemporaryDirectory() as work:
        requirements = os.path.join(work, "requirements.txt")
        with open(requirements, "w") as f:
            f.write("".join(f"{pin.requirement()} " + " ".join(f"--hash={h}" for h in pin.hashes) + "\n"
                            for pin in pins))
        subprocess.run(_pip("download", "--quiet", "--no-deps", "--require-hashes", "--only-binary", ":all:",
                            "-d", wheels, "-r", requirements), check=True, timeout=1800)
    wanted = {pin.requirement().replace("-", "_") for pin in pins}
    files = [os.path.join(wheels, name) for name in os.listdir(wheels)
             if name.endswith(".whl") and _pin_of(name) in wanted]
    shutil.rmtree(site, ignore_errors=True)
    subprocess.run(_pip("install", "--quiet", "--no-deps", "--no-index", "--target", site, *files), check=True,
                   timeout=1800)
    with open(site + ".complete", "w") as f:
        f.write("\n".join(pin.requirement() for pin in pins) + "\n")
    return site


def _pin_of(wheel: str) -> str:
    """name==version of a wheel file, in the normalised spelling wheel file names use."""
    name, version = wheel.split("-")[:2]
    return f"{name.lower()}=={version}".replace("-", "_")


def main(argv: list[str] | None = None) -> int:
    frameworks = (argv if argv is not None else sys.argv[1:]) or list(IMAGES)
    for framework in frameworks:
        if framework not in IMAGES:
            print(f"unknown framework {framework!r}; known: {', '.join(IMAGES)}", file=sys.stderr)
            return 2
        print(f"{framework}: {prepare(framework)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
