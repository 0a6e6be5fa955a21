"""The compiled pipeline, asserted on its YAML: images, GPU pools, retries, caching and the blessed gate."""

import subprocess
import sys

import pytest
import yaml

from pipelines import config
from pipelines.training import compile_pipeline

IMAGES = config.Images(cpu="europe-docker.pkg.dev/p/ml/cpu@sha256:" + "a" * 64,
                       gpu="europe-docker.pkg.dev/p/ml/gpu@sha256:" + "b" * 64,
                       torch="europe-docker.pkg.dev/p/ml/torch@sha256:" + "c" * 64)


@pytest.fixture(scope="module")
def compiled_path(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("compile") / "pipeline.yaml"
    compile_pipeline(str(path), config.PipelineSettings(images=IMAGES))
    return str(path)


@pytest.fixture(scope="module")
def compiled(compiled_path):
    with open(compiled_path) as f:
        spec, platform = yaml.safe_load_all(f.read())
    return spec, platform["platforms"]["kubernetes"]["deploymentSpec"]["executors"]


def tasks(spec):
    return spec["root"]["dag"]["tasks"]


def container(spec, task):
    return spec["deploymentSpec"]["executors"][f"exec-{task}"]["container"]


def test_every_step_runs_on_the_pinned_project_images(compiled):
    """The CPU steps name the CPU image; training, evaluation and batch prediction take the image the image step
    picks for the run's framework (the next test: the pods the driver makes of it)."""
    spec, _ = compiled
    images = {name[len("exec-"):]: e["container"]["image"] for name, e in spec["deploymentSpec"]["executors"].items()}
    chosen = "{{$.inputs.parameters['pipelinechannel--step-images-op-%s']}}"
    assert images == {
        "preprocess-op": IMAGES.cpu, "augment-op": IMAGES.cpu, "register-op": IMAGES.cpu, "placement-op": IMAGES.cpu,
        "step-images-op": IMAGES.cpu, "train-op": chosen % "train", "evaluate-op": chosen % "evaluate",
        "predict-op": chosen % "predict",
    }
    assert tasks(spec)["step-images-op"]["inputs"]["parameters"]["images"]["runtimeValue"]["constant"] == {
        "cpu": IMAGES.cpu, "gpu": IMAGES.gpu, "torch": IMAGES.torch}
    # The image holds the project: no pip install of kfp or anything else at run time.
    for executor in spec["deploymentSpec"]["executors"].values():
        assert "pip install" not in " ".join(executor["container"]["command"])


@pytest.mark.parametrize("framework, train, evaluate, predict", [
    ("tensorflow", IMAGES.gpu, IMAGES.cpu, IMAGES.gpu),
    # The PyTorch image (torch and JAX) has no TensorFlow: TorchScript, and Keras on torch or on JAX, are trained,
    # evaluated and predicted there; the GPU image has no JAX.
    ("jax", IMAGES.torch, IMAGES.torch, IMAGES.torch),
    ("torch", IMAGES.torch, IMAGES.torch, IMAGES.torch),
])
def test_each_framework_gets_pods_on_images_that_can_run_its_steps(compiled_path, framework, train, evaluate,
                                                                   predict):
    """The pods a KFP backend (the driver model at kubeflow/pipelines 2.17.0) starts for a run on `framework`,
    the image step run with the run's parameters as on the cluster."""
    from pipelines.backend import explain

    pods = {step["task"]: step for step in explain.explain(compiled_path, {"framework": framework})["steps"]}
    assert {task: pod["image"] for task, pod in pods.items()} == {
        "preprocess-op": IMAGES.cpu, "augment-op": IMAGES.cpu, "placement-op": IMAGES.cpu,
        "step-images-op": IMAGES.cpu, "register-op": IMAGES.cpu,
        "train-op": train, "evaluate-op": evaluate, "predict-op": predict}
    # Evaluation stays on a CPU node whatever its image; prediction on its GPU pool.
    assert "nvidia.com/gpu" not in pods["evaluate-op"]["resources"].get("limits", {})
    assert pods["evaluate-op"]["resources"]["requests"] == {"cpu": "2", "memory": "8G"}
    assert pods["predict-op"]["resources"]["limits"]["nvidia.com/gpu"] == "1"


@pytest.mark.parametrize("launcher", ["trainjob", "jobset", "vertex-job"])
def test_a_jax_runs_cluster_job_nodes_run_the_chosen_image(launcher, tmp_path):
    """Multi-node training (Trainer v2's jax-multinode runtime, a JobSet, a Vertex AI CustomJob) gets the image the
    image step chose as a value: for jax the PyTorch image, which carries JAX; the GPU image has none."""
    from pipelines.backend import explain

    path = str(tmp_path / "p.yaml")
    compile_pipeline(path, config.PipelineSettings(images=IMAGES, train_launcher=launcher))
    for framework, image in (("jax", IMAGES.torch), ("tensorflow", IMAGES.gpu)):
        steps = explain.explain(path, {"framework": framework, "train_workers": 1})["steps"]
        (train,) = [step for step in steps if step["task"].startswith("train-")]
        assert train["image"] == IMAGES.cpu  # the launcher's own small pod
        assert train["nodes"] and {node["image"] for node in train["nodes"]} == {image}, (framework, train["nodes"])
        if framework == "jax":
            assert all(node["command"][:5] == ["python", "-m", "components.launch.node", "--framework", "jax"]
                       for node in train["nodes"])


def test_a_torch_run_of_a_pipeline_without_the_pytorch_image_is_refused_at_its_start(tmp_path):
    from pipelines.backend import explain

    path = str(tmp_path / "p.yaml")
    compile_pipeline(path, config.PipelineSettings(images=config.Images(cpu=IMAGES.cpu, gpu=IMAGES.gpu)))
    assert explain.explain(path, {"framework": "tensorflow"})  # other frameworks run as before
    for framework in ("torch", "jax"):
        with pytest.raises(ValueError, match=f"framework {framework} trains, evaluates and predicts in the PyTorch "
                                             r"image \(torch and JAX, no TensorFlow\), and this pipeline was compiled "
                                             "without one: compile it with --torch-image"):
            explain.explain(path, {"framework": framework})


def test_the_image_step_picks_per_framework_and_refuses_in_one_line():
    from components.step_images import StepImages, step_images

    pinned = IMAGES.pinned()
    assert step_images("tensorflow", pinned) == StepImages(IMAGES.gpu, IMAGES.cpu, IMAGES.gpu)
    for framework in ("torch", "jax"):  # the TensorFlow-free image carries both
        assert step_images(framework, pinned) == StepImages(IMAGES.torch, IMAGES.torch, IMAGES.torch)
    without = {**pinned, "torch": ""}
    assert step_images("tensorflow", without).train == IMAGES.gpu
    # As the step runs it: one line on stderr, exit status 2, before training.
    argv = [sys.executable, "-m", "components.step_images", "--framework", "jax", "--cpu-image", IMAGES.cpu,
            "--gpu-image", IMAGES.gpu]
    refused = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert refused.returncode != 0 and refused.stdout == ""
    (line,) = refused.stderr.strip().splitlines()
    assert "framework jax trains, evaluates and predicts in the PyTorch image" in line and "--torch-image" in line
    chosen = subprocess.run([*argv, "--torch-image", IMAGES.torch], capture_output=True, text=True, timeout=120)
    assert chosen.returncode == 0, chosen.stderr
    assert IMAGES.torch in chosen.stdout and IMAGES.gpu not in chosen.stdout


def test_vertex_ai_pipelines_keep_the_compiled_images(tmp_path):
    """Vertex AI documents no image taken from a step's output: there the images are fixed when compiling."""
    path = tmp_path / "p.yaml"
    compile_pipeline(str(path), config.PipelineSettings(images=IMAGES, target="vertex"))
    spec = next(yaml.safe_load_all(path.read_text()))
    images = {name[len("exec-"):]: e["container"]["image"] for name, e in spec["deploymentSpec"]["executors"].items()}
    assert images["train-op"] == IMAGES.gpu and images["predict-op"] == IMAGES.gpu
    assert images["evaluate-op"] == IMAGES.cpu and "step-images-op" not in images


def test_training_and_prediction_go_to_their_gpu_pools(compiled):
    spec, k8s = compiled
    # Prediction: a fixed pool, chosen when compiling.
    assert k8s["exec-predict-op"]["nodeSelector"] == {"labels": {"cloud.google.com/gke-accelerator":
                                                                 "nvidia-h100-80gb"}}
    assert k8s["exec-predict-op"]["tolerations"] == [
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    predict = container(spec, "predict-op")["resources"]["accelerator"]
    assert (predict["resourceType"], predict["resourceCount"]) == ("nvidia.com/gpu", "1")
    # Training: chosen per run; the checked node selector and tolerations come from the GPU-check step.
    from_check = {"taskOutputParameter": {"outputParameterKey": "node_selector", "producerTask": "placement-op"}}
    assert k8s["exec-train-op"]["nodeSelector"] == {"nodeSelectorJson": from_check}
    assert k8s["exec-train-op"]["tolerations"][0]["tolerationJson"]["taskOutputParameter"] == \
        {"outputParameterKey": "tolerations", "producerTask": "placement-op"}
    train = container(spec, "train-op")["resources"]["accelerator"]
    # The count is the check step's string output: the driver resolves a number placeholder to no GPU at all
    # (tests/test_kfp_driver.py asserts the resolved pods).
    assert train["resourceType"] == "nvidia.com/gpu" and "placement-op-gpu_limit" in train["resourceCount"]
    inputs = spec["root"]["inputDefinitions"]["parameters"]
    assert inputs["train_accelerator_type"]["defaultValue"] == "nvidia-tesla-t4"
    assert inputs["train_gpu_count"]["defaultValue"] == 1.0
    assert set(k8s) == {"exec-train-op", "exec-predict-op"}  # CPU steps are not pinned to GPU nodes


def test_training_retries_with_backoff_and_keys_checkpoints_by_run_and_task(compiled):
    spec, _ = compiled
    train = tasks(spec)["train-op"]
    assert train["retryPolicy"]["maxRetryCount"] == 3
    assert train["retryPolicy"]["backoffDuration"] == "60s"
    params = train["inputs"]["parameters"]
    assert params["run_id"]["runtimeValue"]["constant"] == "{{$.pipeline_job_uuid}}"
    assert params["task_name"]["runtimeValue"]["constant"] == "{{$.pipeline_task_name}}"
    assert params["pipeline_root"]["runtimeValue"]["constant"] == "{{$.pipeline_root}}"


def test_registration_only_inside_the_blessed_condition(compiled):
    spec, _ = compiled
    assert "register-op" not in tasks(spec)
    condition = next(t for t in tasks(spec).values() if "triggerPolicy" in t)
    assert condition["triggerPolicy"]["condition"] == \
        "inputs.parameter_values['pipelinechannel--evaluate-op-Output'] == true"
    inner = spec["components"][condition["componentRef"]["name"]]["dag"]["tasks"]
    assert list(inner) == ["register-op"]


def test_caching_off_for_the_steps_that_read_the_registry(compiled):
    spec, _ = compiled
    condition = next(t for t in tasks(spec).values() if "triggerPolicy" in t)
    inner = spec["components"][condition["componentRef"]["name"]]["dag"]["tasks"]
    assert not tasks(spec)["evaluate-op"]["cachingOptions"].get("enableCache", False)
    assert not inner["register-op"]["cachingOptions"].get("enableCache", False)
    for name in ("preprocess-op", "augment-op", "train-op", "predict-op"):
        assert tasks(spec)[name]["cachingOptions"]["enableCache"] is True


def test_display_names_and_descriptions_for_the_ui(compiled):
    spec, _ = compiled
    names = {name: t["taskInfo"]["name"] for name, t in tasks(spec).items() if name != "condition-1"}
    assert names == {"preprocess-op": "Preprocess", "augment-op": "Augment", "placement-op": "Check GPU choice",
                     "step-images-op": "Choose images",
                     "train-op": "Train", "evaluate-op": "Evaluate", "predict-op": "Batch predict"}
    assert spec["pipelineInfo"]["name"] == "image-classification"
    assert "registers the model when it is blessed" in spec["pipelineInfo"]["description"]
    assert spec["root"]["inputDefinitions"]["parameters"]["recipe"]["defaultValue"] == "fast"
    assert "epochs" in spec["root"]["inputDefinitions"]["parameters"]["epochs"]["description"].lower()


def test_unknown_accelerator_is_refused():
    with pytest.raises(ValueError, match="Unknown accelerator 'nvidia-tesla-k9'; known GKE accelerators: "
                                         "nvidia-tesla-t4, nvidia-l4"):
        config.PipelineSettings(train_accelerator="nvidia-tesla-k9")


def test_compiling_does_not_import_tensorflow(tmp_path):
    code = ("import sys; from pipelines.training import compile_pipeline; "
            f"compile_pipeline({str(tmp_path / 'p.yaml')!r}); "
            "assert 'tensorflow' not in sys.modules, 'compiling imported TensorFlow'")
    subprocess.run([sys.executable, "-c", code], check=True)


MODEL_PARAMETERS = {"model": "network", "pretrained": "pretrained", "freeze_epochs": "freeze_epochs",
                    "fine_tune_layers": "fine_tune_layers", "fine_tune_lr_factor": "fine_tune_lr_factor",
                    "weights_cache": "weights_cache"}


@pytest.mark.parametrize("launcher", ["pod", "trainjob", "vertex-job"])
def test_the_model_and_its_pretrained_weights_reach_the_train_task(launcher, tmp_path):
    """model, pretrained and the transfer-learning parameters are pipeline parameters wired to the train task (the op
    calls the pipeline's `model` `network`: `model` is its output artifact), with every launcher."""
    path = tmp_path / "pipeline.yaml"
    compile_pipeline(str(path), config.PipelineSettings(images=IMAGES, train_launcher=launcher))
    spec = next(yaml.safe_load_all(path.read_text()))
    inputs = spec["root"]["inputDefinitions"]["parameters"]
    assert inputs["model"]["defaultValue"] == "reference-cnn" and inputs["pretrained"]["defaultValue"] == "none"
    assert inputs["freeze_epochs"]["defaultValue"] == -1 and inputs["fine_tune_layers"]["defaultValue"] == 0
    assert "module:function" in inputs["model"]["description"]
    train = next(task for name, task in tasks(spec).items() if name.startswith("train-"))
    wired = train["inputs"]["parameters"]
    for pipeline_name, op_name in MODEL_PARAMETERS.items():
        assert wired[op_name] == {"componentInputParameter": pipeline_name}, (launcher, op_name)
