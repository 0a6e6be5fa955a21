"""Augment: seeded random geometric, elastic and photometric changes to training images.

The policy (JSON, a pipeline parameter) declares a random resized crop and a horizontal flip (both off by default:
they suit photos, not digits or centred clothing), rotation, shift, zoom, brightness, contrast, gaussian noise,
elastic distortion, cutout, and a seed. A named preset fills in a standard recipe: `{"preset": "photo"}` (or just
`photo`) is the random resized crop and horizontal flip of the Inception/ImageNet recipe, with the other geometric
changes off; keys given beside the preset override it (`{"preset": "photo", "crop_scale_min": 0.25}`).

One implementation (`augment_image`) serves both modes, so a seed gives the same images in both:
  - offline: materialise `copies` augmented copies of every training image into new shards (the originals
    are kept), for expensive policies and reuse across runs;
  - online: write no images; the policy travels in the output manifest and training applies it on the fly
    inside its tf.data pipeline (copy k of offline == epoch k of online for the same example).
With `copies=0` in offline mode the training data passes through unchanged, without being copied.

Every draw is keyed by (policy seed, copy, example index), with stateless random ops: no hidden state, so
results do not depend on thread scheduling, order of evaluation or the machine.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import math
import time

from components import params, stepcli
from components.dataio import data

log = logging.getLogger(__name__)

PASSTHROUGH = "passthrough"

# Named policies: the keys each sets, before the keys given beside it. "photo" is the standard recipe for natural
# images (Szegedy et al. 2015, torchvision's RandomResizedCrop): a crop of 8%-100% of the area with an aspect
# ratio in [3/4, 4/3], resized back to the image size, and a horizontal flip; no rotation, shift or zoom.
PRESETS: dict[str, dict] = {
    "photo": {"random_resized_crop": True, "crop_scale_min": 0.08, "crop_scale_max": 1.0, "crop_aspect_min": 3 / 4,
              "crop_aspect_max": 4 / 3, "horizontal_flip": True, "rotation_degrees": 0.0, "shift_fraction": 0.0,
              "zoom_range": 0.0},
}


@dataclasses.dataclass
class AugmentPolicy:
    """Ranges of the random changes; each draw is uniform in [-x, x] unless said otherwise."""

    preset: str = ""  # a name in PRESETS whose keys apply first; "" for none
    # Random resized crop: a box of crop_scale_min..crop_scale_max of the image's area, with a width/height ratio
    # in crop_aspect_min..crop_aspect_max, resized back to the image size (bilinear). Up to 10 draws look for a
    # box that fits; when none does, the whole image is kept (as tf.image and torchvision do).
    random_resized_crop: bool = False  # off by default: it can cut the object out of a centred, tightly framed image
    crop_scale_min: float = 0.08
    crop_scale_max: float = 1.0
    crop_aspect_min: float = 3 / 4
    crop_aspect_max: float = 4 / 3
    rotation_degrees: float = 10.0
    shift_fraction: float = 0.08  # of the image size, each axis
    zoom_range: float = 0.08  # scale in [1 - z, 1 + z]
    horizontal_flip: bool = False  # off by default: it breaks digits and text
    brightness: float = 0.0  # additive, as a fraction of 255
    contrast: float = 0.0  # factor in [1 - c, 1 + c] around the image mean
    noise_stddev: float = 0.0  # gaussian noise, as a fraction of 255
    elastic_alpha: float = 0.0  # elastic distortion strength in pixels (Simard et al. 2003 use 34 on 28x28)
    elastic_sigma: float = 4.0  # smoothness of the elastic displacement field, in pixels
    cutout_fraction: float = 0.0  # side of a zeroed square, as a fraction of the image size
    seed: int = 0

    @classmethod
    def from_json(cls, text: str | dict | None) -> "AugmentPolicy":
        """A policy from a JSON object (or its text), or from a bare preset name such as `photo`."""
        raw = text if isinstance(text, dict) else {}
        if isinstance(text, str) and text.strip() in PRESETS:
            raw = {"preset": text.strip()}
        elif isinstance(text, str) and text.strip():
            try:
                raw = json.loads(text)
            except ValueError as e:
                raise ValueError(f"Augmentation policy {text.strip()!r} is neither a JSON object ({e}) nor a "
                                 f"preset name ({', '.join(sorted(PRESETS))})") from None
        if not isinstance(raw, dict):
            raise ValueError(f"Augmentation policy must be a JSON object or a preset name, got {raw!r}")
        unknown = sorted(set(raw) - {f.name for f in dataclasses.fields(cls)})
        if unknown:
            allowed = ", ".join(f.name for f in dataclasses.fields(cls))
            raise ValueError(f"Unknown augmentation policy keys {unknown}; allowed: {allowed}")
        for field in dataclasses.fields(cls):
            if field.name not in raw:
                continue
            value = raw[field.name]
            if field.type == "bool" and not isinstance(value, bool):
                raise ValueError(f"Augmentation policy {field.name} must be true or false, got {value!r}")
            if field.type == "int" and (not isinstance(value, int) or isinstance(value, bool)):
                raise ValueError(f"Augmentation policy {field.name} must be an integer, got {value!r}")
            if field.type == "float" and (not isinstance(value, (int, float)) or isinstance(value, bool)):
                raise ValueError(f"Augmentation policy {field.name} must be a number, got {value!r}")
            if field.type == "str" and not isinstance(value, str):
                raise ValueError(f"Augmentation policy {field.name} must be a string, got {value!r}")
        preset = raw.get("preset", "")
        if preset and preset not in PRESETS:
            raise ValueError(f"Unknown augmentation preset {preset!r}; presets: {', '.join(sorted(PRESETS))}")
        policy = cls(**{**PRESETS.get(preset, {}), **raw})
        for name in ("rotation_degrees", "shift_fraction", "zoom_range", "brightness", "contrast",
                     "noise_stddev", "elastic_alpha", "cutout_fraction"):
            if getattr(policy, name) < 0:
                raise ValueError(f"Augmentation policy {name} must be >= 0, got {getattr(policy, name)}")
        if policy.zoom_range >= 1 or policy.cutout_fraction >= 1 or policy.shift_fraction >= 1:
            raise ValueError("zoom_range, shift_fraction and cutout_fraction must be < 1")
        if not 0 < policy.crop_scale_min <= policy.crop_scale_max <= 1:
            raise ValueError(f"The crop scale range must satisfy 0 < crop_scale_min <= crop_scale_max <= 1, got "
                             f"{policy.crop_scale_min}..{policy.crop_scale_max}")
        if not 0 < policy.crop_aspect_min <= policy.crop_aspect_max:
            raise ValueError(f"The crop aspect range must satisfy 0 < crop_aspect_min <= crop_aspect_max, got "
                             f"{policy.crop_aspect_min}..{policy.crop_aspect_max}")
        if policy.elastic_alpha and policy.elastic_sigma <= 0:
            raise ValueError(f"elastic_sigma must be > 0 when elastic_alpha is set, got {policy.elastic_sigma}")
        return policy

    @property
    def is_identity(self) -> bool:
        return not any((self.random_resized_crop, self.rotation_degrees, self.shift_fraction, self.zoom_range,
                        self.horizontal_flip, self.brightness, self.contrast, self.noise_stddev, self.elastic_alpha,
                        self.cutout_fraction))

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


def policy_problem(text: str) -> str | None:
    """What is wrong with an augment_policy value (None: nothing): the pipeline parameter's check."""
    try:
        AugmentPolicy.from_json(text)
    except (ValueError, TypeError) as e:
        return str(e)
    return None


def augment_image(image, index, copy, policy: AugmentPolicy):
    """Augments one uint8 HxWxC image tensor; (policy.seed, copy, index) fixes every random draw."""
    import tensorflow as tf

    height, width, channels = image.shape
    seed = _seed(index, copy, policy)
    u = tf.random.stateless_uniform([8], seed=seed, minval=-1.0, maxval=1.0)
    x = tf.cast(image, tf.float32)
    if policy.random_resized_crop:
        x = _random_resized_crop(x, seed + 5, policy)

    angle = u[0] * policy.rotation_degrees * math.pi / 180.0
    scale = 1.0 + u[1] * policy.zoom_range
    tx, ty = u[2] * policy.shift_fraction * width, u[3] * policy.shift_fraction * height
    if policy.rotation_degrees or policy.zoom_range or policy.shift_fraction:
        # The transform maps output pixel coordinates to input ones: the inverse of
        # p_out = c + scale * R(angle) (p_in - c) + t, around the image centre c.
        cx, cy = (width - 1) / 2.0, (height - 1) / 2.0
        cos, sin = tf.cos(angle), tf.sin(angle)
        ox, oy = cx + tx, cy + ty
        transform = tf.stack([
            cos / scale, sin / scale, cx - (cos * ox + sin * oy) / scale,
            -sin / scale, cos / scale, cy - (-sin * ox + cos * oy) / scale,
            0.0, 0.0,
        ])[None]
        x = tf.raw_ops.ImageProjectiveTransformV3(
            images=x[None], transforms=transform, output_shape=tf.constant([height, width]),
            fill_value=0.0, interpolation="BILINEAR", fill_mode="NEAREST")[0]
    if policy.elastic_alpha:
        x = _elastic(x, seed, policy.elastic_alpha, policy.elastic_sigma)
    if policy.horizontal_flip:
        x = tf.cond(u[4] > 0, lambda: tf.reverse(x, axis=[1]), lambda: x)
    if policy.contrast:
        mean = tf.reduce_mean(x)
        x = (x - mean) * (1.0 + u[5] * policy.contrast) + mean
    if policy.brightness:
        x = x + u[6] * policy.brightness * 255.0
    if policy.noise_stddev:
        x = x + tf.random.stateless_normal(tf.shape(x), seed=seed + 1) * policy.noise_stddev * 255.0
    if policy.cutout_fraction:
        side_h = max(1, int(round(height * policy.cutout_fraction)))
        side_w = max(1, int(round(width * policy.cutout_fraction)))
        centre = tf.random.stateless_uniform([2], seed=seed + 2)
        y0 = tf.cast(centre[0] * (height - side_h + 1), tf.int32)
        x0 = tf.cast(centre[1] * (width - side_w + 1), tf.int32)
        rows = tf.range(height)[:, None, None]
        cols = tf.range(width)[None, :, None]
        inside = (rows >= y0) & (rows < y0 + side_h) & (cols >= x0) & (cols < x0 + side_w)
        x = tf.where(inside, 0.0, x)
    return tf.cast(tf.clip_by_value(tf.round(x), 0.0, 255.0), tf.uint8)


def _seed(index, copy, policy: AugmentPolicy):
    import tensorflow as tf

    return tf.stack([tf.cast(policy.seed, tf.int64) * 1_000_003 + tf.cast(copy, tf.int64), tf.cast(index, tf.int64)])


def augment_source(contents, index, copy, policy: AugmentPolicy, image_shape):
    """`augment_image` for a source record (a JPEG/PNG file's bytes, any size; data.SOURCE): the random resized
    crop is drawn on the file's own pixels and only its blocks are decoded (data.decode_crop_to_shape: the
    ImageNet input pipelines' decode_and_crop_jpeg), then resized to `image_shape`; the rest of the policy runs at
    that size. Without a crop the file is decoded with the readers' rule (data.decode_to_shape)."""
    if not policy.random_resized_crop:
        image = data.decode_to_shape(contents, image_shape)
        return image if policy.is_identity else augment_image(image, index, copy, policy)
    begin, size = _crop_box(data.source_shape(contents, image_shape[2]), _seed(index, copy, policy) + 5, policy)
    image = data.decode_crop_to_shape(contents, image_shape, [begin[0], begin[1], size[0], size[1]])
    rest = dataclasses.replace(policy, random_resized_crop=False)
    return image if rest.is_identity else augment_image(image, index, copy, rest)


def _crop_box(shape, seed, policy: AugmentPolicy):
    """(begin, size) of a random box of an image of `shape` (area and aspect ratio in the policy's ranges).

    The box comes from tf.image's stateless sampler (the Inception recipe's own op): its aspect ratio is drawn
    uniformly in the range, 10 draws at most, and the whole image when none fits."""
    import tensorflow as tf

    begin, size, _ = tf.image.stateless_sample_distorted_bounding_box(
        shape, tf.zeros([1, 0, 4], tf.float32), seed=seed,
        min_object_covered=0.0, aspect_ratio_range=(policy.crop_aspect_min, policy.crop_aspect_max),
        area_range=(policy.crop_scale_min, policy.crop_scale_max), max_attempts=10,
        use_image_if_no_bounding_boxes=True)
    return begin, size


def _random_resized_crop(x, seed, policy: AugmentPolicy):
    """A random box of the image (`_crop_box`), resized back to the image size."""
    import tensorflow as tf

    height, width, channels = x.shape
    begin, size = _crop_box(tf.constant([height, width, channels], tf.int32), seed, policy)
    crop = tf.slice(x, begin, size)
    return tf.ensure_shape(tf.image.resize(crop[None], [height, width], method="bilinear")[0],
                           [height, width, channels])


def _smooth(field, sigma: float):
    """Gaussian blur of an HxW field (separable, reflected borders), as in scipy's gaussian_filter."""
    import tensorflow as tf

    height, width = field.shape
    radius = int(min(math.ceil(3 * sigma), height - 1, width - 1))
    taps = tf.range(-radius, radius + 1, dtype=tf.float32)
    kernel = tf.exp(-0.5 * (taps / sigma) ** 2)
    kernel = kernel / tf.reduce_sum(kernel)
    f = tf.pad(field[None, :, :, None], [[0, 0], [radius, radius], [0, 0], [0, 0]], mode="REFLECT")
    f = tf.nn.conv2d(f, tf.reshape(kernel, [-1, 1, 1, 1]), strides=1, padding="VALID")
    f = tf.pad(f, [[0, 0], [0, 0], [radius, radius], [0, 0]], mode="REFLECT")
    f = tf.nn.conv2d(f, tf.reshape(kernel, [1, -1, 1, 1]), strides=1, padding="VALID")
    return f[0, :, :, 0]


def _elastic(x, seed, alpha: float, sigma: float):
    """Elastic distortion (Simard, Steinkraus & Platt 2003): each pixel is moved by a smooth random field,
    uniform noise in [-1, 1] blurred by a gaussian of `sigma` pixels and scaled by `alpha` pixels; bilinear
    sampling, borders repeated."""
    import tensorflow as tf

    height, width, channels = x.shape
    dy = _smooth(tf.random.stateless_uniform([height, width], seed=seed + 3, minval=-1.0, maxval=1.0), sigma) * alpha
    dx = _smooth(tf.random.stateless_uniform([height, width], seed=seed + 4, minval=-1.0, maxval=1.0), sigma) * alpha
    rows, cols = tf.meshgrid(tf.range(height, dtype=tf.float32), tf.range(width, dtype=tf.float32), indexing="ij")
    sy = tf.clip_by_value(rows + dy, 0.0, height - 1.0)
    sx = tf.clip_by_value(cols + dx, 0.0, width - 1.0)
    y0, x0 = tf.floor(sy), tf.floor(sx)
    wy, wx = (sy - y0)[..., None], (sx - x0)[..., None]
    y0, x0 = tf.cast(y0, tf.int32), tf.cast(x0, tf.int32)
    y1, x1 = tf.minimum(y0 + 1, height - 1), tf.minimum(x0 + 1, width - 1)
    flat = tf.reshape(x, [height * width, channels])

    def at(r, c):
        return tf.reshape(tf.gather(flat, tf.reshape(r * width + c, [-1])), [height, width, channels])

    top = at(y0, x0) * (1 - wx) + at(y0, x1) * wx
    bottom = at(y1, x0) * (1 - wx) + at(y1, x1) * wx
    return top * (1 - wy) + bottom * wy


@dataclasses.dataclass
class AugmentResult:
    output_dir: str
    mode: str
    copies: int
    train_count: int
    seconds: float

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


def augment(dataset_dir: str, output_dir: str, *, copies: int = 0, policy: AugmentPolicy | None = None,
            mode: str = "offline", min_shards: int = 2) -> AugmentResult:
    """Writes the augmented training set of `dataset_dir` to `output_dir` (only the train split lives there)."""
    import tensorflow as tf

    params.validate({"augment_mode": mode, "augment_copies": copies}, what="augmentation settings")
    policy = policy or AugmentPolicy()
    start = time.monotonic()
    manifest = data.read_manifest(dataset_dir)
    train_count = manifest["splits"]["train"]["count"]
    out = {**manifest, "augmentation": {"mode": mode, "copies": copies, "policy": policy.to_json()}}
    out.pop("samples", None)  # the sample grid stays with the original dataset
    data.gfile().makedirs(output_dir)
    if mode == "online" or copies == 0:
        # Nothing to materialise: training reads the original shards (and applies the policy when online).
        # The split points at the original shards, so readers of this manifest find them too.
        original = manifest["splits"]["train"]
        out["splits"] = {"train": {**original, "path": data.locate(dataset_dir, original["path"]), PASSTHROUGH: True}}
        data.write_json(data.join(output_dir, data.MANIFEST), out)
        return AugmentResult(output_dir, mode, copies, train_count, time.monotonic() - start)

    height, width, channels = manifest["image_shape"]
    total = train_count * (copies + 1)
    # Copies are stored as the originals are: raw stays raw, JPEG datasets stay JPEG, PNG or mixed ones get PNG.
    encoding = data.manifest_encoding(manifest)
    # Copies are pixels at the dataset's size: PNG in a mixed dataset, JPEG beside source records (photos)
    copy_encoding = {data.ENCODED: data.PNG, data.SOURCE: data.JPEG}.get(encoding, encoding)
    image_bytes = height * width * channels // (1 if encoding == data.RAW else 4)
    writer = data.ShardWriter(output_dir, "train", data.num_shards_for(total, image_bytes, min_shards=min_shards),
                              encoding=copy_encoding)
    source = data.read_split(dataset_dir, "train", with_uri=True).enumerate()
    for record, label in data.read_records(dataset_dir, "train").as_numpy_iterator():  # the originals, as stored
        writer.write_record(record, int(label), encoding)
    last_report = time.monotonic()
    for copy in range(1, copies + 1):
        augmented = source.map(lambda i, ex, c=copy: (augment_image(ex[0], i, c, policy), ex[1], ex[2]),
                               num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
        for image, label, uri in augmented.prefetch(tf.data.AUTOTUNE).as_numpy_iterator():
            writer.write(image, int(label), f"{uri.decode()}#aug{copy}")
            if time.monotonic() - last_report > 10:
                last_report = time.monotonic()
                log.info("augment: %d/%d images written", writer.count, total)
    writer.close()
    out["splits"] = {"train": writer.summary()}
    out["image_encoding"] = data.dataset_encoding(writer.encodings)
    data.write_json(data.join(output_dir, data.MANIFEST), out)
    seconds = time.monotonic() - start
    log.info("augment: wrote %d training images (%d copies) to %s in %.1fs", writer.count, copies, output_dir, seconds)
    return AugmentResult(output_dir, mode, copies, writer.count, seconds)


def policy_preview(dataset_dir: str, policy: AugmentPolicy, *, rows: int = 10, copies: int = 7,
                   scan_limit: int = 5000, note: str = "") -> str:
    """An HTML page showing what the policy does: the first training image of each class (up to `rows`) and its
    augmented copies 1..`copies`, exactly as offline copy k / online epoch k will see them."""
    import base64
    import html

    import tensorflow as tf

    manifest = data.read_manifest(dataset_dir)
    names = manifest["class_names"]
    picked: dict[int, tuple[int, object]] = {}
    wanted = min(rows, len(names))
    for index, (image, label) in enumerate(data.read_split(dataset_dir, "train").take(scan_limit).as_numpy_iterator()):
        if int(label) not in picked:
            picked[int(label)] = (index, image)
            if len(picked) >= wanted:
                break
    height = manifest["image_shape"][0]
    scale = max(1, 56 // height)
    out = ["<!doctype html><html><head><meta charset='utf-8'><title>Augmentation policy</title><style>"
           "body{font-family:sans-serif;margin:1em}td{padding:2px 8px}img{image-rendering:pixelated}</style>"
           "</head><body><h1>Augmentation policy</h1>",
           f"<p><b>{html.escape(note)}</b></p>" if note else "",
           f"<pre>{html.escape(json.dumps(policy.to_json(), indent=2))}</pre>",
           f"<p>Each row: the original, then copies 1-{copies} (offline copy k = online epoch k).</p><table>"]
    for label in sorted(picked):
        index, image = picked[label]
        augmented = [augment_image(tf.constant(image), index, c, policy).numpy() for c in range(1, copies + 1)]
        strip = data.tile([image] + augmented, copies + 1, gap=2)
        uri = "data:image/png;base64," + base64.b64encode(data.encode_png(strip)).decode()
        out.append(f"<tr><td>{html.escape(names[label])}</td><td><img alt='{html.escape(names[label])}' src='{uri}' "
                   f"width='{strip.shape[1] * scale}' height='{strip.shape[0] * scale}'></td></tr>")
    out.append("</table></body></html>")
    return "\n".join(out) + "\n"


def train_files(dataset_dir: str, augmented_dir: str | None) -> tuple[str, dict | None]:
    """Where training reads its train split from, and the online policy to apply (if any)."""
    if not augmented_dir:
        return dataset_dir, None
    manifest = data.read_manifest(augmented_dir)
    aug = manifest.get("augmentation", {})
    online = aug.get("policy") if aug.get("mode") == "online" else None
    if manifest["splits"]["train"].get(PASSTHROUGH):
        return dataset_dir, online
    return augmented_dir, online


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Write augmented training shards.")
    parser.add_argument("--dataset-dir", required=True, help="output of preprocess")
    parser.add_argument("--output-dir", required=True)
    parser.add_argument("--copies", type=int, default=0)
    parser.add_argument("--mode", choices=("offline", "online"), default="offline")
    parser.add_argument("--policy", default="{}", help="JSON object, e.g. '{\"rotation_degrees\": 15, \"seed\": 1}'")
    parser.add_argument("--preview", help="also write an HTML page of originals and their augmentations here")
    args = parser.parse_args(argv)

    def step():
        policy = AugmentPolicy.from_json(args.policy)
        result = augment(args.dataset_dir, args.output_dir, copies=args.copies, mode=args.mode, policy=policy)
        if args.preview:
            with data.gfile().GFile(args.preview, "w") as f:
                f.write(policy_preview(args.dataset_dir, policy))
        return result

    return stepcli.run(step)


if __name__ == "__main__":
    raise SystemExit(main())
