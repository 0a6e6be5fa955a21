"""The model of the KFP launcher's artifact rule (pipelines/kfp_launcher.py), and what it says of this pipeline:
with data by reference (components/datadir.py), no pod of any step or train launcher copies more than a few MB,
however large the dataset; with the data inside the artifacts, the pods copy all of it."""

import pytest
import yaml

from components import datadir
from pipelines import config, kfp_launcher, training

MB = 1 << 20
LIMIT = 10 * MB
SHARD = 128 * MB  # components/data.py's TARGET_SHARD_BYTES
RUN = "gs://bucket/pipeline-root/image-classification/run-1"


# ---------------------------------------------------------------------------------------------- the rule


def test_an_input_artifact_is_copied_whole_and_only_its_own_folder():
    store = kfp_launcher.Listing({
        f"{RUN}/preprocess-op/dataset/dataset.json": 3000,
        f"{RUN}/preprocess-op/dataset/train/train-00000-of-00002.tfrecord": SHARD,
        f"{RUN}/preprocess-op/dataset/train/train-00001-of-00002.tfrecord": SHARD,
        # Beside it, not below it: isBlobKeyUnderPrefix leaves these out.
        f"{RUN}/preprocess-op/dataset.data/train/train-00000-of-00001.tfrecord": SHARD,
        f"{RUN}/preprocess-op/dataset-other/x": 7,
    })
    copied = kfp_launcher.download(kfp_launcher.RuntimeArtifact("dataset", f"{RUN}/preprocess-op/dataset"), store)
    assert (copied.bytes, copied.note) == (3000 + 2 * SHARD, "copied whole")
    beside = kfp_launcher.download(kfp_launcher.RuntimeArtifact("x", f"{RUN}/preprocess-op/dataset.data"), store)
    assert beside.bytes == SHARD


@pytest.mark.parametrize("artifact, note", [
    (kfp_launcher.RuntimeArtifact("dataset", f"{RUN}/t/dataset", {"_kfp_workspace": True}),
     "in the run's workspace"),
    (kfp_launcher.RuntimeArtifact("model", "oci://registry/model:1"), "mounted from a modelcar"),
    (kfp_launcher.RuntimeArtifact("dataset", "/data/t/dataset"), "no local path for the URI's scheme"),
])
def test_what_the_launcher_does_not_download(artifact, note):
    store = kfp_launcher.Listing({f"{RUN}/t/dataset/a": SHARD, "/data/t/dataset/a": SHARD})
    assert kfp_launcher.download(artifact, store) == kfp_launcher.Transfer(artifact.name, artifact.uri, 0, note)


def test_outputs_upload_the_local_folder_whole(tmp_path):
    (tmp_path / "dataset" / "train").mkdir(parents=True)
    (tmp_path / "dataset" / "dataset.json").write_bytes(b"x" * 100)
    (tmp_path / "dataset" / "train" / "a.tfrecord").write_bytes(b"x" * 5000)
    out = kfp_launcher.RuntimeArtifact("dataset", f"{RUN}/t/dataset")
    assert kfp_launcher.upload(out, str(tmp_path / "dataset"), kfp_launcher.LocalTree()).bytes == 5100
    assert kfp_launcher.upload(out, str(tmp_path / "nothing"), kfp_launcher.LocalTree()).bytes == 0
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


BULK_OUTPUTS = {"dataset", "augmented", "predictions"}  # what the data-heavy steps write by reference
SMALL_FILES = {"model": 4 * MB, "tensorboard": 200_000}  # the reference CNN's model; a few epochs of logs


def run_store(spec: dict, *, shards: int, by_reference: bool) -> kfp_launcher.Listing:
    """The objects of a run over a dataset of `shards` 128 MB shards (3.2 TB for 25,000: ten million 224 px
    photos), laid out as the steps write them: the bulk where datadir.bulk_dir puts it, manifests in artifacts."""
    sizes = {}
    for task, artifacts in kfp_launcher.task_artifacts(spec).items():
        for output in artifacts["outputs"]:
            uri = f"{RUN}/{task}/{output}"
            sizes[f"{uri}/manifest.json"] = SMALL_FILES.get(output, 40_000)
            if output in BULK_OUTPUTS:
                bulk = datadir.bulk_dir(uri, uri, by_reference=by_reference)
                for index in range(shards):
                    sizes[f"{bulk}/train/train-{index:05d}-of-{shards:05d}.tfrecord"] = SHARD
    return kfp_launcher.Listing(sizes)


def transfers(spec: dict, store: kfp_launcher.Listing) -> dict[str, kfp_launcher.PodTransfers]:
    present = {uri.rsplit("/", 1)[0] for uri in store.sizes}

    def artifact_uri(task, output):
        uri = f"{RUN}/{task}/{output}"
        return uri if uri in present else None

    # A step's local output folder holds what it uploads: the artifact's own objects.
    return kfp_launcher.pod_transfers(spec, artifact_uri, lambda task, output: f"{RUN}/{task}/{output}", store)


@pytest.mark.parametrize("launcher", config.TRAIN_LAUNCHERS)
def test_with_data_by_reference_no_pod_copies_the_dataset(tmp_path, launcher):
    spec = compiled(tmp_path, config.PipelineSettings(train_launcher=launcher))
    moved = transfers(spec, run_store(spec, shards=25_000, by_reference=True))
    assert set(moved) == set(training.task_names(config.PipelineSettings(train_launcher=launcher)).values())
    for task, pod in moved.items():
        assert pod.bytes < LIMIT, (task, [(t.artifact, t.bytes) for t in pod.downloads + pod.uploads])


def test_with_the_data_in_the_artifacts_every_reader_copies_it(tmp_path):
    """What this model says of the layout that Vertex AI mounts and that earlier releases used everywhere."""
    spec = compiled(tmp_path, config.PipelineSettings(train_launcher="trainjob"))
    moved = transfers(spec, run_store(spec, shards=20, by_reference=False))
    assert moved["train-cluster-job-op"].bytes > 2 * 20 * SHARD  # dataset and augmented, though its nodes stream
    assert moved["preprocess-op"].bytes > 20 * SHARD
    assert moved["placement-op"].bytes < LIMIT


# ---------------------------------------------------------------------------------------------- where data goes


def test_where_the_bulk_of_an_artifact_goes(caplog):
    uri, path = f"{RUN}/preprocess-op/dataset", f"/gcs/{RUN[5:]}/preprocess-op/dataset"
    assert datadir.bulk_dir(uri, path, by_reference=True) == uri + ".data"
    assert datadir.bulk_dir(uri, path, by_reference=False) == path  # Vertex AI: .path is a GCS FUSE mount
    assert datadir.bulk_dir(uri, path, data_root="gs://data/root") == \
        "gs://data/root/bucket/pipeline-root/image-classification/run-1/preprocess-op/dataset"
    assert datadir.bulk_dir(uri, path, data_root="/mnt/gcs/kfp-data", by_reference=True) == \
        "/mnt/gcs/kfp-data/bucket/pipeline-root/image-classification/run-1/preprocess-op/dataset"
    local = "/home/u/runs/pipeline_root/run/preprocess-op/dataset"  # kfp.local: the URI is the local folder
    assert datadir.bulk_dir(local, local, by_reference=True) == local
    minio = "minio://mlpipeline/v2/artifacts/run/preprocess-op/dataset"
    assert datadir.bulk_dir(minio, "/minio/mlpipeline/x", by_reference=True) == "/minio/mlpipeline/x"
    assert "give the pipeline a data_root" in caplog.text


@pytest.mark.parametrize("value, ok", [("", True), ("gs://b/data", True), ("/mnt/gcs/kfp-data", True),
                                       ("data", False), ("s3://b/data", False)])
def test_data_root_is_a_place_every_step_reaches(value, ok):
    from components import params

    assert (params.problems({"data_root": value}) == []) is ok
