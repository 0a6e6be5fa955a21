"""From inputs to model pixels: file and TFRecord reading, a JPEG header parser, and the two decoders (the
fast TensorFlow path and the reference path, training's own decoder). Where TensorFlow is not installed (the
PyTorch image), every file takes the reference path, with the TensorFlow-free readers (components/dataio/pixels.py) for
the readers' rule."""

from __future__ import annotations

import concurrent.futures
import functools
import logging
import struct
from typing import Iterator

import numpy as np

from components.dataio import data, pixels, records, storage
from components.dataio.images import jpeg_orientation
from components.predict.sources import Chunk, Unlisted, _is_remote

log = logging.getLogger(__name__)

# TFRecord feature names, in order of preference, for the image bytes and for the name of the image.
RECORD_IMAGE_KEYS = ("image/encoded", "image", "image_raw", "image/raw", "encoded")
RECORD_NAME_KEYS = ("uri", "image/filename", "filename", "image/uri", "image/source_id")
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"

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


def tensorflow_reads_alike(contents: bytes) -> bool:
    """Whether TensorFlow's decoders give the pixels PIL's path (data.decode_image) would before resizing: JPEGs
    of 1 or 3 components without EXIF rotation, 8-bit grayscale or RGB PNGs without transparency. These are the
    files preprocess keeps as they are (images.keep_problem)."""
    if contents.startswith(b"\xff\xd8\xff"):
        shape = jpeg_shape(contents)
        return shape is not None and shape[2] in (1, 3) and jpeg_orientation(contents) == 1
    if contents.startswith(PNG_MAGIC) and len(contents) > 26 and contents[12:16] == b"IHDR":
        depth, colour = contents[24], contents[25]
        data_at = contents.find(b"IDAT")
        return depth == 8 and colour in (0, 2) and b"tRNS" not in contents[:data_at if data_at > 0 else 4096]
    return False


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
        with open(uri, "rb", buffering=0) as f:  # whole, unbuffered: one read into the bytes returned
            return f.read()
    except OSError as e:
        return f"unreadable: {type(e).__name__}: {e.strerror or e}"


@functools.lru_cache(maxsize=16)
def batch_decoder(kind: str, shape: tuple[int, int, int]):
    """A batch of file bytes -> uint8 NxHxWxC, decoded in parallel by TensorFlow: "png" and "jpeg" for files
    already of the model's size, "source" for the readers' rule (data.decode_to_shape). Traced once per process
    and shape (tracing the rule's conditionals took half a second, a sixth of a 720-photo run), not per Decoder."""
    import tensorflow as tf

    channels, parallel = shape[2], 2 * data.available_cpus()
    decode_one = {"png": lambda c: tf.io.decode_png(c, channels=channels),
                  "jpeg": lambda c: tf.io.decode_jpeg(c, channels=channels, dct_method="INTEGER_ACCURATE"),
                  "source": lambda c: data.decode_to_shape(c, list(shape))}[kind]

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string)])
    def decode(contents):
        with tf.device("/CPU:0"):
            return tf.map_fn(lambda c: tf.reshape(decode_one(c), list(shape)), contents,
                             fn_output_signature=tf.uint8, parallel_iterations=parallel)

    return decode


class Decoder:
    """Turns a batch of (key, bytes or reason) into model inputs, exactly as training's decoder would.

    The fast path decodes, with TensorFlow's C++ decoders over a whole batch in parallel, the images that need
    no conversion: 8-bit PNGs of the model's size and colour type, and JPEGs of the model's size and number of
    components (with the exact integer DCT, as Pillow uses; both decode to the same pixels as
    `data.decode_image`). For models of source datasets (from 64 px), JPEGs and PNGs of other sizes that
    TensorFlow reads alike (`tensorflow_reads_alike`) are decoded and resized in the same batches with the readers'
    rule, `data.decode_to_shape`, as evaluation and training read them. Raw pixels of the exact size are taken
    as they are (TFRecord sources). Everything else (other sizes and modes below 64 px, 16-bit, palettes,
    transparency, EXIF rotation, other formats, corrupt files) goes to `data.decode_image` in a thread pool, which
    converts what it can and gives the reason for what it cannot.
    """

    def __init__(self, image_shape: list[int], pool: concurrent.futures.Executor, *, raw_ok: bool = False,
                 gpu_jpeg=None):
        tf = storage.tensorflow_or_none()
        self.height, self.width, self.channels = image_shape
        self.shape = [self.height, self.width, self.channels]
        self.pool = pool
        self.raw_size = self.height * self.width * self.channels if raw_ok else -1
        # An 8-bit PNG of the model's size and colour type starts with exactly these bytes (signature + IHDR).
        self.png_head = PNG_MAGIC + struct.pack(">I4sIIBB", 13, b"IHDR", self.width, self.height, 8,
                                                0 if self.channels == 1 else 2)
        # Without TensorFlow there is no fast path: every file goes to the reference decoder, in the thread pool.
        self._png, self._jpeg, self._source = ((batch_decoder(kind, tuple(self.shape)) if tf else None)
                                               for kind in ("png", "jpeg", "source"))
        # Models of source datasets (from data.ENCODED_MIN_SIZE px) were trained on the readers' rule; smaller ones
        # on preprocess's PIL decode (raw records), which the slow path is.
        self.sources = data.record_encoding(self.width, "file") == data.SOURCE
        self._errors = (tf.errors.InvalidArgumentError, tf.errors.UnknownError) if tf else ()
        # JPEGs of the fast routes decoded on the GPU instead (nvjpeg.GpuJpegDecoder), when given: the readers'
        # rule approximately; a batch it rejects is decoded on the CPU as without it
        self.gpu_jpeg = gpu_jpeg

    def slow(self, contents: bytes) -> np.ndarray | str:
        try:
            return decode_contents(contents, self.height, self.width, self.channels, raw_ok=self.raw_size > 0)
        except data.ImageError as e:
            return str(e)

    def route(self, contents: bytes) -> str:
        if len(contents) == self.raw_size and not contents.startswith((PNG_MAGIC, b"\xff\xd8\xff")):
            return "raw"
        if self._png is None:
            return "slow"
        if contents.startswith(self.png_head):
            return "png"
        if contents.startswith(b"\xff\xd8\xff") and jpeg_shape(contents) == tuple(self.shape):
            return "jpeg" if jpeg_orientation(contents) == 1 else "slow"
        if self.sources and tensorflow_reads_alike(contents):
            return "source"
        return "slow"

    def decode(self, items: list[tuple[str, bytes | str]]) -> tuple[list[str], np.ndarray, list[tuple[str, str]]]:
        """(keys of the decoded images, their pixels uint8 NxHxWxC in input order, (key, reason) of failures)."""
        batch = [None]  # the pixels: allocated when the batch needs more than one decode's output

        def images() -> np.ndarray:
            if batch[0] is None:
                batch[0] = np.empty([len(items), *self.shape], np.uint8)
            return batch[0]

        decoded = np.zeros(len(items), bool)
        routes: dict[str, list[int]] = {"png": [], "jpeg": [], "source": [], "raw": [], "slow": []}
        reasons: dict[int, str] = {}
        for position, (_, contents) in enumerate(items):
            if isinstance(contents, str):
                reasons[position] = contents
            else:
                routes[self.route(contents)].append(position)
        if self.gpu_jpeg is not None and (routes["jpeg"] or routes["source"]):
            self._decode_on_gpu(items, routes, images(), decoded)
        for kind, fast in (("png", self._png), ("jpeg", self._jpeg), ("source", self._source)):
            positions = routes[kind]
            if not positions:
                continue
            try:
                pixels = fast([items[p][1] for p in positions]).numpy()
            except self._errors:  # a corrupt file in the batch: the slow path finds which, and why
                routes["slow"].extend(positions)
                continue
            if len(positions) == len(items):  # the whole batch, in order: its pixels as TensorFlow made them
                batch[0] = pixels
            else:
                images()[positions] = pixels
            decoded[positions] = True
        for position in routes["raw"]:
            images()[position] = np.frombuffer(items[position][1], np.uint8).reshape(self.shape)
            decoded[position] = True
        slow = sorted(routes["slow"])
        for position, result in zip(slow, self.pool.map(self.slow, [items[p][1] for p in slow])):
            if isinstance(result, str):
                reasons[position] = result
            else:
                images()[position] = result
                decoded[position] = True
        keep = np.flatnonzero(decoded)
        return ([items[p][0] for p in keep], images()[keep] if len(keep) < len(items) else images(),
                [(items[p][0], reasons[p]) for p in sorted(reasons)])

    def _decode_on_gpu(self, items: list, routes: dict[str, list[int]], images: np.ndarray,
                       decoded: np.ndarray) -> None:
        """Decodes the JPEGs of the "jpeg" and "source" routes with `gpu_jpeg` and takes them off those routes; a
        batch that fails stays on them (TensorFlow's decoders, then the slow path, say which file and why)."""
        positions = [p for kind in ("jpeg", "source") for p in routes[kind] if items[p][1].startswith(b"\xff\xd8\xff")]
        if not positions:
            return
        try:
            images[positions] = self.gpu_jpeg([items[p][1] for p in positions],
                                              [jpeg_shape(items[p][1]) for p in positions])
        except (RuntimeError, ValueError) as e:  # torchvision's errors for a file nvJPEG cannot decode
            why = str(e).splitlines()[0] if str(e) else type(e).__name__
            if "out of memory" in why.lower():  # the device, not the file: every later batch would fail too
                log.warning("predict: JPEGs decode on the CPU from here on: the GPU decoder ran out of memory (%s)",
                            why)
                self.gpu_jpeg = None
            else:
                log.debug("predict: a batch went back to the CPU decoders (%s)", why)
            return
        decoded[positions] = True
        done = set(positions)
        for kind in ("jpeg", "source"):
            routes[kind] = [p for p in routes[kind] if p not in done]


def decode_contents(contents: bytes, height: int, width: int, channels: int, *, raw_ok: bool = False) -> np.ndarray:
    """The reference, one file at a time: what training's readers make of the file as a source record (the rule,
    data.decode_to_shape, for files TensorFlow reads alike; PIL's data.decode_image for the others, which
    preprocess re-encodes); raw pixels of the exact size when `raw_ok`."""
    if raw_ok and len(contents) == height * width * channels and not contents.startswith((PNG_MAGIC, b"\xff\xd8\xff")):
        return np.frombuffer(contents, np.uint8).reshape(height, width, channels)
    if data.record_encoding(width, "file") == data.SOURCE and tensorflow_reads_alike(contents):
        tf = storage.tensorflow_or_none()
        if tf is None:  # the readers' rule without TensorFlow, as training on torch and JAX reads source records
            try:
                return pixels.decode_to_shape(contents, (height, width, channels))
            except (ValueError, OSError):
                return data.decode_image(contents, height, width, channels)  # corrupt or truncated: PIL says why
        try:
            return data.file_decoder((height, width, channels))(contents)
        except (tf.errors.InvalidArgumentError, tf.errors.UnknownError):
            pass  # corrupt or truncated: PIL says why
    return data.decode_image(contents, height, width, channels)


def _record_image(record: bytes, shard: str, index: int) -> tuple[str, bytes | str]:
    """(name, image bytes) of one serialized record, or (its place, why there is no image): the one rule of which
    features hold a record's image and name, whoever framed the record."""
    try:
        features = records.parse_example(record)
    except data.DataError as e:
        return f"{shard}#{index}", str(e)
    contents = next((features[k][0] for k in RECORD_IMAGE_KEYS
                     if features.get(k) and isinstance(features[k][0], bytes)), None)
    if contents is None:
        return f"{shard}#{index}", f"record has no image feature (looked for {', '.join(RECORD_IMAGE_KEYS)})"
    name = next((features[k][0].decode(errors="replace") for k in RECORD_NAME_KEYS
                 if features.get(k) and isinstance(features[k][0], bytes) and features[k][0]), "")
    return name or f"{shard}#{index}", contents


def iter_records(shard: str) -> Iterator[tuple[str, bytes | str]]:
    """(name, image bytes or the reason there are none) for each record of a shard. A corrupt or truncated
    shard ends with one more item: the shard and what went wrong (nothing after that point can be read).

    The records are framed by TensorFlow's reader where TensorFlow is installed (GZIP shards and every scheme
    tf.io.gfile reads), else by components/dataio/records.py (uncompressed shards, local or gs://); either way
    parsed and read by one rule (`_record_image`)."""
    tf = storage.tensorflow_or_none()
    if tf is None:
        if shard.lower().endswith(".gz"):
            yield shard, "a GZIP-compressed TFRecord shard: reading one needs TensorFlow, which is not installed here"
            return
        framed = records.iter_records(shard)
    else:
        options = tf.io.TFRecordOptions(compression_type="GZIP" if shard.lower().endswith(".gz") else "")
        framed = tf.compat.v1.io.tf_record_iterator(shard, options=options)
    index = 0
    try:
        for record in framed:
            yield _record_image(record, shard, index)
            index += 1
    except Exception as e:  # DataError or OSError; with TensorFlow tf.errors.DataLossError, NotFoundError, ...
        yield shard, f"unreadable after record {index}: {type(e).__name__}: {str(e).splitlines()[0]}"


def read_inputs(uris: list) -> list[bytes | str]:
    return [read_input(uri) for uri in uris]


def iter_batches(chunk: Chunk, batch_size: int, pool: concurrent.futures.Executor,
                 local_parts: int = 2) -> Iterator[list]:
    """Batches of (key, bytes or reason) for one chunk. Files are read in parallel in `pool`: remote ones one
    task each (each waits on the network), local ones in `local_parts` runs of consecutive files (a task per
    small file cost more than the read: 20k 28x28 PNGs took 0.9 s one task each, 0.3 s in two runs)."""
    if chunk.uris is None:
        yield from data.batched(iter_records(chunk.shard), batch_size)
        return
    for uris in data.batched(chunk.uris, batch_size):
        if any(_is_remote(uri) for uri in uris if not isinstance(uri, Unlisted)):
            yield list(zip(uris, pool.map(read_input, uris)))
            continue
        step = -(-len(uris) // max(1, local_parts))
        parts = pool.map(read_inputs, [uris[i:i + step] for i in range(0, len(uris), step)])
        yield list(zip(uris, (contents for part in parts for contents in part)))
