"""PyTorch-native models: `--model module:function` returning a torch.nn.Module under `--framework torch`
(components/train/frameworks/torch.py). The builders are tests/byo_torch.py's.

- pipectl and the training step refuse, in one line, a torch.nn.Module off torch, one whose output is not
  (batch, classes), and a builder that returns neither a keras.Model nor a torch.nn.Module;
- it trains in the step (TensorBoard, checkpoints, a SIGTERM then a step-exact resume that ends with the same
  weights as a run never stopped; two processes on gloo; autocast in a mixed precision), and the step writes
  TorchScript, not model.keras;
- load_classifier (evaluation, the champion gate, batch prediction) serves the TorchScript with the module's own
  probabilities, without the builder's code;
- the registries record framework and serving format; Vertex AI refuses it before anything is uploaded (real
  aiplatform client against tests/standins/vertex_api.py).

The training step runs in processes of its own (Keras on its torch backend); this process keeps its own Keras.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import numpy as np
import pytest

from components import train
from components.dataio import data
from components.register import describe_lineage, register
from components.registry import LocalRegistry, identity, model_digest, model_lineage
from components.registry.vertex import FRAMEWORK_LABEL, SERVING_FORMAT_LABEL, ServingFormatUnsupported
from tests.conftest import require_framework
from tests.test_fault_tolerance import Attempt
from tests.test_registry_vertex import MODEL, gcs, make_registry, sleeps, vertex  # noqa: F401

torch = require_framework("torch")

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
IMAGE_SHAPE = [28, 28, 1]
CLASSES = ["zero", "one", "two"]
BUILDER = "tests.byo_torch:build"
THREADS = {"OMP_NUM_THREADS": "1"}


def torchscript_model(model_dir, builder=None, seed: int = 0) -> tuple[str, torch.nn.Module]:
    """A model directory as the train step leaves it for a torch.nn.Module: the TorchScript and training.json."""
    from components.train.frameworks.torch import write_torchscript
    from tests import byo_torch

    torch.manual_seed(seed)
    module = (builder or byo_torch.build)(IMAGE_SHAPE, len(CLASSES))
    write_torchscript(module, IMAGE_SHAPE, str(model_dir))
    data.write_json(os.path.join(model_dir, "training.json"), {
        "class_names": CLASSES, "image_shape": IMAGE_SHAPE, "framework": "torch", "serving_format": "torchscript",
        "serving_file": data.TORCHSCRIPT_FILE, "saved_model": "none",
        "model": {"name": BUILDER, "pretrained": {"source": "none", "sha256": None}}})
    return str(model_dir), module


def pixels(count: int = 5) -> np.ndarray:
    return np.random.default_rng(3).integers(0, 256, (count, *IMAGE_SHAPE)).astype("uint8")


# ---------------------------------------------------------------------------------------------- refusals


def parameter_problem(**given) -> str:
    from pipelines import parameters

    with pytest.raises(ValueError) as refused:
        parameters.validate_parameters(given)
    return str(refused.value)


def test_pipectl_checks_a_torch_module_with_torch_and_refuses_it_off_torch():
    from pipelines import parameters

    parameters.validate_parameters({"model": BUILDER, "framework": "torch"})  # built once here, and fine
    assert parameter_problem(model=BUILDER) == (
        f"model {BUILDER} returned a torch.nn.Module (SmallNet), which trains with --framework torch only (Keras' "
        "torch backend wraps it): run with --framework torch, or return a keras.Model")
    assert "returns (2, 11) for a batch of shape (2, 1, 28, 28) (N x C x H x W); it must return a tensor of " \
           "(batch, num_classes) = (2, 10) logits" in parameter_problem(model="tests.byo_torch:build_wrong_output",
                                                                       framework="torch")
    assert "fails on a float32 batch of shape (2, 1, 28, 28) (N x C x H x W): Given groups=1" in parameter_problem(
        model="tests.byo_torch:build_channels_last", framework="torch")
    assert "returned dict, not a keras.Model" in parameter_problem(model="tests.byo_torch:build_not_a_model",
                                                                  framework="torch")
    assert "Vertex AI registry's serving containers load TensorFlow SavedModels only " \
           "(docs/registry.md#torchscript-on-vertex-ai): use a keras.Model builder, or registry local on a KFP " \
           "backend or locally" in parameter_problem(model=BUILDER, framework="torch", registry="vertex")


def run_step(args: list[str], env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "components.train", *args], cwd=REPO_ROOT, capture_output=True,
                          text=True, timeout=600, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", **THREADS,
                                                       **(env or {})})


@pytest.mark.parametrize("builder, framework, extra, expected", [
    ("tests.byo_torch:build", "tensorflow", [], "returned a torch.nn.Module (SmallNet), which trains with "
                                                "--framework torch only"),
    ("tests.byo_torch:build_wrong_output", "torch", [], "returns (2, 11) for a batch of shape (2, 1, 28, 28)"),
    ("tests.byo_torch:build_not_a_model", "torch", [], "returned dict, not a keras.Model"),
    ("tests.byo_torch:build", "torch", ["--pretrained", "TMP/net.weights.h5"],
     "net.weights.h5: model tests.byo_torch:build is a torch.nn.Module, whose starting weights are its builder's "
     "to load (e.g. module.load_state_dict(...)): pass pretrained none"),
])
def test_the_training_step_refuses_before_training(builder, framework, extra, expected, small_dataset, tmp_path):
    (tmp_path / "net.weights.h5").write_bytes(b"weights")
    extra = [arg.replace("TMP", str(tmp_path)) for arg in extra]
    done = run_step(["--framework", framework, "--model", builder, "--dataset-dir", small_dataset, "--model-dir",
                     str(tmp_path / "model"), "--epochs", "1", *extra])
    assert done.returncode == train.EXIT_PERMANENT, done.stderr[-2000:]
    assert expected in done.stderr
    assert "starting at step" not in done.stderr and not (tmp_path / "model" / "training.json").exists()


def test_in_a_mixed_precision_the_module_runs_under_autocast_with_float32_parameters_and_logits():
    """Keras on torch (a process of its own): the module's convolutions compute in the policy's dtype, its
    parameters stay float32, the logits the loss sees are float32; BatchNorm statistics are Keras variables."""
    out = subprocess.run([sys.executable, "-c", """
from components.train import frameworks
frameworks.use("torch")
import numpy as np
from components.train import models
from components.train.frameworks.torch import Backend, torch_module_of
for policy in ("float32", "mixed_bfloat16", "mixed_float16"):
    model = models.build("tests.byo_torch:build", (28, 28, 1), 3, policy, native=Backend.native_model)
    module, seen = torch_module_of(model), []
    module.features[0].register_forward_hook(lambda m, i, o: seen.append(str(o.dtype)))
    logits = model(np.ones((4, 28, 28, 1), "float32"), training=True)
    print(policy, seen[-1], str(logits.dtype), {str(p.dtype) for p in module.parameters()},
          len(model.trainable_variables), len(model.non_trainable_variables))
"""], cwd=REPO_ROOT, capture_output=True, text=True, timeout=300, env={**os.environ, **THREADS})
    assert out.returncode == 0, out.stderr[-2000:]
    # 8 trainable (2 convolutions, BatchNorm's scale and shift, the head); BatchNorm's mean, variance and count
    assert out.stdout.splitlines() == [
        "float32 torch.float32 torch.float32 {'torch.float32'} 8 3",
        "mixed_bfloat16 torch.bfloat16 torch.float32 {'torch.float32'} 8 3",
        "mixed_float16 torch.float16 torch.float32 {'torch.float32'} 8 3"]


# ---------------------------------------------------------------------------------------------- serving format


def test_load_classifier_serves_the_torchscript_with_the_modules_probabilities(tmp_path):
    """Evaluation, the champion gate and batch prediction load models through load_classifier: the TorchScript
    takes N x H x W x C pixels (uint8 or float) and gives the module's softmax, without tests/byo_torch."""
    model_dir, module = torchscript_model(tmp_path / "model")
    classifier = data.load_classifier(model_dir)
    assert classifier.image_shape == IMAGE_SHAPE and classifier.class_names == CLASSES
    assert classifier.source.endswith(data.TORCHSCRIPT_FILE)
    batch = pixels()
    module.eval()
    with torch.no_grad():
        expected = torch.softmax(module(torch.from_numpy(batch.astype("float32")).permute(0, 3, 1, 2)), -1).numpy()
    np.testing.assert_allclose(classifier.predict_proba(batch), expected, atol=1e-6)
    np.testing.assert_allclose(classifier.predict_proba(batch.astype("float32")).sum(1), 1, atol=1e-6)
    # Another process, where the builder's module cannot be imported: the file alone serves.
    out = subprocess.run([sys.executable, "-c", f"""
import sys, numpy as np
sys.modules['tests.byo_torch'] = None  # importing it fails
from components.dataio import data
print(data.load_classifier({model_dir!r}).predict_proba(np.zeros((2, 28, 28, 1), 'uint8')).shape)
"""], cwd=REPO_ROOT, capture_output=True, text=True, timeout=300, env={**os.environ, **THREADS})
    assert out.returncode == 0 and out.stdout.strip() == "(2, 3)", out.stderr[-2000:]


def test_without_torch_load_classifier_says_what_to_install(tmp_path):
    model_dir, _ = torchscript_model(tmp_path / "model")
    shadow = tmp_path / "no-torch" / "torch"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ImportError('No module named torch')\n")
    out = subprocess.run([sys.executable, "-c", f"""
from components.dataio import data
try:
    data.load_classifier({model_dir!r})
except data.DataError as e:
    print(e)
"""], cwd=REPO_ROOT, capture_output=True, text=True, timeout=300,
                         env={**os.environ, "PYTHONPATH": os.pathsep.join([str(shadow.parent), REPO_ROOT])})
    assert out.stdout.strip() == (
        f"{model_dir} holds a TorchScript model (training.json: serving_format torchscript), and PyTorch is not "
        "installed here (No module named torch): run this step where torch is (pip install "
        "'kfp-image-classification[torch]', or the PyTorch image)"), out.stderr[-2000:]


def test_an_unscriptable_module_is_traced_and_checked_on_another_batch_size(tmp_path):
    from components.train.frameworks.torch import serving_module, write_torchscript
    from tests import byo_torch

    module = byo_torch.build_traced(IMAGE_SHAPE, len(CLASSES))
    with pytest.raises(Exception):
        torch.jit.script(serving_module(module))
    assert write_torchscript(module, IMAGE_SHAPE, str(tmp_path)) == "trace"
    scripted = torch.jit.load(str(tmp_path / data.TORCHSCRIPT_FILE))
    assert tuple(scripted(torch.zeros(7, *IMAGE_SHAPE)).shape) == (7, len(CLASSES))

    class FixedBatch(torch.nn.Module):  # a trace records the 2 of the example batch: refused
        def __init__(self):
            super().__init__()
            self.linear = torch.nn.Linear(28 * 28, len(CLASSES))

        def forward(self, images):
            try:
                flat = images.reshape(2, -1)
            except RuntimeError:
                raise
            return self.linear(flat)

    with pytest.raises(RuntimeError, match="does not reproduce the module's outputs on a batch of 3|shape"):
        write_torchscript(FixedBatch(), IMAGE_SHAPE, str(tmp_path / "fixed"))
    assert not (tmp_path / "fixed" / data.TORCHSCRIPT_FILE).exists()


def test_digest_follows_code_and_weights_not_the_archives_random_id(tmp_path):
    """Saved in two processes of other string hashing (TorchScript writes a class's constants in set order), the
    same weights give the same digest; other weights another."""
    code = f"""
import sys
from tests.test_byo_torch import torchscript_model
from tests import byo_torch
torchscript_model(sys.argv[1], byo_torch.build_traced if sys.argv[2] == 'traced' else None, int(sys.argv[3]))
"""
    for name, kind, seed, hash_seed in (("a", "traced", 0, "1"), ("b", "traced", 0, "2"), ("c", "traced", 1, "1"),
                                        ("d", "scripted", 0, "1"), ("e", "scripted", 0, "2")):
        done = subprocess.run([sys.executable, "-c", code, str(tmp_path / name), kind, str(seed)], cwd=REPO_ROOT,
                              capture_output=True, text=True, timeout=300,
                              env={**os.environ, **THREADS, "PYTHONHASHSEED": hash_seed})
        assert done.returncode == 0, done.stderr[-2000:]
    digests = {name: model_digest(str(tmp_path / name)) for name in "abcde"}
    assert digests["a"] == digests["b"] != digests["c"] and digests["d"] == digests["e"] != digests["a"]
    scripted = [(tmp_path / name / data.TORCHSCRIPT_FILE).read_bytes() for name in "de"]
    assert scripted[0] != scripted[1]  # the files differ, the digests do not
    assert identity.TORCHSCRIPT == data.TORCHSCRIPT and identity.TORCHSCRIPT_FILE == data.TORCHSCRIPT_FILE


def test_vertex_batch_prediction_refuses_a_torchscript_model_in_one_line(tmp_path):
    from components.predict.vertex import serving_input_name

    model_dir, _ = torchscript_model(tmp_path / "model")
    with pytest.raises(data.DataError, match="is a TorchScript model .* load SavedModels only: predict locally"):
        serving_input_name(model_dir)


# ---------------------------------------------------------------------------------------------- registries


def test_local_registry_records_pytorch_and_torchscript(tmp_path):
    model_dir, _ = torchscript_model(tmp_path / "model")
    registry = LocalRegistry(str(tmp_path / "registry"))
    first = register(model_dir, registry, model_name=MODEL, metrics={"accuracy": 0.5})
    assert first.version.lineage["framework"] == "torch"
    assert first.version.lineage["serving_format"] == "torchscript"
    (entry,) = json.loads((tmp_path / "registry" / MODEL / "index.json").read_text())["versions"]
    assert entry["lineage"]["framework"] == "torch" and entry["lineage"]["serving_format"] == "torchscript"
    assert "trained on PyTorch, serving format torchscript" in describe_lineage(
        entry["lineage"])
    stored = first.version.uri
    assert os.path.exists(os.path.join(stored, data.TORCHSCRIPT_FILE))
    assert data.load_classifier(stored).predict_proba(pixels()).shape == (5, len(CLASSES))
    again = register(model_dir, registry, model_name=MODEL, metrics={"accuracy": 0.5})
    assert not again.new_version and again.version.version == first.version.version


def test_vertex_refuses_a_torchscript_model_before_uploading(vertex, gcs, sleeps):
    """Both serving containers load SavedModels: refused in one line, nothing uploaded or staged; the lineage
    labels that a servable model gets name its framework and serving format."""
    model_dir, _ = torchscript_model(gcs / "bkt/runs/r1/model")
    before = sorted(os.listdir(model_dir))
    for serving_image in (None, "us-docker.pkg.dev/vertex-ai/prediction/tf2-cpu.2-15:latest"):
        registry = make_registry(vertex, gcs, sleeps, serving_image=serving_image)
        with pytest.raises(ServingFormatUnsupported) as refused:
            register(model_dir, registry, model_name=MODEL, metrics={"accuracy": 0.5})
        message = str(refused.value)
        assert "\n" not in message and message.startswith(f"Not uploading {model_dir} to Vertex AI: it is a "
                                                          "TorchScript model")
        assert "loads TensorFlow SavedModels only (why not Triton: docs/registry.md#torchscript-on-vertex-ai); " \
               "train a keras.Model builder" in message and "register this one in the local registry" in message
    assert vertex.calls("UploadModel") == [] and vertex.model_ids() == []
    assert sorted(os.listdir(model_dir)) == before

    from components.registry.vertex import lineage_labels

    labels = lineage_labels(model_lineage(model_dir))
    assert labels[FRAMEWORK_LABEL] == "torch" and labels[SERVING_FORMAT_LABEL] == "torchscript"
    assert lineage_labels({"name": "reference-cnn", "framework": "jax", "serving_format": "keras+saved_model"})[
        SERVING_FORMAT_LABEL] == "keras-saved_model"


# ---------------------------------------------------------------------------------------------- training


def train_args(dataset: str, model_dir, *extra: str) -> list[str]:
    return ["--framework", "torch", "--model", BUILDER, "--dataset-dir", dataset, "--model-dir", str(model_dir),
            "--batch-size", "16", *extra]


@pytest.mark.slow
def test_trains_resumes_step_exact_and_writes_torchscript(small_dataset, tmp_path):
    """One run never stopped; one stopped by SIGTERM mid-training (exit 143, checkpoint saved) and run again: it
    resumes at the saved step and ends with the same weights (the module's BatchNorm statistics and torch's random
    state are in the checkpoints), so the two TorchScripts predict the same."""
    epochs = ["--epochs", "3", "--input-mode", "memory"]
    straight = tmp_path / "straight"
    done = run_step(train_args(small_dataset, straight, *epochs, "--tensorboard-dir", str(tmp_path / "logs")))
    assert done.returncode == 0, done.stderr[-3000:]
    assert sorted(os.listdir(straight)) == [data.TORCHSCRIPT_FILE, "training.json"]  # no model.keras
    info = json.loads((straight / "training.json").read_text())
    assert (info["framework"], info["serving_format"], info["serving_file"], info["saved_model"]) == (
        "torch", "torchscript", data.TORCHSCRIPT_FILE, "none")
    assert info["model"]["name"] == BUILDER and info["steps"] == 3 * info["steps_per_epoch"]
    assert len(info["history"]["val_accuracy"]) == 3 and info["history"]["loss"][-1] < info["history"]["loss"][0]
    assert "framework torch" in done.stderr and "TorchScript (script)" in done.stderr
    assert os.listdir(tmp_path / "logs")[0].startswith("events.out.tfevents.")

    resumed = tmp_path / "resumed"
    args = train_args(small_dataset, resumed, *epochs, "--backup-dir", str(tmp_path / "backup"),
                      "--checkpoint-seconds", "0.3")
    first = Attempt(args, env=THREADS)
    try:
        assert first.wait_for_checkpoints(2, timeout=300), "\n".join(first.lines[-20:])
        first.process.send_signal(signal.SIGTERM)
        assert first.finish() == train.EXIT_RETRY, "\n".join(first.lines[-20:])
    finally:
        if first.process.poll() is None:
            first.process.kill()
    saved = first.saved_steps()[-1]
    assert 0 < saved < info["steps"]
    second = Attempt(args, env=THREADS)
    assert second.finish() == 0, "\n".join(second.lines[-20:])
    assert second.resumed_from() == saved
    again = json.loads((resumed / "training.json").read_text())
    assert again["steps"] == info["steps"] and again["resumed_from_step"] == saved

    images, labels = data.load_split_arrays(small_dataset, "test", limit=200)
    expected = data.load_classifier(str(straight)).predict_proba(images)
    np.testing.assert_allclose(data.load_classifier(str(resumed)).predict_proba(images), expected, atol=1e-5)
    assert model_digest(str(resumed)) == model_digest(str(straight))
    assert (expected.argmax(1) == labels).mean() > 0.3


@pytest.mark.slow
def test_two_torch_processes_train_a_module_together(small_dataset, tmp_path):
    """torchrun's variables, gloo: rank 0's module (parameters and BatchNorm buffers) is broadcast, the gradients
    all-reduced each step; rank 0 writes the TorchScript."""
    from tests.test_distributed import free_ports
    from tests.test_frameworks import torch_env

    port = free_ports(1)[0]
    args = train_args(small_dataset, tmp_path / "model", "--epochs", "2", "--backup-dir", str(tmp_path / "backup"))
    workers = [Attempt(args, env=torch_env(rank, 2, port)) for rank in range(2)]
    try:
        codes = [worker.finish(timeout=300) for worker in workers]
    finally:
        for worker in workers:
            if worker.process.poll() is None:
                worker.process.kill()
    assert codes == [0, 0], "\n".join(workers[0].lines[-20:] + workers[1].lines[-20:])
    info = json.loads((tmp_path / "model" / "training.json").read_text())
    assert info["workers"] == info["replicas"] == 2 and info["strategy"] == "torch.distributed(gloo, 2 processes)"
    assert info["serving_format"] == "torchscript" and info["steps"] == 2 * info["steps_per_epoch"]
    images, labels = data.load_split_arrays(small_dataset, "test", limit=200)
    assert (data.load_classifier(str(tmp_path / "model")).predict_proba(images).argmax(1) == labels).mean() > 0.2


# ---------------------------------------------------------------------------------------------- the PyTorch image


def no_tensorflow_env(tmp_path) -> dict:
    """A `tensorflow` package that raises ImportError, first on the path: TensorFlow cannot be imported, as in the
    PyTorch image, whatever this machine has."""
    shadow = tmp_path / "no-tensorflow" / "tensorflow"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ImportError('TensorFlow is not installed here')\n")
    return {**os.environ, **THREADS, "KERAS_BACKEND": "torch",
            "PYTHONPATH": os.pathsep.join([str(shadow.parent), REPO_ROOT])}


def test_evaluation_and_batch_prediction_run_where_tensorflow_cannot_be_imported(small_dataset, tmp_path):
    """What a run on torch does in the PyTorch image (no TensorFlow): evaluation against a registered TorchScript
    champion with its report, and batch prediction of the test samples and of the dataset's own TFRecord shards,
    for a TorchScript model and for a Keras model (model.keras on Keras' torch backend). The test split read there
    is the one TensorFlow reads here: the same test-set digest, the same scores."""
    from components.evaluate import evaluate

    manifest = data.read_manifest(small_dataset)
    shape, names = manifest["image_shape"], manifest["class_names"]
    model_dir, _ = torchscript_model(tmp_path / "model", seed=1)
    champion_dir, _ = torchscript_model(tmp_path / "champion", seed=2)
    for directory in (model_dir, champion_dir):  # the dataset's shape and classes
        info = json.load(open(os.path.join(directory, "training.json")))
        assert info["image_shape"] == shape
        info["class_names"] = names
        data.write_json(os.path.join(directory, "training.json"), info)
    # A torch.nn.Module with 10 outputs for the dataset's 10 classes.
    from tests import byo_torch
    from components.train.frameworks.torch import write_torchscript

    for directory, seed in ((model_dir, 1), (champion_dir, 2)):
        torch.manual_seed(seed)
        write_torchscript(byo_torch.build(shape, len(names)), shape, directory)
    here = evaluate(model_dir, small_dataset, champion_model_dir=champion_dir, champion_version="1")
    shards = os.path.join(small_dataset, "test", "*.tfrecord")
    out = subprocess.run([sys.executable, "-c", f"""
import json, os, sys
import numpy as np
from components.dataio import data
from components.evaluate import evaluate, write_report
from components.predict import export_samples, predict
from components.registry import LocalRegistry

registry = LocalRegistry({str(tmp_path / "registry")!r})
registry.upload("m", {champion_dir!r}, digest="sha256:champion", metrics={{}}, labels={{}})
registry.set_alias("m", "1", "champion")
champion = registry.champion("m")
result = evaluate({model_dir!r}, {small_dataset!r}, champion_model_dir=champion.uri, champion_version=champion.version)
write_report(result, {model_dir!r}, {small_dataset!r}, {str(tmp_path / "report.html")!r})
export_samples({small_dataset!r}, {str(tmp_path / "samples")!r}, per_class=3)
# predict_op's output folder on a KFP backend (by reference, beside the gs:// artifact) stays on gs:// without
# TensorFlow (google-cloud-storage writes it: tests/test_storage_gcs.py); the predictions here go to a local folder
from components.dataio import datadir
predicted_dir = datadir.bulk_dir("gs://bucket/root/image-classification/run/predict-op/1/predictions",
                                 {str(tmp_path / "predicted")!r}, by_reference=True)
samples = predict({model_dir!r}, {str(tmp_path / "samples")!r}, {str(tmp_path / "predicted")!r}, print_first=0)
from_shards = predict({model_dir!r}, {shards!r}, {str(tmp_path / "from-shards")!r}, print_first=0)

import keras  # a Keras model trained on torch: model.keras, loaded on Keras' torch backend
inputs = keras.Input({tuple(shape)!r})
scaled = keras.layers.Flatten()(keras.layers.Rescaling(1 / 255)(inputs))
model = keras.Model(inputs, keras.layers.Dense({len(names)})(scaled))
os.makedirs({str(tmp_path / "keras")!r})
model.save({str(tmp_path / "keras" / "model.keras")!r})
data.write_json({str(tmp_path / "keras" / "training.json")!r}, {{"class_names": {names!r}, "image_shape": {shape!r},
                "framework": "torch", "serving_format": "keras+saved_model", "saved_model": "pending"}})
keras_result = evaluate({str(tmp_path / "keras")!r}, {small_dataset!r})
keras_predicted = predict({str(tmp_path / "keras")!r}, {str(tmp_path / "samples")!r},
                          {str(tmp_path / "keras-predicted")!r}, print_first=0)
print(json.dumps({{"tensorflow": "tensorflow" in sys.modules, "keras_backend": keras.backend.backend(),
                  "accuracy": result.scores.accuracy, "champion": result.champion.accuracy, "test_set": result.test_set,
                  "samples": samples.count, "predicted_dir": predicted_dir, "shards": from_shards.count,
                  "shard_errors": from_shards.errors,
                  "keras_accuracy": keras_result.scores.accuracy, "keras_predicted": keras_predicted.count}}))
"""], cwd=REPO_ROOT, capture_output=True, text=True, timeout=600, env=no_tensorflow_env(tmp_path))
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["tensorflow"] is False and got["keras_backend"] == "torch"
    assert got["test_set"] == here.test_set  # the same images and labels as TensorFlow's readers give
    assert got["accuracy"] == pytest.approx(here.scores.accuracy, abs=1e-9)
    assert got["champion"] == pytest.approx(here.champion.accuracy, abs=1e-9)
    assert got["samples"] == 3 * len(names) and (got["shards"], got["shard_errors"]) == (1500, 0)
    assert got["predicted_dir"] == "gs://bucket/root/image-classification/run/predict-op/1/.data/predictions"
    assert got["keras_predicted"] == 3 * len(names)
    # The Keras model's accuracy there is what Keras itself gives here (on TensorFlow) for the same file and split;
    # two near-ties may fall the other way between the backends.
    import keras

    test_images, test_labels = data.load_split_arrays(small_dataset, "test")
    keras_model = keras.saving.load_model(str(tmp_path / "keras" / "model.keras"))
    keras_here = float((keras_model.predict(test_images.astype("float32"), verbose=0).argmax(1) == test_labels).mean())
    assert got["keras_accuracy"] == pytest.approx(keras_here, abs=2 / len(test_labels))
    assert "Evaluation report" in (tmp_path / "report.html").read_text()
    # Each record's prediction from the shards is the model's on that record's pixels, here: record by record, by
    # the uri each record carries (a sorted list of classes would not see two images' answers swapped).
    rows = [json.loads(line) for line in open(tmp_path / "from-shards" / "predictions.jsonl")]
    uris, images = [], []
    for image, _, uri in data.read_split(small_dataset, "test", with_uri=True).as_numpy_iterator():
        uris.append(uri.decode())
        images.append(image)
    expected = data.load_classifier(model_dir).predict_proba(np.stack(images)).argmax(1)
    by_uri = {row["uri"]: row["class_index"] for row in rows}
    assert len(by_uri) == len(rows) == len(set(uris)) == 1500
    assert by_uri == dict(zip(uris, expected.tolist()))


def test_a_model_trained_on_jax_is_evaluated_and_predicted_in_the_pytorch_image(small_dataset, tmp_path):
    """A run on jax evaluates and predicts in the PyTorch image (torch and JAX, no TensorFlow): its model.keras,
    saved on Keras' JAX backend, loads there on the image's KERAS_BACKEND (torch) and gives JAX's probabilities, and
    evaluation scores it as TensorFlow does here."""
    require_framework("jax")
    from components.evaluate import evaluate

    manifest = data.read_manifest(small_dataset)
    shape, names = manifest["image_shape"], manifest["class_names"]
    model_dir, batch = tmp_path / "jax-model", tmp_path / "batch.npy"
    np.save(batch, np.random.default_rng(0).uniform(0, 255, size=(8, *shape)).astype("float32"))
    env = no_tensorflow_env(tmp_path)
    saved = subprocess.run([sys.executable, "-c", f"""
import os, numpy as np, keras
from components.dataio import data
keras.utils.set_random_seed(3)
inputs = keras.Input({tuple(shape)!r})
hidden = keras.layers.Dense(16, activation="relu")(keras.layers.Flatten()(keras.layers.Rescaling(1 / 255)(inputs)))
model = keras.Model(inputs, keras.layers.Dense({len(names)})(hidden))  # logits, as the project's models give
os.makedirs({str(model_dir)!r})
model.save({str(model_dir / "model.keras")!r})
data.write_json({str(model_dir / "training.json")!r}, {{"class_names": {names!r}, "image_shape": {shape!r},
                "framework": "jax", "serving_format": "keras+saved_model", "saved_model": "pending"}})
probabilities = data.load_classifier({str(model_dir)!r}).predict_proba(np.load({str(batch)!r}))
np.save({str(tmp_path / "jax.npy")!r}, np.asarray(probabilities))
print(keras.backend.backend())
"""], cwd=REPO_ROOT, capture_output=True, text=True, timeout=600, env={**env, "KERAS_BACKEND": "jax"})
    assert saved.returncode == 0 and saved.stdout.split()[-1] == "jax", saved.stderr[-3000:]
    loaded = subprocess.run([sys.executable, "-c", f"""
import json, sys, numpy as np
from components.dataio import data
from components.evaluate import evaluate
from components.predict import export_samples, predict
probabilities = data.load_classifier({str(model_dir)!r}).predict_proba(np.load({str(batch)!r}))
np.save({str(tmp_path / "torch.npy")!r}, np.asarray(probabilities))
result = evaluate({str(model_dir)!r}, {small_dataset!r})
export_samples({small_dataset!r}, {str(tmp_path / "samples")!r}, per_class=2)
predicted = predict({str(model_dir)!r}, {str(tmp_path / "samples")!r}, {str(tmp_path / "predicted")!r}, print_first=0)
import keras
print(json.dumps({{"tensorflow": "tensorflow" in sys.modules, "backend": keras.backend.backend(),
                  "accuracy": result.scores.accuracy, "test_set": result.test_set, "predicted": predicted.count}}))
"""], cwd=REPO_ROOT, capture_output=True, text=True, timeout=600, env=env)
    assert loaded.returncode == 0, loaded.stderr[-3000:]
    got = json.loads(loaded.stdout.strip().splitlines()[-1])
    assert got["tensorflow"] is False and got["backend"] == "torch"
    np.testing.assert_allclose(np.load(tmp_path / "torch.npy"), np.load(tmp_path / "jax.npy"), rtol=1e-4, atol=1e-5)
    assert got["predicted"] == 2 * len(names)
    here = evaluate(str(model_dir), small_dataset)  # TensorFlow's readers and Keras' backend in this process
    assert got["test_set"] == here.test_set and got["accuracy"] == pytest.approx(here.scores.accuracy, abs=1e-9)
