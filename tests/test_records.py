"""The shards' record format: raw pixels below 64 px (the reference workload), from 64 px the source files' bytes
(re-encoded once only where they must be) and PNG for decoded arrays (idx, tfds), recorded in the manifest and
honoured by every reader (read_split, training's input, augment's copies, evaluation, batch prediction, the card);
datasets of earlier releases (raw, png, jpeg, encoded) still read."""

import json
import os

import numpy as np
import pytest
from PIL import Image

from components import augment as augment_lib
from components.dataio import data
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


def source_pixels(path: str, shape) -> np.ndarray:
    """What the readers' one rule (data.decode_to_shape) makes of a file."""
    import tensorflow as tf

    with open(path, "rb") as f:
        return data.decode_to_shape(tf.constant(f.read()), shape).numpy()


def record_bytes(dataset_dir: str) -> dict[str, bytes]:
    import tensorflow as tf

    stored = {}
    for split in data.SPLITS:
        for record, _ in data.read_records(dataset_dir, split).as_numpy_iterator():
            features = tf.train.Example.FromString(record).features.feature
            stored[features["uri"].bytes_list.value[0].decode()] = features["image"].bytes_list.value[0]
    return stored


def test_photo_files_are_stored_as_their_bytes_and_read_with_the_one_resize_rule(tmp_path):
    """No second JPEG generation, no encoding time, shards the size of the sources: the record holds the file,
    and every reader decodes it to the dataset's size with data.decode_to_shape."""
    made = photo_tree(tmp_path / "photos", np.random.default_rng(1), "JPEG", size=320, target=224)  # resized
    made.update(photo_tree(tmp_path / "photos", np.random.default_rng(2), "PNG", per_class=1, size=224))
    out = str(tmp_path / "out")
    pp.preprocess(str(tmp_path / "photos"), out, image_size=224, channels=3, workers=1, min_shards=1)
    manifest = data.read_manifest(out)
    assert manifest["image_encoding"] == data.SOURCE
    stored = record_bytes(out)
    assert stored.keys() == made.keys()
    for uri, contents in stored.items():
        with open(uri, "rb") as f:
            assert contents == f.read()
    sources = manifest["source_files"]
    source_bytes = sum(os.path.getsize(uri) for uri in made)
    assert sources["count"] == sources["kept_bytes_as_is"] == len(made) and sources["reencoded"] == {}
    assert sources["source_bytes"] == source_bytes and sources["max_side"] == 4 * 224
    assert sources["smallest"] == [224, 224] and sources["largest"] == [320, 320]
    on_disk = sum(os.path.getsize(f) for s in data.SPLITS for f in data.split_files(out, s))
    assert on_disk <= 1.05 * source_bytes, f"shards {on_disk} bytes for {source_bytes} bytes of sources"
    for uri, image in stored_images(out).items():
        np.testing.assert_array_equal(image, source_pixels(uri, [224, 224, 3]))
        difference = np.abs(image.astype(int) - made[uri].astype(int))  # PIL's bilinear resize: close, not equal
        assert difference.mean() < 2.5, uri
        if uri.endswith(".png"):  # the dataset's size: exactly the file's pixels
            np.testing.assert_array_equal(image, made[uri])


def test_files_tensorflow_would_read_otherwise_are_reencoded_once_and_counted(tmp_path):
    """CMYK, palette, transparency, EXIF rotation, formats other than JPEG/PNG and sides above max_side are
    re-encoded (at most max_side, orientation applied, colour converted as decode_image does); the manifest
    counts why."""
    rng = np.random.default_rng(7)
    root = tmp_path / "photos" / "things"
    os.makedirs(root)
    rgb = Image.fromarray(photo(rng, 96))
    rgb.convert("CMYK").save(root / "cmyk.jpg", quality=92)
    exif = Image.Exif()
    exif[0x0112] = 6  # rotate 90 degrees clockwise to display
    Image.fromarray(photo(rng, 96)[:, :64]).save(root / "rotated.jpg", quality=92, exif=exif.tobytes())
    rgba = np.dstack([photo(rng, 96), np.full((96, 96), 128, np.uint8)])
    Image.fromarray(rgba).save(root / "alpha.png")
    Image.fromarray(photo(rng, 96)).save(root / "bitmap.bmp")
    Image.fromarray(photo(rng, 600)[:450]).save(root / "large.jpg", quality=92)
    Image.fromarray(photo(rng, 500)[:300]).save(root / "below_twice.jpg", quality=92)
    os.makedirs(tmp_path / "photos" / "others")
    Image.fromarray(photo(rng, 96)).save(tmp_path / "photos" / "others" / "kept.jpg", quality=92)
    out = str(tmp_path / "out")
    pp.preprocess(str(tmp_path / "photos"), out, image_size=64, channels=3, workers=1, min_shards=1,
                  validation_fraction=0.0, test_fraction=0.0)
    sources = data.read_manifest(out)["source_files"]
    assert sources["reencoded"] == {"other colour mode": 2, "EXIF orientation": 1, "other format": 1,
                                    "at least twice max_side": 1}, sources
    assert sources["kept_bytes_as_is"] == 2 and sources["largest"] == [450, 600] and sources["max_side"] == 256
    stored = record_bytes(out)
    for name in ("cmyk.jpg", "rotated.jpg", "alpha.png", "bitmap.bmp", "large.jpg"):
        with open(root / name, "rb") as f:
            assert stored[str(root / name)] != f.read(), name
    assert Image.open(__import__("io").BytesIO(stored[str(root / "large.jpg")])).size == (300, 225)  # DCT 1/2
    with open(root / "below_twice.jpg", "rb") as f:
        assert stored[str(root / "below_twice.jpg")] == f.read()
    assert Image.open(__import__("io").BytesIO(stored[str(root / "rotated.jpg")])).size == (96, 64)  # turned
    read = stored_images(out)
    for path in [root / name for name in ("cmyk.jpg", "rotated.jpg", "alpha.png", "bitmap.bmp", "large.jpg")] + [
            tmp_path / "photos" / "others" / "kept.jpg"]:
        with open(path, "rb") as f:
            reference = data.decode_image(f.read(), 64, 64, 3)
        assert np.abs(read[str(path)].astype(int) - reference.astype(int)).mean() < 4, path


@pytest.mark.parametrize("encoding", [data.PNG, data.JPEG, data.ENCODED])
def test_datasets_of_earlier_releases_still_read(tmp_path, encoding):
    """PNG/JPEG records at the dataset's size (and raw ones, below) as earlier releases wrote them."""
    images = [photo(np.random.default_rng(i), 64) for i in range(4)]
    writer = data.ShardWriter(str(tmp_path), "train", 1, encoding=data.PNG if encoding == data.ENCODED else encoding)
    for i, image in enumerate(images):
        writer.write(image, i % 2, f"image{i}")
    writer.close()
    data.write_json(str(tmp_path / data.MANIFEST), {"image_shape": [64, 64, 3], "image_encoding": encoding,
                                                     "splits": {"train": writer.summary()}})
    read, labels = data.load_split_arrays(str(tmp_path), "train")
    assert labels.tolist() == [0, 1, 0, 1]
    for image, expected in zip(read, images):
        difference = np.abs(image.astype(int) - expected.astype(int))
        assert (difference.max() == 0) if encoding != data.JPEG else difference.mean() < 5  # quality 95


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


# ---------------------------------------------------------------------------------------------- writing records


def test_records_are_the_bytes_tensorflow_serializes_deterministically():
    """records.encode_example against tf.train.Example's deterministic serialization (map entries sorted by key; the
    plain one's order changes from process to process), byte for byte, and parsed alike (by tf.train.Example, by
    records.parse_example's protobuf and by tf.io.parse_single_example): the sizes that change a varint's length (127/128, 16383/16384 bytes),
    empty and large images, labels up to 2**63 - 1 and negative ones, non-ASCII and long URIs."""
    import tensorflow as tf

    from components.dataio import records

    rng = np.random.default_rng(0)
    sizes = [0, 1, 100, 107, 108, 127, 128, 16_363, 16_364, 16_383, 16_384, 2_097_151, 2_097_152, 150_528]
    cases = [(rng.integers(0, 256, n, dtype=np.uint8).tobytes(), label, uri)
             for n in sizes
             for label, uri in ((0, "a.png"), (127, "gs://b/é/x.jpg"), (128, "x" * 120), (300, "y" * 16_400))]
    cases += [(b"\xff" * 10, label, "z.png") for label in (1, 2**31, 2**40, 2**63 - 1, -1, -(2**63))]
    cases += [(rng.integers(0, 256, int(n), dtype=np.uint8).tobytes(), int(label), f"c/{i}/{'é' * (i % 70)}.png")
              for i, (n, label) in enumerate(zip(rng.integers(0, 40_000, 200), rng.integers(0, 1000, 200)))]
    for image, label, uri in cases:
        example = tf.train.Example()
        feature = example.features.feature
        feature["uri"].bytes_list.value.append(uri.encode())
        feature["label"].int64_list.value.append(label)
        feature["image"].bytes_list.value.append(image)
        ours = records.encode_example(image, label, uri)
        assert ours == example.SerializeToString(deterministic=True), (len(image), label, len(uri))
        assert tf.train.Example.FromString(ours) == example
        assert data.encode_example(image, label, uri) == ours
        # read back by records' protobuf parse (no TensorFlow) as TensorFlow's graph parser reads it
        parsed = records.parse_example(ours)
        assert parsed == {"image": [image], "label": [label], "uri": [uri.encode()]}
        assert records.image_label(ours) == (image, label)
        if len(image) < 200_000 and len(uri) < 200:  # (the graph parser costs ms a call: a subset)
            graph = tf.io.parse_single_example(ours, {"image": tf.io.FixedLenFeature([], tf.string),
                                                      "label": tf.io.FixedLenFeature([], tf.int64),
                                                      "uri": tf.io.FixedLenFeature([], tf.string)})
            assert (graph["image"].numpy(), int(graph["label"]), graph["uri"].numpy()) == (
                parsed["image"][0], parsed["label"][0], parsed["uri"][0])
    raw = rng.integers(0, 256, (28, 28, 1), dtype=np.uint8)
    assert data.encode_example(raw, 3, "r.png") == data.encode_example(raw.tobytes(), 3, "r.png")
    for label in (np.int64(300), np.int32(5), np.uint8(7), np.int64(-3)):  # labels from arrays
        assert records.encode_example(b"ab", label, "u") == records.encode_example(b"ab", int(label), "u")
    # and in another process (upb's map order was not): the same inputs, the same shard bytes in any run
    import subprocess
    import sys

    script = ("import sys; from components.dataio import data; "
              "sys.stdout.buffer.write(data.encode_example(bytes(range(200)), 7, 'a/é.png'))")
    other = subprocess.run([sys.executable, "-c", script], capture_output=True, check=True,
                           env={**os.environ, "PYTHONPATH": os.getcwd()}).stdout
    assert other == data.encode_example(bytes(range(200)), 7, "a/é.png")
