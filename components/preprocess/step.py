"""The step: stream a source's examples into train/validation/test shards, reject with reasons, write the
manifest (components/data.py describes the dataset directory)."""

from __future__ import annotations

import collections
import dataclasses
import json
import logging
import math
import time

import numpy as np

from components import data, params
from components.preprocess.bookkeeping import ContentIndex, PixelStats, Progress
from components.preprocess.classes import parse_classes
from components.preprocess.decoding import available_cpus
from components.preprocess.inputs import CONFLICTING_LABEL, DUPLICATE, Example
from components.preprocess.sources import open_source

log = logging.getLogger(__name__)

SAMPLES_FILE = "samples.png"
SAMPLES_PER_CLASS = 8
CARD_MAX_CLASSES = 100  # the card's sample grid shows this many classes at most (memory and page size)


@dataclasses.dataclass
class PreprocessResult:
    output_dir: str
    class_names: list[str]
    image_shape: list[int]
    counts: dict[str, int]
    rejected: int
    rejected_by_reason: dict[str, int]
    seconds: float

    def to_json(self) -> dict:
        return dataclasses.asdict(self)



def preprocess(source: str, output_dir: str, *, validation_fraction: float = 0.1, test_fraction: float = 0.1,
               image_size: int = 28, channels: int = 1, limit: int | None = None, min_shards: int = 2,
               classes: str | list[str] | None = None, workers: int | None = None,
               tfds_data_dir: str | None = None) -> PreprocessResult:
    """Reads `source` and writes the dataset directory `output_dir` (see components/data.py for its layout).

    `limit` caps images per source split (per class folder for folders, rows for manifests) for quick runs;
    `min_shards` is the number of readers that will share a split (training workers), so each gets at least
    one shard; `classes` (comma-separated or a list) is the allowed class list, in label order; `workers` is
    the number of CPUs to decode with (default: those this process may use; see `decode_plan`).
    """
    params.validate({"validation_fraction": validation_fraction, "test_fraction": test_fraction, "channels": channels,
                     "image_size": image_size, "min_shards": min_shards}, what="preprocess settings")
    start = time.monotonic()
    allowed = parse_classes(classes)
    workers = workers or available_cpus()
    src = open_source(source, image_size=image_size, channels=channels, limit=limit, workers=workers,
                      classes=allowed, tfds_data_dir=tfds_data_dir)
    has_test = "test" in src.expected
    total = sum(src.expected.values())
    if has_test:
        train_total = total - src.expected["test"]
        expected = {"train": train_total * (1 - validation_fraction),
                    "validation": train_total * validation_fraction, "test": src.expected["test"]}
    else:
        expected = {"train": total * (1 - validation_fraction - test_fraction),
                    "validation": total * validation_fraction, "test": total * test_fraction}
    image_bytes = image_size * image_size * channels
    data.gfile().makedirs(output_dir)
    writers = {s: data.ShardWriter(output_dir, s, data.num_shards_for(math.ceil(expected[s]), image_bytes,
                                                                      min_shards=min_shards))
               for s in data.SPLITS}
    split_ids = {s: i for i, s in enumerate(data.SPLITS)}
    num_classes = len(src.class_names)
    rejected_by_reason: collections.Counter = collections.Counter()
    rejected_by_class: dict[int, collections.Counter] = collections.defaultdict(collections.Counter)
    kept_by_class = np.zeros(num_classes, np.int64)
    seen_content = ContentIndex()
    pixel_stats = PixelStats(channels)
    sample_rows = min(num_classes, CARD_MAX_CLASSES)
    samples: list[list[np.ndarray]] = [[] for _ in range(sample_rows)]
    progress = Progress(total, "preprocess")
    seen = 0
    rejected_path = data.join(output_dir, data.REJECTED)
    log.info("preprocess: %s (%s, %d classes, ~%d inputs) -> %s with %d workers", source, src.kind, num_classes,
             total, output_dir, workers)
    with data.gfile().GFile(rejected_path, "w") as rejected_file:
        rejected_file.write("")  # GFile creates the file on the first write: an empty list is a file too
        def reject(ex: Example, reason: str, detail: str) -> None:
            rejected_file.write(json.dumps({"uri": ex.uri, "reason": reason, "detail": detail}) + "\n")
            rejected_by_reason[reason] += 1
            if ex.label >= 0:
                rejected_by_class[ex.label][reason] += 1

        for ex in src.examples:
            seen += 1
            progress.update(seen)
            if ex.image is None:
                reject(ex, ex.reason, ex.detail)
                continue
            prior = seen_content.get(ex.key)
            if prior is not None:
                prior_label, prior_split = prior >> 2, data.SPLITS[prior & 3]
                if prior_label != ex.label:
                    kept_as = src.class_names[prior_label]
                    reject(ex, CONFLICTING_LABEL, f"identical bytes to an image kept as {kept_as!r} in the "
                                                  f"{prior_split} split")
                else:
                    reject(ex, DUPLICATE, f"identical bytes to an image kept in the {prior_split} split")
                continue
            u = ex.key / 2.0**64
            if ex.split == "test":
                split = "test"
            elif ex.split == "train":
                split = "validation" if u < validation_fraction else "train"
            else:
                split = ("validation" if u < validation_fraction else
                         "test" if u < validation_fraction + test_fraction else "train")
            seen_content.add(ex.key, ex.label << 2 | split_ids[split])
            writers[split].write(ex.image, ex.label, ex.uri)
            kept_by_class[ex.label] += 1
            if split == "train":
                pixel_stats.add(ex.image)
                if ex.label < sample_rows and len(samples[ex.label]) < SAMPLES_PER_CLASS:
                    samples[ex.label].append(ex.image)
    for w in writers.values():
        w.close()
    counts = {s: w.count for s, w in writers.items()}
    rejected = sum(rejected_by_reason.values())

    def reasons(counter: collections.Counter) -> str:
        return ", ".join(f"{n} {r}" for r, n in counter.most_common())

    if not sum(counts.values()):
        raise data.DataError(f"No usable images in {source}: all {rejected} inputs were rejected "
                             f"({reasons(rejected_by_reason)}); see {rejected_path}")
    empty = [label for label in range(num_classes) if kept_by_class[label] == 0]
    if empty and src.kind in ("folder", "manifest"):
        described = "; ".join(
            f"{src.class_names[c]!r} ({src.class_locations.get(c, '')}): "
            + (f"all {sum(rejected_by_class[c].values())} inputs rejected ({reasons(rejected_by_class[c])})"
               if rejected_by_class[c] else "no inputs")
            for c in empty)
        raise data.DataError(f"{len(empty)} class(es) left with no usable images after rejection: {described}. "
                             f"Fix or remove them (details in {rejected_path}).")
    if empty:
        log.warning("preprocess: class(es) with no images in this slice: %s",
                    ", ".join(src.class_names[c] for c in empty))
    if counts["train"] == 0:
        raise data.DataError(f"No usable training images in {source} ({rejected} inputs rejected; "
                             f"see {rejected_path})")
    if any(samples):
        shape = next(s[0] for s in samples if s).shape
        blank = np.full(shape, 128, np.uint8)
        cells = [row[i] if i < len(row) else blank for row in samples for i in range(SAMPLES_PER_CLASS)]
        with data.gfile().GFile(data.join(output_dir, SAMPLES_FILE), "wb") as f:
            f.write(data.encode_png(data.tile(cells, SAMPLES_PER_CLASS)))
    manifest = {
        "source": source,
        "source_kind": src.kind,
        "class_names": src.class_names,
        "image_shape": [image_size, image_size, channels],
        "splits": {s: w.summary() for s, w in writers.items()},
        "rejected": rejected,
        "rejected_by_reason": dict(rejected_by_reason),
        "pixel_stats": {"split": "train", **pixel_stats.to_json()},
        "samples": {"file": SAMPLES_FILE, "per_class": SAMPLES_PER_CLASS, "classes": sample_rows},
        "empty_classes": [src.class_names[c] for c in empty],
    }
    data.write_json(data.join(output_dir, data.MANIFEST), manifest)
    seconds = time.monotonic() - start
    log.info("preprocess: wrote %s (train %d, validation %d, test %d, rejected %d) in %.1fs (%.0f inputs/s "
             "after opening the source)", output_dir, counts["train"], counts["validation"], counts["test"], rejected,
             seconds, seen / max(time.monotonic() - progress.start, 1e-9))
    return PreprocessResult(output_dir, src.class_names, [image_size, image_size, channels], counts, rejected,
                            dict(rejected_by_reason), seconds)
