"""Evaluate: test metrics, the confusion matrix, and the gate that decides whether a model is blessed.

A model is blessed only if it clears the absolute thresholds (minimum accuracy; optionally a minimum recall
for every class), is not degenerate (see `degenerate`), and is not worse than the registry's current champion by
more than `tolerance`, both measured here on the same test data. With no champion yet, the thresholds alone decide.

The evaluation records which champion the gate compared against (`compared_with`: its version, or None for no
champion) and a digest of the test set (`test_set`), so that registration moves the champion only if it is still
that one; if another run moved it in between, `rejudge` applies the gate again against the new champion.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import html
import io
import json
import logging
import math

import numpy as np

from components import params, stepcli
from components.dataio import data

log = logging.getLogger(__name__)

# A model that predicts one class for this share of the test images (more than that class's own share of them)
# has collapsed onto it: a short run from scratch on a small photo set did, at 100%, with accuracy equal to that
# class's share of the test split.
DEGENERATE_SHARE = 0.8


@dataclasses.dataclass
class Scores:
    accuracy: float
    loss: float
    confusion: list[list[int]]  # rows: true class, columns: predicted class
    precision: list[float]
    recall: list[float]
    f1: list[float]
    support: list[int]

    def summary(self) -> dict:
        support = np.asarray(self.support, dtype=float)
        weights = support / max(support.sum(), 1)
        out = {"accuracy": self.accuracy, "loss": self.loss}
        for name in ("precision", "recall", "f1"):
            values = np.asarray(getattr(self, name))
            out[f"macro_{name}"] = float(values.mean())
            out[f"weighted_{name}"] = float((values * weights).sum())
        return out


@dataclasses.dataclass
class Champion:
    """The registry's current champion, re-scored on this run's test data."""

    version: str
    accuracy: float
    uri: str


@dataclasses.dataclass
class Evaluation:
    class_names: list[str]
    scores: Scores
    blessed: bool
    reasons: list[str]
    decision: str
    champion: Champion | None
    worst_mistakes: list[dict]  # most confidently wrong test images: index, true, predicted, confidence
    mistake_images: list = dataclasses.field(default_factory=list, repr=False)  # their pixels, for the report
    min_class_recall: float | None = None
    # The champion the gate saw: its version, or None when there was none (also when it could not be compared).
    compared_with: str | None = None
    test_set: str = ""  # digest_of_test_set of the images and labels scored
    gate: dict = dataclasses.field(default_factory=dict)  # min_accuracy, min_class_recall, tolerance

    def to_json(self) -> dict:
        out = {k: v for k, v in dataclasses.asdict(self).items() if k != "mistake_images"}
        return {**out, "metrics": self.scores.summary()}


def digest_of_test_set(images: np.ndarray, labels: np.ndarray, class_names: list[str]) -> str:
    """`sha256:HEX` of the test images (shape, dtype, pixels), their labels and the class names: two evaluations
    with the same digest scored the very same test set."""
    digest = hashlib.sha256()
    digest.update(json.dumps({"class_names": list(class_names), "images": [str(images.dtype), list(images.shape)],
                              "labels": list(labels.shape)}).encode())
    digest.update(np.ascontiguousarray(images).tobytes())
    digest.update(np.ascontiguousarray(labels, dtype=np.int64).tobytes())
    return "sha256:" + digest.hexdigest()


def score(probabilities: np.ndarray, labels: np.ndarray, num_classes: int) -> Scores:
    """Accuracy, mean cross-entropy, confusion matrix and per-class precision/recall/F1."""
    labels = labels.astype(np.int64)
    predicted = probabilities.argmax(axis=1)
    confusion = np.zeros((num_classes, num_classes), dtype=np.int64)
    np.add.at(confusion, (labels, predicted), 1)
    true_positive = np.diag(confusion).astype(float)
    predicted_count = confusion.sum(axis=0).astype(float)
    support = confusion.sum(axis=1).astype(float)
    precision = np.divide(true_positive, predicted_count, out=np.zeros(num_classes), where=predicted_count > 0)
    recall = np.divide(true_positive, support, out=np.zeros(num_classes), where=support > 0)
    denom = precision + recall
    f1 = np.divide(2 * precision * recall, denom, out=np.zeros(num_classes), where=denom > 0)
    picked = probabilities[np.arange(len(labels)), labels]
    loss = float(-np.log(np.clip(picked, 1e-12, 1.0)).mean())
    return Scores(float((predicted == labels).mean()), loss, confusion.tolist(), precision.tolist(),
                  recall.tolist(), f1.tolist(), support.astype(int).tolist())


def _digits(*pairs: tuple[float, float], least: int = 3, most: int = 6) -> int:
    """Decimals enough that no two different compared numbers print the same (0.8996 is not shown as 0.900)."""
    digits = least
    while digits < most and any(x != y and f"{x:.{digits}f}" == f"{y:.{digits}f}" for x, y in pairs):
        digits += 1
    return digits


def _short(value: float) -> str:
    """A threshold as written: 0.9 -> 0.90, 0.885 -> 0.885, 0.005 -> 0.005."""
    text = f"{value:.6f}".rstrip("0")
    return text + "0" * max(0, 2 - len(text.split(".")[1]))


def degenerate(scores: Scores, class_names: list[str]) -> str | None:
    """Why the model is degenerate, or None: it predicts one class for most of the test images (at least
    DEGENERATE_SHARE of them, more than that class's own share), or its accuracy is not above the share of the
    majority class (what always answering that class scores)."""
    matrix = np.asarray(scores.confusion)
    total = int(matrix.sum())
    if total == 0 or len(class_names) < 2:
        return None
    predicted, actual = matrix.sum(axis=0), matrix.sum(axis=1)
    top = int(predicted.argmax())
    if predicted[top] >= DEGENERATE_SHARE * total and predicted[top] > actual[top]:
        return (f"degenerate: predicts {class_names[top]} for {predicted[top] / total:.0%} of the test images "
                f"(it is {actual[top] / total:.0%} of them)")
    majority = int(actual.argmax())
    if scores.accuracy <= actual[majority] / total + 1e-9:
        return (f"degenerate: accuracy {scores.accuracy:.3f} is not above the majority class's share "
                f"{actual[majority] / total:.3f} ({class_names[majority]}); it predicts "
                f"{int((predicted > 0).sum())} of {len(class_names)} classes")
    return None


def decide(scores: Scores, class_names: list[str], *, min_accuracy: float, min_class_recall: float | None = None,
           champion: Champion | None = None, tolerance: float = 0.0,
           champion_problem: str | None = None) -> tuple[bool, list[str], str]:
    """The gate: (blessed, reasons, one-line decision for the UI).

    Blessed only if accuracy >= min_accuracy, the model is not `degenerate`, every class's recall >=
    min_class_recall (when given), and
    accuracy >= champion accuracy - tolerance (when there is a champion; both scored on the same test data).
    `champion_problem` says why the champion could not be scored on this test data: then it is not blessed.
    """
    gate = {"min_accuracy": min_accuracy, "tolerance": tolerance}
    if min_class_recall is not None:  # None: no such check (the pipeline's negative value)
        gate["min_class_recall"] = min_class_recall
        if min_class_recall < 0:
            raise ValueError(f"min_class_recall must be in [0, 1] (or None for no such check), got {min_class_recall}")
    params.validate(gate, what="blessing gate")
    reasons: list[str] = []
    clauses: list[tuple[bool, str]] = []  # for the one-line decision, accuracy first
    acc = scores.accuracy
    compared = [(acc, min_accuracy)]
    if champion is not None and not champion_problem:
        compared += [(acc, champion.accuracy), (acc, champion.accuracy - tolerance)]
    d = _digits(*compared)
    ok = acc >= min_accuracy
    reasons.append(f"accuracy {acc:.4f} {'>=' if ok else '<'} minimum {min_accuracy:.4f}")
    clauses.append((ok, f"{acc:.{d}f} {'>=' if ok else '<'} {_short(min_accuracy)}"))
    collapsed = degenerate(scores, class_names)
    if collapsed:  # never blessed, whatever the thresholds and the champion say
        reasons.append(collapsed)
        clauses.append((False, collapsed))
    if min_class_recall is not None:
        low = [(n, r) for n, r in zip(class_names, scores.recall) if r < min_class_recall]
        if low:
            listed = ", ".join(f"{n} ({r:.3f})" for n, r in low)
            reasons.append(f"recall below {min_class_recall:.3f} for {listed}")
            clauses.append((False, f"recall < {_short(min_class_recall)} for {listed}"))
        else:
            reasons.append(f"every class recall >= {min_class_recall:.3f} (lowest {min(scores.recall):.3f})")
    if champion_problem:
        reasons.append(champion_problem)
        clauses.append((False, champion_problem))
    elif champion is None:
        reasons.append("no champion yet: the thresholds alone decide")
    else:
        bar = champion.accuracy - tolerance
        # A hair of slack so that equal scores computed in float32 and float64 compare equal.
        ok = acc + 1e-9 >= bar
        sign = ">=" if ok else "<"
        reasons.append(f"accuracy {acc:.4f} {sign} champion v{champion.version} {champion.accuracy:.4f} - tolerance "
                       f"{tolerance:.4f} (both on the same {sum(scores.support)} test images)")
        clauses.append((ok, f"{sign} champion v{champion.version} {champion.accuracy:.{d}f} - {_short(tolerance)}"))
    blessed = all(ok for ok, _ in clauses)
    line = clauses[0][1]
    for ok, text in clauses[1:]:
        line += (" and " if ok == clauses[0][0] else " but ") + text
    if blessed and champion is None:
        line += " (no champion yet)"
    return blessed, reasons, f"{'blessed' if blessed else 'not blessed'}: {line}"


def _class_list(names: list[str], most: int = 12) -> str:
    shown = ", ".join(names[:most]) + (f", ... ({len(names) - most} more)" if len(names) > most else "")
    return f"{len(names)} classes ({shown})"


def predict_arrays(classifier: data.Classifier, images: np.ndarray, batch: int = 1024) -> np.ndarray:
    out = [classifier.predict_proba(images[i:i + batch].astype(np.float32)) for i in range(0, len(images), batch)]
    return np.concatenate(out)


def evaluate(model_dir: str, dataset_dir: str, *, min_accuracy: float = 0.0, min_class_recall: float | None = None,
             champion_model_dir: str | None = None, champion_version: str = "", tolerance: float = 0.0,
             worst: int = 16) -> Evaluation:
    """Scores `model_dir` on the test split of `dataset_dir`, re-scores the champion (when given) on the same
    images, and applies the gate."""
    manifest = data.read_manifest(dataset_dir)
    class_names = manifest["class_names"]
    images, labels = data.load_split_arrays(dataset_dir, "test")
    classifier = data.load_classifier(model_dir)
    if list(classifier.image_shape) != list(images.shape[1:]):
        raise data.DataError(f"The model takes images of shape {classifier.image_shape} but the test data has "
                             f"{list(images.shape[1:])}")
    probabilities = predict_arrays(classifier, images)
    if probabilities.shape[1] != len(class_names):
        raise data.DataError(f"The model predicts {probabilities.shape[1]} classes but the test data has "
                             f"{len(class_names)} ({', '.join(class_names)})")
    scores = score(probabilities, labels, len(class_names))
    if not all(math.isfinite(v) for v in (scores.accuracy, scores.loss)):
        raise ValueError(f"Evaluation produced non-finite metrics: accuracy={scores.accuracy}, loss={scores.loss}")

    champion, problem = None, None
    if champion_model_dir:
        try:
            champion_classifier = data.load_classifier(champion_model_dir)
        except (data.DataError, OSError) as e:
            raise data.DataError(f"The registry's champion v{champion_version} could not be loaded from "
                                 f"{champion_model_dir}: {e}") from e
        # The decision line carries the whole problem: what differs, and how to keep such models apart.
        advice = ("choose another --model-name or --registry-root (parameters model_name, registry_root) for the "
                  "models of this data")
        if list(champion_classifier.image_shape) != list(images.shape[1:]):
            problem = (f"champion v{champion_version} cannot be compared on this test data: it takes "
                       f"{'x'.join(map(str, champion_classifier.image_shape))} images, this run's test data is "
                       f"{'x'.join(map(str, images.shape[1:]))}; {advice}")
        elif list(champion_classifier.class_names) != list(class_names):
            order = (" (the same classes in another order)"
                     if sorted(champion_classifier.class_names) == sorted(class_names) else "")
            problem = (f"champion v{champion_version} cannot be compared on this test data: it predicts "
                       f"{_class_list(champion_classifier.class_names)}, this run's test data has "
                       f"{_class_list(class_names)}{order}; {advice}")
        else:
            champion_scores = score(predict_arrays(champion_classifier, images), labels, len(class_names))
            champion = Champion(champion_version, champion_scores.accuracy, champion_model_dir)
    blessed, reasons, decision = decide(scores, class_names, min_accuracy=min_accuracy,
                                        min_class_recall=min_class_recall, champion=champion, tolerance=tolerance,
                                        champion_problem=problem)
    # Test images with near-copies in training (preprocess could not keep their groups apart: the source's own
    # test split): the accuracy may be overstated, and the decision line says so wherever it is shown.
    near_copies = (manifest.get("near_duplicates") or {}).get("warning")
    if near_copies:
        reasons.append(f"warning: {near_copies}")
        decision += f" (warning: {near_copies})"
    predicted = probabilities.argmax(axis=1)
    wrong = np.flatnonzero(predicted != labels)
    wrong = wrong[np.argsort(-probabilities[wrong, predicted[wrong]], kind="stable")][:worst]
    worst_mistakes = [{"index": int(i), "true": class_names[labels[i]], "predicted": class_names[predicted[i]],
                       "confidence": float(probabilities[i, predicted[i]])} for i in wrong]
    log.info("evaluate: %s", decision)
    return Evaluation(class_names, scores, blessed, reasons, decision, champion, worst_mistakes,
                      [images[i] for i in wrong], min_class_recall=min_class_recall,
                      compared_with=champion_version if champion_model_dir else None,
                      test_set=digest_of_test_set(images, labels, class_names),
                      gate={"min_accuracy": min_accuracy, "min_class_recall": min_class_recall,
                            "tolerance": tolerance})


def rejudge(evaluation: dict, champion_version: str | None, champion_metrics: dict | None) -> tuple[bool | None, str]:
    """The gate again, for registration, when the champion is no longer the one `evaluation` (an Evaluation's
    JSON) compared against: (blessed, decision line); blessed is None when the new champion cannot be compared.

    The new champion is compared by the test accuracy recorded with it (its registered `accuracy`), and only when
    it was recorded on the very same test set (its registered `test_set` digest equals this evaluation's): that
    number is what evaluation measured for it on these images with this scoring, so re-scoring it would only
    repeat it (up to float rounding between machines, which can only move an image whose top two classes nearly
    tie). This keeps registration light: no model or test data to load in the register step. A champion scored on
    another test set (other data, another split, registered before test sets were recorded) cannot be compared
    without scoring it on this run's test data, which is evaluation's work: None, and the caller registers
    without the alias."""
    if champion_version is None:
        blessed, _, line = decide(Scores(**evaluation["scores"]), evaluation["class_names"], **_gate(evaluation))
        return blessed, line
    recorded = dict(champion_metrics or {})
    if not evaluation.get("test_set") or recorded.get("test_set") != evaluation["test_set"] or \
            not isinstance(recorded.get("accuracy"), (int, float)):
        return None, (f"champion v{champion_version} was not scored on this run's test set (its recorded test set "
                      f"{'differs' if recorded.get('test_set') else 'is unknown'})")
    champion = Champion(champion_version, float(recorded["accuracy"]), "")
    blessed, _, line = decide(Scores(**evaluation["scores"]), evaluation["class_names"], champion=champion,
                              **_gate(evaluation))
    return blessed, line


def _gate(evaluation: dict) -> dict:
    gate = evaluation["gate"]
    return {"min_accuracy": gate["min_accuracy"], "min_class_recall": gate.get("min_class_recall"),
            "tolerance": gate["tolerance"]}


def log_to_kfp(result: Evaluation, metrics, confusion) -> None:
    """Fills the KFP output artifacts: `metrics` (dsl.Metrics: the scalars the run's UI compares across runs)
    and `confusion` (dsl.ClassificationMetrics: the confusion matrix, with class names)."""
    for name, value in result.scores.summary().items():
        metrics.log_metric(name, round(value, 6))
    for name, precision, recall, f1 in zip(result.class_names, result.scores.precision, result.scores.recall,
                                           result.scores.f1):
        metrics.log_metric(f"precision: {name}", round(precision, 6))
        metrics.log_metric(f"recall: {name}", round(recall, 6))
        metrics.log_metric(f"f1: {name}", round(f1, 6))
    if result.champion is not None:
        metrics.log_metric("champion_accuracy", round(result.champion.accuracy, 6))
    metrics.log_metric("blessed", 1.0 if result.blessed else 0.0)
    confusion.log_confusion_matrix(list(result.class_names), [list(map(int, row)) for row in result.scores.confusion])


def decision_markdown(result: Evaluation) -> str:
    """The decision as the KFP UI shows a Markdown artifact: the line in bold, then each reason."""
    return f"**{result.decision}**\n\n" + "".join(f"- {reason}\n" for reason in result.reasons)


def _png(figure) -> str:
    import base64

    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=100, bbox_inches="tight")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


def _figures(result: Evaluation, history: dict) -> dict[str, tuple[str, str]]:
    """The report's figures: title -> (PNG data URI, caption)."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    figures = {}
    names = result.class_names
    if history.get("loss"):
        metric_names = [m for m in ("loss", "accuracy") if history.get(m)]
        fig, axes = plt.subplots(1, len(metric_names), figsize=(5 * len(metric_names), 3.4), squeeze=False)
        epochs = np.arange(1, len(history["loss"]) + 1)
        for ax, metric in zip(axes[0], metric_names):
            ax.plot(epochs, history[metric], "-o", color="#1f77b4", label=f"train {metric}")
            if history.get("val_" + metric):
                ax.plot(epochs, history["val_" + metric], "--s", color="#ff7f0e", label=f"validation {metric}")
            ax.set_xlabel("epoch")
            ax.set_title(metric)
            ax.set_xticks(epochs if len(epochs) <= 20 else epochs[::max(1, len(epochs) // 10)])
            ax.grid(alpha=0.3)
            ax.legend()
        fig.tight_layout()
        figures["Training curves"] = (_png(fig), "Per epoch, on the training and validation splits.")
        plt.close(fig)

    matrix = np.asarray(result.scores.confusion)
    share = matrix / np.maximum(matrix.sum(axis=1, keepdims=True), 1)
    size = 1.5 + 0.62 * len(names)
    fig, ax = plt.subplots(figsize=(size + 1.2, size))
    shown = ax.imshow(share, cmap="Blues", vmin=0, vmax=1)
    fig.colorbar(shown, ax=ax, fraction=0.046, pad=0.04, label="share of the true class")
    ax.set_xticks(range(len(names)), names, rotation=45, ha="right")
    ax.set_yticks(range(len(names)), names)
    ax.set_xlabel("predicted")
    ax.set_ylabel("true")
    for (i, j), value in np.ndenumerate(matrix):
        if value:
            ax.text(j, i, str(value), ha="center", va="center", fontsize=8,
                    color="white" if share[i, j] > 0.5 else "black")
    fig.tight_layout()
    figures["Confusion matrix"] = (_png(fig), "Counts of test images; the colour is the share of each true class "
                                              "(the diagonal is the recall).")
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(max(6.0, 0.75 * len(names) + 2), 3.6))
    x = np.arange(len(names))
    for offset, (label, values, color) in zip((-0.27, 0, 0.27), (
            ("precision", result.scores.precision, "#4c78a8"), ("recall", result.scores.recall, "#f58518"),
            ("F1", result.scores.f1, "#54a24b"))):
        ax.bar(x + offset, values, width=0.27, label=label, color=color)
    if result.min_class_recall is not None:
        ax.axhline(result.min_class_recall, color="#b3261e", linestyle="--", linewidth=1,
                   label=f"minimum recall {result.min_class_recall:g}")
    ax.set_xticks(x, names, rotation=45, ha="right")
    ax.set_ylim(0, 1.05)
    ax.grid(axis="y", alpha=0.3)
    ax.legend(ncol=4, fontsize=8, loc="lower center", bbox_to_anchor=(0.5, 1.0), frameon=False)
    fig.tight_layout()
    figures["Per class"] = (_png(fig), "Precision, recall and F1 of each class on the test split.")
    plt.close(fig)

    if result.mistake_images:
        columns = 8
        rows = (len(result.mistake_images) + columns - 1) // columns
        fig, axes = plt.subplots(rows, columns, figsize=(columns * 1.6, rows * 2.1), squeeze=False)
        for ax in axes.flat:
            ax.axis("off")
        for ax, image, mistake in zip(axes.flat, result.mistake_images, result.worst_mistakes):
            ax.imshow(image.squeeze(), cmap="gray" if image.shape[-1] == 1 else None, vmin=0, vmax=255)
            ax.set_title(f"true: {mistake['true']}\npredicted: {mistake['predicted']}\n"
                         f"{100 * mistake['confidence']:.1f}%", fontsize=8, color="#b3261e")
        fig.tight_layout()
        figures["Most confidently wrong test images"] = (
            _png(fig), "The test images the model got wrong with the highest confidence: label noise, or a blind "
                       "spot worth more data.")
        plt.close(fig)
    return figures


REPORT_STYLE = """
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:24px auto;max-width:1100px;
  color:#202124;padding:0 16px}
h1{font-size:1.6em;margin-bottom:.2em}h2{font-size:1.2em;margin-top:1.6em;border-bottom:1px solid #e0e0e0}
.decision{font-size:1.25em;font-weight:600;padding:10px 14px;border-radius:6px}
.ok{background:#e6f4ea;color:#137333}.no{background:#fce8e6;color:#b3261e}
.cards{display:flex;flex-wrap:wrap;gap:10px;margin:14px 0}
.card{border:1px solid #dadce0;border-radius:6px;padding:8px 14px;min-width:110px}
.card b{display:block;font-size:1.3em}.card span{color:#5f6368;font-size:.85em}
img{max-width:100%;height:auto}figure{margin:0}figcaption{color:#5f6368;font-size:.9em}
table{border-collapse:collapse;font-variant-numeric:tabular-nums}
td,th{border:1px solid #dadce0;padding:4px 12px;text-align:right}td:first-child,th:first-child{text-align:left}
tr.low td{background:#fce8e6}.meta{color:#5f6368;font-size:.85em;margin-top:2em}
"""


def write_report(result: Evaluation, model_dir: str, dataset_dir: str, path: str) -> None:
    """A self-contained HTML report (images inlined, no scripts, nothing fetched): the decision and its
    reasons, training curves, the confusion matrix as a heatmap, per-class figures and table, and the most
    confidently wrong test images. Opens in the KFP UI (an HTML artifact) and in any browser."""
    history = {}
    info_path = data.join(model_dir, "training.json")
    if data.gfile().exists(info_path):
        with data.gfile().GFile(info_path) as f:
            history = json.load(f).get("history", {})
    figures = _figures(result, history)
    summary = result.scores.summary()
    esc = html.escape
    cards = [("accuracy", summary["accuracy"]), ("loss", summary["loss"]), ("macro F1", summary["macro_f1"]),
             ("weighted F1", summary["weighted_f1"]), ("macro recall", summary["macro_recall"])]
    if result.champion is not None:
        cards.append((f"champion v{result.champion.version} accuracy", result.champion.accuracy))
    body = [
        "<h1>Evaluation report</h1>",
        f"<p class='decision {'ok' if result.blessed else 'no'}'>{esc(result.decision)}</p>",
        "<ul>" + "".join(f"<li>{esc(r)}</li>" for r in result.reasons) + "</ul>",
        "<div class='cards'>" + "".join(f"<div class='card'><b>{v:.4f}</b><span>{esc(k)}</span></div>"
                                        for k, v in cards) + "</div>",
    ]
    for title, (src, caption) in figures.items():
        body.append(f"<h2>{esc(title)}</h2><figure><img alt='{esc(title)}' src='{src}'>"
                    f"<figcaption>{esc(caption)}</figcaption></figure>")
        if title == "Per class":
            low = result.min_class_recall
            body.append(
                "<table><tr><th>class</th><th>precision</th><th>recall</th><th>F1</th><th>test images</th></tr>"
                + "".join(
                    f"<tr{' class=low' if low is not None and r < low else ''}><td>{esc(n)}</td><td>{p:.3f}</td>"
                    f"<td>{r:.3f}</td><td>{f1:.3f}</td><td>{s}</td></tr>"
                    for n, p, r, f1, s in zip(result.class_names, result.scores.precision, result.scores.recall,
                                              result.scores.f1, result.scores.support))
                + "</table>")
    body.append(f"<p class='meta'>model {esc(model_dir)}<br>test data {esc(dataset_dir)} "
                f"({sum(result.scores.support)} images)</p>")
    page = ("<!doctype html><html lang='en'><head><meta charset='utf-8'>"
            "<meta name='viewport' content='width=device-width, initial-scale=1'>"
            f"<title>Evaluation report</title><style>{REPORT_STYLE}</style></head><body>"
            + "".join(body) + "</body></html>")
    with data.gfile().GFile(path, "w") as f:
        f.write(page)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Evaluate a trained model on the test split and gate it.")
    parser.add_argument("--model-dir", required=True)
    parser.add_argument("--dataset-dir", required=True)
    parser.add_argument("--min-accuracy", type=float, default=0.0)
    parser.add_argument("--min-class-recall", type=float)
    parser.add_argument("--champion-model-dir", help="the current champion, re-scored on the same test data")
    parser.add_argument("--champion-version", default="", help="its version, for the decision line")
    parser.add_argument("--tolerance", type=float, default=0.0)
    parser.add_argument("--report", help="write the HTML report here")
    args = parser.parse_args(argv)

    def step():
        result = evaluate(args.model_dir, args.dataset_dir, min_accuracy=args.min_accuracy,
                          min_class_recall=args.min_class_recall, champion_model_dir=args.champion_model_dir,
                          champion_version=args.champion_version, tolerance=args.tolerance)
        if args.report:
            write_report(result, args.model_dir, args.dataset_dir, args.report)
        return result

    return stepcli.run(step)


if __name__ == "__main__":
    raise SystemExit(main())
