"""Audit the images' locked requirements for known vulnerabilities: pip-audit over exactly the pins each image
installs (images/locks/IMAGE.txt, installed with --require-hashes --no-deps; `make lock` writes them).

    python images/audit.py                      # every image (`make audit`; Cloud Build's audit step)
    python images/audit.py --image gpu
    python images/audit.py --pins requirements.txt

Each lock is first checked against pyproject.toml (images/locks.py: a lock out of step is an error, not an
audit), then its pins (name==version) are handed to pip-audit, which looks every pin up in OSV's database
(api.osv.dev; PIP_AUDIT_OSV_URL points it elsewhere). Nothing is resolved here: what is audited is what the
images install. A known vulnerability fails the audit and is named: image, package, version, advisory and the
versions that fix it. The exceptions are the advisories in images/audit-ignore.toml, each with the package it
is for and why it cannot be fixed yet; an advisory is ignored only for that package, and an entry that matches
nothing any more is named as stale. A package the service could not be asked about is an error, never a pass.

Exit status: 0 when nothing unignored is found, 1 when something is, 2 when the audit itself could not run.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import tomllib

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
import locks  # noqa: E402  (images/locks.py: the images' locks and their check against pyproject.toml)
import requirements  # noqa: E402

sys.path.pop(0)

IGNORE_FILE = os.path.join(HERE, "audit-ignore.toml")


class AuditError(Exception):
    """The audit could not run; the message says why."""


@dataclasses.dataclass(frozen=True)
class Finding:
    image: str
    package: str
    version: str
    advisory: str
    aliases: tuple[str, ...]
    fix_versions: tuple[str, ...]

    def line(self) -> str:
        fixed = f"fixed in {', '.join(self.fix_versions)}" if self.fix_versions else "no fixed version yet"
        aliases = f" ({', '.join(self.aliases)})" if self.aliases else ""
        return f"{self.image}: {self.package} {self.version}: {self.advisory}{aliases}, {fixed}"


@dataclasses.dataclass(frozen=True)
class Ignore:
    advisory: str
    package: str
    reason: str

    def matches(self, finding: Finding) -> bool:
        return (requirements.canonical(finding.package) == requirements.canonical(self.package)
                and self.advisory in (finding.advisory, *finding.aliases))


def read_ignores(path: str = IGNORE_FILE) -> list[Ignore]:
    """The commented exceptions: every entry names an advisory, its package and the reason; nothing blanket."""
    with open(path, "rb") as f:
        entries = tomllib.load(f).get("ignore", [])
    ignores = []
    for number, entry in enumerate(entries, 1):
        missing = [key for key in ("advisory", "package", "reason") if not str(entry.get(key, "")).strip()]
        unknown = sorted(set(entry) - {"advisory", "package", "reason"})
        if missing or unknown:
            raise AuditError(f"{path}: entry {number} needs advisory, package and reason"
                             f"{'; missing ' + ', '.join(missing) if missing else ''}"
                             f"{'; unknown ' + ', '.join(unknown) if unknown else ''}")
        ignores.append(Ignore(entry["advisory"].strip(), entry["package"].strip(), entry["reason"].strip()))
    return ignores


def locked_pins(image: str) -> list[str]:
    """name==version of everything the image installs (its lock), once the lock is known to match pyproject.toml."""
    problems = locks.disagreements(image)
    if problems:
        raise AuditError(f"{image}: " + "; ".join(problems) + ": run `make lock`")
    return [pin.requirement() for pin in locks.read(image).pins]


def _last_lines(text: str, count: int = 8) -> str:
    return "\n".join(text.strip().splitlines()[-count:])


def audit(image: str, pins: list[str]) -> list[Finding]:
    """pip-audit over the pins, as they are (no second resolution)."""
    if importlib.util.find_spec("pip_audit") is None:
        raise AuditError(f"pip-audit is not installed for {sys.executable}: pip install -e '.[dev]' (or pip-audit)")
    with tempfile.TemporaryDirectory() as work:
        pinned, output = os.path.join(work, "requirements.txt"), os.path.join(work, "audit.json")
        with open(pinned, "w") as f:
            f.write("\n".join(pins) + "\n")
        # OSV, where PyPI's advisories come from (its URL from PIP_AUDIT_OSV_URL when set: the tests' stand-in).
        result = subprocess.run([sys.executable, "-m", "pip_audit", "--vulnerability-service", "osv", "--disable-pip",
                                 "--no-deps", "--progress-spinner", "off", "--requirement", pinned, "--format", "json",
                                 "--output", output],
                                capture_output=True, text=True, timeout=900)
        if not os.path.exists(output) or result.returncode not in (0, 1):
            raise AuditError(f"{image}: pip-audit did not run (exit {result.returncode}):\n{_last_lines(result.stderr)}")
        with open(output) as f:
            report = json.load(f)
    findings = []
    for dependency in report.get("dependencies", []):
        if "skip_reason" in dependency:
            raise AuditError(f"{image}: pip-audit skipped {dependency['name']}: {dependency['skip_reason']}")
        for vuln in dependency.get("vulns", []):
            findings.append(Finding(image, dependency["name"], dependency["version"], vuln["id"],
                                    tuple(vuln.get("aliases", [])), tuple(vuln.get("fix_versions", []))))
    return findings


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--image", action="append", choices=sorted(locks.IMAGES), help="default: every image")
    parser.add_argument("--pins", metavar="FILE", help="audit these name==version pins instead of an image's lock")
    parser.add_argument("--ignore-file", default=IGNORE_FILE, help="the commented exceptions (default: %(default)s)")
    args = parser.parse_args(argv)
    try:
        ignores = read_ignores(args.ignore_file)
        findings = []
        if args.pins:
            with open(args.pins) as f:
                findings += audit(os.path.basename(args.pins), [line.strip() for line in f if line.strip()])
        for image in ([] if args.pins else args.image or list(locks.IMAGES)):
            pins = locked_pins(image)
            image_findings = audit(image, pins)
            findings += image_findings
            print(f"{image}: {len(pins)} packages audited (images/locks/{image}.txt), "
                  f"{len(image_findings)} known vulnerabilities")
    except (AuditError, locks.LockError, requirements.RequirementsError, OSError, tomllib.TOMLDecodeError) as e:
        print(f"audit.py: error: {e}", file=sys.stderr)
        return 2
    failing = [f for f in findings if not any(ignore.matches(f) for ignore in ignores)]
    for finding in findings:
        if finding not in failing:
            reason = next(i.reason for i in ignores if i.matches(finding))
            print(f"ignored  {finding.line()}\n         because: {reason}")
    for ignore in ignores if not (args.image or args.pins) else []:  # stale only when every image was audited
        if not any(ignore.matches(f) for f in findings):
            print(f"stale    {ignore.advisory} for {ignore.package} matches nothing any more: remove it from "
                  f"{os.path.relpath(args.ignore_file, ROOT)}")
    for finding in failing:
        print(f"VULNERABLE {finding.line()}")
    if failing:
        packages = sorted({f"{f.package} {f.version}" for f in failing})
        print(f"audit failed: known vulnerabilities in {', '.join(packages)}: relock with `make lock` (after raising "
              f"their range in pyproject.toml where it holds them back), or, when a pin outside this project holds "
              f"them back, add a commented entry to {os.path.relpath(args.ignore_file, ROOT)}", file=sys.stderr)
        return 1
    print("audit passed: no known vulnerabilities" + (" outside the commented exceptions" if findings else ""))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
