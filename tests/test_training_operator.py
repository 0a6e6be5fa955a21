"""The PyTorchJobs and TFJobs `launch_training` makes, turned into pods and Services by the real Kubeflow Training
Operator v1.9.4 (tests/control_plane with `training_operator=True`: its PyTorchJob and TFJob controllers and
validating webhooks, in their own process against envtest's API server, as its integration tests run them), beside
the pods the stand-in (tests/standins/k8s_api.py TFJob and PyTorchJob) makes of the same job; then the launcher
following a job whose pods succeed, or fail with 143 or 1, the way the operator's own integration tests end them
(no kubelet runs here: the test writes the pods' status, pkg/controller.v1/pytorch/pytorchjob_controller_test.go:
180-185 and tensorflow/pod_test.go:240-250 at v1.9.4).

Both pods are given to the API server: the stand-in's as a dry-run Pod, so that a difference left is the
operator's and not the API server's defaulting or admission.
"""

from __future__ import annotations

import time
from unittest.mock import ANY

import pytest

from components.gcp.errors import JobFailed
from tests.conftest import started_control_plane
from tests.test_control_plane import dry_run, dry_run_cases
from tests.test_trainer_controllers import differences, run_while, wait_for

KINDS = {"pytorchjob": ("PyTorchJob", "pytorchjobs"), "tfjob": ("TFJob", "tfjobs")}
OPERATOR_CASES = [(case, argv) for case, argv in dry_run_cases() if case.split("-")[0] in KINDS]
# and the staged data's emptyDir (--local-ssd): a volume and its mount
OPERATOR_CASES.append(("tfjob-local-ssd", ["--dry-run", "--name", "tfjob-local-ssd", "--image",
                                           "europe-docker.pkg.dev/p/ml/train:1", "--launcher", "tfjob", "--local-ssd",
                                           "100Gi", "--workers", "1", "--gpus", "1", "--", "python", "-m",
                                           "components.train"]))


@pytest.fixture(scope="module")
def operator():
    """The control plane with the Training Operator's controllers; skipped without Go, a failure where
    REQUIRE_GO=1."""
    from kubernetes import client

    with started_control_plane(training_operator=True) as plane:
        client.CoreV1Api(plane.api_client()).create_namespace({"metadata": {"name": "kubeflow"}})
        yield plane


def stand_in_job(stored: dict):
    """The stand-in's operator job of the job the API server stored, with the stand-in's defaulting (no process
    runs)."""
    from tests.standins.k8s_api import PyTorchJob, TFJob, default_pytorchjob

    body = {k: stored[k] for k in ("apiVersion", "kind", "metadata", "spec")}
    if stored["kind"] == "PyTorchJob":
        default_pytorchjob(body)
        return PyTorchJob(body, stored["metadata"]["namespace"], False, lambda: "")
    return TFJob(body, stored["metadata"]["namespace"], False, lambda: "")


def custom_object(api, manifest: dict) -> dict:
    from kubernetes import client

    return client.CustomObjectsApi(api).get_namespaced_custom_object(
        "kubeflow.org", "v1", manifest["metadata"]["namespace"], KINDS[manifest["kind"].lower()][1],
        manifest["metadata"]["name"])


def job_pods(core, name: str, namespace: str = "kubeflow") -> list[dict]:
    pods = core.list_namespaced_pod(namespace, label_selector=f"training.kubeflow.org/job-name={name}")
    return [core.api_client.sanitize_for_serialization(p) for p in pods.items]


def create(api, manifest: dict) -> dict:
    from kubernetes import client

    return client.CustomObjectsApi(api).create_namespaced_custom_object(
        "kubeflow.org", "v1", manifest["metadata"]["namespace"], KINDS[manifest["kind"].lower()][1], manifest)


@pytest.mark.parametrize("case,argv", OPERATOR_CASES, ids=[case for case, _ in OPERATOR_CASES])
def test_the_real_operator_makes_the_pods_the_stand_in_makes(operator, case, argv):
    """Each PyTorchJob and TFJob of `python -m components.launch --launcher pytorchjob|tfjob` (torch with 2 GPU
    nodes, TensorFlow with GPUs, on CPUs, with a local SSD): every pod the real operator creates (env: PET_* and
    MASTER_*, TF_CONFIG; command, resources, node selector, tolerations, volumes, init containers, restart policy)
    is the pod the stand-in describes for that replica, once the API server has defaulted both; and each replica
    has its headless Service on its port."""
    from kubernetes import client

    api = operator.api_client()
    core = client.CoreV1Api(api)
    manifest = dry_run(argv)[-1]
    name, namespace = manifest["metadata"]["name"], manifest["metadata"]["namespace"]
    stored = create(api, manifest)
    replicas = sum(s["replicas"] for s in next(v for k, v in manifest["spec"].items()
                                               if k.endswith("ReplicaSpecs")).values())
    pods = wait_for(lambda: (found := job_pods(core, name)) and len(found) == replicas and found or None)
    stand_in = stand_in_job(stored)
    types = {t.lower(): t for t in stored["spec"][stand_in.specs_key]}
    for pod in pods:
        labels = pod["metadata"]["labels"]
        rtype = types[labels["training.kubeflow.org/replica-type"]]
        index = int(labels["training.kubeflow.org/replica-index"])
        assert pod["metadata"]["name"] == f"{name}-{rtype.lower()}-{index}"
        made = core.create_namespaced_pod(namespace, {"metadata": {"name": f"{pod['metadata']['name']}-stand-in"},
                                                      "spec": stand_in.pod_spec(rtype, index)}, dry_run="All")
        assert differences(pod["spec"], api.sanitize_for_serialization(made)["spec"]) == [], pod["metadata"]["name"]
    services = {s.metadata.name: s for s in core.list_namespaced_service(namespace).items
                if (s.metadata.labels or {}).get("training.kubeflow.org/job-name") == name}
    assert sorted(services) == sorted(p["metadata"]["name"] for p in pods)
    for service in services.values():
        rtype = types[service.metadata.labels["training.kubeflow.org/replica-type"]]
        assert service.spec.cluster_ip == "None"
        assert [p.port for p in service.spec.ports] == [stand_in.port(stored["spec"][stand_in.specs_key][rtype])]


# ---- the launcher following the job while its pods end as the operator's integration tests end them -------------

def now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def container_status(pod: dict, state: dict) -> list[dict]:
    container = pod["spec"]["containers"][0]
    return [{"name": container["name"], "image": container["image"], "imageID": "", "ready": "running" in state,
             "restartCount": 0, "state": state}]


def run_pod(core, pod: dict) -> None:
    """What the kubelet would write of a started pod: Running, its container running; nothing for a pod the
    operator deleted since the test listed it (cleanPodPolicy Running deletes the others once the primary ended)."""
    from kubernetes.client.rest import ApiException

    try:
        core.patch_namespaced_pod_status(pod["metadata"]["name"], pod["metadata"]["namespace"], {"status": {
            "phase": "Running", "startTime": now(),
            "containerStatuses": container_status(pod, {"running": {"startedAt": now()}})}})
    except ApiException as e:
        if e.status != 404:
            raise


def end_pod(core, pod: dict, exit_code: int) -> None:
    """pytorchjob_controller_test.go:180-185 (Succeeded) and tensorflow/pod_test.go:240-250 (Failed with the
    container's exit code, which the operator reads, common/pod.go:339-346)."""
    core.patch_namespaced_pod_status(pod["metadata"]["name"], pod["metadata"]["namespace"], {"status": {
        "phase": "Succeeded" if exit_code == 0 else "Failed",
        "containerStatuses": container_status(pod, {"terminated": {
            "exitCode": exit_code, "reason": "Completed" if exit_code == 0 else "Error", "startedAt": now(),
            "finishedAt": now()}})}})


def follow(api, manifest: dict, primary_codes: list[int]) -> tuple[object, list[str]]:
    """The launcher's run of `manifest` (its outcome, or the error it raised) and the lines it printed, while
    every pod is started and the primary replica's pod (chief, master) ends with the next of `primary_codes` each
    time the operator creates it."""
    from kubernetes import client

    from components.launch.training import KUBERNETES_LAUNCHERS

    lines: list[str] = []
    launcher = KUBERNETES_LAUNCHERS[manifest["kind"].lower()](api, manifest["metadata"]["namespace"],
                                                               poll_seconds=0.2, timeout_seconds=90,
                                                               echo=lines.append)
    core = client.CoreV1Api(api)
    name = manifest["metadata"]["name"]
    primary = f"{name}-{launcher.primary}-0"
    started: set[str] = set()
    codes = list(primary_codes)

    def step():
        new = [pod for pod in job_pods(core, name, manifest["metadata"]["namespace"])
               if not pod["metadata"].get("deletionTimestamp") and pod["metadata"]["uid"] not in started]
        for pod in new:  # every pod starts before the primary ends, as on nodes that have them all
            if pod["metadata"]["name"] == primary and len(codes) < len(primary_codes):
                time.sleep(1)  # a restarted pod starts after a while (scheduling, the image pull), not at once
            run_pod(core, pod)
            started.add(pod["metadata"]["uid"])
        for pod in new:
            if pod["metadata"]["name"] == primary and codes:
                time.sleep(1)  # the operator sees the job running first
                end_pod(core, pod, codes.pop(0))

    return run_while(launcher, manifest, lines, step)


def against_the_stand_in(manifest: dict, primary_codes: list[int], tmp_path) -> tuple[object, list[str]]:
    """The same launcher's run of `manifest` against the stand-in, whose primary replica exits with each of
    `primary_codes` in turn (a local process; the workers wait until the operator stops them)."""
    import copy
    import sys

    from components.launch.training import KUBERNETES_LAUNCHERS
    from tests.standins.k8s_api import KubernetesStandIn

    counter = tmp_path / "runs"
    primary = (f"import os, sys; p = {str(counter)!r}; n = int(open(p).read()) if os.path.exists(p) else 0; "
               f"open(p, 'w').write(str(n + 1)); sys.exit({primary_codes!r}[n])")
    manifest = copy.deepcopy(manifest)
    for rtype, spec in next(v for k, v in manifest["spec"].items() if k.endswith("ReplicaSpecs")).items():
        spec["template"]["spec"]["containers"][0]["command"] = [
            sys.executable, "-c", "import time; time.sleep(60)" if rtype == "Worker" else primary]
    lines: list[str] = []
    with KubernetesStandIn() as k8s:
        from components.launch import kubernetes_client

        launcher = KUBERNETES_LAUNCHERS[manifest["kind"].lower()](kubernetes_client(k8s.url), "kubeflow",
                                                                   poll_seconds=0.05, timeout_seconds=60,
                                                                   echo=lines.append)
        try:
            return launcher.run(manifest), lines
        except Exception as e:  # noqa: BLE001 - the error is what the test looks at
            return e, lines


def launched(framework: str, name: str) -> dict:
    launcher = {"torch": "pytorchjob", "tensorflow": "tfjob"}[framework]
    return dry_run(["--dry-run", "--launcher", launcher, "--framework", framework, "--name", name, "--image",
                    "europe-docker.pkg.dev/p/ml/train:1", "--workers", "1", "--gpus", "1", "--", "python", "-m",
                    "components.train"])[-1]


@pytest.mark.parametrize("framework", ["torch", "tensorflow"])
def test_the_launcher_reports_a_job_that_succeeds_as_against_the_stand_in(operator, framework, tmp_path):
    """The primary replica's pod succeeds: the operator marks the job Succeeded, and the launcher returns the
    outcome and message it returns against the stand-in."""
    manifest = launched(framework, f"ok-{framework}")
    outcome, _ = follow(operator.api_client(), manifest, [0])
    assert not isinstance(outcome, Exception), outcome
    stand_in, _ = against_the_stand_in(manifest, [0], tmp_path)
    assert (outcome.name, outcome.state, outcome.message, outcome.restarts) == (
        stand_in.name, stand_in.state, stand_in.message, 0) == (f"ok-{framework}", "Succeeded", stand_in.message, 0)


@pytest.mark.parametrize("framework", ["torch", "tensorflow"])
def test_the_launcher_reports_a_replica_that_exits_143_and_is_restarted(operator, framework, tmp_path):
    """The primary replica exits 143 (SIGTERM after its checkpoint): with `restartPolicy: ExitCode` the operator
    deletes its pod and creates it again (common/pod.go:349-364), and the job succeeds on the second pod; the
    launcher reports the restart and the outcome it reports against the stand-in."""
    manifest = launched(framework, f"restart-{framework}")
    outcome, _ = follow(operator.api_client(), manifest, [143, 0])
    assert not isinstance(outcome, Exception), outcome
    stand_in, _ = against_the_stand_in(manifest, [143, 0], tmp_path)
    assert not isinstance(stand_in, Exception), stand_in
    assert (outcome.state, outcome.message, outcome.restarts) == (stand_in.state, stand_in.message,
                                                                  stand_in.restarts) == ("Succeeded", ANY, 1)


@pytest.mark.parametrize("framework", ["torch", "tensorflow"])
def test_the_launcher_stops_a_job_restarted_past_its_backoff_limit(operator, framework, tmp_path):
    """The primary replica keeps exiting 143: the operator would restart it for ever, as the job's backoffLimit (6)
    does not count ExitCode restarts (pkg/core/job.go:95-133 counts container restarts of running pods; a recreated
    pod has none: tests/standins/k8s_api.py). The launcher deletes the job at the 7th restart it sees and fails with
    the line it fails with against the stand-in."""
    manifest = launched(framework, f"loops-{framework}")
    codes = [143] * 20  # room for restarts a poll misses: the launcher stops the job at the 7th it sees
    outcome, _ = follow(operator.api_client(), manifest, codes)
    assert isinstance(outcome, JobFailed), outcome
    stand_in, _ = against_the_stand_in(manifest, codes, tmp_path)
    assert isinstance(stand_in, JobFailed), stand_in
    assert str(outcome).splitlines()[0] == str(stand_in).splitlines()[0] == (
        f"{manifest['kind']} kubeflow/loops-{framework} ended Failed: restarted 7 times, more than its "
        "runPolicy.backoffLimit (6), which the Training Operator does not apply to restartPolicy ExitCode; the "
        "launcher deleted it")
    assert custom_object(operator.api_client(), manifest)["metadata"].get("deletionTimestamp")


@pytest.mark.parametrize("framework", ["torch", "tensorflow"])
def test_the_launcher_reports_a_replica_that_exits_1_as_against_the_stand_in(operator, framework, tmp_path):
    """The primary replica exits 1, which ExitCode does not restart: the operator fails the job at once
    (common/pod.go:365-371) and the launcher raises the lines it raises against the stand-in: the operator's
    message, then the failed replica and its exit code, found by the labels the operator gives its pods (no pod log
    here: no kubelet)."""
    manifest = launched(framework, f"fails-{framework}")
    outcome, _ = follow(operator.api_client(), manifest, [1])
    assert isinstance(outcome, JobFailed), outcome
    stand_in, _ = against_the_stand_in(manifest, [1], tmp_path)
    assert isinstance(stand_in, JobFailed), stand_in
    primary = {"torch": "Master", "tensorflow": "Chief"}[framework]
    assert str(outcome).splitlines()[:2] == str(stand_in).splitlines()[:2] == [
        f'{manifest["kind"]} kubeflow/fails-{framework} ended Failed: job "fails-{framework}" is failing because '
        f'"{primary}" replica(s) failed.',
        f"{primary.lower()} 0 (pod fails-{framework}-{primary.lower()}-0) exited with code 1"]  # the pods' labels


BAD_PYTORCHJOBS = {
    "two-masters": lambda spec: spec["Master"].update(replicas=2),
    "no-pytorch-container": lambda spec: spec["Worker"]["template"]["spec"]["containers"][0].update(name="main"),
}


@pytest.mark.parametrize("case", sorted(BAD_PYTORCHJOBS))
def test_the_real_webhook_refuses_what_the_stand_in_refuses(operator, case):
    """The operator's validating webhook (pkg/webhooks/pytorch/pytorchjob_webhook.go) refuses a PyTorchJob with
    two Masters, or a replica without a `pytorch` container, with the status and the fields the stand-in's
    validation (tests/standins/k8s_api.py) answers."""
    from kubernetes import client

    from components.launch.k8s import api_reason
    from tests.standins.k8s_api import KubernetesStandIn

    manifest = launched("torch", f"bad-{case}")
    BAD_PYTORCHJOBS[case](manifest["spec"]["pytorchReplicaSpecs"])
    with pytest.raises(client.ApiException) as real:
        create(operator.api_client(), manifest)
    with KubernetesStandIn(run_containers=False) as k8s:
        from components.launch import kubernetes_client

        with pytest.raises(client.ApiException) as stand_in:
            create(kubernetes_client(k8s.url), manifest)
    assert (real.value.status, api_reason(real.value)) == (stand_in.value.status, api_reason(stand_in.value))
    assert real.value.status == 403
