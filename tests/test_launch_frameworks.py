"""Multi-node training for each framework, each its native way: what every node runs (torchrun for torch), the
variables it gets from each platform (Trainer v2's torch and JAX policies, the JobSet's indices, the Training
Operator's PyTorchJob, Vertex AI's CLUSTER_SPEC), the shipped runtimes and manifests checked against the real CRDs,
and the launchers end to end against the stand-ins.

The stand-ins (tests/standins/) follow the controllers' code at their release tags: Trainer v2.3.0's torch and JAX
plugins (trainer.py), the Training Operator v1.9.4's PyTorchJob env (k8s_api.py), Vertex AI's documented
CLUSTER_SPEC (vertex_jobs.py). The nodes run scripts that show what they received and meet at the coordinator's
address over TCP; then real torchrun processes (gloo) form one group across the nodes of a TrainJob, a PyTorchJob
and a Vertex AI CustomJob, and jax.distributed processes across those of a TrainJob, a JobSet and a CustomJob
(torch and JAX: `make test` installs both, and there a missing one fails: tests/conftest.py, require_framework).
"""

import json
import os
import sys
import textwrap

import pytest
import yaml

from components import launch
from components.launch.frameworks import TORCHRUN_ENV, setup
from components.launch.node import framework_env, node_of
from tests.conftest import REPO_ROOT, require_framework, vertex_client
from tests.standins.jobsets import jobset_problems
from tests.standins.k8s_api import KubernetesStandIn
from tests.standins.kueue import DEFAULT_FRAMEWORKS
from tests.standins.trainer import trainjob_jobset
from tests.standins.validation import crd_problems, job_problems
from tests.standins.vertex_jobs import VertexJobsStandIn
from tests.test_launch import KNOWN, job, script

TRAIN = ["python", "-m", "components.train", "--dataset-dir", "gs://b/d", "--model-dir", "gs://b/m"]


def framework_job(framework: str, nodes: int = 2, command=None, **kwargs) -> launch.TrainingJob:
    node_command = command or setup(framework).node_command(TRAIN)
    return job(workers=nodes - 1, command=node_command, framework=framework, labels={"pipeline-run": "run-1"},
               **kwargs)


def node_container(jobset: dict) -> dict:
    return jobset["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["containers"][0]


# ---------------------------------------------------------------------------------------------- node commands


def test_each_framework_starts_its_nodes_its_own_way():
    assert setup("tensorflow").node_command(TRAIN) == TRAIN
    node = ["python", "-m", "components.launch.node"]
    assert setup("torch").node_command(TRAIN) == [*node, "--framework", "torch", "--", "-m", "components.train",
                                                  *TRAIN[3:], "--framework", "torch"]
    assert setup("jax").node_command(TRAIN) == [*node, "--framework", "jax", "--", "-m", "components.train",
                                                *TRAIN[3:], "--framework", "jax"]
    assert setup("torch").node_command([*TRAIN, "--framework", "torch"]) == setup("torch").node_command(TRAIN)
    with pytest.raises(ValueError, match="trains with --framework 'tensorflow', but the job is launched for 'torch'"):
        setup("torch").node_command([*TRAIN, "--framework", "tensorflow"])
    with pytest.raises(ValueError, match="trains with --framework 'torch', but the job is launched for 'tensorflow'"):
        setup("tensorflow").node_command([*TRAIN, "--framework", "torch"])
    assert setup("tensorflow").node_command([*TRAIN, "--framework", "tensorflow"]) == [*TRAIN, "--framework",
                                                                                       "tensorflow"]
    with pytest.raises(ValueError, match="runs the training step"):
        setup("jax").node_command(["python", "train.py"])
    with pytest.raises(ValueError, match="framework must be one of tensorflow, torch, jax"):
        setup("mxnet")


def test_launch_settings_pair_launchers_with_frameworks():
    settings = launch.LaunchSettings("trainjob", "img", framework="torch")
    node = launch.training_job(settings, TRAIN, run_id="run-1", task_name="train")
    assert node.command[2:6] == ["components.launch.node", "--framework", "torch", "--"]
    assert node.framework == "torch"
    with pytest.raises(ValueError, match="launcher=tfjob runs tensorflow only; for torch use trainjob, jobset, "
                                         "pytorchjob, vertex-job"):
        launch.LaunchSettings("tfjob", "img", framework="torch")
    with pytest.raises(ValueError, match="launcher=pytorchjob runs torch only; for jax use trainjob, jobset, "
                                         "vertex-job"):
        launch.LaunchSettings("pytorchjob", "img", framework="jax")
    with pytest.raises(ValueError, match="a TFJob trains with TensorFlow, not torch"):
        launch.tfjob_manifest(framework_job("torch"), "ml")
    # A shipped runtime's name stands for the framework's shipped runtime; another name is the user's own.
    assert launch.trainjob.runtime_for("torch") == "torch-multinode"
    assert launch.trainjob.runtime_for("jax", "tensorflow-multiworker") == "jax-multinode"
    assert launch.trainjob.runtime_for("torch", "team-torch") == "team-torch"


# ---------------------------------------------------------------------------------------------- Trainer v2


@pytest.mark.parametrize("framework", ["torch", "jax"])
def test_the_shipped_framework_runtimes_are_what_the_code_builds(framework, capsys):
    assert launch.main(["--runtime-manifest", "--framework", framework]) == 0
    with open(os.path.join(REPO_ROOT, "manifests", "trainer", f"{framework}-multinode.yaml")) as f:
        assert f.read() == capsys.readouterr().out, (
            f"regenerate: python -m components.launch --runtime-manifest --framework {framework} > "
            f"manifests/trainer/{framework}-multinode.yaml")
    runtime = launch.runtime_manifest(framework=framework)
    assert crd_problems(runtime) == []
    assert runtime["spec"]["mlPolicy"] == {"numNodes": 1, framework: {}}  # as upstream's {framework}-distributed
    assert launch.trainjob.runtime_problems(runtime, framework) == ([], [])
    errors, _ = launch.trainjob.runtime_problems(runtime, "tensorflow")
    assert errors == [f"it has a {framework} policy (a plain runtime has none)"]
    errors, _ = launch.trainjob.runtime_problems(launch.runtime_manifest(), framework)
    assert errors == [f"it has no framework policy (a {framework} runtime has mlPolicy.{framework})"]


def test_a_torch_trainjob_gets_torchruns_variables_from_trainers_torch_policy():
    """What Trainer v2.3.0 makes of a torch TrainJob: the node container runs torchrun with the PET_* of the torch
    plugin; its JobSet passes the JobSet CRD and webhook, its Job the Kubernetes schema."""
    manifest = launch.trainjob_manifest(framework_job("torch", 3), "ml", runtime="torch-multinode")
    assert crd_problems(manifest) == []
    trainer = manifest["spec"]["trainer"]
    assert trainer["command"] == setup("torch").node_command(TRAIN)
    assert trainer["numProcPerNode"] == 2  # one process per GPU (2 L4s per node)
    assert not any(var["name"] in TORCHRUN_ENV or var["name"].startswith("TRAINING_NODE")
                   for var in trainer.get("env", []))
    jobset, problems = trainjob_jobset(manifest, launch.runtime_manifest(framework="torch"))
    assert problems == []
    assert jobset_problems({**jobset, "metadata": {**jobset["metadata"], "namespace": "ml"}}) == []
    assert job_problems(jobset["spec"]["replicatedJobs"][0]["template"]) == []
    container = node_container(jobset)
    env = {var["name"]: var for var in container["env"]}
    assert {name: env[name].get("value") for name in TORCHRUN_ENV} == {
        "PET_NNODES": "3", "PET_NPROC_PER_NODE": "2", "PET_NODE_RANK": None,
        "PET_MASTER_ADDR": "train-1-node-0-0.train-1", "PET_MASTER_PORT": "29500"}
    assert env["PET_NODE_RANK"]["valueFrom"] == {"fieldRef": {
        "fieldPath": "metadata.annotations['batch.kubernetes.io/job-completion-index']"}}
    assert {"containerPort": 29500} in container["ports"]
    # The JobSet launcher gives its pods the very same variables, as the plugin would.
    direct = node_container(launch.jobset_manifest(framework_job("torch", 3), "ml"))
    assert [var for var in direct["env"] if var["name"] in TORCHRUN_ENV] == \
        [var for var in container["env"] if var["name"] in TORCHRUN_ENV]
    assert jobset_problems(launch.jobset_manifest(framework_job("torch", 3), "ml")) == []


def test_why_a_torch_trainjob_sets_its_processes_and_no_pet_variables():
    """Trainer's torch plugin starts one process per CPU on a CPU node when numProcPerNode is left out ("auto",
    torch.go:131-135), and its webhook refuses a TrainJob that sets torchrun's variables itself (torch.go:65-77)."""
    cpu_job = launch.TrainingJob(name="train-1", image="img", command=setup("torch").node_command(TRAIN), workers=1,
                                 framework="torch", cpu="4")
    manifest = launch.trainjob_manifest(cpu_job, "ml", runtime="torch-multinode")
    assert manifest["spec"]["trainer"]["numProcPerNode"] == 1
    runtime = launch.runtime_manifest(framework="torch")
    auto = json.loads(json.dumps(manifest))
    del auto["spec"]["trainer"]["numProcPerNode"]
    env = {v["name"]: v.get("value") for v in node_container(trainjob_jobset(auto, runtime)[0])["env"]}
    assert env["PET_NPROC_PER_NODE"] == "4"
    manifest["spec"]["trainer"]["env"] = [{"name": "PET_NNODES", "value": "2"}]
    _, problems = trainjob_jobset(manifest, runtime)
    assert problems == ["spec.trainer.env: Invalid value: must not have reserved envs, invalid envs configured: "
                        "[PET_NNODES]"]


@pytest.mark.parametrize("resources, procs", [
    ({"requests": {"cpu": "4", "nvidia.com/gpu": 2}}, "auto"),  # a GPU request alone (no limit) counts
    ({"limits": {"cpu": "4", "amd.com/gpu": 1}}, "auto"),  # any resource name containing "gpu"
    ({"requests": {"cpu": "4", "nvidia.com/gpu": 0}, "limits": {"nvidia.com/gpu": 2}}, "auto"),  # limits, else
    ({"requests": {"cpu": "3500m"}, "limits": {"cpu": "8", "google.com/tpu": 4}}, "4"),  # no GPU: the CPU request
    ({"limits": {"cpu": "2"}}, "2"),  # no request: the CPU limit
])
def test_trainers_torch_plugin_counts_gpus_from_requests_then_limits(resources, procs):
    """With numProcPerNode left out ("auto"), Trainer v2.3.0's torch plugin keeps "auto" (torchrun's: one process
    per GPU) where GetNumGPUPerNode (pkg/runtime/runtime.go:279-298) finds a GPU: in the requests, else in the
    limits, under any resource name containing "gpu"; otherwise one process per CPU."""
    job = launch.TrainingJob(name="train-1", image="img", command=setup("torch").node_command(TRAIN), workers=1,
                             framework="torch", cpu="4")
    manifest = launch.trainjob_manifest(job, "ml", runtime="torch-multinode")
    del manifest["spec"]["trainer"]["numProcPerNode"]
    manifest["spec"]["trainer"]["resourcesPerNode"] = resources
    assert crd_problems(manifest) == []
    jobset, problems = trainjob_jobset(manifest, launch.runtime_manifest(framework="torch"))
    assert problems == []
    env = {v["name"]: v.get("value") for v in node_container(jobset)["env"]}
    assert env["PET_NPROC_PER_NODE"] == procs


def test_a_jax_trainjob_and_jobset_get_jax_distributeds_variables():
    manifest = launch.trainjob_manifest(framework_job("jax", 2), "ml", runtime="jax-multinode")
    assert crd_problems(manifest) == [] and "numProcPerNode" not in manifest["spec"]["trainer"]
    assert manifest["spec"]["trainer"]["command"] == setup("jax").node_command(TRAIN)
    jobset, problems = trainjob_jobset(manifest, launch.runtime_manifest(framework="jax"))
    assert problems == []
    names = ("JAX_NUM_PROCESSES", "JAX_PROCESS_ID", "JAX_COORDINATOR_ADDRESS")
    plugin = [var for var in node_container(jobset)["env"] if var["name"] in names]
    assert {var["name"]: var.get("value") for var in plugin} == {
        "JAX_NUM_PROCESSES": "2", "JAX_PROCESS_ID": None, "JAX_COORDINATOR_ADDRESS": "train-1-node-0-0.train-1:29500"}
    direct = launch.jobset_manifest(framework_job("jax", 2), "ml")
    assert jobset_problems(direct) == []
    assert [var for var in node_container(direct)["env"] if var["name"] in names] == plugin


def test_dry_run_prints_the_framework_manifests(capsys):
    argv = ["--dry-run", "--name", "train-1", "--namespace", "ml", "--image", "registry.example/torch@sha256:abc",
            "--workers", "1", "--accelerator", "nvidia-l4", "--gpus", "2", "--framework", "torch", "--", *TRAIN]
    assert launch.main(argv) == 0
    printed = list(yaml.safe_load_all(capsys.readouterr().out))
    assert [m["kind"] for m in printed] == ["ClusterTrainingRuntime", "TrainJob"]
    assert printed[0] == launch.runtime_manifest(framework="torch")
    assert printed[1]["spec"]["runtimeRef"]["name"] == "torch-multinode"
    assert printed[1]["spec"]["trainer"]["command"] == setup("torch").node_command(TRAIN)
    assert launch.main([*argv[:1], "--launcher", "pytorchjob", *argv[1:]]) == 0
    (pytorchjob,) = yaml.safe_load_all(capsys.readouterr().out)
    assert pytorchjob["kind"] == "PyTorchJob" and crd_problems(pytorchjob) == []
    assert launch.main([*argv[:1], "--launcher", "tfjob", *argv[1:]]) == 2
    assert "a TFJob trains with TensorFlow, not torch" in capsys.readouterr().err


# ---------------------------------------------------------------------------------------------- against the API


SHOW_TORCH = """
    import json, os, socket, time
    names = ("PET_NNODES", "PET_NPROC_PER_NODE", "PET_NODE_RANK", "PET_MASTER_ADDR", "PET_MASTER_PORT")
    env = {name: os.environ.get(name) for name in names}
    rank, address = int(env["PET_NODE_RANK"]), (env["PET_MASTER_ADDR"], int(env["PET_MASTER_PORT"]))
    if rank == 0:  # node 0 listens where torchrun's store would, and hears every other node there
        server = socket.create_server(address)
        heard = sorted(server.accept()[0].recv(16).decode() for _ in range(int(env["PET_NNODES"]) - 1))
        print("node 0 heard", heard, flush=True)
    else:
        for _ in range(200):
            try:
                socket.create_connection(address).sendall(str(rank).encode())
                break
            except OSError:
                time.sleep(0.05)
    print(json.dumps(env), flush=True)
"""


@pytest.fixture
def k8s():
    with KubernetesStandIn() as api:
        for framework in ("torch", "jax"):
            api.add_runtime(launch.runtime_manifest(framework=framework))
        yield api


def test_a_torch_trainjobs_nodes_meet_at_node_zero(k8s):
    lines = []
    launcher = launch.TrainJobLauncher(launch.kubernetes_client(k8s.url), "ml", poll_seconds=0.05,
                                       echo=lines.append)
    outcome = launcher.run(launch.trainjob_manifest(framework_job("torch", 3, command=script(SHOW_TORCH)), "ml",
                                                    runtime="torch-multinode"))
    assert outcome.state == "Complete"
    assert lines[0].endswith("node 0 heard ['1', '2']")
    by_rank = {}
    for pod in k8s.jobset_pods("ml"):
        seen = json.loads(pod.lines[-1][1])
        by_rank[seen["PET_NODE_RANK"]] = seen
        assert (seen["PET_NNODES"], seen["PET_NPROC_PER_NODE"]) == ("3", "2")
        assert seen["PET_MASTER_ADDR"] == "127.0.0.1"  # train-1-node-0-0.train-1, on loopback
    assert sorted(by_rank) == ["0", "1", "2"]
    assert len({seen["PET_MASTER_PORT"] for seen in by_rank.values()}) == 1


def test_a_torch_runtime_is_required_for_a_torch_trainjob(k8s):
    k8s.add_runtime(launch.runtime_manifest())
    launcher = launch.TrainJobLauncher(launch.kubernetes_client(k8s.url), "ml", poll_seconds=0.05)
    with pytest.raises(launch.LaunchError, match=r"'tensorflow-multiworker' cannot run PyTorch DDP under torchrun: "
                                                 r"it has no framework policy .* Use 'torch-multinode' "
                                                 r"\(manifests/trainer/torch-multinode.yaml\)"):
        launcher.run(launch.trainjob_manifest(framework_job("torch"), "ml", runtime="tensorflow-multiworker"))
    with pytest.raises(launch.LaunchError, match=r"'team-torch' is not installed: apply it with `kubectl apply "
                                                 r"--server-side -f manifests/trainer/torch-multinode.yaml`"):
        launcher.run(launch.trainjob_manifest(framework_job("torch"), "ml", runtime="team-torch"))
    assert not k8s.requests_to("POST", "/apis/trainer.kubeflow.org/v1alpha1/namespaces/ml/trainjobs")


def test_a_jax_jobsets_nodes_find_the_coordinator(k8s):
    command = script("""
        import os, socket, time
        host, port = os.environ["JAX_COORDINATOR_ADDRESS"].rsplit(":", 1)
        if os.environ["JAX_PROCESS_ID"] == "0":
            server = socket.create_server((host, int(port)))
            print("coordinator heard", server.accept()[0].recv(16).decode(), "of", os.environ["JAX_NUM_PROCESSES"],
                  flush=True)
        else:
            for _ in range(200):
                try:
                    socket.create_connection((host, int(port))).sendall(os.environ["JAX_PROCESS_ID"].encode())
                    break
                except OSError:
                    time.sleep(0.05)
    """)
    lines = []
    outcome = launch.JobSetLauncher(launch.kubernetes_client(k8s.url), "ml", poll_seconds=0.05,
                                    echo=lines.append).run(launch.jobset_manifest(framework_job("jax", 2, command),
                                                                                 "ml"))
    assert outcome.state == "Completed" and lines[0].endswith("coordinator heard 1 of 2")


TORCH_NODE = [sys.executable, "-m", "components.launch.node", "--framework", "torch", "--"]
JAX_NODE = [sys.executable, "-m", "components.launch.node", "--framework", "jax", "--"]
ALLREDUCE = """
    import os, torch, torch.distributed as dist
    dist.init_process_group("gloo")
    total = torch.tensor([dist.get_rank() + 1.0])
    dist.all_reduce(total)
    # one write of the whole line: the node's processes share its stdout, and print's separate writes interleaved
    os.write(1, f"rank {dist.get_rank()} of {dist.get_world_size()} local {os.environ['LOCAL_RANK']} "
                f"sum {int(total.item())}\\n".encode())
    dist.destroy_process_group()
"""


def allreduce_job(tmp_path) -> launch.TrainingJob:
    """2 nodes x 2 processes (2 GPUs each: torchrun starts one process per GPU) running torchrun through the node
    module, as the training step's torch command does, on the variables the platform gives them."""
    (tmp_path / "allreduce_check.py").write_text(textwrap.dedent(ALLREDUCE))
    placement = launch.gpu_placement("nvidia-l4", 2, known_accelerators=KNOWN)
    return launch.TrainingJob(name="train-1", image="img", command=TORCH_NODE + ["-m", "allreduce_check"], workers=1,
                              framework="torch", placement=placement, env={"PYTHONPATH": str(tmp_path)})


def test_real_torchrun_processes_form_one_group_in_a_trainjob(k8s, tmp_path):
    """torchrun itself, on each node of a torch TrainJob, reads only the PET_* Trainer's torch plugin set, and its
    4 processes (gloo) all-reduce across the 2 nodes."""
    require_framework("torch")
    nodes = allreduce_job(tmp_path)
    lines = []
    outcome = launch.TrainJobLauncher(launch.kubernetes_client(k8s.url), "ml", poll_seconds=0.05,
                                      echo=lines.append).run(launch.trainjob_manifest(nodes, "ml",
                                                                                      runtime="torch-multinode"))
    assert outcome.state == "Complete", lines
    assert any(line.endswith("rank 0 of 4 local 0 sum 10") for line in lines), lines


def test_real_torchrun_processes_form_one_group_in_a_pytorchjob(tmp_path):
    """The same on a PyTorchJob's replicas, from the variables the Training Operator sets."""
    require_framework("torch")
    nodes = allreduce_job(tmp_path)
    lines = []
    with KubernetesStandIn() as k8s:
        outcome = launch.PyTorchJobLauncher(launch.kubernetes_client(k8s.url), "ml", poll_seconds=0.05,
                                            echo=lines.append).run(launch.pytorchjob_manifest(nodes, "ml"))
    assert outcome.state == "Succeeded", lines
    assert any(line.endswith("rank 0 of 4 local 0 sum 10") for line in lines), lines


def test_real_torchrun_processes_form_one_group_on_vertex_ai(tmp_path):
    """The same on a Vertex AI CustomJob's replicas, from CLUSTER_SPEC through the node module."""
    require_framework("torch")
    nodes = allreduce_job(tmp_path)
    with VertexJobsStandIn() as vertex:
        outcome = launch.VertexJobLauncher(vertex_client(vertex.url), "proj", "us-central1", poll_seconds=0.05).run(
            launch.custom_job(nodes, vertex_accelerators=KNOWN, spot=False))
        log = vertex.jobs[outcome.name].log_text()
    assert outcome.state == "JOB_STATE_SUCCEEDED", log
    assert "rank 0 of 4 local 0 sum 10" in log, log


JAX_GROUP = """
    import os, jax, jax.numpy as jnp
    from jax.experimental import multihost_utils
    jax.config.update("jax_platforms", "cpu")
    jax.distributed.initialize(os.environ["JAX_COORDINATOR_ADDRESS"], int(os.environ["JAX_NUM_PROCESSES"]),
                               int(os.environ["JAX_PROCESS_ID"]))
    ranks = multihost_utils.process_allgather(jnp.array([jax.process_index()]))
    print("process", jax.process_index(), "of", jax.process_count(), "saw", sorted(int(r) for r in ranks.ravel()),
          flush=True)
    jax.distributed.shutdown()
"""


@pytest.mark.parametrize("launcher", ["trainjob", "jobset"])
def test_real_jax_processes_form_one_group(k8s, launcher):
    """jax.distributed on each node of a JAX TrainJob (Trainer's jax plugin's variables) or JobSet (ours)."""
    require_framework("jax")
    nodes = framework_job("jax", 2, command=script(JAX_GROUP))
    lines = []
    kind = launch.TrainJobLauncher if launcher == "trainjob" else launch.JobSetLauncher
    outcome = kind(launch.kubernetes_client(k8s.url), "ml", poll_seconds=0.05, echo=lines.append).run(
        launch.job_manifests(launcher, nodes, "ml", runtime="jax-multinode")[-1])
    assert outcome.state in ("Complete", "Completed"), lines
    assert any(line.endswith("process 0 of 2 saw [0, 1]") for line in lines), lines


def test_real_jax_processes_form_one_group_on_vertex_ai():
    require_framework("jax")
    with VertexJobsStandIn() as vertex:
        outcome = launch.VertexJobLauncher(vertex_client(vertex.url), "proj", "us-central1", poll_seconds=0.05).run(
            launch.custom_job(framework_job("jax", 2, command=JAX_NODE + ["-c", textwrap.dedent(JAX_GROUP)]),
                              vertex_accelerators=KNOWN, spot=False))
        log = vertex.jobs[outcome.name].log_text()
    assert outcome.state == "JOB_STATE_SUCCEEDED", log
    assert "process 0 of 2 saw [0, 1]" in log, log


# ---------------------------------------------------------------------------------------------- PyTorchJob


def test_pytorchjob_manifest_is_valid_against_the_operators_crd():
    manifest = launch.pytorchjob_manifest(framework_job("torch", 4, kueue_queue="team-gpu"), "ml")
    assert crd_problems(manifest) == []
    assert manifest["apiVersion"] == "kubeflow.org/v1" and manifest["kind"] == "PyTorchJob"
    assert manifest["spec"]["nprocPerNode"] == "2"
    specs = manifest["spec"]["pytorchReplicaSpecs"]
    assert (specs["Master"]["replicas"], specs["Worker"]["replicas"]) == (1, 3)
    for spec in specs.values():
        assert spec["restartPolicy"] == "ExitCode"
        container = spec["template"]["spec"]["containers"][0]
        assert container["name"] == "pytorch" and container["command"] == setup("torch").node_command(TRAIN)
        assert container["ports"] == [{"name": "pytorchjob-port", "containerPort": 23456}]
        assert container["resources"]["limits"] == {"nvidia.com/gpu": "2"}
    assert manifest["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team-gpu"
    assert "Worker" not in launch.pytorchjob_manifest(framework_job("torch", 1), "ml")["spec"]["pytorchReplicaSpecs"]
    bad = json.loads(json.dumps(manifest))
    bad["spec"]["pytorchReplicaSpecs"]["Master"]["restartPolicy"] = 3
    assert crd_problems(bad) == ["spec.pytorchReplicaSpecs.Master.restartPolicy: 3 is not of type 'string'"]


def test_a_queued_pytorchjob_is_refused_where_kueue_does_not_manage_pytorchjobs():
    """As a TFJob's (tests/test_launch.py): Kueue v0.19's defaults leave kubeflow.org/pytorchjob out too; with it
    enabled, Kueue's webhook suspends the job until the queue admits it."""
    manifest = launch.pytorchjob_manifest(framework_job("torch", 1, kueue_queue="team-gpu"), "ml")
    with KubernetesStandIn(run_containers=False) as k8s:
        with pytest.raises(launch.LaunchError, match=r"^Kueue on this cluster does not manage "
                                                     r"kubeflow.org/pytorchjob \(a server-side dry run of "
                                                     r"PyTorchJob ml/train-1 came back unsuspended\)"):
            launch.PyTorchJobLauncher(launch.kubernetes_client(k8s.url), "ml").run(manifest)
        assert k8s.created_bodies == [] and k8s.pytorchjobs == {}
    enabled = DEFAULT_FRAMEWORKS | {"kubeflow.org/pytorchjob"}
    with KubernetesStandIn(run_containers=False, kueue_frameworks=enabled) as k8s:  # a queue Kueue does not know
        launch.PyTorchJobLauncher(launch.kubernetes_client(k8s.url), "ml").create(manifest)
        assert k8s.dry_runs[0]["spec"]["runPolicy"]["suspend"] is True
        assert k8s.pytorchjob("ml", "train-1").body["spec"]["runPolicy"]["suspend"] is True  # held by Kueue


def test_pytorchjob_replicas_get_the_operators_variables():
    lines = []
    with KubernetesStandIn() as k8s:
        launcher = launch.PyTorchJobLauncher(launch.kubernetes_client(k8s.url), "ml", poll_seconds=0.05,
                                             echo=lines.append)
        outcome = launcher.run(launch.pytorchjob_manifest(framework_job("torch", 3, command=script(SHOW_TORCH)),
                                                          "ml"))
        assert outcome.state == "Succeeded"
        assert lines[0] == "[train-1-master-0] node 0 heard ['1', '2']"
        job_run = k8s.pytorchjob("ml", "train-1")
        assert sorted(job_run.pods) == ["train-1-master-0", "train-1-worker-0", "train-1-worker-1"]
        declared = job_run.declared_env
        assert declared["train-1-worker-1"] == {
            "PYTHONUNBUFFERED": "1", "MASTER_PORT": "23456", "PET_MASTER_PORT": "23456",
            "MASTER_ADDR": "train-1-master-0", "PET_MASTER_ADDR": "train-1-master-0", "WORLD_SIZE": "6",
            "RANK": "2", "PET_NODE_RANK": "2", "PET_NPROC_PER_NODE": "2", "PET_NNODES": "3"}
        assert [declared[f"train-1-{pod}"]["PET_NODE_RANK"] for pod in ("master-0", "worker-0")] == ["0", "1"]
        assert k8s.requests_to("POST", "/apis/kubeflow.org/v1/namespaces/ml/pytorchjobs")


def test_pytorchjob_restarts_a_preempted_replica_and_fails_on_a_bad_one(tmp_path):
    marker = tmp_path / "preempted-once"
    command = script(f"""
        import os, sys
        if not os.path.exists({str(marker)!r}):
            open({str(marker)!r}, "w").close()
            sys.exit(143)
        print("resumed and finished")
    """)
    with KubernetesStandIn() as k8s:
        client = launch.kubernetes_client(k8s.url)
        outcome = launch.PyTorchJobLauncher(client, "ml", poll_seconds=0.05, echo=lambda _: None).run(
            launch.pytorchjob_manifest(framework_job("torch", 1, command=command), "ml"))
        assert outcome.state == "Succeeded" and outcome.restarts == 1
        assert k8s.pytorchjob("ml", "train-1").pods["train-1-master-0"].restarts == 1
        failing = script("import sys; print('error: no shards under gs://b/d', flush=True); sys.exit(2)")
        with pytest.raises(launch.LaunchError, match=r'PyTorchJob ml/train-2 ended Failed: job "train-2" is '
                                                     r'failing because "Master" replica\(s\) failed\.'
                                                     r"(.|\n)*no shards under gs://b/d"):
            launch.PyTorchJobLauncher(client, "ml", poll_seconds=0.05, echo=lambda _: None).run(
                launch.pytorchjob_manifest(framework_job("torch", 1, name="train-2", command=failing), "ml"))


def test_the_operators_webhook_refuses_a_second_master():
    with KubernetesStandIn(run_containers=False) as k8s:
        manifest = launch.pytorchjob_manifest(framework_job("torch", 2), "ml")
        manifest["spec"]["pytorchReplicaSpecs"]["Master"]["replicas"] = 2
        with pytest.raises(launch.LaunchError, match=r'admission webhook "validator.pytorchjob.training-operator.'
                                                     r'kubeflow.org" denied the request: spec.pytorchReplicaSpecs'
                                                     r"\[Master\].replicas: Forbidden: must be 1"):
            launch.PyTorchJobLauncher(launch.kubernetes_client(k8s.url), "ml").run(manifest)


# ---------------------------------------------------------------------------------------------- Vertex AI


def test_the_node_module_reads_vertex_cluster_spec():
    spec = {"cluster": {"workerpool0": ["cmle-training-workerpool0-ab-0:2222"],
                        "workerpool1": ["cmle-training-workerpool1-ab-0:2222", "cmle-training-workerpool1-ab-1:2222"]},
            "environment": "cloud", "task": {"type": "workerpool1", "index": 1, "trial": ""}}
    assert node_of(spec) == (2, 3, "cmle-training-workerpool0-ab-0", 2222)
    assert framework_env("torch", spec, 4) == {
        "PET_NNODES": "3", "PET_NPROC_PER_NODE": "4", "PET_NODE_RANK": "2",
        "PET_MASTER_ADDR": "cmle-training-workerpool0-ab-0", "PET_MASTER_PORT": "2222"}
    assert framework_env("jax", spec, 1) == {"JAX_NUM_PROCESSES": "3", "JAX_PROCESS_ID": "2",
                                             "JAX_COORDINATOR_ADDRESS": "cmle-training-workerpool0-ab-0:2222"}
    with pytest.raises(ValueError, match="only workerpool0 and workerpool1 train"):
        node_of({**spec, "task": {"type": "workerpool2", "index": 0}})
    with pytest.raises(ValueError, match="the primary pool has exactly one"):
        node_of({**spec, "cluster": {"workerpool1": ["a:1"]}})


def test_vertex_custom_job_nodes_get_their_frameworks_variables(tmp_path):
    """Vertex AI sets CLUSTER_SPEC; the node module turns it into JAX's variables (torch's alike, from the same
    node_of above) before it starts the node's Python."""
    # Each replica writes what it got; the primary ends last (the job ends when it does), as in training.
    code = textwrap.dedent(f"""
        import json, os, time
        seen = {{name: os.environ.get(name) for name in ("JAX_PROCESS_ID", "JAX_NUM_PROCESSES",
                                                          "JAX_COORDINATOR_ADDRESS")}}
        with open(os.path.join({str(tmp_path)!r}, "rank-" + seen["JAX_PROCESS_ID"]), "w") as f:
            json.dump(seen, f)
        while seen["JAX_PROCESS_ID"] == "0" and len(os.listdir({str(tmp_path)!r})) < 3:
            time.sleep(0.05)
    """)
    command = [sys.executable, "-m", "components.launch.node", "--framework", "jax", "--", "-c", code]
    with VertexJobsStandIn() as vertex:
        custom_job = launch.custom_job(framework_job("jax", 3, command=command), vertex_accelerators=KNOWN,
                                       spot=False)
        outcome = launch.VertexJobLauncher(vertex_client(vertex.url), "proj", "us-central1",
                                           poll_seconds=0.05).run(custom_job)
        assert outcome.state == "JOB_STATE_SUCCEEDED"
        pods = {pod.name: pod for pod in vertex.jobs[outcome.name].pods}
        primary = json.loads(pods["workerpool0-0"].env["CLUSTER_SPEC"])["cluster"]["workerpool0"][0]
    seen = {name: json.loads((tmp_path / name).read_text()) for name in os.listdir(tmp_path)}
    assert sorted(seen) == ["rank-0", "rank-1", "rank-2"]  # workerpool0-0, then workerpool1-0 and -1
    assert {(s["JAX_NUM_PROCESSES"], s["JAX_COORDINATOR_ADDRESS"]) for s in seen.values()} == {("3", primary)}
    # A torch CustomJob runs the node module with torchrun's arguments, one process per GPU.
    torch_job = launch.custom_job(framework_job("torch", 3), vertex_accelerators=KNOWN, spot=False)
    container = torch_job.job_spec.worker_pool_specs[1].container_spec
    assert list(container.command) == setup("torch").node_command(TRAIN)
    assert {e.name: e.value for e in container.env} == {"PET_NPROC_PER_NODE": "2"}


def test_the_node_module_leaves_a_single_replica_and_the_platforms_own_variables_alone():
    import subprocess

    show = ["-c", "import os; print(os.environ.get('JAX_PROCESS_ID'), os.environ.get('JAX_NUM_PROCESSES'))"]
    run = [sys.executable, "-m", "components.launch.node", "--framework", "jax", "--", *show]
    base = {k: v for k, v in os.environ.items() if not k.startswith(("JAX_", "CLUSTER_SPEC"))}
    single = subprocess.run(run, env=base, cwd=REPO_ROOT, capture_output=True, text=True, check=True)
    assert single.stdout.strip() == "None None"
    spec = {"cluster": {"workerpool0": ["h0:2222"], "workerpool1": ["h1:2222"]}, "task": {"type": "workerpool1",
                                                                                          "index": 0}}
    given = subprocess.run(run, env={**base, "CLUSTER_SPEC": json.dumps(spec), "JAX_NUM_PROCESSES": "5"},
                           cwd=REPO_ROOT, capture_output=True, text=True, check=True)
    assert given.stdout.strip() == "1 5"
    bad = subprocess.run(run, env={**base, "CLUSTER_SPEC": json.dumps({"cluster": {}})}, cwd=REPO_ROOT,
                         capture_output=True, text=True)
    assert bad.returncode == 2 and "the primary pool has exactly one" in bad.stderr


@pytest.mark.parametrize("ending, code", [("sys.exit(2)", 2), ("os.kill(os.getpid(), signal.SIGKILL)", 137),
                                          ("sigterm", 143)])
def test_a_torch_node_ends_with_the_steps_exit_codes(tmp_path, ending, code):
    """torchrun alone ends with 1 (permanent to the failure rules) whatever stopped it; the node module ends with
    the first failed process's own code (2 bad input; 137 killed: retryable), and 143 after SIGTERM, once its
    processes have written their checkpoint."""
    require_framework("torch")
    import signal
    import subprocess
    import time

    (tmp_path / "ending.py").write_text(textwrap.dedent(f"""
        import os, signal, sys, time
        def checkpoint(*_):
            print("checkpoint written", flush=True)
            sys.exit(143)
        signal.signal(signal.SIGTERM, checkpoint)
        print("started", flush=True)
        if {ending!r} == "sigterm":
            time.sleep(60)
        else:
            {ending if ending != "sigterm" else "pass"}
    """))
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "PET_NNODES": "1", "PET_NPROC_PER_NODE": "1"}
    node = subprocess.Popen([*TORCH_NODE, "--standalone", "-m", "ending"], cwd=REPO_ROOT, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    if ending == "sigterm":
        deadline = time.monotonic() + 60
        while "started" not in node.stdout.readline() and time.monotonic() < deadline:
            pass
        node.send_signal(signal.SIGTERM)
    output = node.communicate(timeout=120)[0]
    assert node.returncode == code, output
    if ending == "sigterm":
        assert "checkpoint written" in output


def test_the_launchers_rbac_covers_pytorchjobs():
    with open(os.path.join(REPO_ROOT, "manifests", "trainer", "launcher-rbac.yaml")) as f:
        role = next(yaml.safe_load_all(f))
    granted = {(r["apiGroups"][0], resource): set(r["verbs"]) for r in role["rules"] for resource in r["resources"]}
    assert {"create", "get", "delete"} <= granted[("kubeflow.org", "pytorchjobs")]



@pytest.mark.parametrize("launcher", ["trainjob", "jobset", "pytorchjob"])
def test_explain_shows_the_command_each_torch_node_runs(launcher):
    """`pipectl compile --explain` lists a cluster job's nodes from the launcher's own manifests: their command too."""
    from pipelines.backend import explain

    settings = launch.LaunchSettings(launcher, "img", workers=2, framework="torch")
    manifest = launch.job_manifests(launcher, launch.training_job(settings, TRAIN, run_id="RUN", task_name="train"),
                                    "ml", runtime=settings.runtime)[-1]
    nodes = explain.node_pods(manifest)
    assert sum(node["replicas"] for node in nodes) == 3
    assert all(node["command"] == setup("torch").node_command(TRAIN) for node in nodes)


def test_the_pipeline_path_starts_the_nodes_for_the_framework_that_trains(tmp_path):
    """The ops give the framework to both the launch settings and the training; a mismatch would start torch
    training without torchrun (each node alone), so it is refused before anything is created."""
    with pytest.raises(ValueError, match="nodes are started for torch but train with tensorflow"):
        launch.launch_pipeline_training(
            launch.LaunchSettings("trainjob", "img", framework="torch"), dataset_uri="gs://b/d", augmented_uri="",
            model_uri="gs://b/m", model_path=str(tmp_path / "model"), tensorboard_path=str(tmp_path / "tb"),
            recipe="fast", epochs=1, batch_size=0, learning_rate=0.0, checkpoint_root="", pipeline_root="gs://b/r",
            run_id="run-1", task_name="train")
