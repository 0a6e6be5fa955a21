"""The compiled pipeline, run end to end with kfp.local on a small slice of Fashion-MNIST (conftest's
`local_runs`: the first run through pipectl's command line, the second through run_local).

Two runs share one local registry, as two runs of `make run` do: the first registers version 1 as champion;
the second is gated against that champion, re-scored on the same test data, and, having trained the same weights
(same data, same seed, on the CPU), is version 1 again rather than a duplicate. What the first printed is what a
user sees: one line when each step starts and ends, the project's progress lines between, kfp.local's own output
only in the steps' logs.
"""

import json
import os
import re

import pytest

pytestmark = pytest.mark.slow

STEPS = ["preprocess", "augment", "placement", "images", "train", "evaluate", "predict", "register"]
STEP_LINE = r"\d\d:\d\d:\d\d  {step} +{text}"


@pytest.fixture(scope="module")
def runs(local_runs):
    return local_runs.base, local_runs.first, local_runs.second


def test_summary_reports_what_the_run_produced(runs):
    base, first, second = runs
    assert json.loads((base / "second" / "summary.json").read_text()) == second
    assert first["images"] == {"train": pytest.approx(540, abs=30), "validation": pytest.approx(60, abs=30),
                               "test": 600, "rejected": 0}
    assert first["images"]["train"] + first["images"]["validation"] == 600
    assert 0.3 <= first["test_accuracy"] <= 1 and first["test_loss"] > 0
    assert first["train_seconds"] > 0
    assert first["blessed"] is True and first["decision"].startswith("blessed: ")
    assert set(first["artifacts"]) == {"preprocess", "augment", "placement", "images", "train", "evaluate",
                                       "predict", "register"}


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


def test_an_identical_second_run_is_gated_against_the_champion_and_is_the_same_version(runs):
    from components.registry import model_digest

    base, first, second = runs
    assert first["registered"]["version"] == "1" and "champion" in first["registered"]["aliases"]
    assert first["registered"]["new_version"] is True
    assert "champion v1" in second["decision"]
    # Bit-identical weights, other timings and zip timestamps: one digest, so no second version.
    models = [run["artifacts"]["train"]["model"] for run in (first, second)]
    infos = [json.loads(open(os.path.join(m, "training.json")).read()) for m in models]
    assert infos[0]["train_seconds"] != infos[1]["train_seconds"]
    assert model_digest(models[0]) == model_digest(models[1])
    assert second["registered"]["version"] == "1" and second["registered"]["new_version"] is False
    index = json.loads((base / "registry" / "image-classifier" / "index.json").read_text())
    assert [(v["version"], sorted(v["aliases"])) for v in index["versions"]] == [("1", ["champion", "default"])]
    assert index["versions"][0]["lineage"]["name"] == "reference-cnn"


# ---------------------------------------------------------------------------------------------- console and logs


def step_lines(console: str, step: str, text: str) -> list[str]:
    return [line for line in console.splitlines() if re.fullmatch(STEP_LINE.format(step=step, text=text), line)]


@pytest.mark.parametrize("run", ["first", "second"])
def test_one_line_when_each_step_starts_and_one_when_it_ends(local_runs, run):
    console = local_runs.command.stdout if run == "first" else local_runs.second_console
    lines = console.splitlines()
    for step in STEPS:
        started, ended = step_lines(console, step, "started"), step_lines(console, step, r"succeeded in \d+\.\ds.*")
        assert len(started) == 1 and len(ended) == 1, (step, console)
        assert lines.index(started[0]) < lines.index(ended[0])
    figures = {step: step_lines(console, step, r"succeeded in \d+\.\ds: (.*)")[0] for step in STEPS}
    assert re.search(r"train \d+, validation \d+, test 600, rejected 0$", figures["preprocess"])
    # the last epoch's validation accuracy, or the better first epoch's, which is then the one exported
    assert re.search(r"2 epochs, \d+\.\ds fitting, (validation accuracy 0\.\d{4}|exported epoch 1 \(best "
                     r"validation accuracy 0\.\d{4}\))$", figures["train"])
    assert re.search(r"test accuracy 0\.\d{4}, blessed$", figures["evaluate"])
    assert figures["predict"].endswith("100 predictions, 0 errors")
    again = "" if run == "first" else ", already registered (the same model)"
    assert figures["register"].endswith(f"image-classifier version 1 (local registry){again}")


def test_between_them_only_the_projects_progress_lines(local_runs):
    out, err = local_runs.command.stdout, local_runs.command.stderr
    for progress in ("preprocess: wrote .../preprocess-op/dataset (train ", "epoch 1/2 (", "epoch 2/2 (",
                     "train: 10 steps", "evaluate: blessed: ", "predict: 100 predictions, 0 errors"):
        assert progress in out, progress
    for noise in ("executor_input", '"inputs": {', "[KFP Executor", "Streamed logs", "non-Python base image",
                  "oneDNN", "absl::InitializeLog", "Traceback", "train: checkpoint ", "The image 0000.png is"):
        assert noise not in out and noise not in err, noise
    assert err == ""
    lines = out.splitlines()
    assert len(lines) <= 40, out
    progress = [line for line in lines[1:] if not any(re.fullmatch(STEP_LINE.format(step=s, text=".*"), line)
                                                      for s in STEPS)]
    summary = progress[-6:]
    assert all(re.match(r"\d\d:\d\d:\d\d {14}", line) for line in progress[:-6]), progress
    assert [line.split()[0] for line in summary] == ["test", "decision", "registered", "predictions", "summary", "run"]
    assert summary[-1].endswith(os.path.join("first", "index.html"))


def test_each_steps_log_holds_its_complete_output(local_runs):
    logs = local_runs.base / "first" / "logs"
    for step in STEPS:
        text = (logs / f"{step}.log").read_text()
        task = {"placement": "placement-op", "images": "step-images-op"}.get(step, f"{step}-op")
        assert f"Executing task '{task}'" in text.splitlines()[0]
        assert "Got executor_input:" in text and '"inputs": {' in text
        assert "non-Python base image" in text or step == "placement"  # kfp.local warns about each image once
        assert f"Task '{task}' finished with status SUCCESS" in text
    train = (logs / "train.log").read_text()
    assert "epoch 2/2 (" in train and "train: checkpoint " in train  # kept off the console, not lost
    assert "preprocess: wrote " in (logs / "preprocess.log").read_text()
    assert "The image 0000.png is" in (logs / "predict.log").read_text()
    assert "Running pipeline: 'image-classification'" in (logs / "pipeline.log").read_text()
    steps = {s["step"]: s for s in local_runs.first["steps"]}
    assert sorted(steps) == sorted(STEPS)
    for step, record in steps.items():
        assert record["state"] == "succeeded" and record["log"] == str(logs / f"{step}.log") and record["seconds"] > 0
