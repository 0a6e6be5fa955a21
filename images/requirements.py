"""Print the requirements an image installs, read from pyproject.toml: the one place the pins live.

Used by the Dockerfiles before the sources are copied, so the dependency layer is rebuilt only when
pyproject.toml changes:

    python3 requirements.py pyproject.toml --extra cpu > requirements.txt
    python3 requirements.py pyproject.toml --extra gpu --from-base tensorflow > requirements.txt

``--from-base DIST`` is for a base image that already ships DIST (the TensorFlow GPU image ships
TensorFlow built against its CUDA): the extra's requirement on DIST is checked against the installed
version (a mismatch stops the build with what to change) and replaced by ``DIST==<installed>``, so pip
keeps it and resolves everything else against its requirements instead of reinstalling it.
``--forbid DIST`` fails when DIST is installed (after the install: nothing may have pulled
tensorflow-cpu next to the base image's tensorflow). Needs Python 3.11+ (tomllib) and no third-party
package, except `packaging` for ``--from-base`` (TensorFlow depends on it).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import re
import sys
import tomllib

_NAME = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)")


class RequirementsError(Exception):
    """The pyproject and the image disagree; the message says what to change."""


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def requirement_name(line: str) -> str:
    match = _NAME.match(line)
    if not match:
        raise RequirementsError(f"cannot read a distribution name from requirement {line!r}")
    return canonical(match.group(1))


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


def pin_base_provided(lines: list[str], dist: str, version_of=installed_version) -> list[str]:
    """Replace the requirements on ``dist`` by ``dist==<installed version>``, after checking it satisfies them."""
    from packaging.requirements import Requirement

    wanted = [line for line in lines if requirement_name(line) == canonical(dist)]
    if not wanted:
        raise RequirementsError(f"no requirement on {dist} in the selected dependencies; nothing to take from the base")
    version = version_of(dist)
    if version is None:
        raise RequirementsError(f"the base image has no {dist} installed, but --from-base {dist} says it should")
    for line in wanted:
        specifier = Requirement(line).specifier
        if not specifier.contains(version, prereleases=True):
            raise RequirementsError(
                f"the base image has {dist} {version}, but pyproject.toml asks for {line!r}: change the base "
                f"image tag in the Dockerfile or the pin in pyproject.toml so that they agree")
    return [line for line in lines if line not in wanted] + [f"{dist}=={version}"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("pyproject", help="path of pyproject.toml")
    parser.add_argument("--extra", action="append", default=[], help="optional-dependency group to include")
    parser.add_argument("--from-base", action="append", default=[], metavar="DIST",
                        help="distribution the base image already has: check it and keep it")
    parser.add_argument("--forbid", action="append", default=[], metavar="DIST",
                        help="fail if this distribution is installed")
    args = parser.parse_args(argv)
    try:
        present = [dist for dist in args.forbid if installed_version(dist) is not None]
        if present:
            raise RequirementsError(f"{', '.join(present)} must not be installed in this image: a dependency pulled "
                                    f"it in next to the base image's build")
        lines = read_requirements(args.pyproject, args.extra)
        for dist in args.from_base:
            lines = pin_base_provided(lines, dist)
    except RequirementsError as e:
        print(f"requirements.py: error: {e}", file=sys.stderr)
        return 2
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
