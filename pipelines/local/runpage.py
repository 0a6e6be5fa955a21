"""RUN_DIR/index.html: a local run as one page, the local stand-in for the KFP UI's run view.

One self-contained file: it opens from disk, with no server and nothing fetched; images are inline data URIs.
It shows the decision and the metrics, each step's state, time, key figures and log, then the steps' own HTML
artifacts as they are (the dataset card, the augmentation preview, the evaluation report: each in an iframe
whose srcdoc is the artifact, as the KFP UI shows an HTML artifact), a grid of the predicted images with their
classes and confidences, the training curves (the evaluation report's figure, not drawn again), and the command
that opens TensorBoard on the run's logs. Everything is read from the run's summary and artifacts.
"""

from __future__ import annotations

import base64
import html
import io
import json
import os
import shutil
import sys
from html.parser import HTMLParser

from components import params

PAGE = "index.html"
SECTIONS = [("predictions", "Predictions"), ("training", "Training curves"), ("gpu", "GPU utilization"),
            ("tensorboard", "TensorBoard"),
            ("evaluation", "Evaluation report"), ("dataset", "Dataset card"), ("augmentation", "Augmentation preview")]
MOST_PREDICTIONS = 100  # shown in the grid; predictions.jsonl has them all
INLINE_BYTES = 256 << 10  # larger images are shown as thumbnails
BROWSER_FORMATS = {".png": "image/png", ".jpg": "image/jpeg", ".jpeg": "image/jpeg", ".gif": "image/gif",
                   ".webp": "image/webp", ".bmp": "image/bmp"}

# Added to the evaluation report's style (components/evaluate.py), so that the page and the report look alike.
STYLE = """
body{max-width:1180px}h2{margin-top:1.8em}.decision{font-size:1.2em}
td,th{padding:4px 10px;text-align:left}td.n{text-align:right}.warning{color:#b3261e}
.state-succeeded{color:#137333}.state-failed{color:#b3261e;font-weight:600}.state-skipped{color:#5f6368}
iframe.artifact{width:100%;height:640px;border:1px solid #dadce0;border-radius:6px}
.grid{display:flex;flex-wrap:wrap;gap:8px}
.grid figure{margin:0;width:84px;border:1px solid #dadce0;border-radius:6px;padding:4px;text-align:center}
.grid img{width:72px;height:72px;object-fit:contain;image-rendering:pixelated;background:#000}
.grid figcaption{font-size:.75em;line-height:1.2}.grid .missing{height:72px;display:flex;align-items:center;
  font-size:.75em;color:#5f6368;overflow-wrap:anywhere}
.curves img{max-width:100%;height:auto}svg.spark{vertical-align:middle;background:#f1f3f4;border-radius:4px}
pre{background:#f1f3f4;padding:10px 12px;border-radius:6px;overflow-x:auto}
nav{margin:10px 0 14px}
"""

# Capped, so that one long artifact does not push the rest of the page away (the frame scrolls).
FIT_FRAME = ("try{this.style.height=Math.min(900,this.contentDocument.documentElement.scrollHeight+24)+'px'}"
             "catch(e){}")


def _read(path: str | None) -> str | None:
    if not path or not os.path.exists(path):
        return None
    with open(path, encoding="utf-8", errors="replace") as f:
        return f.read()


def _frame(title: str, page: str | None, missing: str) -> str:
    if page is None:
        return f"<p>{html.escape(missing)}</p>"
    return (f"<iframe class='artifact' title='{html.escape(title)}' sandbox='allow-same-origin' "
            f"onload=\"{FIT_FRAME}\" srcdoc=\"{html.escape(page, quote=True)}\"></iframe>")


class _Images(HTMLParser):
    """The <img> elements of a page: alt -> src."""

    def __init__(self):
        super().__init__()
        self.found: dict[str, str] = {}

    def handle_starttag(self, tag, attrs):
        if tag == "img":
            attributes = dict(attrs)
            self.found.setdefault(attributes.get("alt") or "", attributes.get("src") or "")


def figure_from(page: str | None, alt: str) -> str | None:
    """The data URI of the image titled `alt` in an artifact page, if it has one."""
    if not page:
        return None
    parser = _Images()
    parser.feed(page)
    src = parser.found.get(alt, "")
    return src if src.startswith("data:image/") else None


def image_data_uri(uri: str) -> str | None:
    """A predicted image as a data URI: its own bytes when a browser shows the format and it is small, else a
    PNG thumbnail; None when it is not a local file that can be read (gs://, a TFRecord record, unreadable)."""
    if "://" in uri or not os.path.isfile(uri):
        return None
    mime = BROWSER_FORMATS.get(os.path.splitext(uri)[1].lower())
    try:
        if mime and os.path.getsize(uri) <= INLINE_BYTES:
            with open(uri, "rb") as f:
                return f"data:{mime};base64," + base64.b64encode(f.read()).decode()
        from PIL import Image

        with Image.open(uri) as image:
            image.thumbnail((192, 192))
            buffer = io.BytesIO()
            image.convert("RGB" if image.mode not in ("L", "RGB", "RGBA") else image.mode).save(buffer, "PNG")
        return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()
    except (OSError, ValueError):  # PIL's UnidentifiedImageError is an OSError
        return None


def _predictions(path: str | None, count: int, output_dir: str) -> str:
    rows = []
    if path and os.path.exists(path):
        with open(path) as f:
            for line in f:
                if len(rows) == MOST_PREDICTIONS:
                    break
                rows.append(json.loads(line))
    if not rows:
        return "<p>No predictions.</p>"
    cells = []
    for row in rows:
        src = image_data_uri(row["uri"])
        name, shown = html.escape(row["class_name"]), html.escape(os.path.basename(row["uri"]))
        picture = (f"<img alt='{shown}' src='{src}'>" if src
                   else f"<div class='missing'>{html.escape(row['uri'])}</div>")
        cells.append(f"<figure title='{html.escape(row['uri'])}'>{picture}<figcaption><b>{name}</b><br>"
                     f"{100 * row['confidence']:.1f}%</figcaption></figure>")
    note = (f"The first {len(rows)} of {count} predictions" if count > len(rows) else f"All {count} predictions")
    shown = html.escape(os.path.relpath(path, os.path.abspath(output_dir)))  # the page sits in the output dir
    return (f"<p>{note}: predicted class and confidence. Every prediction, with its top classes: "
            f"<a href='{shown}'><code>{shown}</code></a></p><div class='grid'>{''.join(cells)}</div>")


def _training_info(summary: dict) -> dict | None:
    model = summary["artifacts"].get("train", {}).get("model")
    info = _read(os.path.join(model, "training.json")) if model else None
    return json.loads(info) if info else None


def _training(summary: dict, report: str | None) -> str:
    curves = figure_from(report, "Training curves")
    trained = _training_info(summary) or {}
    history = trained.get("history", {})
    parts = [f"<div class='curves'><img alt='Training curves' src='{curves}'></div>"] if curves else []
    if trained.get("framework"):
        framework = params.FRAMEWORK_NAMES.get(trained["framework"], trained["framework"])
        parts.insert(0, f"<p>Trained on <b>{html.escape(framework)}</b> "
                        f"({html.escape(str(trained.get('strategy', '')))}); serving format "
                        f"{html.escape(str(trained.get('serving_format', '')))}.</p>")
    metrics = [m for m in ("loss", "accuracy", "val_loss", "val_accuracy") if history.get(m)]
    if metrics:
        rows = "".join(f"<tr><td class='n'>{epoch + 1}</td>"
                       + "".join(f"<td class='n'>{history[m][epoch]:.4f}</td>" for m in metrics) + "</tr>"
                       for epoch in range(len(history[metrics[0]])))
        parts.append("<table><tr><th>epoch</th>" + "".join(f"<th>{m}</th>" for m in metrics) + f"</tr>{rows}</table>")
    return "".join(parts) or "<p>No training history.</p>"


def _sparkline(values: list[float], width: int = 240, height: int = 40) -> str:
    """Percentages (0-100) as an inline SVG line, one point per epoch."""
    step = width / max(len(values) - 1, 1)
    points = " ".join(f"{i * step:.1f},{height - height * min(max(v, 0), 100) / 100:.1f}" for i, v in enumerate(values))
    shape = (f"<polyline fill='none' stroke='#1a73e8' stroke-width='2' points='{points}'/>" if len(values) > 1
             else f"<circle r='3' fill='#1a73e8' cx='{points.split(',')[0]}' cy='{points.split(',')[1]}'/>")
    return (f"<svg class='spark' width='{width}' height='{height}' viewBox='0 0 {width} {height}' role='img'>"
            f"<title>mean utilization per epoch, 0-100%</title>{shape}</svg>")


def _gpu_usage(summary: dict) -> str:
    """training.json's "gpu_usage" (components/train/gpu_usage.py): per GPU, the run's figures, a line of the
    epochs' mean utilization and a table of the epochs."""
    info = _training_info(summary)
    usage = (info or {}).get("gpu_usage")
    if not usage:
        return "<p>No GPU utilization in the training record.</p>"
    if not usage.get("recorded"):
        return f"<p>Not recorded: {html.escape(usage.get('reason') or 'unknown reason')}.</p>"
    busy = usage.get("busy_percent", 90)
    parts = [f"<p>Sampled from NVML every {usage['interval_seconds']:g}s during training; the TensorBoard run "
             "<code>gpu</code> has the same figures per epoch.</p>"]
    for gpu in usage["gpus"]:
        run, epochs = gpu["run"], [e for e in gpu["epochs"] if e.get("samples")]
        title = f"GPU {gpu['index']} {gpu['name']} ({gpu['memory_total_gib']:.0f} GiB)"
        if not run.get("samples"):
            parts.append(f"<h3>{html.escape(title)}</h3><p>No samples.</p>")
            continue
        parts.append(
            f"<h3>{html.escape(title)}</h3><p>mean {run['utilization_mean']:.0f}% (p50 {run['utilization_p50']}%, "
            f"p95 {run['utilization_p95']}%, max {run['utilization_max']}%), at {busy}% or more for "
            f"{run[f'seconds_at_least_{busy}']:.0f}s of {run['seconds']:.0f}s; memory up to "
            f"{run['memory_used_gib_max']:.1f} of {gpu['memory_total_gib']:.0f} GiB"
            + (f"; power {run['power_watts_mean']:.0f} W mean" if "power_watts_mean" in run else "") + "</p>"
            + (f"<p>{_sparkline([e['utilization_mean'] for e in epochs])} mean utilization per epoch, "
               "0-100%</p>" if epochs else ""))
        power = any("power_watts_mean" in e for e in epochs)
        rows = "".join(
            f"<tr><td class='n'>{e['epoch']}</td><td class='n'>{e['utilization_mean']:.0f}%</td>"
            f"<td class='n'>{e['utilization_p95']}%</td><td class='n'>{e['utilization_max']}%</td>"
            f"<td class='n'>{e[f'seconds_at_least_{busy}']:.0f}s / {e['seconds']:.0f}s</td>"
            f"<td class='n'>{e['memory_used_gib_max']:.1f} GiB</td>"
            + (f"<td class='n'>{e['power_watts_mean']:.0f} W</td>" if "power_watts_mean" in e else
               "<td></td>" if power else "") + "</tr>"
            for e in epochs)
        if rows:
            parts.append(f"<table><tr><th>epoch</th><th>mean</th><th>p95</th><th>max</th><th>{busy}%+</th>"
                         f"<th>memory (max)</th>{'<th>power (mean)</th>' if power else ''}</tr>{rows}</table>")
    return "".join(parts)


def _tensorboard(summary: dict) -> str:
    logs = summary["artifacts"].get("train", {}).get("tensorboard")
    if not logs:
        return "<p>No TensorBoard logs.</p>"
    beside = os.path.join(os.path.dirname(sys.executable), "tensorboard")
    command = f"{beside if os.path.exists(beside) else shutil.which('tensorboard') or 'tensorboard'} --logdir {logs}"
    return (f"<pre>{html.escape(command)}</pre><p>then open <code>http://localhost:6006</code> (scalars per epoch, "
            "the model graph).</p>")


def near_duplicates_warning(summary: dict) -> str:
    """Under the decision: test images with near-copies in training, as the dataset card says; "" without."""
    warning = summary.get("near_duplicates_warning")
    if not warning:
        return ""
    return (f"<p class='warning'><strong>Warning:</strong> {html.escape(warning)} (the dataset card's "
            "<a href='#dataset'>near-duplicates</a>)</p>")


def _steps(summary: dict, output_dir: str) -> str:
    rows = []
    for step in summary.get("steps", []):
        log = os.path.relpath(step["log"], output_dir)
        rows.append(f"<tr><td>{html.escape(step['step'])}</td><td class='state-{html.escape(step['state'])}'>"
                    f"{html.escape(step['state'])}</td><td class='n'>{step['seconds']:.1f}s</td>"
                    f"<td>{html.escape(step['figures'])}</td><td><a href='{html.escape(log)}'>{html.escape(log)}</a>"
                    "</td></tr>")
    return ("<table><tr><th>step</th><th>state</th><th>time</th><th>key figures</th><th>full log</th></tr>"
            + "".join(rows) + "</table>") if rows else ""


def render(summary: dict, output_dir: str) -> str:
    """The page's HTML, from a local run's summary (pipelines/cli.py's collect_summary plus its steps)."""
    from components.evaluate import REPORT_STYLE

    esc = html.escape
    artifacts = summary["artifacts"]
    report = _read(artifacts.get("evaluate", {}).get("report"))
    reg = summary.get("registered")
    # Blessed, but another run's model became the champion after evaluation and the gate, applied again, kept it.
    unpromoted = bool(reg and reg.get("champion_changed") and "champion" not in reg["aliases"])
    images = summary["images"]
    cards = [(f"{summary['test_accuracy']:.4f}", "test accuracy"), (f"{summary['test_loss']:.4f}", "test loss"),
             (f"{summary['train_seconds']:.1f}s", "training"),
             (f"{images['train']} / {images['validation']} / {images['test']}", "train / validation / test images"),
             (str(images["rejected"]), "rejected inputs"),
             (f"v{reg['version']}" if reg else "none", f"registered as {reg['model']}" if reg else "registered"),
             *([(f"v{reg['champion']}" if reg.get("champion") else "none",
                 "champion, kept: another run's model took it after evaluation, and the gate prefers it")]
               if unpromoted else []),
             (str(summary["predictions"]["count"]), f"predictions, {summary['predictions']['errors']} errors")]
    body = [
        f"<h1>Local run <code>{esc(os.path.basename(os.path.abspath(output_dir)))}</code></h1>",
        f"<p class='decision {'ok' if summary['blessed'] and not unpromoted else 'no'}'>"
        f"{esc(summary['decision'])}</p>",
        near_duplicates_warning(summary),
        "<div class='cards'>" + "".join(f"<div class='card'><b>{esc(v)}</b><span>{esc(k)}</span></div>"
                                        for v, k in cards) + "</div>",
        "<nav>" + " &middot; ".join(f"<a href='#{anchor}'>{esc(title)}</a>" for anchor, title in SECTIONS) + "</nav>",
        _steps(summary, output_dir),
        "<h2 id='predictions'>Predictions</h2>",
        _predictions(summary["predictions"]["path"], summary["predictions"]["count"], output_dir),
        "<h2 id='training'>Training curves</h2>",
        _training(summary, report),
        "<h2 id='gpu'>GPU utilization</h2>",
        _gpu_usage(summary),
        "<h2 id='tensorboard'>TensorBoard</h2>",
        _tensorboard(summary),
        "<h2 id='evaluation'>Evaluation report</h2>",
        _frame("Evaluation report", report, "No evaluation report."),
        "<h2 id='dataset'>Dataset card</h2>",
        _frame("Dataset card", _read(artifacts.get("preprocess", {}).get("card")), "No dataset card."),
        "<h2 id='augmentation'>Augmentation preview</h2>",
        _frame("Augmentation preview", _read(artifacts.get("augment", {}).get("preview")), "No preview."),
        f"<p class='meta'>run directory {esc(os.path.abspath(output_dir))}<br>artifacts {esc(summary['run_dir'])}"
        "<br>summary.json, pipeline.yaml and logs/ beside this page</p>",
    ]
    return ("<!doctype html><html lang='en'><head><meta charset='utf-8'>"
            "<meta name='viewport' content='width=device-width, initial-scale=1'>"
            f"<title>Local run {esc(os.path.basename(os.path.abspath(output_dir)))}</title>"
            f"<style>{REPORT_STYLE}{STYLE}</style>"
            "</head><body>" + "".join(body) + "</body></html>")


def write_run_page(summary: dict, output_dir: str) -> str:
    """Writes OUTPUT_DIR/index.html and returns its path."""
    path = os.path.join(os.path.abspath(output_dir), PAGE)
    with open(path, "w", encoding="utf-8") as f:
        f.write(render(summary, output_dir))
    return path
