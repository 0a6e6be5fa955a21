"""ImageNet weights for clusters without internet: `pipectl weights` stages a backbone's weights in a cache (here
from a mirror: a local HTTP server on 127.0.0.1 serving a Keras notop weights file, as Keras' own download would),
and pretrained=imagenet with weights_cache reads them from a local or a gs://-like (ram://) cache, recording the
file and its digest; offline with no cache, the error is one line."""

import functools
import hashlib
import http.server
import json
import os
import subprocess
import sys
import threading

import numpy as np
import pytest

from components.train import TrainingLoop, TrainSettings, models
from pipelines import cli
from tests.conftest import REPO_ROOT


@pytest.fixture(scope="module")
def mirror(tmp_path_factory):
    """A mirror of one Keras notop weights file: MobileNetV3Small's backbone with (seeded random) weights, served
    over HTTP on 127.0.0.1. Returns (its URL, the backbone's weights)."""
    import keras

    folder = tmp_path_factory.mktemp("mirror")
    keras.utils.set_random_seed(3)
    backbone = keras.applications.MobileNetV3Small(include_top=False, weights=None, input_shape=(224, 224, 3),
                                                   include_preprocessing=True)
    backbone.save_weights(str(folder / "mobilenet_v3_small_notop.weights.h5"))
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(folder))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield (f"http://127.0.0.1:{server.server_address[1]}/mobilenet_v3_small_notop.weights.h5",
           [np.array(w) for w in backbone.get_weights()])
    server.shutdown()


@pytest.fixture(scope="module")
def rgb48(fashion_dir, tmp_path_factory) -> str:
    from components.preprocess import preprocess

    out = str(tmp_path_factory.mktemp("rgb48"))
    preprocess(fashion_dir, out, limit=60, min_shards=2, image_size=48, channels=3)
    return out


def staged_by_pipectl(capsys, *args) -> dict:
    assert cli.main(["weights", "--model", "mobilenet-v3-small", *args]) == 0
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


@pytest.mark.parametrize("cache_kind", ["local", "gs-like"])
def test_weights_are_staged_once_then_read_by_training_with_their_digest(mirror, rgb48, tmp_path, capsys,
                                                                         cache_kind):
    url, served = mirror
    cache = str(tmp_path / "cache") if cache_kind == "local" else f"ram://{tmp_path.name}/weights"
    staged = staged_by_pipectl(capsys, "--cache", cache, "--origin", url)
    uri = f"{cache}/imagenet-mobilenet-v3-small.weights.h5"
    assert staged["uri"] == uri and staged["staged"] is True
    again = staged_by_pipectl(capsys, "--cache", cache, "--origin", url)
    assert again == {**staged, "staged": False}  # kept, not replaced

    loop = TrainingLoop(TrainSettings(rgb48, str(tmp_path / "model"), model="mobilenet-v3-small", epochs=2,
                                      batch_size=16, pretrained="imagenet", weights_cache=cache), validate=False)
    loop.prepare()
    loop.build()
    assert loop.weights.covers == "backbone" and loop.freeze_epochs == 1
    loaded = [np.array(w) for w in loop.model.get_layer(models.BACKBONE).get_weights()]
    for got, expected in zip(loaded, served, strict=True):
        np.testing.assert_array_equal(got, expected)
    lineage = loop.model_lineage()["pretrained"]
    assert lineage == {"source": "imagenet", "sha256": staged["sha256"], "file": uri}
    with open(loop.weights.path, "rb") as f:
        assert hashlib.sha256(f.read()).hexdigest() == staged["sha256"]


def test_a_mirror_that_does_not_answer_is_one_clear_error(tmp_path, capsys):
    code = cli.main(["weights", "--model", "mobilenet-v3-small", "--cache", str(tmp_path / "cache"),
                     "--origin", "http://127.0.0.1:9/missing.h5"])
    error = capsys.readouterr().err.strip()
    assert code == 2 and len(error.splitlines()) == 1
    assert error.startswith("pipectl: error: could not download the ImageNet weights of mobilenet-v3-small from "
                            "http://127.0.0.1:9/missing.h5")
    assert not os.path.exists(tmp_path / "cache")


def test_offline_with_an_empty_cache_names_the_cache_and_the_command(rgb48, tmp_path):
    closed = "http://127.0.0.1:9"
    env = {**os.environ, "https_proxy": closed, "HTTPS_PROXY": closed, "http_proxy": closed, "HTTP_PROXY": closed,
           "KERAS_HOME": str(tmp_path / "keras"), "TF_CPP_MIN_LOG_LEVEL": "2"}
    cache = str(tmp_path / "empty-cache")
    result = subprocess.run([sys.executable, "-m", "components.train", "--dataset-dir", rgb48, "--model-dir",
                             str(tmp_path / "model"), "--model", "mobilenet-v3-small", "--pretrained", "imagenet",
                             "--weights-cache", cache, "--epochs", "1"], cwd=REPO_ROOT, env=env, capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 2, result.stderr[-2000:]
    error = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(error) == 1, result.stderr[-2000:]
    assert f"no imagenet-mobilenet-v3-small.weights.h5 in the weights cache {cache}, and the download failed" \
        in error[0]
    assert f"run `pipectl weights --model mobilenet-v3-small --cache {cache}`" in error[0]

