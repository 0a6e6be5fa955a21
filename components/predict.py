"""Batch predict: classify every image under a folder (local or gs://, recursive) with a trained model.

Images of any size and colour mode are converted to what the model takes. Inputs are streamed in a stable
order, in chunks of `chunk_size` files: each chunk is decoded in parallel, predicted in batches, and
written as its own part file (`parts/predictions-NNNNN.jsonl`, written to a temporary name and renamed when
complete). A rerun over the same inputs and output skips the chunks already written, so an interrupted job
does not start over. Unreadable files go to `errors.jsonl` with the reason; the step fails only when no
image at all could be read. At the end the parts are gathered into `predictions.jsonl` and
`predictions.csv` (uri, class index, class name, confidence, top-k).

Each prediction is also logged in the classic form: `The image 0.png is the number 7 with a 99.85 percent
confidence.` (the class name when classes have names).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import csv
import dataclasses
import io
import json
import logging
import os
import sys
import time
from typing import Iterator

import numpy as np

from components import data

log = logging.getLogger(__name__)

PARTS = "parts"


@dataclasses.dataclass
class PredictResult:
    output_dir: str
    predictions_path: str
    count: int
    errors: int
    skipped_chunks: int
    seconds: float

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


def describe(class_names: list[str], index: int) -> str:
    name = class_names[index]
    if name.isdigit():
        return f"the number {name}"
    return f"{'an' if name[:1].lower() in 'aeiou' else 'a'} {name}"


def sentence(uri: str, class_names: list[str], index: int, confidence: float) -> str:
    return (f"The image {os.path.basename(uri)} is {describe(class_names, index)} "
            f"with a {100 * confidence:.2f} percent confidence.")


def list_images(source: str) -> Iterator[str]:
    """Every file under a folder, in a stable order (non-images are kept, to be reported as errors)."""
    if not source.startswith("gs://") and not os.path.exists(source):
        raise data.DataError(f"Image source not found: {source}")
    yield from data.list_files(source)


def export_samples(dataset_dir: str, output_dir: str, per_class: int = 10) -> int:
    """Writes `per_class` test images of each class as PNG files (for a local run with no folder to predict)."""
    from PIL import Image

    manifest = data.read_manifest(dataset_dir)
    class_names = manifest["class_names"]
    taken = {c: 0 for c in range(len(class_names))}
    data.gfile().makedirs(output_dir)
    written = 0
    for image, label in data.read_split(dataset_dir, "test").as_numpy_iterator():
        if taken[int(label)] >= per_class:
            if all(v >= per_class for v in taken.values()):
                break
            continue
        taken[int(label)] += 1
        buffer = io.BytesIO()
        Image.fromarray(image.squeeze(-1) if image.shape[-1] == 1 else image).save(buffer, format="PNG")
        with data.gfile().GFile(data.join(output_dir, f"{written:04d}.png"), "wb") as f:
            f.write(buffer.getvalue())
        written += 1
    return written


def predict(model_dir: str, source: str, output_dir: str, *, batch_size: int = 256, top_k: int = 3,
            chunk_size: int = 10_000, workers: int | None = None, log_each: int = 1000,
            classifier: data.Classifier | None = None) -> PredictResult:
    """Predicts every image under `source` into `output_dir`; see the module docstring for the layout."""
    start = time.monotonic()
    classifier = classifier or data.load_classifier(model_dir)
    height, width, channels = classifier.image_shape
    names = classifier.class_names
    top_k = max(1, min(top_k, len(names)))
    workers = workers or os.cpu_count() or 1
    parts_dir = data.join(output_dir, PARTS)
    data.gfile().makedirs(parts_dir)

    def decode(uri: str):
        try:
            return uri, data.decode_image(data.read_bytes(uri), height, width, channels), None
        except data.ImageError as e:
            return uri, None, str(e)

    count = errors = skipped = logged = 0
    last_report = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(max_workers=workers) as pool:
        for chunk_index, uris in enumerate(data.batched(list_images(source), chunk_size)):
            part = data.join(parts_dir, f"predictions-{chunk_index:05d}.jsonl")
            if data.gfile().exists(part):
                skipped += 1
                continue
            rows, error_rows = [], []
            for batch in data.batched(pool.map(decode, uris), batch_size):
                good = [(u, img) for u, img, err in batch if err is None]
                error_rows.extend({"uri": u, "reason": err} for u, img, err in batch if err is not None)
                if not good:
                    continue
                probabilities = classifier.predict_proba(np.stack([img for _, img in good]).astype(np.float32))
                order = np.argsort(-probabilities, axis=1)[:, :top_k]
                for (uri, _), probs, top in zip(good, probabilities, order):
                    best = int(top[0])
                    rows.append({"uri": uri, "class_index": best, "class_name": names[best],
                                 "confidence": round(float(probs[best]), 6),
                                 "top_k": [{"class_index": int(t), "class_name": names[int(t)],
                                            "confidence": round(float(probs[t]), 6)} for t in top]})
                    if logged < log_each:
                        logged += 1
                        print(sentence(uri, names, best, float(probs[best])), flush=True)
                if time.monotonic() - last_report > 10:
                    last_report = time.monotonic()
                    log.info("predict: %d images predicted (%.0f/s)", count + len(rows),
                             (count + len(rows)) / (last_report - start))
            # Errors first, the part last: a part file on disk means its chunk is wholly done.
            _write_lines(data.join(parts_dir, f"errors-{chunk_index:05d}.jsonl"), error_rows)
            _write_lines(part, rows)
            count += len(rows)
            errors += len(error_rows)
    total = _gather(output_dir, names)
    if total["count"] == 0:
        raise data.DataError(f"No image under {source} could be read ({total['errors']} files failed; see "
                             f"{data.join(output_dir, 'errors.jsonl')})")
    seconds = time.monotonic() - start
    log.info("predict: %d predictions, %d errors, %d chunks already done, %.1fs", total["count"], total["errors"],
             skipped, seconds)
    return PredictResult(output_dir, data.join(output_dir, "predictions.jsonl"), total["count"], total["errors"],
                         skipped, seconds)


def _write_lines(path: str, rows: list[dict]) -> None:
    tmp = path + ".tmp"
    with data.gfile().GFile(tmp, "w") as f:
        f.write("")  # GFile creates the file on the first write; an empty part must exist too
        for row in rows:
            f.write(json.dumps(row) + "\n")
    data.gfile().rename(tmp, path, overwrite=True)


def _gather(output_dir: str, class_names: list[str]) -> dict:
    """Concatenates the part files into predictions.jsonl / predictions.csv / errors.jsonl (streamed)."""
    parts_dir = data.join(output_dir, PARTS)
    count = errors = 0
    with data.gfile().GFile(data.join(output_dir, "predictions.jsonl"), "w") as out_jsonl, \
            data.gfile().GFile(data.join(output_dir, "predictions.csv"), "w") as out_csv:
        writer = csv.writer(out_csv)
        writer.writerow(["uri", "class_index", "class_name", "confidence", "top_k"])
        for part in sorted(data.gfile().glob(data.join(parts_dir, "predictions-*.jsonl"))):
            for row in data.iter_jsonl(part):
                out_jsonl.write(json.dumps(row) + "\n")
                writer.writerow([row["uri"], row["class_index"], row["class_name"], row["confidence"],
                                 ";".join(f"{t['class_name']}:{t['confidence']}" for t in row["top_k"])])
                count += 1
    with data.gfile().GFile(data.join(output_dir, "errors.jsonl"), "w") as out_errors:
        for part in sorted(data.gfile().glob(data.join(parts_dir, "errors-*.jsonl"))):
            for row in data.iter_jsonl(part):
                out_errors.write(json.dumps(row) + "\n")
                errors += 1
    data.write_json(data.join(output_dir, "summary.json"), {"count": count, "errors": errors,
                                                             "class_names": class_names})
    return {"count": count, "errors": errors}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Classify every image under a folder.")
    parser.add_argument("--model-dir", required=True, help="output of train (or an exported SavedModel)")
    parser.add_argument("--images", required=True, help="folder of images, local or gs://, searched recursively")
    parser.add_argument("--output-dir", required=True)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--top-k", type=int, default=3)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    try:
        result = predict(args.model_dir, args.images, args.output_dir, batch_size=args.batch_size, top_k=args.top_k)
    except data.DataError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    json.dump(result.to_json(), sys.stdout, indent=2)
    print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
