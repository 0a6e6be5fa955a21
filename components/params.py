"""The pipeline's parameters: one table of names, types, defaults, bounds, help and the step each belongs to.

Used three ways, so that a default or a bound is written once:
- pipelines/training.py takes the pipeline signature's defaults and the docstring the KFP UI shows from here;
- pipectl validates what a user gives before anything runs or is sent, and builds its `--help` from the table;
- the steps check the values they receive with the same `validate`, so a step run on its own (its CLI, another
  pipeline) refuses what pipectl would have refused, with the same message.

This table is the bottom layer: it imports nothing of the project. A parameter's vocabulary that a step owns (the
recipes, the models, the registries, the augmentation presets, the GPU placement, Dataflow's settings) stays with
that step, which checks it; pipelines/parameters.py joins those checks to the table's for pipectl.
A check returns a problem ("must be ...") or None.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

DEFAULT_SOURCE = "/usr/share/datasets/fashion-mnist"  # Debian's dataset-fashion-mnist, also in the images
DEFAULT_TRAIN_ACCELERATOR = "nvidia-tesla-t4"  # the reference setup: training on a T4 pool
DEFAULT_PREDICT_ACCELERATOR = "nvidia-h100-80gb"  # ... and batch prediction on an H100 pool
AUGMENT_MODES = ("offline", "online")
FRAMEWORKS = ("tensorflow", "torch", "jax")  # what the train step runs the Keras model on (components/train/frameworks)
FRAMEWORK_NAMES = {"tensorflow": "TensorFlow", "torch": "PyTorch", "jax": "JAX"}  # as the registry, pages say them
PREPROCESS_RUNNERS = ("local", "dataflow")  # components/preprocess/step.py also takes "beam" (tests, benchmarks)
MIN_IMAGE_SIZE = 8
MAX_IMAGE_SIZE = 512  # photos for the backbones; above 64 px the shards hold PNG/JPEG (components/dataio/data.py)


@dataclasses.dataclass(frozen=True)
class Param:
    name: str
    type: type
    default: Any
    help: str
    check: Callable[[Any], str | None] | None = None
    choices: tuple = ()  # the values allowed, where this table owns them (see the module docstring)
    step: str = ""  # the key in STEPS of the step that reads it (`_used_by` sets it)


# The steps, in pipeline order, as pipectl's --help groups their parameters.
STEPS = {
    "preprocess": "preprocess: read the source, split, write shards",
    "preprocess_dataflow": "preprocess on Dataflow (preprocess_runner=dataflow)",
    "augment": "augment",
    "train": "train",
    "model": "train: the network and its initial weights",
    "evaluate": "evaluate: the blessing gate",
    "predict": "batch predict",
    "register": "register",
    "shared": "read by several steps",
}


def _used_by(step: str, *params: Param) -> list[Param]:
    return [dataclasses.replace(param, step=step) for param in params]


def _at_least(low: float, note: str = "") -> Callable[[Any], str | None]:
    return lambda value: None if value >= low else f"must be >= {low}{note} (got {value})"


def _between(low: float, high: float) -> Callable[[Any], str | None]:
    return lambda value: None if low <= value <= high else f"must be in [{low}, {high}] (got {value})"


def _fraction(value: float) -> str | None:
    return None if 0 <= value < 1 else f"must be in [0, 1) (got {value})"


def one_of(choices) -> Callable[[Any], str | None]:
    """The check of a parameter with a fixed vocabulary (also used for the steps' own, pipelines/parameters.py)."""
    return lambda value: None if value in choices else \
        f"must be one of {', '.join(map(str, choices))} (got {value!r})"


def _data_root(value: str) -> str | None:
    # Each step runs in its own pod (its own working directory): a relative path would differ from step to step.
    if not value or value.startswith("gs://") or value.startswith("/"):
        return None
    return f"must be a gs:// folder or an absolute path that every step mounts (got {value!r})"


PARAMETERS: dict[str, Param] = {p.name: p for p in [
    *_used_by(
        "preprocess",
        Param("data", str, DEFAULT_SOURCE,
              "Image source: an idx directory, a class-per-folder image tree (local or gs://), a CSV/JSONL manifest, "
              "or tfds:NAME[:SPLIT]."),
        Param("validation_fraction", float, 0.1,
              "Share of the training images held out for validation (by content hash).", _fraction),
        Param("test_fraction", float, 0.1, "Share held out for test when the source has no test split of its own.",
              _fraction),
        Param("image_size", int, 28, "Images are resized to image_size x image_size (8-512; from 64 the shards hold "
              "PNG/JPEG instead of raw pixels).", _between(MIN_IMAGE_SIZE, MAX_IMAGE_SIZE)),
        Param("channels", int, 1, "1 for grayscale, 3 for RGB.",
              lambda value: None if value in (1, 3) else f"must be 1 or 3 (got {value})", choices=(1, 3)),
        Param("limit", int, 0, "For quick runs, read at most this many images (0: all): per class folder of a folder "
              "source, per split of an idx or tfds source, the first rows of a CSV/JSONL manifest.", _at_least(0)),
        Param("min_shards", int, 2, "At least this many shards per split (one per training worker that reads them).",
              _at_least(1)),
        Param("classes", str, "",
              "Comma-separated allowed class names, in label order (empty: any class the source has)."),
        Param("preprocess_runner", str, "local",
              "local (preprocess inside the step) or dataflow (the same preprocessing as an Apache Beam job on "
              "Dataflow, for sources on gs:// too large for one machine).", choices=PREPROCESS_RUNNERS),
    ),
    # Preprocessing on Dataflow (components/preprocess/dataflow.py checks them together).
    *_used_by(
        "preprocess_dataflow",
        Param("dataflow_temp_location", str, "", "gs:// folder for the Dataflow job's temporary files (required "
              "with preprocess_runner=dataflow)."),
        Param("dataflow_staging_location", str, "", "gs:// folder the job's graph is staged to (empty: "
              "dataflow_temp_location/staging)."),
        Param("dataflow_service_account", str, "", "Service account email Dataflow's workers run as (empty: the "
              "project's Compute Engine default)."),
        Param("dataflow_network", str, "", "VPC network of Dataflow's workers (empty: default)."),
        Param("dataflow_subnetwork", str, "", "Subnetwork of Dataflow's workers: regions/REGION/subnetworks/NAME "
              "(empty: default)."),
        Param("dataflow_max_workers", int, 0, "Most Dataflow workers to autoscale to (0: Dataflow's default).",
              _at_least(0, ", 0 for Dataflow's default")),
        Param("dataflow_machine_type", str, "", "Machine type of Dataflow's workers, e.g. n2-standard-4 (empty: "
              "Dataflow's default)."),
    ),
    *_used_by(
        "augment",
        Param("augment_copies", int, 0,
              "Augmented copies of each training image (offline mode; 0 passes the data through).", _at_least(0)),
        Param("augment_mode", str, "offline", "offline (materialise copies) or online (training augments on the "
              "fly).", choices=AUGMENT_MODES),
        # Its presets and fields are the augment step's (components/augment.py).
        Param("augment_policy", str, "{}",
              "JSON augmentation policy (rotation_degrees, shift_fraction, zoom_range, ..., seed), or a preset: "
              "photo (random resized crop + horizontal flip), also as {\"preset\": \"photo\", ...overrides}."),
    ),
    *_used_by(
        "train",
        # The recipes are the train step's (components/train/recipes.py); the default is this one.
        Param("recipe", str, "fast",
              "Training recipe preset: fast (the default) or reference (the classic 12-epoch recipe)."),
        Param("framework", str, FRAMEWORKS[0],
              "What trains the model: tensorflow (tf.distribute), torch (DDP under torchrun) or jax (jax.distributed); "
              "the training image must carry it.", one_of(FRAMEWORKS), choices=FRAMEWORKS),
        Param("epochs", int, 0, "Training epochs (0: the recipe's).", _at_least(0, ", 0 for the recipe's")),
        Param("batch_size", int, 0, "Batch size per replica (0: the recipe's).", _at_least(0)),
        Param("learning_rate", float, 0.0, "Base learning rate (0: the recipe's).", _at_least(0)),
        Param("checkpoint_root", str, "", "Durable directory for training checkpoints (empty: the pipeline root)."),
        # Where it runs: checked together by components/launch/placement.py.
        Param("train_accelerator_type", str, DEFAULT_TRAIN_ACCELERATOR,
              "GKE accelerator for training (nvidia-tesla-t4, nvidia-l4, nvidia-tesla-a100, nvidia-a100-80gb, "
              "nvidia-h100-80gb, nvidia-h200-141gb, nvidia-h100-mega-80gb, nvidia-b200)."),
        Param("train_gpu_count", int, 1, "GPUs per training machine (0: train on CPU nodes)."),
        Param("train_node_pool", str, "", "GKE node pool to train on (empty: any pool with the accelerator)."),
        Param("train_spot", bool, False,
              "Train on Spot VMs (cheaper, preemptible: training resumes from its checkpoints)."),
        Param("train_workers", int, 1, "Machines besides the chief, when compiled with a multi-worker train "
              "launcher.", _at_least(0)),
        # A share of one GPU on a GKE node pool set up for it (docs/cluster-setup.md): checked with the placement.
        Param("train_gpu_partition", str, "", "MIG partition size to train on, e.g. 1g.10gb (empty: a whole GPU; "
              "the node pool's gpu-partition-size, on A100, H100 or H200; one GPU, one node)."),
        Param("train_gpu_sharing", str, "", "GPU sharing strategy of the node pool to train on: time-sharing or mps "
              "(empty: a whole GPU; one GPU, one node; mps with the jobset launcher only)."),
        Param("train_max_shared_clients", int, 0, "With train_gpu_sharing: the node pool's "
              "max-shared-clients-per-gpu (2-48).", _at_least(0)),
        # The nodes' GPU NICs on A3 Ultra, A4 and A3 Mega (docs/multi-node-training.md): checked with the placement.
        Param("train_network", str, "", "GPUDirect network of the training nodes: rdma (A3 Ultra, A4) or tcpxo "
              "(A3 Mega) (empty: the pod network; all 8 GPUs a node, the trainjob or jobset launcher)."),
        # Each node copies the shards to its local disk first (components/train/staging.py, docs/training.md).
        Param("train_stage_data", bool, False, "Stage the shards on each training node's local SSD (an emptyDir "
              "sized from the data; Vertex AI: a larger SSD boot disk) before the first epoch; a cluster or Vertex "
              "AI train launcher."),
    ),
    # The network and its initial weights (components/train/models.py, pretrained.py, which check them together).
    *_used_by(
        "model",
        Param("model", str, "reference-cnn",
              "Network: reference-cnn (the classic small CNN), mobilenet-v3-small, mobilenet-v3-large, "
              "efficientnet-v2-b0, resnet50, convnext-tiny (these need image_size >= 32), or module:function, your own "
              "builder taking (image_shape, num_classes) and returning an uncompiled keras.Model producing logits."),
        Param("pretrained", str, "none",
              "Initial weights: none, imagenet (a backbone's Keras ImageNet weights, from weights_cache or downloaded; "
              "needs channels=3), or the path or gs:// URI of a .weights.h5 or .keras file or of a registered model's "
              "directory: any model of the same network, whatever its classes (its backbone loads, the head is new)."),
        Param("weights_cache", str, "",
              "Folder or gs:// prefix where `pipectl weights` staged ImageNet weights, read by pretrained=imagenet "
              "before any download (for clusters without internet)."),
        Param("freeze_epochs", int, -1,
              "With pretrained weights: first epochs that train only the head, the backbone frozen (-1: the recipe's "
              "2, at most half the epochs, when the weights leave the head untrained; else 0).",
              _at_least(-1, ", -1 for the recipe's")),
        Param("fine_tune_layers", int, 0,
              "With pretrained weights: after the frozen epochs, train only the backbone's top N layers (0: all).",
              _at_least(0)),
        Param("fine_tune_lr_factor", float, 0.0,
              "With pretrained weights: they train at learning rate x this (0: the recipe's 0.1).", _between(0, 1)),
    ),
    *_used_by(
        "evaluate",
        Param("min_accuracy", float, 0.88, "A model below this test accuracy is not blessed.", _between(0, 1)),
        Param("min_class_recall", float, -1.0, "Minimum recall for every class (negative: no such check).",
              lambda value: None if value <= 1 else f"must be in [0, 1], or negative for no such check (got {value})"),
        Param("tolerance", float, 0.005,
              "A model may trail the champion's accuracy by this much and still be blessed.", _between(0, 1)),
    ),
    *_used_by(
        "predict",
        Param("predict_images", str, "",
              "Images to classify: a folder, glob, manifest or TFRecord shards, local or gs:// (empty: 10 test images "
              "per class)."),
    ),
    *_used_by(
        "register",
        # The registries are the registry package's (components/registry/__init__.py).
        Param("registry", str, "local", "local or vertex."),
        Param("registry_root", str, "", "Directory of the local registry."),
        Param("model_name", str, "image-classifier", "The registered model's name."),
    ),
    *_used_by(
        "shared",
        Param("data_root", str, "",
              "Where the data-heavy steps write shards and predictions, outside the artifacts KFP copies into each "
              "pod (a gs:// folder, or a path every step mounts); the artifacts hold a manifest pointing there. "
              "Empty: in a .data folder of each step's outputs on a KFP backend with a gs:// pipeline root, in the "
              "artifacts on Vertex AI and local runs.", _data_root),
        Param("project", str, "", "Google Cloud project (registry=vertex, preprocess_runner=dataflow)."),
        Param("location", str, "us-central1", "Google Cloud region (registry=vertex, preprocess_runner=dataflow)."),
    ),
]}


def default(name: str) -> Any:
    return PARAMETERS[name].default


def docstring_args(names) -> str:
    """The `Args:` lines of a Google-style docstring for these parameters (what the KFP UI shows). One line each:
    KFP keeps a description's line breaks."""
    return "Args:\n" + "\n".join(f"    {name}: {PARAMETERS[name].help}" for name in names)


def problems(values: dict, checks: dict[str, Callable[[Any], str | None]] | None = None) -> list[str]:
    """What is wrong with these values (a subset of the parameters, by name): each problem names its parameter.
    `checks` adds the checks of parameters whose vocabulary a step owns (pipelines/parameters.py). Checks across
    parameters apply when all of theirs are given."""
    found = []
    for name, value in values.items():
        param = PARAMETERS.get(name)
        if param is None:
            found.append(f"unknown parameter {name!r}")
            continue
        check = (checks or {}).get(name) or param.check or (one_of(param.choices) if param.choices else None)
        problem = check(value) if check else None
        if problem:
            found.append(f"{name}: {problem}" if name == "augment_policy" else f"{name} {problem}")
    if {"validation_fraction", "test_fraction"} <= values.keys() \
            and values["validation_fraction"] + values["test_fraction"] >= 1:
        found.append("validation_fraction and test_fraction must be in [0, 1) and sum to less than 1")
    return found


def validate(values: dict, *, what: str = "parameters", found: list[str] | None = None) -> None:
    """Raises one ValueError listing every problem of `values` (see `problems`), or of `found` when given."""
    found = problems(values) if found is None else found
    if found:
        raise ValueError(f"Invalid {what}:\n  " + "\n  ".join(found))
