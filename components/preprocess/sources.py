"""The readers: idx files, a folder per class, a CSV/JSONL manifest, tfds:NAME; `open_source` picks one.

Each reader checks what must stop the run before any decoding (no classes, an unknown label, an empty class
folder), counts what it expects per split, and streams `Example`s."""

from __future__ import annotations

import collections
import csv
import dataclasses
import itertools
import json
import os
from typing import Iterator

from components.dataio import data
from components.preprocess.classes import apply_allow_list, check_class_count
from components.preprocess.decoding import planned_decode
from components.preprocess.inputs import BAD_ROW, OUTSIDE_CLASSES, Example, Item, Source
from components.preprocess.per_image import array_example

MANIFEST_EXTENSIONS = (".csv", ".jsonl")
URI_COLUMNS = ("uri", "path", "image", "image_uri", "image_path", "file", "filename", "file_path",
               "gcs_file_path", "imagegcsuri", "url")
LABEL_COLUMNS = ("label", "class", "class_name", "category", "displayname")
ML_USE_COLUMNS = ("ml_use", "mluse", "split")
ML_USES = ("training", "train", "validation", "test", "unassigned")
VERTEX_ML_USE = "aiplatform.googleapis.com/ml_use"


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
    class_names, remap = apply_allow_list(source_names, classes, directory)
    check_class_count(class_names, directory)

    def examples() -> Iterator[Example]:
        for pair, images, labels in loaded:
            base = os.path.basename(pair.images)
            for i, (image, label) in enumerate(zip(images, labels)):
                yield array_example(image, remap[int(label)], f"{base}#{i}", pair.split, image_size, channels)

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
    class_names, remap = apply_allow_list(folders, classes, root)
    check_class_count(class_names, f"{root} (one subfolder per class)")
    labelled = [(folder, remap[i]) for i, folder in enumerate(folders)]
    stray = [data.join(root, e) for e in entries if e not in folders]

    def listing(folder: str) -> Iterator[str]:
        files = data.list_files(data.join(root, folder))
        return itertools.islice(files, limit) if limit else files

    # A first pass counts (streamed, nothing kept), so shards can be sized before decoding starts.
    counts = {folder: sum(1 for _ in listing(folder)) if limit else data.count_files(data.join(root, folder))
              for folder, _ in labelled}
    empty = [f for f, n in counts.items() if n == 0]
    if empty:
        raise data.DataError(f"Class folder(s) with no files under {root}: {', '.join(empty)}. "
                             "Add images or remove the folder(s).")

    def items() -> Iterator[Item]:
        for uri in stray:
            detail = "hidden folder, not a class" if _isdir(uri) else f"directly under {root}, not in a class folder"
            yield Item(uri, -1, None, (OUTSIDE_CLASSES, detail))
        for folder, label in labelled:
            for uri in listing(folder):
                yield Item(uri, label, None)

    report: dict = {}

    def examples() -> Iterator[Example]:
        yield from planned_decode(items, source=root, cpus=workers, expected=sum(counts.values()), height=image_size,
                                  width=image_size, channels=channels, check_extension=True, report=report)

    locations = {label: data.join(root, folder) for folder, label in labelled}
    return Source("folder", class_names, {None: sum(counts.values())}, examples(), locations, items, report)


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
    """Streams the rows of a CSV or JSONL manifest (see the package docstring for the formats)."""
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
    check_class_count(class_names, f"manifest {path}")
    index = {name: i for i, name in enumerate(class_names)}
    has_test = test_rows > 0

    def items() -> Iterator[Item]:
        for row in itertools.islice(read_manifest_rows(path), limit):
            if row.problem:
                yield Item(f"{path}:{row.line}", -1, None, (BAD_ROW, row.problem))
        # Test rows first, so that training copies of test images are recognised as duplicates.
        for test in ((True, False) if has_test else (None,)):
            for row in itertools.islice(read_manifest_rows(path), limit):
                if row.problem or (test is not None and (row.ml_use == "test") != test):
                    continue
                source_split = ("test" if row.ml_use == "test" else "train") if has_test else None
                yield Item(resolve(row.uri), index[row.label], source_split)

    report: dict = {}

    def examples() -> Iterator[Example]:
        yield from planned_decode(items, source=path, cpus=workers, expected=test_rows + other_rows,
                                  height=image_size, width=image_size, channels=channels, check_extension=False,
                                  report=report)

    expected = {"test": test_rows, "train": other_rows} if has_test else {None: test_rows + other_rows}
    locations = {index[name]: f"label {name!r} in {path}" for name in class_names}
    return Source("manifest", class_names, expected, examples(), locations, items, report)


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
    class_names, remap = apply_allow_list(source_names, classes, f"tfds:{name}")
    check_class_count(class_names, f"tfds:{name}")
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
                yield array_example(image, remap[int(label)], f"tfds:{name}:{split_name}#{i}", split,
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
