"""Multi-node training on Kubeflow Trainer v2 (TrainJob) and JobSet: TF_CONFIG from the pod environment, manifests
checked against the real CRDs and the Kubernetes schema, the dry run, and the launchers end to end.

The launchers use the real `kubernetes` client against the Kubernetes API stand-in (tests/standins/k8s_api.py),
whose Trainer and JobSet controllers (tests/standins/trainer.py, jobsets.py) run each node as a local process with
the env, hostnames and labels the real JobSet pods get, and restart or fail the job as the manifests' failure
policies say.
"""

import json
import os
import re
import sys
import threading

import pytest
import yaml

from components import launch, train
from components.launch.jobset import cluster_env, node_hosts
from components.train import TRAINING_INFO, TrainSettings
from components.train.cluster import cluster_role, process_tf_config, tf_config_from_pod_env
from tests.conftest import REPO_ROOT, accuracy_of, preprocessed_slice, run_then_sigterm
from tests.standins.jobsets import jobset_problems
from tests.standins.k8s_api import KubernetesStandIn
from tests.standins.trainer import trainjob_jobset
from tests.standins.validation import crd_problems, job_problems
from tests.test_launch import job, script

TRAINJOBS = "/apis/trainer.kubeflow.org/v1alpha1/namespaces/ml/trainjobs"


def pod_env(name: str, nodes: int, index: int) -> dict:
    """The TF variables a node pod of `name` sees: the launcher's env, its Downward API field resolved as the
    kubelet does (to the pod's completion index annotation), and Kubernetes' own JOB_COMPLETION_INDEX."""
    env = {"JOB_COMPLETION_INDEX": str(index)}
    for var in cluster_env(name, nodes):
        if "valueFrom" in var:
            assert var["valueFrom"] == {"fieldRef": {
                "fieldPath": "metadata.annotations['batch.kubernetes.io/job-completion-index']"}}
            env[var["name"]] = str(index)
        else:
            env[var["name"]] = var["value"]
    return env


# ---------------------------------------------------------------------------------------------- TF_CONFIG


@pytest.mark.parametrize("nodes", [1, 2, 4])
def test_each_node_builds_its_tf_config_from_the_pod_environment(nodes):
    hosts = [f"train-1-node-0-{k}.train-1:2222" for k in range(nodes)]
    assert node_hosts("train-1", nodes) == hosts
    for index in range(nodes):
        env = pod_env("train-1", nodes, index)
        tf_config = tf_config_from_pod_env(env)
        if nodes == 1:
            assert tf_config is None and process_tf_config(env) is None  # one node: no cluster, no strategy
            continue
        config = json.loads(tf_config)
        assert config["cluster"] == {"chief": hosts[:1], "worker": hosts[1:]}
        assert config["task"] == ({"type": "chief", "index": 0} if index == 0 else
                                  {"type": "worker", "index": index - 1})
        role = cluster_role(tf_config)
        assert role.workers == nodes and role.is_chief == (index == 0)
        assert role.task == ("chief/0" if index == 0 else f"worker/{index - 1}")
        # Kubernetes' own variable says the same when the Downward API one is missing.
        assert tf_config_from_pod_env({k: v for k, v in env.items() if k != "TRAINING_NODE_INDEX"}) == tf_config


def test_the_platforms_tf_config_wins_and_bad_pod_environments_are_named():
    env = pod_env("train-1", 2, 1)
    assert process_tf_config({**env, "TF_CONFIG": '{"cluster": {}}'}) == '{"cluster": {}}'
    assert process_tf_config({}) is None and cluster_role("").task == "local"
    with pytest.raises(ValueError, match="Node index 2 is outside the 2 node"):
        tf_config_from_pod_env({**env, "TRAINING_NODE_INDEX": "2"})
    with pytest.raises(ValueError, match="which node this is"):
        tf_config_from_pod_env({"TRAINING_NODE_HOSTS": env["TRAINING_NODE_HOSTS"]})
    with pytest.raises(ValueError, match="must be a node index"):
        tf_config_from_pod_env({**env, "TRAINING_NODE_INDEX": "one"})
    with pytest.raises(ValueError, match="host:port for every node"):
        tf_config_from_pod_env({**env, "TRAINING_NODE_HOSTS": "a:1,,b:2"})


# ---------------------------------------------------------------------------------------------- manifests


def gpu_job(nodes: int, **kwargs) -> launch.TrainingJob:
    return job(workers=nodes - 1, kueue_queue="team-gpu", labels={"pipeline-run": "run-1"}, **kwargs)


def test_the_shipped_runtime_is_what_the_code_builds(capsys):
    assert launch.main(["--runtime-manifest"]) == 0
    with open(os.path.join(REPO_ROOT, "manifests", "trainer", "tensorflow-multiworker.yaml")) as f:
        assert f.read() == capsys.readouterr().out, \
            "regenerate: python -m components.launch --runtime-manifest > manifests/trainer/tensorflow-multiworker.yaml"


def test_the_runtime_is_plain_and_valid():
    runtime = launch.runtime_manifest()
    assert crd_problems(runtime) == []
    assert runtime["spec"]["mlPolicy"] == {"numNodes": 1}  # no torch/mpi/jax/...: Trainer's PlainML plugin
    assert launch.trainjob.runtime_problems(runtime) == ([], [])
    node = runtime["spec"]["template"]["spec"]["replicatedJobs"][0]
    assert node["name"] == "node" and node["replicas"] == 1
    assert node["template"]["metadata"]["labels"] == {"trainer.kubeflow.org/trainjob-ancestor-step": "trainer"}
    assert [c["name"] for c in node["template"]["spec"]["template"]["spec"]["containers"]] == ["node"]


@pytest.mark.parametrize("nodes", [1, 2, 4])
def test_trainjob_and_the_jobset_trainer_makes_of_it_are_valid(nodes):
    manifest = launch.trainjob_manifest(gpu_job(nodes), "ml")
    assert crd_problems(manifest) == []
    trainer = manifest["spec"]["trainer"]
    assert trainer["numNodes"] == nodes and trainer["image"] == "registry.example/gpu@sha256:abc"
    assert trainer["resourcesPerNode"] == {"requests": {"cpu": "4", "memory": "16Gi"},
                                           "limits": {"nvidia.com/gpu": "2"}}
    assert manifest["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team-gpu"
    # What Trainer v2 builds from the runtime and the TrainJob: the JobSet CRD, the JobSet webhook and the
    # Kubernetes schema (kubernetes-validate) accept it, and the pods are placed as the run chose.
    jobset, problems = trainjob_jobset(manifest, launch.runtime_manifest())
    assert problems == []
    assert jobset_problems({**jobset, "metadata": {**jobset["metadata"], "namespace": "ml"}}) == []
    node_job = jobset["spec"]["replicatedJobs"][0]["template"]
    assert job_problems(node_job) == []
    assert node_job["spec"]["parallelism"] == node_job["spec"]["completions"] == nodes
    pod = node_job["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"cloud.google.com/gke-accelerator": "nvidia-l4", "cloud.google.com/gke-spot": "true"}
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod["tolerations"]
    assert pod["containers"][0]["resources"]["limits"] == {"nvidia.com/gpu": "2"}
    assert node_job["spec"]["template"]["metadata"]["labels"]["pipeline-run"] == "run-1"


@pytest.mark.parametrize("nodes", [1, 2, 4])
def test_jobset_manifest_is_valid(nodes):
    manifest = launch.jobset_manifest(gpu_job(nodes), "ml")
    assert jobset_problems(manifest) == []
    node_job = manifest["spec"]["replicatedJobs"][0]["template"]
    assert node_job["spec"]["completions"] == nodes
    env = {e["name"]: e for e in node_job["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["TRAINING_NODE_HOSTS"]["value"] == ",".join(node_hosts("train-1", nodes))
    assert manifest["spec"]["failurePolicy"]["rules"] == [
        {"name": "permanent", "action": "FailJobSet", "onJobFailureReasons": ["PodFailurePolicy"],
         "targetReplicatedJobs": ["node"]}]
    assert manifest["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team-gpu"


def test_the_launchers_name_checks_refuse_what_jobset_refuses():
    """The launcher refuses a name whose pods' names JobSet's webhook would refuse, before creating anything. The
    stand-ins' checks are held to the real API server, Trainer and JobSet in tests/test_control_plane.py and
    tests/test_trainer_controllers.py (tests/standins/README.md)."""
    with pytest.raises(ValueError, match="too long for the pod names of 2 nodes"):
        launch.trainjob_manifest(gpu_job(2, name="t" * 50), "ml")
    assert len(launch.job_name("train", "r" * 80, "train-cluster-job-op", max_length=47)) == 47


def test_dry_run_prints_the_manifests_a_launch_creates(capsys):
    argv = ["--dry-run", "--name", "train-1", "--namespace", "ml", "--image", "registry.example/gpu@sha256:abc",
            "--workers", "1", "--accelerator", "nvidia-l4", "--gpus", "2", "--spot", "--kueue-queue", "team-gpu",
            "--", "python", "-m", "components.train", "--epochs", "1"]
    assert launch.main(argv) == 0
    printed = list(yaml.safe_load_all(capsys.readouterr().out))
    expected = launch.job_manifests("trainjob", job(command=["python", "-m", "components.train", "--epochs", "1"],
                                                    kueue_queue="team-gpu"), "ml")
    assert printed == expected and [m["kind"] for m in printed] == ["ClusterTrainingRuntime", "TrainJob"]
    assert launch.main([*argv[:1], "--runtime", "team-tf", *argv[1:]]) == 0
    assert [m["kind"] for m in yaml.safe_load_all(capsys.readouterr().out)] == ["TrainJob"]  # not ours to print
    assert launch.main([*argv[:1], "--launcher", "jobset", *argv[1:]]) == 0
    assert [m["kind"] for m in yaml.safe_load_all(capsys.readouterr().out)] == ["JobSet"]
    assert launch.main(["--dry-run", "--name", "t" * 60, "--image", "img", "--", "true"]) == 2
    assert "too long" in capsys.readouterr().err


def test_the_task_config_places_the_nodes():
    """KFP's TaskConfig (what the pipeline set on the task) becomes the nodes' placement and size."""
    task_config = {"resources": {"limits": {"nvidia.com/gpu": "2"}, "requests": {"cpu": "4", "memory": "16G"}},
                   "node_selector": {"cloud.google.com/gke-accelerator": "nvidia-l4"},
                   "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
                   "env": None, "affinity": None, "volumes": None, "volume_mounts": None}
    placement, sizes = launch.placement_from_task_config(task_config)
    assert (placement.gpus, placement.accelerator, sizes) == (2, "nvidia-l4", {"cpu": "4", "memory": "16G"})
    assert placement.tolerations == task_config["tolerations"]
    assert launch.placement_from_task_config({"resources": None, "node_selector": None}) is None
    with pytest.raises(ValueError, match="not a GPU count"):
        launch.placement_from_task_config({"resources": {"limits": {"nvidia.com/gpu": "many"}}})
    with pytest.raises(ValueError, match="vertex-job picks machines"):
        launch.LaunchSettings("vertex-job", "img", project="p", task_config=task_config)


# ---------------------------------------------------------------------------------------------- against the API


@pytest.fixture
def k8s():
    """The Kubernetes API stand-in with Trainer v2's runtime installed (`kubectl apply` of manifests/trainer/)."""
    with KubernetesStandIn() as api:
        api.add_runtime(launch.runtime_manifest())
        yield api


def launcher(k8s, kind=launch.TrainJobLauncher, lines=None):
    return kind(launch.kubernetes_client(k8s.url), "ml", poll_seconds=0.05,
                echo=(lines.append if lines is not None else lambda _: None))


ROLE = """
    from components.train.cluster import cluster_role
    role = cluster_role(None)
    print("node", role.task, "of", role.workers, flush=True)
"""


def test_trainjob_runs_to_success_and_streams_node_zero(k8s):
    lines = []
    outcome = launcher(k8s, lines=lines).run(launch.trainjob_manifest(gpu_job(3, command=script(ROLE)), "ml"))
    assert outcome.state == "Complete" and outcome.restarts == 0
    assert len(lines) == 1 and re.fullmatch(r"\[train-1-node-0-0-[0-9a-f]{5}\] node chief/0 of 3", lines[0])
    assert k8s.requests_to("GET", "/apis/trainer.kubeflow.org/v1alpha1/clustertrainingruntimes/tensorflow-multiworker")
    assert k8s.requests_to("POST", TRAINJOBS) and k8s.deleted == []  # a finished job is left for inspection
    # The pods the JobSet ran, as the API lists them: hostnames, the run's placement, the roles they took.
    from kubernetes import client

    pods = client.CoreV1Api(launch.kubernetes_client(k8s.url)).list_namespaced_pod(
        "ml", label_selector="jobset.sigs.k8s.io/jobset-name=train-1").items
    assert sorted(p.spec.hostname for p in pods) == ["train-1-node-0-0", "train-1-node-0-1", "train-1-node-0-2"]
    assert {p.spec.subdomain for p in pods} == {"train-1"}
    for pod in pods:
        assert pod.spec.node_selector["cloud.google.com/gke-spot"] == "true"
        assert pod.spec.containers[0].resources.limits == {"nvidia.com/gpu": "2"}
        assert pod.status.phase == "Succeeded"
    roles = sorted(line.strip() for p in k8s.jobset_pods("ml") for _, line in p.lines)
    assert roles == ["node chief/0 of 3", "node worker/0 of 3", "node worker/1 of 3"]


def test_a_preempted_node_restarts_every_node(k8s, tmp_path):
    """Spot preemption of node 1: DisruptionTarget, SIGTERM, exit 143. The Job fails (counted), JobSet restarts
    all nodes once (BlockingRecreate), and the second attempt finishes."""
    command = script(f"""
        import os, time
        index = os.environ["TRAINING_NODE_INDEX"]
        marker = os.path.join({str(tmp_path)!r}, "started-" + index)
        if os.path.exists(marker):
            print("resumed", flush=True)
        else:
            open(marker, "w").close()
            time.sleep(600)
    """)
    lines, outcome = [], []
    run = launcher(k8s, lines=lines)
    thread = threading.Thread(target=lambda: outcome.append(run.run(launch.trainjob_manifest(
        gpu_job(2, command=command), "ml"))), daemon=True)
    thread.start()
    k8s.wait_for(lambda: len(os.listdir(tmp_path)) == 2)
    node_1 = next(p.name for p in k8s.jobset_pods("ml") if p.index == 1)
    k8s.preempt("ml", node_1)
    thread.join(60)
    assert outcome and outcome[0].state == "Complete" and outcome[0].restarts == 1
    status = k8s.jobset("ml", "train-1").snapshot()["status"]
    assert status["restarts"] == status["restartsCountTowardsMax"] == 1
    restarting = next(c for c in status["conditions"] if c["type"] == "RestartingJobSet")
    assert (restarting["status"], restarting["reason"]) == ("False", "JobsReady")  # the restart is over
    assert any(line.endswith("] resumed") for line in lines)
    assert {p.labels["jobset.sigs.k8s.io/restart-attempt"] for p in k8s.jobset_pods("ml")} == {"1"}


GPU_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
SPOT_TOLERATION = {"key": "cloud.google.com/gke-spot", "operator": "Equal", "value": "true", "effect": "NoSchedule"}
DEDICATED = {"key": "dedicated", "operator": "Equal", "value": "ml", "effect": "NoSchedule"}


@pytest.mark.parametrize("flavor_tolerations, plugin, kept", [
    ([], True, True),  # no tolerations in the flavor: Kueue's patch leaves the pods' own alone
    ([DEDICATED, GPU_TOLERATION, SPOT_TOLERATION], True, True),  # the flavor carries ours
    ([DEDICATED, {"operator": "Exists"}], False, True),  # a toleration of every taint covers ours
    # The GPU toleration dropped: GKE's ExtendedResourceToleration plugin puts it back on each pod (a warning).
    ([DEDICATED, SPOT_TOLERATION], True, True),
    ([DEDICATED], True, False),  # Spot's gone: the plugin puts only the GPU one back
    ([DEDICATED, GPU_TOLERATION], False, False),  # Spot's gone
])
def test_kueue_flavor_tolerations_and_ours(flavor_tolerations, plugin, kept, caplog):
    """Kueue v0.19 admits a TrainJob by appending its runtime patch with the ResourceFlavor's tolerations, which
    replace the pods' list (tests/standins/kueue.py). A dropped GPU toleration comes back on each pod where the API
    server runs the ExtendedResourceToleration admission plugin (GKE: tests/standins/admission.py), so the launcher
    runs the job and warns; a dropped Spot toleration does not come back, so it stops at once, deleting the job,
    and says what to add to the flavor."""
    flavor = {"nodeLabels": {"cloud.google.com/gke-accelerator": "nvidia-l4"}, "tolerations": flavor_tolerations}
    plugins = ("ExtendedResourceToleration",) if plugin else ()
    with KubernetesStandIn(kueue_flavors={"team-gpu": flavor}, admission_plugins=plugins) as api:
        api.add_runtime(launch.runtime_manifest())
        manifest = launch.trainjob_manifest(gpu_job(2, command=script(ROLE)), "ml")
        if kept:
            with caplog.at_level("WARNING", logger="components.launch.trainjob"):
                assert launcher(api).run(manifest).state == "Complete"
            pods = [p.pod_spec for p in api.jobset_pods("ml")]
            assert len(pods) == 2
            for pod in pods:
                assert all(any(launch.trainjob._tolerates(t, wanted) for t in pod["tolerations"])
                           for wanted in (GPU_TOLERATION, SPOT_TOLERATION)), pod["tolerations"]
                assert pod["nodeSelector"]["cloud.google.com/gke-spot"] == "true"
            warned = [r.getMessage() for r in caplog.records if "ExtendedResourceToleration" in r.getMessage()]
            dropped_gpu = GPU_TOLERATION not in flavor_tolerations and flavor_tolerations and plugin
            assert len(warned) == bool(dropped_gpu), warned  # once per TrainJob, not at every poll
            return
        with pytest.raises(launch.LaunchError, match=r"Kueue's ResourceFlavor .* drops .*cloud.google.com/gke-spot.*"
                                                     r"Add these tolerations to the ResourceFlavor") as error:
            launcher(api).run(manifest)
        assert "'nvidia.com/gpu'" not in str(error.value).split("drops")[1].split("so the pods")[0]
        assert api.deleted == [("ml", "train-1")]
        (created,) = [b for b in api.created_bodies if b["kind"] == "TrainJob"]
        assert [p["manager"] for p in created["spec"]["runtimePatches"]] == [launch.trainjob.RUNTIME_PATCH_MANAGER]


def test_a_permanent_failure_fails_at_once_with_the_reason(k8s):
    command = script("""
        import os, sys, time
        if os.environ["TRAINING_NODE_INDEX"] == "1":
            print("error: Loss became nan at epoch 1, step 3", flush=True)
            sys.exit(2)
        time.sleep(600)
    """)
    with pytest.raises(launch.LaunchError) as error:
        launcher(k8s).run(launch.trainjob_manifest(gpu_job(2, command=command), "ml"))
    message = str(error.value)
    assert "TrainJob ml/train-1 ended Failed: applying FailJobSet failure policy action" in message
    assert re.search(r"node 1 \(pod train-1-node-0-1-[0-9a-f]{5}\) exited with code 2", message)
    assert "Loss became nan at epoch 1, step 3" in message  # node 1's own log, quoted
    assert k8s.jobset("ml", "train-1").snapshot()["status"]["restarts"] == 0  # never retried


def test_retryable_failures_stop_after_the_runtimes_restarts(k8s):
    k8s.add_runtime(launch.runtime_manifest("tf-one-restart", max_restarts=1))
    command = script("import os; os.kill(os.getpid(), 9)")  # SIGKILL (out of memory): 137, retryable
    with pytest.raises(launch.LaunchError, match="reaching max number of restarts"):
        launcher(k8s).run(launch.trainjob_manifest(gpu_job(1, command=command), "ml", runtime="tf-one-restart"))
    assert k8s.jobset("ml", "train-1").snapshot()["status"]["restarts"] == 1


def test_cancelling_the_run_deletes_the_trainjob(k8s, tmp_path):
    started = tmp_path / "started"
    command = script(f"""
        import time
        open({str(started)!r}, "w").close()
        time.sleep(600)
    """)
    pods, child = run_then_sigterm(
        [sys.executable, "-m", "components.launch", "--api-server", k8s.url, "--namespace", "ml", "--name",
         "train-cancel", "--image", "img", "--workers", "1", "--poll-seconds", "0.05", "--", *command],
        ready=lambda: started.exists() and k8s.jobset_pods("ml"))
    assert child.returncode == 143, child.stderr
    assert ("ml", "train-cancel") in k8s.deleted
    assert k8s.requests_to("DELETE", f"{TRAINJOBS}/train-cancel")
    assert all(pod.process.poll() is not None for pod in pods)
    assert "cancelled" in child.stderr


def test_a_missing_or_framework_runtime_is_refused_before_anything_is_created(k8s):
    manifest = launch.trainjob_manifest(gpu_job(2), "ml", runtime="not-installed")
    with pytest.raises(launch.LaunchError, match=r"'not-installed' is not installed: apply it with `kubectl apply "
                                                 r"--server-side -f manifests/trainer/tensorflow-multiworker.yaml`"):
        launcher(k8s).run(manifest)
    torch = launch.runtime_manifest("torch-distributed")
    torch["spec"]["mlPolicy"]["torch"] = {}
    k8s.add_runtime(torch)
    with pytest.raises(launch.LaunchError, match="has a torch policy"):
        launcher(k8s).run(launch.trainjob_manifest(gpu_job(2), "ml", runtime="torch-distributed"))
    assert not k8s.requests_to("POST", TRAINJOBS)
    # Without the launcher's check, Trainer's own webhook refuses it too.
    from kubernetes import client
    from kubernetes.client.rest import ApiException

    with pytest.raises(ApiException) as refused:
        client.CustomObjectsApi(launch.kubernetes_client(k8s.url)).create_namespaced_custom_object(
            "trainer.kubeflow.org", "v1alpha1", "ml", "trainjobs", manifest)
    assert refused.value.status == 403 and "must be created before the TrainJob" in refused.value.body


def test_a_retried_launcher_follows_the_trainjob_it_created(k8s):
    manifest = launch.trainjob_manifest(gpu_job(1, command=script("import time; time.sleep(0.5)")), "ml")
    launcher(k8s).create(manifest)
    assert launcher(k8s).run(manifest).state == "Complete"
    assert len(k8s.created_bodies) == 1


def test_a_launcher_killed_mid_training_is_followed_by_one_that_finds_the_running_trainjob(k8s, tmp_path):
    """The launcher's pod is killed while the nodes train (evicted under node pressure or OOM-killed: SIGKILL, no
    chance to delete its job). KFP retries the step; the new launcher asks for the same TrainJob (named after the
    run and task), finds it running and follows it to the end: no second TrainJob, no second set of nodes."""
    import subprocess

    go = tmp_path / "go"
    command = script(f"""
        import os, time
        with open(os.path.join({str(tmp_path)!r}, "started-" + os.environ["TRAINING_NODE_INDEX"]), "a") as f:
            f.write("started\\n")
        while not os.path.exists({str(go)!r}):
            time.sleep(0.05)
        print("trained", flush=True)
    """)
    argv = [sys.executable, "-m", "components.launch", "--api-server", k8s.url, "--namespace", "ml", "--name",
            "train-restarted", "--image", "img", "--workers", "1", "--poll-seconds", "0.05", "--", *command]
    launchers = []
    try:
        launchers.append(subprocess.Popen(argv, cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                          text=True))
        k8s.wait_for(lambda: len(list(tmp_path.glob("started-*"))) == 2)  # both nodes are training
        launchers[0].kill()
        launchers[0].communicate(timeout=30)
        assert k8s.deleted == [] and ("ml", "train-restarted") in k8s.trainjobs  # the job outlives its launcher
        launchers.append(subprocess.Popen(argv, cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                          text=True))
        k8s.wait_for(lambda: len(k8s.requests_to("POST", TRAINJOBS)) == 2)  # the retry asked for the job again
        go.touch()
        _, stderr = launchers[1].communicate(timeout=60)
    finally:
        for child in launchers:
            if child.poll() is None:
                child.kill()
                child.communicate()
    assert launchers[1].returncode == 0, stderr[-3000:]
    assert [b["metadata"]["name"] for b in k8s.created_bodies if b["kind"] == "TrainJob"] == ["train-restarted"]
    for index in (0, 1):  # each node started once: the retried launcher did not restart the training
        assert (tmp_path / f"started-{index}").read_text() == "started\n"
    assert k8s.jobset("ml", "train-restarted").snapshot()["status"]["restarts"] == 0


def test_an_invalid_trainjob_is_reported_with_the_api_message(k8s):
    manifest = launch.trainjob_manifest(gpu_job(2), "ml")
    manifest["spec"]["trainer"]["numNodes"] = "two"
    with pytest.raises(launch.LaunchError, match=r"TrainJob.trainer.kubeflow.org \"train-1\" is invalid: "
                                                 r"spec.trainer.numNodes: 'two' is not of type 'integer'"):
        launcher(k8s).run(manifest)


def test_jobset_launcher_runs_and_fails_the_same_way(k8s):
    lines = []
    outcome = launcher(k8s, launch.JobSetLauncher, lines).run(launch.jobset_manifest(
        gpu_job(2, command=script(ROLE)), "ml"))
    assert outcome.state == "Completed" and outcome.restarts == 0
    assert len(lines) == 1 and lines[0].endswith("node chief/0 of 2")
    failing = script("import sys; print('error: no shards under gs://b/d', flush=True); sys.exit(2)")
    with pytest.raises(launch.LaunchError, match=r"JobSet ml/train-2 ended Failed: applying FailJobSet"):
        launcher(k8s, launch.JobSetLauncher).run(launch.jobset_manifest(gpu_job(1, name="train-2",
                                                                                command=failing), "ml"))


# ---------------------------------------------------------------------------------------------- training for real


@pytest.fixture(scope="module")
def sharded_dataset(fashion_dir, tmp_path_factory) -> str:
    """6000 source images: ~5400 train in 2 shards (one per node), 6000 test."""
    return preprocessed_slice(fashion_dir, tmp_path_factory, "trainjob_dataset", limit=6000)


@pytest.mark.slow
def test_a_two_node_trainjob_matches_a_single_process(k8s, sharded_dataset, tmp_path):
    """The train step's path with launcher=trainjob: two nodes started as the TrainJob's pods start (no TF_CONFIG:
    each builds its own from the pod env) train with MultiWorkerMirroredStrategy on loopback, placed by the task's
    config, and match one process within one point of test accuracy."""
    epochs, batch = 6, 64
    task_config = {"resources": {"limits": {"nvidia.com/gpu": "0"}, "requests": {"cpu": "1", "memory": "2G"}},
                   "node_selector": {"cloud.google.com/gke-nodepool": "cpu"}, "tolerations": []}
    info = launch.launch_training(
        TrainSettings(sharded_dataset, "unused", backup_dir=str(tmp_path / "checkpoints"), epochs=epochs,
                      batch_size=batch),
        launch.LaunchSettings("trainjob", "img", workers=1, namespace="ml", task_config=task_config),
        model_path=str(tmp_path / "model"), tensorboard_path=str(tmp_path / "tensorboard"),
        staging_dir=str(tmp_path / "staging"), run_id="run-1", task_name="train",
        api_client=launch.kubernetes_client(k8s.url), poll_seconds=0.2)
    body = k8s.created_bodies[0]
    assert body["kind"] == "TrainJob" and body["spec"]["trainer"]["numNodes"] == 2
    assert body["spec"]["trainer"]["resourcesPerNode"]["requests"] == {"cpu": "1", "memory": "2G"}
    pod_patch = body["spec"]["runtimePatches"][0]["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"][0]
    assert pod_patch["template"]["spec"]["template"]["spec"]["nodeSelector"] == {"cloud.google.com/gke-nodepool": "cpu"}
    assert not any("TF_CONFIG" in p.env for p in k8s.jobset_pods("ml"))
    assert info["strategy"] == "MultiWorkerMirroredStrategy" and info["workers"] == 2
    assert info["steps"] == epochs * info["steps_per_epoch"]

    single = train.train(sharded_dataset, str(tmp_path / "single"), epochs=epochs, batch_size=batch)
    assert info["global_batch_size"] == 2 * single.global_batch_size
    multi_accuracy = accuracy_of(str(tmp_path / "model"), sharded_dataset)
    single_accuracy = accuracy_of(str(tmp_path / "single"), sharded_dataset)
    print(f"test accuracy: 2-node TrainJob {multi_accuracy:.4f}, 1 process {single_accuracy:.4f}")
    assert multi_accuracy > 0.8
    assert abs(multi_accuracy - single_accuracy) <= 0.01, (multi_accuracy, single_accuracy)


@pytest.mark.slow
def test_a_node_preempted_mid_training_resumes_at_the_exact_step(k8s, small_dataset, tmp_path):
    """Real training on two nodes; node 1's VM is preempted after a checkpoint: both nodes stop at the same step
    (the chief checkpoints it), the TrainJob restarts them, and they resume from that step and run exactly the
    planned number of steps."""
    settings = TrainSettings(small_dataset, str(tmp_path / "model"), backup_dir=str(tmp_path / "checkpoints"),
                             epochs=4, batch_size=16, learning_rate=1e-3, steps_per_execution=1,
                             checkpoint_seconds=0.25, input_mode="memory")
    lines, outcome = [], []
    run = launcher(k8s, lines=lines)
    thread = threading.Thread(target=lambda: outcome.append(run.run(launch.trainjob_manifest(
        gpu_job(2, command=settings.command(sys.executable)), "ml"))), daemon=True)
    thread.start()
    k8s.wait_for(lambda: any("train: checkpoint" in line for line in lines) or not thread.is_alive(), timeout=300)
    node_1 = next(p.name for p in k8s.jobset_pods("ml") if p.index == 1)
    if not any(p.running for p in k8s.jobset_pods("ml")):
        pytest.fail("training ended before node 1 could be preempted:\n" + "\n".join(lines[-20:]))
    k8s.preempt("ml", node_1)
    thread.join(600)
    assert outcome and outcome[0].state == "Complete" and outcome[0].restarts == 1, "\n".join(lines[-30:])

    preempted = [int(m.group(1)) for line in lines for m in [re.search(r"ckpt-(\d+) \(preempted\)", line)] if m]
    resumed = [int(m.group(1)) for line in lines for m in [re.search(r"resuming from step (\d+)", line)] if m]
    assert len(preempted) == 1 and resumed == preempted, "\n".join(lines[-40:])
    with open(tmp_path / "model" / TRAINING_INFO) as f:
        info = json.load(f)
    assert info["workers"] == 2 and info["steps"] == 4 * info["steps_per_epoch"] > preempted[0]
    print(f"node 1 preempted: both nodes stopped at step {preempted[0]} of {info['steps']} and resumed there")
