"""Batch predict: classify millions of images with a trained model, streaming, restartable.

Sources (`--images`), local or `gs://`:

- a folder, searched recursively (`gs://bucket/images`);
- a glob (`gs://bucket/images/**/*.jpg`: `*` stays within a folder, `**` crosses folders);
- a manifest: a `.txt` file with one uri per line, a `.csv` with a `uri` column (or uris in the first
  column), or a `.jsonl` with `uri` (or Vertex AI's `content`) per line; relative entries are taken from
  the manifest's folder;
- TFRecord shards (`gs://bucket/shards/*.tfrecord`, `.tfrecord.gz` for GZIP): `tf.train.Example`s with the
  encoded image in `image/encoded` or `image` (or raw uint8 pixels of the model's input size, as this
  project's own dataset shards hold) and its name in `uri`, `image/filename` or `filename`.

How it goes: inputs are listed lazily in a stable order (folders sorted level by level) and cut into chunks of
`chunk_size` inputs (for shards: one chunk per shard). Within a chunk, a background thread reads a batch of
files in parallel and decodes it while the model (GPU when present) predicts the previous one. Images already
at the model's size and colour mode are decoded by TensorFlow's C++ decoders across the whole batch in parallel,
to the same pixels training's decoder gives (8-bit PNG; JPEG with the exact DCT). Anything else (other sizes or
modes, 16-bit, palettes, transparency) is converted by `data.decode_image`, the decoder preprocessing uses, in
a thread pool. Memory stays bounded: neither the listing nor a chunk's results are held; rows are written as
they are predicted.

Outputs in `output_dir`:

    shards/predictions-NNNNN.jsonl   one row per image: uri, class_index, class_name, confidence, top_k
    shards/predictions-NNNNN.csv     the same as columns (top2_..., top3_... for the runners-up)
    shards/errors-NNNNN.jsonl        inputs that could not be read or decoded: uri and reason
    shards/chunk-NNNNN.json          written last: the chunk is complete (its inputs' fingerprint, counts)
    predictions.jsonl, predictions.csv   all shards in one file, when there are at most `combine_max` rows
    errors.jsonl                     all errors
    summary.json                     counts, throughput, the files above

A rerun over the same inputs and output skips every chunk whose marker matches its inputs, so an interrupted
job does not start over (a chunk whose inputs changed is redone). The step fails only when no input at all
could be read. The first `print_first` predictions are also printed in the classic form, `The image 0.png is
the number 7 with a 99.85 percent confidence.`, then a progress line every few seconds, so that logs of a
job over millions of images stay readable.

On Vertex AI: `vertex_batch_predict` (or `--vertex-model RESOURCE --staging gs://...`) runs a
BatchPredictionJob on a model registered there instead: it builds the JSONL instances file from the same
sources with the same decoding, waits for the job, and writes the same outputs from the job's results.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import csv
import dataclasses
import hashlib
import io
import json
import logging
import os
import re
import struct
import sys
import threading
import time
from typing import Iterator

import numpy as np

from components import data, gcp

log = logging.getLogger(__name__)

SHARDS = "shards"
TFRECORD_SUFFIXES = (".tfrecord", ".tfrecords", ".tfrec", ".tfrecord.gz", ".tfrecords.gz", ".tfrec.gz")
MANIFEST_SUFFIXES = (".txt", ".csv", ".jsonl")
GLOB_CHARS = re.compile(r"[*?\[]")
# TFRecord feature names, in order of preference, for the image bytes and for the name of the image.
RECORD_IMAGE_KEYS = ("image/encoded", "image", "image_raw", "image/raw", "encoded")
RECORD_NAME_KEYS = ("uri", "image/filename", "filename", "image/uri", "image/source_id")
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
PROGRESS_SECONDS = 10.0


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


# ---------------------------------------------------------------------------------------------- log lines


def describe(class_names: list[str], index: int) -> str:
    name = class_names[index]
    if name.isdigit():
        return f"the number {name}"
    return f"{'an' if name[:1].lower() in 'aeiou' else 'a'} {name}"


def sentence(uri: str, class_names: list[str], index: int, confidence: float) -> str:
    return (f"The image {os.path.basename(uri)} is {describe(class_names, index)} "
            f"with a {100 * confidence:.2f} percent confidence.")


# ---------------------------------------------------------------------------------------------- sources


@dataclasses.dataclass(frozen=True)
class Source:
    kind: str  # folder | glob | manifest | tfrecord | file
    location: str

    def __str__(self) -> str:
        return f"{self.kind} {self.location}"


def _is_remote(path: str) -> bool:
    return "://" in path


def _exists(path: str) -> bool:
    return data.gfile().exists(path) if _is_remote(path) else os.path.exists(path)


def _isdir(path: str) -> bool:
    return data.gfile().isdir(path) if _is_remote(path) else os.path.isdir(path)


def resolve_source(source: str) -> Source:
    """What kind of input `source` names; raises DataError saying what is accepted when it names nothing."""
    if not source:
        raise data.DataError("No image source given: pass a folder, a glob, a manifest or TFRecord shards")
    lowered = source.lower()
    if GLOB_CHARS.search(source):  # shards when the pattern's file name says so: DIR/train-*.tfrecord*
        return Source("tfrecord" if ".tfrec" in lowered.rsplit("/", 1)[-1] else "glob", source)
    if not _exists(source):
        raise data.DataError(f"Image source not found: {source}")
    if _isdir(source):
        return Source("folder", source)
    if lowered.endswith(TFRECORD_SUFFIXES):
        return Source("tfrecord", source)
    if lowered.endswith(MANIFEST_SUFFIXES):
        return Source("manifest", source)
    if lowered.endswith(data.IMAGE_EXTENSIONS):
        return Source("file", source)
    raise data.DataError(
        f"Cannot tell how to read {source}: give a folder of images, a glob (e.g. 'DIR/**/*.png'), a manifest "
        f"({', '.join(MANIFEST_SUFFIXES)}: one uri per line) or TFRecord shards ({', '.join(TFRECORD_SUFFIXES[:3])})")


def _normal(path: str) -> str:
    return path.rstrip("/") if _is_remote(path) else os.path.abspath(path)


class Unlisted(str):
    """A folder that could not be listed, passed along as an input so that it is reported (with the reason)
    in errors.jsonl and counted, rather than silently missing."""

    reason: str = ""

    @classmethod
    def of(cls, path: str, error: Exception) -> "Unlisted":
        unlisted = cls(path)
        unlisted.reason = f"folder could not be listed: {type(error).__name__}: {getattr(error, 'strerror', '') or error}"
        return unlisted


def walk_files(root: str, exclude: str | None = None) -> Iterator[str]:
    """Every file below `root`, lazily and in a stable order: a folder's files sorted, then its sub-folders in
    sorted order. Only one folder's listing is held at a time. `exclude` (a folder) is not entered; linked
    folders are followed once (no loops)."""
    excluded = _normal(exclude) if exclude else None
    if _is_remote(root):
        for directory, subdirs, files in data.gfile().walk(root):
            subdirs.sort()
            subdirs[:] = [d for d in subdirs if _normal(data.join(directory, d)) != excluded]
            for name in sorted(files):
                yield data.join(directory, name)
        return
    stack, seen = [root], set()
    while stack:
        directory = stack.pop()
        files, subdirs = [], []
        try:
            identity = os.stat(directory)
            if (identity.st_dev, identity.st_ino) in seen:
                continue
            seen.add((identity.st_dev, identity.st_ino))
            with os.scandir(directory) as entries:
                for entry in entries:
                    (subdirs if entry.is_dir() else files).append(entry.name)
        except OSError as e:
            yield Unlisted.of(directory, e)
            continue
        for name in sorted(files):
            yield os.path.join(directory, name)
        for name in sorted(subdirs, reverse=True):
            path = os.path.join(directory, name)
            if _normal(path) != excluded:
                stack.append(path)


def glob_regex(pattern: str) -> re.Pattern:
    """A regex for a glob: `*` and `?` stay within a folder, `**` crosses folders, `[...]` is a character set."""
    out, i = [], 0
    while i < len(pattern):
        ch = pattern[i]
        if pattern.startswith("**/", i):
            out.append("(?:.*/)?")
            i += 3
        elif pattern.startswith("**", i):
            out.append(".*")
            i += 2
        elif ch == "*":
            out.append("[^/]*")
            i += 1
        elif ch == "?":
            out.append("[^/]")
            i += 1
        elif ch == "[" and pattern.find("]", i + 2) > 0:
            end = pattern.find("]", i + 2)  # a ']' right after '[' (or '[!') belongs to the set
            body = pattern[i + 1:end]
            body = "^" + body[1:] if body.startswith("!") else body
            out.append("[" + body.replace("\\", "\\\\") + "]")
            i = end + 1
        else:
            out.append(re.escape(ch))
            i += 1
    return re.compile("".join(out) + r"\Z")


def _glob_base(pattern: str) -> str:
    """The longest folder of `pattern` without glob characters."""
    head = pattern[:GLOB_CHARS.search(pattern).start()]
    if _is_remote(pattern):
        scheme, rest = head.split("://", 1)
        return f"{scheme}://{rest.rsplit('/', 1)[0]}" if "/" in rest else f"{scheme}://{rest}"
    return os.path.dirname(head) or "."


def iter_glob(pattern: str, exclude: str | None = None) -> Iterator[str]:
    """Files matching `pattern`, streamed by walking its fixed prefix folder (stable order, bounded memory)."""
    base = _glob_base(pattern)
    if not _isdir(base):
        return
    if not _is_remote(pattern) and not os.path.isabs(pattern):
        pattern = os.path.join(os.getcwd(), pattern)
        base = os.path.join(os.getcwd(), base)
    matcher = glob_regex(pattern)
    for path in walk_files(base, exclude):
        if matcher.match(path):
            yield path


def iter_manifest(path: str) -> Iterator[str]:
    """The uris listed in a manifest (.txt: one per line, '#' comments; .csv: `uri` column or the first;
    .jsonl: `uri` or `content`), streamed; relative entries are resolved against the manifest's folder."""
    folder = path.rsplit("/", 1)[0] if _is_remote(path) else os.path.dirname(os.path.abspath(path))
    lowered = path.lower()

    def resolve(entry: str) -> str:
        entry = entry.strip()
        return entry if _is_remote(entry) or os.path.isabs(entry) else data.join(folder, entry)

    with data.gfile().GFile(path) as f:
        if lowered.endswith(".csv"):
            reader = csv.reader(f)
            column = 0
            for line_number, row in enumerate(reader, start=1):
                if line_number == 1 and "uri" in [c.strip().lower() for c in row]:
                    column = [c.strip().lower() for c in row].index("uri")
                    continue
                if len(row) > column and row[column].strip():
                    yield resolve(row[column])
        elif lowered.endswith(".jsonl"):
            for line_number, line in enumerate(f, start=1):
                if not line.strip():
                    continue
                try:
                    entry = json.loads(line)
                except json.JSONDecodeError as e:
                    raise data.DataError(f"{path} line {line_number} is not JSON: {e}") from None
                uri = entry.get("uri") or entry.get("content") if isinstance(entry, dict) else None
                if not isinstance(uri, str):
                    raise data.DataError(f"{path} line {line_number} has no 'uri' (or 'content') string")
                yield resolve(uri)
        else:
            for line in f:
                line = line.strip()
                if line and not line.startswith("#"):
                    yield resolve(line)


def iter_uris(source: Source, exclude: str | None = None) -> Iterator[str]:
    if source.kind == "folder":
        return walk_files(source.location, exclude)
    if source.kind == "glob":
        return iter_glob(source.location, exclude)
    if source.kind == "manifest":
        return iter_manifest(source.location)
    if source.kind == "file":
        return iter([source.location])
    raise ValueError(f"{source} is not a list of files")


def tfrecord_shards(source: Source) -> list[str]:
    if GLOB_CHARS.search(source.location):
        return sorted(data.gfile().glob(source.location))
    return [source.location]


# ---------------------------------------------------------------------------------------------- chunks


@dataclasses.dataclass
class Chunk:
    """A unit of work and of restart: a run of uris from a file source, or one TFRecord shard."""

    index: int
    fingerprint: str
    uris: list[str] | None = None
    shard: str | None = None

    @property
    def label(self) -> str:
        return self.shard or (f"{self.uris[0]} .. {self.uris[-1]}" if self.uris else "")


def iter_chunks(source: Source, chunk_size: int, exclude: str | None = None) -> Iterator[Chunk]:
    if source.kind == "tfrecord":
        for index, shard in enumerate(tfrecord_shards(source)):
            stat = data.gfile().stat(shard)
            key = f"{shard}\0{stat.length}\0{stat.mtime_nsec}"
            yield Chunk(index, "sha256:" + hashlib.sha256(key.encode()).hexdigest(), shard=shard)
        return
    for index, uris in enumerate(data.batched(iter_uris(source, exclude), chunk_size)):
        digest = hashlib.sha256("\n".join(uris).encode()).hexdigest()
        yield Chunk(index, "sha256:" + digest, uris=uris)


# ---------------------------------------------------------------------------------------------- decoding

# JPEG start-of-frame markers (baseline, extended, progressive, lossless; Huffman and arithmetic coded).
SOF_MARKERS = frozenset([0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF])


def jpeg_shape(contents: bytes) -> tuple[int, int, int] | None:
    """(height, width, components) from a JPEG's frame header, or None if there is none before the scan."""
    i, n = 2, len(contents)
    while i + 4 <= n:
        if contents[i] != 0xFF:
            return None
        marker = contents[i + 1]
        if marker == 0xFF:  # fill byte
            i += 1
            continue
        if marker == 0x01 or 0xD0 <= marker <= 0xD8:  # markers without a length
            i += 2
            continue
        if marker in SOF_MARKERS:
            if i + 10 > n:
                return None
            return (int.from_bytes(contents[i + 5:i + 7], "big"), int.from_bytes(contents[i + 7:i + 9], "big"),
                    contents[i + 9])
        if marker == 0xDA:
            return None
        i += 2 + int.from_bytes(contents[i + 2:i + 4], "big")
    return None


def read_input(uri: str) -> bytes | str:
    """The bytes of a file, or the reason it cannot be read (local files skip TensorFlow's file layer: 6x cheaper)."""
    if isinstance(uri, Unlisted):
        return uri.reason
    if _is_remote(uri):
        try:
            return data.read_bytes(uri)
        except data.ImageError as e:
            return str(e)
    try:
        with open(uri, "rb") as f:
            return f.read()
    except OSError as e:
        return f"unreadable: {type(e).__name__}: {e.strerror or e}"


class Decoder:
    """Turns a batch of (key, bytes or reason) into model inputs, exactly as training's decoder would.

    The fast path decodes, with TensorFlow's C++ decoders over a whole batch in parallel, the images that need
    no conversion: 8-bit PNGs of the model's size and colour type, and JPEGs of the model's size and number of
    components (with the exact integer DCT, as Pillow uses; both decode to the same pixels as
    `data.decode_image`). Raw pixels of the exact size are taken as they are (TFRecord sources). Everything
    else (other sizes and modes, 16-bit, palettes, transparency, other formats, corrupt files) goes to
    `data.decode_image` in a thread pool, which converts what it can and gives the reason for what it cannot.
    """

    def __init__(self, image_shape: list[int], pool: concurrent.futures.Executor, *, raw_ok: bool = False):
        import tensorflow as tf

        self.height, self.width, self.channels = image_shape
        self.shape = [self.height, self.width, self.channels]
        self.pool = pool
        self.raw_size = self.height * self.width * self.channels if raw_ok else -1
        # An 8-bit PNG of the model's size and colour type starts with exactly these bytes (signature + IHDR).
        self.png_head = PNG_MAGIC + struct.pack(">I4sIIBB", 13, b"IHDR", self.width, self.height, 8,
                                                0 if self.channels == 1 else 2)
        parallel = 2 * (os.cpu_count() or 1)
        shape, channels = self.shape, self.channels

        def batch_decoder(decode_one):
            @tf.function(input_signature=[tf.TensorSpec([None], tf.string)])
            def decode(contents):
                with tf.device("/CPU:0"):
                    return tf.map_fn(lambda c: tf.reshape(decode_one(c), shape), contents,
                                     fn_output_signature=tf.uint8, parallel_iterations=parallel)

            return decode

        self._png = batch_decoder(lambda c: tf.io.decode_png(c, channels=channels))
        self._jpeg = batch_decoder(lambda c: tf.io.decode_jpeg(c, channels=channels, dct_method="INTEGER_ACCURATE"))
        self._errors = (tf.errors.InvalidArgumentError, tf.errors.UnknownError)

    def slow(self, contents: bytes) -> np.ndarray | str:
        try:
            return decode_contents(contents, self.height, self.width, self.channels, raw_ok=self.raw_size > 0)
        except data.ImageError as e:
            return str(e)

    def route(self, contents: bytes) -> str:
        if contents.startswith(self.png_head):
            return "png"
        if contents.startswith(b"\xff\xd8\xff") and jpeg_shape(contents) == tuple(self.shape):
            return "jpeg"
        if len(contents) == self.raw_size and not contents.startswith((PNG_MAGIC, b"\xff\xd8\xff")):
            return "raw"
        return "slow"

    def decode(self, items: list[tuple[str, bytes | str]]) -> tuple[list[str], np.ndarray, list[tuple[str, str]]]:
        """(keys of the decoded images, their pixels uint8 NxHxWxC in input order, (key, reason) of failures)."""
        images = np.empty([len(items), *self.shape], np.uint8)
        decoded = np.zeros(len(items), bool)
        routes: dict[str, list[int]] = {"png": [], "jpeg": [], "raw": [], "slow": []}
        reasons: dict[int, str] = {}
        for position, (_, contents) in enumerate(items):
            if isinstance(contents, str):
                reasons[position] = contents
            else:
                routes[self.route(contents)].append(position)
        for kind, fast in (("png", self._png), ("jpeg", self._jpeg)):
            positions = routes[kind]
            if not positions:
                continue
            try:
                images[positions] = fast([items[p][1] for p in positions]).numpy()
                decoded[positions] = True
            except self._errors:  # a corrupt file in the batch: the slow path finds which, and why
                routes["slow"].extend(positions)
        for position in routes["raw"]:
            images[position] = np.frombuffer(items[position][1], np.uint8).reshape(self.shape)
            decoded[position] = True
        slow = sorted(routes["slow"])
        for position, result in zip(slow, self.pool.map(self.slow, [items[p][1] for p in slow])):
            if isinstance(result, str):
                reasons[position] = result
            else:
                images[position] = result
                decoded[position] = True
        keep = np.flatnonzero(decoded)
        return ([items[p][0] for p in keep], images[keep] if len(keep) < len(items) else images,
                [(items[p][0], reasons[p]) for p in sorted(reasons)])


def decode_contents(contents: bytes, height: int, width: int, channels: int, *, raw_ok: bool = False) -> np.ndarray:
    """The slow path, and the reference: training's decoder; raw pixels of the exact size when `raw_ok`."""
    if raw_ok and len(contents) == height * width * channels and not contents.startswith((PNG_MAGIC, b"\xff\xd8\xff")):
        return np.frombuffer(contents, np.uint8).reshape(height, width, channels)
    return data.decode_image(contents, height, width, channels)


def _record_image(example, shard: str, index: int) -> tuple[str, bytes]:
    features = example.features.feature
    contents = next((features[k].bytes_list.value[0] for k in RECORD_IMAGE_KEYS
                     if k in features and features[k].bytes_list.value), None)
    if contents is None:
        raise data.ImageError(f"record has no image feature (looked for {', '.join(RECORD_IMAGE_KEYS)})")
    name = next((features[k].bytes_list.value[0].decode(errors="replace") for k in RECORD_NAME_KEYS
                 if k in features and features[k].bytes_list.value and features[k].bytes_list.value[0]), "")
    return name or f"{shard}#{index}", contents


def iter_records(shard: str) -> Iterator[tuple[str, bytes | str]]:
    """(name, image bytes or the reason there are none) for each record of a shard. A corrupt or truncated
    shard ends with one more item: the shard and what went wrong (nothing after that point can be read)."""
    import tensorflow as tf

    options = tf.io.TFRecordOptions(compression_type="GZIP" if shard.lower().endswith(".gz") else "")
    index = 0
    try:
        for record in tf.compat.v1.io.tf_record_iterator(shard, options=options):
            try:
                example = tf.train.Example.FromString(record)
            except Exception as e:  # protobuf's DecodeError: a record that is not an Example
                yield f"{shard}#{index}", f"not a tf.train.Example: {e}"
            else:
                try:
                    yield _record_image(example, shard, index)
                except data.ImageError as e:
                    yield f"{shard}#{index}", str(e)
            index += 1
    except Exception as e:  # tf.errors.DataLossError, NotFoundError, ...
        yield shard, f"unreadable after record {index}: {type(e).__name__}: {str(e).splitlines()[0]}"


def iter_batches(chunk: Chunk, batch_size: int, pool: concurrent.futures.Executor) -> Iterator[list]:
    """Batches of (key, bytes or reason) for one chunk; files are read in parallel in `pool`."""
    if chunk.uris is None:
        yield from data.batched(iter_records(chunk.shard), batch_size)
        return
    for uris in data.batched(chunk.uris, batch_size):
        yield list(zip(uris, pool.map(read_input, uris)))


class Prefetcher:
    """Runs a producer in a background thread, `depth` results ahead of the consumer.

    Reading and decoding (file I/O, TensorFlow's decoders, Pillow's C code: all release the GIL) overlap
    with the model working on the previous batch. An exception in the producer is raised in the consumer.
    """

    _DONE = object()

    def __init__(self, produce: Iterator, depth: int = 2):
        import queue

        self._queue: queue.Queue = queue.Queue(maxsize=depth)
        self._stop = False
        self._thread = threading.Thread(target=self._run, args=(produce,), daemon=True, name="predict-prefetch")
        self._thread.start()

    def _put(self, item) -> bool:
        import queue

        while not self._stop:
            try:
                self._queue.put(item, timeout=0.2)
                return True
            except queue.Full:
                continue
        return False

    def _run(self, produce: Iterator) -> None:
        try:
            for item in produce:
                if not self._put(item):
                    return
            self._put(self._DONE)
        except BaseException as e:  # handed to the consumer, which raises it
            self._put(e)

    def __iter__(self):
        while True:
            item = self._queue.get()
            if item is self._DONE:
                return
            if isinstance(item, BaseException):
                raise item
            yield item

    def close(self) -> None:
        self._stop = True
        self._thread.join()


# ---------------------------------------------------------------------------------------------- output


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
        confidences = np.round(np.take_along_axis(probabilities, order, axis=1).astype(np.float64), 6).tolist()
        order = order.tolist()
        lines, out = [], []
        for uri, top, conf in zip(keys, order, confidences):
            ranked = ", ".join(f'{{"class_index": {t}, "class_name": {self.names_json[t]}, "confidence": {c}}}'
                               for t, c in zip(top, conf))
            best = top[0]
            lines.append(f'{{"uri": {json.dumps(uri)}, "class_index": {best}, "class_name": '
                         f'{self.names_json[best]}, "confidence": {conf[0]}, "top_k": [{ranked}]}}\n')
            row = [uri, best, self.class_names[best], conf[0]]
            for t, c in zip(top[1:], conf[1:]):
                row += [t, self.class_names[t], c]
            self.csv.writerow(row)
            out.append((uri, best, conf[0]))
        self.jsonl.write("".join(lines))
        self.count += len(keys)
        return out

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
            combine_max: int = 1_000_000, classifier: data.Classifier | None = None) -> PredictResult:
    """Predicts every image of `source` into `output_dir`; see the module docstring for sources and layout."""
    import tensorflow as tf

    if (batch_size is not None and batch_size < 1) or chunk_size < 1 or top_k < 1:
        raise ValueError("batch_size, chunk_size and top_k must be >= 1")
    start = time.monotonic()
    where = resolve_source(source)
    classifier = classifier or data.load_classifier(model_dir)
    batch_size = batch_size or auto_batch_size(classifier.image_shape)
    names = list(classifier.class_names)
    top_k = min(top_k, len(names))
    # Reading from object storage waits on the network, not the CPU: many more readers there.
    workers = workers or (32 if _is_remote(where.location) else 2 * (os.cpu_count() or 1))
    data.gfile().makedirs(data.join(output_dir, SHARDS))
    gpus = tf.config.list_physical_devices("GPU")
    log.info("predict: %s -> %s; model input %s on %s, batches of %d", where, output_dir,
             "x".join(map(str, classifier.image_shape)), f"{len(gpus)} GPU(s)" if gpus else "CPU", batch_size)
    progress = _Progress(names, print_first)
    totals = {"count": 0, "errors": 0, "inputs": 0}
    chunks = skipped = predicted_here = 0
    with concurrent.futures.ThreadPoolExecutor(max_workers=workers, thread_name_prefix="predict-io") as pool:
        decoder = Decoder(classifier.image_shape, pool, raw_ok=where.kind == "tfrecord")
        for chunk in iter_chunks(where, chunk_size, exclude=output_dir):
            chunks += 1
            marker = read_marker(shard_paths(output_dir, chunk.index)["marker"])
            if marker and marker.get("fingerprint") == chunk.fingerprint:
                skipped += 1
                for key in totals:
                    totals[key] += marker.get(key, 0)
                continue
            writer = ChunkWriter(output_dir, chunk.index, names, top_k)
            batches = Prefetcher(decoder.decode(items) for items in iter_batches(chunk, batch_size, pool))
            try:
                for keys, images, errors in batches:
                    for uri, reason in errors:
                        writer.error(uri, reason)
                    progress.errors += len(errors)
                    if keys:
                        progress.predicted(writer.write(keys, classifier.predict_proba(images.astype(np.float32))))
            finally:
                batches.close()
                writer.close()
            inputs = writer.count + writer.errors
            writer.commit({"chunk": chunk.index, "fingerprint": chunk.fingerprint, "inputs": inputs,
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


def _remove_stale_shards(output_dir: str, chunks: int) -> None:
    """Shards beyond this run's last chunk belong to an earlier, larger input: remove them."""
    pattern = data.join(output_dir, SHARDS, "chunk-*.json")
    for marker in data.gfile().glob(pattern):
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


# ---------------------------------------------------------------------------------------------- Vertex AI


# A Vertex AI batch prediction job could not be created or did not succeed; the message says why. The name
# callers catch for the Google Cloud layer's errors (components/gcp/errors.py, which also gives the exit codes).
VertexBatchError = gcp.RemoteError


def serving_input_name(model_dir: str) -> str:
    """The input name of the exported SavedModel's serving signature: Vertex AI's TensorFlow serving container
    takes instances keyed by it."""
    import tensorflow as tf

    saved = data.join(model_dir, "saved_model")
    saved = saved if data.gfile().exists(data.join(saved, "saved_model.pb")) else model_dir
    if not data.gfile().exists(data.join(saved, "saved_model.pb")):
        raise data.DataError(f"No SavedModel in {model_dir} (looked for saved_model/saved_model.pb): Vertex AI "
                             "serves the SavedModel that training exports")
    names = list(tf.saved_model.load(saved).signatures["serving_default"].structured_input_signature[1])
    if len(names) != 1:
        raise data.DataError(f"The serving signature of {saved} takes {len(names)} inputs ({names}); expected one")
    return names[0]


def write_vertex_instances(source: str, instances_path: str, errors_path: str, image_shape: list[int],
                           input_name: str, *, batch_size: int = 256, chunk_size: int = 10_000,
                           exclude: str | None = None) -> dict:
    """Vertex AI batch prediction's input, built from any source this module reads: JSONL with one line per
    readable image, `{"uri": URI, INPUT_NAME: HxWxC pixels}`, decoded exactly as local prediction decodes them
    (the job's `instanceConfig.keyField` is `uri`, so predictions come back keyed by it). Inputs that cannot
    be read go to `errors_path` with the reason. Returns {"instances": n, "errors": m}."""
    where = resolve_source(source)
    counts = {"instances": 0, "errors": 0}
    workers = 32 if _is_remote(where.location) else 2 * (os.cpu_count() or 1)
    with concurrent.futures.ThreadPoolExecutor(max_workers=workers) as pool, \
            data.gfile().GFile(instances_path, "w") as instances, data.gfile().GFile(errors_path, "w") as errors:
        decoder = Decoder(image_shape, pool, raw_ok=where.kind == "tfrecord")
        for chunk in iter_chunks(where, chunk_size, exclude=exclude):
            for keys, images, failures in map(decoder.decode, iter_batches(chunk, batch_size, pool)):
                instances.write("".join(json.dumps({"uri": key, input_name: image.tolist()}) + "\n"
                                        for key, image in zip(keys, images)))
                errors.write("".join(json.dumps({"uri": uri, "reason": reason}) + "\n" for uri, reason in failures))
                counts["instances"] += len(keys)
                counts["errors"] += len(failures)
    return counts


def run_vertex_batch_job(client, *, model: str, instances_uri: str, output_uri_prefix: str, display_name: str,
                         machine_type: str = "n1-standard-4", accelerator_type: str = "", accelerator_count: int = 0,
                         replicas: int = 1, max_replicas: int = 1, labels: dict | None = None,
                         poll_seconds: float = 30.0, timeout_seconds: float = 24 * 3600, sleep=None):
    """Creates a BatchPredictionJob for a model registered in Vertex AI and follows it to its end.

    `client` is a `google.cloud.aiplatform_v1.JobServiceClient` for the model's region (`gcp.job_client`).
    `model` is the model's resource name, optionally with `@VERSION` or `@ALIAS`
    (`projects/P/locations/L/models/ID@champion`). Returns the succeeded job; raises VertexBatchError when it
    cannot be created, fails or runs past the timeout. The job is ours: it is cancelled on a timeout, on SIGTERM
    (`gcp.JobStopped`) and when this process fails, so an interrupted prediction leaves no paid job running.
    `sleep` (tests) replaces the real wait.
    """
    from google.api_core import exceptions
    from google.cloud import aiplatform_v1

    found = re.match(r"^(projects/[^/]+/locations/[^/]+)/models/[^/@]+(@[A-Za-z0-9_-]+)?$", model)
    if not found:
        raise ValueError(f"Not a Vertex AI model resource name: {model!r} (expected "
                         "projects/PROJECT/locations/REGION/models/ID[@VERSION_OR_ALIAS])")
    parent = found.group(1)
    machine_spec = {"machine_type": machine_type}
    if accelerator_count:
        machine_spec.update(accelerator_type=accelerator_type, accelerator_count=accelerator_count)
    request = aiplatform_v1.BatchPredictionJob(
        display_name=display_name, model=model, labels=labels or {},
        input_config={"instances_format": "jsonl", "gcs_source": {"uris": [instances_uri]}},
        instance_config={"instance_type": "object", "key_field": "uri"},
        output_config={"predictions_format": "jsonl", "gcs_destination": {"output_uri_prefix": output_uri_prefix}},
        dedicated_resources={"machine_spec": machine_spec, "starting_replica_count": replicas,
                             "max_replica_count": max(replicas, max_replicas)})
    retry = gcp.RetryPolicy(sleep=sleep or time.sleep)
    with gcp.sigterm_stops():  # a SIGTERM while the job is being created cancels it too
        try:
            job = retry.call(f"create a batch prediction job for {model}", lambda: client.create_batch_prediction_job(
                parent=parent, batch_prediction_job=request), parent=parent)
        except exceptions.GoogleAPICallError as e:  # what the retry policy leaves as the API answered it
            hint = " (is the model registered in this project and region?)" if e.code == 404 else ""
            raise VertexBatchError(f"Creating the batch prediction job for {model} failed: {e.message}{hint}") from e
        followed = gcp.follow_job(
            lambda: retry.call(f"get {job.name}", lambda: client.get_batch_prediction_job(name=job.name),
                               parent=parent, idempotent=True),
            lambda: retry.call(f"cancel {job.name}", lambda: client.cancel_batch_prediction_job(name=job.name),
                               parent=parent, idempotent=True),
            status=gcp.vertex_job_status, what=f"Batch prediction job {job.name}", job=job,
            poll_seconds=poll_seconds, timeout_seconds=timeout_seconds, sleep=sleep)
    return followed.job


def read_vertex_predictions(results_dir: str, output_dir: str, class_names: list[str], *, top_k: int = 3,
                            batch_size: int = 1024) -> dict:
    """Writes this module's outputs (shards, errors) from a job's `prediction.results-*` files, whose lines are
    `{"key": URI, "prediction": probabilities}` (or `"error"` for an instance the model refused)."""
    files = sorted(data.gfile().glob(data.join(results_dir, "prediction.results-*")))
    if not files:
        raise VertexBatchError(f"The job wrote no prediction.results-* files under {results_dir}")
    top_k = min(top_k, len(class_names))
    totals = {"count": 0, "errors": 0, "inputs": 0}
    for index, path in enumerate(files):
        writer = ChunkWriter(output_dir, index, class_names, top_k)
        keys, rows = [], []

        def flush():
            if keys:
                writer.write(list(keys), np.asarray(rows, dtype=np.float64))
                keys.clear()
                rows.clear()

        with data.gfile().GFile(path) as f:
            for line in f:
                if not line.strip():
                    continue
                entry = json.loads(line)
                key = entry.get("key") or json.dumps(entry.get("instance"))[:200]
                prediction = entry.get("prediction")
                if isinstance(prediction, dict) and len(prediction) == 1:  # a signature with one named output
                    prediction = next(iter(prediction.values()))
                if "error" in entry or not isinstance(prediction, list) or len(prediction) != len(class_names):
                    error = entry.get("error") or {}
                    writer.error(key, f"Vertex AI: {error.get('message', error) or 'no prediction'}")
                    continue
                keys.append(key)
                rows.append(prediction)
                if len(keys) >= batch_size:
                    flush()
        flush()
        writer.commit({"chunk": index, "fingerprint": f"vertex:{path}", "inputs": writer.count + writer.errors})
        for key, value in (("count", writer.count), ("errors", writer.errors), ("inputs", writer.count + writer.errors)):
            totals[key] += value
    totals["chunks"] = len(files)
    return totals


def vertex_batch_predict(model_dir: str, vertex_model: str, source: str, output_dir: str, *, client,
                         staging_uri: str, storage_root: str | None = None, top_k: int = 3,
                         machine_type: str = "n1-standard-4", accelerator_type: str = "", accelerator_count: int = 0,
                         replicas: int = 1, max_replicas: int = 1, poll_seconds: float = 30.0,
                         timeout_seconds: float = 24 * 3600, sleep=None) -> PredictResult:
    """Batch prediction on Vertex AI for a model registered there, with the same inputs and outputs as `predict`.

    The instances file is built here from the inputs (`staging_uri/instances.jsonl`, a gs:// location the job
    can read), the job writes under `staging_uri/results/`, and its results are turned into predictions.jsonl,
    predictions.csv and errors.jsonl in `output_dir`. `model_dir` is the trained model's directory (local or
    gs://), for the image size, the class names and the serving input's name. `storage_root`, when given, is
    where gs:// is mounted (`/gcs` under Vertex AI Pipelines' GCS FUSE): gs://BUCKET/PATH is read and written as
    STORAGE_ROOT/BUCKET/PATH; otherwise gs:// is used directly.
    """
    if not staging_uri.startswith("gs://"):
        raise ValueError(f"The staging location must be a gs:// folder Vertex AI can read and write, got {staging_uri}")
    start = time.monotonic()

    def local(uri: str) -> str:
        return os.path.join(storage_root, uri[len("gs://"):]) if storage_root and uri.startswith("gs://") else uri

    classifier_info = data.load_classifier(model_dir)
    input_name = serving_input_name(model_dir)
    staging_uri = staging_uri.rstrip("/")
    instances_uri = f"{staging_uri}/instances.jsonl"
    data.gfile().makedirs(local(staging_uri))
    data.gfile().makedirs(data.join(output_dir, SHARDS))
    built = write_vertex_instances(source, local(instances_uri), data.join(output_dir, "instance-errors.jsonl"),
                                   classifier_info.image_shape, input_name, exclude=output_dir)
    log.info("predict: %d instances in %s (%d inputs could not be read)", built["instances"], instances_uri,
             built["errors"])
    if built["instances"] == 0:
        raise data.DataError(f"No image in {source} could be read ({built['errors']} inputs failed; see "
                             f"{data.join(output_dir, 'instance-errors.jsonl')})")
    job = run_vertex_batch_job(client, model=vertex_model, instances_uri=instances_uri,
                               output_uri_prefix=f"{staging_uri}/results", display_name=f"predict-{int(time.time())}",
                               machine_type=machine_type, accelerator_type=accelerator_type,
                               accelerator_count=accelerator_count, replicas=replicas, max_replicas=max_replicas,
                               poll_seconds=poll_seconds, timeout_seconds=timeout_seconds, sleep=sleep)
    totals = read_vertex_predictions(local(job.output_info.gcs_output_directory), output_dir,
                                     classifier_info.class_names, top_k=top_k)
    _remove_stale_shards(output_dir, totals["chunks"])
    # Inputs that never became instances are errors too: they lead errors.jsonl.
    _copy_lines([data.join(output_dir, "instance-errors.jsonl")]
                + [shard_paths(output_dir, i)["errors"] for i in range(totals["chunks"])],
                data.join(output_dir, "all-errors.jsonl"))
    totals["errors"] += built["errors"]
    totals["inputs"] += built["errors"]
    seconds = time.monotonic() - start
    where = resolve_source(source)
    path = _gather(output_dir, totals["chunks"], totals, classifier_info.class_names, where, combine_max=1_000_000,
                   seconds=seconds, rate=totals["inputs"] / seconds, skipped=0)
    _rename(data.join(output_dir, "all-errors.jsonl"), data.join(output_dir, "errors.jsonl"))
    return PredictResult(output_dir, path, totals["count"], totals["errors"], totals["chunks"], 0, seconds,
                         totals["inputs"] / seconds)


# ---------------------------------------------------------------------------------------------- samples


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


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The prediction options shared by this module's CLI and `pipectl predict`."""
    parser.add_argument("--batch-size", type=int,
                        help="images per model call (default: from the image size, 512 for 28x28, 128 for 224x224x3)")
    parser.add_argument("--top-k", type=int, default=3, help="classes kept per image (default: %(default)s)")
    parser.add_argument("--chunk-size", type=int, default=10_000,
                        help="inputs per output shard, the unit of restart (default: %(default)s)")
    parser.add_argument("--print-first", type=int, default=1000,
                        help="print this many predictions in full, then progress lines (default: %(default)s)")
    vertex = parser.add_argument_group("on Vertex AI (a BatchPredictionJob instead of this machine)")
    vertex.add_argument("--vertex-model", metavar="RESOURCE",
                        help="the registered model: projects/P/locations/L/models/ID[@VERSION_OR_ALIAS]")
    vertex.add_argument("--staging", metavar="GS_URI", help="gs:// folder for the instances file and the job's output")
    vertex.add_argument("--machine-type", default="n1-standard-4", help="default: %(default)s")
    vertex.add_argument("--accelerator-type", default="", help="e.g. NVIDIA_TESLA_T4 (default: none)")
    vertex.add_argument("--accelerator-count", type=int, default=0)
    vertex.add_argument("--max-replicas", type=int, default=1, help="workers the job may scale to (default: 1)")


def predict_from_args(args: argparse.Namespace, model_dir: str, images: str, output_dir: str) -> PredictResult:
    """Runs what the options of `add_arguments` ask for: here, or as a Vertex AI batch prediction job."""
    if not args.vertex_model:
        return predict(model_dir, images, output_dir, batch_size=args.batch_size, top_k=args.top_k,
                       chunk_size=args.chunk_size, print_first=args.print_first)
    if not args.staging:
        raise ValueError("--vertex-model needs --staging gs://BUCKET/FOLDER for the instances and the job's output")
    location = re.match(r"^projects/[^/]+/locations/([^/]+)/", args.vertex_model)
    if not location:
        raise ValueError(f"Not a Vertex AI model resource name: {args.vertex_model!r}")
    return vertex_batch_predict(model_dir, args.vertex_model, images, output_dir,
                                client=gcp.job_client(location.group(1)), staging_uri=args.staging,
                                top_k=args.top_k, machine_type=args.machine_type,
                                accelerator_type=args.accelerator_type, accelerator_count=args.accelerator_count,
                                max_replicas=args.max_replicas)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Classify every image of a folder, glob, manifest or TFRecord "
                                                 "shards with a trained model.")
    parser.add_argument("--model-dir", required=True, help="output of train (or an exported SavedModel)")
    parser.add_argument("--images", required=True,
                        help="folder (recursive), glob, manifest (.txt/.csv/.jsonl) or TFRecord shards; local or gs://")
    parser.add_argument("--output-dir", required=True)
    add_arguments(parser)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    try:
        result = predict_from_args(args, args.model_dir, args.images, args.output_dir)
    except (data.DataError, ValueError, VertexBatchError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    json.dump(result.to_json(), sys.stdout, indent=2)
    print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
