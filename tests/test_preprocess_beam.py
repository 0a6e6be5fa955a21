"""The Apache Beam runner of preprocess gives the same dataset as the in-process one: same records per split, same
rejects, same manifest figures and card. Beam runs in process (FnApiRunner): no binaries, no network."""

import os
import shutil

import pytest

from tests.conftest import require_framework

require_framework("apache_beam")

from components.dataio import data  # noqa: E402
from components import preprocess as pp  # noqa: E402
from tests.test_data import encoded  # noqa: E402
from tests.test_preprocess import bad_files, odd_but_good, read_back, write  # noqa: E402


def records_by_split(dataset_dir: str) -> dict[str, set]:
    return {split: set(rows) for split, rows in read_back(dataset_dir).items()}


def comparable_manifest(dataset_dir: str) -> dict:
    manifest = data.read_manifest(dataset_dir)
    for info in manifest["splits"].values():
        info.pop("num_shards")  # Beam may spread a split over its shards differently
    return manifest


@pytest.fixture
def tree_with_duplicates(image_folder, fashion_arrays):
    """Good PNGs, every kind of bad file, and duplicates: the same bytes twice in a class, and in two classes."""
    root = image_folder(per_class=20)
    odd_but_good(root, fashion_arrays[0])
    bad_files(root)
    bag = sorted(os.listdir(os.path.join(root, "Bag")))
    shutil.copy(os.path.join(root, "Bag", "0000.png" if "0000.png" in bag else bag[0]),
                os.path.join(root, "Bag", "zz-copy.png"))
    sneaker = sorted(f for f in os.listdir(os.path.join(root, "Sneaker")) if f.endswith(".png"))
    shutil.copy(os.path.join(root, "Sneaker", sneaker[0]), os.path.join(root, "Sandal", "zz-relabelled.png"))
    return root


def test_beam_and_local_runners_give_the_same_dataset(tree_with_duplicates, tmp_path):
    root = tree_with_duplicates
    local = pp.preprocess(root, str(tmp_path / "local"), workers=1, min_shards=2)
    beam = pp.preprocess(root, str(tmp_path / "beam"), min_shards=2, runner="beam")
    assert local.counts == beam.counts and local.class_names == beam.class_names
    assert local.rejected_by_reason == beam.rejected_by_reason
    assert local.rejected_by_reason[pp.DUPLICATE] >= 1 and local.rejected_by_reason[pp.CONFLICTING_LABEL] >= 1
    assert records_by_split(str(tmp_path / "local")) == records_by_split(str(tmp_path / "beam"))
    # Every reject, with its reason and detail, in the same (input) order.
    local_rejects = list(data.iter_jsonl(str(tmp_path / "local" / data.REJECTED)))
    assert local_rejects == list(data.iter_jsonl(str(tmp_path / "beam" / data.REJECTED)))
    assert comparable_manifest(str(tmp_path / "local")) == comparable_manifest(str(tmp_path / "beam"))
    for split in data.SPLITS:  # at least min_shards per split, none empty, none left over from the work folder
        files = data.split_files(str(tmp_path / "beam"), split)
        assert len(files) >= 2 and all(os.path.getsize(f) > 0 for f in files)
    assert sorted(os.listdir(tmp_path / "beam")) == sorted(os.listdir(tmp_path / "local"))
    with open(tmp_path / "local" / pp.SAMPLES_FILE, "rb") as a, open(tmp_path / "beam" / pp.SAMPLES_FILE, "rb") as b:
        assert a.read() == b.read()
    assert pp.dataset_card(str(tmp_path / "local")) == pp.dataset_card(str(tmp_path / "beam")).replace(
        str(tmp_path / "beam"), str(tmp_path / "local"))


def test_beam_runner_on_a_manifest_with_a_test_split_catches_leaks(fashion_arrays, tmp_path):
    images, labels = fashion_arrays
    rows = []
    for i in range(24):
        path = write(tmp_path / "imgs" / f"{i:03d}.png", encoded(images[i], "PNG"))
        rows.append(f"{'test' if i < 6 else 'training'},{path},{labels[i]}")
    rows.append(f"training,{tmp_path / 'imgs' / '000.png'},{labels[0]}")  # a test image copied into training
    (tmp_path / "import.csv").write_text("\n".join(rows) + "\n")
    local = pp.preprocess(str(tmp_path / "import.csv"), str(tmp_path / "local"), workers=1)
    beam = pp.preprocess(str(tmp_path / "import.csv"), str(tmp_path / "beam"), runner="beam")
    assert local.counts == beam.counts and local.counts["test"] == 6
    assert beam.rejected_by_reason == {pp.DUPLICATE: 1}
    assert records_by_split(str(tmp_path / "local")) == records_by_split(str(tmp_path / "beam"))


def test_beam_runner_writes_encoded_records_for_large_images(image_folder, tmp_path):
    root = image_folder(per_class=4)
    local = pp.preprocess(root, str(tmp_path / "local"), image_size=64, channels=3, workers=1, min_shards=1)
    beam = pp.preprocess(root, str(tmp_path / "beam"), image_size=64, channels=3, min_shards=1, runner="beam")
    manifest = data.read_manifest(str(tmp_path / "beam"))
    assert manifest["image_encoding"] == data.SOURCE
    assert manifest["source_files"] == data.read_manifest(str(tmp_path / "local"))["source_files"]
    assert manifest["source_files"]["count"] == sum(beam.counts.values())
    assert local.counts == beam.counts
    assert records_by_split(str(tmp_path / "local")) == records_by_split(str(tmp_path / "beam"))


def test_beam_runner_refuses_array_sources(fashion_dir, tmp_path):
    with pytest.raises(data.DataError, match="preprocess_runner=local"):
        pp.preprocess(fashion_dir, str(tmp_path / "out"), limit=50, runner="beam")
