"""The stand-ins themselves: the shared base (tests/standins/base.py: loopback only, routes, one request log,
scripted failures, streamed answers, the clock), each API's error shape through its real client, and Vertex AI
batch prediction, which runs the jobs it is given."""

from __future__ import annotations

import http.client
import json
import threading
import urllib.error
import urllib.request

import pytest

from tests.standins.base import (
    ApiError,
    StandIn,
    Stream,
    google_error,
    grpc_gateway_error,
    kubernetes_status,
    rfc3339,
    route,
)
from tests.conftest import vertex_client
from tests.standins.vertex_api import VertexStandIn


class Things(StandIn):
    """A tiny API: things by id, created by POST; a log that streams until released."""

    name = "things"

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.things: dict[str, dict] = {}
        self.release = threading.Event()

    def routes(self):
        return [
            route("POST", r"/v1/things", "CreateThing", self.create),
            route("GET", r"/v1/things/(?P<thing>[^/:]+)", "GetThing", self.get),
            route("GET", r"/v1/things/(?P<thing>[^/:]+)/log", "ReadLog", self.log),
            route("GET", r"/v1/broken", "Broken", lambda request: 1 / 0),
        ]

    def create(self, request):
        body = request.json()
        if not body.get("name"):
            raise ApiError("INVALID_ARGUMENT", "thing.name is required.")
        self.things[body["name"]] = {**body, "createTime": self.now()}
        return 201, self.things[body["name"]]

    def get(self, request):
        if request.params["thing"] not in self.things:
            raise ApiError("NOT_FOUND", f"Thing {request.params['thing']} does not exist.")
        return self.things[request.params["thing"]]

    def log(self, request):
        def chunks():
            yield b"first line\n"
            self.release.wait(30)
            yield b"second line\n"

        return Stream(chunks())


def call(url: str, method: str = "GET", body: bytes | None = None, headers: dict | None = None):
    req = urllib.request.Request(url, data=body, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=30) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def test_only_loopback_is_served():
    for host in ("0.0.0.0", "localhost", "::", "192.168.1.10"):
        with pytest.raises(ValueError, match="127.0.0.1 only"):
            Things(host=host)
    with Things() as api:
        assert api.url.startswith("http://127.0.0.1:")


def test_routes_answers_and_the_request_log():
    ticks = iter([1_767_225_600.25])
    with Things(clock=lambda: next(ticks)) as api:
        assert call(api.url + "/v1/things", "POST", b'{"name": "a b"}', {"Content-Type": "application/json",
                                                                         "X-Trace": "t1"}) == \
            (201, {"name": "a b", "createTime": "2026-01-01T00:00:00.250000Z"})
        assert call(api.url + "/v1/things/a%20b?view=FULL&view=BASIC&empty=") == \
            (200, {"name": "a b", "createTime": "2026-01-01T00:00:00.250000Z"})
        assert call(api.url + "/v1/things/zz") == \
            (404, {"error": {"code": 404, "message": "Thing zz does not exist.", "status": "NOT_FOUND"}})
        assert call(api.url + "/v1/things", "POST", b"[1]")[0] == 400
        assert call(api.url + "/v1/nothing")[0] == 404
        status, body = call(api.url + "/v1/broken")
        assert status == 500 and "ZeroDivisionError" in body["error"]["message"]

    create, get, missing, bad, unknown, broken = api.requests
    assert (create.method, create.path, create.rpc, create.status) == ("POST", "/v1/things", "CreateThing", 201)
    assert create.headers["x-trace"] == "t1" and create.raw == b'{"name": "a b"}' and create.body == {"name": "a b"}
    assert (get.path, get.rpc, get.params, get.status) == ("/v1/things/a b", "GetThing", {"thing": "a b"}, 200)
    assert get.query == {"view": ["FULL", "BASIC"], "empty": [""]} and get.arg("view") == "FULL" and get.body is None
    assert (missing.status, bad.status, bad.body) == (404, 400, [1])
    assert (unknown.rpc, unknown.status, broken.status) == ("", 404, 500)
    assert api.calls("GetThing") == [get, missing]
    assert api.requests_to("GET", "/v1/things/", prefix=True) == [get, missing]


def test_scripted_failures_name_the_method_and_count_down():
    with Things() as api:
        api.fail_next(429, count=2, rpc="GetThing")
        api.fail_next("PERMISSION_DENIED", message="no", details=[{"reason": "IAM_PERMISSION_DENIED"}])
        with pytest.raises(ValueError, match="no API method 'GetThings'"):
            api.fail_next(500, rpc="GetThings")
        assert call(api.url + "/v1/things", "POST", b'{"name": "a"}') == \
            (403, {"error": {"code": 403, "message": "no", "status": "PERMISSION_DENIED",
                             "details": [{"reason": "IAM_PERMISSION_DENIED"}]}})
        assert call(api.url + "/v1/things/a")[1]["error"]["status"] == "RESOURCE_EXHAUSTED"
        assert call(api.url + "/v1/things/a")[1]["error"]["message"] == "Scripted RESOURCE_EXHAUSTED error."
        assert call(api.url + "/v1/things/a")[0] == 404  # the scripted ones are used up; "a" was never created
    assert [r.status for r in api.requests] == [403, 429, 429, 404]


def test_each_api_error_shape():
    error = ApiError("ALREADY_EXISTS", "taken", [{"x": 1}])
    assert error.code == 6 and error.http_status == 409
    assert google_error(error) == {"error": {"code": 409, "message": "taken", "status": "ALREADY_EXISTS",
                                             "details": [{"x": 1}]}}
    assert grpc_gateway_error(error) == {"code": 6, "message": "taken", "details": [{"x": 1}]}
    assert kubernetes_status(error) == {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                                        "message": "taken", "reason": "AlreadyExists", "code": 409}
    invalid = ApiError("INVALID_ARGUMENT", "bad", http_status=422)
    assert kubernetes_status(invalid)["reason"] == "Invalid" and kubernetes_status(invalid)["code"] == 422
    with pytest.raises(ValueError, match="unknown google.rpc.Code"):
        ApiError("NOT_A_CODE", "x")


def test_a_stream_is_sent_as_it_comes_and_outside_the_lock():
    with Things() as api:
        api.things["a"] = {"name": "a"}
        connection = http.client.HTTPConnection("127.0.0.1", int(api.url.rsplit(":", 1)[1]), timeout=30)
        connection.request("GET", "/v1/things/a/log")
        answer = connection.getresponse()
        assert answer.status == 200 and answer.getheader("Transfer-Encoding") == "chunked"
        assert answer.readline() == b"first line\n"
        assert call(api.url + "/v1/things/a")[0] == 200  # other calls go on while the log is open
        api.release.set()
        assert answer.read() == b"second line\n"
        connection.close()


def test_wait_for_and_the_clock():
    with Things() as api:
        api.wait_for(lambda: True)
        with pytest.raises(TimeoutError, match="condition not reached in the things stand-in within 0.1s"):
            api.wait_for(lambda: False, timeout=0.1)
    assert rfc3339(1_767_225_600.5, 0) == "2026-01-01T00:00:00Z"
    assert rfc3339(1_767_225_600.5) == "2026-01-01T00:00:00.500000Z"
    assert rfc3339(1_767_225_600.5, 9) == "2026-01-01T00:00:00.500000000Z"
    assert rfc3339(1_767_225_600.5, 9, trim=True) == "2026-01-01T00:00:00.5Z"
    assert rfc3339(1_767_225_600, 6, trim=True) == "2026-01-01T00:00:00Z"


# ---------------------------------------------------------------------------------------------- each API's shape


def test_kfp_scripted_failures_use_grpc_gateway_and_upload_error_bodies(kfp_api, tmp_path):
    import kfp
    from kfp_server_api.exceptions import ApiException

    client = kfp.Client(host=kfp_api.url)
    kfp_api.fail_next(503, rpc="ListPipelines")
    with pytest.raises(ApiException) as listed:
        client.list_pipelines()
    assert listed.value.status == 503
    assert json.loads(listed.value.body) == {"code": 14, "message": "Scripted UNAVAILABLE error.", "details": []}

    package = tmp_path / "p.yaml"
    package.write_text("pipelineInfo: {name: p}\nroot: {dag: {tasks: {}}}\nschemaVersion: 2.1.0\n")
    kfp_api.fail_next("ALREADY_EXISTS", rpc="UploadPipeline", message="Failed to create a pipeline")
    with pytest.raises(ApiException) as uploaded:
        client.upload_pipeline(str(package), pipeline_name="p")
    assert uploaded.value.status == 409
    assert json.loads(uploaded.value.body) == {"error_message": "Failed to create a pipeline",
                                               "error_details": "Failed to create a pipeline"}
    assert [r.rpc for r in kfp_api.requests if r.status >= 400] == ["ListPipelines", "UploadPipeline"]


def test_kubernetes_errors_are_status_objects():
    from kubernetes import client

    from tests.standins.k8s_api import KubernetesStandIn

    with KubernetesStandIn(run_containers=False) as k8s:
        configuration = client.Configuration()
        configuration.host = k8s.url
        api = client.CustomObjectsApi(client.ApiClient(configuration))
        k8s.fail_next(409, rpc="createKubeflowOrgV1NamespacedTFJob", message='tfjobs.kubeflow.org "t" already exists')
        with pytest.raises(client.ApiException) as created:
            api.create_namespaced_custom_object("kubeflow.org", "v1", "ml", "tfjobs", {"metadata": {"name": "t"}})
        with pytest.raises(client.ApiException) as read:
            api.get_namespaced_custom_object("kubeflow.org", "v1", "ml", "tfjobs", "t")
    assert created.value.status == 409 and json.loads(created.value.body) == {
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": 'tfjobs.kubeflow.org "t" already exists', "reason": "AlreadyExists", "code": 409}
    assert read.value.status == 404 and json.loads(read.value.body)["reason"] == "NotFound"


# ---------------------------------------------------------------------------------------------- Vertex AI batch

PROJECT, LOCATION = "test-project", "us-central1"
PARENT = f"projects/{PROJECT}/locations/{LOCATION}"


def batch_job(model: str, **overrides):
    from google.cloud import aiplatform_v1

    fields = dict(display_name="predict", model=model,
                  input_config={"instances_format": "jsonl", "gcs_source": {"uris": ["gs://b/in.jsonl"]}},
                  instance_config={"key_field": "id"},
                  output_config={"predictions_format": "jsonl", "gcs_destination": {"output_uri_prefix": "gs://b/out"}},
                  dedicated_resources={"machine_spec": {"machine_type": "n1-standard-2"}, "starting_replica_count": 1})
    return aiplatform_v1.BatchPredictionJob(**{**fields, **overrides})


def summing_server(instances: list) -> list:
    """A model server: the sum of each instance's `x`; it refuses an instance whose `x` is not a list."""
    for instance in instances:
        if not isinstance(instance.get("x"), list):
            raise ValueError(f"x must be a list, not {instance.get('x')!r}")
    return [sum(instance["x"]) for instance in instances]


@pytest.fixture
def gcs(tmp_path):
    (tmp_path / "gcs" / "b").mkdir(parents=True)
    (tmp_path / "gcs" / "b" / "in.jsonl").write_text('{"id": "a", "x": [1, 2]}\n{"id": "b", "x": [3]}\n'
                                                    '{"id": "c", "x": "three"}\n')
    return tmp_path / "gcs"


def test_vertex_batch_prediction_of_a_registered_model_runs_to_success(gcs):
    """A model uploaded to the Model Registry and named by an alias: the job resolves the version, sends the
    instances to the model server and writes the results where the service does."""
    from google.cloud import aiplatform_v1

    with VertexStandIn(storage_root=str(gcs), serve=summing_server) as vertex:
        models, jobs = vertex_client(vertex.api_endpoint, "ModelServiceClient"), vertex_client(vertex.api_endpoint)
        uploaded = models.upload_model(request=aiplatform_v1.UploadModelRequest(
            parent=PARENT, model_id="image-classifier", model=aiplatform_v1.Model(
                display_name="image-classifier", artifact_uri="gs://b/model",
                container_spec={"image_uri": "us-docker.pkg.dev/vertex-ai/prediction/tf2-cpu.2-15:latest"}))).result()
        models.merge_version_aliases(name=f"{uploaded.model}@{uploaded.model_version_id}",
                                     version_aliases=["champion"])
        model = f"{PARENT}/models/image-classifier@champion"
        job = jobs.create_batch_prediction_job(parent=PARENT, batch_prediction_job=batch_job(model))
        states = [job.state]
        while job.state not in (aiplatform_v1.JobState.JOB_STATE_SUCCEEDED, aiplatform_v1.JobState.JOB_STATE_FAILED):
            job = jobs.get_batch_prediction_job(name=job.name)
            states.append(job.state)
    assert states == [aiplatform_v1.JobState.JOB_STATE_PENDING, aiplatform_v1.JobState.JOB_STATE_RUNNING,
                      aiplatform_v1.JobState.JOB_STATE_SUCCEEDED]
    assert job.model_version_id == "1"
    directory = job.output_info.gcs_output_directory
    assert directory.startswith("gs://b/out/prediction-image-classifier-")  # the model's display name
    with open(gcs / directory[len("gs://"):] / "prediction.results-00000-of-00001") as f:
        rows = [json.loads(line) for line in f]
    assert rows == [{"key": "a", "prediction": 3}, {"key": "b", "prediction": 3}]
    # The refused instance is only counted, per message, as for a custom-trained model.
    with open(gcs / directory[len("gs://"):] / "prediction.errors_stats-00000-of-00001") as f:
        assert f.read() == repr(("Post request fails. Cannot get predictions. Error: x must be a list, not 'three'",
                                 1)) + "\n"
    assert (job.completion_stats.successful_count, job.completion_stats.failed_count) == (2, 1)


def test_vertex_batch_prediction_refusals_failures_and_cancel(gcs):
    from google.api_core import exceptions
    from google.cloud import aiplatform_v1

    state = aiplatform_v1.JobState
    with VertexStandIn(storage_root=str(gcs), serve=summing_server, batch_polls=(1, 2)) as vertex:
        model = vertex.add_model("77", "image-classifier", versions=("1", "2"), aliases={"default": "2"})
        jobs = vertex_client(vertex.api_endpoint)
        with pytest.raises(exceptions.NotFound, match="does not exist"):
            jobs.create_batch_prediction_job(parent=PARENT, batch_prediction_job=batch_job(model + "@3"))
        with pytest.raises(exceptions.BadRequest, match="machine_type must be set"):
            jobs.create_batch_prediction_job(parent=PARENT, batch_prediction_job=batch_job(
                model, dedicated_resources=None))

        def run(job) -> aiplatform_v1.BatchPredictionJob:
            job = jobs.create_batch_prediction_job(parent=PARENT, batch_prediction_job=job)
            while job.state not in (state.JOB_STATE_SUCCEEDED, state.JOB_STATE_FAILED, state.JOB_STATE_CANCELLED):
                job = jobs.get_batch_prediction_job(name=job.name)
            return job

        vertex.fail_next_batch_job("Model server terminated: out of memory")
        failed = run(batch_job(model))
        assert failed.state == state.JOB_STATE_FAILED
        assert failed.error.message == "Model server terminated: out of memory"
        assert failed.model_version_id == "2"
        missing = run(batch_job(model, input_config={"instances_format": "jsonl",
                                                     "gcs_source": {"uris": ["gs://b/missing.jsonl"]}}))
        assert missing.state == state.JOB_STATE_FAILED and "gs://b/missing.jsonl" in missing.error.message

        running = jobs.create_batch_prediction_job(parent=PARENT, batch_prediction_job=batch_job(model))
        jobs.get_batch_prediction_job(name=running.name)
        jobs.cancel_batch_prediction_job(name=running.name)
        assert jobs.get_batch_prediction_job(name=running.name).state == state.JOB_STATE_CANCELLED
    assert [job["state"] for job in vertex.batch_jobs()] == ["JOB_STATE_FAILED", "JOB_STATE_FAILED",
                                                            "JOB_STATE_CANCELLED"]

    with VertexStandIn() as bare:  # no storage, no model server: the job says so instead of pretending
        model = bare.add_model("77", "image-classifier")
        jobs = vertex_client(bare.api_endpoint)
        job = jobs.create_batch_prediction_job(parent=PARENT, batch_prediction_job=batch_job(model))
        while job.state not in (state.JOB_STATE_SUCCEEDED, state.JOB_STATE_FAILED):
            job = jobs.get_batch_prediction_job(name=job.name)
    assert job.state == state.JOB_STATE_FAILED and "serve=" in job.error.message


@pytest.mark.parametrize("accelerator, accepted", [("NVIDIA_L4", True), ("TPU_V3", True), ("nvidia.com/gpu", False),
                                                   ("NVIDIA_TESLA_T5", False), ("ACCELERATOR_TYPE_UNSPECIFIED", False)])
def test_vertex_pipeline_accelerators_are_the_apis_enum(accelerator, accepted):
    """Validated against google.cloud.aiplatform_v1.AcceleratorType itself, so the stand-in cannot drift from it."""
    from google.api_core import exceptions
    from google.cloud import aiplatform_v1

    spec = {"pipelineInfo": {"name": "p"}, "root": {"dag": {"tasks": {}}}, "schemaVersion": "2.1.0",
            "deploymentSpec": {"executors": {"exec-train": {"container": {
                "image": "img", "resources": {"accelerator": {"resourceType": accelerator, "resourceCount": "1"}}}}}}}
    with VertexStandIn() as vertex:
        client = vertex_client(vertex.api_endpoint, "PipelineServiceClient")
        job = aiplatform_v1.PipelineJob(pipeline_spec=spec, runtime_config={"gcs_output_directory": "gs://bucket/root"})
        if accepted:
            assert client.create_pipeline_job(parent=PARENT, pipeline_job=job).state == \
                aiplatform_v1.PipelineState.PIPELINE_STATE_PENDING
        else:
            with pytest.raises(exceptions.BadRequest, match=f"accelerator type '{accelerator}'.*NVIDIA_L4.*TPU_V3"):
                client.create_pipeline_job(parent=PARENT, pipeline_job=job)
