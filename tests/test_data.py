"""The image, idx and shard helpers of components/dataio/data.py, on real bytes (PIL-written files, real idx files)."""

import gzip
import io
import os
import struct
import zlib

import numpy as np
import pytest
from PIL import Image

from components.dataio import data


def encoded(array: np.ndarray, fmt: str, mode: str | None = None, **save) -> bytes:
    buffer = io.BytesIO()
    image = Image.fromarray(array) if mode is None else Image.fromarray(array).convert(mode)
    image.save(buffer, fmt, **save)
    return buffer.getvalue()


def gradient(height=40, width=30) -> np.ndarray:
    """A gray image whose pixel values are all different along both axes (orientation shows)."""
    return ((np.arange(height)[:, None] * 5 + np.arange(width)[None, :]) % 256).astype(np.uint8)


def png_header_only(width: int, height: int) -> bytes:
    """A PNG that declares width x height pixels but carries a tiny IDAT: decoding it would take huge memory."""
    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body) & 0xFFFFFFFF)

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\0" * 64)) + chunk(b"IEND", b"")


# ---------------------------------------------------------------------------------------------- decode_image


def test_decodes_grayscale_png_exactly():
    image = gradient(28, 28)
    out = data.decode_image(encoded(image, "PNG"), 28, 28, 1)
    assert out.shape == (28, 28, 1) and out.dtype == np.uint8
    np.testing.assert_array_equal(out[..., 0], image)


def test_resizes_and_converts_channels():
    rgb = np.stack([gradient(), np.zeros((40, 30), np.uint8), np.full((40, 30), 200, np.uint8)], axis=-1)
    out = data.decode_image(encoded(rgb, "PNG"), 28, 28, 3)
    assert out.shape == (28, 28, 3)
    assert out[..., 1].max() == 0 and abs(int(out[..., 2].mean()) - 200) <= 1
    gray = data.decode_image(encoded(rgb, "PNG"), 16, 16, 1)
    assert gray.shape == (16, 16, 1)


@pytest.mark.parametrize("fmt", ["GIF", "BMP", "WEBP", "TIFF"])
def test_other_common_formats_are_supported(fmt):
    image = gradient(28, 28)
    save = {"lossless": True} if fmt == "WEBP" else {}
    out = data.decode_image(encoded(image, fmt, **save), 28, 28, 1)
    np.testing.assert_array_equal(out[..., 0], image)


def test_sixteen_bit_png_is_scaled_not_clipped():
    wide = np.array([[0, 257, 257 * 100, 65535]], np.uint16)
    out = data.decode_image(encoded(wide, "PNG"), 1, 4, 1)
    assert out[0, :, 0].tolist() == [0, 1, 100, 255]


def test_cmyk_jpeg_becomes_rgb():
    cmyk = Image.new("CMYK", (16, 16), (0, 255, 255, 0))  # pure red in CMYK
    buffer = io.BytesIO()
    cmyk.save(buffer, "JPEG", quality=95)
    out = data.decode_image(buffer.getvalue(), 16, 16, 3)
    red, green, blue = (int(c) for c in out.reshape(-1, 3).mean(axis=0))
    assert red > 200 and green < 40 and blue < 40


def test_transparency_is_composited_on_white():
    rgba = np.zeros((8, 8, 4), np.uint8)
    rgba[:4, :, 3] = 255  # top half opaque black, bottom half fully transparent
    out = data.decode_image(encoded(rgba, "PNG"), 8, 8, 1)
    assert out[:4].max() == 0 and out[4:].min() == 255
    palette = Image.fromarray(np.array([[0, 1], [1, 0]], np.uint8), mode="P")
    palette.putpalette([0, 0, 0, 255, 0, 0] + [0] * 762)
    buffer = io.BytesIO()
    palette.save(buffer, "PNG", transparency=1)  # palette entry 1 (red) transparent
    out = data.decode_image(buffer.getvalue(), 2, 2, 3)
    assert out[0, 0].tolist() == [0, 0, 0] and out[0, 1].tolist() == [255, 255, 255]


def test_exif_orientation_is_applied():
    image = gradient(20, 30)
    exif = Image.Exif()
    exif[0x0112] = 6  # stored rotated: viewers turn it 90 degrees clockwise
    buffer = io.BytesIO()
    Image.fromarray(image).save(buffer, "PNG", exif=exif)
    out = data.decode_image(buffer.getvalue(), 30, 20, 1)  # upright it is 30 rows x 20 columns
    np.testing.assert_array_equal(out[..., 0], np.rot90(image, k=-1))


def test_large_jpeg_is_decoded_at_reduced_scale_with_the_same_result():
    rng = np.random.default_rng(0)
    smooth = np.kron(rng.integers(0, 255, (32, 32)), np.ones((32, 32))).astype(np.uint8)  # 1024x1024 blocks
    jpeg = encoded(smooth, "JPEG", quality=95)
    out = data.decode_image(jpeg, 32, 32, 1)
    full = np.asarray(Image.open(io.BytesIO(jpeg)).resize((32, 32), Image.Resampling.BILINEAR), np.int16)
    assert np.abs(out[..., 0].astype(np.int16) - full).mean() < 3


@pytest.mark.parametrize("make, reason", [
    (lambda: b"", data.EMPTY_FILE),
    (lambda: os.urandom(2000), data.NOT_AN_IMAGE),
    (lambda: b"label,uri\nBag,x.png\n", data.NOT_AN_IMAGE),
    (lambda: encoded(np.random.default_rng(1).integers(0, 255, (64, 64), dtype=np.uint8), "PNG")[:600],
     data.CORRUPT),
    (lambda: encoded(np.random.default_rng(2).integers(0, 255, (64, 64, 3), dtype=np.uint8), "JPEG")[:1500],
     data.CORRUPT),
    (lambda: encoded(gradient(), "PPM"), data.UNSUPPORTED_FORMAT),
    (lambda: encoded(np.zeros((4, 4, 3), np.uint8), "TIFF", mode="LAB"), data.UNSUPPORTED_MODE),
    (lambda: encoded(np.zeros((4, 4), np.float32), "TIFF"), data.UNSUPPORTED_MODE),
    (lambda: png_header_only(10_000, 10_000), data.TOO_LARGE),  # above our limit, below PIL's error
    (lambda: png_header_only(20_000, 20_000), data.TOO_LARGE),  # PIL's own decompression-bomb error
])
def test_unusable_bytes_raise_image_error_with_reason(make, reason):
    with pytest.raises(data.ImageError) as caught:
        data.decode_image(make(), 28, 28, 1)
    assert caught.value.reason == reason
    assert str(caught.value).startswith(reason)


def test_read_bytes_reports_unreadable_paths(tmp_path):
    (tmp_path / "dir.png").mkdir()
    os.symlink(tmp_path / "gone.png", tmp_path / "dangling.png")
    for path, detail in ((tmp_path / "dir.png", "directory"), (tmp_path / "dangling.png", "not found")):
        with pytest.raises(data.ImageError) as caught:
            data.read_bytes(str(path))
        assert caught.value.reason == data.UNREADABLE and detail in caught.value.detail


def test_list_files_streams_in_stable_order(tmp_path):
    for name in ("b/2.png", "a/1.png", "a/sub/0.png", "c.png"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(b"x")
    assert [os.path.relpath(p, tmp_path) for p in data.list_files(str(tmp_path))] == [
        "c.png", "a/1.png", "a/sub/0.png", "b/2.png"]
    with pytest.raises(data.DataError, match="Not a directory"):
        list(data.list_files(str(tmp_path / "c.png")))


def test_tile_lays_out_rows():
    cells = [np.full((2, 3, 1), v, np.uint8) for v in (10, 20, 30)]
    grid = data.tile(cells, 2, gap=1, background=0)
    assert grid.shape == (5, 7, 1)
    assert grid[0, 0, 0] == 10 and grid[0, 4, 0] == 20 and grid[3, 0, 0] == 30 and grid[3, 4, 0] == 0
    assert Image.open(io.BytesIO(data.encode_png(grid))).size == (7, 5)


# ---------------------------------------------------------------------------------------------- idx


def write_idx(path, array: np.ndarray) -> None:
    header = struct.pack(">HBB", 0, 0x08, array.ndim) + struct.pack(f">{array.ndim}I", *array.shape)
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "wb") as f:
        f.write(header + array.astype(np.uint8).tobytes())


def test_read_idx_round_trip_and_validation(tmp_path, fashion_dir):
    images = data.read_idx(os.path.join(fashion_dir, "t10k-images-idx3-ubyte.gz"))
    assert images.shape == (10000, 28, 28)
    write_idx(tmp_path / "a-images-idx3-ubyte", images[:5])
    np.testing.assert_array_equal(data.read_idx(str(tmp_path / "a-images-idx3-ubyte")), images[:5])
    raw = (tmp_path / "a-images-idx3-ubyte").read_bytes()
    (tmp_path / "short").write_bytes(raw[:-10])
    with pytest.raises(data.DataError, match="truncated"):
        data.read_idx(str(tmp_path / "short"))
    (tmp_path / "magic").write_bytes(b"\x01\x02" + raw[2:])
    with pytest.raises(data.DataError, match="not an unsigned-byte idx"):
        data.read_idx(str(tmp_path / "magic"))


def test_find_idx_pairs_needs_labels(tmp_path):
    write_idx(tmp_path / "train-images-idx3-ubyte.gz", np.zeros((2, 4, 4)))
    with pytest.raises(data.DataError, match="no matching labels file"):
        data.find_idx_pairs(str(tmp_path))
    write_idx(tmp_path / "train-labels-idx1-ubyte.gz", np.zeros(2))
    (pair,) = data.find_idx_pairs(str(tmp_path))
    assert pair.split == "train" and pair.labels.endswith("train-labels-idx1-ubyte.gz")


# ---------------------------------------------------------------------------------------------- shards


def test_encode_example_matches_tensorflow_proto():
    import tensorflow as tf

    image = np.random.default_rng(0).integers(0, 255, (5, 4, 3), dtype=np.uint8)
    for label in (0, 7, 300, 2**40):
        ours = tf.train.Example.FromString(data.encode_example(image, label, "gs://b/é/x.png"))
        expected = tf.train.Example(features=tf.train.Features(feature={
            "image": tf.train.Feature(bytes_list=tf.train.BytesList(value=[image.tobytes()])),
            "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[label])),
            "uri": tf.train.Feature(bytes_list=tf.train.BytesList(value=["gs://b/é/x.png".encode()])),
        }))
        assert ours == expected


def test_num_shards_for_targets_size_and_readers():
    assert data.num_shards_for(0, 784) == 1
    assert data.num_shards_for(3, 784, min_shards=8) == 3  # never an empty shard
    assert data.num_shards_for(60_000, 784, min_shards=2) == 2  # 56 MB: the readers decide
    photos = data.num_shards_for(1_000_000, 224 * 224 * 3, min_shards=4)
    per_shard = 1_000_000 * (224 * 224 * 3 + 148) / photos
    assert 100e6 <= per_shard <= 200e6 and photos >= 4
    assert data.num_shards_for(1_000_000, 224 * 224 * 3, min_shards=2000) == 2000


def test_shard_writer_round_robin_and_no_empty_shards(tmp_path):
    import tensorflow as tf

    writer = data.ShardWriter(str(tmp_path), "train", 4)
    image = np.zeros((2, 2, 1), np.uint8)
    for i in range(2):
        writer.write(image, i, f"img{i}")
    writer.close()
    files = sorted(tf.io.gfile.glob(str(tmp_path / "train" / "train-*.tfrecord")))
    assert [os.path.basename(f) for f in files] == ["train-00000-of-00002.tfrecord", "train-00001-of-00002.tfrecord"]
    assert writer.summary()["num_shards"] == 2 and writer.summary()["count"] == 2
    assert [sum(1 for _ in tf.data.TFRecordDataset(f)) for f in files] == [1, 1]

    full = data.ShardWriter(str(tmp_path), "test", 3)
    for i in range(7):
        full.write(image, i % 2, f"img{i}")
    full.close()
    sizes = [sum(1 for _ in tf.data.TFRecordDataset(p)) for p in full.paths]
    assert sizes == [3, 2, 2] and full.summary()["class_counts"] == {"0": 4, "1": 3}


def test_the_exif_orientation_is_read_as_pillow_reads_it():
    """images._orientation reads IFD0's orientation tag itself where the EXIF block is plain, and leaves the rest
    to Image.getexif(): the same answer on every block, real-looking, big-endian, with XMP, and damaged (bytes
    changed at random, truncated)."""
    import random
    import struct
    import warnings

    from components.dataio import images

    def jpeg_with(exif_block: bytes | None, xmp: bytes | None = None) -> bytes:
        buffer = io.BytesIO()
        Image.new("RGB", (16, 8), (90, 120, 30)).save(buffer, "JPEG", **({"xmp": xmp} if xmp else {}))
        raw = buffer.getvalue()
        if exif_block is None:
            return raw
        return raw[:2] + b"\xff\xe1" + struct.pack(">H", len(exif_block) + 2) + exif_block + raw[2:]

    def big_endian(orientation: int) -> bytes:
        entries = [(0x010F, 2, 6, 38), (0x0112, 3, 1, orientation << 16), (0x011A, 5, 1, 44)]
        ifd = struct.pack(">H", len(entries)) + b"".join(struct.pack(">HHLL", *e) for e in entries) + b"\0" * 4
        return b"Exif\0\0MM\0*" + struct.pack(">L", 8) + ifd + b"Canon\0" + struct.pack(">LL", 72, 1)

    blocks = []
    for orientation in (1, 3, 6, 8, 0, 9):
        exif = Image.Exif()
        exif[0x010F], exif[0x0110], exif[0x0112], exif[0x0131] = "Maker", "Model X", orientation, "an editor"
        blocks.append(b"Exif\0\0" + exif.tobytes())
        blocks.append(big_endian(orientation))
    without = Image.Exif()
    without[0x010F] = "no orientation"
    blocks.append(b"Exif\0\0" + without.tobytes())
    rng = random.Random(0)
    damaged = []
    for block in blocks:
        for _ in range(40):
            changed = bytearray(block)
            for _ in range(rng.randint(1, 3)):
                changed[rng.randrange(6, len(changed))] = rng.randrange(256)
            damaged.append(bytes(changed))
        damaged += [block[:n] for n in range(6, len(block), 5)]
    files = [jpeg_with(b) for b in blocks + damaged]
    files += [jpeg_with(blocks[-1], xmp=b'<x:xmpmeta><rdf:Description tiff:Orientation="6"/></x:xmpmeta>'),
              jpeg_with(blocks[0], xmp=b'<x:xmpmeta><rdf:Description tiff:Orientation="6"/></x:xmpmeta>')]
    read_here = 0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # PIL warns about the damaged blocks
        for raw in files:
            img = Image.open(io.BytesIO(raw))
            try:
                expected = Image.open(io.BytesIO(raw)).getexif().get(0x0112, 1)
            except Exception:
                expected = 1
            assert images._orientation(img) == expected, raw[:80]
            read_here += "exif" in img.info and images._exif_orientation(img.info["exif"]) is not None
    assert read_here >= len(blocks)  # the plain blocks (and some damaged ones) are read without getexif()
    assert images._orientation(Image.open(io.BytesIO(files[-2]))) == 6  # XMP's orientation, where IFD0 has none
