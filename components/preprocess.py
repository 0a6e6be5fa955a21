"""Preprocess: read a source of labelled images and write sharded TFRecords for train / validation / test.

Sources:
  - a directory of MNIST-format idx files (`*-images-idx3-ubyte[.gz]` + `*-labels-idx1-ubyte[.gz]`);
    `train-*` feeds train and validation, `t10k-*`/`test-*` is the test split;
  - a folder with one subfolder per class holding image files (local or `gs://`);
  - a manifest of `(uri, label)` rows, `.csv` or `.jsonl` (local or `gs://`), as labelling tools export them:
    a CSV with a header naming the columns (`uri`/`path`/`image`..., `label`/`class`...), a headerless
    `uri,label` CSV, Vertex AI's `ML_USE,GCS_FILE_PATH,LABEL` CSV, or JSONL with `uri`/`label` keys or
    Vertex AI's `imageGcsUri` + `classificationAnnotation.displayName`. Relative paths are read beside the
    manifest; rows marked `test` (ML_USE) stay the test split;
  - `tfds:NAME[:SPLIT]` through tensorflow-datasets.

Every image is decoded, converted to grayscale or RGB and resized (see `data.decode_image`), and stored as
raw uint8 with its label and source uri. Decoding runs in parallel (processes for local files, threads for
remote ones, whose cost is waiting on the network) with a bounded number of images in flight; listings are
streamed, so memory does not grow with the number of images (except 12 bytes per image for duplicate
detection).

Splits are deterministic: an image's split is fixed by a hash of its bytes (the file's bytes, or the raw
pixels of idx/tfds sources), so the same input gives the same split on any machine, in any order and at any
target size, and identical images never straddle two splits. Where the source has its own test split, it
stays the test split and training copies of test images are dropped (leakage). Duplicates are kept once.

Unusable inputs (unreadable, empty, not an image, corrupt or truncated, unsupported format or mode, too
large, duplicates) are listed in `rejected.jsonl` with their reason and counted per reason; nothing is
dropped silently and none of them stops the run. The run fails, with a message saying what to fix, when
nothing usable is left, a class ends up with no images, there are fewer than 2 classes, a class is not in an
explicit `classes` list, or a manifest label is not a known class.
"""

from __future__ import annotations

import argparse
import collections
import concurrent.futures
import csv
import dataclasses
import hashlib
import html
import io
import itertools
import json
import logging
import math
import multiprocessing
import os
import sys
import time
from typing import Callable, Iterable, Iterator

import numpy as np

from components import data

log = logging.getLogger(__name__)

SAMPLES_FILE = "samples.png"
SAMPLES_PER_CLASS = 8
CARD_MAX_CLASSES = 100  # the card's sample grid shows this many classes at most (memory and page size)
PROGRESS_SECONDS = 10.0

# Reasons for rejections that are not about the image file itself (see data.py for the others).
DUPLICATE = "duplicate"
CONFLICTING_LABEL = "duplicate with a different label"
OUTSIDE_CLASSES = "outside any class folder"
BAD_ROW = "bad manifest row"

# Image files of formats we do not decode: reported as an unsupported format rather than "not an image".
OTHER_IMAGE_EXTENSIONS = (".heic", ".heif", ".avif", ".svg", ".psd", ".ico", ".jp2", ".tga", ".ppm", ".pgm",
                          ".dng", ".cr2", ".nef", ".arw", ".raw")
MANIFEST_EXTENSIONS = (".csv", ".jsonl")
URI_COLUMNS = ("uri", "path", "image", "image_uri", "image_path", "file", "filename", "file_path",
               "gcs_file_path", "imagegcsuri", "url")
LABEL_COLUMNS = ("label", "class", "class_name", "category", "displayname")
ML_USE_COLUMNS = ("ml_use", "mluse", "split")
ML_USES = ("training", "train", "validation", "test", "unassigned")
VERTEX_ML_USE = "aiplatform.googleapis.com/ml_use"


@dataclasses.dataclass
class Example:
    uri: str
    label: int
    split: str | None  # the source's own split ("train"/"test"), or None to assign by content
    key: int = 0  # 64 bits of the SHA-256 of the source bytes: the split and duplicate key
    image: np.ndarray | None = None  # None when rejected
    reason: str = ""
    detail: str = ""


@dataclasses.dataclass
class Source:
    """What a reader knows before streaming: class names and how many inputs to expect per source split."""

    kind: str
    class_names: list[str]
    expected: dict[str | None, int]
    examples: Iterator[Example]
    class_locations: dict[int, str] = dataclasses.field(default_factory=dict)  # label -> folder, for messages


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


def content_key(raw: bytes) -> int:
    return int.from_bytes(hashlib.sha256(raw).digest()[:8], "big")


def available_cpus() -> int:
    """CPUs this process may use: the affinity mask, capped by a cgroup CPU quota (a pod's CPU limit),
    which os.cpu_count() ignores (it reports the node's cores)."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    try:
        with open("/sys/fs/cgroup/cpu.max") as f:  # cgroup v2: "max 100000" or "200000 100000"
            quota, period = f.read().split()
        if quota != "max":
            cpus = min(cpus, max(1, math.ceil(int(quota) / int(period))))
    except (OSError, ValueError):
        pass
    return max(1, cpus)


# ---------------------------------------------------------------------------------------------- decoding


def decode_file(uri: str, label: int, split: str | None, height: int, width: int, channels: int,
                check_extension: bool) -> Example:
    """Reads and decodes one image file; failures come back as a rejected Example, never as an exception."""
    if check_extension and not uri.lower().endswith(data.IMAGE_EXTENSIONS):
        extension = os.path.splitext(uri)[1].lower() or "no extension"
        if extension in OTHER_IMAGE_EXTENSIONS:
            return Example(uri, label, split, reason=data.UNSUPPORTED_FORMAT,
                           detail=f"{extension} files are not decoded; convert them to PNG or JPEG")
        return Example(uri, label, split, reason=data.NOT_AN_IMAGE,
                       detail=f"file extension {extension} (expected {', '.join(data.IMAGE_EXTENSIONS)})")
    try:
        raw = data.read_bytes(uri)
        image = data.decode_image(raw, height, width, channels)
    except data.ImageError as e:
        return Example(uri, label, split, reason=e.reason, detail=e.detail)
    return Example(uri, label, split, content_key(raw), image)


def decode_batch(items: list[tuple[str, int, str | None]], height: int, width: int, channels: int,
                 check_extension: bool) -> tuple[list[tuple], np.ndarray]:
    """Decodes a batch into (uri, label, split, key, reason, detail) rows and one array of the good images:
    a single array crosses a process boundary far cheaper than one per image."""
    examples = [decode_file(uri, label, split, height, width, channels, check_extension)
                for uri, label, split in items]
    good = [e.image for e in examples if e.image is not None]
    images = np.stack(good) if good else np.zeros((0, height, width, channels), np.uint8)
    return [(e.uri, e.label, e.split, e.key, e.reason, e.detail) for e in examples], images


def _unbatch(decoded: tuple[list[tuple], np.ndarray]) -> Iterator[Example]:
    rows, images = decoded
    next_image = 0
    for uri, label, split, key, reason, detail in rows:
        if reason:
            yield Example(uri, label, split, key, None, reason, detail)
        else:
            yield Example(uri, label, split, key, images[next_image])
            next_image += 1


def parallel_decode(items: Callable[[], Iterable[tuple[str, int, str | None]]], *, height: int, width: int,
                    channels: int, check_extension: bool, workers: int, use_processes: bool) -> Iterator[Example]:
    """Decodes the files of `items()` in parallel and yields them in input order, with at most 4 batches per
    worker in flight (memory stays bounded whatever the number of files).

    See `decode_plan` for when processes and when threads are used. If worker processes cannot start (e.g. a calling script without an `if __name__ == "__main__"` guard),
    decoding falls back to threads with a warning.
    """
    args = (height, width, channels, check_extension)
    if workers <= 1:
        for batch in data.batched(items(), 64):
            yield from _unbatch(decode_batch(batch, *args))
        return
    if use_processes:
        # forkserver: children start clean instead of inheriting TensorFlow's threads through fork.
        executor = concurrent.futures.ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("forkserver"))
    else:
        executor = concurrent.futures.ThreadPoolExecutor(workers)
    yielded = False
    try:
        with executor:
            pending: collections.deque = collections.deque()
            for batch in data.batched(items(), 64 if use_processes else 8):
                pending.append(executor.submit(decode_batch, batch, *args))
                if len(pending) >= 4 * workers:
                    yield from _unbatch(pending.popleft().result())
                    yielded = True
            while pending:
                yield from _unbatch(pending.popleft().result())
                yielded = True
    except concurrent.futures.process.BrokenProcessPool as e:
        if yielded:
            raise
        log.warning("decode worker processes could not start (%s); decoding with threads instead", e)
        yield from parallel_decode(items, height=height, width=width, channels=channels,
                                   check_extension=check_extension, workers=workers, use_processes=False)


def decode_plan(source: str, cpus: int) -> dict:
    """How to decode the files of `source` with `cpus` CPUs (measured in tests/benchmarks/ingest.py):

    - remote files (gs://...): 4 threads per CPU, since their cost is waiting on the network;
    - local files with 3+ CPUs: worker processes, one per CPU beside the main process (which writes the
      shards). For small images about 75% of a decode is Python inside PIL holding the GIL (profiled), so
      threads cannot go beyond ~1.3x whatever the cores;
    - local files with 1-2 CPUs: decode threads (1 CPU: none) overlapping the main process's work. Processes
      cost a second or two to start and the pickling of every batch, which 2 CPUs do not win back (on a
      2-CPU machine they measured slower than a single worker).
    """
    if "://" in source:
        return {"workers": 4 * cpus, "use_processes": False}
    if cpus >= 3:
        return {"workers": cpus - 1, "use_processes": True}
    return {"workers": 2 if cpus == 2 else 1, "use_processes": False}


def _conform(image: np.ndarray, image_size: int, channels: int) -> np.ndarray:
    from PIL import Image

    img = Image.fromarray(image.squeeze(-1) if image.shape[-1] == 1 else image)
    img = img.convert("L" if channels == 1 else "RGB").resize((image_size, image_size), Image.Resampling.BILINEAR)
    return np.asarray(img, dtype=np.uint8).reshape(image_size, image_size, channels)


def _array_example(image: np.ndarray, label: int, uri: str, split: str | None, image_size: int,
                   channels: int) -> Example:
    """An Example from an already decoded array (idx, tfds): keyed by its raw pixels, then conformed."""
    if image.ndim == 2:
        image = image[..., None]
    image = np.ascontiguousarray(image, dtype=np.uint8)
    key = content_key(image.tobytes())
    if image.shape != (image_size, image_size, channels):
        image = _conform(image, image_size, channels)
    return Example(uri, label, split, key, image)


# ---------------------------------------------------------------------------------------------- classes


def parse_classes(classes: str | Iterable[str] | None) -> list[str] | None:
    """`classes` as a list (None: any), from a comma-separated string or a list; refuses blanks and repeats."""
    if classes is None:
        return None
    names = [c.strip() for c in classes.split(",")] if isinstance(classes, str) else [str(c).strip() for c in classes]
    if not any(names):
        return None
    if "" in names:
        raise data.DataError(f"classes has an empty name: {classes!r} (give names separated by commas)")
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise data.DataError(f"classes lists {', '.join(repeated)} more than once")
    return names


def _check_class_count(names: list[str], where: str) -> None:
    if len(names) < 2:
        found = f": {', '.join(repr(n) for n in names)}" if names else ""
        raise data.DataError(f"Need at least 2 classes to train a classifier, found {len(names)} in {where}{found}")


def _apply_allow_list(source_names: list[str], classes: list[str] | None, where: str) -> tuple[list[str], list[int]]:
    """Class names to use and the map from the source's label numbers to them (the allow-list's order)."""
    if classes is None:
        return source_names, list(range(len(source_names)))
    not_allowed = [n for n in source_names if n not in classes]
    if not_allowed:
        raise data.DataError(f"{where} has class(es) {', '.join(repr(n) for n in not_allowed)} that are not in "
                             f"the allowed classes ({', '.join(classes)}): remove them or add them to classes")
    missing = [n for n in classes if n not in source_names]
    if missing:
        raise data.DataError(f"Class(es) {', '.join(repr(n) for n in missing)} from the allowed classes are not "
                             f"in {where} (it has {', '.join(source_names)})")
    return classes, [classes.index(n) for n in source_names]


# ---------------------------------------------------------------------------------------------- readers


def idx_source(directory: str, image_size: int, channels: int, limit: int | None,
               classes: list[str] | None) -> Source:
    pairs = data.find_idx_pairs(directory)
    if not pairs:
        raise data.DataError(f"No idx files found in {directory} (looked for *-images-idx3-ubyte[.gz] "
                             "with matching *-labels-idx1-ubyte[.gz])")
    loaded = []
    for pair in sorted(pairs, key=lambda p: p.split != "test"):  # test first: its images guard train
        images, labels = data.read_idx(pair.images), data.read_idx(pair.labels)
        if images.ndim != 3 or labels.ndim != 1:
            raise data.DataError(f"{pair.images} should hold N x rows x cols images and {pair.labels} N labels; "
                                 f"found shapes {images.shape} and {labels.shape}")
        if len(images) != len(labels):
            raise data.DataError(f"idx counts disagree: {pair.images} has {len(images)} images but "
                                 f"{pair.labels} has {len(labels)} labels")
        if limit is not None:
            images, labels = images[:limit], labels[:limit]
        loaded.append((pair, images, labels))
    if not any(len(lab) for _, _, lab in loaded):
        raise data.DataError(f"The idx files in {directory} hold no images")
    num_classes = int(max(int(lab.max()) for _, _, lab in loaded if len(lab)) + 1)
    source_names = data.idx_class_names(directory, num_classes)
    class_names, remap = _apply_allow_list(source_names, classes, directory)
    _check_class_count(class_names, directory)

    def examples() -> Iterator[Example]:
        for pair, images, labels in loaded:
            base = os.path.basename(pair.images)
            for i, (image, label) in enumerate(zip(images, labels)):
                yield _array_example(image, remap[int(label)], f"{base}#{i}", pair.split, image_size, channels)

    return Source("idx", class_names, {p.split: len(lab) for p, _, lab in loaded}, examples())


def _exists(path: str) -> bool:
    return data.gfile().exists(path) if "://" in path else os.path.exists(path)


def _listdir(path: str) -> list[str]:
    return sorted(e.rstrip("/") for e in (data.gfile().listdir(path) if "://" in path else os.listdir(path)))


def _isdir(path: str) -> bool:
    return data.gfile().isdir(path) if "://" in path else os.path.isdir(path)


def folder_source(root: str, image_size: int, channels: int, limit: int | None, workers: int,
                  classes: list[str] | None) -> Source:
    entries = _listdir(root)
    # Hidden folders (.git, .ipynb_checkpoints, ...) are not classes; they are reported with the stray files.
    folders = [e for e in entries if not e.startswith(".") and _isdir(data.join(root, e))]
    if not folders:
        kinds = ", ".join(data.IMAGE_EXTENSIONS)
        what = "it is empty" if not entries else f"it holds {len(entries)} file(s) but no subfolders"
        raise data.DataError(f"No class folders found under {root} ({what}): expected one subfolder per class "
                             f"holding {kinds} files")
    class_names, remap = _apply_allow_list(folders, classes, root)
    _check_class_count(class_names, f"{root} (one subfolder per class)")
    labelled = [(folder, remap[i]) for i, folder in enumerate(folders)]
    stray = [data.join(root, e) for e in entries if e not in folders]

    def listing(folder: str) -> Iterator[str]:
        files = data.list_files(data.join(root, folder))
        return itertools.islice(files, limit) if limit else files

    # A first pass counts (streamed, nothing kept), so shards can be sized before decoding starts.
    counts = {folder: sum(1 for _ in listing(folder)) for folder, _ in labelled}
    empty = [f for f, n in counts.items() if n == 0]
    if empty:
        raise data.DataError(f"Class folder(s) with no files under {root}: {', '.join(empty)}. "
                             "Add images or remove the folder(s).")

    def items() -> Iterator[tuple[str, int, str | None]]:
        for folder, label in labelled:
            for uri in listing(folder):
                yield uri, label, None

    def examples() -> Iterator[Example]:
        for uri in stray:
            detail = "hidden folder, not a class" if _isdir(uri) else f"directly under {root}, not in a class folder"
            yield Example(uri, -1, None, reason=OUTSIDE_CLASSES, detail=detail)
        yield from parallel_decode(items, height=image_size, width=image_size, channels=channels,
                                   check_extension=True, **decode_plan(root, workers))

    locations = {label: data.join(root, folder) for folder, label in labelled}
    return Source("folder", class_names, {None: sum(counts.values())}, examples(), locations)


@dataclasses.dataclass
class ManifestRow:
    line: int
    uri: str
    label: str
    ml_use: str
    problem: str = ""


def _first(mapping: dict, names: tuple[str, ...]):
    lowered = {k.lower(): v for k, v in mapping.items()}
    return next((lowered[n] for n in names if n in lowered and lowered[n] not in (None, "")), None)


def read_manifest_rows(path: str) -> Iterator[ManifestRow]:
    """Streams the rows of a CSV or JSONL manifest (see the module docstring for the formats)."""
    with data.gfile().GFile(path, "r") as f:
        if path.lower().endswith(".jsonl"):
            for line_no, line in enumerate(f, start=1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                    if not isinstance(row, dict):
                        raise ValueError("not a JSON object")
                except ValueError as e:
                    yield ManifestRow(line_no, "", "", "", f"line is not a JSON object: {e}")
                    continue
                annotation = row.get("classificationAnnotation") or {}
                resource_labels = row.get("dataItemResourceLabels") or {}
                uri = _first(row, URI_COLUMNS)
                label = _first(row, LABEL_COLUMNS)
                if label is None and isinstance(annotation, dict):
                    label = annotation.get("displayName")
                ml_use = _first(row, ML_USE_COLUMNS) or (resource_labels.get(VERTEX_ML_USE, "")
                                                         if isinstance(resource_labels, dict) else "")
                yield _row(line_no, uri, label, ml_use)
            return
        reader = csv.reader(f)
        header: list[str] | None = None
        for line_no, cells in enumerate(reader, start=1):
            cells = [c.strip() for c in cells]
            if not any(cells):
                continue
            if header is None:  # the first non-blank row: a header, or tells the headerless layout
                lowered = [c.lower() for c in cells]
                if any(c in URI_COLUMNS for c in lowered) and any(c in LABEL_COLUMNS for c in lowered):
                    header = lowered
                    continue
                if len(cells) not in (2, 3) or (len(cells) == 3 and lowered[0] not in ML_USES):
                    raise data.DataError(
                        f"Cannot tell the columns of manifest {path} from its first row {cells}: give a header "
                        "row naming the `uri` and `label` columns, or use `uri,label` / `ML_USE,uri,label` rows")
                header = ["ml_use", "uri", "label"] if len(cells) == 3 else ["uri", "label"]
            if len(cells) != len(header):
                yield ManifestRow(line_no, cells[0] if cells else "", "", "",
                                  f"{len(cells)} columns where the header has {len(header)}")
                continue
            row = dict(zip(header, cells))
            yield _row(line_no, _first(row, URI_COLUMNS), _first(row, LABEL_COLUMNS), _first(row, ML_USE_COLUMNS))


def _row(line_no: int, uri, label, ml_use) -> ManifestRow:
    uri = "" if uri is None else str(uri).strip()
    label = "" if label is None else str(label).strip()
    ml_use = ("" if ml_use is None else str(ml_use)).strip().lower()
    problem = "no uri" if not uri else "no label" if not label else ""
    return ManifestRow(line_no, uri, label, ml_use, problem)


def manifest_source(path: str, image_size: int, channels: int, limit: int | None, workers: int,
                    classes: list[str] | None) -> Source:
    base = path.rsplit("/", 1)[0] if "/" in path else "."

    def resolve(uri: str) -> str:
        return uri if "://" in uri or os.path.isabs(uri) else data.join(base, uri)

    # First pass: counts, labels and errors that must stop the run before any decoding (nothing kept per row).
    label_counts: collections.Counter = collections.Counter()
    unknown: dict[str, int] = {}
    test_rows = other_rows = 0
    for row in itertools.islice(read_manifest_rows(path), limit):
        if row.problem:
            continue
        label_counts[row.label] += 1
        if classes is not None and row.label not in classes and row.label not in unknown:
            unknown[row.label] = row.line
        if row.ml_use == "test":
            test_rows += 1
        else:
            other_rows += 1
    if unknown:
        shown = ", ".join(f"{label!r} (line {line})" for label, line in list(unknown.items())[:10])
        raise data.DataError(f"Manifest {path} has label(s) that are not known classes: {shown}"
                             f"{' and more' if len(unknown) > 10 else ''}. Known classes: {', '.join(classes)}")
    if not label_counts:
        raise data.DataError(f"Manifest {path} has no rows with both a uri and a label")
    class_names = classes if classes is not None else sorted(label_counts)
    _check_class_count(class_names, f"manifest {path}")
    index = {name: i for i, name in enumerate(class_names)}
    has_test = test_rows > 0

    def items(test: bool | None) -> Iterator[tuple[str, int, str | None]]:
        for row in itertools.islice(read_manifest_rows(path), limit):
            if row.problem or (test is not None and (row.ml_use == "test") != test):
                continue
            source_split = ("test" if row.ml_use == "test" else "train") if has_test else None
            yield resolve(row.uri), index[row.label], source_split

    def examples() -> Iterator[Example]:
        for row in itertools.islice(read_manifest_rows(path), limit):
            if row.problem:
                yield Example(f"{path}:{row.line}", -1, None, reason=BAD_ROW, detail=row.problem)
        kwargs = dict(height=image_size, width=image_size, channels=channels, check_extension=False,
                      **decode_plan(path, workers))
        # Test rows first, so that training copies of test images are recognised as duplicates.
        for part in ((True, False) if has_test else (None,)):
            yield from parallel_decode(lambda part=part: items(part), **kwargs)

    expected = {"test": test_rows, "train": other_rows} if has_test else {None: test_rows + other_rows}
    locations = {index[name]: f"label {name!r} in {path}" for name in class_names}
    return Source("manifest", class_names, expected, examples(), locations)


def tfds_source(spec: str, image_size: int, channels: int, limit: int | None, data_dir: str | None,
                classes: list[str] | None) -> Source:
    import tensorflow as tf
    import tensorflow_datasets as tfds

    parts = spec.split(":")
    if len(parts) not in (2, 3) or not parts[1]:
        raise data.DataError(f"Bad TFDS source {spec!r}: use tfds:NAME or tfds:NAME:SPLIT (e.g. tfds:mnist:train)")
    name = parts[1]
    try:
        builder = tfds.builder(name, data_dir=data_dir)
    except Exception as e:  # tfds raises its own DatasetNotFoundError family
        raise data.DataError(f"Unknown TFDS dataset {name!r}: {str(e).splitlines()[0]}") from None
    builder.download_and_prepare()
    features = builder.info.features
    if "image" not in features or "label" not in features or not hasattr(features["label"], "names"):
        raise data.DataError(f"tfds:{name} needs an `image` feature and a class `label` feature; it has "
                             f"{', '.join(features.keys())}")
    source_names = list(features["label"].names)
    class_names, remap = _apply_allow_list(source_names, classes, f"tfds:{name}")
    _check_class_count(class_names, f"tfds:{name}")
    known = list(builder.info.splits.keys()) or ["train", "test"]  # no split metadata: try the usual names
    if len(parts) == 3:
        wanted = {parts[2]: None}
    else:
        wanted = {s: ("test" if s == "test" else "train") for s in ("test", "train") if s in known}
        if not wanted:
            raise data.DataError(f"tfds:{name} has no train or test split ({', '.join(known)}): name one, "
                                 f"e.g. tfds:{name}:{known[0]}")
    datasets = {}
    expected: collections.Counter = collections.Counter()
    for split_name, split in wanted.items():
        ds = builder.as_dataset(split=split_name, shuffle_files=False)
        if limit:
            ds = ds.take(limit)
        datasets[split_name] = ds
        cardinality = int(ds.cardinality())
        if cardinality < 0:
            cardinality = builder.info.splits[split_name].num_examples if split_name in builder.info.splits else 0
        expected[split] += cardinality

    def examples() -> Iterator[Example]:
        for split_name, split in wanted.items():
            ds = datasets[split_name].map(lambda ex: (ex["image"], ex["label"]), num_parallel_calls=tf.data.AUTOTUNE)
            for i, (image, label) in enumerate(ds.as_numpy_iterator()):
                yield _array_example(image, remap[int(label)], f"tfds:{name}:{split_name}#{i}", split,
                                     image_size, channels)

    return Source("tfds", class_names, dict(expected), examples())


def open_source(source: str, *, image_size: int, channels: int, limit: int | None, workers: int,
                classes: list[str] | None = None, tfds_data_dir: str | None = None) -> Source:
    if source.startswith("tfds:"):
        return tfds_source(source, image_size, channels, limit, tfds_data_dir, classes)
    if not _exists(source):
        hint = ""
        if source == data.DEFAULT_SOURCE:
            hint = (" Install the embedded default dataset with `sudo apt-get install dataset-fashion-mnist` "
                    "(Debian/Ubuntu), or point --source at an idx directory, an image folder, a manifest or "
                    "tfds:NAME.")
        raise data.DataError(f"Source not found: {source}.{hint}")
    if source.lower().endswith(MANIFEST_EXTENSIONS) and not _isdir(source):
        return manifest_source(source, image_size, channels, limit, workers, classes)
    if not _isdir(source):
        raise data.DataError(f"Source {source} is a file but not a manifest: give an idx directory, a folder with "
                             f"one subfolder per class, a {' or '.join(MANIFEST_EXTENSIONS)} manifest or tfds:NAME")
    if "://" not in source and any("-images-idx3-ubyte" in n for n in os.listdir(source)):
        return idx_source(source, image_size, channels, limit, classes)
    return folder_source(source, image_size, channels, limit, workers, classes)


# ---------------------------------------------------------------------------------------------- bookkeeping


class ContentIndex:
    """Content keys seen so far, each with the (label, split) it was kept under: 12 bytes per image.

    A Python dict would cost ~100 bytes per image (1 GB for 10M images); here recent keys sit in a small
    dict that is flushed into sorted numpy runs, merged like a log-structured merge tree, so lookups stay
    binary searches over at most log2(N / flush_size) runs.
    """

    def __init__(self, flush_size: int = 1 << 16):
        self._recent: dict[int, int] = {}
        self._runs: list[tuple[np.ndarray, np.ndarray]] = []
        self._flush_size = flush_size

    def __len__(self) -> int:
        return len(self._recent) + sum(len(k) for k, _ in self._runs)

    @property
    def nbytes(self) -> int:
        return sum(k.nbytes + v.nbytes for k, v in self._runs)

    def get(self, key: int) -> int | None:
        value = self._recent.get(key)
        if value is not None:
            return value
        probe = np.uint64(key)
        for keys, values in self._runs:
            i = int(np.searchsorted(keys, probe))
            if i < len(keys) and keys[i] == probe:
                return int(values[i])
        return None

    def add(self, key: int, value: int) -> None:
        self._recent[key] = value
        if len(self._recent) >= self._flush_size:
            self._flush()

    def _flush(self) -> None:
        keys = np.fromiter(self._recent.keys(), np.uint64, len(self._recent))
        values = np.fromiter(self._recent.values(), np.int32, len(self._recent))
        self._recent = {}
        order = np.argsort(keys)
        keys, values = keys[order], values[order]
        while self._runs and len(self._runs[-1][0]) <= len(keys):
            older_keys, older_values = self._runs.pop()
            keys, values = np.concatenate([older_keys, keys]), np.concatenate([older_values, values])
            order = np.argsort(keys, kind="stable")
            keys, values = keys[order], values[order]
        self._runs.append((keys, values))


class Progress:
    """Logs how far a long run is, at most every `every` seconds: count, percent, rate and time left."""

    def __init__(self, total: int, what: str, every: float = PROGRESS_SECONDS,
                 clock: Callable[[], float] = time.monotonic):
        self.total, self.what, self.every, self.clock = total, what, every, clock
        self.start = self.last = clock()

    def update(self, done: int) -> None:
        now = self.clock()
        if now - self.last < self.every:
            return
        self.last = now
        rate = done / max(now - self.start, 1e-9)
        left = (self.total - done) / rate if rate > 0 and self.total > done else 0.0
        percent = f" ({100 * done / self.total:.0f}%)" if self.total else ""
        log.info("%s: %d/%d%s, %.0f/s, about %s left", self.what, done, self.total, percent, rate,
                 time.strftime("%H:%M:%S", time.gmtime(left)))


class PixelStats:
    """Streaming per-channel mean and standard deviation of 0-255 pixel values, exact: a 256-bin histogram
    per channel (one bincount per image) instead of float sums."""

    def __init__(self, channels: int):
        self.channels = channels
        self.histogram = np.zeros(256 * channels, np.int64)
        self._offsets = (np.arange(channels, dtype=np.int64) * 256) if channels > 1 else None

    def add(self, image: np.ndarray) -> None:
        values = image.ravel() if self._offsets is None else (image.reshape(-1, self.channels) + self._offsets).ravel()
        self.histogram += np.bincount(values, minlength=256 * self.channels)

    def to_json(self) -> dict:
        per_channel = self.histogram.reshape(self.channels, 256)
        pixels = int(per_channel[0].sum())
        if not pixels:
            return {"mean": [], "std": [], "pixels": 0}
        levels = np.arange(256, dtype=np.float64)
        mean = per_channel @ levels / pixels
        std = np.sqrt(np.maximum(per_channel @ levels ** 2 / pixels - mean ** 2, 0.0))
        return {"mean": [round(float(m), 4) for m in mean], "std": [round(float(v), 4) for v in std],
                "pixels": pixels}


# ---------------------------------------------------------------------------------------------- the step


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
    if not 0 <= validation_fraction < 1 or not 0 <= test_fraction < 1 or validation_fraction + test_fraction >= 1:
        raise ValueError("validation_fraction and test_fraction must be in [0, 1) and sum to less than 1")
    if channels not in (1, 3):
        raise ValueError(f"channels must be 1 (grayscale) or 3 (RGB), got {channels}")
    if image_size < 1:
        raise ValueError(f"image_size must be >= 1, got {image_size}")
    if min_shards < 1:
        raise ValueError(f"min_shards must be >= 1, got {min_shards}")
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


# ---------------------------------------------------------------------------------------------- card


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
        f"images {height}x{width}x{channels} uint8; {len(names)} classes.</p>",
        "<h2>Images per split and class</h2><table><tr><th>class</th>"
        + "".join(f"<th>{esc(s)}</th>" for s in splits) + "</tr>",
    ]
    for index, name in enumerate(names):
        out.append(f"<tr><td>{esc(name)}</td>"
                   + "".join(f"<td>{s['class_counts'].get(str(index), 0)}</td>" for s in splits.values()) + "</tr>")
    out.append("<tr><th>total</th>" + "".join(f"<th>{s['count']}</th>" for s in splits.values()) + "</tr>")
    out.append("<tr><td>shards</td>" + "".join(f"<td>{s['num_shards']}</td>" for s in splits.values())
               + "</tr></table>")
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
        rows = list(itertools.islice(data.iter_jsonl(data.join(dataset_dir, data.REJECTED)), rejected_examples))
        out.append(f"<p>First {len(rows)} (all in <code>{data.REJECTED}</code>):</p><table>"
                   "<tr><th>uri</th><th>reason</th><th>detail</th></tr>"
                   + "".join(f"<tr><td><code>{esc(r['uri'])}</code></td><td>{esc(r['reason'])}</td>"
                             f"<td>{esc(r.get('detail', ''))}</td></tr>" for r in rows) + "</table>")
    if manifest.get("empty_classes"):
        out.append(f"<p>Classes with no images: {esc(', '.join(manifest['empty_classes']))}</p>")
    samples_path = data.join(dataset_dir, (manifest.get("samples") or {}).get("file", SAMPLES_FILE))
    if data.gfile().exists(samples_path):
        from PIL import Image

        per_class = manifest["samples"]["per_class"]
        with data.gfile().GFile(samples_path, "rb") as f:
            grid = np.asarray(Image.open(io.BytesIO(f.read())))
        grid = grid[..., None] if grid.ndim == 2 else grid
        scale = max(1, 56 // height)
        out.append(f"<h2>Sample training images</h2><table>")
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Preprocess a labelled image source into TFRecord shards.")
    parser.add_argument("--source", default=data.DEFAULT_SOURCE,
                        help="idx directory, class-per-folder image tree (local or gs://), a .csv/.jsonl manifest "
                             "of (uri, label) rows, or tfds:NAME[:SPLIT]")
    parser.add_argument("--output-dir", required=True)
    parser.add_argument("--validation-fraction", type=float, default=0.1)
    parser.add_argument("--test-fraction", type=float, default=0.1, help="used when the source has no test split")
    parser.add_argument("--image-size", type=int, default=28)
    parser.add_argument("--channels", type=int, default=1, choices=(1, 3))
    parser.add_argument("--limit", type=int, help="at most this many images per source split (quick runs)")
    parser.add_argument("--min-shards", type=int, default=2, help="training workers that will read each split")
    parser.add_argument("--classes", help="comma-separated allowed classes, in label order (default: any)")
    parser.add_argument("--workers", type=int, help="CPUs to decode with (default: the CPUs this process may use)")
    parser.add_argument("--card", help="also write the HTML dataset card to this file")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    try:
        result = preprocess(args.source, args.output_dir, validation_fraction=args.validation_fraction,
                            test_fraction=args.test_fraction, image_size=args.image_size, channels=args.channels,
                            limit=args.limit, min_shards=args.min_shards, classes=args.classes, workers=args.workers)
    except (data.DataError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.card:
        with data.gfile().GFile(args.card, "w") as f:
            f.write(dataset_card(args.output_dir))
    json.dump(result.to_json(), sys.stdout, indent=2)
    print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
