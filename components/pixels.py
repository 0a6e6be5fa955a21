"""Record images decoded without TensorFlow (Pillow and numpy): the counterpart of components/data.py's
decode_record_image, decode_to_shape (the resize rule of source records), decode_crop_to_shape (training's crop
of a source file) and resize_to_shape, for the torch and JAX training paths (components/train/portable_input.py).

What matches TensorFlow's path, and how closely (tests/test_portable_input.py checks each):
  - raw and PNG records: the same pixels;
  - JPEG records: Pillow's libjpeg-turbo with the same integer DCT (ISLOW, TensorFlow's INTEGER_ACCURATE) and fancy
    upsampling: the same pixels on our shards, at most a level or two apart in principle;
  - plain bilinear resizing (half-pixel centres, TensorFlow's clamping) is written here in float32 in the same
    order of operations as TensorFlow's kernel, rounded half to even as tf.round: the same pixels up to float
    rounding (a level at most, rarely);
  - antialiased resizing (a side shrinking ANTIALIAS_FROM times or more) is Pillow's triangle filter, the kernel
    TensorFlow's scale_and_translate uses: within a level or two;
  - the DCT scale of a JPEG source is chosen by the same rule (data.DCT_RATIOS) and obtained with Image.draft;
  - the crop of a source JPEG: Pillow cannot decode only some blocks, so the whole file is decoded at the
    largest DCT scale (1/2, 1/4, 1/8) that keeps the crop at least the target size, and the crop's box is
    sampled from it. TensorFlow decodes the crop's blocks at full scale and samples those: the same region,
    a slightly smoother image where the crop is more than twice the target (the DCT scaling averages where
    plain bilinear sampling skips), which for a random augmentation is no loss.
"""

from __future__ import annotations

import io

import numpy as np

from components.storage import DataError

# The encodings and constants of components/data.py, repeated as plain values: data.py keeps TensorFlow out of its
# import time too, but this module must not depend on that staying true. tests/test_portable_input.py checks
# that they agree.
RAW, PNG, JPEG, ENCODED, SOURCE = "raw", "png", "jpeg", "encoded", "source"
IMAGE_ENCODINGS = (RAW, PNG, JPEG, ENCODED, SOURCE)
DCT_RATIOS = (1, 2, 4, 8)
ANTIALIAS_FROM = 3.0


def _open(contents: bytes):
    from PIL import Image, UnidentifiedImageError

    try:
        return Image.open(io.BytesIO(contents))
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as e:
        raise DataError(f"A record's image cannot be decoded ({e}; {len(contents)} bytes, starts "
                        f"{bytes(contents[:8])!r})") from None


def _array(img, channels: int) -> np.ndarray:
    """The loaded image as uint8 HxWxC: grayscale replicated to RGB, alpha dropped (as tf.io.decode_png and
    decode_jpeg do with `channels`)."""
    mode = "L" if channels == 1 else "RGB"
    try:
        if img.mode != mode:
            img = img.convert(mode)
        pixels = np.asarray(img)
    except (OSError, SyntaxError, ValueError) as e:
        raise DataError(f"A record's image cannot be decoded ({e})") from None
    return pixels[..., None] if channels == 1 else pixels


def is_jpeg(contents: bytes) -> bool:
    return contents[:3] == b"\xff\xd8\xff"


def decode(contents: bytes, channels: int) -> np.ndarray:
    """A PNG or JPEG file's bytes at its own size, uint8 HxWxC."""
    img = _open(contents)
    if img.format == "JPEG":
        img.draft("L" if channels == 1 else "RGB", None)
    return _array(img, channels)


def decode_record_image(contents: bytes, image_shape, encoding: str) -> np.ndarray:
    """The uint8 HxWxC image a record stores (data.decode_record_image), its shape checked against the
    manifest's."""
    height, width, channels = image_shape
    if encoding == SOURCE:
        return decode_to_shape(contents, image_shape)
    if encoding == RAW:
        image = np.frombuffer(contents, dtype=np.uint8)
        if image.size != height * width * channels:
            raise DataError(f"A raw record holds {image.size} bytes, not the {height}x{width}x{channels} of the "
                            "dataset's image_shape")
        return image.reshape(height, width, channels)
    if encoding not in IMAGE_ENCODINGS:
        raise DataError(f"Unknown image_encoding {encoding!r} (known: {', '.join(IMAGE_ENCODINGS)})")
    image = decode(contents, channels)
    if image.shape != (height, width, channels):
        raise DataError(f"A record's image is {'x'.join(map(str, image.shape))}, not the dataset's image_shape "
                        f"{height}x{width}x{channels}")
    return image


def dct_ratio(size: tuple[int, int], target: tuple[int, int]) -> int:
    """The largest of DCT_RATIOS at which libjpeg's scaled size (ceil(side / ratio)) keeps both sides of `size`
    (height, width) at least the target's (data.decode_to_shape's rule)."""
    fits = [r for r in DCT_RATIOS if -(-size[0] // r) >= target[0] and -(-size[1] // r) >= target[1]]
    return max(fits) if fits else 1


def _draft(img, channels: int, ratio: int) -> None:
    """Asks Pillow's JPEG decoder for scale 1/ratio: Image.draft picks the largest power of two up to
    min(width // w, height // h) for a requested (w, h), which for (width // ratio, height // ratio) is ratio."""
    width, height = img.size
    img.draft("L" if channels == 1 else "RGB", (max(1, width // ratio), max(1, height // ratio)))


def source_size(contents: bytes) -> tuple[int, int]:
    """(height, width) of a JPEG or PNG file, from its header (data.source_shape)."""
    img = _open(contents)
    return img.height, img.width


def decode_to_shape(contents: bytes, image_shape) -> np.ndarray:
    """The resize rule (data.decode_to_shape): JPEGs decoded at the DCT scale that keeps both sides at least
    the target's, then `resize_to_shape`."""
    height, width, channels = image_shape
    img = _open(contents)
    if img.format == "JPEG":
        _draft(img, channels, dct_ratio((img.height, img.width), (height, width)))
    return resize_to_shape(_array(img, channels), image_shape)


def decode_crop_to_shape(contents: bytes, image_shape, crop_box) -> np.ndarray:
    """A crop (top, left, height, width, in the file's pixels) of a JPEG or PNG file at `image_shape`, plain
    bilinear (data.decode_crop_to_shape; see the module docstring for the DCT scale)."""
    height, width, channels = image_shape
    top, left, crop_height, crop_width = (int(v) for v in crop_box)
    img = _open(contents)
    ratio = 1
    if img.format == "JPEG":
        ratio = dct_ratio((crop_height, crop_width), (height, width))
        _draft(img, channels, ratio)
    image = _array(img, channels)
    box = np.array([[top / ratio, left / ratio, crop_height / ratio, crop_width / ratio]], dtype=np.float64)
    return resize_boxes(image[None], box, (height, width))[0]


def resize_to_shape(image: np.ndarray, image_shape, *, antialias: bool | None = None) -> np.ndarray:
    """uint8 HxWxC of any size -> `image_shape` (data.resize_to_shape): unchanged at that size; antialiased
    (Pillow's triangle filter) where a side shrinks ANTIALIAS_FROM times or more, or as `antialias` says; plain
    bilinear otherwise."""
    height, width, channels = image_shape
    if image.shape[:2] == (height, width):
        return image
    if antialias is None:
        antialias = image.shape[0] >= int(ANTIALIAS_FROM * height) or image.shape[1] >= int(ANTIALIAS_FROM * width)
    if antialias:
        from PIL import Image

        resized = Image.fromarray(image[..., 0] if channels == 1 else image).resize(
            (width, height), Image.Resampling.BILINEAR)
        out = np.asarray(resized)
        return out[..., None] if channels == 1 else out
    box = np.array([[0, 0, image.shape[0], image.shape[1]]], dtype=np.float64)
    return resize_boxes(image[None], box, (height, width))[0]


def _axis(starts: np.ndarray, lengths: np.ndarray, size: int, out: int):
    """Per example, the source rows (or columns) of `out` samples of a box [start, start + length) of an axis of
    `size` pixels: TensorFlow's half-pixel bilinear (resize_bilinear_op.cc: in = (i + 0.5) * scale - 0.5, lower =
    max(floor(in), 0), upper = min(ceil(in), size - 1), lerp = in - floor(in)), with the box's edges as the
    clamps, as slicing the box first would make them. Computed in float32, as the kernel is."""
    scale = (lengths / out).astype(np.float32)[:, None]
    local = (np.arange(out, dtype=np.float32)[None] + np.float32(0.5)) * scale - np.float32(0.5)
    floor = np.floor(local)
    lerp = (local - floor).astype(np.float32)
    first = np.floor(starts).astype(np.int64)[:, None]
    last = np.minimum(np.ceil(starts + lengths).astype(np.int64), size)[:, None] - 1
    origin = (starts - np.floor(starts)).astype(np.float32)[:, None]  # 0 for integer boxes
    if np.any(origin):
        local = local + origin
        floor = np.floor(local)
        lerp = (local - floor).astype(np.float32)
    lower = np.clip(first + floor.astype(np.int64), first, last)
    upper = np.clip(first + np.ceil(local).astype(np.int64), first, last)
    return lower, upper, lerp


def resize_boxes(images: np.ndarray, boxes: np.ndarray, out_size: tuple[int, int]) -> np.ndarray:
    """Boxes (top, left, height, width; N x 4, fractional allowed) of N images (uint8 or float, N x h x w x C),
    each resized to `out_size` with plain bilinear sampling: uint8 rounded half to even (tf.round) for uint8 input,
    float32 otherwise."""
    height, width = out_size
    count = len(images)
    y0, y1, wy = _axis(boxes[:, 0], boxes[:, 2], images.shape[1], height)
    x0, x1, wx = _axis(boxes[:, 1], boxes[:, 3], images.shape[2], width)
    n = np.arange(count)[:, None, None]
    source = images if images.dtype == np.float32 else images.astype(np.float32)

    def at(rows, cols):
        return source[n, rows[:, :, None], cols[:, None, :]]

    wx = wx[:, None, :, None]
    top_left, top_right = at(y0, x0), at(y0, x1)
    top = top_left + (top_right - top_left) * wx
    bottom_left, bottom_right = at(y1, x0), at(y1, x1)
    bottom = bottom_left + (bottom_right - bottom_left) * wx
    out = top + (bottom - top) * wy[:, :, None, None]
    if images.dtype == np.uint8:
        return np.clip(np.rint(out), 0, 255).astype(np.uint8)
    return out
