"""The command line of the training step (`python -m components.train`): what each replica of a multi-node job
runs; `TF_CONFIG` tells it its role. Its options are `TrainSettings`' fields; its exit codes are the contract in
the package docstring."""

from __future__ import annotations

import argparse

from components import stepcli
from components.train import frameworks
from components.train.faults import attempt
from components.train.loop import TrainingLoop
from components.train.settings import TrainSettings


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m components.train",
        description="Train the image classifier (one worker of several when TF_CONFIG names a cluster).")
    TrainSettings.add_arguments(parser)
    return parser


def main(argv: list[str] | None = None) -> int:
    settings = TrainSettings.from_args(build_parser().parse_args(argv))
    frameworks.use(settings.framework)  # KERAS_BACKEND, before anything imports keras
    return stepcli.run(lambda: attempt(TrainingLoop(settings).run, settings.backup_dir))
