"""Batch prediction on real images: mixed folders, every kind of source, restart, sharded outputs, the CLI."""

import concurrent.futures
import csv
import dataclasses
import io
import json
import os
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image

from components.dataio import data
from components import predict as predict_lib
from components.predict import decode, sources
from components.predict import predict
from components.predict.local import describe
from tests.conftest import REPO_ROOT, vertex_client
from tests.test_storage_gcs import bucket  # noqa: F401 (the gs:// stand-in fixture)


def encode(array: np.ndarray, fmt: str, mode: str | None = None, **options) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(array, mode=mode).save(buffer, format=fmt, **options)
    return buffer.getvalue()


def write(path, payload: bytes) -> str:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(payload)
    return str(path)


def rows(path: str) -> list[dict]:
    with open(path) as f:
        return [json.loads(line) for line in f]


@pytest.fixture(scope="module")
def classifier(tiny_model):
    from components.registry import model_digest

    return dataclasses.replace(data.load_classifier(tiny_model), digest=model_digest(tiny_model))


class CountingClassifier:
    """A real classifier that counts the images it is asked about, and can be told to fail on a call."""

    def __init__(self, classifier: data.Classifier, fail_on_call: int | None = None):
        self.inner, self.fail_on_call, self.calls, self.images = classifier, fail_on_call, 0, 0

    def __call__(self, batch):
        self.calls += 1
        if self.fail_on_call is not None and self.calls == self.fail_on_call:
            raise KeyboardInterrupt("interrupted by the test")
        self.images += len(batch)
        return self.inner.predict_proba(batch)

    def as_classifier(self) -> data.Classifier:
        return data.Classifier(self, self.inner.image_shape, self.inner.class_names, self.inner.source,
                               digest=self.inner.digest)


@pytest.fixture
def mixed_folder(tmp_path, fashion_arrays):
    """Good images of many kinds in nested folders, plus files that cannot be used. Returns (root, good, bad)."""
    images, _ = fashion_arrays
    root = tmp_path / "mixed"
    good, bad = [], {}
    for i in range(12):  # the common case: 28x28 8-bit grayscale PNGs, in nested folders
        good.append(write(root / "a" / "b" / f"{i:03d}.png", encode(images[i], "PNG")))
    rgb = np.stack([images[20], images[21], images[22]], axis=-1)
    good.append(write(root / "rgb.png", encode(rgb, "PNG")))
    good.append(write(root / "big_rgba.png", encode(np.dstack([np.kron(rgb, np.ones((3, 4, 1), np.uint8)),
                                                               np.full((84, 112), 200, np.uint8)]), "PNG")))
    good.append(write(root / "palette.png", _palette_png(rgb)))
    good.append(write(root / "deep16.png", encode(images[23].astype(np.uint16) * 257, "PNG")))
    good.append(write(root / "c" / "gray.jpg", encode(images[24], "JPEG", quality=90)))
    good.append(write(root / "c" / "color.JPEG", encode(np.kron(rgb, np.ones((2, 2, 1), np.uint8)), "JPEG")))
    good.append(write(root / "c" / "d" / "progressive.jpeg", encode(images[25], "JPEG", progressive=True)))
    good.append(write(root / "anim.gif", encode(images[28], "GIF")))  # GIF/BMP/WebP/TIFF decode like training's
    full_png = encode(images[26], "PNG")
    bad[write(root / "truncated.png", full_png[:len(full_png) // 2])] = "truncated"
    bad[write(root / "c" / "truncated.jpg", encode(images[27], "JPEG")[:150])] = "truncated"
    bad[write(root / "garbage.png", b"\x89PNG\r\n\x1a\n" + os.urandom(200))] = "image"
    bad[write(root / "empty.png", b"")] = "empty file"
    bad[write(root / "README.txt", b"these are the images to classify\n")] = "not an image"
    bad[write(root / "c" / "d" / "weights.npy", np.arange(10).tobytes())] = "not an image"
    return str(root), sorted(good), bad


def _palette_png(rgb: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(rgb).convert("P", palette=Image.Palette.ADAPTIVE, colors=16).save(buffer, format="PNG")
    return buffer.getvalue()


def test_mixed_folder_predicts_every_image_and_reports_every_failure(mixed_folder, classifier, tmp_path):
    root, good, bad = mixed_folder
    out = str(tmp_path / "out")
    result = predict("", root, out, classifier=classifier)

    assert (result.count, result.errors) == (len(good), len(bad))
    predicted = rows(os.path.join(out, "predictions.jsonl"))
    assert sorted(r["uri"] for r in predicted) == good
    names = classifier.class_names
    for row in predicted:
        assert set(row) == {"uri", "class_index", "class_name", "confidence", "top_k"}
        assert row["class_name"] == names[row["class_index"]]
        assert len(row["top_k"]) == 3
        assert row["top_k"][0] == {"class_index": row["class_index"], "class_name": row["class_name"],
                                   "confidence": row["confidence"]}
        confidences = [t["confidence"] for t in row["top_k"]]
        assert confidences == sorted(confidences, reverse=True) and 0 < confidences[0] <= 1
        assert [t["class_name"] for t in row["top_k"]] == [names[t["class_index"]] for t in row["top_k"]]

    # The same answer as the model gives on training's decoder, whichever path decoded the image.
    for row in predicted:
        with open(row["uri"], "rb") as f:
            pixels = decode.decode_contents(f.read(), *classifier.image_shape)
        expected = classifier.predict_proba(pixels[None].astype(np.float32))[0]
        assert row["class_index"] == int(expected.argmax()), row["uri"]
        assert row["confidence"] == pytest.approx(float(expected.max()), abs=2e-6), row["uri"]

    errors = {e["uri"]: e["reason"] for e in rows(os.path.join(out, "errors.jsonl"))}
    assert set(errors) == set(bad)
    for uri, expected_words in bad.items():
        assert expected_words in errors[uri], (uri, errors[uri])

    with open(os.path.join(out, "predictions.csv"), newline="") as f:
        table = list(csv.DictReader(f))
    assert list(table[0]) == ["uri", "class_index", "class_name", "confidence", "top2_class_index",
                              "top2_class_name", "top2_confidence", "top3_class_index", "top3_class_name",
                              "top3_confidence"]
    by_uri = {r["uri"]: r for r in predicted}
    assert len(table) == len(good)
    for line in table:
        row = by_uri[line["uri"]]
        assert (int(line["class_index"]), line["class_name"], float(line["confidence"])) == \
            (row["class_index"], row["class_name"], row["confidence"])
        assert line["top3_class_name"] == row["top_k"][2]["class_name"]
    with open(os.path.join(out, "summary.json")) as f:
        summary = json.load(f)
    assert (summary["count"], summary["errors"], summary["inputs"]) == (len(good), len(bad), len(good) + len(bad))
    assert summary["source_kind"] == "folder"


def test_rows_are_written_as_json_dumps_and_csv_writer_write_them(tmp_path):
    """The writer joins each row from pieces formatted once per class; the bytes are the standard modules'."""
    from components.predict.output import ChunkWriter, csv_header

    names = ["plain", 'a "quoted", name', "naïve\nline", "x,y", ""]
    uris = ["gs://b/a.png", "/d/with,comma.jpg", '/d/"quoted".png', "/d/new\nline.png", "/d/ret\r.png",
            "/d/naïve €.png", "", "/d/tab\t.png"]
    probabilities = np.array([[1.0, 0.0, 0.0, 0.0, 0.0], [1e-6, 5e-5, 0.25, 0.5, 0.249949],
                              [0.2, 0.2, 0.2, 0.2, 0.2], [0.1234565, 0.3, 0.0001, 0.00009999, 0.5765435],
                              [0.333333333, 0.333333333, 0.333333334, 0, 0], [0.9999996, 4e-7, 0, 0, 0],
                              [0.6, 0.1, 0.1, 0.1, 0.1], [0, 0, 0, 0.5, 0.5]], np.float32)
    os.makedirs(tmp_path / "shards")
    for top_k in (1, 3, 5):
        writer = ChunkWriter(str(tmp_path), top_k, names, top_k)
        logged = writer.write(uris, probabilities)
        writer.commit({})
        lines, buffer = [], io.StringIO()
        table = csv.writer(buffer, lineterminator="\n")
        table.writerow(csv_header(top_k))
        for uri, p in zip(uris, probabilities):
            order = np.argsort(-p, kind="stable")[:top_k].tolist()
            conf = np.round(p[order].astype(np.float64), 6).tolist()
            lines.append(json.dumps({"uri": uri, "class_index": order[0], "class_name": names[order[0]],
                                     "confidence": conf[0], "top_k": [
                                         {"class_index": t, "class_name": names[t], "confidence": c}
                                         for t, c in zip(order, conf)]}) + "\n")
            table.writerow([uri, order[0], names[order[0]], conf[0]]
                           + [x for t, c in zip(order[1:], conf[1:]) for x in (t, names[t], c)])
            assert logged[len(lines) - 1] == (uri, order[0], conf[0])
        with open(writer.paths["jsonl"], encoding="utf-8") as f:
            assert f.read() == "".join(lines)
        with open(writer.paths["csv"], newline="", encoding="utf-8") as f:
            assert f.read() == buffer.getvalue()


def test_fast_path_gives_the_pixels_of_trainings_decoder(fashion_arrays):
    """The batch decoders must be used for the common files and agree with data.decode_image to the pixel."""
    images, _ = fashion_arrays
    rgb = np.stack([images[0], images[1], 255 - images[2]], axis=-1)
    transparent = io.BytesIO()
    Image.fromarray(images[3]).save(transparent, format="PNG", transparency=0)
    cases = {
        (28, 28, 1): {"png": [encode(images[i], "PNG") for i in range(4, 8)]
                      + [transparent.getvalue(), encode(images[8], "PNG", optimize=True)],
                      "jpeg": [encode(images[i], "JPEG", quality=q) for i, q in ((9, 50), (10, 95))]
                      + [encode(images[11], "JPEG", progressive=True)],
                      "slow": [encode(rgb, "PNG"), encode(rgb, "JPEG"), encode(images[12][:20], "PNG")]},
        (28, 28, 3): {"png": [encode(rgb, "PNG")],
                      "jpeg": [encode(rgb, "JPEG", quality=q, subsampling=s) for q, s in ((75, 2), (95, 0))],
                      "slow": [encode(images[13], "PNG"), encode(images[14], "JPEG")]},
    }
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        for shape, routes in cases.items():
            decoder = decode.Decoder(list(shape), pool)
            items = []
            for route, payloads in routes.items():
                for payload in payloads:
                    assert decoder.route(payload) == route, (shape, route)
                    items.append((f"{route}-{len(items)}", payload))
            keys, pixels, errors = decoder.decode(items)
            assert errors == [] and keys == [k for k, _ in items]
            for (key, payload), got in zip(items, pixels):
                np.testing.assert_array_equal(got, data.decode_image(payload, *shape), err_msg=f"{shape} {key}")


def test_corrupt_file_in_a_fast_batch_fails_alone(fashion_arrays):
    images, _ = fashion_arrays
    good = [encode(images[i], "PNG") for i in range(5)]
    corrupt = good[0][:40] + bytes(60)  # a valid header, then zeros: the fast decoder raises on the batch
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        decoder = decode.Decoder([28, 28, 1], pool)
        assert decoder.route(corrupt) == "png"
        keys, pixels, errors = decoder.decode([("g0", good[0]), ("bad", corrupt), ("g1", good[1]),
                                               ("gone", "unreadable: FileNotFoundError: No such file")])
    assert keys == ["g0", "g1"] and len(pixels) == 2
    assert [k for k, _ in errors] == ["bad", "gone"]
    assert "corrupt" in errors[0][1] or "not an image" in errors[0][1]


def digit_classifier(shape=(28, 28, 1)) -> data.Classifier:
    """Classes named by digits; the class is the first pixel's value mod 10, at 99.85% (for the log line)."""

    def proba(batch):
        out = np.full((len(batch), 10), 0.0015 / 9, np.float32)
        out[np.arange(len(batch)), batch[:, 0, 0, 0].astype(int) % 10] = 0.9985
        return out

    return data.Classifier(proba, list(shape), [str(i) for i in range(10)], "test", digest="test:first-pixel-mod-10")


def test_log_lines_in_the_classic_form_then_bounded(tmp_path, capsys, fashion_arrays):
    folder = tmp_path / "digits"
    for i in range(25):
        pixels = np.zeros((28, 28), np.uint8)
        pixels[0, 0] = 7 if i == 0 else i
        write(folder / f"{i}.png", encode(pixels, "PNG"))
    predict("", str(folder), str(tmp_path / "out"), classifier=digit_classifier(), print_first=5)
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "The image 0.png is the number 7 with a 99.85 percent confidence."
    classic = [line for line in lines if line.startswith("The image ")]
    assert len(classic) == 5
    assert "(the first 5 predictions are printed; progress lines follow)" in lines


def test_log_lines_use_class_names(image_folder, classifier, tmp_path, capsys):
    folder = image_folder(per_class=3)
    predict("", folder, str(tmp_path / "out"), classifier=classifier)
    classic = [line for line in capsys.readouterr().out.splitlines() if line.startswith("The image ")]
    assert len(classic) == 9
    names = "|".join(n.replace("/", "\\/") for n in classifier.class_names)
    import re

    pattern = re.compile(rf"The image \d{{5}}\.png is an? ({names}) with a \d{{1,3}}\.\d\d percent confidence\.")
    for line in classic:
        assert pattern.fullmatch(line), line
    assert describe(["Ankle boot"], 0) == "an Ankle boot"
    assert describe(["T-shirt/top"], 0) == "a T-shirt/top"


def test_restart_after_an_interruption_skips_finished_chunks(image_folder, classifier, tmp_path):
    folder = image_folder(per_class=15)  # 45 images, 5 chunks of 10
    clean_dir, out = str(tmp_path / "clean"), str(tmp_path / "out")
    predict("", folder, clean_dir, classifier=classifier, chunk_size=10, batch_size=4)

    interrupted = CountingClassifier(classifier, fail_on_call=8)  # 3 calls a chunk: dies inside chunk 2
    with pytest.raises(KeyboardInterrupt):
        predict("", folder, out, classifier=interrupted.as_classifier(), chunk_size=10, batch_size=4)
    shards = os.path.join(out, "shards")
    assert sorted(f for f in os.listdir(shards) if f.startswith("chunk-")) == ["chunk-00000.json", "chunk-00001.json"]
    assert not os.path.exists(os.path.join(out, "predictions.jsonl"))

    rerun = CountingClassifier(classifier)
    result = predict("", folder, out, classifier=rerun.as_classifier(), chunk_size=10, batch_size=4)
    assert (result.chunks, result.skipped_chunks, result.count) == (5, 2, 45)
    assert rerun.images == 25  # only what was not done yet
    assert not [f for f in os.listdir(shards) if f.endswith(".tmp")]
    with open(os.path.join(out, "predictions.jsonl")) as a, open(os.path.join(clean_dir, "predictions.jsonl")) as b:
        assert a.read() == b.read()

    # Inputs that changed under a finished chunk: that chunk (and those after it) are redone, the rest skipped.
    first_class = sorted(os.listdir(folder))[-1]
    os.remove(os.path.join(folder, first_class, sorted(os.listdir(os.path.join(folder, first_class)))[0]))
    again = CountingClassifier(classifier)
    result = predict("", folder, out, classifier=again.as_classifier(), chunk_size=10, batch_size=4)
    assert result.count == 44 and result.chunks == 5 and 0 < result.skipped_chunks < 5
    assert again.images == 44 - 10 * result.skipped_chunks
    assert len(rows(os.path.join(out, "predictions.jsonl"))) == 44


@pytest.fixture(scope="module")
def other_model(tiny_model, tmp_path_factory) -> str:
    """Another model of the same shape and classes: the tiny model with its last layer's biases shifted, so that
    it answers differently (and has another digest)."""
    import shutil

    import keras

    out = str(tmp_path_factory.mktemp("other_model"))
    shutil.copy(os.path.join(tiny_model, "training.json"), out)
    model = keras.models.load_model(os.path.join(tiny_model, "model.keras"), compile=False)
    weights = model.get_weights()
    weights[-1] = weights[-1] + np.linspace(0.0, 3.0, len(weights[-1]), dtype=weights[-1].dtype)
    model.set_weights(weights)
    model.save(os.path.join(out, "model.keras"))
    return out


def test_a_rerun_with_another_model_or_other_options_never_mixes(image_folder, tiny_model, other_model, tmp_path):
    from components.predict.output import PredictionsExist
    from components.registry import model_digest

    folder = image_folder(per_class=15)  # 45 images, 5 chunks of 10
    ours, theirs = data.load_classifier(tiny_model), data.load_classifier(other_model)
    clean = str(tmp_path / "clean")
    predict(other_model, folder, clean, classifier=theirs, chunk_size=10)
    other_rows = rows(os.path.join(clean, "predictions.jsonl"))
    out = str(tmp_path / "out")
    interrupted = CountingClassifier(ours, fail_on_call=2)  # dies inside chunk 1: chunk 0 is ours
    with pytest.raises(KeyboardInterrupt):
        predict(tiny_model, folder, out, classifier=interrupted.as_classifier(), chunk_size=10)
    shards = os.path.join(out, "shards")
    assert sorted(f for f in os.listdir(shards) if f.startswith("chunk-")) == ["chunk-00000.json"]
    ours_first = rows(os.path.join(shards, "predictions-00000.jsonl"))
    assert [r["uri"] for r in ours_first] == [r["uri"] for r in other_rows[:10]]
    assert ours_first != other_rows[:10]  # the two models answer differently

    # Another model into the folder: refused in one line naming the folder and the way on; nothing written.
    before = {name: os.path.getmtime(os.path.join(shards, name)) for name in os.listdir(shards)}
    with pytest.raises(PredictionsExist) as refused:
        predict(other_model, folder, out, classifier=theirs, chunk_size=10)
    message = str(refused.value)
    assert "\n" not in message and message.startswith(f"{out} already holds predictions of another model")
    assert f"model {model_digest(tiny_model)[:19]}... there, {model_digest(other_model)[:19]}... here" in message
    assert "new output folder" in message and "--overwrite" in message
    assert {name: os.path.getmtime(os.path.join(shards, name)) for name in os.listdir(shards)} == before

    # The same model resumes: its chunk is kept, the others are predicted.
    again = CountingClassifier(ours)
    resumed = predict(tiny_model, folder, out, classifier=again.as_classifier(), chunk_size=10)
    assert (resumed.skipped_chunks, resumed.count, again.images) == (1, 45, 35)
    ours_rows = rows(os.path.join(out, "predictions.jsonl"))
    assert ours_rows[:10] == ours_first

    # Other options that change a row are another answer too: top_k here.
    with pytest.raises(PredictionsExist, match=r"top_k 3 there, 2 here"):
        predict(tiny_model, folder, out, classifier=ours, chunk_size=10, top_k=2)

    # --overwrite: the other model's predictions only, as a run into a new folder gives them.
    replaced = predict(other_model, folder, out, classifier=theirs, chunk_size=10, overwrite=True)
    assert (replaced.skipped_chunks, replaced.count) == (0, 45)
    assert rows(os.path.join(out, "predictions.jsonl")) == other_rows
    with open(os.path.join(out, "summary.json")) as f:
        assert json.load(f)["skipped_chunks"] == 0

    # Chunks written before markers recorded their model are not trusted to be this model's.
    marker_path = os.path.join(shards, "chunk-00000.json")
    with open(marker_path) as f:
        marker = json.load(f)
    del marker["settings"]
    with open(marker_path, "w") as f:
        json.dump(marker, f)
    with pytest.raises(PredictionsExist, match="made before predictions recorded their model"):
        predict(other_model, folder, out, classifier=theirs, chunk_size=10)


def test_shrunk_input_removes_stale_shards(image_folder, classifier, tmp_path):
    folder = image_folder(per_class=10)
    out = str(tmp_path / "out")
    predict("", folder, out, classifier=classifier, chunk_size=10)
    assert os.path.exists(os.path.join(out, "shards", "chunk-00002.json"))
    predict("", os.path.join(folder, "Bag"), out, classifier=classifier, chunk_size=10)
    assert not os.path.exists(os.path.join(out, "shards", "chunk-00002.json"))
    assert len(rows(os.path.join(out, "predictions.jsonl"))) == 10


def test_large_outputs_stay_sharded(image_folder, classifier, tmp_path):
    folder = image_folder(per_class=10)
    out = str(tmp_path / "out")
    result = predict("", folder, out, classifier=classifier, chunk_size=7, combine_max=20)
    assert result.predictions_path == os.path.join(out, "shards", "predictions-*.jsonl")
    assert not os.path.exists(os.path.join(out, "predictions.jsonl"))
    shard_rows = [r for i in range(result.chunks) for r in rows(os.path.join(out, "shards", f"predictions-{i:05d}.jsonl"))]
    assert len(shard_rows) == 30 and result.chunks == 5
    for i in range(result.chunks):
        with open(os.path.join(out, "shards", f"predictions-{i:05d}.csv")) as f:
            assert f.readline().startswith("uri,class_index,class_name,confidence")
    with open(os.path.join(out, "summary.json")) as f:
        summary = json.load(f)
    assert summary["predictions_jsonl"] is None and summary["count"] == 30


def test_output_inside_the_source_folder_is_not_read_back(image_folder, classifier):
    folder = image_folder(per_class=4)
    out = os.path.join(folder, "predictions")
    first = predict("", folder, out, classifier=classifier)
    second = predict("", folder, out, classifier=classifier)
    assert first.count == second.count == 12 and second.errors == 0 and second.skipped_chunks == 1


def test_glob_sources(image_folder, classifier, tmp_path):
    folder = image_folder(per_class=4)
    write(os.path.join(folder, "notes.txt"), b"not an image")
    result = predict("", os.path.join(folder, "**", "*.png"), str(tmp_path / "all"), classifier=classifier)
    assert (result.count, result.errors) == (12, 0)
    result = predict("", os.path.join(folder, "S*", "*.png"), str(tmp_path / "s"), classifier=classifier)
    assert result.count == 8  # Sandal and Sneaker, not Bag
    top_level = sources.glob_regex("/d/*.png")
    assert top_level.match("/d/a.png") and not top_level.match("/d/x/a.png")
    assert sources.glob_regex("/d/**/*.png").match("/d/a.png")
    assert sources.glob_regex("gs://b/i/**/[!_]?.jp*g").match("gs://b/i/x/y/a1.jpeg")
    with pytest.raises(data.DataError, match="No input found"):
        predict("", os.path.join(folder, "*.jpg"), str(tmp_path / "none"), classifier=classifier)


def test_manifest_sources(image_folder, classifier, tmp_path):
    folder = image_folder(per_class=3)
    files = sorted(os.path.join(d, f) for d, _, fs in os.walk(folder) for f in fs)
    relative = [os.path.relpath(f, folder) for f in files]
    missing = os.path.join(folder, "Bag", "missing.png")
    with open(os.path.join(folder, "list.txt"), "w") as f:
        f.write("# images to score\n" + "\n".join(relative + [missing]) + "\n\n")
    result = predict("", os.path.join(folder, "list.txt"), str(tmp_path / "txt"), classifier=classifier)
    assert (result.count, result.errors) == (9, 1)
    error = rows(str(tmp_path / "txt" / "errors.jsonl"))[0]
    assert error["uri"] == missing and "unreadable" in error["reason"] and "No such file" in error["reason"]

    with open(tmp_path / "list.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["id", "uri"])
        writer.writerows([[i, uri] for i, uri in enumerate(files)])
    assert predict("", str(tmp_path / "list.csv"), str(tmp_path / "csv"), classifier=classifier).count == 9
    with open(tmp_path / "instances.jsonl", "w") as f:
        f.writelines(json.dumps({"content": uri, "mimeType": "image/png"}) + "\n" for uri in files[:4])
    result = predict("", str(tmp_path / "instances.jsonl"), str(tmp_path / "jsonl"), classifier=classifier)
    assert result.count == 4
    assert [r["uri"] for r in rows(str(tmp_path / "jsonl" / "predictions.jsonl"))] == files[:4]


def _example(**features) -> bytes:
    import tensorflow as tf

    def feature(value):
        if isinstance(value, int):
            return tf.train.Feature(int64_list=tf.train.Int64List(value=[value]))
        return tf.train.Feature(bytes_list=tf.train.BytesList(value=[value]))

    return tf.train.Example(features=tf.train.Features(
        feature={k.replace("__", "/"): feature(v) for k, v in features.items()})).SerializeToString()


def _common_layout_shards(fashion_arrays, tmp_path):
    """The common layout: encoded images under image/encoded, a filename; one record without an image; a GZIP
    shard; and a shard truncated in the middle of a record."""
    import tensorflow as tf

    pictures, _ = fashion_arrays
    shards = tmp_path / "shards"
    shards.mkdir()
    with tf.io.TFRecordWriter(str(shards / "a-00000.tfrecord")) as w:
        for i in range(6):
            w.write(_example(image__encoded=encode(pictures[i], "PNG" if i % 2 else "JPEG"),
                             image__filename=f"a{i}.png".encode(), label=i))
        w.write(_example(label=99))
    with tf.io.TFRecordWriter(str(shards / "b-00001.tfrecord.gz"), options="GZIP") as w:
        for i in range(4):
            w.write(_example(image=encode(pictures[10 + i], "PNG")))
    with tf.io.TFRecordWriter(str(shards / "c-00002.tfrecord")) as w:
        for i in range(5):
            w.write(_example(image=encode(pictures[20 + i], "PNG"), uri=f"gs://b/c{i}.png".encode()))
    with open(shards / "c-00002.tfrecord", "rb") as f:
        whole = f.read()
    with open(shards / "c-00002.tfrecord", "wb") as f:
        f.write(whole[:len(whole) - 30])
    return shards


def test_tfrecord_sources(small_dataset, classifier, fashion_arrays, tmp_path):
    import tensorflow as tf

    # This project's own shards: raw pixels, with the original uri; one chunk per shard, in order.
    shard_files = data.split_files(small_dataset, "test")
    result = predict("", os.path.join(small_dataset, "test", "*.tfrecord"), str(tmp_path / "own"),
                     classifier=classifier)
    expected = data.read_manifest(small_dataset)["splits"]["test"]["count"]
    assert (result.count, result.errors, result.chunks) == (expected, 0, len(shard_files))
    predicted = rows(str(tmp_path / "own" / "predictions.jsonl"))
    records = [tf.train.Example.FromString(r) for shard in shard_files for r in tf.compat.v1.io.tf_record_iterator(shard)]
    pixels = np.stack([np.frombuffer(r.features.feature["image"].bytes_list.value[0], np.uint8) for r in records])
    probabilities = classifier.predict_proba(pixels.reshape(-1, *classifier.image_shape).astype(np.float32))
    assert [r["uri"] for r in predicted] == [r.features.feature["uri"].bytes_list.value[0].decode() for r in records]
    assert [r["class_index"] for r in predicted] == probabilities.argmax(1).tolist()
    np.testing.assert_allclose([r["confidence"] for r in predicted], probabilities.max(1), atol=2e-6)

    shards = _common_layout_shards(fashion_arrays, tmp_path)
    out = str(tmp_path / "records")
    result = predict("", str(shards / "*-0000?.tfrecord*"), out, classifier=classifier)
    assert (result.count, result.errors, result.chunks) == (6 + 4 + 4, 2, 3)
    uris = [r["uri"] for r in rows(os.path.join(out, "predictions.jsonl"))]
    assert uris[:6] == [f"a{i}.png" for i in range(6)]
    assert uris[6:10] == [f"{shards / 'b-00001.tfrecord.gz'}#{i}" for i in range(4)]
    assert uris[10:] == [f"gs://b/c{i}.png" for i in range(4)]
    errors = rows(os.path.join(out, "errors.jsonl"))
    assert errors[0]["uri"].endswith("a-00000.tfrecord#6") and "no image feature" in errors[0]["reason"]
    assert errors[1]["uri"].endswith("c-00002.tfrecord") and "unreadable after record 4" in errors[1]["reason"]


ITER_RECORDS_WITHOUT_TENSORFLOW = """
import json, sys
for name in ("tensorflow", "keras"):
    sys.modules[name] = None  # `import` of a module set to None raises ImportError
from components.predict import decode
print(json.dumps([[name, item.hex() if isinstance(item, bytes) else item] for shard in sys.argv[1:]
                  for name, item in decode.iter_records(shard)]))
"""


def test_records_are_read_alike_with_and_without_tensorflow(fashion_arrays, tmp_path):
    """decode.iter_records frames records with TensorFlow's reader where it is installed and with records.py where
    it is not; the names, images and reasons are one rule's (_record_image): the same items from the same shards,
    but for the GZIP shard, which only TensorFlow reads, and the words of each reader for a truncated record."""
    shards = _common_layout_shards(fashion_arrays, tmp_path)
    files = [str(shards / name) for name in ("a-00000.tfrecord", "c-00002.tfrecord", "b-00001.tfrecord.gz")]
    with_tensorflow = [[name, item.hex() if isinstance(item, bytes) else item]
                       for shard in files for name, item in decode.iter_records(shard)]
    run = subprocess.run([sys.executable, "-c", ITER_RECORDS_WITHOUT_TENSORFLOW, *files], capture_output=True,
                         text=True, timeout=300, env={**os.environ, "PYTHONPATH": REPO_ROOT}, cwd=REPO_ROOT)
    assert run.returncode == 0, run.stderr[-3000:]
    without = json.loads(run.stdout.strip().splitlines()[-1])
    assert len(with_tensorflow) == 7 + 5 + 4  # 7 records; 4 whole ones and the truncation; 4 in the GZIP shard
    assert without[:11] == with_tensorflow[:11]
    assert with_tensorflow[6] == [f"{files[0]}#6", "record has no image feature (looked for image/encoded, image, "
                                  "image_raw, image/raw, encoded)"]
    for items in (with_tensorflow, without):  # the truncation, in each reader's words (DataLossError, DataError)
        assert items[11][0] == files[1] and items[11][1].startswith("unreadable after record 4: "), items[11]
    assert without[12:] == [[files[2], "a GZIP-compressed TFRecord shard: reading one needs TensorFlow, which is "
                                       "not installed here"]]


def test_sources_that_cannot_be_used(tmp_path, classifier):
    with pytest.raises(data.DataError, match="Image source not found: .*nowhere"):
        predict("", str(tmp_path / "nowhere"), str(tmp_path / "o1"), classifier=classifier)
    (tmp_path / "empty").mkdir()
    with pytest.raises(data.DataError, match="No input found"):
        predict("", str(tmp_path / "empty"), str(tmp_path / "o2"), classifier=classifier)
    write(tmp_path / "model.bin", b"\0" * 10)
    with pytest.raises(data.DataError, match="Cannot tell how to read .*model.bin: give a folder"):
        predict("", str(tmp_path / "model.bin"), str(tmp_path / "o3"), classifier=classifier)
    junk = tmp_path / "junk"
    write(junk / "a.png", b"not a png")
    write(junk / "b.txt", b"text")
    with pytest.raises(data.DataError, match=r"No image in folder .*junk could be read \(2 inputs failed"):
        predict("", str(junk), str(tmp_path / "o4"), classifier=classifier)
    assert len(rows(str(tmp_path / "o4" / "errors.jsonl"))) == 2


def test_jpeg_shape_reads_the_frame_header(fashion_arrays):
    images, _ = fashion_arrays
    assert decode.jpeg_shape(encode(images[0], "JPEG")) == (28, 28, 1)
    assert decode.jpeg_shape(encode(np.zeros((30, 40, 3), np.uint8), "JPEG", progressive=True)) == (30, 40, 3)
    assert decode.jpeg_shape(b"\xff\xd8\xff\xe0\x00") is None


@pytest.mark.slow
def test_pipectl_predict_standalone(image_folder, tiny_model, tmp_path):
    folder = image_folder(per_class=5)
    out = tmp_path / "out"
    pipectl = os.path.join(os.path.dirname(sys.executable), "pipectl")
    command = [pipectl, "predict", "--model", tiny_model, "--images", folder, "--output", str(out), "--top-k", "2"]
    completed = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert completed.returncode == 0, completed.stderr
    classic = [line for line in completed.stdout.splitlines() if line.startswith("The image ")]
    assert len(classic) == 15
    summary = json.loads(completed.stdout[completed.stdout.index("{"):])
    assert summary["count"] == 15 and summary["errors"] == 0
    assert all(len(r["top_k"]) == 2 for r in rows(str(out / "predictions.jsonl")))

    again = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0 and json.loads(again.stdout[again.stdout.index("{"):])["skipped_chunks"] == 1

    other_options = subprocess.run(command[:-1] + ["3"], capture_output=True, text=True, timeout=300)
    assert other_options.returncode == 2 and "Traceback" not in other_options.stderr
    assert (f"pipectl: error: {out} already holds predictions of another model or other options (top_k 2 there, "
            "3 here): predict into a new output folder, or pass --overwrite to replace them") in other_options.stderr

    missing = subprocess.run([pipectl, "predict", "--model", tiny_model, "--images", str(tmp_path / "nope"),
                              "--output", str(tmp_path / "o")], capture_output=True, text=True, timeout=300)
    assert missing.returncode == 2
    assert "Image source not found" in missing.stderr and "Traceback" not in missing.stderr


# ---------------------------------------------------------------------------------------------- Vertex AI


@pytest.fixture
def vertex_serving(tiny_model):
    """What Vertex AI's TensorFlow serving container does with the registered model: the exported SavedModel's
    serving signature, refusing instances that do not match it."""
    import tensorflow as tf

    signature = tf.saved_model.load(os.path.join(tiny_model, "saved_model")).signatures["serving_default"]
    (input_name,) = signature.structured_input_signature[1]

    def serve(instances: list) -> list:
        for instance in instances:
            if set(instance) != {input_name}:
                raise ValueError(f"instance fields {sorted(instance)} do not match the signature's input {input_name}")
        try:
            outputs = signature(**{input_name: tf.constant([i[input_name] for i in instances], tf.float32)})
        except (tf.errors.InvalidArgumentError, ValueError) as e:
            raise ValueError(f"the model refused the instances: {str(e).splitlines()[0]}") from None
        return next(iter(outputs.values())).numpy().tolist()

    return serve


@pytest.fixture
def vertex(tmp_path, vertex_serving):
    from tests.standins.vertex_api import VertexStandIn

    with VertexStandIn(storage_root=str(tmp_path / "gcs"), serve=vertex_serving) as standin:
        yield standin


def test_vertex_batch_prediction_gives_what_local_prediction_gives(vertex, image_folder, tiny_model, classifier,
                                                                   tmp_path):
    folder = image_folder(per_class=4)
    write(os.path.join(folder, "Bag", "broken.png"), b"\x89PNG\r\n\x1a\n broken")
    model = vertex.add_model("4242", "image-classifier", versions=("1", "2"), aliases={"default": "1", "champion": "2"})
    sleeps = []
    out = str(tmp_path / "vertex-out")
    result = predict_lib.vertex_batch_predict(
        tiny_model, model + "@champion", folder, out, client=vertex_client(vertex.api_endpoint),
        staging_uri="gs://bucket/batch/run-1", storage_root=str(tmp_path / "gcs"), machine_type="n1-standard-8",
        poll_seconds=5, sleep=sleeps.append)

    assert (result.count, result.errors) == (12, 1)
    assert sleeps == [5, 5]  # PENDING, RUNNING, SUCCEEDED
    (create,) = vertex.calls("CreateBatchPredictionJob")
    assert create.path == "/v1/projects/test-project/locations/us-central1/batchPredictionJobs"
    body = create.body
    assert body["model"] == model + "@champion"
    assert body["inputConfig"] == {"instancesFormat": "jsonl",
                                   "gcsSource": {"uris": ["gs://bucket/batch/run-1/instances.jsonl"]}}
    assert body["instanceConfig"] == {"instanceType": "object", "keyField": "uri"}
    assert body["outputConfig"]["gcsDestination"]["outputUriPrefix"] == "gs://bucket/batch/run-1/results"
    assert body["dedicatedResources"]["machineSpec"] == {"machineType": "n1-standard-8"}
    with open(tmp_path / "gcs" / "bucket" / "batch" / "run-1" / "instances.jsonl") as f:
        assert sum(1 for _ in f) == 12

    local = predict("", folder, str(tmp_path / "local-out"), classifier=classifier)
    assert local.count == 12
    remote_rows = {r["uri"]: r for r in rows(os.path.join(out, "predictions.jsonl"))}
    for row in rows(str(tmp_path / "local-out" / "predictions.jsonl")):
        assert remote_rows[row["uri"]]["class_index"] == row["class_index"]
        assert remote_rows[row["uri"]]["confidence"] == pytest.approx(row["confidence"], abs=1e-5)
        assert [t["class_name"] for t in remote_rows[row["uri"]]["top_k"]][:1] == [row["class_name"]]
    errors = rows(os.path.join(out, "errors.jsonl"))
    assert [e["uri"] for e in errors] == [os.path.join(folder, "Bag", "broken.png")]
    with open(os.path.join(out, "predictions.csv")) as f:
        assert sum(1 for _ in f) == 13


def test_instances_the_vertex_model_server_refused_are_reported_not_dropped(image_folder, tiny_model,
                                                                          vertex_serving, tmp_path):
    """A custom-trained model's job writes refused instances nowhere but as a count in
    prediction.errors_stats-*: each is found missing from the results and reported in errors.jsonl."""
    from tests.standins.vertex_api import VertexStandIn

    folder = image_folder(per_class=3)
    for name in ("black-1.png", "black-2.png"):
        Image.fromarray(np.zeros((28, 28), np.uint8)).save(os.path.join(folder, "Bag", name))

    def refuses_black_images(instances: list) -> list:
        if any(not np.any(next(iter(i.values()))) for i in instances):
            raise ValueError("the model server answered 500 for an all-black image")
        return vertex_serving(instances)

    with VertexStandIn(storage_root=str(tmp_path / "gcs"), serve=refuses_black_images) as vertex:
        model = vertex.add_model("4242", "image-classifier")
        out = str(tmp_path / "out")
        result = predict_lib.vertex_batch_predict(
            tiny_model, model, folder, out, client=vertex_client(vertex.api_endpoint), staging_uri="gs://b/run",
            storage_root=str(tmp_path / "gcs"), poll_seconds=1, sleep=lambda s: None)
        (job,) = vertex.batch_jobs()
    assert job["completionStats"]["failedCount"] == "2"
    assert (result.count, result.errors) == (9, 2)
    errors = {e["uri"]: e["reason"] for e in rows(os.path.join(out, "errors.jsonl"))}
    assert set(errors) == {os.path.join(folder, "Bag", name) for name in ("black-1.png", "black-2.png")}
    assert all("Vertex AI returned no prediction" in reason and "answered 500 for an all-black image (2 instances)"
               in reason for reason in errors.values())
    assert len(rows(os.path.join(out, "predictions.jsonl"))) == 9


def test_vertex_output_of_a_model_with_schemata_is_read_too(tmp_path):
    """The layout batch_prediction_job.proto documents for a model with schemata: predictions_N.jsonl and, for
    failed instances, errors_N.jsonl with the instance and a google.rpc.Status."""
    results = tmp_path / "prediction-m-2026_01_01T00_00_00_000Z"
    results.mkdir()
    (results / "predictions_0001.jsonl").write_text(json.dumps({"key": "gs://b/a.png", "prediction": [0.9, 0.1]})
                                                    + "\n")
    (results / "errors_0001.jsonl").write_text(json.dumps({"instance": {"uri": "gs://b/b.png", "x": [0]},
                                                           "error": {"code": 3, "message": "bad shape"}}) + "\n")
    out = tmp_path / "out"
    (out / "shards").mkdir(parents=True)  # as vertex_batch_predict makes it
    totals = predict_lib.vertex.read_vertex_predictions(str(results), str(out), ["cat", "dog"],
                                                        sent_keys=["gs://b/a.png", "gs://b/b.png", "gs://b/c.png"])
    assert (totals["count"], totals["errors"], totals["missing"]) == (1, 2, 1)
    errors = {}
    for chunk in range(totals["chunks"]):
        path = predict_lib.output.shard_paths(str(out), chunk)["errors"]
        errors.update((e["uri"], e["reason"]) for e in rows(path))
    assert errors["gs://b/b.png"] == "Vertex AI: bad shape"
    assert errors["gs://b/c.png"].startswith("Vertex AI returned no prediction for it")
    with pytest.raises(predict_lib.VertexBatchError, match="wrote none of its output files"):
        predict_lib.vertex.read_vertex_predictions(str(tmp_path), str(out), ["cat", "dog"], sent_keys=[])


def test_vertex_batch_job_failures_are_reported(vertex, image_folder, tiny_model, tmp_path):
    folder = image_folder(per_class=2)
    model = vertex.add_model("77", "image-classifier")
    common = dict(client=vertex_client(vertex.api_endpoint), staging_uri="gs://bucket/batch",
                  storage_root=str(tmp_path / "gcs"), poll_seconds=1, sleep=lambda s: None)

    vertex.fail_next_batch_job("Model server terminated: out of memory")
    with pytest.raises(predict_lib.VertexBatchError, match="ended JOB_STATE_FAILED: Model server terminated"):
        predict_lib.vertex_batch_predict(tiny_model, model, folder, str(tmp_path / "o1"), **common)

    with pytest.raises(predict_lib.VertexBatchError, match=r"failed: .*does not exist.*registered in this project"):
        predict_lib.vertex_batch_predict(tiny_model, model.replace("/77", "/78"), folder, str(tmp_path / "o2"), **common)

    vertex.batch_polls = (100, 1)
    with pytest.raises(predict_lib.VertexBatchError, match="did not finish within 3s; it was cancelled"):
        predict_lib.vertex_batch_predict(tiny_model, model, folder, str(tmp_path / "o3"), timeout_seconds=3, **common)
    assert vertex.batch_jobs()[-1]["state"] == "JOB_STATE_CANCELLED"

    with pytest.raises(ValueError, match="Not a Vertex AI model resource name"):
        predict_lib.run_vertex_batch_job(common["client"], model="image-classifier", instances_uri="gs://b/i.jsonl",
                                         output_uri_prefix="gs://b/o", display_name="x")
    with pytest.raises(ValueError, match="staging location must be a gs:// folder"):
        predict_lib.vertex_batch_predict(tiny_model, model, folder, str(tmp_path / "o4"),
                                         **{**common, "staging_uri": str(tmp_path / "staging")})


def test_pipectl_predict_on_vertex_needs_a_staging_folder(tiny_model, image_folder, capsys):
    from pipelines import cli

    code = cli.main(["predict", "--model", tiny_model, "--images", image_folder(per_class=1), "--output", "/tmp/x",
                     "--vertex-model", "projects/p/locations/us-central1/models/1"])
    assert code == 2
    assert "--vertex-model needs --staging gs://BUCKET/FOLDER" in capsys.readouterr().err


def test_an_interrupted_vertex_batch_prediction_cancels_its_job(tmp_path):
    """SIGTERM (a cancelled pipeline run, or `kill` of pipectl predict) must not leave a paid batch job running:
    the follower cancels it, as the CustomJob launcher does (tests/test_launch.py), and exits 143."""
    import textwrap

    from tests.conftest import run_then_sigterm
    from tests.standins.vertex_api import VertexStandIn

    with VertexStandIn(storage_root=str(tmp_path / "gcs"), serve=lambda instances: [],
                       batch_polls=(1, 1_000_000)) as vertex:  # RUNNING until cancelled
        model = vertex.add_model("4242", "image-classifier")
        _, follower = run_then_sigterm([sys.executable, "-c", textwrap.dedent(f"""
            import sys
            from components import gcp, stepcli
            from components.predict import run_vertex_batch_job
            client = gcp.job_client("us-central1", api_endpoint={vertex.api_endpoint!r})
            try:
                run_vertex_batch_job(client, model={model!r}, instances_uri="gs://bucket/batch/instances.jsonl",
                                     output_uri_prefix="gs://bucket/batch/results", display_name="interrupted",
                                     poll_seconds=0.05)
            except gcp.JobStopped as e:
                print("stopped:", e)
                sys.exit(stepcli.exit_code_for(e))
        """)], ready=lambda: len(vertex.calls("GetBatchPredictionJob")) >= 2)
        assert follower.returncode == 143, follower.stderr
        assert "stopped: Stopped while Batch prediction job projects/" in follower.stdout
        (job,) = vertex.batch_jobs()
        assert job["state"] == "JOB_STATE_CANCELLED"
        assert len(vertex.calls("CancelBatchPredictionJob")) == 1


def test_a_folder_that_cannot_be_listed_is_reported(tmp_path):
    """A folder gone (or unreadable) when the walk reaches it becomes an input whose reading fails with the reason."""
    for name in ("a.png", "b/c.png", "d/e.png"):
        write(tmp_path / "root" / name, b"x")
    walk = sources.walk_files(str(tmp_path / "root"))
    assert next(walk) == str(tmp_path / "root" / "a.png")
    os.rename(tmp_path / "root" / "b", tmp_path / "elsewhere")  # vanishes before the walk lists it
    rest = list(walk)
    assert rest == [str(tmp_path / "root" / "b"), str(tmp_path / "root" / "d" / "e.png")]
    reason = decode.read_input(rest[0])
    assert reason.startswith("folder could not be listed: FileNotFoundError")


def test_linked_folders_are_followed_once(image_folder, classifier, tmp_path):
    folder = image_folder(per_class=2)
    os.symlink(folder, os.path.join(folder, "Bag", "loop"))
    result = predict("", folder, str(tmp_path / "out"), classifier=classifier)
    assert (result.count, result.errors) == (6, 0)


# ---------------------------------------------------------------------------------------------- JPEGs on the GPU


def camera_jpegs(food_photos: str) -> list[bytes]:
    """Real photos (the food photos) at sizes that take each of the rule's DCT scales to 64x64, as JPEGs."""
    names = sorted(os.path.join(folder, n) for folder, _, files in os.walk(food_photos) for n in files)[:4]
    payloads = []
    for path, size in zip(names, ((1024, 768), (600, 338), (307, 173), (130, 90))):
        with Image.open(path) as img:
            payloads.append(encode(np.asarray(img.convert("RGB").resize(size, Image.Resampling.BICUBIC)), "JPEG",
                                   quality=90))
    return payloads


def test_without_cuda_jpegs_decode_on_the_cpu_and_the_log_names_no_gpu(food_photos, tmp_path, caplog):
    """Where torch sees no CUDA device (or is not installed: this project's CPU image), prediction takes the CPU
    decoders, exactly the readers' rule, and says nothing of a GPU."""
    from components.predict import nvjpeg

    try:
        import torch
    except ImportError:
        torch = None
    if torch is not None and torch.cuda.is_available():
        pytest.skip("a CUDA device is here: prediction takes the GPU path")
    assert nvjpeg.gpu_jpeg_decoder([64, 64, 3]) is None
    folder = tmp_path / "photos"
    for i, payload in enumerate(camera_jpegs(food_photos)):
        write(str(folder / f"{i}.jpg"), payload)
    caplog.set_level("INFO", logger="components.predict")
    result = predict("", str(folder), str(tmp_path / "out"), classifier=digit_classifier((64, 64, 3)))
    assert result.count == 4 and result.errors == 0
    assert "on the GPU" not in caplog.text and "predict: " in caplog.text


@pytest.mark.parametrize("size,ratio", [((3000, 4000), 8), ((1536, 2048), 4), ((480, 640), 2), ((240, 320), 1),
                                        ((448, 5000), 2), ((447, 449), 2), ((446, 449), 1)])
def test_the_gpu_decoder_scales_by_the_rules_dct_ratio(size, ratio):
    from components.predict import nvjpeg

    assert nvjpeg.rule_ratio(*size, 224, 224) == ratio


def test_the_gpu_decoder_run_on_the_cpu_approximates_the_rule_and_a_corrupt_file_falls_back(food_photos):
    """torchvision's decode_jpeg on the CPU (libjpeg; nvJPEG on CUDA, not measurable without a GPU) with the rule's
    scaling and resize: within a few levels of the rule; a batch holding a corrupt JPEG is decoded on the CPU
    decoders, which name the file and why."""
    pytest.importorskip("torchvision")
    from components.predict import nvjpeg

    gpu = nvjpeg.GpuJpegDecoder([64, 64, 3], device="cpu")
    payloads = camera_jpegs(food_photos)
    pixels = gpu(payloads, [decode.jpeg_shape(p) for p in payloads])
    for payload, got in zip(payloads, pixels):
        expected = data.file_decoder((64, 64, 3))(payload).astype(np.int16)
        difference = np.abs(got.astype(np.int16) - expected)
        assert difference.mean() < 3 and np.percentile(difference, 99) < 24, (decode.jpeg_shape(payload),
                                                                              difference.mean())
    corrupt = payloads[0][:len(payloads[0]) // 3] + bytes(200)
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        decoder = decode.Decoder([64, 64, 3], pool, gpu_jpeg=gpu)
        keys, images, errors = decoder.decode([("a", payloads[1]), ("bad", corrupt), ("b", payloads[2])])
    assert keys == ["a", "b"] and [k for k, _ in errors] == ["bad"]
    for got, payload in zip(images, (payloads[1], payloads[2])):
        np.testing.assert_array_equal(got, data.file_decoder((64, 64, 3))(payload))  # the CPU's exact pixels


def test_a_model_on_gs_is_read_once_for_its_digest_and_its_predictions(bucket, tiny_model, tmp_path):
    """Predicting with a gs:// model fetches each of its files once: loading the model and the fingerprint's
    model digest (the registry's digest of the same files) both read one local copy, which is gone afterwards."""
    import glob
    import shutil
    import tempfile

    from components.dataio import storage
    from components.predict.output import SHARDS, model_here
    from components.registry import model_digest

    shutil.copytree(tiny_model, bucket.root_path / "models" / "tiny")
    folder = tmp_path / "images"
    folder.mkdir()
    for i in range(3):
        (folder / f"{i}.png").write_bytes(encode(np.full((28, 28), 40 * i, np.uint8), "PNG"))
    storage.use_tensorflow_io(False)  # gs:// through google-cloud-storage's client, against the stand-in
    copies = set(glob.glob(os.path.join(tempfile.gettempdir(), "model-*")))
    try:
        result = predict("gs://bucket/models/tiny", str(folder), str(tmp_path / "out"))
        with pytest.raises(FileNotFoundError, match="gs://bucket/models/none"):
            with model_here("gs://bucket/models/none"):
                pass
        (bucket.root_path / "models" / "empty").mkdir()
        (bucket.root_path / "models" / "empty" / "notes.txt").write_text("no model here")
        with pytest.raises(data.DataError, match="No model found in gs://bucket/models/empty "):
            predict("gs://bucket/models/empty", str(folder), str(tmp_path / "out-empty"))
    finally:
        storage.use_tensorflow_io(True)
    assert result.count == 3
    markers = [json.loads(p.read_text()) for p in (tmp_path / "out" / SHARDS).glob("chunk-*.json")]
    assert markers and all(m["settings"]["model"] == model_digest(tiny_model) for m in markers), markers
    model_files = [os.path.relpath(f, tiny_model) for f in glob.glob(f"{tiny_model}/**", recursive=True)
                   if os.path.isfile(f)]
    assert "model.keras" in model_files
    for name in model_files:
        downloads = bucket.requests_to("GET", f"/download/storage/v1/b/bucket/o/models/tiny/{name}")
        assert len(downloads) == 1, (name, len(downloads))
    assert set(glob.glob(os.path.join(tempfile.gettempdir(), "model-*"))) == copies
