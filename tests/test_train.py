"""Training: outputs, recipes, settings, learning-rate schedule, strategy, input pipeline, NaN stop, exit codes."""

import dataclasses
import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest

from components import train
from components.dataio import data
from components.train.cluster import ClusterRole, choose_strategy, cluster_role
from components.train.inputs import TrainInput
from components.train.learning_rate import keras_schedule, learning_rate_for
from components.train.model import check_gpus_visible, precision_for, resolve_jit

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# ---------------------------------------------------------------------------------------------- outputs


def test_outputs_keras_savedmodel_and_training_json(tiny_model, small_dataset):
    import keras
    import tensorflow as tf

    assert os.path.exists(os.path.join(tiny_model, "model.keras"))
    assert os.path.exists(os.path.join(tiny_model, "saved_model", "saved_model.pb"))
    with open(os.path.join(tiny_model, train.TRAINING_INFO)) as f:
        info = json.load(f)
    manifest = data.read_manifest(small_dataset)
    assert info["class_names"] == manifest["class_names"] and info["image_shape"] == manifest["image_shape"]
    assert info["recipe"] == train.DEFAULT_RECIPE and info["epochs"] == 2
    assert info["steps"] == 2 * info["steps_per_epoch"]
    assert info["steps_per_epoch"] == math.ceil(manifest["splits"]["train"]["count"] / info["global_batch_size"])
    for name in ("loss", "accuracy", "val_loss", "val_accuracy", "learning_rate"):
        assert len(info["history"][name]) == 2
    assert info["history"]["val_accuracy"][-1] > 0.5  # well above chance (0.1) after two epochs
    assert info["strategy"] == "DefaultStrategy" and info["replicas"] == 1 and info["workers"] == 1

    images, labels = data.load_split_arrays(small_dataset, "test", limit=200)
    keras_model = keras.models.load_model(os.path.join(tiny_model, "model.keras"))
    assert all(w.dtype == "float32" for w in keras_model.weights)  # exported in float32 whatever training used
    served = tf.saved_model.load(os.path.join(tiny_model, "saved_model")).signatures["serving_default"]
    probabilities = list(served(tf.constant(images, tf.float32)).values())[0].numpy()
    np.testing.assert_allclose(probabilities.sum(axis=1), 1.0, rtol=1e-4)
    logits = keras_model(images.astype("float32")).numpy()
    assert (logits.argmax(1) == probabilities.argmax(1)).mean() > 0.99
    assert (probabilities.argmax(1) == labels).mean() > 0.5


# ---------------------------------------------------------------------------------------------- recipes


def test_reference_recipe_is_the_classic_one():
    reference = train.RECIPES["reference"]
    assert reference.epochs == 12 and reference.batch_size == 64 and reference.learning_rate == 1e-3
    assert reference.lr_schedule == "steps" and reference.lr_steps == ((0, 1.0), (3, 0.1), (7, 0.01))
    assert reference.shuffle_buffer == 10_000 and reference.steps_per_execution == 1


def test_reference_learning_rate_steps_at_epochs_3_and_7():
    rates = [learning_rate_for(epoch, train.RECIPES["reference"]) for epoch in range(12)]
    assert rates == pytest.approx([1e-3] * 3 + [1e-4] * 4 + [1e-5] * 5)


def test_schedule_on_steps_matches_the_epoch_rule():
    for name in ("reference", "fast"):
        for replicas in (1, 4):
            recipe = train.RECIPES[name]
            schedule = keras_schedule(recipe, replicas, steps_per_epoch=10)
            for step in range(0, recipe.epochs * 10, 3):
                expected = learning_rate_for(step / 10, recipe, replicas)
                assert float(schedule(step)) == pytest.approx(expected, rel=1e-5, abs=1e-9), (name, replicas, step)


def test_learning_rate_scales_with_replicas_after_a_warm_up():
    reference = train.RECIPES["reference"]
    assert learning_rate_for(0.0, reference, 4) == pytest.approx(1e-3)  # warm-up starts at one replica's
    assert learning_rate_for(0.5, reference, 4) == pytest.approx(2.5e-3)
    assert learning_rate_for(1.0, reference, 4) == pytest.approx(4e-3)
    assert learning_rate_for(3.0, reference, 4) == pytest.approx(4e-4)
    unscaled = train.resolve_recipe("reference", scale_lr=False)
    assert [learning_rate_for(e, unscaled, 4) for e in (0, 1, 3)] == pytest.approx([1e-3, 1e-3, 1e-4])


def test_recipe_overrides_are_validated():
    assert train.resolve_recipe("fast", epochs=3, batch_size=None).epochs == 3
    with pytest.raises(ValueError, match="Unknown recipe 'quick'"):
        train.resolve_recipe("quick")
    with pytest.raises(ValueError, match="epochs must be >= 1"):
        train.resolve_recipe("fast", epochs=0)
    with pytest.raises(ValueError, match="precision"):
        train.resolve_recipe("fast", precision="fp8")


@pytest.mark.slow
def test_reference_recipe_run_steps_the_rate_at_epochs_3_and_7(small_dataset, tmp_path):
    result = train.train(small_dataset, str(tmp_path / "model"), recipe="reference", epochs=8, validate=False)
    assert result.history["learning_rate"] == pytest.approx([1e-3] * 3 + [1e-4] * 4 + [1e-5])
    assert result.global_batch_size == 64 and result.steps == 8 * result.steps_per_epoch


# ---------------------------------------------------------------------------------------------- settings


FULL_SETTINGS = dict(augmented_dir="gs://b/augmented", recipe="reference", epochs=3, batch_size=32,
                     learning_rate=1e-38, scale_lr=False, steps_per_execution=4, precision="mixed_bfloat16",
                     jit_compile="off", seed=7, backup_dir="gs://b/checkpoints/run-1/train", checkpoint_seconds=30.5,
                     input_mode="stream", tensorboard_dir="gs://b/tensorboard", model="my_models.vision:build",
                     pretrained="gs://b/champion", freeze_epochs=1, fine_tune_layers=20, fine_tune_lr_factor=0.05)


@pytest.mark.parametrize("given", [{}, FULL_SETTINGS, {"scale_lr": True, "learning_rate": 0.002}],
                         ids=["defaults", "every-field", "scale-lr"])
def test_settings_round_trip_through_the_training_cli(given):
    """What a launcher puts in a replica's command is read back by the replica as the same settings."""
    settings = train.TrainSettings("gs://b/dataset", "gs://b/model", **given)
    argv = settings.to_argv()
    assert train.TrainSettings.from_args(train.build_parser().parse_args(argv)) == settings
    assert settings.command()[:3] == ["python", "-m", "components.train"] and settings.command()[3:] == argv


def test_settings_are_the_training_clis_options():
    """Every option of the CLI is a settings field and back, so a new setting cannot miss the launchers."""
    parsed = train.build_parser().parse_args(["--dataset-dir", "d", "--model-dir", "m"])
    assert set(vars(parsed)) == {field.name for field in dataclasses.fields(train.TrainSettings)}
    assert train.TrainSettings.from_args(parsed) == train.TrainSettings("d", "m")
    assert train.TrainSettings("d", "m").to_argv() == ["--dataset-dir", "d", "--model-dir", "m", "--framework",
                                                      "tensorflow", "--recipe", train.DEFAULT_RECIPE, "--model", "reference-cnn",
                                                      "--pretrained", "none", "--fine-tune-layers", "0",
                                                      "--checkpoint-seconds", "120.0", "--input-mode", "auto"]
    assert "--no-scale-lr" in train.TrainSettings("d", "m", scale_lr=False).to_argv()


def test_settings_from_pipeline_parameters_read_zero_as_the_recipes_value():
    settings = train.TrainSettings.from_pipeline("d", "m", recipe="reference", epochs=0, batch_size=16,
                                                 learning_rate=0.0, augmented_dir="", backup_dir="b")
    assert (settings.epochs, settings.batch_size, settings.learning_rate) == (None, 16, None)
    assert settings.augmented_dir is None and settings.backup_dir == "b"
    recipe = settings.resolve_recipe()
    assert recipe.epochs == train.RECIPES["reference"].epochs and recipe.batch_size == 16
    with pytest.raises(ValueError, match="epochs must be >= 1"):
        train.TrainSettings("d", "m", epochs=0).resolve_recipe()  # 0 is unset only for pipeline parameters
    tuned = train.TrainSettings.from_pipeline("d", "m", freeze_epochs=-1, fine_tune_lr_factor=0.0)
    assert (tuned.freeze_epochs, tuned.fine_tune_lr_factor) == (None, None)  # the recipe's
    assert tuned.resolve_recipe().fine_tune_lr_factor == 0.1
    assert train.TrainSettings.from_pipeline("d", "m", freeze_epochs=0, fine_tune_lr_factor=0.5).freeze_epochs == 0


# ---------------------------------------------------------------------------------------------- strategy


def test_cluster_roles_from_tf_config():
    def role(cluster, task_type, index):
        return cluster_role(json.dumps({"cluster": cluster, "task": {"type": task_type, "index": index}}))

    assert cluster_role(None) == ClusterRole(1, True, "local")
    two_workers = {"worker": ["a:1", "b:2"]}
    assert role(two_workers, "worker", 0) == ClusterRole(2, True, "worker/0")
    assert role(two_workers, "worker", 1).is_chief is False
    with_chief = {"chief": ["c:0"], "worker": ["a:1", "b:2"]}
    assert role(with_chief, "chief", 0) == ClusterRole(3, True, "chief/0")
    assert role(with_chief, "worker", 0).is_chief is False
    with pytest.raises(ValueError, match="'ps' is not supported"):
        role({"worker": ["a:1"], "ps": ["p:1"], "chief": ["c:1"]}, "ps", 0)


def test_one_worker_tf_config_uses_the_default_strategy():
    import tensorflow as tf

    strategy = choose_strategy(json.dumps({"cluster": {"worker": ["127.0.0.1:1"]},
                                           "task": {"type": "worker", "index": 0}}))
    assert strategy is tf.distribute.get_strategy()


def test_precision_and_xla_choices():
    assert precision_for("float32", (9, 0)) == "float32"
    assert precision_for("auto", None) == "float32"  # a CPU, or a framework slower in bf16 on it
    assert precision_for("auto", None, cpu_bf16=True) == "mixed_bfloat16"  # TensorFlow on a native-bf16 CPU
    assert precision_for("auto", (7, 5), cpu_bf16=True) == "mixed_float16"  # a GPU: its capability decides
    assert precision_for("mixed_bfloat16", None) == "mixed_bfloat16"  # asked for: honoured on a CPU too
    assert [precision_for("auto", c) for c in ((6, 1), (7, 0), (7, 5), (8, 0), (8, 9), (9, 0), (10, 0))] == \
        ["float32"] + ["mixed_float16"] * 2 + ["mixed_bfloat16"] * 4
    assert resolve_jit("auto", []) is False and resolve_jit("auto", ["gpu"]) is True
    assert resolve_jit("off", ["gpu"]) is False


# ---------------------------------------------------------------------------------------------- input


@pytest.mark.parametrize("mode", ["memory", "stream"])
def test_input_resumes_on_the_same_batches(small_dataset, mode):
    """Batches k.. of an epoch are the same whether the epoch started at 0 or at k (mid-epoch resume)."""
    manifest = data.read_manifest(small_dataset)
    pipeline = TrainInput(small_dataset, manifest["image_shape"], pipeline_id=0, num_pipelines=1,
                          recipe=train.RECIPES["fast"], online_policy=None, mode=mode)
    whole = [y.numpy() for _, y in pipeline.dataset(epoch=2, first_batch=0, num_batches=8, batch=32)]
    tail = [y.numpy() for _, y in pipeline.dataset(epoch=2, first_batch=5, num_batches=3, batch=32)]
    assert len(whole) == 8 and all(len(b) == 32 for b in whole)
    for a, b in zip(whole[5:], tail):
        np.testing.assert_array_equal(a, b)
    other_epoch = [y.numpy() for _, y in pipeline.dataset(epoch=3, first_batch=0, num_batches=8, batch=32)]
    assert any((a != b).any() for a, b in zip(whole, other_epoch))  # reshuffled every epoch


def test_online_augmentation_in_memory_input(small_dataset):
    """Online augmentation changes the images, not the labels, the same way on every call (resumable)."""
    manifest = data.read_manifest(small_dataset)
    policy = {"rotation_degrees": 15, "shift_fraction": 0.1, "seed": 3}

    def first_batch(online_policy):
        pipeline = TrainInput(small_dataset, manifest["image_shape"], pipeline_id=0, num_pipelines=1,
                              recipe=train.RECIPES["fast"], online_policy=online_policy, mode="memory")
        images, labels = next(iter(pipeline.dataset(epoch=1, first_batch=0, num_batches=1, batch=16)))
        return images.numpy(), labels.numpy()

    plain, augmented, again = first_batch(None), first_batch(policy), first_batch(policy)
    np.testing.assert_array_equal(plain[1], augmented[1])
    assert np.abs(plain[0] - augmented[0]).mean() > 5  # pixel values 0-255
    np.testing.assert_array_equal(augmented[0], again[0])


def test_workers_read_disjoint_shards(small_dataset):
    manifest = data.read_manifest(small_dataset)
    shares = [TrainInput(small_dataset, manifest["image_shape"], pipeline_id=i, num_pipelines=2,
                         recipe=train.RECIPES["fast"], online_policy=None, mode="memory") for i in range(2)]
    files = [set(s.files) for s in shares]
    assert files[0].isdisjoint(files[1]) and len(files[0]) == len(files[1]) == 1
    assert sum(int(s.labels.shape[0]) for s in shares) == manifest["splits"]["train"]["count"]


# ---------------------------------------------------------------------------------------------- failures


def test_nan_loss_stops_training_naming_epoch_and_step(small_dataset, tmp_path):
    """A learning rate of 1e38 overflows the weights at the first update: the next loss is NaN or inf."""
    model_dir, backup_dir = tmp_path / "model", tmp_path / "backup"
    args = ["--dataset-dir", small_dataset, "--model-dir", str(model_dir), "--backup-dir", str(backup_dir),
            "--epochs", "2", "--learning-rate", "1e38", "--steps-per-execution", "1"]
    done = subprocess.run([sys.executable, "-m", "components.train", *args], cwd=REPO_ROOT, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == train.EXIT_PERMANENT, done.stderr
    assert "Loss became" in done.stderr and "at epoch 1, step " in done.stderr
    assert not (model_dir / "model.keras").exists()  # nothing for evaluation to pick up
    with open(backup_dir / train.FAILED_MARKER) as f:
        assert "NonFiniteLossError" in json.load(f)["error"]
    # A retry of the task (same backup dir) fails at once with the reason, without training again.
    retried = subprocess.run([sys.executable, "-m", "components.train", *args], cwd=REPO_ROOT, capture_output=True,
                             text=True, timeout=300)
    assert retried.returncode == train.EXIT_PERMANENT
    assert "failed permanently" in retried.stderr and "Loss became" in retried.stderr
    assert "starting at step" not in retried.stderr


def test_bad_input_is_a_permanent_error(tmp_path):
    code = train.main(["--dataset-dir", str(tmp_path), "--model-dir", str(tmp_path / "m"),
                       "--backup-dir", str(tmp_path / "b")])
    assert code == train.EXIT_PERMANENT
    assert (tmp_path / "b" / train.FAILED_MARKER).exists()


def test_exit_codes_tell_retryable_from_permanent():
    assert train.EXIT_RETRY in train.RETRYABLE_EXIT_CODES and train.EXIT_KILLED in train.RETRYABLE_EXIT_CODES
    assert train.EXIT_PERMANENT not in train.RETRYABLE_EXIT_CODES and train.EXIT_BUG not in train.RETRYABLE_EXIT_CODES


def test_backup_dir_is_keyed_by_run_and_task():
    a = train.backup_dir_for("", "gs://bucket/root", "run-1", "train-op")
    assert a == "gs://bucket/root/checkpoints/run-1/train-op"
    assert train.backup_dir_for("", "gs://bucket/root/", "run-1", "train-op") == a  # a retry finds it again
    assert train.backup_dir_for("", "gs://bucket/root", "run-2", "train-op") != a  # a new run starts clean
    assert train.backup_dir_for("gs://ckpt", "gs://bucket/root", "run-1", "train-op").startswith("gs://ckpt/")
    with pytest.raises(ValueError, match="durable"):
        train.backup_dir_for("", "", "run-1", "train-op")


def test_a_finished_backup_is_not_trained_again(small_dataset, tmp_path):
    backup = str(tmp_path / "backup")
    first = train.train(small_dataset, str(tmp_path / "m1"), epochs=1, backup_dir=backup, validate=False)
    again = train.train(small_dataset, str(tmp_path / "m2"), epochs=1, backup_dir=backup, validate=False)
    assert again.resumed_from_step == first.steps == again.steps
    assert os.path.exists(tmp_path / "m2" / "model.keras")
    with pytest.raises(ValueError, match="different training setup"):
        train.train(small_dataset, str(tmp_path / "m3"), epochs=2, backup_dir=backup, validate=False)


def test_gpus_given_but_invisible_to_tensorflow_fail_fast(tmp_path):
    (tmp_path / "nvidia0").touch()
    (tmp_path / "nvidiactl").touch()
    with pytest.raises(RuntimeError, match=r"GPU devices \(nvidia0 in .*\) but TensorFlow sees none"):
        check_gpus_visible([], device_dir=str(tmp_path))
    check_gpus_visible(["a GPU"], device_dir=str(tmp_path))  # seen: fine
    (tmp_path / "nvidia0").unlink()
    check_gpus_visible([], device_dir=str(tmp_path))  # no GPU given: CPU training is expected


def logits_of(model_dir: str, images: np.ndarray) -> np.ndarray:
    import keras

    return np.asarray(keras.models.load_model(os.path.join(model_dir, "model.keras"), compile=False)(images))


def test_the_best_epoch_on_validation_is_exported_also_by_a_resumed_attempt(small_dataset, tmp_path):
    """Logits of fixed images after every epoch (the epoch callback sees the weights validation scored): the export
    gives those of the best epoch, and so does a second attempt on the same backup, which reads them from its file.
    A learning rate 25x the recipe's makes the third epoch (of four) the best here (seeded, float32)."""
    images, _ = data.load_split_arrays(small_dataset, "test", limit=16)
    images = images.astype("float32")
    per_epoch = []
    backup = str(tmp_path / "backup")
    settings = dict(epochs=4, learning_rate=0.05, backup_dir=backup, seed=1, precision="float32")
    result = train.train(small_dataset, str(tmp_path / "m1"), **settings,
                         epoch_callback=lambda epoch, logs, predict: per_epoch.append(np.asarray(predict(images))))
    history = result.history["val_accuracy"]
    best = max(range(4), key=lambda e: (history[e], -result.history["val_loss"][e]))
    assert result.exported_epoch == best + 1 == result.best_on_validation["epoch"]
    assert best < 3  # so the export puts back an earlier epoch's weights
    np.testing.assert_allclose(logits_of(str(tmp_path / "m1"), images), per_epoch[best], rtol=1e-4, atol=1e-4)
    assert os.listdir(backup).count(f"best-epoch-{best + 1}.weights.h5") == 1  # one file: the best so far
    assert not [name for name in os.listdir(backup) if name.startswith("best-") and str(best + 1) not in name]

    again = train.train(small_dataset, str(tmp_path / "m2"), **settings)
    assert again.resumed_from_step == again.steps and again.exported_epoch == best + 1
    np.testing.assert_allclose(logits_of(str(tmp_path / "m2"), images), per_epoch[best], rtol=1e-4, atol=1e-4)
