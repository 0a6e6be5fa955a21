"""The model of the KFP launcher's artifact rule (pipelines/backend/kfp_launcher.py), and what it says of this pipeline:
with data by reference (components/dataio/datadir.py), no pod of any step or train launcher copies more than a few MB,
however large the dataset; with the data inside the artifacts, the pods copy all of it."""

import pytest
import yaml

from components import ops
from components.dataio import datadir
from pipelines import config, training
from pipelines.backend import kfp_launcher

MB = 1 << 20
LIMIT = 10 * MB
SHARD = 128 * MB  # components/dataio/data.py's TARGET_SHARD_BYTES
RUN = "gs://bucket/pipeline-root/image-classification/run-1"


# ---------------------------------------------------------------------------------------------- the rule

RELEASES = ("2.5.0", "2.16.1", "2.17.0")  # the first release `pipectl upload` accepts, the last two


def test_an_input_artifact_is_its_own_folder_on_2_17_and_every_key_it_starts_on_2_16():
    """DownloadBlob lists with `Prefix: <artifact key>` on every release; 2.17.0 keeps the key and the keys below
    `key/` (isBlobKeyUnderPrefix, object_store.go:171-174), 2.16.1 and 2.5.0 keep all they list
    (object_store.go 2.16.1:127-154, 2.5.0:123-150)."""
    store = kfp_launcher.Listing({
        f"{RUN}/preprocess-op/dataset/dataset.json": 3000,
        f"{RUN}/preprocess-op/dataset/train/train-00000-of-00002.tfrecord": SHARD,
        f"{RUN}/preprocess-op/dataset/train/train-00001-of-00002.tfrecord": SHARD,
        # Beside it, not below it: only the key's start is shared.
        f"{RUN}/preprocess-op/dataset.data/train/train-00000-of-00001.tfrecord": SHARD,
        f"{RUN}/preprocess-op/dataset-other": 7,
        f"{RUN}/preprocess-op/.data/dataset/train/train-00000-of-00001.tfrecord": SHARD,
    })
    artifact = kfp_launcher.RuntimeArtifact("dataset", f"{RUN}/preprocess-op/dataset")
    new = kfp_launcher.download(artifact, store, "2.17.0")
    assert (new.bytes, new.note, new.beside) == (3000 + 2 * SHARD, "copied whole", ())
    for release in ("2.16.1", "2.15.0", "2.5.0"):
        old = kfp_launcher.download(artifact, store, release)
        assert old.bytes == 3000 + 3 * SHARD + 7, release
        assert old.beside_folders() == [f"{RUN}/preprocess-op/dataset-other", f"{RUN}/preprocess-op/dataset.data/"]
    beside = kfp_launcher.download(kfp_launcher.RuntimeArtifact("x", f"{RUN}/preprocess-op/dataset.data"), store)
    assert beside.bytes == SHARD


def test_the_workspace_flag_skips_a_download_from_2_15_on():
    store = kfp_launcher.Listing({f"{RUN}/t/dataset/a": SHARD})
    flagged = kfp_launcher.RuntimeArtifact("dataset", f"{RUN}/t/dataset", {"_kfp_workspace": True})
    assert kfp_launcher.download(flagged, store, "2.15.0").note == "in the run's workspace"
    assert kfp_launcher.download(flagged, store, "2.14.0").bytes == SHARD  # launcher_v2.go 2.14.0 has no such check


@pytest.mark.parametrize("artifact, note", [
    (kfp_launcher.RuntimeArtifact("dataset", f"{RUN}/t/dataset", {"_kfp_workspace": True}),
     "in the run's workspace"),
    (kfp_launcher.RuntimeArtifact("model", "oci://registry/model:1"), "mounted from a modelcar"),
    (kfp_launcher.RuntimeArtifact("dataset", "/data/t/dataset"), "no local path for the URI's scheme"),
])
def test_what_the_launcher_does_not_download(artifact, note):
    store = kfp_launcher.Listing({f"{RUN}/t/dataset/a": SHARD, "/data/t/dataset/a": SHARD})
    for release in ("2.16.1", "2.17.0"):
        assert kfp_launcher.download(artifact, store, release) == \
            kfp_launcher.Transfer(artifact.name, artifact.uri, 0, note)


def test_outputs_upload_the_local_folder_whole(tmp_path):
    (tmp_path / "dataset" / "train").mkdir(parents=True)
    (tmp_path / "dataset" / "dataset.json").write_bytes(b"x" * 100)
    (tmp_path / "dataset" / "train" / "a.tfrecord").write_bytes(b"x" * 5000)
    out = kfp_launcher.RuntimeArtifact("dataset", f"{RUN}/t/dataset")
    assert kfp_launcher.upload(out, str(tmp_path / "dataset"), kfp_launcher.LocalTree()).bytes == 5100
    assert kfp_launcher.upload(out, str(tmp_path / "nothing"), kfp_launcher.LocalTree()).bytes == 0
    (tmp_path / "dataset.data").mkdir()  # a sibling folder is not the output's: UploadBlob walks the local path
    (tmp_path / "dataset.data" / "b").write_bytes(b"x" * 7)
    assert kfp_launcher.upload(out, str(tmp_path / "dataset"), kfp_launcher.LocalTree()).bytes == 5100
    oci = kfp_launcher.RuntimeArtifact("model", "oci://registry/model:1")
    assert kfp_launcher.upload(oci, str(tmp_path / "dataset"), kfp_launcher.LocalTree()).bytes == 0


# ---------------------------------------------------------------------------------------------- the pipeline


def compiled(tmp_path, settings: config.PipelineSettings) -> dict:
    path = training.compile_pipeline(str(tmp_path / "pipeline.yaml"), settings)
    with open(path) as f:
        return next(yaml.safe_load_all(f))


def test_each_task_reads_its_producers_outputs_also_inside_the_condition(tmp_path):
    tasks = kfp_launcher.task_artifacts(compiled(tmp_path, config.PipelineSettings()))
    assert tasks["evaluate-op"]["inputs"] == {"model": ("train-op", "model"), "dataset": ("preprocess-op", "dataset")}
    assert tasks["train-op"]["inputs"] == {"dataset": ("preprocess-op", "dataset"),
                                           "augmented": ("augment-op", "augmented")}
    # register-op runs in the dsl.If group: its inputs come through the group's own inputs.
    assert tasks["register-op"]["inputs"] == {"model": ("train-op", "model"),
                                              "evaluation": ("evaluate-op", "evaluation")}
    assert tasks["preprocess-op"] == {"inputs": {}, "outputs": ["card", "dataset", "stats"]}


SMALL_FILES = {"model": 4 * MB, "tensorboard": 200_000}  # the reference CNN's model; a few epochs of logs


def legacy_bulk_dir(uri: str, path: str, *, data_root: str = "", by_reference: bool = False) -> str:
    """Where releases of this project before this one put the bulk on a KFP backend: beside the artifact."""
    return uri + ".data" if by_reference else path


def kfp_uri(task: str, output: str) -> str:
    """Where a KFP backend puts a task's output (kfp_launcher.output_uri): one salt per task."""
    return kfp_launcher.output_uri("gs://bucket/pipeline-root", "image-classification", "run-1", task,
                                   f"uuid-of-{task}", output)


def run_store(spec: dict, *, shards: int, by_reference: bool, bulk_dir=datadir.bulk_dir) -> kfp_launcher.Listing:
    """The objects of a run over a dataset of `shards` 128 MB shards (3.2 TB for 25,000: ten million 224 px
    photos), laid out as the steps write them: the bulk where `bulk_dir` puts it, manifests in artifacts."""
    sizes = {}
    tasks = {**spec["root"]["dag"]["tasks"], **{name: task for c in spec["components"].values()
                                                 for name, task in c.get("dag", {}).get("tasks", {}).items()}}
    bulk_outputs = {task: ops.BY_REFERENCE.get(spec["components"][t["componentRef"]["name"]]["executorLabel"][5:])
                    for task, t in tasks.items() if "executorLabel" in spec["components"][t["componentRef"]["name"]]}
    for task, artifacts in kfp_launcher.task_artifacts(spec).items():
        for output in artifacts["outputs"]:
            uri = kfp_uri(task, output)
            sizes[f"{uri}/manifest.json"] = SMALL_FILES.get(output, 40_000)
            if output == bulk_outputs[task]:
                bulk = bulk_dir(uri, uri, by_reference=by_reference)
                for index in range(shards):
                    sizes[f"{bulk}/train/train-{index:05d}-of-{shards:05d}.tfrecord"] = SHARD
    return kfp_launcher.Listing(sizes)


def transfers(spec: dict, store: kfp_launcher.Listing, release: str) -> dict[str, kfp_launcher.PodTransfers]:
    present = {uri.rsplit("/", 1)[0] for uri in store.sizes}

    def artifact_uri(task, output):
        uri = kfp_uri(task, output)
        return uri if uri in present else None

    # A step's local output folder holds what it uploads: the artifact's own objects.
    return kfp_launcher.pod_transfers(spec, artifact_uri, kfp_uri, store, release)


@pytest.mark.parametrize("release", RELEASES)
@pytest.mark.parametrize("launcher", config.TRAIN_LAUNCHERS)
def test_with_data_by_reference_no_pod_copies_the_dataset_on_any_release(tmp_path, launcher, release):
    spec = compiled(tmp_path, config.PipelineSettings(train_launcher=launcher))
    moved = transfers(spec, run_store(spec, shards=25_000, by_reference=True), release)
    assert set(moved) == set(training.task_names(config.PipelineSettings(train_launcher=launcher)).values())
    for task, pod in moved.items():
        assert pod.beside == [], (task, pod.beside[:3])  # neither bulk data nor another artifact
        assert pod.bytes < LIMIT, (task, [(t.artifact, t.bytes) for t in pod.downloads + pod.uploads])


def test_data_beside_the_artifact_is_copied_by_every_release_before_2_17(tmp_path):
    """The layout of earlier releases (`ARTIFACT_URI.data`) on the releases the upload gate accepts: the model
    tells them apart, so the test above can fail."""
    spec = compiled(tmp_path, config.PipelineSettings(train_launcher="trainjob"))
    store = run_store(spec, shards=20, by_reference=True, bulk_dir=legacy_bulk_dir)
    for release in ("2.5.0", "2.16.1"):
        moved = transfers(spec, store, release)
        assert moved["train-cluster-job-op"].bytes > 2 * 20 * SHARD, release  # dataset.data and augmented.data
        assert moved["evaluate-op"].bytes > 20 * SHARD, release
    assert all(pod.bytes < LIMIT for pod in transfers(spec, store, "2.17.0").values())


def test_with_the_data_in_the_artifacts_every_reader_copies_it(tmp_path):
    """What this model says of the layout that Vertex AI mounts and that earlier releases used everywhere."""
    spec = compiled(tmp_path, config.PipelineSettings(train_launcher="trainjob"))
    moved = transfers(spec, run_store(spec, shards=20, by_reference=False), "2.17.0")
    assert moved["train-cluster-job-op"].bytes > 2 * 20 * SHARD  # dataset and augmented, though its nodes stream
    assert moved["preprocess-op"].bytes > 20 * SHARD
    assert moved["placement-op"].bytes < LIMIT


@pytest.mark.parametrize("launcher", config.TRAIN_LAUNCHERS)
def test_no_output_name_starts_another_of_the_same_task(tmp_path, launcher):
    """Before 2.17.0 an input `model` would bring a sibling `model_card` with it; nor may any start with a dot,
    the bulk folder's first character (datadir.BULK_FOLDER)."""
    spec = compiled(tmp_path, config.PipelineSettings(train_launcher=launcher))
    for task, artifacts in kfp_launcher.task_artifacts(spec).items():
        outputs = artifacts["outputs"] + ["executor-logs"]  # the launcher's log artifact (driver.go:761)
        assert not [(a, b) for a in outputs for b in outputs if a != b and b.startswith(a)], task
        assert not [name for name in outputs if datadir.BULK_FOLDER.startswith(name[:1])], task


def test_each_step_writing_by_reference_takes_the_data_root():
    """ops.BY_REFERENCE names an output of each step, and the steps take what bulk_dir needs."""
    for name, output in ops.BY_REFERENCE.items():
        component = next(c for c in vars(ops).values() if getattr(c, "name", None) == name)
        spec = component.component_spec
        assert output in spec.outputs and {"data_root", "by_reference"} <= set(spec.inputs), name


# ---------------------------------------------------------------------------------------------- where data goes


def test_where_the_bulk_of_an_artifact_goes(caplog):
    uri = kfp_uri("preprocess-op", "dataset")
    path = "/gcs/" + uri[len("gs://"):]
    task_root = uri.rsplit("/", 1)[0]
    assert datadir.bulk_dir(uri, path, by_reference=True) == task_root + "/.data/dataset"
    assert datadir.bulk_dir(uri, path, by_reference=False) == path  # Vertex AI: .path is a GCS FUSE mount
    assert datadir.bulk_dir(uri, path, data_root="gs://data/root") == \
        "gs://data/root/bucket/pipeline-root/image-classification/run-1/preprocess-op/uuid-of-preprocess-op/dataset"
    assert datadir.bulk_dir(uri, path, data_root="/mnt/gcs/kfp-data", by_reference=True) == \
        "/mnt/gcs/kfp-data/" + uri[len("gs://"):]
    # kfp.local: the URI is the local folder PIPELINE_ROOT/<run>/<task>/<output>
    # (kfp/local/executor_input_utils.py construct_local_task_root and artifact_type_schema_to_artifact_list).
    local = "/home/u/runs/try/pipeline_root/image-classification-2026-11-27-12-00-00-000001/preprocess-op/dataset"
    assert datadir.bulk_dir(local, local, by_reference=True) == local
    assert datadir.bulk_dir(local, local, data_root="/home/u/data") == \
        "/home/u/data/image-classification-2026-11-27-12-00-00-000001/preprocess-op/dataset"
    assert datadir.bulk_dir(local, local, data_root="gs://b/data") == \
        "gs://b/data/image-classification-2026-11-27-12-00-00-000001/preprocess-op/dataset"
    minio = "minio://mlpipeline/v2/artifacts/run/preprocess-op/dataset"
    assert datadir.bulk_dir(minio, "/minio/mlpipeline/x", by_reference=True) == "/minio/mlpipeline/x"
    assert "give the pipeline a data_root" in caplog.text


def test_the_local_layout_is_kfp_locals():
    """bulk_dir's <run>/<task>/<output> for a local run is kfp.local's own layout of an artifact."""
    from kfp.local import executor_input_utils

    root = executor_input_utils.construct_local_task_root("/p/root", "image-classification-2026", "preprocess-op")
    assert root == "/p/root/image-classification-2026/preprocess-op"
    assert datadir.bulk_dir(root + "/dataset", root + "/dataset", data_root="/d") == \
        "/d/image-classification-2026/preprocess-op/dataset"


# ---------------------------------------------------------------------------------------------- explain


def explain_downloads(tmp_path, release: str, **parameters) -> dict:
    from pipelines.backend import explain

    package = training.compile_pipeline(str(tmp_path / "p.yaml"), config.PipelineSettings(train_launcher="trainjob"))
    return {step["task"]: step.get("downloads", [])
            for step in explain.explain(package, parameters, release)["steps"]}


@pytest.mark.parametrize("release", RELEASES)
def test_explain_shows_what_each_pod_downloads_and_no_bulk_data(tmp_path, release):
    downloads = explain_downloads(tmp_path, release)
    assert [d["input"] for d in downloads["train-cluster-job-op"]] == ["augmented", "dataset"]
    assert downloads["evaluate-op"][1]["uri"].endswith("/train-cluster-job-op/UUID/model")
    for task, inputs in downloads.items():
        for entry in inputs:
            assert entry["copies"] == "the artifact" and "also_copies" not in entry, (task, entry)
    with_root = explain_downloads(tmp_path, release, data_root="gs://b/data")
    assert all("also_copies" not in entry for inputs in with_root.values() for entry in inputs)


def test_explain_names_the_bulk_data_an_older_release_would_download(tmp_path):
    from pipelines.backend import explain

    spec = compiled(tmp_path, config.PipelineSettings(train_launcher="trainjob"))
    old = explain.pod_downloads(spec, {}, "2.16.1", bulk_dir=legacy_bulk_dir)
    assert old["evaluate-op"][0]["also_copies"] == [
        "gs://BUCKET/pipeline-root/image-classification/RUN_ID/preprocess-op/UUID/dataset.data/"]
    new = explain.pod_downloads(spec, {}, "2.17.0", bulk_dir=legacy_bulk_dir)
    assert all("also_copies" not in entry for inputs in new.values() for entry in inputs)


@pytest.mark.parametrize("value, ok", [("", True), ("gs://b/data", True), ("/mnt/gcs/kfp-data", True),
                                       ("data", False), ("s3://b/data", False)])
def test_data_root_is_a_place_every_step_reaches(value, ok):
    from components import params

    assert (params.problems({"data_root": value}) == []) is ok
