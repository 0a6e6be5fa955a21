"""The model catalogue, bring-your-own builders, pretrained weights and transfer learning, on small real images
(Fashion-MNIST slices resized to 32x32, RGB or grayscale)."""

import hashlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

from components import params
from components.dataio import data
from components.train import TrainingLoop, TrainSettings, models, train
from components.train.faults import PreemptionWatch
from pipelines import parameters
from tests.conftest import REPO_ROOT

SLOW_BACKBONES = [name for name in models.BACKBONES if name != "mobilenet-v3-small"]


@pytest.fixture(scope="module")
def rgb32(fashion_dir, tmp_path_factory) -> str:
    """150 train-source and 150 test Fashion-MNIST images as 32x32 RGB."""
    from components.preprocess import preprocess

    out = str(tmp_path_factory.mktemp("rgb32"))
    preprocess(fashion_dir, out, limit=150, min_shards=2, image_size=32, channels=3)
    return out


@pytest.fixture(scope="module")
def gray32(fashion_dir, tmp_path_factory) -> str:
    from components.preprocess import preprocess

    out = str(tmp_path_factory.mktemp("gray32"))
    preprocess(fashion_dir, out, limit=100, min_shards=2, image_size=32, channels=1)
    return out


def check_export(model_dir: str, dataset_dir: str) -> None:
    """The SavedModel takes raw 0-255 pixels and returns probabilities, as the .keras model does."""
    import tensorflow as tf

    images, _ = data.load_split_arrays(dataset_dir, "test", limit=8)
    pixels = images.astype("float32")
    assert pixels.max() > 1.0  # raw pixels, not rescaled ones
    serve = tf.saved_model.load(os.path.join(model_dir, "saved_model")).signatures["serving_default"]
    probabilities = list(serve(tf.constant(pixels)).values())[0].numpy()
    assert probabilities.shape == (8, 10) and (probabilities >= 0).all()
    np.testing.assert_allclose(probabilities.sum(axis=1), 1.0, atol=1e-5)
    from_keras = data.load_classifier(model_dir).predict_proba(pixels)
    np.testing.assert_allclose(from_keras, probabilities, atol=1e-4)


def test_mobilenet_on_grayscale_trains_and_serves_raw_pixels(gray32, tmp_path):
    """Grayscale images are repeated to three channels inside the model; the export serves 1-channel raw pixels."""
    result = train(gray32, str(tmp_path / "model"), model="mobilenet-v3-small", epochs=1, batch_size=16,
                   validate=False)
    assert result.steps == result.steps_per_epoch
    check_export(str(tmp_path / "model"), gray32)
    with open(tmp_path / "model" / "training.json") as f:
        info = json.load(f)
    assert info["model"] == {"name": "mobilenet-v3-small", "pretrained": {"source": "none", "sha256": None},
                             "freeze_epochs": 0, "fine_tune_layers": 0}


@pytest.mark.slow
@pytest.mark.parametrize("name", SLOW_BACKBONES)
def test_every_backbone_trains_and_serves_raw_pixels(name, rgb32, tmp_path):
    result = train(rgb32, str(tmp_path / "model"), model=name, epochs=1, batch_size=16, validate=False)
    assert result.steps == result.steps_per_epoch > 0
    check_export(str(tmp_path / "model"), rgb32)


@pytest.mark.parametrize("name", ["mobilenet-v3-small", "resnet50"])
def test_backbones_batchnorm_momentum_is_capped_for_short_runs(name):
    """MobileNetV3 ships 0.999 and ResNet50 0.99: from scratch, a few epochs left their moving statistics so far
    behind the weights that the model in inference mode was at chance (see models._cap_batchnorm_momentum)."""
    import keras

    model = models.build(name, (32, 32, 3), 10)
    momenta = {layer.momentum for layer in model._flatten_layers()
               if isinstance(layer, keras.layers.BatchNormalization)}
    assert momenta and max(momenta) <= models.BATCHNORM_MOMENTUM_MAX == 0.9


def test_resnet50_preprocessing_is_keras_own():
    """The frozen layer in front of ResNet50 computes keras.applications.resnet50.preprocess_input."""
    import keras

    pixels = np.random.default_rng(0).uniform(0, 255, (2, 4, 4, 3)).astype("float32")
    np.testing.assert_allclose(models._caffe_preprocessing()(pixels),
                               keras.applications.resnet50.preprocess_input(pixels.copy()), atol=1e-4)


# ---------------------------------------------------------------------------------------------- bring your own


BUILDERS = '''
import keras


def build(image_shape, num_classes):
    inputs = keras.Input(shape=image_shape)
    x = keras.layers.Rescaling(1 / 255)(inputs)
    x = keras.layers.Conv2D(8, 3, activation="relu")(x)
    x = keras.layers.GlobalAveragePooling2D()(x)
    return keras.Model(inputs, keras.layers.Dense(num_classes, dtype="float32")(x))


def wrong_shape(image_shape, num_classes):
    inputs = keras.Input(shape=image_shape)
    return keras.Model(inputs, keras.layers.Dense(num_classes)(keras.layers.Flatten()(inputs))[:, :1])
'''


@pytest.fixture
def my_vision(tmp_path, monkeypatch):
    """A module `my_vision` with builders, importable as a user's would be (its folder on sys.path)."""
    folder = tmp_path / "user_code"
    folder.mkdir()
    (folder / "my_vision.py").write_text(textwrap.dedent(BUILDERS))
    monkeypatch.syspath_prepend(str(folder))
    yield str(folder)
    sys.modules.pop("my_vision", None)


def test_bring_your_own_model_trains_exports_and_is_recorded(my_vision, small_dataset, tmp_path):
    train(small_dataset, str(tmp_path / "model"), model="my_vision:build", epochs=1, validate=False)
    check_export(str(tmp_path / "model"), small_dataset)
    with open(tmp_path / "model" / "training.json") as f:
        assert json.load(f)["model"]["name"] == "my_vision:build"


@pytest.mark.parametrize("model, message", [
    ("my_vision:wrong_shape", r"produces outputs of shape \(2, 1\) .* must produce \(batch, num_classes\) = \(2, 10\)"),
    ("my_vision:missing", "module 'my_vision' .* has no function 'missing'"),
    ("not_installed.vision:build", "cannot import module 'not_installed.vision' .* must be importable where the "
                                   "training step runs"),
    ("efficientnet", "must be one of reference-cnn, mobilenet-v3-small, .*, or module:function"),
])
def test_a_model_that_cannot_work_is_refused_before_training(model, message, my_vision, small_dataset, tmp_path):
    with pytest.raises(models.ModelError, match=message):
        train(small_dataset, str(tmp_path / "model"), model=model, epochs=1, backup_dir=str(tmp_path / "backup"))
    assert not (tmp_path / "model").exists() and not (tmp_path / "backup").exists()  # nothing trained


def test_pipectl_checks_a_builder_it_can_import_and_warns_about_one_it_cannot(my_vision, caplog):
    from pipelines import cli

    cli.validate_parameters({"model": "my_vision:build", "image_size": 32})
    with pytest.raises(ValueError, match=r"must produce \(batch, num_classes\) = \(2, 3\)"):
        cli.validate_parameters({"model": "my_vision:wrong_shape", "classes": "a,b,c"})
    cli.validate_parameters({"model": "elsewhere.vision:build"})
    assert "cannot import module 'elsewhere.vision'" in caplog.text and "checked again in the training step" in caplog.text


@pytest.mark.parametrize("values, message", [
    ({"model": "resnet"}, "model must be one of reference-cnn"),
    ({"model": "mobilenet-v3-small"}, "model mobilenet-v3-small needs image_size >= 32 (got 28)"),
    ({"model": "resnet50", "image_size": 64, "pretrained": "imagenet"},
     "pretrained imagenet needs RGB images (the ImageNet weights were learned on colour photos): preprocess with "
     "channels=3"),
    ({"pretrained": "imagenet"}, "ImageNet weights for the catalogue's backbones"),
    ({"freeze_epochs": 2}, "freeze_epochs 2 with pretrained none would train only the head on a random backbone"),
    ({"fine_tune_layers": 10}, "fine_tune_layers applies to pretrained weights"),
])
def test_settings_that_cannot_work_are_refused_at_submission(values, message):
    defaults = {name: param.default for name, param in params.PARAMETERS.items()}
    found = parameters.problems(defaults | values)
    assert any(message in problem for problem in found), found


# ---------------------------------------------------------------------------------------------- pretrained weights


def backbone_weights(model) -> list[np.ndarray]:
    return [np.array(w) for layer in models.backbone_layers(model) for w in layer.get_weights()]


def prepared(settings: TrainSettings) -> TrainingLoop:
    loop = TrainingLoop(settings, validate=False)
    loop.prepare()
    loop.build()
    loop.restore()
    loop.last_save = time.monotonic()
    return loop


def run_one_epoch(loop: TrainingLoop) -> None:
    with PreemptionWatch() as watch:
        loop.run_epoch(watch, None)


def test_pretrained_backbone_is_loaded_frozen_in_phase_1_and_fine_tuned_in_phase_2(rgb32, tmp_path):
    """Backbone weights from a file: loaded exactly; phase 1 leaves them unchanged while the head trains; phase 2
    changes them, BatchNormalization statistics staying the pretrained ones (inference mode)."""
    import keras

    keras.utils.set_random_seed(1)
    source = models.build("mobilenet-v3-small", (32, 32, 3), 10)
    backbone = next(layer for layer in source.layers if layer.name == models.BACKBONE)
    backbone.save_weights(str(tmp_path / "backbone.weights.h5"))
    pretrained = backbone_weights(source)

    loop = prepared(TrainSettings(rgb32, str(tmp_path / "model"), model="mobilenet-v3-small", epochs=2,
                                  batch_size=16, pretrained=str(tmp_path / "backbone.weights.h5"),
                                  backup_dir=str(tmp_path / "backup")))
    assert (loop.weights.covers, loop.freeze_epochs) == ("backbone", 1)  # auto: the recipe's 2, at most half
    for loaded, expected in zip(backbone_weights(loop.model), pretrained, strict=True):
        np.testing.assert_array_equal(loaded, expected)
    head_before = loop.model.get_layer("logits").get_weights()[0].copy()

    run_one_epoch(loop)
    assert loop.phase == 1 and loop.step == loop.plan.steps_per_epoch
    for after, expected in zip(backbone_weights(loop.model), pretrained, strict=True):
        np.testing.assert_array_equal(after, expected)
    assert not np.allclose(loop.model.get_layer("logits").get_weights()[0], head_before)

    run_one_epoch(loop)
    assert loop.phase == 2 and loop.step == 2 * loop.plan.steps_per_epoch
    layers = models.backbone_layers(loop.model)
    trained = [layer for layer in layers if layer.trainable_weights]
    assert trained and all(not layer.trainable for layer in layers if isinstance(layer, keras.layers.BatchNormalization))
    changed = [not np.array_equal(np.array(w), before) for w, before in
               zip([w for layer in layers for w in layer.get_weights()], pretrained)]
    assert sum(changed) > len(trained) // 2
    for layer in layers:
        if isinstance(layer, keras.layers.BatchNormalization):  # moving statistics: the pretrained ones
            np.testing.assert_array_equal(np.array(layer.moving_mean), np.array(source.get_layer(models.BACKBONE)
                                                                                 .get_layer(layer.name).moving_mean))
    assert int(loop.head_optimizer.iterations.numpy()) == int(loop.optimizer.iterations.numpy()) == \
        loop.plan.steps_per_epoch
    assert loop.rate_at_step(loop.step - 1) < loop.rate_at_step(0) * 0.2  # the fine-tuning rate


def test_fine_tuning_a_registered_model_loads_it_caches_it_and_records_its_digest(small_dataset, tmp_path):
    champion = str(tmp_path / "champion")
    train(small_dataset, champion, epochs=1, validate=False)
    backup = str(tmp_path / "backup")
    loop = prepared(TrainSettings(small_dataset, str(tmp_path / "model"), epochs=1, pretrained=champion,
                                  backup_dir=backup))
    import keras

    champion_model = keras.models.load_model(os.path.join(champion, "model.keras"), compile=False)
    for loaded, saved in zip(loop.model.get_weights(), champion_model.get_weights(), strict=True):
        np.testing.assert_array_equal(loaded, saved)
    assert (loop.weights.covers, loop.freeze_epochs) == ("model", 0)  # the head is trained already
    cached = os.listdir(os.path.join(backup, "pretrained"))
    assert len(cached) == 1 and cached[0].endswith("model.keras")  # a retry reads it from here
    lineage = loop.model_lineage()
    with open(os.path.join(champion, "model.keras"), "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()
    assert lineage == {"name": "reference-cnn", "pretrained": {
        "source": champion, "sha256": digest, "source_model": {
            "name": "reference-cnn", "num_classes": 10, "image_shape": [28, 28, 1],
            "class_names": json.load(open(os.path.join(champion, "training.json")))["class_names"]}},
        "freeze_epochs": 0, "fine_tune_layers": 0}


def test_weights_of_another_architecture_are_refused_naming_both(small_dataset, rgb32, tmp_path):
    champion = str(tmp_path / "champion")
    train(rgb32, champion, epochs=1, validate=False)  # reference-cnn, 32x32x3
    with pytest.raises(models.ModelError, match=r"holds weights for model reference-cnn \(10 classes, input "
                                                r"\(32, 32, 3\)\), which do not fit model mobilenet-v3-small"):
        train(rgb32, str(tmp_path / "model"), model="mobilenet-v3-small", epochs=1, pretrained=champion)
    with pytest.raises(models.ModelError, match="does not exist"):
        train(rgb32, str(tmp_path / "model"), epochs=1, pretrained=str(tmp_path / "nothing.weights.h5"))


def test_imagenet_without_internet_or_cache_says_so_in_one_line(rgb32, tmp_path):
    """No internet here: the proxy points at a closed port so that the test does not depend on the machine's."""
    closed = "http://127.0.0.1:9"
    env = {**os.environ, "https_proxy": closed, "HTTPS_PROXY": closed, "http_proxy": closed, "HTTP_PROXY": closed,
           "KERAS_HOME": str(tmp_path / "keras"), "TF_CPP_MIN_LOG_LEVEL": "2"}
    result = subprocess.run([sys.executable, "-m", "components.train", "--dataset-dir", rgb32, "--model-dir",
                             str(tmp_path / "model"), "--model", "mobilenet-v3-small", "--pretrained", "imagenet",
                             "--epochs", "2"], cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == train_module().EXIT_PERMANENT, result.stderr[-2000:]
    error = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(error) == 1 and "no weights cache, and the download failed" in error[0], result.stderr[-2000:]
    assert "no internet access" in error[0]
    assert "run `pipectl weights --model mobilenet-v3-small --cache gs://BUCKET/weights`" in error[0]
    assert not (tmp_path / "model").exists()


def train_module():
    import components.train

    return components.train


def test_imagenet_with_one_channel_is_refused_before_building(gray32, tmp_path):
    with pytest.raises(models.ModelError, match="pretrained imagenet needs RGB images"):
        train(gray32, str(tmp_path / "model"), model="resnet50", pretrained="imagenet", epochs=1)


# ---------------------------------------------------------------------------------------------- preemption


@pytest.mark.slow
def test_killed_in_phase_2_resumes_in_phase_2_at_the_exact_step(small_dataset, tmp_path):
    from tests.test_fault_tolerance import Attempt

    import keras

    keras.utils.set_random_seed(3)
    models.build("reference-cnn", (28, 28, 1), 10).save_weights(str(tmp_path / "start.weights.h5"))
    common = ["--dataset-dir", small_dataset, "--epochs", "3", "--batch-size", "8", "--steps-per-execution", "1",
              "--input-mode", "memory", "--pretrained", str(tmp_path / "start.weights.h5"), "--freeze-epochs", "1"]
    reference = Attempt([*common, "--model-dir", str(tmp_path / "reference"), "--backup-dir", str(tmp_path / "rb")])
    assert reference.finish() == 0, "\n".join(reference.lines[-20:])
    with open(tmp_path / "reference" / "training.json") as f:
        info = json.load(f)
    freeze_steps = info["steps_per_epoch"]

    args = [*common, "--model-dir", str(tmp_path / "model"), "--backup-dir", str(tmp_path / "backup"),
            "--checkpoint-seconds", "0.25"]
    first = Attempt(args)
    deadline = time.monotonic() + 240
    while not any(step > freeze_steps + 5 for step in first.saved_steps()):
        assert first.process.poll() is None and time.monotonic() < deadline, "\n".join(first.lines[-20:])
        time.sleep(0.05)
    first.process.send_signal(signal.SIGTERM)
    assert first.finish() == train_module().EXIT_RETRY, "\n".join(first.lines[-20:])
    saved = first.saved_steps()[-1]

    second = Attempt(args)
    assert second.finish() == 0, "\n".join(second.lines[-20:])
    assert second.resumed_from() == saved > freeze_steps
    assert any("phase 2" in line for line in second.lines) and not any("phase 1" in line for line in second.lines)
    with open(tmp_path / "model" / "training.json") as f:
        resumed = json.load(f)
    assert resumed["steps"] == info["steps"] == 3 * freeze_steps
    assert resumed["model"]["freeze_epochs"] == 1 and resumed["model"]["pretrained"]["sha256"]
