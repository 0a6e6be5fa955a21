"""A real Kubernetes control plane for the tests: `kube-apiserver` and `etcd` built from their own Go modules
(k8s.io/kubernetes and go.etcd.io/etcd at the versions harness/go.mod pins), run by controller-runtime's envtest the
way Kubeflow Trainer's, JobSet's and Kueue's integration tests run them, with the CRDs vendored in tests/schemas
installed, the RBAC authorizer on and the admission plugins GKE adds; with Trainer's and JobSet's controllers
(`controllers=True`), and Kueue's beside them (`kueue=True`, kueue/main.go, a module of its own).

`build()` builds the two binaries, the harness, kubectl, the Training Operator's and Kueue's binaries into
~/.cache/control-plane/<versions>/ (Go's module and build caches make a rebuild take seconds). `ControlPlane()` starts it on a loopback port and hands out a kubeconfig; the
real `kubernetes` client talks to it as it talks to a cluster. `apply()` applies objects server-side and returns
what the API server answers.

`python -m tests.control_plane apply FILE...` starts it, applies the files and prints each answer; with
`--controllers`, Trainer's and JobSet's controllers run too, and it prints what they create (`made_by_controllers()`)
(docs/multi-node-training.md).
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path

from tests import go_modules
from tests.go_modules import GoMissing  # noqa: F401 (callers catch it here)

HARNESS = Path(__file__).parent / "harness"
SCHEMAS = Path(__file__).parent.parent / "schemas"
GO_HINT = "Go 1.26 (https://go.dev/dl/, or /usr/local/go/bin on PATH) builds the Kubernetes control plane of the tests"
# The binaries: the name in the cache folder -> the Go package that `go build` makes it from (harness/go.mod's
# `tool` lines pin the modules; "." is the envtest harness itself, harness/main.go). kubectl runs
# docs/cluster-setup.sh in tests/test_cluster_setup.py, and its `kubectl kustomize` (kustomize v5.8.1, which
# kubectl v1.36.3 embeds) rendered tests/cluster_setup/.
BINARIES = {"kube-apiserver": "k8s.io/kubernetes/cmd/kube-apiserver", "etcd": "go.etcd.io/etcd/server/v3",
            "control-plane-harness": ".", "kubectl": "k8s.io/kubernetes/cmd/kubectl"}
# The Kubeflow Training Operator v1.9.4's PyTorchJob and TFJob controllers and webhooks (ControlPlane's
# `training_operator`), in a module of its own (training_operator/go.mod): it pins other scheduler-plugins and
# Volcano APIs than Trainer v2 does.
OPERATOR = Path(__file__).parent / "training_operator"
OPERATOR_BINARY = "training-operator-harness"
OPERATOR_MODULE = "github.com/kubeflow/training-operator"
# The admission plugins GKE enables on top of kube-apiserver's default set (which envtest keeps, less
# ServiceAccount: envtest turns that off, as no controller creates the `default` service accounts here).
# ExtendedResourceToleration: "GKE automatically applies the corresponding tolerations to Pods requesting GPUs by
# running the ExtendedResourceToleration admission controller" (cloud.google.com/kubernetes-engine/docs/how-to/gpus).
# GKE publishes no complete list of its plugins; the others it documents (PodSecurity, since 1.25) are already in
# kube-apiserver's default set.
ADMISSION_PLUGINS = ("ExtendedResourceToleration",)
# Kubeflow Trainer (whose controllers and webhooks the harness runs with `--trainer`) and JobSet, at the versions
# harness/go.mod pins. Where the Go module proxy refuses them (some mirrors serve github.com/kubeflow/trainer/v2 only
# at v2.0.0 and refuse sigs.k8s.io/jobset), TRAINER_GIT and JOBSET_GIT name local clones of these repositories to
# fetch them from instead (go.mod replaces sigs.k8s.io/jobset, whose vanity path needs https://sigs.k8s.io, with its
# GitHub repository); go.sum pins what they hash to either way.
CLONES = {"https://github.com/kubeflow/trainer": "TRAINER_GIT",
          "https://github.com/kubernetes-sigs/jobset": "JOBSET_GIT",
          # the Training Operator's module path; its repository is kubeflow/trainer now (its v1.9.4 tag)
          "https://github.com/kubeflow/training-operator": "TRAINER_GIT",
          "https://github.com/kubernetes-sigs/kueue": "KUEUE_GIT"}
TRAINER_MODULE, JOBSET_MODULE = "github.com/kubeflow/trainer/v2", "sigs.k8s.io/jobset"
# Kueue's controllers, scheduler and webhooks (`ControlPlane(kueue=True)`): kueue/main.go, its own module, as Kueue
# v0.19.2 (the release the docs install) is built against Trainer v2.2.1 and the harness against v2.3.0. Where the
# module proxy refuses github.com/kubernetes-sigs/kueue at v0.19.2 (some serve it only up to v0.17.0) or Trainer at
# v2.2.1, KUEUE_GIT and TRAINER_GIT name local clones. It installs Kueue's CRDs and webhook configurations from the
# release's manifests.yaml, the copy tests/cluster_setup vendors (its README names its source and sha256).
KUEUE = Path(__file__).parent / "kueue"
KUEUE_MODULE = "sigs.k8s.io/kueue"
CLUSTER_SETUP = Path(__file__).parent.parent / "cluster_setup"
FIELD_MANAGER = "control-plane-tests"


def go() -> str:
    return go_modules.go(GO_HINT)


def versions() -> dict[str, str]:
    """The releases harness/go.mod pins (kubernetes, etcd, controller-runtime, trainer, jobset),
    training_operator/go.mod's training-operator and kueue/go.mod's kueue."""

    def pinned(module: str, folder: Path = HARNESS) -> str:
        text = (folder / "go.mod").read_text()
        found = re.search(rf"^(?:require)?\s*{re.escape(module)} (v\S+)", text, re.M)
        if not found:
            raise RuntimeError(f"{folder.name}/go.mod pins no {module}")
        return found.group(1)

    return {"kubernetes": pinned("k8s.io/kubernetes"), "etcd": pinned("go.etcd.io/etcd/server/v3"),
            "controller-runtime": pinned("sigs.k8s.io/controller-runtime"), "trainer": pinned(TRAINER_MODULE),
            "jobset": pinned("sigs.k8s.io/jobset"), "training-operator": pinned(OPERATOR_MODULE, OPERATOR),
            "kueue": pinned(KUEUE_MODULE, KUEUE)}


def cache_dir() -> Path:
    pins = versions()
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
    return cache / "control-plane" / f"k8s-{pins['kubernetes']}-etcd-{pins['etcd']}"


def harness_name() -> str:
    """The harness binary's name in cache_dir(): `control-plane-harness-<hash of its sources and go.mod/go.sum>`,
    so that checkouts of other harness sources sharing the cache do not replace each other's harness mid-run."""
    import hashlib

    digest = hashlib.sha256()
    for path in [*sorted(HARNESS.glob("*.go")), HARNESS / "go.mod", HARNESS / "go.sum"]:
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return f"control-plane-harness-{digest.hexdigest()[:12]}"


def build() -> Path:
    """Builds kube-apiserver, etcd, the harness, kubectl, the Training Operator's harness and Kueue's binary into
    cache_dir() (seconds when nothing changed); the folder."""
    from tests.go_modules import build_env

    out = cache_dir()
    out.mkdir(parents=True, exist_ok=True)
    # Built as a module, kubectl would call itself v0.0.0-master (`kubectl version`); Kubernetes' own build stamps
    # the release the same way (hack/lib/version.sh: -X .../component-base/version.gitVersion).
    stamp = f"-ldflags=-X k8s.io/component-base/version.gitVersion={versions()['kubernetes']}"
    builds = [(name, package, HARNESS) for name, package in BINARIES.items()] + [(OPERATOR_BINARY, ".", OPERATOR),
                                                                                  (kueue_binary(), ".", KUEUE)]
    for name, package, module in builds:
        flags = [stamp] if name == "kubectl" else []
        name = harness_name() if name == "control-plane-harness" else name
        done = subprocess.run([go(), "build", *flags, "-o", str(out / name), package], cwd=module,
                              capture_output=True, text=True, env=build_env(CLONES))
        if done.returncode:
            raise RuntimeError(f"building {name} ({package}) failed:\n{done.stderr[-4000:]}")
    return out


def kueue_binary() -> str:
    """Kueue's binary's name in cache_dir()."""
    return f"control-plane-kueue-{versions()['kueue']}"


def module_dir(module: str, folder: Path = HARNESS) -> str:
    """The folder of `module`, as the Go module at `folder` requires it, in Go's module cache: Kubeflow Trainer's
    (its webhook configuration, the TrainingRuntime CRD and the PodGroup CRDs its runtime plugins watch, which the
    harness installs with its controllers), JobSet's (its webhook configuration) or the Training Operator's."""
    from tests.go_modules import build_env

    done = subprocess.run([go(), "list", "-m", "-f", "{{.Dir}}", module], cwd=folder, capture_output=True,
                          text=True, env=build_env(CLONES))
    if done.returncode or not done.stdout.strip():
        raise RuntimeError(f"locating {module}: {done.stderr.strip()[-2000:]}")
    return done.stdout.strip()


def crd_files() -> list[Path]:
    """The CustomResourceDefinitions installed: every CRD vendored at the top of tests/schemas (its folders hold
    other releases' copies of the same CRDs, not installed)."""
    return sorted(SCHEMAS.glob("*.yaml"))


class ControlPlane:
    """kube-apiserver and etcd under envtest, started on a loopback port; a context manager.

    `kubeconfig` is a file for a system:masters user; `api_client()` is a `kubernetes.client.ApiClient` on it.
    `crds`: the CustomResourceDefinition files installed at start (crd_files() unless given; `[]` is a bare
    cluster, as a new GKE cluster is). With `controllers`, the harness also runs Kubeflow Trainer's controllers and
    webhooks and JobSet's controllers and webhooks in one controller-runtime manager on envtest's rest config, as
    their own integration tests do. With `training_operator`, a second process (training_operator/main.go) runs the
    Training Operator v1's PyTorchJob and TFJob controllers and webhooks against the same API server, as its
    integration tests do. With `kueue` (which implies `controllers`), Kueue's controllers, scheduler and webhooks
    run beside them in a process of their own (kueue/main.go), on the same API server.
    """

    def __init__(self, *, start_seconds: float = 120.0, crds: list[Path] | None = None, controllers: bool = False,
                 training_operator: bool = False, kueue: bool = False):
        self.start_seconds = start_seconds
        self.crds = crd_files() if crds is None else list(crds)
        self.controllers = controllers or kueue
        self.training_operator = training_operator
        self.kueue = kueue
        self.kueue_process: subprocess.Popen | None = None
        self.folder = tempfile.mkdtemp(prefix="control-plane-")
        self.kubeconfig = os.path.join(self.folder, "kubeconfig")
        self.host = ""
        self.process: subprocess.Popen | None = None
        self.operator: subprocess.Popen | None = None
        self._stderr: list[str] = []

    def start(self) -> "ControlPlane":
        binaries = build()
        argv = [str(binaries / harness_name()), "--assets", str(binaries), "--write-kubeconfig", self.kubeconfig,
                "--enable-admission-plugins", ",".join(ADMISSION_PLUGINS)]
        for crd in self.crds:
            argv += ["--crds", str(crd)]
        if self.controllers:
            argv += ["--trainer", module_dir(TRAINER_MODULE), "--jobset", module_dir(JOBSET_MODULE)]
        self.process, ready = self._started(argv, "the control plane")
        self.host = json.loads(ready)["host"]
        if self.training_operator:
            self.operator, _ = self._started([str(binaries / OPERATOR_BINARY), "--kubeconfig", self.kubeconfig,
                                              "--operator", module_dir(OPERATOR_MODULE, OPERATOR)],
                                             "the Training Operator")
        if self.kueue:
            manifests = CLUSTER_SETUP / f"kueue-{versions()['kueue']}-manifests.yaml"
            self.kueue_process, _ = self._started([str(binaries / kueue_binary()), "--kubeconfig", self.kubeconfig,
                                                   "--manifests", str(manifests)], "Kueue")
        return self

    def _started(self, argv: list[str], what: str) -> tuple[subprocess.Popen, str]:
        """The process of `argv` and the ready line it printed on stdout (its stderr is kept in `_stderr`); stops
        everything and raises when no line comes within start_seconds."""
        process = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                   text=True)
        threading.Thread(target=self._drain, args=(process,), daemon=True).start()
        ready: list[str] = []
        reader = threading.Thread(target=lambda: ready.append(process.stdout.readline()), daemon=True)
        reader.start()
        reader.join(self.start_seconds)
        if not ready or not ready[0]:
            self._end(process)
            self.stop()
            raise RuntimeError(f"{what} did not start (waited up to {self.start_seconds:.0f}s):\n"
                               + "".join(self._stderr[-40:]))
        return process, ready[0]

    def _drain(self, process: subprocess.Popen) -> None:
        for line in process.stderr:
            self._stderr = (self._stderr + [line])[-200:]

    @staticmethod
    def _end(process: subprocess.Popen | None) -> None:
        """Closes the process's stdin, which stops it, and waits for it."""
        if process and process.poll() is None:
            process.stdin.close()
            try:
                process.wait(60)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()

    def stop(self) -> None:
        """Stops Kueue's and the Training Operator's processes, then the harness (which stops kube-apiserver and
        etcd), and waits for them."""
        self._end(self.kueue_process)
        self._end(self.operator)
        self._end(self.process)
        shutil.rmtree(self.folder, ignore_errors=True)

    def __enter__(self) -> "ControlPlane":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def api_client(self, *, impersonate: str = ""):
        """A kubernetes ApiClient on the kubeconfig; with `impersonate`, it acts as that user (Impersonate-User)."""
        from kubernetes import client, config

        configuration = client.Configuration()
        config.load_kube_config(config_file=self.kubeconfig, client_configuration=configuration)
        api = client.ApiClient(configuration)
        if impersonate:
            api.set_default_header("Impersonate-User", impersonate)
        return api


@dataclasses.dataclass
class Answer:
    """What the API server answered to one object: the object it stored (or would store), or its error."""
    kind: str
    name: str
    namespace: str
    status: int
    body: dict
    warnings: list[str]

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300

    @property
    def message(self) -> str:
        return self.body.get("message", "") if not self.ok else ""

    @property
    def causes(self) -> list[str]:
        """The fields an Invalid answer names, each with its message (Status.details.causes)."""
        return [f"{c.get('field', '')}: {c.get('message', '')}" for c in
                (self.body.get("details") or {}).get("causes") or []]

    def line(self) -> str:
        where = f"{self.namespace}/" if self.namespace else ""
        head = f"{self.kind} {where}{self.name}: "
        if not self.ok:
            return head + f"{self.status} {self.message}"
        return head + f"{self.status} applied (uid {self.body['metadata'].get('uid', '') or '-, dry run'})"


def apply(api_client, manifest: dict, *, dry_run: bool = False) -> Answer:
    """Server-side apply of one object (kubectl apply --server-side --force-conflicts, with fieldValidation=Strict:
    an unknown or duplicate field is an error naming it); the API server's answer."""
    from kubernetes import dynamic
    from kubernetes.client.rest import ApiException

    metadata = manifest.get("metadata") or {}
    name, namespace = metadata.get("name", ""), metadata.get("namespace", "")
    resources = dynamic.DynamicClient(api_client).resources
    try:
        resource = resources.get(api_version=manifest["apiVersion"], kind=manifest["kind"])
    except (dynamic.exceptions.ResourceNotFoundError, dynamic.exceptions.ResourceNotUniqueError) as e:
        return Answer(manifest["kind"], name, namespace, 404,
                      {"message": f"the API server serves no {manifest['kind']} in {manifest['apiVersion']} ({e}): "
                                  f"its CustomResourceDefinition is not installed"}, [])
    if resource.namespaced and not namespace:
        namespace = "default"
    query = [("fieldManager", FIELD_MANAGER), ("fieldValidation", "Strict"), ("force", "true")]
    if dry_run:
        query.append(("dryRun", "All"))
    try:
        response = api_client.call_api(
            resource.path(name=name, namespace=namespace if resource.namespaced else None), "PATCH",
            query_params=query, body=manifest, auth_settings=["BearerToken"], _preload_content=False,
            header_params={"Content-Type": "application/apply-patch+yaml", "Accept": "application/json"})[0]
        status, body, headers = response.status, json.loads(response.data), response.headers
    except ApiException as e:
        status, headers = e.status, e.headers or {}
        try:
            body = json.loads(e.body)
        except (TypeError, ValueError):
            body = {"message": str(e.body or e.reason)}
    warnings = [w for w in (headers.get("Warning") or "").split(", 299 ") if w]
    return Answer(manifest["kind"], name, namespace if resource.namespaced else "", status, body, warnings)


def apply_all(api_client, manifests: list[dict], *, dry_run: bool = False) -> list[Answer]:
    """apply() of each object, in order; a Namespace an object names and no manifest makes is created first, as
    the cluster it is for has it."""
    from kubernetes import client
    from kubernetes.client.rest import ApiException

    core = client.CoreV1Api(api_client)
    for namespace in {(m.get("metadata") or {}).get("namespace") for m in manifests} - {None, ""}:
        try:
            core.create_namespace({"metadata": {"name": namespace}})
        except ApiException as e:
            if e.status != 409:
                raise
    return [apply(api_client, manifest, dry_run=dry_run) for manifest in manifests]


# The kinds Trainer's and JobSet's controllers create: a TrainJob's JobSet (v2.3.0 pkg/runtime/framework/plugins/
# jobset) and the ConfigMap `{trainjob}-runtime-snapshot` of its runtime (pkg/runtime/core/snapshot.go:34), a
# JobSet's Jobs and headless Service (v0.12.0 pkg/controllers/jobset_controller.go), and the ConfigMaps and Secrets
# of Trainer's MPI plugin.
CONTROLLER_KINDS = (("jobset.x-k8s.io/v1alpha2", "JobSet"), ("batch/v1", "Job"), ("v1", "Service"),
                    ("v1", "ConfigMap"), ("v1", "Secret"))


@dataclasses.dataclass
class Made:
    """An object a controller created: `owner` is the object its controller owner reference names."""
    owner: str
    body: dict

    def line(self) -> str:
        return f"{described(self.body)}: created by {self.owner}"


def described(body: dict) -> str:
    """`Kind namespace/name` (`Kind name` when cluster-scoped)."""
    metadata = body["metadata"]
    return f"{body['kind']} {metadata['namespace'] + '/' if metadata.get('namespace') else ''}{metadata['name']}"


def made_by_controllers(api_client, answers: list[Answer], *, settle_seconds: float = 5.0,
                        timeout_seconds: float = 60.0) -> list[Made]:
    """The objects of CONTROLLER_KINDS whose owner references lead back to an applied object (what the controllers
    made of it, and of what they made), in creation order, as they stand once nothing new has appeared for
    `settle_seconds` (or `timeout_seconds` have passed)."""
    import time

    from kubernetes import dynamic

    resources = dynamic.DynamicClient(api_client).resources
    kinds = [resources.get(api_version=version, kind=kind) for version, kind in CONTROLLER_KINDS]
    roots = {a.body["metadata"]["uid"]: described(a.body) for a in answers if a.ok and a.body["metadata"].get("uid")}

    def survey() -> list[Made]:  # a list's items do not say their kind
        items = [{"apiVersion": kind.group_version, "kind": kind.kind, **item.to_dict()}
                 for kind in kinds for item in kind.get().items]
        owners, found, grew = dict(roots), {}, True
        while grew:  # a JobSet's Jobs are owned by the JobSet, which the TrainJob owns: follow the chain
            grew = False
            for item in items:
                uid = item["metadata"]["uid"]
                owner = next((o for o in item["metadata"].get("ownerReferences") or []
                              if o.get("controller") and o["uid"] in owners), None)
                if owner and uid not in found:
                    found[uid] = Made(owners[owner["uid"]], {**item, "metadata": {
                        k: v for k, v in item["metadata"].items() if k != "managedFields"}})
                    owners[uid] = described(item)
                    grew = True
        return sorted(found.values(), key=lambda m: (m.body["metadata"]["creationTimestamp"],
                                                     m.body["metadata"]["name"]))

    deadline = time.monotonic() + timeout_seconds
    made, since = survey(), time.monotonic()
    while time.monotonic() < deadline and time.monotonic() - since < settle_seconds:
        time.sleep(0.5)
        now = survey()
        if [m.line() for m in now] != [m.line() for m in made]:
            since = time.monotonic()
        made = now
    return made


def load(paths: list[str]) -> list[dict]:
    """The objects of YAML files (multi-document; `-` reads stdin), empty documents left out."""
    import sys

    import yaml

    objects = []
    for path in paths:
        text = sys.stdin.read() if path == "-" else Path(path).read_text()
        objects += [doc for doc in yaml.safe_load_all(text) if doc]
    return objects


def main(argv: list[str] | None = None) -> int:
    import argparse
    import sys
    import time

    parser = argparse.ArgumentParser(prog="python -m tests.control_plane", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("build", help="only build kube-apiserver, etcd, kubectl, the envtest harness and Kueue")
    applying = commands.add_parser("apply", help="start the control plane, apply FILEs server-side, print each "
                                                 "answer, stop")
    applying.add_argument("files", nargs="+", metavar="FILE", help="YAML manifests (- for stdin)")
    applying.add_argument("--dry-run", action="store_true", help="dryRun=All: the API server stores nothing")
    applying.add_argument("--controllers", action="store_true",
                          help="also run Kubeflow Trainer's controllers and webhooks and JobSet's controllers, and "
                               "print what they create of the applied objects")
    args = parser.parse_args(argv)
    if args.command == "apply" and args.controllers and args.dry_run:
        parser.error("--controllers needs objects that are stored: leave out --dry-run")
    try:
        if args.command == "build":
            started = time.monotonic()
            print(f"{', '.join(f'{k} {v}' for k, v in versions().items())}: {build()} "
                  f"({time.monotonic() - started:.1f}s)")
            return 0
        manifests = load(args.files)
        made: list[Made] = []
        with ControlPlane(controllers=args.controllers) as plane:
            api = plane.api_client()
            answers = apply_all(api, manifests, dry_run=args.dry_run)
            if args.controllers:
                made = made_by_controllers(api, answers)
    except GoMissing as e:
        print(e, file=sys.stderr)
        return 2
    for answer in answers:
        print(answer.line())
        for cause in answer.causes:
            print(f"  {cause}")
        for warning in answer.warnings:
            print(f"  warning: {warning}")
        if answer.ok:
            print(_shown(answer.body))
    if args.controllers:
        print(f"The controllers created {len(made)} object{'s' if len(made) != 1 else ''}:")
        for thing in made:
            print(thing.line())
            print(_shown(thing.body))
    return 0 if all(a.ok for a in answers) else 1


def _shown(body: dict) -> str:
    """An object as YAML, indented, without its managedFields."""
    import yaml

    shown = {k: v for k, v in body.items() if k != "metadata"}
    shown["metadata"] = {k: v for k, v in body["metadata"].items() if k != "managedFields"}
    return "  " + yaml.safe_dump(shown, sort_keys=False, width=120).replace("\n", "\n  ").rstrip()
