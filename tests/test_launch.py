"""Multi-node launch and GPU placement: per-run accelerator choice, Spot, Kueue, TFJob and Vertex CustomJob.

The launchers use the real clients (`kubernetes`, `google.cloud.aiplatform_v1` over REST) against local stand-ins
of the APIs (tests/standins/), which run each replica's command as a local process with the TF_CONFIG the
platform would set. Compile tests assert on the compiled pipeline YAML.
"""

import os
import sys
import textwrap

import pytest
import yaml

from components import launch
from components.train import TrainSettings
from pipelines import config, training
from tests.conftest import REPO_ROOT, run_then_sigterm, vertex_client
from tests.standins.k8s_api import KubernetesStandIn
from tests.standins.kueue import DEFAULT_FRAMEWORKS
from tests.standins.vertex_jobs import VertexJobsStandIn

KNOWN = config.ACCELERATORS


def script(code: str) -> list[str]:
    """A container command: this Python running `code`."""
    return [sys.executable, "-c", textwrap.dedent(code)]


# ---------------------------------------------------------------------------------------------- placement


def test_known_accelerators_are_the_gke_ones():
    assert set(KNOWN) == {"nvidia-tesla-t4", "nvidia-l4", "nvidia-tesla-a100", "nvidia-a100-80gb",
                          "nvidia-h100-80gb", "nvidia-h200-141gb", "nvidia-h100-mega-80gb", "nvidia-b200"}
    assert launch.ACCELERATOR_NODE_LABEL == config.ACCELERATOR_NODE_LABEL
    assert launch.GPU_RESOURCE == config.GPU_RESOURCE
    assert launch.KUEUE_QUEUE_LABEL == config.KUEUE_QUEUE_LABEL
    assert set(launch.VERTEX_MACHINES) == set(KNOWN)


def test_unknown_accelerator_is_refused_with_the_known_ones():
    with pytest.raises(ValueError) as error:
        launch.gpu_placement("nvidia-tesla-k80", 1, known_accelerators=KNOWN)
    assert "nvidia-tesla-k80" in str(error.value)
    for name in KNOWN:
        assert name in str(error.value)


@pytest.mark.parametrize("gpus", [-1, 17, 1.5, True])
def test_gpu_count_out_of_range_is_refused(gpus):
    with pytest.raises(ValueError, match="GPU count"):
        launch.gpu_placement("nvidia-l4", gpus, known_accelerators=KNOWN)


def test_placement_for_gpu_spot_and_node_pool():
    s = launch.gpu_placement("nvidia-h100-80gb", 8, known_accelerators=KNOWN, spot=True, node_pool="h100-spot")
    assert s.node_selector == {"cloud.google.com/gke-accelerator": "nvidia-h100-80gb",
                               "cloud.google.com/gke-spot": "true", "cloud.google.com/gke-nodepool": "h100-spot"}
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in s.tolerations
    assert {"key": "cloud.google.com/gke-spot", "operator": "Equal", "value": "true",
            "effect": "NoSchedule"} in s.tolerations
    assert s.gpus == 8


def test_cpu_only_placement_ignores_the_accelerator():
    s = launch.gpu_placement("anything", 0, known_accelerators=KNOWN)
    assert s.node_selector == {} and s.tolerations == [] and s.accelerator == ""
    with pytest.raises(ValueError, match="node pool"):
        launch.gpu_placement("nvidia-l4", 1, known_accelerators=KNOWN, node_pool="Bad Pool!")


def test_pipectl_refuses_an_unknown_accelerator_before_running():
    from pipelines import cli

    with pytest.raises(ValueError, match="Unknown accelerator 'nvidia-k80'"):
        cli.validate_parameters({"train_accelerator_type": "nvidia-k80"})
    assert cli.validate_parameters({"train_spot": True, "train_gpu_count": 2}) == {"train_spot": True,
                                                                                  "train_gpu_count": 2}


def test_job_names_are_stable_dns_labels():
    name = launch.job_name("train", "Image-Classification-20260101-123456-" + "x" * 60, "train-op")
    assert len(name) <= 63 and name == name.lower() and not name.endswith("-")
    assert name == launch.job_name("train", "Image-Classification-20260101-123456-" + "x" * 60, "train-op")
    assert name != launch.job_name("train", "Image-Classification-20260101-123456-" + "y" * 60, "train-op")


# ---------------------------------------------------------------------------------------------- compile


def compiled(tmp_path, settings=None) -> tuple[dict, dict]:
    path = training.compile_pipeline(str(tmp_path / "pipeline.yaml"), settings)
    with open(path) as f:
        spec, platform = list(yaml.safe_load_all(f))
    return spec, platform["platforms"]["kubernetes"]["deploymentSpec"]["executors"]


def test_compile_training_placement_is_chosen_per_run(tmp_path):
    spec, executors = compiled(tmp_path)
    params = spec["root"]["inputDefinitions"]["parameters"]
    assert params["train_accelerator_type"]["defaultValue"] == config.DEFAULT_TRAIN_ACCELERATOR
    assert params["train_gpu_count"]["parameterType"] == "NUMBER_INTEGER"
    assert params["train_spot"] == {**params["train_spot"], "parameterType": "BOOLEAN", "defaultValue": False}
    assert params["train_node_pool"]["defaultValue"] == ""
    # The node selector and tolerations are the placement step's checked outputs, through the _json forms.
    train = executors["exec-train-op"]
    assert train["nodeSelector"] == {"nodeSelectorJson": {"taskOutputParameter": {
        "outputParameterKey": "node_selector", "producerTask": "placement-op"}}}
    assert train["tolerations"] == [{"tolerationJson": {"taskOutputParameter": {
        "outputParameterKey": "tolerations", "producerTask": "placement-op"}}}]
    placement_inputs = spec["root"]["dag"]["tasks"]["placement-op"]["inputs"]["parameters"]
    assert placement_inputs["spot"] == {"componentInputParameter": "train_spot"}
    assert placement_inputs["accelerator"] == {"componentInputParameter": "train_accelerator_type"}
    assert placement_inputs["known_accelerators"]["runtimeValue"]["constant"] == KNOWN
    resources = spec["deploymentSpec"]["executors"]["exec-train-op"]["container"]["resources"]["accelerator"]
    assert resources["resourceType"] == "nvidia.com/gpu"
    # A string output of the placement step (the driver reads a number placeholder as no GPU): "" for 0 GPUs.
    assert resources["resourceCount"] == "{{$.inputs.parameters['pipelinechannel--placement-op-gpu_limit']}}"


def test_compile_spot_training_gets_a_retry_policy_with_backoff(tmp_path):
    spec, _ = compiled(tmp_path)
    retry = spec["root"]["dag"]["tasks"]["train-op"]["retryPolicy"]
    assert retry == {"maxRetryCount": 3, "backoffDuration": "60s", "backoffFactor": 2.0,
                     "backoffMaxDuration": "3600s"}


def test_the_placement_step_turns_spot_into_selector_and_toleration():
    from components import ops

    result = ops.placement_op.python_func(accelerator="nvidia-l4", gpus=1, spot=True, node_pool="",
                                          known_accelerators=KNOWN)
    assert result.node_selector == {"cloud.google.com/gke-accelerator": "nvidia-l4", "cloud.google.com/gke-spot": "true"}
    assert {"key": "cloud.google.com/gke-spot", "operator": "Equal", "value": "true",
            "effect": "NoSchedule"} in result.tolerations
    assert result.gpu_limit == "1"
    cpu = ops.placement_op.python_func(accelerator="nvidia-l4", gpus=0, spot=False, node_pool="", known_accelerators=KNOWN)
    assert (cpu.gpu_limit, cpu.node_selector, cpu.tolerations) == ("", {}, [])
    assert result.vertex_accelerator == "NVIDIA_L4"
    with pytest.raises(ValueError, match="Unknown accelerator"):
        ops.placement_op.python_func(accelerator="tpu-v5", gpus=1, spot=False, node_pool="", known_accelerators=KNOWN)


def test_compile_kueue_queue_labels_the_gpu_pods(tmp_path):
    _, executors = compiled(tmp_path, config.PipelineSettings(kueue_queue="team-gpu"))
    for executor in ("exec-train-op", "exec-predict-op"):
        assert executors[executor]["podMetadata"]["labels"] == {"kueue.x-k8s.io/queue-name": "team-gpu"}
    assert "exec-preprocess-op" not in executors  # CPU steps get no Kubernetes settings at all
    _, plain = compiled(tmp_path, config.PipelineSettings())
    assert "podMetadata" not in plain["exec-train-op"]


@pytest.mark.parametrize("launcher", config.CLUSTER_LAUNCHERS)
def test_compile_cluster_launchers_pass_the_task_placement_on(tmp_path, launcher):
    settings = config.PipelineSettings(train_launcher=launcher, kueue_queue="team-gpu", train_namespace="ml",
                                       train_runtime="team-tf")
    spec, executors = compiled(tmp_path, settings)
    tasks = spec["root"]["dag"]["tasks"]
    assert "train-op" not in tasks and "train-cluster-job-op" in tasks
    inputs = tasks["train-cluster-job-op"]["inputs"]["parameters"]
    assert inputs["launcher"]["runtimeValue"]["constant"] == launcher
    # the nodes' image: the one the image step picks for the run's framework (tests/test_compile.py)
    assert inputs["image"] == {"taskOutputParameter": {"outputParameterKey": "train", "producerTask": "step-images-op"}}
    assert inputs["namespace"]["runtimeValue"]["constant"] == "ml"
    assert inputs["runtime"]["runtimeValue"]["constant"] == "team-tf"
    assert inputs["kueue_queue"]["runtimeValue"]["constant"] == "team-gpu"
    assert inputs["workers"] == {"componentInputParameter": "train_workers"}
    assert tasks["train-cluster-job-op"]["retryPolicy"]["maxRetryCount"] == 3
    # KFP's TaskConfig passthrough: the task's node selector and tolerations go to the op, which gives them to the
    # nodes, and are not applied to the launching pod itself; its resources are its own (apply_to_task), a small
    # CPU and memory request and no GPU. The nodes' size comes as values, the GPU count from the check step.
    component = spec["components"]["comp-train-cluster-job-op"]
    assert component["inputDefinitions"]["parameters"]["task_config"]["parameterType"] == "TASK_CONFIG"
    assert component["taskConfigPassthroughs"] == [{"field": "RESOURCES", "applyToTask": True},
                                                   {"field": "KUBERNETES_NODE_SELECTOR"},
                                                   {"field": "KUBERNETES_TOLERATIONS"}]
    container = spec["deploymentSpec"]["executors"]["exec-train-cluster-job-op"]["container"]
    assert container["image"] == settings.images.cpu
    assert "accelerator" not in container["resources"]
    assert (container["resources"]["resourceCpuRequest"], container["resources"]["resourceMemoryRequest"]) == \
        training.LAUNCHER_REQUEST == ("1", "2G")
    assert inputs["node_cpu"]["runtimeValue"]["constant"] == "4"
    assert inputs["node_memory"]["runtimeValue"]["constant"] == "16G"
    assert inputs["node_gpus"] == {"taskOutputParameter": {"outputParameterKey": "gpu_limit",
                                                           "producerTask": "placement-op"}}
    placed = executors["exec-train-cluster-job-op"]
    assert placed["nodeSelector"] == {"nodeSelectorJson": {"taskOutputParameter": {
        "outputParameterKey": "node_selector", "producerTask": "placement-op"}}}
    assert placed["tolerations"] == [{"tolerationJson": {"taskOutputParameter": {
        "outputParameterKey": "tolerations", "producerTask": "placement-op"}}}]
    assert "podMetadata" not in placed  # the Kueue label goes on the job, not on the launching pod
    # The model still flows to evaluation from the training task.
    evaluate_inputs = tasks["evaluate-op"]["inputs"]["artifacts"]["model"]["taskOutputArtifact"]
    assert evaluate_inputs["producerTask"] == "train-cluster-job-op"
    assert training.task_names(settings)["train"] == "train-cluster-job-op"


def test_compile_vertex_job_launcher_places_its_pools_from_parameters(tmp_path):
    spec, executors = compiled(tmp_path, config.PipelineSettings(train_launcher="vertex-job"))
    inputs = spec["root"]["dag"]["tasks"]["train-job-op"]["inputs"]["parameters"]
    assert inputs["accelerator"] == {"componentInputParameter": "train_accelerator_type"}
    assert "taskConfigPassthroughs" not in spec["components"]["comp-train-job-op"]
    container = spec["deploymentSpec"]["executors"]["exec-train-job-op"]["container"]
    assert "accelerator" not in container["resources"] and "exec-train-job-op" not in executors


def test_cluster_launchers_are_refused_on_vertex():
    with pytest.raises(ValueError, match="on Vertex AI use pod or vertex-job"):
        config.PipelineSettings(target="vertex", train_launcher="trainjob")


def test_compile_vertex_target_fixes_the_accelerator_when_compiling(tmp_path):
    settings = config.PipelineSettings(target="vertex", train_accelerator="nvidia-l4", train_gpus=2)
    path = training.compile_pipeline(str(tmp_path / "vertex.yaml"), settings)
    with open(path) as f:
        docs = list(yaml.safe_load_all(f))
    resources = docs[0]["deploymentSpec"]["executors"]["exec-train-op"]["container"]["resources"]["accelerator"]
    assert (resources["resourceType"], resources["resourceCount"]) == ("NVIDIA_L4", "2")


# ---------------------------------------------------------------------------------------------- TFJob


def job(name="train-1", command=None, workers=1, **kwargs) -> launch.TrainingJob:
    placement = launch.gpu_placement("nvidia-l4", 2, known_accelerators=KNOWN, spot=True)
    return launch.TrainingJob(name=name, image="registry.example/gpu@sha256:abc", workers=workers,
                              command=command or script("print('trained')"), placement=placement, **kwargs)


def test_tfjob_manifest_shape():
    manifest = launch.tfjob_manifest(job(workers=3, kueue_queue="team-gpu"), "ml")
    assert manifest["apiVersion"] == "kubeflow.org/v1" and manifest["kind"] == "TFJob"
    assert manifest["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team-gpu"
    specs = manifest["spec"]["tfReplicaSpecs"]
    assert specs["Chief"]["replicas"] == 1 and specs["Worker"]["replicas"] == 3
    for spec in specs.values():
        assert spec["restartPolicy"] == "ExitCode"
        pod = spec["template"]["spec"]
        container = pod["containers"][0]
        assert container["name"] == "tensorflow" and container["image"] == "registry.example/gpu@sha256:abc"
        assert container["command"] == specs["Chief"]["template"]["spec"]["containers"][0]["command"]
        assert container["resources"]["limits"] == {"nvidia.com/gpu": "2"}
        assert pod["nodeSelector"]["cloud.google.com/gke-accelerator"] == "nvidia-l4"
        assert pod["nodeSelector"]["cloud.google.com/gke-spot"] == "true"
        assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod["tolerations"]
        assert pod["terminationGracePeriodSeconds"] >= 30
    assert "Worker" not in launch.tfjob_manifest(job(workers=0), "ml")["spec"]["tfReplicaSpecs"]


def test_tfjob_runs_to_success_and_streams_the_chief_log():
    with KubernetesStandIn() as k8s:
        lines = []
        launcher = launch.TFJobLauncher(launch.kubernetes_client(k8s.url), "ml", poll_seconds=0.05, echo=lines.append)
        command = script("""
            import json, os
            config = json.loads(os.environ["TF_CONFIG"])
            print("role", config["task"]["type"], config["task"]["index"], "of", len(config["cluster"]["worker"]) + 1)
        """)
        outcome = launcher.run(launch.tfjob_manifest(job(command=command, workers=2), "ml"))
        assert outcome.state == "Succeeded"
        assert lines == ["[train-1-chief-0] role chief 0 of 3"]
        assert k8s.created_bodies[0]["spec"]["tfReplicaSpecs"]["Worker"]["replicas"] == 2
        pods = k8s.job("ml", "train-1").pods
        assert sorted(pods) == ["train-1-chief-0", "train-1-worker-0", "train-1-worker-1"]
        assert k8s.requests_to("POST", "/apis/kubeflow.org/v1/namespaces/ml/tfjobs")
        assert k8s.deleted == []  # a finished job is left for inspection; its pods are cleaned up


# Kueue v0.19's default configuration with its TFJob and PyTorchJob integrations added (tests/standins/kueue.py)
WITH_TRAINING_OPERATOR = DEFAULT_FRAMEWORKS | {"kubeflow.org/tfjob", "kubeflow.org/pytorchjob"}


def test_a_queued_tfjob_is_refused_where_kueue_does_not_manage_tfjobs(capsys):
    """Kueue v0.19's defaults leave kubeflow.org/tfjob out: the queue label would do nothing and the job would run
    outside the quota. The launcher asks the API server (a dry run, which Kueue's webhook answers) and stops."""
    with KubernetesStandIn(run_containers=False) as k8s:
        manifest = launch.tfjob_manifest(job(kueue_queue="team-gpu"), "ml")
        with pytest.raises(launch.LaunchError) as refused:
            launch.TFJobLauncher(launch.kubernetes_client(k8s.url), "ml").run(manifest)
        message = str(refused.value)
        assert "\n" not in message
        assert message.startswith("Kueue on this cluster does not manage kubeflow.org/tfjob (a server-side dry run "
                                  "of TFJob ml/train-1 came back unsuspended), so queue 'team-gpu' would not hold it")
        assert '"kubeflow.org/tfjob" to integrations.frameworks' in message and "trainjob or jobset" in message
        assert k8s.created_bodies == [] and k8s.jobs == {}  # nothing was created
        assert len(k8s.dry_runs) == 1 and "suspend" not in k8s.dry_runs[0]["spec"]["runPolicy"]

        code = launch.main(["--launcher", "tfjob", "--api-server", k8s.url, "--namespace", "ml", "--name",
                            "train-2", "--image", "img", "--workers", "0", "--kueue-queue", "team-gpu", "--",
                            *script("print('trained')")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len([line for line in err if "does not manage kubeflow.org/tfjob" in line]) == 1
    assert k8s.created_bodies == []


def test_a_queued_tfjob_waits_for_kueue_where_it_manages_tfjobs(caplog):
    with KubernetesStandIn(kueue_frameworks=WITH_TRAINING_OPERATOR, kueue_flavors={"team-gpu": {}}) as k8s:
        launcher = launch.TFJobLauncher(launch.kubernetes_client(k8s.url), "ml", poll_seconds=0.05,
                                        echo=lambda _: None)
        with caplog.at_level("INFO", logger="components.launch.tfjob"):
            outcome = launcher.run(launch.tfjob_manifest(job(kueue_queue="team-gpu", workers=0), "ml"))
        assert outcome.state == "Succeeded"
        assert k8s.dry_runs[0]["spec"]["runPolicy"]["suspend"] is True  # Kueue's webhook suspended it
        assert k8s.job("ml", "train-1").body["spec"]["runPolicy"]["suspend"] is False  # and admitted it
    assert "launch: Kueue manages kubeflow.org/tfjob: TFJob ml/train-1 waits for queue team-gpu" in caplog.messages


def test_an_unqueued_tfjob_is_not_dry_run():
    with KubernetesStandIn() as k8s:
        outcome = launch.TFJobLauncher(launch.kubernetes_client(k8s.url), "ml", poll_seconds=0.05,
                                       echo=lambda _: None).run(launch.tfjob_manifest(job(workers=0), "ml"))
        assert outcome.state == "Succeeded" and k8s.dry_runs == []


def test_tfjob_failure_fails_the_step_with_the_reason_and_log_tail():
    with KubernetesStandIn() as k8s:
        launcher = launch.TFJobLauncher(launch.kubernetes_client(k8s.url), "ml", poll_seconds=0.05, echo=lambda _: None)
        command = script("""
            import sys
            print("error: Loss became nan at epoch 1, step 3")
            sys.exit(2)
        """)
        with pytest.raises(launch.LaunchError) as error:
            launcher.run(launch.tfjob_manifest(job(command=command, workers=0), "ml"))
        assert str(error.value).splitlines()[:2] == [
            'TFJob ml/train-1 ended Failed: job "train-1" is failing because "Chief" replica(s) failed.',
            "chief 0 (pod train-1-chief-0) exited with code 2"]
        assert "Loss became nan at epoch 1, step 3" in str(error.value)


def test_tfjob_restarts_a_preempted_replica(tmp_path):
    marker = tmp_path / "preempted-once"
    command = script(f"""
        import os, sys
        if not os.path.exists({str(marker)!r}):
            open({str(marker)!r}, "w").close()
            print("preempted: checkpoint saved")
            sys.exit(143)
        print("resumed and finished")
    """)
    with KubernetesStandIn() as k8s:
        lines = []
        launcher = launch.TFJobLauncher(launch.kubernetes_client(k8s.url), "ml", poll_seconds=0.05, echo=lines.append)
        outcome = launcher.run(launch.tfjob_manifest(job(command=command, workers=0), "ml"))
        assert outcome.state == "Succeeded" and outcome.restarts == 1
        assert k8s.job("ml", "train-1").pods["train-1-chief-0"].restarts == 1
        assert "[train-1-chief-0] resumed and finished" in lines


def test_a_retried_launcher_follows_the_existing_job():
    with KubernetesStandIn() as k8s:
        client = launch.kubernetes_client(k8s.url)
        command = script("import time; time.sleep(0.5); print('done')")
        manifest = launch.tfjob_manifest(job(command=command, workers=0), "ml")
        launch.TFJobLauncher(client, "ml").create(manifest)
        outcome = launch.TFJobLauncher(client, "ml", poll_seconds=0.05, echo=lambda _: None).run(manifest)
        assert outcome.state == "Succeeded"
        assert len(k8s.created_bodies) == 1


def test_cancelling_the_run_deletes_the_tfjob(tmp_path):
    """The launcher pod gets SIGTERM when the pipeline run is cancelled: the TFJob and its pods must go."""
    with KubernetesStandIn() as k8s:
        started = tmp_path / "started"
        command = script(f"""
            import time
            open({str(started)!r}, "w").close()
            time.sleep(600)
        """)
        pods, launcher = run_then_sigterm(
            [sys.executable, "-m", "components.launch", "--launcher", "tfjob", "--api-server", k8s.url, "--namespace",
             "ml", "--name",
             "train-cancel", "--image", "img", "--workers", "1", "--poll-seconds", "0.05", "--", *command],
            ready=lambda: started.exists() and list(k8s.job("ml", "train-cancel").pods.values()))
        assert launcher.returncode == 143, launcher.stderr
        assert ("ml", "train-cancel") in k8s.deleted
        assert k8s.requests_to("DELETE", "/apis/kubeflow.org/v1/namespaces/ml/tfjobs/train-cancel")
        assert all(pod.process.poll() is not None for pod in pods)
        assert "cancelled" in launcher.stderr


def test_launch_cli_exit_codes_follow_the_training_contract(capsys):
    """2 for bad input and for a job that failed (permanent), as components/stepcli.py documents; 143 is above."""
    assert launch.main(["--name", "bad", "--image", "img", "--gpus", "99", "--", "true"]) == 2
    assert "GPU count" in capsys.readouterr().err
    with KubernetesStandIn() as k8s:
        failing = script("import sys; sys.exit(2)")
        code = launch.main(["--launcher", "tfjob", "--api-server", k8s.url, "--namespace", "ml", "--name",
                            "train-fails", "--image", "img",
                            "--workers", "0", "--poll-seconds", "0.05", "--", *failing])
    assert code == 2
    assert "TFJob ml/train-fails ended Failed" in capsys.readouterr().err


def test_invalid_tfjob_is_reported_with_the_api_message():
    with KubernetesStandIn(run_containers=False) as k8s:
        manifest = launch.tfjob_manifest(job(), "ml")
        manifest["spec"]["tfReplicaSpecs"]["Chief"]["template"]["spec"]["containers"][0]["name"] = "trainer"
        with pytest.raises(launch.LaunchError, match="one container must be named tensorflow"):
            launch.TFJobLauncher(launch.kubernetes_client(k8s.url), "ml").run(manifest)


@pytest.mark.slow
def test_tfjob_trains_a_model_on_two_workers(small_dataset, tmp_path):
    """The launch step end to end: the real training command as chief + 1 worker, model copied to the output."""
    with KubernetesStandIn(kueue_frameworks=WITH_TRAINING_OPERATOR, kueue_flavors={"team-gpu": {}}) as k8s:
        lines = []
        settings = TrainSettings(small_dataset, str(tmp_path / "unused"), backup_dir=str(tmp_path / "checkpoints"),
                                 epochs=1, batch_size=32)
        where = launch.LaunchSettings("tfjob", "img", workers=1, accelerator="nvidia-l4", gpus=0, spot=True,
                                      kueue_queue="team-gpu", namespace="ml")
        info = launch.launch_training(
            settings, where, model_path=str(tmp_path / "model"), tensorboard_path=str(tmp_path / "tensorboard"),
            staging_dir=str(tmp_path / "staging"), run_id="run-1", task_name="train",
            api_client=launch.kubernetes_client(k8s.url), poll_seconds=0.2)
        body = k8s.created_bodies[0]
        assert body["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team-gpu"
        command = body["spec"]["tfReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]["command"]
        assert command[:3] == ["python", "-m", "components.train"]
    assert info["workers"] == 2 and info["strategy"] == "MultiWorkerMirroredStrategy"
    assert info["steps"] == info["steps_per_epoch"]
    assert os.path.exists(tmp_path / "model" / "model.keras")
    assert os.path.exists(tmp_path / "model" / "saved_model" / "saved_model.pb")
    assert os.listdir(tmp_path / "tensorboard")


# ---------------------------------------------------------------------------------------------- Vertex AI


def test_custom_job_worker_pools():
    from google.cloud import aiplatform_v1 as v1

    spec = launch.custom_job(job(workers=3), vertex_accelerators=KNOWN, spot=True)
    pools = spec.job_spec.worker_pool_specs
    assert [p.replica_count for p in pools] == [1, 3]
    for pool in pools:
        assert pool.machine_spec.machine_type == "g2-standard-24"
        assert pool.machine_spec.accelerator_type == v1.AcceleratorType.NVIDIA_L4
        assert pool.machine_spec.accelerator_count == 2
        assert pool.container_spec.image_uri == "registry.example/gpu@sha256:abc"
    assert spec.job_spec.scheduling.strategy == v1.Scheduling.Strategy.SPOT
    assert spec.job_spec.scheduling.restart_job_on_worker_restart
    with pytest.raises(ValueError, match="no machine with 3 x nvidia-l4"):
        launch.vertex_machine_type("nvidia-l4", 3)


def test_vertex_custom_job_runs_the_pools_and_succeeds(tmp_path):
    with VertexJobsStandIn() as vertex:
        launcher = launch.VertexJobLauncher(vertex_client(vertex.url), "proj", "us-central1", poll_seconds=0.05)
        # The chief finishes last, as in multi-worker training (the job ends when the chief does).
        command = script(f"""
            import json, os, time
            task = json.loads(os.environ["TF_CONFIG"])["task"]
            print(task["type"], task["index"], flush=True)
            open(os.path.join({str(tmp_path)!r}, task["type"] + str(task["index"])), "w").close()
            while task["type"] == "chief" and len(os.listdir({str(tmp_path)!r})) < 3:
                time.sleep(0.05)
        """)
        outcome = launcher.run(launch.custom_job(job(command=command, workers=2), vertex_accelerators=KNOWN,
                                                 spot=False))
        assert outcome.state == "JOB_STATE_SUCCEEDED"
        assert outcome.name.startswith("projects/proj/locations/us-central1/customJobs/")
        body = vertex.created_bodies[0]
        assert [int(p["replicaCount"]) for p in body["jobSpec"]["workerPoolSpecs"]] == [1, 2]
        # On demand is STANDARD: ON_DEMAND is deprecated (googleapis/googleapis,
        # google/cloud/aiplatform/v1/custom_job.proto:379 at f8291d2b).
        # (The REST transport sends enums as numbers.)
        from google.cloud import aiplatform_v1 as v1
        assert v1.Scheduling.Strategy(body["jobSpec"]["scheduling"]["strategy"]) == v1.Scheduling.Strategy.STANDARD
        assert sorted(vertex.jobs[outcome.name].log_text().split("\n")) == ["", "chief 0", "worker 0", "worker 1"]


def test_vertex_custom_job_failure_names_the_replica():
    with VertexJobsStandIn() as vertex:
        launcher = launch.VertexJobLauncher(vertex_client(vertex.url), "proj", "us-central1", poll_seconds=0.05)
        command = script("""
            import json, os, sys, time
            if json.loads(os.environ["TF_CONFIG"])["task"]["type"] == "worker":
                sys.exit(1)
            time.sleep(30)  # the chief would wait for its peer
        """)
        with pytest.raises(launch.LaunchError,
                           match="JOB_STATE_FAILED: The replica workerpool1-0 exited with a non-zero status of 1"):
            launcher.run(launch.custom_job(job(command=command, workers=1), vertex_accelerators=KNOWN, spot=False))


def test_cancelling_the_run_cancels_the_custom_job(tmp_path):
    started = tmp_path / "started"
    command = script(f"""
        import time
        open({str(started)!r}, "w").close()
        time.sleep(600)
    """)
    with VertexJobsStandIn() as vertex:
        _, runner = run_then_sigterm([sys.executable, "-c", textwrap.dedent(f"""
            import sys
            sys.path.insert(0, {REPO_ROOT!r})
            from components import launch
            from tests.conftest import vertex_client
            from tests.test_launch import job, KNOWN
            launcher = launch.VertexJobLauncher(vertex_client({vertex.url!r}), "proj", "us-central1", poll_seconds=0.05)
            try:
                launcher.run(launch.custom_job(job(command={command!r}, workers=0), vertex_accelerators=KNOWN, spot=True))
            except launch.Cancelled as e:
                print("cancelled:", e)
                sys.exit(143)
        """)], ready=started.exists)
        assert runner.returncode == 143, runner.stderr
        assert "cancelled" in runner.stdout
        name = vertex.cancelled[0]
        assert vertex.jobs[name].snapshot()["state"] == "JOB_STATE_CANCELLED"
        assert all(pod.process.poll() is not None for pod in vertex.jobs[name].pods)


def test_a_job_cannot_use_a_pipeline_root_its_replicas_cannot_reach(tmp_path):
    with pytest.raises(ValueError, match="gs:// pipeline root"):
        launch.launch_training(
            TrainSettings("minio://mlpipeline/v2/artifacts/run/preprocess/dataset", "unused",
                          backup_dir="minio://mlpipeline/checkpoints/run/train"),
            launch.LaunchSettings("tfjob", "img", workers=1, accelerator="nvidia-l4", gpus=1, namespace="ml"),
            model_path=str(tmp_path / "model"), tensorboard_path=str(tmp_path / "tb"),
            staging_dir="minio://mlpipeline/jobs/run/train", run_id="run", task_name="train")
