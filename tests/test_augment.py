"""Augmentation on real Fashion-MNIST images: each transform does what it says, seeds fix every draw, offline
copy k equals what training sees online at epoch k, and 0 copies passes the data through untouched."""

import collections
import glob
import os

import numpy as np
import pytest

from components import augment as aug
from components.dataio import data
from tests.conftest import preprocessed_slice

NONE = {"rotation_degrees": 0, "shift_fraction": 0, "zoom_range": 0}  # the default geometric changes off


@pytest.fixture(scope="module")
def dataset(fashion_dir, tmp_path_factory) -> str:
    return preprocessed_slice(fashion_dir, tmp_path_factory, "aug_dataset", limit=200)


@pytest.fixture(scope="module")
def images(dataset) -> list[np.ndarray]:
    return [img for img, _ in data.read_split(dataset, "train").take(8).as_numpy_iterator()]


def run(image: np.ndarray, policy: dict, index: int = 0, copy: int = 1) -> np.ndarray:
    import tensorflow as tf

    return aug.augment_image(tf.constant(image), index, copy, aug.AugmentPolicy.from_json(policy)).numpy()


# ---------------------------------------------------------------------------------------------- policy


@pytest.mark.parametrize("raw, message", [
    ({"rotation": 10}, "Unknown augmentation policy keys"),
    ({"rotation_degrees": -1}, "must be >= 0"),
    ({"zoom_range": 1.0}, "must be < 1"),
    ({"horizontal_flip": "yes"}, "true or false"),
    ({"seed": 1.5}, "integer"),
    ({"brightness": "0.1"}, "number"),
    ({"elastic_alpha": 10, "elastic_sigma": 0}, "elastic_sigma must be > 0"),
    ({"preset": "imagenet"}, "Unknown augmentation preset 'imagenet'; presets: photo"),
    ({"preset": 1}, "preset must be a string"),
    ({"random_resized_crop": True, "crop_scale_min": 0}, "0 < crop_scale_min <= crop_scale_max <= 1"),
    ({"crop_scale_min": 0.5, "crop_scale_max": 0.4}, "0 < crop_scale_min <= crop_scale_max <= 1"),
    ({"crop_scale_max": 1.5}, "crop_scale_max <= 1"),
    ({"crop_aspect_min": 2, "crop_aspect_max": 1}, "0 < crop_aspect_min <= crop_aspect_max"),
    ("fotos", "neither a JSON object .* nor a preset name \\(photo\\)"),
    ("[1, 2]", "must be a JSON object or a preset name"),
])
def test_policy_validation(raw, message):
    with pytest.raises(ValueError, match=message):
        aug.AugmentPolicy.from_json(raw)


def test_policy_round_trip_and_defaults():
    policy = aug.AugmentPolicy.from_json('{"elastic_alpha": 30, "seed": 4}')
    assert aug.AugmentPolicy.from_json(policy.to_json()) == policy
    assert aug.AugmentPolicy().horizontal_flip is False  # it breaks digits and text
    assert aug.AugmentPolicy.from_json(NONE).is_identity and not policy.is_identity
    assert aug.AugmentPolicy().random_resized_crop is False  # the reference run is unchanged


def test_photo_preset_and_its_spellings():
    photo = aug.AugmentPolicy.from_json({"preset": "photo"})
    assert photo.random_resized_crop and photo.horizontal_flip
    assert (photo.crop_scale_min, photo.crop_scale_max, photo.crop_aspect_min, photo.crop_aspect_max) == \
        (0.08, 1.0, 3 / 4, 4 / 3)
    assert (photo.rotation_degrees, photo.shift_fraction, photo.zoom_range) == (0, 0, 0)
    assert aug.AugmentPolicy.from_json("photo") == aug.AugmentPolicy.from_json(" photo \n") == photo
    assert aug.AugmentPolicy.from_json('{"preset": "photo"}') == photo
    # Keys beside the preset override it, and the resolved policy (what the manifest carries) round-trips.
    milder = aug.AugmentPolicy.from_json({"preset": "photo", "crop_scale_min": 0.25, "seed": 7})
    assert (milder.crop_scale_min, milder.horizontal_flip, milder.seed) == (0.25, True, 7)
    assert aug.AugmentPolicy.from_json(milder.to_json()) == milder
    assert not photo.is_identity


def test_the_pipeline_parameter_takes_the_preset():
    from pipelines import parameters

    parameters.validate({"augment_policy": "photo"}, what="parameters")
    parameters.validate({"augment_policy": '{"preset": "photo", "seed": 3}'}, what="parameters")
    with pytest.raises(ValueError, match="Unknown augmentation preset"):
        parameters.validate({"augment_policy": '{"preset": "pictures"}'}, what="parameters")


# ---------------------------------------------------------------------------------------------- transforms


def test_identity_policy_returns_the_image(images):
    np.testing.assert_array_equal(run(images[0], NONE), images[0])


def test_seed_copy_and_index_fix_every_draw(images):
    policy = {"rotation_degrees": 15, "elastic_alpha": 20, "noise_stddev": 0.05, "cutout_fraction": 0.2, "seed": 3}
    first = run(images[0], policy, index=5, copy=2)
    np.testing.assert_array_equal(first, run(images[0], policy, index=5, copy=2))
    assert not np.array_equal(first, run(images[0], policy, index=5, copy=3))
    assert not np.array_equal(first, run(images[0], policy, index=6, copy=2))
    assert not np.array_equal(first, run(images[0], {**policy, "seed": 4}, index=5, copy=2))


def test_shift_moves_the_centre_of_mass_within_the_range(images):
    def centre(image):
        weights = image[..., 0].astype(np.float64)
        rows, cols = np.indices(weights.shape)
        return np.array([(rows * weights).sum(), (cols * weights).sum()]) / weights.sum()

    moves = [centre(run(images[1], {**NONE, "shift_fraction": 0.1}, copy=c)) - centre(images[1]) for c in range(1, 9)]
    assert max(abs(m).max() for m in moves) <= 0.1 * 28 + 0.5
    assert max(abs(m).max() for m in moves) > 0.5


def test_flip_mirrors_or_keeps(images):
    outs = [run(images[2], {**NONE, "horizontal_flip": True}, copy=c) for c in range(1, 9)]
    assert all(np.array_equal(o, images[2]) or np.array_equal(o, images[2][:, ::-1]) for o in outs)
    assert any(np.array_equal(o, images[2][:, ::-1]) for o in outs) and any(np.array_equal(o, images[2]) for o in outs)


def test_rotation_and_zoom_keep_the_shape(images):
    for policy in ({**NONE, "rotation_degrees": 30}, {**NONE, "zoom_range": 0.3}):
        out = run(images[3], policy)
        assert out.shape == images[3].shape and out.dtype == np.uint8 and not np.array_equal(out, images[3])


def ramps(size: int = 64) -> np.ndarray:
    """An RGB image whose red is 4 x column and green 4 x row: where each output pixel came from is readable."""
    rows, cols = np.indices((size, size))
    return np.stack([cols * 4, rows * 4, np.full_like(rows, 100)], axis=-1).astype(np.uint8)


def test_random_resized_crop_takes_a_box_in_range_and_resizes_it_back():
    image = ramps()
    policy = {**NONE, "random_resized_crop": True, "crop_scale_min": 0.25, "seed": 5}
    areas, aspects, outs = [], [], []
    for copy in range(1, 13):
        out = run(image, policy, index=3, copy=copy)
        assert out.shape == image.shape and out.dtype == np.uint8
        red, green = out[..., 0].astype(np.float64), out[..., 1].astype(np.float64)
        # A crop, not a warp: the columns still increase to the right and the rows downwards, and blue is intact.
        assert (np.diff(red, axis=1) >= 0).all() and (np.diff(green, axis=0) >= 0).all()
        assert (out[..., 2] == 100).all()
        width, height = (red.max() - red.min()) / 4 + 1, (green.max() - green.min()) / 4 + 1
        areas.append(width * height / 64 ** 2)
        aspects.append(width / height)
        outs.append(out)
    assert all(0.25 - 0.05 <= a <= 1.0 for a in areas) and min(areas) < 0.6  # really crops, within the range
    assert all(3 / 4 - 0.1 <= r <= 4 / 3 + 0.1 for r in aspects)
    assert len({o.tobytes() for o in outs}) > 8  # a new box per copy
    np.testing.assert_array_equal(outs[0], run(image, policy, index=3, copy=1))  # and the same box per seed
    assert not np.array_equal(outs[0], run(image, {**policy, "seed": 6}, index=3, copy=1))


@pytest.mark.parametrize("shape", [(28, 28, 1), (64, 64, 3), (96, 96, 3)])
def test_photo_preset_keeps_shape_and_dtype(shape):
    image = np.random.default_rng(0).integers(0, 256, shape, dtype=np.uint8)
    outs = [run(image, {"preset": "photo", "seed": 1}, copy=c) for c in range(1, 5)]
    assert all(o.shape == shape and o.dtype == np.uint8 for o in outs)
    assert all(not np.array_equal(o, image) for o in outs)


def test_photo_preset_flips_some_copies_and_not_others():
    image = ramps()
    policy = {"preset": "photo", "seed": 2}
    directions = set()
    for copy in range(1, 13):
        red = run(image, policy, copy=copy)[..., 0].astype(np.int64)
        steps = np.diff(red, axis=1)
        assert (steps >= 0).all() or (steps <= 0).all()  # mirrored as a whole, never in parts
        directions.add("left-to-right" if steps.sum() > 0 else "right-to-left")
    assert directions == {"left-to-right", "right-to-left"}
    # The flip alone (crop off) mirrors exactly.
    flip_only = {"preset": "photo", "random_resized_crop": False, "seed": 2}
    outs = [run(image, flip_only, copy=c) for c in range(1, 9)]
    assert all(np.array_equal(o, image) or np.array_equal(o, image[:, ::-1]) for o in outs)
    assert any(np.array_equal(o, image[:, ::-1]) for o in outs)


def test_brightness_contrast_and_noise(images):
    gray = np.full((28, 28, 1), 128, np.uint8)
    shifts = [int(run(gray, {**NONE, "brightness": 0.2}, copy=c)[0, 0, 0]) - 128 for c in range(1, 9)]
    assert all(abs(s) <= 0.2 * 255 + 1 for s in shifts) and len(set(shifts)) > 1
    noisy = run(gray, {**NONE, "noise_stddev": 0.05}).astype(np.float64) - 128
    assert 0.03 * 255 < noisy.std() < 0.07 * 255
    image = images[4]
    contrasted = run(image, {**NONE, "contrast": 0.5}).astype(np.float64)
    assert not np.array_equal(contrasted, image)
    assert abs(contrasted.mean() - image.mean()) < 20  # around the image mean (up to clipping)


def test_cutout_zeroes_a_square(images):
    bright = np.full((28, 28, 1), 200, np.uint8)
    out = run(bright, {**NONE, "cutout_fraction": 0.25})
    rows, cols = np.nonzero(out[..., 0] == 0)
    assert len(rows) == 7 * 7 and rows.max() - rows.min() == 6 and cols.max() - cols.min() == 6


def test_elastic_distortion_is_smooth_and_bounded():
    constant = np.full((28, 28, 1), 90, np.uint8)
    policy = {**NONE, "elastic_alpha": 34, "elastic_sigma": 4}
    np.testing.assert_array_equal(run(constant, policy), constant)  # sampling weights sum to one
    ramp = (np.arange(28)[None, :, None] * 8 + np.zeros((28, 1, 1))).astype(np.uint8)  # value = 8 * column
    out = run(ramp, policy).astype(np.float64)[2:-2, 2:-2]  # away from the clamped borders
    dx = (out - ramp[2:-2, 2:-2]) / 8  # the horizontal displacement each pixel got
    assert 0.2 < np.abs(dx).mean() and np.abs(dx).max() < 34  # moved, by less than alpha
    assert np.abs(np.diff(dx, axis=1)).mean() < 0.5 * np.abs(dx).mean()  # smooth, not pixel noise


# ---------------------------------------------------------------------------------------------- the step


def shard_files(directory: str) -> list[str]:
    return glob.glob(os.path.join(directory, "**", "*.tfrecord"), recursive=True)


def test_zero_copies_passes_through_without_copying(dataset, tmp_path):
    result = aug.augment(dataset, str(tmp_path / "out"), copies=0)
    assert shard_files(str(tmp_path / "out")) == []
    assert result.train_count == data.read_manifest(dataset)["splits"]["train"]["count"]
    assert aug.train_files(dataset, str(tmp_path / "out")) == (dataset, None)
    assert data.split_files(str(tmp_path / "out"), "train") == data.split_files(dataset, "train")


def test_online_hands_the_policy_to_training(dataset, tmp_path):
    policy = aug.AugmentPolicy.from_json({"elastic_alpha": 20, "seed": 9})
    aug.augment(dataset, str(tmp_path / "out"), copies=3, mode="online", policy=policy)
    assert shard_files(str(tmp_path / "out")) == []
    train_dir, online = aug.train_files(dataset, str(tmp_path / "out"))
    assert train_dir == dataset and aug.AugmentPolicy.from_json(online) == policy


def test_offline_writes_originals_and_copies(dataset, tmp_path):
    policy = aug.AugmentPolicy.from_json({"rotation_degrees": 12, "elastic_alpha": 20, "seed": 2})
    result = aug.augment(dataset, str(tmp_path / "out"), copies=2, policy=policy)
    originals = list(data.read_split(dataset, "train", with_uri=True).as_numpy_iterator())
    stored = list(data.read_split(str(tmp_path / "out"), "train", with_uri=True).as_numpy_iterator())
    assert result.train_count == len(stored) == 3 * len(originals)
    by_uri = {u.decode(): (img, int(lab)) for img, lab, u in stored}
    for index, (image, label, uri) in enumerate(originals[:20]):
        np.testing.assert_array_equal(by_uri[uri.decode()][0], image)
        for copy in (1, 2):
            augmented, augmented_label = by_uri[f"{uri.decode()}#aug{copy}"]
            assert augmented_label == label
            np.testing.assert_array_equal(augmented, run(image, policy.to_json(), index=index, copy=copy))
    assert aug.train_files(dataset, str(tmp_path / "out"))[0] == str(tmp_path / "out")


@pytest.mark.parametrize("raw", [
    {"rotation_degrees": 10, "shift_fraction": 0.1, "elastic_alpha": 25, "noise_stddev": 0.02, "cutout_fraction": 0.2,
     "seed": 11},
    {"preset": "photo", "seed": 11},
], ids=["geometric+elastic", "photo"])
def test_online_epoch_k_equals_offline_copy_k(dataset, tmp_path, raw):
    """What training's own input pipeline feeds at epoch k is exactly offline copy k (as a multiset: it shuffles)."""
    from components import train
    from components.train.inputs import TrainInput

    policy = aug.AugmentPolicy.from_json(raw)
    aug.augment(dataset, str(tmp_path / "offline"), copies=2, policy=policy)
    aug.augment(dataset, str(tmp_path / "online"), copies=2, mode="online", policy=policy)
    offline = collections.defaultdict(list)
    for image, label, uri in data.read_split(str(tmp_path / "offline"), "train", with_uri=True).as_numpy_iterator():
        copy = uri.decode().rsplit("#aug", 1)[1] if "#aug" in uri.decode() else "0"
        offline[int(copy)].append((int(label), image.tobytes()))
    train_dir, online_policy = aug.train_files(dataset, str(tmp_path / "online"))
    image_shape = data.read_manifest(train_dir)["image_shape"]
    inputs = TrainInput(train_dir, image_shape, pipeline_id=0, num_pipelines=1, recipe=train.Recipe(),
                        online_policy=online_policy, mode="memory")
    count = inputs.total_count
    for k in (1, 2):
        # Epoch k-1 (counted from 0) augments as copy k; one batch of the whole split holds each image once.
        ((images, labels),) = list(inputs.dataset(k - 1, 0, 1, count).as_numpy_iterator())
        seen = [(int(lab), img.astype(np.uint8).tobytes()) for img, lab in zip(images, labels)]
        assert sorted(seen) == sorted(offline[k])
    assert sorted(offline[1]) != sorted(offline[2])


def test_preview_shows_originals_and_copies(dataset):
    html = aug.policy_preview(dataset, aug.AugmentPolicy.from_json({"elastic_alpha": 20}), rows=4, copies=5,
                              note="not applied")
    assert html.count("data:image/png;base64,") == 4 and "elastic_alpha" in html and "not applied" in html
    assert "copies 1-5" in html


def test_bad_arguments_and_cli(dataset, tmp_path, capsys):
    with pytest.raises(ValueError, match="mode"):
        aug.augment(dataset, str(tmp_path / "x"), mode="sometimes")
    with pytest.raises(ValueError, match="copies"):
        aug.augment(dataset, str(tmp_path / "x"), copies=-1)
    assert aug.main(["--dataset-dir", dataset, "--output-dir", str(tmp_path / "y"), "--policy", '{"spin": 1}']) == 2
    assert "Unknown augmentation policy keys ['spin']" in capsys.readouterr().err
    assert aug.main(["--dataset-dir", dataset, "--output-dir", str(tmp_path / "z"), "--copies", "1", "--policy",
                     '{"seed": 1}', "--preview", str(tmp_path / "preview.html")]) == 0
    assert (tmp_path / "preview.html").read_text().startswith("<!doctype html>")
