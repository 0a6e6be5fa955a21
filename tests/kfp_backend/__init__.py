"""Kubeflow Pipelines' own backend code on a compiled pipeline: the Go program under tests/kfp_backend/harness
imports kubeflow/pipelines at a release's commit (its go.mod), compiles the YAML to the Argo Workflow the API server
makes, and runs the real drivers over the workflow's DAG (harness/main.go says how). This module builds it (Go's
module and build caches make a rebuild take seconds), runs it, puts its pods in the shape `pipectl compile --explain`
prints, and lists where the two differ.

`python -m tests.kfp_backend PIPELINE.yaml --release 2.17.0 --param train_gpu_count=2` prints both and the
differences (docs/kfp-compatibility.md).
"""

from __future__ import annotations

import atexit
import dataclasses
import functools
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tests import go_modules
from tests.go_modules import GoMissing  # noqa: F401 (callers catch it here)

HARNESS = Path(__file__).parent / "harness"
# The releases a harness module is built for, newest first: the release -> its go.mod (go.mod is the newest
# release's; the others are `-modfile`s beside it, so one source tree serves each), and the build tags that pick
# the source files where a release's API differs (options_*.go: driver.Options; argo_v3.go: the Argo Workflows v3
# that releases before 2.17 pin).
RELEASES = {"2.17.0": "go.mod", "2.16.1": "go.2.16.1.mod", "2.15.0": "go.2.15.0.mod"}
BUILD_TAGS = {"2.17.0": "", "2.16.1": "kfp2_16,argo3", "2.15.0": "kfp2_15,argo3"}
GO_HINT = "Go 1.26 (https://go.dev/dl/, or /usr/local/go/bin on PATH) runs Kubeflow Pipelines' backend in the tests"


def go() -> str:
    return go_modules.go(GO_HINT)


def binary_path(release: str) -> Path:
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
    return cache / "kfp-backend-harness" / release / "kfp-backend"


@functools.cache
def build(release: str) -> Path:
    """Build the harness for `release` (Go's caches make this seconds when nothing changed), once a process: the
    harness runs of a test session use the binary its first call built, not a `go build` (1.3 CPU-s when nothing
    changed) each."""
    if release not in RELEASES:
        raise ValueError(f"no harness for KFP {release}: built releases are {', '.join(RELEASES)}")
    out = binary_path(release)
    out.parent.mkdir(parents=True, exist_ok=True)
    argv = [go(), "build", "-o", str(out), *module_flags(release), "."]
    done = subprocess.run(argv, cwd=HARNESS, capture_output=True, text=True, env=build_env())
    if done.returncode and "kubeflow/pipelines" in done.stderr and "403 Forbidden" in done.stderr:
        raise GoMissing(f"the Go module proxy refuses github.com/kubeflow/pipelines: set KFP_GIT to a clone of "
                        f"https://github.com/kubeflow/pipelines to build the KFP {release} harness from it")
    if done.returncode:
        raise RuntimeError(f"building the KFP {release} harness failed:\n{done.stderr[-4000:]}")
    return out


def module_flags(release: str) -> list[str]:
    """The go command's flags that pick `release`'s go.mod and source files."""
    flags = [] if RELEASES[release] == "go.mod" else [f"-modfile={RELEASES[release]}"]
    return flags + ([f"-tags={BUILD_TAGS[release]}"] if BUILD_TAGS[release] else [])


def argo_module(release: str) -> str:
    """The Argo Workflows module `release` pins: v3 before 2.17 (argo_v3.go), v4 from 2.17 (argo_v4.go)."""
    return "github.com/argoproj/argo-workflows/v3" if "argo3" in BUILD_TAGS[release] else \
        "github.com/argoproj/argo-workflows/v4"


def build_env() -> dict:
    """The environment of a harness build. Where the Go module proxy refuses kubeflow/pipelines (some mirrors
    do), KFP_GIT names a local clone of github.com/kubeflow/pipelines to fetch those modules from instead; the
    go.sum pins what they must hash to either way."""
    from tests.go_modules import build_env as local_clones

    return local_clones({"https://github.com/kubeflow/pipelines": "KFP_GIT"})


def go_test(release: str) -> subprocess.CompletedProcess:
    """The harness's own Go tests (its in-memory ML Metadata store against `release`'s driver's metadata client)."""
    return subprocess.run([go(), "test", *module_flags(release), "."], cwd=HARNESS, capture_output=True, text=True,
                          env=build_env())


def run(package_path: str, parameters: dict, outputs: dict, release: str) -> dict:
    """The harness's report for the compiled pipeline and these run parameters (tasks: pod, labels, executor
    input, condition), with `outputs` as the fixed output parameters of the tasks others read."""
    done = subprocess.run([str(build(release)), "--pipeline", package_path, "--params", json.dumps(parameters),
                           "--outputs", json.dumps(outputs)], capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"the KFP {release} harness failed: {done.stderr.strip()[-4000:]}")
    return json.loads(done.stdout)


def downloaded(objects: list[str], uri: str, release: str) -> list[str]:
    """The URIs of the objects the release's own objectstore.DownloadBlob copies for an input artifact at `uri`,
    from a bucket holding `objects` (gs:// URIs of one bucket)."""
    bucket = uri.split("/")[2]
    prefix = f"gs://{bucket}/"
    keys = [o[len(prefix):] for o in objects if o.startswith(prefix)]
    done = subprocess.run([str(build(release)), "--download-objects", json.dumps(keys),
                           "--download-key", uri[len(prefix):]], capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"the KFP {release} harness failed: {done.stderr.strip()[-2000:]}")
    return [prefix + key for key in json.loads(done.stdout)]


def workflow(package_path: str, parameters: dict, release: str) -> dict:
    """The Argo Workflow the release's API server makes of the compiled pipeline for these run parameters."""
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "workflow.json")
        done = subprocess.run([str(build(release)), "--pipeline", package_path, "--params", json.dumps(parameters),
                               "--workflow-out", out, "--outputs", json.dumps(_all_outputs(package_path, parameters))],
                              capture_output=True, text=True)
        if done.returncode:
            raise RuntimeError(f"the KFP {release} harness failed: {done.stderr.strip()[-4000:]}")
        with open(out) as f:
            return json.load(f)


def _all_outputs(package_path: str, parameters: dict) -> dict:
    from pipelines.backend import explain, kfp_driver

    spec, _ = kfp_driver.read_package(package_path)
    return explain.producer_outputs(spec, parameters) | decision_outputs(spec)


@functools.cache
def argo_workflow_schema(release: str) -> tuple[str, dict]:
    """The Workflow CRD's openAPIV3Schema of the Argo Workflows release that `release`'s go.mod pins (its module's
    manifests/base/crds/full/argoproj.io_workflows.yaml), as JSON Schema, and the Argo version; read once a
    process (callers only read it)."""
    import yaml

    argv = [go(), "list", "-m", *module_flags(release)[:1], "-f", "{{.Version}} {{.Dir}}", argo_module(release)]
    done = subprocess.run(argv, cwd=HARNESS, capture_output=True, text=True, env=build_env())
    if done.returncode:
        raise RuntimeError(done.stderr)
    version, directory = done.stdout.split()
    with open(os.path.join(directory, "manifests/base/crds/full/argoproj.io_workflows.yaml")) as f:
        crd = yaml.safe_load(f)
    return version, _json_schema(crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"])


def _json_schema(node):
    """OpenAPI v3 (Kubernetes structural schema) as JSON Schema: `x-kubernetes-int-or-string` is an integer or a
    string, `nullable` admits null; unknown fields are allowed, as the API server prunes them."""
    if isinstance(node, list):
        return [_json_schema(n) for n in node]
    if not isinstance(node, dict):
        return node
    node = {k: _json_schema(v) for k, v in node.items()}
    if node.pop("x-kubernetes-int-or-string", False):
        node.pop("type", None)
        node = {"anyOf": [{"type": "integer"}, {"type": "string"}], **node}
    if node.pop("nullable", False) and "type" in node:
        node["type"] = [node["type"], "null"]
    return node


def workflow_errors(workflow_object: dict, schema: dict) -> list[str]:
    """Where the workflow breaks the CRD's schema, one line each; [] when it validates. Nulls are dropped first, as
    the API server prunes a null of a field that is not nullable before it validates (apiextensions.k8s.io/v1;
    Go writes an unset metav1.Time as null)."""
    import jsonschema

    def pruned(node):
        if isinstance(node, dict):
            return {k: pruned(v) for k, v in node.items() if v is not None}
        return [pruned(v) for v in node] if isinstance(node, list) else node

    validator = jsonschema.Draft7Validator(schema)
    return [f"{'/'.join(map(str, e.absolute_path)) or '(root)'}: {e.message[:300]}"
            for e in validator.iter_errors(pruned(workflow_object))]


def as_explained(report: dict) -> list[dict]:
    """The real pods in the shape `pipectl compile --explain` prints its steps (pipelines/backend/kfp_driver.TaskPod):
    what the driver's patch puts on the executor template's pod. Volumes, mounts and env the template already has (the
    launcher's scratch volumes, KFP_POD_NAME...) are every pod's and left out; `command` is the launcher's
    command line after its `--` and the args, which is the step's own command line."""
    steps = []
    for task in report["tasks"]:
        entry: dict = {"task": task["task"]}
        if task.get("error"):
            entry["fails"] = task["error"]
        if task.get("skipped"):
            entry["skipped"] = task["skipped"]
        pod, template = task.get("pod"), task.get("template_pod") or {}
        if pod:
            main, base = pod["containers"][0], (template.get("containers") or [{}])[0]
            command = main.get("command") or []
            entry["image"] = main.get("image")
            entry["resources"] = main.get("resources") or {}
            entry["node_selector"] = pod.get("nodeSelector")
            entry["tolerations"] = pod.get("tolerations")
            entry["volumes"] = _added(pod.get("volumes"), template.get("volumes"))
            entry["volume_mounts"] = _added(main.get("volumeMounts"), base.get("volumeMounts"))
            entry["env"] = [e for e in _added(main.get("env"), base.get("env")) or []
                            if not e["name"].startswith("KFP_")] or None  # the launcher's (KFP_RETRY_INDEX)
            # the launcher runs what follows its `--`: the rest of its command, then the container's args
            entry["command_line"] = (command[command.index("--") + 1:] if "--" in command else []) + \
                (main.get("args") or [])
        values = ((task.get("executor_input") or {}).get("inputs") or {}).get("parameterValues") or {}
        entry["inputs"] = values
        entry["labels"] = {k: v for k, v in (task.get("labels") or {}).items() if not _system(k)}
        entry["annotations"] = {k: v for k, v in (task.get("annotations") or {}).items() if not _system(k)}
        steps.append(entry)
    return steps


def _added(merged: list | None, base: list | None) -> list | None:
    return [item for item in merged or [] if item not in (base or [])] or None


def _system(key: str) -> bool:
    """Labels and annotations KFP and Argo put on every pod, which a pipeline does not choose."""
    return key.startswith(("pipelines.kubeflow.org/", "workflows.argoproj.io/", "sidecar.istio.io/",
                           "pipeline/runid"))


# The fields compared one by one: those pipelines/backend/kfp_driver.py answers, and the step's command line.
MODEL_FIELDS = ("image", "resources", "node_selector", "tolerations", "volumes", "volume_mounts", "env", "labels",
                "annotations")


def _norm(value):
    if isinstance(value, dict):
        value = {k: v for k, v in value.items() if v not in (None, {}, [])}
    return value or None


def differences(explained: dict, real: list[dict], spec: dict | None = None,
                counted: list | None = None) -> list[str]:
    """Where `pipectl compile --explain`'s steps and the real driver's pods differ, one line per field with both
    sides; [] when they agree. With the compiled `spec`, each pod's command and args must also be its executor's
    (the model passes them through unchanged). `counted` gets one entry per field compared."""
    counted = [] if counted is None else counted
    diffs = []
    model = {s["task"]: s for s in explained["steps"]}
    seen = set()
    for pod in real:
        name = pod["task"]
        seen.add(name)
        if name not in model:
            diffs.append(f"{name}: the real driver makes a pod; explain has no step")
            continue
        step = model[name]
        if ("fails" in pod) != ("fails" in step):
            diffs.append(f"{name}: fails: explain {step.get('fails')!r} / real {pod.get('fails')!r}")
            continue
        if "fails" in pod:
            continue
        for field in MODEL_FIELDS:
            counted.append((name, field))
            ours, theirs = _norm(step.get(field)), _norm(pod.get(field))
            if ours != theirs:
                diffs.append(f"{name}: {field}: explain {json.dumps(ours)} / real {json.dumps(theirs)}")
        if spec is not None:
            from pipelines.backend.explain import all_tasks

            component = spec["components"][all_tasks(spec)[name]["componentRef"]["name"]]
            container = spec["deploymentSpec"]["executors"][component["executorLabel"]]["container"]
            for input_name, definition in component.get("inputDefinitions", {}).get("parameters", {}).items():
                if definition.get("parameterType") == "TASK_CONFIG":  # what a cluster launcher's nodes follow
                    counted.append((name, "task_config"))
                    ours, theirs = _norm(step.get("task_config")), _norm(pod["inputs"].get(input_name))
                    if ours != theirs:
                        diffs.append(f"{name}: task_config: explain {json.dumps(ours)} / real {json.dumps(theirs)}")
            compiled = (container.get("command") or []) + (container.get("args") or [])
            counted.append((name, "command"))
            if compiled != pod.get("command_line"):
                diffs.append(f"{name}: command and args: compiled {json.dumps(compiled)[:400]} / real "
                             f"{json.dumps(pod.get('command_line'))[:400]}")
    for name in model:
        if name not in seen:
            diffs.append(f"{name}: explain has a step; the real driver makes no pod")
    return diffs


def decision_outputs(spec: dict) -> dict:
    """True for every boolean output of the other tasks (the evaluation's `blessed`), so that the branches they
    guard run and their pods are made, as explain shows every step's pod."""
    from pipelines.backend.explain import PRODUCERS, all_tasks

    outputs = {}
    for name, task in all_tasks(spec).items():
        component = spec["components"][task["componentRef"]["name"]]
        if component.get("executorLabel", "")[len("exec-"):] in PRODUCERS:
            continue
        for output, definition in component.get("outputDefinitions", {}).get("parameters", {}).items():
            if definition.get("parameterType") == "BOOLEAN":
                outputs.setdefault(name, {})[output] = True
    return outputs


@dataclasses.dataclass
class Comparison:
    explained: dict  # pipectl compile --explain's answer
    real: list[dict]  # the real driver's pods, in explain's shape
    differences: list[str]
    fields: int  # how many fields were compared


# The pipeline variants we compile (compile options, run parameters): the frameworks, the train launchers, GPU
# type/count/pool/Spot, GCS FUSE (and its file cache's volume), data_root, Kueue, the Vertex target, shared GPUs and
# GPUDirect.
VARIANTS = {
    "default": ([], {}),
    "torch": (["--framework", "torch"], {}),
    "jax": (["--framework", "jax"], {}),
    "cpu-training": ([], {"train_gpu_count": 0}),
    "two-gpus-l4-pool-spot": ([], {"train_gpu_count": 2, "train_accelerator_type": "nvidia-l4",
                                   "train_node_pool": "gpu-pool", "train_spot": True}),
    "trainjob-torch-2gpus": (["--train-launcher", "trainjob", "--framework", "torch", "--train-gpus", "2"], {}),
    "jobset": (["--train-launcher", "jobset"], {}),
    "tfjob": (["--train-launcher", "tfjob"], {}),
    "pytorchjob": (["--train-launcher", "pytorchjob", "--framework", "torch"], {}),
    "vertex-job": (["--train-launcher", "vertex-job"], {"project": "p", "location": "us-central1"}),
    "gcs-fuse": (["--gcs-fuse-pvc", "kfp-data"], {}),
    "gcs-fuse-file-cache": (["--gcs-fuse-pvc", "kfp-data", "--gcs-fuse-cache", "50Gi"], {}),
    "data-root": ([], {"data_root": "gs://BUCKET/kfp-data"}),
    "kueue": (["--kueue-queue", "team-a", "--train-launcher", "trainjob"], {}),
    "vertex-target": (["--target", "vertex"], {}),
    "time-shared-training": ([], {"train_accelerator_type": "nvidia-l4", "train_gpu_sharing": "time-sharing",
                                  "train_max_shared_clients": 4}),
    "mig-predict": (["--predict-accelerator", "nvidia-a100-80gb", "--predict-gpu-partition", "1g.10gb"], {}),
    "rdma-trainjob": (["--train-launcher", "trainjob", "--framework", "torch"],
                      {"train_network": "rdma", "train_accelerator_type": "nvidia-h200-141gb", "train_gpu_count": 8,
                       "train_workers": 1}),
}


def compile_variant(variant: str, folder: str) -> tuple[str, dict]:
    """The variant compiled as `pipectl compile` does, and its run parameters (its parameter flags included)."""
    from pipelines import training
    from pipelines.cli import build_parser, given_parameters, settings_from, validate_parameters

    options, parameters = VARIANTS[variant]
    path = os.path.join(folder, f"{variant}.yaml")
    args = build_parser().parse_args(["compile", "-o", path, *options])
    training.compile_pipeline(path, settings_from(args))
    return path, {**validate_parameters(given_parameters(args)), **parameters}


@functools.cache
def _compiled_variant(variant: str) -> tuple[str, dict]:
    folder = tempfile.mkdtemp(prefix=f"kfp-variant-{variant}-")
    atexit.register(shutil.rmtree, folder, True)
    return compile_variant(variant, folder)


# A VARIANTS pipeline's real runs at a release, once a process: the tests that compare each variant, validate its
# workflow against Argo's CRD and check docs/kfp-compatibility.md's rows read the same runs of the same binaries.
@functools.cache
def variant_comparison(variant: str, release: str) -> Comparison:
    """compare() of the compiled variant at `release`."""
    return compare(*_compiled_variant(variant), release)


@functools.cache
def variant_workflow_errors(variant: str, release: str) -> tuple[str, list[str], dict]:
    """The Argo version `release` pins, where the Workflow its API server makes of the compiled variant breaks that
    version's CRD ([] when valid), and the workflow's kind and template count."""
    path, parameters = _compiled_variant(variant)
    version, schema = argo_workflow_schema(release)
    made = workflow(path, parameters, release)
    shape = {"kind": made.get("kind"), "templates": len((made.get("spec") or {}).get("templates") or [])}
    return version, workflow_errors(made, schema), shape


DOC = Path(__file__).parents[2] / "docs" / "kfp-compatibility.md"
ROWS_BEGIN, ROWS_END = "<!-- real-backend rows: python -m tests.kfp_backend --write-docs -->", "<!-- end -->"


def doc_rows() -> str:
    """docs/kfp-compatibility.md's rows of what the real backend was compared on, from real runs (those this
    process already ran for the tests are read, not run again)."""
    lines = ["| release | variants compared | fields compared | differences | Argo Workflow CRD |",
             "| --- | --- | --- | --- | --- |"]
    for release in RELEASES:
        fields, diffs, errors = 0, [], []
        for variant in VARIANTS:
            result = variant_comparison(variant, release)
            fields, diffs = fields + result.fields, diffs + result.differences
            version, broken, _ = variant_workflow_errors(variant, release)
            errors += broken
        lines.append(f"| {release} | {len(VARIANTS)}: {', '.join(VARIANTS)} | {fields} | "
                     f"{len(diffs) or 'none'} | {'valid' if not errors else f'{len(errors)} errors'} at Argo "
                     f"{version} |")
    return "\n".join(lines)


def write_docs() -> None:
    text = DOC.read_text()
    before, rest = text.split(ROWS_BEGIN, 1)
    _, after = rest.split(ROWS_END, 1)
    DOC.write_text(f"{before}{ROWS_BEGIN}\n{doc_rows()}\n{ROWS_END}{after}")


def documented_rows() -> str:
    return DOC.read_text().split(ROWS_BEGIN, 1)[1].split(ROWS_END, 1)[0].strip()


def compare(package_path: str, parameters: dict, release: str) -> tuple[dict, list[dict], list[str]]:
    """explain's answer, the real pods, and their differences for a compiled pipeline and run parameters. The
    producer steps' outputs (GPU check, images) come from running those steps here, as explain does."""
    from pipelines.backend import explain, kfp_driver

    explained = explain.explain(package_path, parameters, release)
    spec, _ = kfp_driver.read_package(package_path)
    outputs = explain.producer_outputs(spec, parameters) | decision_outputs(spec)
    real = as_explained(run(package_path, parameters, outputs, release))
    spec, executors = kfp_driver.read_package(package_path)
    resolved = {pod.task: pod.inputs for pod in kfp_driver.resolve_pods(spec, executors, parameters, outputs, release,
                                                                        failures=[])}
    counted: list = []
    diffs = differences(explained, real, spec, counted) + input_differences(resolved, real, counted)
    return Comparison(explained, real, diffs, len(counted))


def input_differences(resolved: dict, real: list[dict], counted: list | None = None) -> list[str]:
    """Each task input the model resolves against the executor input the real driver hands the launcher; an input
    still holding a `{{$.inputs...}}` placeholder there is the launcher's to fill, and not compared."""
    diffs = []
    for pod in real:
        for name, ours in resolved.get(pod["task"], {}).items():
            if isinstance(ours, kfp_driver_unresolved()) or name not in pod.get("inputs", {}):
                continue
            theirs = pod["inputs"][name]
            if isinstance(theirs, str) and "{{$" in theirs:
                continue
            if counted is not None:
                counted.append((pod["task"], name))
            same = float(ours) == float(theirs) if isinstance(ours, (int, float)) and not isinstance(ours, bool) \
                and isinstance(theirs, (int, float)) and not isinstance(theirs, bool) else ours == theirs
            if not same:
                diffs.append(f"{pod['task']}: input {name}: explain {json.dumps(ours)} / real {json.dumps(theirs)}")
    return diffs


def kfp_driver_unresolved():
    from pipelines.backend.kfp_driver import Unresolved

    return Unresolved


def main(argv: list[str] | None = None) -> int:
    import argparse

    import yaml

    parser = argparse.ArgumentParser(prog="python -m tests.kfp_backend", description=__doc__.split("\n\n")[0])
    parser.add_argument("pipeline", nargs="?", help="a compiled pipeline YAML (pipectl compile -o P.yaml)")
    parser.add_argument("--build", action="store_true", help="only build the harness for every release")
    parser.add_argument("--write-docs", action="store_true",
                        help="regenerate docs/kfp-compatibility.md's real-backend rows from real runs")
    parser.add_argument("--release", default=next(iter(RELEASES)), help="KFP release (built: %(choices)s)",
                        choices=list(RELEASES))
    parser.add_argument("--param", action="append", default=[], metavar="NAME=VALUE",
                        help="a run parameter (VALUE as JSON where it parses, else a string)")
    args = parser.parse_args(argv)
    if args.write_docs:
        write_docs()
        print(documented_rows())
        return 0
    if args.build or not args.pipeline:
        try:
            for release in RELEASES:
                started = time.monotonic()
                print(f"KFP {release} harness: {build(release)} ({time.monotonic() - started:.1f}s)")
        except GoMissing as e:
            print(e, file=sys.stderr)
            return 2
        return 0
    parameters = {}
    for item in args.param:
        name, _, value = item.partition("=")
        try:
            parameters[name] = json.loads(value)
        except ValueError:
            parameters[name] = value
    try:
        result = compare(args.pipeline, parameters, args.release)
        real, diffs = result.real, result.differences
    except GoMissing as e:
        print(e, file=sys.stderr)
        return 2
    print(f"# the real KFP {args.release} driver's pods (tests/kfp_backend/harness)")
    from pipelines.backend import kfp_driver
    from pipelines.backend.explain import all_tasks

    spec, _ = kfp_driver.read_package(args.pipeline)
    shown = []
    for step in real:
        entry = {k: v for k, v in step.items() if v not in (None, {}, []) and k not in ("command_line", "inputs")}
        component = spec["components"][all_tasks(spec)[step["task"]]["componentRef"]["name"]]
        for name, definition in component.get("inputDefinitions", {}).get("parameters", {}).items():
            if definition.get("parameterType") == "TASK_CONFIG" and name in step.get("inputs", {}):
                entry["task_config"] = step["inputs"][name]  # what the step's cluster launcher receives
        shown.append(entry)
    print(yaml.safe_dump({"backend_release": args.release, "steps": shown}, sort_keys=False, width=118), end="")
    print(f"# differences from pipectl compile --explain --backend-release {args.release}")
    print("\n".join(diffs) if diffs else "none")
    return 1 if diffs else 0
