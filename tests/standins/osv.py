"""OSV's vulnerability API, `POST /v1/query` only: what pip-audit's OSV service asks (`pip-audit
--vulnerability-service osv`, pointed here with `--osv-url` or PIP_AUDIT_OSV_URL).

Source: google/osv.dev docs/api/post-v1-query.md (the request: `{"package": {"name", "ecosystem"}, "version"}`;
the answer: `{"vulns": [OSV records]}`, and `{}` when nothing affects that version, which pip-audit reads as no
vulnerability: pip_audit/_service/osv.py `OsvService.query`), and the OSV schema (ossf/osv-schema, docs/schema.md)
for whether a record affects a version: an `affected` entry for the same ecosystem and package (PyPI names compared
normalised, PEP 503) whose `versions` list the version, or one of whose `ECOSYSTEM` ranges contains it: events
sorted by version, the version affected from an `introduced` ("0": from the start) up to a `fixed` (excluded) or a
`last_affected` (included). Versions order as PEP 440 says (the PyPI ecosystem's ordering).

The advisories are the test's: real OSV records (or trimmed copies of them) passed to the stand-in.
"""

from __future__ import annotations

import re

from packaging.version import InvalidVersion, Version

from tests.standins.base import ApiError, StandIn, route


def _pypi_name(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _in_range(version: Version, events: list[dict]) -> bool:
    """OSV's ECOSYSTEM range evaluation for one ordered version."""
    def key(event):
        value = next(iter(event.values()))
        return Version("0") if value == "0" else Version(value)

    affected = False
    for event in sorted(events, key=key):
        kind, value = next(iter(event.items()))
        bound = Version("0") if value == "0" else Version(value)
        if kind == "introduced" and version >= bound:
            affected = True
        elif kind == "fixed" and version >= bound:
            affected = False
        elif kind == "last_affected" and version > bound:
            affected = False
    return affected


def affects(record: dict, ecosystem: str, name: str, version: str) -> bool:
    try:
        parsed = Version(version)
    except InvalidVersion:
        parsed = None
    for affected in record.get("affected", []):
        package = affected.get("package", {})
        if package.get("ecosystem") != ecosystem or _pypi_name(package.get("name", "")) != _pypi_name(name):
            continue
        if version in affected.get("versions", []):
            return True
        for ranges in affected.get("ranges", []):
            if ranges.get("type") == "ECOSYSTEM" and parsed is not None and _in_range(parsed, ranges["events"]):
                return True
    return False


class OsvStandIn(StandIn):
    name = "OSV"

    def __init__(self, advisories: list[dict], **kwargs):
        super().__init__(**kwargs)
        self.advisories = advisories

    def routes(self):
        return [route("POST", r"/v1/query", "query", self.query)]

    def query(self, request):
        body = request.json()
        package, version = body.get("package") or {}, body.get("version")
        if not version or not package.get("name") or not package.get("ecosystem"):
            raise ApiError("INVALID_ARGUMENT", "Query needs a package name and ecosystem, and a version.")
        vulns = [record for record in self.advisories
                 if affects(record, package["ecosystem"], package["name"], version)]
        return {"vulns": vulns} if vulns else {}
