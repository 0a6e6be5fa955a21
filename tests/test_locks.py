"""images/locks.py and images/locks/IMAGE.txt: each image's requirements locked with hashes, checked against
pyproject.toml with no network, so that a change to pyproject.toml that is not relocked (`make lock`) fails here
and not in a build that installs something nobody audited.

The one test that asks PyPI (marked registry) resolves a lock again at the date its header records and expects
the same lock: the lock is what pyproject.toml resolves to, not an edited file.
"""

from __future__ import annotations

import datetime
import os
import re
import shutil
import subprocess
import sys

import pytest
from packaging.version import Version

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "images"))
import locks  # noqa: E402  (images/ holds the images' build tools, not a package)

sys.path.pop(0)

TENSORFLOW_BUILDS = {"tensorflow", "tensorflow-cpu", "tensorflow-intel", "tensorflow-gpu", "tf-nightly"}


def pins(image: str) -> dict[str, str]:
    return {pin.name: pin.version for pin in locks.read(image).pins}


@pytest.mark.parametrize("image", sorted(locks.IMAGES))
def test_every_lock_matches_pyproject(image):
    assert locks.disagreements(image) == []
    lock = locks.read(image)
    assert lock.inputs["python"] == locks.PYTHON_VERSION and lock.inputs["platform"] == locks.PLATFORM
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", lock.inputs["exclude-newer"])
    assert len(lock.pins) > 50 and all(pin.hashes for pin in lock.pins)
    assert len({pin.name for pin in lock.pins}) == len(lock.pins), "one pin per package"


def test_the_check_command_passes_on_the_committed_locks():
    script = os.path.join(ROOT, "images", "locks.py")
    result = subprocess.run([sys.executable, script, "--check"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and result.stdout.strip() == "cpu, gpu, torch: the locks match pyproject.toml"


def edited_pyproject(tmp_path, old: str, new: str) -> str:
    with open(locks.PYPROJECT) as f:
        text = f.read()
    assert old in text
    path = tmp_path / "pyproject.toml"
    path.write_text(text.replace(old, new))
    return str(path)


def test_a_range_the_lock_falls_outside_of_is_drift(tmp_path):
    pyproject = edited_pyproject(tmp_path, '"nvidia-cudnn-cu12>=9.24.0.43,<10"', '"nvidia-cudnn-cu12>=9.99,<10"')
    problems = locks.disagreements("gpu", pyproject=pyproject)
    cudnn = pins("gpu")["nvidia-cudnn-cu12"]
    assert f"images/locks/gpu.txt pins nvidia-cudnn-cu12=={cudnn}, outside pyproject.toml's " \
           "nvidia-cudnn-cu12>=9.99,<10" in problems
    assert any(p.startswith("pyproject.toml changed the gpu image's requirements since images/locks/gpu.txt was "
                            "made; added nvidia-cudnn-cu12>=9.99,<10; dropped nvidia-cudnn-cu12>=9.24.0.43,<10")
               for p in problems)
    assert locks.disagreements("cpu", pyproject=pyproject) == [], "the other images do not install the [gpu] extra"


def test_a_new_dependency_the_lock_lacks_is_drift(tmp_path):
    pyproject = edited_pyproject(tmp_path, '\n  "tensorboard>=2.20",', '\n  "polars>=1",\n  "tensorboard>=2.20",')
    for image in locks.IMAGES:
        problems = locks.disagreements(image, pyproject=pyproject)
        assert f"images/locks/{image}.txt has no polars, which pyproject.toml requires (polars>=1)" in problems


def test_a_lock_made_for_other_inputs_is_drift(tmp_path):
    stale = tmp_path / "torch.txt"
    with open(locks.lock_path("torch")) as f:
        stale.write_text(f.read().replace("#   python: 3.11\n", "#   python: 3.12\n"))
    problems = locks.disagreements("torch", path=str(stale))
    assert any("was made for python '3.12', the image needs '3.11'" in p for p in problems)


def test_a_pin_without_hashes_is_refused(tmp_path):
    broken = tmp_path / "cpu.txt"
    with open(locks.lock_path("cpu")) as f:
        lines = f.read().splitlines()
    first = next(i for i, line in enumerate(lines) if re.match(r"^[a-z0-9]", line))
    hashes = [i for i in range(first + 1, len(lines)) if lines[i].lstrip().startswith("--hash")]
    block = [i for n, i in enumerate(hashes) if i == first + 1 + n]  # the first pin's own hash lines
    kept = lines[:first] + [lines[first].rstrip(" \\")] + [line for i, line in enumerate(lines) if i > first
                                                              and i not in block]
    broken.write_text("\n".join(kept) + "\n")
    with pytest.raises(locks.LockError, match="pins without hashes"):
        locks.read("cpu", str(broken))


def test_each_image_gets_one_tensorflow_build_or_none():
    """--no-deps installs exactly the lock: what the lock holds is all a build can bring."""
    builds = {image: sorted(set(pins(image)) & TENSORFLOW_BUILDS) for image in locks.IMAGES}
    assert builds == {"cpu": ["tensorflow-cpu"], "gpu": ["tensorflow"], "torch": []}
    assert pins("cpu")["tensorflow-cpu"] == pins("gpu")["tensorflow"], "the CPU and GPU images run one TensorFlow"
    assert "apache-beam" in pins("cpu") and "apache-beam" not in pins("gpu")


def test_the_gpu_lock_holds_a_cudnn_that_trains_conv2d_on_tensorflow_2_21():
    """cuDNN 9.5 failed TensorFlow 2.21's Conv2D fit() in XLA's autotuner; 9.24.0.43 fixed it (aws/deep-learning-
    containers #6417, #6418)."""
    gpu = pins("gpu")
    assert Version(gpu["tensorflow"]).release[:2] == (2, 21)
    assert Version(gpu["nvidia-cudnn-cu12"]) >= Version("9.24.0.43")
    assert Version(gpu["nvidia-cudnn-cu12"]).major == 9


def test_the_images_share_one_kfp_and_one_vertex_sdk():
    for package in ("kfp", "kfp-kubernetes", "google-cloud-aiplatform"):
        versions = {image: pins(image)[package] for image in locks.IMAGES}
        assert len(set(versions.values())) == 1, f"{package}: {versions}"


@pytest.mark.registry
@pytest.mark.parametrize("image", sorted(locks.IMAGES))
def test_a_lock_is_what_pyproject_resolves_to_at_its_date(image, tmp_path):
    """Resolve again from PyPI at the date the lock records: the same pins and hashes, so the lock was made by
    `make lock` from this pyproject.toml, and anyone can check it."""
    if shutil.which("uv", path=os.path.dirname(sys.executable)) is None and shutil.which("uv") is None:
        pytest.fail("uv is not installed: pip install -e '.[dev]' (deselect with -m 'not registry' offline)")
    lock = locks.read(image)
    again = tmp_path / f"{image}.txt"
    result = subprocess.run(locks.uv_command(image, lock.inputs["exclude-newer"], str(again)), capture_output=True,
                            text=True, timeout=600, cwd=ROOT)
    assert result.returncode == 0, result.stderr[-3000:]
    with open(locks.lock_path(image)) as f:
        committed = f.read()
    header = locks.header(image, lock.requirements, lock.inputs["exclude-newer"])
    assert committed == header + again.read_text()


def test_a_lock_made_without_a_date_takes_only_releases_three_days_old():
    """A mirror of PyPI a day behind must still hold every release the lock could pick, so `make lock` dates a lock
    at the start of the UTC day three days back, whatever the hour it runs."""
    for hour in (0, 13, 23):
        now = datetime.datetime(2026, 12, 5, hour, 59, tzinfo=datetime.timezone.utc)
        assert locks.default_exclude_newer(now) == "2026-12-02T00:00:00Z"
    pacific = datetime.timezone(datetime.timedelta(hours=-8))
    assert locks.default_exclude_newer(datetime.datetime(2026, 12, 5, 20, 0, tzinfo=pacific)) == "2026-12-03T00:00:00Z"
