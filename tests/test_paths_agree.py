"""Where the TensorFlow path and the TensorFlow-free path once had a copy each and gave different answers, each
now goes through one rule, and a test feeds both paths the same input:
- globs: storage.glob, which data.split_files (TensorFlow's readers) and records.split_files (the torch and JAX
  input) both call, against tf.io.gfile.glob itself and glibc's fnmatch, locally and on gs://;
- EXIF orientation: images.jpeg_orientation (prediction's fast routes) and images._orientation (training's
  records), against Pillow's getexif() on generated blocks and on real photos;
- folder markers: gs:// globs, listings and walks on a bucket laid out as TensorFlow writes it
  (tests/test_storage_gcs.py holds those; the shard listing here runs on such a bucket too)."""

from __future__ import annotations

import concurrent.futures
import ctypes
import io
import json
import os
import random
import shutil
import struct
import warnings

import numpy as np
import pytest
from PIL import Image

from components.dataio import data, images, records, storage
from tests.standins.gcs import GcsStandIn

# ---------------------------------------------------------------------------------------------- globs


def _libc_fnmatch():
    libc = ctypes.CDLL(None)
    if not hasattr(libc, "fnmatch"):
        pytest.skip("this C library has no fnmatch")
    libc.fnmatch.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_int]
    return lambda pattern, name: libc.fnmatch(pattern.encode(), name.encode(), 1) == 0  # FNM_PATHNAME


def test_a_path_matches_as_fnmatch_with_fnm_pathname_says():
    """TensorFlow's FileSystem::Match on POSIX is fnmatch(pattern, path, FNM_PATHNAME): storage.match against the
    C library's own, on every kind of element a shard or image pattern is made of."""
    fnmatch = _libc_fnmatch()
    tokens = ["a", "b", "1", ".", "-", "_", "]", "!", "^", "*", "?", "/", "[ab]", "[!a]", "[^.]", "[a-c]", "[]a]",
              "[a-]", "[!]a]", "[[:digit:]]", "[![:alpha:]]", "\\*", "\\[", "\\a", "[", "[b-a]", "[/a]"]
    names = list("ab1.-_]!^[*?\\") + ["/"] * 2
    rng = random.Random(0)
    compared = 0
    for _ in range(40000):
        pattern = "".join(rng.choice(tokens) for _ in range(rng.randint(0, 5)))
        name = "".join(rng.choice(names) for _ in range(rng.randint(0, 6)))
        assert storage.match(name, pattern) == fnmatch(pattern, name), (pattern, name)
        compared += 1
    for name, pattern in [(".hidden", "*"), ("a/.b", "a/*"), ("train-old/x", "train-*"), ("a", "[[.a.]]"),
                          ("x", "x\\"), ("a/b", "a?b"), ("a", "[!/]")]:
        assert storage.match(name, pattern) == fnmatch(pattern, name), (pattern, name)
    assert compared == 40000


SHARDS = ["train/train-00000-of-00002.tfrecord", "train/train-00001-of-00002.tfrecord",
          "train/train-old/train-00000-of-00001.tfrecord", "train/.train-00002-of-00002.tfrecord",
          "train/sub/deeper/train-9-of-9.tfrecord", "test/test-00000-of-00001.tfrecord", "test/[x].tfrecord"]
PATTERNS = ["train/train-*-of-*.tfrecord", "train/*", "train/*/*", "*/*.tfrecord", "train/train-0000[0-1]-*",
            "train/.*", "t*/*-of-00001.tfrecord", "test/\\[x].tfrecord", "test/[[]x]*", "train/*/", "*",
            "train/sub/*/*", "train/?rain-*", "no/*", "train/train-00000-of-00002.tfrecord"]


def _layout(root) -> None:
    for name in SHARDS:
        os.makedirs(os.path.dirname(os.path.join(root, name)), exist_ok=True)
        with open(os.path.join(root, name), "wb") as f:
            f.write(records.frame(b"record of " + name.encode()))


def test_one_glob_lists_what_tf_io_gfile_glob_lists(tmp_path, monkeypatch):
    """Before, records.glob let `*` cross "/" on gs:// (train/train-*-of-*.tfrecord also listed train/train-old/),
    and LocalFiles.glob (Python's glob) skipped hidden files, which TensorFlow lists. Both now ask storage.glob."""
    tf = pytest.importorskip("tensorflow")
    _layout(tmp_path)
    for pattern in PATTERNS:
        full = os.path.join(str(tmp_path), pattern)
        assert storage.glob(full) == sorted(tf.io.gfile.glob(full)), pattern
    monkeypatch.chdir(tmp_path)  # a relative pattern, which TensorFlow reads as ./PATTERN
    for pattern in ["train/train-*", "*", "tes?"]:
        assert storage.glob(pattern) == sorted(tf.io.gfile.glob(pattern)), pattern
    assert storage.LocalFiles.glob(str(tmp_path / "train" / ".*")) == [str(tmp_path / "train" / ".train-00002-of-"
                                                                                                "00002.tfrecord")]


# What tf.io.gfile.makedirs of each folder leaves on GCS: an empty object per level (GcsFileSystem::CreateDir)
MARKERS = ["data/", "data/train/", "data/train/train-old/", "data/train/sub/", "data/train/sub/deeper/",
           "data/test/"]


def _dataset(root) -> None:
    """A dataset whose train folder also holds an older run's shards one level down, and a hidden one."""
    _layout(root)
    data.write_json(os.path.join(root, "dataset.json"), {
        "class_names": ["a", "b"], "image_shape": [28, 28, 1],
        "splits": {"train": {"path": "train", "pattern": "train-*-of-*.tfrecord", "count": 2},
                   "test": {"path": "test", "pattern": "test-*.tfrecord", "count": 1}}})


def test_shards_of_a_split_are_the_same_files_with_and_without_tensorflow(tmp_path, loopback_only):
    """data.split_files (the TensorFlow input) and records.split_files (torch, JAX) on the same dataset, and
    records.split_files and storage.glob on gs:// in a bucket laid out as TensorFlow writes it (folder markers
    from tf.io.gfile.makedirs): the files tf.io.gfile.glob lists, and never the older run's shards under
    train/train-old/. (TensorFlow's own GCS file system cannot be pointed at the stand-in: its endpoint is fixed,
    kGcsUriBase in gcs_file_system.cc; its answer here is its answer on the local copy.)"""
    tf = pytest.importorskip("tensorflow")
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import storage as gcs_storage

    from components.dataio import gcs

    local = tmp_path / "local"
    _dataset(local)
    expected = sorted(tf.io.gfile.glob(str(local / "train" / "train-*-of-*.tfrecord")))
    assert [os.path.relpath(f, local) for f in expected] == SHARDS[:2]
    assert data.split_files(str(local), "train") == records.split_files(str(local), "train") == expected
    shutil.copytree(local, tmp_path / "gcs" / "bucket" / "data")
    with GcsStandIn(tmp_path / "gcs") as server:
        client = gcs_storage.Client(project="test", credentials=AnonymousCredentials(),
                                    client_options={"api_endpoint": server.url})
        for marker in MARKERS:
            client.bucket("bucket").blob(marker).upload_from_string(b"", if_generation_match=0)
        gcs.set_client(client)
        try:
            remote = [f"gs://bucket/data/{os.path.relpath(f, local)}" for f in expected]
            assert records.split_files("gs://bucket/data", "train") == remote
            assert [list(records.iter_records(f)) for f in remote] == [list(records.iter_records(f))
                                                                        for f in expected]
            markers = [f"gs://bucket/{m}" for m in MARKERS]
            for pattern in [p for p in PATTERNS if not p.endswith("/")]:
                # TensorFlow's answer on the local copy, and the marker objects that match the pattern, but for
                # the marker of the folder it lists (GcsFileSystem::GetMatchingPaths: include_self_directory_
                # marker false; AddAllSubpaths keeps a deeper `sub/`, and `*` matches its empty last segment)
                full = f"gs://bucket/data/{pattern}"
                listed = os.path.dirname(storage._fixed_prefix(full)) + "/"
                want = {f"gs://bucket/data/{os.path.relpath(f, local)}"
                        for f in tf.io.gfile.glob(str(local / pattern))}
                want |= {m for m in markers if m != listed and storage.match(m, full)}
                assert storage.glob(full) == sorted(want), pattern
            # a pattern ending in "/": locally TensorFlow drops the "/" (AllDirectoryPrefixes), on GCS it matches
            # the marker objects only (GetMatchingPaths matches full names)
            assert storage.glob("gs://bucket/data/train/*/") == ["gs://bucket/data/train/sub/",
                                                                  "gs://bucket/data/train/train-old/"]
            assert storage.glob("gs://bucket/data/train/*") == [  # the folder's own marker is not listed
                f"gs://bucket/data/{name}" for name in ("train/.train-00002-of-00002.tfrecord", "train/sub",
                                                         "train/train-00000-of-00002.tfrecord",
                                                         "train/train-00001-of-00002.tfrecord", "train/train-old")]
        finally:
            gcs.set_client(None)


def test_the_manifest_and_a_missing_split_read_the_same_with_and_without_tensorflow(tmp_path):
    """data.read_manifest/split_files (through gfile(): tf.io.gfile here) are records' one copy with the file system
    handed in: the same manifest, and for a split the manifest lacks the same one-line DataError naming the splits
    there are (data.split_files raised a bare KeyError('holdout') before it was records')."""
    pytest.importorskip("tensorflow")
    _dataset(tmp_path)
    assert data.read_manifest(str(tmp_path)) == records.read_manifest(str(tmp_path)) == json.loads(
        (tmp_path / "dataset.json").read_text())
    messages = []
    for split_files in (data.split_files, records.split_files):
        with pytest.raises(storage.DataError) as raised:
            split_files(str(tmp_path), "holdout")
        messages.append(str(raised.value))
    assert messages[0] == messages[1] == f"{tmp_path} has no holdout split (it has test, train)"
    for read in (data.read_manifest, records.read_manifest):
        with pytest.raises(storage.DataError, match="is not a dataset produced by preprocess"):
            read(str(tmp_path / "train"))


# ---------------------------------------------------------------------------------------------- EXIF


def _exif(order: str, kind: int, orientation: int, extra: bool = True) -> bytes:
    """An EXIF block (APP1 payload) whose IFD0 holds the orientation as SHORT (3) or LONG (4), little-endian
    ("II") or big-endian ("MM"), after a Make entry whose string lies outside the IFD."""
    e = "<" if order == "II" else ">"
    value = struct.pack(e + "H", orientation) + b"\0\0" if kind == 3 else struct.pack(e + "L", orientation)
    entries = ([struct.pack(e + "HHLL", 0x010F, 2, 6, 8 + 2 + 12 * 2 + 4)] if extra else [])
    entries.append(struct.pack(e + "HHL", 0x0112, kind, 1) + value)
    ifd = struct.pack(e + "H", len(entries)) + b"".join(entries) + b"\0" * 4
    return (b"Exif\0\0" + (b"II*\0" if order == "II" else b"MM\0*") + struct.pack(e + "L", 8) + ifd
            + (b"Maker\0" if extra else b""))


def _with_exif(jpeg: bytes, block: bytes) -> bytes:
    return jpeg[:2] + b"\xff\xe1" + struct.pack(">H", len(block) + 2) + block + jpeg[2:]


def _pillow(contents: bytes) -> int:
    try:
        return Image.open(io.BytesIO(contents)).getexif().get(0x0112, 1)
    except Exception:
        return 1


def test_the_orientation_of_training_and_prediction_is_pillows(food_photos):
    """images.jpeg_orientation (from a JPEG's bytes: prediction's routes) and images._orientation (from an opened
    image: preprocess's records) against Image.getexif() on SHORT and LONG orientations in both byte orders,
    plain and damaged, and on every real photo of the food set with each of them inserted. Before, prediction's
    own parser (predict/decode.py:exif_orientation) read a big-endian LONG 6 as 1."""
    rng = random.Random(1)
    buffer = io.BytesIO()
    Image.new("RGB", (16, 8), (90, 120, 30)).save(buffer, "JPEG")
    small = buffer.getvalue()
    blocks = [_exif(order, kind, orientation, extra)
              for order in ("II", "MM") for kind in (3, 4) for orientation in range(0, 10) for extra in (True, False)]
    damaged = []
    for block in blocks:
        for _ in range(10):
            changed = bytearray(block)
            changed[rng.randrange(6, len(changed))] = rng.randrange(256)
            damaged.append(bytes(changed))
    files = [_with_exif(small, block) for block in blocks + damaged] + [small]
    files.append(_with_exif(_with_exif(small, blocks[3]), blocks[5]))  # two EXIF segments: Pillow joins them
    xmp = io.BytesIO()
    Image.new("RGB", (16, 8)).save(xmp, "JPEG", xmp=b'<x:xmpmeta><rdf:Description tiff:Orientation="8"/></x:xmpmeta>')
    files.append(xmp.getvalue())
    photos = sorted(os.path.join(d, f) for d, _, names in os.walk(food_photos) for f in names
                    if f.lower().endswith((".jpg", ".jpeg")))
    assert len(photos) > 400
    for path in photos:
        with open(path, "rb") as f:
            photo = f.read()
        files.append(photo)
        files.append(_with_exif(photo, _exif(rng.choice(["II", "MM"]), rng.choice([3, 4]), rng.randint(1, 8))))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Pillow warns about the damaged blocks
        for contents in files:
            expected = _pillow(contents)
            assert images.jpeg_orientation(contents) == expected, contents[:60]
            with Image.open(io.BytesIO(contents)) as img:
                assert images._orientation(img) == expected, contents[:60]
    assert images.jpeg_orientation(_with_exif(small, _exif("MM", 4, 6))) == 6


def test_a_rotated_photo_at_the_models_size_is_predicted_from_the_pixels_training_saw(food_photos):
    """The prediction route of a JPEG already at the model's size: with a big-endian LONG orientation it went to
    TensorFlow's decoder unrotated; now it goes where the rotation is applied, and its pixels are training's."""
    tf = pytest.importorskip("tensorflow")
    del tf
    from components.predict import decode

    photo_path = sorted(os.path.join(d, f) for d, _, names in os.walk(food_photos) for f in names
                        if f.lower().endswith((".jpg", ".jpeg")))[0]
    with open(photo_path, "rb") as f:
        photo = f.read()
    height, width, _ = decode.jpeg_shape(photo)
    rotated = _with_exif(photo, _exif("MM", 4, 6))
    plain = _with_exif(photo, _exif("MM", 4, 1))
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        decoder = decode.Decoder([height, width, 3], pool)
        assert decoder.route(plain) == "jpeg" and decoder.route(rotated) == "slow"
        _, pixels, errors = decoder.decode([("rotated", rotated), ("plain", plain)])
    assert errors == []
    np.testing.assert_array_equal(pixels[0], data.decode_image(rotated, height, width, 3))
    np.testing.assert_array_equal(pixels[1], data.decode_image(plain, height, width, 3))
    assert not np.array_equal(pixels[0], pixels[1])
