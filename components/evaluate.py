"""Evaluate: test metrics, the confusion matrix, and the gate that decides whether a model is blessed.

A model is blessed only if it clears the absolute thresholds (minimum accuracy; optionally a minimum recall
for every class) and is not worse than the registry's current champion by more than `tolerance`, both
measured here on the same test data. With no champion yet, the thresholds alone decide.
"""

from __future__ import annotations

import argparse
import dataclasses
import html
import io
import json
import logging
import math
import sys

import numpy as np

from components import data

log = logging.getLogger(__name__)


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

    def to_json(self) -> dict:
        out = {k: v for k, v in dataclasses.asdict(self).items() if k != "mistake_images"}
        return {**out, "metrics": self.scores.summary()}


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


def decide(scores: Scores, class_names: list[str], *, min_accuracy: float, min_class_recall: float | None = None,
           champion: Champion | None = None, tolerance: float = 0.0) -> tuple[bool, list[str], str]:
    """The gate: (blessed, reasons, one-line decision for the UI)."""
    reasons, failed = [], False
    acc = scores.accuracy
    if acc >= min_accuracy:
        reasons.append(f"accuracy {acc:.4f} >= minimum {min_accuracy:.4f}")
    else:
        failed = True
        reasons.append(f"accuracy {acc:.4f} < minimum {min_accuracy:.4f}")
    if min_class_recall is not None:
        low = [(n, r) for n, r in zip(class_names, scores.recall) if r < min_class_recall]
        if low:
            failed = True
            reasons.append("recall below {:.3f} for ".format(min_class_recall)
                           + ", ".join(f"{n} ({r:.3f})" for n, r in low))
        else:
            reasons.append(f"every class recall >= {min_class_recall:.3f}")
    line = f"{acc:.3f} {'>=' if acc >= min_accuracy else '<'} {min_accuracy:.2f}"
    if champion is None:
        reasons.append("no champion yet: the thresholds alone decide")
    else:
        bar = champion.accuracy - tolerance
        # A hair of slack so that equal scores computed in float32 and float64 compare equal.
        if acc + 1e-9 >= bar:
            reasons.append(f"accuracy {acc:.4f} >= champion v{champion.version} {champion.accuracy:.4f} "
                           f"- tolerance {tolerance:.4f}")
            line += f" and >= champion v{champion.version} {champion.accuracy:.3f} - {tolerance:.3f}"
        else:
            failed = True
            reasons.append(f"accuracy {acc:.4f} < champion v{champion.version} {champion.accuracy:.4f} "
                           f"- tolerance {tolerance:.4f}")
            line += f" but < champion v{champion.version} {champion.accuracy:.3f} - {tolerance:.3f}"
    blessed = not failed
    return blessed, reasons, f"{'blessed' if blessed else 'not blessed'}: {line}"


def predict_arrays(classifier: data.Classifier, images: np.ndarray, batch: int = 1024) -> np.ndarray:
    out = [classifier.predict_proba(images[i:i + batch].astype(np.float32)) for i in range(0, len(images), batch)]
    return np.concatenate(out)


def evaluate(model_dir: str, dataset_dir: str, *, min_accuracy: float = 0.0, min_class_recall: float | None = None,
             champion_model_dir: str | None = None, champion_version: str = "", tolerance: float = 0.0,
             worst: int = 16) -> Evaluation:
    """Scores `model_dir` on the test split of `dataset_dir` and applies the gate."""
    manifest = data.read_manifest(dataset_dir)
    class_names = manifest["class_names"]
    images, labels = data.load_split_arrays(dataset_dir, "test")
    classifier = data.load_classifier(model_dir)
    if list(classifier.image_shape) != list(images.shape[1:]):
        raise data.DataError(f"The model takes images of shape {classifier.image_shape} but the test data has "
                             f"{list(images.shape[1:])}")
    probabilities = predict_arrays(classifier, images)
    scores = score(probabilities, labels, len(class_names))
    if not all(math.isfinite(v) for v in (scores.accuracy, scores.loss)):
        raise ValueError(f"Evaluation produced non-finite metrics: accuracy={scores.accuracy}, loss={scores.loss}")

    champion = None
    if champion_model_dir:
        champion_classifier = data.load_classifier(champion_model_dir)
        champion_scores = score(predict_arrays(champion_classifier, images), labels, len(class_names))
        champion = Champion(champion_version, champion_scores.accuracy, champion_model_dir)
    blessed, reasons, decision = decide(scores, class_names, min_accuracy=min_accuracy,
                                        min_class_recall=min_class_recall, champion=champion, tolerance=tolerance)
    predicted = probabilities.argmax(axis=1)
    wrong = np.flatnonzero(predicted != labels)
    wrong = wrong[np.argsort(-probabilities[wrong, predicted[wrong]])][:worst]
    worst_mistakes = [{"index": int(i), "true": class_names[labels[i]], "predicted": class_names[predicted[i]],
                       "confidence": float(probabilities[i, predicted[i]])} for i in wrong]
    log.info("evaluate: %s", decision)
    return Evaluation(class_names, scores, blessed, reasons, decision, champion, worst_mistakes,
                      [images[i] for i in wrong])


def _png(figure) -> str:
    import base64

    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=100, bbox_inches="tight")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


def write_report(result: Evaluation, model_dir: str, dataset_dir: str, path: str) -> None:
    """A self-contained HTML report (images inlined): training curves, confusion heatmap, per-class table and
    the most confidently wrong test images. Opens in the KFP UI and in any browser."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    figures = {}
    info_path = data.join(model_dir, "training.json")
    history = {}
    if data.gfile().exists(info_path):
        with data.gfile().GFile(info_path) as f:
            history = json.load(f).get("history", {})
    if history.get("loss"):
        fig, axes = plt.subplots(1, 2, figsize=(10, 3.5))
        epochs = range(1, len(history["loss"]) + 1)
        for ax, metric in zip(axes, ("loss", "accuracy")):
            for prefix, style in (("", "-o"), ("val_", "--s")):
                if prefix + metric in history:
                    ax.plot(epochs, history[prefix + metric], style, label=("validation " if prefix else "train ")
                            + metric)
            ax.set_xlabel("epoch")
            ax.set_title(metric)
            ax.grid(alpha=0.3)
            ax.legend()
        figures["Training curves"] = _png(fig)
        plt.close(fig)
    names = result.class_names
    matrix = np.asarray(result.scores.confusion)
    fig, ax = plt.subplots(figsize=(1 + 0.6 * len(names), 1 + 0.55 * len(names)))
    ax.imshow(matrix, cmap="Blues")
    ax.set_xticks(range(len(names)), names, rotation=45, ha="right")
    ax.set_yticks(range(len(names)), names)
    ax.set_xlabel("predicted")
    ax.set_ylabel("true")
    for (i, j), value in np.ndenumerate(matrix):
        ax.text(j, i, str(value), ha="center", va="center", fontsize=8,
                color="white" if value > matrix.max() / 2 else "black")
    figures["Confusion matrix"] = _png(fig)
    plt.close(fig)
    if result.mistake_images:
        columns = 8
        rows = (len(result.mistake_images) + columns - 1) // columns
        fig, axes = plt.subplots(rows, columns, figsize=(columns * 1.6, rows * 1.9), squeeze=False)
        for ax in axes.flat:
            ax.axis("off")
        for ax, image, mistake in zip(axes.flat, result.mistake_images, result.worst_mistakes):
            ax.imshow(image.squeeze(), cmap="gray" if image.shape[-1] == 1 else None)
            ax.set_title(f"true: {mistake['true']}\npred: {mistake['predicted']}\n{100 * mistake['confidence']:.1f}%",
                         fontsize=7)
        figures["Most confidently wrong test images"] = _png(fig)
        plt.close(fig)
    summary = result.scores.summary()
    rows_html = "".join(
        f"<tr><td>{html.escape(n)}</td><td>{p:.3f}</td><td>{r:.3f}</td><td>{f1:.3f}</td><td>{s}</td></tr>"
        for n, p, r, f1, s in zip(names, result.scores.precision, result.scores.recall, result.scores.f1,
                                  result.scores.support))
    body = [f"<h1>Evaluation report</h1><p class='decision {'ok' if result.blessed else 'no'}'>"
            f"{html.escape(result.decision)}</p><ul>" + "".join(f"<li>{html.escape(r)}</li>" for r in result.reasons)
            + "</ul>",
            "<p>" + " &middot; ".join(f"{k.replace('_', ' ')}: <b>{v:.4f}</b>" for k, v in summary.items()) + "</p>"]
    for title, src in figures.items():
        body.append(f"<h2>{title}</h2><img alt='{title}' src='{src}'>")
    body.append("<h2>Per class</h2><table><tr><th>class</th><th>precision</th><th>recall</th><th>F1</th>"
                f"<th>support</th></tr>{rows_html}</table>")
    page = ("<!doctype html><html><head><meta charset='utf-8'><title>Evaluation report</title><style>"
            "body{font-family:sans-serif;margin:24px;max-width:1100px}img{max-width:100%}"
            "table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:4px 10px;text-align:right}"
            "td:first-child{text-align:left}.decision{font-size:1.3em;font-weight:bold}.ok{color:#137333}"
            ".no{color:#b3261e}</style></head><body>" + "".join(body) + "</body></html>")
    with data.gfile().GFile(path, "w") as f:
        f.write(page)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Evaluate a trained model on the test split and gate it.")
    parser.add_argument("--model-dir", required=True)
    parser.add_argument("--dataset-dir", required=True)
    parser.add_argument("--min-accuracy", type=float, default=0.0)
    parser.add_argument("--min-class-recall", type=float)
    parser.add_argument("--champion-model-dir")
    parser.add_argument("--tolerance", type=float, default=0.0)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    try:
        result = evaluate(args.model_dir, args.dataset_dir, min_accuracy=args.min_accuracy,
                          min_class_recall=args.min_class_recall, champion_model_dir=args.champion_model_dir,
                          tolerance=args.tolerance)
    except (data.DataError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    json.dump(result.to_json(), sys.stdout, indent=2)
    print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
