"""The shards' record format: raw pixels below 64 px (the reference workload), PNG for lossless sources and JPEG
for lossy ones from 64 px, recorded in the manifest and honoured by every reader (read_split, training's input,
augment's copies, evaluation, batch prediction, the card)."""

import json
import os

import numpy as np
import pytest
from PIL import Image

from components import augment as augment_lib
from components import data
from components import preprocess as pp
from components.train.inputs import TrainInput

RAW_224_RGB = 224 * 224 * 3  # 150,528 bytes


def photo(rng: np.random.Generator, size: int = 224) -> np.ndarray:
    """A photo-like RGB image: smooth lighting gradients, a few soft blobs, sensor noise."""
    y, x = np.mgrid[0:size, 0:size] / size
    channels = []
    for _ in range(3):
        a, b, c = rng.uniform(-1, 1, 3)
        base = 128 + 60 * (a * x + b * y) + 30 * np.sin(2 * np.pi * (c * x + y))
        for _ in range(3):
            cx, cy, r = rng.uniform(0, 1, 3)
            base += 50 * np.exp(-((x - cx) ** 2 + (y - cy) ** 2) / (0.02 + 0.05 * r))
        channels.append(base)
    image = np.stack(channels, -1) + rng.normal(0, 4, (size, size, 3))
    return image.clip(0, 255).astype(np.uint8)


def photo_tree(root, rng, fmt: str, per_class: int = 6, size: int = 224, target: int | None = None) -> dict:
    """Two class folders of photos saved as `fmt`; returns path -> the pixels preprocess decodes at `target` px."""
    made = {}
    for cls in ("cat", "dog"):
        os.makedirs(root / cls, exist_ok=True)
        for i in range(per_class):
            path = str(root / cls / f"{i}.{'jpg' if fmt == 'JPEG' else 'png'}")
            Image.fromarray(photo(rng, size)).save(path, fmt, **({"quality": 92} if fmt == "JPEG" else {}))
            with open(path, "rb") as f:
                made[path] = data.decode_image(f.read(), target or size, target or size, 3)
    return made


def stored_images(dataset_dir: str) -> dict[str, np.ndarray]:
    return {uri.decode(): image for split in data.SPLITS
            for image, _, uri in data.read_split(dataset_dir, split, with_uri=True).as_numpy_iterator()}


def test_224_photos_from_jpegs_are_stored_as_jpeg_at_a_quarter_of_raw_or_less(tmp_path):
    made = photo_tree(tmp_path / "photos", np.random.default_rng(1), "JPEG", size=320, target=224)  # resized
    out = str(tmp_path / "out")
    result = pp.preprocess(str(tmp_path / "photos"), out, image_size=224, channels=3, workers=1, min_shards=1)
    manifest = data.read_manifest(out)
    assert manifest["image_encoding"] == data.JPEG
    count = sum(result.counts.values())
    stored_bytes = sum(info["bytes"] for info in manifest["splits"].values())
    on_disk = sum(os.path.getsize(f) for s in data.SPLITS for f in data.split_files(out, s))
    assert count == len(made) and on_disk >= stored_bytes
    per_record = on_disk / count
    print(f"{per_record:.0f} bytes per 224x224 RGB record ({RAW_224_RGB / per_record:.1f}x smaller than raw)")
    assert on_disk / count <= RAW_224_RGB / 4, f"{on_disk / count:.0f} bytes per record"
    for uri, image in stored_images(out).items():  # lossy, but close: quality 95 of the decoded source
        difference = np.abs(image.astype(int) - made[uri].astype(int))
        assert difference.mean() < 2.5 and np.percentile(difference, 99) < 16


def test_png_sources_are_stored_losslessly(tmp_path):
    made = photo_tree(tmp_path / "photos", np.random.default_rng(2), "PNG", per_class=3, size=96)
    out = str(tmp_path / "out")
    pp.preprocess(str(tmp_path / "photos"), out, image_size=96, channels=3, workers=1, min_shards=1)
    assert data.read_manifest(out)["image_encoding"] == data.PNG
    stored = stored_images(out)
    assert stored.keys() == made.keys()
    for uri, image in stored.items():
        np.testing.assert_array_equal(image, made[uri])
    assert "stored as PNG" in pp.dataset_card(out)


def test_sources_already_of_the_target_size_are_stored_as_they_are(tmp_path):
    """No second JPEG generation and no encoding time: the record holds the file, which reads back to exactly the
    pixels preprocess decoded."""
    made = photo_tree(tmp_path / "photos", np.random.default_rng(4), "JPEG", per_class=3, size=96)
    made.update(photo_tree(tmp_path / "photos", np.random.default_rng(5), "PNG", per_class=1, size=96))
    out = str(tmp_path / "out")
    pp.preprocess(str(tmp_path / "photos"), out, image_size=96, channels=3, workers=1, min_shards=1)
    assert data.read_manifest(out)["image_encoding"] == data.ENCODED
    import tensorflow as tf

    for split in data.SPLITS:
        for record, _ in data.read_records(out, split).as_numpy_iterator():
            features = tf.train.Example.FromString(record).features.feature
            uri = features["uri"].bytes_list.value[0].decode()
            with open(uri, "rb") as f:
                assert features["image"].bytes_list.value[0] == f.read()
    for uri, image in stored_images(out).items():
        np.testing.assert_array_equal(image, made[uri])


def test_a_mix_of_jpeg_and_png_sources_is_encoded_and_read_back(tmp_path):
    rng = np.random.default_rng(3)
    made = photo_tree(tmp_path / "photos", rng, "PNG", per_class=2, size=64)
    made.update(photo_tree(tmp_path / "photos", rng, "JPEG", per_class=2, size=64))
    out = str(tmp_path / "out")
    pp.preprocess(str(tmp_path / "photos"), out, image_size=64, channels=3, workers=1, min_shards=1)
    assert data.read_manifest(out)["image_encoding"] == data.ENCODED
    stored = stored_images(out)
    for uri, image in stored.items():
        if uri.endswith(".png"):
            np.testing.assert_array_equal(image, made[uri])
        else:
            assert np.abs(image.astype(int) - made[uri].astype(int)).mean() < 3


def test_small_images_stay_raw_and_old_manifests_read_as_raw(fashion_dir, tmp_path):
    out = str(tmp_path / "out")
    pp.preprocess(fashion_dir, out, limit=60, min_shards=1)
    manifest = data.read_manifest(out)
    assert manifest["image_encoding"] == data.RAW
    record = next(iter(data.read_records(out, "train").as_numpy_iterator()))[0]
    import tensorflow as tf

    assert len(tf.train.Example.FromString(record).features.feature["image"].bytes_list.value[0]) == 28 * 28
    before = stored_images(out)
    del manifest["image_encoding"]  # a dataset written before the key existed
    data.write_json(os.path.join(out, data.MANIFEST), manifest)
    after = stored_images(out)
    assert before.keys() == after.keys() and all((before[k] == after[k]).all() for k in before)
    manifest["image_encoding"] = "webp"
    data.write_json(os.path.join(out, data.MANIFEST), manifest)
    with pytest.raises(data.DataError, match="Unknown image_encoding 'webp'"):
        data.read_split(out, "train")


@pytest.fixture(scope="module")
def fashion_64_rgb(fashion_dir, tmp_path_factory) -> str:
    """Fashion-MNIST resized to 64x64 RGB: PNG records (idx arrays are a lossless source)."""
    out = str(tmp_path_factory.mktemp("fashion64") / "dataset")
    pp.preprocess(fashion_dir, out, image_size=64, channels=3, limit=400, min_shards=2)
    return out


def test_training_input_decodes_encoded_shards_in_both_modes(fashion_64_rgb):
    from components import train

    manifest = data.read_manifest(fashion_64_rgb)
    assert manifest["image_encoding"] == data.PNG and manifest["image_shape"] == [64, 64, 3]
    reference, _ = data.load_split_arrays(fashion_64_rgb, "train")
    batches = {}
    for mode in ("memory", "stream"):
        pipeline = TrainInput(fashion_64_rgb, [64, 64, 3], pipeline_id=0, num_pipelines=1,
                              recipe=train.RECIPES["fast"], online_policy=None, mode=mode)
        images, labels = next(iter(pipeline.dataset(epoch=0, first_batch=0, num_batches=1, batch=16)))
        assert images.shape == (16, 64, 64, 3)
        batches[mode] = images.numpy()
    train_images = {image.tobytes() for image in reference.astype(np.float32)}
    assert all(image.tobytes() in train_images for mode in batches for image in batches[mode])


def test_a_short_training_run_reads_encoded_shards(fashion_64_rgb, tmp_path):
    from components.train import train

    result = train(fashion_64_rgb, str(tmp_path / "model"), epochs=1, batch_size=64)
    info = json.loads((tmp_path / "model" / "training.json").read_text())
    assert info["image_shape"] == [64, 64, 3] and result.train_seconds > 0


def test_offline_copies_keep_the_encoding_and_the_originals_bytes(fashion_64_rgb, tmp_path):
    out = str(tmp_path / "augmented")
    policy = augment_lib.AugmentPolicy.from_json('{"rotation_degrees": 10, "seed": 3}')
    augment_lib.augment(fashion_64_rgb, out, copies=1, policy=policy, min_shards=1)
    assert data.read_manifest(out)["image_encoding"] == data.PNG
    originals = {r for r, _ in data.read_records(fashion_64_rgb, "train").as_numpy_iterator()}
    copied = {r for r, _ in data.read_records(out, "train").as_numpy_iterator()}
    assert originals <= copied and len(copied) == 2 * len(originals)
    images, _ = data.load_split_arrays(out, "train")
    assert images.shape[1:] == (64, 64, 3)


def test_batch_prediction_reads_encoded_shards_like_training(fashion_64_rgb):
    import concurrent.futures

    from components.predict.decode import Decoder, iter_records

    expected = stored_images(fashion_64_rgb)
    shard = data.split_files(fashion_64_rgb, "test")[0]
    items = list(iter_records(shard))
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        keys, images, failures = Decoder([64, 64, 3], pool, raw_ok=True).decode(items)
    assert not failures and len(keys) == len(items) > 0
    for key, image in zip(keys, images):
        np.testing.assert_array_equal(image, expected[key])


def test_image_size_is_bounded_to_8_512():
    from components import params

    assert params.problems({"image_size": 512}) == []
    assert params.problems({"image_size": 513}) == ["image_size must be in [8, 512] (got 513)"]
    assert params.problems({"image_size": 4}) == ["image_size must be in [8, 512] (got 4)"]
