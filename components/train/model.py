"""The hardware choices around the model: precision, XLA, GPU visibility, and the float32 export that serving
loads. The networks (the reference CNN, the backbones, bring-your-own) are in `models`."""

from __future__ import annotations

import contextlib
import os
import sys

from components.dataio import data
from components.train import models


# What to run in the TensorFlow image to see the GPUs as TensorFlow sees them (the other backends pass their own).
TF_GPU_PROBE = "python3 -c \"import tensorflow as tf; print(tf.config.list_physical_devices('GPU'))\""


def check_gpus_visible(gpus: list, device_dir: str = "/dev", *, framework: str = "TensorFlow",
                       probe: str = TF_GPU_PROBE) -> None:
    """Fails fast when the pod was given GPUs (the device plugin mounts /dev/nvidiaN) but `framework` sees none:
    a driver/CUDA mismatch in the image would otherwise train on the CPU of a GPU node, silently and slowly. (A
    driver older than the framework's CUDA is caught before, by name: components/gpu_driver.py.)"""
    try:
        devices = [n for n in os.listdir(device_dir) if n.startswith("nvidia") and n[len("nvidia"):].isdigit()]
    except OSError:
        return
    if devices and not gpus:
        raise RuntimeError(f"This machine has GPU devices ({', '.join(sorted(devices))} in {device_dir}) but "
                           f"{framework} sees none: the image's CUDA/cuDNN does not match the node's driver. Check "
                           f"with: {probe}")


def cpu_has_bf16() -> bool:
    """Whether the CPU computes in bfloat16 natively (AVX512-BF16 or AMX)."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((line for line in f if line.startswith("flags")), "").split()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def precision_for(requested: str, capability: tuple[int, int] | None, cpu_bf16: bool = False) -> str:
    """The Keras dtype policy for `requested` on a device of CUDA compute `capability` (None: the CPU), the same rule
    on every framework. auto: bf16 on GPUs of capability >= 8.0 (A100, L4, H100, H200), fp16 on 7.x (T4, V100),
    float32 on older GPUs; on a CPU, bf16 only where `cpu_bf16` (the CPU computes it natively and the framework's
    kernels are faster in it: TensorFlow's oneDNN ones, 5-50% on this machine; torch's and JAX's trained several
    times slower, so their backends pass False). An explicit policy is taken as it is, on a CPU too."""
    if requested != "auto":
        return requested
    if capability is None:
        return "mixed_bfloat16" if cpu_bf16 else "float32"
    if tuple(capability) >= (8, 0):
        return "mixed_bfloat16"
    if tuple(capability) >= (7, 0):
        return "mixed_float16"
    return "float32"


def tf_gpu_capability(gpus: list) -> tuple[int, int] | None:
    """The compute capability of the first of TensorFlow's `gpus` (PhysicalDevices); None without one."""
    if not gpus:
        return None
    import tensorflow as tf

    return tuple(tf.config.experimental.get_device_details(gpus[0]).get("compute_capability", (0, 0)))


def resolve_jit(requested: str, gpus: list) -> bool:
    return requested == "on" or (requested == "auto" and bool(gpus))



# The SavedModel's signature for JPEG/PNG file bytes (models of source datasets, from 64 px): the readers' resize
# rule, data.decode_to_shape, inside the model, so a server given the files sees the pixels evaluation saw.
SERVE_IMAGE_FILES = "serve_image_files"


SAVED_MODEL_PENDING = "saved_model.pending.json"  # model.keras written where TensorFlow is not installed


def write_model(model, image_shape, num_classes: int, model_dir: str, model_name: str = "reference-cnn") -> None:
    """Writes model.keras and saved_model/ in float32, whatever precision training used: the same network
    (`model_name`, see components/train/models.py) built again in float32 with the trained weights. The
    SavedModel serves pixels ("serving_default") and, for models of source datasets, image files
    (SERVE_IMAGE_FILES)."""
    export = write_keras_model(model, image_shape, num_classes, model_dir, model_name)
    write_saved_model(export, image_shape, model_dir)


def write_keras_model(model, image_shape, num_classes: int, model_dir: str, model_name: str):
    """model.keras in float32 (any Keras backend); returns the float32 model."""
    export = models.build(model_name, image_shape, num_classes, "float32")
    export.set_weights([w.numpy() if hasattr(w, "numpy") else w for w in model.get_weights()])
    data.gfile().makedirs(model_dir)
    export.save(data.join(model_dir, "model.keras"))
    return export


def write_saved_model(export, image_shape, model_dir: str, saved_model_dir: str | None = None) -> None:
    """saved_model/ of a float32 Keras model (Keras on its TensorFlow backend); into `saved_model_dir` instead
    when given."""
    import keras
    import tensorflow as tf

    inference = keras.Sequential([export, keras.layers.Softmax(name="probabilities")], name="inference")
    archive = keras.export.ExportArchive()  # what inference.export does, plus the image-file endpoint
    archive.track(inference)
    archive.add_endpoint("serve", lambda pixels: inference(pixels, training=False),  # also "serving_default"
                         input_signature=[tf.TensorSpec([None, *image_shape], tf.float32)])
    if data.record_encoding(image_shape[1], "file") == data.SOURCE:
        archive.add_endpoint(SERVE_IMAGE_FILES, lambda contents: inference(tf.map_fn(
            lambda one: tf.cast(data.decode_to_shape(one, list(image_shape)), tf.float32), contents,
            fn_output_signature=tf.TensorSpec(image_shape, tf.float32)), training=False),
            input_signature=[tf.TensorSpec([None], tf.string)])
    with contextlib.redirect_stdout(sys.stderr):
        archive.write_out(saved_model_dir or data.join(model_dir, "saved_model"), verbose=False)


def complete_saved_model(model_dir: str, image_shape: list[int] | None = None, model_name: str | None = None,
                         output_dir: str | None = None) -> bool:
    """Writes saved_model/ from model_dir's model.keras, and removes the pending marker: the SavedModel of a model
    trained on another framework. The image shape and model name are training.json's unless given. Needs Keras on
    its TensorFlow backend (a process of its own: python -m components.train.export MODEL_DIR). False when there
    was nothing to do. With `output_dir`, the SavedModel is written there and model_dir is left as it is (the
    register step's copy for serving, where the train step's output cannot be written)."""
    import json

    import keras

    marker = data.join(model_dir, SAVED_MODEL_PENDING)
    if output_dir is None and data.gfile().exists(data.join(model_dir, "saved_model", "saved_model.pb")) and \
            not data.gfile().exists(marker):
        return False
    if image_shape is None or model_name is None:
        with data.gfile().GFile(data.join(model_dir, "training.json")) as f:
            info = json.load(f)
        image_shape, model_name = info["image_shape"], (info.get("model") or {}).get("name", "")
    builder = model_name
    if ":" in builder:  # a bring-your-own model: its module registers its custom layers, if it has any
        models.import_builder(builder)
    export = keras.models.load_model(data.join(model_dir, "model.keras"), compile=False)
    write_saved_model(export, list(image_shape), model_dir, output_dir)
    if output_dir is None and data.gfile().exists(marker):
        data.gfile().remove(marker)
    return True
