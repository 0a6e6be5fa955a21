"""The online augmentation policies (components/augment.py's AugmentPolicy) in numpy and Pillow, for the torch and
JAX training paths, where TensorFlow is not installed (components/train/portable_input.py).

Same policy, same parameters, same semantics: every draw is keyed by (policy seed, copy, example index) and nothing
else, so an example's augmentation does not depend on the batch it is in, the thread that ran it or the attempt
(resumed or not). The draws themselves come from a counter-based hash (splitmix64 of the key, the stream and the
draw's number), not TensorFlow's Philox streams: the same example gets other random values than on the TensorFlow
path, from the same distributions. What is exact, given the same draws (tests/test_portable_input.py):
  - the random resized crop's box: TensorFlow's sampler (sample_distorted_bounding_box_op.cc, GenerateRandomCrop:
    an aspect ratio uniform in the range, a height uniform between the area bounds', 10 attempts, else the whole
    image), ported step by step in float32;
  - the rotation/shift/zoom (ImageProjectiveTransformV3, bilinear, nearest fill), the elastic field's smoothing
    and sampling, the flip, contrast, brightness and cutout: the same arithmetic in float32, rounded half to even;
  - the crop's plain bilinear resizing (pixels.crop_to_shape) within a level: it is rounded to uint8 once before
    the rest of the policy, where TensorFlow keeps float32 to the end.
Whole batches are augmented at once (each example with its own draws), vectorized over the batch.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from components.dataio import pixels

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
# The streams of draws, as augment.py offsets its stateless seeds: the main draws, noise, cutout, the two elastic
# fields, the crop box.
MAIN, NOISE, CUTOUT, ELASTIC_Y, ELASTIC_X, CROP = range(6)
CROP_ATTEMPTS = 10


def _mix(z: np.ndarray) -> np.ndarray:
    """splitmix64's finalizer (uint64, wrapping)."""
    z = z ^ (z >> np.uint64(30))
    z = z * np.uint64(0xBF58476D1CE4E5B9)
    z = z ^ (z >> np.uint64(27))
    z = z * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def keys(indices, copy: int, seed: int) -> np.ndarray:
    """One uint64 key per example: a hash of (seed * 1_000_003 + copy, index), augment.py's seed pair."""
    with np.errstate(over="ignore"):
        first = np.uint64((int(seed) * 1_000_003 + int(copy)) % (1 << 64))
        index = np.asarray(indices, dtype=np.int64).astype(np.uint64)
        return _mix(_mix(first + _GOLDEN) ^ (index + _GOLDEN))


def uniform(example_keys: np.ndarray, stream: int, shape: tuple[int, ...]) -> np.ndarray:
    """float64 draws in [0, 1), N x shape: draw j of `stream` for each example's key."""
    count = math.prod(shape)
    with np.errstate(over="ignore"):
        counters = np.uint64(stream << 40) + np.arange(count, dtype=np.uint64)
        bits = _mix(example_keys[:, None] ^ _mix(counters + _GOLDEN)[None])
    return ((bits >> np.uint64(11)).astype(np.float64) * (1.0 / (1 << 53))).reshape(len(example_keys), *shape)


def normal(example_keys: np.ndarray, stream: int, shape: tuple[int, ...]) -> np.ndarray:
    """Standard normal float32 draws (Box-Muller of two uniform streams)."""
    u1 = uniform(example_keys, stream, shape)
    u2 = uniform(example_keys, stream + 64, shape)
    return (np.sqrt(-2.0 * np.log1p(-u1)) * np.cos(2.0 * np.pi * u2)).astype(np.float32)


# ---------------------------------------------------------------------------------------------- crop box


def crop_boxes(heights, widths, example_keys: np.ndarray, policy) -> np.ndarray:
    """N x 4 int (top, left, height, width): TensorFlow's sample_distorted_bounding_box with no boxes,
    min_object_covered 0, the policy's area and aspect ranges and 10 attempts (augment._crop_box), per example,
    with this module's draws: 4 a attempt (aspect, height, top, left)."""
    heights = np.broadcast_to(np.asarray(heights, np.int64), (len(example_keys),))
    widths = np.broadcast_to(np.asarray(widths, np.int64), (len(example_keys),))
    draws = uniform(example_keys, CROP, (CROP_ATTEMPTS, 4)).astype(np.float32)
    return _sample_boxes(heights, widths, draws, policy.crop_scale_min, policy.crop_scale_max,
                         policy.crop_aspect_min, policy.crop_aspect_max)


def _sample_boxes(heights, widths, draws, area_min, area_max, aspect_min, aspect_max) -> np.ndarray:
    f32 = np.float32
    count = len(heights)
    boxes = np.stack([np.zeros(count, np.int64), np.zeros(count, np.int64), heights, widths], axis=1)
    done = np.zeros(count, dtype=bool)
    image_area = (widths * heights).astype(f32)  # original_width * original_height, in float
    min_area = f32(area_min) * image_area
    max_area = f32(area_max) * image_area
    for attempt in range(draws.shape[1]):
        aspect = draws[:, attempt, 0] * (f32(aspect_max) - f32(aspect_min)) + f32(aspect_min)
        height = np.rint(np.sqrt(min_area / aspect)).astype(np.int64)  # lrintf: round half to even
        max_height = np.rint(np.sqrt(max_area / aspect)).astype(np.int64)
        too_wide = np.rint(max_height * aspect) > widths
        fitted = ((widths + 0.5 - 0.0000001) / aspect).astype(np.int64)
        fitted = np.where(np.rint(fitted * aspect) > widths, fitted - 1, fitted)
        max_height = np.where(too_wide, fitted, max_height)
        max_height = np.minimum(max_height, heights)
        height = np.minimum(height, max_height)
        span = max_height - height + 1  # Uniform(span): an integer in [0, span)
        height = height + np.where(height < max_height, (draws[:, attempt, 1] * span).astype(np.int64), 0)
        width = np.rint(height * aspect).astype(np.int64)
        area = (width * height).astype(f32)
        grow = area < min_area
        height = np.where(grow, height + 1, height)
        width = np.where(grow, np.rint(height * aspect).astype(np.int64), width)
        area = (width * height).astype(f32)
        shrink = area > max_area
        height = np.where(shrink, height - 1, height)
        width = np.where(shrink, np.rint(height * aspect).astype(np.int64), width)
        area = (width * height).astype(f32)
        ok = ((area >= min_area) & (area <= max_area) & (width <= widths) & (height <= heights) & (width > 0)
              & (height > 0) & (area >= 1) & ~done)
        top = np.where(height < heights, (draws[:, attempt, 2] * np.maximum(heights - height, 1)).astype(np.int64), 0)
        left = np.where(width < widths, (draws[:, attempt, 3] * np.maximum(widths - width, 1)).astype(np.int64), 0)
        boxes[ok] = np.stack([top, left, height, width], axis=1)[ok]
        done |= ok
    return boxes


# ---------------------------------------------------------------------------------------------- the policy


def augment_batch(images: np.ndarray, indices, copy: int, policy) -> np.ndarray:
    """augment.augment_image for a batch (uint8 N x H x W x C, the examples' indices): uint8 of the same shape."""
    count, height, width, channels = images.shape
    example_keys = keys(indices, copy, policy.seed)
    u = (uniform(example_keys, MAIN, (8,)) * 2.0 - 1.0).astype(np.float32)
    x = images.astype(np.float32)
    if policy.random_resized_crop:
        boxes = crop_boxes(height, width, example_keys, policy)
        # resized from the uint8 pixels by Pillow (pixels.crop_to_shape), rounded once there: TensorFlow keeps the
        # crop in float32 until the end of the policy, a half level apart at most
        x = np.stack([pixels.crop_to_shape(image, box, (height, width)) for image, box in zip(images, boxes)]
                     ).astype(np.float32)
    if policy.rotation_degrees or policy.zoom_range or policy.shift_fraction:
        angle = u[:, 0] * np.float32(policy.rotation_degrees * math.pi / 180.0)
        scale = np.float32(1.0) + u[:, 1] * np.float32(policy.zoom_range)
        tx = u[:, 2] * np.float32(policy.shift_fraction) * np.float32(width)
        ty = u[:, 3] * np.float32(policy.shift_fraction) * np.float32(height)
        x = _transform(x, angle, scale, tx, ty)
    if policy.elastic_alpha:
        x = _elastic(x, example_keys, policy.elastic_alpha, policy.elastic_sigma)
    if policy.horizontal_flip:
        flip = u[:, 4] > 0
        x[flip] = x[flip][:, :, ::-1]
    if policy.contrast:
        mean = x.mean(axis=(1, 2, 3), keepdims=True, dtype=np.float32)
        x = (x - mean) * (np.float32(1.0) + u[:, 5, None, None, None] * np.float32(policy.contrast)) + mean
    if policy.brightness:
        x = x + (u[:, 6] * np.float32(policy.brightness) * np.float32(255.0))[:, None, None, None]
    if policy.noise_stddev:
        x = x + normal(example_keys, NOISE, (height, width, channels)) * np.float32(policy.noise_stddev * 255.0)
    if policy.cutout_fraction:
        side_h = max(1, int(round(height * policy.cutout_fraction)))
        side_w = max(1, int(round(width * policy.cutout_fraction)))
        centre = uniform(example_keys, CUTOUT, (2,)).astype(np.float32)
        y0 = (centre[:, 0] * (height - side_h + 1)).astype(np.int64)[:, None, None]
        x0 = (centre[:, 1] * (width - side_w + 1)).astype(np.int64)[:, None, None]
        rows = np.arange(height)[None, :, None]
        cols = np.arange(width)[None, None, :]
        inside = (rows >= y0) & (rows < y0 + side_h) & (cols >= x0) & (cols < x0 + side_w)
        x = np.where(inside[..., None], np.float32(0.0), x)
    return np.clip(np.rint(x), 0, 255).astype(np.uint8)


def _bilinear(x: np.ndarray, sy: np.ndarray, sx: np.ndarray) -> np.ndarray:
    """x (N x H x W x C float32) sampled at N x h x w coordinates already inside the image, as TensorFlow's
    projective transform samples (image_ops.h bilinear_interpolation): weights from floor and floor + 1, a
    neighbour past the edge weighing 0."""
    count, height, width, _ = x.shape
    y_floor, x_floor = np.floor(sy), np.floor(sx)
    y_ceil, x_ceil = y_floor + np.float32(1), x_floor + np.float32(1)
    r0 = y_floor.astype(np.int64)
    c0 = x_floor.astype(np.int64)
    r1 = np.minimum(r0 + 1, height - 1)
    c1 = np.minimum(c0 + 1, width - 1)
    n = np.arange(count)[:, None, None]
    wx0, wx1 = (x_ceil - sx)[..., None], (sx - x_floor)[..., None]
    top = wx0 * x[n, r0, c0] + wx1 * x[n, r0, c1]
    bottom = wx0 * x[n, r1, c0] + wx1 * x[n, r1, c1]
    return (y_ceil - sy)[..., None] * top + (sy - y_floor)[..., None] * bottom


def _transform(x: np.ndarray, angle, scale, tx, ty) -> np.ndarray:
    """Rotation by `angle` and zoom by `scale` around the centre, then a shift (augment.augment_image's
    transform): bilinear, coordinates outside clamped to the edge (fill_mode NEAREST)."""
    count, height, width, _ = x.shape
    f32 = np.float32
    cx, cy = f32((width - 1) / 2.0), f32((height - 1) / 2.0)
    cos, sin = np.cos(angle).astype(f32), np.sin(angle).astype(f32)
    ox, oy = cx + tx, cy + ty
    a0, a1, a2 = cos / scale, sin / scale, cx - (cos * ox + sin * oy) / scale
    b0, b1, b2 = -sin / scale, cos / scale, cy - (-sin * ox + cos * oy) / scale
    cols = np.arange(width, dtype=f32)[None, None, :]
    rows = np.arange(height, dtype=f32)[None, :, None]
    e = (slice(None), None, None)
    sx = a0[e] * cols + a1[e] * rows + a2[e]
    sy = b0[e] * cols + b1[e] * rows + b2[e]
    sx = np.clip(sx, f32(0), f32(width - 1))
    sy = np.clip(sy, f32(0), f32(height - 1))
    return _bilinear(x, sy, sx).astype(f32)


def _smoothing_matrix(size: int, sigma: float) -> np.ndarray:
    """size x size: a field times it is the field blurred along that axis by a gaussian of `sigma` pixels,
    borders reflected (augment._smooth: tf.pad REFLECT, then a VALID convolution)."""
    radius = int(min(math.ceil(3 * sigma), size - 1))
    taps = np.arange(-radius, radius + 1, dtype=np.float32)
    kernel = np.exp(np.float32(-0.5) * (taps / np.float32(sigma)) ** 2)
    kernel = kernel / kernel.sum(dtype=np.float32)
    matrix = np.zeros((size, size), dtype=np.float32)
    for out in range(size):
        for tap, weight in zip(range(-radius, radius + 1), kernel):
            source = out + tap
            source = -source if source < 0 else (2 * (size - 1) - source if source >= size else source)
            matrix[source, out] += weight
    return matrix


def _elastic(x: np.ndarray, example_keys: np.ndarray, alpha: float, sigma: float) -> np.ndarray:
    count, height, width, _ = x.shape
    rows_blur, cols_blur = _smoothing_matrix(height, sigma), _smoothing_matrix(width, sigma)

    def field(stream):
        noise = (uniform(example_keys, stream, (height, width)) * 2.0 - 1.0).astype(np.float32)
        return np.swapaxes(np.swapaxes(noise, 1, 2) @ rows_blur, 1, 2) @ cols_blur * np.float32(alpha)

    dy, dx = field(ELASTIC_Y), field(ELASTIC_X)
    rows = np.arange(height, dtype=np.float32)[None, :, None]
    cols = np.arange(width, dtype=np.float32)[None, None, :]
    sy = np.clip(rows + dy, np.float32(0), np.float32(height - 1))
    sx = np.clip(cols + dx, np.float32(0), np.float32(width - 1))
    y0, x0 = np.floor(sy), np.floor(sx)
    wy, wx = (sy - y0)[..., None], (sx - x0)[..., None]
    r0, c0 = y0.astype(np.int64), x0.astype(np.int64)
    r1, c1 = np.minimum(r0 + 1, height - 1), np.minimum(c0 + 1, width - 1)
    n = np.arange(count)[:, None, None]
    top = x[n, r0, c0] * (1 - wx) + x[n, r0, c1] * wx
    bottom = x[n, r1, c0] * (1 - wx) + x[n, r1, c1] * wx
    return (top * (1 - wy) + bottom * wy).astype(np.float32)


def augment_sources(contents: list[bytes], indices, copy: int, policy, image_shape) -> np.ndarray:
    """augment.augment_source for a batch of source records (JPEG/PNG file bytes, any size): the random resized
    crop drawn on each file's own pixels and decoded from it (pixels.decode_crop_to_shape), or each file decoded
    with the readers' rule when the policy has no crop; then the rest of the policy on the batch."""
    height, width, channels = image_shape
    out = np.empty((len(contents), height, width, channels), dtype=np.uint8)
    if policy.random_resized_crop:
        sizes = np.array([pixels.source_size(c) for c in contents], dtype=np.int64).reshape(-1, 2)
        boxes = crop_boxes(sizes[:, 0], sizes[:, 1], keys(indices, copy, policy.seed), policy)
        for i, (item, box) in enumerate(zip(contents, boxes)):
            out[i] = pixels.decode_crop_to_shape(item, image_shape, box)
        policy = dataclasses.replace(policy, random_resized_crop=False)
    else:
        for i, item in enumerate(contents):
            out[i] = pixels.decode_to_shape(item, image_shape)
    return out if policy.is_identity else augment_batch(out, indices, copy, policy)
