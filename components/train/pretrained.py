"""Pretrained weights: where they come from (`none`, `imagenet`, or the path/gs:// URI of a `.weights.h5` or
`.keras` file or of a registered model's directory), the local copy kept beside the checkpoints so that a retried
task does not fetch them again, loading them into the model (the whole classifier, or only its backbone), and
their digest for lineage."""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import logging
import os
import re
import tempfile
import warnings
import zipfile

from components.dataio import data
from components.train import models

log = logging.getLogger(__name__)

NONE, IMAGENET = "none", "imagenet"
WEIGHT_SUFFIXES = (".weights.h5", ".keras")
CACHE_FOLDER = "pretrained"  # under backup_dir


@dataclasses.dataclass(frozen=True)
class Weights:
    """What was loaded into the model: the source as given, the local file, its digest, and which part it covered."""

    source: str
    path: str | None = None
    sha256: str | None = None
    covers: str = ""  # "model" (the whole classifier, head included) or "backbone"; "" for none
    # What the source says it was trained as (training.json beside it: model name, class names, image shape), and
    # how many classes its own head had when only its backbone was taken (the head is new).
    source_model: dict | None = None
    source_classes: int | None = None
    file: str | None = None  # the cached file the ImageNet weights came from (weights_cache), when they did

    def lineage(self) -> dict:
        lineage = {"source": self.source, "sha256": self.sha256}
        if self.file:
            lineage["file"] = self.file
        if self.covers == "backbone" and self.source not in (NONE, IMAGENET):
            lineage["loaded"] = "backbone (a new head for this data's classes)"
        source_model = dict(self.source_model or {})
        if self.source_classes:
            source_model["num_classes"] = self.source_classes
        elif source_model.get("class_names"):
            source_model["num_classes"] = len(source_model["class_names"])
        if source_model:
            lineage["source_model"] = source_model
        return lineage


def check_settings(model: str, pretrained: str, image_shape, *, freeze_epochs: int | None = None,
                   fine_tune_layers: int = 0, epochs: int | None = None) -> None:
    """Refuses a model/pretrained setting that cannot work before anything is built (ModelError, exit code 2), and
    a weights source that does not exist; a bring-your-own builder is imported and its output checked when the
    model is built, before the first step."""
    found = models.problems(model, pretrained, channels=image_shape[-1], image_size=min(image_shape[:2]),
                            freeze_epochs=freeze_epochs, fine_tune_layers=fine_tune_layers, epochs=epochs)
    if found:
        raise models.ModelError("; ".join(found))
    if pretrained not in (NONE, IMAGENET):
        weights_file(pretrained)


def sha256_of(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def weights_file(source: str) -> str:
    """The file a source names: itself, or a registered model directory's model.keras (ModelError otherwise)."""
    gfile = data.gfile()
    if gfile.isdir(source):
        candidate = data.join(source, "model.keras")
        if gfile.exists(candidate):
            return candidate
        raise models.ModelError(f"pretrained {source} is a directory without model.keras: give a registered model's "
                                "directory, or a .weights.h5 or .keras file")
    if not source.endswith(WEIGHT_SUFFIXES):
        raise models.ModelError(f"pretrained {source}: expected a .weights.h5 or .keras file, or a registered model's "
                                "directory (holding model.keras)")
    if not gfile.exists(source):
        raise models.ModelError(f"pretrained {source} does not exist")
    return source


def _cache_dir(backup_dir: str | None) -> str:
    return data.join(backup_dir, CACHE_FOLDER) if backup_dir else tempfile.mkdtemp(prefix="pretrained-")


def _local_copy(remote: str, name: str, cache_dir: str, *, write_cache: bool) -> str:
    """A local path holding `remote`'s bytes, taken from the cache when it has them, else copied (and cached)."""
    gfile = data.gfile()
    cached = data.join(cache_dir, name)
    local_dir = tempfile.mkdtemp(prefix="pretrained-")
    local = os.path.join(local_dir, name)
    if gfile.exists(cached):
        log.info("train: pretrained weights from the cache %s", cached)
        gfile.copy(cached, local, overwrite=True)
        return local
    gfile.copy(remote, local, overwrite=True)
    if write_cache:
        _publish(local, cached)
    return local


def fetch(source: str, model_name: str, *, backup_dir: str | None, write_cache: bool = True) -> str | None:
    """A local file with the weights `source` names (None for none). `imagenet` is fetched when loading."""
    if source in (NONE, IMAGENET):
        return None
    remote = weights_file(source)
    key = hashlib.sha256(remote.encode()).hexdigest()[:12]
    return _local_copy(remote, f"{key}-{os.path.basename(remote)}", _cache_dir(backup_dir), write_cache=write_cache)


def load(model, model_name: str, source: str, *, backup_dir: str | None = None, write_cache: bool = True,
         weights_cache: str | None = None) -> Weights:
    """Loads `source`'s weights into `model` (built by models.build(model_name, ...)); ModelError when they do not
    fit, naming both architectures. `write_cache`: this process writes the cache (the chief). `weights_cache`: where
    `pipectl weights` staged ImageNet weights (for steps without internet)."""
    if source == NONE:
        return Weights(NONE)
    if models.native_kind(model):
        raise models.ModelError(f"pretrained {source}: model {model_name} is a {models.native_kind(model)}, whose "
                                "starting weights are its builder's to load (e.g. module.load_state_dict(...)): "
                                "pass pretrained none")
    if source == IMAGENET:
        return _load_imagenet(model, model_name, backup_dir, write_cache, weights_cache)
    local = fetch(source, model_name, backup_dir=backup_dir, write_cache=write_cache)
    covers, source_classes = _load_file(model, model_name, local, source)
    log.info("train: pretrained weights (%s) loaded into the %s from %s", covers, model_name, source)
    return Weights(source, local, sha256_of(local), covers, source_info(source), source_classes)


def _try_load(target, path: str) -> str | None:
    """Loads `path` into `target`; the problem when it does not fit (Keras' first line), else None."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Keras warns per layer before raising one error
        try:
            target.load_weights(path)
        except Exception as e:  # Keras raises ValueError/KeyError/OSError by the kind of mismatch
            return str(e).splitlines()[0] if str(e) else type(e).__name__
    return None


def _load_file(model, model_name: str, local: str, source: str) -> tuple[str, int | None]:
    """Loads `local` into `model`: ("model", None) when it is this very classifier; ("backbone", None) when it
    holds a backbone alone; ("backbone", N) when it holds a classifier of the same network with N classes of its
    own or another image size (its backbone is taken, the head stays new). ModelError when none fits."""
    problem = _try_load(model, local)
    if problem is None:
        return "model", None
    backbone = next((layer for layer in model.layers if layer.name == models.BACKBONE), None)
    if backbone is not None and _try_load(backbone, local) is None:
        return "backbone", None
    source_classes = classifier_classes(local)
    if source_classes:
        backbone_problem = _load_backbone_of_classifier(model, model_name, local, source_classes)
        if backbone_problem is None:
            return "backbone", source_classes
        problem = backbone_problem
    saved_from = saved_architecture(source, local)
    raise models.ModelError(
        f"pretrained {source} holds weights {'for ' + saved_from if saved_from else 'of another architecture'}, "
        f"which do not fit model {model_name} ({model.outputs[0].shape[-1]} classes, "
        f"input {tuple(model.inputs[0].shape[1:])}): {problem}. Train with the network the weights were saved from "
        "(any classes; any image size for a backbone), or give weights saved from " + model_name)


def classifier_classes(local: str) -> int | None:
    """The number of classes of the classifier whose weights `local` (.weights.h5 or .keras) holds: the size of
    the bias of its last top-level Dense layer (Keras names the weights file's groups after the layers' classes:
    dense, dense_1, ... in the model's order). None when the file holds no top-level Dense (a backbone alone)."""
    import h5py

    try:
        if local.endswith(".keras"):
            with zipfile.ZipFile(local) as archive:
                weights = io.BytesIO(archive.read("model.weights.h5"))
        else:
            weights = local
        with h5py.File(weights, "r") as f:
            layers = f.get("layers")
            names = layers.keys() if layers is not None else ()
            dense = [name for name in names if re.fullmatch(r"dense(_\d+)?", name)]
            if not dense:
                return None
            last = max(dense, key=lambda name: int(name.rpartition("_")[2]) if name != "dense" else 0)
            bias = layers[last].get("vars/1")
            return int(bias.shape[0]) if bias is not None and len(bias.shape) == 1 else None
    except (OSError, KeyError, ValueError, zipfile.BadZipFile):
        return None


def _load_backbone_of_classifier(model, model_name: str, local: str, source_classes: int) -> str | None:
    """Builds the source classifier (`model_name`, this model's input, `source_classes` logits), loads `local` into
    it and copies its backbone into `model`'s; the problem when it does not fit, else None."""
    source = models.build(model_name, tuple(model.inputs[0].shape[1:]), source_classes)
    problem = _try_load(source, local)
    if problem is not None:
        return problem
    try:
        for from_layer, to_layer in zip(models.backbone_layers(source), models.backbone_layers(model), strict=True):
            to_layer.set_weights(from_layer.get_weights())
    except ValueError as e:  # another image size where a layer's weights depend on it (the reference CNN's Dense)
        return str(e).splitlines()[0]
    return None


def source_info(source: str) -> dict | None:
    """What training.json beside a weights source says it was trained as: {"name", "class_names", "image_shape"};
    None when there is none (a file from elsewhere)."""
    gfile = data.gfile()
    parent = source.rstrip("/") if gfile.isdir(source) else os.path.dirname(source)
    info_path = data.join(parent, "training.json") if parent else "training.json"
    try:
        if not gfile.exists(info_path):
            return None
        with gfile.GFile(info_path) as f:
            info = json.load(f)
    except (OSError, ValueError):
        return None
    return {"name": (info.get("model") or {}).get("name", models.DEFAULT_MODEL),
            "class_names": list(info.get("class_names", [])), "image_shape": list(info.get("image_shape", []))}


def saved_architecture(source: str, local: str) -> str:
    """What a weights file says it was saved from: training.json beside it (model name, classes, image shape), or
    a .keras archive's model name; "" when it does not say (a bare .weights.h5)."""
    info = source_info(source)
    if info:
        return f"model {info['name']} ({len(info['class_names'])} classes, input {tuple(info['image_shape'])})"
    try:
        if local.endswith(".keras"):
            with zipfile.ZipFile(local) as archive:
                config = json.loads(archive.read("config.json"))
            return f"a Keras model named {config.get('config', {}).get('name', '?')!r}"
    except (OSError, ValueError, KeyError, zipfile.BadZipFile):
        pass
    return ""


def imagenet_file(model_name: str) -> str:
    """The name of a backbone's ImageNet weights in a cache (`pipectl weights`, the weights_cache parameter)."""
    return f"imagenet-{model_name}.weights.h5"


def download_imagenet(model_name: str, input_shape: tuple | None = None, *, origin: str | None = None) -> str:
    """A local .weights.h5 of `model_name`'s backbone with Keras' ImageNet weights: downloaded by Keras from its
    own address, or from `origin` (the URL, path or gs:// URI of the Keras notop weights file, e.g. a mirror)."""
    import keras

    spec = models.BACKBONES.get(model_name)
    if spec is None:
        raise models.ModelError(f"pretrained imagenet: there are ImageNet weights for {', '.join(models.BACKBONES)}, "
                                f"not for {model_name}; pass a weights file instead")
    work = tempfile.mkdtemp(prefix="imagenet-")
    weights = "imagenet"
    if origin and "://" in origin and not origin.startswith("gs://"):
        weights = keras.utils.get_file(origin.rstrip("/").rsplit("/", 1)[-1], origin, cache_dir=work)
    elif origin:
        weights = os.path.join(work, os.path.basename(origin))
        data.gfile().copy(origin, weights, overwrite=True)
    options = {"include_preprocessing": True} if spec.builtin_preprocessing else {}
    with models.dtype_policy("float32"):
        reference = getattr(keras.applications, spec.application)(include_top=False, weights=weights,
                                                                   input_shape=input_shape, **options)
    local = os.path.join(work, imagenet_file(model_name))
    reference.save_weights(local)
    return local


def _publish(local: str, uri: str) -> None:
    """Copies `local` to `uri` through a temporary name, so that readers never see half a file."""
    gfile = data.gfile()
    gfile.makedirs(os.path.dirname(uri) or ".")
    gfile.copy(local, uri + ".partial", overwrite=True)
    gfile.rename(uri + ".partial", uri, overwrite=True)


def stage_imagenet(model_name: str, cache: str, *, origin: str | None = None) -> dict:
    """Puts `model_name`'s ImageNet backbone weights into `cache` (a folder or gs:// prefix) for training steps
    without internet (pretrained=imagenet with weights_cache=cache). A file already there is kept, never
    replaced: {"uri", "sha256", "staged": False}; else downloaded and written: "staged": True."""
    uri = data.join(cache, imagenet_file(model_name))
    gfile = data.gfile()
    if gfile.exists(uri):
        local = os.path.join(tempfile.mkdtemp(prefix="imagenet-"), imagenet_file(model_name))
        gfile.copy(uri, local, overwrite=True)
        return {"model": model_name, "uri": uri, "sha256": sha256_of(local), "staged": False}
    try:
        local = download_imagenet(model_name, origin=origin)
    except models.ModelError:
        raise
    except Exception as e:  # Keras' download raises a bare Exception("URL fetch failure on ...")
        raise models.ModelError(f"could not download the ImageNet weights of {model_name} from "
                                f"{origin or 'Keras'}: {_first_line(e)}") from e
    _publish(local, uri)
    return {"model": model_name, "uri": uri, "sha256": sha256_of(local), "staged": True}


def _first_line(e: BaseException) -> str:
    return str(e).splitlines()[0] if str(e) else type(e).__name__


def _load_imagenet(model, model_name: str, backup_dir: str | None, write_cache: bool,
                   weights_cache: str | None = None) -> Weights:
    """Keras' ImageNet weights for the backbone: from `weights_cache` (staged by `pipectl weights`), else from this
    task's earlier attempt (backup_dir), else downloaded (and kept in backup_dir for the retries)."""
    backbone = next((layer for layer in model.layers if layer.name == models.BACKBONE), None)
    if model_name not in models.BACKBONES or backbone is None:
        raise models.ModelError(f"pretrained imagenet: there are ImageNet weights for {', '.join(models.BACKBONES)}, "
                                f"not for {model_name}; pass a weights file instead")
    name = imagenet_file(model_name)
    retry_cache = data.join(_cache_dir(backup_dir), name)
    gfile = data.gfile()
    for cached in ([data.join(weights_cache, name)] if weights_cache else []) + [retry_cache]:
        if not gfile.exists(cached):
            continue
        local = os.path.join(tempfile.mkdtemp(prefix="pretrained-"), name)
        gfile.copy(cached, local, overwrite=True)
        problem = _try_load(backbone, local)
        if problem:
            raise models.ModelError(f"the cached ImageNet weights {cached} do not fit {model_name}: {problem}; "
                                    "delete the file to download them again")
        log.info("train: ImageNet weights of %s from the cache %s", model_name, cached)
        return Weights(IMAGENET, local, sha256_of(local), "backbone", file=cached)
    try:
        local = download_imagenet(model_name, tuple(backbone.inputs[0].shape[1:]))
    except Exception as e:  # Keras' download raises a bare Exception("URL fetch failure on ...")
        where = f"no {name} in the weights cache {weights_cache}, and" if weights_cache else "no weights cache, and"
        raise models.ModelError(
            f"pretrained imagenet: {where} the download failed ({_first_line(e)}): this machine seems to have no "
            f"internet access. Where internet exists, run `pipectl weights --model {model_name} --cache "
            f"{weights_cache or 'gs://BUCKET/weights'}` and train with weights_cache set to that cache") from e
    problem = _try_load(backbone, local)
    if problem:
        raise models.ModelError(f"the ImageNet weights of {model_name} do not fit its backbone: {problem}")
    if write_cache:
        _publish(local, retry_cache)
    return Weights(IMAGENET, local, sha256_of(local), "backbone")
