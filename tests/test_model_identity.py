"""The registry's model digest (architecture + weights + class names, not timestamps or timings) and the lineage a
registered version records (the network and its pretrained weights), on real Keras model archives."""

import json
import os
import shutil
import zipfile

import numpy as np
import pytest

from components.register import register
from components.registry import LocalRegistry, model_digest, model_lineage
from components.registry.identity import ModelDigestError, _files_digest
from tests.conftest import preprocessed_slice

CLASSES = ["cat", "dog", "fox"]
LINEAGE = {"name": "mobilenet-v3-small",
           "pretrained": {"source": "gs://weights/mobilenet_v3_small.weights.h5", "sha256": "ab" * 32},
           "freeze_epochs": 2, "fine_tune_layers": 20}


def small_net(seed: int = 0, activation: str = "relu"):
    import keras

    keras.utils.set_random_seed(seed)
    return keras.Sequential([
        keras.Input((8, 8, 3), name="image"),
        keras.layers.Rescaling(1 / 255),
        keras.layers.Conv2D(4, 3, activation=activation),
        keras.layers.Flatten(),
        keras.layers.Dense(len(CLASSES), name="logits"),
    ], name="classifier")


def model_dir(root, name: str, model, *, class_names=CLASSES, train_seconds: float = 1.0, lineage=None) -> str:
    """A directory shaped like the train step's output: model.keras and training.json with timings."""
    path = root / name
    path.mkdir()
    model.save(str(path / "model.keras"))
    info = {"class_names": list(class_names), "image_shape": [8, 8, 3], "train_seconds": train_seconds,
            "images_per_second": 1000 / train_seconds, "history": {"loss": [train_seconds]}}
    if lineage is not None:
        info["model"] = lineage
    (path / "training.json").write_text(json.dumps(info))
    return str(path)


def restamp(archive: str, when=(2031, 5, 6, 7, 8, 10)) -> None:
    """Rewrites a .keras zip with other timestamps and another save date, as a later save of the same model."""
    with zipfile.ZipFile(archive) as z:
        members = [(info, z.read(info.filename)) for info in z.infolist()]
    with zipfile.ZipFile(archive, "w", zipfile.ZIP_DEFLATED) as z:
        for info, content in members:
            if info.filename == "metadata.json":
                content = json.dumps({**json.loads(content), "date_saved": "2031-05-06@07:08:10"}).encode()
            z.writestr(zipfile.ZipInfo(info.filename, date_time=when), content)


# ---------------------------------------------------------------------------------------------- the digest


def test_same_weights_give_the_same_digest_whatever_the_timestamps_and_timings(tmp_path):
    trained = small_net(seed=0)
    first = model_dir(tmp_path, "first", trained, train_seconds=1.0)
    # Another process's save of the same weights: a model built afresh (its layers auto-named conv2d_1, ...;
    # other Python ids in config.json's shared_object_id), other timings, other zip timestamps and save date.
    rebuilt = small_net(seed=1)
    rebuilt.set_weights(trained.get_weights())
    second = model_dir(tmp_path, "second", rebuilt, train_seconds=2.5)
    restamp(os.path.join(second, "model.keras"))

    def read(path, name):
        with open(os.path.join(path, name), "rb") as f:
            return f.read()

    assert read(first, "model.keras") != read(second, "model.keras")
    assert read(first, "training.json") != read(second, "training.json")
    assert _files_digest(first) != _files_digest(second)  # what the registry compared before
    assert model_digest(first) == model_digest(second)
    assert model_digest(first).startswith("sha256:") and len(model_digest(first)) == len("sha256:") + 64


def test_a_changed_weight_class_list_or_architecture_changes_the_digest(tmp_path):
    trained = small_net(seed=0)
    base = model_digest(model_dir(tmp_path, "base", trained))

    weights = trained.get_weights()
    weights[0] = weights[0].copy()
    weights[0].flat[5] = np.nextafter(weights[0].flat[5], np.float32(np.inf))  # one weight, by one ulp
    nudged = small_net(seed=0)
    nudged.set_weights(weights)
    assert model_digest(model_dir(tmp_path, "nudged", nudged)) != base

    assert model_digest(model_dir(tmp_path, "renamed", trained, class_names=["cat", "dog", "wolf"])) != base
    assert model_digest(model_dir(tmp_path, "reordered", trained, class_names=["dog", "cat", "fox"])) != base

    other_activation = small_net(seed=0, activation="tanh")  # the same weight shapes, another network
    other_activation.set_weights(trained.get_weights())
    assert model_digest(model_dir(tmp_path, "tanh", other_activation)) != base


def test_a_retrain_with_the_same_seed_is_the_same_version(fashion_dir, tmp_path_factory, tmp_path):
    """Training here (CPU) is bit-identical for one seed: two runs give one digest and one registered version."""
    import h5py

    from components.train import train

    dataset = preprocessed_slice(fashion_dir, tmp_path_factory, "identity_dataset", limit=300)
    runs = [str(tmp_path / "run1"), str(tmp_path / "run2")]
    for run in runs:
        train(dataset, run, epochs=1)

    def weights(run):
        with zipfile.ZipFile(os.path.join(run, "model.keras")) as z:
            z.extract("model.weights.h5", str(tmp_path / os.path.basename(run)))
        with h5py.File(str(tmp_path / os.path.basename(run) / "model.weights.h5")) as h5:
            found = {}
            h5.visititems(lambda path, obj: found.__setitem__(path, obj[()]) if isinstance(obj, h5py.Dataset) else None)
            return found

    first, second = weights(runs[0]), weights(runs[1])
    assert first.keys() == second.keys() and all(np.array_equal(first[k], second[k]) for k in first)
    timings = [json.load(open(os.path.join(run, "training.json")))["train_seconds"] for run in runs]
    assert timings[0] != timings[1]
    assert model_digest(runs[0]) == model_digest(runs[1])

    registry = LocalRegistry(str(tmp_path / "registry"))
    one = register(runs[0], registry, model_name="clf")
    two = register(runs[1], registry, model_name="clf")
    assert one.new_version and not two.new_version and two.version.version == "1"


def test_unreadable_archives_are_refused_with_the_reason(tmp_path):
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "model.keras").write_bytes(b"not a zip")
    with pytest.raises(ModelDigestError, match="Cannot read the model archive .*broken/model.keras"):
        model_digest(str(broken))
    partial = tmp_path / "partial"
    partial.mkdir()
    with zipfile.ZipFile(partial / "model.keras", "w") as z:
        z.writestr("config.json", "{}")
    with pytest.raises(ModelDigestError, match="not a Keras 3 model archive: it lacks model.weights.h5"):
        model_digest(str(partial))


# ---------------------------------------------------------------------------------------------- lineage


def test_registration_records_the_lineage_in_the_local_registry(tmp_path):
    registry = LocalRegistry(str(tmp_path / "registry"))
    path = model_dir(tmp_path, "m", small_net(), lineage=LINEAGE)
    first = register(path, registry, model_name="clf", metrics={"accuracy": 0.9})
    assert first.version.lineage == LINEAGE
    assert first.to_json()["lineage"] == LINEAGE  # what the register step writes to its output artifact
    with open(tmp_path / "registry" / "clf" / "index.json") as f:
        (entry,) = json.load(f)["versions"]
    assert entry["lineage"] == LINEAGE and entry["digest"] == model_digest(path)
    assert LocalRegistry(str(tmp_path / "registry")).champion("clf").lineage == LINEAGE
    # The lineage is not part of the digest: the same model found again keeps its version.
    assert not register(path, registry, model_name="clf").new_version


def test_lineage_of_older_and_bare_model_directories(tmp_path):
    older = model_dir(tmp_path, "older", small_net())  # training.json written before the `model` key
    assert model_lineage(older) == {"name": "reference-cnn", "pretrained": {"source": "none", "sha256": None}}
    bare = tmp_path / "bare" / "saved_model"
    bare.mkdir(parents=True)
    (bare / "saved_model.pb").write_bytes(b"pb")
    assert model_lineage(str(tmp_path / "bare")) == {}
    registry = LocalRegistry(str(tmp_path / "registry"))
    assert register(str(tmp_path / "bare"), registry, model_name="clf").version.lineage == {}
    assert register(older, registry, model_name="clf").version.lineage["name"] == "reference-cnn"
    # Versions in an index written before lineage was recorded read back with none.
    index_path = tmp_path / "registry" / "clf" / "index.json"
    index = json.loads(index_path.read_text())
    for entry in index["versions"]:
        entry.pop("lineage")
    index_path.write_text(json.dumps(index))
    assert [v.lineage for v in registry.versions("clf")] == [{}, {}]


def test_bring_your_own_lineage_and_malformed_model_keys(tmp_path):
    own = {"name": "my_models.vision:build", "pretrained": {"source": "none", "sha256": None}}
    path = model_dir(tmp_path, "own", small_net(), lineage=own)
    assert model_lineage(path) == own
    bad = model_dir(tmp_path, "bad", small_net(), lineage={"pretrained": "imagenet"})
    with pytest.raises(ModelDigestError, match="'model' must be an object with a 'name'"):
        register(bad, LocalRegistry(str(tmp_path / "registry")), model_name="clf")
    garbled = tmp_path / "garbled"
    shutil.copytree(path, garbled)
    (garbled / "training.json").write_text("[1]")
    with pytest.raises(ModelDigestError, match="not the JSON object the train step writes"):
        model_digest(str(garbled))
