"""The training loop."""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import shutil
import tempfile
import time

from components import augment as augment_lib
from components import data
from components.train.cluster import choose_strategy, cluster_role, strategy_name
from components.train.faults import NonFiniteLossError, Preempted, PreemptionWatch, check_not_failed_before
from components.train.inputs import TrainInput, make_eval_dataset
from components.train.learning_rate import keras_schedule, peak_learning_rate
from components.train.model import build_model, check_gpus_visible, resolve_jit, resolve_precision, write_model
from components.train.recipes import DEFAULT_RECIPE, Recipe, resolve_recipe
from components.train.results import TRAINING_INFO, TrainResult

log = logging.getLogger(__name__)


def setup_json(recipe: Recipe, global_batch: int, steps_per_epoch: int, train_count: int, workers: int) -> str:
    return json.dumps({"recipe": dataclasses.asdict(recipe), "global_batch": global_batch,
                       "steps_per_epoch": steps_per_epoch, "train_count": train_count, "workers": workers},
                      sort_keys=True)


def train(dataset_dir: str, model_dir: str, *, augmented_dir: str | None = None, recipe: str = DEFAULT_RECIPE,
          epochs: int | None = None, batch_size: int | None = None, learning_rate: float | None = None,
          scale_lr: bool | None = None, steps_per_execution: int | None = None, precision: str | None = None,
          jit_compile: str | None = None, seed: int | None = None, backup_dir: str | None = None,
          tensorboard_dir: str | None = None, checkpoint_seconds: float = 120.0, input_mode: str = "auto",
          validate: bool = True, tf_config: str | None = None, epoch_callback=None) -> TrainResult:
    """Trains the classifier on `dataset_dir` (train from `augmented_dir` when given) and writes `model_dir`.

    `backup_dir` (durable, one per run and task) makes the training resumable; `checkpoint_seconds` bounds the
    work a SIGKILL can cost. `tf_config` defaults to the `TF_CONFIG` environment variable. `epoch_callback(epoch,
    logs, predict)`, when given, is called on the chief after each epoch (epoch counted from 0) with that epoch's
    logs and a function mapping a batch of images to logits (for tuning services and benchmarks).
    Raises NonFiniteLossError, data.DataError/ValueError (bad input), Preempted (SIGTERM; checkpoint saved),
    PermanentFailure (an earlier attempt failed for good).
    """
    import keras
    import tensorflow as tf

    chosen = resolve_recipe(recipe, epochs=epochs, batch_size=batch_size, learning_rate=learning_rate,
                            scale_lr=scale_lr, steps_per_execution=steps_per_execution, precision=precision,
                            jit_compile=jit_compile, seed=seed)
    tf_config = os.environ.get("TF_CONFIG") if tf_config is None else tf_config
    role = cluster_role(tf_config)
    check_not_failed_before(backup_dir)
    manifest = data.read_manifest(dataset_dir)
    class_names = manifest["class_names"]
    image_shape = manifest["image_shape"]
    train_dir, online_policy = augment_lib.train_files(dataset_dir, augmented_dir)

    # The strategy first: MultiWorkerMirroredStrategy must configure the runtime before any other TF op.
    strategy = choose_strategy(tf_config)
    gpus = tf.config.list_physical_devices("GPU")
    check_gpus_visible(gpus)
    precision_used = resolve_precision(chosen.precision, gpus)
    use_jit = resolve_jit(chosen.jit_compile, gpus)
    replicas = strategy.num_replicas_in_sync
    global_batch = chosen.batch_size * replicas
    train_count = data.read_manifest(train_dir)["splits"]["train"]["count"]
    if train_count < 1:
        raise data.DataError(f"The training split of {train_dir} is empty")
    steps_per_epoch = max(1, math.ceil(train_count / global_batch))
    total_steps = chosen.epochs * steps_per_epoch
    peak_lr = peak_learning_rate(chosen, replicas)
    keras.utils.set_random_seed(chosen.seed)
    log.info("train: %s on %s, %d replica(s) in %d worker(s), global batch %d, peak learning rate %g, %s, XLA %s, "
             "recipe %s", strategy_name(strategy), role.task, replicas, role.workers, global_batch, peak_lr,
             precision_used, "on" if use_jit else "off", recipe)

    inputs: dict[int, TrainInput] = {}

    def input_for(context) -> TrainInput:
        if context.input_pipeline_id not in inputs:
            inputs[context.input_pipeline_id] = TrainInput(
                train_dir, image_shape, pipeline_id=context.input_pipeline_id,
                num_pipelines=context.num_input_pipelines, recipe=chosen, online_policy=online_policy,
                mode=input_mode)
        return inputs[context.input_pipeline_id]

    def distributed_batches(epoch: int, first_step: int):
        def dataset_fn(context):
            per_replica = context.get_per_replica_batch_size(global_batch)
            per_pipeline = replicas // context.num_input_pipelines  # replicas fed by this pipeline
            return input_for(context).dataset(epoch, first_step * per_pipeline,
                                              (steps_per_epoch - first_step) * per_pipeline, per_replica)

        return iter(strategy.distribute_datasets_from_function(dataset_fn))

    with strategy.scope():
        model = build_model(image_shape, len(class_names), precision_used)
        schedule = keras_schedule(chosen, replicas, steps_per_epoch)
        optimizer = keras.optimizers.Adam(schedule)
        if precision_used == "mixed_float16":
            optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
        optimizer.build(model.trainable_variables)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=None)
    if chosen.label_smoothing:
        smoothed = keras.losses.CategoricalCrossentropy(from_logits=True, label_smoothing=chosen.label_smoothing,
                                                        reduction=None)

        def train_loss_fn(labels, logits):
            return smoothed(tf.one_hot(labels, len(class_names)), logits)
    else:
        train_loss_fn = loss_fn

    # The epoch's running sums (loss, correct, count) and the finished epochs' history travel with the weights.
    setup = setup_json(chosen, global_batch, steps_per_epoch, train_count, role.workers)
    with tf.device("/CPU:0"):  # host-side bookkeeping (strings cannot live on a GPU)
        epoch_sums = tf.Variable(tf.zeros([3], tf.float64), trainable=False)
        history_var = tf.Variable("{}", dtype=tf.string, trainable=False)
        setup_var = tf.Variable(setup, dtype=tf.string, trainable=False)
    checkpoint = tf.train.Checkpoint(model=model, optimizer=optimizer, epoch_sums=epoch_sums,
                                     history=history_var, setup=setup_var)
    # The other workers write what the chief writes (checkpoints, model) to scratch space, deleted at the end.
    scratch = None if role.is_chief else tempfile.mkdtemp(prefix="train-scratch-")
    checkpoint_dir = backup_dir if role.is_chief else os.path.join(scratch, "checkpoints")
    manager = tf.train.CheckpointManager(checkpoint, checkpoint_dir, max_to_keep=2) if backup_dir else None
    resumed_from = 0
    if backup_dir and tf.train.latest_checkpoint(backup_dir):
        latest = tf.train.latest_checkpoint(backup_dir)
        checkpoint.restore(latest).assert_existing_objects_matched()
        if setup_var.numpy().decode() != setup:
            raise ValueError(f"{backup_dir} holds checkpoints of a different training setup "
                             f"({setup_var.numpy().decode()}); use a new backup directory for new settings")
        resumed_from = int(optimizer.iterations.numpy())
        log.info("train: resuming from step %d of %d (epoch %d, step %d) from %s", resumed_from, total_steps,
                 resumed_from // steps_per_epoch + 1, resumed_from % steps_per_epoch, latest)
    history: dict[str, list[float]] = json.loads(history_var.numpy().decode())

    def replica_step(images, labels):
        with tf.GradientTape() as tape:
            logits = model(images, training=True)
            per_example = train_loss_fn(labels, logits)
            loss = tf.reduce_sum(per_example) / global_batch
            scaled = optimizer.scale_loss(loss)
        grads = tape.gradient(scaled, model.trainable_variables)
        optimizer.apply(grads, model.trainable_variables)
        correct = tf.reduce_sum(tf.cast(tf.equal(tf.argmax(logits, -1, output_type=tf.int32), labels), tf.float32))
        return tf.stack([tf.reduce_sum(per_example), correct, tf.cast(tf.size(labels), tf.float32)])

    step_fn = tf.function(replica_step, jit_compile=True) if use_jit else replica_step

    @tf.function
    def run_steps(iterator, count):
        sums = tf.TensorArray(tf.float32, size=count)
        for i in tf.range(count):
            images, labels = next(iterator)
            sums = sums.write(i, strategy.reduce("SUM", strategy.run(step_fn, args=(images, labels)), axis=None))
        return sums.stack()

    @tf.function
    def agree(flags):
        # Every worker must take the same decision (save, stop) at the same step, or the all-reduces hang.
        return strategy.reduce("SUM", strategy.run(lambda: tf.identity(flags)), axis=None)  # > 0: anyone

    @tf.function
    def predict_logits(images):
        return model(images, training=False)

    def evaluate_split(dataset) -> tuple[float, float]:
        total_loss = correct = count = 0.0
        for images, labels in dataset:
            logits = predict_logits(images)
            total_loss += float(tf.reduce_sum(loss_fn(labels, logits)))
            correct += float(tf.reduce_sum(tf.cast(tf.equal(tf.argmax(logits, -1, output_type=tf.int32), labels),
                                                   tf.float32)))
            count += int(tf.size(labels))
        return total_loss / max(count, 1), correct / max(count, 1)

    def save(reason: str) -> None:
        if manager is None:
            return
        history_var.assign(json.dumps(history))
        path = manager.save(checkpoint_number=int(optimizer.iterations.numpy()))
        if role.is_chief:
            log.info("train: checkpoint %s (%s)", path, reason)

    val_ds = make_eval_dataset(dataset_dir, "validation", max(global_batch, 256)) if validate and role.is_chief \
        else None
    writer = tf.summary.create_file_writer(tensorboard_dir) if tensorboard_dir and role.is_chief \
        else tf.summary.create_noop_writer()

    step = int(optimizer.iterations.numpy())
    start = time.monotonic()
    last_save = time.monotonic()
    try:
        with PreemptionWatch() as watch, writer.as_default():
            log.info("train: starting at step %d of %d", step, total_steps)
            while step < total_steps:
                epoch, in_epoch = divmod(step, steps_per_epoch)
                epoch_start = time.monotonic()
                if in_epoch == 0:
                    epoch_sums.assign(tf.zeros([3], tf.float64))
                iterator = distributed_batches(epoch, in_epoch)
                while in_epoch < steps_per_epoch:
                    count = min(chosen.steps_per_execution, steps_per_epoch - in_epoch)
                    sums = run_steps(iterator, tf.constant(count)).numpy()
                    losses = sums[:, 0] / sums[:, 2]
                    bad = [i for i, value in enumerate(losses) if not math.isfinite(value)]
                    if bad:
                        raise NonFiniteLossError(
                            f"Loss became {losses[bad[0]]} at epoch {epoch + 1}, step {in_epoch + bad[0] + 1} "
                            f"(global step {step + bad[0] + 1}): training stopped. Lower the learning rate or "
                            "check the input data for corrupt values.")
                    epoch_sums.assign_add(tf.constant(sums.sum(axis=0), tf.float64))
                    step += count
                    in_epoch += count
                    want_save = role.is_chief and time.monotonic() - last_save >= checkpoint_seconds
                    flags = [float(watch.signalled.is_set()), float(want_save)]
                    if role.workers > 1:
                        flags = agree(tf.constant(flags)).numpy().tolist()
                    if flags[0]:
                        save("preempted")
                        raise Preempted(f"Preempted at step {step} of {total_steps}; a retry resumes from here")
                    if flags[1] and in_epoch < steps_per_epoch:
                        save(f"epoch {epoch + 1}, step {in_epoch}")
                        last_save = time.monotonic()
                loss_sum, correct, seen = epoch_sums.numpy()
                logs = {"loss": loss_sum / seen, "accuracy": correct / seen,
                        "learning_rate": float(schedule(step - 1))}  # the rate of the epoch's last step
                if val_ds is not None:
                    logs["val_loss"], logs["val_accuracy"] = evaluate_split(val_ds)
                for name, value in logs.items():
                    history.setdefault(name, []).append(float(value))
                    tf.summary.scalar(f"epoch_{name}", value, step=step)
                log.info("epoch %d/%d (%.1fs) %s", epoch + 1, chosen.epochs, time.monotonic() - epoch_start,
                         " ".join(f"{k}={v:.4f}" for k, v in sorted(logs.items())))
                if epoch_callback is not None and role.is_chief:
                    epoch_callback(epoch, dict(logs), predict_logits)
                save(f"end of epoch {epoch + 1}")
                last_save = time.monotonic()
    except (tf.errors.UnavailableError, tf.errors.AbortedError, tf.errors.DeadlineExceededError,
            tf.errors.CancelledError) as e:
        # A peer worker went away (preempted node, restarted pod): the whole job restarts and resumes.
        raise Preempted(f"Lost contact with a peer worker at step {step}: {str(e).splitlines()[0]}") from e
    train_seconds = time.monotonic() - start
    steps_run = step - resumed_from
    if steps_run == 0:
        log.info("train: %s already holds the finished training (%d steps); writing the model again", backup_dir,
                 step)

    # Only the chief's model counts; the others save theirs to scratch (the standard multi-worker pattern,
    # as saving reads the distributed variables on every worker) and delete it.
    output_dir = model_dir if role.is_chief else os.path.join(scratch, "model")
    result = TrainResult(model_dir, chosen.epochs, step, steps_per_epoch, global_batch, replicas, role.workers,
                         strategy_name(strategy), peak_lr, precision_used, use_jit, next(iter(inputs.values())).mode
                         if inputs else input_mode, resumed_from, history, train_seconds,
                         steps_run * global_batch / max(train_seconds, 1e-9))
    write_model(model, image_shape, len(class_names), output_dir)
    if role.is_chief:
        data.write_json(data.join(model_dir, TRAINING_INFO), {
            **result.to_json(), "recipe": recipe, "recipe_settings": dataclasses.asdict(chosen),
            "class_names": class_names, "image_shape": image_shape, "train_count": train_count,
        })
        writer.flush()
    if scratch:
        shutil.rmtree(scratch, ignore_errors=True)
    log.info("train: %d steps (%d in this attempt) in %.1fs, %.0f images/s; model in %s", step, steps_run,
             train_seconds, result.images_per_second, model_dir)
    return result
