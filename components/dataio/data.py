"""Readers and writers shared by the steps: idx files, TFRecord shards, the dataset manifest.

A dataset directory (the `Dataset` artifact of preprocess and augment) holds:

    dataset.json                 class names, image shape, per-split counts and shard locations, rejected
                                 counts per reason, pixel mean/std of the train split
    train/train-00000-of-00004.tfrecord ...
    validation/...  test/...
    rejected.jsonl               inputs that could not be used: {"uri", "reason", "detail"} per line
    samples.png                  the first training images of each class, one row per class (dataset card;
                                 samples.jpg for photo datasets)

Each record is a `tf.train.Example` with `image`, `label` (int64) and `uri` (where the image came from).
How `image` holds the pixels is the manifest's `image_encoding`:

    raw       uint8 bytes, HxWxC: images below ENCODED_MIN_SIZE (64) px, e.g. the 28x28 reference workload; a
              few hundred bytes that readers take as they are, with nothing to decode
    png       PNG (lossless): sources whose pixels are exact (PNG/BMP/GIF/TIFF files, idx, tfds arrays)
    jpeg      JPEG at quality JPEG_QUALITY (95): lossy sources (JPEG, WebP files), where a lossless copy would
              store the source's compression noise at ~5x the size (224x224 photo-like images: 15.6 KB as
              JPEG, 87 KB as PNG) for no accuracy
    encoded   a mix of the two (a folder of PNGs and JPEGs), told apart by their first bytes
    source    image files (a folder or manifest of them, from 64 px): each JPEG or PNG file's bytes as they are,
              at the file's own size; re-encoded once only what TensorFlow's decoders cannot read to the same
              pixels (other formats, CMYK/palette/alpha/16-bit, EXIF-rotated) or what is larger than the
              manifest's `max_side` (scaled to fit it). Readers decode and resize to `image_shape` with
              `decode_to_shape`, the one rule shared by evaluation, training and batch prediction; training's
              random resized crop decodes only its crop of the source (`decode_crop_to_shape`). docs/photos.md

A 224x224 RGB photo is 150,528 bytes raw and a tenth of that as JPEG, so for photos the encoded form cuts the
shards (and the read I/O) several times; tf.data decodes them in parallel on the way to the model. Every reader
goes through `record_parser` (or `decode_record_image`), so the encoding is decided here only. A manifest
without the key (older datasets) holds raw records.
Paths may be local or `gs://` (everything goes through `tf.io.gfile`).
"""

from __future__ import annotations

import dataclasses
import functools
import gzip
import io
import json
import math
import os
import struct
from typing import Iterable, Iterator

import numpy as np

from components.params import DEFAULT_SOURCE  # noqa: F401 (readers name the default source as data.DEFAULT_SOURCE)
from components.dataio.storage import (  # noqa: F401 (readers use them as data.join, ...)
    DataError, gfile, glob, glob_regex, join, locate, tensorflow_or_none)
from components import gpu_driver
from components.dataio import pixels, records  # TFRecords and record images without TensorFlow (import none of it)

FASHION_MNIST_CLASSES = [
    "T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot",
]
MANIFEST = records.MANIFEST
REJECTED = "rejected.jsonl"
SPLITS = ("train", "validation", "test")
TARGET_SHARD_BYTES = 128 << 20  # within the 100-200 MB that object stores and tf.data readers like

# Record image encodings (see the module docstring) and when each is used.
RAW, PNG, JPEG, ENCODED, SOURCE = "raw", "png", "jpeg", "encoded", "source"
IMAGE_ENCODINGS = (RAW, PNG, JPEG, ENCODED, SOURCE)
# Source records: files with a side above max_side are scaled down to it once, in preprocess. The photo recipe's
# smallest crop (8% of the area) is 0.28 of each side: at 4x the model's size it still holds about the model's
# pixels, so no crop is upsampled much, while a 4000x3000 camera JPEG shrinks to a 896x672 one.
SOURCE_MAX_SIDE_FACTOR = 4
ENCODED_MIN_SIZE = 64
from components.dataio.images import JPEG_QUALITY, LOSSY_FORMATS  # noqa: E402 (images imports nothing from here)


# ---------------------------------------------------------------------------------------------- idx


def read_idx(path: str) -> np.ndarray:
    """Reads an MNIST-format idx file (optionally gzipped) into an array, validating its header."""
    opener = gzip.open if path.endswith(".gz") else open
    try:
        with opener(path, "rb") as f:
            raw = f.read()
    except (OSError, EOFError) as e:
        raise DataError(f"Cannot read idx file {path}: {e}") from e
    if len(raw) < 4:
        raise DataError(f"{path} is too short to be an idx file ({len(raw)} bytes)")
    zero, dtype_code, ndim = struct.unpack(">HBB", raw[:4])
    if zero != 0 or dtype_code != 0x08:
        raise DataError(f"{path} is not an unsigned-byte idx file (magic {raw[:4].hex()})")
    dims = struct.unpack(f">{ndim}I", raw[4:4 + 4 * ndim])
    expected = int(np.prod(dims)) if dims else 0
    body = raw[4 + 4 * ndim:]
    if len(body) != expected:
        raise DataError(f"{path} is truncated or padded: header says {dims} ({expected} bytes), found {len(body)}")
    return np.frombuffer(body, dtype=np.uint8).reshape(dims)


@dataclasses.dataclass
class IdxPair:
    split: str  # "train" or "test"
    images: str
    labels: str


def find_idx_pairs(directory: str) -> list[IdxPair]:
    """Finds `PREFIX-images-idx3-ubyte[.gz]` / `PREFIX-labels-idx1-ubyte[.gz]` pairs in a directory."""
    names = sorted(os.listdir(directory))
    pairs = []
    for name in names:
        if "-images-idx3-ubyte" not in name:
            continue
        prefix = name.split("-images-idx3-ubyte")[0]
        suffix = name.split("-images-idx3-ubyte")[1]
        label_name = next((n for n in (f"{prefix}-labels-idx1-ubyte{suffix}", f"{prefix}-labels-idx1-ubyte",
                                       f"{prefix}-labels-idx1-ubyte.gz") if n in names), None)
        if label_name is None:
            raise DataError(f"{join(directory, name)} has no matching labels file {prefix}-labels-idx1-ubyte[.gz]")
        split = "test" if prefix in ("t10k", "test") else "train"
        pairs.append(IdxPair(split, join(directory, name), join(directory, label_name)))
    return pairs


def idx_class_names(directory: str, num_classes: int) -> list[str]:
    """Class names for an idx directory: `classes.txt` when present, Fashion-MNIST's names for that dataset,
    else the label numbers."""
    listed = os.path.join(directory, "classes.txt")
    if os.path.exists(listed):
        with open(listed) as f:
            names = [line.strip() for line in f if line.strip()]
        if len(names) < num_classes:
            raise DataError(f"{listed} lists {len(names)} classes but the labels go up to {num_classes - 1}")
        return names
    if "fashion" in os.path.abspath(directory).lower() and num_classes <= len(FASHION_MNIST_CLASSES):
        return FASHION_MNIST_CLASSES[:max(num_classes, 10)]
    return [str(i) for i in range(num_classes)]


# ---------------------------------------------------------------------------------------------- split


def num_shards_for(num_images: int, image_bytes: int, *, min_shards: int = 1, uri_bytes: int = 100) -> int:
    """Enough shards to keep each near TARGET_SHARD_BYTES (128 MB), at least `min_shards` (one per reader that
    shares the split), never more than there are images."""
    if num_images <= 0:
        return 1
    record_bytes = image_bytes + uri_bytes + 48  # + Example framing and the TFRecord length/CRC header
    by_size = math.ceil(num_images * record_bytes / TARGET_SHARD_BYTES)
    return max(1, min(num_images, max(by_size, min_shards)))


# ---------------------------------------------------------------------------------------------- TFRecord


def record_encoding(image_size: int, source_format: str | None = None) -> str:
    """How one record's image is stored: raw below ENCODED_MIN_SIZE px, else the source file for image files
    (`source_format` is PIL's name, e.g. "JPEG") and PNG for decoded arrays (idx and tfds: None)."""
    if image_size < ENCODED_MIN_SIZE:
        return RAW
    return PNG if source_format is None else SOURCE


def dataset_encoding(used: Iterable[str]) -> str:
    """The manifest's `image_encoding` from the encodings its records use."""
    kinds = set(used) or {RAW}
    if len(kinds) == 1:
        return kinds.pop()
    if RAW in kinds:
        raise ValueError(f"raw and encoded records cannot share a dataset ({sorted(kinds)})")
    return SOURCE if SOURCE in kinds else ENCODED  # source records' reader takes PNGs/JPEGs of any size


def manifest_encoding(manifest: dict) -> str:
    """A manifest's `image_encoding`; datasets written before the key existed hold raw records."""
    encoding = manifest.get("image_encoding", RAW)
    if encoding not in IMAGE_ENCODINGS:
        raise DataError(f"Unknown image_encoding {encoding!r} in {MANIFEST} (known: {', '.join(IMAGE_ENCODINGS)}); "
                        "was the dataset written by a newer version?")
    return encoding


def encode_image(image: np.ndarray, encoding: str) -> bytes:
    """The bytes a record stores for a uint8 HxWxC image (see the module docstring for the encodings)."""
    if encoding == RAW:
        return np.ascontiguousarray(image).tobytes()
    import io

    from PIL import Image

    pil = Image.fromarray(image[..., 0] if image.shape[-1] == 1 else image)
    buffer = io.BytesIO()
    if encoding == PNG:
        # Level 1: on 224x224 photo-like images 14% larger than the default level 6 (98 vs 87 KB) in 64% of the
        # time (6.8 vs 10.7 ms); encoding runs once per image in the decode workers, where it is the cost.
        pil.save(buffer, "PNG", compress_level=1)
    elif encoding == JPEG:
        pil.save(buffer, "JPEG", quality=JPEG_QUALITY)
    else:
        raise ValueError(f"Cannot encode a record as {encoding!r} (use raw, png or jpeg)")
    return buffer.getvalue()


def encode_example(image: np.ndarray | bytes, label: int, uri: str) -> bytes:
    """A serialized `tf.train.Example` {image: bytes, label: int64, uri: bytes}. `image` is the stored form
    (`encode_image`), or an array stored raw. Written in the wire format by records.encode_example (the bytes
    tf.train.Example serializes, without TensorFlow: decode workers build records too)."""
    return records.encode_example(image if isinstance(image, bytes) else np.ascontiguousarray(image).tobytes(),
                                  label, uri)


class ShardWriter:
    """Writes records round-robin into `DIR/SPLIT/SPLIT-IIIII-of-NNNNN.tfrecord` (a glob on `SPLIT-*` finds them).

    The shard count is fixed up front from the expected number of records; when fewer arrive (inputs rejected),
    the empty shards are removed on close and the rest renamed to the real count, so readers never see an
    empty shard and `-of-N` stays true. `encoding` is how `write` stores the arrays it is given; `encodings`
    collects what was written (`dataset_encoding` makes the manifest's key of it).
    """

    def __init__(self, dataset_dir: str, split: str, num_shards: int, *, encoding: str = RAW):
        import tensorflow as tf

        self.split = split
        self.encoding = encoding
        self.encodings: set[str] = set()
        self.directory = join(dataset_dir, split)
        tf.io.gfile.makedirs(self.directory)
        self.paths = [self._name(i, num_shards) for i in range(num_shards)]
        self._writers = [tf.io.TFRecordWriter(p) for p in self.paths]
        self.count = 0
        self.bytes = 0
        self.class_counts: dict[int, int] = {}

    def _name(self, index: int, total: int) -> str:
        return join(self.directory, f"{self.split}-{index:05d}-of-{total:05d}.tfrecord")

    def write(self, image: np.ndarray, label: int, uri: str) -> None:
        self.write_record(encode_example(encode_image(image, self.encoding), label, uri), label, self.encoding)

    def write_record(self, record: bytes, label: int, encoding: str = RAW) -> None:
        """Writes an already serialized example (see `encode_example`) whose image is stored as `encoding`."""
        self._writers[self.count % len(self._writers)].write(record)
        self.encodings.add(encoding)
        self.count += 1
        self.bytes += len(record)
        self.class_counts[int(label)] = self.class_counts.get(int(label), 0) + 1

    def close(self) -> None:
        for w in self._writers:
            w.close()
        used = max(1, min(self.count, len(self.paths)))
        if used < len(self.paths):
            for path in self.paths[used:]:
                gfile().remove(path)
            renamed = [self._name(i, used) for i in range(used)]
            for old, new in zip(self.paths[:used], renamed):
                gfile().rename(old, new, overwrite=True)
            self.paths = renamed

    def summary(self) -> dict:
        return {"path": self.split, "pattern": f"{self.split}-*.tfrecord", "num_shards": len(self.paths),
                "count": self.count, "bytes": self.bytes,
                "class_counts": {str(k): v for k, v in sorted(self.class_counts.items())}}


def split_files(dataset_dir: str, split: str) -> list[str]:
    """The shard files of a split, resolving splits that live elsewhere (see `locate`): records.split_files, with
    the manifest read through gfile()."""
    return records.split_files(dataset_dir, split, read_manifest(dataset_dir))


def decode_record_image(image_bytes, image_shape, encoding: str):
    """The uint8 HxWxC tensor of a record's stored image (a scalar string tensor), for tf.data maps: the one
    place that knows how each `image_encoding` is decoded. The shape is checked (reshape) against the manifest's."""
    import tensorflow as tf

    height, width, channels = image_shape
    if encoding == SOURCE:
        return decode_to_shape(image_bytes, image_shape)
    if encoding == RAW:
        image = tf.io.decode_raw(image_bytes, tf.uint8)
    elif encoding == PNG:
        image = tf.io.decode_png(image_bytes, channels=channels)
    elif encoding == JPEG:  # the exact integer DCT, as PIL decoded the sources preprocess took as they were
        image = tf.io.decode_jpeg(image_bytes, channels=channels, dct_method="INTEGER_ACCURATE")
    elif encoding == ENCODED:
        image = tf.cond(_is_jpeg(image_bytes),
                        lambda: tf.io.decode_jpeg(image_bytes, channels=channels, dct_method="INTEGER_ACCURATE"),
                        lambda: tf.io.decode_png(image_bytes, channels=channels))
    else:
        raise DataError(f"Unknown image_encoding {encoding!r} (known: {', '.join(IMAGE_ENCODINGS)})")
    return tf.reshape(image, [height, width, channels])


def _is_jpeg(contents):
    import tensorflow as tf

    return tf.equal(tf.strings.substr(contents, 0, 3), b"\xff\xd8\xff")


DCT_RATIOS = (1, 2, 4, 8)  # the scales libjpeg decodes at (1/ratio), as tf.io.decode_jpeg's `ratio`


def decode_to_shape(contents, image_shape):
    """The resize rule: a JPEG or PNG file's bytes (scalar string tensor, any size) -> uint8 HxWxC at
    `image_shape`. JPEGs decode at the smallest DCT scale (1/2, 1/4, 1/8) that keeps both sides at least the
    target's, then `resize_to_shape`. Evaluation, training without a crop and batch prediction all decode
    through this function, so one file gives the same pixels in each (tests/test_photos.py checks)."""
    import tensorflow as tf

    height, width, channels = image_shape

    def jpeg():
        size = tf.io.extract_jpeg_shape(contents)
        # libjpeg's scaled size is ceil(side / ratio); ratios that keep both sides >= the target's form a prefix
        fits = [tf.logical_and((size[0] + r - 1) // r >= height, (size[1] + r - 1) // r >= width)
                for r in DCT_RATIOS[1:]]
        index = tf.add_n([tf.cast(f, tf.int32) for f in fits])
        branches = [lambda r=r: tf.io.decode_jpeg(contents, channels=channels, ratio=r,
                                                  dct_method="INTEGER_ACCURATE") for r in DCT_RATIOS]
        return tf.switch_case(index, branches)

    image = tf.cond(_is_jpeg(contents), jpeg, lambda: tf.io.decode_png(contents, channels=channels))
    return resize_to_shape(image, image_shape)


@functools.lru_cache(maxsize=8)
def file_decoder(image_shape: tuple[int, int, int]):
    """decode_to_shape as a function traced once, for decoding files one at a time outside tf.data (eagerly, its
    conds and switch cost tens of ms a call): bytes -> uint8 numpy array."""
    import tensorflow as tf

    decode = tf.function(lambda contents: decode_to_shape(contents, list(image_shape)),
                         input_signature=[tf.TensorSpec([], tf.string)], autograph=False)
    return lambda contents: decode(tf.constant(contents)).numpy()


# Antialiased resizing from this shrink factor on (per side); below it plain bilinear (see resize_to_shape).
ANTIALIAS_FROM = 3.0


def resize_to_shape(image, image_shape, *, antialias: bool | None = None):
    """uint8 HxWxC of any size -> `image_shape`, bilinear, rounded; an image already of that size is returned as it
    is. `antialias` None (the readers' rule): a box wide enough to average every source pixel only where a side
    shrinks by ANTIALIAS_FROM or more (a large PNG, a panorama JPEG whose short side allows no DCT scale); below
    that, plain bilinear, whose 2x2 taps still reach most source pixels. After decode_to_shape's DCT scaling a
    JPEG is within about 2x of the target, where TensorFlow's antialiased kernel cost 1.5-3 ms a photo against
    0.5 ms for plain bilinear, a third of the whole decode (docs/photos.md); training's crops are resized plainly
    too."""
    import tensorflow as tf

    height, width, channels = image_shape
    image = tf.ensure_shape(image, [None, None, channels])
    size = tf.shape(image)

    def resize(smooth: bool):
        resized = tf.image.resize(image, [height, width], method="bilinear", antialias=smooth)
        return tf.cast(tf.clip_by_value(tf.round(resized), 0.0, 255.0), tf.uint8)

    def shrink():
        if antialias is not None:
            return resize(antialias)
        far = tf.logical_or(size[0] >= int(ANTIALIAS_FROM * height), size[1] >= int(ANTIALIAS_FROM * width))
        return tf.cond(far, lambda: resize(True), lambda: resize(False))

    same = tf.logical_and(tf.equal(size[0], height), tf.equal(size[1], width))
    return tf.reshape(tf.cond(same, lambda: image, shrink), [height, width, channels])


def decode_crop_to_shape(contents, image_shape, crop_box):
    """A crop of a JPEG or PNG file's bytes at `image_shape`: crop_box is [top, left, height, width] in the
    file's pixels (int32). JPEGs decode only the crop's blocks (tf.io.decode_and_crop_jpeg, the ImageNet input
    pipelines' op); then plain bilinear resizing, as those pipelines do for their training crops: antialiasing a
    crop of up to 1792 px down to 224 measured 11 ms against 0.6 ms, more than the decode itself, for a random
    augmentation that needs no exact pixels."""
    import tensorflow as tf

    channels = image_shape[2]
    image = tf.cond(_is_jpeg(contents),
                    lambda: tf.io.decode_and_crop_jpeg(contents, crop_box, channels=channels,
                                                       dct_method="INTEGER_ACCURATE"),
                    lambda: tf.slice(tf.io.decode_png(contents, channels=channels),
                                     tf.stack([crop_box[0], crop_box[1], 0]),
                                     tf.stack([crop_box[2], crop_box[3], channels])))
    return resize_to_shape(image, image_shape, antialias=False)


def source_shape(contents, channels: int):
    """[height, width, channels] (int32) of a JPEG or PNG file's bytes, from its header (no pixels decoded)."""
    import tensorflow as tf

    return tf.cond(_is_jpeg(contents),
                   lambda: tf.concat([tf.io.extract_jpeg_shape(contents)[:2], [channels]], 0),
                   lambda: tf.concat([tf.reverse(tf.io.decode_raw(tf.strings.substr(contents, 16, 8), tf.int32,
                                                                  little_endian=False), [0]), [channels]], 0))


def record_parser(manifest: dict, *, with_uri: bool = False):
    """A tf.data map function: serialized record -> (image uint8 HxWxC, label int32[, uri]) for the dataset
    whose manifest this is (its image_shape and image_encoding). Every reader of the shards uses it."""
    import tensorflow as tf

    shape, encoding = list(manifest["image_shape"]), manifest_encoding(manifest)
    spec = {"image": tf.io.FixedLenFeature([], tf.string), "label": tf.io.FixedLenFeature([], tf.int64),
            "uri": tf.io.FixedLenFeature([], tf.string, default_value="")}

    def parse(record):
        ex = tf.io.parse_single_example(record, spec)
        image = decode_record_image(ex["image"], shape, encoding)
        label = tf.cast(ex["label"], tf.int32)
        return (image, label, ex["uri"]) if with_uri else (image, label)

    return parse


def read_split(dataset_dir: str, split: str, *, with_uri: bool = False, shuffle_files_seed: int | None = None):
    """A tf.data.Dataset of (image uint8 HxWxC, label int32[, uri]) from a split's shards."""
    import tensorflow as tf

    manifest = read_manifest(dataset_dir)
    files = split_files(dataset_dir, split)
    ds = tf.data.Dataset.from_tensor_slices(files)
    if shuffle_files_seed is not None:
        ds = ds.shuffle(len(files), seed=shuffle_files_seed)
    ds = ds.interleave(tf.data.TFRecordDataset, cycle_length=min(len(files), 8),
                       num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    return ds.map(record_parser(manifest, with_uri=with_uri), num_parallel_calls=tf.data.AUTOTUNE,
                  deterministic=True)


def read_records(dataset_dir: str, split: str):
    """A tf.data.Dataset of (serialized record, label int64) of a split, in read_split's order: for copying
    records as they are (no decode and re-encode, which would compress a JPEG twice)."""
    import tensorflow as tf

    files = split_files(dataset_dir, split)
    ds = tf.data.Dataset.from_tensor_slices(files).interleave(
        tf.data.TFRecordDataset, cycle_length=min(len(files), 8), num_parallel_calls=tf.data.AUTOTUNE,
        deterministic=True)
    spec = {"label": tf.io.FixedLenFeature([], tf.int64)}
    return ds.map(lambda record: (record, tf.io.parse_single_example(record, spec)["label"]),
                  num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)


def load_split_arrays(dataset_dir: str, split: str, limit: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """A whole split as numpy arrays (images uint8 NxHxWxC, labels int32). For evaluation-sized splits. Where
    TensorFlow is not installed, the same arrays from the TensorFlow-free readers."""
    if tensorflow_or_none() is None:
        return _split_arrays_without_tensorflow(dataset_dir, split, limit)
    ds = read_split(dataset_dir, split)
    if limit is not None:
        ds = ds.take(limit)
    images, labels = [], []
    for image_batch, label_batch in ds.batch(4096).as_numpy_iterator():
        images.append(image_batch)
        labels.append(label_batch)
    if not images:
        raise DataError(f"The {split} split of {dataset_dir} is empty")
    return np.concatenate(images), np.concatenate(labels)


def iter_split(dataset_dir: str, split: str) -> Iterator[tuple[np.ndarray, int]]:
    """(image uint8 HxWxC, label) of a split in read_split's order, one at a time, with or without TensorFlow."""
    if tensorflow_or_none() is not None:
        for image, label in read_split(dataset_dir, split).as_numpy_iterator():
            yield image, int(label)
        return
    manifest = read_manifest(dataset_dir)
    shape, encoding = list(manifest["image_shape"]), manifest_encoding(manifest)
    for record in records.interleave(records.split_files(dataset_dir, split, manifest)):
        contents, label = records.image_label(record)
        yield pixels.decode_record_image(contents, shape, encoding), label


def _split_arrays_without_tensorflow(dataset_dir: str, split: str, limit: int | None) -> tuple[np.ndarray, np.ndarray]:
    images, labels = [], []
    for image, label in iter_split(dataset_dir, split):
        if limit is not None and len(images) >= limit:
            break
        images.append(image)
        labels.append(label)
    if not images:
        raise DataError(f"The {split} split of {dataset_dir} is empty")
    return np.stack(images), np.asarray(labels, np.int32)


# ---------------------------------------------------------------------------------------------- manifest


def write_json(path: str, obj) -> None:
    with gfile().GFile(path, "w") as f:
        f.write(json.dumps(obj, indent=2, sort_keys=True) + "\n")


def read_manifest(dataset_dir: str) -> dict:
    return records.read_manifest(dataset_dir, gfile())


def iter_jsonl(path: str) -> Iterator[dict]:
    if not gfile().exists(path):
        return
    with gfile().GFile(path) as f:
        for line in f:
            if line.strip():
                yield json.loads(line)


def batched(items: Iterable, size: int) -> Iterator[list]:
    batch = []
    for item in items:
        batch.append(item)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch


# ---------------------------------------------------------------------------------------------- images

# Image files (decoding, reading, listing, PNG/grid helpers) live in components/dataio/images.py; readers use them
# from here.
from components.dataio.images import (  # noqa: E402,F401
    CORRUPT, EMPTY_FILE, IMAGE_EXTENSIONS, IMAGE_FORMATS, MAX_IMAGE_PIXELS, NOT_AN_IMAGE, TOO_LARGE, UNREADABLE,
    UNSUPPORTED_FORMAT, UNSUPPORTED_MODE, ImageError, decode_image, decode_image_file, decode_source, encode_png,
    available_cpus, count_files, list_files, near_key, near_keys, read_bytes, source_near_key, tile)


# ---------------------------------------------------------------------------------------------- models


# What a model directory holds for serving (training.json's "serving_format"): model.keras and a SavedModel, or,
# for a torch.nn.Module trained on PyTorch, TorchScript (components/train/frameworks/torch.py).
KERAS_SAVED_MODEL = "keras+saved_model"
TORCHSCRIPT = "torchscript"
TORCHSCRIPT_FILE = "model.torchscript.pt"


@dataclasses.dataclass
class Classifier:
    """A trained model ready for inference: raw uint8/float pixels in, class probabilities out."""

    predict_proba: object  # callable: uint8 or float32 NxHxWxC (0-255) -> N x classes numpy array
    image_shape: list[int]
    class_names: list[str]
    source: str
    device: str = "CPU"  # where it runs, for the log: "CPU", "1 GPU(s)"
    # The model's content digest (components/registry/identity.py), where the caller knows it: batch prediction
    # takes it from the model's directory, or from here for a classifier handed in without one.
    digest: str = ""


def _tensorflow_device(tf) -> str:
    gpus = tf.config.list_physical_devices("GPU")
    return f"{len(gpus)} GPU(s)" if gpus else "CPU"


def load_classifier(model_dir: str) -> Classifier:
    """Loads the output of train (`model.keras` + `training.json`; `model.torchscript.pt` where training.json's
    serving_format is torchscript), or a bare exported SavedModel directory."""
    info_path = join(model_dir, "training.json")
    keras_path = join(model_dir, "model.keras")
    info = None
    if gfile().exists(info_path):
        with gfile().GFile(info_path) as f:
            info = json.load(f)
    if info is not None and info.get("serving_format") == TORCHSCRIPT:
        return _torchscript_classifier(model_dir, info)
    tf = tensorflow_or_none()
    if tf is None:  # the PyTorch image: model.keras on Keras' own backend; a SavedModel needs TensorFlow
        return _keras_classifier_without_tensorflow(model_dir, keras_path, info)

    if gfile().exists(keras_path) and info is not None:
        import keras

        _import_builder_module(info)
        model = keras.models.load_model(keras_path, compile=False)

        @tf.function(reduce_retracing=True)
        def probabilities(images):
            return tf.nn.softmax(model(images, training=False), axis=-1)

        # uint8 batches cross into TensorFlow as they are and are cast there: a quarter of the bytes to copy
        return Classifier(lambda x: probabilities(tf.cast(tf.convert_to_tensor(x), tf.float32)).numpy(),
                          list(info["image_shape"]), list(info["class_names"]), keras_path, _tensorflow_device(tf))
    saved = join(model_dir, "saved_model") if gfile().exists(join(model_dir, "saved_model")) else model_dir
    if not gfile().exists(join(saved, "saved_model.pb")):
        raise DataError(f"No model found in {model_dir} (looked for model.keras + training.json, or saved_model.pb)")
    loaded = tf.saved_model.load(saved)
    serve = loaded.signatures["serving_default"]
    spec = list(serve.structured_input_signature[1].values())[0]
    output_key = list(serve.structured_outputs)[0]
    num_classes = serve.structured_outputs[output_key].shape[-1]
    parent = model_dir if saved != model_dir else os.path.dirname(model_dir.rstrip("/"))
    info_path = join(parent, "training.json")
    class_names = [str(i) for i in range(num_classes)]
    if gfile().exists(info_path):
        with gfile().GFile(info_path) as f:
            class_names = json.load(f)["class_names"]
    return Classifier(lambda x: serve(tf.cast(tf.convert_to_tensor(x), tf.float32))[output_key].numpy(),
                      list(spec.shape[1:]), class_names, saved, _tensorflow_device(tf))


def _import_builder_module(info: dict) -> None:
    """A bring-your-own model's module registers its custom layers, if it has any."""
    builder = (info.get("model") or {}).get("name", "")
    if ":" in builder:
        import importlib

        try:
            importlib.import_module(builder.partition(":")[0])
        except ImportError:
            pass  # a model of built-in layers loads without it; one that needs it says which layer is unknown


def _keras_classifier_without_tensorflow(model_dir: str, keras_path: str, info: dict | None) -> Classifier:
    """model.keras on the backend Keras runs on here (KERAS_BACKEND; torch in the PyTorch image), where TensorFlow
    is not installed: a Keras model trained on any framework loads on any backend."""
    if not (gfile().exists(keras_path) and info is not None):
        raise DataError(f"No model.keras + training.json in {model_dir}, and TensorFlow, which loads a bare "
                        "SavedModel, is not installed here: run this step in an image with TensorFlow")
    os.environ.setdefault("KERAS_BACKEND", "torch")  # Keras' default backend is TensorFlow; the PyTorch image sets it
    if os.environ["KERAS_BACKEND"] == "torch":  # Keras on torch picks its device when imported: the driver first
        import torch

        gpu_driver.check_driver(torch.version.cuda, framework=f"torch {torch.__version__}")
    import keras

    _import_builder_module(info)
    if "://" in keras_path:  # Keras reads URIs only through TensorFlow: a local copy of the file instead
        import tempfile

        with tempfile.TemporaryDirectory() as local:
            gfile().copy(keras_path, os.path.join(local, "model.keras"), overwrite=True)
            model = keras.models.load_model(os.path.join(local, "model.keras"), compile=False)
    else:
        model = keras.models.load_model(keras_path, compile=False)

    def probabilities(images):
        batch = keras.ops.convert_to_tensor(np.asarray(images, dtype=np.float32))
        return keras.ops.convert_to_numpy(keras.ops.softmax(model(batch, training=False), axis=-1))

    device = "CPU"
    if keras.backend.backend() == "torch":
        import torch

        device = f"{torch.cuda.device_count()} GPU(s)" if torch.cuda.is_available() else "CPU"
    return Classifier(probabilities, list(info["image_shape"]), list(info["class_names"]), keras_path, device)


def _torchscript_classifier(model_dir: str, info: dict) -> Classifier:
    """The TorchScript of a torch.nn.Module trained on PyTorch: N x H x W x C pixels in, probabilities out (the
    softmax is inside it); torch alone loads it, on the CPU, without the builder's code."""
    path = join(model_dir, info.get("serving_file") or TORCHSCRIPT_FILE)
    try:
        import torch
    except ImportError as e:
        raise DataError(f"{model_dir} holds a TorchScript model (training.json: serving_format {TORCHSCRIPT}), and "
                        f"PyTorch is not installed here ({e}): run this step where torch is (pip install "
                        "'kfp-image-classification[torch]', or the PyTorch image)") from e
    if not gfile().exists(path):
        raise DataError(f"No {os.path.basename(path)} in {model_dir}, which training.json says holds a TorchScript "
                        "model: is the train step's output complete?")
    with gfile().GFile(path, "rb") as f:
        scripted = torch.jit.load(io.BytesIO(f.read()), map_location="cpu")
    scripted.eval()

    def probabilities(images):
        with torch.no_grad():
            return scripted(torch.from_numpy(np.ascontiguousarray(images, dtype=np.float32))).numpy()

    return Classifier(probabilities, list(info["image_shape"]), list(info["class_names"]), path)
