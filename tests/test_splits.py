"""Splits stratified by class and fixed by content: each class is cut in its own order of content keys, so every
class with enough images is in validation and test, in proportion, identically across runs and runners."""

import collections
import json

import pytest

from components.dataio import data
from components.preprocess import per_image, preprocess
from components.preprocess.inputs import CONFLICTING_LABEL, DUPLICATE
from tests.test_preprocess import read_back


@pytest.mark.parametrize("n, validation, test", [(1, 0, 0), (2, 0, 0), (3, 0, 0), (4, 0, 0), (5, 1, 1), (10, 1, 1),
                                                 (15, 2, 2), (24, 2, 2), (25, 3, 3), (78, 8, 8), (1000, 100, 100)])
def test_each_class_is_cut_at_its_rounded_shares(n, validation, test):
    keys = [per_image.content_key(f"image {i}".encode()) for i in range(n)]
    cuts = per_image.class_cuts(keys, 0.1, 0.1)
    splits = collections.Counter(per_image.assign_split(k, None, cuts) for k in keys)
    assert (splits["validation"], splits["test"], splits["train"]) == (validation, test, n - validation - test)
    # the lowest keys are validation, the next ones test: the class's own hash order
    ordered = sorted(keys)
    assert [per_image.assign_split(k, None, cuts) for k in ordered] == \
        ["validation"] * validation + ["test"] * test + ["train"] * (n - validation - test)


def test_a_source_test_split_stays_and_only_validation_is_cut_from_the_rest():
    keys = [per_image.content_key(f"image {i}".encode()) for i in range(20)]
    cuts = per_image.split_cuts([(0, k, "train") for k in keys] + [(0, 7, "test")], 0.1, 0.1)
    assert collections.Counter(per_image.assign_split(k, "train", cuts[0]) for k in keys) == \
        {"validation": 2, "train": 18}
    assert per_image.assign_split(7, "test", cuts[0]) == "test"
    assert per_image.class_cuts([], 0.1, 0.1) == per_image.NO_CUTS


def test_every_class_of_a_small_set_is_in_validation_and_test_identically_across_runs(image_folder, tmp_path):
    source = image_folder(per_class=24, classes=("Sandal", "Sneaker", "Bag", "T-shirt", "Trouser"))
    for run in ("first", "second"):
        preprocess(source, str(tmp_path / run), workers=1)
    manifest = data.read_manifest(str(tmp_path / "first"))
    for split, per_class in (("validation", 2), ("test", 2), ("train", 20)):
        assert manifest["splits"][split]["class_counts"] == {str(c): per_class for c in range(5)}
    first, second = read_back(str(tmp_path / "first")), read_back(str(tmp_path / "second"))
    assert {s: sorted(rows) for s, rows in first.items()} == {s: sorted(rows) for s, rows in second.items()}


def test_the_food_photos_test_split_measures_every_class(food_photos, tmp_path):
    """The content-hash split without strata put 1 test image in each of 6 of these 12 classes."""
    out = str(tmp_path / "photos")
    preprocess(food_photos, out, image_size=32, channels=3)
    manifest = data.read_manifest(out)
    kept = collections.Counter()
    for info in manifest["splits"].values():
        kept.update({int(c): n for c, n in info["class_counts"].items()})
    for split in ("validation", "test"):
        counts = {int(c): n for c, n in manifest["splits"][split]["class_counts"].items()}
        for label, n in kept.items():
            assert counts.get(label, 0) == int(n * 0.1 + 0.5), (split, manifest["class_names"][label], n)
    assert all(counts.get(label, 0) >= 1 for label, n in kept.items() if n >= 5)  # every class of 5 or more
    rejected = [json.loads(line) for line in open(f"{out}/{data.REJECTED}")]
    assert rejected and {r["reason"] for r in rejected} <= {DUPLICATE, CONFLICTING_LABEL}  # 79 shared photos
    assert all(" split" in r["detail"] for r in rejected)  # the split of the copy that was kept
