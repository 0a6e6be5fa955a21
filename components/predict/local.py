"""Batch prediction on this machine: the chunk loop (skip what a marker says is done, prefetch and decode,
predict, write) with its log lines: the first predictions in the classic sentence, then progress lines."""

from __future__ import annotations

import concurrent.futures
import logging
import os
import time

import numpy as np

from components.dataio import data
from components.predict import nvjpeg
from components.predict.decode import Decoder, iter_batches
from components.predict.output import (SHARDS, ChunkWriter, PredictResult, _gather, _remove_stale_shards,
                                       claim_output, model_here)
from components.predict.prefetch import Prefetcher
from components.predict.sources import _is_remote, iter_chunks, resolve_source

log = logging.getLogger(__name__)

PROGRESS_SECONDS = 10.0


# ---------------------------------------------------------------------------------------------- log lines


def describe(class_names: list[str], index: int) -> str:
    name = class_names[index]
    if name.isdigit():
        return f"the number {name}"
    return f"{'an' if name[:1].lower() in 'aeiou' else 'a'} {name}"


def sentence(uri: str, class_names: list[str], index: int, confidence: float) -> str:
    return (f"The image {os.path.basename(uri)} is {describe(class_names, index)} "
            f"with a {100 * confidence:.2f} percent confidence.")


# ---------------------------------------------------------------------------------------------- predict


class _Progress:
    def __init__(self, class_names: list[str], print_first: int):
        self.class_names = class_names
        self.print_first = print_first
        self.printed = 0
        self.count = self.errors = 0
        self.start = self.last = time.monotonic()

    def predicted(self, rows: list[tuple[str, int, float]]) -> None:
        self.count += len(rows)
        if self.printed < self.print_first:
            lines = [sentence(uri, self.class_names, index, confidence)
                     for uri, index, confidence in rows[:self.print_first - self.printed]]
            self.printed += len(lines)
            print("\n".join(lines), flush=True)
            if self.printed >= self.print_first:
                print(f"(the first {self.print_first} predictions are printed; progress lines follow)", flush=True)
        now = time.monotonic()
        if now - self.last >= PROGRESS_SECONDS:
            self.last = now
            log.info("predict: %d images predicted (%.0f/s), %d errors", self.count, self.count / (now - self.start),
                     self.errors)


def auto_batch_size(image_shape: list[int], budget_bytes: int = 128 << 20) -> int:
    """Images per model call: as many as fit `budget_bytes` of float32 input, a power of two in [32, 512]
    (512 for 28x28 images, 128 for 224x224x3): large batches cost the model less per image, up to a point
    (1024 saves little more and holds 150 MB more activations for the small CNN)."""
    per_image = 4 * int(np.prod(image_shape))
    return int(min(512, max(32, 2 ** int(np.log2(max(1, budget_bytes // per_image))))))


def predict(model_dir: str, source: str, output_dir: str, *, batch_size: int | None = None, top_k: int = 3,
            chunk_size: int = 10_000, workers: int | None = None, print_first: int = 1000,
            combine_max: int = 1_000_000, classifier: data.Classifier | None = None,
            gpu_decode: bool = True, overwrite: bool = False) -> PredictResult:
    """Predicts every image of `source` into `output_dir`; see the package docstring for sources and layout.
    `gpu_decode`: decode JPEGs on the GPU where torchvision can (components/predict/nvjpeg.py), said in the log.
    `overwrite`: replace what `output_dir` holds from another model or other options, instead of refusing.
    A `classifier` handed in is the model of `model_dir`, or, without one, carries its own `digest`."""
    if (batch_size is not None and batch_size < 1) or chunk_size < 1 or top_k < 1:
        raise ValueError("batch_size, chunk_size and top_k must be >= 1")
    start = time.monotonic()
    where = resolve_source(source)
    if model_dir:
        with model_here(model_dir) as (here, digest):  # a gs:// model is read once, for both
            classifier = classifier or data.load_classifier(here)
    else:
        digest = classifier.digest if classifier else ""
    if not digest:
        raise ValueError("predict needs the model's directory (for its digest) or a classifier that carries one")
    batch_size = batch_size or auto_batch_size(classifier.image_shape)
    names = list(classifier.class_names)
    top_k = min(top_k, len(names))
    # Reading from object storage waits on the network, not the CPU: many more readers there.
    workers = workers or (32 if _is_remote(where.location) else 2 * data.available_cpus())
    data.gfile().makedirs(data.join(output_dir, SHARDS))
    log.info("predict: %s -> %s; model input %s on %s, batches of %d", where, output_dir,
             "x".join(map(str, classifier.image_shape)), classifier.device, batch_size)
    progress = _Progress(names, print_first)
    totals = {"count": 0, "errors": 0, "inputs": 0}
    chunks = skipped = predicted_here = 0
    with concurrent.futures.ThreadPoolExecutor(max_workers=workers, thread_name_prefix="predict-io") as pool:
        gpu_jpeg = nvjpeg.gpu_jpeg_decoder(classifier.image_shape) if gpu_decode else None
        if gpu_jpeg is not None:
            log.info("predict: decoding JPEGs on the GPU with %s (the readers' rule to within a few levels; "
                     "gpu_decode=False for the CPU's exact pixels)", gpu_jpeg.description)
        # Everything besides the inputs that changes a row: the rows of a rerun that differs here are another
        # answer, which must neither be mixed with these nor silently replace them (output.claim_output).
        settings = {"model": digest, "top_k": top_k, "image_shape": list(classifier.image_shape),
                    "jpeg_decoder": "nvjpeg" if gpu_jpeg is not None else "cpu"}
        markers = claim_output(output_dir, settings, overwrite=overwrite)
        decoder = Decoder(classifier.image_shape, pool, raw_ok=where.kind == "tfrecord", gpu_jpeg=gpu_jpeg)
        for chunk in iter_chunks(where, chunk_size, exclude=output_dir, settings=settings):
            chunks += 1
            marker = markers.get(chunk.index)
            if marker and marker.get("fingerprint") == chunk.fingerprint:
                skipped += 1
                for key in totals:
                    totals[key] += marker.get(key, 0)
                continue
            writer = ChunkWriter(output_dir, chunk.index, names, top_k)
            # Three stages at once: reading batch n+2, decoding n+1 (both release the GIL), predicting n.
            reads = Prefetcher(iter_batches(chunk, batch_size, pool))
            batches = Prefetcher(decoder.decode(items) for items in reads)
            try:
                for keys, images, errors in batches:
                    for uri, reason in errors:
                        writer.error(uri, reason)
                    progress.errors += len(errors)
                    if keys:
                        progress.predicted(writer.write(keys, classifier.predict_proba(images)))
            finally:
                batches.close()
                reads.close()
                writer.close()
            inputs = writer.count + writer.errors
            writer.commit({"chunk": chunk.index, "fingerprint": chunk.fingerprint, "settings": settings,
                           "inputs": inputs,
                           "first": chunk.uris[0] if chunk.uris else chunk.shard,
                           "last": chunk.uris[-1] if chunk.uris else chunk.shard})
            totals["count"] += writer.count
            totals["errors"] += writer.errors
            totals["inputs"] += inputs
            predicted_here += inputs
            log.info("predict: chunk %d done: %d predictions, %d errors (%s)", chunk.index, writer.count,
                     writer.errors, chunk.label)
    if chunks == 0:
        raise data.DataError(f"No input found in {where}" + (" (no file matches the pattern)"
                                                              if where.kind in ("glob", "tfrecord") else ""))
    _remove_stale_shards(output_dir, chunks)
    seconds = time.monotonic() - start
    rate = predicted_here / seconds if seconds > 0 else 0.0
    predictions_path = _gather(output_dir, chunks, totals, names, where, combine_max=combine_max,
                               seconds=seconds, rate=rate, skipped=skipped)
    if totals["count"] == 0:
        raise data.DataError(f"No image in {where} could be read ({totals['errors']} inputs failed; the reasons are "
                             f"in {data.join(output_dir, 'errors.jsonl')})")
    log.info("predict: %d predictions, %d errors, %d of %d chunks already done, %.1fs (%.0f images/s)",
             totals["count"], totals["errors"], skipped, chunks, seconds, rate)
    return PredictResult(output_dir, predictions_path, totals["count"], totals["errors"], chunks, skipped, seconds,
                         rate)
