"""The command line of the training step (`python -m components.train`): what each replica of a multi-node job
runs; `TF_CONFIG` tells it its role."""

from __future__ import annotations

import argparse
import json
import logging
import sys

from components import data
from components.train.faults import EXIT_OK, EXIT_PERMANENT, NonFiniteLossError, PermanentFailure, attempt
from components.train.loop import train
from components.train.recipes import DEFAULT_RECIPE, PRECISIONS, RECIPES


def run(args: argparse.Namespace) -> int:
    """Trains with the parsed arguments and returns the documented exit code."""
    try:
        result = attempt(lambda: train(
            args.dataset_dir, args.model_dir, augmented_dir=args.augmented_dir, recipe=args.recipe,
            epochs=args.epochs, batch_size=args.batch_size, learning_rate=args.learning_rate, scale_lr=args.scale_lr,
            steps_per_execution=args.steps_per_execution, precision=args.precision, jit_compile=args.jit_compile,
            seed=args.seed, backup_dir=args.backup_dir, tensorboard_dir=args.tensorboard_dir,
            checkpoint_seconds=args.checkpoint_seconds, input_mode=args.input_mode), args.backup_dir)
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
    parser.add_argument("--dataset-dir", required=True, help="output of preprocess")
    parser.add_argument("--augmented-dir", help="output of augment (optional)")
    parser.add_argument("--model-dir", required=True)
    parser.add_argument("--recipe", default=DEFAULT_RECIPE, choices=sorted(RECIPES),
                        help="preset (default: %(default)s; reference: the classic 12-epoch recipe)")
    parser.add_argument("--epochs", type=int)
    parser.add_argument("--batch-size", type=int, help="per replica")
    parser.add_argument("--learning-rate", type=float, help="for one replica")
    parser.add_argument("--no-scale-lr", dest="scale_lr", action="store_const", const=False,
                        help="keep the learning rate when replicas are added")
    parser.add_argument("--steps-per-execution", type=int)
    parser.add_argument("--precision", choices=PRECISIONS)
    parser.add_argument("--jit-compile", choices=("auto", "on", "off"))
    parser.add_argument("--seed", type=int)
    parser.add_argument("--backup-dir", help="durable checkpoint directory, one per run and task")
    parser.add_argument("--checkpoint-seconds", type=float, default=120.0,
                        help="checkpoint within an epoch at most this often (default: %(default)s)")
    parser.add_argument("--input-mode", choices=("auto", "memory", "stream"), default="auto")
    parser.add_argument("--tensorboard-dir")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    return run(args)
