"""pipectl: compile the pipeline, run it (locally with kfp.local, or on a KFP host), and predict standalone."""

import argparse
import datetime as _dt
import glob
import inspect
import json
import logging
import os
import sys

from pipelines import config, training

log = logging.getLogger("pipectl")

# Pipeline parameters that pipectl fills in for a local run when the user gives none.
LOCAL_DEFAULTS_HELP = "default: a `registry` folder beside the output directory"


def pipeline_parameters() -> dict[str, inspect.Parameter]:
    """The pipeline's parameters, with their defaults and types, from its signature."""
    return dict(inspect.signature(training.build_pipeline().pipeline_func).parameters)


def add_image_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("images (pinned into the compiled pipeline)")
    group.add_argument("--image-repo", default=config.DEFAULT_IMAGE_REPO,
                       help="registry path holding the cpu and gpu images (default: %(default)s)")
    group.add_argument("--image-tag", default=config.DEFAULT_IMAGE_TAG, help="tag of both images (default: %(default)s)")
    group.add_argument("--cpu-image", help="full CPU image reference (overrides repo/tag), e.g. REPO/cpu@sha256:...")
    group.add_argument("--gpu-image", help="full GPU image reference (overrides repo/tag), e.g. REPO/gpu@sha256:...")
    group.add_argument("--target", choices=config.TARGETS, default="kfp",
                       help="kfp: GKE node selectors via kfp-kubernetes; vertex: Vertex AI Pipelines")
    group.add_argument("--train-accelerator", default=config.DEFAULT_TRAIN_ACCELERATOR,
                       choices=sorted(config.ACCELERATORS))
    group.add_argument("--train-gpus", type=int, default=1)
    group.add_argument("--predict-accelerator", default=config.DEFAULT_PREDICT_ACCELERATOR,
                       choices=sorted(config.ACCELERATORS))
    group.add_argument("--predict-gpus", type=int, default=1)
    group.add_argument("--train-launcher", choices=config.TRAIN_LAUNCHERS, default="pod",
                       help="pod: train in the pipeline task; tfjob: a Kubeflow TFJob (chief + --train-workers); "
                            "vertex-job: a Vertex AI CustomJob with worker pools")
    group.add_argument("--train-namespace", default="kubeflow", help="namespace of the TFJob (default: %(default)s)")
    group.add_argument("--kueue-queue", default="", help="Kueue queue for the GPU pods and the TFJob")


def settings_from(args: argparse.Namespace) -> config.PipelineSettings:
    repo_images = config.Images.from_repo(args.image_repo, args.image_tag)
    images = config.Images(cpu=args.cpu_image or repo_images.cpu, gpu=args.gpu_image or repo_images.gpu)
    return config.PipelineSettings(images=images, target=args.target, train_accelerator=args.train_accelerator,
                                   train_gpus=args.train_gpus, predict_accelerator=args.predict_accelerator,
                                   predict_gpus=args.predict_gpus, train_launcher=args.train_launcher,
                                   train_namespace=args.train_namespace, kueue_queue=args.kueue_queue)


def add_parameter_options(parser: argparse.ArgumentParser) -> None:
    """One typed option per pipeline parameter (--epochs, --predict-images, ...); only those given are sent."""
    group = parser.add_argument_group("pipeline parameters (omitted ones keep the pipeline's defaults)")
    for name, param in pipeline_parameters().items():
        flag = "--" + name.replace("_", "-")
        kind = param.annotation if param.annotation in (int, float, str) else str
        if param.annotation is bool:
            kind = _parse_bool
        group.add_argument(flag, dest=f"param_{name}", type=kind, default=None, metavar=kind.__name__.upper(),
                           help=f"default: {param.default!r}")


def _parse_bool(text: str) -> bool:
    if text.lower() in ("true", "1", "yes"):
        return True
    if text.lower() in ("false", "0", "no"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


_parse_bool.__name__ = "bool"


def given_parameters(args: argparse.Namespace) -> dict:
    return {k[len("param_"):]: v for k, v in vars(args).items() if k.startswith("param_") and v is not None}


def validate_parameters(params: dict) -> dict:
    """Refuses unknown names, wrong types and out-of-range values before anything runs or is sent."""
    from components.augment import AugmentPolicy
    from components.register import REGISTRIES
    from components.train import RECIPES

    known = pipeline_parameters()
    unknown = sorted(set(params) - set(known))
    if unknown:
        raise ValueError(f"Unknown pipeline parameter(s) {unknown}; allowed: {', '.join(known)}")
    merged = {name: p.default for name, p in known.items()} | params
    for name, value in params.items():
        expected = known[name].annotation
        if expected is float and isinstance(value, int) and not isinstance(value, bool):
            params[name] = merged[name] = float(value)
        elif not isinstance(value, expected) or (isinstance(value, bool) and expected is not bool):
            raise ValueError(f"Parameter {name} must be {expected.__name__}, got {value!r}")
    problems = []
    if merged["epochs"] < 0:
        problems.append(f"epochs must be >= 0, 0 for the recipe's (got {merged['epochs']})")
    for name in ("limit", "batch_size", "augment_copies", "learning_rate"):
        if merged[name] < 0:
            problems.append(f"{name} must be >= 0 (got {merged[name]})")
    if merged["min_shards"] < 1:
        problems.append(f"min_shards must be >= 1 (got {merged['min_shards']})")
    if not 0 <= merged["validation_fraction"] < 1 or not 0 <= merged["test_fraction"] < 1 \
            or merged["validation_fraction"] + merged["test_fraction"] >= 1:
        problems.append("validation_fraction and test_fraction must be in [0, 1) and sum to less than 1")
    if merged["channels"] not in (1, 3):
        problems.append(f"channels must be 1 or 3 (got {merged['channels']})")
    if merged["image_size"] < 8:
        problems.append(f"image_size must be >= 8 (got {merged['image_size']})")
    if merged["augment_mode"] not in ("offline", "online"):
        problems.append(f"augment_mode must be offline or online (got {merged['augment_mode']!r})")
    if merged["recipe"] not in RECIPES:
        problems.append(f"recipe must be one of {', '.join(sorted(RECIPES))} (got {merged['recipe']!r})")
    if merged["registry"] not in REGISTRIES:
        problems.append(f"registry must be one of {', '.join(REGISTRIES)} (got {merged['registry']!r})")
    if not 0 <= merged["min_accuracy"] <= 1:
        problems.append(f"min_accuracy must be in [0, 1] (got {merged['min_accuracy']})")
    try:
        from components.launch import pod_scheduling

        pod_scheduling(merged["train_accelerator_type"], merged["train_gpu_count"],
                       known_accelerators=config.ACCELERATORS, spot=merged["train_spot"],
                       node_pool=merged["train_node_pool"])
    except ValueError as e:
        problems.append(str(e))
    if merged["train_workers"] < 0:
        problems.append(f"train_workers must be >= 0 (got {merged['train_workers']})")
    try:
        AugmentPolicy.from_json(merged["augment_policy"])
    except (ValueError, TypeError) as e:
        problems.append(f"augment_policy: {e}")
    if problems:
        raise ValueError("Invalid pipeline parameters:\n  " + "\n  ".join(problems))
    return params


# ---------------------------------------------------------------------------------------------- local run


def find_run_dir(pipeline_root: str) -> str:
    runs = sorted(glob.glob(os.path.join(pipeline_root, f"{training.PIPELINE_NAME}-*")), key=os.path.getmtime)
    if not runs:
        raise RuntimeError(f"kfp.local left no run directory under {pipeline_root}")
    return runs[-1]


def _artifact(run_dir: str, task: str, output: str) -> str | None:
    path = os.path.join(run_dir, task, output)
    return path if os.path.exists(path) else None


def collect_summary(run_dir: str) -> dict:
    """What a local run produced, read back from its artifacts (the same files a cluster run writes)."""
    from components import data

    dataset = _artifact(run_dir, "preprocess-op", "dataset")
    model = _artifact(run_dir, "train-op", "model")
    evaluation_path = _artifact(run_dir, "evaluate-op", "evaluation")
    predictions = _artifact(run_dir, "predict-op", "predictions")
    registration_path = _artifact(run_dir, "register-op", "registration")
    manifest = data.read_manifest(dataset)
    with open(os.path.join(model, "training.json")) as f:
        training_info = json.load(f)
    with open(evaluation_path) as f:
        evaluation = json.load(f)
    registered = None
    if registration_path:
        with open(registration_path) as f:
            reg = json.load(f)
        registered = {"registry": reg["registry"], "model": reg["model"], "version": reg["version"],
                      "aliases": reg["aliases"], "uri": reg["uri"], "new_version": reg["new_version"]}
    with open(os.path.join(predictions, "summary.json")) as f:
        prediction_summary = json.load(f)
    artifacts = {}
    for task in sorted(os.listdir(run_dir)):
        task_dir = os.path.join(run_dir, task)
        if os.path.isdir(task_dir):
            artifacts[task.removesuffix("-op")] = {o: os.path.join(task_dir, o) for o in sorted(os.listdir(task_dir))
                                                   if o != "executor_output.json"}
    return {
        "test_accuracy": evaluation["metrics"]["accuracy"],
        "test_loss": evaluation["metrics"]["loss"],
        "train_seconds": training_info["train_seconds"],
        "images": {s: manifest["splits"][s]["count"] for s in ("train", "validation", "test")}
        | {"rejected": manifest["rejected"]},
        "blessed": evaluation["blessed"],
        "decision": evaluation["decision"],
        "registered": registered,
        "predictions": {"path": os.path.join(predictions, "predictions.jsonl"), "count": prediction_summary["count"],
                        "errors": prediction_summary["errors"]},
        "artifacts": artifacts,
        "run_dir": run_dir,
    }


def run_local(params: dict, output_dir: str, settings: config.PipelineSettings | None = None) -> dict:
    """Compiles the pipeline and runs that compiled YAML with kfp.local's SubprocessRunner; returns the summary."""
    from kfp import components, local

    output_dir = os.path.abspath(output_dir)
    os.makedirs(output_dir, exist_ok=True)
    params = dict(params)
    params.setdefault("registry_root", os.path.join(os.path.dirname(output_dir), "registry"))
    validate_parameters(params)
    package = training.compile_pipeline(os.path.join(output_dir, "pipeline.yaml"), settings)
    pipeline_root = os.path.join(output_dir, "pipeline_root")
    # use_venv=False: the steps run in this environment, where the project is installed (as the image has it).
    local.init(runner=local.SubprocessRunner(use_venv=False), pipeline_root=pipeline_root, raise_on_error=True)
    log.info("running %s locally; artifacts under %s", package, pipeline_root)
    components.load_component_from_file(package)(**params)
    summary = collect_summary(find_run_dir(pipeline_root))
    with open(os.path.join(output_dir, "summary.json"), "w") as f:
        json.dump(summary, f, indent=2)
    return summary


def print_summary(summary: dict, output_dir: str) -> None:
    reg = summary["registered"]
    lines = [
        "",
        f"test accuracy    {summary['test_accuracy']:.4f} (loss {summary['test_loss']:.4f})",
        f"training         {summary['train_seconds']:.1f}s",
        "images           " + ", ".join(f"{k} {v}" for k, v in summary["images"].items()),
        f"decision         {summary['decision']}",
        f"registered       {reg['registry']} model {reg['model']} version {reg['version']} {reg['aliases']}"
        if reg else "registered       nothing (not blessed)",
        f"predictions      {summary['predictions']['count']} in {summary['predictions']['path']}",
        f"summary          {os.path.join(os.path.abspath(output_dir), 'summary.json')}",
    ]
    print("\n".join(lines))


# ---------------------------------------------------------------------------------------------- commands


def cmd_compile(args: argparse.Namespace) -> int:
    settings = settings_from(args)
    training.compile_pipeline(args.output, settings)
    if settings.images == config.Images.from_repo():
        print("note: images are the unpinned development defaults; pass --image-repo/--image-tag or "
              "--cpu-image/--gpu-image for a cluster", file=sys.stderr)
    print(f"wrote {args.output} (cpu image {settings.images.cpu}, gpu image {settings.images.gpu})")
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    params = given_parameters(args)
    if not args.local:
        raise SystemExit("pipectl run: choose where: --local (kfp.local on this machine)")
    output_dir = args.output_dir or os.path.join("runs", _dt.datetime.now().strftime("%Y%m%d-%H%M%S"))
    summary = run_local(params, output_dir, settings_from(args))
    print_summary(summary, output_dir)
    return 0


def cmd_predict(args: argparse.Namespace) -> int:
    from components.predict import predict

    result = predict(args.model, args.images, args.output, batch_size=args.batch_size, top_k=args.top_k)
    print(json.dumps(result.to_json(), indent=2))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="pipectl", description=__doc__)
    parser.add_argument("-v", "--verbose", action="store_true")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("compile", help="write the pipeline as KFP IR YAML")
    p.add_argument("--output", "-o", default="pipeline.yaml")
    add_image_options(p)
    p.set_defaults(func=cmd_compile)

    p = sub.add_parser("run", help="run the pipeline (--local: with kfp.local on this machine)")
    p.add_argument("--local", action="store_true", help="run with kfp.local's SubprocessRunner")
    p.add_argument("--output-dir", help="local run: where artifacts and summary.json go (default: runs/TIMESTAMP)")
    add_image_options(p)
    add_parameter_options(p)
    p.set_defaults(func=cmd_run)

    p = sub.add_parser("predict", help="classify a folder of images with a trained model, outside a pipeline")
    p.add_argument("--model", required=True, help="a model directory written by training (or a SavedModel)")
    p.add_argument("--images", required=True, help="folder of images (local or gs://), searched recursively")
    p.add_argument("--output", required=True, help="output directory for predictions.jsonl/.csv and errors.jsonl")
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--top-k", type=int, default=3)
    p.set_defaults(func=cmd_predict)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        return args.func(args)
    except ValueError as e:
        print(f"pipectl: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
