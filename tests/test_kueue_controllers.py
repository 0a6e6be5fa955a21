"""The launcher's TrainJobs queued by the real Kueue v0.19.2 (the release the docs install): its controllers,
scheduler and webhooks run beside the real Kubeflow Trainer and JobSet controllers on the tests' API server
(tests/control_plane with `kueue=True`: kueue/main.go, set up as Kueue's own integration tests set them up), with
the ResourceFlavor, ClusterQueue and LocalQueue of docs/multi-node-training.md.

- A TrainJob that fits the ClusterQueue's quota is admitted: Kueue's webhook suspends it and adds its runtime patch,
  the scheduler admits its Workload to the `t4` flavor, Kueue fills the patch with the flavor's node labels and
  unsuspends it, Trainer creates the JobSet, and the launcher follows the run to its end. The TrainJob is compared
  with what the stand-in's Kueue (tests/standins/kueue.py) makes of the same TrainJob.
- A TrainJob that asks for more GPUs than the ClusterQueue has is held: it stays suspended, its Workload says why,
  and the launcher says what it says against the stand-in's Kueue for a held TrainJob.
- The JobSet launcher's JobSets are admitted and held the same way (Kueue's JobSet integration).
- A TrainJob with an empty list in spec.trainer is admitted but never resumed (Kueue's write-back is refused), on
  the real Kueue as on the stand-in's: why the launcher writes no `env: []`.
"""

from __future__ import annotations

import copy
import logging
import time

import pytest

from components.gcp.errors import JobTimedOut
from tests import control_plane
from tests.conftest import started_control_plane
from tests.test_control_plane import KUBEFLOW, applied, doc_objects, dry_run
from tests.test_trainer_controllers import complete_job, differences, follow, read, resources, wait_for

KUEUE = "kueue.x-k8s.io"
KUEUE_KINDS = {"ResourceFlavor", "ClusterQueue", "LocalQueue"}


# What Kueue's scheduler says of 4 GPUs for a ClusterQueue of 2 (pkg/scheduler/flavorassigner/flavorassigner.go:240
# and :1350), in the Workload's QuotaReserved condition (status False, reason Pending)
HELD_REASON = ("couldn't assign flavors to pod set node: insufficient quota for nvidia.com/gpu in flavor t4, "
               "previously considered podsets requests (0) + current podset request (4) > maximum capacity (2)")


def docs_queues() -> list[dict]:
    """The ResourceFlavor, ClusterQueue and LocalQueue docs/multi-node-training.md creates."""
    return [obj for source, obj in doc_objects() if source == "multi-node-training.md" and obj["kind"] in KUEUE_KINDS]


@pytest.fixture(scope="module")
def kueue():
    """The control plane with Trainer's, JobSet's and Kueue's controllers, the docs' queues applied; skipped without
    Go, a failure where REQUIRE_GO=1."""
    with started_control_plane(kueue=True) as plane:
        queues = docs_queues()
        assert sorted(q["kind"] for q in queues) == sorted(KUEUE_KINDS)
        # applied as they are (not `applied`: Kueue's defaulting webhook writes back the quotas' numbers as the
        # quantity strings they are, 16 -> "16", and adds its defaults)
        answers = control_plane.apply_all(plane.api_client(), [KUBEFLOW, *queues])
        assert [a.line() for a in answers if not a.ok] == []
        yield plane


def queued_trainjob(api, name: str, gpus: int, runtimes: list | None = None) -> dict:
    """The torch TrainJob of 2 nodes the launcher makes for queue team-gpu, its runtime installed by an admin (and
    put in `runtimes`)."""
    *made, trainjob = dry_run(["--dry-run", "--launcher", "trainjob", "--framework", "torch", "--name", name,
                               "--image", "europe-docker.pkg.dev/p/ml/train:1", "--workers", "1", "--gpus",
                               str(gpus), "--kueue-queue", "team-gpu", "--", "python", "-m", "components.train"])
    applied(api, [KUBEFLOW, *made])
    if runtimes is not None:
        runtimes.extend(made)
    return trainjob


def workload_of(api, trainjob: dict) -> dict | None:
    """The Workload Kueue made for the TrainJob (its owner)."""
    from kubernetes import client

    items = client.CustomObjectsApi(api).list_namespaced_custom_object(
        KUEUE, "v1beta2", trainjob["metadata"]["namespace"], "workloads")["items"]
    return next((w for w in items if any(o.get("uid") == trainjob["metadata"]["uid"]
                                          for o in w["metadata"].get("ownerReferences", []))), None)


def condition(obj: dict, kind: str) -> dict:
    return next((c for c in (obj.get("status") or {}).get("conditions", []) if c["type"] == kind), {})


def completed_once_admitted(api):
    """An end_jobs for follow(): completes each Job once Kueue's admission has unsuspended it (the JobSet
    controller creates the Jobs of a suspended JobSet suspended and resumes them with it)."""
    from kubernetes import client

    def end(_, job: dict) -> None:
        batch = client.BatchV1Api(api)
        name, namespace = job["metadata"]["name"], job["metadata"]["namespace"]
        resumed = wait_for(lambda: (lambda j: None if j["spec"].get("suspend") else j)(
            api.sanitize_for_serialization(batch.read_namespaced_job(name, namespace))))
        complete_job(batch, resumed)
    return end


def test_a_trainjob_that_fits_the_quota_is_admitted_to_the_flavor_and_runs(kueue):
    """2 nodes of 1 GPU, 4 CPUs and 16Gi each: within the ClusterQueue's 2 GPUs, 16 CPUs and 64Gi. Kueue admits
    it to the `t4` flavor and unsuspends it; Trainer's JobSet runs with the flavor's node label, and the launcher
    follows the TrainJob to Complete. Kueue's runtime patch is the one the stand-in's Kueue adds, and everything we
    sent survives Kueue writing the TrainJob back (with Trainer v2.2.1's types: an `env: []` did not, and the
    TrainJob stayed suspended for ever, trainjob.py)."""
    from tests.standins.kueue import KUEUE_PATCH_MANAGER, admit_trainjob
    from tests.test_control_plane import changed

    api = kueue.api_client()
    kinds = resources(api)
    trainjob = queued_trainjob(api, "kueue-fits", gpus=1)
    outcome, _ = follow(api, trainjob, completed_once_admitted(api))
    assert not isinstance(outcome, Exception), outcome
    assert (outcome.name, outcome.state) == ("kueue-fits", "Complete")

    stored = read(kinds["TrainJob"], "kueue-fits", "kubeflow")
    assert stored["spec"]["suspend"] is False
    workload = workload_of(api, stored)
    assert condition(workload, "Admitted")["status"] == "True"
    admission = workload["status"]["admission"]
    assert admission["clusterQueue"] == "gpu"
    assert [(p["name"], p["count"], p["flavors"]) for p in admission["podSetAssignments"]] == [
        ("node", 2, {"cpu": "t4", "memory": "t4", "nvidia.com/gpu": "t4"})]
    jobset = read(kinds["JobSet"], "kueue-fits", "kubeflow")
    assert jobset["spec"]["suspend"] is False
    pod = jobset["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"cloud.google.com/gke-accelerator": "nvidia-tesla-t4"}
    sent = {k: v for k, v in trainjob["spec"].items() if k != "runtimePatches"}
    assert changed(sent, stored["spec"]) == []
    assert changed(trainjob["spec"]["runtimePatches"][0], stored["spec"]["runtimePatches"][0]) == []

    # the stand-in's Kueue on the TrainJob the launcher sent, admitted to the docs' flavor
    flavor = next(q for q in docs_queues() if q["kind"] == "ResourceFlavor")["spec"]
    runtime = read(kinds["ClusterTrainingRuntime"], stored["spec"]["runtimeRef"]["name"])
    stand_in = copy.deepcopy(trainjob)
    stand_in["metadata"]["uid"] = stored["metadata"]["uid"]
    admit_trainjob(stand_in, runtime, flavor)
    assert [p["manager"] for p in stored["spec"]["runtimePatches"]] == [
        p["manager"] for p in stand_in["spec"]["runtimePatches"]]
    real_patch = next(p for p in stored["spec"]["runtimePatches"] if p["manager"] == KUEUE_PATCH_MANAGER)
    stand_in_patch = next(p for p in stand_in["spec"]["runtimePatches"] if p["manager"] == KUEUE_PATCH_MANAGER)
    assert differences({k: v for k, v in real_patch.items() if k != "time"}, stand_in_patch) == []


def stand_in_queues() -> dict:
    """KubernetesStandIn's Kueue options for the docs' queues: the LocalQueue's flavor spec, and its ClusterQueue's
    flavor and quota."""
    queues = {q["kind"]: q for q in docs_queues()}
    (flavor,) = queues["ClusterQueue"]["spec"]["resourceGroups"][0]["flavors"]
    assert flavor["name"] == queues["ResourceFlavor"]["metadata"]["name"]
    queue = queues["LocalQueue"]["metadata"]["name"]
    return {"kueue_flavors": {queue: queues["ResourceFlavor"]["spec"]},
            "kueue_quotas": {queue: {"flavor": flavor["name"], "nominalQuota": {
                r["name"]: str(r["nominalQuota"]) for r in flavor["resources"]}}}}


def held_run(api, trainjob: dict, caplog, kind: str = "trainjob") -> tuple[str, list[str]]:
    """The launcher on a job Kueue holds, given up after 5s: its error and what it logged about the job."""
    from components.launch.training import KUBERNETES_LAUNCHERS

    launcher = KUBERNETES_LAUNCHERS[kind](api, trainjob["metadata"]["namespace"], poll_seconds=0.2,
                                          timeout_seconds=5, echo=lambda line: None)
    caplog.clear()
    with caplog.at_level(logging.INFO), pytest.raises(JobTimedOut) as timed_out:
        launcher.run(trainjob)
    name = trainjob["metadata"]["name"]
    return str(timed_out.value), [m for m in caplog.messages if name in m and (" is " in m or "Kueue" in m)]


def test_a_trainjob_over_the_quota_is_held_and_the_launcher_says_why(kueue, caplog):
    """2 nodes of 2 GPUs: 4 GPUs, more than the ClusterQueue's 2. Kueue's webhook suspends it and its scheduler
    never admits it: the TrainJob and its JobSet stay suspended, the Workload is pending with the scheduler's
    reason, and the launcher logs that reason until it gives up, as against the stand-in's Kueue given the docs'
    queues."""
    from components.launch import kubernetes_client
    from tests.standins.k8s_api import KubernetesStandIn

    api = kueue.api_client()
    kinds = resources(api)
    runtimes: list[dict] = []
    trainjob = queued_trainjob(api, "kueue-held", gpus=2, runtimes=runtimes)
    with KubernetesStandIn(run_containers=False, **stand_in_queues()) as k8s:
        for runtime in runtimes:
            k8s.add_runtime(runtime)
        stand_in = held_run(kubernetes_client(k8s.url), trainjob, caplog)
    real = held_run(api, trainjob, caplog)
    # a first poll may come before Trainer's first status (no condition yet: Created), and before Kueue's scheduler
    # has said why (the order of the two lines); the stand-in answers both at once
    assert (real[0], sorted(line for line in real[1] if not line.endswith(" is Created"))) == (
        stand_in[0], sorted(stand_in[1]))
    assert stand_in == ("TrainJob kubeflow/kueue-held did not finish within 5s; it was cancelled", [
        f"launch: TrainJob kubeflow/kueue-held waits in Kueue queue team-gpu: {HELD_REASON}",
        "TrainJob kubeflow/kueue-held is Suspended (TrainJob is suspended)"])
    # cancelled: the launcher deleted it (in the foreground; no garbage collector runs here to finish that)
    held = read(kinds["TrainJob"], "kueue-held", "kubeflow")
    assert held["spec"]["suspend"] is True and held["metadata"].get("deletionTimestamp")
    reserved = condition(workload_of(api, held), "QuotaReserved")
    assert (reserved["status"], reserved["reason"], reserved["message"]) == ("False", "Pending", HELD_REASON)
    assert read(kinds["JobSet"], "kueue-held", "kubeflow")["spec"]["suspend"] is True


def test_the_launchers_jobsets_are_admitted_and_held_as_its_trainjobs(kueue, caplog):
    """The JobSet launcher's JobSets for queue team-gpu (Kueue's JobSet integration): 2 nodes of 1 GPU are
    admitted, unsuspended and given the pod-set labels and Workload annotation; 2 nodes of 2 GPUs are held, and the
    launcher logs Kueue's reason as for a TrainJob. (The stand-in's JobSets do not go through its Kueue: it starts
    them at once.)"""
    from kubernetes import client

    from tests.standins.kueue import workload_name

    api = kueue.api_client()
    custom = client.CustomObjectsApi(api)
    made = {}
    for name, gpus in (("jobset-fits", 1), ("jobset-held", 2)):
        (made[name],) = dry_run(["--dry-run", "--launcher", "jobset", "--framework", "torch", "--name", name,
                                 "--image", "europe-docker.pkg.dev/p/ml/train:1", "--workers", "1", "--gpus",
                                 str(gpus), "--kueue-queue", "team-gpu", "--", "python", "-m", "components.train"])
    assert control_plane.apply(api, made["jobset-fits"]).ok

    def admitted():
        jobset = custom.get_namespaced_custom_object("jobset.x-k8s.io", "v1alpha2", "kubeflow", "jobsets",
                                                     "jobset-fits")
        return None if jobset["spec"].get("suspend") else jobset
    template = wait_for(admitted)["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]
    uid = custom.get_namespaced_custom_object("jobset.x-k8s.io", "v1alpha2", "kubeflow", "jobsets",
                                              "jobset-fits")["metadata"]["uid"]
    assert template["metadata"]["labels"] == {
        "app.kubernetes.io/component": "training", "kueue.x-k8s.io/cluster-queue-name": "gpu",
        "kueue.x-k8s.io/local-queue-name": "team-gpu", "kueue.x-k8s.io/podset": "node"}
    assert template["metadata"]["annotations"] == {
        "kueue.x-k8s.io/workload": workload_name("JobSet", "jobset.x-k8s.io", "jobset-fits", uid)}
    assert template["spec"]["nodeSelector"] == {"cloud.google.com/gke-accelerator": "nvidia-tesla-t4"}

    error, lines = held_run(api, made["jobset-held"], caplog, kind="jobset")
    assert error == "JobSet kubeflow/jobset-held did not finish within 5s; it was cancelled"
    assert f"launch: JobSet kubeflow/jobset-held waits in Kueue queue team-gpu: {HELD_REASON}" in lines
    assert "JobSet kubeflow/jobset-held is Suspended (jobset is suspended)" in lines


def test_an_empty_trainer_list_keeps_an_admitted_trainjob_suspended_as_on_the_stand_in(kueue):
    """Why the launcher writes no `env: []` (trainjob.py): Kueue admits such a TrainJob, but its write-back, from
    Trainer v2.2.1's Go types, leaves the empty list out, Trainer's rule that spec.trainer never changes refuses it,
    and the TrainJob stays suspended with its Workload admitted. The stand-in's Kueue does the same
    (tests/standins/kueue.py left_out_on_write_back). Last in this module: its Workload keeps its quota."""
    from kubernetes import client

    from components.launch import kubernetes_client
    from tests.standins.k8s_api import KubernetesStandIn

    api = kueue.api_client()
    kinds = resources(api)
    runtimes: list[dict] = []
    # no GPU: the JobSet admitted above holds the queue's 2, and its CPUs and memory leave room for 2 CPU nodes
    trainjob = queued_trainjob(api, "kueue-empty-env", gpus=0, runtimes=runtimes)
    trainjob["spec"]["trainer"]["env"] = []
    assert control_plane.apply(api, trainjob).ok
    stored = wait_for(lambda: read(kinds["TrainJob"], "kueue-empty-env", "kubeflow"))
    wait_for(lambda: (lambda w: w if w and condition(w, "Admitted").get("status") == "True" else None)(
        workload_of(api, stored)))
    time.sleep(3)  # Kueue's update has been refused by now, and retried
    assert read(kinds["TrainJob"], "kueue-empty-env", "kubeflow")["spec"]["suspend"] is True

    with KubernetesStandIn(run_containers=False, **stand_in_queues()) as k8s:
        for runtime in runtimes:
            k8s.add_runtime(runtime)
        custom = client.CustomObjectsApi(kubernetes_client(k8s.url))
        made = custom.create_namespaced_custom_object("trainer.kubeflow.org", "v1alpha1", "kubeflow", "trainjobs",
                                                      copy.deepcopy(trainjob))
        (admitted,) = custom.list_namespaced_custom_object(
            "kueue.x-k8s.io", "v1beta2", "kubeflow", "workloads",
            label_selector=f"kueue.x-k8s.io/job-uid={made['metadata']['uid']}")["items"]
    assert made["spec"]["suspend"] is True and condition(admitted, "Admitted")["status"] == "True"
