"""Can a serving container's TensorFlow load and serve the SavedModel that training writes?

Two halves, run in two Python environments:

    # 1. with the project's TensorFlow: train the reference CNN a few steps, export it with the train step's own
    #    write_model (components/train/model.py), and keep inputs and the trainer's own predictions
    python -m tests.benchmarks.serving_compat export /tmp/serving-compat

    # 2. with the serving container's TensorFlow (e.g. a scratch venv with tensorflow-cpu==2.15.*, the TensorFlow
    #    of Vertex AI's tf2-cpu.2-15 container): load each SavedModel as TensorFlow Serving does (the SavedModel
    #    loader into a session, the signature run by its tensor names) and as tf.saved_model.load does, and
    #    compare the predictions with the trainer's
    /path/to/venv/bin/python tests/benchmarks/serving_compat.py check /tmp/serving-compat

The check half imports nothing from the project (only tensorflow and numpy), so it runs in any environment
that has the serving TensorFlow. It prints one JSON line per model and signature and exits non-zero when a
model does not load or a prediction differs by more than --tolerance.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

# (name, image shape, network): the reference CNN on Fashion-MNIST's grayscale 28 px (pixels only) and on 64 px RGB
# photos, whose SavedModel also serves JPEG/PNG file bytes (the decode and resize ops inside the model), and a
# Keras Applications backbone (its own preprocessing and hard-swish inside; untrained weights, nothing downloaded).
CASES = (("fashion-28x28x1", (28, 28, 1), "reference-cnn"), ("photos-64x64x3", (64, 64, 3), "reference-cnn"),
         ("mobilenet-v3-small-64x64x3", (64, 64, 3), "mobilenet-v3-small"))
NUM_CLASSES = 10
BATCH = 8


def _cases(names=None):
    unknown = set(names or ()) - {case[0] for case in CASES}
    if unknown:
        raise ValueError(f"unknown model(s) {sorted(unknown)}; known: {[case[0] for case in CASES]}")
    return [case for case in CASES if not names or case[0] in names]


def export(out_dir: str, seed: int = 7, names=None) -> list[dict]:
    import keras
    import numpy as np
    import tensorflow as tf

    from components.dataio.images import encode_png
    from components.train import model as train_model
    from components.train import models

    written = []
    for name, shape, network_name in _cases(names):
        keras.utils.set_random_seed(seed)
        rng = np.random.default_rng(seed)
        network = models.build(network_name, shape, NUM_CLASSES)
        network.compile(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        pixels = rng.integers(0, 256, size=(64, *shape)).astype("float32")
        network.fit(pixels, rng.integers(0, NUM_CLASSES, size=64), epochs=1, batch_size=16, verbose=0)
        model_dir = os.path.join(out_dir, name)
        train_model.write_model(network, shape, NUM_CLASSES, model_dir, network_name)
        served = tf.saved_model.load(os.path.join(model_dir, "saved_model"))
        inputs = pixels[:BATCH]
        arrays = {"pixels": inputs,
                  "expected_pixels": served.signatures["serving_default"](
                      tf.constant(inputs))[_only_output(served.signatures["serving_default"])].numpy()}
        if train_model.SERVE_IMAGE_FILES in served.signatures:
            files = np.array([encode_png(image.astype("uint8")) for image in inputs], dtype=object)
            signature = served.signatures[train_model.SERVE_IMAGE_FILES]
            arrays["files"] = files
            arrays["expected_files"] = signature(tf.constant(list(files)))[_only_output(signature)].numpy()
        np.savez(os.path.join(model_dir, "compat.npz"), **arrays)
        written.append({"model": name, "tensorflow": tf.__version__, "keras": keras.__version__,
                        "signatures": sorted(served.signatures)})
    with open(os.path.join(out_dir, "exported.json"), "w") as f:
        json.dump(written, f, indent=1)
    return written


def _only_output(signature) -> str:
    (key,) = signature.structured_outputs
    return key


def check(out_dir: str, names=None) -> list[dict]:
    import numpy as np
    import tensorflow as tf

    results = []
    for name, _, _ in _cases(names):
        model_dir = os.path.join(out_dir, name)
        arrays = np.load(os.path.join(model_dir, "compat.npz"), allow_pickle=True)
        path = os.path.join(model_dir, "saved_model")
        requests = [("serving_default", arrays["pixels"], arrays["expected_pixels"])]
        if "files" in arrays:
            requests.append(("serve_image_files", arrays["files"], arrays["expected_files"]))
        for signature_name, inputs, expected in requests:
            result = {"model": name, "signature": signature_name, "tensorflow": tf.__version__}
            try:
                result["session_max_abs_diff"] = _max_diff(_run_in_session(path, signature_name, inputs), expected)
                loaded = tf.saved_model.load(path)
                signature = loaded.signatures[signature_name]
                got = signature(tf.constant(list(inputs) if inputs.dtype == object else inputs))
                result["function_max_abs_diff"] = _max_diff(got[_only_output(signature)].numpy(), expected)
                result["loads"] = True
            except Exception as error:  # the finding is the error itself: what the server would log
                result.update(loads=False, error=f"{type(error).__name__}: {str(error).splitlines()[0][:300]}")
            results.append(result)
    return results


def _run_in_session(path: str, signature_name: str, inputs):
    """What TensorFlow Serving does: LoadSavedModel (tag `serve`) into a session, then Session.Run with the
    signature's input and output tensor names."""
    import tensorflow as tf

    graph = tf.Graph()
    with tf.compat.v1.Session(graph=graph) as session:
        meta_graph = tf.compat.v1.saved_model.loader.load(session, ["serve"], path)
        signature = meta_graph.signature_def[signature_name]
        (input_info,) = signature.inputs.values()
        (output_info,) = signature.outputs.values()
        feed = list(inputs) if inputs.dtype == object else inputs
        return session.run(output_info.name, feed_dict={input_info.name: feed})


def _max_diff(got, expected) -> float:
    import numpy as np

    if got.shape != expected.shape:
        raise ValueError(f"output shape {got.shape} != {expected.shape}")
    return float(np.max(np.abs(got.astype("float64") - expected.astype("float64"))))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("action", choices=("export", "check"))
    parser.add_argument("out_dir")
    parser.add_argument("--tolerance", type=float, default=1e-5, help="largest accepted |difference| of a probability")
    parser.add_argument("--model", action="append", help="only this model (repeatable; default: all of CASES)")
    args = parser.parse_args(argv)
    if args.action == "export":
        for line in export(args.out_dir, names=args.model):
            print(json.dumps(line))
        return 0
    results = check(args.out_dir, names=args.model)
    for line in results:
        print(json.dumps(line))
    bad = [r for r in results if not r["loads"] or max(r["session_max_abs_diff"], r["function_max_abs_diff"]) > args.tolerance]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
