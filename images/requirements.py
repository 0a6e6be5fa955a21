"""Print the requirements an image is locked from, read from pyproject.toml: the one place the ranges live.

    python3 images/requirements.py pyproject.toml --extra cpu --extra beam

images/locks.py resolves these lines into each image's lock (images/locks/IMAGE.txt) and checks the lock
against them; images/audit.py names them when it explains a lock. Needs Python 3.11+ (tomllib) and no
third-party package.
"""

from __future__ import annotations

import argparse
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("pyproject", help="path of pyproject.toml")
    parser.add_argument("--extra", action="append", default=[], help="optional-dependency group to include")
    args = parser.parse_args(argv)
    try:
        lines = read_requirements(args.pyproject, args.extra)
    except RequirementsError as e:
        print(f"requirements.py: error: {e}", file=sys.stderr)
        return 2
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
