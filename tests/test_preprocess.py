"""Preprocess on real images: Fashion-MNIST idx files and PNG trees, plus a generated corpus of every kind of bad
file mixed with good ones (all good images must arrive, every bad one must be listed with its reason)."""

import collections
import io
import json
import os
import re
import shutil

import numpy as np
import pytest
from PIL import Image

from components.dataio import data
from components import preprocess as pp
from components.preprocess import bookkeeping, decoding, per_image, sources
from tests.test_data import encoded, png_header_only


def read_back(dataset_dir: str) -> dict[str, list[tuple[str, int, bytes]]]:
    """(uri, label, image bytes) of every stored record, per split."""
    out = {}
    for split in data.SPLITS:
        try:
            ds = data.read_split(dataset_dir, split, with_uri=True)
        except data.DataError:
            out[split] = []
            continue
        out[split] = [(u.decode(), int(lab), img.tobytes()) for img, lab, u in ds.as_numpy_iterator()]
    return out


def rejected_rows(dataset_dir: str) -> dict[str, dict]:
    return {row["uri"]: row for row in data.iter_jsonl(os.path.join(dataset_dir, data.REJECTED))}


def write(path, payload: bytes) -> str:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(payload)
    return str(path)


def odd_but_good(root, fashion_images) -> dict[str, str]:
    """Images in unusual but supported encodings, each a different real image: path -> class."""
    pick = iter(fashion_images[1000:1100])
    files = {}

    def add(cls, name, payload):
        files[write(os.path.join(root, cls, name), payload)] = cls

    add("Bag", "cmyk.jpg", encoded(np.stack([next(pick)] * 3, -1), "JPEG", mode="CMYK", quality=95))
    add("Bag", "sixteen.png", encoded(next(pick).astype(np.uint16) * 257, "PNG"))
    palette = Image.fromarray(next(pick)).convert("P")
    buffer = io.BytesIO()
    palette.save(buffer, "PNG", transparency=0)
    add("Bag", "palette_transparent.png", buffer.getvalue())
    add("Sandal", "rgba.png", encoded(np.dstack([np.stack([next(pick)] * 3, -1), np.full((28, 28), 200, np.uint8)]),
                                      "PNG"))
    add("Sandal", "anim.gif", encoded(next(pick), "GIF"))
    add("Sandal", "old.bmp", encoded(next(pick), "BMP"))
    add("Sneaker", "photo.webp", encoded(next(pick), "WEBP", lossless=True))
    add("Sneaker", "scan.tiff", encoded(next(pick), "TIFF"))
    add("Sneaker", "big.jpeg", encoded(np.kron(next(pick), np.ones((20, 20), np.uint8)), "JPEG"))  # 560x560
    return files


def bad_files(root) -> dict[str, str]:
    """One file of every unusable kind: path -> the reason preprocess must give."""
    rng = np.random.default_rng(7)
    noise = rng.integers(0, 255, (64, 64, 3), dtype=np.uint8)
    files = {
        write(os.path.join(root, "Bag", "zero.png"), b""): data.EMPTY_FILE,
        write(os.path.join(root, "Bag", "half.png"), encoded(noise, "PNG")[:3000]): data.CORRUPT,
        write(os.path.join(root, "Sandal", "half.jpg"), encoded(noise, "JPEG")[:1500]): data.CORRUPT,
        write(os.path.join(root, "Sandal", "random.png"), rng.bytes(3000)): data.NOT_AN_IMAGE,
        write(os.path.join(root, "Sandal", "notes.txt"), b"shot on a phone\n"): data.NOT_AN_IMAGE,
        write(os.path.join(root, "Sneaker", "text.jpg"), b"<html>404 not found</html>"): data.NOT_AN_IMAGE,
        write(os.path.join(root, "Sneaker", "lab.tif"), encoded(noise, "TIFF", mode="LAB")): data.UNSUPPORTED_MODE,
        write(os.path.join(root, "Sneaker", "float.tif"), encoded(noise[..., 0].astype(np.float32), "TIFF")):
            data.UNSUPPORTED_MODE,
        write(os.path.join(root, "Sneaker", "pixmap.png"), encoded(noise, "PPM")): data.UNSUPPORTED_FORMAT,
        write(os.path.join(root, "Sneaker", "IMG_0001.HEIC"), b"\0\0\0\x18ftypheic"): data.UNSUPPORTED_FORMAT,
        write(os.path.join(root, "Bag", "bomb.png"), png_header_only(12_000, 12_000)): data.TOO_LARGE,
        write(os.path.join(root, "README.md"), b"class folders below"): pp.OUTSIDE_CLASSES,
    }
    dangling = os.path.join(root, "Bag", "moved.png")
    os.symlink(os.path.join(root, "nowhere", "moved.png"), dangling)
    files[dangling] = data.UNREADABLE
    return files


@pytest.fixture
def mixed_corpus(image_folder, fashion_arrays):
    root = image_folder(per_class=20)
    good = {os.path.join(root, cls, name): cls
            for cls in os.listdir(root) for name in os.listdir(os.path.join(root, cls))}
    good.update(odd_but_good(root, fashion_arrays[0]))
    return root, good, bad_files(root)


def test_bad_files_are_reported_and_every_good_image_arrives(mixed_corpus, tmp_path):
    root, good, bad = mixed_corpus
    out = str(tmp_path / "out")
    assert decoding.decode_plan(root, 2) == {"workers": 1, "use_processes": False}  # a small run: one worker
    result = pp.preprocess(root, out, workers=2, min_shards=1)
    stored = read_back(out)
    arrived = {uri: label for split in stored.values() for uri, label, _ in split}
    names = result.class_names
    assert names == ["Bag", "Sandal", "Sneaker"]
    assert arrived == {uri: names.index(cls) for uri, cls in good.items()}
    rejected = rejected_rows(out)
    assert {uri: row["reason"] for uri, row in rejected.items()} == bad
    assert all(row["detail"] for row in rejected.values())
    assert result.rejected_by_reason == dict(collections.Counter(bad.values()))
    assert result.rejected == len(bad) and sum(result.counts.values()) == len(good)
    manifest = data.read_manifest(out)
    assert manifest["rejected_by_reason"] == result.rejected_by_reason
    for uri, _, image in stored["train"][:5]:
        assert len(image) == 28 * 28  # every stored image is the target size and channels


@pytest.mark.parametrize("size, channels", [(28, 1), (64, 3)])
def test_every_decode_plan_gives_the_same_examples(mixed_corpus, size, channels):
    """One worker, threads, processes and TensorFlow batches (PNGs and JPEGs of the target size decoded by
    TensorFlow, the rest by PIL) give the same pixels, keys (near-duplicate keys too), records and rejections, in
    the same order."""
    root, _, _ = mixed_corpus
    exact = os.path.join(root, "Bag")  # PNGs and a JPEG that need no conversion: TensorFlow's share
    image = np.random.default_rng(5).integers(0, 255, (size, size, channels), dtype=np.uint8)
    write(os.path.join(exact, "exact.png"), encoded(image[..., 0] if channels == 1 else image, "PNG"))
    write(os.path.join(exact, "exact.jpg"), encoded(image[..., 0] if channels == 1 else image, "JPEG"))
    src = sources.folder_source(root, size, channels, None, 1, None)
    shape = dict(height=size, width=size, channels=channels, check_extension=True)
    plans = decoding.candidate_plans(root, 2)
    assert {"workers": 2, "use_processes": False, "use_tensorflow": True} in plans and len(plans) == 4
    decoder = decoding.TensorFlowDecoder(size, size, channels)
    routed = [i for i in src.items() if not i.problem and decoder.route(open(i.uri, "rb").read() if os.path.isfile(
        i.uri) else b"")]
    assert len(routed) >= (2 if channels == 3 else 60)  # TensorFlow really decodes some of them
    results = []
    for plan in plans:
        examples = list(decoding.parallel_decode(src.items, **shape, **plan))
        results.append([(e.uri, e.key, e.reason, e.detail, e.encoding, e.stored,
                         None if e.image is None else e.image.tobytes(),
                         None if e.histogram is None else e.histogram.tobytes(),
                         # the near-duplicate key, taken at decoding or from the pixels, whichever decoder ran
                         e.near_key if e.near_key is not None or e.image is None else data.near_key(e.image))
                        for e in examples])
    for other in results[1:]:
        assert other == results[0]


@pytest.mark.parametrize("channels, form", [(1, "PNG"), (3, "PNG"), (3, "JPEG")])
def test_tensorflows_unrolled_decoders_give_pils_pixels(channels, form):
    """TensorFlow's batches decode exact files EXACT_CHUNK, then EXACT_REST, at a time, the last call padded: each
    file's pixels are PIL's, in order, whatever the count; a corrupt file fails its call (decode_examples then
    decodes that call's files with PIL, which gives the reason)."""
    import tensorflow as tf

    rng = np.random.default_rng(channels)
    shape = (28, 28, channels)
    arrays = rng.integers(0, 256, (decoding.EXACT_CHUNK + decoding.EXACT_REST + 5, *shape), dtype=np.uint8)
    files = [encoded(a[..., 0] if channels == 1 else a, form) for a in arrays]
    assert all(per_image.exact_format(f, *shape) == form for f in files)
    for count in (1, decoding.EXACT_REST, decoding.EXACT_CHUNK + 1, len(files)):
        decoded = decoding._decode_exact(form, shape, files[:count])
        assert decoded.shape == (count, *shape)
        assert all(np.array_equal(image, data.decode_image(f, *shape)) for image, f in zip(decoded, files))
    with pytest.raises(tf.errors.OpError):
        decoding._decode_exact(form, shape, files[:3] + [files[3][:len(files[3]) // 2]])


@pytest.mark.parametrize("mode,size", [("RGB", (39, 22)), ("RGB", (500, 375)), ("L", (7, 300)), ("RGB", (224, 224)),
                                       ("L", (1, 1))])
def test_the_sampled_histogram_counts_the_nearest_resize_without_making_it(mode, size):
    """Source records' pixel statistics: the histogram of the image resized with PIL's nearest pixels, counted by
    weights on the decoded pixels, is exactly PIL's histogram of that resized image."""
    from PIL import Image

    from components.dataio import images

    channels = 3 if mode == "RGB" else 1
    pixels = np.random.default_rng(sum(size)).integers(0, 256, (size[1], size[0], channels), dtype=np.uint8)
    img = Image.fromarray(pixels[..., 0] if channels == 1 else pixels, mode)
    for target in ((224, 224), (64, 48), (size[0], size[1])):
        expected = img.resize(target, Image.Resampling.NEAREST).histogram()
        assert images.sampled_histogram(img, target[1], target[0], channels).tolist() == expected


def test_processes_and_one_worker_give_the_same_dataset(mixed_corpus, tmp_path, monkeypatch):
    root, _, _ = mixed_corpus
    monkeypatch.setattr(decoding, "MEASURE_MIN_INPUTS", 10)  # measure even this small tree
    one = pp.preprocess(root, str(tmp_path / "one"), workers=1, min_shards=1)
    many = pp.preprocess(root, str(tmp_path / "many"), workers=3, min_shards=1)
    assert one.counts == many.counts and one.rejected_by_reason == many.rejected_by_reason
    assert read_back(str(tmp_path / "one")) == read_back(str(tmp_path / "many"))


def test_rgb_target(image_folder, tmp_path):
    result = pp.preprocess(image_folder(per_class=10), str(tmp_path / "out"), channels=3, image_size=32, workers=1)
    assert result.image_shape == [32, 32, 3]
    image, _ = next(data.read_split(str(tmp_path / "out"), "train").as_numpy_iterator())
    assert image.shape == (32, 32, 3)
    assert len(data.read_manifest(str(tmp_path / "out"))["pixel_stats"]["mean"]) == 3


# ---------------------------------------------------------------------------------------------- fatal cases


def test_class_folder_left_empty_after_rejection_is_fatal_and_named(image_folder, tmp_path):
    root = image_folder(per_class=5)
    write(os.path.join(root, "Coat", "zero.png"), b"")
    write(os.path.join(root, "Coat", "junk.png"), b"not a png at all")
    with pytest.raises(data.DataError) as caught:
        pp.preprocess(root, str(tmp_path / "out"), workers=1)
    message = str(caught.value)
    assert "'Coat'" in message and os.path.join(root, "Coat") in message
    assert "all 2 inputs rejected" in message and "1 empty file" in message and "1 not an image" in message
    assert "class(es) left with no usable images" in message
    assert len(rejected_rows(str(tmp_path / "out"))) == 2  # the report is written before failing


def test_no_usable_images_at_all_is_fatal(tmp_path):
    for cls in ("a", "b"):
        write(tmp_path / "src" / cls / "zero.png", b"")
    with pytest.raises(data.DataError, match=r"No usable images in .*all 2 inputs were rejected \(2 empty file\)"):
        pp.preprocess(str(tmp_path / "src"), str(tmp_path / "out"), workers=1)


def test_fewer_than_two_classes_is_fatal(image_folder, tmp_path):
    root = image_folder(per_class=5, classes=("Bag",))
    with pytest.raises(data.DataError, match=r"Need at least 2 classes.*found 1 .*'Bag'"):
        pp.preprocess(root, str(tmp_path / "out"))


def test_allowed_classes(image_folder, tmp_path):
    root = image_folder(per_class=5)
    with pytest.raises(data.DataError, match=r"class\(es\) 'Sneaker' that are not in the allowed classes"):
        pp.preprocess(root, str(tmp_path / "a"), classes="Bag,Sandal", workers=1)
    with pytest.raises(data.DataError, match=r"'Coat' from the allowed classes are not in"):
        pp.preprocess(root, str(tmp_path / "b"), classes="Bag,Sandal,Sneaker,Coat", workers=1)
    with pytest.raises(data.DataError, match="more than once"):
        pp.preprocess(root, str(tmp_path / "c"), classes="Bag,Bag", workers=1)
    result = pp.preprocess(root, str(tmp_path / "d"), classes="Sneaker, Bag,Sandal", workers=1)
    assert result.class_names == ["Sneaker", "Bag", "Sandal"]  # the allow-list's order is the label order
    labels = {uri.split(os.sep)[-2]: label for split in read_back(str(tmp_path / "d")).values()
              for uri, label, _ in split}
    assert labels == {"Sneaker": 0, "Bag": 1, "Sandal": 2}


def test_missing_source_empty_folder_and_empty_class_folder(tmp_path):
    with pytest.raises(data.DataError, match="Source not found: .*nope"):
        pp.preprocess(str(tmp_path / "nope"), str(tmp_path / "out"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(data.DataError, match="No class folders found under .*it is empty"):
        pp.preprocess(str(tmp_path / "empty"), str(tmp_path / "out"))
    write(tmp_path / "flat" / "a.png", encoded(np.zeros((4, 4), np.uint8), "PNG"))
    with pytest.raises(data.DataError, match="holds 1 file\\(s\\) but no subfolders"):
        pp.preprocess(str(tmp_path / "flat"), str(tmp_path / "out"))
    write(tmp_path / "tree" / "a" / "x.png", encoded(np.zeros((4, 4), np.uint8), "PNG"))
    (tmp_path / "tree" / "b").mkdir()
    with pytest.raises(data.DataError, match=r"Class folder\(s\) with no files under .*: b\."):
        pp.preprocess(str(tmp_path / "tree"), str(tmp_path / "out"))


def test_idx_counts_that_disagree(tmp_path, fashion_dir):
    for name in ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz"):
        shutil.copy(os.path.join(fashion_dir, name), tmp_path / name)
    from tests.test_data import write_idx

    write_idx(tmp_path / "train-labels-idx1-ubyte.gz", np.zeros(59_999))
    with pytest.raises(data.DataError, match="idx counts disagree: .* 60000 images but .* 59999 labels"):
        pp.preprocess(str(tmp_path), str(tmp_path / "out"))


def test_bad_arguments():
    with pytest.raises(ValueError, match="sum to less than 1"):
        pp.preprocess("x", "y", validation_fraction=0.6, test_fraction=0.5)
    with pytest.raises(ValueError, match="channels"):
        pp.preprocess("x", "y", channels=2)


def test_cli_reports_errors_without_traceback(tmp_path, capsys):
    assert pp.main(["--source", str(tmp_path / "missing"), "--output-dir", str(tmp_path / "out")]) == 2
    assert "error: Source not found" in capsys.readouterr().err


# ---------------------------------------------------------------------------------------------- splits


def test_same_input_same_split_in_any_order(fashion_arrays, tmp_path, monkeypatch):
    images, labels = fashion_arrays
    # The same 300 images under two trees with different file names, so a different listing order.
    for tree, order in (("one", range(300)), ("two", reversed(range(300)))):
        for rank, i in enumerate(order):
            write(tmp_path / tree / f"c{labels[i] % 3}" / f"{rank:04d}.png", encoded(images[i], "PNG"))
    split_of = {}
    for tree in ("one", "two"):
        pp.preprocess(str(tmp_path / tree), str(tmp_path / f"out-{tree}"), workers=1)
        split_of[tree] = {img: split for split, rows in read_back(str(tmp_path / f"out-{tree}")).items()
                          for _, _, img in rows}
    assert split_of["one"] == split_of["two"]
    counts = collections.Counter(split_of["one"].values())
    assert counts["train"] > counts["validation"] > 0 and counts["test"] > 0
    # and a second run over the same tree writes byte-identical shards, its kept images spooled to disk this time
    from components.preprocess import step

    monkeypatch.setattr(step, "SPOOL_MEMORY_BYTES", 0)
    pp.preprocess(str(tmp_path / "one"), str(tmp_path / "again"), workers=1)
    for split in data.SPLITS:
        first = data.split_files(str(tmp_path / "out-one"), split)
        second = data.split_files(str(tmp_path / "again"), split)
        assert len(first) == len(second)
        for a, b in zip(first, second):
            assert open(a, "rb").read() == open(b, "rb").read()


def test_the_spool_keeps_its_first_batches_in_memory_and_the_rest_on_disk_in_order(tmp_path):
    from components.preprocess.step import _Spool

    spool = _Spool(str(tmp_path / "kept.pickle"), memory_bytes=10)
    batches = [[(i, b"x" * 4)] for i in range(5)]
    for batch in batches:
        spool.add(batch, 4)
    spool.close()
    assert len(spool.in_memory) == 2 and (tmp_path / "kept.pickle").exists()  # 4 + 4 bytes fit, 12 do not
    assert list(spool) == batches


def test_idx_source_keeps_its_test_split_and_drops_leaked_copies(tmp_path, fashion_dir):
    from tests.test_data import write_idx

    train = data.read_idx(os.path.join(fashion_dir, "train-images-idx3-ubyte.gz"))[:200].copy()
    train_labels = data.read_idx(os.path.join(fashion_dir, "train-labels-idx1-ubyte.gz"))[:200]
    test = data.read_idx(os.path.join(fashion_dir, "t10k-images-idx3-ubyte.gz"))[:100]
    test_labels = data.read_idx(os.path.join(fashion_dir, "t10k-labels-idx1-ubyte.gz"))[:100]
    train[10], train[20], train[30] = test[0], test[1], train[5]  # two leaks, one duplicate within train
    train_labels = train_labels.copy()
    train_labels[10], train_labels[20], train_labels[30] = test_labels[0], (test_labels[1] + 1) % 10, train_labels[5]
    for name, array in (("train-images-idx3-ubyte.gz", train), ("train-labels-idx1-ubyte.gz", train_labels),
                        ("t10k-images-idx3-ubyte.gz", test), ("t10k-labels-idx1-ubyte.gz", test_labels)):
        (tmp_path / "fashion").mkdir(exist_ok=True)
        write_idx(tmp_path / "fashion" / name, array)
    result = pp.preprocess(str(tmp_path / "fashion"), str(tmp_path / "out"))
    assert result.counts["test"] == 100 and result.counts["train"] + result.counts["validation"] == 197
    assert result.rejected_by_reason == {pp.DUPLICATE: 2, pp.CONFLICTING_LABEL: 1}
    rejected = rejected_rows(str(tmp_path / "out"))
    assert "test split" in rejected["train-images-idx3-ubyte.gz#10"]["detail"]
    assert "kept as" in rejected["train-images-idx3-ubyte.gz#20"]["detail"]
    assert set(rejected) == {f"train-images-idx3-ubyte.gz#{i}" for i in (10, 20, 30)}
    assert result.class_names == data.FASHION_MNIST_CLASSES  # the directory name says fashion


def test_identical_files_in_two_classes_are_reported(image_folder, tmp_path):
    root = image_folder(per_class=5)
    first = sorted(os.listdir(os.path.join(root, "Bag")))[0]
    shutil.copy(os.path.join(root, "Bag", first), os.path.join(root, "Sandal", "copy-of-bag.png"))
    shutil.copy(os.path.join(root, "Bag", first), os.path.join(root, "Bag", "zz-same.png"))
    result = pp.preprocess(root, str(tmp_path / "out"), workers=1)
    rejected = rejected_rows(str(tmp_path / "out"))
    assert rejected[os.path.join(root, "Sandal", "copy-of-bag.png")]["reason"] == pp.CONFLICTING_LABEL
    assert "'Bag'" in rejected[os.path.join(root, "Sandal", "copy-of-bag.png")]["detail"]
    assert rejected[os.path.join(root, "Bag", "zz-same.png")]["reason"] == pp.DUPLICATE
    assert sum(result.counts.values()) == 15


def test_limit_and_shards_for_readers(fashion_dir, tmp_path):
    result = pp.preprocess(fashion_dir, str(tmp_path / "out"), limit=500, min_shards=4)
    manifest = data.read_manifest(str(tmp_path / "out"))
    assert result.counts["test"] == 500 and result.counts["train"] + result.counts["validation"] <= 500
    for split in data.SPLITS:
        files = data.split_files(str(tmp_path / "out"), split)
        assert len(files) == manifest["splits"][split]["num_shards"] == 4
        assert all(f"-of-00004.tfrecord" in f for f in files)


def test_limit_is_per_class_folder_for_a_folder_source(image_folder, tmp_path):
    """`limit` as its help says it (components/params.py): a folder source keeps the first `limit` files of each
    class folder, so every class is there."""
    result = pp.preprocess(image_folder(per_class=10), str(tmp_path / "out"), limit=4, workers=1)
    kept = collections.Counter(label for split in read_back(str(tmp_path / "out")).values() for _, label, _ in split)
    assert result.class_names == ["Bag", "Sandal", "Sneaker"] and sum(result.counts.values()) == 12
    assert kept == {0: 4, 1: 4, 2: 4}


# ---------------------------------------------------------------------------------------------- manifests


@pytest.fixture
def manifest_images(fashion_arrays, tmp_path):
    """12 real PNGs under tmp/imgs (4 per class) and their labels."""
    images, labels = fashion_arrays
    names = {0: "top", 1: "trouser", 8: "bag"}
    rows = []
    for label, name in names.items():
        for i in np.flatnonzero(labels == label)[:4]:
            write(tmp_path / "imgs" / f"{i:05d}.png", encoded(images[i], "PNG"))
            rows.append((f"imgs/{i:05d}.png", name))
    return rows


def test_csv_manifest_with_header_relative_paths_and_bad_rows(manifest_images, tmp_path):
    lines = ["image_path,label"] + [f"{u},{c}" for u, c in manifest_images]
    lines += ["imgs/missing.png,bag", ",bag", "imgs/00001.png,", str(tmp_path / "imgs") + ",top"]
    (tmp_path / "labels.csv").write_text("\n".join(lines) + "\n")
    result = pp.preprocess(str(tmp_path / "labels.csv"), str(tmp_path / "out"), workers=1)
    assert result.class_names == ["bag", "top", "trouser"]
    assert sum(result.counts.values()) == 12
    rejected = rejected_rows(str(tmp_path / "out"))
    assert rejected[str(tmp_path / "imgs" / "missing.png")]["reason"] == data.UNREADABLE
    assert rejected[str(tmp_path / "imgs")]["detail"] == "is a directory"
    assert rejected[f"{tmp_path / 'labels.csv'}:15"] == {"uri": f"{tmp_path / 'labels.csv'}:15", "reason": pp.BAD_ROW,
                                                         "detail": "no uri"}
    assert rejected[f"{tmp_path / 'labels.csv'}:16"]["detail"] == "no label"


def test_limit_takes_the_first_rows_of_a_manifest(manifest_images, tmp_path):
    (tmp_path / "labels.csv").write_text("\n".join(f"{u},{c}" for u, c in manifest_images) + "\n")
    result = pp.preprocess(str(tmp_path / "labels.csv"), str(tmp_path / "out"), limit=5, workers=1)
    assert sum(result.counts.values()) == 5
    assert result.class_names == sorted({c for _, c in manifest_images[:5]})


def test_vertex_csv_keeps_its_test_rows_as_test(manifest_images, tmp_path):
    lines = [f"{'test' if i % 3 == 0 else 'training'},{tmp_path / u},{c}" for i, (u, c) in enumerate(manifest_images)]
    (tmp_path / "import.csv").write_text("\n".join(lines) + "\n")
    result = pp.preprocess(str(tmp_path / "import.csv"), str(tmp_path / "out"), workers=1)
    assert result.counts["test"] == 4 and result.counts["train"] + result.counts["validation"] == 8
    stored = read_back(str(tmp_path / "out"))
    assert {os.path.basename(u) for u, _, _ in stored["test"]} == {
        os.path.basename(u) for i, (u, _) in enumerate(manifest_images) if i % 3 == 0}


def test_jsonl_manifest_plain_and_vertex_rows(manifest_images, tmp_path):
    rows = []
    for i, (uri, cls) in enumerate(manifest_images):
        if i % 2:
            rows.append({"uri": uri, "label": cls})
        else:
            rows.append({"imageGcsUri": str(tmp_path / uri), "classificationAnnotation": {"displayName": cls},
                         "dataItemResourceLabels": {sources.VERTEX_ML_USE: "training"}})
    text = "\n".join(json.dumps(r) for r in rows) + "\n[1, 2]\n{broken\n"
    (tmp_path / "export.jsonl").write_text(text)
    result = pp.preprocess(str(tmp_path / "export.jsonl"), str(tmp_path / "out"), classes="top,trouser,bag",
                           workers=1)
    assert result.class_names == ["top", "trouser", "bag"] and sum(result.counts.values()) == 12
    assert result.rejected_by_reason == {pp.BAD_ROW: 2}


def test_manifest_label_not_a_known_class_is_fatal(manifest_images, tmp_path):
    lines = ["uri,class"] + [f"{u},{c}" for u, c in manifest_images] + ["imgs/x.png,Bags"]
    (tmp_path / "labels.csv").write_text("\n".join(lines) + "\n")
    with pytest.raises(data.DataError,
                       match=r"not known classes: 'Bags' \(line 14\)\. Known classes: top, trouser, bag"):
        pp.preprocess(str(tmp_path / "labels.csv"), str(tmp_path / "out"), classes="top,trouser,bag")
    (tmp_path / "odd.csv").write_text("a,b,c,d\n")
    with pytest.raises(data.DataError, match="Cannot tell the columns"):
        pp.preprocess(str(tmp_path / "odd.csv"), str(tmp_path / "out"))


def test_manifest_class_left_empty_is_fatal(manifest_images, tmp_path):
    write(tmp_path / "imgs" / "broken.png", b"\x89PNG\r\n\x1a\n garbage")
    lines = [f"{u},{c}" for u, c in manifest_images] + ["imgs/broken.png,shoe", "imgs/zero.png,shoe"]
    (tmp_path / "labels.csv").write_text("\n".join(lines) + "\n")
    with pytest.raises(data.DataError, match=r"'shoe' \(label 'shoe' in .*labels.csv\): all 2 inputs rejected"):
        pp.preprocess(str(tmp_path / "labels.csv"), str(tmp_path / "out"), workers=1)


# ---------------------------------------------------------------------------------------------- tfds


def test_tfds_source_with_mock_data(tmp_path):
    import tensorflow_datasets as tfds

    with tfds.testing.mock_data(num_examples=60):
        result = pp.preprocess("tfds:mnist:train", str(tmp_path / "out"), min_shards=1)
    assert result.class_names == [str(i) for i in range(10)]
    assert sum(result.counts.values()) + result.rejected == 60
    assert all(r == pp.DUPLICATE for r in result.rejected_by_reason)  # random images can repeat, nothing else
    uris = {u for rows in read_back(str(tmp_path / "out")).values() for u, _, _ in rows}
    assert all(u.startswith("tfds:mnist:train#") for u in uris)


def test_tfds_source_keeps_test_and_drops_leaked_train_copies(tmp_path, fashion_arrays):
    import tensorflow as tf
    import tensorflow_datasets as tfds

    images, labels = fashion_arrays
    test_images, test_labels = images[:40], labels[:40]
    train_images = np.concatenate([images[40:140], test_images[:5]])  # 5 test images leak into train
    train_labels = np.concatenate([labels[40:140], test_labels[:5]])

    def as_dataset(self, split, **kwargs):
        chosen = (test_images, test_labels) if split == "test" else (train_images, train_labels)
        return tf.data.Dataset.from_tensor_slices({"image": chosen[0][..., None], "label": chosen[1].astype(np.int64)})

    with tfds.testing.mock_data(as_dataset_fn=as_dataset):
        result = pp.preprocess("tfds:fashion_mnist", str(tmp_path / "out"), min_shards=1)
    assert result.class_names[0] == "T-shirt/top"
    assert result.counts["test"] == 40 and result.counts["train"] + result.counts["validation"] == 100
    assert result.rejected_by_reason == {pp.DUPLICATE: 5}


def test_tfds_bad_spec():
    with pytest.raises(data.DataError, match="use tfds:NAME"):
        pp.preprocess("tfds:", "/tmp/unused")


# ---------------------------------------------------------------------------------------------- card & helpers


def test_dataset_card_has_counts_stats_rejections_and_samples(mixed_corpus, tmp_path):
    root, _, bad = mixed_corpus
    out = str(tmp_path / "out")
    pp.preprocess(root, out, workers=1)
    manifest = data.read_manifest(out)
    stats = manifest["pixel_stats"]
    train = np.stack([np.frombuffer(img, np.uint8) for _, _, img in read_back(out)["train"]]).astype(np.float64)
    assert stats["mean"][0] == pytest.approx(train.mean(), abs=1e-3)
    assert stats["std"][0] == pytest.approx(train.std(), abs=1e-3)
    card = pp.dataset_card(out)
    assert card.startswith("<!doctype html>") and card.count("data:image/png;base64,") == 3
    for text in ("Bag", "Sandal", "Sneaker", f"Rejected inputs: {len(bad)}", data.CORRUPT, "moved.png",
                 f"{stats['mean'][0]:.2f}", f"{stats['std'][0]:.2f}"):
        assert text in card
    grid = Image.open(os.path.join(out, pp.SAMPLES_FILE))
    assert grid.size == (8 * 29 - 1, 3 * 29 - 1)


def test_content_index_finds_every_key_and_stays_compact():
    index = bookkeeping.ContentIndex(flush_size=1000)
    rng = np.random.default_rng(0)
    keys = [int(k) for k in rng.integers(0, 2**63, 25_000, dtype=np.int64)] + [2**64 - 1]
    for i, key in enumerate(keys):
        assert index.get(key) is None
        index.add(key, i % 1000)
    assert len(index) == len(keys)
    assert all(index.get(key) == i % 1000 for i, key in enumerate(keys))
    assert index.get(12345) is None
    assert index.nbytes <= 12 * len(keys)
    assert len(index._runs) <= 5  # merged: logarithmic in the number of flushes


def test_progress_logs_rate_and_time_left(caplog):
    now = [0.0]
    progress = bookkeeping.Progress(1000, "preprocess", every=10, clock=lambda: now[0])
    with caplog.at_level("INFO", logger="components.preprocess"):
        now[0] = 5
        progress.update(100)
        now[0] = 20
        progress.update(400)
    assert [r.getMessage() for r in caplog.records] == ["preprocess: 400/1000 (40%), 20/s, about 00:00:30 left"]


def test_available_cpus_and_decode_plan(tmp_path):
    assert 1 <= decoding.available_cpus() <= (os.cpu_count() or 1)
    mine = len(os.sched_getaffinity(0))
    limits = tmp_path / "cpu.max"
    for quota, cpus in (("max 100000", mine), ("150000 100000", min(mine, 2)), ("50000 100000", 1),
                        ("6400000 100000", mine)):  # a pod's limit of 1.5, 0.5 and 64 CPUs
        limits.write_text(quota + "\n")
        assert decoding.available_cpus(str(limits)) == cpus, quota
    assert decoding.available_cpus(str(tmp_path / "none")) == mine  # no cgroup v2 file: the affinity mask
    assert decoding.decode_plan("gs://bucket/images", 2) == {"workers": 8, "use_processes": False}
    assert decoding.decode_plan("/data/images", 1) == {"workers": 1, "use_processes": False}
    assert decoding.decode_plan("/data/images", 16) == {"workers": 1, "use_processes": False}  # nothing measured


def test_decode_plan_is_measured_on_the_files(image_folder, caplog, monkeypatch):
    root = image_folder(per_class=120)
    src = sources.folder_source(root, 28, 1, None, 2, None)
    monkeypatch.setattr(decoding, "MEASURE_MIN_INPUTS", 100)
    caplog.set_level("INFO")
    plan = decoding.decode_plan(root, 2, src.items, expected=1_000_000)
    assert plan in decoding.candidate_plans(root, 2)
    line = next(r.getMessage() for r in caplog.records if "decoding with" in r.getMessage())
    for label in ("one worker", "2 processes", "TensorFlow batches x2"):
        assert re.search(label + r" [\d,]+/s", line), line
    # raw records of files TensorFlow decodes: plain threads, the same threads less its C++ decode, are not measured
    assert "2 threads" not in line, line
    caplog.clear()
    # as RGB the grayscale PNGs need PIL's conversion: TensorFlow has nothing to decode, threads are measured
    plan = decoding.decode_plan(root, 2, src.items, expected=1_000_000, channels=3)
    line = next(r.getMessage() for r in caplog.records if "decoding with" in r.getMessage())
    for label in ("one worker", "2 threads", "2 processes"):
        assert re.search(label + r" [\d,]+/s", line), line
    assert "TensorFlow" not in line, line



@pytest.mark.parametrize("chunk", [16, 128])
def test_the_measured_plans_decodes_are_the_runs_own(image_folder, monkeypatch, chunk):
    """Each candidate plan is measured on the next chunk of inputs, which is yielded (nothing decoded twice): the
    planned stream is every input once, in order, as one worker decodes it, whether the probe ends before the
    inputs (small chunks: the run goes on, with re-checks) or the inputs end during the probe."""
    root = image_folder(per_class=120)
    src = sources.folder_source(root, 28, 1, None, 2, None)
    monkeypatch.setattr(decoding, "MEASURE_MIN_INPUTS", 100)
    monkeypatch.setattr(decoding, "FIRST_CHUNK", chunk)
    monkeypatch.setattr(decoding, "MIN_CHUNK", chunk)
    monkeypatch.setattr(decoding, "CHUNK_SECONDS", 0.001)
    shape = dict(height=28, width=28, channels=1, check_extension=True)
    planned = list(decoding.planned_decode(src.items, source=root, cpus=2, expected=1_000_000, **shape))
    alone = list(decoding.parallel_decode(src.items, **shape, workers=1, use_processes=False))
    assert len(planned) == len(alone) == 360
    assert [(e.uri, e.key, e.image.tobytes()) for e in planned] == [(e.uri, e.key, e.image.tobytes()) for e in alone]


# ---------------------------------------------------------------------------------------------- remote paths


def copy_to_filesystem(local_root: str, remote_root: str) -> None:
    """Copies a local tree to another tf.io.gfile filesystem (ram:// here; gs:// in production)."""
    import tensorflow as tf

    for directory, _, files in os.walk(local_root):
        target = remote_root + directory[len(local_root):]
        tf.io.gfile.makedirs(target)
        for name in files:
            tf.io.gfile.copy(os.path.join(directory, name), f"{target}/{name}", overwrite=True)


def test_remote_folder_and_output_through_gfile(image_folder, tmp_path):
    """The gs:// code path (gfile listing and reads, threaded decoding, shards written remotely), on TensorFlow's
    in-memory filesystem, which goes through the same tf.io.gfile calls."""
    root = image_folder(per_class=6)
    write(os.path.join(root, "Bag", "zero.png"), b"")
    remote = f"ram://{tmp_path.name}/images"
    copy_to_filesystem(root, remote)
    out = f"ram://{tmp_path.name}/out"
    result = pp.preprocess(remote, out, workers=2, min_shards=1)
    assert sum(result.counts.values()) == 18 and result.rejected_by_reason == {data.EMPTY_FILE: 1}
    stored = read_back(out)
    assert all(uri.startswith(remote + "/") for rows in stored.values() for uri, _, _ in rows)
    assert rejected_rows(out) == {f"{remote}/Bag/zero.png": {"uri": f"{remote}/Bag/zero.png",
                                                             "reason": data.EMPTY_FILE, "detail": "0 bytes"}}
    assert "<table>" in pp.dataset_card(out)


def test_remote_manifest_with_relative_paths(manifest_images, tmp_path):
    remote = f"ram://{tmp_path.name}"
    copy_to_filesystem(str(tmp_path / "imgs"), f"{remote}/imgs")
    import tensorflow as tf

    with tf.io.gfile.GFile(f"{remote}/labels.csv", "w") as f:
        f.write("uri,label\n" + "".join(f"{u},{c}\n" for u, c in manifest_images) + "imgs/gone.png,bag\n")
    result = pp.preprocess(f"{remote}/labels.csv", str(tmp_path / "out"), workers=1)
    assert sum(result.counts.values()) == 12
    assert rejected_rows(str(tmp_path / "out"))[f"{remote}/imgs/gone.png"]["reason"] == data.UNREADABLE


def test_hidden_folders_are_not_classes(image_folder, tmp_path):
    root = image_folder(per_class=4)
    write(os.path.join(root, ".ipynb_checkpoints", "x.png"), b"")
    result = pp.preprocess(root, str(tmp_path / "out"), workers=1)
    assert result.class_names == ["Bag", "Sandal", "Sneaker"]
    row = rejected_rows(str(tmp_path / "out"))[os.path.join(root, ".ipynb_checkpoints")]
    assert row["reason"] == pp.OUTSIDE_CLASSES and row["detail"] == "hidden folder, not a class"
