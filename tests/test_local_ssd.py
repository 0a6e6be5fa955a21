"""Room on each node for the staged data (components/launch/local_ssd.py): the node pods of every Kubernetes
launcher carry the emptyDir with its sizeLimit, its mount at the training command's --stage-dir, and the same size
requested as ephemeral storage (the TrainJob's as Trainer makes its JobSet, tests/standins/trainer.py; all valid
against the CRDs and the Kubernetes schema); a Vertex AI worker gets a larger SSD boot disk; the size comes from
the datasets' bytes; what is not a size is refused in one line."""

from __future__ import annotations

import math
import os

import pytest
import yaml

from components import launch
from components.gcp.accelerators import ACCELERATORS
from components.launch import local_ssd
from components.launch.network import RDMA, TCPXO
from components.launch.training import LaunchSettings, staged_input
from components.train import staging
from components.train.settings import TrainSettings
from tests.standins.validation import crd_problems, job_problems
from tests.test_gpudirect import by_name, gpudirect_job, node_pods

COMMAND = ["python", "-m", "components.train", "--dataset-dir", "gs://b/data", "--model-dir", "gs://b/model",
           "--stage-dir", local_ssd.MOUNT_PATH]
STAGED = {"name": "staged-data", "emptyDir": {"sizeLimit": "12Gi"}}
MOUNT = {"name": "staged-data", "mountPath": "/mnt/staged-data"}


def staged_job(framework: str = "tensorflow", size: str = "12Gi", workers: int = 1) -> launch.TrainingJob:
    placement = launch.gpu_placement("nvidia-l4", 1, known_accelerators=launch.VERTEX_MACHINES)
    return launch.TrainingJob(name="train-ssd", image="registry.example/train@sha256:abc", workers=workers,
                              command=launch.frameworks.setup(framework).node_command(COMMAND),
                              placement=placement, framework=framework, local_ssd=size)


def assert_staged(pod_spec: dict, container: dict, size: str = "12Gi") -> None:
    assert by_name(pod_spec["volumes"])["staged-data"] == {**STAGED, "emptyDir": {"sizeLimit": size}}
    assert by_name(container["volumeMounts"])["staged-data"] == MOUNT
    assert container["resources"]["requests"]["ephemeral-storage"] == size


@pytest.mark.parametrize("launcher", ["trainjob", "jobset"])
@pytest.mark.parametrize("framework", ["tensorflow", "torch", "jax"])
def test_each_node_pod_gets_the_empty_dir_its_mount_and_the_ephemeral_storage_request(launcher, framework):
    pod = node_pods(launcher, staged_job(framework))
    (node,) = pod["spec"]["containers"]
    assert_staged(pod["spec"], node)
    assert "--stage-dir /mnt/staged-data" in " ".join(node["command"])


def test_without_staging_the_pods_have_no_volume_and_no_ephemeral_request():
    pod = node_pods("jobset", staged_job(size=""))
    (node,) = pod["spec"]["containers"]
    assert "volumes" not in pod["spec"] and "volumeMounts" not in node
    assert "ephemeral-storage" not in node["resources"]["requests"]


@pytest.mark.parametrize("launcher", ["trainjob", "jobset"])
@pytest.mark.parametrize("net", [RDMA, TCPXO])
def test_staging_goes_beside_a_gpudirect_networks_volumes(launcher, net):
    import dataclasses

    job = dataclasses.replace(gpudirect_job(net), local_ssd="40Gi")
    pod = node_pods(launcher, job)
    (node,) = pod["spec"]["containers"]
    assert_staged(pod["spec"], node, "40Gi")
    assert "shared-memory" in by_name(pod["spec"]["volumes"]) and "shared-memory" in by_name(node["volumeMounts"])


@pytest.mark.parametrize("launcher, framework, replicas", [("tfjob", "tensorflow", "tfReplicaSpecs"),
                                                           ("pytorchjob", "torch", "pytorchReplicaSpecs")])
def test_operator_jobs_carry_it_on_every_replica(launcher, framework, replicas):
    (manifest,) = launch.job_manifests(launcher, staged_job(framework, workers=2), "ml")
    if manifest["kind"] == "PyTorchJob":
        assert crd_problems(manifest) == []
    specs = manifest["spec"][replicas]
    assert len(specs) == 2
    for spec in specs.values():
        assert job_problems({"spec": {"template": spec["template"]}}) == []
        (container,) = spec["template"]["spec"]["containers"]
        assert_staged(spec["template"]["spec"], container)


def test_a_vertex_worker_gets_a_boot_disk_with_room_for_the_staged_data():
    job = launch.custom_job(staged_job(workers=2), vertex_accelerators=ACCELERATORS, spot=False)
    pools = job.job_spec.worker_pool_specs
    assert len(pools) == 2
    for pool in pools:  # 100 GB (DiskSpec's default) and 12 GiB in GB, rounded up
        assert (pool.disk_spec.boot_disk_type, pool.disk_spec.boot_disk_size_gb) == ("pd-ssd", 100 + 13)
    plain = launch.custom_job(staged_job(size=""), vertex_accelerators=ACCELERATORS, spot=False)
    assert not plain.job_spec.worker_pool_specs[0].disk_spec.boot_disk_size_gb


@pytest.mark.parametrize("size", ["12GB", "12", "0Gi", "1.5Gi", "-1Gi"])
def test_what_is_not_a_size_is_refused_in_one_line(size):
    with pytest.raises(ValueError, match=r"^the local-SSD size must be a Kubernetes quantity such as 20Gi") as e:
        staged_job(size=size)
    assert "\n" not in str(e.value)


def test_the_launcher_sizes_the_room_from_the_datasets_bytes(small_dataset):
    settings = TrainSettings(small_dataset, "gs://b/model")
    shards = [os.path.join(small_dataset, split, name) for split in ("train", "validation", "test")
              if os.path.isdir(os.path.join(small_dataset, split))
              for name in os.listdir(os.path.join(small_dataset, split))]
    data_bytes = sum(os.path.getsize(p) for p in shards)
    assert staging.dataset_bytes(small_dataset) == data_bytes
    for launcher, stage_dir in (("jobset", "/mnt/staged-data"), ("vertex-job", "/tmp/staged-data")):
        launch_settings = LaunchSettings(launcher=launcher, image="i", stage_data=True, project="p")
        staged, size = staged_input(settings, launch_settings)
        assert staged.stage_dir == stage_dir and staged.dataset_dir == small_dataset
        assert size == f"{math.ceil((data_bytes * 1.05 + (1 << 30)) / (1 << 30))}Gi"
        assert staged.command()[-2:] == ["--stage-dir", stage_dir]
    assert staged_input(settings, LaunchSettings(launcher="jobset", image="i")) == (settings, "")


def test_the_cli_dry_run_shows_the_empty_dir_and_the_request(capsys):
    assert launch.main(["--dry-run", "--launcher", "jobset", "--name", "t-1", "--image", "img", "--gpus", "1",
                        "--accelerator", "nvidia-l4", "--local-ssd", "12Gi", "--", *COMMAND]) == 0
    (jobset,) = yaml.safe_load_all(capsys.readouterr().out)
    pod = jobset["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    assert_staged(pod, pod["containers"][0])
    assert launch.main(["--dry-run", "--name", "t-1", "--image", "img", "--local-ssd", "12G", "--", *COMMAND]) == 2
    assert capsys.readouterr().err.strip().startswith("error: the local-SSD size must be")


# ---------------------------------------------------------------------------------------------- in the pipeline


@pytest.mark.parametrize("launcher, task", [("trainjob", "train-cluster-job-op"), ("jobset", "train-cluster-job-op"),
                                            ("tfjob", "train-cluster-job-op"), ("vertex-job", "train-job-op")])
def test_train_stage_data_reaches_the_launchers_and_the_placement_check(tmp_path, launcher, task):
    from tests.test_gpudirect import compiled

    _, spec = compiled(tmp_path, launcher)
    assert spec["root"]["inputDefinitions"]["parameters"]["train_stage_data"]["defaultValue"] is False
    tasks = spec["root"]["dag"]["tasks"]
    assert tasks[task]["inputs"]["parameters"]["stage_data"] == {"componentInputParameter": "train_stage_data"}
    assert tasks["placement-op"]["inputs"]["parameters"]["stage_data"] == {
        "componentInputParameter": "train_stage_data"}


REFUSAL = ("train_stage_data: a pipeline step's own training pod gets no room sized from the data (an emptyDir's "
           "size is fixed when compiling, and KFP requests no ephemeral storage); use --train-launcher trainjob, "
           "jobset, tfjob, pytorchjob, vertex-job, or the GCS FUSE file cache (--gcs-fuse-cache)")


def test_staging_in_the_pipelines_own_pod_is_refused_in_one_line_by_pipectl_and_the_placement_step():
    from components import ops
    from pipelines import parameters

    values = {"train_stage_data": True}
    with pytest.raises(ValueError) as refused:
        parameters.validate_parameters(dict(values), launcher="pod")
    assert str(refused.value) == f"Invalid pipeline parameters:\n  {REFUSAL}"
    assert parameters.validate_parameters(dict(values), launcher="jobset") == values
    # An uploaded pipeline's launcher is unknown to pipectl: its placement step refuses the same.
    assert parameters.validate_parameters(dict(values)) == values
    with pytest.raises(ValueError) as refused:
        ops.placement_op.python_func(accelerator="nvidia-l4", gpus=1, spot=False, node_pool="",
                                     known_accelerators=ACCELERATORS, created_by="pod", stage_data=True)
    assert str(refused.value) == REFUSAL
    placed = ops.placement_op.python_func(accelerator="nvidia-l4", gpus=1, spot=False, node_pool="",
                                          known_accelerators=ACCELERATORS, created_by="jobset", stage_data=True)
    assert placed.gpu_limit == "1"


@pytest.mark.parametrize("launcher, room", [("jobset", "emptyDir staged-data with a sizeLimit"),
                                            ("vertex-job", "a 100 GB pd-ssd boot disk plus the datasets' size")])
def test_explain_says_where_each_node_stages_and_how_its_room_is_sized(tmp_path, launcher, room):
    from pipelines.backend import explain
    from tests.test_gpudirect import compiled

    path, _ = compiled(tmp_path, launcher)
    task = "train-job-op" if launcher == "vertex-job" else "train-cluster-job-op"
    parameters = {"project": "p", "location": "us-central1"} if launcher == "vertex-job" else {}
    steps = {step["task"]: step for step in explain.explain(path, {**parameters, "train_stage_data": True})["steps"]}
    nodes = steps[task]["nodes"]
    assert nodes and all(node["staged"]["room"].startswith(room) for node in nodes)
    assert {node["staged"]["stage_dir"] for node in nodes} == {local_ssd.stage_dir(launcher)}
    plain = {step["task"]: step for step in explain.explain(path, parameters)["steps"]}
    assert all("staged" not in node for node in plain[task]["nodes"])
