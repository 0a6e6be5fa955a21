"""The online augmentation policies (components/augment.py's AugmentPolicy) in numpy and Pillow, for the torch and
JAX training paths, where TensorFlow is not installed (components/train/portable_input.py).

Same policy, same parameters, same draws: every draw is keyed by (policy seed, copy, example index) and nothing
else, so an example's augmentation does not depend on the batch it is in, the thread that ran it or the attempt
(resumed or not), and it is TensorFlow's draw for that key: Philox4x32-10 over the stateless ops' key and counter
(their seed pair mixed by one Philox call), tf.random.stateless_uniform's floats bit for bit, stateless_normal's
Box-Muller within float32 rounding of the C library's log, sin and cos, and stateless_sample_distorted_bounding_box's
box for box. The same example gets the same augmentation on both paths (tests/test_portable_input.py):
  - the random resized crop's box: TensorFlow's sampler (sample_distorted_bounding_box_op.cc, GenerateRandomCrop),
    ported step by step in its float32, int and double arithmetic, with its draws (SimplePhilox);
  - the rotation/shift/zoom (ImageProjectiveTransformV3, bilinear, nearest fill), the elastic field's smoothing
    and sampling, the flip, contrast, brightness, noise and cutout: the same arithmetic in float32, rounded half to
    even, within a level where float32 order differs;
  - the crop's plain bilinear resizing (pixels.crop_to_shape) within a level: it is rounded to uint8 once before
    the rest of the policy, where TensorFlow keeps float32 to the end.
Whole batches are augmented at once (each example with its own draws), vectorized over the batch.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from components.dataio import pixels

# The streams of draws: augment.py's stateless seeds are its seed pair plus these offsets (the main draws, noise,
# cutout, the two elastic fields, the crop box).
MAIN, NOISE, CUTOUT, ELASTIC_Y, ELASTIC_X, CROP = range(6)
CROP_ATTEMPTS = 10

# Philox4x32-10 (Salmon et al. 2011) as TensorFlow runs it (xla/tsl/lib/random/philox_random.h): the multipliers,
# the Weyl key increments, and the fixed key that mixes a stateless op's seed pair into its key and counter
# (core/kernels/stateless_random_ops.cc, GenerateKey).
_PHILOX_M = (np.uint64(0xD2511F53), np.uint64(0xCD9E8D57))
_PHILOX_W = (np.uint64(0x9E3779B9), np.uint64(0xBB67AE85))
_SEED_KEY = (np.uint64(0x3EC8F720), np.uint64(0x02461E29))
_LOW = np.uint64(0xFFFFFFFF)
_32 = np.uint64(32)


def _philox(counter, key):
    """Philox4x32-10 of 4 counter words under 2 key words (uint64 arrays holding 32-bit values, broadcast):
    10 rounds, the key raised between them (PhiloxRandom::operator(), ComputeSingleRound, RaiseKey)."""
    c0, c1, c2, c3 = counter
    k0, k1 = key
    for round_ in range(10):
        if round_:
            k0, k1 = (k0 + _PHILOX_W[0]) & _LOW, (k1 + _PHILOX_W[1]) & _LOW
        p0, p1 = _PHILOX_M[0] * c0, _PHILOX_M[1] * c2  # exact: both factors < 2**32
        c0, c1, c2, c3 = (p1 >> _32) ^ c1 ^ k0, p1 & _LOW, (p0 >> _32) ^ c3 ^ k1, p0 & _LOW
    return c0, c1, c2, c3


def keys(indices, copy: int, seed: int) -> np.ndarray:
    """N x 2 uint64: each example's seed pair, augment._seed's [seed * 1_000_003 + copy, index] (int64, wrapping,
    as its two's complement)."""
    first = (int(seed) * 1_000_003 + int(copy)) % (1 << 64)
    index = np.asarray(indices, dtype=np.int64).astype(np.uint64)
    return np.stack([np.full(index.shape, first, dtype=np.uint64), index], axis=-1).reshape(-1, 2)


def _key_counter(example_keys: np.ndarray, stream: int):
    """The Philox key and the counter's high words of each example's stateless op seeded with its seed pair plus
    `stream` on both (augment.py's `seed + k`): GenerateKey's one Philox call over the seed pair under a fixed key;
    the counter's low words start at 0."""
    with np.errstate(over="ignore"):
        seeds = example_keys + np.uint64(stream)
    return _philox((seeds[:, 0] & _LOW, seeds[:, 0] >> _32, seeds[:, 1] & _LOW, seeds[:, 1] >> _32), _SEED_KEY)


def _bits(example_keys: np.ndarray, stream: int, count: int, first_block: int = 0) -> np.ndarray:
    """N x count uint32: the Philox output of each example's stream from block `first_block` on, 4 words a block
    in order (the counter's low 64 bits count the blocks)."""
    k0, k1, c2, c3 = (m[:, None] for m in _key_counter(example_keys, stream))
    blocks = np.arange(first_block, first_block + -(-count // 4), dtype=np.uint64)[None]
    out = _philox((blocks & _LOW, blocks >> _32, c2, c3), (k0, k1))
    return np.stack(out, axis=-1).reshape(len(example_keys), -1)[:, :count].astype(np.uint32)


def _unit_float(bits: np.ndarray) -> np.ndarray:
    """float32 in [0, 1) from uint32: 23 random mantissa bits under exponent 0, minus 1 (Uint32ToFloat,
    random_distributions_utils.h)."""
    return ((bits & np.uint32(0x7FFFFF)) | np.uint32(0x3F800000)).view(np.float32) - np.float32(1.0)


def uniform(example_keys: np.ndarray, stream: int, shape: tuple[int, ...]) -> np.ndarray:
    """float32 draws in [0, 1), N x shape: tf.random.stateless_uniform(shape, seed=seed pair + stream) of each
    example (StatelessRandomUniformV2 with Philox: element i is word i % 4 of block i // 4)."""
    return _unit_float(_bits(example_keys, stream, math.prod(shape))).reshape(len(example_keys), *shape)


def normal(example_keys: np.ndarray, stream: int, shape: tuple[int, ...]) -> np.ndarray:
    """Standard normal float32 draws, N x shape: tf.random.stateless_normal(shape, seed=seed pair + stream) of each
    example. Box-Muller on each pair of words of a block (BoxMullerFloat): u1 from the first (at least 1e-7),
    the angle 2 pi u from the second; sin times the radius first, then cos. Within float32 rounding of TensorFlow's
    (its log, sin and cos are the C library's)."""
    count = math.prod(shape)
    bits = _bits(example_keys, stream, count + count % 2)
    u1 = np.maximum(_unit_float(bits[:, 0::2]), np.float32(1.0e-7))
    angle = (2.0 * math.pi * _unit_float(bits[:, 1::2]).astype(np.float64)).astype(np.float32)
    radius = np.sqrt(np.float32(-2.0) * np.log(u1))
    out = np.stack([np.sin(angle) * radius, np.cos(angle) * radius], axis=-1).reshape(len(example_keys), -1)
    return out[:, :count].reshape(len(example_keys), *shape)


# ---------------------------------------------------------------------------------------------- crop box


class _Words:
    """Each example's stream of uint32 words, taken one at a time (SimplePhilox over a SingleSampleAdapter: the
    words of each Philox block in order), an independent cursor per example."""

    def __init__(self, example_keys: np.ndarray, stream: int, blocks: int = 12):
        self.example_keys, self.stream = example_keys, stream
        self.words = _bits(example_keys, stream, 4 * blocks)
        self.cursor = np.zeros(len(example_keys), dtype=np.int64)

    def take(self, wanted: np.ndarray) -> np.ndarray:
        """The next word of the examples `wanted` (bool N; their cursors advance), 0 for the others."""
        if wanted.any() and self.cursor[wanted].max() >= self.words.shape[1]:
            more = _bits(self.example_keys, self.stream, self.words.shape[1], self.words.shape[1] // 4)
            self.words = np.concatenate([self.words, more], axis=1)
        rows = np.arange(len(self.cursor))
        out = np.where(wanted, self.words[rows, np.minimum(self.cursor, self.words.shape[1] - 1)], np.uint32(0))
        self.cursor += wanted
        return out

    def uniform_int(self, n: np.ndarray, wanted: np.ndarray) -> np.ndarray:
        """An integer in [0, n) for the examples `wanted` (n >= 1): ExactUniformInt (exact_uniform_int.h), the
        low bits for a power of two, else words below 2**32 mod n rejected and the next one taken."""
        n = np.maximum(n, 1).astype(np.uint32)
        power_of_two = (n & (n - np.uint32(1))) == 0
        rem = (np.uint32(0xFFFFFFFF) % n) + np.uint32(1)
        out = np.zeros(len(n), dtype=np.uint32)
        pending = wanted.copy()
        while pending.any():
            word = self.take(pending)
            accepted = pending & (power_of_two | (word >= rem))
            out = np.where(accepted, np.where(power_of_two, word & (n - np.uint32(1)), word % n), out)
            pending &= ~accepted
        return out.astype(np.int64)


def crop_boxes(heights, widths, example_keys: np.ndarray, policy) -> np.ndarray:
    """N x 4 int (top, left, height, width): each example's tf.image.stateless_sample_distorted_bounding_box (no
    boxes, min_object_covered 0, the policy's area and aspect ranges, 10 attempts: augment._crop_box) with its
    seed pair + CROP, box for box."""
    heights = np.broadcast_to(np.asarray(heights, np.int64), (len(example_keys),))
    widths = np.broadcast_to(np.asarray(widths, np.int64), (len(example_keys),))
    return _sample_boxes(heights, widths, _Words(example_keys, CROP), policy.crop_scale_min, policy.crop_scale_max,
                         policy.crop_aspect_min, policy.crop_aspect_max)


def _sample_boxes(heights, widths, words: _Words, area_min, area_max, aspect_min, aspect_max) -> np.ndarray:
    """The sampler's loop (sample_distorted_bounding_box_op.cc: DoCompute and GenerateRandomCrop) for every
    example at once, in its float32 and int arithmetic, each example drawing its words only where the sampler
    does: an aspect ratio each attempt, a height when the range is not a single one, the top and left when the box
    fits; the whole image when no attempt gives a box."""
    f32 = np.float32
    count = len(heights)
    boxes = np.stack([np.zeros(count, np.int64), np.zeros(count, np.int64), heights, widths], axis=1)
    done = np.zeros(count, dtype=bool)
    min_area = f32(area_min) * widths.astype(f32) * heights.astype(f32)  # min_relative_crop_area * w * h, float
    max_area = f32(area_max) * widths.astype(f32) * heights.astype(f32)
    k_eps = float(f32(0.0000001))

    def rounded(ints, aspect):  # lrintf(int * float): the product in float32, rounded half to even
        return np.rint(ints.astype(f32) * aspect).astype(np.int64)

    for _ in range(CROP_ATTEMPTS):
        active = ~done
        aspect = _unit_float(words.take(active)) * (f32(aspect_max) - f32(aspect_min)) + f32(aspect_min)
        height = np.rint(np.sqrt(min_area / aspect)).astype(np.int64)
        max_height = np.rint(np.sqrt(max_area / aspect)).astype(np.int64)
        too_wide = rounded(max_height, aspect) > widths
        fitted = ((widths + 0.5 - k_eps) / aspect.astype(np.float64)).astype(np.int64)  # in double, truncated
        fitted = np.where(rounded(fitted, aspect) > widths, fitted - 1, fitted)
        max_height = np.where(too_wide, fitted, max_height)
        max_height = np.minimum(max_height, heights)
        height = np.minimum(height, max_height)
        drawn = active & (height < max_height)
        height = height + words.uniform_int(max_height - height + 1, drawn)
        width = rounded(height, aspect)
        area = (width * height).astype(f32)
        grow = area < min_area
        height = np.where(grow, height + 1, height)
        width = np.where(grow, rounded(height, aspect), width)
        area = (width * height).astype(f32)
        shrink = area > max_area
        height = np.where(shrink, height - 1, height)
        width = np.where(shrink, rounded(height, aspect), width)
        area = (width * height).astype(f32)
        ok = (active & (area >= min_area) & (area <= max_area) & (width <= widths) & (height <= heights)
              & (width > 0) & (height > 0) & (area >= 1))  # the last: SatisfiesOverlapConstraints' kMinArea
        top = words.uniform_int(heights - height, ok & (height < heights))
        left = words.uniform_int(widths - width, ok & (width < widths))
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
