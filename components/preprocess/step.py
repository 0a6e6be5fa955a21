"""The step: stream a source's examples into train/validation/test shards, reject with reasons, write the
manifest (components/dataio/data.py describes the dataset directory)."""

from __future__ import annotations

import array
import collections
import concurrent.futures
import dataclasses
import itertools
import json
import logging
import math
import os
import pickle
import shutil
import tempfile
import time
from typing import Iterator

import numpy as np

from components import params
from components.dataio import data, records
from components.preprocess.bookkeeping import SAMPLES_PER_CLASS, ContentIndex, Progress, Tally, image_histogram
from components.preprocess.classes import parse_classes
from components.preprocess.decoding import available_cpus
from components.preprocess import per_image
from components.preprocess.sources import open_source

log = logging.getLogger(__name__)

SAMPLES_FILE = "samples.png"
# Photo datasets (source files, JPEG records): the card as a JPEG. 13 classes x 8 photos at 224 px were 7.6 MB and
# 0.4 s to write as PNG, a tenth of a 720-photo run; as JPEG about 1 MB in a tenth of the time.
SAMPLES_PHOTO_FILE = "samples.jpg"


@dataclasses.dataclass
class PreprocessResult:
    output_dir: str
    class_names: list[str]
    image_shape: list[int]
    counts: dict[str, int]
    rejected: int
    rejected_by_reason: dict[str, int]
    seconds: float
    near_duplicates: dict = dataclasses.field(default_factory=dict)  # the manifest's near_duplicates
    # How the files were decoded: the plan chosen, each plan's measured rates, any switch during the run
    # (decoding.DecodePlanner.report); empty for array sources and the Beam runner. Not in the manifest: the rates
    # change from run to run, the dataset does not.
    decode_plan: dict = dataclasses.field(default_factory=dict)

    def to_json(self) -> dict:
        return dataclasses.asdict(self)



def shard_plan(expected: dict[str | None, int], *, validation_fraction: float, test_fraction: float, image_size: int,
               channels: int, min_shards: int) -> dict[str, int]:
    """Shards per split, fixed before any image is decoded (both runners): from the expected counts, sized near
    data.TARGET_SHARD_BYTES, at least `min_shards`."""
    total = sum(expected.values())
    if "test" in expected:
        train_total = total - expected["test"]
        counts = {"train": train_total * (1 - validation_fraction),
                  "validation": train_total * validation_fraction, "test": expected["test"]}
    else:
        counts = {"train": total * (1 - validation_fraction - test_fraction),
                  "validation": total * validation_fraction, "test": total * test_fraction}
    image_bytes = image_size * image_size * channels
    if data.record_encoding(image_size) != data.RAW:
        image_bytes //= 4  # PNG/JPEG: a guess; more shards than needed only means smaller ones
    return {s: data.num_shards_for(math.ceil(counts[s]), image_bytes, min_shards=min_shards) for s in data.SPLITS}


def preprocess(source: str, output_dir: str, *, validation_fraction: float = 0.1, test_fraction: float = 0.1,
               image_size: int = 28, channels: int = 1, limit: int | None = None, min_shards: int = 2,
               classes: str | list[str] | None = None, workers: int | None = None,
               tfds_data_dir: str | None = None, runner: str = "local", beam_options=None, dataflow=None,
               dataflow_jobs=None) -> PreprocessResult:
    """Reads `source` and writes the dataset directory `output_dir` (see components/dataio/data.py for its layout).

    `limit` caps the images read, for quick runs: per class folder of a folder source, per split of an idx or tfds
    source, the first rows of a manifest;
    `min_shards` is the number of readers that will share a split (training workers), so each gets at least
    one shard; `classes` (comma-separated or a list) is the allowed class list, in label order; `workers` is
    the number of CPUs to decode with (default: those this process may use; see `decoding.planned_decode`).
    `runner`: "local" decodes in this process (and its workers); "beam" runs the same per-image logic as an
    Apache Beam pipeline (components/preprocess/beam.py) with `beam_options` (a
    `apache_beam.options.pipeline_options.PipelineOptions`; default: Beam's in-process FnApiRunner); "dataflow"
    runs that pipeline as a Dataflow job with `dataflow` (a dataflow.DataflowSettings; `dataflow_jobs` replaces
    its API client), checked before anything is read.
    """
    params.validate({"validation_fraction": validation_fraction, "test_fraction": test_fraction, "channels": channels,
                     "image_size": image_size, "min_shards": min_shards}, what="preprocess settings")
    if runner not in ("local", "beam", "dataflow"):
        raise ValueError(f"runner must be local, beam or dataflow, got {runner!r}")
    if runner == "dataflow":
        if dataflow is None:
            raise ValueError("runner=dataflow needs its settings (dataflow=DataflowSettings(...))")
        dataflow.check(source=source, output_dir=output_dir)
    start = time.monotonic()
    allowed = parse_classes(classes)
    workers = workers or available_cpus()
    src = open_source(source, image_size=image_size, channels=channels, limit=limit, workers=workers,
                      classes=allowed, tfds_data_dir=tfds_data_dir)
    shards = shard_plan(src.expected, validation_fraction=validation_fraction, test_fraction=test_fraction,
                        image_size=image_size, channels=channels, min_shards=min_shards)
    data.gfile().makedirs(output_dir)
    total = sum(src.expected.values())
    log.info("preprocess: %s (%s, %d classes, ~%d inputs) -> %s %s", source, src.kind, len(src.class_names),
             total, output_dir, f"with {workers} workers" if runner == "local" else f"with Apache Beam ({runner})")
    fractions = dict(validation_fraction=validation_fraction, test_fraction=test_fraction)
    if runner in ("beam", "dataflow"):
        from components.preprocess.beam import run_beam

        splits, tally, seen, started = run_beam(src, output_dir, shards=shards, image_size=image_size,
                                                channels=channels, options=beam_options, dataflow=dataflow,
                                                dataflow_jobs=dataflow_jobs, **fractions)
    else:
        splits, tally, seen, started = _run_local(src, output_dir, shards=shards, total=total,
                                                  image_shape=[image_size, image_size, channels], **fractions)
    counts = {s: splits[s]["count"] for s in data.SPLITS}
    manifest = finish(source, src, output_dir, [image_size, image_size, channels], splits, tally)
    seconds = time.monotonic() - start
    rejected = sum(tally.rejected_by_reason.values())
    log.info("preprocess: wrote %s (train %d, validation %d, test %d, rejected %d) in %.1fs (%.0f inputs/s "
             "after opening the source)", output_dir, counts["train"], counts["validation"], counts["test"], rejected,
             seconds, seen / max(time.monotonic() - started, 1e-9))
    return PreprocessResult(output_dir, src.class_names, [image_size, image_size, channels], counts, rejected,
                            dict(tally.rejected_by_reason), seconds, manifest["near_duplicates"],
                            dict(src.decode_report) if runner == "local" else {})


SPOOL_BATCH = 512  # kept images per pickle in _run_local's spool (16 when they are encoded files: photos)
# The spool's first batches stay in memory up to this many bytes of images, the rest go to a file: a run that fits
# pays no pickling and no disk round trip (2,000 food photos, 34 MB: 0.1 s of a 1.3 s run), a larger one holds this
# much more memory, whatever its size.
SPOOL_MEMORY_BYTES = 64 << 20


class _Spool:
    """Batches of kept images in input order: in memory up to SPOOL_MEMORY_BYTES, then pickled to `path`."""

    def __init__(self, path: str, memory_bytes: int | None = None):
        self.path = path
        self.memory_left = SPOOL_MEMORY_BYTES if memory_bytes is None else memory_bytes
        self.in_memory: collections.deque[list[tuple]] = collections.deque()
        self.file = None

    def add(self, batch: list[tuple], nbytes: int) -> None:
        if self.file is None and nbytes <= self.memory_left:
            self.in_memory.append(batch)
            self.memory_left -= nbytes
            return
        if self.file is None:
            self.file = open(self.path, "wb")
        pickle.dump(batch, self.file, protocol=pickle.HIGHEST_PROTOCOL)

    def close(self) -> None:
        if self.file is not None:
            self.file.close()

    def __iter__(self) -> Iterator[list[tuple]]:
        batches, self.in_memory = self.in_memory, collections.deque()
        while batches:
            yield batches.popleft()  # each batch freed once read
        if self.file is None:
            return
        with open(self.path, "rb") as spool:
            while True:
                try:
                    yield pickle.load(spool)
                except EOFError:
                    return


def _run_local(src, output_dir: str, *, shards: dict[str, int], image_shape: list[int], total: int,
               validation_fraction: float, test_fraction: float) -> tuple[dict, Tally, int, float]:
    """The in-process runner. A class's split follows from all of its content keys (per_image.split_cuts), so the
    source is streamed once into a local spool of the kept images (their stored bytes and pixel histogram), then
    the spool is written into each split's shards in input order; rejections are written in input order too."""
    channels = image_shape[-1]
    tally = Tally(len(src.class_names), channels)
    seen_content = ContentIndex()  # content key -> index of the kept image
    kept_keys, kept_labels, kept_sources = array.array("Q"), array.array("i"), array.array("b")
    kept_near = array.array("Q")  # near-duplicate keys, taken a spool batch at a time (one call per batch)
    source_splits = (None, "train", "test")
    source_codes = {split: code for code, split in enumerate(source_splits)}
    rejections: list[tuple] = []  # (uri, label, reason, detail), or (uri, label, None, index of the kept image)
    progress = Progress(total, "preprocess")
    seen = 0
    spool_dir = tempfile.mkdtemp(prefix="preprocess-kept-")
    try:
        # The spool is pickled SPOOL_BATCH kept images at a time (one pickle per image cost a tenth of a run of
        # 28x28 PNGs), past its first SPOOL_MEMORY_BYTES kept in memory; memory stays bounded.
        spool = _Spool(os.path.join(spool_dir, "kept.pickle"))
        try:
            pending: list[tuple] = []
            pending_near: list = []  # each kept image's near key, or its pixels to take it from
            pending_bytes = 0
            for ex in src.examples:
                seen += 1
                if not seen & 1023:
                    progress.update(seen)
                if not ex.kept:
                    rejections.append((ex.uri, ex.label, ex.reason, ex.detail))
                    continue
                prior = seen_content.get(ex.key)
                if prior is not None:
                    rejections.append((ex.uri, ex.label, None, prior))
                    continue
                seen_content.add(ex.key, len(kept_keys))
                kept_keys.append(ex.key)
                kept_labels.append(ex.label)
                kept_sources.append(source_codes[ex.split])
                if ex.source_size:
                    tally.source_files.add(ex.source_size, ex.source_bytes, ex.reencoded)
                # Raw pixels are counted from the spool in batches; an encoded image's histogram travels with it
                # (decoding it again would cost more than the histogram's 1 KB per channel).
                raw = ex.stored is None
                stored = ex.image.tobytes() if raw else ex.stored
                pending.append((ex.uri, ex.label, ex.encoding, stored, raw,
                                None if raw else (image_histogram(ex.image, channels) if ex.histogram is None
                                                  else ex.histogram).astype(np.uint32)))
                pending_near.append(ex.near_key if ex.near_key is not None else ex.image)
                pending_bytes += len(stored)
                if len(pending) >= SPOOL_BATCH or (not raw and len(pending) >= 16):
                    kept_near.extend(_near_keys(pending_near))
                    spool.add(pending, pending_bytes)
                    pending, pending_near, pending_bytes = [], [], 0
            if pending:
                kept_near.extend(_near_keys(pending_near))
                spool.add(pending, pending_bytes)
        finally:
            spool.close()
        # Near-copies are split as one: by their group's key (per_image.near_group_key)
        split_keys, groups = _near_groups(kept_near, kept_keys)
        cuts = per_image.split_cuts(zip(kept_labels, split_keys, (source_splits[c] for c in kept_sources)),
                                    validation_fraction, test_fraction)
        kept_splits = [per_image.assign_split(key, source_splits[code], cuts.get(label, per_image.NO_CUTS))
                       for key, label, code in zip(split_keys, kept_labels, kept_sources)]
        for members in groups:
            tally.near_duplicates.update(dict(zip(per_image.NEAR_GROUP_FIELDS, per_image.near_group_summary(
                [kept_splits[i] for i in members]))))
        writers = {s: data.ShardWriter(output_dir, s, shards[s]) for s in data.SPLITS}
        train_pixels: list[bytes] = []  # raw pixels are counted 512 images at a time (one histogram)
        # The card's samples of encoded records are decoded beside the writing (up to 8 per class, a few ms each)
        samples = concurrent.futures.ThreadPoolExecutor(available_cpus(), thread_name_prefix="preprocess-samples")
        # once every class of the card has its samples, the rest of the run asks no more (a call a record)
        samples_wanted = len(tally.samples) * SAMPLES_PER_CLASS
        with samples:
            spooled: Iterator[tuple] = itertools.chain.from_iterable(spool)
            for split in kept_splits:
                uri, label, encoding, stored, raw, histogram = next(spooled)
                writers[split].write_record(records.encode_example(stored, label, uri), label, encoding)
                if split != "train":
                    continue
                if raw:
                    train_pixels.append(stored)
                    if len(train_pixels) >= 512:
                        tally.pixel_stats.add(_pixels(train_pixels, image_shape))
                        train_pixels = []
                else:
                    tally.pixel_stats.histogram += histogram
                if samples_wanted and tally.wants_sample(label):
                    samples_wanted -= 1
                    tally.samples[label].append(np.frombuffer(stored, np.uint8).reshape(image_shape) if raw else
                                                samples.submit(per_image.stored_pixels, stored, encoding, image_shape))
        tally.samples = [[cell if isinstance(cell, np.ndarray) else cell.result() for cell in row]
                         for row in tally.samples]
        if train_pixels:
            tally.pixel_stats.add(_pixels(train_pixels, image_shape))
    finally:
        shutil.rmtree(spool_dir, ignore_errors=True)
    with data.gfile().GFile(data.join(output_dir, data.REJECTED), "w") as rejected_file:
        rejected_file.write("")  # GFile creates the file on the first write: an empty list is a file too
        for uri, label, reason, detail in rejections:
            if reason is None:  # a duplicate of the kept image number `detail`
                reason, detail = per_image.duplicate_rejection(label, kept_labels[detail], kept_splits[detail],
                                                               src.class_names)
            rejected_file.write(json.dumps(per_image.rejected_row(uri, reason, detail)) + "\n")
            tally.reject(label, reason)
    for w in writers.values():
        w.close()
    encoding = data.dataset_encoding(set().union(*(w.encodings for w in writers.values())))
    splits = {s: {**w.summary(), "encoding": encoding} for s, w in writers.items()}
    return splits, tally, seen, progress.start


def _near_keys(pending: list) -> list[int]:
    """The near keys of a spool batch: those taken at decoding as they are, the rest from their pixels in one
    call per image shape (one call for 512 images costs a fraction of 512 calls for one)."""
    keys: list = list(pending)
    by_shape: dict[tuple, list[int]] = collections.defaultdict(list)
    for index, item in enumerate(pending):
        if isinstance(item, np.ndarray):
            by_shape[item.shape].append(index)
    for positions in by_shape.values():
        for index, key in zip(positions, data.near_keys(np.stack([pending[i] for i in positions])).tolist()):
            keys[index] = key
    return keys


def _near_groups(near: array.array, keys: array.array) -> tuple[array.array, list[list[int]]]:
    """Each kept image's split key (its group's `per_image.near_group_key`; its own content key when no other
    kept image shares its near key), and the groups of two or more as lists of kept-image indices."""
    near_keys = np.frombuffer(near, np.uint64) if len(near) else np.zeros(0, np.uint64)
    order = np.argsort(near_keys, kind="stable")
    ordered = near_keys[order]
    starts = np.flatnonzero(np.concatenate([[True], ordered[1:] != ordered[:-1]])) if len(ordered) else \
        np.zeros(0, np.int64)
    sizes = np.diff(np.append(starts, len(ordered)))
    split_keys = array.array("Q", keys)  # 8 bytes an image, as the content keys
    groups = []
    for start, size in zip(starts[sizes > 1].tolist(), sizes[sizes > 1].tolist()):
        members = order[start:start + size].tolist()
        group_key = per_image.near_group_key(keys[i] for i in members)
        for i in members:
            split_keys[i] = group_key
        groups.append(members)
    return split_keys, groups


def _pixels(stored: list[bytes], image_shape: list[int]) -> np.ndarray:
    """Raw records' images as one N x H x W x C array (one copy)."""
    return np.frombuffer(b"".join(stored), np.uint8).reshape(-1, *image_shape)


def finish(source: str, src, output_dir: str, image_shape: list[int], splits: dict[str, dict], tally: Tally) -> dict:
    """What both runners end with: the checks on what was kept, samples.png and dataset.json. `splits` holds each
    split's shard summary (ShardWriter.summary) with the records' `encoding`."""
    num_classes = len(src.class_names)
    counts = {s: splits[s]["count"] for s in data.SPLITS}
    rejected = sum(tally.rejected_by_reason.values())
    rejected_path = data.join(output_dir, data.REJECTED)
    kept_by_class = np.zeros(num_classes, np.int64)
    for info in splits.values():
        for label, n in info["class_counts"].items():
            kept_by_class[int(label)] += n

    def reasons(counter: collections.Counter) -> str:
        return ", ".join(f"{n} {r}" for r, n in counter.most_common())

    if not sum(counts.values()):
        raise data.DataError(f"No usable images in {source}: all {rejected} inputs were rejected "
                             f"({reasons(tally.rejected_by_reason)}); see {rejected_path}")
    empty = [label for label in range(num_classes) if kept_by_class[label] == 0]
    if empty and src.kind in ("folder", "manifest"):
        described = "; ".join(
            f"{src.class_names[c]!r} ({src.class_locations.get(c, '')}): "
            + (f"all {sum(tally.rejected_by_class[c].values())} inputs rejected "
               f"({reasons(tally.rejected_by_class[c])})" if tally.rejected_by_class[c] else "no inputs")
            for c in empty)
        raise data.DataError(f"{len(empty)} class(es) left with no usable images after rejection: {described}. "
                             f"Fix or remove them (details in {rejected_path}).")
    if empty:
        log.warning("preprocess: class(es) with no images in this slice: %s",
                    ", ".join(src.class_names[c] for c in empty))
    if counts["train"] == 0:
        raise data.DataError(f"No usable training images in {source} ({rejected} inputs rejected; "
                             f"see {rejected_path})")
    used = [info.pop("encoding") for info in splits.values()]
    encoding = data.dataset_encoding(e for e, info in zip(used, splits.values()) if info["count"])
    samples = tally.samples
    samples_file = SAMPLES_PHOTO_FILE if encoding in (data.SOURCE, data.JPEG) else SAMPLES_FILE
    if any(samples):
        blank = np.full(image_shape, 128, np.uint8)
        cells = [row[i] if i < len(row) else blank for row in samples for i in range(SAMPLES_PER_CLASS)]
        grid = data.tile(cells, SAMPLES_PER_CLASS)
        with data.gfile().GFile(data.join(output_dir, samples_file), "wb") as f:
            f.write(data.encode_image(grid, data.JPEG) if samples_file == SAMPLES_PHOTO_FILE else data.encode_png(grid))
    manifest = {
        "source": source,
        "source_kind": src.kind,
        "class_names": src.class_names,
        "image_shape": image_shape,
        "image_encoding": encoding,
        "splits": splits,
        "rejected": rejected,
        "rejected_by_reason": dict(tally.rejected_by_reason),
        "pixel_stats": {"split": "train", **tally.pixel_stats.to_json()},
        "samples": {"file": samples_file, "per_class": SAMPLES_PER_CLASS, "classes": len(samples)},
        "empty_classes": [src.class_names[c] for c in empty],
    }
    if encoding == data.SOURCE:
        manifest["source_files"] = tally.source_files.to_json(per_image.max_side(image_shape[1]))
    manifest["near_duplicates"] = near = near_duplicates_summary(tally.near_duplicates, counts["test"])
    log.info("preprocess: %s", near["line"])
    if near["test_groups_shared"]:
        log.warning("preprocess: %s", near["warning"])
    data.write_json(data.join(output_dir, data.MANIFEST), manifest)
    return manifest


NEAR_DUPLICATES_METHOD = ("a 64-bit key of a 9x9 grayscale thumbnail (1/16 margin left out): its horizontal and "
                          "vertical brightness differences; images with equal keys are one group")


def near_duplicates_summary(counts, test_images: int) -> dict:
    """The manifest's `near_duplicates`: the groups of near-copies (per_image.NEAR_GROUP_FIELDS) with the console
    line and, where test images still share a group with training images, the warning that the card, the run page
    and the evaluation repeat, with the most those images can add to the test accuracy (all of them right only
    because their copies were learnt)."""
    near = {field: int(counts.get(field, 0)) for field in per_image.NEAR_GROUP_FIELDS}
    line = (f"near-duplicates: {near['images']} images in {near['groups']} groups of near-copies, each group split "
            "as one")
    near.update(method=NEAR_DUPLICATES_METHOD, line=line, warning="")
    if near["test_groups_shared"]:
        share = 100 * near["test_images_shared"] / max(test_images, 1)
        near["warning"] = (f"{near['test_images_shared']} of {test_images} test images ({share:.2g}%) have "
                           f"near-copies in training or validation ({near['test_groups_shared']} groups not kept in "
                           "one split: the source's own test split, or copies labelled as different classes): the "
                           f"test accuracy may be overstated, by up to {share:.2g} points")
    return near
