"""A model trained where TensorFlow is not installed (model.keras and the pending marker, no saved_model/) registered
into Vertex AI: the register step makes its SavedModel from model.keras and stages it as MODEL_DIR/serving/1/.

Real aiplatform client against tests/standins/vertex_api.py (as tests/test_registry_vertex.py); the model is the
project's reference CNN written by the train step's own `write_model`, its saved_model/ then removed and the marker
written, as components/train/frameworks/portable.py leaves it on the PyTorch GPU image.
"""

from __future__ import annotations

import json
import os
import shutil

import numpy as np
import pytest

from components.dataio import data
from components.register import register
from components.registry import LocalRegistry, model_digest
from components.registry import identity
from components.registry.vertex import EXPORT_NO_TENSORFLOW, SERVING_FOLDER, SavedModelUnavailable
from components.train import export as train_export
from components.train import model as train_model
from tests.conftest import require_framework
from tests.test_registry_vertex import MODEL, gcs, make_registry, sleeps, vertex  # noqa: F401

pytestmark = pytest.mark.usefixtures("loopback_only")

IMAGE_SHAPE = [28, 28, 1]
CLASSES = ["zero", "one", "two"]
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def pending_model(root) -> str:
    """model.keras + training.json + SAVED_MODEL_PENDING, no saved_model/."""
    from components.train.models import build

    keras_model = build("reference-cnn", IMAGE_SHAPE, len(CLASSES))
    rng = np.random.default_rng(7)
    keras_model.set_weights([rng.normal(0, 0.05, w.shape).astype("float32") for w in keras_model.get_weights()])
    model_dir = str(root)
    train_model.write_model(keras_model, IMAGE_SHAPE, len(CLASSES), model_dir)
    data.write_json(os.path.join(model_dir, "training.json"), {
        "class_names": CLASSES, "image_shape": IMAGE_SHAPE, "framework": "torch",
        "model": {"name": "reference-cnn", "pretrained": {"source": "none", "sha256": None}}})
    shutil.rmtree(os.path.join(model_dir, "saved_model"))
    data.write_json(os.path.join(model_dir, train_model.SAVED_MODEL_PENDING), {
        "reason": "trained where TensorFlow is not installed",
        "complete_with": f"python -m components.train.export {model_dir}"})
    return model_dir


@pytest.fixture
def no_tensorflow(tmp_path, monkeypatch):
    """Processes started from here cannot import TensorFlow, as on the PyTorch GPU image (which has none)."""
    blocker = tmp_path / "without-tensorflow"
    blocker.mkdir()
    (blocker / "tensorflow.py").write_text("raise ModuleNotFoundError(\"No module named 'tensorflow'\")\n")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(blocker), REPO]))


def test_constants_agree_with_the_train_step():
    """The registry names the train step's marker and exit code without importing it."""
    assert identity.SAVED_MODEL_PENDING == train_model.SAVED_MODEL_PENDING
    assert EXPORT_NO_TENSORFLOW == train_export.NO_TENSORFLOW


def test_pending_model_registers_into_vertex_with_a_servable_saved_model(vertex, gcs, sleeps):
    import keras
    import tensorflow as tf

    registry = make_registry(vertex, gcs, sleeps, serving_image=None)  # TensorFlow Serving, versioned copy
    model_dir = pending_model(gcs / "bkt/runs/r1/model")
    digest = model_digest(model_dir)
    before = sorted(os.listdir(model_dir))

    first = register(model_dir, registry, model_name=MODEL, metrics={"accuracy": 0.5})
    assert first.new_version and first.version.digest == digest
    assert first.version.uri == f"gs://bkt/runs/r1/model/{SERVING_FOLDER}"
    assert first.version.lineage["framework"] == "torch"
    (call,) = vertex.calls("UploadModel")
    assert call.body["model"]["artifactUri"] == f"gs://bkt/runs/r1/model/{SERVING_FOLDER}"
    # The train step's output is left as it was: no saved_model/ written into it, the marker kept.
    assert sorted(os.listdir(model_dir)) == sorted(before + [SERVING_FOLDER])
    staged = os.path.join(model_dir, SERVING_FOLDER, "1")
    assert os.path.isfile(os.path.join(staged, "saved_model.pb"))

    # What TensorFlow Serving would load predicts what the Keras model does.
    pixels = np.random.default_rng(3).integers(0, 256, (5, *IMAGE_SHAPE)).astype("float32")
    served = tf.saved_model.load(staged).signatures["serving_default"](tf.constant(pixels))
    (probabilities,) = served.values()
    expected = keras.ops.convert_to_numpy(keras.activations.softmax(
        keras.models.load_model(os.path.join(model_dir, "model.keras"), compile=False)(pixels)))
    np.testing.assert_allclose(probabilities.numpy(), expected, atol=1e-5)

    # A retried register finds the version by its digest (model.keras + training.json, not the SavedModel):
    # nothing uploaded, nothing staged again.
    pb = open(os.path.join(staged, "saved_model.pb"), "rb").read()
    again = register(model_dir, registry, model_name=MODEL, metrics={"accuracy": 0.5})
    assert not again.new_version and again.version.version == first.version.version
    assert len(vertex.calls("UploadModel")) == 1 and len(vertex.versions(MODEL)) == 1
    assert open(os.path.join(staged, "saved_model.pb"), "rb").read() == pb
    assert model_digest(model_dir) == digest


def test_an_attempt_that_staged_but_did_not_upload_is_completed_with_the_staged_copy(vertex, gcs, sleeps,
                                                                                     no_tensorflow):
    """serving/1/ staged by an attempt that ended before its upload: the retry uploads that copy as it is (the
    export is not byte-stable, so making it again would differ), without needing TensorFlow to export again."""
    model_dir = pending_model(gcs / "bkt/runs/r2/model")
    staged = os.path.join(model_dir, SERVING_FOLDER, "1")
    train_model.complete_saved_model(model_dir, output_dir=os.path.join(str(gcs), "scratch"))
    shutil.copytree(os.path.join(str(gcs), "scratch"), staged)
    pb = open(os.path.join(staged, "saved_model.pb"), "rb").read()

    version = register(model_dir, make_registry(vertex, gcs, sleeps, serving_image=None), model_name=MODEL).version
    assert version.uri == f"gs://bkt/runs/r2/model/{SERVING_FOLDER}"
    assert open(os.path.join(staged, "saved_model.pb"), "rb").read() == pb
    assert os.path.exists(os.path.join(model_dir, train_model.SAVED_MODEL_PENDING))


def test_upload_refuses_in_one_line_when_no_saved_model_can_be_made(vertex, gcs, sleeps, no_tensorflow):
    registry = make_registry(vertex, gcs, sleeps, serving_image=None)
    model_dir = pending_model(gcs / "bkt/runs/r3/model")
    with pytest.raises(SavedModelUnavailable) as refused:
        register(model_dir, registry, model_name=MODEL)
    message = str(refused.value)
    assert "\n" not in message
    assert "no TensorFlow in" in message and train_model.SAVED_MODEL_PENDING in message
    assert f"python -m components.train.export {model_dir}" in message
    assert vertex.calls("UploadModel") == [] and vertex.model_ids() == []
    assert not os.path.exists(os.path.join(model_dir, SERVING_FOLDER))

    # An export that fails for another reason says so, with its last line.
    registry = make_registry(vertex, gcs, sleeps, serving_image=None, export_python="/nonexistent/python3")
    with pytest.raises(SavedModelUnavailable, match=r"exporting it failed \(exit -1: .*nonexistent"):
        register(model_dir, registry, model_name=MODEL)
    assert vertex.calls("UploadModel") == []


def test_prebuilt_container_is_given_the_staged_saved_model_itself(vertex, gcs, sleeps):
    """A Vertex AI prebuilt image loads the SavedModel at the artifact URI itself: serving/1, not serving/."""
    registry = make_registry(vertex, gcs, sleeps)  # the prebuilt tf2-cpu.2-15 container
    model_dir = pending_model(gcs / "bkt/runs/r4/model")
    version = register(model_dir, registry, model_name=MODEL).version
    assert version.uri == f"gs://bkt/runs/r4/model/{SERVING_FOLDER}/1"
    assert os.path.isfile(os.path.join(model_dir, SERVING_FOLDER, "1", "saved_model.pb"))


def test_the_same_version_before_and_after_its_saved_model_is_written(tmp_path):
    """The digest leaves out saved_model/ and the marker: completing the model in place (`python -m
    components.train.export MODEL_DIR`) does not make it another version; the local registry registers the
    directory as it is (evaluation and prediction read model.keras; nothing serves from the local registry)."""
    model_dir = pending_model(tmp_path / "model")
    local = LocalRegistry(str(tmp_path / "registry"))
    first = register(model_dir, local, model_name=MODEL)
    assert sorted(os.listdir(first.version.uri)) == ["model.keras", train_model.SAVED_MODEL_PENDING, "training.json"]

    assert train_model.complete_saved_model(model_dir)
    assert not os.path.exists(os.path.join(model_dir, train_model.SAVED_MODEL_PENDING))
    again = register(model_dir, local, model_name=MODEL)
    assert not again.new_version and again.version.version == first.version.version
    assert json.load(open(os.path.join(model_dir, "training.json")))["framework"] == "torch"


@pytest.mark.slow
def test_trained_on_torch_without_tensorflow_then_registered_and_served_by_tensorflow(small_dataset, tmp_path, vertex,
                                                                                      gcs, sleeps):
    """The whole way: the training step on torch where TensorFlow cannot be imported (a package of that name that
    raises ImportError first on the path, as tests/test_frameworks.py does) leaves the SavedModel pending; the
    register step makes it, and TensorFlow Serving's copy predicts what the model does."""
    import subprocess
    import sys

    import keras
    import tensorflow as tf

    require_framework("torch")
    shadow = tmp_path / "no-tensorflow" / "tensorflow"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ImportError('TensorFlow is not installed here')\n")
    model_dir = gcs / "bkt/runs/torch/model"
    done = subprocess.run([sys.executable, "-m", "components.train", "--framework", "torch", "--dataset-dir",
                           small_dataset, "--model-dir", str(model_dir), "--epochs", "1", "--batch-size", "32",
                           "--tensorboard-dir", str(tmp_path / "logs")], cwd=REPO, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join([str(shadow.parent), REPO])}, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert sorted(os.listdir(model_dir)) == ["model.keras", train_model.SAVED_MODEL_PENDING, "training.json"]

    registry = make_registry(vertex, gcs, sleeps, serving_image=None)
    first = register(str(model_dir), registry, model_name=MODEL)
    assert first.version.lineage["framework"] == "torch"
    staged = os.path.join(model_dir, SERVING_FOLDER, "1")
    pixels = np.random.default_rng(5).integers(0, 256, (8, 28, 28, 1)).astype("float32")
    (served,) = tf.saved_model.load(staged).signatures["serving_default"](tf.constant(pixels)).values()
    expected = keras.ops.convert_to_numpy(keras.activations.softmax(
        keras.models.load_model(str(model_dir / "model.keras"), compile=False)(pixels)))
    np.testing.assert_allclose(served.numpy(), expected, atol=1e-5)
    again = register(str(model_dir), registry, model_name=MODEL)
    assert not again.new_version and len(vertex.versions(MODEL)) == 1
