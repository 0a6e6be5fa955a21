"""A real Kubernetes control plane for the tests: `kube-apiserver` and `etcd` built from their own Go modules
(k8s.io/kubernetes and go.etcd.io/etcd at the versions harness/go.mod pins), run by controller-runtime's envtest the
way Kubeflow Trainer's, JobSet's and Kueue's integration tests run them, with the CRDs vendored in tests/schemas
installed, the RBAC authorizer on and the admission plugins GKE adds; with Trainer's and JobSet's controllers
(`controllers=True`), and Kueue's beside them (`kueue=True`, kueue/main.go, a module of its own).

`build()` builds the two binaries and the harness into ~/.cache/control-plane/<versions>/, `build_kueue()` the Kueue
binary beside them (Go's module and build caches make a rebuild take seconds). `ControlPlane()` starts it on a loopback port and hands out a kubeconfig; the
real `kubernetes` client talks to it as it talks to a cluster. `apply()` applies objects server-side and returns
what the API server answers.

`python -m tests.control_plane apply FILE...` starts it, applies the files and prints each answer
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
          "https://github.com/kubernetes-sigs/kueue": "KUEUE_GIT"}
TRAINER_MODULE = "github.com/kubeflow/trainer/v2"
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
    """The releases harness/go.mod pins: kubernetes, etcd, controller-runtime."""
    text = (HARNESS / "go.mod").read_text()

    def pinned(module: str) -> str:
        found = re.search(rf"^(?:require)?\s*{re.escape(module)} (v\S+)", text, re.M)
        if not found:
            raise RuntimeError(f"harness/go.mod pins no {module}")
        return found.group(1)

    return {"kubernetes": pinned("k8s.io/kubernetes"), "etcd": pinned("go.etcd.io/etcd/server/v3"),
            "controller-runtime": pinned("sigs.k8s.io/controller-runtime"), "trainer": pinned(TRAINER_MODULE),
            "jobset": pinned("sigs.k8s.io/jobset")}


def cache_dir() -> Path:
    pins = versions()
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
    return cache / "control-plane" / f"k8s-{pins['kubernetes']}-etcd-{pins['etcd']}"


def build() -> Path:
    """Builds kube-apiserver, etcd, the harness and kubectl into cache_dir() (seconds when nothing changed); the
    folder."""
    from tests.go_modules import build_env

    out = cache_dir()
    out.mkdir(parents=True, exist_ok=True)
    # Built as a module, kubectl would call itself v0.0.0-master (`kubectl version`); Kubernetes' own build stamps
    # the release the same way (hack/lib/version.sh: -X .../component-base/version.gitVersion).
    stamp = f"-ldflags=-X k8s.io/component-base/version.gitVersion={versions()['kubernetes']}"
    for name, package in BINARIES.items():
        flags = [stamp] if name == "kubectl" else []
        done = subprocess.run([go(), "build", *flags, "-o", str(out / name), package], cwd=HARNESS,
                              capture_output=True, text=True, env=build_env(CLONES))
        if done.returncode:
            raise RuntimeError(f"building {name} ({package}) failed:\n{done.stderr[-4000:]}")
    return out


def kueue_version() -> str:
    """The Kueue release kueue/go.mod pins."""
    found = re.search(rf"^\s*{re.escape(KUEUE_MODULE)} (v\S+)$", (KUEUE / "go.mod").read_text(), re.M)
    if not found:
        raise RuntimeError(f"kueue/go.mod pins no {KUEUE_MODULE}")
    return found.group(1)


def build_kueue() -> Path:
    """Builds the Kueue binary (kueue/main.go) into cache_dir() (seconds when nothing changed); its path."""
    from tests.go_modules import build_env

    out = cache_dir() / f"control-plane-kueue-{kueue_version()}"
    out.parent.mkdir(parents=True, exist_ok=True)
    done = subprocess.run([go(), "build", "-o", str(out), "."], cwd=KUEUE, capture_output=True, text=True,
                          env=build_env(CLONES))
    if done.returncode:
        raise RuntimeError(f"building Kueue ({KUEUE}) failed:\n{done.stderr[-4000:]}")
    return out


def trainer_dir() -> str:
    """Kubeflow Trainer's module folder in Go's module cache (its webhook configuration and the PodGroup CRDs its
    runtime plugins watch, which the harness installs with its controllers)."""
    from tests.go_modules import build_env

    done = subprocess.run([go(), "list", "-m", "-f", "{{.Dir}}", TRAINER_MODULE], cwd=HARNESS, capture_output=True,
                          text=True, env=build_env(CLONES))
    if done.returncode or not done.stdout.strip():
        raise RuntimeError(f"locating {TRAINER_MODULE}: {done.stderr.strip()[-2000:]}")
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
    webhooks and JobSet's controllers in one controller-runtime manager on envtest's rest config, as their own
    integration tests do. With `kueue` (which implies `controllers`), Kueue's controllers, scheduler and webhooks
    run beside them in a process of their own (kueue/main.go), on the same API server.
    """

    def __init__(self, *, start_seconds: float = 120.0, crds: list[Path] | None = None, controllers: bool = False,
                 kueue: bool = False):
        self.start_seconds = start_seconds
        self.crds = crd_files() if crds is None else list(crds)
        self.controllers = controllers or kueue
        self.kueue = kueue
        self.kueue_process: subprocess.Popen | None = None
        self.folder = tempfile.mkdtemp(prefix="control-plane-")
        self.kubeconfig = os.path.join(self.folder, "kubeconfig")
        self.host = ""
        self.process: subprocess.Popen | None = None
        self._stderr: list[str] = []

    def start(self) -> "ControlPlane":
        binaries = build()
        kueue = build_kueue() if self.kueue else None
        argv = [str(binaries / "control-plane-harness"), "--assets", str(binaries), "--write-kubeconfig", self.kubeconfig,
                "--enable-admission-plugins", ",".join(ADMISSION_PLUGINS)]
        for crd in self.crds:
            argv += ["--crds", str(crd)]
        if self.controllers:
            argv += ["--trainer", trainer_dir()]
        self.process, ready = self._started(argv, "the control plane")
        self.host = json.loads(ready)["host"]
        if kueue:
            manifests = CLUSTER_SETUP / f"kueue-{kueue_version()}-manifests.yaml"
            self.kueue_process, _ = self._started([str(kueue), "--kubeconfig", self.kubeconfig,
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
            self._stop(process)
            self.stop()
            raise RuntimeError(f"{what} did not start (waited up to {self.start_seconds:.0f}s):\n"
                               + "".join(self._stderr[-40:]))
        return process, ready[0]

    def _drain(self, process: subprocess.Popen) -> None:
        for line in process.stderr:
            self._stderr = (self._stderr + [line])[-200:]

    @staticmethod
    def _stop(process: subprocess.Popen | None) -> None:
        if process and process.poll() is None:
            process.stdin.close()
            try:
                process.wait(60)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()

    def stop(self) -> None:
        """Closes Kueue's stdin, then the harness's, which stops kube-apiserver and etcd, and waits for them."""
        self._stop(self.kueue_process)
        self._stop(self.process)
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
    args = parser.parse_args(argv)
    try:
        if args.command == "build":
            started = time.monotonic()
            print(f"{', '.join(f'{k} {v}' for k, v in versions().items())}: {build()} "
                  f"({time.monotonic() - started:.1f}s)")
            started = time.monotonic()
            print(f"kueue {kueue_version()}: {build_kueue()} ({time.monotonic() - started:.1f}s)")
            return 0
        manifests = load(args.files)
        with ControlPlane() as plane:
            answers = apply_all(plane.api_client(), manifests, dry_run=args.dry_run)
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
            import yaml

            shown = {k: v for k, v in answer.body.items() if k != "metadata"}
            shown["metadata"] = {k: v for k, v in answer.body["metadata"].items() if k != "managedFields"}
            print("  " + yaml.safe_dump(shown, sort_keys=False, width=120).replace("\n", "\n  ").rstrip())
    return 0 if all(a.ok for a in answers) else 1
