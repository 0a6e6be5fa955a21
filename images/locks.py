"""The images' locked requirements: every package each image installs, pinned with its hashes, resolved from
pyproject.toml once, here, and installed as written (`pip install --require-hashes --no-deps`), so that what
images/audit.py audits is what the images install.

    python images/locks.py            # regenerate images/locks/IMAGE.txt for every image (`make lock`; needs uv)
    python images/locks.py --check    # offline: does every lock still match pyproject.toml?

A lock is `uv pip compile --generate-hashes` of the image's requirements (the project's dependencies and the
extras its Dockerfile target names) for the image's platform: Linux x86_64 (manylinux_2_40: Debian 13's glibc
is 2.41) and the base image's Python minor version, with nothing published after the lock's date
(--exclude-newer), so that the same inputs resolve to the same lock again. That date is, unless given, the start
of the UTC day three days back (COOLDOWN_DAYS): a mirror or proxy of PyPI can be a day or more behind, and a lock
dated "now" would take, on the next resolve, a release the first one never saw (cryptography 51.0.1, uploaded 32
hours before a lock dated at its own making, arrived in the index after it). Three days also keeps a release that
is yanked in its first days out of the images. Its header records those inputs:
the image, the extras, the requirement lines read from pyproject.toml, the Python version, the platform and the
date. `--check` (and tests/test_locks.py) compares them with pyproject.toml and checks that every requirement
is met by a pinned version, with no network.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import os
import re
import shutil
import subprocess
import sys
import tempfile

COOLDOWN_DAYS = 3
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
LOCK_DIR = os.path.join(HERE, "locks")
PYPROJECT = os.path.join(ROOT, "pyproject.toml")
sys.path.insert(0, HERE)
import requirements  # noqa: E402  (images/requirements.py, the reader of pyproject.toml)

sys.path.pop(0)

# The extras each image installs: the one place they are named (images/Dockerfile copies images/locks/IMAGE.txt
# into the target of the same name; tests/test_images.py keeps the two in step).
IMAGES = {"cpu": ["cpu", "beam"], "gpu": ["gpu"], "torch": ["torch", "jax-cuda"]}
# The images' Python (the base image's python:3.11.x tag) and platform (Debian 13's glibc 2.41; x86_64 nodes).
PYTHON_VERSION = "3.11"
PLATFORM = "x86_64-manylinux_2_40"
# Markers are evaluated for that platform when checking a lock against pyproject.toml.
ENVIRONMENT = {"python_version": PYTHON_VERSION, "python_full_version": f"{PYTHON_VERSION}.0", "os_name": "posix",
               "sys_platform": "linux", "platform_system": "Linux", "platform_machine": "x86_64",
               "platform_python_implementation": "CPython", "implementation_name": "cpython", "extra": ""}
HEADER = "# images/locks/{image}.txt: the {image} image's requirements, locked. Regenerate with `make lock`."


class LockError(Exception):
    """A lock is missing, malformed or out of step with pyproject.toml; the message says what to run."""


@dataclasses.dataclass(frozen=True)
class Pin:
    name: str
    version: str
    hashes: tuple[str, ...]

    def requirement(self) -> str:
        return f"{self.name}=={self.version}"


@dataclasses.dataclass(frozen=True)
class Lock:
    image: str
    inputs: dict[str, str]  # extras, python, platform, exclude-newer (from the header)
    requirements: list[str]  # the requirement lines the lock was made from
    pins: list[Pin]


def lock_path(image: str) -> str:
    return os.path.join(LOCK_DIR, f"{image}.txt")


def header(image: str, lines: list[str], exclude_newer: str) -> str:
    inputs = [f"#   extras: {' '.join(IMAGES[image])}", f"#   python: {PYTHON_VERSION}", f"#   platform: {PLATFORM}",
              f"#   exclude-newer: {exclude_newer}", "#   requirements (pyproject.toml):"]
    return "\n".join([HEADER.format(image=image), "# inputs:", *inputs, *(f"#     {line}" for line in lines)]) + "\n"


def uv_command(image: str, exclude_newer: str, output: str) -> list[str]:
    uv = shutil.which("uv", path=os.path.dirname(sys.executable)) or shutil.which("uv")
    if uv is None:
        raise LockError(f"uv is not installed for {sys.executable}: pip install -e '.[dev]' (it brings uv)")
    extras = [arg for extra in IMAGES[image] for arg in ("--extra", extra)]
    return [uv, "pip", "compile", PYPROJECT, *extras, "--generate-hashes", "--python-version", PYTHON_VERSION,
            "--python-platform", PLATFORM, "--exclude-newer", exclude_newer, "--no-header", "--quiet",
            "--index-url", "https://pypi.org/simple", "--output-file", output]


def compile_lock(image: str, exclude_newer: str) -> str:
    """Resolve the image's requirements with uv (from PyPI) and write images/locks/IMAGE.txt; returns its path."""
    lines = requirements.read_requirements(PYPROJECT, IMAGES[image])
    os.makedirs(LOCK_DIR, exist_ok=True)
    with tempfile.TemporaryDirectory() as work:
        body = os.path.join(work, f"{image}.txt")
        result = subprocess.run(uv_command(image, exclude_newer, body), capture_output=True, text=True, timeout=1800,
                                cwd=ROOT)
        if result.returncode != 0:
            raise LockError(f"{image}: uv could not resolve its requirements:\n{result.stderr.strip()[-3000:]}")
        with open(body) as f:
            text = f.read()
    with open(lock_path(image), "w") as f:
        f.write(header(image, lines, exclude_newer) + text)
    return lock_path(image)


_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+?)\s*(\\)?$")
_HASH = re.compile(r"^\s+--hash=(sha256:[0-9a-f]{64})\s*(\\)?$")


def read(image: str, path: str | None = None) -> Lock:
    """Parse a lock: its header's inputs and every pin with its hashes."""
    path = path or lock_path(image)
    if not os.path.exists(path):
        raise LockError(f"{os.path.relpath(path, ROOT)} is missing: run `make lock`")
    inputs, lines, pins, current = {}, [], [], None
    with open(path) as f:
        text = f.read().splitlines()
    for number, line in enumerate(text, 1):
        if line.startswith("#     "):
            lines.append(line[6:].strip())
        elif line.startswith("#   ") and ":" in line and not line.startswith("#   requirements"):
            key, _, value = line[4:].partition(":")
            inputs[key.strip()] = value.strip()
        elif match := _PIN.match(line):
            current = Pin(requirements.canonical(match.group(1)), match.group(2), ())
            pins.append(current)
        elif match := _HASH.match(line):
            if current is None:
                raise LockError(f"{path}:{number}: a hash before any pin")
            current = pins[-1] = dataclasses.replace(current, hashes=current.hashes + (match.group(1),))
        elif line.strip() and not line.lstrip().startswith("#"):
            raise LockError(f"{path}:{number}: not a pin, hash or comment: {line.strip()}")
    unhashed = [pin.requirement() for pin in pins if not pin.hashes]
    if unhashed:
        raise LockError(f"{path}: pins without hashes: {', '.join(unhashed)}; run `make lock`")
    return Lock(image, inputs, lines, pins)


def disagreements(image: str, path: str | None = None, pyproject: str = PYPROJECT) -> list[str]:
    """Where the lock and pyproject.toml disagree (empty when they agree). Offline."""
    from packaging.requirements import Requirement

    lock = read(image, path)
    name = os.path.relpath(path or lock_path(image), ROOT)
    wanted = requirements.read_requirements(pyproject, IMAGES[image])
    problems = []
    expected = {"extras": " ".join(IMAGES[image]), "python": PYTHON_VERSION, "platform": PLATFORM}
    for key, value in expected.items():
        if lock.inputs.get(key) != value:
            problems.append(f"{name} was made for {key} {lock.inputs.get(key)!r}, the image needs {value!r}")
    if lock.requirements != wanted:
        added = [r for r in wanted if r not in lock.requirements]
        dropped = [r for r in lock.requirements if r not in wanted]
        problems.append(f"pyproject.toml changed the {image} image's requirements since {name} was made"
                        f"{'; added ' + ', '.join(added) if added else ''}"
                        f"{'; dropped ' + ', '.join(dropped) if dropped else ''}")
    versions = {pin.name: pin.version for pin in lock.pins}
    for line in wanted:
        requirement = Requirement(line)
        if requirement.marker and not requirement.marker.evaluate(ENVIRONMENT):
            continue
        version = versions.get(requirements.canonical(requirement.name))
        if version is None:
            problems.append(f"{name} has no {requirement.name}, which pyproject.toml requires ({line})")
        elif not requirement.specifier.contains(version, prereleases=True):
            problems.append(f"{name} pins {requirement.name}=={version}, outside pyproject.toml's {line}")
    return problems


def check(images: list[str]) -> list[str]:
    problems = []
    for image in images:
        try:
            problems += disagreements(image)
        except LockError as e:
            problems.append(str(e))
    return problems


def default_exclude_newer(now: datetime.datetime) -> str:
    """The start of the UTC day COOLDOWN_DAYS before `now`: what every mirror of PyPI has had for days."""
    day = (now.astimezone(datetime.timezone.utc) - datetime.timedelta(days=COOLDOWN_DAYS)).date()
    return f"{day.isoformat()}T00:00:00Z"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--image", action="append", choices=sorted(IMAGES), help="default: every image")
    parser.add_argument("--check", action="store_true", help="compare the locks with pyproject.toml (offline)")
    parser.add_argument("--exclude-newer", metavar="TIME",
                        help=f"resolve as PyPI stood at this UTC time (default: the start of the UTC day "
                             f"{COOLDOWN_DAYS} days back), e.g. 2026-12-02T00:00:00Z")
    args = parser.parse_args(argv)
    images = args.image or list(IMAGES)
    if args.check:
        problems = check(images)
        for problem in problems:
            print(f"locks.py: {problem}", file=sys.stderr)
        if problems:
            print("locks.py: the locks do not match pyproject.toml: run `make lock`", file=sys.stderr)
            return 1
        print(f"{', '.join(images)}: the locks match pyproject.toml")
        return 0
    exclude_newer = args.exclude_newer or default_exclude_newer(datetime.datetime.now(datetime.timezone.utc))
    try:
        for image in images:
            path = compile_lock(image, exclude_newer)
            print(f"{os.path.relpath(path, ROOT)}: {len(read(image).pins)} packages (PyPI as of {exclude_newer})")
    except (LockError, requirements.RequirementsError, OSError) as e:
        print(f"locks.py: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
