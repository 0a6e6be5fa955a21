"""Near-copies across the split: a group of images that differ in a few pixels (re-saves, marks, edits) lands in
one split, in every preprocess path; the card, the console, the evaluation's decision and the run page say what
was grouped, and warn where a source's own test split still shares a group with training."""

import collections
import html

import numpy as np
import pytest

from components.dataio import data
from components import preprocess as pp
from components.preprocess import per_image
from tests.test_data import encoded
from tests.test_preprocess import read_back, write

COPIES = 12  # near-copies of each image besides itself
CORNERS = ((0, 0), (0, -1), (-1, 0), (-1, -1))


def near_copy(image: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """The image with two of its corner pixels set to random values."""
    copy = image.copy()
    for corner in rng.choice(len(CORNERS), 2, replace=False):
        copy[CORNERS[corner]] = rng.integers(0, 256)
    return copy


def distinct_images(images: np.ndarray, labels: np.ndarray, count: int):
    """The first `count` images whose near keys no other one of them shares (Fashion-MNIST holds a few near-copies
    of its own), with their labels."""
    keys = data.near_keys(images[..., None]).tolist()
    seen = collections.Counter(keys)
    chosen = [i for i in range(len(images)) if seen[keys[i]] == 1][:count]
    return images[chosen], labels[chosen]


@pytest.fixture(scope="module")
def near_copy_tree(fashion_arrays, tmp_path_factory):
    """A class-per-folder tree where every image comes with COPIES near-copies (two corner pixels changed), all in
    the image's class, under unrelated file names: (root, uri -> the index of the image it copies)."""
    images, labels = distinct_images(*fashion_arrays, count=120)
    rng = np.random.default_rng(7)
    root = tmp_path_factory.mktemp("near-copies")
    origin = {}
    names = rng.permutation(len(images) * (COPIES + 1))
    position = 0
    for index, (image, label) in enumerate(zip(images, labels)):
        for copy in range(COPIES + 1):
            pixels = image if copy == 0 else near_copy(image, rng)
            path = write(root / data.FASHION_MNIST_CLASSES[label].replace("/", "-") / f"{names[position]:05d}.png",
                         encoded(pixels, "PNG"))
            origin[path] = index
            position += 1
    return str(root), origin


def splits_of(dataset_dir: str, origin: dict) -> dict[str, set]:
    """The originals whose copies each split holds."""
    return {split: {origin[uri] for uri, _, _ in rows} for split, rows in read_back(dataset_dir).items()}


def test_near_copies_never_straddle_the_split_and_the_card_says_how_many(near_copy_tree, tmp_path, caplog):
    root, origin = near_copy_tree
    caplog.set_level("INFO", logger="components.preprocess.step")
    result = pp.preprocess(root, str(tmp_path / "out"), workers=1)
    held = splits_of(str(tmp_path / "out"), origin)
    assert held["test"] and held["validation"] and held["train"]
    assert not held["test"] & (held["train"] | held["validation"])  # no near-copy of a test image in training
    assert not held["validation"] & held["train"]
    assert sum(result.counts.values()) == 120 * (COPIES + 1) and result.rejected == 0  # none dropped as a duplicate
    near = data.read_manifest(str(tmp_path / "out"))["near_duplicates"]
    assert (near["groups"], near["images"], near["test_groups_shared"], near["warning"]) == (
        120, 120 * (COPIES + 1), 0, "")
    line = f"near-duplicates: {120 * (COPIES + 1)} images in 120 groups of near-copies, each group split as one"
    assert any(line in message for message in caplog.messages)
    card = pp.dataset_card(str(tmp_path / "out"))
    assert f"Near-duplicates: {120 * (COPIES + 1)} images in 120 groups" in card and "Warning" not in card
    # Whole groups, so the test share is still about a tenth of the images (10 to 14 of the 120 groups)
    assert 10 * (COPIES + 1) <= result.counts["test"] <= 14 * (COPIES + 1)


def test_the_beam_runner_groups_the_same_way(near_copy_tree, tmp_path):
    root, origin = near_copy_tree
    local = pp.preprocess(root, str(tmp_path / "local"), workers=1)
    beam = pp.preprocess(root, str(tmp_path / "beam"), runner="beam")
    assert local.counts == beam.counts
    assert local.near_duplicates == beam.near_duplicates
    assert {s: {uri for uri, _, _ in rows} for s, rows in read_back(str(tmp_path / "local")).items()} == \
        {s: {uri for uri, _, _ in rows} for s, rows in read_back(str(tmp_path / "beam")).items()}


def test_images_without_near_copies_keep_the_split_of_their_own_bytes(image_folder, tmp_path):
    """Split stability: grouping moves only members of a group; every other image stays where its content key
    puts it, as before near-copies were grouped."""
    root = image_folder(per_class=40)
    pp.preprocess(root, str(tmp_path / "out"), workers=1)
    manifest = data.read_manifest(str(tmp_path / "out"))
    assert manifest["near_duplicates"]["groups"] == 0
    stored = read_back(str(tmp_path / "out"))
    kept = [(per_image.content_key(open(uri, "rb").read()), label, split)
            for split, rows in stored.items() for uri, label, _ in rows]
    cuts = per_image.split_cuts(((label, key, None) for key, label, _ in kept), 0.1, 0.1)
    assert all(per_image.assign_split(key, None, cuts[label]) == split for key, label, split in kept)


def test_a_group_is_split_by_its_lowest_content_key_and_counted_where_it_straddles():
    assert per_image.near_group_key([30, 10, 20]) == per_image.near_group_key(iter([20, 30, 10])) == 10
    # One group of three, kept whole: counted, no straddle; a source's own test image with two training copies
    assert per_image.near_group_summary(["test", "test", "test"]) == (1, 3, 0, 0)
    assert per_image.near_group_summary(["train", "test", "validation"]) == (1, 3, 1, 1)
    # Cuts over group keys keep a class's fractions of images: groups of 13 at the lowest of their keys
    rng = np.random.default_rng(0)
    keys = [per_image.near_group_key(rng.integers(0, 2 ** 63, 13).tolist()) for _ in range(200)]
    cuts = per_image.split_cuts(((0, key, None) for key in keys for _ in range(13)), 0.1, 0.1)[0]
    splits = collections.Counter(per_image.assign_split(key, None, cuts) for key in keys)
    assert 18 <= splits["validation"] <= 22 and 18 <= splits["test"] <= 22


def test_near_keys_match_near_copies_and_are_the_same_for_one_and_many(fashion_arrays):
    images = fashion_arrays[0][:300, ..., None]
    rng = np.random.default_rng(3)
    copies = np.stack([near_copy(image[..., 0], rng)[..., None] for image in images])
    assert (data.near_keys(copies) == data.near_keys(images)).all()
    assert data.near_key(images[5]) == int(data.near_keys(images)[5])
    assert data.near_keys(np.repeat(images[:20], 3, axis=-1)).tolist() == data.near_keys(images[:20]).tolist()
    # A different image is another key (Fashion-MNIST's own near-copies aside: a handful in 2,000)
    keys = data.near_keys(fashion_arrays[0][..., None]).tolist()
    assert len(set(keys)) >= 0.99 * len(keys)


@pytest.fixture(scope="module")
def leaky_manifest(fashion_arrays, tmp_path_factory):
    """A Vertex AI import CSV whose own test split's images have near-copies in its training rows."""
    images, labels = distinct_images(*fashion_arrays, count=300)
    rng = np.random.default_rng(11)
    root = tmp_path_factory.mktemp("leaky")
    rows = []
    for i, (image, label) in enumerate(zip(images, labels)):
        path = write(root / "imgs" / f"{i:04d}.png", encoded(image, "PNG"))
        rows.append(f"{'test' if i < 60 else 'training'},{path},{label}")
        if i < 5:  # five test images copied, two pixels changed, into training
            rows.append(f"training,{write(root / 'imgs' / f'copy-{i}.png', encoded(near_copy(image, rng), 'PNG'))},"
                        f"{label}")
    (root / "import.csv").write_text("\n".join(rows) + "\n")
    return str(root / "import.csv")


def test_a_source_test_split_that_shares_groups_with_training_is_warned_about(leaky_manifest, tiny_model, tmp_path):
    from components.evaluate import evaluate

    out = str(tmp_path / "out")
    result = pp.preprocess(leaky_manifest, out, workers=1)
    assert result.counts["test"] == 60
    near = result.near_duplicates
    assert (near["groups"], near["test_groups_shared"], near["test_images_shared"]) == (5, 5, 5)
    warning = ("5 of 60 test images (8.3%) have near-copies in training or validation (5 groups not kept in one "
               "split: the source's own test split, or copies labelled as different classes): the test accuracy may "
               "be overstated, by up to 8.3 points")
    assert near["warning"] == warning
    assert f"<strong>Warning:</strong> {html.escape(warning)}" in pp.dataset_card(out)
    evaluation = evaluate(tiny_model, out)
    assert evaluation.decision.endswith(f" (warning: {warning})") and f"warning: {warning}" in evaluation.reasons
    beam = pp.preprocess(leaky_manifest, str(tmp_path / "beam"), runner="beam")
    assert beam.near_duplicates == near
