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


def test_one_class_collapse_on_small_photo_set_then_fixed(photos64, tmp_path):
    collapsed_dir, fixed_dir = str(tmp_path / "collapsed"), str(tmp_path / "fixed")
    trained(MovingAveragesOnly, photos64, collapsed_dir)
    result = trained(TrainingLoop, photos64, fixed_dir)

    collapsed = evaluate(collapsed_dir, photos64)
    assert not collapsed.blessed and "degenerate: " in collapsed.decision
    fixed = evaluate(fixed_dir, photos64)
    assert fixed.blessed, fixed.decision  # so above the majority class's share of the test images
    predicted = np.asarray(fixed.scores.confusion).sum(axis=0)
    assert (predicted > 0).sum() >= 4
    assert fixed.scores.accuracy > collapsed.scores.accuracy

    info = json.load(open(os.path.join(fixed_dir, "training.json")))
    assert info["batchnorm_recalibrated"] is True
    best = info["best_on_validation"]
    assert best["val_accuracy"] == max(info["history"]["val_accuracy"])
    assert info["exported_epoch"] == best["epoch"] == result.exported_epoch
