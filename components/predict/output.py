"""What a prediction run writes: per-chunk shards renamed into place (a chunk's marker last), the combined
files, errors.jsonl and summary.json; and the result it returns. Local and Vertex AI runs share all of it."""

from __future__ import annotations

import contextlib
import csv
import dataclasses
import json
import os
import re
import tempfile
from collections.abc import Iterator

import numpy as np

from components.dataio import data
from components.predict.sources import Source, _exists, _is_remote
from components.registry.identity import model_digest
from components.dataio.storage import copy_tree

SHARDS = "shards"


@dataclasses.dataclass
class PredictResult:
    output_dir: str
    predictions_path: str  # predictions.jsonl, or the shards' pattern when there are more than combine_max rows
    count: int
    errors: int
    chunks: int
    skipped_chunks: int
    seconds: float
    images_per_second: float  # over the inputs predicted in this run (skipped chunks not counted)

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


def _open(path: str, mode: str):
    return data.gfile().GFile(path, mode) if _is_remote(path) else open(path, mode, newline="" if "b" not in mode else None)


def _rename(source: str, target: str) -> None:
    if _is_remote(target):
        data.gfile().rename(source, target, overwrite=True)
    else:
        os.replace(source, target)


def _remove(path: str) -> None:
    if _exists(path):
        data.gfile().remove(path) if _is_remote(path) else os.remove(path)


_json_string = json.encoder.encode_basestring_ascii  # what json.dumps(a str) calls
_CSV_SPECIAL = re.compile('[,"\r\n]')  # the characters that make csv.writer (excel dialect) quote a field


def _csv_field(value: str) -> str:
    """`value` as csv.writer writes it in a row of several fields."""
    import io

    buffer = io.StringIO()
    csv.writer(buffer, lineterminator="\n").writerow([value, ""])
    return buffer.getvalue()[:-2]


def _csv_uri(uri: str) -> str:
    return _csv_field(uri) if _CSV_SPECIAL.search(uri) else uri


def csv_header(top_k: int) -> list[str]:
    header = ["uri", "class_index", "class_name", "confidence"]
    for rank in range(2, top_k + 1):
        header += [f"top{rank}_class_index", f"top{rank}_class_name", f"top{rank}_confidence"]
    return header


def shard_paths(output_dir: str, index: int) -> dict[str, str]:
    shards = data.join(output_dir, SHARDS)
    return {"jsonl": data.join(shards, f"predictions-{index:05d}.jsonl"),
            "csv": data.join(shards, f"predictions-{index:05d}.csv"),
            "errors": data.join(shards, f"errors-{index:05d}.jsonl"),
            "marker": data.join(shards, f"chunk-{index:05d}.json")}


class ChunkWriter:
    """Writes one chunk's rows as they come, to temporary names renamed into place by `commit`."""

    def __init__(self, output_dir: str, index: int, class_names: list[str], top_k: int):
        self.paths = shard_paths(output_dir, index)
        self.class_names = class_names
        self.names_json = [json.dumps(n) for n in class_names]
        self.top_k = top_k
        # Each row is joined from these pieces, formatted once per class: the text json.dumps and csv.writer give
        # (tests check it byte for byte), without their per-row Python (13 us a row for 28x28 PNGs).
        names_csv = [_csv_field(n) for n in class_names]
        self._json_best = [f', "class_index": {i}, "class_name": {n}, "confidence": '
                           for i, n in enumerate(self.names_json)]
        self._json_ranked = [f'{{"class_index": {i}, "class_name": {n}, "confidence": '
                             for i, n in enumerate(self.names_json)]
        self._csv_class = [f",{i},{n}," for i, n in enumerate(names_csv)]
        self.jsonl = _open(self.paths["jsonl"] + ".tmp", "w")
        self.csv_file = _open(self.paths["csv"] + ".tmp", "w")
        self.errors_file = _open(self.paths["errors"] + ".tmp", "w")
        self.csv = csv.writer(self.csv_file, lineterminator="\n")
        self.csv.writerow(csv_header(top_k))
        self.count = self.errors = 0

    def write(self, keys: list[str], probabilities: np.ndarray) -> list[tuple[str, int, float]]:
        """Writes predictions; returns (uri, class index, confidence) for each, for the log lines."""
        k = self.top_k
        order = np.argsort(-probabilities, axis=1, kind="stable")[:, :k]
        confidences = np.round(np.take_along_axis(probabilities, order, axis=1).astype(np.float64), 6)
        best_confidence = confidences[:, 0].tolist()
        texts = list(map(repr, confidences.ravel().tolist()))  # a float's text in json.dumps and csv.writer
        order = order.tolist()
        json_best, json_ranked, csv_class = self._json_best, self._json_ranked, self._csv_class
        lines, rows = [], []
        for row, (uri, top) in enumerate(zip(keys, order)):
            conf = texts[row * k:row * k + k]
            best = top[0]
            ranked = "}, ".join([json_ranked[t] + c for t, c in zip(top, conf)])
            lines.append(f'{{"uri": {_json_string(uri)}{json_best[best]}{conf[0]}, "top_k": [{ranked}}}]}}\n')
            runners = "".join([csv_class[t] + c for t, c in zip(top[1:], conf[1:])])
            rows.append(f"{_csv_uri(uri)}{csv_class[best]}{conf[0]}{runners}\n")
        self.jsonl.write("".join(lines))
        self.csv_file.write("".join(rows))
        self.count += len(keys)
        return list(zip(keys, [top[0] for top in order], best_confidence))

    def error(self, uri: str, reason: str) -> None:
        self.errors_file.write(json.dumps({"uri": uri, "reason": reason}) + "\n")
        self.errors += 1

    def close(self) -> None:
        for f in (self.jsonl, self.csv_file, self.errors_file):
            f.close()

    def commit(self, marker: dict) -> None:
        """Data files first, the marker last: a marker on disk means the whole chunk is there."""
        self.close()
        for name in ("errors", "csv", "jsonl"):
            _rename(self.paths[name] + ".tmp", self.paths[name])
        with _open(self.paths["marker"] + ".tmp", "w") as f:
            json.dump({**marker, "count": self.count, "errors": self.errors}, f)
        _rename(self.paths["marker"] + ".tmp", self.paths["marker"])


def read_marker(path: str) -> dict | None:
    if not _exists(path):
        return None
    try:
        with _open(path, "r") as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


@contextlib.contextmanager
def model_here(model_dir: str) -> Iterator[tuple[str, str]]:
    """`model_dir` where this process reads it, and the model's content digest (components/registry/identity.py:
    what the registry records for a version). A gs:// model directory is copied into a temporary folder once, and
    both loading the model and its digest read that copy, which is removed on leaving: a backbone of hundreds of
    MB is fetched once, not once to load and again to hash."""
    if not _is_remote(model_dir):
        yield model_dir, model_digest(model_dir)
        return
    files = data.gfile()
    if not files.isdir(model_dir):
        raise FileNotFoundError(f"Model directory not found: {model_dir}")
    with tempfile.TemporaryDirectory(prefix="model-") as local_copy:
        copy_tree(model_dir, local_copy)
        try:
            yield local_copy, model_digest(local_copy)
        except data.DataError as e:  # "No model found in ...": name the model's directory, not the copy's
            raise data.DataError(str(e).replace(local_copy, model_dir.rstrip("/"))) from None


COMBINED = ("predictions.jsonl", "predictions.csv", "errors.jsonl", "summary.json")


def _difference(earlier: dict | None, settings: dict) -> str:
    if not earlier:
        return "made before predictions recorded their model and options"
    changed = []
    for key in sorted(set(earlier) | set(settings)):
        there, here = earlier.get(key), settings.get(key)
        if there != here:
            shown = [str(v)[:19] + "..." if isinstance(v, str) and len(v) > 22 else v for v in (there, here)]
            changed.append(f"{key} {shown[0]} there, {shown[1]} here")
    return "; ".join(changed)


def claim_output(output_dir: str, settings: dict, *, overwrite: bool = False) -> dict[int, dict]:
    """The markers of the chunks already in `output_dir`, by chunk index, once it is known that they were made by
    the same model with the same options (`settings`, as each marker records them).

    Earlier predictions of another model, or with other options (top_k, the image size, the JPEG decoder), are
    never kept beside new ones nor replaced silently: the folder is refused in one line that says how to go on.
    With `overwrite` they are removed first (their shards and markers, and the combined files), so that an
    interrupted overwrite leaves no mixture either; chunks of the same model and options are still kept."""
    markers = {}
    for path in data.gfile().glob(data.join(output_dir, SHARDS, "chunk-*.json")):
        marker = read_marker(path)
        if marker is not None:
            markers[int(re.search(r"chunk-(\d+)\.json$", path).group(1))] = marker
    others = sorted(index for index, marker in markers.items() if marker.get("settings") != settings)
    if not others:
        return markers
    if not overwrite:
        raise PredictionsExist(
            f"{output_dir} already holds predictions of another model or other options "
            f"({_difference(markers[others[0]].get('settings'), settings)}): predict into a new output folder, or "
            "pass --overwrite to replace them")
    for name in COMBINED:
        _remove(data.join(output_dir, name))
    for index in others:
        for path in shard_paths(output_dir, index).values():
            _remove(path)
        del markers[index]
    return markers


class PredictionsExist(data.DataError):
    """The output folder holds predictions that this run would mix with its own or replace."""


def _remove_stale_shards(output_dir: str, chunks: int) -> None:
    """Shards beyond this run's last chunk belong to an earlier, larger input: remove them."""
    pattern = data.join(output_dir, SHARDS, "chunk-*.json")
    for marker in data.glob(pattern):
        index = int(re.search(r"chunk-(\d+)\.json$", marker).group(1))
        if index >= chunks:
            for path in shard_paths(output_dir, index).values():
                _remove(path)


def _copy_lines(paths: list[str], target: str, *, skip_first_line: bool = False, header: str = "") -> None:
    with _open(target + ".tmp", "wb") as out:
        out.write(header.encode())
        for path in paths:
            with _open(path, "rb") as f:
                if skip_first_line:
                    f.readline()
                while block := f.read(1 << 22):
                    out.write(block)
    _rename(target + ".tmp", target)


def _gather(output_dir: str, chunks: int, totals: dict, class_names: list[str], where: Source, *,
            combine_max: int, seconds: float, rate: float, skipped: int) -> str:
    """errors.jsonl always; predictions.jsonl/.csv when small enough; summary.json. Returns the predictions."""
    shards = [shard_paths(output_dir, i) for i in range(chunks)]
    _copy_lines([s["errors"] for s in shards], data.join(output_dir, "errors.jsonl"))
    combined = totals["count"] <= combine_max
    jsonl_path = data.join(output_dir, "predictions.jsonl")
    csv_path = data.join(output_dir, "predictions.csv")
    if combined:
        _copy_lines([s["jsonl"] for s in shards], jsonl_path)
        with _open(shards[0]["csv"], "r") as f:
            header = f.readline()
        _copy_lines([s["csv"] for s in shards], csv_path, skip_first_line=True, header=header)
    else:
        _remove(jsonl_path)
        _remove(csv_path)
    pattern = data.join(output_dir, SHARDS, "predictions-*.jsonl")
    data.write_json(data.join(output_dir, "summary.json"), {
        "count": totals["count"], "errors": totals["errors"], "inputs": totals["inputs"], "chunks": chunks,
        "skipped_chunks": skipped, "class_names": class_names, "source": where.location, "source_kind": where.kind,
        "seconds": round(seconds, 3), "images_per_second": round(rate, 1),
        "predictions_jsonl": jsonl_path if combined else None, "predictions_csv": csv_path if combined else None,
        "errors_jsonl": data.join(output_dir, "errors.jsonl"),
        "shards": {"jsonl": pattern, "csv": data.join(output_dir, SHARDS, "predictions-*.csv")},
    })
    return jsonl_path if combined else pattern
