"""The TrainJobs `launch_training` makes, turned into JobSets by the real Kubeflow Trainer v2.3.0 controller and into
Jobs by the real JobSet v0.12.0 controller (tests/control_plane with `controllers=True`: both run in the harness's
controller-runtime manager on envtest's API server, with Trainer's webhooks, as their own integration tests run
them), beside what the stand-in (tests/standins/trainer.py) makes of the same TrainJob.

Both are given the objects as the API server stored them, and the stand-in's JobSet is defaulted by a server-side
dry run, so that a difference left is the controllers' and not the API server's defaulting.
"""

from __future__ import annotations

import json
import os
import time

import pytest

from tests import control_plane
from tests.test_control_plane import KUBEFLOW, applied, dry_run, dry_run_cases


@pytest.fixture(scope="module")
def controllers():
    """The control plane with Trainer's and JobSet's controllers; skipped without Go, a failure where REQUIRE_GO=1."""
    plane = control_plane.ControlPlane(controllers=True)
    try:
        plane.start()
    except control_plane.GoMissing as missing:
        if os.environ.get("REQUIRE_GO") == "1":
            pytest.fail(f"REQUIRE_GO=1 and {missing}")
        pytest.skip(str(missing))
    try:
        yield plane
    finally:
        plane.stop()


def differences(real, stand_in, path: str = "") -> list[str]:
    """`path: real -> stand-in` for each value that differs (lists item by item when their lengths agree)."""
    if isinstance(real, dict) and isinstance(stand_in, dict):
        return [line for key in sorted(set(real) | set(stand_in))
                for line in differences(real.get(key), stand_in.get(key), f"{path}.{key}")]
    if isinstance(real, list) and isinstance(stand_in, list) and len(real) == len(stand_in):
        return [line for i, (a, b) in enumerate(zip(real, stand_in)) for line in differences(a, b, f"{path}[{i}]")]
    return [] if real == stand_in else [f"{path}: {json.dumps(real)} -> {json.dumps(stand_in)}"]


def wait_for(read, seconds: float = 60.0):
    """read()'s first answer that is not None, polling; fails after `seconds`."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        found = read()
        if found is not None:
            return found
        time.sleep(0.25)
    pytest.fail(f"nothing after {seconds:.0f}s")


def resources(api):
    from kubernetes import dynamic

    found = dynamic.DynamicClient(api).resources
    return {kind: found.get(api_version=version, kind=kind) for version, kind in [
        ("trainer.kubeflow.org/v1alpha1", "TrainJob"), ("trainer.kubeflow.org/v1alpha1", "ClusterTrainingRuntime"),
        ("jobset.x-k8s.io/v1alpha2", "JobSet"), ("batch/v1", "Job")]}


def read(resource, name: str, namespace: str | None = None) -> dict | None:
    from kubernetes.dynamic.exceptions import NotFoundError

    try:
        return resource.get(name=name, namespace=namespace).to_dict()
    except NotFoundError:
        return None


# Trainer writes `resources: {}` on a container the runtime gives no resources (the TCPXO daemon, a native sidecar)
# where the stand-in leaves the field out; a container reads both the same (no requests, no limits).
EMPTY_RESOURCES = {"trainjob-tcpxo": ["[0].template.spec.template.spec.initContainers[0].resources: {} -> null"]}
TRAINJOB_CASES = [(case, argv) for case, argv in dry_run_cases() if case.startswith("trainjob-")]


@pytest.mark.parametrize("case,argv", TRAINJOB_CASES, ids=[case for case, _ in TRAINJOB_CASES])
def test_the_real_trainer_makes_the_jobset_the_stand_in_makes(controllers, case, argv):
    """Each TrainJob of `python -m components.launch --launcher trainjob` (torch, JAX and TensorFlow runtimes of
    manifests/trainer, GPUDirect, Kueue and Spot, MIG): the JobSet the real Trainer controller creates has the
    replicated jobs (pod templates: PET_* and JAX_* env, command, resources, node selector, tolerations, volumes)
    the stand-in creates. The differences: Trainer writes `suspend: false` where the stand-in leaves it out (v2.3.0
    pkg/runtime/framework/plugins/jobset/jobset.go:425 copies the TrainJob's), which a JobSet reads the same, and
    the `resources: {}` of EMPTY_RESOURCES."""
    from tests.standins.trainer import trainjob_jobset

    api = controllers.api_client()
    kinds = resources(api)
    *runtimes, trainjob = dry_run(argv)
    # the runtime first: Trainer's validating webhook refuses a TrainJob (dry run too) whose runtime is not there
    applied(api, [KUBEFLOW, *runtimes])
    applied(api, [trainjob])
    name, namespace = trainjob["metadata"]["name"], trainjob["metadata"]["namespace"]
    real = wait_for(lambda: read(kinds["JobSet"], name, namespace))
    stored = read(kinds["TrainJob"], name, namespace)
    runtime = read(kinds["ClusterTrainingRuntime"], stored["spec"]["runtimeRef"]["name"])
    made, problems = trainjob_jobset(stored, runtime)
    assert problems == []
    made["metadata"] = {"name": f"{name}-stand-in", "namespace": namespace}
    defaulted = kinds["JobSet"].create(body=made, namespace=namespace, query_params=[("dryRun", "All")]).to_dict()

    found = differences(real["spec"]["replicatedJobs"], defaulted["spec"]["replicatedJobs"])
    assert found == EMPTY_RESOURCES.get(case, [])
    rest = lambda spec: {k: v for k, v in spec.items() if k != "replicatedJobs"}  # noqa: E731
    assert differences(rest(real["spec"]), rest(defaulted["spec"])) == [".suspend: false -> null"]
    owner = real["metadata"]["ownerReferences"]
    assert [(o["kind"], o["name"], o["uid"], o.get("controller")) for o in owner] == [
        ("TrainJob", name, stored["metadata"]["uid"], True)]
