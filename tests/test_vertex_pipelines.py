"""The pipeline on Vertex AI Pipelines: the compiled YAML for `--target vertex`, and runs and schedules sent with
the real google-cloud-aiplatform clients (REST transport) to the local stand-in (tests/standins/vertex_api.py).

Nothing is mocked: `aiplatform_v1.PipelineServiceClient` and `ScheduleServiceClient` send real HTTP requests to
127.0.0.1 with anonymous credentials; a socket guard fails any test that would reach another host.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import re

import google.api_core.exceptions
import pytest
import yaml
from google.auth.credentials import AnonymousCredentials
from google.cloud import aiplatform_v1

from pipelines import config, training
from pipelines.backend import explain
from pipelines.vertexai import vertex, vertex_checks
from pipelines.vertexai.vertex import (
    PipelineJobFailed,
    ScheduleNotFound,
    VertexPermissionError,
    VertexPipelineError,
    VertexPipelines,
)
from tests.standins.vertex_api import VertexStandIn

PROJECT, PROJECT_NUMBER, LOCATION = "test-project", "123456789012", "us-central1"
ROOT = "gs://ml-pipelines-test/pipeline-root"
SA = "pipelines@test-project.iam.gserviceaccount.com"
PIPELINE = training.PIPELINE_NAME


pytestmark = pytest.mark.usefixtures("loopback_only")  # tests/conftest.py: fails a test that leaves this machine


@pytest.fixture(scope="module")
def packages(tmp_path_factory) -> dict[str, str]:
    """The project pipeline compiled for both targets."""
    out = tmp_path_factory.mktemp("compiled")
    return {target: training.compile_pipeline(str(out / f"{target}.yaml"), config.PipelineSettings(target=target))
            for target in config.TARGETS}


@pytest.fixture()
def vertex_package(packages) -> str:
    return packages["vertex"]


@pytest.fixture()
def standin():
    with VertexStandIn(project=PROJECT, project_number=PROJECT_NUMBER, location=LOCATION) as server:
        yield server


class FakeClock:
    def __init__(self):
        self.now = 0.0
        self.sleeps: list[float] = []

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds

    def monotonic(self) -> float:
        return self.now


@pytest.fixture()
def clock():
    return FakeClock()


def connect(standin: VertexStandIn, clock: FakeClock | None = None, **kwargs) -> VertexPipelines:
    clock = clock or FakeClock()
    return VertexPipelines(PROJECT, LOCATION, api_endpoint=standin.api_endpoint, credentials=AnonymousCredentials(),
                           sleep=clock.sleep, monotonic=clock.monotonic, **kwargs)


def load_documents(path: str) -> list[dict]:
    with open(path) as f:
        return [d for d in yaml.load_all(f, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader)) if d is not None]


def executor_resources(spec: dict, executor: str) -> dict:
    return spec["deploymentSpec"]["executors"][executor]["container"].get("resources", {})


# ---------------------------------------------------------------------------------------------- compile


def test_vertex_yaml_has_no_kubernetes_platform_config(packages):
    kfp_docs, vertex_docs = load_documents(packages["kfp"]), load_documents(packages["vertex"])
    assert any("platforms" in d for d in kfp_docs), "the kfp target carries the GKE node selectors"
    assert len(vertex_docs) == 1 and "platforms" not in vertex_docs[0]
    text = open(packages["vertex"]).read()
    # ("tolerations" stays in the text as an output name of the GPU-check step, which Vertex runs unused.)
    for word in ("nodeSelector", "kubernetes", config.ACCELERATOR_NODE_LABEL, config.GPU_RESOURCE):
        assert word not in text


def test_gpu_tasks_ask_for_vertex_accelerator_types(packages):
    (spec,) = load_documents(packages["vertex"])
    vertex_types = {a.name for a in aiplatform_v1.AcceleratorType}
    train = executor_resources(spec, "exec-train-op")["accelerator"]
    predict = executor_resources(spec, "exec-predict-op")["accelerator"]
    assert (train["resourceType"], train["resourceCount"]) == ("NVIDIA_TESLA_T4", "1")
    assert (predict["resourceType"], predict["resourceCount"]) == ("NVIDIA_H100_80GB", "1")
    assert {train["resourceType"], predict["resourceType"]} <= vertex_types
    for executor in ("exec-preprocess-op", "exec-augment-op", "exec-evaluate-op", "exec-register-op"):
        assert "accelerator" not in executor_resources(spec, executor)
    (kfp_spec, *_) = load_documents(packages["kfp"])
    assert executor_resources(kfp_spec, "exec-train-op")["accelerator"]["resourceType"] == config.GPU_RESOURCE


def test_accelerator_settings_reach_the_vertex_yaml(tmp_path):
    settings = config.PipelineSettings(target="vertex", train_accelerator="nvidia-l4", train_gpus=2,
                                       predict_accelerator="nvidia-tesla-t4", predict_gpus=0)
    (spec,) = load_documents(training.compile_pipeline(str(tmp_path / "p.yaml"), settings))
    train = executor_resources(spec, "exec-train-op")["accelerator"]
    assert (train["resourceType"], train["resourceCount"]) == ("NVIDIA_L4", "2")
    assert "accelerator" not in executor_resources(spec, "exec-predict-op")
    assert spec["deploymentSpec"]["executors"]["exec-predict-op"]["container"]["image"] == \
        config.Images.from_repo().gpu, "a CPU-only predict still runs the GPU image (same TensorFlow build)"


def test_everything_but_accelerators_matches_the_kfp_target(packages):
    def without_accelerators(path: str) -> dict:
        spec = load_documents(path)[0]
        for executor in spec["deploymentSpec"]["executors"].values():
            executor["container"].get("resources", {}).pop("accelerator", None)
        # On GKE the training GPU is placed per run (inputs from the GPU-check step, a shared GPU's share too); on
        # Vertex when compiling.
        train = spec["root"]["dag"]["tasks"]["train-op"]
        train["inputs"]["parameters"] = {k: v for k, v in train["inputs"]["parameters"].items()
                                         if not k.startswith("pipelinechannel--")
                                         and k not in ("accelerator_count", "accelerator_type", "shared_gpu")}
        train["dependentTasks"] = [t for t in train["dependentTasks"] if t != "placement-op"]
        # The GPU-check step knows what creates the training pod (a shared GPU's checks): the KFP driver or Vertex.
        spec["root"]["dag"]["tasks"]["placement-op"]["inputs"]["parameters"].pop("created_by")
        # On a KFP backend the data-heavy steps write by reference (components/dataio/datadir.py); Vertex mounts
        # artifacts.
        for task in spec["root"]["dag"]["tasks"].values():
            task.get("inputs", {}).get("parameters", {}).pop("by_reference", None)
        # On a KFP backend a step picks three steps' images per run (components/step_images.py): as it does for
        # TensorFlow, Vertex AI's compiled images.
        chooser = spec["root"]["dag"]["tasks"].pop("step-images-op", None)
        if chooser is not None:
            pinned = chooser["inputs"]["parameters"]["images"]["runtimeValue"]["constant"]
            spec["components"].pop("comp-step-images-op")
            spec["deploymentSpec"]["executors"].pop("exec-step-images-op")
            for task, image in (("train-op", "gpu"), ("evaluate-op", "cpu"), ("predict-op", "gpu")):
                spec["deploymentSpec"]["executors"][f"exec-{task}"]["container"]["image"] = pinned[image]
                chosen = spec["root"]["dag"]["tasks"][task]
                chosen["inputs"]["parameters"] = {k: v for k, v in chosen["inputs"]["parameters"].items()
                                                  if not k.startswith("pipelinechannel--step-images-op-")
                                                  and k != "base_image"}  # the image, as KFP passes it in
                chosen["dependentTasks"] = [t for t in chosen["dependentTasks"] if t != "step-images-op"]
        # On GKE the run chooses the framework; on Vertex AI it is fixed when compiling (the default here).
        if "framework" in spec["root"]["inputDefinitions"]["parameters"]:
            default = spec["root"]["inputDefinitions"]["parameters"].pop("framework")["defaultValue"]
            spec["root"]["dag"]["tasks"]["train-op"]["inputs"]["parameters"]["framework"] = {
                "runtimeValue": {"constant": default}}
        return spec

    assert without_accelerators(packages["vertex"]) == without_accelerators(packages["kfp"])


# ---------------------------------------------------------------------------------------------- runs


def test_submit_sends_the_compiled_spec_root_parameters_and_service_account(standin, vertex_package):
    params = vertex.vertex_run_parameters({"epochs": 3, "learning_rate": 1, "predict_images": "gs://b/imgs"},
                                          project=PROJECT, location=LOCATION)
    run = connect(standin).submit(vertex_package, pipeline_root=ROOT + "/", parameter_values=params,
                                  service_account=SA, labels={"team": "vision"})

    (call,) = standin.calls("CreatePipelineJob")
    assert call.path == f"/v1/projects/{PROJECT}/locations/{LOCATION}/pipelineJobs"
    job_id = call.query["pipelineJobId"][0]
    assert re.fullmatch(rf"{PIPELINE}-\d{{14}}", job_id)
    body = call.body
    assert body["pipelineSpec"] == load_documents(vertex_package)[0]
    assert body["runtimeConfig"]["gcsOutputDirectory"] == ROOT
    assert body["runtimeConfig"]["parameterValues"] == {
        "epochs": 3, "learning_rate": 1.0, "predict_images": "gs://b/imgs", "registry": "vertex",
        "project": PROJECT, "location": LOCATION}
    assert body["serviceAccount"] == SA
    assert body["displayName"] == PIPELINE
    assert body["labels"] == {"team": "vision"}

    assert run.name == f"projects/{PROJECT_NUMBER}/locations/{LOCATION}/pipelineJobs/{job_id}"
    assert run.state == "PIPELINE_STATE_PENDING" and not run.done
    assert run.console_url == (f"https://console.cloud.google.com/vertex-ai/locations/{LOCATION}/pipelines/runs/"
                               f"{job_id}?project={PROJECT}")


def test_wait_follows_the_run_to_success(standin, vertex_package, clock):
    standin.pipeline_polls = (2, 3)
    run = connect(standin, clock).submit(vertex_package, pipeline_root=ROOT, job_id="nightly-1", wait=True,
                                         poll_seconds=5)
    assert run.state == "PIPELINE_STATE_SUCCEEDED" and run.job_id == "nightly-1" and run.failed_tasks == ()
    assert len(standin.calls("GetPipelineJob")) == 5
    assert clock.sleeps == [5, 10, 20, 40], "polls back off, up to a minute apart"


def test_wait_raises_with_the_failed_task_and_console_page(standin, vertex_package):
    standin.fail_next_pipeline(task="train-op", message="The replica workerpool0-0 ran out of memory.")
    with pytest.raises(PipelineJobFailed) as failure:
        connect(standin).submit(vertex_package, pipeline_root=ROOT, job_id="failing-run", wait=True)
    message = str(failure.value)
    assert "failing-run ended FAILED" in message and "Failed tasks: train-op" in message
    assert "The DAG failed because some tasks failed" in message
    assert f"pipelines/runs/failing-run?project={PROJECT}" in message
    assert failure.value.run.failed_tasks == ("train-op",)
    assert failure.value.run.state == "PIPELINE_STATE_FAILED"


def test_wait_times_out_with_the_run_still_going(standin, vertex_package, clock):
    standin.pipeline_polls = (1, 1000)
    pipelines = connect(standin, clock)
    with pytest.raises(TimeoutError, match=r"still PIPELINE_STATE_RUNNING after 300s.*pipelines/runs/slow-run"):
        pipelines.submit(vertex_package, pipeline_root=ROOT, job_id="slow-run", wait=True, timeout_seconds=300)
    assert clock.now >= 300


def test_polling_survives_transient_server_errors(standin, vertex_package):
    run = connect(standin).submit(vertex_package, pipeline_root=ROOT, job_id="blip-run")
    standin.fail_next(503, count=2, rpc="GetPipelineJob")
    assert connect(standin).wait(run.name).state == "PIPELINE_STATE_SUCCEEDED"
    assert [c.status for c in standin.calls("GetPipelineJob")][:2] == [503, 503]


def test_caching_switches(standin, vertex_package):
    pipelines = connect(standin)
    pipelines.submit(vertex_package, pipeline_root=ROOT, job_id="fresh", enable_caching=False)
    pipelines.submit(vertex_package, pipeline_root=ROOT, job_id="cached", enable_caching=True)
    fresh, cached = (c.body["pipelineSpec"]["root"]["dag"]["tasks"] for c in standin.calls("CreatePipelineJob"))
    assert all(t["cachingOptions"] == {"enableCache": False} for t in fresh.values())
    assert cached["train-op"]["cachingOptions"] == {"enableCache": True}
    assert cached["evaluate-op"]["cachingOptions"] == {}, "evaluation reads the live champion: never cached"


@pytest.mark.parametrize("root", ["/tmp/pipeline-root", "s3://bucket/root", "gs://", "gs:///root", "", None])
def test_non_gcs_pipeline_root_is_refused_before_any_request(standin, vertex_package, root):
    with pytest.raises(ValueError, match="gs://"):
        connect(standin).submit(vertex_package, pipeline_root=root)
    assert standin.requests == []


@pytest.mark.parametrize("params, error", [
    ({"epoch": 3}, r"Unknown pipeline parameter\(s\) \['epoch'\]"),
    ({"epochs": "3"}, "epochs is NUMBER_INTEGER"),
    ({"epochs": 2.5}, "epochs is NUMBER_INTEGER"),
    ({"min_accuracy": True}, "min_accuracy is NUMBER_DOUBLE"),
])
def test_bad_parameters_are_refused_before_any_request(standin, vertex_package, params, error):
    with pytest.raises(ValueError, match=error):
        connect(standin).submit(vertex_package, pipeline_root=ROOT, parameter_values=params)
    assert standin.requests == []


def test_bad_service_account_and_kfp_target_yaml_are_refused_before_any_request(standin, packages):
    pipelines = connect(standin)
    with pytest.raises(ValueError, match="service account must be an email"):
        pipelines.submit(packages["vertex"], pipeline_root=ROOT, service_account="pipelines")
    with pytest.raises(ValueError, match=r"Kubernetes platform config.*--target vertex"):
        pipelines.submit(packages["kfp"], pipeline_root=ROOT)
    with pytest.raises(ValueError, match="No compiled pipeline at"):
        pipelines.submit("/nonexistent/pipeline.yaml", pipeline_root=ROOT)
    assert standin.requests == []


def test_gke_accelerator_names_are_refused(standin, vertex_package, tmp_path):
    (spec,) = load_documents(vertex_package)
    spec["deploymentSpec"]["executors"]["exec-train-op"]["container"]["resources"]["accelerator"]["resourceType"] = \
        "nvidia.com/gpu"
    path = tmp_path / "hand-edited.yaml"
    path.write_text(yaml.safe_dump(spec))
    with pytest.raises(ValueError, match=r"exec-train-op .* 'nvidia.com/gpu'.*not a Vertex AI accelerator"):
        connect(standin).submit(str(path), pipeline_root=ROOT)
    assert standin.requests == []


def test_local_registry_is_refused_for_vertex_runs():
    assert vertex.vertex_run_parameters({}, project=PROJECT, location=LOCATION) == {
        "registry": "vertex", "project": PROJECT, "location": LOCATION}
    assert vertex.vertex_run_parameters({"location": "europe-west4"}, project=PROJECT, location=LOCATION)[
        "location"] == "europe-west4"
    with pytest.raises(ValueError, match="registry=local.*--registry vertex"):
        vertex.vertex_run_parameters({"registry": "local"}, project=PROJECT, location=LOCATION)


# ---------------------------------------------------------------------------------------------- torch and JAX


TORCH_IMAGE = "us-docker.pkg.dev/test-project/images/torch@sha256:" + "ab" * 32


@pytest.fixture(scope="module")
def framework_packages(tmp_path_factory) -> dict[str, str]:
    """The pipeline compiled for Vertex AI with each framework fixed, the PyTorch image pinned by digest."""
    out = tmp_path_factory.mktemp("frameworks")
    images = dataclasses.replace(config.Images.from_repo(), torch=TORCH_IMAGE)
    return {framework: training.compile_pipeline(str(out / f"{framework}.yaml"), config.PipelineSettings(
        images=images, target="vertex", framework=framework)) for framework in ("torch", "jax")}


@pytest.mark.parametrize("framework", ["torch", "jax"])
def test_torch_and_jax_train_evaluate_and_predict_in_the_pytorch_image_on_vertex(framework_packages, packages,
                                                                                 framework):
    (spec,) = load_documents(framework_packages[framework])
    executors = spec["deploymentSpec"]["executors"]
    for step in ("train-op", "evaluate-op", "predict-op"):
        assert executors[f"exec-{step}"]["container"]["image"] == TORCH_IMAGE, step
    for step in ("preprocess-op", "augment-op", "placement-op", "register-op"):
        assert executors[f"exec-{step}"]["container"]["image"] == config.Images.from_repo().cpu, step
    # The GPUs are Vertex AI's accelerator types, as on TensorFlow; no image is taken from a step's output.
    assert executor_resources(spec, "exec-train-op")["accelerator"]["resourceType"] == "NVIDIA_TESLA_T4"
    assert executor_resources(spec, "exec-predict-op")["accelerator"]["resourceType"] == "NVIDIA_H100_80GB"
    assert "step-images-op" not in spec["root"]["dag"]["tasks"]
    # The framework is no run parameter: training receives the compiled one.
    assert "framework" not in vertex_checks.pipeline_parameters(spec)
    assert spec["root"]["dag"]["tasks"]["train-op"]["inputs"]["parameters"]["framework"] == {
        "runtimeValue": {"constant": framework}}
    assert vertex_checks.compiled_framework(spec) == framework
    assert vertex_checks.compiled_framework(load_documents(packages["vertex"])[0]) == "tensorflow"
    assert vertex_checks.compiled_framework(load_documents(packages["kfp"])[0]) == ""


def test_explain_shows_the_pytorch_image_on_train_evaluate_and_predict(framework_packages):
    report = explain.explain(framework_packages["torch"], {})
    images = {step["task"]: step.get("image") for step in report["steps"]}
    assert {images[t] for t in ("train-op", "evaluate-op", "predict-op")} == {TORCH_IMAGE}
    assert images["preprocess-op"] == config.Images.from_repo().cpu
    assert not [step for step in report["steps"] if "fails" in step]


def test_no_vertex_pipeline_compiles_torch_without_the_pytorch_image(tmp_path):
    images = dataclasses.replace(config.Images.from_repo(), torch="")
    with pytest.raises(ValueError, match="framework torch trains, evaluates and predicts in the PyTorch image .* "
                                         "compile it with --torch-image"):
        training.compile_pipeline(str(tmp_path / "p.yaml"), config.PipelineSettings(
            images=images, target="vertex", framework="torch"))
    with pytest.raises(ValueError, match="On a KFP backend the framework is chosen per run"):
        config.PipelineSettings(target="kfp", framework="torch")


def test_a_run_parameter_contradicting_the_compiled_framework_is_refused_before_any_request(
        standin, framework_packages, vertex_package):
    pipelines = connect(standin)
    with pytest.raises(ValueError, match=r"compiled for Vertex AI with framework torch .* framework=tensorflow "
                                         r"cannot apply .*`pipectl compile --target vertex --framework tensorflow`"):
        pipelines.submit(framework_packages["torch"], pipeline_root=ROOT, parameter_values={"framework": "tensorflow"})
    with pytest.raises(ValueError, match=r"compiled for Vertex AI with framework tensorflow .* framework=jax"):
        pipelines.submit(vertex_package, pipeline_root=ROOT, parameter_values={"framework": "jax"})
    assert standin.requests == []
    # The one it was compiled for says nothing new: it is not sent, and the run trains on it.
    pipelines.submit(framework_packages["torch"], pipeline_root=ROOT, parameter_values={"framework": "torch"})
    (call,) = standin.calls("CreatePipelineJob")
    assert "framework" not in call.body["runtimeConfig"].get("parameterValues", {})
    assert call.body["pipelineSpec"] == load_documents(framework_packages["torch"])[0]


def test_vertex_ai_itself_refuses_a_framework_parameter_sent_past_pipectl(standin, framework_packages):
    """A run started without pipectl's check cannot set the framework and have it ignored: the Vertex AI SDK's
    PipelineJob refuses an undeclared parameter (google-cloud-aiplatform 1.165.1,
    google/cloud/aiplatform/utils/pipeline_utils.py:240-243; run here, it sends nothing), and so does the API as
    the stand-in models it."""
    from google.cloud import aiplatform

    with pytest.raises(ValueError, match="The pipeline parameter framework is not found in the pipeline job input "
                                         "definitions"):
        aiplatform.PipelineJob(display_name=PIPELINE, template_path=framework_packages["torch"], pipeline_root=ROOT,
                               parameter_values={"framework": "tensorflow"}, project=PROJECT, location=LOCATION,
                               credentials=AnonymousCredentials())
    (spec,) = load_documents(framework_packages["torch"])
    job = aiplatform_v1.PipelineJob(display_name=PIPELINE, pipeline_spec=spec,
                                    runtime_config=aiplatform_v1.PipelineJob.RuntimeConfig(
                                        gcs_output_directory=ROOT, parameter_values={"framework": "tensorflow"}))
    with pytest.raises(google.api_core.exceptions.BadRequest, match="parameter framework is not found"):
        connect(standin).pipeline_client.create_pipeline_job(
            parent=f"projects/{PROJECT}/locations/{LOCATION}", pipeline_job=job)


def test_permission_denied_names_the_roles(standin, vertex_package):
    standin.fail_next(403, rpc="CreatePipelineJob")
    with pytest.raises(VertexPermissionError) as denied:
        connect(standin).submit(vertex_package, pipeline_root=ROOT, service_account=SA)
    message = str(denied.value)
    assert "roles/aiplatform.user" in message and "aiplatform.pipelineJobs.create" in message
    assert "roles/iam.serviceAccountUser on that service account" in message


def test_act_as_refusal_names_service_account_user_and_the_command(standin, vertex_package):
    standin.deny_act_as(SA)
    with pytest.raises(VertexPermissionError) as denied:
        connect(standin).submit(vertex_package, pipeline_root=ROOT, service_account=SA)
    message = str(denied.value)
    assert f"gcloud iam service-accounts add-iam-policy-binding {SA}" in message
    assert "--role=roles/iam.serviceAccountUser" in message
    assert standin.pipeline_jobs() == []


def test_quota_refusals_are_retried(standin, vertex_package, clock):
    standin.fail_next(429, count=2, rpc="CreatePipelineJob")
    draws = []
    run = connect(standin, clock, uniform=lambda low, high: draws.append((low, high)) or high / 2).submit(
        vertex_package, pipeline_root=ROOT, job_id="after-quota")
    # each wait is the jitter's draw under a ceiling doubling from 2 s (here the draw is half of it)
    assert run.job_id == "after-quota" and draws == [(0.0, 2.0), (0.0, 4.0)] and clock.sleeps == [1.0, 2.0]
    assert len(standin.pipeline_jobs()) == 1


def test_taken_job_id_and_foreign_endpoint(standin, vertex_package):
    pipelines = connect(standin)
    pipelines.submit(vertex_package, pipeline_root=ROOT, job_id="same-id")
    with pytest.raises(VertexPipelineError, match="already exists.*Pick another id"):
        pipelines.submit(vertex_package, pipeline_root=ROOT, job_id="same-id")
    with pytest.raises(ValueError, match="serves region europe-west4"):
        VertexPipelines(PROJECT, LOCATION, api_endpoint="europe-west4-aiplatform.googleapis.com")
    with pytest.raises(ValueError, match="region such as us-central1"):
        VertexPipelines(PROJECT, "global")


def test_job_ids_stay_under_128_characters(standin, vertex_package, tmp_path):
    """Vertex AI takes a pipeline_job_id of less than 128 characters (pipeline_service.proto:357-359): a long
    pipeline name is cut so that the generated id fits, and a 128-character id is refused before it is sent."""
    documents = load_documents(vertex_package)
    documents[0]["pipelineInfo"]["name"] = "image-classification-" + "x" * 200
    long_named = tmp_path / "long.yaml"
    long_named.write_text(yaml.safe_dump_all(documents))
    run = connect(standin).submit(str(long_named), pipeline_root=ROOT)
    assert len(run.job_id) == 127 and re.fullmatch(r"image-classification-x+-\d{14}", run.job_id)

    too_long = "a" * 128
    with pytest.raises(ValueError, match="at most 127 characters"):
        connect(standin).submit(vertex_package, pipeline_root=ROOT, job_id=too_long)
    assert len(standin.calls("CreatePipelineJob")) == 1
    # The stand-in refuses it as the service does, when a client skips the check.
    client = aiplatform_v1.PipelineServiceClient(
        credentials=AnonymousCredentials(), transport="rest", client_options={"api_endpoint": standin.api_endpoint})
    job = aiplatform_v1.PipelineJob(pipeline_spec=documents[0], runtime_config={"gcs_output_directory": ROOT})
    with pytest.raises(google.api_core.exceptions.BadRequest, match="less than 128 characters"):
        client.create_pipeline_job(parent=f"projects/{PROJECT}/locations/{LOCATION}", pipeline_job=job,
                                   pipeline_job_id=too_long)
    assert len(standin.pipeline_jobs()) == 1


# ---------------------------------------------------------------------------------------------- schedules


def test_schedule_creates_one_schedule_per_pipeline_name(standin, vertex_package):
    info = connect(standin).schedule(vertex_package, cron="TZ=Europe/Berlin 0 3 * * MON-FRI", pipeline_root=ROOT,
                                     parameter_values={"epochs": 20}, service_account=SA)
    (stored,) = standin.schedules()
    assert info.action == "created" and info.name == stored["name"] and info.state == "ACTIVE"
    assert info.display_name == stored["displayName"] == PIPELINE
    assert stored["cron"] == "TZ=Europe/Berlin 0 3 * * MON-FRI"
    assert stored["maxConcurrentRunCount"] == "1"
    request = stored["createPipelineJobRequest"]
    assert request["parent"] == f"projects/{PROJECT}/locations/{LOCATION}"
    assert request["pipelineJob"]["pipelineSpec"] == load_documents(vertex_package)[0]
    assert request["pipelineJob"]["runtimeConfig"] == {"gcsOutputDirectory": ROOT, "parameterValues": {"epochs": 20}}
    assert request["pipelineJob"]["serviceAccount"] == SA
    next_run = _dt.datetime.fromisoformat(info.next_run_time.replace("Z", "+00:00"))
    assert next_run.astimezone(_dt.timezone(_dt.timedelta(hours=0))).minute == 0
    assert next_run.weekday() < 5 and next_run.hour in (1, 2), "03:00 in Berlin is 01:00 or 02:00 UTC"
    assert info.console_url.endswith(f"/pipelines/schedules/{info.name.rsplit('/', 1)[-1]}?project={PROJECT}")


def test_updating_a_schedule_leaves_exactly_one(standin, vertex_package):
    pipelines = connect(standin)
    first = pipelines.schedule(vertex_package, cron="0 3 * * *", pipeline_root=ROOT, parameter_values={"epochs": 5})
    second = pipelines.schedule(vertex_package, cron="30 4 * * SUN", pipeline_root=ROOT + "/v2",
                                parameter_values={"epochs": 30}, max_concurrent_run_count=2, allow_queueing=True)

    assert second.action == "updated" and second.name == first.name and second.removed == ()
    (stored,) = standin.schedules()
    assert stored["cron"] == "30 4 * * SUN" and stored["maxConcurrentRunCount"] == "2" and stored["allowQueueing"]
    (update,) = standin.calls("UpdateSchedule")
    assert update.method == "PATCH"
    assert set(update.query["updateMask"][0].split(",")) == {
        "cron", "maxConcurrentRunCount", "allowQueueing", "createPipelineJobRequest"}
    assert len(standin.calls("CreateSchedule")) == 1
    job = standin.trigger_schedule(stored["name"])
    assert job["runtimeConfig"] == {"gcsOutputDirectory": ROOT + "/v2", "parameterValues": {"epochs": 30}}
    assert job["scheduleName"] == stored["name"]


def test_updating_a_paused_schedule_keeps_it_paused(standin, vertex_package):
    pipelines = connect(standin)
    pipelines.schedule(vertex_package, cron="0 3 * * *", pipeline_root=ROOT)
    pipelines.pause(PIPELINE)
    info = pipelines.schedule(vertex_package, cron="0 5 * * *", pipeline_root=ROOT)
    assert (info.action, info.state, info.cron) == ("updated", "PAUSED", "0 5 * * *")


@pytest.mark.parametrize("refusal", ["Updating create_pipeline_job_request of a schedule is not supported.",
                                     "Request contains an invalid argument."])
def test_schedule_is_replaced_when_the_api_will_not_change_its_pipeline(vertex_package, refusal):
    """The refusal is told by its status (INVALID_ARGUMENT), whatever its text says."""
    with VertexStandIn(project=PROJECT, project_number=PROJECT_NUMBER, location=LOCATION,
                       schedule_request_updatable=False) as standin:
        standin.schedule_request_refusal = refusal
        pipelines = connect(standin)
        first = pipelines.schedule(vertex_package, cron="0 3 * * *", pipeline_root=ROOT,
                                   parameter_values={"epochs": 5})
        second = pipelines.schedule(vertex_package, cron="0 6 * * *", pipeline_root=ROOT,
                                    parameter_values={"epochs": 7})
        (stored,) = standin.schedules()
        assert second.action == "replaced" and second.removed == (first.name,) and stored["name"] == second.name
        assert stored["createPipelineJobRequest"]["pipelineJob"]["runtimeConfig"]["parameterValues"] == {"epochs": 7}
        rpcs = [r.rpc for r in standin.requests if r.rpc in ("UpdateSchedule", "PauseSchedule", "CreateSchedule",
                                                             "DeleteSchedule")]
        assert rpcs == ["CreateSchedule", "UpdateSchedule", "PauseSchedule", "CreateSchedule", "DeleteSchedule"], \
            "the old schedule is paused before the new one exists, so they never run side by side"


def test_a_refused_replacement_resumes_the_old_schedule(vertex_package):
    with VertexStandIn(project=PROJECT, project_number=PROJECT_NUMBER, location=LOCATION,
                       schedule_request_updatable=False) as standin:
        pipelines = connect(standin)
        first = pipelines.schedule(vertex_package, cron="0 3 * * *", pipeline_root=ROOT, service_account=SA)
        standin.deny_act_as(SA)
        with pytest.raises(VertexPermissionError, match="actAs"):
            pipelines.schedule(vertex_package, cron="0 6 * * *", pipeline_root=ROOT, service_account=SA)
        (stored,) = standin.schedules()
        assert (stored["name"], stored["state"], stored["cron"]) == (first.name, "ACTIVE", "0 3 * * *")
        assert [r.rpc for r in standin.requests][-2:] == ["CreateSchedule", "ResumeSchedule"]


def test_hand_made_duplicates_are_folded_into_one(standin, vertex_package):
    pipelines = connect(standin)
    for cron in ("0 1 * * *", "0 2 * * *"):  # two schedules of the same name, made outside pipectl
        job = pipelines.pipeline_job(vertex_package, pipeline_root=ROOT)
        pipelines.schedule_client.create_schedule(parent=pipelines.parent, schedule=aiplatform_v1.Schedule(
            display_name=PIPELINE, cron=cron, max_concurrent_run_count=1,
            create_pipeline_job_request=aiplatform_v1.CreatePipelineJobRequest(parent=pipelines.parent,
                                                                               pipeline_job=job)))
    oldest, newer = (s["name"] for s in standin.schedules())
    info = pipelines.schedule(vertex_package, cron="0 3 * * *", pipeline_root=ROOT)
    assert (info.action, info.name, info.removed) == ("updated", oldest, (newer,))
    assert [s["name"] for s in standin.schedules()] == [oldest]


def test_pause_resume_delete_by_name(standin, vertex_package):
    pipelines = connect(standin)
    created = pipelines.schedule(vertex_package, cron="0 3 * * *", pipeline_root=ROOT)

    (paused,) = pipelines.pause(PIPELINE)
    assert (paused.action, paused.state) == ("paused", "PAUSED")
    assert pipelines.pause(PIPELINE)[0].action == "unchanged", "pausing twice is not an error"
    with pytest.raises(ValueError, match="only an ACTIVE schedule starts runs"):
        standin.trigger_schedule(created.name)

    (resumed,) = pipelines.resume(PIPELINE, catch_up=True)
    assert (resumed.action, resumed.state) == ("resumed", "ACTIVE")
    assert standin.calls("ResumeSchedule")[0].body == {"catchUp": True}

    (deleted,) = pipelines.delete(PIPELINE)
    assert deleted.action == "deleted" and standin.schedules() == []
    with pytest.raises(ScheduleNotFound, match="No Vertex AI schedule named 'image-classification'"):
        pipelines.pause(PIPELINE)


def test_schedule_functions_take_a_custom_name(standin, vertex_package):
    common = dict(project=PROJECT, location=LOCATION, api_endpoint=standin.api_endpoint,
                  credentials=AnonymousCredentials())
    info = vertex.schedule_pipeline_job(vertex_package, name="nightly-retrain", cron="0 2 * * *",
                                        pipeline_root=ROOT, **common)
    assert info.display_name == "nightly-retrain"
    assert standin.schedules()[0]["createPipelineJobRequest"]["pipelineJob"]["displayName"] == "nightly-retrain"
    assert vertex.pause_schedule("nightly-retrain", **common)[0].state == "PAUSED"
    assert vertex.resume_schedule("nightly-retrain", **common)[0].state == "ACTIVE"
    assert vertex.delete_schedule("nightly-retrain", **common)[0].action == "deleted"
    run = vertex.submit_pipeline_job(vertex_package, pipeline_root=ROOT, job_id="fn-run", wait=True,
                                     sleep=lambda s: None, **common)
    assert run.state == "PIPELINE_STATE_SUCCEEDED"


@pytest.mark.parametrize("cron", ["0 3 * *", "0 3 * * * *", "@daily", "61 * * * *", "0 24 * * *", "0 3 0 * *",
                                  "0 3 * 13 *", "0 3 * * 8", "*/0 * * * *", "0 5-1 * * *", "TZ=Mars/Olympus 0 3 * * *",
                                  "0 3 * * FUNDAY", "", "0 0 31 2 *", "0 0 30-31 FEB *", "0 0 31 4,6,9,11 *"])
def test_bad_cron_is_refused_before_any_request(standin, vertex_package, cron):
    with pytest.raises(ValueError, match="cron|time zone"):
        connect(standin).schedule(vertex_package, cron=cron, pipeline_root=ROOT)
    assert standin.requests == []


@pytest.mark.parametrize("cron", ["*/15 * * * *", "0 0 1 JAN *", "TZ=America/New_York 0 3 * * MON-FRI",
                                  "CRON_TZ=Asia/Tokyo 30 6 1,15 * *", "0 9-17/2 * * 1-5", "0 0 * * 7",
                                  "0 0 29 2 *", "0 0 31 2/2 *", "0 0 31 2 MON"])  # leap days; Dec 31; Mondays
def test_good_cron_is_accepted_by_us_and_the_api(standin, vertex_package, cron):
    info = connect(standin).schedule(vertex_package, cron=cron, pipeline_root=ROOT)
    assert info.cron == cron and info.next_run_time


def test_schedule_with_a_non_gcs_root_sends_nothing(standin, vertex_package):
    with pytest.raises(ValueError, match="gs://"):
        connect(standin).schedule(vertex_package, cron="0 3 * * *", pipeline_root="/mnt/pipeline-root")
    assert standin.requests == []
