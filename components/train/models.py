"""The networks training can build: the catalogue (the reference CNN and Keras Applications backbones with a
classification head), bring-your-own builders named `module:function`, and the checks run before any training.

Every model takes raw 0-255 pixels of the training size and returns logits: each backbone's own input
preprocessing is part of the model (MobileNetV3, EfficientNetV2 and ConvNeXt rescale/normalise themselves; ResNet50
gets its caffe-style preprocessing as a frozen layer), so the exported model and SavedModel serve raw pixels.
Grayscale (1-channel) images are repeated to three channels inside a backbone model, so RGB weights fit it; ImageNet
weights are refused for 1-channel data all the same (see `problems`).

Transfer learning freezes "the backbone": the nested layer named `backbone` when the model has one (every
catalogue backbone; a bring-your-own model may name one), else every layer but the last (the logits).

This module imports no TensorFlow at import time: pipectl uses its checks.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import sys

DEFAULT_MODEL = "reference-cnn"
HEAD_DROPOUT = 0.2
MIN_BACKBONE_SIZE = 32  # Keras Applications refuse smaller inputs
BATCHNORM_MOMENTUM_MAX = 0.9  # EfficientNetV2's own; see _cap_batchnorm_momentum
BACKBONE = "backbone"  # the name of the part that transfer learning freezes
IMAGENET_MEAN_BGR = (103.939, 116.779, 123.68)  # what keras.applications.resnet50.preprocess_input subtracts


@dataclasses.dataclass(frozen=True)
class Backbone:
    application: str  # the keras.applications constructor
    builtin_preprocessing: bool  # takes include_preprocessing=True (else caffe-style, as ResNet50)


BACKBONES = {
    "mobilenet-v3-small": Backbone("MobileNetV3Small", True),
    "mobilenet-v3-large": Backbone("MobileNetV3Large", True),
    "efficientnet-v2-b0": Backbone("EfficientNetV2B0", True),
    "resnet50": Backbone("ResNet50", False),
    "convnext-tiny": Backbone("ConvNeXtTiny", True),
}
MODELS = (DEFAULT_MODEL, *BACKBONES)


class ModelError(ValueError):
    """A model or pretrained-weights setting that cannot work: permanent (exit code 2), named for the user."""


def is_builder_path(name: str) -> bool:
    """Whether `name` is a bring-your-own `module:function` (not a catalogue name)."""
    return ":" in name


def name_problem(name: str) -> str | None:
    """What is wrong with a model name, without importing anything (None: a catalogue name or module:function)."""
    if name in MODELS:
        return None
    if is_builder_path(name):
        module, _, function = name.partition(":")
        identifiers = module.split(".") + [function]
        if all(part.isidentifier() for part in identifiers):
            return None
        return (f"must be module:function with a dotted module path and a function name, e.g. my_models.vision:build "
                f"(got {name!r})")
    return f"must be one of {', '.join(MODELS)}, or module:function for your own builder (got {name!r})"


def import_builder(name: str):
    """The callable named by `module:function`; ModelError says which part failed."""
    module_name, _, function_name = name.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise ModelError(f"model {name}: cannot import module {module_name!r} ({e}). The module must be importable "
                         "where the training step runs: install it in the training image, or put its folder on "
                         "PYTHONPATH") from e
    builder = getattr(module, function_name, None)
    if not callable(builder):
        raise ModelError(f"model {name}: module {module_name!r} ({getattr(module, '__file__', '?')}) has no "
                         f"function {function_name!r}")
    return builder


@contextlib.contextmanager
def dtype_policy(name: str):
    """Keras' global dtype policy set to `name` while models are built (Keras Applications take no dtype)."""
    import keras

    before = keras.config.dtype_policy()
    keras.config.set_dtype_policy(name)
    try:
        yield
    finally:
        keras.config.set_dtype_policy(before)


def build_model(image_shape: list[int] | tuple[int, ...], num_classes: int, dtype_policy: str = "float32"):
    """The reference CNN. Pixel scaling is part of the model, so serving takes raw 0-255 pixels."""
    import keras

    policy = keras.DTypePolicy(dtype_policy)
    return keras.Sequential([
        keras.Input(shape=tuple(image_shape), name="image"),
        keras.layers.Rescaling(1.0 / 255, dtype=policy),
        keras.layers.Conv2D(32, 3, activation="relu", dtype=policy),
        keras.layers.MaxPooling2D(dtype=policy),
        keras.layers.Flatten(dtype=policy),
        keras.layers.Dense(64, activation="relu", dtype=policy),
        keras.layers.Dense(num_classes, name="logits", dtype="float32"),  # softmax/loss stay in float32
    ], name="classifier")


def build(name: str, image_shape, num_classes: int, precision: str = "float32", native=None):
    """The uncompiled model `name` for images of `image_shape` (raw 0-255 pixels) and `num_classes` logits, its
    layers computing in `precision` (a Keras dtype policy; logits stay float32 in the catalogue's heads).
    `native(name, built, image_shape, num_classes)`: what a bring-your-own builder's result goes through (the
    framework's `Backend.native_model`: a torch.nn.Module becomes a Keras model on torch); default: `check_output`."""
    image_shape = tuple(int(n) for n in image_shape)
    if name == DEFAULT_MODEL:
        return build_model(image_shape, num_classes, precision)
    if name in BACKBONES:
        return _backbone_classifier(name, image_shape, num_classes, precision)
    problem = name_problem(name)
    if problem:
        raise ModelError(f"model {problem}")
    with dtype_policy(precision):
        return call_builder(name, import_builder(name), image_shape, num_classes, native)


def call_builder(name: str, builder, image_shape: tuple, num_classes: int, native=None):
    """The builder's model for (image_shape, num_classes), checked: a keras.Model by `check_output`, anything else
    by `native` (a framework's own model, see `build`); ModelError when it fails."""
    try:
        model = builder(image_shape, num_classes)
    except Exception as e:
        raise ModelError(f"model {name}({image_shape}, {num_classes}) failed: {type(e).__name__}: "
                         f"{str(e).splitlines()[0] if str(e) else ''}") from e
    if native is not None and not is_keras_model(model):
        return native(name, model, image_shape, num_classes)
    return check_output(name, model, image_shape, num_classes)


NATIVE_KIND = "native_kind"  # the attribute of a Keras model around a framework's own model: what that model is


def native_kind(model) -> str | None:
    """What framework-native model a Keras model wraps (e.g. "torch.nn.Module"), or None for Keras layers."""
    return getattr(model, NATIVE_KIND, None)


def is_keras_model(model) -> bool:
    import keras

    return isinstance(model, keras.Model)


def is_torch_module(model) -> bool:
    """Whether `model` is a torch.nn.Module of the builder's own, without importing torch (a builder that made one
    has imported it); Keras layers, which are torch modules on Keras' torch backend, are not."""
    torch, keras = sys.modules.get("torch"), sys.modules.get("keras")
    return torch is not None and isinstance(model, torch.nn.Module) and not (
        keras is not None and isinstance(model, keras.Layer))


def _backbone_classifier(name: str, image_shape: tuple, num_classes: int, precision: str):
    import keras

    spec = BACKBONES[name]
    height, width, channels = image_shape
    if min(height, width) < MIN_BACKBONE_SIZE:
        raise ModelError(f"model {name} needs images of at least {MIN_BACKBONE_SIZE}x{MIN_BACKBONE_SIZE} "
                         f"(got {height}x{width}): preprocess with image_size >= {MIN_BACKBONE_SIZE}")
    with dtype_policy(precision):
        inputs = keras.Input(shape=image_shape, name="image")
        x = inputs
        if channels == 1:  # gray -> three equal channels: the backbones (and RGB weights) expect RGB
            x = keras.layers.Concatenate(name="grayscale_to_rgb", dtype="float32")([x, x, x])
        if not spec.builtin_preprocessing:  # resnet50.preprocess_input: RGB -> BGR, minus the ImageNet mean
            x = _caffe_preprocessing()(x)
        options = {"include_preprocessing": True} if spec.builtin_preprocessing else {}
        backbone = getattr(keras.applications, spec.application)(
            include_top=False, weights=None, input_shape=(height, width, 3), **options)
        backbone.name = BACKBONE
        _cap_batchnorm_momentum(backbone)
        x = backbone(x)
        x = keras.layers.GlobalAveragePooling2D(name="pool")(x)
        x = keras.layers.Dropout(HEAD_DROPOUT, name="dropout")(x)
        outputs = keras.layers.Dense(num_classes, name="logits", dtype="float32")(x)
    return keras.Model(inputs, outputs, name=name.replace("-", "_"))


def _cap_batchnorm_momentum(backbone) -> None:
    """BatchNormalization momentum at most BATCHNORM_MOMENTUM_MAX (EfficientNetV2 ships 0.9, ResNet50 0.99,
    MobileNetV3 0.999, tuned for ImageNet-length runs). With 0.999 or 0.99 the moving statistics lag the weights of
    a short run from scratch and the model in inference mode is near chance: MobileNetV3-small on 2,000 Fashion-MNIST
    images at 64x64, 3 epochs, reached 0.90 training accuracy and 0.06-0.09 validation accuracy, and 0.83 with 0.9.
    Pretrained weights are unaffected: their BatchNormalization layers are frozen while fine-tuning."""
    import keras

    for layer in backbone._flatten_layers():
        if isinstance(layer, keras.layers.BatchNormalization) and layer.momentum > BATCHNORM_MOMENTUM_MAX:
            layer.momentum = BATCHNORM_MOMENTUM_MAX


def _caffe_preprocessing():
    """keras.applications.resnet50.preprocess_input as a frozen Dense layer on the channel axis (a permutation
    and a bias): a built-in layer, so model.keras loads anywhere without custom code."""
    import keras
    import numpy as np

    layer = keras.layers.Dense(3, name="caffe_preprocessing", trainable=False, dtype="float32")
    layer.build((None, 3))
    layer.set_weights([np.eye(3, dtype="float32")[::-1], -np.array(IMAGENET_MEAN_BGR, dtype="float32")])
    return layer


def check_output(name: str, model, image_shape: tuple, num_classes: int):
    """`model` if it is a keras.Model mapping a batch of images to (batch, num_classes); else ModelError."""
    import keras
    import numpy as np

    if is_torch_module(model):
        raise ModelError(f"model {name} returned a torch.nn.Module ({type(model).__name__}), which trains with "
                         "--framework torch only (Keras' torch backend wraps it): run with --framework torch, or "
                         "return a keras.Model")
    if not isinstance(model, keras.Model):
        raise ModelError(f"model {name} returned {type(model).__name__}, not a keras.Model: the builder must return "
                         "an uncompiled keras.Model taking images (image_shape) and producing logits (or, with "
                         "--framework torch, a torch.nn.Module taking N x C x H x W pixels)")
    try:
        out = model(np.zeros((2, *image_shape), "float32"), training=False)
    except Exception as e:
        raise ModelError(f"model {name} fails on a batch of images of shape {image_shape}: "
                         f"{str(e).splitlines()[0] if str(e) else type(e).__name__}") from e
    shape = tuple(getattr(out, "shape", ()))
    if shape != (2, num_classes):
        raise ModelError(f"model {name} produces outputs of shape {shape} for a batch of 2 images of shape "
                         f"{image_shape}; it must produce (batch, num_classes) = (2, {num_classes}) logits")
    return model


def problems(model: str, pretrained: str, *, channels: int | None = None, image_size: int | None = None,
             freeze_epochs: int | None = None, fine_tune_layers: int = 0, epochs: int | None = None) -> list[str]:
    """What is wrong with these settings, without building or importing anything (pipectl and the step share it).
    None/unknown values skip their checks."""
    found = []
    problem = name_problem(model)
    if problem:
        return [f"model {problem}"]
    if model in BACKBONES and image_size is not None and image_size < MIN_BACKBONE_SIZE:
        found.append(f"model {model} needs image_size >= {MIN_BACKBONE_SIZE} (got {image_size})")
    if pretrained == "imagenet":
        if model not in BACKBONES:
            found.append(f"pretrained imagenet: there are ImageNet weights for the catalogue's backbones "
                         f"({', '.join(BACKBONES)}), not for {model}; pass a weights file instead")
        elif channels == 1:
            found.append("pretrained imagenet needs RGB images (the ImageNet weights were learned on colour photos): "
                         "preprocess with channels=3 (grayscale sources become three equal channels), or pass "
                         "pretrained none or a weights file")
    elif not pretrained:
        found.append("pretrained must be none, imagenet, or the path or gs:// URI of a .weights.h5 or .keras file or "
                     "of a registered model's directory")
    if freeze_epochs is not None and freeze_epochs < 0:
        found.append(f"freeze_epochs must be >= 0 (got {freeze_epochs})")
    if fine_tune_layers < 0:
        found.append(f"fine_tune_layers must be >= 0, 0 for all (got {fine_tune_layers})")
    if pretrained == "none":
        if freeze_epochs:
            found.append(f"freeze_epochs {freeze_epochs} with pretrained none would train only the head on a random "
                         "backbone: give pretrained weights, or freeze_epochs 0")
        if fine_tune_layers:
            found.append("fine_tune_layers applies to pretrained weights: give pretrained weights, or "
                         "fine_tune_layers 0")
    if freeze_epochs is not None and epochs is not None and freeze_epochs > epochs:
        found.append(f"freeze_epochs {freeze_epochs} is more than the {epochs} epochs of training")
    return found


# ---------------------------------------------------------------------------------------------- transfer learning


def backbone_layers(model) -> list:
    """The layers transfer learning freezes: those of the nested `backbone` model, else all but the last."""
    nested = next((layer for layer in model.layers if layer.name == BACKBONE), None)
    if nested is not None and hasattr(nested, "layers"):
        return list(nested.layers)
    return [layer for layer in model.layers[:-1]]


def set_phase(model, phase: int, *, fine_tune_layers: int = 0, frozen_batchnorm: bool = True) -> None:
    """Phase 1: the backbone frozen, the head trains. Phase 2: the backbone trains (all of it, or its top
    `fine_tune_layers` layers). BatchNormalization layers of the backbone stay frozen when `frozen_batchnorm`
    (pretrained weights): Keras runs a non-trainable BatchNormalization in inference mode, so its statistics stay
    the pretrained ones (calling the backbone with training=False in the functional graph does not hold in Keras 3
    when the outer model is called with training=True)."""
    import keras

    model.trainable = True  # recursive: every layer, nested ones too; then the backbone's choice per layer
    layers = backbone_layers(model)
    unfrozen = set()
    if phase == 2:
        unfrozen = {id(layer) for layer in (layers[-fine_tune_layers:] if fine_tune_layers else layers)}
    for layer in layers:
        batchnorm = frozen_batchnorm and isinstance(layer, keras.layers.BatchNormalization)
        layer.trainable = id(layer) in unfrozen and not batchnorm
