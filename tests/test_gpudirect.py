"""GPUDirect networking for multi-node training (components/launch/network.py): the node pods of a TrainJob (as
Trainer makes its JobSet from the TrainJob and its runtime, tests/standins/trainer.py) and of a JobSet carry what
upstream's reference pods carry (tests/upstream/gpudirect/: container-engine-accelerators at network.CEA_COMMIT),
the manifests validate against the vendored CRDs and the Kubernetes schema, and what cannot run is refused in one
line before anything is created. In the pipeline, the run's train_network reaches the cluster-job step's launcher
(compiled YAML, the driver model's resolved inputs, `pipectl compile --explain`) and is refused by pipectl or the
placement step where the compiled launcher cannot carry it.
"""

import json
import os

import pytest
import yaml

from components import launch
from components.gcp.accelerators import ACCELERATORS
from components.launch import network
from components.launch.network import RDMA, TCPXO, pod_network
from tests.conftest import REPO_ROOT
from tests.standins.jobsets import jobset_problems
from tests.standins.trainer import trainjob_jobset
from tests.standins.validation import crd_problems, job_problems
from tests.test_install_versions import kueue_trainjob_problems

ACCELERATOR = {RDMA: "nvidia-h200-141gb", TCPXO: "nvidia-h100-mega-80gb"}
COMMAND = ["python", "-m", "components.train", "--epochs", "1"]


def upstream_pod(name: str) -> dict:
    with open(os.path.join(REPO_ROOT, "tests", "upstream", "gpudirect", f"{name}-pod.yaml")) as f:
        return yaml.safe_load(f)


def gpudirect_job(net: str, framework: str = "torch", *, accelerator: str = "", gpus: int = 8,
                  workers: int = 1) -> launch.TrainingJob:
    placement = launch.gpu_placement(accelerator or ACCELERATOR[net], gpus,
                                     known_accelerators=launch.VERTEX_MACHINES)
    return launch.TrainingJob(name="train-gd", image="registry.example/torch@sha256:abc", workers=workers,
                              command=launch.frameworks.setup(framework).node_command(COMMAND),
                              placement=placement, framework=framework, network=net)


def node_pods(launcher: str, job: launch.TrainingJob) -> dict:
    """The node pod template the cluster runs: the JobSet launcher's own, or the one Trainer makes of the TrainJob
    and the runtime the dry run shows with it; both valid against the CRDs and the Kubernetes schema."""
    manifests = launch.job_manifests(launcher, job, "ml")
    for manifest in manifests:
        assert crd_problems(manifest) == []
    if launcher == "trainjob":
        runtime, trainjob = manifests
        assert kueue_trainjob_problems(trainjob) == []  # Kueue v0.19.2's TrainJob types hold all of it
        jobset, problems = trainjob_jobset(trainjob, runtime)
        assert problems == []
    else:
        (jobset,) = manifests
    assert jobset_problems({**jobset, "metadata": {**jobset["metadata"], "namespace": "ml"}}) == []
    node_job = jobset["spec"]["replicatedJobs"][0]["template"]
    assert job_problems(node_job) == []
    assert node_job["spec"]["completions"] == job.nodes
    return node_job["spec"]["template"]


def by_name(items: list[dict]) -> dict:
    return {item["name"]: item for item in items}


def sourced(command: list[str]) -> str:
    """The script the node's command sources before it execs the training command."""
    assert command[:2] == ["/bin/bash", "-c"] and command[4:6] == ["python", "-m"]
    assert command[2].startswith("source ") and command[2].endswith(' && exec "$@"')
    return command[2][len("source "):-len(' && exec "$@"')]


@pytest.mark.parametrize("launcher", ["trainjob", "jobset"])
@pytest.mark.parametrize("framework", ["torch", "jax", "tensorflow"])
def test_rdma_node_pods_carry_what_upstreams_a3_ultra_and_a4_pod_carries(launcher, framework):
    upstream = upstream_pod("rdma")
    (test,) = upstream["spec"]["containers"]
    pod = node_pods(launcher, gpudirect_job(RDMA, framework))
    assert pod["metadata"]["annotations"] == upstream["metadata"]["annotations"]
    assert json.loads(pod["metadata"]["annotations"]["networking.gke.io/interfaces"])[1:] == [
        {"interfaceName": f"eth{k + 2}", "network": f"rdma-{k}"} for k in range(8)]
    assert by_name(pod["spec"]["volumes"]) == by_name(upstream["spec"]["volumes"])
    assert "initContainers" not in pod["spec"] and [c["name"] for c in pod["spec"]["containers"]] == ["node"]
    (node,) = pod["spec"]["containers"]
    assert by_name(node["volumeMounts"]) == by_name(test["volumeMounts"])
    env = by_name(node["env"])
    assert all(env[var["name"]] == var for var in test["env"])  # LD_LIBRARY_PATH=/usr/local/nvidia/lib64
    assert f"source {sourced(node['command'])}" in test["args"][0].splitlines()
    assert node["resources"]["limits"]["nvidia.com/gpu"] == str(test["resources"]["limits"]["nvidia.com/gpu"])
    assert pod["spec"]["nodeSelector"]["cloud.google.com/gke-accelerator"] == "nvidia-h200-141gb"
    assert node["command"][3:] == [f"gpudirect-{RDMA}", *gpudirect_job(RDMA, framework).command]


@pytest.mark.parametrize("launcher", ["trainjob", "jobset"])
@pytest.mark.parametrize("framework", ["torch", "jax", "tensorflow"])
def test_tcpxo_node_pods_carry_what_upstreams_a3_mega_pod_carries(launcher, framework):
    upstream = upstream_pod("tcpxo")
    daemon, test = upstream["spec"]["containers"]
    pod = node_pods(launcher, gpudirect_job(TCPXO, framework))
    assert pod["metadata"]["annotations"] == upstream["metadata"]["annotations"]
    assert by_name(pod["spec"]["volumes"]) == by_name(upstream["spec"]["volumes"])
    # The daemon as a native sidecar: upstream's container, started before the node and stopped after it. Its
    # imagePullPolicy (Always) is left to the default, IfNotPresent for a tagged image.
    (sidecar,) = pod["spec"]["initContainers"]
    assert sidecar == {**{k: v for k, v in daemon.items() if k != "imagePullPolicy"}, "restartPolicy": "Always"}
    (node,) = pod["spec"]["containers"]
    assert by_name(node["volumeMounts"]) == by_name(test["volumeMounts"])
    env = by_name(node["env"])
    assert all(env[var["name"]] == var for var in test["env"])  # LD_LIBRARY_PATH, NCCL_FASTRAK_LLCM_DEVICE_DIRECTORY
    # The installer's NCCL settings, as gpudirect-tcpxo/README.md:29-35 says to load them.
    assert env["NCCL_LIB_DIR"]["value"] == "/usr/local/nvidia/lib64"
    assert sourced(node["command"]) == "${NCCL_LIB_DIR}/nccl-env-profile.sh"
    assert node["resources"]["limits"]["nvidia.com/gpu"] == str(test["resources"]["limits"]["nvidia.com/gpu"])
    assert pod["spec"]["nodeSelector"]["cloud.google.com/gke-accelerator"] == "nvidia-h100-mega-80gb"


def test_a_tcpxo_trainjob_runs_on_its_runtime_and_rdma_on_the_frameworks_own():
    runtime, trainjob = launch.job_manifests("trainjob", gpudirect_job(TCPXO), "ml")
    assert runtime["metadata"]["name"] == trainjob["spec"]["runtimeRef"]["name"] == "torch-multinode-tcpxo"
    runtime, trainjob = launch.job_manifests("trainjob", gpudirect_job(RDMA), "ml")
    assert runtime["metadata"]["name"] == trainjob["spec"]["runtimeRef"]["name"] == "torch-multinode"
    patch = trainjob["spec"]["runtimePatches"][0]["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"][0]
    assert set(patch["template"]["spec"]["template"]["spec"]) >= {"volumes", "containers", "nodeSelector"}
    # Without a network, nothing of it: the same TrainJob as before.
    plain = launch.trainjob_manifest(gpudirect_job("", accelerator="nvidia-h200-141gb"), "ml", "torch-multinode")
    assert "annotations" not in json.dumps(plain) and plain["spec"]["trainer"]["command"][0] == "python"


@pytest.mark.parametrize("framework,file", [("tensorflow", "tensorflow-multiworker-tcpxo.yaml"),
                                            ("torch", "torch-multinode-tcpxo.yaml"),
                                            ("jax", "jax-multinode-tcpxo.yaml")])
def test_the_shipped_tcpxo_runtimes_are_what_the_code_builds_and_valid(framework, file, capsys):
    assert launch.main(["--runtime-manifest", "--framework", framework, "--network", "tcpxo"]) == 0
    with open(os.path.join(REPO_ROOT, "manifests", "trainer", file)) as f:
        shipped = f.read()
    assert shipped == capsys.readouterr().out, \
        f"regenerate: python -m components.launch --runtime-manifest --framework {framework} --network tcpxo " \
        f"> manifests/trainer/{file}"
    runtime = yaml.safe_load(shipped)
    assert crd_problems(runtime) == []
    assert launch.trainjob.runtime_problems(runtime, framework) == ([], [])


REFUSALS = [
    (dict(net=RDMA, accelerator="nvidia-h100-mega-80gb"), "trainjob",
     "GPUDirect RDMA runs on A3 Ultra (nvidia-h200-141gb) or A4 (nvidia-b200) nodes, not on nvidia-h100-mega-80gb"),
    (dict(net=TCPXO, accelerator="nvidia-b200"), "jobset",
     "GPUDirect-TCPXO runs on A3 Mega (nvidia-h100-mega-80gb) nodes, not on nvidia-b200"),
    (dict(net=RDMA, gpus=4), "trainjob",
     "GPUDirect RDMA: each node takes all 8 GPUs of its A3 Ultra machine (and with them all its GPU NICs); got 4 "
     "GPU(s) per node"),
    (dict(net=TCPXO, gpus=0, accelerator="nvidia-h100-mega-80gb"), "jobset",
     "GPUDirect-TCPXO runs on A3 Mega (nvidia-h100-mega-80gb) nodes, not on CPU nodes"),
    (dict(net=RDMA), "pytorchjob",
     "GPUDirect RDMA: the pytorchjob launcher's pods cannot carry the GPU NICs' networks and volumes; use "
     "--launcher trainjob or jobset"),
    (dict(net=RDMA, framework="tensorflow"), "tfjob",
     "GPUDirect RDMA: the tfjob launcher's pods cannot carry the GPU NICs' networks and volumes; use --launcher "
     "trainjob or jobset"),
    (dict(net="roce", accelerator="nvidia-b200"), "jobset", "network must be one of rdma, tcpxo (or empty: the pod network), got 'roce'"),
]


@pytest.mark.parametrize("job_args,launcher,message", REFUSALS)
def test_what_the_nodes_cannot_use_is_refused_in_one_line(job_args, launcher, message):
    with pytest.raises(ValueError) as refused:
        launch.job_manifests(launcher, gpudirect_job(**job_args), "ml")
    assert str(refused.value) == message and "\n" not in message


def test_a_tcpxo_trainjob_on_another_runtime_and_a_vertex_job_are_refused():
    with pytest.raises(ValueError, match=r"^GPUDirect-TCPXO's tcpxo-daemon sidecar comes with the runtime "
                                         r"'torch-multinode-tcpxo' \(manifests/trainer/torch-multinode-tcpxo.yaml\), "
                                         r"not 'my-runtime': a TrainJob's runtime patch cannot add a container$"):
        launch.job_manifests("trainjob", gpudirect_job(TCPXO), "ml", runtime="my-runtime")
    with pytest.raises(ValueError, match="^GPUDirect RDMA: the vertex-job launcher's pods cannot carry"):
        launch.custom_job(gpudirect_job(RDMA, accelerator="nvidia-b200"), vertex_accelerators=ACCELERATORS,
                          spot=False)
    with pytest.raises(ValueError, match="^GPUDirect RDMA: the vertex-job launcher's pods"):
        launch.training_job(launch.LaunchSettings("vertex-job", "img", accelerator="nvidia-b200", gpus=8,
                                                  network=RDMA, project="p", framework="torch"),
                            COMMAND, run_id="r", task_name="t")


def test_the_cli_dry_run_refuses_in_one_line(capsys):
    assert launch.main(["--dry-run", "--framework", "torch", "--network", "rdma", "--accelerator", "nvidia-b200",
                        "--gpus", "4", "--name", "t", "--image", "img", "--", *COMMAND]) == 2
    assert capsys.readouterr().err == ("error: GPUDirect RDMA: each node takes all 8 GPUs of its A4 machine (and with "
                                       "them all its GPU NICs); got 4 GPU(s) per node\n")


def test_the_gpudirect_machines_are_in_the_accelerator_table():
    for net, accelerators in network.NETWORK_ACCELERATORS.items():
        for accelerator in accelerators:
            assert launch.VERTEX_MACHINES[accelerator] == {8: {"nvidia-h200-141gb": "a3-ultragpu-8g",
                                                               "nvidia-b200": "a4-highgpu-8g",
                                                               "nvidia-h100-mega-80gb": "a3-megagpu-8g"}[accelerator]}


# ---------------------------------------------------------------------------------------------- in the pipeline


def compiled(tmp_path, launcher: str, target: str = "kfp") -> tuple[str, dict]:
    from pipelines import config, training

    path = training.compile_pipeline(str(tmp_path / "pipeline.yaml"),
                                     config.PipelineSettings(train_launcher=launcher, target=target))
    with open(path) as f:
        return path, next(yaml.safe_load_all(f))


def explained_nodes(path: str, parameters: dict) -> list[dict]:
    from pipelines.backend import explain

    steps = {step["task"]: step for step in explain.explain(path, parameters)["steps"]}
    return steps["train-cluster-job-op"]["nodes"]


def test_train_network_reaches_the_cluster_launcher_and_the_placement_check(tmp_path):
    path, spec = compiled(tmp_path, "trainjob")
    assert spec["root"]["inputDefinitions"]["parameters"]["train_network"]["defaultValue"] == ""
    tasks = spec["root"]["dag"]["tasks"]
    # The launcher's --network (LaunchSettings.network) and the placement step's check take the run's value.
    assert tasks["train-cluster-job-op"]["inputs"]["parameters"]["gpudirect"] == {
        "componentInputParameter": "train_network"}
    assert tasks["placement-op"]["inputs"]["parameters"]["network"] == {"componentInputParameter": "train_network"}
    assert tasks["placement-op"]["inputs"]["parameters"]["created_by"]["runtimeValue"]["constant"] == "trainjob"
    # What the driver resolves for the run is what the launcher's own code makes of it: 2 A3 Ultra nodes on RDMA.
    [node] = explained_nodes(path, {"train_network": RDMA, "train_accelerator_type": "nvidia-h200-141gb",
                                    "train_gpu_count": 8, "train_workers": 1, "framework": "torch"})
    assert node["replicas"] == 2 and node["resources"]["limits"] == {"nvidia.com/gpu": "8"}
    assert sourced(node["command"]) == network.RDMA_NCCL_ENV_SCRIPT
    rdma = pod_network(RDMA)
    assert [i["network"] for i in node["network"]["annotations"][network.INTERFACES_ANNOTATION]] == [
        "default", *(f"rdma-{k}" for k in range(8))]
    assert [v["name"] for v in node["network"]["volumes"]] == [v["name"] for v in rdma.volumes]
    assert node["network"]["env"] == {"LD_LIBRARY_PATH": network.NVIDIA_LIB64} and "sidecars" not in node["network"]
    # On the pod network the nodes carry none of it.
    [plain] = explained_nodes(path, {"train_accelerator_type": "nvidia-h200-141gb", "train_gpu_count": 8})
    assert "network" not in plain and plain["command"][:2] != ["/bin/bash", "-c"]


@pytest.mark.parametrize("launcher", ["trainjob", "jobset"])
def test_explain_shows_a_tcpxo_nodes_sidecar_devices_and_volumes(tmp_path, launcher):
    """A TCPXO TrainJob's node pod fields come from its shipped runtime, a JobSet's from its own pod template."""
    path, _ = compiled(tmp_path, launcher)
    [node] = explained_nodes(path, {"train_network": TCPXO, "train_accelerator_type": "nvidia-h100-mega-80gb",
                                    "train_gpu_count": 8, "train_workers": 1})
    tcpxo = pod_network(TCPXO)
    assert node["replicas"] == 2 and sourced(node["command"]) == network.TCPXO_NCCL_ENV_SCRIPT
    assert node["network"]["sidecars"] == [{"name": network.TCPXO_DAEMON, "image": network.TCPXO_DAEMON_IMAGE}]
    assert [d["path"] for d in node["network"]["annotations"][network.TCPXO_DEVICES_ANNOTATION]][:2] == [
        "/dev/nvidia0", "/dev/nvidia1"]
    assert {v["name"]: v.get("mountPath") for v in node["network"]["volumes"]} == {
        v["name"]: {m["name"]: m["mountPath"] for m in tcpxo.mounts}.get(v["name"]) for v in tcpxo.volumes}
    assert node["network"]["env"] == {e["name"]: e["value"] for e in tcpxo.env}


PIPECTL_REFUSALS = [
    ("pod", dict(train_accelerator_type="nvidia-h200-141gb"),
     "GPUDirect RDMA: a pipeline step's own pod cannot carry the GPU NICs' networks and volumes; use "
     "--train-launcher trainjob or jobset"),
    ("tfjob", dict(train_accelerator_type="nvidia-h200-141gb"),
     "GPUDirect RDMA: the tfjob launcher's pods cannot carry the GPU NICs' networks and volumes; use "
     "--train-launcher trainjob or jobset"),
    ("pytorchjob", dict(train_accelerator_type="nvidia-b200", framework="torch"),
     "GPUDirect RDMA: the pytorchjob launcher's pods cannot carry the GPU NICs' networks and volumes; use "
     "--train-launcher trainjob or jobset"),
    ("vertex-job", dict(train_accelerator_type="nvidia-h200-141gb"),
     "GPUDirect RDMA: the vertex-job launcher's pods cannot carry the GPU NICs' networks and volumes; use "
     "--train-launcher trainjob or jobset"),
    ("vertex", dict(train_accelerator_type="nvidia-h200-141gb"),
     "GPUDirect RDMA: a pipeline step's pod on Vertex AI Pipelines cannot carry the GPU NICs' networks and "
     "volumes; use a KFP backend on GKE (--target kfp) with --train-launcher trainjob or jobset"),
    ("jobset", dict(train_accelerator_type="nvidia-h200-141gb", train_gpu_count=4),
     "GPUDirect RDMA: each node takes all 8 GPUs of its A3 Ultra machine (and with them all its GPU NICs); got 4 "
     "GPU(s) per node"),
    ("trainjob", dict(train_network="roce"),
     "train_network must be one of rdma, tcpxo, or empty for the pod network (got 'roce')"),
]


@pytest.mark.parametrize("launcher,given,message", PIPECTL_REFUSALS)
def test_pipectl_refuses_a_network_the_compiled_launcher_cannot_carry_in_one_line(launcher, given, message):
    from pipelines import parameters

    values = {"train_network": RDMA, "train_gpu_count": 8, **given}
    with pytest.raises(ValueError) as refused:
        parameters.validate_parameters(dict(values), launcher=launcher)
    assert str(refused.value) == f"Invalid pipeline parameters:\n  {message}"
    assert "\n" not in message
    # An uploaded pipeline's launcher is unknown to pipectl: its placement step refuses the same.
    if launcher in ("pod", "tfjob", "vertex"):
        assert parameters.validate_parameters(dict(values)) == values
        from components import ops

        with pytest.raises(ValueError, match=f"^{message}$".replace("(", r"\(").replace(")", r"\)")):
            ops.placement_op.python_func(accelerator=values["train_accelerator_type"], gpus=8, spot=False,
                                         node_pool="", known_accelerators=ACCELERATORS, created_by=launcher,
                                         network=RDMA)


def test_pipectl_run_local_refuses_before_anything_runs(tmp_path, capsys):
    from pipelines import cli

    output = tmp_path / "run"
    assert cli.main(["run", "--local", "--output-dir", str(output), "--train-launcher", "pod", "--train-network",
                     "rdma", "--train-accelerator-type", "nvidia-h200-141gb", "--train-gpu-count", "8"]) == 2
    assert capsys.readouterr().err.splitlines()[-1] == (
        "  GPUDirect RDMA: a pipeline step's own pod cannot carry the GPU NICs' networks and volumes; use "
        "--train-launcher trainjob or jobset")
    assert not output.exists()


def test_the_train_step_hands_the_run_network_to_its_launcher(tmp_path):
    """The cluster-job step's own code: the run's network reaches LaunchSettings, whose check refuses it on CPU
    nodes before any cluster is asked."""
    from kfp import dsl

    from components import ops

    artifacts = {name: kind(uri=f"gs://b/{name}") for name, kind in (
        ("dataset", dsl.Dataset), ("augmented", dsl.Dataset), ("model", dsl.Model), ("metrics", dsl.Metrics),
        ("tensorboard", dsl.Artifact))}
    with pytest.raises(ValueError, match="^GPUDirect-TCPXO runs on A3 Mega .* not on CPU nodes$"):
        ops.train_cluster_job_op.python_func(
            **artifacts, recipe="fast", epochs=1, batch_size=0, learning_rate=0.0, checkpoint_root="",
            pipeline_root="gs://b/root", run_id="run-1", task_name="train", launcher="jobset", image="img",
            workers=1, kueue_queue="", namespace="ml", runtime=launch.RUNTIME_NAME, node_cpu="4", node_memory="16G",
            node_gpus="", task_config=dsl.TaskConfig(node_selector={}, tolerations=[], resources={}),
            gpudirect=TCPXO)
