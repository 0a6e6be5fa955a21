"""`python -m components.train.export MODEL_DIR`: the SavedModel of a model trained on PyTorch or JAX, written from
its model.keras by Keras on its TensorFlow backend (model.complete_saved_model), in a process of its own because
a process holds Keras on one backend only. Run by the training step where TensorFlow is installed; elsewhere (the
PyTorch image, where runs on torch and jax train) the step leaves model.SAVED_MODEL_PENDING, and the register step
runs it with --output-dir for the copy it serves (components/registry/vertex.py)."""

from __future__ import annotations

import argparse
import os
import sys

NO_TENSORFLOW = 3  # the exit code when TensorFlow cannot be imported here


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m components.train.export", description=__doc__.splitlines()[0])
    parser.add_argument("model_dir")
    parser.add_argument("--image-shape", help="H,W,C (default: training.json's)")
    parser.add_argument("--model", help="the network's name (default: training.json's)")
    parser.add_argument("--output-dir", help="write the SavedModel here and leave MODEL_DIR as it is (default: "
                                             "MODEL_DIR/saved_model, removing the pending marker)")
    args = parser.parse_args(argv)
    os.environ["KERAS_BACKEND"] = "tensorflow"  # before keras is first imported
    try:
        import tensorflow  # noqa: F401
    except ImportError as e:
        print(f"no TensorFlow here: {e}", file=sys.stderr)
        return NO_TENSORFLOW
    from components.train.model import complete_saved_model

    shape = [int(n) for n in args.image_shape.split(",")] if args.image_shape else None
    complete_saved_model(args.model_dir, shape, args.model, args.output_dir)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
