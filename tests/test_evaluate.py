"""Evaluation: the gate's decisions, scores on real data against a real champion, the KFP outputs, the report."""

import base64
import html
import io
import json
import os
import re

import numpy as np
import pytest

from components.dataio import data
from components.evaluate import (Champion, decide, decision_markdown, evaluate, log_to_kfp, score,
                                 write_report)

NAMES = ["zero", "one", "two", "three"]


def scores_with(correct: int, total: int = 1000, *, recall_of_last: float | None = None):
    """Real scores of `correct` right answers out of `total` over four classes (optionally a weak last class)."""
    labels = np.arange(total) % 4
    predicted = labels.copy()
    wrong = list(range(total - correct))
    if recall_of_last is not None:  # put the mistakes on the last class first
        last = np.flatnonzero(labels == 3)
        misses = int(round(len(last) * (1 - recall_of_last)))
        wrong = list(last[:misses]) + [i for i in range(total) if labels[i] != 3][:max(0, total - correct - misses)]
    predicted[wrong] = (labels[wrong] + 1) % 4
    probabilities = np.full((total, 4), 0.1)
    probabilities[np.arange(total), predicted] = 0.7
    return score(probabilities, labels, 4)


def test_thresholds_alone_decide_without_a_champion():
    blessed, reasons, line = decide(scores_with(912), NAMES, min_accuracy=0.90)
    assert blessed and line == "blessed: 0.912 >= 0.90 (no champion yet)"
    assert "no champion yet: the thresholds alone decide" in reasons
    blessed, reasons, line = decide(scores_with(899), NAMES, min_accuracy=0.90)
    assert not blessed and line == "not blessed: 0.899 < 0.90"
    assert reasons[0] == "accuracy 0.8990 < minimum 0.9000"


def test_champion_worse_within_tolerance_is_blessed():
    champion = Champion("3", scores_with(905).accuracy, "registry/3")
    blessed, reasons, line = decide(scores_with(912), NAMES, min_accuracy=0.90, champion=champion, tolerance=0.005)
    assert blessed
    assert line == "blessed: 0.912 >= 0.90 and >= champion v3 0.905 - 0.005"
    assert "both on the same 1000 test images" in reasons[-1]


def test_champion_better_is_not_blessed_even_above_the_thresholds():
    champion = Champion("7", 0.95, "registry/7")
    blessed, reasons, line = decide(scores_with(912), NAMES, min_accuracy=0.90, champion=champion, tolerance=0.005)
    assert not blessed
    assert line == "not blessed: 0.912 >= 0.90 but < champion v7 0.950 - 0.005"
    assert reasons[-1].startswith("accuracy 0.9120 < champion v7 0.9500 - tolerance 0.0050")


def test_tolerance_edges():
    champion = Champion("2", scores_with(905).accuracy, "registry/2")
    at_edge = scores_with(900)  # exactly champion - tolerance
    assert decide(at_edge, NAMES, min_accuracy=0.5, champion=champion, tolerance=0.005)[0]
    one_image_below = scores_with(899)
    blessed, _, line = decide(one_image_below, NAMES, min_accuracy=0.5, champion=champion, tolerance=0.005)
    assert not blessed and line == "not blessed: 0.899 >= 0.50 but < champion v2 0.905 - 0.005"
    # Tolerance 0: equal to the champion is enough, a hair below is not.
    assert decide(scores_with(905), NAMES, min_accuracy=0.5, champion=champion, tolerance=0.0)[0]
    assert not decide(scores_with(904), NAMES, min_accuracy=0.5, champion=champion, tolerance=0.0)[0]
    # A threshold met exactly passes.
    assert decide(scores_with(900), NAMES, min_accuracy=0.9)[0]


def test_the_line_never_rounds_a_failure_into_a_pass():
    near = scores_with(8996, total=10000)
    blessed, _, line = decide(near, NAMES, min_accuracy=0.9)
    assert not blessed and line == "not blessed: 0.8996 < 0.90"
    blessed, _, line = decide(scores_with(8999, total=10000), NAMES, min_accuracy=0.5,
                              champion=Champion("4", 0.9004, "r/4"), tolerance=0.0)
    assert not blessed and line == "not blessed: 0.8999 >= 0.50 but < champion v4 0.9004 - 0.00"


def test_minimum_recall_per_class():
    weak_last = scores_with(900, recall_of_last=0.6)
    assert weak_last.recall[3] == pytest.approx(0.6)
    blessed, reasons, line = decide(weak_last, NAMES, min_accuracy=0.85, min_class_recall=0.7)
    assert not blessed
    assert line == "not blessed: 0.900 >= 0.85 but recall < 0.70 for three (0.600)"
    assert "recall below 0.700 for three (0.600)" in reasons
    blessed, reasons, _ = decide(weak_last, NAMES, min_accuracy=0.85, min_class_recall=0.5)
    assert blessed and any(r.startswith("every class recall >= 0.500") for r in reasons)
    assert decide(weak_last, NAMES, min_accuracy=0.85, min_class_recall=None)[0]


def test_both_checks_failing_and_a_champion_that_cannot_be_compared():
    blessed, _, line = decide(scores_with(800, recall_of_last=0.3), NAMES, min_accuracy=0.9, min_class_recall=0.5,
                              champion=Champion("1", 0.7, "r/1"))
    assert not blessed
    assert line == "not blessed: 0.800 < 0.90 and recall < 0.50 for three (0.300) but >= champion v1 0.700 - 0.00"
    problem = "champion v1 cannot be compared on this test data: it takes 32x32x3 images; choose another ..."
    blessed, reasons, line = decide(scores_with(950), NAMES, min_accuracy=0.9, champion_problem=problem)
    assert not blessed and line == f"not blessed: 0.950 >= 0.90 but {problem}"  # the whole problem: what to do
    assert problem in reasons


@pytest.mark.parametrize("arguments", [{"min_accuracy": 1.5}, {"min_accuracy": -0.1},
                                       {"min_accuracy": 0.5, "tolerance": -0.01},
                                       {"min_accuracy": 0.5, "min_class_recall": 2.0}])
def test_thresholds_out_of_range_are_refused(arguments):
    with pytest.raises(ValueError, match="must be in"):
        decide(scores_with(900), NAMES, **arguments)


def collapsed_scores(shares: list[int], predicted_class: int, right_elsewhere: int = 0):
    """Scores of a model that answers `predicted_class` for every test image but `right_elsewhere` of the others,
    on a test split of `shares[c]` images of class c."""
    labels = np.repeat(np.arange(len(shares)), shares)
    predicted = np.full(len(labels), predicted_class)
    others = np.flatnonzero(labels != predicted_class)[:right_elsewhere]
    predicted[others] = labels[others]
    return score(np.eye(len(shares))[predicted] * 0.9 + 0.1 / len(shares), labels, len(shares))


def test_a_model_that_predicts_one_class_is_degenerate_and_never_blessed():
    """The collapse seen on a small photo set: one class for every test image, accuracy = that class's share."""
    collapsed = collapsed_scores([28, 24, 24, 24], predicted_class=0)
    blessed, reasons, line = decide(collapsed, NAMES, min_accuracy=0.2)
    assert not blessed
    assert line == ("not blessed: 0.280 >= 0.20 but degenerate: predicts zero for 100% of the test images "
                    "(it is 28% of them)")
    assert reasons[1] == "degenerate: predicts zero for 100% of the test images (it is 28% of them)"
    # Even beating a champion does not bless it.
    assert not decide(collapsed, NAMES, min_accuracy=0.0, champion=Champion("1", 0.1, "r/1"), tolerance=0.5)[0]
    mostly = collapsed_scores([28, 24, 24, 24], predicted_class=0, right_elsewhere=14)  # 86% "zero"
    assert "degenerate: predicts zero for 86%" in decide(mostly, NAMES, min_accuracy=0.2)[2]


def test_accuracy_not_above_the_majority_share_is_degenerate():
    """70% of the test images are "zero": 0.70 is what answering "zero" every time scores."""
    labels = np.repeat(np.arange(4), [70, 10, 10, 10])

    def scores_of(predicted_per_class: list[list[int]]):
        predicted = np.concatenate([np.array(p) for p in predicted_per_class])
        return score(np.eye(4)[predicted], labels, 4)

    better = scores_of([[0] * 70, [1] * 5 + [0] * 5, [2] * 5 + [3] * 5, [3] * 5 + [2] * 5])  # "zero" for 75%
    assert better.accuracy == pytest.approx(0.85) and decide(better, NAMES, min_accuracy=0.5)[0]
    weak = scores_of([[0] * 60 + [1] * 10, [1] * 10, [3] * 10, [0] * 10])
    assert weak.accuracy == pytest.approx(0.70)
    blessed, _, line = decide(weak, NAMES, min_accuracy=0.5)
    assert not blessed
    assert line == ("not blessed: 0.700 >= 0.50 but degenerate: accuracy 0.700 is not above the majority class's "
                    "share 0.700 (zero); it predicts 3 of 4 classes")
    assert decide(scores_with(900), NAMES, min_accuracy=0.5)[0]  # a balanced, working model is not


def test_a_real_model_with_one_answer_is_refused_by_the_gate(tiny_model, small_dataset, tmp_path):
    """The trained model with its logits' weights zeroed and one bias raised: it answers Bag whatever the image,
    as a collapsed run does; evaluate() refuses it and the report says so."""
    import keras

    model = keras.models.load_model(os.path.join(tiny_model, "model.keras"), compile=False)
    kernel, bias = model.get_layer("logits").get_weights()
    bias[:] = 0
    bias[8] = 5.0  # Bag
    model.get_layer("logits").set_weights([np.zeros_like(kernel), bias])
    collapsed = tmp_path / "collapsed"
    collapsed.mkdir()
    model.save(str(collapsed / "model.keras"))
    data.write_json(str(collapsed / "training.json"), json.load(open(os.path.join(tiny_model, "training.json"))))
    result = evaluate(str(collapsed), small_dataset, min_accuracy=0.0)
    assert not result.blessed
    assert re.search(r"degenerate: predicts Bag for 100% of the test images \(it is \d+% of them\)", result.decision)
    write_report(result, str(collapsed), small_dataset, str(tmp_path / "report.html"))
    assert "degenerate: predicts Bag" in (tmp_path / "report.html").read_text()
    assert "degenerate: predicts Bag" in decision_markdown(result)


def test_scores_are_the_textbook_ones():
    labels = np.array([0, 0, 0, 1, 1, 2])
    probabilities = np.eye(3)[[0, 0, 1, 1, 2, 2]] * 0.8 + 0.2 / 3
    s = score(probabilities, labels, 3)
    assert s.confusion == [[2, 1, 0], [0, 1, 1], [0, 0, 1]]
    assert s.accuracy == pytest.approx(4 / 6)
    assert s.precision == pytest.approx([1.0, 0.5, 0.5])
    assert s.recall == pytest.approx([2 / 3, 0.5, 1.0])
    assert s.f1[0] == pytest.approx(0.8)
    assert s.loss == pytest.approx(-(4 * np.log(0.8 + 0.2 / 3) + 2 * np.log(0.2 / 3)) / 6)
    summary = s.summary()
    assert summary["macro_recall"] == pytest.approx((2 / 3 + 0.5 + 1) / 3)
    assert summary["weighted_recall"] == pytest.approx(s.accuracy)  # weighted recall is accuracy


# ---------------------------------------------------------------------------------------------- real models


@pytest.fixture(scope="module")
def untrained_model(small_dataset, tmp_path_factory) -> str:
    """A real model with random weights in train's output format: a champion anyone should beat."""
    import keras

    from components.train import build_model

    manifest = data.read_manifest(small_dataset)
    keras.utils.set_random_seed(0)
    model = build_model(manifest["image_shape"], len(manifest["class_names"]))
    out = tmp_path_factory.mktemp("untrained")
    model.save(str(out / "model.keras"))
    data.write_json(str(out / "training.json"), {"class_names": manifest["class_names"],
                                                 "image_shape": manifest["image_shape"], "history": {}})
    return str(out)


def test_evaluate_scores_the_test_split(tiny_model, small_dataset):
    result = evaluate(tiny_model, small_dataset, min_accuracy=0.5)
    images, labels = data.load_split_arrays(small_dataset, "test")
    probabilities = data.load_classifier(tiny_model).predict_proba(images.astype(np.float32))
    assert result.scores.accuracy == pytest.approx(float(np.mean(probabilities.argmax(1) == labels)))
    assert sum(map(sum, result.scores.confusion)) == len(labels)
    assert result.blessed and result.champion is None
    assert result.decision.endswith("(no champion yet)")
    assert 0 < len(result.worst_mistakes) <= 16
    confidences = [m["confidence"] for m in result.worst_mistakes]
    assert confidences == sorted(confidences, reverse=True)
    assert all(m["true"] != m["predicted"] for m in result.worst_mistakes)
    assert json.loads(json.dumps(result.to_json()))["metrics"]["accuracy"] == result.scores.accuracy


def test_champion_is_rescored_on_the_same_test_data(tiny_model, untrained_model, small_dataset):
    weak = evaluate(untrained_model, small_dataset)
    strong = evaluate(tiny_model, small_dataset)
    assert strong.scores.accuracy > weak.scores.accuracy + 0.2

    beats = evaluate(tiny_model, small_dataset, min_accuracy=0.3, champion_model_dir=untrained_model,
                     champion_version="1", tolerance=0.005)
    assert beats.blessed and beats.champion.accuracy == weak.scores.accuracy
    assert ">= champion v1" in beats.decision

    loses = evaluate(untrained_model, small_dataset, min_accuracy=0.0, champion_model_dir=tiny_model,
                     champion_version="2", tolerance=0.005)
    assert not loses.blessed and "< champion v2" in loses.decision

    itself = evaluate(tiny_model, small_dataset, champion_model_dir=tiny_model, champion_version="3")
    assert itself.blessed and itself.champion.accuracy == itself.scores.accuracy  # the edge: equal, tolerance 0


def test_champion_that_cannot_be_compared_or_loaded(tiny_model, small_dataset, tmp_path):
    from components.train import build_model

    other = tmp_path / "rgb-model"
    other.mkdir()
    build_model([32, 32, 3], 10).save(str(other / "model.keras"))
    data.write_json(str(other / "training.json"), {"class_names": data.FASHION_MNIST_CLASSES,
                                                   "image_shape": [32, 32, 3], "history": {}})
    result = evaluate(tiny_model, small_dataset, champion_model_dir=str(other), champion_version="5")
    assert not result.blessed
    assert "but champion v5 cannot be compared on this test data: it takes 32x32x3 images, this run's test data " \
           "is 28x28x1; choose another --model-name or --registry-root" in result.decision
    assert result.decision.split(" but ", 1)[1] in result.reasons
    with pytest.raises(data.DataError, match="champion v6 could not be loaded from .*gone"):
        evaluate(tiny_model, small_dataset, champion_model_dir=str(tmp_path / "gone"), champion_version="6")


def test_champion_of_other_classes_names_both_and_says_what_to_choose(tiny_model, small_dataset, tmp_path):
    from components.train import build_model

    other = tmp_path / "pets-model"
    other.mkdir()
    build_model([28, 28, 1], 3).save(str(other / "model.keras"))
    data.write_json(str(other / "training.json"), {"class_names": ["cat", "dog", "bird"], "image_shape": [28, 28, 1],
                                                   "history": {}})
    result = evaluate(tiny_model, small_dataset, champion_model_dir=str(other), champion_version="4")
    assert not result.blessed
    assert ("but champion v4 cannot be compared on this test data: it predicts 3 classes (cat, dog, bird), this "
            "run's test data has 10 classes (T-shirt/top, Trouser, Pullover, Dress, Coat, Sandal, Shirt, Sneaker, "
            "Bag, Ankle boot); choose another --model-name or --registry-root") in result.decision


def test_kfp_metrics_and_confusion_matrix(tiny_model, small_dataset, tmp_path):
    from kfp import dsl

    result = evaluate(tiny_model, small_dataset, min_accuracy=0.5)
    metrics = dsl.Metrics(name="metrics", uri=str(tmp_path / "metrics"))
    confusion = dsl.ClassificationMetrics(name="confusion", uri=str(tmp_path / "confusion"))
    log_to_kfp(result, metrics, confusion)

    for name in ("accuracy", "loss", "macro_precision", "macro_recall", "macro_f1", "weighted_precision",
                 "weighted_recall", "weighted_f1"):
        assert metrics.metadata[name] == pytest.approx(result.scores.summary()[name], abs=1e-6)
    for name, recall in zip(result.class_names, result.scores.recall):
        assert metrics.metadata[f"recall: {name}"] == pytest.approx(recall, abs=1e-6)
        assert f"precision: {name}" in metrics.metadata and f"f1: {name}" in metrics.metadata
    assert metrics.metadata["blessed"] == 1.0
    matrix = confusion.metadata["confusionMatrix"]
    assert [spec["displayName"] for spec in matrix["annotationSpecs"]] == data.FASHION_MNIST_CLASSES
    assert [row["row"] for row in matrix["rows"]] == result.scores.confusion
    json.dumps(confusion.metadata)  # what KFP stores must be plain JSON

    markdown = decision_markdown(result)
    assert markdown.startswith(f"**{result.decision}**\n\n- accuracy ")
    assert markdown.count("\n- ") == len(result.reasons)


def test_report_is_self_contained_with_every_figure(tiny_model, small_dataset, tmp_path):
    from PIL import Image

    result = evaluate(tiny_model, small_dataset, min_accuracy=0.5, min_class_recall=0.95)
    path = str(tmp_path / "report.html")
    write_report(result, tiny_model, small_dataset, path)
    with open(path) as f:
        page = f.read()
    titles = re.findall(r"<h2>([^<]+)</h2>", page)
    assert titles == ["Training curves", "Confusion matrix", "Per class", "Most confidently wrong test images"]
    sources = re.findall(r"<img alt='[^']*' src='data:image/png;base64,([^']+)'>", page)
    assert len(sources) == 4
    for encoded in sources:
        image = Image.open(io.BytesIO(base64.b64decode(encoded)))
        image.load()
        assert image.width > 300 and image.height > 150
    assert not re.search(r"(src|href)=['\"]?(https?:)?//", page)  # nothing fetched from anywhere
    assert "<script" not in page
    assert "T-shirt/top" in page and html.escape(result.decision) in page
    assert page.count("<tr class=low>") == sum(r < 0.95 for r in result.scores.recall) > 0
    assert len(page) < 1_500_000


def test_evaluate_op_reads_the_champion_from_the_registry(tiny_model, untrained_model, small_dataset, tmp_path):
    """The KFP component as it runs in a pipeline: champion from a real local registry, every output written."""
    from kfp import dsl

    from components import ops
    from components.register import LocalRegistry, register

    registry_root = str(tmp_path / "registry")
    register(untrained_model, LocalRegistry(registry_root), model_name="clf")

    def run(model_dir: str, name: str) -> tuple[bool, dict]:
        outputs = {key: tmp_path / f"{name}-{key}" for key in ("metrics", "confusion", "decision", "evaluation",
                                                                "report")}
        blessed = ops.evaluate_op.python_func(
            model=dsl.Model(uri=model_dir), dataset=dsl.Dataset(uri=small_dataset), min_accuracy=0.3,
            min_class_recall=-1.0, tolerance=0.005, registry="local", registry_root=registry_root,
            model_name="clf", project="", location="",
            metrics=dsl.Metrics(uri=str(outputs["metrics"])),
            confusion=dsl.ClassificationMetrics(uri=str(outputs["confusion"])),
            decision=dsl.Markdown(uri=str(outputs["decision"])), evaluation=dsl.Artifact(uri=str(outputs["evaluation"])),
            report=dsl.HTML(uri=str(outputs["report"])))
        return blessed, outputs

    blessed, outputs = run(tiny_model, "first")
    assert blessed is True
    decision = outputs["decision"].read_text()
    assert decision.startswith("**blessed: ") and ">= champion v1 " in decision
    evaluation = json.loads(outputs["evaluation"].read_text())
    assert evaluation["blessed"] and evaluation["champion"]["version"] == "1"
    assert outputs["report"].read_text().startswith("<!doctype html>")

    register(tiny_model, LocalRegistry(registry_root), model_name="clf")  # now the champion is strong
    blessed, outputs = run(untrained_model, "second")
    assert blessed is False and "< champion v2 " in outputs["decision"].read_text()
