"""What a registered model is and where it came from: its content digest and its lineage.

**The digest** (`model_digest`) identifies what the model computes, not when or how fast it was written: for the
output of train (a directory with `model.keras` and `training.json`) it is sha256 over

- the architecture: `config.json` of the model.keras archive as canonical JSON (sorted keys, no spaces), with the
  two things Keras fills in from the process rather than the model made canonical: `shared_object_id` (a Python
  `id()`) renumbered in order of appearance, and auto-generated layer names (`conv2d_3`: the counter depends on
  how many layers the process built before) renamed to their base and rank in the model (`conv2d#0`);
- the weights: every dataset of the archive's `model.weights.h5`, in sorted path order: path, dtype, shape and
  bytes (the paths are the archive's own, derived from the model's structure, not from layer names);
- what the outputs mean: `class_names` and `image_shape` from training.json.

Left out: `metadata.json` (Keras version, save date), the zip's timestamps, training.json's timings and history,
`saved_model/` (written from the same weights by the same step; TensorFlow's protobufs are not byte-stable) and
the marker left where it could not be written (SAVED_MODEL_PENDING): a model is the same version before and after
its SavedModel is made.
Two trainings that produce bit-identical weights therefore have the same digest, and registering the second
returns the first's version. A directory without model.keras (a bare SavedModel) is hashed file by file: its
relative paths and bytes in sorted order.

A TorchScript model (a torch.nn.Module trained on PyTorch: training.json's `serving_format` is `torchscript`,
`model.torchscript.pt` beside it) is digested from its archive, a zip read without torch: the code TorchScript
generated (`code/**.py`, with what varies between processes made canonical: the counters of traced classes,
`___torch_mangle_N`, and the order of a class's constants)
and every tensor's bytes (`data/N`, in index order), then the same outputs; the archive's random
`serialization_id`, its debug tables and the pickles that name the mangled classes are left out.

Versions registered before this scheme carry the file-by-file digest of their whole directory; registering the
same files again gives them one new version (with the new digest), and from then on re-registration finds it.
The scheme is versioned inside the hash (`DIGEST_SCHEME`) so that it can never equal a file-by-file digest.

**The lineage** (`model_lineage`): the network (a Keras Applications name, `reference-cnn`, or the `module:function`
of a bring-your-own builder) and the pretrained weights it started from (`none`, `imagenet`, or a path/URI, with
their sha256), read from training.json's `model` key. A training.json written before that key existed is the
reference CNN trained from scratch, which is what every model was then.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import zipfile

DIGEST_SCHEME = b"kfp-image-classification model digest v2\0"
KERAS_ARCHIVE = "model.keras"
TRAINING_INFO = "training.json"  # components/train/results.py writes it; the registry must not import train
REFERENCE_MODEL = "reference-cnn"
# Beside model.keras when it was trained where TensorFlow is not installed (components/train/model.py writes it):
# left out of the digest, like saved_model/, so the model is the same version before and after its SavedModel.
SAVED_MODEL_PENDING = "saved_model.pending.json"
# A torch.nn.Module's serving format and file (components/dataio/data.py's TORCHSCRIPT, TORCHSCRIPT_FILE).
TORCHSCRIPT = "torchscript"
TORCHSCRIPT_FILE = "model.torchscript.pt"


class ModelDigestError(ValueError):
    """The model directory cannot be digested: the message says which file and why."""


def _field(sha, value: bytes) -> None:
    """Length-prefixed, so that no two different sequences of fields hash the same bytes."""
    sha.update(len(value).to_bytes(8, "big"))
    sha.update(value)


def _canonical_json(value) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def _snake(name: str) -> str:
    """keras' own `to_snake_case`, which makes a layer's default name from its class name."""
    name = re.sub(r"\W+", "", name)
    name = re.sub("(.)([A-Z][a-z]+)", r"\1_\2", name)
    name = re.sub("([a-z])([A-Z])", r"\1_\2", name).lower()
    return name


def canonical_config(config):
    """The Keras model config with its process-dependent parts made canonical (see the module docstring)."""
    shared_ids: dict = {}
    auto_names: dict[str, str] = {}
    ranks: dict[str, int] = {}

    def collect(node):  # in the config's own (deterministic) order
        if isinstance(node, dict):
            if "shared_object_id" in node:
                shared_ids.setdefault(node["shared_object_id"], len(shared_ids))
            inner = node.get("config")
            named = isinstance(inner, dict) and isinstance(inner.get("name"), str)
            if isinstance(node.get("class_name"), str) and named:
                name, base = inner["name"], _snake(node["class_name"])
                if re.fullmatch(re.escape(base) + r"(_\d+)?", name) and name not in auto_names:
                    auto_names[name] = f"{base}#{ranks.get(base, 0)}"
                    ranks[base] = ranks.get(base, 0) + 1
            for value in node.values():
                collect(value)
        elif isinstance(node, list):
            for value in node:
                collect(value)

    def rewrite(node):
        if isinstance(node, dict):
            return {key: (shared_ids[value] if key == "shared_object_id" else rewrite(value))
                    for key, value in node.items()}
        if isinstance(node, list):
            return [rewrite(value) for value in node]
        if isinstance(node, str):
            return auto_names.get(node, node)  # the name itself and every reference to it (functional graphs)
        return node

    collect(config)
    return rewrite(config)


def _hash_weights(sha, weights_file) -> int:
    """Every dataset of a Keras weights file in sorted path order; returns how many."""
    import h5py
    import numpy as np

    with h5py.File(weights_file, "r") as h5:
        paths: list[str] = []
        h5.visititems(lambda path, obj: paths.append(path) if isinstance(obj, h5py.Dataset) else None)
        for path in sorted(paths):
            value = np.asarray(h5[path][()])
            _field(sha, path.encode())
            if value.dtype.kind == "O":  # variable-length strings: their text
                _field(sha, b"object")
                _field(sha, _canonical_json(value.shape))
                _field(sha, _canonical_json([v.decode() if isinstance(v, bytes) else str(v) for v in value.ravel()]))
                continue
            _field(sha, value.dtype.str.encode())
            _field(sha, _canonical_json(value.shape))
            _field(sha, np.ascontiguousarray(value).tobytes())
    return len(paths)


def _files_digest(model_dir: str) -> str:
    """sha256 over relative paths and file bytes, in sorted order: for directories train did not write."""
    sha = hashlib.sha256()
    for root, dirs, files in os.walk(model_dir):
        dirs.sort()
        for name in sorted(files):
            path = os.path.join(root, name)
            sha.update(os.path.relpath(path, model_dir).encode() + b"\0")
            with open(path, "rb") as f:
                for chunk in iter(lambda: f.read(1 << 20), b""):
                    sha.update(chunk)
            sha.update(b"\0")
    return "sha256:" + sha.hexdigest()


def _training_info(model_dir: str) -> dict:
    path = os.path.join(model_dir, TRAINING_INFO)
    if not os.path.exists(path):
        return {}
    try:
        with open(path) as f:
            info = json.load(f)
    except (OSError, ValueError) as e:
        raise ModelDigestError(f"Cannot read {path}: {e}; it is written by the train step beside model.keras") from e
    if not isinstance(info, dict):
        raise ModelDigestError(f"{path} holds {type(info).__name__}, not the JSON object the train step writes")
    return info


_TORCHSCRIPT_ATTRIBUTE = re.compile(rb"^  [A-Za-z_]\w* : ")


def _canonical_torchscript_code(code: bytes) -> bytes:
    """TorchScript's generated code with what varies between processes made canonical: the counters of traced
    classes (`___torch_mangle_N`), and the order of a class's attribute declarations (its constants come from a
    set, in the order of Python's per-process string hashing), sorted within each run of them."""
    lines = re.sub(rb"___torch_mangle_\d+", b"___torch_mangle", code).split(b"\n")
    out, run = [], []
    for line in lines + [b""]:
        if _TORCHSCRIPT_ATTRIBUTE.match(line):
            run.append(line)
            continue
        out.extend(sorted(run))
        run = []
        out.append(line)
    return b"\n".join(out[:-1])


def _torchscript_digest(model_dir: str, info: dict) -> str:
    archive = os.path.join(model_dir, info.get("serving_file") or TORCHSCRIPT_FILE)
    sha = hashlib.sha256(DIGEST_SCHEME)
    _field(sha, b"torchscript")
    try:
        with zipfile.ZipFile(archive) as torch_zip:
            entries = {name.split("/", 1)[1]: name for name in torch_zip.namelist() if "/" in name}
            code = sorted(rel for rel in entries if rel.startswith("code/") and rel.endswith(".py"))
            tensors = sorted((rel for rel in entries if re.fullmatch(r"data/\d+", rel)),
                             key=lambda rel: int(rel.split("/")[1]))
            if not code:
                raise ModelDigestError(f"{archive} is not a TorchScript archive (no code/ in it); the train step "
                                       "writes it with torch.jit.save")
            for rel in code:
                _field(sha, re.sub(r"___torch_mangle_\d+", "___torch_mangle", rel).encode())
                _field(sha, _canonical_torchscript_code(torch_zip.read(entries[rel])))
            _field(sha, b"tensors")
            for rel in tensors:
                _field(sha, rel.encode())
                _field(sha, torch_zip.read(entries[rel]))
    except (zipfile.BadZipFile, OSError) as e:
        raise ModelDigestError(f"Cannot read the TorchScript archive {archive}: {e}. Is it complete? Train the "
                               "model again (the train step writes it)") from e
    _field(sha, b"outputs")
    _field(sha, _canonical_json({"class_names": info.get("class_names"), "image_shape": info.get("image_shape")}))
    return "sha256:" + sha.hexdigest()


def model_digest(model_dir: str) -> str:
    """The content digest of a model directory, `sha256:HEX` (what it covers: the module docstring)."""
    if not os.path.isdir(model_dir):
        raise FileNotFoundError(f"Model directory not found: {model_dir}")
    archive = os.path.join(model_dir, KERAS_ARCHIVE)
    if not os.path.isfile(archive):
        info = _training_info(model_dir)
        if info.get("serving_format") == TORCHSCRIPT:
            return _torchscript_digest(model_dir, info)
        return _files_digest(model_dir)
    sha = hashlib.sha256(DIGEST_SCHEME)
    try:
        with zipfile.ZipFile(archive) as keras_zip:
            names = set(keras_zip.namelist())
            missing = sorted({"config.json", "model.weights.h5"} - names)
            if missing:
                raise ModelDigestError(f"{archive} is not a Keras 3 model archive: it lacks {', '.join(missing)} "
                                       f"(it holds {', '.join(sorted(names)) or 'nothing'}); export it with "
                                       "model.save('model.keras')")
            config = json.loads(keras_zip.read("config.json"))
            _field(sha, b"config")
            _field(sha, _canonical_json(canonical_config(config)))
            _field(sha, b"weights")
            with keras_zip.open("model.weights.h5") as packed:
                count = _hash_weights(sha, io.BytesIO(packed.read()))
    except (zipfile.BadZipFile, OSError, ValueError) as e:
        if isinstance(e, ModelDigestError):
            raise
        raise ModelDigestError(f"Cannot read the model archive {archive}: {e}. Is it complete? Export the model "
                               "again (the train step writes it)") from e
    _field(sha, count.to_bytes(8, "big"))
    info = _training_info(model_dir)
    _field(sha, b"outputs")
    _field(sha, _canonical_json({"class_names": info.get("class_names"), "image_shape": info.get("image_shape")}))
    return "sha256:" + sha.hexdigest()


def model_lineage(model_dir: str) -> dict:
    """The network and its starting weights, from training.json's `model` key:

    `{"name": "reference-cnn" | "<backbone>" | "<module:function>", "pretrained": {"source": "none" | "imagenet" |
    "<path or URI>", "sha256": "<hex>" | None}, ...}` (other keys of `model`, such as `freeze_epochs`, are kept),
    with training.json's `framework` (tensorflow, torch, jax) and `serving_format` where it records them.
    Without the key (a training.json written before it existed) the model is the reference CNN from scratch; without
    training.json (a bare SavedModel) nothing is known and {} is returned.
    """
    info = _training_info(model_dir)
    if not info:
        return {}
    model = info.get("model")
    if model is None:
        return {"name": REFERENCE_MODEL, "pretrained": {"source": "none", "sha256": None}}
    if not isinstance(model, dict) or not isinstance(model.get("name"), str) or not model["name"]:
        raise ModelDigestError(f"{os.path.join(model_dir, TRAINING_INFO)}: 'model' must be an object with a 'name', "
                               f"got {model!r}")
    pretrained = model.get("pretrained")
    if isinstance(pretrained, str):  # a bare source
        pretrained = {"source": pretrained, "sha256": None}
    pretrained = dict(pretrained or {})
    pretrained.setdefault("source", "none")
    pretrained.setdefault("sha256", None)
    trained = {key: info[key] for key in ("framework", "serving_format") if key in info}  # what trained it
    return {**model, "pretrained": pretrained, **trained}
