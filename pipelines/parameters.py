"""The pipeline's parameters as pipectl sees them: the table (components/params.py) joined to the vocabularies and
checks that the steps own, one typed flag per parameter grouped by the step that reads it, and the checks run on
what a user gives before anything runs or is sent.

The table imports nothing above it; this module, above the steps, is where their words meet it.
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import logging
from typing import Any, Callable

from components import params
from pipelines import training

log = logging.getLogger("pipectl")


@dataclasses.dataclass(frozen=True)
class Vocabulary:
    """A parameter's words that a step owns: what --help lists, its check (None: checked with others, in
    `problems`), and what else it takes."""

    choices: tuple[str, ...]
    check: Callable[[Any], str | None] | None = None
    also: str = ""


def step_vocabularies() -> dict[str, Vocabulary]:
    """The parameters whose vocabulary a step owns, from the step (imported when asked: they are not small)."""
    from components import augment
    from components.gcp.accelerators import ACCELERATORS
    from components.launch.network import NETWORKS
    from components.launch.placement import SHARING_STRATEGIES
    from components.registry import REGISTRIES
    from components.train import models, pretrained, recipes

    recipe_names = tuple(sorted(recipes.RECIPES))
    return {
        "augment_policy": Vocabulary(tuple(sorted(augment.PRESETS)), augment.policy_problem,
                                     also="a JSON policy, or {\"preset\": NAME, ...overrides}"),
        "recipe": Vocabulary(recipe_names, params.one_of(recipe_names)),
        "model": Vocabulary(models.MODELS, models.name_problem, also="module:function"),
        "pretrained": Vocabulary((pretrained.NONE, pretrained.IMAGENET), also="a weights file or a registered model"),
        "train_accelerator_type": Vocabulary(tuple(ACCELERATORS)),  # with the GPU count: components/launch/placement.py
        "train_gpu_sharing": Vocabulary(SHARING_STRATEGIES, also="empty for a whole GPU"),  # checked there too
        "train_network": Vocabulary(NETWORKS, lambda value: None if value in ("", *NETWORKS) else
                                    f"must be one of {', '.join(NETWORKS)}, or empty for the pod network "
                                    f"(got {value!r})", also="empty for the pod network"),
        "registry": Vocabulary(REGISTRIES, params.one_of(REGISTRIES)),
    }


def problems(values: dict, *, launcher: str | None = None) -> list[str]:
    """Everything wrong with these values: the table's checks, the steps' own, and the checks across parameters
    (the network and its weights, Dataflow's settings, the training GPUs' placement) when theirs are all given.
    `launcher`: the train launcher the pipeline was compiled with, where known (a shared GPU's checks and the
    GPUDirect network's need it)."""
    found = params.problems(values, {name: v.check for name, v in step_vocabularies().items() if v.check})
    if {"model", "pretrained", "image_size", "channels", "freeze_epochs", "fine_tune_layers"} <= values.keys() \
            and not any(problem.startswith(("model ", "freeze_epochs ", "fine_tune_layers ")) for problem in found):
        from components.train.models import problems as model_problems

        found += model_problems(values["model"], values["pretrained"], channels=values["channels"],
                                image_size=values["image_size"],
                                freeze_epochs=None if values["freeze_epochs"] < 0 else values["freeze_epochs"],
                                fine_tune_layers=values["fine_tune_layers"],
                                epochs=values.get("epochs") or None)
    if values.get("preprocess_runner") == "dataflow":
        from components.preprocess import dataflow

        names = ("data", "preprocess_runner", *dataflow.PARAMETERS)
        found += dataflow.parameter_problems({name: values.get(name, params.default(name)) for name in names})
    if {"train_accelerator_type", "train_gpu_count", "train_spot", "train_node_pool"} <= values.keys():
        from components.gcp.accelerators import ACCELERATORS
        from components.launch.local_ssd import check_staging
        from components.launch.network import NETWORKS, check_network
        from components.launch.placement import SharedGpu, gpu_placement

        shared = SharedGpu(values.get("train_gpu_partition", ""), values.get("train_gpu_sharing", ""),
                           values.get("train_max_shared_clients", 0))
        network = values.get("train_network", "")
        try:
            placement = gpu_placement(values["train_accelerator_type"], values["train_gpu_count"],
                                      known_accelerators=ACCELERATORS, spot=values["train_spot"],
                                      node_pool=values["train_node_pool"], shared=shared,
                                      workers=training.placement_workers(launcher, values.get("train_workers", 0)),
                                      launcher=launcher)
            # The nodes' network, where the launcher is known here (else the placement step checks it); a word
            # outside the vocabulary was reported above.
            if launcher is not None and network in NETWORKS:
                check_network(network, placement, launcher=launcher, flag="--train-launcher")
            if launcher is not None:
                check_staging(values.get("train_stage_data", False), launcher=launcher)
        except ValueError as e:
            found.append(str(e))
    return found


def validate(values: dict, *, what: str = "parameters", launcher: str | None = None) -> None:
    """Raises one ValueError listing every problem of `values` (see `problems`)."""
    params.validate(values, what=what, found=problems(values, launcher=launcher))


# ---------------------------------------------------------------------------------------------- pipectl's flags


def pipeline_parameters() -> dict[str, inspect.Parameter]:
    """The pipeline's parameters, with their defaults and types, from its signature."""
    return dict(inspect.signature(training.build_pipeline().pipeline_func).parameters)


def parameter_help(name: str, default: Any, vocabularies: dict[str, Vocabulary]) -> str:
    """A flag's help: the table's text, the values it takes, its default ('%' escaped for argparse)."""
    param = params.PARAMETERS[name]
    parts = [param.help]
    vocabulary = vocabularies.get(name)
    choices = vocabulary.choices if vocabulary else param.choices
    if choices:
        also = f"; or {vocabulary.also}" if vocabulary and vocabulary.also else ""
        parts.append(f"Choices: {', '.join(map(str, choices))}{also}.")
    parts.append(f"Default: {default!r}.")
    return " ".join(parts).replace("%", "%%")


def add_parameter_options(parser: argparse.ArgumentParser) -> None:
    """One typed option per pipeline parameter (--epochs, --predict-images, ...), grouped by the step that reads it;
    only those given are sent, the others keep the pipeline's defaults."""
    vocabularies = step_vocabularies()
    by_step: dict[str, list[inspect.Parameter]] = {step: [] for step in params.STEPS}
    for name, param in pipeline_parameters().items():
        by_step[params.PARAMETERS[name].step].append(param)
    for step, members in by_step.items():
        group = parser.add_argument_group(f"pipeline parameters, {params.STEPS[step]}")
        for param in members:
            kind = _parse_bool if param.annotation is bool else param.annotation
            group.add_argument("--" + param.name.replace("_", "-"), dest=f"param_{param.name}", type=kind,
                               default=None, metavar=kind.__name__.upper(),
                               help=parameter_help(param.name, param.default, vocabularies))


def _parse_bool(text: str) -> bool:
    if text.lower() in ("true", "1", "yes"):
        return True
    if text.lower() in ("false", "0", "no"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


_parse_bool.__name__ = "bool"


def given_parameters(args: argparse.Namespace) -> dict:
    return {k[len("param_"):]: v for k, v in vars(args).items() if k.startswith("param_") and v is not None}


def validate_parameters(given: dict, *, launcher: str | None = None) -> dict:
    """Refuses unknown names, wrong types and out-of-range values before anything runs or is sent; ints given for
    float parameters become floats. `launcher`: the compiled train launcher, where this pipectl compiles it."""
    known = pipeline_parameters()
    unknown = sorted(set(given) - set(known))
    if unknown:
        raise ValueError(f"Unknown pipeline parameter(s) {unknown}; allowed: {', '.join(known)}")
    for name, value in given.items():
        expected = known[name].annotation
        if expected is float and isinstance(value, int) and not isinstance(value, bool):
            given[name] = float(value)
        elif not isinstance(value, expected) or (isinstance(value, bool) and expected is not bool):
            raise ValueError(f"Parameter {name} must be {expected.__name__}, got {value!r}")
    values = {name: p.default for name, p in known.items()} | given
    validate(values, what="pipeline parameters", launcher=launcher)
    check_model_builder(values)
    return given


def check_model_builder(values: dict) -> None:
    """A bring-your-own model (module:function) is built here once, as the training step will build it, and refused
    when its output is not (batch, classes) logits, or when it is a torch.nn.Module and the framework is not torch
    (checked with torch itself, whatever Keras' backend here) or the registry is Vertex AI (whose serving
    containers load SavedModels, not TorchScript); when its module does not import here (e.g. it imports torch
    and torch is not installed), only a warning: the step imports it where it runs (the training image) and
    refuses it there before training."""
    from components.train import frameworks, models

    name = values["model"]
    if not models.is_builder_path(name):
        return
    classes = [c for c in values.get("classes", "").split(",") if c.strip()]
    image_shape = (values["image_size"], values["image_size"], values["channels"])
    try:
        builder = models.import_builder(name)
    except models.ModelError as e:
        log.warning("%s; it is checked again in the training step, where it must import", e)
        return
    import keras

    # Without `classes` the count is the data's, unknown here: any count shows whether the builder honours it.
    num_classes = len(classes) or 10
    backend = frameworks.backend_class(values.get("framework") or params.default("framework"))
    try:
        built = models.call_builder(name, builder, image_shape, num_classes, native=_checked(backend))
    finally:
        keras.backend.clear_session()
    if models.is_torch_module(built) and values.get("registry") == "vertex":
        raise models.ModelError(f"model {name} is a torch.nn.Module, served as TorchScript, and the Vertex AI "
                                "registry's serving containers load TensorFlow SavedModels only "
                                "(docs/registry.md#torchscript-on-vertex-ai): use a keras.Model builder, or registry "
                                "local on a KFP backend or locally")


def _checked(backend):
    """`backend.check_native`, returning what it checked (models.call_builder returns what `native` returns)."""
    def check(name, built, image_shape, num_classes):
        backend.check_native(name, built, image_shape, num_classes)
        return built

    return check

