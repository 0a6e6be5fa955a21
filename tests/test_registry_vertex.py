"""VertexRegistry with the real google-cloud-aiplatform client (REST transport) against the local stand-in.

Nothing is mocked: the generated `aiplatform_v1.ModelServiceClient` sends real HTTP requests to
tests/standins/vertex_api.py on 127.0.0.1, with anonymous credentials; a socket guard fails any test that would
reach another host (a metadata server, a real Google endpoint).
"""

from __future__ import annotations

import json
import os
import random

import pytest
from google.auth.credentials import AnonymousCredentials

from components import gcp
from components.register import register
from components.registry import CHAMPION, ChampionChanged, LocalRegistry, model_digest
from components.registry.vertex import (
    DIGEST_LABEL,
    NETWORK_LABEL,
    PRETRAINED_DIGEST_LABEL,
    PRETRAINED_LABEL,
    PREBUILT_TF_IMAGES,
    SERVING_FOLDER,
    TF_SERVING_VERSION,
    VertexPermissionError,
    VertexQuotaError,
    VertexRegionError,
    VertexRegistry,
    VertexRegistryError,
    digest_label,
    lineage_labels,
    parse_version_description,
    sanitize_label_key,
    sanitize_label_value,
    default_serving_image,
    prebuilt_image_for,
    serving_container,
    version_description,
)
from tests.standins.vertex_api import UPLOAD_RESULT, VertexStandIn

PROJECT, PROJECT_NUMBER, LOCATION = "test-project", "123456789012", "us-central1"
MODEL = "image-classifier"


pytestmark = pytest.mark.usefixtures("loopback_only")  # tests/conftest.py: fails a test that leaves this machine


@pytest.fixture
def vertex():
    with VertexStandIn(project=PROJECT, project_number=PROJECT_NUMBER, location=LOCATION) as standin:
        yield standin


@pytest.fixture
def sleeps():
    return []


@pytest.fixture
def gcs(tmp_path):
    """A local stand-in for the /gcs mount of Vertex AI Pipelines: gcs/BUCKET/PATH is gs://BUCKET/PATH."""
    root = tmp_path / "gcs"
    root.mkdir()
    return root


def make_registry(vertex, gcs, sleeps, **kwargs) -> VertexRegistry:
    location = kwargs.pop("location", LOCATION)
    # The registry's behaviour (versions, aliases, digests, labels) is the same whichever container serves; these
    # tests register gs:// URIs that have no files here, which only the prebuilt container (no versioned copy to
    # stage) allows. The default container has its own tests below.
    # The backoff's jitter draws the top of its range here, so that each wait is the ceiling (1, 2, 4 s...);
    # tests/test_gcp.py holds the jitter itself.
    options = dict(api_endpoint=vertex.api_endpoint, credentials=AnonymousCredentials(), sleep=sleeps.append,
                   uniform=lambda low, high: high, gcs_fuse_root=str(gcs), serving_image=PREBUILT_TF_IMAGES["cpu"])
    options.update(kwargs)
    return VertexRegistry(PROJECT, location, **options)


@pytest.fixture
def registry(vertex, gcs, sleeps):
    return make_registry(vertex, gcs, sleeps)


def saved_model(root, name: str, content: bytes) -> str:
    """A small directory shaped like an exported SavedModel."""
    path = root / name
    (path / "variables").mkdir(parents=True, exist_ok=True)
    (path / "saved_model.pb").write_bytes(b"saved-model:" + content)
    (path / "variables" / "variables.index").write_bytes(content)
    return str(path)


def upload(registry, uri: str, digest: str, **kwargs):
    options = dict(digest=digest, metrics={"accuracy": 0.9}, labels={}, description="accuracy=0.9000")
    options.update(kwargs)
    return registry.upload(MODEL, uri, **options)


DIGEST_1 = "sha256:" + "1" * 64
DIGEST_2 = "sha256:" + "2" * 64


def test_first_upload_creates_model_and_version_1_with_default_alias(vertex, registry):
    assert registry.champion(MODEL) is None and registry.find_by_digest(MODEL, DIGEST_1) is None
    labels = {"pipeline_run": "image-clf-20240501-120000", "Git Commit": "0123ABCDEF" * 4,
              "data_fingerprint": "sha256:" + "f" * 64}
    v = upload(registry, "gs://my-bucket/runs/r1/model", DIGEST_1, labels=labels,
               metrics={"accuracy": 0.9123, "loss": 0.25})

    assert (v.registry, v.model, v.version, v.aliases) == ("vertex", MODEL, "1", ["default"])
    assert v.uri == "gs://my-bucket/runs/r1/model"
    assert v.digest == DIGEST_1
    assert v.metrics == {"accuracy": 0.9123, "loss": 0.25}
    # Resource names use the project number, whatever the request used.
    assert v.resource_name == f"projects/{PROJECT_NUMBER}/locations/{LOCATION}/models/{MODEL}@1"
    assert v.labels == {"pipeline_run": "image-clf-20240501-120000", "git_commit": "0123abcdef" * 4,
                        "data_fingerprint": "sha256-" + "f" * 56, DIGEST_LABEL: "sha256-" + "1" * 56}
    assert v.created

    (call,) = vertex.calls("UploadModel")
    assert call.path == f"/v1/projects/{PROJECT}/locations/{LOCATION}/models:upload"
    assert call.body["modelId"] == MODEL and "parentModel" not in call.body
    sent = call.body["model"]
    assert sent["containerSpec"] == {"imageUri": PREBUILT_TF_IMAGES["cpu"]}  # a prebuilt image runs as built
    assert sent["artifactUri"] == "gs://my-bucket/runs/r1/model"
    assert sent["versionDescription"].startswith("accuracy=0.9000\n")
    assert vertex.calls("GetOperation"), "the client waits for the upload operation"
    assert vertex.model_ids() == [MODEL]


def test_second_upload_is_version_2_of_the_same_model(vertex, registry):
    v1 = upload(registry, "gs://my-bucket/runs/r1/model", DIGEST_1)
    v2 = upload(registry, "gs://my-bucket/runs/r2/model", DIGEST_2, metrics={"accuracy": 0.95})

    assert (v2.version, v2.aliases, v2.uri, v2.metrics) == ("2", [], "gs://my-bucket/runs/r2/model", {"accuracy": 0.95})
    assert v2.resource_name.rsplit("@", 1)[0] == v1.resource_name.rsplit("@", 1)[0]
    second = vertex.calls("UploadModel")[1]
    assert second.body["parentModel"] == f"projects/{PROJECT_NUMBER}/locations/{LOCATION}/models/{MODEL}"
    assert "modelId" not in second.body
    assert vertex.model_ids() == [MODEL]
    assert [(v["versionId"], v["versionAliases"]) for v in vertex.versions(MODEL)] == [("1", ["default"]), ("2", [])]


def trained_model(root, name: str, content: bytes) -> str:
    """A model directory as the train step writes it: model.keras beside the SavedModel in saved_model/."""
    path = root / name
    saved_model(path, "saved_model", content)
    (path / "model.keras").write_bytes(b"keras:" + content)
    return str(path)


def test_default_serving_container_is_tensorflow_serving_on_a_versioned_copy(vertex, gcs, sleeps):
    registry = make_registry(vertex, gcs, sleeps, serving_image=None)  # the default
    model_dir = trained_model(gcs, "bkt/runs/r1/model", b"one")
    v = upload(registry, model_dir, DIGEST_1)

    # What Vertex AI received: TensorFlow Serving, run on its REST port with the routes it serves, reading the
    # model from the copy Vertex makes of the artifact URI.
    (call,) = vertex.calls("UploadModel")
    sent = call.body["model"]
    assert sent["containerSpec"] == {
        "imageUri": f"{LOCATION}-docker.pkg.dev/{PROJECT}/kfp/image-classification/tensorflow-serving:{TF_SERVING_VERSION}",
        "command": ["/usr/bin/tensorflow_model_server"],
        "args": ["--port=8500", "--rest_api_port=8501", "--model_name=model", "--model_base_path=$(AIP_STORAGE_URI)"],
        "ports": [{"containerPort": 8501}],
        "predictRoute": "/v1/models/model:predict",
        "healthRoute": "/v1/models/model",
    }
    assert sent["artifactUri"] == v.uri == f"gs://bkt/runs/r1/model/{SERVING_FOLDER}"
    # TensorFlow Serving loads numbered folders under its base path: the SavedModel, byte for byte, as 1/.
    source, copy = gcs / "bkt/runs/r1/model/saved_model", gcs / "bkt/runs/r1/model" / SERVING_FOLDER / "1"
    assert sorted(p.relative_to(copy).as_posix() for p in copy.rglob("*") if p.is_file()) == [
        "saved_model.pb", "variables/variables.index"]
    assert (copy / "saved_model.pb").read_bytes() == (source / "saved_model.pb").read_bytes()
    assert not list((gcs / "bkt/runs/r1/model" / SERVING_FOLDER).glob("*.partial"))


def test_versioned_copy_is_reused_when_identical_and_never_overwritten(vertex, gcs, sleeps):
    registry = make_registry(vertex, gcs, sleeps, serving_image=None)
    model_dir = trained_model(gcs, "bkt/runs/r1/model", b"one")
    upload(registry, model_dir, DIGEST_1)
    again = upload(registry, model_dir, DIGEST_2)  # e.g. the same export registered under another digest
    assert again.uri == f"gs://bkt/runs/r1/model/{SERVING_FOLDER}"

    # An interrupted copy (a file missing) is completed, not refused.
    (gcs / "bkt/runs/r1/model" / SERVING_FOLDER / "1" / "variables" / "variables.index").unlink()
    upload(registry, model_dir, "sha256:" + "4" * 64)
    assert (gcs / "bkt/runs/r1/model" / SERVING_FOLDER / "1" / "variables" / "variables.index").read_bytes() == b"one"

    # Someone else's model in serving/1: refused before anything is sent, and left as it was.
    other = gcs / "bkt/runs/r1/model" / SERVING_FOLDER / "1" / "saved_model.pb"
    other.write_bytes(b"another model")
    calls = len(vertex.calls("UploadModel"))
    with pytest.raises(VertexRegistryError, match="already holds another model.*Remove"):
        upload(registry, model_dir, "sha256:" + "3" * 64)
    assert other.read_bytes() == b"another model"
    assert len(vertex.calls("UploadModel")) == calls


def test_bare_saved_model_directory_is_copied_without_its_own_serving_folder(vertex, gcs, sleeps):
    registry = make_registry(vertex, gcs, sleeps, serving_image=None)
    model_dir = saved_model(gcs, "bkt/exports/bare", b"bare")
    upload(registry, model_dir, DIGEST_1)
    upload(registry, model_dir, DIGEST_2)  # the first copy, now inside model_dir, is not copied into itself
    copy = gcs / "bkt/exports/bare" / SERVING_FOLDER / "1"
    assert sorted(p.relative_to(copy).as_posix() for p in copy.rglob("*") if p.is_file()) == [
        "saved_model.pb", "variables/variables.index"]
    assert vertex.calls("UploadModel")[0].body["model"]["artifactUri"] == f"gs://bkt/exports/bare/{SERVING_FOLDER}"


def test_versioned_copy_through_tf_io_gfile(tmp_path):
    """The copy a cluster's register step writes to gs:// goes through tf.io.gfile; file:// takes the same path."""
    from components.registry.vertex import stage_versioned

    source = saved_model(tmp_path, "export", b"weights")
    serving = "file://" + str(tmp_path / "model" / SERVING_FOLDER)
    stage_versioned(source, serving)
    copy = tmp_path / "model" / SERVING_FOLDER / "1"
    assert (copy / "saved_model.pb").read_bytes() == b"saved-model:weights"
    assert (copy / "variables" / "variables.index").read_bytes() == b"weights"
    (copy / "saved_model.pb").unlink()  # interrupted before the last file: completed
    stage_versioned(source, serving)
    assert (copy / "saved_model.pb").read_bytes() == b"saved-model:weights"
    (copy / "variables" / "variables.index").write_bytes(b"other")
    with pytest.raises(VertexRegistryError, match="already holds another model"):
        stage_versioned(source, serving)


def test_default_container_needs_the_files_and_an_artifact_registry_image(vertex, gcs, sleeps):
    registry = make_registry(vertex, gcs, sleeps, serving_image=None)
    with pytest.raises(ValueError, match="No SavedModel in gs://bkt/elsewhere.*versioned copy"):
        upload(registry, "gs://bkt/elsewhere", DIGEST_1)
    # Docker Hub's tensorflow/serving itself is refused by Vertex AI: it takes Artifact Registry / Container
    # Registry images only, hence the copy Cloud Build makes.
    registry = make_registry(vertex, gcs, sleeps, serving_image=f"docker.io/tensorflow/serving:{TF_SERVING_VERSION}")
    with pytest.raises(VertexRegistryError, match="Artifact Registry or Container Registry"):
        upload(registry, trained_model(gcs, "bkt/runs/r2/model", b"two"), DIGEST_1)
    assert not vertex.model_ids()


def test_serving_container_choice():
    assert serving_container(PREBUILT_TF_IMAGES["gpu"]).spec() == {"image_uri": PREBUILT_TF_IMAGES["gpu"]}
    assert not serving_container(prebuilt_image_for("asia-east1")).versioned_artifact
    mine = serving_container("europe-west4-docker.pkg.dev/p/r/my-tf-serving@sha256:" + "a" * 64)
    assert mine.versioned_artifact and mine.predict_route == "/v1/models/model:predict"
    assert default_serving_image("p", "europe-west4").startswith("europe-west4-docker.pkg.dev/p/")
    with pytest.raises(ValueError, match="image URI"):
        serving_container("tensorflow serving")


def test_tensorflow_serving_is_the_minor_version_of_the_trainer_or_one_before():
    """TensorFlow Serving releases after TensorFlow (2.20.0 came eight months after TensorFlow 2.20): the serving
    version may trail the trainer's by one minor version, which tests/benchmarks/serving_compat.py checks loads
    and predicts the same; move TF_SERVING_VERSION when TensorFlow Serving releases the trainer's."""
    import re
    import tomllib

    with open(os.path.join(os.path.dirname(__file__), "..", "pyproject.toml"), "rb") as f:
        extras = tomllib.load(f)["project"]["optional-dependencies"]
    pins = {re.search(r"==(\d+)\.(\d+)", requirement).groups() for extra in ("cpu", "gpu") for requirement in extras[extra]
            if requirement.startswith(("tensorflow-cpu", "tensorflow["))}
    (trainer,) = {(int(major), int(minor)) for major, minor in pins}
    serving = tuple(int(n) for n in TF_SERVING_VERSION.split(".")[:2])
    assert serving[0] == trainer[0] and trainer[1] - 1 <= serving[1] <= trainer[1], (serving, trainer)


def test_register_with_promote_moves_champion_from_v1_to_v2(vertex, registry, gcs):
    first = register(saved_model(gcs, "bkt/runs/r1/model", b"one"), registry, model_name=MODEL,
                     metrics={"accuracy": 0.9}, labels={"pipeline_run": "r1"})
    assert first.new_version and first.version.version == "1"
    assert sorted(first.version.aliases) == [CHAMPION, "default"]
    assert first.version.uri == "gs://bkt/runs/r1/model"
    champion = registry.champion(MODEL)
    assert (champion.version, champion.metrics) == ("1", {"accuracy": 0.9})

    second = register(saved_model(gcs, "bkt/runs/r2/model", b"two"), registry, model_name=MODEL,
                      metrics={"accuracy": 0.95}, labels={"pipeline_run": "r2"})
    assert second.new_version and second.version.version == "2"
    assert second.version.aliases == [CHAMPION]
    champion = registry.champion(MODEL)
    assert (champion.version, champion.metrics, champion.labels["pipeline_run"]) == ("2", {"accuracy": 0.95}, "r2")
    assert [(v["versionId"], sorted(v["versionAliases"])) for v in vertex.versions(MODEL)] == [
        ("1", ["default"]), ("2", [CHAMPION])]
    merge = vertex.calls("MergeVersionAliases")[-1]
    assert merge.path.endswith(f"/models/{MODEL}@2:mergeVersionAliases")
    assert merge.body == {"versionAliases": [CHAMPION]}


def test_registering_the_same_digest_twice_returns_the_existing_version(vertex, registry, gcs):
    model_dir = saved_model(gcs, "bkt/runs/r1/model", b"same")
    first = register(model_dir, registry, model_name=MODEL, metrics={"accuracy": 0.9})
    again = register(model_dir, registry, model_name=MODEL, metrics={"accuracy": 0.9})

    assert first.new_version and not again.new_version
    assert again.version.version == first.version.version == "1"
    assert again.version.digest == model_digest(model_dir)
    assert len(vertex.calls("UploadModel")) == 1
    assert len(vertex.versions(MODEL)) == 1
    lookup = vertex.calls("ListModelVersions")[-1]
    assert lookup.query["filter"] == [f'labels.{DIGEST_LABEL}="{digest_label(model_digest(model_dir))}"']


def test_permission_denied_names_the_role_and_the_bucket(vertex, registry):
    vertex.fail_next(403, rpc="UploadModel")
    with pytest.raises(VertexPermissionError) as info:
        upload(registry, "gs://my-bucket/runs/r1/model", DIGEST_1)
    message = str(info.value)
    assert "roles/aiplatform.user" in message and PROJECT in message
    assert "aiplatform.models.upload" in message  # the permission named by the API's ErrorInfo
    assert "roles/storage.objectViewer on gs://my-bucket" in message
    assert isinstance(info.value, PermissionError)
    assert vertex.model_ids() == [] and len(vertex.calls("UploadModel")) == 1  # not retried


def test_permission_denied_on_lookup_is_actionable_too(vertex, registry):
    vertex.fail_next("PERMISSION_DENIED", rpc="ListModels")
    with pytest.raises(VertexPermissionError, match=r"roles/aiplatform\.user.*aiplatform\.models\.list"):
        registry.champion(MODEL)


def test_quota_error_is_retried_with_backoff_then_succeeds(vertex, registry, sleeps):
    vertex.fail_next(429, count=2, rpc="UploadModel")
    v = upload(registry, "gs://my-bucket/runs/r1/model", DIGEST_1)

    assert v.version == "1"
    assert sleeps == [1.0, 2.0]
    assert len(vertex.calls("UploadModel")) == 3
    assert [c.status for c in vertex.calls("UploadModel")] == [429, 429, 200]
    assert len(vertex.versions(MODEL)) == 1


def test_quota_retries_wait_a_random_share_of_a_doubling_ceiling(vertex, gcs, sleeps):
    """Full jitter, as google-api-core's own retries (exponential_sleep_generator): each wait is drawn uniformly
    between 0 and a ceiling that doubles, so that steps refused together do not all come back at the same second."""
    source, draws = random.Random(7), []

    def uniform(low, high):
        draws.append((low, high))
        return source.uniform(low, high)

    registry = make_registry(vertex, gcs, sleeps, uniform=uniform)
    vertex.fail_next(429, count=3, rpc="UploadModel")
    assert upload(registry, "gs://my-bucket/runs/r1/model", DIGEST_1).version == "1"
    assert draws == [(0.0, 1.0), (0.0, 2.0), (0.0, 4.0)]
    twin = random.Random(7)
    assert sleeps == [twin.uniform(0.0, ceiling) for ceiling in (1.0, 2.0, 4.0)]
    assert len(set(sleeps)) == 3 and all(0 <= wait <= ceiling for wait, ceiling in zip(sleeps, (1.0, 2.0, 4.0)))
    assert gcp.RetryPolicy().uniform is random.uniform  # what runs outside tests


def test_quota_error_while_polling_does_not_upload_twice(vertex, registry, sleeps):
    vertex.fail_next(429, rpc="GetOperation")
    v = upload(registry, "gs://my-bucket/runs/r1/model", DIGEST_1)
    assert v.version == "1" and len(vertex.calls("UploadModel")) == 1 and sleeps == [1.0]


def test_upload_waits_for_the_operation(gcs, sleeps):
    with VertexStandIn(project=PROJECT, project_number=PROJECT_NUMBER, location=LOCATION, polls_until_done=3) as vertex:
        registry = make_registry(vertex, gcs, sleeps, poll_seconds=2.0)
        assert upload(registry, "gs://b/m1", DIGEST_1).version == "1"
        assert len(vertex.calls("GetOperation")) == 3
        assert sleeps == [2.0, 3.0]


def test_upload_operation_that_fails_for_permission_is_actionable(vertex, registry):
    vertex.fail_next("PERMISSION_DENIED", rpc=UPLOAD_RESULT,
                     message="Vertex AI Service Agent cannot read gs://locked-bucket/model.")
    with pytest.raises(VertexPermissionError, match=r"cannot read gs://locked-bucket.*roles/storage\.objectViewer on "
                                                    r"gs://locked-bucket.*Service Agent"):
        upload(registry, "gs://locked-bucket/model", DIGEST_1)
    assert vertex.model_ids() == []
    assert upload(registry, "gs://locked-bucket/model", DIGEST_1).version == "1"  # once access is granted


def test_quota_error_gives_up_after_bounded_attempts(vertex, gcs, sleeps):
    registry = make_registry(vertex, gcs, sleeps, max_attempts=3, initial_backoff_s=0.5)
    vertex.fail_next(429, count=10, rpc="UploadModel")
    with pytest.raises(VertexQuotaError, match=r"quota.*3 times.*Quota exceeded"):
        upload(registry, "gs://my-bucket/runs/r1/model", DIGEST_1)
    assert sleeps == [0.5, 1.0]
    assert len(vertex.calls("UploadModel")) == 3 and vertex.model_ids() == []


def test_a_model_dir_not_on_cloud_storage_is_rejected(vertex, registry, tmp_path):
    local = saved_model(tmp_path, "local/model", b"x")
    with pytest.raises(ValueError, match=r"Vertex AI serves models from Cloud Storage.*gs://"):
        upload(registry, local, DIGEST_1)
    with pytest.raises(ValueError, match="Cloud Storage"):
        register(local, registry, model_name=MODEL)
    assert vertex.calls("UploadModel") == []

    # A caller that copied the model to Cloud Storage names the copy.
    v = upload(registry, local, DIGEST_1, artifact_uri="gs://my-bucket/copied/model")
    assert v.uri == "gs://my-bucket/copied/model"


def test_region_mismatches_are_reported(vertex, gcs, sleeps):
    with pytest.raises(VertexRegionError, match="serves region us-central1"):
        VertexRegistry(PROJECT, "europe-west4", api_endpoint="us-central1-aiplatform.googleapis.com")

    # The stand-in is a us-central1 endpoint; a registry for europe-west4 pointed at it is refused by the API.
    elsewhere = make_registry(vertex, gcs, sleeps, location="europe-west4")
    with pytest.raises(VertexRegionError, match="europe-west4"):
        elsewhere.find_by_digest(MODEL, DIGEST_1)

    # With a bucket-location lookup, an artifact bucket in another region is refused before uploading.
    registry = make_registry(vertex, gcs, sleeps, bucket_location={"eu-bucket": "EUROPE-WEST4", "us": "US"}.get)
    with pytest.raises(VertexRegionError, match=r"gs://eu-bucket, a bucket in europe-west4.*us-central1"):
        upload(registry, "gs://eu-bucket/model", DIGEST_1)
    assert vertex.calls("UploadModel") == []
    assert upload(registry, "gs://us/model", DIGEST_1).version == "1"  # a multi-region is left to the API


def test_model_id_taken_by_another_display_name_is_explained(vertex, registry):
    registry.upload("Image Classifier", "gs://b/m1", digest=DIGEST_1, metrics={}, labels={}, description="")
    with pytest.raises(VertexRegistryError, match="model id 'image-classifier' is taken"):
        upload(registry, "gs://b/m2", DIGEST_2)


def test_lookups_follow_pages(gcs, sleeps):
    with VertexStandIn(project=PROJECT, project_number=PROJECT_NUMBER, location=LOCATION, max_page_size=1) as vertex:
        registry = make_registry(vertex, gcs, sleeps)
        for other in ("other-a", "other-b"):
            registry.upload(other, "gs://b/o", digest=DIGEST_1, metrics={}, labels={}, description="")
        digests = [f"sha256:{n}" + "0" * 63 for n in "123"]
        for n, digest in enumerate(digests):
            upload(registry, f"gs://b/m{n}", digest)
        assert registry.find_by_digest(MODEL, digests[2]).version == "3"
        assert registry.find_by_digest(MODEL, "sha256:" + "9" * 64) is None
        assert [v.version for v in registry.versions(MODEL)] == ["1", "2", "3"]
        assert any("pageToken" in c.query for c in vertex.calls("ListModelVersions"))


def test_set_alias_on_a_missing_version_raises_key_error(registry):
    with pytest.raises(KeyError):
        registry.set_alias(MODEL, "1", CHAMPION)
    upload(registry, "gs://b/m1", DIGEST_1)
    with pytest.raises(KeyError):
        registry.set_alias(MODEL, "7", CHAMPION)
    with pytest.raises(ValueError, match="alias"):
        registry.set_alias(MODEL, "1", "Not An Alias")


def run_scenario(registry, gcs) -> dict:
    """The same register steps on any registry; returns what a user can observe."""
    d1 = saved_model(gcs, "bkt/scenario/1", b"one")
    d2 = saved_model(gcs, "bkt/scenario/2", b"two")
    d3 = saved_model(gcs, "bkt/scenario/3", b"three")
    steps = [
        register(d1, registry, model_name=MODEL, metrics={"accuracy": 0.8}),
        register(d2, registry, model_name=MODEL, metrics={"accuracy": 0.7}, promote=False),  # a worse challenger
        register(d2, registry, model_name=MODEL, metrics={"accuracy": 0.7}, promote=False),  # a retried task
        register(d3, registry, model_name=MODEL, metrics={"accuracy": 0.9}),
        register(d1, registry, model_name=MODEL, metrics={"accuracy": 0.8}),  # roll back to v1
    ]
    registry.set_alias(MODEL, "2", "challenger")
    return {
        "steps": [(s.new_version, s.version.version, sorted(s.version.aliases)) for s in steps],
        "versions": [(v.version, sorted(v.aliases), v.digest, v.metrics) for v in registry.versions(MODEL)],
        "champion": registry.champion(MODEL).version,
        "by_digest": registry.find_by_digest(MODEL, model_digest(d3)).version,
    }


def test_local_and_vertex_registries_behave_the_same(vertex, registry, gcs, tmp_path):
    local = run_scenario(LocalRegistry(str(tmp_path / "registry")), gcs)
    remote = run_scenario(registry, gcs)
    assert remote == local
    assert local["champion"] == "1"
    assert [v[:2] for v in local["versions"]] == [("1", [CHAMPION, "default"]), ("2", ["challenger"]), ("3", [])]


def test_label_and_description_helpers():
    assert sanitize_label_value("Run/2024-05-01 12:00") == "run-2024-05-01-12-00"
    long = sanitize_label_value("x" * 100)
    assert len(long) == 63 and long.startswith("x" * 54 + "-")
    assert sanitize_label_key("Git Commit") == "git_commit" and sanitize_label_key("1st") == "k_1st"
    assert digest_label("sha256:" + "ab" * 32) == "sha256-" + ("ab" * 32)[:56]
    assert len(digest_label("weird digest!")) == 63
    text = version_description("accuracy=0.9000", digest=DIGEST_1, metrics={"accuracy": 0.9})
    assert parse_version_description(text) == {"digest": DIGEST_1, "metrics": {"accuracy": 0.9}}
    assert parse_version_description("made in the console") == {}
    assert prebuilt_image_for("europe-west4", "gpu") == PREBUILT_TF_IMAGES["gpu"].replace("us-docker", "europe-docker")
    assert all(":" in image and "tf2-" in image for image in PREBUILT_TF_IMAGES.values())


def with_lineage(path: str, lineage: dict | None) -> str:
    """Adds the training.json the train step writes beside the model, with `model` when given."""
    info = {"class_names": ["a", "b"], "image_shape": [28, 28, 1], **({"model": lineage} if lineage else {})}
    with open(os.path.join(path, "training.json"), "w") as f:
        json.dump(info, f)
    return path


def test_registration_records_the_lineage_in_labels_and_in_full(vertex, registry, gcs):
    weights_uri = "gs://team-weights/fine-tuned/2024-05/champions/image-classifier/version-17/model.weights.h5"
    lineage = {"name": "my_models.vision:build", "pretrained": {"source": weights_uri, "sha256": "AB" * 32},
               "freeze_epochs": 3, "fine_tune_layers": 0}
    path = with_lineage(saved_model(gcs, "bkt/runs/r1/model", b"one"), lineage)
    first = register(path, registry, model_name=MODEL, metrics={"accuracy": 0.91}, labels={"pipeline_run": "r1"})

    assert first.version.lineage == lineage  # read back from the version description
    (call,) = vertex.calls("UploadModel")
    sent = call.body["model"]["labels"]  # the stand-in refuses labels that break Vertex's rules
    assert sent[NETWORK_LABEL] == "my_models-vision-build"
    assert len(sent[PRETRAINED_LABEL]) == 63 and sent[PRETRAINED_LABEL].startswith("gs---team-weights-fine-tuned-")
    assert sent[PRETRAINED_DIGEST_LABEL] == "sha256-" + ("ab" * 32)[:56]
    assert sent["pipeline_run"] == "r1" and sent[DIGEST_LABEL] == digest_label(model_digest(path))
    description = call.body["model"]["versionDescription"]
    assert description.startswith("accuracy=0.9100; network my_models.vision:build, pretrained " + weights_uri)
    assert parse_version_description(description)["lineage"] == lineage

    # Found again by digest (a retried task) and listed: the same lineage; a console filter on the label works.
    again = register(path, registry, model_name=MODEL)
    assert not again.new_version and again.version.lineage == lineage
    assert [v.lineage for v in registry.versions(MODEL)] == [lineage]
    parent = registry._find_model(MODEL)
    found = list(registry._client.list_model_versions(
        request={"name": parent.name, "filter": f'labels.{NETWORK_LABEL}="my_models-vision-build"'}))
    assert [pb.version_id for pb in found] == ["1"]


def test_older_training_json_is_the_reference_cnn_and_a_bare_model_has_no_lineage(vertex, registry, gcs):
    older = register(with_lineage(saved_model(gcs, "bkt/runs/old/model", b"old"), None), registry, model_name=MODEL)
    assert older.version.lineage == {"name": "reference-cnn", "pretrained": {"source": "none", "sha256": None}}
    assert (older.version.labels[NETWORK_LABEL], older.version.labels[PRETRAINED_LABEL]) == ("reference-cnn", "none")
    assert PRETRAINED_DIGEST_LABEL not in older.version.labels
    bare = register(saved_model(gcs, "bkt/runs/bare/model", b"bare"), registry, model_name=MODEL)
    assert bare.version.lineage == {} and NETWORK_LABEL not in bare.version.labels
    assert "network" not in vertex.calls("UploadModel")[-1].body["model"]["versionDescription"]


def test_lineage_labels_follow_the_label_rules():
    import re

    rule = re.compile(r"^[a-z0-9_-]{0,63}$")
    for name in ("resnet50", "convnext-tiny", "Pkg.Sub_Module:Build_Fn", "x" * 100 + ":f"):
        for source in ("none", "imagenet", "/gcs/b/w.keras", "gs://b/" + "d/" * 40 + "w.weights.h5"):
            labels = lineage_labels({"name": name, "pretrained": {"source": source, "sha256": "0" * 64}})
            assert all(rule.match(v) for v in labels.values()), labels
    assert lineage_labels({}) == {} and lineage_labels({"name": "resnet50"}) == {
        NETWORK_LABEL: "resnet50", PRETRAINED_LABEL: "none"}


def test_importing_the_module_does_not_import_the_client():
    import subprocess
    import sys

    code = ("import sys, components.registry.vertex; "
            "print(any(m.startswith('google.cloud.aiplatform') for m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert out.stdout.strip() == "False"


def test_move_champion_reads_the_alias_right_before_merging(vertex, registry):
    upload(registry, "gs://b/m1", DIGEST_1)
    upload(registry, "gs://b/m2", DIGEST_2)
    assert registry.move_champion(MODEL, "1", expected=None).aliases == ["default", CHAMPION]
    get, merge = vertex.requests[-2:]
    assert (get.rpc, get.path) == (
        "GetModel", f"/v1/projects/{PROJECT_NUMBER}/locations/{LOCATION}/models/{MODEL}@{CHAMPION}")
    assert (merge.rpc, merge.body) == ("MergeVersionAliases", {"versionAliases": [CHAMPION]})

    # Another run moved it since this run's evaluation found none: nothing is merged, the caller learns who has it.
    merges = len(vertex.calls("MergeVersionAliases"))
    with pytest.raises(ChampionChanged) as changed:
        registry.move_champion(MODEL, "2", expected=None)
    assert changed.value.current.version == "1" and len(vertex.calls("MergeVersionAliases")) == merges
    assert registry.move_champion(MODEL, "1", expected="7").version == "1"  # already the champion: as it is
    assert len(vertex.calls("MergeVersionAliases")) == merges
    assert registry.move_champion(MODEL, "2", expected="1").aliases == [CHAMPION]
    with pytest.raises(KeyError):
        registry.move_champion("no-such-model", "1", expected=None)


@pytest.mark.parametrize("order", ["better first", "weaker first"])
def test_two_runs_at_once_crown_the_model_the_gate_prefers(order, vertex, gcs, sleeps, tmp_path):
    """Two runs, both evaluated while there was no champion, register one after the other (each its own client):
    the champion ends on the better one, as on the local registry. (Registrations whose read and merge interleave
    are not covered: Vertex has no conditional alias move, see VertexRegistry.move_champion.)"""
    from components.register import evaluation_metrics, gate_from_evaluation
    from tests.test_champion_race import evaluation_with

    runs = {"better": (saved_model(gcs, "bkt/runs/better/model", b"better"), evaluation_with(967)),
            "weaker": (saved_model(gcs, "bkt/runs/weaker/model", b"weaker"), evaluation_with(933))}

    def register_step(name, registry):
        model_dir, evaluation = runs[name]
        return register(model_dir, registry, model_name=MODEL, metrics=evaluation_metrics(evaluation),
                        gate=gate_from_evaluation(evaluation))

    def one_after_the_other(make) -> dict:
        return {name: register_step(name, make())
                for name in (["better", "weaker"] if order == "better first" else ["weaker", "better"])}

    results = one_after_the_other(lambda: make_registry(vertex, gcs, sleeps))
    better = results["better"].version.version
    champion = make_registry(vertex, gcs, sleeps).champion(MODEL)
    assert champion.version == better and champion.metrics["accuracy"] == pytest.approx(0.967)
    weaker_lost = results["weaker"].champion_changed
    assert weaker_lost != results["better"].champion_changed  # one of them saw the other's move
    loser = results["weaker"] if weaker_lost else results["better"]
    assert ("not blessed: 0.933 >= 0.50 but < champion v" if weaker_lost else
            "blessed: 0.967 >= 0.50 and >= champion v") in loser.promotion
    local = one_after_the_other(lambda: LocalRegistry(str(tmp_path / "registry")))
    assert {n: (r.promotion, r.champion) for n, r in local.items()} == \
        {n: (r.promotion, r.champion) for n, r in results.items()}


def test_first_uploads_of_two_runs_at_once_become_versions_of_one_model(vertex, gcs, sleeps):
    """The second upload finds the model id taken by the first, whose operation has not finished: it waits for the
    model to appear and becomes its next version, instead of refusing the id as another model's."""
    import threading

    start = threading.Barrier(2)
    versions, errors = {}, []

    def run(digest):
        registry = make_registry(vertex, gcs, sleeps)
        start.wait()
        try:
            versions[digest] = upload(registry, f"gs://b/{digest[-1]}", digest).version
        except Exception as e:  # noqa: BLE001 (reported below)
            errors.append(e)

    threads = [threading.Thread(target=run, args=(d,)) for d in (DIGEST_1, DIGEST_2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and sorted(versions.values()) == ["1", "2"]
    assert vertex.model_ids() == [MODEL]
