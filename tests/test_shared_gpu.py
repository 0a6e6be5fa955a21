"""Shared GPUs on GKE (components/launch/placement.py SharedGpu): MIG partitions and time-sharing for training (per
run) and batch prediction (compiled), MPS through the JobSet launcher. What is checked: the one-line refusals
before anything runs (one GPU, one node, no multi-node launcher, MIG only where GKE offers it and only its sizes,
MPS only where the pod can set hostIPC), the node selectors in the compiled pipeline and in the pods the driver model
resolves (`pipectl compile --explain`), the JobSet node pod's hostIPC, each framework's memory setting, and the
training command that tells a node of its share.

Upstream facts (GoogleCloudPlatform/container-engine-accelerators at 992db81257553607f1477945f1b3219632991829):
the partition sizes per accelerator (pkg/gpu/nvidia/mig/mig.go:36-69), the strategies' names and the admission
refusal of more than one time-shared GPU (pkg/gpu/nvidia/gpusharing/gpusharing.go:25-29, 40-50).
"""

from __future__ import annotations

import pytest
import yaml

from components import launch, ops
from components.gcp.accelerators import MIG_PROFILES
from components.launch.placement import SharedGpu
from components.train import TrainSettings, frameworks
from pipelines import cli, config, training
from pipelines.backend import explain

KNOWN = config.ACCELERATORS
PARTITION = "cloud.google.com/gke-gpu-partition-size"
SHARING = "cloud.google.com/gke-gpu-sharing-strategy"
CLIENTS = "cloud.google.com/gke-max-shared-clients-per-gpu"


# ---------------------------------------------------------------------------------------------- the checks


def test_mig_is_offered_on_the_accelerators_gke_partitions():
    assert MIG_PROFILES == {
        "nvidia-tesla-a100": ("1g.5gb", "2g.10gb", "3g.20gb", "7g.40gb"),
        "nvidia-a100-80gb": ("1g.10gb", "2g.20gb", "3g.40gb", "7g.80gb"),
        "nvidia-h100-80gb": ("1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb", "7g.80gb"),
        "nvidia-h200-141gb": ("1g.18gb", "1g.35gb", "2g.35gb", "3g.71gb", "4g.71gb", "7g.141gb"),
        "nvidia-b200": ("1g.23gb", "1g.45gb", "2g.45gb", "3g.90gb", "4g.90gb", "7g.180gb")}


def test_a_mig_slice_and_a_time_shared_gpu_select_their_node_pools():
    mig = launch.gpu_placement("nvidia-a100-80gb", 1, known_accelerators=KNOWN, shared=SharedGpu("1g.10gb"))
    assert mig.node_selector == {"cloud.google.com/gke-accelerator": "nvidia-a100-80gb", PARTITION: "1g.10gb"}
    assert (mig.gpu_limit, mig.shared_gpu) == ("1", "mig 1g.10gb")
    shared = launch.gpu_placement("nvidia-l4", 1, known_accelerators=KNOWN, spot=True,
                                  shared=SharedGpu(sharing="time-sharing", max_shared_clients=4))
    assert shared.node_selector == {"cloud.google.com/gke-accelerator": "nvidia-l4", SHARING: "time-sharing",
                                    CLIENTS: "4", "cloud.google.com/gke-spot": "true"}
    assert shared.shared_gpu == "time-sharing 4"
    assert SharedGpu.from_node_selector(shared.node_selector) == SharedGpu("", "time-sharing", 4)
    whole = launch.gpu_placement("nvidia-l4", 2, known_accelerators=KNOWN)
    assert whole.shared_gpu == "" and PARTITION not in whole.node_selector and SHARING not in whole.node_selector


REFUSALS = [
    (dict(accelerator="nvidia-l4", gpus=2, shared=SharedGpu(sharing="time-sharing", max_shared_clients=4)),
     "training on a shared GPU (time-sharing 4) asks for exactly one nvidia.com/gpu, which is one slice or share "
     "(GKE's device plugin refuses more at admission); got a GPU count of 2"),
    (dict(accelerator="nvidia-a100-80gb", gpus=1, shared=SharedGpu("1g.10gb"), workers=1, launcher="trainjob"),
     "training on a shared GPU (mig 1g.10gb) runs on a single node: a MIG slice has no peer-to-peer and a shared GPU "
     "no bandwidth of its own for collectives; got 1 worker(s) besides the chief"),
    (dict(accelerator="nvidia-l4", gpus=1, shared=SharedGpu("1g.10gb")),
     "training on a shared GPU (mig 1g.10gb): nvidia-l4 has no MIG partitions on GKE; MIG runs on "
     "nvidia-tesla-a100, nvidia-a100-80gb, nvidia-h100-80gb, nvidia-h200-141gb, nvidia-b200"),
    (dict(accelerator="nvidia-tesla-a100", gpus=1, shared=SharedGpu("1g.10gb")),
     "training on a shared GPU (mig 1g.10gb): '1g.10gb' is not a MIG partition size of nvidia-tesla-a100; GKE offers "
     "1g.5gb, 2g.10gb, 3g.20gb, 7g.40gb"),
    (dict(accelerator="nvidia-h100-80gb", gpus=1, shared=SharedGpu("1g.10gb", "time-sharing", 2)),
     "training: choose a MIG partition size (1g.10gb) or a GPU sharing strategy (time-sharing), not both"),
    (dict(accelerator="nvidia-l4", gpus=1, shared=SharedGpu(sharing="mps", max_shared_clients=2)),
     "training on a shared GPU (mps 2): an MPS pod needs hostIPC, which kfp-kubernetes cannot set on a pipeline's own "
     "pod; use --train-launcher jobset, or time-sharing"),
    (dict(accelerator="nvidia-l4", gpus=1, shared=SharedGpu(sharing="mps", max_shared_clients=2), workers=0,
          launcher="trainjob"),
     "training on a shared GPU (mps 2): an MPS pod needs hostIPC, which the trainjob launcher's pods do not carry; "
     "use --train-launcher jobset, or time-sharing"),
    (dict(accelerator="nvidia-l4", gpus=1, shared=SharedGpu(sharing="time-sharing", max_shared_clients=1)),
     "training on a shared GPU (time-sharing 1): max shared clients per GPU must be the node pool's, from 2 to 48; "
     "got 1"),
    (dict(accelerator="nvidia-l4", gpus=1, shared=SharedGpu(sharing="round-robin", max_shared_clients=2)),
     "training: GPU sharing strategy must be one of time-sharing, mps, got 'round-robin'"),
    (dict(accelerator="nvidia-l4", gpus=1, shared=SharedGpu(max_shared_clients=4)),
     "training: max shared clients per GPU (4) goes with a GPU sharing strategy (time-sharing or mps)"),
    (dict(accelerator="nvidia-l4", gpus=1, shared=SharedGpu(sharing="time-sharing", max_shared_clients=2),
          launcher="vertex-job"),
     "training on a shared GPU (time-sharing 2): Vertex AI machines have whole GPUs; GKE's MIG partitions and GPU "
     "sharing need a KFP backend on GKE (--target kfp)"),
]


@pytest.mark.parametrize("given, message", REFUSALS)
def test_each_refusal_is_one_line_before_anything_runs(given, message):
    accelerator, gpus = given.pop("accelerator"), given.pop("gpus")
    with pytest.raises(ValueError) as error:
        launch.gpu_placement(accelerator, gpus, known_accelerators=KNOWN, **given)
    assert str(error.value) == message and "\n" not in message


def test_the_placement_step_refuses_what_pipectl_refuses():
    result = ops.placement_op.python_func(accelerator="nvidia-h100-80gb", gpus=1, spot=False, node_pool="",
                                          known_accelerators=KNOWN, gpu_partition="1g.20gb")
    assert result.node_selector[PARTITION] == "1g.20gb" and result.shared_gpu == "mig 1g.20gb"
    with pytest.raises(ValueError, match="runs on a single node"):
        ops.placement_op.python_func(accelerator="nvidia-l4", gpus=1, spot=False, node_pool="",
                                     known_accelerators=KNOWN, gpu_sharing="time-sharing", max_shared_clients=2,
                                     other_nodes=2, created_by="jobset")
    with pytest.raises(ValueError, match="single node"):
        cli.validate_parameters({"train_gpu_sharing": "time-sharing", "train_max_shared_clients": 2,
                                 "train_accelerator_type": "nvidia-l4", "train_workers": 1}, launcher="jobset")
    # The training pod trains on one node whatever train_workers says; an uploaded pipeline's launcher is unknown
    # to pipectl, and its placement step checks it.
    given = {"train_gpu_sharing": "time-sharing", "train_max_shared_clients": 2, "train_accelerator_type": "nvidia-l4"}
    assert cli.validate_parameters(dict(given), launcher="pod") == given
    assert cli.validate_parameters(dict(given, train_gpu_sharing="mps")) == dict(given, train_gpu_sharing="mps")
    with pytest.raises(ValueError, match="Vertex AI machines have whole GPUs"):
        cli.validate_parameters(dict(given), launcher="vertex")


def test_batch_prediction_checks_its_share_when_compiling():
    with pytest.raises(ValueError, match=r"^batch prediction on a shared GPU \(mps 2\): an MPS pod needs hostIPC, "
                                         r"which kfp-kubernetes cannot set on a pipeline's own pod; use time-sharing$"):
        config.PipelineSettings(predict_accelerator="nvidia-l4", predict_gpu_sharing="mps",
                                predict_max_shared_clients=2)
    with pytest.raises(ValueError, match="asks for exactly one nvidia.com/gpu"):
        config.PipelineSettings(predict_accelerator="nvidia-h100-80gb", predict_gpus=2,
                                predict_gpu_partition="1g.10gb")
    with pytest.raises(ValueError, match="Vertex AI machines have whole GPUs"):
        config.PipelineSettings(target="vertex", predict_gpu_partition="1g.10gb")


# ---------------------------------------------------------------------------------------------- compiled pipeline


def compiled(tmp_path, settings) -> tuple[str, dict, dict]:
    path = training.compile_pipeline(str(tmp_path / "pipeline.yaml"), settings)
    with open(path) as f:
        spec, platform = list(yaml.safe_load_all(f))
    return path, spec, platform["platforms"]["kubernetes"]["deploymentSpec"]["executors"]


def pods(path: str, parameters: dict) -> dict:
    return {step["task"]: step for step in explain.explain(path, parameters)["steps"]}


def test_a_mig_predict_step_and_a_time_shared_training_step_resolve_to_their_pods(tmp_path):
    settings = config.PipelineSettings(predict_accelerator="nvidia-a100-80gb", predict_gpu_partition="1g.10gb")
    path, spec, executors = compiled(tmp_path, settings)
    assert executors["exec-predict-op"]["nodeSelector"] == {"labels": {
        "cloud.google.com/gke-accelerator": "nvidia-a100-80gb", PARTITION: "1g.10gb"}}
    # A MIG slice has memory of its own: the frameworks keep their usual allocation there.
    assert "env" not in spec["deploymentSpec"]["executors"]["exec-predict-op"]["container"]
    placement_inputs = spec["root"]["dag"]["tasks"]["placement-op"]["inputs"]["parameters"]
    assert placement_inputs["gpu_sharing"] == {"componentInputParameter": "train_gpu_sharing"}
    assert placement_inputs["other_nodes"]["runtimeValue"]["constant"] == 0  # the training pod: one node
    assert spec["root"]["dag"]["tasks"]["train-op"]["inputs"]["parameters"]["shared_gpu"] == {
        "taskOutputParameter": {"outputParameterKey": "shared_gpu", "producerTask": "placement-op"}}

    resolved = pods(path, {"train_accelerator_type": "nvidia-l4", "train_gpu_sharing": "time-sharing",
                           "train_max_shared_clients": 4})
    train, predict = resolved["train-op"], resolved["predict-op"]
    assert train["resources"]["limits"] == {"nvidia.com/gpu": "1"}
    assert train["node_selector"] == {"cloud.google.com/gke-accelerator": "nvidia-l4", SHARING: "time-sharing",
                                      CLIENTS: "4"}
    assert predict["resources"]["limits"] == {"nvidia.com/gpu": "1"}
    assert predict["node_selector"] == {"cloud.google.com/gke-accelerator": "nvidia-a100-80gb", PARTITION: "1g.10gb"}
    with pytest.raises(ValueError, match="asks for exactly one nvidia.com/gpu"):
        pods(path, {"train_accelerator_type": "nvidia-l4", "train_gpu_count": 2, "train_gpu_sharing": "time-sharing",
                    "train_max_shared_clients": 4})


def test_a_time_shared_predict_step_gets_every_frameworks_memory_setting(tmp_path):
    settings = config.PipelineSettings(predict_accelerator="nvidia-l4", predict_gpu_sharing="time-sharing",
                                       predict_max_shared_clients=3)
    _, spec, executors = compiled(tmp_path, settings)
    assert executors["exec-predict-op"]["nodeSelector"]["labels"][CLIENTS] == "3"
    env = {e["name"]: e["value"] for e in spec["deploymentSpec"]["executors"]["exec-predict-op"]["container"]["env"]}
    assert env == {"TF_FORCE_GPU_ALLOW_GROWTH": "true", "XLA_PYTHON_CLIENT_PREALLOCATE": "false",
                   "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}


def test_mps_training_runs_as_a_jobset_whose_node_pod_sets_host_ipc(tmp_path):
    path, _, _ = compiled(tmp_path, config.PipelineSettings(train_launcher="jobset"))
    step = pods(path, {"train_accelerator_type": "nvidia-l4", "train_gpu_sharing": "mps",
                       "train_max_shared_clients": 2, "train_workers": 0})["train-cluster-job-op"]
    [node] = step["nodes"]
    assert node["hostIPC"] is True and node["replicas"] == 1
    assert node["resources"]["limits"] == {"nvidia.com/gpu": "1"}
    assert node["nodeSelector"][SHARING] == "mps" and node["nodeSelector"][CLIENTS] == "2"
    with pytest.raises(ValueError, match="runs on a single node"):
        pods(path, {"train_accelerator_type": "nvidia-l4", "train_gpu_sharing": "mps", "train_max_shared_clients": 2,
                    "train_workers": 1})


def test_a_node_on_a_shared_gpu_is_told_so_and_launchers_refuse_what_it_cannot_carry():
    task_config = {"node_selector": {"cloud.google.com/gke-accelerator": "nvidia-l4", SHARING: "mps", CLIENTS: "2"},
                   "tolerations": [], "resources": {}}
    settings = TrainSettings("gs://b/data", "gs://b/model", shared_gpu="mps 2")
    assert settings.to_argv()[-2:] == ["--shared-gpu", "mps 2"]
    sizes = launch.node_resources("4", "16G", "1")
    job = launch.training_job(launch.LaunchSettings("jobset", "img", workers=0, task_config=task_config,
                                                    node_resources=sizes), settings.command(),
                              run_id="run", task_name="train")
    pod = launch.jobset_manifest(job, "ml")["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    assert pod["hostIPC"] is True and pod["containers"][0]["command"][-2:] == ["--shared-gpu", "mps 2"]
    with pytest.raises(ValueError, match="the tfjob launcher's pods do not carry"):
        launch.training_job(launch.LaunchSettings("tfjob", "img", workers=0, task_config=task_config,
                                                  node_resources=sizes), settings.command(),
                            run_id="run", task_name="train")
    whole = {**task_config, "node_selector": {"cloud.google.com/gke-accelerator": "nvidia-l4"}}
    job = launch.training_job(launch.LaunchSettings("jobset", "img", workers=1, task_config=whole,
                                                    node_resources=sizes), ["python"], run_id="run", task_name="t")
    assert "hostIPC" not in launch.jobset_manifest(job, "ml")["spec"]["replicatedJobs"][0]["template"]["spec"][
        "template"]["spec"]


# ---------------------------------------------------------------------------------------------- the frameworks


@pytest.mark.parametrize("framework, variables", [
    ("tensorflow", {"TF_FORCE_GPU_ALLOW_GROWTH": "true"}),
    ("jax", {"XLA_PYTHON_CLIENT_PREALLOCATE": "false"}),
    ("torch", {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}),
])
def test_each_framework_takes_memory_as_it_needs_it_where_the_gpu_memory_is_shared(framework, variables):
    backend = frameworks.backend_class(framework)
    for shared in ("time-sharing 4", "mps 2"):
        environ = {}
        assert backend.share_gpu_memory(shared, environ) == variables and environ == variables
    environ = {}
    assert backend.share_gpu_memory("mig 1g.10gb", environ) == {} and environ == {}  # its own memory
    assert backend.share_gpu_memory(None, environ) == {} and environ == {}
    name = next(iter(variables))
    environ = {name: "set by the pod"}
    assert backend.share_gpu_memory("time-sharing 2", environ) == {} and environ == {name: "set by the pod"}


def test_the_training_step_applies_it_before_the_framework_starts(monkeypatch):
    monkeypatch.delenv("XLA_PYTHON_CLIENT_PREALLOCATE", raising=False)
    settings = TrainSettings.from_args(build_args(["--dataset-dir", "d", "--model-dir", "m", "--framework", "jax",
                                                   "--shared-gpu", "time-sharing 4"]))
    backend = frameworks.backend_class("jax")(settings)
    import os

    assert backend.shared_gpu_env == {"XLA_PYTHON_CLIENT_PREALLOCATE": "false"}
    assert os.environ["XLA_PYTHON_CLIENT_PREALLOCATE"] == "false"


def build_args(argv):
    from components.train.cli import build_parser

    return build_parser().parse_args(argv)
