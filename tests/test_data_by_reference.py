"""Data by reference, run for real: the compiled pipeline with kfp.local over a synthetic dataset larger than what a
pod may copy, its shards and predictions under a data root; what the KFP launcher would copy for each of its pods
(pipelines/backend/kfp_launcher.py), for every train launcher; and the pipeline on a class-folder tree of photos."""

import glob
import gzip
import json
import os
import struct

import numpy as np
import pytest

from components.dataio import data, datadir
from pipelines import cli, config, training
from pipelines.backend import kfp_launcher
from tests.conftest import write_png

MB = 1 << 20
LIMIT = 10 * MB
RUN_URI = "gs://bucket/pipeline-root/image-classification/run-1"  # where a KFP backend would keep the run


def write_idx(path: str, array: np.ndarray) -> None:
    header = struct.pack(">HBB", 0, 0x08, array.ndim) + struct.pack(f">{array.ndim}I", *array.shape)
    with gzip.open(path, "wb", compresslevel=1) as f:
        f.write(header + array.astype(np.uint8).tobytes())


def synthetic_idx(folder: str, train: int, test: int, seed: int = 0) -> str:
    """Noisy 28x28 images of 10 classes, each a bright band at its own height: learnable in one epoch."""
    rng = np.random.default_rng(seed)
    os.makedirs(folder, exist_ok=True)
    for prefix, count in (("train", train), ("t10k", test)):
        labels = rng.integers(0, 10, count)
        images = rng.integers(0, 90, (count, 28, 28))
        for label in range(10):
            images[labels == label, 2 + 2 * label:5 + 2 * label, :] += 160
        write_idx(os.path.join(folder, f"{prefix}-images-idx3-ubyte.gz"), np.clip(images, 0, 255))
        write_idx(os.path.join(folder, f"{prefix}-labels-idx1-ubyte.gz"), labels)
    return folder


def tree_bytes(folder: str) -> int:
    return sum(kfp_launcher.LocalTree().listing(folder.rstrip("/") + "/").values())


@pytest.fixture(scope="module")
def large_run(tmp_path_factory):
    """A local run over 20,000 images (about 18 MB of shards) that also predicts all of them, with
    data_root set: the data outside the artifacts, as a KFP backend gets it."""
    from components.preprocess import preprocess

    base = tmp_path_factory.mktemp("by_reference")
    source = synthetic_idx(str(base / "source"), train=16_000, test=4_000)
    to_predict = str(base / "to_predict")
    preprocess(source, to_predict, min_shards=2)
    summary = cli.run_local({"data": source, "epochs": 1, "min_accuracy": 0.0, "tolerance": 1.0,
                             "data_root": str(base / "data"),
                             "predict_images": os.path.join(to_predict, "*", "*.tfrecord")}, str(base / "run"))
    return base, summary


@pytest.mark.slow
def test_the_data_lives_under_the_data_root_and_the_artifacts_point_there(large_run):
    base, summary = large_run
    data_root, run_dir = str(base / "data"), summary["run_dir"]
    assert summary["images"]["test"] == 4000 and summary["predictions"]["count"] == 20_000
    assert not glob.glob(os.path.join(run_dir, "**", "*.tfrecord"), recursive=True)  # no shard in an artifact
    dataset = data.read_manifest(summary["artifacts"]["preprocess"]["dataset"])
    # Below the data root, as <run>/<task>/<output>: not the run folder's whole path again.
    run_name = os.path.basename(run_dir)
    assert dataset["data_dir"] == os.path.join(data_root, run_name, training.task_names()["preprocess"], "dataset")
    assert all(info["path"].startswith(dataset["data_dir"] + "/") for info in dataset["splits"].values())
    augmented = data.read_manifest(summary["artifacts"]["augment"]["augmented"])
    assert augmented["splits"]["train"]["path"] == dataset["splits"]["train"]["path"]  # passed through
    assert summary["predictions"]["path"].startswith(data_root + "/")
    # The KFP UI's lineage: the artifacts say where their data is.
    with open(os.path.join(run_dir, training.task_names()["preprocess"], "executor_output.json")) as f:
        metadata = json.load(f)["artifacts"]["dataset"]["artifacts"][0]["metadata"]
    assert metadata["data_dir"] == dataset["data_dir"] and metadata["test"] == 4000
    assert tree_bytes(dataset["data_dir"]) > 15 * MB
    assert tree_bytes(os.path.dirname(summary["predictions"]["path"])) > LIMIT


@pytest.mark.slow
@pytest.mark.parametrize("release", ["2.5.0", "2.16.1", "2.17.0"])
@pytest.mark.parametrize("launcher", config.TRAIN_LAUNCHERS)
def test_no_pod_copies_more_than_10_mb_for_any_train_launcher(large_run, tmp_path, launcher, release):
    """Each pod of the run as a KFP backend with a gs:// pipeline root would run it: the launcher's rule of
    `release` applied to the files the steps wrote (before 2.17.0 it also copies every object whose key starts with
    an artifact's). A cluster launcher's task has the train task's inputs and outputs (its job copies the model
    back)."""
    import yaml

    _, summary = large_run
    settings = config.PipelineSettings(train_launcher=launcher)
    with open(training.compile_pipeline(str(tmp_path / "pipeline.yaml"), settings)) as f:
        spec = next(yaml.safe_load_all(f))
    compiled, ran = training.task_names(settings), training.task_names()  # the local run trained in train-op
    role_of = {task: role for role, task in compiled.items()}

    store = kfp_launcher.LocalTree(uri_root=RUN_URI, local_root=summary["run_dir"])

    def artifact_uri(task: str, output: str) -> str | None:  # None: the task did not run
        local_task = ran[role_of[task]]
        return f"{RUN_URI}/{local_task}/{output}" if os.path.isdir(os.path.join(summary["run_dir"], local_task)) \
            else None

    moved = kfp_launcher.pod_transfers(spec, artifact_uri, artifact_uri, store, release)
    assert set(moved) == set(compiled.values())
    for task, pod in moved.items():
        assert pod.beside == [], (task, pod.beside[:3])
        assert pod.bytes < LIMIT, (task, [(t.artifact, t.bytes) for t in pod.downloads + pod.uploads])
    train = moved[compiled["train"]]
    assert {(t.artifact, t.note) for t in train.downloads} == {("dataset", "copied whole"),
                                                              ("augmented", "copied whole")}
    assert all(t.bytes > 1000 for t in train.downloads)  # the manifests are counted
    assert next(t.bytes for t in train.uploads if t.artifact == "model") > 100_000


@pytest.mark.parametrize("where", ["data root", "beside the artifact (earlier releases)"])
def test_a_dataset_published_by_reference_reads_as_the_original(small_dataset, tmp_path, where):
    """The artifact's manifest points at the shards, rejected inputs and sample grid where they are, wherever that
    is: under a data root, or `ARTIFACT.data` as earlier releases wrote on a KFP backend; a dataset written in its
    artifact (Vertex AI, local runs) keeps reading as it did."""
    import shutil

    from components.preprocess import dataset_card

    artifact = str(tmp_path / "artifact")
    data_dir = small_dataset if where == "data root" else shutil.copytree(small_dataset, artifact + ".data")
    reference = datadir.publish_dataset(data_dir, artifact)
    assert os.listdir(artifact) == [data.MANIFEST] and reference["data_dir"] == data_dir
    for split in data.SPLITS:
        original_images, original_labels = data.load_split_arrays(small_dataset, split)
        images, labels = data.load_split_arrays(artifact, split)
        assert np.array_equal(images, original_images) and np.array_equal(labels, original_labels)
    assert "Sample training images" in dataset_card(artifact)
    assert datadir.publish_dataset(small_dataset, small_dataset) == data.read_manifest(small_dataset)


@pytest.mark.slow
def test_the_local_pipeline_finishes_on_a_class_folder_tree_of_photos(tmp_path):
    """JPEG photos of three classes at 64 px (source records: the files' bytes), the local run's default layout."""
    rng = np.random.default_rng(1)
    colours = {"poppy": (200, 40, 40), "fern": (40, 170, 60), "cornflower": (50, 70, 210)}
    for name, colour in colours.items():
        for index in range(60):
            photo = np.clip(np.array(colour) + rng.normal(0, 40, (80, 96, 3)), 0, 255).astype(np.uint8)
            path = tmp_path / "photos" / name / f"IMG_{index:04d}.jpg"
            path.parent.mkdir(parents=True, exist_ok=True)
            from PIL import Image

            Image.fromarray(photo).save(path, quality=90)
    write_png(str(tmp_path / "photos" / "fern" / "scan.png"), np.full((64, 64, 3), 60, np.uint8))
    summary = cli.run_local({"data": str(tmp_path / "photos"), "image_size": 64, "channels": 3, "epochs": 1,
                             "min_accuracy": 0.0, "tolerance": 1.0}, str(tmp_path / "run"))
    assert sum(summary["images"][s] for s in data.SPLITS) == 181 and summary["images"]["rejected"] == 0
    assert data.read_manifest(summary["artifacts"]["preprocess"]["dataset"])["image_encoding"] == data.SOURCE
    assert summary["predictions"]["count"] > 0 and os.path.exists(summary["predictions"]["path"])
    assert summary["registered"]["version"] == "1"
