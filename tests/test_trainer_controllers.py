"""The TrainJobs `launch_training` makes, turned into JobSets by the real Kubeflow Trainer v2.3.0 controller and into
Jobs by the real JobSet v0.12.0 controller (tests/control_plane with `controllers=True`: both run in the harness's
controller-runtime manager on envtest's API server, with their webhooks, as their own integration tests run
them), beside what the stand-in (tests/standins/trainer.py) makes of the same TrainJob; then the launcher following
a TrainJob whose nodes complete, fail, or fail and restart, beside its run of the same TrainJob on the stand-in. No
kube-controller-manager or kubelet runs here: the test creates the pods the Job controller would create, ends their
containers through the pod status subresource and the Jobs through theirs, as Kubernetes' and JobSet's own
integration tests do; the launcher's lines for the run and each failed node are compared, the pod logs it quotes
are not (no kubelet serves them).

Both are given the objects as the API server stored them, and the stand-in's JobSet is defaulted by a server-side
dry run, so that a difference left is the controllers' and not the API server's defaulting.
"""

from __future__ import annotations

import json
import re
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


TRAINJOB_CASES = [(case, argv) for case, argv in dry_run_cases() if case.startswith("trainjob-")]


@pytest.mark.parametrize("case,argv", TRAINJOB_CASES, ids=[case for case, _ in TRAINJOB_CASES])
def test_the_trainer_stand_in_kept_to_run_nodes_makes_the_jobset_the_real_trainer_makes(controllers, case,
                                                                                         argv):
    """The stand-in's Trainer stays because the real one's JobSet gets no running pods here (no kubelet); the
    stand-in's JobSet runs its nodes as processes. Each TrainJob of `python -m components.launch --launcher
    trainjob` (torch, JAX and TensorFlow runtimes of manifests/trainer, GPUDirect, Kueue and Spot, MIG): the JobSet
    the real Trainer controller creates has the replicated jobs (pod templates: PET_* and JAX_* env, command,
    resources, node selector, tolerations, volumes) the stand-in creates. The differences: Trainer writes
    `suspend: false` where the stand-in leaves it out (v2.3.0 pkg/runtime/framework/plugins/jobset/jobset.go:425
    copies the TrainJob's), which a JobSet reads the same. (JobSet's defaulting webhook writes `resources: {}` on
    a container without resources, the TCPXO daemon's, in both.)"""
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
    assert found == []
    rest = lambda spec: {k: v for k, v in spec.items() if k != "replicatedJobs"}  # noqa: E731
    assert differences(rest(real["spec"]), rest(defaulted["spec"])) == [".suspend: false -> null"]
    owner = real["metadata"]["ownerReferences"]
    assert [(o["kind"], o["name"], o["uid"], o.get("controller")) for o in owner] == [
        ("TrainJob", name, stored["metadata"]["uid"], True)]


@pytest.mark.parametrize("framework", ["torch", "jax", "tensorflow"])
def test_the_jobset_stand_in_kept_to_run_nodes_makes_the_jobs_the_real_controller_makes(controllers, framework):
    """The stand-in's JobSet and Job controllers stay because they run the nodes (no kubelet, and no
    kube-controller-manager for the Jobs' podFailurePolicy, runs here). The Job the real JobSet controller creates
    for the TrainJob's JobSet: its pods get the jobset.sigs.k8s.io labels and annotations and the subdomain the
    stand-in gives them (tests/standins/jobsets.py JobSetRun), and the Job's pod template is the replicated job's
    once the API server has defaulted it."""
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


# ---- the launcher following the TrainJob while its Jobs and their pods end -------------------------------------
#
# No kube-controller-manager or kubelet runs here. The test does their parts the way upstream's integration tests do:
# the Job controller's pods (made as k8s.io/kubernetes v1.36.3 pkg/controller/job makes them), their containers'
# ends through the pod status subresource (the kubelet's part, as Kubernetes' Job integration tests write it), the
# Job's conditions through the Job status subresource (as JobSet's integration tests write them), and the garbage
# collector's foreground deletion of a Job's pods.

JOB_TRACKING_FINALIZER = "batch.kubernetes.io/job-tracking"  # k8s.io/api v0.36.3 batch/v1/types.go:44
COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"  # batch/v1/types.go:34


def now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def create_job_pods(core, job: dict) -> list[dict]:
    """The pods the Job controller creates for an Indexed Job, one per completion index, made as v1.36.3
    pkg/controller/job/job_controller.go makes them: the Job's pod template with the JOB_COMPLETION_INDEX env
    (:1892-1894, indexed_job_utils.go:455-479) and the tracking finalizer (:1896); per index, the completion index
    annotation and label, the hostname `{job}-{index}` and the generated name `{job}-{index}-` (:1940-1944,
    indexed_job_utils.go:481-503); the Job as controller owner (:1951 CreatePodsWithGenerateName,
    pkg/controller/controller_utils.go:544-590; apimachinery meta/v1 NewControllerRef sets controller and
    blockOwnerDeletion). The API server's admission (GKE's ExtendedResourceToleration among it) runs on each."""
    import copy

    name, namespace = job["metadata"]["name"], job["metadata"]["namespace"]
    owner = {"apiVersion": "batch/v1", "kind": "Job", "name": name, "uid": job["metadata"]["uid"],
             "controller": True, "blockOwnerDeletion": True}
    pods = []
    for index in range(int(job["spec"]["completions"])):
        template = copy.deepcopy(job["spec"]["template"])
        spec = template["spec"]
        for container in [*spec.get("initContainers", []), *spec["containers"]]:
            if not any(var["name"] == "JOB_COMPLETION_INDEX" for var in container.get("env", [])):
                container.setdefault("env", []).append({"name": "JOB_COMPLETION_INDEX", "valueFrom": {
                    "fieldRef": {"fieldPath": f"metadata.labels['{COMPLETION_INDEX}']"}}})
        metadata = template.get("metadata") or {}
        pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {
            "generateName": f"{name}-{index}-", "namespace": namespace, "ownerReferences": [owner],
            "labels": {**(metadata.get("labels") or {}), COMPLETION_INDEX: str(index)},
            "annotations": {**(metadata.get("annotations") or {}), COMPLETION_INDEX: str(index)},
            "finalizers": [*(metadata.get("finalizers") or []), JOB_TRACKING_FINALIZER]},
            "spec": {**spec, "hostname": f"{name}-{index}"}}
        pods.append(core.api_client.sanitize_for_serialization(core.create_namespaced_pod(namespace, pod)))
    return pods


def end_container(core, pod: dict, exit_code: int) -> None:
    """The kubelet's part: the pod's `node` container terminated with `exit_code`, written with UpdateStatus as
    Kubernetes' Job integration tests write it (v1.36.3 test/integration/job/job_test.go:1944-1952 and
    2008-2014); then the Job controller, having counted the pod, takes its tracking finalizer off
    (job_controller.go:2107-2118 removeTrackingFinalizerPatch)."""
    name, namespace = pod["metadata"]["name"], pod["metadata"]["namespace"]
    current = core.api_client.sanitize_for_serialization(core.read_namespaced_pod(name, namespace))
    current["status"] = {**current.get("status", {}), "phase": "Succeeded" if exit_code == 0 else "Failed",
                         "containerStatuses": [{
                             "name": "node", "image": current["spec"]["containers"][0]["image"], "imageID": "",
                             "ready": False, "restartCount": 0, "state": {"terminated": {
                                 "exitCode": exit_code, "reason": "Completed" if exit_code == 0 else "Error",
                                 "startedAt": now(), "finishedAt": now()}}}]}
    core.replace_namespaced_pod_status(name, namespace, current)
    release(core, name, namespace)


def release(core, name: str, namespace: str) -> None:
    """The tracking finalizer off the pod (JSON patch: only if the list is still what was read)."""
    finalizers = core.read_namespaced_pod(name, namespace).metadata.finalizers or []
    if JOB_TRACKING_FINALIZER in finalizers:
        core.patch_namespaced_pod(name, namespace, [
            {"op": "test", "path": "/metadata/finalizers", "value": finalizers},
            {"op": "replace", "path": "/metadata/finalizers",
             "value": [f for f in finalizers if f != JOB_TRACKING_FINALIZER]}])


def delete_pods(core, pods: list[dict]) -> None:
    """The Job controller deleting the active pods of a Job that failed (job_controller.go:1122-1124
    deleteActivePods), or the garbage collector a deleted Job's pods: the finalizer off, then the pod deleted (a
    pod no node runs is deleted at once)."""
    from kubernetes.client.rest import ApiException

    for pod in pods:
        try:
            release(core, pod["metadata"]["name"], pod["metadata"]["namespace"])
            core.delete_namespaced_pod(pod["metadata"]["name"], pod["metadata"]["namespace"])
        except ApiException as e:
            if e.status != 404:
                raise


def complete_job(batch, job: dict) -> None:
    """JobSet v0.12.0 test/integration/controller/jobset_controller_test.go:3460-3486 completeJob: the conditions
    and counts kube-controller-manager's Job controller (not running here) would write."""
    status = job.get("status") or {}
    batch.patch_namespaced_job_status(job["metadata"]["name"], job["metadata"]["namespace"], {"status": {
        "startTime": status.get("startTime") or now(), "completionTime": now(),
        "succeeded": job["spec"].get("parallelism", 0),
        "conditions": [*(status.get("conditions") or []),
                       {"type": "SuccessCriteriaMet", "status": "True"}, {"type": "Complete", "status": "True"}]}})


def fail_job(batch, job: dict, reason: str, message: str) -> None:
    """jobset_controller_test.go:3567-3592 failJobWithOptions: FailureTarget, then Failed with the reason the Job
    controller gives (PodFailurePolicy when a podFailurePolicy FailJob rule matched an exit code,
    BackoffLimitExceeded when a pod failed past backoffLimit)."""
    status = job.get("status") or {}
    batch.patch_namespaced_job_status(job["metadata"]["name"], job["metadata"]["namespace"], {"status": {
        "startTime": status.get("startTime") or now(),
        "conditions": [*(status.get("conditions") or []),
                       {"type": "FailureTarget", "status": "True", "reason": reason, "message": message},
                       {"type": "Failed", "status": "True", "reason": reason, "message": message}]}})


def run_nodes(exit_codes: dict[int, int]):
    """What ends each Job of the JobSet: its pods are created; node i's container exits with exit_codes[i] (the
    others keep running); then the Job ends as the Job controller ends it for the job's podFailurePolicy
    (components/launch/jobset.py pod_failure_policy: 1-127 FailJob, anything else counted against backoffLimit
    0): Complete when every node exited 0, else Failed with the reason and message of the first failed pod
    (pod_failure_policy.go:57-58 words the FailJob match), its running pods deleted."""
    from kubernetes import client

    def end(api, job: dict) -> None:
        core, batch = client.CoreV1Api(api), client.BatchV1Api(api)
        pods = create_job_pods(core, job)
        for index, code in sorted(exit_codes.items()):
            end_container(core, pods[index], code)
        if set(exit_codes) == set(range(len(pods))) and not any(exit_codes.values()):
            return complete_job(batch, job)
        index, code = next((i, c) for i, c in sorted(exit_codes.items()) if c)
        pod = pods[index]["metadata"]
        delete_pods(core, [p for i, p in enumerate(pods) if i not in exit_codes])
        if 1 <= code <= 127:
            fail_job(batch, job, "PodFailurePolicy", f"Container node for pod {pod['namespace']}/{pod['name']} "
                                                     f"failed with exit code {code} matching FailJob rule at index 1")
        else:
            fail_job(batch, job, "BackoffLimitExceeded", "Job has reached the specified backoff limit")

    return end


def run_while(launcher, manifest: dict, lines: list[str], step) -> tuple[object, list[str]]:
    """The launcher's run of `manifest` in a thread (its outcome, or the error it raised) and the `lines` it
    printed, calling `step()` every 0.2 s while it runs, for at most 90 s: the test's part of the cluster."""
    result: list = []

    def run():
        try:
            result.append(launcher.run(manifest))
        except Exception as e:  # noqa: BLE001 - the error is what the test looks at
            result.append(e)

    runner = threading.Thread(target=run, daemon=True)
    runner.start()
    deadline = time.monotonic() + 90
    while runner.is_alive() and time.monotonic() < deadline:
        step()
        time.sleep(0.2)
    runner.join(5)
    assert result, f"the launcher did not end in 90s: {lines[-5:]}"
    return result[0], lines


def follow(api, trainjob: dict, end_job) -> tuple[object, list[str]]:
    """The TrainJob launcher's run of `trainjob` (its outcome, or the error it raised) and the lines it printed,
    while `end_job(api, job)` ends each of the JobSet's Jobs as it appears."""
    from kubernetes import client

    lines: list[str] = []
    core, batch = client.CoreV1Api(api), client.BatchV1Api(api)
    name = trainjob["metadata"]["name"]
    ended: set[str] = set()

    def step():
        mine = [j for j in batch.list_namespaced_job(trainjob["metadata"]["namespace"]).to_dict()["items"]
                if (j["metadata"].get("labels") or {}).get("jobset.sigs.k8s.io/jobset-name") == name]
        for job in mine:  # the garbage collector's part: JobSet deletes Jobs in the foreground to restart them; the
            # collector deletes their pods (the dependents that block the owner's deletion), then lets the Job go
            # (jobset_controller_test.go:3514-3535 removeForegroundDeletionFinalizers)
            finalizers = job["metadata"].get("finalizers") or []
            if job["metadata"].get("deletion_timestamp") and "foregroundDeletion" in finalizers:
                selector = f"batch.kubernetes.io/controller-uid={job['metadata']['uid']}"
                delete_pods(core, [core.api_client.sanitize_for_serialization(p) for p in core.list_namespaced_pod(
                    job["metadata"]["namespace"], label_selector=selector).items])
                batch.patch_namespaced_job(job["metadata"]["name"], job["metadata"]["namespace"], [
                    {"op": "test", "path": "/metadata/finalizers", "value": finalizers},
                    {"op": "replace", "path": "/metadata/finalizers",
                     "value": [f for f in finalizers if f != "foregroundDeletion"]}])
        jobs = [j for j in mine if not j["metadata"].get("deletion_timestamp") and j["metadata"]["uid"] not in ended]
        for job in jobs:
            end_job(api, api.sanitize_for_serialization(batch.read_namespaced_job(job["metadata"]["name"],
                                                                                  job["metadata"]["namespace"])))
            ended.add(job["metadata"]["uid"])

    return run_while(launcher_of(api, lines), trainjob, lines, step)


def launcher_of(api, lines: list[str]):
    from components.launch.training import KUBERNETES_LAUNCHERS

    return KUBERNETES_LAUNCHERS["trainjob"](api, "kubeflow", poll_seconds=0.2, timeout_seconds=90, echo=lines.append)


NODE_1_EXITS = """
import os, sys, time
if os.environ["TRAINING_NODE_INDEX"] == "1" or {code} == 0:
    sys.exit({code})
time.sleep(600)
"""


def node_trainjob(api, name: str, code: int) -> list[dict]:
    """A TensorFlow TrainJob of 2 nodes as the launcher makes it (its runtime applied by an admin), whose node 1
    exits with `code` and node 0 trains on (or exits 0 too, when `code` is 0), when it runs: its runtime(s) and
    itself."""
    import sys

    manifests = dry_run(["--dry-run", "--launcher", "trainjob", "--framework", "tensorflow", "--name", name,
                         "--image", "europe-docker.pkg.dev/p/ml/train:1", "--workers", "1", "--gpus", "1",
                         "--", sys.executable, "-c", NODE_1_EXITS.format(code=code)])
    applied(api, [KUBEFLOW, *manifests[:-1]])
    return manifests


def on_the_stand_in(manifests: list[dict]) -> tuple[object, list[str]]:
    """The same launcher's run of the same TrainJob on the Kubernetes stand-in, whose JobSet controller runs each
    node's command as a process (tests/standins/jobsets.py)."""
    from kubernetes import client

    from tests.standins.k8s_api import KubernetesStandIn

    *runtimes, trainjob = manifests
    lines: list[str] = []
    with KubernetesStandIn() as k8s:
        for runtime in runtimes:
            k8s.add_runtime(runtime)
        configuration = client.Configuration()
        configuration.host = k8s.url
        try:
            return launcher_of(client.ApiClient(configuration), lines).run(trainjob), lines
        except Exception as e:  # noqa: BLE001 - the error is what the test looks at
            return e, lines


def node_lines(error: Exception) -> list[str]:
    """What the launcher's error says of the run and its nodes: its first line and each `node K (pod P) exited
    with code C` line, the random suffix of a pod's name (the Job controller's generateName) masked. The quoted
    logs are left out: no kubelet runs here to serve a pod's log."""
    lines = str(error).splitlines()
    nodes = [re.sub(r"(\(pod [a-z0-9-]+-\d+-)[a-z0-9]{5}\)", r"\1xxxxx)", line) for line in lines
             if re.fullmatch(r"node \d+ \(pod [a-z0-9-]+\) exited with code \d+", line)]
    return [lines[0], *nodes]


def test_the_launcher_reports_a_run_whose_nodes_complete_as_on_the_stand_in(controllers):
    """Both nodes exit 0: the Job completes, JobSet marks the JobSet Completed, Trainer the TrainJob Complete, and
    the launcher returns the outcome it returns on the stand-in."""
    api = controllers.api_client()
    manifests = node_trainjob(api, "ends-complete", 0)
    outcome, _ = follow(api, manifests[-1], run_nodes({0: 0, 1: 0}))
    stand_in, _ = on_the_stand_in(manifests)
    for where, result in (("real", outcome), ("stand-in", stand_in)):
        assert not isinstance(result, Exception), (where, result)
    assert (outcome.name, outcome.state, outcome.restarts) == (stand_in.name, stand_in.state, stand_in.restarts) == (
        "ends-complete", "Complete", 0)


def test_the_launcher_reports_a_permanent_failure_and_its_node_as_on_the_stand_in(controllers):
    """Node 1 exits 2, a code of the runtime's FailJob rule (1-127): the Job fails with reason PodFailurePolicy, the
    runtime's JobSet rule fails the JobSet at once, Trainer fails the TrainJob with its message, and the launcher
    raises the lines it raises on the stand-in: the TrainJob's end and `node 1 (pod ...) exited with code 2`."""
    api = controllers.api_client()
    manifests = node_trainjob(api, "ends-permanent", 2)
    outcome, _ = follow(api, manifests[-1], run_nodes({1: 2}))
    stand_in, _ = on_the_stand_in(manifests)
    for where, result in (("real", outcome), ("stand-in", stand_in)):
        assert isinstance(result, JobFailed), (where, result)
    assert node_lines(outcome) == node_lines(stand_in) == [
        "TrainJob kubeflow/ends-permanent ended Failed: applying FailJobSet failure policy action "
        "(first failed job: ends-permanent-node-0)", "node 1 (pod ends-permanent-node-0-1-xxxxx) exited with code 2"]
    assert read(resources(api)["JobSet"], "ends-permanent", "kubeflow")["status"].get("restarts", 0) == 0


def test_the_launcher_reports_a_node_that_exits_143_as_on_the_stand_in(controllers):
    """Node 1 exits 143 (SIGTERM), which no FailJob rule names: the Job fails with BackoffLimitExceeded
    (backoffLimit 0), JobSet recreates all Jobs (BlockingRecreate) until the runtime's maxRestarts (6), then fails;
    the launcher raises the lines it raises on the stand-in: the restarts run out, and node 1 of the last attempt
    exited with 143 (the pods of earlier attempts went with their Jobs)."""
    api = controllers.api_client()
    manifests = node_trainjob(api, "ends-143", 143)
    outcome, _ = follow(api, manifests[-1], run_nodes({1: 143}))
    stand_in, _ = on_the_stand_in(manifests)
    for where, result in (("real", outcome), ("stand-in", stand_in)):
        assert isinstance(result, JobFailed), (where, result)
    assert node_lines(outcome) == node_lines(stand_in) == [
        "TrainJob kubeflow/ends-143 ended Failed: jobset failed due to reaching max number of restarts "
        "(first failed job: ends-143-node-0)", "node 1 (pod ends-143-node-0-1-xxxxx) exited with code 143"]
    assert read(resources(api)["JobSet"], "ends-143", "kubeflow")["status"]["restarts"] == 6


def test_the_apply_command_with_controllers_prints_what_they_create(controllers, tmp_path, capsys):
    """`python -m tests.control_plane apply --controllers FILE...` (docs/multi-node-training.md) starts its own
    control plane with Trainer's and JobSet's controllers, prints each object's answer, then what the controllers
    created of them: the TrainJob's JobSet and the snapshot of its runtime, and the JobSet's Job and headless
    Service, each with its owner."""
    import yaml

    manifests = dry_run(["--dry-run", "--launcher", "trainjob", "--framework", "tensorflow", "--name", "cmd-1",
                         "--image", "europe-docker.pkg.dev/p/ml/train:1", "--workers", "1", "--gpus", "1",
                         "--", "python", "-m", "components.train"])
    files = tmp_path / "runtime.yaml", tmp_path / "trainjob.yaml"
    files[0].write_text(yaml.safe_dump_all(manifests[:-1]))
    files[1].write_text(yaml.safe_dump(manifests[-1]))
    assert control_plane.main(["apply", "--controllers", *map(str, files)]) == 0
    out = capsys.readouterr().out
    assert re.search(r"^TrainJob kubeflow/cmd-1: 201 applied \(uid [0-9a-f-]{36}\)$", out, re.M), out
    made = re.findall(r"^(\w+ \S+): created by (.+)$", out.split("The controllers created 4 objects:\n")[1], re.M)
    assert sorted(made) == [("ConfigMap kubeflow/cmd-1-runtime-snapshot", "TrainJob kubeflow/cmd-1"),
                            ("Job kubeflow/cmd-1-node-0", "JobSet kubeflow/cmd-1"),
                            ("JobSet kubeflow/cmd-1", "TrainJob kubeflow/cmd-1"),
                            ("Service kubeflow/cmd-1", "JobSet kubeflow/cmd-1")]
    jobset = yaml.safe_load(out.split("JobSet kubeflow/cmd-1: created by TrainJob kubeflow/cmd-1\n")[1].split(
        "\nJob ")[0].split("\nService ")[0])
    assert jobset["spec"]["replicatedJobs"][0]["template"]["spec"]["completions"] == 2


def test_the_trainer_stand_in_kept_to_run_nodes_refuses_what_the_real_webhooks_refuse(controllers):
    """The stand-in's Trainer stays because the real one makes no pods here (no kubelet runs them): the runs of
    tests/test_trainjob.py need a Trainer whose nodes run. So its webhook is held to the real one's: each TrainJob
    below, created through the `kubernetes` client on both, gets the same status, and both name the same fault.
    A runtime patch for a job or container the runtime lacks is accepted by both (tests/standins/trainer.py says
    why v2.3.0's check never fires)."""
    import copy

    from kubernetes import client
    from kubernetes.client.rest import ApiException

    from tests.standins.k8s_api import KubernetesStandIn

    api = controllers.api_client()
    *runtimes, made = dry_run(["--dry-run", "--launcher", "trainjob", "--framework", "torch", "--name", "hook",
                               "--image", "europe-docker.pkg.dev/p/ml/train:1", "--workers", "1", "--gpus", "1",
                               "--", "python", "-m", "components.train"])
    applied(api, [KUBEFLOW, *runtimes])

    def pod_patch(trainjob: dict) -> dict:
        rjob = trainjob["spec"]["runtimePatches"][0]["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"][0]
        return rjob["template"]["spec"]["template"]["spec"]

    def case(change) -> dict:
        trainjob = copy.deepcopy(made)
        change(trainjob)
        return trainjob

    cases = {
        "as made": (case(lambda t: None), 201, ""),
        "missing runtime": (case(lambda t: t["spec"]["runtimeRef"].update(name="not-installed")), 403,
                            "specified clusterTrainingRuntime must be created before the TrainJob is created"),
        "torchrun's env": (case(lambda t: t["spec"]["trainer"].setdefault("env", []).append(
            {"name": "PET_NNODES", "value": "3"})),
                           403, "must not have reserved envs, invalid envs configured: [PET_NNODES]"),
        "env in a patch": (case(lambda t: pod_patch(t).update(containers=[{"name": "node", "env": [
            {"name": "A", "value": "1"}]}])), 403,
            "must not have envs for the dataset-initializer, model-initializer, node containers"),
        "manager": (case(lambda t: t["spec"]["runtimePatches"][0].update(manager="launcher")), 403,
                    'spec.runtimePatches.manager: Invalid value: "launcher": must be a domain-prefixed path'),
        "a patch's own container": (case(lambda t: pod_patch(t).update(containers=[{"name": "sidecar"}])), 201,
                                    ""),
        "dotted name": (case(lambda t: None), 422, "metadata.name must match RFC 1035 DNS label format"),
    }
    cases["dotted name"][0]["metadata"]["name"] = "hook.x"

    def create(api_client, trainjob: dict) -> tuple[int, str]:
        try:
            client.CustomObjectsApi(api_client).create_namespaced_custom_object(
                "trainer.kubeflow.org", "v1alpha1", "kubeflow", "trainjobs", trainjob)
            return 201, ""
        except ApiException as e:
            return e.status, json.loads(e.body)["message"]

    answers = []
    with KubernetesStandIn(run_containers=False) as k8s:
        for runtime in runtimes:
            k8s.add_runtime(runtime)
        configuration = client.Configuration()
        configuration.host = k8s.url
        stand_in = client.ApiClient(configuration)
        for index, (name, (trainjob, status, phrase)) in enumerate(cases.items()):
            if name != "dotted name":
                trainjob["metadata"]["name"] = f"hook-{index}"
            answers += [(name, where, *create(api_client, trainjob))
                        for where, api_client in (("real", api), ("stand-in", stand_in))]
    wrong = [(name, where, got, message) for name, where, got, message in answers
             if got != cases[name][1] or cases[name][2] not in message]
    assert wrong == []


def test_the_jobset_stand_in_kept_to_run_nodes_defaults_and_refuses_what_the_real_webhook_does(controllers):
    """The stand-in's JobSet stays because it runs the nodes; so its webhook is held to JobSet's own (v0.12.0
    pkg/webhooks, run here with its controllers): the JobSet launcher's JobSet, created through the `kubernetes`
    client on both, gets the same defaults outside its pod template (the API server's own pod defaults are the
    real server's alone), and each fault below the same status and the same words."""
    import copy

    from kubernetes import client
    from kubernetes.client.rest import ApiException

    from tests.standins.k8s_api import KubernetesStandIn

    api = controllers.api_client()
    applied(api, [KUBEFLOW])
    (made,) = dry_run(dict(dry_run_cases())["jobset-tensorflow"])

    def case(change) -> dict:
        jobset = copy.deepcopy(made)
        change(jobset)
        return jobset

    cases = {
        "as made": (case(lambda j: None), ""),
        "long name": (case(lambda j: j["metadata"].update(name="x" * 50)),
                      "JobSet name is too long, pod names generated for this JobSet will exceed 63 characters"),
        "rule name": (case(lambda j: j["spec"]["failurePolicy"]["rules"][0].update(name="no spaces")),
                      "invalid failure policy rule name 'no spaces', a failure policy rule name must start with"),
        "subdomain": (case(lambda j: j["spec"]["network"].update(subdomain="Bad_Sub")),
                      'spec.network.subdomain: Invalid value: "Bad_Sub": a lowercase RFC 1123 subdomain must'),
    }

    def create(api_client, jobset: dict) -> tuple[int, object]:
        try:
            return 201, client.CustomObjectsApi(api_client).create_namespaced_custom_object(
                "jobset.x-k8s.io", "v1alpha2", "kubeflow", "jobsets", jobset)
        except ApiException as e:
            return e.status, json.loads(e.body)["message"]

    def outside_the_pod_template(spec: dict) -> dict:
        """The spec less its pod templates, and less the empty objects the real webhook writes back (a Job
        template's `metadata: {}`), which read as absent ones."""
        spec = copy.deepcopy(spec)
        for rjob in spec["replicatedJobs"]:
            del rjob["template"]["spec"]["template"]

        def pruned(value):
            if isinstance(value, dict):
                return {k: pruned(v) for k, v in value.items() if v != {}}
            return [pruned(v) for v in value] if isinstance(value, list) else value

        return pruned(spec)

    with KubernetesStandIn(run_containers=False) as k8s:
        configuration = client.Configuration()
        configuration.host = k8s.url
        stand_in = client.ApiClient(configuration)
        for index, (name, (jobset, phrase)) in enumerate(cases.items()):
            if name != "long name":
                jobset["metadata"]["name"] = f"webhook-{index}"
            (real, real_body), (ours, our_body) = create(api, jobset), create(stand_in, jobset)
            if not phrase:
                assert real == ours == 201, (real_body, our_body)
                assert differences(outside_the_pod_template(real_body["spec"]),
                                   outside_the_pod_template(our_body["spec"])) == []
                continue
            assert (name, real, ours) == (name, 422, 422), (real_body, our_body)
            assert phrase in real_body and phrase in our_body, (real_body, our_body)
