"""The compiled pipeline, run end to end with kfp.local on a small slice of Fashion-MNIST.

Two runs share one local registry, as two runs of `make run` do: the first registers version 1 as champion;
the second is gated against that champion, re-scored on the same test data.
"""

import json
import os

import pytest

from pipelines import cli

pytestmark = pytest.mark.slow

PARAMS = {"limit": 600, "epochs": 2, "min_accuracy": 0.3, "tolerance": 1.0}


@pytest.fixture(scope="module")
def runs(fashion_dir, tmp_path_factory):
    base = tmp_path_factory.mktemp("e2e")
    first = cli.run_local(dict(PARAMS), str(base / "first"))
    second = cli.run_local(dict(PARAMS), str(base / "second"))
    return base, first, second


def test_summary_reports_what_the_run_produced(runs):
    base, first, _ = runs
    assert json.loads((base / "first" / "summary.json").read_text()) == first
    assert first["images"] == {"train": pytest.approx(540, abs=30), "validation": pytest.approx(60, abs=30),
                               "test": 600, "rejected": 0}
    assert first["images"]["train"] + first["images"]["validation"] == 600
    assert 0.3 <= first["test_accuracy"] <= 1 and first["test_loss"] > 0
    assert first["train_seconds"] > 0
    assert first["blessed"] is True and first["decision"].startswith("blessed: ")
    assert set(first["artifacts"]) == {"preprocess", "augment", "placement", "train", "evaluate", "predict",
                                       "register"}


def test_model_and_training_artifacts(runs):
    _, first, _ = runs
    model = first["artifacts"]["train"]["model"]
    assert os.path.exists(os.path.join(model, "model.keras"))
    assert os.path.exists(os.path.join(model, "saved_model", "saved_model.pb"))
    info = json.loads(open(os.path.join(model, "training.json")).read())
    assert info["recipe_settings"]["epochs"] == 2 and len(info["history"]["val_accuracy"]) == 2
    assert info["class_names"][9] == "Ankle boot"
    assert os.listdir(first["artifacts"]["train"]["tensorboard"])  # TensorBoard event files


def test_kfp_ui_artifacts(runs):
    _, first, _ = runs
    evaluate_dir = os.path.dirname(first["artifacts"]["evaluate"]["evaluation"])
    executor_output = json.loads(open(os.path.join(evaluate_dir, "executor_output.json")).read())
    confusion = executor_output["artifacts"]["confusion"]["artifacts"][0]["metadata"]["confusionMatrix"]
    assert [c["displayName"] for c in confusion["annotationSpecs"]][:2] == ["T-shirt/top", "Trouser"]
    assert sum(sum(row["row"]) for row in confusion["rows"]) == 600
    metrics = executor_output["artifacts"]["metrics"]["artifacts"][0]["metadata"]
    assert metrics["accuracy"] == pytest.approx(first["test_accuracy"], abs=1e-6)
    assert "macro_f1" in metrics and "recall: Sneaker" in metrics
    report = open(first["artifacts"]["evaluate"]["report"]).read()
    assert report.count("data:image/png;base64,") >= 3 and "Per class" in report
    assert open(first["artifacts"]["evaluate"]["decision"]).read().startswith("**blessed: ")
    card = open(first["artifacts"]["preprocess"]["card"]).read()
    assert card.startswith("<!doctype html>") and "Sneaker" in card and "data:image/png;base64," in card


def test_predictions_of_the_exported_test_images(runs):
    _, first, _ = runs
    assert first["predictions"]["count"] == 100 and first["predictions"]["errors"] == 0
    rows = [json.loads(line) for line in open(first["predictions"]["path"])]
    assert len(rows) == 100 and len({r["uri"] for r in rows}) == 100
    assert {"uri", "class_index", "class_name", "confidence", "top_k"} <= set(rows[0])
    assert sum(r["class_name"] == "Trouser" for r in rows) >= 1


def test_second_run_is_gated_against_the_champion_and_becomes_version_2(runs):
    base, first, second = runs
    assert first["registered"]["version"] == "1" and "champion" in first["registered"]["aliases"]
    assert "champion v1" in second["decision"]
    assert second["registered"]["version"] == "2" and second["registered"]["aliases"] == ["champion"]
    index = json.loads((base / "registry" / "image-classifier" / "index.json").read_text())
    assert [(v["version"], v["aliases"]) for v in index["versions"]] == [("1", ["default"]), ("2", ["champion"])]
