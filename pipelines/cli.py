"""pipectl: compile the pipeline, run it (locally with kfp.local, or on a KFP host), and predict standalone."""

import argparse
import dataclasses
import datetime as _dt
import glob
import json
import logging
import os
import re
import sys
import warnings
from typing import TextIO

from pipelines import config, training, weights
from pipelines.parameters import add_parameter_options, given_parameters, validate_parameters
from pipelines.backend.kfp_driver import PINNED_RELEASE

log = logging.getLogger("pipectl")

# Pipeline parameters that pipectl fills in for a local run when the user gives none.
LOCAL_DEFAULTS_HELP = "default: a `registry` folder beside the output directory"


def add_image_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("images (pinned into the compiled pipeline)")
    group.add_argument("--image-repo", default=config.DEFAULT_IMAGE_REPO,
                       help="registry path holding the cpu, gpu and torch images (default: %(default)s)")
    group.add_argument("--image-tag", default=config.DEFAULT_IMAGE_TAG, help="tag of the images (default: %(default)s)")
    group.add_argument("--cpu-image", help="full CPU image reference (overrides repo/tag), e.g. REPO/cpu@sha256:...")
    group.add_argument("--gpu-image", help="full GPU image reference (overrides repo/tag), e.g. REPO/gpu@sha256:...")
    group.add_argument("--torch-image", help="full reference of the TensorFlow-free image, torch and JAX (overrides "
                       "repo/tag), e.g. REPO/torch@sha256:...: training, evaluation and batch prediction of runs on "
                       "framework torch or jax")
    group.add_argument("--serving-image", help="what serves models registered in Vertex AI (default: REPO/"
                       "tensorflow-serving:VERSION, TensorFlow Serving as Cloud Build copies it; a Vertex AI "
                       "prebuilt image such as us-docker.pkg.dev/vertex-ai/prediction/tf2-cpu.2-15:latest keeps it)")
    group.add_argument("--target", choices=config.TARGETS, default="kfp",
                       help="kfp: GKE node selectors via kfp-kubernetes, the framework chosen per run; vertex: "
                            "Vertex AI Pipelines, the framework (--framework) and with it the images fixed now")
    group.add_argument("--train-accelerator", default=config.DEFAULT_TRAIN_ACCELERATOR,
                       choices=sorted(config.ACCELERATORS))
    group.add_argument("--train-gpus", type=int, default=1)
    group.add_argument("--predict-accelerator", default=config.DEFAULT_PREDICT_ACCELERATOR,
                       choices=sorted(config.ACCELERATORS))
    group.add_argument("--predict-gpus", type=int, default=1)
    group.add_argument("--predict-gpu-partition", default="",
                       help="batch prediction on a MIG partition of this size, e.g. 1g.10gb (a GKE node pool with "
                            "gpu-partition-size; --predict-gpus 1)")
    group.add_argument("--predict-gpu-sharing", default="", choices=("", *config.SHARING_STRATEGIES),
                       help="batch prediction on a GPU shared this way (a GKE node pool with gpu-sharing-strategy; "
                            "--predict-gpus 1); mps is refused: the step's own pod cannot set hostIPC")
    group.add_argument("--predict-max-shared-clients", type=int, default=0,
                       help="with --predict-gpu-sharing: the node pool's max-shared-clients-per-gpu")
    group.add_argument("--train-launcher", choices=config.TRAIN_LAUNCHERS, default="pod",
                       help="pod: train in the pipeline task; trainjob: a Kubeflow Trainer v2 TrainJob of chief + "
                            "--train-workers nodes; jobset: the same as a JobSet (no Trainer v2); tfjob, pytorchjob: a "
                            "legacy Kubeflow TFJob or (framework torch) PyTorchJob; vertex-job: a Vertex AI CustomJob "
                            "with worker pools")
    group.add_argument("--train-runtime", default=config.DEFAULT_TRAIN_RUNTIME,
                       help="ClusterTrainingRuntime of the TrainJob (default: the framework's in manifests/trainer/)")
    group.add_argument("--train-namespace", default="kubeflow",
                       help="namespace of the TrainJob/JobSet/TFJob (default: %(default)s)")
    group.add_argument("--kueue-queue", default="", help="Kueue queue for the GPU pods and the training job")
    group.add_argument("--gcs-fuse-pvc", default="",
                       help="PersistentVolumeClaim of a bucket mounted with the GCS FUSE CSI driver "
                            "(manifests/gcsfuse/): mounted into the data-heavy steps, data_root defaults to "
                            f"MOUNT/{config.DATA_ROOT_UNDER_MOUNT} (docs/data-by-reference.md)")
    group.add_argument("--gcs-fuse-mount", default=config.GCS_FUSE_MOUNT,
                       help="where --gcs-fuse-pvc is mounted (default: %(default)s)")
    group.add_argument("--gcs-fuse-cache", default="", metavar="SIZE",
                       help="with --gcs-fuse-pvc: the file cache's volume (gke-gcsfuse-cache), an emptyDir of SIZE "
                            "(e.g. 50Gi; on local SSD where the node pool has it) in each data-heavy step; the "
                            "PersistentVolume's file-cache:max-size-mb must be below it (docs/data-by-reference.md)")


def add_host_options(parser: argparse.ArgumentParser, required: bool = False) -> None:
    group = parser.add_argument_group("KFP host (credentials: a bearer token, or Google credentials behind IAP)")
    group.add_argument("--host", required=required, help="KFP API endpoint, e.g. https://kfp.example.com/pipeline")
    group.add_argument("--token-file", help="file holding a bearer token (default: the KFP_TOKEN variable, if set)")
    group.add_argument("--iap-client-id", help="OAuth client id of an IAP-protected endpoint (uses ADC)")
    group.add_argument("--namespace", help="KFP profile namespace (multi-user clusters)")
    group.add_argument("--allow-older-backend", action="store_true", help="warn, not refuse, on a too old KFP backend")


def add_cache_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--cache", action=argparse.BooleanOptionalAction, default=None,
                        help="force caching on/off for this run (default: each step's own setting)")


def settings_from(args: argparse.Namespace) -> config.PipelineSettings:
    repo_images = config.Images.from_repo(args.image_repo, args.image_tag)
    images = config.Images(cpu=args.cpu_image or repo_images.cpu, gpu=args.gpu_image or repo_images.gpu,
                           serving=args.serving_image or repo_images.serving,
                           torch=args.torch_image or repo_images.torch)
    return config.PipelineSettings(images=images, target=args.target, train_accelerator=args.train_accelerator,
                                   train_gpus=args.train_gpus, predict_accelerator=args.predict_accelerator,
                                   predict_gpus=args.predict_gpus, predict_gpu_partition=args.predict_gpu_partition,
                                   predict_gpu_sharing=args.predict_gpu_sharing,
                                   predict_max_shared_clients=args.predict_max_shared_clients,
                                   train_launcher=args.train_launcher,
                                   train_namespace=args.train_namespace, train_runtime=args.train_runtime,
                                   kueue_queue=args.kueue_queue, gcs_fuse_pvc=args.gcs_fuse_pvc,
                                   gcs_fuse_mount=args.gcs_fuse_mount, gcs_fuse_cache=args.gcs_fuse_cache,
                                   framework=compiled_framework(args) if args.target == "vertex" else "")


def compiled_framework(args: argparse.Namespace) -> str:
    """--framework, which Vertex AI takes when compiling (its images are fixed then): empty for the default."""
    return getattr(args, "param_framework", None) or ""


def vertex_settings(args: argparse.Namespace) -> config.PipelineSettings:
    """The image options compiled for Vertex AI Pipelines, --framework with them."""
    return dataclasses.replace(settings_from(args), target="vertex", framework=compiled_framework(args))


# ---------------------------------------------------------------------------------------------- local run


def find_run_dir(pipeline_root: str) -> str:
    runs = sorted(glob.glob(os.path.join(pipeline_root, f"{training.PIPELINE_NAME}-*")), key=os.path.getmtime)
    if not runs:
        raise RuntimeError(f"kfp.local left no run directory under {pipeline_root}")
    return runs[-1]


def _artifact(run_dir: str, task: str, output: str) -> str | None:
    path = os.path.join(run_dir, task, output)
    return path if os.path.exists(path) else None


def collect_summary(run_dir: str, settings: config.PipelineSettings | None = None) -> dict:
    """What a local run produced, read back from its artifacts (the same files a cluster run writes)."""
    from components.dataio import data

    tasks = training.task_names(settings)
    dataset = _artifact(run_dir, tasks["preprocess"], "dataset")
    model = _artifact(run_dir, tasks["train"], "model")
    evaluation_path = _artifact(run_dir, tasks["evaluate"], "evaluation")
    predictions = _artifact(run_dir, tasks["predict"], "predictions")
    registration_path = _artifact(run_dir, tasks["register"], "registration")
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
                      "aliases": reg["aliases"], "uri": reg["uri"], "new_version": reg["new_version"],
                      "promotion": reg.get("promotion", ""), "champion_changed": reg.get("champion_changed", False),
                      "champion": reg.get("champion")}
    with open(os.path.join(predictions, "summary.json")) as f:
        prediction_summary = json.load(f)
    artifacts = {}
    for role, task in tasks.items():
        task_dir = os.path.join(run_dir, task)
        if os.path.isdir(task_dir):
            artifacts[role] = {o: os.path.join(task_dir, o) for o in sorted(os.listdir(task_dir))
                               if o != "executor_output.json"}
    return {
        "test_accuracy": evaluation["metrics"]["accuracy"],
        "test_loss": evaluation["metrics"]["loss"],
        "train_seconds": training_info["train_seconds"],
        "images": {s: manifest["splits"][s]["count"] for s in ("train", "validation", "test")}
        | {"rejected": manifest["rejected"]},
        "blessed": evaluation["blessed"],
        # The gate's line; when another run moved the champion after evaluation, what registration did about it.
        "decision": evaluation["decision"] + (f"; at registration: {registered['promotion']}"
                                              if registered and registered["champion_changed"] else ""),
        "registered": registered,
        # Test images with near-copies in training, as the dataset card says ("" when there are none).
        "near_duplicates_warning": (manifest.get("near_duplicates") or {}).get("warning", ""),
        # Predictions written by reference (data_root) are where their summary says.
        "predictions": {"path": prediction_summary.get("predictions_jsonl")
                        or os.path.join(predictions, "predictions.jsonl"), "count": prediction_summary["count"],
                        "errors": prediction_summary["errors"]},
        "artifacts": artifacts,
        "run_dir": run_dir,
    }


def run_local(params: dict, output_dir: str, settings: config.PipelineSettings | None = None, *,
              console: TextIO | None = None, verbose: bool = False) -> dict:
    """Compiles the pipeline and runs that compiled YAML with kfp.local's SubprocessRunner; returns the summary
    (also written to OUTPUT_DIR/summary.json, and shown as OUTPUT_DIR/index.html).

    Each step's complete output goes to OUTPUT_DIR/logs/<step>.log; `console` (default: this process's stdout)
    gets one line when a step starts, one when it ends, and the project's progress lines between
    (pipelines/local/steplogs.py); with `verbose`, every line. A failed step raises steplogs.StepFailed, whose text
    names the step, its own error message and its log.
    """
    import yaml
    from kfp import components, local

    from pipelines.local import local_checks, runpage, steplogs

    shown_dir = output_dir.rstrip("/") or output_dir
    output_dir = os.path.abspath(output_dir)
    params = dict(params)
    params.setdefault("registry_root", os.path.join(os.path.dirname(output_dir), "registry"))
    validate_parameters(params, launcher=(settings or config.PipelineSettings()).train_placement_launcher)
    local_checks.check_local_sources(params)
    os.makedirs(output_dir, exist_ok=True)
    # No task retries here: they exist for preempted GPU nodes, and on this machine a failed step fails for good,
    # so retrying with backoff (60 + 120 + 240 s) would only keep the user waiting for the same error.
    settings = dataclasses.replace(settings or config.PipelineSettings(), train_retries=0)
    package = training.compile_pipeline(os.path.join(output_dir, "pipeline.yaml"), settings)
    pipeline_root = os.path.join(output_dir, "pipeline_root")
    # The steps inherit this: TensorFlow's C++ start-up chatter, which only the step logs would show anyway.
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    # use_venv=False: the steps run in this environment, where the project is installed (as the image has it).
    local.init(runner=local.SubprocessRunner(use_venv=False), pipeline_root=pipeline_root, raise_on_error=True)

    run_prefix = re.compile(re.escape(pipeline_root) + "/" + re.escape(training.PIPELINE_NAME) + r"-[^/\s]+/")

    def shorten(text: str) -> str:  # a progress line's paths, as the console shows them
        return run_prefix.sub(".../", text).replace(output_dir + "/", shown_dir + "/")

    own_console = console is None
    console = console or steplogs.console_stream()
    tasks = training.task_names(settings)
    logs_dir = os.path.join(output_dir, "logs")
    with open(package) as f:
        groups = steplogs.task_groups(next(yaml.safe_load_all(f)))  # the spec; the platform spec follows
    router = steplogs.StepRouter(
        logs_dir, {task: step for step, task in tasks.items()}, console, verbose=verbose, groups=groups,
        task_outputs=lambda task: steplogs.read_task_outputs(os.path.join(find_run_dir(pipeline_root), task)),
        shorten=shorten)
    console.write(f"running {os.path.join(shown_dir, 'pipeline.yaml')} with kfp.local; each step's full log: "
                  f"{os.path.join(shown_dir, 'logs', 'STEP.log')}\n")
    try:
        # The summary is read inside too: reading the artifacts starts TensorFlow here, whose start-up lines
        # belong in the run's log (logs/pipeline.log), not on the console.
        with steplogs.captured_output(router.feed):
            with warnings.catch_warnings():
                # kfp.local says, for every task, that node selectors and resource requests do nothing here.
                warnings.filterwarnings("ignore", message=".*have no effect in the current local runner")
                # Its other warnings (one per task about the image) go to the task's log, also under a caller
                # that records warnings itself (pytest).
                warnings.showwarning = _warning_to_stderr
                components.load_component_from_file(package)(**params)
            summary = collect_summary(find_run_dir(pipeline_root), settings)
    except RuntimeError as e:
        if router.failures():
            raise steplogs.StepFailed(router.failures(), shorten=shorten) from None
        raise RuntimeError(f"{steplogs.ANSI.sub('', str(e))} (kfp.local's log: "
                           f"{router.log_path(steplogs.PIPELINE_LOG)})") from e
    finally:
        router.close()
        if own_console:
            console.close()
    summary["steps"] = router.summary()
    summary["logs"] = logs_dir
    summary["page"] = runpage.write_run_page(summary, output_dir)
    with open(os.path.join(output_dir, "summary.json"), "w") as f:
        json.dump(summary, f, indent=2)
    return summary


def _warning_to_stderr(message, category, filename, lineno, file=None, line=None) -> None:
    sys.stderr.write(warnings.formatwarning(message, category, filename, lineno, line))


def print_summary(summary: dict, output_dir: str) -> None:
    """The run in a few lines (each step's own figures were on its end line); the run page's path last."""
    reg = summary["registered"]
    shown = output_dir.rstrip("/") or output_dir

    def short(path: str) -> str:  # as the user named the output directory
        return path.replace(os.path.abspath(output_dir), shown, 1)

    lines = [
        f"test accuracy    {summary['test_accuracy']:.4f} (loss {summary['test_loss']:.4f}), "
        f"training {summary['train_seconds']:.1f}s",
        f"decision         {summary['decision']}",
        f"registered       {reg['registry']} model {reg['model']} version {reg['version']} {reg['aliases']}"
        + ("" if reg.get("new_version", True) else " (already registered: the same model)")
        if reg else "registered       nothing (not blessed)",
        f"predictions      {summary['predictions']['count']} in {short(summary['predictions']['path'])}",
        f"summary          {short(os.path.join(os.path.abspath(output_dir), 'summary.json'))}",
        f"run page         {short(summary['page'])}",
    ]
    print("\n".join(lines))


# ---------------------------------------------------------------------------------------------- commands


def cmd_compile(args: argparse.Namespace) -> int:
    settings = settings_from(args)
    params = validate_parameters(given_parameters(args), launcher=settings.train_placement_launcher)
    if settings.target == "vertex":
        params.pop("framework", None)  # fixed into the pipeline (settings.framework), no run parameter there
    if params and not args.explain:
        raise ValueError("pipeline parameters are chosen per run; when compiling they only go with --explain")
    training.compile_pipeline(args.output, settings)
    if settings.images == config.Images.from_repo():
        print("note: images are the unpinned development defaults; pass --image-repo/--image-tag or "
              "--cpu-image/--gpu-image/--torch-image for a cluster", file=sys.stderr)
    print(f"wrote {args.output} (cpu image {settings.images.cpu}, gpu image {settings.images.gpu}, torch image "
          f"{settings.images.torch or 'none'}"
          + (f"; framework {settings.compiled_framework}, fixed for Vertex AI" if settings.target == "vertex" else "")
          + ")",
          file=sys.stderr if args.explain else sys.stdout)
    if args.explain:
        from pipelines.backend import explain

        print(explain.render(explain.explain(args.output, params, args.backend_release)), end="")
    return 0


def kfp_client(args: argparse.Namespace):
    """A kfp.Client for --host: bearer token from --token-file or KFP_TOKEN, or an IAP client id."""
    from pipelines.hosts.publish import make_client

    token = None
    if args.token_file:
        with open(args.token_file) as f:
            token = f.read().strip()
    elif os.environ.get("KFP_TOKEN"):
        token = os.environ["KFP_TOKEN"]
    return make_client(args.host, token=token, namespace=args.namespace, iap_client_id=args.iap_client_id)


def package_for(args: argparse.Namespace, directory: str) -> str:
    """--package as given, or the pipeline compiled now with the image options."""
    if getattr(args, "package", None):
        if not os.path.exists(args.package):
            raise ValueError(f"Pipeline package not found: {args.package}")
        return args.package
    return training.compile_pipeline(os.path.join(directory, "pipeline.yaml"), settings_from(args))


def add_vertex_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("Vertex AI Pipelines (credentials: ADC / Workload Identity; the project is "
                                      "--project)")
    group.add_argument("--vertex", action="store_true", help="use Vertex AI Pipelines")
    group.add_argument("--region", help="Vertex AI region, e.g. us-central1 (also the registry's location)")
    group.add_argument("--pipeline-root", help="gs:// folder for the run's artifacts, in the same region")
    group.add_argument("--service-account", help="service account the steps run as")
    group.add_argument("--vertex-endpoint", help="API endpoint override (private endpoint or a local emulator); an "
                       "http:// endpoint gets no credentials, so none ever travel unencrypted")


# GKE placement parameters (node selector, Spot, node pool) that have no meaning for Vertex AI's machine selection.
VERTEX_COMPILE_TIME_PARAMETERS = {"train_accelerator_type", "train_gpu_count", "train_node_pool", "train_spot"}


def vertex_context(args: argparse.Namespace) -> tuple[dict, dict]:
    """Vertex connection arguments, and the pipeline parameters with Vertex's registry defaults applied."""
    from pipelines.vertexai import vertex

    given = given_parameters(args)
    project, region = given.get("project"), args.region or given.get("location")
    if not project or not region:
        raise ValueError("--vertex needs --project PROJECT and --region REGION")
    connection = {"project": project, "location": region}
    if args.vertex_endpoint:  # an http:// endpoint gets anonymous credentials (components/gcp/clients.py)
        connection["api_endpoint"] = args.vertex_endpoint
    per_run_gpu = sorted(VERTEX_COMPILE_TIME_PARAMETERS & set(given))
    if per_run_gpu:
        raise ValueError(f"On Vertex AI the training GPU is chosen when compiling: use --train-accelerator and "
                         f"--train-gpus instead of {', '.join('--' + p.replace('_', '-') for p in per_run_gpu)}")
    params = validate_parameters(vertex.vertex_run_parameters(given, project=project, location=region),
                                 launcher=vertex_settings(args).train_placement_launcher)
    return connection, params


def vertex_package(args: argparse.Namespace, directory: str) -> str:
    return training.compile_pipeline(os.path.join(directory, "pipeline.yaml"), vertex_settings(args))


def cmd_run(args: argparse.Namespace) -> int:
    if sum(bool(x) for x in (args.local, args.host, args.vertex)) != 1:
        raise ValueError("choose where to run: --local (kfp.local on this machine), --host URL (a KFP API) or "
                         "--vertex (Vertex AI Pipelines)")
    if args.vertex:
        import tempfile

        from pipelines.vertexai import vertex

        connection, params = vertex_context(args)
        with tempfile.TemporaryDirectory() as tmp:
            run = vertex.submit_pipeline_job(vertex_package(args, tmp), pipeline_root=args.pipeline_root,
                                             parameter_values=params, service_account=args.service_account,
                                             display_name=args.run_name, enable_caching=args.cache, wait=args.wait,
                                             poll_seconds=args.poll_seconds, timeout_seconds=args.timeout,
                                             **connection)
        print(json.dumps(run.to_json(), indent=2))
        return 0
    params = validate_parameters(given_parameters(args),
                                 launcher=settings_from(args).train_placement_launcher if args.local else None)
    if args.local:
        output_dir = args.output_dir or os.path.join("runs", _dt.datetime.now().strftime("%Y%m%d-%H%M%S"))
        summary = run_local(params, output_dir, settings_from(args), verbose=args.verbose)
        print_summary(summary, output_dir)
        return 0
    from pipelines.hosts.publish import start_run

    run_name = args.run_name or f"{args.pipeline_name}-{_dt.datetime.now().strftime('%Y%m%d-%H%M%S')}"
    result = start_run(kfp_client(args), pipeline_name=args.pipeline_name, run_name=run_name,
                       version=args.version, experiment=args.experiment, params=params,
                       enable_caching=args.cache, wait=args.wait, timeout_seconds=args.timeout,
                       poll_seconds=args.poll_seconds)
    print(json.dumps(result, indent=2))
    return 0


def cmd_upload(args: argparse.Namespace) -> int:
    import tempfile

    from pipelines.hosts.backend_check import check_backend, package_features
    from pipelines.hosts.publish import upload_version

    with tempfile.TemporaryDirectory() as tmp:
        package, client = package_for(args, tmp), kfp_client(args)
        check_backend(client, package_features(package), host=args.host, allow_older=args.allow_older_backend)
        result = upload_version(client, package, name=args.name, version=args.version,
                                description=args.description, if_exists=args.if_exists)
    print(json.dumps(result, indent=2))
    return 0


def cmd_schedule(args: argparse.Namespace) -> int:
    if bool(args.host) == bool(args.vertex):
        raise ValueError("choose where to schedule: --host URL (a KFP API) or --vertex (Vertex AI Pipelines)")
    if args.vertex:
        return vertex_schedule(args)
    from pipelines.hosts import backend_check, publish

    if args.resume:
        raise ValueError("--resume is for --vertex; on a KFP host, run the schedule command again to re-create it")
    client = kfp_client(args)
    if args.delete:
        result = publish.delete_schedule(client, name=args.name, experiment=args.experiment)
    elif args.disable:
        result = publish.disable_schedule(client, name=args.name, experiment=args.experiment)
    else:
        if not args.cron:
            raise ValueError("--cron is needed to create or update a schedule (e.g. --cron '0 3 * * *')")
        params = validate_parameters(given_parameters(args))
        backend_check.check_backend(client, backend_check.schedule_features(args.version), host=args.host,
                                    allow_older=args.allow_older_backend)
        result = publish.schedule(client, name=args.name, pipeline_name=args.pipeline_name, cron=args.cron,
                                  version=args.version, experiment=args.experiment,
                                  max_concurrency=args.max_concurrency, catchup=not args.no_catchup, params=params,
                                  enable_caching=args.cache)
    print(json.dumps(result, indent=2))
    return 0


def cmd_predict(args: argparse.Namespace) -> int:
    from components import stepcli
    from components.predict import predict_from_args

    # Through the step CLI's helper, so the exit codes are those of `python -m components.predict`.
    return stepcli.run(lambda: predict_from_args(args, args.model, args.images, args.output), prog="pipectl")


def vertex_schedule(args: argparse.Namespace) -> int:
    import tempfile

    from pipelines.vertexai import vertex

    connection, params = vertex_context(args)
    if args.delete:
        result = [s.to_json() for s in vertex.delete_schedule(args.name, **connection)]
    elif args.disable:
        result = [s.to_json() for s in vertex.pause_schedule(args.name, **connection)]
    elif args.resume:
        result = [s.to_json() for s in vertex.resume_schedule(args.name, catch_up=not args.no_catchup, **connection)]
    else:
        if not args.cron:
            raise ValueError("--cron is needed to create or update a schedule (e.g. --cron '0 3 * * *')")
        with tempfile.TemporaryDirectory() as tmp:
            result = vertex.schedule_pipeline_job(
                vertex_package(args, tmp), cron=args.cron, name=args.name, pipeline_root=args.pipeline_root,
                parameter_values=params, service_account=args.service_account,
                max_concurrent_run_count=args.max_concurrency, enable_caching=args.cache, **connection).to_json()
    print(json.dumps(result, indent=2))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="pipectl", description=__doc__)
    parser.add_argument("-v", "--verbose", action="store_true")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("compile", help="write the pipeline as KFP IR YAML; --explain: and print the pods it makes")
    p.add_argument("--output", "-o", default="pipeline.yaml")
    p.add_argument("--explain", action="store_true", help="print each step's pod for these parameter values")
    p.add_argument("--backend-release", default=PINNED_RELEASE, help="KFP backend release (default: %(default)s)")
    add_image_options(p)
    add_parameter_options(p)
    p.set_defaults(func=cmd_compile)

    p = sub.add_parser("run", help="run the pipeline: --local (kfp.local here) or --host URL (a KFP API)")
    p.add_argument("--local", action="store_true", help="run with kfp.local's SubprocessRunner")
    # SUPPRESS: `pipectl -v run` and `pipectl run -v` both work (a default here would undo the first).
    p.add_argument("-v", "--verbose", action="store_true", default=argparse.SUPPRESS,
                   help="--local: show every step's complete output as it comes (it always goes to its log)")
    p.add_argument("--output-dir", help="local run: where artifacts and summary.json go (default: runs/TIMESTAMP)")
    add_host_options(p)
    p.add_argument("--pipeline-name", default=training.PIPELINE_NAME, help="--host: the uploaded pipeline to run")
    p.add_argument("--version", default="latest", help="--host: pipeline version name, or latest (default)")
    p.add_argument("--experiment", default="Default", help="--host: experiment (created when missing)")
    p.add_argument("--run-name", help="--host/--vertex: run name (default: PIPELINE-TIMESTAMP)")
    p.add_argument("--wait", action="store_true", help="--host/--vertex: follow the run; exit non-zero when it fails")
    p.add_argument("--timeout", type=float, default=86400, help="--host --wait: give up after this many seconds")
    p.add_argument("--poll-seconds", type=float, default=30, help="--host --wait: seconds between status checks")
    add_cache_option(p)
    add_vertex_options(p)
    add_image_options(p)
    add_parameter_options(p)
    p.set_defaults(func=cmd_run)

    p = sub.add_parser("upload", help="upload the pipeline as a new version to a KFP host (the KFP UI)")
    add_host_options(p, required=True)
    p.add_argument("--name", default=training.PIPELINE_NAME, help="pipeline name (default: %(default)s)")
    p.add_argument("--version", required=True, help="version name, e.g. the git commit")
    p.add_argument("--package", help="compiled pipeline YAML (default: compile now with the image options)")
    p.add_argument("--description", default="")
    p.add_argument("--if-exists", choices=("error", "skip"), default="error",
                   help="when the version name exists: error (default) or skip; never overwrite")
    add_image_options(p)
    p.set_defaults(func=cmd_upload)

    p = sub.add_parser("schedule", help="create or update the recurring run (KFP host or Vertex AI Pipelines)")
    add_host_options(p)
    add_vertex_options(p)
    p.add_argument("--name", default=training.PIPELINE_NAME,
                   help="schedule name: one schedule per name, updated in place (default: %(default)s)")
    p.add_argument("--pipeline-name", default=training.PIPELINE_NAME)
    p.add_argument("--cron", help="standard 5-field cron, e.g. '0 3 * * *' (03:00 every day)")
    p.add_argument("--version", default="latest", help="pipeline version to run, or latest (default): the newest "
                   "version at every trigger")
    p.add_argument("--experiment", default="Default")
    p.add_argument("--max-concurrency", type=int, default=1)
    p.add_argument("--no-catchup", action="store_true", help="do not backfill runs missed while paused")
    action = p.add_mutually_exclusive_group()
    action.add_argument("--disable", "--pause", action="store_true", help="pause the schedule")
    action.add_argument("--resume", action="store_true", help="--vertex: resume a paused schedule")
    action.add_argument("--delete", action="store_true", help="delete the schedule")
    add_cache_option(p)
    add_image_options(p)
    add_parameter_options(p)
    p.set_defaults(func=cmd_schedule)

    p = sub.add_parser("predict", help="classify a folder of images with a trained model, outside a pipeline")
    p.add_argument("--model", required=True, help="a model directory written by training (or a SavedModel)")
    p.add_argument("--images", required=True, help="a folder (searched recursively), a glob, a manifest "
                   "(.txt/.csv/.jsonl of uris) or TFRecord shards; local or gs://")
    p.add_argument("--output", required=True, help="output directory for predictions.jsonl/.csv and errors.jsonl; "
                   "a rerun into the same directory with the same model and options skips what is already predicted")
    from components.predict import add_arguments as add_predict_arguments

    add_predict_arguments(p)
    p.set_defaults(func=cmd_predict)
    weights.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    from pipelines.hosts.publish import PublishError
    from pipelines.local.steplogs import StepFailed
    from pipelines.vertexai.vertex import VertexPipelineError

    try:
        return args.func(args)
    except (ValueError, PublishError) as e:
        print(f"pipectl: error: {e}", file=sys.stderr)
        return 2
    except (VertexPipelineError, TimeoutError) as e:
        print(f"pipectl: error: {e}", file=sys.stderr)
        return 1
    except StepFailed as e:  # the step's own message and its log say what happened; no traceback from here
        print(f"pipectl: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("pipectl: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
