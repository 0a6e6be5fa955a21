"""A scratch install of a GPU extra's framework and NVIDIA wheels, for tests/test_gpu_libs.py: the wheels the GPU
images install, resolved from pyproject.toml as their pip resolves them (PyPI only: `--isolated` leaves out this
machine's local wheel folders, whose torch is a +cpu build), downloaded once and unpacked into a site folder that
nothing imports unless asked.

    python -m tests.gpu_wheels [tensorflow|torch|jax ...]      (`make gpu-wheels`)

Sizes, measured on a 2-core machine: the [gpu] extra's tensorflow and 12 nvidia-*-cu12 wheels, 3.2 GB downloaded
(26 s), 6.0 GB unpacked (66 s); the [torch] extra's torch and 16 NVIDIA CUDA 13 wheels, 2.4 GB (29 s), 3.9 GB
(58 s); the [jax-cuda] extra's JAX, its CUDA 13 plugin and the NVIDIA wheels it shares with torch (resolved
together, as in the image). All stay under GPU_WHEELS_DIR (default ~/.cache/gpu-wheels) and are reused while the pins resolve the
same.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import tomllib

from packaging.requirements import Requirement

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# framework -> the pyproject extra that installs it (jax: the one the TensorFlow-free image adds to [torch])
EXTRAS = {"tensorflow": "gpu", "torch": "torch", "jax": "jax-cuda"}
# Resolved together with another framework, as in its image: JAX's NVIDIA wheels are the ones torch's pins choose.
ALONGSIDE = {"jax": ("torch",)}
# Besides the framework and nvidia-*: what the check imports (JAX's CUDA 13 plugin holds its build versions).
PLUGINS = {"jax": ("jax-cuda13-plugin",)}


def default_dir() -> str:
    return os.environ.get("GPU_WHEELS_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "gpu-wheels")


def requirement(framework: str) -> str:
    """The extra's requirement on the framework, e.g. tensorflow[and-cuda]==2.21.*."""
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        extra = tomllib.load(f)["project"]["optional-dependencies"][EXTRAS[framework]]
    (line,) = [r for r in extra if Requirement(r).name == framework]
    return line


def _pip(*args: str) -> list[str]:
    return [sys.executable, "-m", "pip", "--isolated", "--disable-pip-version-check", "--no-input", *args]


def resolve(framework: str) -> list[str]:
    """name==version of the framework and of every nvidia-* wheel it pulls in here (Linux x86_64, as the images)."""
    with tempfile.TemporaryDirectory() as work:
        report = os.path.join(work, "report.json")
        subprocess.run(_pip("install", "--dry-run", "--quiet", "--ignore-installed", "--report", report,
                            "--target", os.path.join(work, "t"), requirement(framework),
                            *map(requirement, ALONGSIDE.get(framework, ()))), check=True, timeout=600)
        with open(report) as f:
            installs = json.load(f)["install"]
    wanted = {framework, *PLUGINS.get(framework, ())}
    pins = [f"{i['metadata']['name']}=={i['metadata']['version']}" for i in installs
            if i["metadata"]["name"].lower() in wanted or i["metadata"]["name"].lower().startswith("nvidia-")]
    return sorted(pins)


def prepare(framework: str, base: str | None = None) -> str:
    """The site folder holding the framework and its NVIDIA wheels (nvidia/*/lib), made once per resolution."""
    base = base or default_dir()
    pins = resolve(framework)
    key = hashlib.sha256("\n".join(pins).encode()).hexdigest()[:12]
    site = os.path.join(base, f"{framework}-{key}")
    if os.path.exists(site + ".complete"):
        return site
    wheels = os.path.join(base, "wheels")
    os.makedirs(wheels, exist_ok=True)
    subprocess.run(_pip("download", "--quiet", "--no-deps", "-d", wheels, *pins), check=True, timeout=1800)
    files = [os.path.join(wheels, name) for name in os.listdir(wheels)
             if name.endswith(".whl") and _pin_of(name) in {p.lower().replace("-", "_") for p in pins}]
    shutil.rmtree(site, ignore_errors=True)
    subprocess.run(_pip("install", "--quiet", "--no-deps", "--no-index", "--target", site, *files), check=True,
                   timeout=1800)
    with open(site + ".complete", "w") as f:
        f.write("\n".join(pins) + "\n")
    return site


def _pin_of(wheel: str) -> str:
    """name==version of a wheel file, in the normalised spelling wheel file names use."""
    name, version = wheel.split("-")[:2]
    return f"{name.lower()}=={version}".replace("-", "_")


def main(argv: list[str] | None = None) -> int:
    frameworks = (argv if argv is not None else sys.argv[1:]) or list(EXTRAS)
    for framework in frameworks:
        if framework not in EXTRAS:
            print(f"unknown framework {framework!r}; known: {', '.join(EXTRAS)}", file=sys.stderr)
            return 2
        print(f"{framework}: {prepare(framework)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
