"""The command line of the training step (`python -m components.train`): what each replica of a multi-node job
runs; `TF_CONFIG` tells it its role. Its options are `TrainSettings`' fields."""

from __future__ import annotations

import argparse
import json
import logging
import sys

from components import data
from components.train.faults import EXIT_OK, EXIT_PERMANENT, NonFiniteLossError, PermanentFailure, attempt
from components.train.loop import TrainingLoop
from components.train.settings import TrainSettings


def run(settings: TrainSettings) -> int:
    """Trains with the given settings and returns the documented exit code."""
    try:
        result = attempt(TrainingLoop(settings).run, settings.backup_dir)
    except SystemExit as e:
        return int(e.code)
    except (PermanentFailure, data.DataError, ValueError, NonFiniteLossError) as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_PERMANENT
    json.dump(result.to_json(), sys.stdout, indent=2)
    print()
    return EXIT_OK


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m components.train",
        description="Train the image classifier (one worker of several when TF_CONFIG names a cluster).")
    TrainSettings.add_arguments(parser)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    return run(TrainSettings.from_args(args))
