"""Record images decoded without TensorFlow (Pillow and numpy): the counterpart of components/dataio/data.py's
decode_record_image, decode_to_shape (the resize rule of source records), decode_crop_to_shape (training's crop
of a source file) and resize_to_shape, for the torch and JAX training paths (components/train/portable_input.py).

What matches TensorFlow's path, and how closely (tests/test_portable_input.py checks each):
  - raw and PNG records: the same pixels;
  - JPEG records: Pillow's libjpeg-turbo with the same integer DCT (ISLOW, TensorFlow's INTEGER_ACCURATE) and fancy
    upsampling: the same pixels on our shards, at most a level or two apart in principle;
  - plain bilinear resizing (half-pixel centres, neighbours clamped at the edges of the box) is Pillow's affine
    transform with bilinear sampling, which is TensorFlow's arithmetic in double precision rounded half up: a
    level apart, rarely;
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
import math

import numpy as np

from components.dataio.storage import DataError

# The encodings and constants of components/dataio/data.py, repeated as plain values: data.py keeps TensorFlow out of
# its import time too, but this module must not depend on that staying true. tests/test_portable_input.py checks
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
    the target's, then resized as `resize_to_shape` does."""
    height, width, channels = image_shape
    img = _open(contents)
    if img.format == "JPEG":
        _draft(img, channels, dct_ratio((img.height, img.width), (height, width)))
    return _resize(_conform(img, channels), image_shape, None)


def decode_crop_to_shape(contents: bytes, image_shape, crop_box) -> np.ndarray:
    """A crop (top, left, height, width, in the file's pixels) of a JPEG or PNG file at `image_shape`, uint8, plain
    bilinear rounded as TensorFlow rounds (data.decode_crop_to_shape; see the module docstring for the DCT
    scale)."""
    img, box = _open_crop(contents, image_shape, crop_box)
    return _sample_box(img, box, tuple(image_shape[:2]), image_shape[2])


def _open_crop(contents: bytes, image_shape, crop_box):
    """The file opened at the DCT scale its crop allows (the largest keeping the crop at least the target's size),
    and the crop's box at that scale."""
    height, width, channels = image_shape
    top, left, crop_height, crop_width = (int(v) for v in crop_box)
    img = _open(contents)
    ratio = 1
    if img.format == "JPEG":
        ratio = dct_ratio((crop_height, crop_width), (height, width))
        _draft(img, channels, ratio)
    return _conform(img, channels), (top / ratio, left / ratio, crop_height / ratio, crop_width / ratio)


def resize_to_shape(image: np.ndarray, image_shape, *, antialias: bool | None = None) -> np.ndarray:
    """uint8 HxWxC of any size -> `image_shape` (data.resize_to_shape): unchanged at that size; antialiased
    (Pillow's triangle filter, the kernel of TensorFlow's antialiased bilinear) where a side shrinks ANTIALIAS_FROM
    times or more, or as `antialias` says; plain bilinear otherwise (`crop_to_shape`)."""
    if image.shape[:2] == tuple(image_shape[:2]):
        return image
    return _resize(_pil_image(image), image_shape, antialias)


def crop_to_shape(image: np.ndarray, box, out_size: tuple[int, int]) -> np.ndarray:
    """A box (top, left, height, width) of a uint8 HxWxC image resized to `out_size`, plain bilinear (the random
    resized crop of augment_image: tf.slice, then tf.image.resize)."""
    return _sample_box(_pil_image(image), tuple(float(v) for v in box), out_size, image.shape[-1])


def _resize(img, image_shape, antialias: bool | None) -> np.ndarray:
    from PIL import Image

    height, width, channels = image_shape
    if img.size == (width, height):
        pixels = np.asarray(img)
        return pixels[..., None] if channels == 1 else pixels
    if antialias is None:
        antialias = img.height >= int(ANTIALIAS_FROM * height) or img.width >= int(ANTIALIAS_FROM * width)
    if not antialias:
        return _sample_box(img, (0, 0, img.height, img.width), (height, width), channels)
    pixels = np.asarray(img.resize((width, height), Image.Resampling.BILINEAR))
    return pixels[..., None] if channels == 1 else pixels


def _pil_image(image: np.ndarray):
    from PIL import Image

    return Image.fromarray(image[..., 0] if image.shape[-1] == 1 else image)


def _conform(img, channels: int):
    mode = "L" if channels == 1 else "RGB"
    try:
        return img if img.mode == mode else img.convert(mode)
    except (OSError, SyntaxError, ValueError) as e:
        raise DataError(f"A record's image cannot be decoded ({e})") from None


def _sample_box(img, box, out_size: tuple[int, int], channels: int) -> np.ndarray:
    """A box (top, left, height, width; fractional allowed) of a PIL image at `out_size`, plain bilinear: Pillow's
    affine transform samples each output pixel's centre with the 2x2 bilinear taps and no antialiasing, which is
    TensorFlow's half-pixel bilinear (in = (i + 0.5) * scale - 0.5, neighbours clamped to the edge) once the box's
    pixels are cut out, so that the clamping happens at the box's edges as tf.slice + tf.image.resize do. Pillow
    computes in double precision, TensorFlow in float32: a level apart, rarely."""
    from PIL import Image

    height, width = out_size
    top, left, box_height, box_width = box
    first_row, first_col = math.floor(top), math.floor(left)
    region = img.crop((first_col, first_row, min(math.ceil(left + box_width), img.width),
                       min(math.ceil(top + box_height), img.height)))
    # Pillow truncates the 8-bit results of a transform: each channel is sampled as 32-bit float instead and
    # rounded here (half to even, as tf.round)
    data = (box_width / width, 0, left - first_col, 0, box_height / height, top - first_row)
    try:
        bands = [band.convert("F").transform((width, height), Image.Transform.AFFINE, data,
                                             resample=Image.Resampling.BILINEAR) for band in region.split()]
    except (OSError, SyntaxError, ValueError) as e:
        raise DataError(f"A record's image cannot be decoded ({e})") from None
    sampled = np.stack([np.asarray(band) for band in bands], axis=-1)
    return np.rint(sampled, out=sampled).clip(0, 255, out=sampled).astype(np.uint8)
