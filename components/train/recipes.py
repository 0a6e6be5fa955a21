"""Recipes: the named presets of how to train (epochs, batch, learning rate and its schedule, precision, ...)."""

from __future__ import annotations

import dataclasses

from components import params


@dataclasses.dataclass(frozen=True)
class Recipe:
    """How to train: the knobs around the model (which model, and which pretrained weights, are the run's
    settings: TrainSettings.model / pretrained)."""

    epochs: int = 12
    batch_size: int = 64  # per replica
    learning_rate: float = 1e-3  # for one replica; scaled by the number of replicas when scale_lr is on
    lr_schedule: str = "steps"  # "steps": factors from lr_steps; "cosine": cosine decay to zero after warm-up
    # Stepped schedule: (first epoch, factor of learning_rate), epochs counted from 0.
    lr_steps: tuple[tuple[int, float], ...] = ((0, 1.0), (3, 0.1), (7, 0.01))
    scale_lr: bool = True  # linear scaling rule: learning rate x replicas
    warmup_epochs: float = 1.0  # ramp from the one-replica rate to the scaled one (Goyal et al., 2017)
    label_smoothing: float = 0.0  # share of the target spread over the other classes (training loss only)
    shuffle_buffer: int = 10_000  # streamed input only; in-memory input shuffles the whole split
    steps_per_execution: int = 1  # training steps per call into the TF runtime
    precision: str = "auto"  # auto (bf16/fp16 on GPUs that have them, else float32), float32, mixed_*
    jit_compile: str = "auto"  # auto (XLA on GPU, not on CPU where it made this model slower), on, off
    seed: int = 0  # initial weights and data order
    # Transfer learning (with pretrained weights only): the first epochs train the head with the backbone frozen
    # when the weights leave the head untrained (ImageNet, a backbone's weights), at most half of the epochs; then
    # the pretrained weights train at learning_rate x fine_tune_lr_factor (the Keras guide's lower rate).
    freeze_epochs: int = 2
    fine_tune_lr_factor: float = 0.1

    def validate(self) -> "Recipe":
        problems = []
        if self.epochs < 1:
            problems.append(f"epochs must be >= 1, got {self.epochs}")
        if self.batch_size < 1:
            problems.append(f"batch_size must be >= 1, got {self.batch_size}")
        if not self.learning_rate > 0:
            problems.append(f"learning_rate must be > 0, got {self.learning_rate}")
        if self.lr_schedule not in ("steps", "cosine"):
            problems.append(f"lr_schedule must be steps or cosine, got {self.lr_schedule!r}")
        if self.steps_per_execution < 1:
            problems.append(f"steps_per_execution must be >= 1, got {self.steps_per_execution}")
        if self.precision not in PRECISIONS:
            problems.append(f"precision must be one of {', '.join(PRECISIONS)}, got {self.precision!r}")
        if self.jit_compile not in ("auto", "on", "off"):
            problems.append(f"jit_compile must be auto, on or off, got {self.jit_compile!r}")
        if not 0 <= self.label_smoothing < 1:
            problems.append(f"label_smoothing must be in [0, 1), got {self.label_smoothing}")
        if self.warmup_epochs < 0:
            problems.append(f"warmup_epochs must be >= 0, got {self.warmup_epochs}")
        if self.freeze_epochs < 0:
            problems.append(f"freeze_epochs must be >= 0, got {self.freeze_epochs}")
        if not 0 < self.fine_tune_lr_factor <= 1:
            problems.append(f"fine_tune_lr_factor must be in (0, 1], got {self.fine_tune_lr_factor}")
        if problems:
            raise ValueError("Invalid training recipe: " + "; ".join(problems))
        return self


PRECISIONS = ("auto", "float32", "mixed_bfloat16", "mixed_float16")

RECIPES = {
    # The classic recipe, as written: batch 64, Adam 1e-3 -> 1e-4 from epoch 3 -> 1e-5 from epoch 7, 12 epochs.
    "reference": Recipe(),
    # Same model, at least the same accuracy, a fraction of the time (see `make bench`): twice the batch at twice
    # the rate with cosine decay, 8 epochs, 16 steps per call into the runtime, bf16 on GPUs that compute it fast.
    "fast": Recipe(epochs=8, batch_size=128, learning_rate=2e-3, lr_schedule="cosine", steps_per_execution=16),
}
DEFAULT_RECIPE = params.default("recipe")  # the pipeline parameter's default


def resolve_recipe(name: str, **overrides) -> Recipe:
    """The named preset with the given overrides (None values are ignored), validated."""
    if name not in RECIPES:
        raise ValueError(f"Unknown recipe {name!r}; known: {', '.join(sorted(RECIPES))}")
    given = {k: v for k, v in overrides.items() if v is not None}
    unknown = sorted(set(given) - {f.name for f in dataclasses.fields(Recipe)})
    if unknown:
        raise ValueError(f"Unknown recipe settings {unknown}")
    return dataclasses.replace(RECIPES[name], **given).validate()
