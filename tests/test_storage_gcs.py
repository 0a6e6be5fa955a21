"""gs:// without TensorFlow (components/dataio/gcs.py behind storage.LocalFiles): each call the steps make, with
google-cloud-storage's real client against the Cloud Storage stand-in (tests/standins/gcs.py), and a process where
TensorFlow cannot be imported reading a dataset by reference and loading models from gs://."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from components.dataio import data, gcs, storage
from components.dataio.storage import LocalFiles as fs
from tests.conftest import require_framework
from tests.standins.gcs import GcsStandIn

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture
def bucket(tmp_path, loopback_only):
    """gs://bucket on a stand-in, reached through a client handed to components/dataio/gcs.py (set_client)."""
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import storage as gcs_storage

    root = tmp_path / "gcs"
    (root / "bucket" / "d" / "sub").mkdir(parents=True)
    (root / "bucket" / "d" / "a.txt").write_text("first\nsecond\n")
    (root / "bucket" / "d" / "train-00000-of-00002.tfrecord").write_bytes(b"x" * 10)
    (root / "bucket" / "d" / "train-00001-of-00002.tfrecord").write_bytes(b"y" * 20)
    (root / "bucket" / "d" / "sub" / "b.bin").write_bytes(bytes(range(256)))
    with GcsStandIn(root) as server:
        client = gcs_storage.Client(project="test", credentials=AnonymousCredentials(),
                                    client_options={"api_endpoint": server.url})
        gcs.set_client(client)
        # The folder markers tf.io.gfile.makedirs("gs://bucket/d/sub") uploads (RecursivelyCreateDir: one empty
        # `name/` object a level, GcsFileSystem::CreateDir with ifGenerationMatch=0): a bucket as TensorFlow
        # writes it
        for marker in ("d/", "d/sub/"):
            client.bucket("bucket").blob(marker).upload_from_string(b"", if_generation_match=0)
        server.root_path = root / "bucket"
        try:
            yield server
        finally:
            gcs.set_client(None)


def test_directories_are_prefixes_as_tf_gfile_sees_them_on_gcs(bucket):
    assert fs.isdir("gs://bucket/d") and fs.isdir("gs://bucket/d/") and fs.isdir("gs://bucket/d/sub")
    assert fs.isdir("gs://bucket") and not fs.isdir("gs://no-such-bucket")
    assert not fs.isdir("gs://bucket/d/a.txt") and not fs.isdir("gs://bucket/nothing")
    assert fs.exists("gs://bucket/d/a.txt") and fs.exists("gs://bucket/d") and not fs.exists("gs://bucket/d/a")
    assert sorted(fs.listdir("gs://bucket/d")) == ["a.txt", "sub/", "train-00000-of-00002.tfrecord",
                                                   "train-00001-of-00002.tfrecord"]
    with pytest.raises(FileNotFoundError, match="gs://bucket/nothing"):
        fs.listdir("gs://bucket/nothing")
    assert list(fs.walk("gs://bucket/d")) == [
        ("gs://bucket/d", ["sub/"], ["a.txt", "train-00000-of-00002.tfrecord", "train-00001-of-00002.tfrecord"]),
        ("gs://bucket/d/sub/", [], ["b.bin"])]
    assert list(fs.walk("gs://bucket/nothing")) == []
    # the patterns of the steps: shards of a split (`*` stays within one segment), a directory's children
    assert fs.glob("gs://bucket/d/train-*.tfrecord") == ["gs://bucket/d/train-00000-of-00002.tfrecord",
                                                         "gs://bucket/d/train-00001-of-00002.tfrecord"]
    assert fs.glob("gs://bucket/*") == ["gs://bucket/d"]
    assert fs.glob("gs://bucket/d/*/*.bin") == ["gs://bucket/d/sub/b.bin"]
    assert fs.glob("gs://bucket/d/train-0000[1]-*") == ["gs://bucket/d/train-00001-of-00002.tfrecord"]
    assert fs.glob("gs://bucket/e/*") == []
    # the markers: gs://bucket/d/ is no child of gs://bucket/d (GetMatchingPaths lists without the folder's own
    # marker); one deeper matches a "/"-ending name, as TensorFlow's does (AddAllSubpaths keeps `sub/`)
    assert fs.glob("gs://bucket/d/*") == ["gs://bucket/d/a.txt", "gs://bucket/d/sub",
                                          "gs://bucket/d/train-00000-of-00002.tfrecord",
                                          "gs://bucket/d/train-00001-of-00002.tfrecord"]
    assert fs.glob("gs://bucket/d/*/*") == ["gs://bucket/d/sub/", "gs://bucket/d/sub/b.bin"]
    assert fs.glob("gs://bucket/d*") == ["gs://bucket/d"]
    assert fs.stat("gs://bucket/d/sub/b.bin").length == 256 and fs.stat("gs://bucket/d/sub/b.bin").mtime_nsec > 0
    with pytest.raises(FileNotFoundError):
        fs.stat("gs://bucket/d/nothing")
    inserted = len(bucket.calls("storage.objects.insert"))
    fs.makedirs("gs://bucket/new/dir")  # an object's name makes its directories: nothing is written
    assert len(bucket.calls("storage.objects.insert")) == inserted


def test_the_stand_in_holds_every_name_gcs_allows(bucket):
    """A marker `e/`, an object `e` beside objects under `e/`, names with empty, "." and ".." segments: each is
    its own object, listed, read and deleted as Cloud Storage does (cloud.google.com/storage/docs/naming-objects)."""
    objects = gcs.client().bucket("bucket")
    for name, contents in [("e/x", b"under"), ("e", b"beside"), ("e/", b""), ("f//g", b"empty segment"),
                           ("f/./h", b"dot"), ("f/../i", b"dots")]:
        objects.blob(name).upload_from_string(contents)
    assert [blob.name for blob in gcs.client().list_blobs("bucket", prefix="e")] == ["e", "e/", "e/x"]
    assert [objects.blob(n).download_as_bytes() for n in ("e", "e/x", "e/", "f//g", "f/./h", "f/../i")] == [
        b"beside", b"under", b"", b"empty segment", b"dot", b"dots"]
    # as tf.io.gfile on GCS sees them: `e` is a file and a folder; the marker is no child of its folder
    assert fs.exists("gs://bucket/e") and fs.isdir("gs://bucket/e") and fs.stat("gs://bucket/e").length == 6
    assert sorted(fs.listdir("gs://bucket")) == ["d/", "e", "e/", "f/"] and fs.listdir("gs://bucket/e") == ["x"]
    assert list(fs.walk("gs://bucket/e")) == [("gs://bucket/e", [], ["x"])]
    assert fs.glob("gs://bucket/e*") == ["gs://bucket/e"] and fs.glob("gs://bucket/e/*") == ["gs://bucket/e/x"]
    assert fs.glob("gs://bucket/f/*/*") == ["gs://bucket/f/../i", "gs://bucket/f/./h", "gs://bucket/f//g"]
    objects.blob("e").delete()
    assert [blob.name for blob in gcs.client().list_blobs("bucket", prefix="e")] == ["e/", "e/x"]
    objects.blob("e").upload_from_string(b"again")
    assert objects.blob("e").download_as_bytes() == b"again"


def test_a_publish_by_rename_survives_one_server_error(bucket):
    """Renames and copies on gs:// are objects.rewrite, which the client retries (DEFAULT_RETRY_IF_GENERATION_
    SPECIFIED, blob.py:4045 at 3.17.1) only with a generation precondition: components/dataio/gcs.py sends them."""
    from google.api_core import exceptions

    with fs.GFile("gs://bucket/ckpt/epoch-2.partial", "wb") as f:
        f.write(b"weights of epoch 2")
    fs.copy("gs://bucket/d/a.txt", "gs://bucket/ckpt/epoch-2")  # the previous checkpoint to replace
    # Without a precondition the real client gives up on the first 503: what publishing did before
    plain = gcs.client().bucket("bucket")
    bucket.fail_next(503, rpc="storage.objects.rewrite")
    with pytest.raises(exceptions.ServiceUnavailable):
        plain.blob("ckpt/other").rewrite(plain.blob("d/a.txt"))
    before = len(bucket.calls("storage.objects.rewrite"))
    bucket.fail_next(503, rpc="storage.objects.rewrite")
    fs.rename("gs://bucket/ckpt/epoch-2.partial", "gs://bucket/ckpt/epoch-2", overwrite=True)
    assert (bucket.root_path / "ckpt" / "epoch-2").read_bytes() == b"weights of epoch 2"
    assert not fs.exists("gs://bucket/ckpt/epoch-2.partial")
    tries = bucket.calls("storage.objects.rewrite")[before:]
    assert [call.status for call in tries] == [503, 200]
    assert all(call.arg("ifGenerationMatch") and call.arg("ifSourceGenerationMatch") for call in tries)
    # a copy to a new name: ifGenerationMatch=0, so it also never replaces one that appeared meanwhile
    bucket.fail_next(500, rpc="storage.objects.rewrite")
    fs.copy("gs://bucket/ckpt/epoch-2", "gs://bucket/ckpt/backup")
    assert bucket.calls("storage.objects.rewrite")[-1].arg("ifGenerationMatch") == "0"
    assert (bucket.root_path / "ckpt" / "backup").read_bytes() == b"weights of epoch 2"
    with pytest.raises(FileExistsError, match="gs://bucket/ckpt/backup already exists"):
        fs.copy("gs://bucket/d/a.txt", "gs://bucket/ckpt/backup")
    # a rewrite that landed but whose answer was lost: the retry's precondition fails (412), the target holds the
    # source's bytes, so the publish is done; and the delete of the source, retried the same way, finds it gone
    with fs.GFile("gs://bucket/ckpt/epoch-3.partial", "wb") as f:
        f.write(b"weights of epoch 3")
    before = len(bucket.calls())
    bucket.lose_answer("storage.objects.rewrite")
    bucket.lose_answer("storage.objects.delete")
    fs.rename("gs://bucket/ckpt/epoch-3.partial", "gs://bucket/ckpt/epoch-2", overwrite=True)
    assert (bucket.root_path / "ckpt" / "epoch-2").read_bytes() == b"weights of epoch 3"
    assert not fs.exists("gs://bucket/ckpt/epoch-3.partial")
    calls = [(call.rpc, call.status) for call in bucket.calls()[before:] if call.method != "GET"]
    assert calls == [("storage.objects.rewrite", 503), ("storage.objects.rewrite", 412),
                     ("storage.objects.delete", 503), ("storage.objects.delete", 404)]


def test_downloads_are_checked_against_x_goog_hash_and_ranged_reads_keep_their_generation(bucket, tmp_path,
                                                                                         monkeypatch):
    from google.api_core import exceptions

    fs.copy("gs://bucket/d/sub/b.bin", str(tmp_path / "b.bin"))  # a whole download, checked against crc32c
    assert (tmp_path / "b.bin").read_bytes() == bytes(range(256))
    media = bucket.calls("storage.objects.media")[-1]
    assert media.status == 200
    bucket.corrupt_next = 1  # a byte flipped on the way: the client's check refuses it
    with pytest.raises(Exception, match="[Cc]hecksum mismatch"):
        fs.copy("gs://bucket/d/sub/b.bin", str(tmp_path / "bad.bin"))
    assert not (tmp_path / "bad.bin").exists()
    # every ranged read of one GFile asks for the generation it opened: a replaced object is not read half old
    monkeypatch.setattr(gcs, "_READ_CHUNK", 1 << 16)
    objects = gcs.client().bucket("bucket")
    objects.blob("big.bin").upload_from_string(b"a" * (3 << 16))
    with fs.GFile("gs://bucket/big.bin", "rb") as f:
        assert f.read(10) == b"a" * 10
        generation = bucket.calls("storage.objects.media")[-1].arg("generation")
        assert generation == str(objects.get_blob("big.bin").generation)
        objects.blob("big.bin").upload_from_string(b"b" * (3 << 16))
        with pytest.raises(exceptions.NotFound, match=f"big.bin#{generation}"):
            f.read()


def test_an_unforeseen_error_in_the_stand_in_answers_500_and_the_client_retries(tmp_path, loopback_only):
    """Google's JSON error with 500, as the service answers an internal error, not a dropped connection."""
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import storage as gcs_storage

    class Failing(GcsStandIn):
        failures = 1

        def _download(self, request, split, headers):
            if self.failures:
                self.failures -= 1
                raise RuntimeError("disk went away")
            return super()._download(request, split, headers)

    (tmp_path / "gcs" / "bucket").mkdir(parents=True)
    (tmp_path / "gcs" / "bucket" / "x").write_bytes(b"payload")
    with Failing(tmp_path / "gcs") as server:
        client = gcs_storage.Client(project="test", credentials=AnonymousCredentials(),
                                    client_options={"api_endpoint": server.url})
        assert client.bucket("bucket").blob("x").download_as_bytes() == b"payload"
        first, second = server.requests_to("GET", "/download/storage/v1/b/bucket/o/x")
    assert first.status == 500 and second.status == 200


def test_reads_stream_in_ranges_and_text_iterates_by_line(bucket, monkeypatch):
    with fs.GFile("gs://bucket/d/a.txt") as f:
        assert list(f) == ["first\n", "second\n"]
    with fs.GFile("gs://bucket/d/a.txt") as f:
        assert f.readline() == "first\n" and f.read() == "second\n"
    with fs.GFile("gs://bucket/d/sub/b.bin", "rb") as f:
        assert f.read() == bytes(range(256))
    with pytest.raises(FileNotFoundError, match="gs://bucket/d/missing does not exist"):
        fs.GFile("gs://bucket/d/missing", "rb")
    # A big object is never fetched whole: ranged requests of the chunk size, as the caller reads on
    monkeypatch.setattr(gcs, "_READ_CHUNK", 1 << 20)
    payload = np.random.default_rng(0).integers(0, 256, 3 * (1 << 20) + 5, dtype=np.uint8).tobytes()
    (bucket.root_path / "big.bin").write_bytes(payload)
    before = len(bucket.calls("storage.objects.media"))
    with fs.GFile("gs://bucket/big.bin", "rb") as f:
        assert f.read(1000) == payload[:1000]
        assert len(bucket.calls("storage.objects.media")) == before + 1
        assert b"".join(iter(lambda: f.read(256 << 10), b"")) == payload[1000:]
    ranges = [call.headers["range"] for call in bucket.calls("storage.objects.media")[before:]]
    spans = [tuple(map(int, r[len("bytes="):].split("-"))) for r in ranges]
    assert spans[0][0] == 0 and len(spans) >= 4  # the client asks one byte more than the chunk, to see the end
    assert all(end - start + 1 <= (1 << 20) + 1 for start, end in spans)


def test_writes_upload_on_close_and_copies_renames_and_removes_as_tf_gfile(bucket, tmp_path):
    with fs.GFile("gs://bucket/out/summary.json", "w") as f:
        f.write(json.dumps({"count": 3}) + "\n")
        assert not (bucket.root_path / "out").exists()  # nothing uploaded before close
    assert json.loads((bucket.root_path / "out" / "summary.json").read_text()) == {"count": 3}
    with fs.GFile("gs://bucket/out/events", "wb") as f:
        f.write(b"one")
        f.flush()  # as TensorFlow's GCS file uploads on flush: what is written so far is there
        assert (bucket.root_path / "out" / "events").read_bytes() == b"one"
        f.write(b"two")
    assert (bucket.root_path / "out" / "events").read_bytes() == b"onetwo"

    # copy: gs:// to gs:// on the server, local to gs:// and back; an existing target only with overwrite=True
    fs.copy("gs://bucket/d/a.txt", "gs://bucket/out/a.txt")
    assert bucket.calls("storage.objects.rewrite")
    with pytest.raises(FileExistsError, match="gs://bucket/out/a.txt already exists"):
        fs.copy("gs://bucket/d/sub/b.bin", "gs://bucket/out/a.txt")
    fs.copy("gs://bucket/d/sub/b.bin", "gs://bucket/out/a.txt", overwrite=True)
    assert (bucket.root_path / "out" / "a.txt").read_bytes() == bytes(range(256))
    local = tmp_path / "local.bin"
    local.write_bytes(b"weights")
    fs.copy(str(local), "gs://bucket/out/weights.bin")
    fs.copy("gs://bucket/out/a.txt", str(tmp_path / "back.bin"))
    assert (tmp_path / "back.bin").read_bytes() == bytes(range(256))
    with pytest.raises(FileExistsError):
        fs.copy("gs://bucket/out/weights.bin", str(tmp_path / "back.bin"))
    with pytest.raises(FileNotFoundError):
        fs.copy("gs://bucket/out/nothing", "gs://bucket/out/x")

    # rename: the checkpoint's `.partial` into place, replacing the previous one
    fs.rename("gs://bucket/out/weights.bin", "gs://bucket/out/a.txt", overwrite=True)
    assert (bucket.root_path / "out" / "a.txt").read_bytes() == b"weights"
    assert not fs.exists("gs://bucket/out/weights.bin")
    with pytest.raises(FileExistsError):
        fs.rename("gs://bucket/out/events", "gs://bucket/out/a.txt")
    assert fs.exists("gs://bucket/out/events")  # a refused rename leaves the source

    fs.remove("gs://bucket/out/events")
    assert not fs.exists("gs://bucket/out/events")
    with pytest.raises(FileNotFoundError):
        fs.remove("gs://bucket/out/events")
    fs.rmtree("gs://bucket/d")
    assert not fs.exists("gs://bucket/d") and fs.exists("gs://bucket/out/a.txt")
    with pytest.raises(FileNotFoundError):
        fs.rmtree("gs://bucket/d")


def test_a_checkpoint_bigger_than_a_multipart_upload_goes_up_resumably(bucket, tmp_path):
    """Over 8 MiB the client uploads in a resumable session (a checkpoint, a TorchScript file, a copy of one)."""
    payload = np.random.default_rng(1).integers(0, 256, (8 << 20) + 123, dtype=np.uint8).tobytes()
    before = len(bucket.calls("storage.objects.insert"))  # the fixture's folder markers
    with fs.GFile("gs://bucket/ckpt/epoch-1.partial", "wb") as f:
        for start in range(0, len(payload), 1 << 20):
            f.write(payload[start:start + (1 << 20)])
    fs.rename("gs://bucket/ckpt/epoch-1.partial", "gs://bucket/ckpt/epoch-1", overwrite=True)
    assert (bucket.root_path / "ckpt" / "epoch-1").read_bytes() == payload
    local = tmp_path / "model.pt"
    local.write_bytes(payload[::-1])
    fs.copy(str(local), "gs://bucket/model/model.pt")
    assert (bucket.root_path / "model" / "model.pt").read_bytes() == payload[::-1]
    uploads = [call for call in bucket.calls("storage.objects.insert")[before:] if call.method == "POST"]
    assert [call.arg("uploadType") for call in uploads] == ["resumable", "resumable"]
    assert fs.listdir("gs://bucket/ckpt") == ["epoch-1"]


def test_gfile_is_this_implementation_where_tensorflow_io_is_off(bucket, tmp_path):
    (tmp_path / "local" / "sub").mkdir(parents=True)
    (tmp_path / "local" / "sub" / "x").write_bytes(b"x")
    assert [(d, sorted(s), f) for d, s, f in fs.walk(str(tmp_path / "local"))] == [
        (str(tmp_path / "local"), ["sub"], []), (str(tmp_path / "local" / "sub"), [], ["x"])]  # local: os.walk
    storage.use_tensorflow_io(False)
    try:
        assert storage.gfile() is fs
        assert storage.gfile().GFile("gs://bucket/d/a.txt").read() == "first\nsecond\n"
    finally:
        storage.use_tensorflow_io(True)


def test_without_google_cloud_storage_the_error_says_what_to_do(monkeypatch):
    monkeypatch.setitem(sys.modules, "google.cloud.storage", None)  # `import` of it raises ImportError
    with pytest.raises(storage.DataError, match="gs://b/x: gs:// without TensorFlow needs google-cloud-storage"):
        fs.exists("gs://b/x")


NO_TENSORFLOW = """
import json, sys
import numpy as np
from components.dataio import data, images, records

dataset, model, keras_model, keras_local = sys.argv[1:5]
manifest = data.read_manifest(dataset)
shards = data.split_files(dataset, "test")
files = list(images.list_files("gs://bucket/photos"))
pixels = np.random.default_rng(3).integers(0, 256, (4, 28, 28, 1)).astype("uint8")
torchscript = data.load_classifier(model).predict_proba(pixels)
keras_probabilities = data.load_classifier(keras_model).predict_proba(pixels)
print(json.dumps({"tensorflow": "tensorflow" in sys.modules, "classes": manifest["class_names"], "shards": shards,
                  "files": files, "count": images.count_files("gs://bucket/photos"),
                  "first": images.read_bytes(files[0]).hex(), "torchscript": torchscript.tolist(),
                  "keras": keras_probabilities.tolist(),
                  "keras_local": data.load_classifier(keras_local).predict_proba(pixels).tolist()}))
"""


def test_a_process_without_tensorflow_reads_a_dataset_and_loads_models_from_gs(small_dataset, tmp_path,
                                                                             loopback_only):
    """As in the PyTorch image: the manifest and shards of a dataset, a folder of images, a TorchScript model (a
    registry champion's files) and a Keras model, all on gs://."""
    require_framework("torch")
    from tests.test_byo_torch import no_tensorflow_env, torchscript_model

    root = tmp_path / "gcs" / "bucket"
    shutil.copytree(small_dataset, root / "data")
    (root / "photos" / "b").mkdir(parents=True)
    (root / "photos" / "a").mkdir(parents=True)
    (root / "photos" / "b" / "2.png").write_bytes(b"\x89PNG two")
    (root / "photos" / "a" / "1.png").write_bytes(b"\x89PNG one")
    model_dir, _ = torchscript_model(root / "model")
    env = no_tensorflow_env(tmp_path)
    keras_dir = root / "keras"
    made = subprocess.run([sys.executable, "-c", f"""
import keras
from components.dataio import data
inputs = keras.Input((28, 28, 1))
model = keras.Model(inputs, keras.layers.Dense(3)(keras.layers.Flatten()(keras.layers.Rescaling(1 / 255)(inputs))))
import os; os.makedirs({str(keras_dir)!r})
model.save({str(keras_dir / "model.keras")!r})
data.write_json({str(keras_dir / "training.json")!r}, {{"class_names": ["zero", "one", "two"],
                "image_shape": [28, 28, 1], "framework": "torch", "serving_format": "keras+saved_model"}})
"""], cwd=REPO_ROOT, capture_output=True, text=True, timeout=300, env=env)
    assert made.returncode == 0, made.stderr[-3000:]
    with GcsStandIn(tmp_path / "gcs") as server:
        args = ["gs://bucket/data", "gs://bucket/model", "gs://bucket/keras", str(keras_dir)]
        out = subprocess.run([sys.executable, "-c", NO_TENSORFLOW, *args], cwd=REPO_ROOT, capture_output=True,
                             text=True, timeout=600, env={**env, "STORAGE_EMULATOR_HOST": server.url})
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["tensorflow"] is False
    assert got["classes"] == data.read_manifest(small_dataset)["class_names"]
    assert got["shards"] == [f"gs://bucket/data/{os.path.relpath(f, small_dataset)}"
                             for f in data.split_files(small_dataset, "test")]
    assert got["files"] == ["gs://bucket/photos/a/1.png", "gs://bucket/photos/b/2.png"] and got["count"] == 2
    assert bytes.fromhex(got["first"]) == b"\x89PNG one"
    pixels = np.random.default_rng(3).integers(0, 256, (4, 28, 28, 1)).astype("uint8")
    local = data.load_classifier(model_dir).predict_proba(pixels)
    np.testing.assert_allclose(got["torchscript"], local, atol=1e-6)
    np.testing.assert_allclose(got["keras"], got["keras_local"], atol=1e-6)


def test_the_pytorch_image_has_google_cloud_storage():
    """gs:// in the PyTorch image rests on google-cloud-storage (via google-cloud-aiplatform): its build imports it."""
    from tests.test_images import target

    checks = [args for kind, args in target("torch") if kind == "RUN" and "python3 -I -c" in args]
    assert checks and "google.cloud.storage" in checks[-1]
