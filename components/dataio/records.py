"""The shards without TensorFlow: TFRecord framing, tf.train.Example, and local or gs:// files read with Python's
own files and google-cloud-storage. The torch and JAX training paths read the datasets through this module, where
TensorFlow is not installed (components/train/portable_input.py); it imports nothing that imports TensorFlow.

TFRecord framing (tensorflow/core/lib/io/record_writer.cc): each record is

    uint64 length (little-endian) | uint32 masked crc32c of the length | data | uint32 masked crc32c of the data

Both checksums are verified, as tf.data's TFRecordDataset does: a corrupt or truncated shard raises DataError naming
the file and the byte offset of the bad record. crc32c is google-crc32c's C extension (a dependency of the project,
as of google-cloud-storage; 6-14 GB/s, where the numpy implementation this module had ran at 0.15 GB/s).

tf.train.Example is parsed by protobuf (its upb runtime; a dependency of the project, as of kfp), with the message
classes built here from the schema of tensorflow/core/example/{example,feature}.proto, so no TensorFlow is needed.
Our own records are written by `encode_example`, which writes the wire format directly: faster than protobuf's
serializer, and byte for byte its deterministic output (tests/test_records.py).
"""

from __future__ import annotations

import functools
import json
import struct
from typing import BinaryIO, Iterator

import google_crc32c

from components.dataio.storage import DataError, LocalFiles, glob, join, locate

_MASK_DELTA = 0xA282EAD8
_READ_BUFFER = 4 << 20
MANIFEST = "dataset.json"  # in every dataset directory: what the splits are and where their shards live


# ---------------------------------------------------------------------------------------------- crc32c


def crc32c(data) -> int:
    return google_crc32c.value(bytes(data) if isinstance(data, memoryview) else data)


def _mask(crc: int) -> int:
    return ((((crc >> 15) | (crc << 17)) & 0xFFFFFFFF) + _MASK_DELTA) & 0xFFFFFFFF


def masked_crc32c(data) -> int:
    """The TFRecord checksum: crc32c rotated right by 15 bits plus a constant (record_writer.h's MaskedCrc)."""
    return _mask(crc32c(data))


def frame(record: bytes) -> bytes:
    """One record as a TFRecord file holds it (for writing shards and tests without TensorFlow)."""
    length = struct.pack("<Q", len(record))
    return length + struct.pack("<I", masked_crc32c(length)) + record + struct.pack("<I", masked_crc32c(record))


# ---------------------------------------------------------------------------------------------- files


def _check_scheme(uri: str) -> None:
    if "://" in uri and not uri.startswith("gs://"):
        raise DataError(f"Cannot read {uri}: without TensorFlow only local paths and gs:// are read")


def open_file(uri: str) -> BinaryIO:
    """A local or gs:// file for reading, buffered (gs://: components/dataio/gcs.py's GFile, ranged reads of
    google-cloud-storage's BlobReader)."""
    _check_scheme(uri)
    try:
        if uri.startswith("gs://"):
            return LocalFiles.GFile(uri, "rb")
        return open(uri, "rb", buffering=_READ_BUFFER)
    except FileNotFoundError:
        raise DataError(f"{uri} does not exist") from None


# ---------------------------------------------------------------------------------------------- TFRecord


def iter_records(uri: str, *, verify: bool = True) -> Iterator[bytes]:
    """The records of one TFRecord file, in order; DataError for a corrupt or truncated one."""
    with open_file(uri) as f:
        yield from _iter_stream(f, uri, verify)


def _iter_stream(f: BinaryIO, uri: str, verify: bool) -> Iterator[bytes]:
    offset = 0
    masked = _mask
    value = google_crc32c.value
    read = f.read
    unpack = _HEADER.unpack
    while True:
        header = read(12)
        if not header:
            return
        if len(header) < 12:
            raise DataError(f"{uri} is truncated: {len(header)} bytes of a record header at byte {offset}")
        length, length_crc = unpack(header)
        if verify and masked(value(header[:8])) != length_crc:  # before reading `length` bytes it may not hold
            raise DataError(f"{uri} is corrupt: the length of the record at byte {offset} fails its checksum")
        body = read(length + 4)
        if len(body) < length + 4:
            raise DataError(f"{uri} is truncated: the record at byte {offset} needs {length + 4} bytes after its "
                            f"header, {len(body)} are left")
        record = body[:length]
        if verify and masked(value(record)) != int.from_bytes(body[length:], "little"):
            raise DataError(f"{uri} is corrupt: the data of the record at byte {offset} ({length} bytes) fails "
                            "its checksum")
        offset += 16 + length
        yield record


_HEADER = struct.Struct("<QI")


def interleave(files: list[str], *, cycle_length: int = 8) -> Iterator[bytes]:
    """The records of several files in tf.data's deterministic `interleave(TFRecordDataset, cycle_length)` order
    (block length 1): one record from each of the first `cycle_length` files in turn; a file that ends gives its
    place in the cycle to the next file of the list, which is read from the following turn on. This is the order
    data.read_split and the training input read a split in, so record positions (the augmentation's example
    index) agree with the TensorFlow path."""
    pending = iter(files)
    cycle: list = [iter_records(f) for f in _take(pending, max(1, min(cycle_length, len(files))))]
    position = 0
    while cycle:
        position %= len(cycle)
        current = cycle[position]
        record = next(current, None) if current is not None else None
        if record is not None:
            yield record
            position += 1
            continue
        following = next(pending, None)
        if following is None:
            del cycle[position]
        else:
            cycle[position] = iter_records(following)
            position += 1


def _take(iterator, count):
    return [item for _, item in zip(range(count), iterator)]


# ---------------------------------------------------------------------------------------------- tf.train.Example


@functools.cache
def _example_class():
    """tf.train.Example as a protobuf message class, from its schema (tensorflow/core/example/feature.proto and
    example.proto: Example { Features features = 1 }; Features { map<string, Feature> feature = 1 }; Feature {
    oneof kind { BytesList bytes_list = 1; FloatList float_list = 2; Int64List int64_list = 3 } }, each list
    `repeated ... value = 1`, the numbers packed). Built in a pool of its own, so that it never clashes with
    TensorFlow's where both are loaded; the same wire format, so the same parse."""
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    field = descriptor_pb2.FieldDescriptorProto
    schema = descriptor_pb2.FileDescriptorProto(name="kfp_image_classification/example.proto", package="tensorflow",
                                                syntax="proto3")

    def add(parent, name, number, kind, label=field.LABEL_OPTIONAL, type_name=None, oneof_index=None):
        added = parent.field.add(name=name, number=number, type=kind, label=label)
        if type_name:
            added.type_name = type_name
        if oneof_index is not None:
            added.oneof_index = oneof_index
        return added

    for name, kind in (("BytesList", field.TYPE_BYTES), ("FloatList", field.TYPE_FLOAT),
                       ("Int64List", field.TYPE_INT64)):
        add(schema.message_type.add(name=name), "value", 1, kind, field.LABEL_REPEATED)
    feature = schema.message_type.add(name="Feature")
    feature.oneof_decl.add(name="kind")
    for number, name in enumerate(("bytes_list", "float_list", "int64_list"), start=1):
        add(feature, name, number, field.TYPE_MESSAGE, type_name=f".tensorflow.{name.title().replace('_', '')}",
            oneof_index=0)
    features = schema.message_type.add(name="Features")
    entry = features.nested_type.add(name="FeatureEntry")
    entry.options.map_entry = True
    add(entry, "key", 1, field.TYPE_STRING)
    add(entry, "value", 2, field.TYPE_MESSAGE, type_name=".tensorflow.Feature")
    add(features, "feature", 1, field.TYPE_MESSAGE, field.LABEL_REPEATED, ".tensorflow.Features.FeatureEntry")
    add(schema.message_type.add(name="Example"), "features", 1, field.TYPE_MESSAGE, type_name=".tensorflow.Features")
    pool = descriptor_pool.DescriptorPool()
    pool.Add(schema)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("tensorflow.Example"))


def _parsed(record: bytes):
    try:
        return _example_class().FromString(record)
    except Exception as e:  # google.protobuf.message.DecodeError
        raise DataError(f"A record is not a tf.train.Example ({e})") from None


def parse_example(record: bytes) -> dict[str, list]:
    """A serialized tf.train.Example -> {feature name: its values (bytes, float or int)}; unknown fields are
    skipped, and int64s and floats read packed or not, as protobuf reads them."""
    features = {}
    for key, feature in _parsed(record).features.feature.items():
        kind = feature.WhichOneof("kind")
        features[key] = list(getattr(feature, kind).value) if kind else []
    return features


def _varint_bytes(value: int) -> bytes:
    """A protobuf varint; a negative int64 as its 64-bit two's complement (10 bytes), as protobuf writes it."""
    value &= 0xFFFFFFFFFFFFFFFF
    if value < 0x4000:
        return _SMALL_VARINTS[value]
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


# The varints of 0 to 16,383 (one or two bytes): every length in a record of up to 16 KB, by one lookup.
_SMALL_VARINTS = tuple(bytes([n]) for n in range(0x80)) + tuple(bytes([n & 0x7F | 0x80, n >> 7])
                                                                for n in range(0x80, 0x4000))


def _v(n: int) -> bytes:
    return _SMALL_VARINTS[n] if n < 0x4000 else _varint_bytes(n)


@functools.lru_cache(maxsize=4096)
def _label_entry(label: int) -> bytes:
    """The map entry {"label": Feature{int64_list {value: [label]}}} (packed)."""
    number = _varint_bytes(label)
    int64_list = b"\n" + _varint_bytes(len(number)) + number
    feature = b"\x1a" + _varint_bytes(len(int64_list)) + int64_list
    entry = b"\n\x05label\x12" + _varint_bytes(len(feature)) + feature
    return b"\n" + _varint_bytes(len(entry)) + entry


def encode_example(image: bytes, label: int, uri: str) -> bytes:
    """The serialized tf.train.Example {image: bytes, label: int64, uri: bytes} of one of our records, written in
    the wire format directly: the bytes of tf.train.Example's SerializeToString(deterministic=True), which writes
    the map's entries sorted by key (image, label, uri; tests/test_records.py compares them byte for byte over many
    records), with no TensorFlow and the image copied once. (The plain SerializeToString that built records
    before wrote the entries in the order of upb's hash table, whose seed is an address: the order changed from
    one process to the next, so the same inputs gave other shard bytes in another run.)

    Example { Features features = 1 }, Features { map<string, Feature> feature = 1 } (entries: key = 1,
    value = 2), Feature { BytesList bytes_list = 1; Int64List int64_list = 3 } (each `repeated value = 1`, the
    int64s packed)."""
    # Each field is tag | varint length | payload; the lengths are summed here so that the image is copied once.
    # image entry = 0x0a len | 0x0a 0x05 "image" | 0x12 len Feature; Feature = 0x0a len BytesList;
    # BytesList = 0x0a len value (the uri's the same)
    v = _v
    image_size = len(image)
    image_length = v(image_size)
    image_list = 1 + len(image_length) + image_size
    image_list_length = v(image_list)
    image_feature = 1 + len(image_list_length) + image_list
    image_feature_length = v(image_feature)
    image_entry = 8 + len(image_feature_length) + image_feature
    image_entry_length = v(image_entry)
    uri_bytes = uri.encode()
    uri_size = len(uri_bytes)
    uri_length = v(uri_size)
    uri_list = 1 + len(uri_length) + uri_size
    uri_list_length = v(uri_list)
    uri_feature = 1 + len(uri_list_length) + uri_list
    uri_feature_length = v(uri_feature)
    uri_entry = 6 + len(uri_feature_length) + uri_feature
    uri_entry_length = v(uri_entry)
    label_entry = _label_entry(int(label))
    size = 2 + len(image_entry_length) + image_entry + len(label_entry) + len(uri_entry_length) + uri_entry
    return b"".join((b"\n", v(size), b"\n", image_entry_length, b"\n\x05image\x12", image_feature_length, b"\n",
                     image_list_length, b"\n", image_length, image, label_entry, b"\n", uri_entry_length,
                     b"\n\x03uri\x12", uri_feature_length, b"\n", uri_list_length, b"\n", uri_length, uri_bytes))


def image_label(record: bytes) -> tuple[bytes, int]:
    """(image bytes, label) of one of our records (data.encode_example): the two features only (a third of the
    time of parse_example)."""
    features = _parsed(record).features.feature
    if "image" in features and "label" in features:  # (indexing a message map would add the key)
        image, label = features["image"], features["label"]
        images = image.bytes_list.value
        labels = label.int64_list.value or getattr(label, label.WhichOneof("kind") or "int64_list").value
        if images and labels:
            return images[0], int(labels[0])
    raise DataError(f"A record lacks its image or label (features: {sorted(features)})")


# ---------------------------------------------------------------------------------------------- datasets


def read_manifest(dataset_dir: str, files=None) -> dict:
    """The dataset's manifest, read with `files`: by default without TensorFlow (local paths and gs:// through
    storage.LocalFiles); data.read_manifest passes storage.gfile()."""
    path = join(dataset_dir, MANIFEST)
    if files is None:
        _check_scheme(path)
        files = LocalFiles
    if not files.exists(path):
        raise DataError(f"{dataset_dir} is not a dataset produced by preprocess (no {MANIFEST})")
    with files.GFile(path) as f:
        return json.load(f)


def split_files(dataset_dir: str, split: str, manifest: dict | None = None) -> list[str]:
    """The shard files of a split, through the manifest (splits written by reference elsewhere included): the one
    listing of a split's shards, whichever framework reads them (data.split_files is this)."""
    manifest = manifest or read_manifest(dataset_dir)
    if split not in manifest.get("splits", {}):
        raise DataError(f"{dataset_dir} has no {split} split (it has {', '.join(sorted(manifest.get('splits', {})))})")
    info = manifest["splits"][split]
    base = locate(dataset_dir, info["path"])
    files = glob(join(base, info["pattern"]))
    if not files:
        raise DataError(f"No {split} shards found under {base} (pattern {info['pattern']})")
    return files
