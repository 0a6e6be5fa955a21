"""The TrainJobs `launch_training` makes, turned into JobSets by the real Kubeflow Trainer v2.3.0 controller and into
Jobs by the real JobSet v0.12.0 controller (tests/control_plane with `controllers=True`: both run in the harness's
controller-runtime manager on envtest's API server, with Trainer's webhooks, as their own integration tests run
them), beside what the stand-in (tests/standins/trainer.py) makes of the same TrainJob; then the launcher following
a TrainJob whose Jobs complete, fail, or fail and restart, ended the way JobSet's own integration tests end them (no
kube-controller-manager or kubelet runs here: no pods, so no pod exit codes or logs to quote).

Both are given the objects as the API server stored them, and the stand-in's JobSet is defaulted by a server-side
dry run, so that a difference left is the controllers' and not the API server's defaulting.
"""

from __future__ import annotations

import json
import threading
import time

import pytest

from components.gcp.errors import JobFailed
from tests import control_plane
from tests.conftest import started_control_plane
from tests.test_control_plane import KUBEFLOW, applied, dry_run, dry_run_cases


@pytest.fixture(scope="module")
def controllers():
    """The control plane with Trainer's and JobSet's controllers; skipped without Go, a failure where REQUIRE_GO=1."""
    with started_control_plane(controllers=True) as plane:
        yield plane


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


@pytest.mark.parametrize("framework", ["torch", "jax", "tensorflow"])
def test_the_real_jobset_controller_makes_the_jobs_the_stand_in_makes(controllers, framework):
    """The Job the real JobSet controller creates for the TrainJob's JobSet: its pods get the jobset.sigs.k8s.io
    labels and annotations and the subdomain the stand-in gives them (tests/standins/jobsets.py JobSetRun), and the
    Job's pod template is the replicated job's once the API server has defaulted it."""
    import copy

    from tests.standins.jobsets import JobSetRun

    api = controllers.api_client()
    kinds = resources(api)
    name = f"jobs-{framework}"
    trainjob = dry_run(["--dry-run", "--launcher", "trainjob", "--framework", framework, "--name", name, "--image",
                        "europe-docker.pkg.dev/p/ml/train:1", "--workers", "1", "--gpus", "1", "--", "python", "-m",
                        "components.train"])
    applied(api, [KUBEFLOW, *trainjob[:-1]])
    applied(api, trainjob[-1:])
    jobset = wait_for(lambda: read(kinds["JobSet"], name, "kubeflow"))
    job = wait_for(lambda: read(kinds["Job"], f"{name}-node-0", "kubeflow"))
    stand_in = JobSetRun(copy.deepcopy(jobset), "kubeflow", run_containers=False, now=lambda: "")
    stand_in.uid = jobset["metadata"]["uid"]
    rjob = stand_in.spec["replicatedJobs"][0]
    template = rjob["template"]["spec"]["template"]
    jobset_keys = stand_in.pod_labels(rjob, 0)
    labels = job["spec"]["template"]["metadata"]["labels"]
    # the Job's own selector labels are the API server's (batch/v1 Job defaulting), not the JobSet controller's
    selector = {"batch.kubernetes.io/job-name", "job-name", "batch.kubernetes.io/controller-uid", "controller-uid"}
    assert differences({k: v for k, v in labels.items() if k not in selector},
                       {**template["metadata"].get("labels", {}), **jobset_keys}) == []
    assert differences(job["spec"]["template"]["metadata"]["annotations"],
                       {**template["metadata"].get("annotations", {}), **jobset_keys}) == []
    assert job["spec"]["template"]["spec"]["subdomain"] == stand_in.subdomain
    made = dict(jobset["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"],
                subdomain=stand_in.subdomain)
    from kubernetes import client

    # a Job of that pod template, dry run: the API server's defaults for a Job's template (not a Pod's admission)
    defaulted = api.sanitize_for_serialization(client.BatchV1Api(api).create_namespaced_job("kubeflow", {
        "apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": f"{name}-stand-in"},
        "spec": {"template": {"spec": made}}}, dry_run="All"))
    assert differences(job["spec"]["template"]["spec"], defaulted["spec"]["template"]["spec"]) == []


# ---- the launcher following the TrainJob while the Jobs end as JobSet's integration tests end them ---------------

def complete_job(batch, job: dict) -> None:
    """JobSet v0.12.0 test/integration/controller/jobset_controller_test.go:3460-3486 completeJob: the conditions
    and counts kube-controller-manager's Job controller (not running here) would write."""
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    status = job.get("status") or {}
    batch.patch_namespaced_job_status(job["metadata"]["name"], job["metadata"]["namespace"], {"status": {
        "startTime": status.get("startTime") or now, "completionTime": now,
        "succeeded": job["spec"].get("parallelism", 0),
        "conditions": [*(status.get("conditions") or []),
                       {"type": "SuccessCriteriaMet", "status": "True"}, {"type": "Complete", "status": "True"}]}})


def fail_job(batch, job: dict, reason: str, message: str) -> None:
    """jobset_controller_test.go:3567-3592 failJobWithOptions: FailureTarget, then Failed with the reason the Job
    controller gives (PodFailurePolicy when a podFailurePolicy FailJob rule matched an exit code,
    BackoffLimitExceeded when a pod failed past backoffLimit)."""
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    status = job.get("status") or {}
    batch.patch_namespaced_job_status(job["metadata"]["name"], job["metadata"]["namespace"], {"status": {
        "startTime": status.get("startTime") or now,
        "conditions": [*(status.get("conditions") or []),
                       {"type": "FailureTarget", "status": "True", "reason": reason, "message": message},
                       {"type": "Failed", "status": "True", "reason": reason, "message": message}]}})


def follow(api, trainjob: dict, end_jobs) -> tuple[object, list[str]]:
    """The TrainJob launcher's run of `trainjob` (its outcome, or the error it raised) and the lines it printed,
    while `end_jobs(batch, jobs)` ends the JobSet's Jobs as they appear (it returns True when it is done)."""
    from kubernetes import client

    from components.launch.training import KUBERNETES_LAUNCHERS

    lines: list[str] = []
    result: list = []
    launcher = KUBERNETES_LAUNCHERS["trainjob"](api, trainjob["metadata"]["namespace"], poll_seconds=0.2,
                                                timeout_seconds=90, echo=lines.append)

    def run():
        try:
            result.append(launcher.run(trainjob))
        except Exception as e:  # noqa: BLE001 - the error is what the test looks at
            result.append(e)

    runner = threading.Thread(target=run, daemon=True)
    runner.start()
    batch = client.BatchV1Api(api)
    name = trainjob["metadata"]["name"]
    ended: set[str] = set()
    deadline = time.monotonic() + 90
    while runner.is_alive() and time.monotonic() < deadline:
        mine = [j for j in batch.list_namespaced_job(trainjob["metadata"]["namespace"]).to_dict()["items"]
                if (j["metadata"].get("labels") or {}).get("jobset.sigs.k8s.io/jobset-name") == name]
        for job in mine:  # the garbage collector's part, which does not run here: a Job with no pods has no
            # dependents, so its foreground deletion ends at once (jobset_controller_test.go:3514-3535
            # removeForegroundDeletionFinalizers); JobSet deletes Jobs that way to restart them
            finalizers = job["metadata"].get("finalizers") or []
            if job["metadata"].get("deletion_timestamp") and "foregroundDeletion" in finalizers:
                batch.patch_namespaced_job(job["metadata"]["name"], job["metadata"]["namespace"], [
                    {"op": "test", "path": "/metadata/finalizers", "value": finalizers},
                    {"op": "replace", "path": "/metadata/finalizers",
                     "value": [f for f in finalizers if f != "foregroundDeletion"]}])
        jobs = [j for j in mine if not j["metadata"].get("deletion_timestamp") and j["metadata"]["uid"] not in ended]
        for job in jobs:
            fresh = api.sanitize_for_serialization(batch.read_namespaced_job(job["metadata"]["name"],
                                                                             job["metadata"]["namespace"]))
            end_jobs(batch, fresh)
            ended.add(job["metadata"]["uid"])
        time.sleep(0.2)
    runner.join(5)
    assert result, f"the launcher did not end in 90s: {lines[-5:]}"
    return result[0], lines


def torch_trainjob(api, name: str) -> dict:
    """A torch TrainJob of 2 nodes as the launcher makes it, its runtime (manifests/trainer) installed by an admin."""
    *runtimes, trainjob = dry_run(["--dry-run", "--launcher", "trainjob", "--framework", "torch", "--name", name,
                                   "--image", "europe-docker.pkg.dev/p/ml/train:1", "--workers", "1", "--gpus", "1",
                                   "--", "python", "-m", "components.train"])
    applied(api, [KUBEFLOW, *runtimes])
    return trainjob


def test_the_launcher_reports_a_run_whose_jobs_complete(controllers):
    """The Jobs complete: JobSet marks the JobSet Completed, Trainer the TrainJob Complete, and the launcher
    returns its outcome, as against the stand-in (tests/test_trainjob.py)."""
    api = controllers.api_client()
    outcome, lines = follow(api, torch_trainjob(api, "ends-complete"), lambda batch, job: complete_job(batch, job))
    assert not isinstance(outcome, Exception), outcome
    assert (outcome.name, outcome.state, outcome.restarts) == ("ends-complete", "Complete", 0)


def test_the_launcher_reports_a_permanent_failure_as_against_the_stand_in(controllers):
    """A node exits with a code of the runtime's FailJob rule (1-127): the Job fails with reason PodFailurePolicy,
    the runtime's JobSet rule fails the JobSet at once, Trainer fails the TrainJob with its message, and the
    launcher raises the line tests/test_trainjob.py's
    test_a_permanent_failure_fails_at_once_with_the_reason asserts against the stand-in."""
    api = controllers.api_client()
    outcome, _ = follow(api, torch_trainjob(api, "ends-permanent"), lambda batch, job: fail_job(
        batch, job, "PodFailurePolicy", "Container node for pod x failed with exit code 2 matching FailJob rule"))
    assert isinstance(outcome, JobFailed), outcome
    assert "TrainJob kubeflow/ends-permanent ended Failed: applying FailJobSet failure policy action" in str(outcome)


def test_the_launcher_reports_a_node_that_exits_143_as_against_the_stand_in(controllers):
    """A node exits with 143 (SIGTERM), which no FailJob rule names: the Job fails with BackoffLimitExceeded
    (backoffLimit 0), JobSet recreates all Jobs (BlockingRecreate) until the runtime's maxRestarts (6), then fails;
    the launcher raises the line tests/test_trainjob.py's test_retryable_failures_stop_after_the_runtimes_restarts
    asserts against the stand-in."""
    api = controllers.api_client()
    outcome, _ = follow(api, torch_trainjob(api, "ends-143"), lambda batch, job: fail_job(
        batch, job, "BackoffLimitExceeded", "Job has reached the specified backoff limit"))
    assert isinstance(outcome, JobFailed), outcome
    assert "reaching max number of restarts" in str(outcome)
    jobset = read(resources(api)["JobSet"], "ends-143", "kubeflow")
    assert jobset["status"]["restarts"] == 6
