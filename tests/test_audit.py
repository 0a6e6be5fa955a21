"""images/audit.py: the images' locks (images/locks/IMAGE.txt, what the images install) and pip-audit (the real one)
asking OSV about every pin. OSV is the stand-in of tests/standins/osv.py, holding a real advisory
(GHSA-9wx4-h78v-vm56: requests before 2.32.0), so that a known vulnerability is found, fails the audit and is
named, and an ignore entry lets through only its own package. Nothing here asks PyPI: `make audit` and Cloud
Build's audit step ask api.osv.dev itself.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from tests.standins.osv import OsvStandIn, affects

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
AUDIT = os.path.join(ROOT, "images", "audit.py")

sys.path.insert(0, os.path.join(ROOT, "images"))
import audit  # noqa: E402  (images/ holds the images' build tools, not a package)

sys.path.pop(0)

# GHSA-9wx4-h78v-vm56 as OSV serves it (github/advisory-database), trimmed to the fields pip-audit reads.
REQUESTS_SESSION_VERIFY = {
    "schema_version": "1.4.0",
    "id": "GHSA-9wx4-h78v-vm56",
    "aliases": ["CVE-2024-35195"],
    "summary": "Requests `Session` object does not verify requests after making first request with verify=False",
    "published": "2024-05-20T20:15:00Z",
    "affected": [{"package": {"ecosystem": "PyPI", "name": "requests", "purl": "pkg:pypi/requests"},
                  "ranges": [{"type": "ECOSYSTEM", "events": [{"introduced": "0"}, {"fixed": "2.32.0"}]}]}],
}


@pytest.fixture
def osv():
    with OsvStandIn([REQUESTS_SESSION_VERIFY]) as service:
        yield service


def run_audit(osv_url: str, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PIP_AUDIT_OSV_URL=f"{osv_url}/v1/query")
    return subprocess.run([sys.executable, AUDIT, *args], capture_output=True, text=True, timeout=1500, env=env,
                          cwd=ROOT)


def write_pins(tmp_path, *pins: str) -> str:
    path = tmp_path / "pins.txt"
    path.write_text("\n".join(pins) + "\n")
    return str(path)


def test_the_stand_in_evaluates_osv_ranges():
    assert affects(REQUESTS_SESSION_VERIFY, "PyPI", "Requests", "2.31.0")
    assert not affects(REQUESTS_SESSION_VERIFY, "PyPI", "requests", "2.32.0")
    assert not affects(REQUESTS_SESSION_VERIFY, "npm", "requests", "2.31.0")
    events = [{"introduced": "1.0"}, {"last_affected": "1.2"}]
    last = {"affected": [{"package": {"ecosystem": "PyPI", "name": "x"},
                          "ranges": [{"type": "ECOSYSTEM", "events": events}]}]}
    assert [affects(last, "PyPI", "x", v) for v in ("0.9", "1.0", "1.2", "1.2.1")] == [False, True, True, False]


def test_a_known_vulnerability_fails_the_audit_and_names_the_package(osv, tmp_path):
    result = run_audit(osv.url, "--pins", write_pins(tmp_path, "requests==2.31.0", "urllib3==2.8.0", "idna==3.20"))
    assert result.returncode == 1, result.stdout + result.stderr
    (line,) = [line for line in result.stdout.splitlines() if line.startswith("VULNERABLE")]
    assert line.startswith("VULNERABLE pins.txt: requests 2.31.0: ") and line.endswith(", fixed in 2.32.0")
    assert "GHSA-9wx4-h78v-vm56" in line and "CVE-2024-35195" in line  # pip-audit names it by one, aliases the other
    assert "known vulnerabilities in requests 2.31.0" in result.stderr
    asked = sorted(r.body["package"]["name"] for r in osv.requests if r.rpc == "query")
    assert asked == ["idna", "requests", "urllib3"], "pip-audit asks about every pin, once"


def test_a_fixed_version_passes(osv, tmp_path):
    result = run_audit(osv.url, "--pins", write_pins(tmp_path, "requests==2.32.0", "urllib3==2.8.0"))
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.splitlines()[-1] == "audit passed: no known vulnerabilities"


def test_an_ignore_entry_lets_through_its_own_package_only(osv, tmp_path):
    pins = write_pins(tmp_path, "requests==2.31.0")
    ignore = tmp_path / "ignore.toml"
    ignore.write_text('[[ignore]]\nadvisory = "CVE-2024-35195"\npackage = "requests"\n'
                      'reason = "kfp pins requests exactly; no Session here uses verify=False"\n')
    result = run_audit(osv.url, "--pins", pins, "--ignore-file", str(ignore))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "ignored  pins.txt: requests 2.31.0: " in result.stdout and "GHSA-9wx4-h78v-vm56" in result.stdout
    assert "because: kfp pins requests exactly" in result.stdout

    ignore.write_text('[[ignore]]\nadvisory = "GHSA-9wx4-h78v-vm56"\npackage = "urllib3"\nreason = "wrong package"\n')
    result = run_audit(osv.url, "--pins", pins, "--ignore-file", str(ignore))
    assert result.returncode == 1 and "VULNERABLE pins.txt: requests 2.31.0" in result.stdout


@pytest.mark.parametrize("entry", [
    'advisory = "GHSA-9wx4-h78v-vm56"\npackage = "requests"\n',
    'advisory = "*"\npackage = "requests"\nreason = "all"\nscope = "everything"\n'])
def test_an_ignore_entry_without_a_reason_or_with_extra_keys_is_refused(osv, tmp_path, entry):
    ignore = tmp_path / "ignore.toml"
    ignore.write_text("[[ignore]]\n" + entry)
    result = run_audit(osv.url, "--pins", write_pins(tmp_path, "requests==2.31.0"), "--ignore-file", str(ignore))
    assert result.returncode == 2 and "needs advisory, package and reason" in result.stderr


def test_an_unreachable_service_is_an_error_not_a_pass(tmp_path):
    result = run_audit("http://127.0.0.1:9", "--pins", write_pins(tmp_path, "requests==2.32.0"))
    assert result.returncode == 2, result.stdout + result.stderr
    assert "pip-audit did not run" in result.stderr


def test_the_repositorys_ignore_list_is_well_formed():
    for ignore in audit.read_ignores():
        assert ignore.reason and ignore.package and re.fullmatch(r"(GHSA|PYSEC|CVE)-[\w-]+", ignore.advisory)


def test_an_image_is_audited_as_its_lock_pins_it(osv):
    """The torch image (the TensorFlow-free one, torch and JAX): every package its lock pins is asked about, and
    nothing is resolved (the lock is what the image installs)."""
    result = run_audit(osv.url, "--image", "torch")
    assert result.returncode == 0, result.stdout + result.stderr[-3000:]
    pins = [pin.requirement() for pin in audit.locks.read("torch").pins]
    names = {p.split("==")[0] for p in pins}
    assert {"torch", "keras", "kfp", "google-cloud-aiplatform", "requests", "urllib3"} <= names
    assert {"jax", "jaxlib", "jax-cuda13-plugin", "jax-cuda13-pjrt"} <= names, "JAX for CUDA 13 rides along"
    assert not names & {"tensorflow", "tensorflow-cpu"}
    vertex = next(p for p in pins if p.startswith("google-cloud-aiplatform=="))
    assert vertex.split("==")[1].startswith("1."), f"{vertex}: not the Vertex SDK major version the tests run"
    asked = {(r.body["package"]["name"], r.body["version"]) for r in osv.requests if r.rpc == "query"}
    assert asked == {tuple(p.split("==")) for p in pins}, "every pin, at the version the lock holds"
    assert f"torch: {len(pins)} packages audited (images/locks/torch.txt), 0 known vulnerabilities" in result.stdout


def test_a_lock_out_of_step_with_pyproject_is_an_error_not_an_audit(osv, tmp_path, monkeypatch):
    """A lock that no longer matches pyproject.toml would audit something the next build does not install."""
    lock = audit.locks.read("gpu")
    stale = tmp_path / "gpu.txt"
    text = open(audit.locks.lock_path("gpu")).read()
    tensorflow = next(p for p in lock.pins if p.name == "tensorflow")
    stale.write_text(text.replace(f"tensorflow=={tensorflow.version} ", "tensorflow==2.20.0 "))
    monkeypatch.setattr(audit.locks, "lock_path", lambda image: str(stale))
    with pytest.raises(audit.AuditError) as failure:
        audit.locked_pins("gpu")
    assert "pins tensorflow==2.20.0, outside pyproject.toml's tensorflow[and-cuda]==2.21.*" in str(failure.value)
    assert str(failure.value).endswith("run `make lock`")
