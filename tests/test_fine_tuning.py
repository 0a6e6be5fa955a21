"""Fine-tuning onto new classes: the backbone of a classifier trained here on other classes (any image size) under a
new head, through the training step and end to end through the local pipeline."""

import json
import os

import numpy as np
import pytest

from components.register import describe_lineage
from components.train import TrainingLoop, TrainSettings, models, train
from components.preprocess import preprocess

SHOES_AND_BAGS = ("Sandal", "Sneaker", "Bag")  # the new ones


def backbone_weights(model) -> list[np.ndarray]:
    return [np.array(w) for w in model.get_layer(models.BACKBONE).get_weights()]


@pytest.fixture(scope="module")
def clothes_model(fashion_dir, tmp_path_factory) -> str:
    """mobilenet-v3-small trained one epoch on 150 Fashion-MNIST images (10 classes) at 32x32 RGB."""
    dataset = str(tmp_path_factory.mktemp("clothes"))
    preprocess(fashion_dir, dataset, limit=150, min_shards=2, image_size=32, channels=3)
    model_dir = str(tmp_path_factory.mktemp("clothes_model"))
    train(dataset, model_dir, model="mobilenet-v3-small", epochs=1, batch_size=16, validate=False)
    return model_dir


def test_a_classifier_of_other_classes_gives_its_backbone_and_a_new_head_is_trained(clothes_model, image_folder,
                                                                                     tmp_path):
    import keras

    dataset = str(tmp_path / "shoes")
    preprocess(image_folder(per_class=20, classes=SHOES_AND_BAGS), dataset, image_size=48, channels=3)
    for source in (clothes_model, os.path.join(clothes_model, "model.keras")):  # a registered model, its file
        loop = TrainingLoop(TrainSettings(dataset, str(tmp_path / "model"), model="mobilenet-v3-small", epochs=2,
                                          batch_size=16, pretrained=source), validate=False)
        loop.prepare()
        loop.build()
        assert (loop.weights.covers, loop.freeze_epochs) == ("backbone", 1)  # phase 1 trains the new head
        assert loop.model.outputs[0].shape[-1] == 3
        saved = keras.models.load_model(os.path.join(clothes_model, "model.keras"), compile=False)
        for loaded, expected in zip(backbone_weights(loop.model), backbone_weights(saved), strict=True):
            np.testing.assert_array_equal(loaded, expected)
        lineage = loop.model_lineage()["pretrained"]
        assert lineage["loaded"] == "backbone (a new head for this data's classes)"
        assert lineage["source_model"] == {"name": "mobilenet-v3-small", "num_classes": 10, "image_shape": [32, 32, 3],
                                           "class_names": json.load(open(os.path.join(clothes_model, "training.json")))
                                           ["class_names"]}


def test_a_bare_weights_file_of_a_classifier_gives_its_backbone(clothes_model, image_folder, tmp_path):
    """A .weights.h5 with no training.json beside it: its number of classes is read from the file's last Dense."""
    import keras

    saved = keras.models.load_model(os.path.join(clothes_model, "model.keras"), compile=False)
    bare = str(tmp_path / "elsewhere" / "classifier.weights.h5")
    os.makedirs(os.path.dirname(bare))
    saved.save_weights(bare)
    dataset = str(tmp_path / "shoes")
    preprocess(image_folder(per_class=10, classes=SHOES_AND_BAGS), dataset, image_size=40, channels=1)
    result = train(dataset, str(tmp_path / "model"), model="mobilenet-v3-small", epochs=2, batch_size=16,
                   pretrained=bare, validate=False)
    info = json.load(open(os.path.join(result.model_dir, "training.json")))
    assert info["model"]["pretrained"]["source_model"] == {"num_classes": 10}
    assert info["model"]["freeze_epochs"] == 1 and info["class_names"] == sorted(SHOES_AND_BAGS)


def test_weights_of_another_network_are_still_refused(clothes_model, image_folder, tmp_path):
    dataset = str(tmp_path / "shoes")
    preprocess(image_folder(per_class=10, classes=SHOES_AND_BAGS), dataset, image_size=32, channels=3)
    with pytest.raises(models.ModelError, match=r"holds weights for model mobilenet-v3-small \(10 classes, input "
                                                r"\(32, 32, 3\)\), which do not fit model efficientnet-v2-b0"):
        train(dataset, str(tmp_path / "model"), model="efficientnet-v2-b0", epochs=1, pretrained=clothes_model)


@pytest.mark.slow
def test_a_champion_is_fine_tuned_onto_a_new_class_list_through_the_local_pipeline(image_folder, tmp_path):
    """Two local runs of the compiled pipeline: a champion of clothes, then a model of shoes and bags started
    from the champion's registered version. The second trains a new head on the champion's backbone, and its
    registered version's lineage names the champion, its classes and what was loaded."""
    from pipelines import cli

    clothes = image_folder(per_class=150, classes=("T-shirt", "Trouser"))
    os.rename(clothes, str(tmp_path / "clothes"))
    shoes = image_folder(per_class=80, classes=SHOES_AND_BAGS)
    registry = str(tmp_path / "registry")
    common = {"model": "mobilenet-v3-small", "channels": 3, "min_accuracy": 0.0, "registry_root": registry,
              "batch_size": 16}
    first = cli.run_local({**common, "data": str(tmp_path / "clothes"), "image_size": 32, "epochs": 3,
                           "model_name": "clothes"}, str(tmp_path / "first"))
    assert first["registered"]["version"] == "1" and "champion" in first["registered"]["aliases"]
    champion = os.path.join(registry, "clothes", "versions", "1")
    assert os.path.exists(os.path.join(champion, "model.keras"))

    second = cli.run_local({**common, "data": shoes, "image_size": 48, "epochs": 4, "model_name": "shoes-and-bags",
                            "pretrained": champion}, str(tmp_path / "second"))
    info = json.load(open(os.path.join(second["artifacts"]["train"]["model"], "training.json")))
    assert info["class_names"] == sorted(SHOES_AND_BAGS) and info["image_shape"] == [48, 48, 3]
    pretrained = info["model"]["pretrained"]
    assert pretrained["source"] == champion and pretrained["loaded"].startswith("backbone")
    assert pretrained["source_model"] == {"name": "mobilenet-v3-small", "class_names": ["T-shirt", "Trouser"],
                                          "image_shape": [32, 32, 3], "num_classes": 2}
    assert info["model"]["freeze_epochs"] == 2  # phase 1: the new head; phase 2: fine-tuning
    assert second["blessed"], second["decision"]
    assert second["registered"]["model"] == "shoes-and-bags"
    lineage = json.load(open(os.path.join(registry, "shoes-and-bags", "index.json")))["versions"][0]["lineage"]
    assert lineage["pretrained"] == pretrained
    assert describe_lineage(lineage).endswith(  # the registered version's description line (Vertex AI)
        "its backbone only (trained as mobilenet-v3-small on 2 classes; a new head)")
