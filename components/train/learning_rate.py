"""The learning rate: linear scaling with the replicas, warm-up, then steps or cosine decay; as a function of
the epoch (for reading and tests) and as the Keras schedule the optimizer follows (on its step, restored with
the checkpoint)."""

from __future__ import annotations

import dataclasses
import math

from components.train.recipes import Recipe


def peak_learning_rate(recipe: Recipe, replicas: int) -> float:
    return recipe.learning_rate * (replicas if recipe.scale_lr else 1)


def learning_rate_for(epoch: float, recipe: Recipe, replicas: int = 1) -> float:
    """The rate at a (fractional) epoch: warm-up from the one-replica rate, then steps or cosine decay."""
    peak = peak_learning_rate(recipe, replicas)
    if epoch < recipe.warmup_epochs and peak != recipe.learning_rate:
        return recipe.learning_rate + (peak - recipe.learning_rate) * epoch / recipe.warmup_epochs
    if recipe.lr_schedule == "cosine":
        start = recipe.warmup_epochs if peak != recipe.learning_rate else 0.0
        progress = min(1.0, max(0.0, (epoch - start) / max(recipe.epochs - start, 1e-9)))
        return peak * 0.5 * (1.0 + math.cos(math.pi * progress))
    factor = 1.0
    for first_epoch, step_factor in recipe.lr_steps:
        if epoch >= first_epoch:
            factor = step_factor
    return peak * factor


def keras_schedule(recipe: Recipe, replicas: int, steps_per_epoch: int, *, first_step: int = 0,
                   rate_factor: float = 1.0):
    """`learning_rate_for` as a Keras schedule on the optimizer's step (restored with the checkpoint). An optimizer
    that starts at global step `first_step` (the fine-tuning phase's) counts its steps from 0: the schedule adds
    `first_step`, and scales the rate by `rate_factor`."""
    import keras
    from keras import ops

    peak = peak_learning_rate(recipe, replicas)
    warmup_steps = recipe.warmup_epochs * steps_per_epoch if peak != recipe.learning_rate else 0.0
    total_steps = recipe.epochs * steps_per_epoch

    class RecipeSchedule(keras.optimizers.schedules.LearningRateSchedule):  # keras.ops: any framework's tensors
        def __call__(self, step):
            step = ops.cast(step, "float32") + first_step
            warm = recipe.learning_rate + (peak - recipe.learning_rate) * step / max(warmup_steps, 1.0)
            if recipe.lr_schedule == "cosine":
                progress = ops.clip((step - warmup_steps) / max(total_steps - warmup_steps, 1.0), 0.0, 1.0)
                after = peak * 0.5 * (1.0 + ops.cos(math.pi * progress))
            else:
                epoch = ops.floor(step / steps_per_epoch)
                factor = ops.ones((), "float32")
                for first_epoch, step_factor in recipe.lr_steps:
                    factor = ops.where(epoch >= first_epoch, ops.full((), step_factor, "float32"), factor)
                after = peak * factor
            return ops.where(step < warmup_steps, warm, after) * rate_factor

        def get_config(self):
            return {"recipe": dataclasses.asdict(recipe), "replicas": replicas, "steps_per_epoch": steps_per_epoch,
                    "first_step": first_step, "rate_factor": rate_factor}

    return RecipeSchedule()
