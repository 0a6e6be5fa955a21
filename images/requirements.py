"""Print the requirements an image installs, read from pyproject.toml: the one place the pins live.

Used by the Dockerfiles before the sources are copied, so the dependency layer is rebuilt only when
pyproject.toml changes:

    python3 requirements.py pyproject.toml --extra cpu --extra beam > requirements.txt
    python3 requirements.py pyproject.toml --extra gpu > requirements.txt

``--forbid DIST`` fails when DIST is installed (after the install: nothing may have pulled tensorflow-cpu
next to the GPU image's tensorflow, nor any TensorFlow into the torch image). Needs Python 3.11+ (tomllib)
and no third-party package. images/audit.py reads the same requirements to audit them.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import re
import sys
import tomllib

class RequirementsError(Exception):
    """The pyproject and the image disagree; the message says what to change."""


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def read_requirements(pyproject_path: str, extras: list[str]) -> list[str]:
    """The project's dependencies followed by those of each extra, in pyproject order."""
    with open(pyproject_path, "rb") as f:
        project = tomllib.load(f).get("project", {})
    lines = list(project.get("dependencies", []))
    optional = project.get("optional-dependencies", {})
    for extra in extras:
        if extra not in optional:
            raise RequirementsError(f"{pyproject_path} has no extra {extra!r}; it has: {', '.join(optional) or 'none'}")
        lines += optional[extra]
    return lines


def installed_version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("pyproject", help="path of pyproject.toml")
    parser.add_argument("--extra", action="append", default=[], help="optional-dependency group to include")
    parser.add_argument("--forbid", action="append", default=[], metavar="DIST",
                        help="fail if this distribution is installed")
    args = parser.parse_args(argv)
    try:
        present = [dist for dist in args.forbid if installed_version(dist) is not None]
        if present:
            raise RequirementsError(f"{', '.join(present)} must not be installed in this image: a dependency pulled "
                                    f"it in next to the image's own framework build")
        lines = read_requirements(args.pyproject, args.extra)
    except RequirementsError as e:
        print(f"requirements.py: error: {e}", file=sys.stderr)
        return 2
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
