"""The dataset card: one self-contained HTML page about a dataset directory, for the KFP UI."""

from __future__ import annotations

import html
import io
import itertools

import numpy as np

from components.dataio import data
from components.preprocess.step import SAMPLES_FILE


_STORED = {data.RAW: "as raw pixels", data.PNG: "as PNG", data.JPEG: f"as JPEG (quality {data.JPEG_QUALITY})",
           data.SOURCE: "as the source files' bytes (JPEG/PNG of any size, re-encoded only where needed)",
           data.ENCODED: "as PNG or JPEG (after the source files)"}


def _source_files(sources: dict | None) -> str:
    """The source records' line: how many files kept their bytes, how many were re-encoded and why."""
    if not sources:
        return ""
    import html

    why = ", ".join(f"{n} {reason}" for reason, n in sources["reencoded"].items()) or "none"
    return (f"<p>Source files: {sources['count']}, {sources['kept_bytes_as_is']} stored as they are; re-encoded: "
            f"{html.escape(why)} (max_side {sources['max_side']}); sizes {sources['smallest'][1]}x"
            f"{sources['smallest'][0]} to {sources['largest'][1]}x{sources['largest'][0]}, "
            f"{sources['mean_megapixels']} Mpx on average, {sources['source_bytes'] / 1e6:.1f} MB.</p>")


def _png_data_uri(image: np.ndarray) -> str:
    import base64

    return "data:image/png;base64," + base64.b64encode(data.encode_png(image)).decode()


def dataset_card(dataset_dir: str, *, rejected_examples: int = 20) -> str:
    """A self-contained HTML card for the KFP UI: images per split and class, rejected inputs per reason (with
    the first few), pixel mean/std per channel of the train split, and sample training images per class."""
    manifest = data.read_manifest(dataset_dir)
    names = manifest["class_names"]
    splits = {s: manifest["splits"][s] for s in data.SPLITS if s in manifest["splits"]}  # the json sorts keys
    height, width, channels = manifest["image_shape"]
    esc = html.escape
    out = [
        "<!doctype html><html><head><meta charset='utf-8'><title>Dataset card</title><style>"
        "body{font-family:sans-serif;margin:1em}table{border-collapse:collapse;margin:.5em 0}"
        "td,th{border:1px solid #ccc;padding:2px 8px;text-align:right}td:first-child,th:first-child{text-align:left}"
        "img{image-rendering:pixelated;vertical-align:middle}code{font-size:90%}</style></head><body>",
        "<h1>Dataset card</h1>",
        f"<p>Source <code>{esc(manifest['source'])}</code> ({esc(manifest['source_kind'])}); "
        f"images {height}x{width}x{channels} uint8, stored {_STORED[data.manifest_encoding(manifest)]}; "
        f"{len(names)} classes.</p>",
        _source_files(manifest.get("source_files")),
        "<h2>Images per split and class</h2><table><tr><th>class</th>"
        + "".join(f"<th>{esc(s)}</th>" for s in splits) + "</tr>",
    ]
    for index, name in enumerate(names):
        out.append(f"<tr><td>{esc(name)}</td>"
                   + "".join(f"<td>{s['class_counts'].get(str(index), 0)}</td>" for s in splits.values()) + "</tr>")
    out.append("<tr><th>total</th>" + "".join(f"<th>{s['count']}</th>" for s in splits.values()) + "</tr>")
    out.append("<tr><td>shards</td>" + "".join(f"<td>{s['num_shards']}</td>" for s in splits.values())
               + "</tr></table>")
    near = manifest.get("near_duplicates")
    if near:  # datasets written before near-copies were grouped have no such key
        out.append(f"<h2>Near-duplicates</h2><p>{esc(near['line'][0].upper() + near['line'][1:])}. Grouped by "
                   f"{esc(near['method'])}.</p>")
        if near.get("warning"):
            out.append(f"<p class='warning' style='color:#a00'><strong>Warning:</strong> {esc(near['warning'])}</p>")
    stats = manifest.get("pixel_stats") or {}
    if stats.get("mean"):
        labels = ["gray"] if channels == 1 else ["red", "green", "blue"]
        out.append("<h2>Pixel statistics (train split, 0-255)</h2><table><tr><th>channel</th><th>mean</th>"
                   "<th>std</th></tr>" + "".join(f"<tr><td>{c}</td><td>{m:.2f}</td><td>{s:.2f}</td></tr>"
                                                 for c, m, s in zip(labels, stats["mean"], stats["std"]))
                   + "</table>")
    out.append(f"<h2>Rejected inputs: {manifest['rejected']}</h2>")
    if manifest["rejected"]:
        out.append("<table><tr><th>reason</th><th>count</th></tr>"
                   + "".join(f"<tr><td>{esc(r)}</td><td>{n}</td></tr>" for r, n in
                             sorted(manifest["rejected_by_reason"].items(), key=lambda kv: -kv[1]))
                   + "</table>")
        rejected_path = data.locate(dataset_dir, manifest.get("rejected_file", data.REJECTED))
        rows = list(itertools.islice(data.iter_jsonl(rejected_path), rejected_examples))
        out.append(f"<p>First {len(rows)} (all in <code>{data.REJECTED}</code>):</p><table>"
                   "<tr><th>uri</th><th>reason</th><th>detail</th></tr>"
                   + "".join(f"<tr><td><code>{esc(r['uri'])}</code></td><td>{esc(r['reason'])}</td>"
                             f"<td>{esc(r.get('detail', ''))}</td></tr>" for r in rows) + "</table>")
    if manifest.get("empty_classes"):
        out.append(f"<p>Classes with no images: {esc(', '.join(manifest['empty_classes']))}</p>")
    samples_path = data.locate(dataset_dir, (manifest.get("samples") or {}).get("file", SAMPLES_FILE))
    if data.gfile().exists(samples_path):
        from PIL import Image

        with data.gfile().GFile(samples_path, "rb") as f:
            grid = np.asarray(Image.open(io.BytesIO(f.read())))
        grid = grid[..., None] if grid.ndim == 2 else grid
        scale = max(1, 56 // height)
        out.append("<h2>Sample training images</h2><table>")
        for index, name in enumerate(names[:manifest["samples"]["classes"]]):
            row = grid[index * (height + 1):index * (height + 1) + height]
            if row.shape[0] != height:
                break
            out.append(f"<tr><td>{esc(name)}</td><td><img alt='{esc(name)}' src='{_png_data_uri(row)}' "
                       f"width='{row.shape[1] * scale}' height='{height * scale}'></td></tr>")
        out.append("</table>")
        if len(names) > manifest["samples"]["classes"]:
            out.append(f"<p>(first {manifest['samples']['classes']} of {len(names)} classes shown)</p>")
    out.append("</body></html>")
    return "\n".join(out) + "\n"
