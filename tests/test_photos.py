"""Camera-sized photos: the source records' one resize rule shared by the readers, and training's photo recipe
decoding only its crop of each source file (data.SOURCE)."""

import os

import numpy as np
import pytest
from PIL import Image

from components import augment as augment_lib
from components.dataio import data
from components import preprocess as pp
from components.train.inputs import TrainInput
from tests.test_records import photo, source_pixels


@pytest.fixture(scope="module")
def photo_dataset(tmp_path_factory) -> tuple[str, str]:
    """(source folder, dataset): JPEGs and PNGs of several sizes (some above max_side) in two classes, at 64 px."""
    root = tmp_path_factory.mktemp("photos")
    rng = np.random.default_rng(11)
    sizes = [(96, 128), (240, 320), (300, 200), (64, 64), (180, 90), (520, 600)]
    for cls in ("cat", "dog"):
        os.makedirs(root / cls)
        for i, (height, width) in enumerate(sizes * 2):
            image = np.asarray(Image.fromarray(photo(rng, max(height, width))).resize((width, height)))
            if i % 3 == 2:
                Image.fromarray(image).save(root / cls / f"{i}.png")
            else:
                Image.fromarray(image).save(root / cls / f"{i}.jpg", quality=90)
    out = str(tmp_path_factory.mktemp("dataset") / "photos")
    pp.preprocess(str(root), out, image_size=64, channels=3, workers=1, min_shards=1, validation_fraction=0.2,
                  test_fraction=0.2)
    return str(root), out


def test_the_crop_decodes_to_the_pixels_of_the_whole_file_cropped():
    """decode_and_crop_jpeg decodes only the crop's blocks, to the same pixels as decoding all and slicing."""
    import tensorflow as tf

    image = photo(np.random.default_rng(3), 300)
    for fmt in ("JPEG", "PNG"):
        import io

        buffer = io.BytesIO()
        Image.fromarray(image).save(buffer, fmt)
        contents = tf.constant(buffer.getvalue())
        box = tf.constant([37, 51, 120, 90])
        whole = (tf.io.decode_jpeg(contents, channels=3, dct_method="INTEGER_ACCURATE") if fmt == "JPEG" else
                 tf.io.decode_png(contents, channels=3))[37:157, 51:141]
        expected = data.resize_to_shape(whole, [64, 64, 3], antialias=False)
        np.testing.assert_array_equal(data.decode_crop_to_shape(contents, [64, 64, 3], box).numpy(),
                                      expected.numpy())
        assert data.source_shape(contents, 3).numpy().tolist() == [300, 300, 3]


def test_the_rule_uses_dct_scaling_only_where_it_keeps_the_target_size():
    import io

    import tensorflow as tf

    image = photo(np.random.default_rng(4), 512)
    buffer = io.BytesIO()
    Image.fromarray(image).save(buffer, "JPEG", quality=95)
    contents = tf.constant(buffer.getvalue())
    for target, ratio in ((64, 8), (100, 4), (200, 2), (300, 1)):
        full = tf.io.decode_jpeg(contents, channels=3, ratio=ratio, dct_method="INTEGER_ACCURATE")
        assert min(full.shape[:2]) >= target
        np.testing.assert_array_equal(data.decode_to_shape(contents, [target, target, 3]).numpy(),
                                      data.resize_to_shape(full, [target, target, 3]).numpy())


def test_the_rule_antialiases_only_where_a_side_shrinks_three_times_or_more():
    """After DCT scaling a JPEG is within about 2x of the target, where plain bilinear is what the rule does (and
    what training's crops do); a much larger PNG is averaged over every source pixel instead of sampled."""
    import tensorflow as tf

    rng = np.random.default_rng(5)
    for side, smooth in ((100, False), (191, False), (192, True), (400, True)):  # the height decides
        image = tf.constant(rng.integers(0, 256, (side, side - 20, 3), dtype=np.uint8))
        expected = tf.cast(tf.clip_by_value(tf.round(tf.image.resize(image, [64, 64], antialias=smooth)), 0, 255),
                           tf.uint8)
        np.testing.assert_array_equal(data.resize_to_shape(image, [64, 64, 3]).numpy(), expected.numpy())
        other = tf.image.resize(image, [64, 64], antialias=not smooth)
        assert np.abs(tf.round(other).numpy() - expected.numpy()).max() > 0  # the two filters differ here


def test_evaluation_and_batch_prediction_read_a_file_to_the_same_pixels(photo_dataset):
    import concurrent.futures

    from components.predict.decode import Decoder, read_input

    root, dataset = photo_dataset
    evaluated = {uri.decode(): image for split in data.SPLITS
                 for image, _, uri in data.read_split(dataset, split, with_uri=True).as_numpy_iterator()}
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        files = sorted(evaluated)
        keys, images, failures = Decoder([64, 64, 3], pool).decode([(uri, read_input(uri)) for uri in files])
    assert not failures and keys == files
    max_side = data.read_manifest(dataset)["source_files"]["max_side"]
    compared = 0
    for key, image in zip(keys, images):
        if max(Image.open(key).size) >= 2 * max_side:
            continue  # its record holds it scaled down: close to the file's pixels, not equal
        np.testing.assert_array_equal(image, evaluated[key])
        np.testing.assert_array_equal(image, source_pixels(key, [64, 64, 3]))
        compared += 1
    assert compared >= len(files) * 3 // 5


def test_the_photo_recipe_trains_from_the_source_pixels_in_both_modes(photo_dataset):
    """Memory and stream modes decode each example's crop from its source file; both give examples that
    augment_source gives for that file, index and epoch."""
    import tensorflow as tf

    from components import train

    _, dataset = photo_dataset
    policy = augment_lib.AugmentPolicy.from_json("photo")
    stored = {}
    for record, _ in data.read_records(dataset, "train").as_numpy_iterator():
        features = tf.train.Example.FromString(record).features.feature
        stored[features["image"].bytes_list.value[0]] = features["label"].int64_list.value[0]
    for mode in ("memory", "stream"):
        pipeline = TrainInput(dataset, [64, 64, 3], pipeline_id=0, num_pipelines=1, recipe=train.RECIPES["fast"],
                              online_policy=policy.to_json(), mode=mode)
        assert pipeline.source_bytes
        images, labels = next(iter(pipeline.dataset(epoch=0, first_batch=0, num_batches=1, batch=4)))
        assert images.shape == (4, 64, 64, 3) and images.dtype == tf.float32
        again, _ = next(iter(pipeline.dataset(epoch=0, first_batch=0, num_batches=1, batch=4)))
        np.testing.assert_array_equal(images.numpy(), again.numpy())  # resumable: a pure function of the seed
        if mode == "memory":
            order = tf.random.experimental.stateless_shuffle(tf.range(len(stored), dtype=tf.int64),
                                                             seed=[pipeline.seed, 0]).numpy()
            contents = pipeline.images.numpy()
            for position in range(4):
                pick = order[position]
                expected = augment_lib.augment_source(tf.constant(contents[pick]), pick, 1, policy, [64, 64, 3])
                np.testing.assert_array_equal(images[position].numpy(), expected.numpy().astype(np.float32))
                assert labels[position] == stored[contents[pick]]


def test_the_card_and_offline_copies_of_a_source_dataset(photo_dataset, tmp_path):
    _, dataset = photo_dataset
    card = pp.dataset_card(dataset)
    assert "as the source files' bytes" in card and "4 at least twice max_side" in card and "max_side 256" in card
    samples = data.read_manifest(dataset)["samples"]
    assert samples["file"] == pp.SAMPLES_PHOTO_FILE and card.count("data:image/png;base64,") == samples["classes"]
    grid = Image.open(os.path.join(dataset, pp.SAMPLES_PHOTO_FILE))
    assert grid.format == "JPEG" and grid.size == (8 * 65 - 1, 2 * 65 - 1)
    out = str(tmp_path / "augmented")
    augment_lib.augment(dataset, out, copies=1, policy=augment_lib.AugmentPolicy.from_json("photo"), min_shards=1)
    assert data.read_manifest(out)["image_encoding"] == data.SOURCE  # the originals as they are, copies as JPEG
    originals = {r for r, _ in data.read_records(dataset, "train").as_numpy_iterator()}
    copied = {r for r, _ in data.read_records(out, "train").as_numpy_iterator()}
    assert originals <= copied and len(copied) == 2 * len(originals)
    images, _ = data.load_split_arrays(out, "train")
    assert images.shape == (2 * len(originals), 64, 64, 3)


def test_the_exported_model_serves_image_files_with_the_readers_rule(photo_dataset, tmp_path):
    """The SavedModel's file endpoint gives a file the probabilities that its pixels, as evaluation and batch
    prediction decode them, get from the pixel endpoint."""
    import tensorflow as tf

    from components.train import train
    from components.train.model import SERVE_IMAGE_FILES

    root, dataset = photo_dataset
    train(dataset, str(tmp_path / "model"), epochs=1, batch_size=8)
    loaded = tf.saved_model.load(str(tmp_path / "model" / "saved_model"))
    files = sorted(str(p) for p in __import__("pathlib").Path(root).rglob("*.jpg"))[:4]
    contents = [open(f, "rb").read() for f in files]
    by_files = loaded.signatures[SERVE_IMAGE_FILES](tf.constant(contents))
    pixels = np.stack([source_pixels(f, [64, 64, 3]) for f in files]).astype(np.float32)
    by_pixels = loaded.signatures["serving_default"](tf.constant(pixels))
    (files_out,), (pixels_out,) = by_files.values(), by_pixels.values()
    np.testing.assert_allclose(files_out.numpy(), pixels_out.numpy(), atol=1e-6)
