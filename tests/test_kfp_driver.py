"""What a KFP backend makes of the compiled pipeline: the training pod (or each node of a cluster job) gets exactly
the GPUs asked for, with the matching node selector and tolerations, on every launcher and target.

The pods come from pipelines/backend/kfp_driver.py, the model of the driver at kubeflow/pipelines 2.17.0 (each rule
cites its file and line); the nodes from the launchers' own code, fed the TaskConfig the way kfp's executor hands it
over.
"""

import functools

import pytest
import yaml

from pipelines import config
from pipelines.backend import explain, kfp_driver
from pipelines.training import compile_pipeline
from tests.standins.trainer import trainjob_jobset

IMAGES = config.Images(cpu="registry.example/cpu@sha256:" + "a" * 64, gpu="registry.example/gpu@sha256:" + "b" * 64,
                       torch="registry.example/torch@sha256:" + "c" * 64)
GPU = "nvidia.com/gpu"
GPU_TOLERATION = {"key": GPU, "operator": "Exists", "effect": "NoSchedule"}
SPOT_TOLERATION = {"key": "cloud.google.com/gke-spot", "operator": "Equal", "value": "true", "effect": "NoSchedule"}
CHOICES = [(gpus, spot, pool) for gpus in (0, 1, 2, 4) for spot in (False, True) for pool in ("", "train-pool")]


@functools.lru_cache(maxsize=None)
def package(tmp_root: str, launcher: str, target: str = "kfp", train_gpus: int = 1) -> str:
    path = f"{tmp_root}/{target}-{launcher}-{train_gpus}.yaml"
    compile_pipeline(path, config.PipelineSettings(images=IMAGES, target=target, train_launcher=launcher,
                                                   train_gpus=train_gpus, kueue_queue="team-gpu"))
    return path


@pytest.fixture(scope="module")
def tmp_root(tmp_path_factory):
    return str(tmp_path_factory.mktemp("driver"))


def train_step(report: dict) -> dict:
    return next(step for step in report["steps"] if step["task"].startswith("train-"))


def expected_placement(gpus: int, spot: bool, pool: str) -> tuple[dict, list]:
    selector = {"cloud.google.com/gke-accelerator": "nvidia-tesla-t4"} if gpus else {}
    if spot:
        selector["cloud.google.com/gke-spot"] = "true"
    if pool:
        selector["cloud.google.com/gke-nodepool"] = pool
    return selector, [GPU_TOLERATION] * bool(gpus) + [SPOT_TOLERATION] * spot


def run_parameters(gpus: int, spot: bool, pool: str) -> dict:
    return {"train_gpu_count": gpus, "train_spot": spot, "train_node_pool": pool, "train_workers": 2,
            "project": "p", "location": "us-central1"}


@pytest.mark.parametrize("gpus,spot,pool", CHOICES)
def test_the_training_pod_gets_the_gpus_asked_for(tmp_root, gpus, spot, pool):
    """launcher=pod on a KFP backend: the pod's nvidia.com/gpu limit is the run's count, placed on that pool; 0
    GPUs is a CPU pod without the GPU node selector and toleration."""
    report = explain.explain(package(tmp_root, "pod"), run_parameters(gpus, spot, pool))
    pod = train_step(report)
    selector, tolerations = expected_placement(gpus, spot, pool)
    assert kfp_driver.gpu_count(pod["resources"]) == gpus
    assert (GPU in pod["resources"].get("limits", {})) == bool(gpus)  # 0: no GPU resource at all
    assert pod.get("node_selector", {}) == selector
    assert pod.get("tolerations", []) == tolerations
    assert pod["resources"]["requests"] == {"cpu": "4", "memory": "16G"}
    assert pod["labels"] == {"kueue.x-k8s.io/queue-name": "team-gpu"}
    assert pod["image"] == IMAGES.gpu


@pytest.mark.parametrize("launcher", ["trainjob", "jobset", "tfjob"])
@pytest.mark.parametrize("gpus,spot,pool", CHOICES)
def test_each_node_of_a_cluster_job_gets_the_gpus_asked_for(tmp_root, launcher, gpus, spot, pool):
    """launcher=trainjob/jobset/tfjob: the driver passes the task's node selector and tolerations on (TaskConfig,
    not applied to the launcher's own pod), the nodes' size comes as values, and every node of the job gets them;
    the launcher's own pod keeps a small CPU and memory request of its own and no GPU."""
    report = explain.explain(package(tmp_root, launcher), run_parameters(gpus, spot, pool))
    step = train_step(report)
    assert step["resources"] == {"requests": {"cpu": "1", "memory": "2G"}}
    assert "node_selector" not in step and "tolerations" not in step and "labels" not in step
    selector, tolerations = expected_placement(gpus, spot, pool)
    assert step["task_config"]["resources"] == step["resources"]  # the launcher's own, applied to its pod
    assert step["nodes"] and sum(n["replicas"] for n in step["nodes"]) == 3  # the chief and two workers
    for node in step["nodes"]:
        assert kfp_driver.gpu_count(node["resources"]) == gpus
        assert (GPU in node["resources"].get("limits", {})) == bool(gpus)
        assert (node["nodeSelector"] or {}) == selector
        assert (node["tolerations"] or []) == tolerations
        assert node["resources"]["requests"] == {"cpu": "4", "memory": "16G"}


@pytest.mark.parametrize("launcher", ["trainjob", "jobset"])
def test_trainer_builds_the_nodes_pods_from_the_trainjob(tmp_root, launcher):
    """The TrainJob's nodes as Trainer v2 builds them (its JobSet, tests/standins/trainer.py) carry the GPUs."""
    from components.launch import LaunchSettings, job_manifests, node_resources, training_job

    report = explain.explain(package(tmp_root, launcher), run_parameters(2, True, ""))
    task_config = explain.task_config_as_step_reads_it(train_step(report)["task_config"])
    import dataclasses

    launch = LaunchSettings(launcher, IMAGES.gpu, workers=1, task_config=dataclasses.asdict(task_config),
                            node_resources=node_resources("4", "16G", "2"))
    manifests = job_manifests(launcher, training_job(launch, ["true"], run_id="r", task_name="t"), "ml")
    if launcher == "trainjob":
        jobset, problems = trainjob_jobset(manifests[-1], manifests[0])
        assert problems == []
    else:
        jobset = manifests[-1]
    pod = jobset["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    assert pod["containers"][0]["resources"]["limits"] == {GPU: "2"}
    assert pod["nodeSelector"]["cloud.google.com/gke-accelerator"] == "nvidia-tesla-t4"
    assert pod["tolerations"] == [GPU_TOLERATION, SPOT_TOLERATION]


@pytest.mark.parametrize("gpus,spot,pool", CHOICES)
def test_vertex_custom_job_machines_get_the_gpus_asked_for(tmp_root, gpus, spot, pool):
    """launcher=vertex-job: the step's pod is a small CPU pod; the CustomJob's machines carry the run's GPUs (a GKE
    node pool means nothing to Vertex AI, which picks machines by type)."""
    step = train_step(explain.explain(package(tmp_root, "vertex-job"), run_parameters(gpus, spot, pool)))
    assert kfp_driver.gpu_count(step["resources"]) == 0 and "node_selector" not in step
    assert [n["replicas"] for n in step["nodes"]] == [1, 2]
    for node in step["nodes"]:
        assert node["machine"]["acceleratorCount"] == gpus
        assert node["machine"]["acceleratorType"] == ("NVIDIA_TESLA_T4" if gpus else "ACCELERATOR_TYPE_UNSPECIFIED")
        assert (node["scheduling"] == "SPOT") == spot


@pytest.mark.parametrize("gpus", [0, 1, 2, 4])
def test_vertex_ai_pipelines_training_gets_the_gpus_compiled_in(tmp_root, gpus):
    """target=vertex: Vertex AI picks the machine from the task's accelerator type and count, fixed when
    compiling (--train-gpus); 0 compiles no accelerator at all, a CPU machine."""
    spec, _ = kfp_driver.read_package(package(tmp_root, "pod", "vertex", gpus))
    accelerator = spec["deploymentSpec"]["executors"]["exec-train-op"]["container"]["resources"].get("accelerator")
    if gpus:
        assert accelerator["resourceType"] == "NVIDIA_TESLA_T4" and accelerator["resourceCount"] == str(gpus)
    else:
        assert accelerator is None
    pod = train_step(explain.explain(package(tmp_root, "pod", "vertex", gpus), {}))
    assert kfp_driver.gpu_count(pod["resources"], "NVIDIA_TESLA_T4") == gpus


@pytest.mark.parametrize("target", ["kfp", "vertex"])
@pytest.mark.parametrize("gpus", [0, 1, 2])
def test_batch_prediction_gets_the_gpus_compiled_in(tmp_path, target, gpus):
    """The other GPU step: its pool and count are fixed when compiling (--predict-gpus); 0 is a CPU pod."""
    path = str(tmp_path / "p.yaml")
    compile_pipeline(path, config.PipelineSettings(images=IMAGES, target=target, predict_gpus=gpus))
    pod = next(s for s in explain.explain(path, {})["steps"] if s["task"] == "predict-op")
    resource = GPU if target == "kfp" else "NVIDIA_H100_80GB"
    assert kfp_driver.gpu_count(pod["resources"], resource) == gpus
    if target == "kfp":
        h100 = {"cloud.google.com/gke-accelerator": "nvidia-h100-80gb"}
        assert pod.get("node_selector", {}) == (h100 if gpus else {})
        assert pod.get("tolerations", []) == [GPU_TOLERATION] * bool(gpus)


@pytest.mark.parametrize("launcher", ["trainjob", "pytorchjob", "vertex-job"])
@pytest.mark.parametrize("framework, image", [("tensorflow", IMAGES.gpu), ("torch", IMAGES.torch)])
def test_a_cluster_jobs_nodes_run_the_image_of_the_runs_framework(tmp_root, launcher, framework, image):
    """The launcher's own pod stays on the CPU image; the job's nodes get the image step's pick as a value."""
    spec, executors = kfp_driver.read_package(package(tmp_root, launcher))
    params = {**run_parameters(1, False, ""), "framework": framework}
    pods = kfp_driver.resolve_pods(spec, executors, params, explain.producer_outputs(spec, params))
    train = next(pod for pod in pods if pod.task.startswith("train-"))
    assert (train.image, train.inputs["image"]) == (IMAGES.cpu, image)


def test_a_number_placeholder_resolves_to_no_gpu_as_the_driver_reads_it():
    """The bug this guards against: an accelerator count fed by the NUMBER_INTEGER parameter is read with
    GetStringValue() (resolve.go:825) and sets no limit; a string sets it."""
    container = {"resources": {"accelerator": {"resourceType": GPU,
                                               "resourceCount": "{{$.inputs.parameters['pipelinechannel--n']}}"}}}
    assert kfp_driver.container_resources(container, {"pipelinechannel--n": 2.0}, "2.17.0") == {}
    assert kfp_driver.container_resources(container, {"pipelinechannel--n": "2"}, "2.17.0") == {"limits": {GPU: "2"}}
    assert kfp_driver.container_resources(container, {"pipelinechannel--n": ""}, "2.17.0") == {}
    with pytest.raises(kfp_driver.DriverError, match="quantities must match"):
        kfp_driver.container_resources(container, {"pipelinechannel--n": "two"}, "2.17.0")


def test_older_backends_drop_or_fail_on_what_they_do_not_know(tmp_root):
    """Before 2.15 no TaskConfig reaches the launcher: its own pod gets the node selector and tolerations (the
    launcher refuses to guess the nodes'). Before 2.5 the `_json` placement is an unknown field: 2.4.1 makes the
    toleration an empty one, which the API server refuses; 2.4.0 and older fail on the unknown field itself, and
    before 2.4 on the placeholder resource fields every step carries."""
    params = run_parameters(2, True, "")
    step = train_step(explain.explain(package(tmp_root, "trainjob"), params, release="2.14.0"))
    assert "task_config" not in step and "nodes" not in step
    assert step["resources"] == {"requests": {"cpu": "1", "memory": "2G"}}  # never the nodes' GPUs
    assert step["tolerations"] == [GPU_TOLERATION, SPOT_TOLERATION]
    assert any("no TaskConfig passthrough" in n for n in step["notes"])
    pod = train_step(explain.explain(package(tmp_root, "pod"), params, release="2.4.1"))
    assert "operator must be Exists when `key` is empty" in pod["fails"] and "resources" not in pod
    pod = train_step(explain.explain(package(tmp_root, "pod"), params, release="2.4.0"))
    assert "unknown field 'nodeSelectorJson'" in pod["fails"]
    report = explain.explain(package(tmp_root, "pod"), params, release="2.3.0")
    assert all("unknown field 'resource" in s["fails"] for s in report["steps"]), report["steps"]


def test_the_pipeline_states_the_backend_it_needs(tmp_root):
    # vertex-job: 2.4.0 for the images picked per run (evaluation and prediction run in the pipeline)
    for launcher, needed in (("pod", "2.5.0"), ("trainjob", "2.15.0"), ("vertex-job", "2.4.0")):
        spec, executors = kfp_driver.read_package(package(tmp_root, launcher))
        assert kfp_driver.required_release(spec, executors)[0].first_release == needed, launcher


@pytest.mark.parametrize("text,canonical", [("4", "4"), ("0.5", "500m"), ("0.512G", "512M"), ("16G", "16G"),
                                            ("1000M", "1G"), ("1.5Gi", "1536Mi"), ("16Gi", "16Gi"), ("0", "0"),
                                            ("512", "512"), ("1e3", "1e3"), ("1000e0", "1e3")])
def test_quantities_read_back_as_kubernetes_writes_them(text, canonical):
    assert kfp_driver.canonical_quantity(text) == canonical


def test_explain_prints_yaml_with_every_step(tmp_root):
    report = explain.explain(package(tmp_root, "pod"), run_parameters(1, False, ""))
    parsed = yaml.safe_load(explain.render(report))
    assert sorted(s["task"] for s in parsed["steps"]) == ["augment-op", "evaluate-op", "placement-op", "predict-op",
                                                          "preprocess-op", "register-op", "step-images-op",
                                                          "train-op"]
    assert parsed["backend_release"] == kfp_driver.PINNED_RELEASE
    order = [s["task"] for s in parsed["steps"]]  # in run order: each step after the steps it waits for
    assert order.index("preprocess-op") < order.index("augment-op") < order.index("train-op")
    assert order.index("train-op") < order.index("evaluate-op") < order.index("register-op")
    assert order.index("placement-op") < order.index("train-op") < order.index("predict-op")


def test_tasks_come_in_run_order_whatever_their_names():
    tasks = {"a-last": {"dependentTasks": ["m-middle"]}, "m-middle": {"dependentTasks": ["z-first"]}, "z-first": {},
             "b-free": {}}
    assert [name for name, _ in kfp_driver.in_run_order(tasks)] == ["b-free", "z-first", "m-middle", "a-last"]


# --- the model's rules, on the driver's own test cases and on the SDK's compiled forms --------------------------
def placeholder(name: str) -> str:
    return "{{$.inputs.parameters['pipelinechannel--" + name + "']}}"


def test_the_model_passes_the_drivers_resource_tests():
    """kubeflow/pipelines 2.17.0, backend/src/v2/driver/driver_test.go: Test_initPodSpecPatch_resource_placeholders
    (:307, every value a string) and the legacy numeric fields of
    Test_initPodSpecPatch_TaskConfig_Resources_Passthrough_ApplyAndCapture (:1444)."""
    container = {"resources": {
        "resourceCpuRequest": placeholder("cpu_request"), "resourceCpuLimit": placeholder("cpu_limit"),
        "resourceMemoryRequest": placeholder("memory_request"), "resourceMemoryLimit": placeholder("memory_limit"),
        "accelerator": {"resourceType": placeholder("accelerator_type"),
                        "resourceCount": placeholder("accelerator_count")}}}
    inputs = {"pipelinechannel--cpu_request": "200m", "pipelinechannel--cpu_limit": "400m",
              "pipelinechannel--memory_request": "100Mi", "pipelinechannel--memory_limit": "500Mi",
              "pipelinechannel--accelerator_type": GPU, "pipelinechannel--accelerator_count": "1"}
    assert kfp_driver.container_resources(container, inputs, "2.17.0") == {
        "limits": {"memory": "500Mi", "cpu": "400m", GPU: "1"}, "requests": {"memory": "100Mi", "cpu": "200m"}}
    legacy = {"resources": {"cpuLimit": 2.0, "memoryLimit": 1.5, "cpuRequest": 1.0, "memoryRequest": 0.65}}
    assert kfp_driver.container_resources(legacy, {}, "2.17.0") == {
        "limits": {"memory": "1500M", "cpu": "2"}, "requests": {"memory": "650M", "cpu": "1"}}
    # driver_test.go:820 (apply_to_task false: captured only) and :1444 (true: on the pod and captured); the
    # fields a component does not list stay on the pod (driver.go:212-236).
    every = {"RESOURCES", "ENV", "KUBERNETES_AFFINITY", "KUBERNETES_TOLERATIONS", "KUBERNETES_NODE_SELECTOR",
             "KUBERNETES_VOLUMES"}
    for apply, on_pod in ((False, every - {"RESOURCES"}), (True, every)):
        component = {"taskConfigPassthroughs": [{"field": "RESOURCES", "applyToTask": apply}]}
        assert kfp_driver.task_config_options(component, "2.17.0") == ({"RESOURCES"}, on_pod)
    assert kfp_driver.task_config_options({}, "2.17.0") == (set(), every)  # no passthroughs: all on the pod


def test_apply_to_task_fixed_tolerations_and_labels_as_the_sdk_compiles_them(tmp_path):
    """A component compiled by the SDK with RESOURCES passed through and applied to the task, and tolerations
    passed through only: the pod and the TaskConfig get what the driver gives them."""
    from kfp import compiler, dsl, kubernetes

    @dsl.component(base_image="python:3.11", task_config_passthroughs=[
        dsl.TaskConfigPassthrough(field=dsl.TaskConfigField.RESOURCES, apply_to_task=True),
        dsl.TaskConfigField.KUBERNETES_TOLERATIONS, dsl.TaskConfigField.KUBERNETES_NODE_SELECTOR])
    def launch(task_config: dsl.TaskConfig):
        pass

    @dsl.pipeline
    def pipeline(count: str = "2", number: int = 2):
        task = launch().set_accelerator_type(GPU).set_accelerator_limit(count).set_cpu_request("0.5")
        kubernetes.add_toleration(task, key="dedicated", operator="Equal", value="ml", effect="NoSchedule")
        kubernetes.add_node_selector(task, label_key="pool", label_value="gpu")
        kubernetes.add_pod_label(task, "team", "vision")
        other = launch().set_accelerator_type(GPU).set_accelerator_limit(number)
        other.set_display_name("number")

    path = str(tmp_path / "p.yaml")
    compiler.Compiler().compile(pipeline, path)
    spec, executors = kfp_driver.read_package(path)
    first, second = kfp_driver.resolve_pods(spec, executors, {}, {})
    assert first.resources == {"limits": {GPU: "2"}, "requests": {"cpu": "500m"}}
    assert first.task_config["resources"] == first.resources
    assert first.tolerations is None and first.node_selector is None
    assert first.task_config["tolerations"] == [{"key": "dedicated", "operator": "Equal", "value": "ml",
                                                 "effect": "NoSchedule"}]
    assert first.task_config["nodeSelector"] == {"pool": "gpu"} and first.labels == {"team": "vision"}
    assert explain.task_config_as_step_reads_it(first.task_config).node_selector == {"pool": "gpu"}
    # The same limit from an int parameter: the driver reads it as "" and sets no GPU.
    assert second.gpus == 0 and second.task_config["resources"] == {}


@pytest.mark.parametrize("release,says", [("2.4.1", "operator must be Exists when `key` is empty"),
                                          ("2.4.0", "unknown field 'nodeSelectorJson'")])
def test_explain_says_which_steps_an_older_backend_fails(tmp_path, capsys, release, says):
    """What `pipectl upload` refuses an old host for, `pipectl compile --explain --backend-release` shows: the
    training step fails there, with the driver's or the API server's reason; the other steps' pods are shown."""
    from pipelines import cli

    assert cli.main(["compile", "--output", str(tmp_path / "p.yaml"), "--explain", "--backend-release", release,
                     "--train-gpu-count", "1"]) == 0
    report = yaml.safe_load(capsys.readouterr().out)
    failing = [s for s in report["steps"] if "fails" in s]
    assert [s["task"] for s in failing] == ["train-op"] and says in failing[0]["fails"]
    assert next(s for s in report["steps"] if s["task"] == "evaluate-op")["resources"]["requests"]["cpu"] == "2"
