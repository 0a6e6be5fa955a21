"""The training loop: one attempt at training, as an object whose phases can be read one at a time.

`TrainingLoop(settings).run()` goes through the phases in order:

    prepare()     the plan: recipe, this process's role in the cluster, the data, the strategy, precision and
                  XLA, the global batch and the step counts
    build()       the model (components/train/models.py) and its pretrained weights, the transfer-learning phases,
                  one optimizer per phase under the strategy, the losses, the compiled step functions, and the
                  checkpoint (weights, optimizers' state, step, the epoch's running sums, the history)
    restore()     resume from the last checkpoint in backup_dir, mid-epoch and step-exact
    run_epochs()  train up to the planned number of steps; checkpoint at every epoch's end, every
                  checkpoint_seconds within one, and on SIGTERM (then raise Preempted); at every epoch's end the
                  BatchNormalization statistics are re-estimated (batchnorm.py) and `evaluate()` scores the
                  validation split
    export()      the weights of the epoch best on validation (accuracy, then loss), the float32 model,
                  training.json, the TrainResult

Transfer learning (pretrained weights): phase 1 trains the head with the backbone frozen for the first
`freeze_epochs`, phase 2 trains the backbone too (all of it or its top `fine_tune_layers` layers) at
learning_rate x fine_tune_lr_factor, its BatchNormalization layers kept frozen (inference mode). Each phase has its
own optimizer (the Keras guide's recompile: fresh moments and bias correction for the newly trainable weights), both
in the checkpoint; the global step is the sum of their steps, so a resumed attempt is in the same phase at the same
step. Without pretrained weights there is one phase and one optimizer, as before.

The contracts these phases keep (distribution, fault tolerance, exit codes) are stated in the package's
docstring, components/train/__init__.py.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import math
import os
import shutil
import tempfile
import time
from typing import Callable

import numpy as np

from components import augment as augment_lib
from components.dataio import data
from components.train import batchnorm, frameworks, gpu_usage, models, staging
from components.train import pretrained as pretrained_lib
from components.train.cluster import ClusterRole
from components.train.faults import (NonFiniteLossError, Preempted, PreemptionWatch, check_not_failed_before,
                                     peer_loss_is_preemption)
from components.train.frameworks.base import InputSpec
from components.train.learning_rate import keras_schedule, peak_learning_rate
from components.train.recipes import Recipe
from components.train.results import TRAINING_INFO, TrainResult
from components.train.settings import TrainSettings

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Plan:
    """What `prepare` decides before anything is built."""

    recipe: Recipe
    role: ClusterRole
    class_names: list[str]
    image_shape: list[int]
    train_dir: str  # the dataset's, or the augmented copies'
    online_policy: dict | None  # augmentation applied while training, if any
    train_count: int
    distribution: str  # how the replicas train together: the tf.distribute strategy, DDP, ...
    precision: str
    use_jit: bool
    replicas: int
    global_batch: int
    steps_per_epoch: int
    total_steps: int
    peak_learning_rate: float

    def input_spec(self, input_mode: str) -> InputSpec:
        return InputSpec(self.train_dir, self.image_shape, self.recipe, self.online_policy, input_mode,
                         self.replicas, self.global_batch, self.steps_per_epoch)


def setup_json(recipe: Recipe, global_batch: int, steps_per_epoch: int, train_count: int, workers: int,
               model: dict | None = None) -> str:
    """What a checkpoint must have been trained with to be resumed (stored in it and compared on restore); `model`
    is the training.json "model" entry (name, weights source, phases), so the phase follows from the step."""
    return json.dumps({"recipe": dataclasses.asdict(recipe), "global_batch": global_batch,
                       "steps_per_epoch": steps_per_epoch, "train_count": train_count, "workers": workers,
                       **({"model": {k: v for k, v in model.items() if k != "pretrained"} |
                                    {"pretrained": model["pretrained"]["source"]}} if model else {})},
                      sort_keys=True)


class TrainingLoop:
    """One attempt at training with `settings`; see the module docstring for the phases.

    The framework (settings.framework: components/train/frameworks) does what differs between TensorFlow, PyTorch
    and JAX (distribution, step functions, checkpoint files, TensorBoard, the model files); the phases here are the
    same for all. `validate=False` skips the validation pass. `tf_config` defaults to the `TF_CONFIG` environment
    variable (TensorFlow). `epoch_callback(epoch, logs, predict)`, when given, is called on the chief after each
    epoch (epoch counted from 0) with that epoch's logs and a function mapping a batch of images to logits (for
    tuning services and benchmarks). `run()` raises NonFiniteLossError, data.DataError/ValueError (bad input),
    Preempted (SIGTERM or a lost peer; checkpoint saved), PermanentFailure (an earlier attempt failed for good).
    """

    def __init__(self, settings: TrainSettings, *, validate: bool = True, tf_config: str | None = None,
                 epoch_callback: Callable[[int, dict, Callable], None] | None = None):
        frameworks.use(settings.framework)  # before keras is first imported (KERAS_BACKEND)
        self.settings = settings
        self.backend = frameworks.backend_class(settings.framework)(settings)
        self.validate = validate
        self.tf_config = os.environ.get("TF_CONFIG") if tf_config is None else tf_config
        self.epoch_callback = epoch_callback
        self.step = 0  # optimizer steps taken, in all attempts together
        self.resumed_from = 0
        self.history: dict[str, list[float]] = {}
        self.epoch_sums = np.zeros(3, np.float64)  # the current epoch's (loss sum, correct, count) so far
        self.scratch: str | None = None  # a non-chief worker's throwaway output
        self.train_seconds = 0.0
        self.stage = ""  # the phase of `run()` it is in (prepare ... export), for the message of a lost peer
        self.phase = 0  # the transfer-learning phase (1: head only, 2: all; see enter_phase)
        self.best: dict = {}  # the epoch best on validation: {"epoch", "val_accuracy", "val_loss", "file"}
        self.best_weights: list | None = None  # its weights, in this process
        self.stale_best_file: str | None = None  # an earlier best epoch's file, until the next checkpoint
        self.recalibrated_at = -1  # the step whose weights the BatchNormalization statistics were estimated for
        self.recalibration = None  # the training images that estimate them (run_epochs), when the model has any
        self.gpu_sampler = None  # GPU utilization over run_epochs (gpu_usage.py)
        self.gpus = 0  # the GPUs this process trains on (Backend.start)
        self.staged = None  # the local copy of the input (staging.py), with settings.stage_dir

    def run(self) -> TrainResult:
        # A peer lost in any phase, not only between steps, is a preemption: every phase outside the epoch loop
        # runs collective ops too (the distribution's start, variables created and restored, the export).
        with peer_loss_is_preemption(lambda: f"step {self.step}" if self.stage == "run_epochs" else self.stage,
                                     self.backend.is_peer_loss):
            for phase in (self.prepare, self.build, self.restore, self.run_epochs, self.export):
                self.stage = phase.__name__
                result = phase()
        return result

    # ------------------------------------------------------------------------------------------ prepare

    def prepare(self) -> Plan:
        import keras

        settings, backend = self.settings, self.backend
        recipe = settings.resolve_recipe()
        role = backend.role(self.tf_config)
        check_not_failed_before(settings.backup_dir)
        if settings.stage_dir:  # every later read of the input is local; checkpoints stay in backup_dir
            self.staged = staging.stage(settings.dataset_dir, settings.stage_dir, augmented_dir=settings.augmented_dir)
            settings = self.settings = dataclasses.replace(settings, dataset_dir=self.staged.dataset_dir,
                                                           augmented_dir=self.staged.augmented_dir)
        manifest = data.read_manifest(settings.dataset_dir)
        pretrained_lib.check_settings(settings.model, settings.pretrained, manifest["image_shape"],
                                      freeze_epochs=settings.freeze_epochs, fine_tune_layers=settings.fine_tune_layers,
                                      epochs=recipe.epochs)
        train_dir, online_policy = augment_lib.train_files(settings.dataset_dir, settings.augmented_dir)

        runtime = backend.start(role)
        self.gpus = runtime.accelerators
        replicas = runtime.replicas
        global_batch = recipe.batch_size * replicas
        train_count = data.read_manifest(train_dir)["splits"]["train"]["count"]
        if train_count < 1:
            raise data.DataError(f"The training split of {train_dir} is empty")
        steps_per_epoch = max(1, math.ceil(train_count / global_batch))
        self.plan = plan = Plan(
            recipe=recipe, role=role, class_names=manifest["class_names"], image_shape=manifest["image_shape"],
            train_dir=train_dir, online_policy=online_policy, train_count=train_count,
            distribution=runtime.distribution, precision=backend.resolve_precision(recipe.precision),
            use_jit=backend.resolve_jit(recipe.jit_compile), replicas=replicas, global_batch=global_batch,
            steps_per_epoch=steps_per_epoch, total_steps=recipe.epochs * steps_per_epoch,
            peak_learning_rate=peak_learning_rate(recipe, replicas))
        keras.utils.set_random_seed(recipe.seed)
        log.info("train: %s on %s, %d replica(s) in %d worker(s), global batch %d, peak learning rate %g, %s, "
                 "XLA %s, recipe %s, model %s, pretrained %s, framework %s", plan.distribution, role.task, replicas,
                 role.workers, global_batch, plan.peak_learning_rate, plan.precision, "on" if plan.use_jit else "off",
                 settings.recipe, settings.model, settings.pretrained, backend.name)
        return plan

    # ------------------------------------------------------------------------------------------ build

    def build(self) -> None:
        import keras

        settings, plan, backend = self.settings, self.plan, self.backend
        recipe = plan.recipe
        with backend.scope():
            self.model = models.build(settings.model, plan.image_shape, len(plan.class_names), plan.precision,
                                      native=backend.native_model)
            self.weights = pretrained_lib.load(self.model, settings.model, settings.pretrained,
                                               backup_dir=settings.backup_dir, write_cache=plan.role.is_chief,
                                               weights_cache=settings.weights_cache)
            self.transfer = self.weights.source != pretrained_lib.NONE
            freeze_epochs = settings.freeze_epochs
            if freeze_epochs is None:  # the recipe's when the head starts untrained, at most half of the epochs
                freeze_epochs = min(recipe.freeze_epochs, recipe.epochs // 2) if self.weights.covers == "backbone" \
                    else 0
            self.freeze_epochs = freeze_epochs if self.transfer else 0
            self.freeze_steps = self.freeze_epochs * plan.steps_per_epoch
            factor = recipe.fine_tune_lr_factor if self.transfer else 1.0

            def optimizer_for(schedule, variables):
                optimizer = keras.optimizers.Adam(schedule)
                if plan.precision == "mixed_float16":
                    optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
                optimizer.build(variables)
                return optimizer

            # Phase 2 (or the only phase): everything that trains after the frozen epochs.
            if self.transfer:
                models.set_phase(self.model, 2, fine_tune_layers=settings.fine_tune_layers)
            self.phase_variables = {2: list(self.model.trainable_variables)}
            tuning_rate = keras_schedule(recipe, plan.replicas, plan.steps_per_epoch, first_step=self.freeze_steps,
                                         rate_factor=factor)
            self.optimizer = optimizer_for(tuning_rate, self.phase_variables[2])
            self.head_optimizer = None
            if self.freeze_steps:
                models.set_phase(self.model, 1)
                self.phase_variables[1] = list(self.model.trainable_variables)
                head_rate = keras_schedule(recipe, plan.replicas, plan.steps_per_epoch)
                self.head_optimizer = optimizer_for(head_rate, self.phase_variables[1])
                self.rate_at_step = lambda step: head_rate(step) if step < self.freeze_steps \
                    else tuning_rate(step - self.freeze_steps)
            else:
                self.rate_at_step = tuning_rate
        self.phase = 0  # set by enter_phase
        self.loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=None)
        self.train_loss_fn = self.loss_fn
        if plan.recipe.label_smoothing:
            smoothed = keras.losses.CategoricalCrossentropy(
                from_logits=True, label_smoothing=plan.recipe.label_smoothing, reduction=None)
            self.train_loss_fn = lambda labels, logits: smoothed(
                keras.ops.one_hot(labels, len(plan.class_names)), logits)

        # The epoch's running sums (loss, correct, count) and the finished epochs' history travel with the weights.
        self.setup = setup_json(plan.recipe, plan.global_batch, plan.steps_per_epoch, plan.train_count,
                                plan.role.workers, self.model_lineage())
        # The other workers write what the chief writes (checkpoints, model) to scratch space, deleted at the end.
        self.scratch = None if plan.role.is_chief else tempfile.mkdtemp(prefix="train-scratch-")
        optimizers = {"optimizer": self.optimizer}
        if self.head_optimizer is not None:
            optimizers["head_optimizer"] = self.head_optimizer
        self.checkpoint = backend.checkpoint(self.model, optimizers, backup_dir=settings.backup_dir,
                                             scratch=self.scratch, is_chief=plan.role.is_chief, setup=self.setup)
        self._run_steps = {}  # by phase, made when the phase is entered (traced with its trainable layers)
        self.predict_logits = backend.predict_function(self.model)
        self.writer = backend.summary_writer(settings.tensorboard_dir if plan.role.is_chief else None)

    def global_step(self) -> int:
        """Optimizer steps taken in all attempts: the head phase's and the fine-tuning (or only) phase's."""
        import keras

        optimizers = [self.optimizer] + ([self.head_optimizer] if self.head_optimizer is not None else [])
        return sum(int(keras.ops.convert_to_numpy(optimizer.iterations)) for optimizer in optimizers)

    def enter_phase(self, phase: int) -> None:
        """Makes the phase's layers trainable (before its step function is traced) and its step function."""
        if phase == self.phase:
            return
        if self.transfer:
            models.set_phase(self.model, phase, fine_tune_layers=self.settings.fine_tune_layers)
            log.info("train: phase %d: %s from step %d", phase, "the head trains, the backbone is frozen" if phase == 1
                     else "fine-tuning the pretrained weights at learning rate x %g" % self.plan.recipe.fine_tune_lr_factor,
                     self.step)
        if phase not in self._run_steps:
            optimizer = self.head_optimizer if phase == 1 else self.optimizer
            self._run_steps[phase] = self.backend.step_function(
                self.model, optimizer, self.phase_variables[phase], self.train_loss_fn, self.plan.global_batch,
                self.plan.use_jit)
        self.phase = phase

    # ------------------------------------------------------------------------------------------ restore

    def restore(self) -> None:
        backup_dir, plan = self.settings.backup_dir, self.plan
        found = self.checkpoint.restore_latest() if self.checkpoint is not None else None
        if found:
            latest, extras = found
            if extras["setup"] != self.setup:
                raise ValueError(f"{backup_dir} holds checkpoints of a different training setup "
                                 f"({extras['setup']}); use a new backup directory for new settings")
            self.epoch_sums = np.asarray(extras["epoch_sums"], np.float64)
            self.history = json.loads(extras["history"])
            self.best = json.loads(extras["best"])
            self.resumed_from = self.global_step()
            log.info("train: resuming from step %d of %d (epoch %d, step %d) from %s", self.resumed_from,
                     plan.total_steps, self.resumed_from // plan.steps_per_epoch + 1,
                     self.resumed_from % plan.steps_per_epoch, latest)
        self.step = self.global_step()

    def save(self, reason: str) -> None:
        """A checkpoint at the current step (no-op without a backup_dir)."""
        if self.checkpoint is None:
            return
        path = self.checkpoint.save(self.global_step(), {
            "epoch_sums": self.epoch_sums, "history": json.dumps(self.history), "setup": self.setup,
            "best": json.dumps(self.best)})
        if self.plan.role.is_chief:
            log.info("train: checkpoint %s (%s)", path, reason)

    # ------------------------------------------------------------------------------------------ run epochs

    def run_epochs(self) -> None:
        settings, plan, backend = self.settings, self.plan, self.backend
        chief = plan.role.is_chief
        has_validation = data.read_manifest(settings.dataset_dir)["splits"]["validation"]["count"] > 0
        validation = backend.eval_batches(settings.dataset_dir, "validation", max(plan.global_batch, 256)) \
            if self.validate and chief and has_validation else None
        # Every worker would estimate statistics on its own images and the replicas would disagree: one worker only.
        self.recalibration = backend.recalibration_batches(settings.dataset_dir) \
            if plan.role.workers == 1 and batchnorm.trainable_batchnorm(self.model) else None
        self.gpu_sampler = gpu_usage.start_for_training(settings.tensorboard_dir, chief=chief, gpus=self.gpus)
        start = time.monotonic()
        self.last_save = time.monotonic()
        with PreemptionWatch() as watch, self.gpu_sampler:
            log.info("train: starting at step %d of %d", self.step, plan.total_steps)
            while self.step < plan.total_steps:
                self.run_epoch(watch, validation)
        self.train_seconds = time.monotonic() - start

    def run_epoch(self, watch: PreemptionWatch, validation) -> None:
        """The rest of the current epoch (all of it, or from a resumed step), then its end-of-epoch work."""
        plan = self.plan
        epoch, in_epoch = divmod(self.step, plan.steps_per_epoch)
        epoch_start = time.monotonic()
        if in_epoch == 0:
            self.epoch_sums = np.zeros(3, np.float64)
        self.enter_phase(1 if self.step < self.freeze_steps else 2)  # the frozen phase ends at an epoch's end
        iterator = self.backend.batches(plan.input_spec(self.settings.input_mode), epoch, in_epoch)
        while in_epoch < plan.steps_per_epoch:
            count = min(plan.recipe.steps_per_execution, plan.steps_per_epoch - in_epoch)
            self.take_steps(iterator, count, epoch, in_epoch)
            in_epoch += count
            self.checkpoint_or_stop(watch, epoch, in_epoch)
        self.end_epoch(epoch, epoch_start, validation)

    def take_steps(self, iterator, count: int, epoch: int, in_epoch: int) -> None:
        """`count` optimizer steps; stops training (NonFiniteLossError) at the first NaN or infinite loss."""
        sums = np.asarray(self._run_steps[self.phase](iterator, count), np.float64)
        losses = sums[:, 0] / sums[:, 2]
        bad = [i for i, value in enumerate(losses) if not math.isfinite(value)]
        if bad:
            raise NonFiniteLossError(
                f"Loss became {losses[bad[0]]} at epoch {epoch + 1}, step {in_epoch + bad[0] + 1} "
                f"(global step {self.step + bad[0] + 1}): training stopped. Lower the learning rate or "
                "check the input data for corrupt values.")
        self.epoch_sums = self.epoch_sums + sums.sum(axis=0)
        self.step += count

    def checkpoint_or_stop(self, watch: PreemptionWatch, epoch: int, in_epoch: int) -> None:
        """Between steps: on SIGTERM (on any worker) save and raise Preempted; within an epoch, save when the chief's
        checkpoint_seconds have passed. All workers decide together."""
        role = self.plan.role
        want_save = role.is_chief and time.monotonic() - self.last_save >= self.settings.checkpoint_seconds
        flags = [float(watch.signalled.is_set()), float(want_save)]
        if role.workers > 1:
            flags = self.backend.agree(flags)
        # At an epoch's last step the stop waits for the epoch's end (its validation, history and checkpoint): a
        # checkpoint taken before them would resume into the next epoch without them.
        if flags[0] and in_epoch < self.plan.steps_per_epoch:
            self.save("preempted")
            raise Preempted(f"Preempted at step {self.step} of {self.plan.total_steps}; a retry resumes from here")
        if flags[1] and in_epoch < self.plan.steps_per_epoch:
            self.save(f"epoch {epoch + 1}, step {in_epoch}")
            self.last_save = time.monotonic()

    def end_epoch(self, epoch: int, epoch_start: float, validation) -> None:
        """The epoch's metrics (validation included) into the history, TensorBoard and the log; then a checkpoint."""
        loss_sum, correct, seen = self.epoch_sums.tolist()
        logs = {"loss": loss_sum / seen, "accuracy": correct / seen,
                "learning_rate": float(self.rate_at_step(self.step - 1))}  # the rate of the epoch's last step
        self.recalibrate_batchnorm()
        if validation is not None:
            logs["val_loss"], logs["val_accuracy"] = self.evaluate(validation)
            self.keep_if_best(epoch, logs)
        for name, value in logs.items():
            self.history.setdefault(name, []).append(float(value))
            self.writer.scalar(f"epoch_{name}", value, self.step)
        log.info("epoch %d/%d (%.1fs) %s", epoch + 1, self.plan.recipe.epochs, time.monotonic() - epoch_start,
                 " ".join(f"{k}={v:.4f}" for k, v in sorted(logs.items())))
        if self.gpu_sampler is not None:
            self.gpu_sampler.end_epoch(epoch, self.step)
        if self.epoch_callback is not None and self.plan.role.is_chief:
            self.epoch_callback(epoch, dict(logs), self.predict_logits)
        self.save(f"end of epoch {epoch + 1}")
        self.last_save = time.monotonic()
        if self.stale_best_file:
            data.gfile().remove(self.stale_best_file)
            self.stale_best_file = None

    def recalibrate_batchnorm(self) -> None:
        """Statistics for the current weights (batchnorm.py), once per step reached; single-worker training only."""
        if self.recalibration is not None and self.recalibrated_at != self.step:
            batchnorm.recalibrate(self.model, self.recalibration)
            self.recalibrated_at = self.step

    def keep_if_best(self, epoch: int, logs: dict) -> None:
        """Remembers this epoch's weights when it is the best on validation so far (accuracy; lower loss breaks a
        tie), in memory and, with a backup_dir, as a file there for a resumed attempt. Single worker only: the
        others do not see the validation scores and would export other weights."""
        if self.plan.role.workers > 1:
            return
        if self.best and (logs["val_accuracy"], -logs["val_loss"]) <= (self.best["val_accuracy"],
                                                                        -self.best["val_loss"]):
            return
        best = {"epoch": epoch + 1, "val_accuracy": float(logs["val_accuracy"]), "val_loss": float(logs["val_loss"])}
        self.best_weights = self.model.get_weights()
        if self.settings.backup_dir:
            best["file"] = data.join(self.settings.backup_dir, f"best-epoch-{epoch + 1}.weights.h5")
            local = os.path.join(tempfile.mkdtemp(prefix="best-"), "best.weights.h5")
            self.model.save_weights(local)
            data.gfile().makedirs(self.settings.backup_dir)  # before the first checkpoint makes it
            data.gfile().copy(local, best["file"], overwrite=True)
            shutil.rmtree(os.path.dirname(local), ignore_errors=True)
            if self.best.get("file") and self.best["file"] != best["file"]:
                self.stale_best_file = self.best["file"]  # removed once the checkpoint no longer names it
        self.best = best

    def restore_best(self) -> int:
        """Puts back the weights of the epoch best on validation; returns the epoch the exported model is from."""
        last = self.step // self.plan.steps_per_epoch
        if not self.best or self.best["epoch"] == last:
            return last
        if self.best_weights is not None:
            self.model.set_weights(self.best_weights)
        else:  # a resumed attempt: the file an earlier one wrote
            local = os.path.join(tempfile.mkdtemp(prefix="best-"), "best.weights.h5")
            data.gfile().copy(self.best["file"], local, overwrite=True)
            self.model.load_weights(local)
            shutil.rmtree(os.path.dirname(local), ignore_errors=True)
        log.info("train: exporting epoch %d, the best on validation (accuracy %.4f), not the last (%d)",
                 self.best["epoch"], self.best["val_accuracy"], last)
        return self.best["epoch"]

    # ------------------------------------------------------------------------------------------ evaluate

    def evaluate(self, dataset) -> tuple[float, float]:
        """Mean loss and accuracy of the model on `dataset` (batches of images and labels)."""
        import keras

        total_loss = correct = count = 0.0
        for images, labels in dataset:
            logits = self.predict_logits(images)
            labels = keras.ops.convert_to_numpy(labels)
            total_loss += float(keras.ops.convert_to_numpy(self.loss_fn(labels, logits)).sum())
            correct += float((keras.ops.convert_to_numpy(logits).argmax(-1) == labels).sum())
            count += int(labels.size)
        return total_loss / max(count, 1), correct / max(count, 1)

    # ------------------------------------------------------------------------------------------ export

    def export(self) -> TrainResult:
        settings, plan = self.settings, self.plan
        steps_run = self.step - self.resumed_from
        if steps_run == 0:
            log.info("train: %s already holds the finished training (%d steps); writing the model again",
                     settings.backup_dir, self.step)
        # Only the chief's model counts; the others save theirs to scratch (the standard multi-worker pattern,
        # as saving reads the distributed variables on every worker) and delete it.
        output_dir = settings.model_dir if plan.role.is_chief else os.path.join(self.scratch, "model")
        input_mode = self.backend.input_mode() or settings.input_mode
        self.recalibrate_batchnorm()
        exported_epoch = self.restore_best()
        result = TrainResult(settings.model_dir, plan.recipe.epochs, self.step, plan.steps_per_epoch,
                             plan.global_batch, plan.replicas, plan.role.workers, plan.distribution,
                             plan.peak_learning_rate, plan.precision, plan.use_jit, input_mode, self.resumed_from,
                             self.history, self.train_seconds,
                             steps_run * plan.global_batch / max(self.train_seconds, 1e-9), exported_epoch,
                             {k: v for k, v in self.best.items() if k != "file"} or None,
                             self.recalibrated_at == self.step, framework=self.backend.name)
        written = self.backend.write_model(self.model, plan.image_shape, len(plan.class_names), output_dir,
                                           settings.model)
        result.serving_format = written["serving_format"]
        if plan.role.is_chief:
            data.write_json(data.join(settings.model_dir, TRAINING_INFO), {
                **result.to_json(), **written, "recipe": settings.recipe, "recipe_settings": dataclasses.asdict(plan.recipe),
                "class_names": plan.class_names, "image_shape": plan.image_shape, "train_count": plan.train_count,
                "model": self.model_lineage(), "gpu_usage": self.gpu_sampler.summary() if self.gpu_sampler is not None
                else {"recorded": False, "reason": "no training in this attempt"},
                **({"staging": self.staged.metrics()} if self.staged else {}),
            })
            self.writer.flush()
        if self.scratch:
            shutil.rmtree(self.scratch, ignore_errors=True)
        self.backend.finish()
        log.info("train: %d steps (%d in this attempt) in %.1fs, %.0f images/s; model in %s", self.step, steps_run,
                 self.train_seconds, result.images_per_second, settings.model_dir)
        return result

    def model_lineage(self) -> dict:
        """training.json's "model": the network, its initial weights (source and the file's sha256) and phases."""
        return {"name": self.settings.model, "pretrained": self.weights.lineage(), "freeze_epochs": self.freeze_epochs,
                "fine_tune_layers": self.settings.fine_tune_layers if self.transfer else 0}


def train(dataset_dir: str, model_dir: str, *, validate: bool = True, tf_config: str | None = None,
          epoch_callback: Callable[[int, dict, Callable], None] | None = None, **settings) -> TrainResult:
    """Trains the classifier on `dataset_dir` (train from `augmented_dir` when given) and writes `model_dir`.

    `settings` are `TrainSettings`' other fields (recipe, epochs, batch_size, ..., backup_dir, tensorboard_dir):
    `backup_dir` (durable, one per run and task) makes the training resumable; `checkpoint_seconds` bounds the
    work a SIGKILL can cost. The other arguments and what this raises are `TrainingLoop`'s.
    """
    settings = TrainSettings(dataset_dir, model_dir, **settings)
    frameworks.use(settings.framework)
    return TrainingLoop(settings, validate=validate, tf_config=tf_config,
                        epoch_callback=epoch_callback).run()
