"""Training settings: everything one training run is told, as one value that travels from the pipeline's op to
the training CLI and, for multi-node training, into each replica's command.

The fields below are the only place the options are written down. `add_arguments` declares them on an
argparse parser (the training CLI), `from_args` reads them back, and `to_argv` writes the CLI's arguments, what
a launcher puts in every replica's command: `TrainSettings.from_args(parser.parse_args(s.to_argv())) == s`.

The recipe overrides (epochs ... seed, fine_tune_lr_factor) and freeze_epochs are None for "the recipe's value";
pipeline parameters cannot be None, so `from_pipeline` reads their 0 (freeze_epochs: -1) as unset.
"""

from __future__ import annotations

import argparse
import dataclasses

from components.params import FRAMEWORKS
from components.train.models import BACKBONES, DEFAULT_MODEL
from components.train.recipes import DEFAULT_RECIPE, PRECISIONS, RECIPES, Recipe, resolve_recipe

MODULE = "components.train"  # what `python -m` runs: the training CLI
INPUT_MODES = ("auto", "memory", "stream")
JIT_CHOICES = ("auto", "on", "off")
# Recipe fields a run may override; the other recipe knobs (schedule shape, warm-up, ...) come from the preset.
RECIPE_OVERRIDES = ("epochs", "batch_size", "learning_rate", "scale_lr", "steps_per_execution", "precision",
                    "jit_compile", "seed", "fine_tune_lr_factor")
# Directories (and the shared GPU) that may be absent: launchers and ops pass "" for "none", which means None here.
OPTIONAL_DIRS = ("augmented_dir", "backup_dir", "tensorboard_dir", "weights_cache", "shared_gpu", "stage_dir")


def _option(help: str, **argparse_kwargs) -> dict:
    """A field's command-line option: its help and argparse keywords (type, choices, required)."""
    return {"cli": {"help": help, **argparse_kwargs}}


@dataclasses.dataclass(frozen=True)
class TrainSettings:
    dataset_dir: str = dataclasses.field(metadata=_option("output of preprocess", required=True))
    model_dir: str = dataclasses.field(metadata=_option("where the model and training.json go", required=True))
    augmented_dir: str | None = dataclasses.field(default=None, metadata=_option("output of augment (optional)"))
    framework: str = dataclasses.field(default=FRAMEWORKS[0], metadata=_option(
        "what trains the model: tensorflow (tf.distribute, TF_CONFIG), torch (DDP; several processes under "
        "torchrun) or jax (jax.distributed) (default: %(default)s)", choices=FRAMEWORKS))
    recipe: str = dataclasses.field(default=DEFAULT_RECIPE, metadata=_option(
        "preset (default: %(default)s; reference: the classic 12-epoch recipe)", choices=sorted(RECIPES)))
    epochs: int | None = dataclasses.field(default=None, metadata=_option("default: the recipe's", type=int))
    batch_size: int | None = dataclasses.field(default=None, metadata=_option("per replica", type=int))
    learning_rate: float | None = dataclasses.field(default=None, metadata=_option("for one replica", type=float))
    scale_lr: bool | None = dataclasses.field(default=None, metadata=_option(
        "scale the learning rate with the replicas (--no-scale-lr keeps it when replicas are added)",
        action=argparse.BooleanOptionalAction))
    steps_per_execution: int | None = dataclasses.field(default=None, metadata=_option(
        "training steps per call into the TF runtime", type=int))
    precision: str | None = dataclasses.field(default=None, metadata=_option("default: the recipe's",
                                                                             choices=PRECISIONS))
    jit_compile: str | None = dataclasses.field(default=None, metadata=_option("XLA (default: the recipe's)",
                                                                               choices=JIT_CHOICES))
    seed: int | None = dataclasses.field(default=None, metadata=_option("initial weights and data order", type=int))
    model: str = dataclasses.field(default=DEFAULT_MODEL, metadata=_option(
        f"the network: {DEFAULT_MODEL} (default), {', '.join(BACKBONES)}, or module:function, your own builder "
        "taking (image_shape, num_classes) and returning an uncompiled keras.Model producing logits"))
    pretrained: str = dataclasses.field(default="none", metadata=_option(
        "initial weights: none (default), imagenet, or the path/gs:// URI of a .weights.h5 or .keras file or of a "
        "registered model's directory"))
    freeze_epochs: int | None = dataclasses.field(default=None, metadata=_option(
        "epochs that train the head with the backbone frozen (pretrained weights only; default: the recipe's when "
        "the weights leave the head untrained, else 0)", type=int))
    fine_tune_layers: int = dataclasses.field(default=0, metadata=_option(
        "after the frozen epochs, train the backbone's top N layers only (default: 0, all)", type=int))
    fine_tune_lr_factor: float | None = dataclasses.field(default=None, metadata=_option(
        "pretrained weights train at learning_rate x this (default: the recipe's)", type=float))
    weights_cache: str | None = dataclasses.field(default=None, metadata=_option(
        "folder or gs:// prefix where `pipectl weights` staged ImageNet weights (pretrained imagenet without "
        "internet)"))
    backup_dir: str | None = dataclasses.field(default=None, metadata=_option(
        "durable checkpoint directory, one per run and task"))
    checkpoint_seconds: float = dataclasses.field(default=120.0, metadata=_option(
        "checkpoint within an epoch at most this often (default: %(default)s)", type=float))
    input_mode: str = dataclasses.field(default="auto", metadata=_option(
        "hold the training images in memory, stream them, or choose by size (default: %(default)s)",
        choices=INPUT_MODES))
    tensorboard_dir: str | None = dataclasses.field(default=None, metadata=_option("TensorBoard logs (chief only)"))
    stage_dir: str | None = dataclasses.field(default=None, metadata=_option(
        "copy the datasets' shards here (a local-SSD emptyDir) before the first epoch, verified, and train from the "
        "copy; checkpoints and the model stay where they are (components/train/staging.py)"))
    shared_gpu: str | None = dataclasses.field(default=None, metadata=_option(
        "the GPU is a share of one, as the placement step describes it (mig 1g.10gb, time-sharing 4, mps 2): on a "
        "time-shared or MPS GPU the framework takes memory as it needs it instead of most of the GPU's"))

    def __post_init__(self):
        for name in OPTIONAL_DIRS:
            if getattr(self, name) == "":
                object.__setattr__(self, name, None)

    def resolve_recipe(self) -> Recipe:
        """The named preset with this run's overrides, validated (ValueError says what is wrong)."""
        return resolve_recipe(self.recipe, **{name: getattr(self, name) for name in RECIPE_OVERRIDES})

    # ------------------------------------------------------------------------------------------ the CLI's view

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser) -> None:
        """One option per field: --dataset-dir, --epochs, --no-scale-lr, ..."""
        for field in dataclasses.fields(cls):
            options = dict(field.metadata["cli"])
            if field.default is not dataclasses.MISSING:
                options["default"] = field.default
            parser.add_argument(_flag(field.name), dest=field.name, **options)

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> "TrainSettings":
        return cls(**{field.name: getattr(args, field.name) for field in dataclasses.fields(cls)})

    def to_argv(self) -> list[str]:
        """The training CLI's arguments for these settings (unset values left out)."""
        argv: list[str] = []
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if value is None:
                continue
            if isinstance(value, bool):
                argv.append(_flag(field.name) if value else _flag("no_" + field.name))
            else:
                argv += [_flag(field.name), str(value)]
        return argv

    def command(self, python: str = "python") -> list[str]:
        """The whole command a replica runs: `python -m components.train` with these settings."""
        return [python, "-m", MODULE, *self.to_argv()]

    # ------------------------------------------------------------------------------------------ the pipeline's view

    @classmethod
    def from_pipeline(cls, dataset_dir: str, model_dir: str, *, epochs: int = 0, batch_size: int = 0,
                      learning_rate: float = 0.0, freeze_epochs: int = -1, fine_tune_lr_factor: float = 0.0,
                      **settings) -> "TrainSettings":
        """Settings from pipeline parameters, where 0 (freeze_epochs: -1) stands for "the recipe's value" (they
        cannot be None)."""
        return cls(dataset_dir, model_dir, epochs=epochs or None, batch_size=batch_size or None,
                   learning_rate=learning_rate or None, freeze_epochs=None if freeze_epochs < 0 else freeze_epochs,
                   fine_tune_lr_factor=fine_tune_lr_factor or None, **settings)


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")
