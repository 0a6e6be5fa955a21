"""pipectl run/schedule --vertex as typed, against the Vertex AI REST stand-in (real aiplatform_v1 clients)."""

import json

import pytest

from pipelines import cli
from tests.standins.vertex_api import VertexStandIn

PROJECT, LOCATION = "test-project", "europe-west4"
ROOT = "gs://ml-test/pipeline-root"


@pytest.fixture
def vertex():
    with VertexStandIn(project=PROJECT, project_number="123456789012", location=LOCATION) as server:
        yield server


def common(vertex):
    return ["--vertex", "--project", PROJECT, "--region", LOCATION, "--pipeline-root", ROOT,
            "--vertex-endpoint", vertex.api_endpoint, "--image-repo", f"{LOCATION}-docker.pkg.dev/p/ml",
            "--image-tag", "abc1234"]


def printed(capsys):
    out = capsys.readouterr().out
    return json.loads(out[out.index("{"):] if out.lstrip().startswith("{") else out[out.index("["):])


def test_run_vertex_submits_the_vertex_compiled_pipeline_and_waits(vertex, capsys):
    argv = ["run", *common(vertex), "--service-account", f"runner@{PROJECT}.iam.gserviceaccount.com",
            "--epochs", "5", "--wait", "--poll-seconds", "0.01"]
    assert cli.main(argv) == 0
    run = printed(capsys)
    assert run["state"] == "PIPELINE_STATE_SUCCEEDED" and "console.cloud.google.com" in run["console_url"]
    (job,) = vertex.pipeline_jobs()
    assert job["serviceAccount"] == f"runner@{PROJECT}.iam.gserviceaccount.com"
    assert job["runtimeConfig"]["gcsOutputDirectory"] == ROOT
    params = job["runtimeConfig"]["parameterValues"]
    # On Vertex the registry defaults to Vertex AI's, in the run's project and region.
    assert params == {"epochs": 5, "registry": "vertex", "project": PROJECT, "location": LOCATION}
    spec = job["pipelineSpec"]
    train = spec["deploymentSpec"]["executors"]["exec-train-op"]["container"]
    assert train["image"] == f"{LOCATION}-docker.pkg.dev/p/ml/gpu:abc1234"
    assert train["resources"]["accelerator"]["type"] == "NVIDIA_TESLA_T4"


def test_run_vertex_refuses_before_sending(vertex, capsys):
    assert cli.main(["run", *common(vertex), "--registry", "local"]) == 2
    assert "registry=local" in capsys.readouterr().err
    assert cli.main(["run", "--vertex", "--region", LOCATION, "--pipeline-root", ROOT]) == 2
    assert "--vertex needs --project PROJECT and --region REGION" in capsys.readouterr().err
    argv = ["run", *common(vertex)]
    argv[argv.index(ROOT)] = "/local/root"
    assert cli.main(argv) == 2
    assert "gs://" in capsys.readouterr().err
    assert vertex.pipeline_jobs() == []


def test_run_needs_exactly_one_place(capsys):
    assert cli.main(["run", "--local", "--vertex"]) == 2
    assert "choose where to run" in capsys.readouterr().err


def test_schedule_vertex_keeps_one_per_name(vertex, capsys):
    base = ["schedule", *common(vertex), "--name", "nightly"]
    assert cli.main(base + ["--cron", "0 3 * * *"]) == 0
    assert cli.main(base + ["--cron", "TZ=Europe/Berlin 30 4 * * MON-FRI", "--epochs", "6"]) == 0
    capsys.readouterr()
    (schedule,) = vertex.schedules()
    assert schedule["displayName"] == "nightly" and schedule["cron"] == "TZ=Europe/Berlin 30 4 * * MON-FRI"
    params = schedule["createPipelineJobRequest"]["pipelineJob"]["runtimeConfig"]["parameterValues"]
    assert params["epochs"] == 6
    assert cli.main(base + ["--pause"]) == 0
    assert vertex.schedules()[0]["state"] in ("PAUSED", 2)
    assert cli.main(base + ["--resume"]) == 0
    assert cli.main(base + ["--delete"]) == 0
    assert vertex.schedules() == []


def test_run_vertex_refuses_per_run_gke_placement(vertex, capsys):
    assert cli.main(["run", *common(vertex), "--train-accelerator-type", "nvidia-l4", "--train-spot", "true"]) == 2
    err = capsys.readouterr().err
    assert "use --train-accelerator and --train-gpus instead of --train-accelerator-type, --train-spot" in err
    assert vertex.pipeline_jobs() == []


@pytest.mark.parametrize("framework", ["torch", "jax"])
def test_run_vertex_on_torch_or_jax_compiles_the_pytorch_image_into_three_steps(vertex, capsys, framework):
    assert cli.main(["run", *common(vertex), "--framework", framework, "--epochs", "2"]) == 0
    (job,) = vertex.pipeline_jobs()
    # The framework is fixed into the pipeline, not sent: the pipeline declares no such parameter on Vertex AI.
    assert job["runtimeConfig"]["parameterValues"] == {"epochs": 2, "registry": "vertex", "project": PROJECT,
                                                       "location": LOCATION}
    spec = job["pipelineSpec"]
    executors = spec["deploymentSpec"]["executors"]
    torch_image = f"{LOCATION}-docker.pkg.dev/p/ml/torch:abc1234"
    assert {executors[f"exec-{s}-op"]["container"]["image"] for s in ("train", "evaluate", "predict")} == {torch_image}
    assert executors["exec-preprocess-op"]["container"]["image"] == f"{LOCATION}-docker.pkg.dev/p/ml/cpu:abc1234"
    assert spec["root"]["dag"]["tasks"]["train-op"]["inputs"]["parameters"]["framework"] == {
        "runtimeValue": {"constant": framework}}


def test_compile_vertex_fixes_the_framework_and_kfp_keeps_it_per_run(tmp_path, capsys):
    import yaml

    out = tmp_path / "vertex-torch.yaml"
    assert cli.main(["compile", "--target", "vertex", "--framework", "torch", "--torch-image",
                     "r/torch@sha256:" + "0" * 64, "-o", str(out)]) == 0
    assert "framework torch, fixed for Vertex AI" in capsys.readouterr().out
    spec = yaml.safe_load(out.read_text())
    assert spec["deploymentSpec"]["executors"]["exec-train-op"]["container"]["image"] == "r/torch@sha256:" + "0" * 64
    # On a KFP backend the framework stays a run parameter, given when compiling only with --explain.
    assert cli.main(["compile", "--target", "kfp", "--framework", "torch", "-o", str(tmp_path / "kfp.yaml")]) == 2
    assert "chosen per run" in capsys.readouterr().err


def test_run_vertex_on_torch_refuses_a_torch_module_for_the_vertex_registry_before_sending(vertex, capsys):
    pytest.importorskip("torch")
    assert cli.main(["run", *common(vertex), "--framework", "torch", "--model", "tests.byo_torch:build"]) == 2
    err = capsys.readouterr().err
    assert "is a torch.nn.Module, served as TorchScript" in err and "torchscript-on-vertex-ai" in err
    assert len(err.strip().splitlines()) == 1
    assert vertex.pipeline_jobs() == []


def test_schedule_vertex_on_jax_runs_the_pytorch_image(vertex, capsys):
    assert cli.main(["schedule", *common(vertex), "--name", "nightly-jax", "--cron", "0 3 * * *",
                     "--framework", "jax"]) == 0
    (schedule,) = vertex.schedules()
    job = schedule["createPipelineJobRequest"]["pipelineJob"]
    assert "framework" not in job["runtimeConfig"].get("parameterValues", {})
    executors = job["pipelineSpec"]["deploymentSpec"]["executors"]
    assert executors["exec-train-op"]["container"]["image"] == f"{LOCATION}-docker.pkg.dev/p/ml/torch:abc1234"
    assert executors["exec-evaluate-op"]["container"]["image"] == f"{LOCATION}-docker.pkg.dev/p/ml/torch:abc1234"
