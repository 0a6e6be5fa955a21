"""The two training inputs fed the same shards: inputs.TrainInput (tf.data, the TensorFlow path) and
portable_input.PortableTrainInput (numpy/Pillow, the torch and JAX paths), with augmentation off, give the model
the same answer: each worker the same files and records, each epoch the same examples (every example of the share
once, then the start of the same order again up to whole batches: drop_remainder on both), with the same labels,
pixels equal within the stated tolerance (raw and PNG exactly; source files decoded to shape within a level,
tests/test_portable_input.py's resize-rule test), as float32 0-255 and int32, in the same batch shapes and steps;
and the same evaluation batches, the last one partial. The orders are drawn from different random streams by
design (portable_input's docstring: "the same semantics, other permutations"), so an epoch's examples are compared
by their place in the worker's share."""

import collections
import math
import os

import numpy as np
import pytest

from components.dataio import data, pixels, records
from components.train.inputs import TrainInput, make_eval_dataset
from components.train.portable_input import PortableTrainInput, eval_batches
from components.train.recipes import Recipe
from tests.conftest import preprocessed_slice

RECIPE = Recipe(shuffle_buffer=48)  # smaller than a share: the stream's buffer shuffles only part of it


def share_examples(dataset: str, shape, files: list[str], record_shard) -> tuple[np.ndarray, np.ndarray]:
    """The worker's share, decoded in interleave order (the reference both paths are matched to)."""
    encoding = records.read_manifest(dataset).get("image_encoding", pixels.RAW)
    chosen = [r for k, r in enumerate(records.interleave(files)) if not record_shard or k % record_shard[1] ==
              record_shard[0]]
    parsed = [records.image_label(r) for r in chosen]
    images = np.stack([pixels.decode_record_image(image, shape, encoding) for image, _ in parsed])
    return images.astype(np.float32), np.array([label for _, label in parsed], np.int32)


def places(batches: np.ndarray, labels: np.ndarray, share: np.ndarray, share_labels: np.ndarray,
           canonical: np.ndarray, tolerance: tuple[float, float]) -> np.ndarray:
    """Each fed example's place in the share (the nearest, then checked: the same label, every pixel within
    tolerance[0] levels and the mean within tolerance[1]); identical images of the share count as one place."""
    flat = share.reshape(len(share), -1)
    fed = batches.reshape(len(batches), -1)
    distance = (fed ** 2).sum(1)[:, None] + (flat ** 2).sum(1)[None, :] - 2 * fed @ flat.T
    found = distance.argmin(1)
    difference = np.abs(fed - flat[found])
    assert (labels == share_labels[found]).all()
    assert difference.max() <= tolerance[0], difference.max()
    assert difference.mean() <= tolerance[1], difference.mean()
    return canonical[found]


def epoch_of(pipeline, epoch: int, steps: int, batch: int) -> tuple[list[np.ndarray], list[np.ndarray]]:
    if isinstance(pipeline, TrainInput):
        fed = list(pipeline.dataset(epoch, 0, steps, batch).as_numpy_iterator())
    else:
        fed = list(pipeline.batches(epoch, 0, steps, batch))
    return [x for x, _ in fed], [y for _, y in fed]


def check_twins(dataset: str, shape, workers: int, mode: str, batch: int, tolerance: tuple[float, float]) -> None:
    manifest = records.read_manifest(dataset)
    count = manifest["splits"]["train"]["count"]
    steps = max(1, math.ceil(count / (batch * workers)))  # loop.py's steps_per_epoch, one replica per worker
    seen = []
    for worker in range(workers):
        twins = [cls(dataset, shape, pipeline_id=worker, num_pipelines=workers, recipe=RECIPE, online_policy=None,
                     mode=mode) for cls in (TrainInput, PortableTrainInput)]
        tf_input, portable = twins
        assert (tf_input.files, tf_input.record_shard, tf_input.mode, tf_input.total_count) == (
            portable.files, portable.record_shard, portable.mode, portable.total_count)
        assert tf_input.mode == mode
        share, share_labels = share_examples(dataset, shape, portable.files, portable.record_shard)
        seen.append(len(share))
        flat = share.reshape(len(share), -1)
        canonical = np.array([next(j for j in range(len(share)) if np.array_equal(flat[i], flat[j]))
                              for i in range(len(share))])
        if mode == "memory":  # the held pixels, in the same order
            held = tf_input.images.numpy().astype(np.float32)
            assert held.shape == portable.images.shape == share.shape
            assert np.abs(held - share).max() <= tolerance[0]
            np.testing.assert_array_equal(portable.images, share)
            np.testing.assert_array_equal(tf_input.labels.numpy(), portable.labels)
        for epoch in (0, 1):
            sequences = []
            for pipeline in twins:
                images, labels = epoch_of(pipeline, epoch, steps, batch)
                assert len(images) == steps
                assert all(x.shape == (batch, *shape) and x.dtype == np.float32 for x in images)
                assert all(y.shape == (batch,) and y.dtype == np.int32 for y in labels)
                fed = np.concatenate(images)
                assert 0 <= fed.min() and fed.max() <= 255 and fed.max() > 1  # 0-255, not rescaled
                sequence = places(fed, np.concatenate(labels), share, share_labels, canonical,
                                  (0, 0) if pipeline is portable else tolerance)
                sequences.append(sequence)
                # every example of the share once, then (cycling to whole batches) the same order again
                if len(sequence) >= len(share):
                    first = sequence[:len(share)]
                    assert collections.Counter(first.tolist()) == collections.Counter(canonical.tolist())
                else:  # a larger share than its steps take: distinct examples of it
                    assert len(set(sequence.tolist())) == len(sequence)
                np.testing.assert_array_equal(sequence[len(share):], sequence[:len(sequence) - len(share)])
            tf_sequence, portable_sequence = sequences
            if len(tf_sequence) >= len(share):
                assert sorted(tf_sequence[:len(share)]) == sorted(portable_sequence[:len(share)])
        for pipeline in twins[1:]:
            pipeline.close()
    assert sum(seen) == count  # the workers' shares cover the split once


def check_eval(dataset: str, batch: int, tolerance: tuple[float, float]) -> None:
    for split in ("validation", "test"):
        theirs = list(make_eval_dataset(dataset, split, batch).as_numpy_iterator())
        ours = list(eval_batches(dataset, split, batch, workers=2))
        assert [x.shape for x, _ in theirs] == [x.shape for x, _ in ours]
        count = records.read_manifest(dataset)["splits"][split]["count"]
        if count == 0:  # a split too small to hold an image: no batch on either path
            assert theirs == ours == []
            continue
        assert len(ours) == math.ceil(count / batch) and len(ours[-1][1]) == count - batch * (len(ours) - 1)
        for (x, y), (x2, y2) in zip(theirs, ours, strict=True):
            assert x.dtype == x2.dtype == np.float32 and y.dtype == y2.dtype == np.int32
            np.testing.assert_array_equal(y, y2)
            difference = np.abs(x - x2)
            assert difference.max() <= tolerance[0] and difference.mean() <= tolerance[1]


@pytest.fixture(scope="module")
def fashion_twin(fashion_dir, tmp_path_factory) -> str:
    """300 train-source images of Fashion-MNIST (raw 28x28 records), in 2 training shards."""
    return preprocessed_slice(fashion_dir, tmp_path_factory, "twin_fashion", limit=300)


@pytest.mark.parametrize("mode", ["memory", "stream"])
@pytest.mark.parametrize("workers", [1, 2, 3])  # 3 workers of 2 shards: every 3rd record
def test_both_inputs_feed_the_same_fashion_mnist_batches(fashion_twin, mode, workers):
    assert records.read_manifest(fashion_twin).get("image_encoding", pixels.RAW) == pixels.RAW
    check_twins(fashion_twin, [28, 28, 1], workers, mode, 32, (0, 0))


def test_both_inputs_give_the_same_fashion_mnist_evaluation_batches(fashion_twin):
    check_eval(fashion_twin, 32, (0, 0))


def photo_dataset(tmp_path_factory, source: str, size: int, limit: int) -> str:
    from components import preprocess as pp

    out = str(tmp_path_factory.mktemp("twin_photos") / f"photos{size}")
    pp.preprocess(source, out, image_size=size, channels=3, workers=2, min_shards=2, limit=limit)
    # data.record_encoding: the files themselves, decoded to shape when read; raw pixels under ENCODED_MIN_SIZE
    expected = pixels.RAW if size < data.ENCODED_MIN_SIZE else pixels.SOURCE
    assert records.read_manifest(out)["image_encoding"] == expected
    return out


@pytest.mark.parametrize("size, limit, workers, mode", [(64, 12, 2, "memory"), (64, 12, 1, "stream"),
                                                        (224, 4, 2, "stream")])
def test_both_inputs_feed_the_same_food_photo_batches(food_photos, tmp_path_factory, size, limit, workers, mode):
    """The food photos (307x173 JPEG) stored as source files: decoded to shape in the input, within a level
    (test_portable_input's resize-rule test: a mean under 0.01)."""
    dataset = photo_dataset(tmp_path_factory, food_photos, size, limit)
    check_twins(dataset, [size, size, 3], workers, mode, 16, (1, 0.01))
    check_eval(dataset, 16, (1, 0.01))


def test_both_inputs_feed_the_same_camera_photo_batches(mate_photos, tmp_path_factory):
    """Debian's photographs at camera size (up to 5640x3172), in two class folders: stored as the files at 64 and
    224 px and decoded in the input, within a level, a mean under 0.15 (test_portable_input's resize-rule test);
    at 28 px decoded by preprocess and stored raw, the same pixels."""
    source = tmp_path_factory.mktemp("camera")
    for i, path in enumerate(mate_photos[:8]):
        folder = source / ("even" if i % 2 == 0 else "odd")
        folder.mkdir(exist_ok=True)
        os.symlink(path, folder / os.path.basename(path))
    for size, mode in ((64, "memory"), (224, "stream"), (28, "memory")):
        dataset = photo_dataset(tmp_path_factory, str(source), size, None)
        tolerance = (0, 0) if size < data.ENCODED_MIN_SIZE else (1, 0.15)
        check_twins(dataset, [size, size, 3], 2, mode, 2, tolerance)
