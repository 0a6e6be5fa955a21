"""A bring-your-own torch.nn.Module through the whole local pipeline: `pipectl run --local --framework torch
--model tests.byo_torch:build` on a slice of Fashion-MNIST, as a user starts it. The module trains on PyTorch,
the step writes TorchScript, evaluation and batch prediction serve it through load_classifier, and the local
registry and the run page say it is PyTorch and TorchScript.
"""

import html
import json
import math
import os
import subprocess
import sys

import pytest

from tests.conftest import require_framework

require_framework("torch")
pytestmark = pytest.mark.slow

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PARAMS = {"framework": "torch", "model": "tests.byo_torch:build", "limit": 600, "epochs": 3, "batch_size": 16,
          "min_accuracy": 0.2, "tolerance": 1.0}


def test_a_torch_module_goes_through_the_whole_local_pipeline(fashion_dir, tmp_path):
    output_dir = tmp_path / "run"
    flags = [f"--{name.replace('_', '-')}={value}" for name, value in PARAMS.items()]
    done = subprocess.run([sys.executable, "-m", "pipelines.cli", "run", "--local", "--output-dir", str(output_dir),
                           *flags], cwd=REPO_ROOT, capture_output=True, text=True, timeout=1500,
                          env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": REPO_ROOT})
    assert done.returncode == 0, f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    summary = json.loads((output_dir / "summary.json").read_text())

    # Trained on PyTorch, served as TorchScript: no model.keras, no SavedModel.
    model_dir = summary["artifacts"]["train"]["model"]
    info = json.loads(open(os.path.join(model_dir, "training.json")).read())
    assert (info["framework"], info["serving_format"], info["model"]["name"]) == ("torch", "torchscript",
                                                                                 PARAMS["model"])
    assert sorted(os.listdir(model_dir)) == ["model.torchscript.pt", "training.json"]
    assert info["steps"] == 3 * info["steps_per_epoch"] and len(info["history"]["val_accuracy"]) == 3

    # Evaluation and prediction ran the TorchScript: real figures.
    assert 0.2 <= summary["test_accuracy"] <= 1 and math.isfinite(summary["test_loss"]) and summary["test_loss"] > 0
    assert summary["blessed"] is True
    predictions = [json.loads(line) for line in open(summary["predictions"]["path"])]
    assert summary["predictions"]["count"] == len(predictions) == 100 and summary["predictions"]["errors"] == 0
    assert all(0 < row["confidence"] <= 1 and row["class_name"] in info["class_names"] for row in predictions)
    assert len({row["class_name"] for row in predictions}) > 1

    # The registry records what trained it and how it serves.
    registered = summary["registered"]
    assert registered["registry"] == "local" and registered["version"] == "1" and "champion" in registered["aliases"]
    assert os.path.exists(os.path.join(registered["uri"], "model.torchscript.pt"))
    index = json.loads((tmp_path / "registry" / registered["model"] / "index.json").read_text())
    (entry,) = index["versions"]
    assert entry["lineage"]["framework"] == "torch" and entry["lineage"]["serving_format"] == "torchscript"
    assert entry["lineage"]["name"] == PARAMS["model"]

    # The run page says PyTorch and TorchScript.
    page = html.unescape((output_dir / "index.html").read_text())
    assert "Trained on <b>PyTorch</b>" in page and "serving format torchscript" in page
