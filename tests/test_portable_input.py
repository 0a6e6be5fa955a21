"""The input without TensorFlow (components/dataio/records.py, pixels.py, augment_numpy.py, train/portable_input.py),
against the TensorFlow path it stands in for: the same records, labels and pixels (raw and PNG exactly; JPEG and
the resize rule within a level; the crop of a source file within the stated tolerance), the CRC checks, the
policies' invariants and their exact parts, the resume and sharding semantics, and a process in which TensorFlow
cannot be imported reading a split end to end."""

import dataclasses
import io
import json
import os
import struct
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image

from components import augment as augment_lib
from components.dataio import augment_numpy, data, pixels, records
from components.train.portable_input import PortableTrainInput, eval_batches
from components.train.recipes import RECIPES, Recipe
from tests.conftest import REPO_ROOT
from tests.test_records import photo

FULL_POLICY = {"rotation_degrees": 12.0, "shift_fraction": 0.1, "zoom_range": 0.1, "horizontal_flip": True,
               "brightness": 0.1, "contrast": 0.2, "noise_stddev": 0.02, "elastic_alpha": 3.0, "cutout_fraction": 0.2,
               "random_resized_crop": True, "seed": 3}


def tf_records(files: list[str]) -> list[bytes]:
    import tensorflow as tf

    ds = tf.data.Dataset.from_tensor_slices(files).interleave(
        tf.data.TFRecordDataset, cycle_length=min(len(files), 8), num_parallel_calls=tf.data.AUTOTUNE,
        deterministic=True)
    return [r.numpy() for r in ds]


def split_of(dataset: str, split: str):
    images, labels = [], []
    for x, y in eval_batches(dataset, split, 50):
        assert x.dtype == np.float32 and y.dtype == np.int32
        images.append(x)
        labels.append(y)
    return np.concatenate(images), np.concatenate(labels)


# ---------------------------------------------------------------------------------------------- records


def test_records_and_examples_read_as_tensorflow_reads_them(small_dataset):
    import tensorflow as tf

    for split in data.SPLITS:
        files = records.split_files(small_dataset, split)
        assert files == data.split_files(small_dataset, split) and len(files) >= 2
        ours = list(records.interleave(files))
        assert ours == tf_records(files)  # same bytes, same order (the augmentation's example index)
        for record in ours[:50]:
            parsed = records.parse_example(record)
            feature = tf.train.Example.FromString(record).features.feature
            assert parsed["image"] == list(feature["image"].bytes_list.value)
            assert parsed["label"] == list(feature["label"].int64_list.value)
            assert parsed["uri"] == list(feature["uri"].bytes_list.value)
        images, labels = split_of(small_dataset, split)
        expected_images, expected_labels = data.load_split_arrays(small_dataset, split)
        np.testing.assert_array_equal(images, expected_images.astype(np.float32))
        np.testing.assert_array_equal(labels, expected_labels)


def test_the_example_parser_reads_every_wire_form():
    import tensorflow as tf

    example = tf.train.Example()
    feature = example.features.feature
    feature["image"].bytes_list.value.extend([b"", b"\x00\xff" * 300])
    feature["label"].int64_list.value.extend([-3, 0, 2**40, -(2**63)])
    feature["weights"].float_list.value.extend([0.5, -1.25])
    feature["empty"].int64_list.SetInParent()
    assert records.parse_example(example.SerializeToString()) == {
        "image": [b"", b"\x00\xff" * 300], "label": [-3, 0, 2**40, -(2**63)], "weights": [0.5, -1.25], "empty": []}
    # int64s not packed (older writers), floats not packed, and an unknown field: all read as protobuf reads them
    label = bytes([0x1A, 0x04, 0x08, 0x07, 0x08, 0x09])  # Feature{int64_list{value: 7, value: 9}}, one by one
    floats = bytes([0x12, 0x05, 0x0D]) + struct.pack("<f", 2.5)
    unknown = bytes([0x10, 0x01])
    entry = lambda key, value: bytes([0x0A, len(key) + len(value) + 4, 0x0A, len(key)]) + key + \
        bytes([0x12, len(value)]) + value  # noqa: E731
    body = entry(b"label", label) + entry(b"x", floats)
    serialized = bytes([0x0A, len(body)]) + body + unknown
    assert records.parse_example(serialized) == {"label": [7, 9], "x": [2.5]}
    reference = tf.train.Example.FromString(serialized).features.feature
    assert list(reference["label"].int64_list.value) == [7, 9]
    with pytest.raises(data.DataError, match="not a tf.train.Example"):
        records.parse_example(b"\x0a\x30\x01")


def test_framing_and_crc_agree_with_tensorflow_and_corruption_names_file_and_offset(tmp_path):
    import google_crc32c
    import tensorflow as tf

    rng = np.random.default_rng(0)
    payloads = [rng.integers(0, 256, n, dtype=np.uint8).tobytes() for n in (0, 1, 5, 100, 4097, 70000)]
    assert google_crc32c.implementation == "c"  # the C extension, as in every image (a dependency of the project)
    assert records.crc32c(memoryview(payloads[4])) == google_crc32c.value(payloads[4])
    path = str(tmp_path / "a.tfrecord")
    with tf.io.TFRecordWriter(path) as writer:
        for payload in payloads:
            writer.write(payload)
    with open(path, "rb") as f:
        written = f.read()
    assert written == b"".join(records.frame(p) for p in payloads)
    assert list(records.iter_records(path)) == payloads
    offset = sum(len(records.frame(p)) for p in payloads[:4])  # the record of 4097 bytes
    for where, what in ((offset + 12 + 2000, "data"), (offset + 3, "length")):
        corrupt = bytearray(written)
        corrupt[where] ^= 0x10
        bad = tmp_path / f"bad-{what}.tfrecord"
        bad.write_bytes(bytes(corrupt))
        with pytest.raises(data.DataError, match=f"{bad} is corrupt: the {what} of the record at byte {offset}"):
            list(records.iter_records(str(bad)))
    short = tmp_path / "short.tfrecord"
    short.write_bytes(written[:-10])
    with pytest.raises(data.DataError, match=f"{short} is truncated: the record at byte {len(written) - 70016}"):
        list(records.iter_records(str(short)))


def test_the_constants_repeated_without_tensorflow_agree():
    assert pixels.IMAGE_ENCODINGS == data.IMAGE_ENCODINGS
    assert (pixels.DCT_RATIOS, pixels.ANTIALIAS_FROM) == (data.DCT_RATIOS, data.ANTIALIAS_FROM)


# ---------------------------------------------------------------------------------------------- pixels


def written_dataset(root, encoding: str, images: list[np.ndarray]) -> str:
    """A one-split dataset whose records hold `images` stored as `encoding` (as datasets of earlier releases)."""
    out = str(root / encoding)
    writer = data.ShardWriter(out, "train", 2, encoding=pixels.PNG if encoding == pixels.ENCODED else encoding)
    for i, image in enumerate(images):
        if encoding == pixels.ENCODED:
            stored = data.encode_image(image, pixels.JPEG if i % 2 else pixels.PNG)
            writer.write_record(data.encode_example(stored, i % 3, f"img{i}"), i % 3)
        else:
            writer.write(image, i % 3, f"img{i}")
    writer.close()
    data.write_json(os.path.join(out, data.MANIFEST), {
        "image_shape": list(images[0].shape), "class_names": ["a", "b", "c"], "image_encoding": encoding,
        "splits": {"train": writer.summary()}})
    return out


@pytest.mark.parametrize("encoding", ["raw", "png", "jpeg", "encoded"])
def test_stored_encodings_decode_to_tensorflows_pixels(tmp_path, encoding):
    rng = np.random.default_rng(1)
    images = [photo(rng, 80) for _ in range(10)]
    dataset = written_dataset(tmp_path, encoding, images)
    ours, labels = split_of(dataset, "train")
    expected, expected_labels = data.load_split_arrays(dataset, "train")
    np.testing.assert_array_equal(labels, expected_labels)
    difference = np.abs(ours - expected)
    if encoding in ("raw", "png"):
        assert difference.max() == 0
    else:  # libjpeg-turbo with the same integer DCT in both
        assert difference.max() <= 1 and difference.mean() < 0.01


def photo_files(request, photo_set: str, every: int) -> list[str]:
    """Every `every`-th photo of the food photos (food_photos) or of Debian's photographs (mate_photos): each set is a
    test of its own, so that one missing set does not drop the other's."""
    found = request.getfixturevalue(photo_set)
    if isinstance(found, str):  # a folder of class folders
        found = sorted(os.path.join(d, f) for d, _, fs in os.walk(found) for f in fs)
    return found[::every]


@pytest.mark.parametrize("photo_set, every, mean_levels", [
    ("food_photos", 25, 0.01),  # 307x173: the same pixels but for a few
    ("mate_photos", 3, 0.15),  # up to 5640x3172, to 64 and 28 px: one level apart on up to about a tenth of them
])
def test_the_resize_rule_matches_tensorflows_on_real_photos(request, photo_set, every, mean_levels):
    """data.decode_to_shape's rule (DCT scale, then bilinear; antialiased from a 3x shrink) on the food photos
    (307x173) and Debian's photographs (up to 5640x3172), at the sizes training uses: within one level."""
    files = photo_files(request, photo_set, every)
    assert files
    for shape in ([64, 64, 3], [224, 224, 3], [28, 28, 1]):
        decode = data.file_decoder(tuple(shape))
        means = []
        for path in files:
            with open(path, "rb") as f:
                contents = f.read()
            difference = np.abs(decode(contents).astype(int) - pixels.decode_to_shape(contents, shape))
            assert difference.max() <= 1, (path, shape)
            means.append(difference.mean())
        assert np.mean(means) < mean_levels, (shape, means)


@pytest.mark.parametrize("photo_set, every, ratios", [
    ("food_photos", 40, {1}),  # 307x173: every crop is under twice 224, so no DCT scale applies
    ("mate_photos", 2, {2, 4, 8}),  # up to 5640x3172: these crops all decode at a DCT scale
])
def test_the_crop_of_a_source_file_matches_tensorflows_decode_and_crop(request, photo_set, every, ratios):
    """At the crop's full scale (a crop under twice the target: no DCT scale applies) the pixels of
    data.decode_crop_to_shape to a level, but where libjpeg's block edges meet the crop's edge; larger crops decode
    at a DCT scale, which averages what TensorFlow's plain bilinear samples: compared with TensorFlow's crop
    resized with antialiasing, within a few levels on average."""
    import tensorflow as tf

    files = photo_files(request, photo_set, every)
    rng = np.random.default_rng(2)
    by_ratio: dict[int, list[float]] = {}
    for path in files:
        with open(path, "rb") as f:
            contents = f.read()
        height, width = pixels.source_size(contents)
        assert data.source_shape(tf.constant(contents), 3).numpy().tolist() == [height, width, 3]
        for _ in range(3):
            crop_height = int(rng.integers(max(1, height // 4), height + 1))
            crop_width = int(rng.integers(max(1, width // 4), width + 1))
            box = (int(rng.integers(0, height - crop_height + 1)), int(rng.integers(0, width - crop_width + 1)),
                   crop_height, crop_width)
            ratio = pixels.dct_ratio((crop_height, crop_width), (224, 224))
            ours = pixels.decode_crop_to_shape(contents, [224, 224, 3], box)
            if ratio == 1:
                theirs = data.decode_crop_to_shape(tf.constant(contents), [224, 224, 3], tf.constant(box)).numpy()
            else:
                crop = tf.io.decode_and_crop_jpeg(contents, box, channels=3, dct_method="INTEGER_ACCURATE")
                theirs = data.resize_to_shape(crop, [224, 224, 3], antialias=True).numpy()
            by_ratio.setdefault(ratio, []).append(float(np.abs(ours.astype(int) - theirs).mean()))
    assert set(by_ratio) == ratios
    assert max(by_ratio.get(1, [0.0])) < 0.1
    for ratio, means in by_ratio.items():
        assert np.mean(means) < 5 and max(means) < 12, (ratio, means)


def test_plain_bilinear_boxes_are_tensorflows():
    """tf.slice + tf.image.resize (bilinear, no antialiasing) of boxes, shrinking and enlarging: Pillow's affine
    sampling gives the same pixels but for a rounding of a half, in double precision where TensorFlow rounds in
    float32 (up to 3% of the pixels by one level, where the weights are short binary fractions)."""
    import tensorflow as tf

    rng = np.random.default_rng(3)
    for channels in (3, 1):
        image = rng.integers(0, 256, (90, 70, channels), dtype=np.uint8)
        for box in ((0, 0, 90, 70), (10, 5, 33, 60), (89, 0, 1, 70), (3, 4, 80, 20)):
            crop = tf.slice(tf.constant(image), [box[0], box[1], 0], [box[2], box[3], channels])
            for size in ((28, 28), (64, 48), (120, 100)):
                expected = tf.cast(tf.clip_by_value(tf.round(tf.image.resize(crop, size)), 0, 255), tf.uint8).numpy()
                ours = pixels.crop_to_shape(image, box, size)
                difference = np.abs(ours.astype(int) - expected)
                assert ours.shape == expected.shape and difference.max() <= 1 and (difference > 0).mean() < 0.05


# ---------------------------------------------------------------------------------------------- augmentation


# (policy seed, copy, index) triples: augment._seed's pair is [seed * 1_000_003 + copy, index], int64 wrapping
SEED_TRIPLES = [(0, 0, 0), (0, 1, 1), (3, 2, 7), (7, 1, 12345), (123456789, 5, 2 ** 31 + 3), (-4, 3, 99),
                (2 ** 62, 1, 5), (1, 0, -1)] + [(11, c, i) for c in range(1, 4) for i in range(0, 400, 37)]


def tf_seeds(stream: int):
    import tensorflow as tf

    return [tf.constant([(s * 1_000_003 + c + 2 ** 63) % 2 ** 64 - 2 ** 63, i], tf.int64) + stream
            for s, c, i in SEED_TRIPLES]


def our_keys():
    return np.concatenate([augment_numpy.keys([i], c, s) for s, c, i in SEED_TRIPLES])


@pytest.mark.parametrize("shape", [(1,), (2,), (3,), (8,), (5, 7), (28, 28), (64, 64, 3)])
def test_the_draws_are_tensorflows_stateless_ones(shape):
    """uniform and normal of each example's seed pair plus a stream are tf.random.stateless_uniform and
    stateless_normal of it (Philox, odd sizes included): the uniform bit for bit, the normal (Box-Muller through
    the C library's log, sin and cos) within 1e-6 relative."""
    import tensorflow as tf

    keys = our_keys()
    for stream in (augment_numpy.MAIN, augment_numpy.CUTOUT, augment_numpy.ELASTIC_X):
        theirs = np.stack([tf.random.stateless_uniform(shape, seed=s).numpy() for s in tf_seeds(stream)])
        ours = augment_numpy.uniform(keys, stream, shape)
        assert ours.dtype == np.float32
        np.testing.assert_array_equal(ours.view(np.uint32), theirs.view(np.uint32))
    theirs = np.stack([tf.random.stateless_normal(shape, seed=s).numpy() for s in tf_seeds(augment_numpy.NOISE)])
    ours = augment_numpy.normal(keys, augment_numpy.NOISE, shape)
    assert ours.dtype == np.float32
    np.testing.assert_allclose(ours, theirs, rtol=1e-6, atol=0)


def test_crop_boxes_are_tensorflows_sampler_box_for_box():
    """crop_boxes gives each example tf.image.stateless_sample_distorted_bounding_box's box for its seed pair
    (augment._crop_box): a camera photo, a food photo, a 28x28 image, a strip, for the photo recipe and for a wide
    aspect range, with 10 attempts that may all fail (whole image)."""
    import tensorflow as tf

    keys = our_keys()
    for raw in ("photo", {"random_resized_crop": True, "crop_scale_min": 0.5, "crop_aspect_min": 0.2,
                          "crop_aspect_max": 5.0}):
        policy = augment_lib.AugmentPolicy.from_json(raw)
        for height, width in ((3172, 5640), (480, 640), (173, 307), (28, 28), (5, 1000)):
            ours = augment_numpy.crop_boxes(height, width, keys, policy)
            theirs = np.array([np.concatenate([b[:2], s[:2]]) for b, s in (
                augment_lib._crop_box(tf.constant([height, width, 3]), seed, policy)
                for seed in tf_seeds(augment_numpy.CROP))])
            np.testing.assert_array_equal(ours, theirs)


OFF = {"rotation_degrees": 0, "shift_fraction": 0, "zoom_range": 0}
# Every change of the policy alone, the defaults, the photo recipe and all of them together
POLICY_TABLE = {"default": {}, "photo": "photo", "all": FULL_POLICY,
                "all but the crop": {**FULL_POLICY, "random_resized_crop": False},
                "rotation": {**OFF, "rotation_degrees": 15, "seed": 1}, "shift": {**OFF, "shift_fraction": 0.1},
                "zoom": {**OFF, "zoom_range": 0.1}, "flip": {**OFF, "horizontal_flip": True},
                "brightness": {**OFF, "brightness": 0.2}, "contrast": {**OFF, "contrast": 0.3},
                "noise": {**OFF, "noise_stddev": 0.05}, "elastic": {**OFF, "elastic_alpha": 34.0},
                "cutout": {**OFF, "cutout_fraction": 0.3}, "crop": {**OFF, "random_resized_crop": True, "seed": 9}}


@pytest.mark.parametrize("name", list(POLICY_TABLE))
def test_fashion_mnist_gets_tensorflows_augmentation(fashion_arrays, name):
    """The same Fashion-MNIST images, (seed, copy, index): augment_batch gives augment.augment_image's pixels,
    within a level where float32 order differs (measured: 1 pixel in 10^5 at most). The random resized crop is
    resized and rounded to uint8 before the rest of the policy (TensorFlow keeps float32), which moves 0.13% of
    the pixels by a level, 9% when contrast and brightness follow it."""
    import tensorflow as tf

    policy = augment_lib.AugmentPolicy.from_json(POLICY_TABLE[name])
    images, indices = fashion_arrays[0][:120, :, :, None], np.arange(120) * 13 + 1
    for copy in (1, 4):
        ours = augment_numpy.augment_batch(images, indices, copy, policy).astype(int)
        theirs = np.stack([augment_lib.augment_image(tf.constant(image), int(i), copy, policy).numpy()
                           for image, i in zip(images, indices)])
        difference = np.abs(ours - theirs)
        assert difference.max() <= 1, (name, copy)
        assert (difference > 0).mean() <= (0.12 if policy.random_resized_crop else 1e-4), (name, copy)


def test_camera_photos_get_tensorflows_crop_and_augmentation(mate_photos):
    """Source records at camera size (up to 5640x3172): each photo's crop box on the TensorFlow path
    (augment_source: its size from the JPEG header, tf.image's sampler) is augment_sources' box, and the rest of
    the policy on that crop gives TensorFlow's pixels within a level. (The crop's pixels themselves come from a
    DCT-scaled decode here, data.decode_crop_to_shape's full one there: pixels.py's docstring.)"""
    import tensorflow as tf

    from components.dataio import data as tf_data

    contents = [open(path, "rb").read() for path in mate_photos[:4]]
    indices = np.arange(len(contents)) * 5 + 2
    for raw in ("photo", FULL_POLICY):
        policy = augment_lib.AugmentPolicy.from_json(raw)
        rest = dataclasses.replace(policy, random_resized_crop=False)
        ours = augment_numpy.augment_sources(contents, indices, 2, policy, [64, 64, 3]).astype(int)
        for position, (item, index) in enumerate(zip(contents, indices)):
            begin, size = augment_lib._crop_box(tf_data.source_shape(tf.constant(item), 3),
                                                augment_lib._seed(int(index), 2, policy) + 5, policy)
            box = augment_numpy.crop_boxes(*pixels.source_size(item), augment_numpy.keys([index], 2, policy.seed),
                                           policy)[0]
            np.testing.assert_array_equal(box, np.concatenate([begin.numpy()[:2], size.numpy()[:2]]))
            crop = pixels.decode_crop_to_shape(item, [64, 64, 3], box)
            theirs = augment_lib.augment_image(tf.constant(crop), int(index), 2, rest).numpy()
            assert np.abs(ours[position] - theirs).max() <= 1


def test_food_photos_get_tensorflows_augmentation_end_to_end(food_photos):
    """Source records where no DCT scale applies (the food photos, 307x173, at 224 px): augment_sources gives
    augment.augment_source's pixels, crop and decode included, within a level but where libjpeg's block edges meet
    the crop's edge (measured on these 20 photos: 0.07% of the pixels with the photo recipe, 0.23% with every
    change, a mean difference under 0.01 level)."""
    import glob

    import tensorflow as tf

    files = sorted(glob.glob(os.path.join(food_photos, "**", "*.jp*g"), recursive=True))[::25][:20]
    contents = [open(path, "rb").read() for path in files]
    indices = np.arange(len(contents)) * 3
    for raw in ("photo", FULL_POLICY):
        policy = augment_lib.AugmentPolicy.from_json(raw)
        ours = augment_numpy.augment_sources(contents, indices, 1, policy, [224, 224, 3]).astype(int)
        theirs = np.stack([augment_lib.augment_source(tf.constant(item), int(index), 1, policy, [224, 224, 3]).numpy()
                           for item, index in zip(contents, indices)])
        difference = np.abs(ours - theirs)
        assert len(files) == 20 and (difference > 1).mean() < 0.005 and difference.mean() < 0.02, raw


def test_the_geometric_transform_and_smoothing_are_tensorflows():
    import math

    import tensorflow as tf

    rng = np.random.default_rng(4)
    images = rng.integers(0, 256, (3, 28, 30, 1)).astype(np.float32)
    angle = np.array([0.2, -0.1, 0.0], np.float32)
    scale = np.array([1.05, 0.93, 1.0], np.float32)
    tx, ty = np.array([2.0, -1.5, 0.3], np.float32), np.array([-2.2, 1.0, 0.0], np.float32)
    ours = augment_numpy._transform(images, angle, scale, tx, ty)
    for i in range(3):
        height, width = 28, 30
        cx, cy = (width - 1) / 2.0, (height - 1) / 2.0
        cos, sin = math.cos(angle[i]), math.sin(angle[i])
        ox, oy = cx + tx[i], cy + ty[i]
        transform = tf.constant([[cos / scale[i], sin / scale[i], cx - (cos * ox + sin * oy) / scale[i],
                                  -sin / scale[i], cos / scale[i], cy - (-sin * ox + cos * oy) / scale[i], 0, 0]],
                                tf.float32)
        theirs = tf.raw_ops.ImageProjectiveTransformV3(
            images=images[i:i + 1], transforms=transform, output_shape=tf.constant([height, width]),
            fill_value=0.0, interpolation="BILINEAR", fill_mode="NEAREST")[0].numpy()
        np.testing.assert_allclose(ours[i], theirs, atol=2e-3)
    field = rng.uniform(-1, 1, (28, 30)).astype(np.float32)
    smoothed = (_blur := augment_numpy._smoothing_matrix(28, 4.0)).T @ field @ augment_numpy._smoothing_matrix(30, 4.0)
    assert _blur.shape == (28, 28)
    np.testing.assert_allclose(smoothed, augment_lib._smooth(tf.constant(field), 4.0).numpy(), atol=1e-5)


def test_each_example_is_a_pure_function_of_seed_copy_and_index():
    rng = np.random.default_rng(5)
    images = rng.integers(0, 256, (8, 28, 28, 1), dtype=np.uint8)
    policy = augment_lib.AugmentPolicy.from_json(FULL_POLICY)
    indices = np.arange(100, 108)
    whole = augment_numpy.augment_batch(images, indices, 2, policy)
    assert whole.shape == images.shape and whole.dtype == np.uint8
    part = augment_numpy.augment_batch(images[[5, 1]], indices[[5, 1]], 2, policy)  # another batch, order, size
    np.testing.assert_array_equal(part, whole[[5, 1]])
    assert not np.array_equal(augment_numpy.augment_batch(images, indices, 3, policy), whole)  # another epoch
    reseeded = augment_lib.AugmentPolicy.from_json({**FULL_POLICY, "seed": 4})
    assert not np.array_equal(augment_numpy.augment_batch(images, indices, 2, reseeded), whole)


def test_flips_and_photometric_draws_have_the_policys_ranges():
    rng = np.random.default_rng(6)
    image = rng.integers(20, 236, (1, 32, 32, 3), dtype=np.uint8)
    images = np.repeat(image, 400, axis=0)
    indices = np.arange(400)
    flipped = augment_numpy.augment_batch(images, indices, 1, augment_lib.AugmentPolicy.from_json(
        {"horizontal_flip": True, "rotation_degrees": 0, "shift_fraction": 0, "zoom_range": 0}))
    mirrored = np.array([np.array_equal(f, image[0, :, ::-1]) for f in flipped])
    unchanged = np.array([np.array_equal(f, image[0]) for f in flipped])
    assert (mirrored | unchanged).all() and 0.4 < mirrored.mean() < 0.6
    shifted = augment_numpy.augment_batch(images, indices, 1, augment_lib.AugmentPolicy.from_json(
        {"brightness": 0.1, "rotation_degrees": 0, "shift_fraction": 0, "zoom_range": 0}))
    offsets = shifted.astype(float).mean(axis=(1, 2, 3)) - image.mean()
    assert np.abs(offsets).max() <= 0.1 * 255 + 0.5 and offsets.std() > 0.1 * 255 / 2
    cut = augment_numpy.augment_batch(images, indices, 1, augment_lib.AugmentPolicy.from_json(
        {"cutout_fraction": 0.25, "rotation_degrees": 0, "shift_fraction": 0, "zoom_range": 0}))
    assert ((cut == 0).all(axis=3).sum(axis=(1, 2)) == 64).all()  # an 8x8 square each, wherever it lands


def test_the_photo_recipe_decodes_each_crop_from_the_source_file(food_photos, tmp_path_factory):
    """Source records with the photo recipe: each example is its crop box, drawn on the file's own size, decoded
    from the file; the flip is the rest of the policy."""
    from components import preprocess as pp

    dataset = str(tmp_path_factory.mktemp("food") / "food64")
    pp.preprocess(food_photos, dataset, image_size=64, channels=3, workers=1, min_shards=2, limit=60)
    policy = augment_lib.AugmentPolicy.from_json("photo")
    pipeline = PortableTrainInput(dataset, [64, 64, 3], pipeline_id=0, num_pipelines=1, recipe=RECIPES["fast"],
                                  online_policy=policy.to_json(), mode="memory", workers=2)
    assert pipeline.source_bytes and pipeline.mode == "memory"
    images, labels = next(pipeline.batches(epoch=2, first_batch=0, num_batches=1, batch=6))
    picks = pipeline.order(2)[:6]
    example_keys = augment_numpy.keys(picks, 3, policy.seed)
    for position, pick in enumerate(picks):
        contents = pipeline.contents[pick]
        box = augment_numpy.crop_boxes(*pixels.source_size(contents), example_keys[position:position + 1], policy)[0]
        crop = pixels.decode_crop_to_shape(contents, [64, 64, 3], box).astype(np.float32)
        assert np.array_equal(images[position], crop) or np.array_equal(images[position], crop[:, ::-1])
        assert labels[position] == pipeline.labels[pick]


# ---------------------------------------------------------------------------------------------- the input


@pytest.mark.parametrize("mode", ["memory", "stream"])
def test_a_resumed_attempt_gets_the_batches_of_the_uninterrupted_one(small_dataset, mode):
    recipe = Recipe(shuffle_buffer=200)
    pipeline = PortableTrainInput(small_dataset, [28, 28, 1], pipeline_id=0, num_pipelines=1, recipe=recipe,
                                  online_policy=FULL_POLICY, mode=mode, workers=2)
    steps = -(-pipeline.total_count // 64)  # enough to cycle past the end of the share
    whole = list(pipeline.batches(epoch=1, first_batch=0, num_batches=steps + 2, batch=64))
    assert len(whole) == steps + 2 and all(x.shape == (64, 28, 28, 1) for x, _ in whole)
    restarted = PortableTrainInput(small_dataset, [28, 28, 1], pipeline_id=0, num_pipelines=1, recipe=recipe,
                                   online_policy=FULL_POLICY, mode=mode, workers=3)
    resumed = list(restarted.batches(epoch=1, first_batch=5, num_batches=steps - 3, batch=64))
    for (x, y), (x2, y2) in zip(whole[5:], resumed, strict=True):
        np.testing.assert_array_equal(x, x2)
        np.testing.assert_array_equal(y, y2)
    other_epoch, _ = next(pipeline.batches(epoch=2, first_batch=0, num_batches=1, batch=64))
    assert not np.array_equal(other_epoch, whole[0][0])


def test_input_threads_are_the_processes_share_of_the_cpus_unless_asked(small_dataset, caplog):
    """N training processes on one machine (torchrun's LOCAL_WORLD_SIZE) each take 1/N of its CPUs, at least one;
    an explicit `workers` is taken as it is. (Real torchrun and jax.distributed processes: test_frameworks.py.)"""
    from components.dataio.images import available_cpus
    from components.train.frameworks.base import InputSpec
    from components.train.frameworks.portable import train_input
    from components.train.portable_input import input_workers

    cpus = available_cpus()
    assert input_workers() == input_workers(None, 1) == cpus
    assert input_workers(None, 2) == max(1, cpus // 2) and input_workers(None, 4 * cpus) == 1
    assert input_workers(3) == input_workers(3, 8) == 3
    spec = InputSpec(small_dataset, [28, 28, 1], RECIPES["reference"], None, "memory", 1, 64, 4)
    with caplog.at_level("INFO"):
        shared = train_input(spec, pipeline_id=0, num_pipelines=1, local_processes=4 * cpus)
        asked = train_input(spec, pipeline_id=0, num_pipelines=1, workers=3, local_processes=4 * cpus)
    assert (shared.workers, shared.train.workers, asked.workers, asked.train.workers) == (1, 1, 3, 3)
    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("train: input on")]
    assert said == [f"train: input on 1 thread(s) ({cpus} CPU(s) shared by {4 * cpus} process(es) on this machine)",
                    "train: input on 3 thread(s) (as asked)"]


def test_both_inputs_share_one_rule_for_a_workers_files_and_mode(caplog):
    """inputs.worker_share, what TrainInput and PortableTrainInput both take their share and mode from."""
    from components.train.inputs import MEMORY_INPUT_LIMIT_BYTES, worker_share

    files = [f"train-{i}.tfrecord" for i in range(5)]
    assert worker_share(files, 1, 2, "auto", 1000, [28, 28, 1]) == (files[1::2], None, "memory")
    with caplog.at_level("WARNING"):
        assert worker_share(files[:1], 1, 2, "stream", 1000, [28, 28, 1]) == (files[:1], (1, 2), "stream")
    assert "1 training shard(s) for 2 workers: each worker reads all and keeps every 2-th record" in caplog.text
    limit_count = MEMORY_INPUT_LIMIT_BYTES // (224 * 224 * 3)  # a worker's share at the limit: memory
    assert worker_share(files, 0, 2, "auto", 2 * limit_count, [224, 224, 3])[2] == "memory"
    assert worker_share(files, 0, 2, "auto", 2 * limit_count + 2, [224, 224, 3])[2] == "stream"
    # Source files held as their bytes: their size decides, not the pixels'.
    assert worker_share(files, 0, 2, "auto", 10, [224, 224, 3], 2 * MEMORY_INPUT_LIMIT_BYTES + 2)[2] == "stream"
    assert worker_share(files, 0, 2, "auto", 10 ** 9, [224, 224, 3], 1000)[2] == "memory"
    with pytest.raises(ValueError, match="input mode must be auto, memory or stream, got 'disk'"):
        worker_share(files, 0, 2, "disk", 10, [28, 28, 1])


def test_two_workers_share_the_split_by_file_and_by_record(small_dataset, tmp_path):
    """Two workers' shares are disjoint and cover the split; with fewer files than workers, every other record."""
    manifest = records.read_manifest(small_dataset)
    expected = sorted(records.image_label(r)[0] for r in records.interleave(records.split_files(small_dataset,
                                                                                                "train")))
    one_file = str(tmp_path / "one")
    os.makedirs(os.path.join(one_file, "train"))
    with open(os.path.join(one_file, "train", "train-00000-of-00001.tfrecord"), "wb") as f:
        for record in records.interleave(records.split_files(small_dataset, "train")):
            f.write(records.frame(record))
    with open(os.path.join(one_file, "dataset.json"), "w") as f:
        json.dump({**manifest, "splits": {"train": {**manifest["splits"]["train"], "path": "train"}}}, f)
    for dataset in (small_dataset, one_file):
        shares = [PortableTrainInput(dataset, [28, 28, 1], pipeline_id=i, num_pipelines=2, recipe=RECIPES["reference"],
                                     online_policy=None, mode="memory", workers=1) for i in range(2)]
        assert (shares[0].record_shard is None) == (dataset == small_dataset)
        held = [sorted(image.tobytes() for image in share.images) for share in shares]
        assert sorted(held[0] + held[1]) == expected
        assert abs(len(held[0]) - len(held[1])) <= max(1, len(expected) // 10)
        # every worker takes the same steps, cycling through its own share
        steps = -(-manifest["splits"]["train"]["count"] // (2 * 32))
        for share in shares:
            assert sum(1 for _ in share.batches(0, 0, steps, 32)) == steps


NO_TENSORFLOW = """
import json, sys
import numpy as np
# As on a lent GPU machine's python3 (tests/benchmarks/gpu.py): no TensorFlow, Keras or google-cloud-storage
# (`import` of a module set to None raises ImportError); google-crc32c and protobuf, which the shard reader needs,
# are dependencies of the project, in every image and among the GPU check's carried wheels
for name in ("tensorflow", "keras", "google.cloud.storage"):
    sys.modules[name] = None
from components.train.portable_input import PortableTrainInput, eval_batches
from components.train.recipes import RECIPES, Recipe
dataset, photos, out = sys.argv[1:4]
results = {}
for mode in ("memory", "stream"):
    pipeline = PortableTrainInput(dataset, [28, 28, 1], pipeline_id=0, num_pipelines=1, recipe=RECIPES["reference"],
                                  online_policy=json.loads(sys.argv[4]), mode=mode)
    x, y = zip(*pipeline.batches(epoch=0, first_batch=0, num_batches=3, batch=32))
    results[mode] = np.concatenate(x)
pipeline = PortableTrainInput(photos, [64, 64, 3], pipeline_id=0, num_pipelines=1, recipe=RECIPES["fast"],
                              online_policy={"preset": "photo"}, mode="stream")
results["photos"] = next(pipeline.batches(epoch=0, first_batch=0, num_batches=1, batch=8))[0]
results["test"] = np.concatenate([x for x, _ in eval_batches(dataset, "test", 100)])
loaded = sorted(name for name, module in sys.modules.items() if module is not None and name.split(".")[0] in
                ("tensorflow", "keras", "tf_keras", "tensorboard"))
assert not loaded, loaded
np.savez(out, **results)
"""


def test_a_process_without_tensorflow_reads_and_augments_a_split(small_dataset, food_photos, tmp_path_factory,
                                                                 tmp_path):
    from components import preprocess as pp

    photos = str(tmp_path_factory.mktemp("food") / "food64")
    pp.preprocess(food_photos, photos, image_size=64, channels=3, workers=1, min_shards=2, limit=40)
    out = str(tmp_path / "batches.npz")
    run = subprocess.run([sys.executable, "-c", NO_TENSORFLOW, small_dataset, photos, out, json.dumps(FULL_POLICY)],
                         cwd=REPO_ROOT, capture_output=True, text=True, timeout=600,
                         env={**os.environ, "PYTHONPATH": REPO_ROOT})
    assert run.returncode == 0, run.stderr[-3000:]
    got = np.load(out)
    for mode in ("memory", "stream"):
        pipeline = PortableTrainInput(small_dataset, [28, 28, 1], pipeline_id=0, num_pipelines=1,
                                      recipe=RECIPES["reference"], online_policy=FULL_POLICY, mode=mode)
        expected = np.concatenate([x for x, _ in pipeline.batches(epoch=0, first_batch=0, num_batches=3, batch=32)])
        np.testing.assert_array_equal(got[mode], expected)
    assert got["photos"].shape == (8, 64, 64, 3) and got["photos"].std() > 10
    np.testing.assert_array_equal(got["test"], data.load_split_arrays(small_dataset, "test")[0])


def test_bad_settings_and_data_say_what_is_wrong(small_dataset, tmp_path):
    with pytest.raises(ValueError, match="input mode must be auto, memory or stream"):
        PortableTrainInput(small_dataset, [28, 28, 1], pipeline_id=0, num_pipelines=1, recipe=RECIPES["reference"],
                           online_policy=None, mode="disk")
    with pytest.raises(data.DataError, match="is not a dataset produced by preprocess"):
        PortableTrainInput(str(tmp_path), [28, 28, 1], pipeline_id=0, num_pipelines=1, recipe=RECIPES["reference"],
                           online_policy=None)
    with pytest.raises(data.DataError, match="without TensorFlow only local paths and gs://"):
        records.split_files("s3://bucket/dataset", "train")
    buffer = io.BytesIO()
    Image.fromarray(np.zeros((10, 12, 3), np.uint8)).save(buffer, "PNG")
    with pytest.raises(data.DataError, match="is 10x12x3, not the dataset's image_shape 28x28x3"):
        pixels.decode_record_image(buffer.getvalue(), [28, 28, 3], "png")
    with pytest.raises(data.DataError, match="cannot be decoded"):
        pixels.decode_record_image(b"not an image", [28, 28, 3], "jpeg")


def test_a_dataset_by_reference_on_gs_is_read_through_its_manifest(small_dataset, tmp_path, monkeypatch,
                                                                    loopback_only):
    """Data by reference (docs/data-by-reference.md): the manifest in the artifact, the shards under gs://; read
    with google-cloud-storage's client (listing, ranged reads) from a Cloud Storage stand-in."""
    import shutil

    from tests.standins.gcs import GcsStandIn

    bucket = tmp_path / "gcs" / "bucket"
    shutil.copytree(small_dataset, bucket / "data")
    artifact = tmp_path / "artifact"
    artifact.mkdir()
    manifest = records.read_manifest(small_dataset)
    manifest["splits"] = {name: {**info, "path": f"gs://bucket/data/{info['path']}"}
                          for name, info in manifest["splits"].items()}
    (artifact / "dataset.json").write_text(json.dumps(manifest))
    with GcsStandIn(tmp_path / "gcs") as gcs:
        monkeypatch.setenv("STORAGE_EMULATOR_HOST", gcs.url)
        files = records.split_files(str(artifact), "train")
        assert files == [f"gs://bucket/data/{os.path.relpath(f, small_dataset)}"
                         for f in data.split_files(small_dataset, "train")]
        assert records.read_manifest("gs://bucket/data")["splits"]["train"]["count"] == manifest["splits"]["train"][
            "count"]
        remote = PortableTrainInput(str(artifact), [28, 28, 1], pipeline_id=0, num_pipelines=1,
                                    recipe=RECIPES["reference"], online_policy=None, mode="stream", workers=1)
        local = PortableTrainInput(small_dataset, [28, 28, 1], pipeline_id=0, num_pipelines=1,
                                   recipe=RECIPES["reference"], online_policy=None, mode="stream", workers=1)
        for (x, y), (x2, y2) in zip(remote.batches(0, 0, 4, 32), local.batches(0, 0, 4, 32), strict=True):
            np.testing.assert_array_equal(x, x2)
            np.testing.assert_array_equal(y, y2)
        test_images, _ = split_of(str(artifact), "test")
        np.testing.assert_array_equal(test_images, split_of(small_dataset, "test")[0])
        assert gcs.calls("storage.objects.list")
        assert all(call.headers.get("range", "").startswith("bytes=") for call in gcs.calls("storage.objects.media")
                   if call.path.endswith(".tfrecord"))
        with pytest.raises(data.DataError, match="gs://bucket/nothing-here is not a dataset"):
            records.read_manifest("gs://bucket/nothing-here")


def test_a_corrupt_shard_stops_the_input_with_the_files_name(small_dataset, tmp_path):
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(small_dataset, copy)
    shard = records.split_files(str(copy), "test")[1]
    contents = bytearray(open(shard, "rb").read())
    contents[5000] ^= 0x01
    with open(shard, "wb") as f:
        f.write(bytes(contents))
    with pytest.raises(data.DataError, match=f"{shard} is corrupt: the data of the record at byte"):
        for _ in eval_batches(str(copy), "test", 64):
            pass


def test_evaluation_batches_are_decoded_once_and_the_same_every_pass(small_dataset):
    from components.train.portable_input import PortableEvalInput

    validation = PortableEvalInput(small_dataset, "validation", 100, workers=1)
    first = list(validation.batches())
    assert validation._held is not None and len(first) == -(-len(data.load_split_arrays(small_dataset,
                                                                                         "validation")[1]) // 100)
    second = list(validation.batches())
    for (x, y), (x2, y2) in zip(first, second, strict=True):
        assert x2.dtype == np.float32
        np.testing.assert_array_equal(x, x2)
        np.testing.assert_array_equal(y, y2)


def test_the_portable_modules_import_no_framework_even_lazily():
    """What the subprocess test cannot reach (gs:// paths, error paths) still imports no TensorFlow or Keras: no
    `import` of them anywhere in these modules, inside functions included."""
    import ast

    for module in ("components/dataio/records.py", "components/dataio/pixels.py", "components/dataio/augment_numpy.py",
                   "components/train/portable_input.py"):
        with open(os.path.join(REPO_ROOT, module)) as f:
            tree = ast.parse(f.read())
        imported = {alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import)
                    for alias in node.names}
        imported |= {(node.module or "").split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
        assert not imported & {"tensorflow", "keras", "tf_keras", "torch", "jax"}, (module, imported)
