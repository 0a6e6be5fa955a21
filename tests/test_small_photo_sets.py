"""Small photo sets train to a working model: on 491 real food photos (12 classes), mobilenet-v3-small from scratch
collapses onto one class when the BatchNormalization statistics are the moving averages a short run leaves; with
them re-estimated (components/train/batchnorm.py) and the best epoch on validation exported, it does not, and the
gate tells the two apart."""

import json
import os

import numpy as np
import pytest

from components.evaluate import evaluate
from components.preprocess import preprocess
from components.train import TrainingLoop, TrainSettings

pytestmark = pytest.mark.slow


class MovingAveragesOnly(TrainingLoop):
    """The training loop as it was: the statistics are the moving averages training leaves behind."""

    def recalibrate_batchnorm(self) -> None:
        pass


@pytest.fixture(scope="module")
def photos64(food_photos, tmp_path_factory) -> str:
    out = str(tmp_path_factory.mktemp("photos64"))
    preprocess(food_photos, out, image_size=64, channels=3)
    return out


def trained(loop_class, dataset: str, model_dir: str):
    settings = TrainSettings(dataset, model_dir, model="mobilenet-v3-small", epochs=10, batch_size=128)
    return loop_class(settings).run()


def collapse(scores) -> str | None:
    """How the model's test predictions collapse, or None: one class answers for most of the test images, or it is
    right on one class at most (it does not tell classes apart)."""
    matrix = np.asarray(scores.confusion)
    predicted = matrix.sum(axis=0)
    if predicted.max() >= matrix.sum() / 2:
        return f"one class answers for {predicted.max()} of {matrix.sum()} test images: {predicted.tolist()}"
    if (np.diag(matrix) > 0).sum() < 2:
        return f"right on {(np.diag(matrix) > 0).sum()} class(es) only: {matrix.tolist()}"
    return None


def test_one_class_collapse_on_small_photo_set_then_fixed(photos64, tmp_path):
    collapsed_dir, fixed_dir = str(tmp_path / "collapsed"), str(tmp_path / "fixed")
    trained(MovingAveragesOnly, photos64, collapsed_dir)
    result = trained(TrainingLoop, photos64, fixed_dir)

    collapsed = evaluate(collapsed_dir, photos64)
    assert not collapsed.blessed and "degenerate: " in collapsed.decision
    fixed = evaluate(fixed_dir, photos64)
    assert fixed.blessed, fixed.decision  # so above the majority class's share of the test images
    # Not collapsed, rather than a count of classes predicted, which float round-off decides: training is seeded and
    # repeats exactly on one machine, but the 41 validation photos (one is 0.024) pick an early epoch of a model that
    # then overfits. On a Xeon with AVX-512 it is epoch 2 of 10 (tied with 3 at 0.415, lower loss): 3 classes
    # predicted (17, 13 and 11 of the 41 test photos), right on all 3, accuracy 0.366 (the majority share 0.220);
    # with TF_ENABLE_ONEDNN_OPTS=0 on the same machine, epoch 3: 5 classes, accuracy 0.317. The collapsed model
    # answers one class for all 41.
    assert collapse(collapsed.scores) and collapse(fixed.scores) is None, collapse(fixed.scores)
    assert fixed.scores.accuracy > collapsed.scores.accuracy

    info = json.load(open(os.path.join(fixed_dir, "training.json")))
    assert info["batchnorm_recalibrated"] is True
    best = info["best_on_validation"]
    assert best["val_accuracy"] == max(info["history"]["val_accuracy"])
    assert info["exported_epoch"] == best["epoch"] == result.exported_epoch
