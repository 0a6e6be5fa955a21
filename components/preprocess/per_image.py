"""One input's way into the dataset: read, decode, conform, content key, split, reject reason, record.

Both runners call these functions and nothing else for per-image decisions: the in-process step
(components/preprocess/step.py) and the Apache Beam pipeline (components/preprocess/beam.py), so the same input
gives the same record, split or rejection whichever runs it.
"""

from __future__ import annotations

import array
import collections
import functools
import hashlib
import math
import os
from typing import Iterable

import numpy as np

from components.dataio import data
from components.preprocess.inputs import CONFLICTING_LABEL, DUPLICATE, Example, Item

# Image files of formats we do not decode: reported as an unsupported format rather than "not an image".
OTHER_IMAGE_EXTENSIONS = (".heic", ".heif", ".avif", ".svg", ".psd", ".ico", ".jp2", ".tga", ".ppm", ".pgm",
                          ".dng", ".cr2", ".nef", ".arw", ".raw")


def content_key(raw: bytes) -> int:
    """64 bits of the SHA-256 of the source bytes: fixes the split and finds duplicates. SHA-256 of a small
    PNG is ~1 us (hashlib runs in C and releases the GIL on larger inputs): not worth a weaker hash."""
    return int.from_bytes(hashlib.sha256(raw).digest()[:8], "big")


def extension_problem(uri: str) -> tuple[str, str] | None:
    """(reason, detail) for a file whose name says it is not an image we decode, else None."""
    if uri.lower().endswith(data.IMAGE_EXTENSIONS):
        return None
    extension = os.path.splitext(uri)[1].lower() or "no extension"
    if extension in OTHER_IMAGE_EXTENSIONS:
        return data.UNSUPPORTED_FORMAT, f"{extension} files are not decoded; convert them to PNG or JPEG"
    return data.NOT_AN_IMAGE, f"file extension {extension} (expected {', '.join(data.IMAGE_EXTENSIONS)})"


def exact_format(raw: bytes, height: int, width: int, channels: int) -> str | None:
    """"PNG" or "JPEG" when file bytes decode, as they are, to the target's size and colour type (8-bit PNG; JPEG of
    that many components), with no EXIF orientation to apply, else None. Such files decode to the same pixels in
    TensorFlow as in PIL (the exact integer DCT for JPEG), so TensorFlow may decode them, and an encoded record may
    hold them unchanged."""
    head = raw[:65536]
    if b"eXIf" in head or b"Exif" in head:
        return None
    if raw.startswith(_png_header(height, width, channels)):
        return "PNG"
    if raw.startswith(b"\xff\xd8\xff"):
        from components.predict.decode import jpeg_shape

        if jpeg_shape(raw) == (height, width, channels):
            return "JPEG"
    return None


@functools.lru_cache(maxsize=16)
def _png_header(height: int, width: int, channels: int) -> bytes:
    """The first bytes of an 8-bit PNG of that size and colour type (signature and IHDR up to the colour type)."""
    import struct

    from components.predict.decode import PNG_MAGIC

    return PNG_MAGIC + struct.pack(">I4sIIBB", 13, b"IHDR", width, height, 8, 0 if channels == 1 else 2)


def stored_form(image: np.ndarray, image_size: int, source_format: str | None,
                raw: bytes | None = None) -> tuple[bytes | None, str]:
    """(bytes a record stores, encoding) for pixels decoded without `decode_source`'s policy: for raw datasets
    None (the pixels are the bytes, taken when the record is built), else the source file itself when it already
    is exactly the record's image (`exact_format`), else the pixels encoded as PNG."""
    encoding = data.record_encoding(image_size, source_format)
    if encoding == data.RAW:
        return None, encoding
    if raw is not None and exact_format(raw, *image.shape) == (source_format or "").upper():
        return raw, encoding
    return data.encode_image(image, data.PNG), encoding


def max_side(image_size: int) -> int:
    """The longest side a source record keeps (data.SOURCE_MAX_SIDE_FACTOR)."""
    return data.SOURCE_MAX_SIDE_FACTOR * image_size


def decode_file(uri: str, label: int, split: str | None, height: int, width: int, channels: int,
                check_extension: bool) -> Example:
    """Reads, decodes, conforms and encodes one image file; failures come back as a rejected Example (with a
    reason from data.py), never as an exception."""
    if check_extension:
        problem = extension_problem(uri)
        if problem:
            return Example(uri, label, split, reason=problem[0], detail=problem[1])
    try:
        raw = data.read_bytes(uri)
    except data.ImageError as e:
        return Example(uri, label, split, reason=e.reason, detail=e.detail)
    return decode_contents(Item(uri, label, split), raw, height, width, channels)


def decode_contents(item: Item, raw: bytes, height: int, width: int, channels: int) -> Example:
    """Decodes the bytes of one file (every file is decoded: what cannot be is rejected here) and decides what its
    record stores: below data.ENCODED_MIN_SIZE the pixels, else the file's bytes as they are or re-encoded once
    (images.decode_source's policy)."""
    try:
        if data.record_encoding(width, "file") == data.RAW:
            image, _ = data.decode_image_file(raw, height, width, channels)
            return Example(item.uri, item.label, item.split, content_key(raw), image)
        source = data.decode_source(raw, height, width, channels, max_side=max_side(width))
    except data.ImageError as e:
        return Example(item.uri, item.label, item.split, reason=e.reason, detail=e.detail)
    return Example(item.uri, item.label, item.split, content_key(raw),
                   stored=raw if source.reencoded is None else source.reencoded, encoding=data.SOURCE,
                   source_size=source.source_size, source_bytes=len(raw), reencoded=source.why,
                   histogram=source.histogram, near_key=source.near_key)


def conform(image: np.ndarray, image_size: int, channels: int) -> np.ndarray:
    """An already decoded array (any size, 1 or 3 channels) as image_size x image_size x channels."""
    from PIL import Image

    img = Image.fromarray(image.squeeze(-1) if image.shape[-1] == 1 else image)
    img = img.convert("L" if channels == 1 else "RGB").resize((image_size, image_size), Image.Resampling.BILINEAR)
    return np.asarray(img, dtype=np.uint8).reshape(image_size, image_size, channels)


def array_example(image: np.ndarray, label: int, uri: str, split: str | None, image_size: int,
                  channels: int) -> Example:
    """An Example from an already decoded array (idx, tfds): keyed by its raw pixels, then conformed; a
    lossless source, so stored as PNG when encoded."""
    if image.ndim == 2:
        image = image[..., None]
    image = np.ascontiguousarray(image, dtype=np.uint8)
    key = content_key(image.tobytes())
    if image.shape != (image_size, image_size, channels):
        image = conform(image, image_size, channels)
    stored, encoding = stored_form(image, image_size, None)
    return Example(uri, label, split, key, image, stored=stored, encoding=encoding)


NO_CUT = 2 ** 64  # above every content key
NO_CUTS = (NO_CUT, NO_CUT)  # a class with no images to cut (all in the source's test split)


def class_cuts(keys, validation_fraction: float, test_fraction: float) -> tuple[int, int]:
    """Where one class's images split, in the class's own order of content keys: (validation_below, test_below).
    Each fraction of the class's n images is rounded (so every class of 5 or more images has at least one image in
    validation and in test at the default 0.1), at least one image stays in train; the same keys give the same
    cuts on any machine and with either runner. `keys`: the content keys of the class's kept inputs that the
    source did not put in its own test split (with a source test split, pass test_fraction 0)."""
    ordered = sorted(int(k) for k in keys)
    n = len(ordered)
    validation = int(math.floor(n * validation_fraction + 0.5))
    test = int(math.floor(n * test_fraction + 0.5))
    while validation + test > max(n - 1, 0):
        if test >= validation and test:
            test -= 1
        else:
            validation -= 1
    validation_below = ordered[validation] if validation < n else NO_CUT
    test_below = ordered[validation + test] if validation + test < n else NO_CUT
    return validation_below, test_below


def split_cuts(kept: Iterable[tuple[int, int, str | None]], validation_fraction: float,
               test_fraction: float) -> dict[int, tuple[int, int]]:
    """Every class's `class_cuts`, from the (label, content key, source split) of the kept inputs. A class whose
    source has its own test split (rows marked train) takes only validation from them."""
    keys: dict[int, array.array] = collections.defaultdict(lambda: array.array("Q"))
    from_train_split: set[int] = set()
    for label, key, source_split in kept:
        if source_split == "test":
            continue
        keys[label].append(key)
        if source_split == "train":
            from_train_split.add(label)
    return {label: class_cuts(class_keys, validation_fraction, 0.0 if label in from_train_split else test_fraction)
            for label, class_keys in keys.items()}


def assign_split(key: int, source_split: str | None, cuts: tuple[int, int]) -> str:
    """The split of a kept image: the source's test split stays test; the rest by its class's `class_cuts`,
    stratified by class and fixed by the content keys (the same bytes land in the same split in any input order)."""
    if source_split == "test":
        return "test"
    validation_below, test_below = cuts
    if key < validation_below:
        return "validation"
    if source_split != "train" and key < test_below:
        return "test"
    return "train"


def near_group_key(keys: Iterable[int]) -> int:
    """The split key of a group of near-copies (kept images with one `images.near_keys` key): the lowest of their
    content keys, so that the group's place does not depend on input order. Every member is split by it instead
    of its own content key (`split_cuts` and `assign_split` then see the group as one key, as many times as it
    has images): a class's cuts keep their fractions of images, and the group lands in one split. An image with
    no near-copy keeps its own content key, and its split stays what it was before groups existed, unless a
    cut moved past it (the cuts are quantiles of all of the class's keys)."""
    return min(keys)


NEAR_GROUP_FIELDS = ("groups", "images", "test_groups_shared", "test_images_shared")


def near_group_summary(splits: list[str]) -> tuple[int, ...]:
    """One group's share of the manifest's `near_duplicates` counts (NEAR_GROUP_FIELDS), from its members'
    splits: 1 group, its images, and whether it still straddles test and training (a source's own test split
    stays test; near-copies labelled as different classes are cut by their own class's cuts) and with how many
    test images."""
    straddles = "test" in splits and any(split != "test" for split in splits)
    return 1, len(splits), int(straddles), splits.count("test") if straddles else 0


def duplicate_rejection(label: int, kept_label: int, kept_split: str, class_names: list[str]) -> tuple[str, str]:
    """(reason, detail) for an image whose bytes equal those of an image kept earlier (in input order)."""
    if kept_label != label:
        return CONFLICTING_LABEL, (f"identical bytes to an image kept as {class_names[kept_label]!r} in the "
                                   f"{kept_split} split")
    return DUPLICATE, f"identical bytes to an image kept in the {kept_split} split"


def rejected_row(uri: str, reason: str, detail: str) -> dict:
    """One line of rejected.jsonl."""
    return {"uri": uri, "reason": reason, "detail": detail}


def stored_pixels(stored: bytes, encoding: str, image_shape: list[int]) -> np.ndarray:
    """The pixels a record holds, as readers will see them (for the card's samples; a source record as PIL
    decodes it: the readers' rule to within a level or two, at a fraction of the cost of TensorFlow one file at a
    time)."""
    if encoding == data.RAW:
        return np.frombuffer(stored, np.uint8).reshape(image_shape)
    return data.decode_image(stored, image_shape[0], image_shape[1], image_shape[2])
