"""The shards without TensorFlow: TFRecord framing, tf.train.Example, and local or gs:// files read with Python's
own files and google-cloud-storage. The torch and JAX training paths read the datasets through this module, where
TensorFlow is not installed (components/train/portable_input.py); it imports nothing that imports TensorFlow.

TFRecord framing (tensorflow/core/lib/io/record_writer.cc): each record is

    uint64 length (little-endian) | uint32 masked crc32c of the length | data | uint32 masked crc32c of the data

Both checksums are verified, as tf.data's TFRecordDataset does: a corrupt or truncated shard raises DataError naming
the file and the byte offset of the bad record. crc32c comes from google-crc32c (installed with the Google Cloud
libraries; a few tens of KB of C) and, where that is missing, from a numpy implementation that checks many records
at once (`crc32c_many`).

tf.train.Example is read by a small protobuf wire-format parser (`parse_example`), not by the protobuf package:
the message is three levels of length-delimited fields whose layout is fixed by tensorflow/core/example/
{example,feature}.proto, and the GPU machines' PyTorch/JAX installs carry no protobuf (torch and jax do not depend
on it), so a parser of our own keeps this path free of any package beyond numpy.
"""

from __future__ import annotations

import functools
import json
import os
import struct
from typing import BinaryIO, Iterator

import numpy as np

from components.storage import DataError, glob, join, locate

_MASK_DELTA = 0xA282EAD8
_READ_BUFFER = 4 << 20


# ---------------------------------------------------------------------------------------------- crc32c


@functools.cache
def _crc32c_c():
    """google-crc32c's C function, or None where only its pure-Python fallback (or nothing) is installed."""
    try:
        import google_crc32c
    except ImportError:
        return None
    return google_crc32c.value if google_crc32c.implementation == "c" else None


@functools.cache
def _table() -> np.ndarray:
    """The byte table of the reflected Castagnoli polynomial 0x82F63B78."""
    table = np.arange(256, dtype=np.uint32)
    for _ in range(8):
        table = np.where(table & 1, (table >> 1) ^ np.uint32(0x82F63B78), table >> 1).astype(np.uint32)
    return table


@functools.cache
def _python_table() -> tuple[int, ...]:
    return tuple(int(v) for v in _table())


def _crc32c_python(data: bytes) -> int:
    """For the 8 bytes of a length: a table loop, microseconds where a numpy call costs a hundred."""
    table, crc = _python_table(), 0xFFFFFFFF
    for byte in data:
        crc = table[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


@functools.cache
def _zero_shift(log2_bytes: int) -> np.ndarray:
    """4x256 tables of the linear map 'feed 2**log2_bytes zero bytes to the register' (applied a byte at a time)."""
    basis = np.array([1 << bit for bit in range(32)], dtype=np.uint32)
    if log2_bytes == 0:
        images = _table()[basis & 0xFF] ^ (basis >> 8)
    else:
        half = _zero_shift(log2_bytes - 1)
        images = _apply_shift(_apply_shift(basis, half), half)
    tables = np.zeros((4, 256), dtype=np.uint32)
    values = np.arange(256)
    for byte in range(4):
        for bit in range(8):
            tables[byte] ^= np.where(values >> bit & 1, images[byte * 8 + bit], 0).astype(np.uint32)
    return tables


def _apply_shift(registers: np.ndarray, tables: np.ndarray) -> np.ndarray:
    return (tables[0][registers & 0xFF] ^ tables[1][(registers >> 8) & 0xFF] ^ tables[2][(registers >> 16) & 0xFF]
            ^ tables[3][registers >> 24])


def crc32c_many(items: list[bytes]) -> list[int]:
    """crc32c of each of many byte strings: google-crc32c's C extension where it is installed, else numpy, many
    records at once. The numpy way: every record is cut into chunks of CHUNK bytes (padded with zeros at its front),
    the registers of all chunks of all records advance together a byte at a time, and each record's chunks are then
    combined (the register is linear: raw(a + b) = shift(raw(a), len(b)) ^ raw(b), with zero-register shifts as
    table lookups). Leading zero bytes leave a zero register as it is, and the standard crc is
    raw(data) ^ crc(len(data) zero bytes)."""
    native = _crc32c_c()
    if native is not None:
        return [native(item) for item in items]
    if not items:
        return []
    lengths = np.array([len(item) for item in items], dtype=np.int64)
    # about sqrt(longest) bytes a chunk: as many steps a byte at a time as steps combining chunks
    log2_chunk = int(min(12, max(6, (int(lengths.max()).bit_length() + 1) // 2)))
    chunk = 1 << log2_chunk
    counts = np.maximum(1, -(-lengths // chunk))
    ends = np.cumsum(counts) * chunk
    padded = np.zeros(int(ends[-1]), dtype=np.uint8)
    for item, end in zip(items, ends):
        if item:
            padded[end - len(item):end] = np.frombuffer(item, dtype=np.uint8)
    columns = np.ascontiguousarray(padded.reshape(-1, chunk).T)  # byte j of every chunk, contiguous
    table = _table()
    registers = np.zeros(columns.shape[1], dtype=np.uint32)
    index = np.empty(columns.shape[1], dtype=np.uint32)
    for column in columns:
        np.bitwise_xor(registers, column, out=index)
        np.bitwise_and(index, 0xFF, out=index)
        registers >>= 8
        registers ^= table.take(index)
    # Horner over each record's chunks, right-aligned so that every record ends at the last step
    most = int(counts.max())
    aligned = np.zeros((len(items), most), dtype=np.uint32)
    rows = np.repeat(np.arange(len(items)), counts)
    firsts = np.cumsum(counts) - counts
    aligned[rows, most - np.repeat(counts, counts) + (np.arange(len(registers)) - np.repeat(firsts, counts))] = registers
    raw = np.zeros(len(items), dtype=np.uint32)
    shift = _zero_shift(log2_chunk)
    for k in range(most):
        raw = _apply_shift(raw, shift) ^ aligned[:, k]
    ones = np.full(len(items), 0xFFFFFFFF, dtype=np.uint32)
    for bit in range(int(lengths.max()).bit_length()):
        set_here = (lengths >> bit & 1).astype(bool)
        ones = np.where(set_here, _apply_shift(ones, _zero_shift(bit)), ones)
    crcs = raw ^ ones ^ np.uint32(0xFFFFFFFF)
    return [0 if length == 0 else int(crc) for length, crc in zip(lengths, crcs)]


def crc32c(data) -> int:
    data = bytes(data) if isinstance(data, memoryview) else data
    native = _crc32c_c()
    if native is not None:
        return native(data)
    return _crc32c_python(data) if len(data) <= 64 else crc32c_many([data])[0]


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


def _gcs_client():
    from components import gcs  # the client of every gs:// path without TensorFlow (credentials, endpoint)

    return gcs.client()


def _blob(uri: str):
    bucket, _, name = uri[len("gs://"):].partition("/")
    return _gcs_client().bucket(bucket).blob(name)


def _check_scheme(uri: str) -> None:
    if "://" in uri and not uri.startswith("gs://"):
        raise DataError(f"Cannot read {uri}: without TensorFlow only local paths and gs:// are read")


def open_file(uri: str) -> BinaryIO:
    """A local or gs:// file for reading, buffered (gs://: ranged reads of google-cloud-storage's BlobReader)."""
    _check_scheme(uri)
    try:
        if uri.startswith("gs://"):
            return _blob(uri).open("rb", chunk_size=_READ_BUFFER)
        return open(uri, "rb", buffering=_READ_BUFFER)
    except FileNotFoundError:
        raise DataError(f"{uri} does not exist") from None
    except Exception as e:
        if type(e).__name__ == "NotFound":  # google.api_core.exceptions.NotFound
            raise DataError(f"{uri} does not exist") from None
        raise


def read_file(uri: str) -> bytes:
    with open_file(uri) as f:
        return f.read()


def exists(uri: str) -> bool:
    _check_scheme(uri)
    return _blob(uri).exists() if uri.startswith("gs://") else os.path.exists(uri)


# ---------------------------------------------------------------------------------------------- TFRecord


def iter_records(uri: str, *, verify: bool = True) -> Iterator[bytes]:
    """The records of one TFRecord file, in order; DataError for a corrupt or truncated one."""
    with open_file(uri) as f:
        yield from _iter_stream(f, uri, verify)


# Records whose data checksums are verified together (the numpy crc32c works on many at once)
_CHECK_RECORDS = 8192
_CHECK_BYTES = 16 << 20


def _iter_stream(f: BinaryIO, uri: str, verify: bool) -> Iterator[bytes]:
    offset = 0
    pending: list[tuple[int, bytes, int]] = []  # (offset, record, stored masked crc) not yet verified
    pending_bytes = 0
    while True:
        header = f.read(12)
        if not header:
            break
        if len(header) < 12:
            yield from _verified(pending, uri, verify)
            raise DataError(f"{uri} is truncated: {len(header)} bytes of a record header at byte {offset}")
        length, length_crc = struct.unpack("<QI", header)
        if verify and masked_crc32c(header[:8]) != length_crc:  # before reading `length` bytes it may not hold
            yield from _verified(pending, uri, verify)
            raise DataError(f"{uri} is corrupt: the length of the record at byte {offset} fails its checksum")
        body = f.read(length + 4)
        if len(body) < length + 4:
            yield from _verified(pending, uri, verify)
            raise DataError(f"{uri} is truncated: the record at byte {offset} needs {length + 4} bytes after its "
                            f"header, {len(body)} are left")
        pending.append((offset, body[:length], struct.unpack("<I", body[length:])[0]))
        pending_bytes += length
        offset += 12 + length + 4
        if len(pending) >= _CHECK_RECORDS or pending_bytes >= _CHECK_BYTES:
            yield from _verified(pending, uri, verify)
            pending, pending_bytes = [], 0
    yield from _verified(pending, uri, verify)


def _verified(pending: list[tuple[int, bytes, int]], uri: str, verify: bool) -> Iterator[bytes]:
    crcs = crc32c_many([record for _, record, _ in pending]) if verify else [None] * len(pending)
    for (offset, record, stored), crc in zip(pending, crcs):
        if verify and _mask(crc) != stored:
            raise DataError(f"{uri} is corrupt: the data of the record at byte {offset} ({len(record)} bytes) fails "
                            "its checksum")
        yield record


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


def _varint(buffer: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        byte = buffer[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise ValueError("varint longer than 10 bytes")


def _fields(buffer: bytes, start: int, end: int) -> Iterator[tuple[int, int, object]]:
    """(field number, wire type, value) of a message: ints for varints and fixed64/fixed32, (start, end) for
    length-delimited fields."""
    pos = start
    while pos < end:
        key, pos = _varint(buffer, pos)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _varint(buffer, pos)
        elif wire == 2:
            size, pos = _varint(buffer, pos)
            value, pos = (pos, pos + size), pos + size
        elif wire == 1:
            value, pos = struct.unpack_from("<Q", buffer, pos)[0], pos + 8
        elif wire == 5:
            value, pos = struct.unpack_from("<I", buffer, pos)[0], pos + 4
        else:
            raise ValueError(f"unsupported wire type {wire}")
        if pos > end:
            raise ValueError("field runs past the end of its message")
        yield number, wire, value


def _signed(value: int) -> int:
    return value - (1 << 64) if value >= 1 << 63 else value


def _feature(buffer: bytes, start: int, end: int) -> list:
    """A tf.train.Feature: bytes_list = 1, float_list = 2, int64_list = 3 (each `repeated ... value = 1`, the
    numbers packed or not)."""
    values: list = []
    for kind, wire, span in _fields(buffer, start, end):
        if wire != 2 or kind not in (1, 2, 3):
            continue
        for number, value_wire, value in _fields(buffer, *span):
            if number != 1:
                continue
            if kind == 1 and value_wire == 2:
                values.append(buffer[value[0]:value[1]])
            elif kind == 2 and value_wire == 5:
                values.append(struct.unpack("<f", struct.pack("<I", value))[0])
            elif kind == 2 and value_wire == 2:
                values.extend(np.frombuffer(buffer[value[0]:value[1]], "<f4").tolist())
            elif kind == 3 and value_wire == 0:
                values.append(_signed(value))
            elif kind == 3 and value_wire == 2:
                pos, stop = value
                while pos < stop:
                    number_value, pos = _varint(buffer, pos)
                    values.append(_signed(number_value))
    return values


def parse_example(record: bytes) -> dict[str, list]:
    """A serialized tf.train.Example -> {feature name: its values (bytes, float or int)}.

    Example { Features features = 1 }, Features { map<string, Feature> feature = 1 } (map entries: key = 1,
    value = 2). Unknown fields are skipped, as protobuf parsers do."""
    features: dict[str, list] = {}
    try:
        for number, wire, span in _fields(record, 0, len(record)):
            if number != 1 or wire != 2:
                continue
            for entry_number, entry_wire, entry in _fields(record, *span):
                if entry_number != 1 or entry_wire != 2:
                    continue
                key, value = "", []
                for part, part_wire, part_span in _fields(record, *entry):
                    if part == 1 and part_wire == 2:
                        key = record[part_span[0]:part_span[1]].decode()
                    elif part == 2 and part_wire == 2:
                        value = _feature(record, *part_span)
                features[key] = value
    except (ValueError, IndexError, struct.error, UnicodeDecodeError) as e:
        raise DataError(f"A record is not a tf.train.Example ({e})") from None
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
    """(image bytes, label) of one of our records (data.encode_example)."""
    features = parse_example(record)
    try:
        return features["image"][0], int(features["label"][0])
    except (KeyError, IndexError):
        raise DataError(f"A record lacks its image or label (features: {sorted(features)})") from None


# ---------------------------------------------------------------------------------------------- datasets


def read_manifest(dataset_dir: str) -> dict:
    """The dataset's manifest (data.read_manifest, without TensorFlow)."""
    path = join(dataset_dir, "dataset.json")
    if not exists(path):
        raise DataError(f"{dataset_dir} is not a dataset produced by preprocess (no dataset.json)")
    return json.loads(read_file(path))


def split_files(dataset_dir: str, split: str, manifest: dict | None = None) -> list[str]:
    """The shard files of a split, through the manifest as data.split_files finds them (splits written by
    reference elsewhere included)."""
    manifest = manifest or read_manifest(dataset_dir)
    if split not in manifest.get("splits", {}):
        raise DataError(f"{dataset_dir} has no {split} split (it has {', '.join(sorted(manifest.get('splits', {})))})")
    info = manifest["splits"][split]
    base = locate(dataset_dir, info["path"])
    files = glob(join(base, info["pattern"]))
    if not files:
        raise DataError(f"No {split} shards found under {base} (pattern {info['pattern']})")
    return files
