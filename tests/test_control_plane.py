"""What we ship and what the launchers make, against a real kube-apiserver and etcd (tests/control_plane: built
from k8s.io/kubernetes and go.etcd.io/etcd, run by controller-runtime's envtest with the CRDs of tests/schemas, the
RBAC authorizer and GKE's ExtendedResourceToleration admission plugin).

- Every manifest we ship (manifests/), every object the docs create, and what `python -m components.launch
  --dry-run` prints for each launcher and framework is applied server-side, dry run and for real, with
  fieldValidation=Strict. A schema error, a CEL rule, an unknown field, or a default or admission plugin that changes
  a value we set fails the test naming the field.
- RBAC: every Kubernetes API call of components/launch, found by walking its code (the `kubernetes` client methods it
  calls, with the group and resource each is called on), is checked with a SubjectAccessReview as KFP's
  `pipeline-runner` service account once manifests/trainer/launcher-rbac.yaml is applied.
"""

from __future__ import annotations

import ast
import contextlib
import importlib
import inspect
import io
import json
import os
import re
from pathlib import Path

import pytest
import yaml

from tests import control_plane

REPO = Path(__file__).resolve().parent.parent
LAUNCH = REPO / "components" / "launch"
RUNNER = "system:serviceaccount:kubeflow:pipeline-runner"
KUBEFLOW = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "kubeflow"}}


@pytest.fixture(scope="module")
def control_plane_api(real_api_server):
    return real_api_server.api_client()


# ---- what we ship and make ------------------------------------------------------------------------------------

def shipped_files() -> list[Path]:
    return sorted((REPO / "manifests").rglob("*.yaml"))


def shipped(path: Path) -> list[dict]:
    """A shipped file's objects, its placeholders filled as its header says (gcsfuse: BUCKET, NAMESPACE)."""
    text = path.read_text().replace("NAMESPACE", "kubeflow").replace("BUCKET", "training-data-bucket")
    return [doc for doc in yaml.safe_load_all(text) if doc]


def doc_objects() -> list[tuple[str, dict]]:
    """Every object the docs create: the YAML of their ```yaml blocks and `kubectl apply -f - <<'YAML'` inputs."""
    found = []
    for path in sorted((REPO / "docs").glob("*.md")):
        text = path.read_text()
        for block in re.findall(r"```ya?ml\n(.*?)```", text, re.S) + re.findall(r"<<'?YAML'?\n(.*?)\nYAML", text, re.S):
            found += [(path.name, doc) for doc in yaml.safe_load_all(block)
                      if isinstance(doc, dict) and "apiVersion" in doc and "kind" in doc]
    return found


def dry_run_cases() -> list[tuple[str, list[str]]]:
    """(id, argv) of `python -m components.launch --dry-run`: each launcher with each framework it runs, and the
    options that change the manifests most (GPUDirect networks, Kueue and Spot, MIG, GPU sharing, CPU only)."""
    from components.launch.frameworks import FRAMEWORKS
    from components.launch.training import KUBERNETES_LAUNCHERS, LAUNCHER_FRAMEWORKS

    def base(name: str) -> list[str]:  # a name each: a TrainJob's spec is immutable (its CRD's CEL rules)
        return ["--dry-run", "--name", name, "--image", "europe-docker.pkg.dev/p/ml/train:1"]

    command = ["--", "python", "-m", "components.train", "--epochs", "1"]
    cases = [(f"{launcher}-{framework}", [*base(f"{launcher}-{framework}"), "--launcher", launcher, "--framework",
                                          framework, "--workers", "1", "--gpus", "1", *command])
             for launcher in KUBERNETES_LAUNCHERS for framework in LAUNCHER_FRAMEWORKS.get(launcher, FRAMEWORKS)]
    variants = {
        "trainjob-rdma": ["--launcher", "trainjob", "--network", "rdma", "--accelerator", "nvidia-h200-141gb",
                          "--gpus", "8"],
        "trainjob-tcpxo": ["--launcher", "trainjob", "--network", "tcpxo", "--accelerator", "nvidia-h100-mega-80gb",
                           "--gpus", "8"],
        "jobset-tcpxo": ["--launcher", "jobset", "--network", "tcpxo", "--accelerator", "nvidia-h100-mega-80gb",
                         "--gpus", "8"],
        "trainjob-kueue-spot": ["--launcher", "trainjob", "--kueue-queue", "team-gpu", "--spot", "--gpus", "2"],
        "jobset-kueue-torch": ["--launcher", "jobset", "--framework", "torch", "--kueue-queue", "team-gpu"],
        "trainjob-mig": ["--launcher", "trainjob", "--workers", "0", "--gpus", "1", "--gpu-partition", "1g.10gb",
                         "--accelerator", "nvidia-a100-80gb"],
        "jobset-mps": ["--launcher", "jobset", "--workers", "0", "--gpus", "1", "--gpu-sharing", "mps",
                       "--max-shared-clients", "4"],
        "tfjob-cpu": ["--launcher", "tfjob", "--workers", "2", "--gpus", "0"],
    }
    return cases + [(name, [*base(name), *options, *command]) for name, options in variants.items()]


def dry_run(argv: list[str]) -> list[dict]:
    """What `python -m components.launch ARGV` prints, as objects."""
    from components.launch import cli

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert cli.main(argv) == 0, argv
    return [doc for doc in yaml.safe_load_all(out.getvalue()) if doc]


# ---- applying ---------------------------------------------------------------------------------------------------

def changed(sent, stored, path: str = "") -> list[str]:
    """The fields we sent that the API server stored otherwise (pruned, or changed by a default or an admission
    plugin), as `path: sent -> stored`; fields it added are not changes."""
    if isinstance(sent, dict):
        if not isinstance(stored, dict):
            return [f"{path or '.'}: {sent!r} -> {stored!r}"]
        return [line for key, value in sent.items()
                for line in (changed(value, stored[key], f"{path}.{key}") if key in stored
                             else [f"{path}.{key}: dropped"])]
    if isinstance(sent, list):
        if not isinstance(stored, list) or len(sent) != len(stored):
            return [f"{path}: {sent!r} -> {stored!r}"]
        return [line for i, (a, b) in enumerate(zip(sent, stored)) for line in changed(a, b, f"{path}[{i}]")]
    return [] if sent == stored else [f"{path}: {sent!r} -> {stored!r}"]


def applied(api, manifests: list[dict]) -> list[control_plane.Answer]:
    """Each object applied dry run, then for real; fails naming the object and field the API server refused or
    changed."""
    problems = []
    answers = []
    for dry in (True, False):
        for manifest, answer in zip(manifests, control_plane.apply_all(api, manifests, dry_run=dry)):
            what = f"{'dry run' if dry else 'apply'} {answer.kind} {answer.name}"
            if not answer.ok:
                problems.append(f"{what}: {answer.status} {answer.message} {answer.causes}")
                continue
            problems += [f"{what}: {change}" for change in changed(manifest, answer.body)]
            problems += [f"{what}: warning {warning}" for warning in answer.warnings]
            if not dry:
                answers.append(answer)
    assert problems == []
    return answers


@pytest.mark.parametrize("path", shipped_files(), ids=lambda p: str(p.relative_to(REPO / "manifests")))
def test_every_shipped_manifest_applies_server_side(control_plane_api, path):
    answers = applied(control_plane_api, shipped(path))
    assert answers and all(a.body["metadata"]["uid"] for a in answers)


def test_every_object_the_docs_create_applies_server_side(control_plane_api):
    objects = doc_objects()
    assert {obj["kind"] for _, obj in objects} >= {"ResourceFlavor", "ClusterQueue", "LocalQueue"}
    applied(control_plane_api, [obj for _, obj in objects])


@pytest.mark.parametrize("case", dry_run_cases(), ids=lambda case: case[0])
def test_what_the_launcher_dry_run_prints_applies_server_side(control_plane_api, case):
    _, argv = case
    manifests = dry_run(argv)
    answers = applied(control_plane_api, manifests)
    assert [a.kind for a in answers] == [m["kind"] for m in manifests]


def test_a_field_the_schema_does_not_know_fails_naming_it(control_plane_api):
    """The check above can fail: an unknown field of a TrainJob is refused by name, and so is a value its CRD's CEL
    rule refuses."""
    _, argv = dry_run_cases()[0]
    trainjob = dry_run(argv)[-1]
    trainjob["spec"]["trainer"]["numNodez"] = 2
    answer = control_plane.apply(control_plane_api, trainjob, dry_run=True)
    # kube-apiserver v1.36.3 answers an apply patch with a field a CRD's schema lacks with 500, naming the field
    assert not answer.ok and ".spec.trainer.numNodez: field not declared in schema" in answer.message, answer.body
    del trainjob["spec"]["trainer"]["numNodez"]
    trainjob["metadata"]["name"] = "train.1"  # a DNS subdomain, which the TrainJob CRD's CEL rule narrows
    answer = control_plane.apply(control_plane_api, trainjob, dry_run=True)
    assert answer.status == 422 and "metadata.name must match RFC 1035 DNS label format" in answer.message, answer.body


# ---- RBAC ----------------------------------------------------------------------------------------------------------

def _client_methods() -> dict[str, type]:
    """Every API method of the `kubernetes` client -> its API class."""
    from kubernetes import client

    methods = {}
    for name, api in vars(client).items():
        if name.endswith("Api") and inspect.isclass(api) and name != "ApiClient":
            for method in vars(api):
                if not method.startswith("_") and not method.endswith("_with_http_info"):
                    methods.setdefault(method, api)
    return methods


def _request(api: type, method: str) -> tuple[str, str]:
    """The path template and HTTP method the client method calls (its generated *_with_http_info body)."""
    source = inspect.getsource(getattr(api, f"{method}_with_http_info"))
    ((path, http),) = set(re.findall(r"call_api\(\s*'([^']+)', '(\w+)'", source))
    return path, http


def _dispatchers(tree: ast.Module) -> dict[str, tuple[str, ast.Call]]:
    """Functions that call a client method named by their first argument (`getattr(api, f"{verb}_suffix")`) ->
    (the suffix, the call they make with it)."""
    found = {}
    for func in (n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)):
        params = [a.arg for a in func.args.args if a.arg != "self"]
        for node in ast.walk(func):
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call) \
                    and getattr(node.value.func, "id", "") == "getattr" and len(node.value.args) == 2 \
                    and isinstance(node.value.args[1], ast.JoinedStr):
                parts = node.value.args[1].values
                if isinstance(parts[0], ast.FormattedValue) and getattr(parts[0].value, "id", "") == params[0]:
                    suffix = "".join(p.value for p in parts[1:] if isinstance(p, ast.Constant))
                    variable = node.targets[0].id
                    call = next(c for c in ast.walk(func) if isinstance(c, ast.Call)
                                and getattr(c.func, "id", "") == variable)
                    found[func.name] = (suffix, call)
    return found


def launcher_api_calls() -> list[dict]:
    """Every Kubernetes API request components/launch makes, from its code: each call of a `kubernetes` client
    method (directly, or through a function that names the method by a verb, CustomResourceLauncher._api), with
    its group, resource and subresource from the client method's own request path, and the values of its group and
    plural arguments: constants, module names, or `self.X` of each launcher class the call can run in."""
    from components.launch.training import KUBERNETES_LAUNCHERS

    methods = _client_methods()
    calls = []
    sources = sorted(p for p in LAUNCH.glob("*.py") if p.name != "__main__.py")  # __main__ runs the CLI
    dispatchers = {}
    for source in sources:
        dispatchers |= _dispatchers(ast.parse(source.read_text()))
    for source in sources:
        module = importlib.import_module("components.launch" + ("" if source.stem == "__init__" else f".{source.stem}"))
        tree = ast.parse(source.read_text())
        for cls_node in [tree, *(n for n in tree.body if isinstance(n, ast.ClassDef))]:
            owner = getattr(module, cls_node.name) if isinstance(cls_node, ast.ClassDef) else None
            body = cls_node.body
            nodes = [c for stmt in body if not isinstance(stmt, ast.ClassDef) for c in ast.walk(stmt)
                     if isinstance(c, ast.Call) and isinstance(c.func, ast.Attribute)]
            if owner is None:  # module level: functions only, the classes are walked on their own
                nodes = [c for stmt in body if isinstance(stmt, ast.FunctionDef) for c in ast.walk(stmt)
                         if isinstance(c, ast.Call) and isinstance(c.func, ast.Attribute)]
            for call in nodes:
                name = call.func.attr
                if name in dispatchers and call.args and isinstance(call.args[0], ast.Constant):
                    suffix, inner = dispatchers[name]
                    method, arguments = f"{call.args[0].value}{suffix}", {k.arg: k.value for k in inner.keywords}
                elif name in methods:
                    method = name
                    params = [p for p in inspect.signature(getattr(methods[name], name)).parameters if p != "self"]
                    arguments = dict(zip(params, call.args)) | {k.arg: k.value for k in call.keywords if k.arg}
                else:
                    continue
                path, http = _request(methods[method], method)
                launchers = [c for c in KUBERNETES_LAUNCHERS.values() if owner in c.__mro__] if owner else []
                for launcher in launchers or [None]:
                    values = {key: _value(arguments.get(key), module, launcher) for key in ("group", "plural")}
                    calls.append(_attributes(method, path, http, values, f"{source.name}:{call.lineno}"))
    return list({tuple(sorted(c.items())): c for c in calls}.values())


def _value(node, module, launcher):
    if node is None:
        return None
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Name):
        return getattr(module, node.id)
    if isinstance(node, ast.Attribute) and getattr(node.value, "id", "") == "self" and launcher is not None:
        return getattr(launcher, node.attr)
    raise AssertionError(f"cannot tell the value of {ast.unparse(node)} in {module.__name__}")


def _attributes(method: str, path: str, http: str, values: dict, where: str) -> dict:
    """The SubjectAccessReview resourceAttributes of a request to `path` (a client path template)."""
    path = path.replace("{group}", values["group"] or "{group}").replace("{plural}", values["plural"] or "{plural}")
    assert "{group}" not in path and "{plural}" not in path, (method, where)
    parts = path.strip("/").split("/")
    group = "" if parts[0] == "api" else parts[1]
    rest = parts[2:] if parts[0] == "api" else parts[3:]
    namespaced = rest[:1] == ["namespaces"] and len(rest) > 2
    if namespaced:
        rest = rest[2:]
    resource, named, subresource = rest[0], len(rest) > 1, rest[2] if len(rest) > 2 else ""
    verb = {"GET": "get" if named else "list", "POST": "create", "PUT": "update", "PATCH": "patch",
            "DELETE": "delete"}[http]
    return {"method": method, "where": where, "verb": verb, "group": group, "resource": resource,
            "subresource": subresource, "namespaced": namespaced}


def access_review(api, attributes: dict, namespace: str = "kubeflow") -> dict:
    from kubernetes import client

    resource = {k: attributes[k] for k in ("verb", "group", "resource", "subresource")}
    if attributes["namespaced"]:
        resource["namespace"] = namespace
    review = client.AuthorizationV1Api(api).create_subject_access_review({
        "apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
        "spec": {"user": RUNNER, "groups": ["system:serviceaccounts", "system:serviceaccounts:kubeflow",
                                            "system:authenticated"], "resourceAttributes": resource}})
    return review.status.to_dict()


def test_the_launchers_api_calls_are_found_in_their_code():
    calls = launcher_api_calls()
    seen = {(c["verb"], c["group"], c["resource"], c["subresource"]) for c in calls}
    # the walk finds each kind of request the launchers' docstrings promise (k8s.py, jobset.py, trainjob.py)
    assert ("get", "", "pods", "log") in seen and ("list", "", "pods", "") in seen
    assert ("get", "trainer.kubeflow.org", "clustertrainingruntimes", "") in seen
    for group, plural in (("trainer.kubeflow.org", "trainjobs"), ("jobset.x-k8s.io", "jobsets"),
                          ("kubeflow.org", "tfjobs"), ("kubeflow.org", "pytorchjobs")):
        assert {verb for verb, g, r, _ in seen if (g, r) == (group, plural)} == {"create", "get", "delete"}


def test_launcher_rbac_grants_every_api_call_of_the_launchers(control_plane_api):
    applied(control_plane_api, shipped(REPO / "manifests" / "trainer" / "launcher-rbac.yaml"))
    calls = launcher_api_calls()
    denied = [f"{c['method']} ({c['where']}): {c['verb']} {c['group'] or 'core'}/{c['resource']}"
              f"{'/' + c['subresource'] if c['subresource'] else ''}"
              for c in calls if not access_review(control_plane_api, c)["allowed"]]
    assert denied == []
    # and the review can say no: what the Role does not grant, or grants only in the pipeline's namespace
    assert not access_review(control_plane_api, {"verb": "list", "group": "trainer.kubeflow.org",
                                                 "resource": "trainjobs", "subresource": "", "namespaced": True})["allowed"]
    assert not access_review(control_plane_api, {"verb": "create", "group": "trainer.kubeflow.org",
                                                 "resource": "trainjobs", "subresource": "", "namespaced": True},
                             namespace="default")["allowed"]


@pytest.mark.parametrize("launcher", ["trainjob", "jobset", "tfjob", "pytorchjob"])
def test_each_launcher_creates_follows_and_deletes_its_job_as_pipeline_runner(real_api_server, control_plane_api,
                                                                              launcher, caplog):
    """The launcher's own code, with the `kubernetes` client it uses in a pod, acting as `pipeline-runner` under
    launcher-rbac.yaml: it creates its job, reads it, looks for its pods and their log, and deletes it when its
    time is up (no controller runs here, so the job never starts). A request the Role refuses would be a 403."""
    from components.launch.frameworks import FRAMEWORKS
    from components.launch.job import LaunchError
    from components.launch.training import KUBERNETES_LAUNCHERS, LAUNCHER_FRAMEWORKS

    applied(control_plane_api, shipped(REPO / "manifests" / "trainer" / "launcher-rbac.yaml"))
    framework = LAUNCHER_FRAMEWORKS.get(launcher, FRAMEWORKS)[0]
    manifests = dry_run(["--dry-run", "--launcher", launcher, "--framework", framework, "--name", f"rbac-{launcher}",
                         "--image", "europe-docker.pkg.dev/p/ml/train:1", "--workers", "1", "--gpus", "1",
                         "--", "python", "-m", "components.train"])
    applied(control_plane_api, manifests[:-1])  # the ClusterTrainingRuntime a TrainJob needs, installed by an admin
    runner = real_api_server.api_client(impersonate=RUNNER)
    job = KUBERNETES_LAUNCHERS[launcher](runner, "kubeflow", poll_seconds=0.5, timeout_seconds=4, echo=print)
    with pytest.raises(LaunchError) as stopped:
        job.run(manifests[-1])
    assert "403" not in str(stopped.value) and "forbidden" not in str(stopped.value).lower(), stopped.value
    assert not [r.getMessage() for r in caplog.records if "forbidden" in r.getMessage().lower()]
    # deleted when its time was up: gone, or (Foreground, and no garbage collector runs here) marked for deletion
    left = job.get(manifests[-1]["metadata"]["name"])
    assert left is None or left["metadata"].get("deletionTimestamp"), left


# ---- the stand-in beside the real API server ----------------------------------------------------------------------

def test_a_field_the_crd_lacks_stops_the_launcher_on_the_real_api_server_as_on_the_stand_in(control_plane_api):
    """The Kubernetes stand-in refuses a custom resource with a field its CRD lacks (tests/standins/validation.py).
    The real API server's default (fieldValidation=Warn) stores it without the field and says so only in a Warning
    header, which the `kubernetes` client discards: a field of a newer Trainer than the cluster's would be lost
    without a word. The launcher asks for Strict (components/launch/k8s.py), so both stop it, naming the field."""
    from kubernetes import client

    from components.launch.job import LaunchError
    from components.launch.trainjob import TrainJobLauncher
    from tests.standins.k8s_api import KubernetesStandIn

    runtime, trainjob = dry_run(dry_run_cases()[0][1])
    trainjob["metadata"]["name"] = "unknown-field"
    trainjob["spec"]["trainer"]["numNodez"] = 2
    applied(control_plane_api, [KUBEFLOW, runtime])
    with KubernetesStandIn(run_containers=False) as k8s:
        k8s.add_runtime(runtime)
        configuration = client.Configuration()
        configuration.host = k8s.url
        for api in (control_plane_api, client.ApiClient(configuration)):
            with pytest.raises(LaunchError, match=r'unknown field \\?"spec.trainer.numNodez\\?"'):
                TrainJobLauncher(api, "kubeflow").create(trainjob)
    # what the API server does without Strict: the TrainJob is stored without the field
    stored = client.CustomObjectsApi(control_plane_api).create_namespaced_custom_object(
        "trainer.kubeflow.org", "v1alpha1", "kubeflow", "trainjobs", trainjob)
    assert "numNodez" not in stored["spec"]["trainer"]


def test_the_kubernetes_stand_in_kept_to_run_nodes_and_script_faults_answers_as_the_real_api_server(
        control_plane_api):
    """The Kubernetes stand-in stays because it runs each node as a process (no kubelet runs here) and answers the
    faults a test scripts (`fail_next`: a 5xx, a 429 or a 409 at a chosen call), which a real server cannot be made
    to answer on cue. Each job the launchers make (and a TrainJob with a name its CRD's CEL rule refuses), created through the
    `kubernetes` client on the stand-in and on the real API server: the two answer with the same status."""
    from kubernetes import client
    from kubernetes.client.rest import ApiException

    from tests.standins.k8s_api import KubernetesStandIn

    plurals = {"TrainJob": "trainjobs", "JobSet": "jobsets", "TFJob": "tfjobs", "PyTorchJob": "pytorchjobs"}

    def status(api, job: dict) -> int:
        group, version = job["apiVersion"].split("/")
        try:
            client.CustomObjectsApi(api).create_namespaced_custom_object(group, version, "kubeflow",
                                                                         plurals[job["kind"]], job)
            return 201
        except ApiException as e:
            return e.status

    answers = []
    with KubernetesStandIn(run_containers=False) as k8s:
        configuration = client.Configuration()
        configuration.host = k8s.url
        stand_in = client.ApiClient(configuration)
        for case, argv in dry_run_cases():
            *runtimes, job = dry_run(argv)
            applied(control_plane_api, [KUBEFLOW, *runtimes])
            for runtime in runtimes:
                k8s.runtimes.setdefault(runtime["metadata"]["name"], runtime)
            bad = {**job, "metadata": {**job["metadata"], "name": f"{case}.x"}}
            job = {**job, "metadata": {**job["metadata"], "name": f"{case}-x"}}
            # a JobSet's and the Training Operator's name rules are their webhooks', which do not run here
            bodies = (("as made", job), ("dotted name", bad)) if job["kind"] == "TrainJob" else (("as made", job),)
            answers += [(case, name, status(control_plane_api, body), status(stand_in, body))
                        for name, body in bodies]
    assert [a for a in answers if a[2] != a[3]] == []
    assert {a[2] for a in answers if a[1] == "as made"} == {201}


def test_the_stand_ins_schema_checks_kept_for_what_runs_on_it_refuse_what_the_real_api_server_refuses(
        control_plane_api):
    """tests/standins/validation.py stays because the stand-in, on which the launchers' runs go, must refuse a
    body as the API server does (and the tests without Go check the manifests with it). Each fault below (what
    tests/test_trainjob.py asserted of the checks alone): the real API server refuses it (fieldValidation=Strict,
    dry run; a Job template as a batch/v1 Job, which is where the JobSet controller's Job would be refused), and
    the stand-in's check refuses it too, both naming the field."""
    from kubernetes import client
    from kubernetes.client.rest import ApiException

    from components import launch
    from tests.standins.validation import crd_problems, job_problems
    from tests.test_launch import job as gpu_job

    job = gpu_job()
    applied(control_plane_api, [KUBEFLOW])
    old = launch.trainjob_manifest(job, "kubeflow")  # the TrainJob field Trainer v2.3.0 replaced
    old["spec"]["podSpecOverrides"] = [{"targetJobs": [{"name": "node"}], "nodeSelector": {"a": "b"}}]
    runtime = launch.runtime_manifest()  # a value the enum lacks
    runtime["metadata"]["name"] = "sometimes"
    runtime["spec"]["template"]["spec"]["failurePolicy"]["restartStrategy"] = "Sometimes"
    real = [control_plane.apply(control_plane_api, body, dry_run=True) for body in (old, runtime)]
    assert [(a.ok, "spec.podSpecOverrides" in a.message + " ".join(a.causes)) for a in real[:1]] == [(False, True)]
    assert not real[1].ok and "restartStrategy" in real[1].message, real[1].body
    assert crd_problems(old) == ['unknown field "spec.podSpecOverrides"']
    assert any("restartStrategy" in p for p in crd_problems(runtime))

    def node_job(change) -> dict:
        template = launch.jobset_manifest(job, "kubeflow")["spec"]["replicatedJobs"][0]["template"]
        change(template["spec"])
        return template

    batch = client.BatchV1Api(control_plane_api)
    for name, template, field, stand_in in [
        ("unknown-pod-field", node_job(lambda spec: spec["template"]["spec"]["containers"][0].update(gpus=2)),
         "spec.template.spec.containers[0].gpus", "'gpus' was unexpected"),
        ("exit-code-0", node_job(lambda spec: spec["podFailurePolicy"]["rules"][1]["onExitCodes"]["values"].insert(
            0, 0)), "spec.podFailurePolicy.rules[1].onExitCodes.values[0]", "0 is not allowed"),
    ]:
        with pytest.raises(ApiException) as refused:
            batch.create_namespaced_job("kubeflow", {"apiVersion": "batch/v1", "kind": "Job",
                                                     "metadata": {"name": name}, **template},
                                        dry_run="All", field_validation="Strict")
        assert refused.value.status in (400, 422) and field in refused.value.body, refused.value.body
        assert any(stand_in in p for p in job_problems(template)), name


@pytest.mark.parametrize("case", ["jobset-tensorflow", "jobset-tcpxo", "jobset-mps"])
@pytest.mark.parametrize("tolerations", ["as made", "none"])
def test_the_admission_stand_in_kept_for_the_pods_it_runs_adds_the_tolerations_gke_adds(control_plane_api, case,
                                                                                      tolerations):
    """tests/standins/admission.py stays because the stand-in's JobSet pods, which run as processes, must be
    admitted as GKE admits them (tests/test_trainjob.py test_kueue_flavor_tolerations_and_ours). The pod of a
    JobSet the launcher makes (as made, and with its tolerations dropped, as a Kueue flavor may drop them),
    created (dry run) on the real API server with GKE's ExtendedResourceToleration plugin on: it gets the
    tolerations the stand-in's plugin gives it."""
    from kubernetes import client

    from tests.standins import admission

    (jobset,) = dry_run(dict(dry_run_cases())[case])
    spec = jobset["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    if tolerations == "none":
        spec.pop("tolerations", None)
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": f"{case}-pod", "namespace": "kubeflow"},
           "spec": spec}
    applied(control_plane_api, [KUBEFLOW])
    core = client.CoreV1Api(control_plane_api)
    real = core.api_client.sanitize_for_serialization(core.create_namespaced_pod("kubeflow", pod, dry_run="All"))
    expected = json.loads(json.dumps(spec))
    admission.admit_pod((admission.EXTENDED_RESOURCE_TOLERATION,), expected)
    assert expected.get("tolerations")  # the pods request GPUs: the plugin has a toleration to give
    # the API server's DefaultTolerationSeconds plugin adds its not-ready/unreachable tolerations besides
    ours = [t for t in real["spec"]["tolerations"] if t["key"] not in ("node.kubernetes.io/not-ready",
                                                                       "node.kubernetes.io/unreachable")]
    assert ours == expected["tolerations"]


GPU_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
SPOT_TOLERATION = {"key": "cloud.google.com/gke-spot", "operator": "Equal", "value": "true", "effect": "NoSchedule"}


@pytest.mark.parametrize("pod", [
    # extended resources of containers and init containers (the API server wants an extended resource's request
    # equal to its limit, and makes a limit without a request its request), sorted; an equal toleration is not
    # added twice, one of another effect is kept beside; native resources and hugepages add none
    {"containers": [{"name": "node", "image": "i", "resources": {"limits": {"nvidia.com/gpu": "2", "cpu": "4"}}}],
     "initContainers": [{"name": "init", "image": "i", "resources": {"requests": {"example.com/fpga": "1",
                                                                                 "memory": "1Gi"},
                                                                    "limits": {"example.com/fpga": "1"}}}],
     "tolerations": [GPU_TOLERATION, SPOT_TOLERATION]},
    {"containers": [{"name": "node", "image": "i", "resources": {"requests": {"cpu": "1", "hugepages-2Mi": "1Gi"},
                                                                 "limits": {"hugepages-2Mi": "1Gi"}}}]},
    {"containers": [{"name": "node", "image": "i", "resources": {"limits": {"example.com/fpga": "1",
                                                                            "nvidia.com/gpu": "1"}}}],
     "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoExecute"}]},
], ids=["gpu-and-fpga", "cpu-only", "other-effect"])
def test_the_admission_stand_in_kept_for_the_pods_it_runs_and_the_launchers_forecast_add_what_gke_adds(
        control_plane_api, pod):
    """The same plugin on hand-made pods (what tests/test_trainjob.py asserted of the stand-in alone): the real
    API server's tolerations, the stand-in's, and those the TrainJob launcher forecasts for its node pods
    (components/launch/trainjob.py readded_by_admission, which warns when a Kueue flavor drops a GPU toleration
    that the plugin puts back) agree."""
    from kubernetes import client

    from components.launch.trainjob import readded_by_admission
    from tests.standins.admission import extended_resource_toleration

    applied(control_plane_api, [KUBEFLOW])
    core = client.CoreV1Api(control_plane_api)
    real = core.api_client.sanitize_for_serialization(core.create_namespaced_pod("kubeflow", {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "admitted"}, "spec": pod}, dry_run="All"))
    stand_in = json.loads(json.dumps(pod))
    extended_resource_toleration(stand_in)
    # the API server's DefaultTolerationSeconds plugin adds its not-ready/unreachable tolerations besides
    ours = [t for t in real["spec"].get("tolerations") or [] if t["key"] not in ("node.kubernetes.io/not-ready",
                                                                               "node.kubernetes.io/unreachable")]
    assert ours == stand_in.get("tolerations", [])
    node = pod["containers"][0]["resources"]
    forecast = readded_by_admission({"spec": {"trainer": {"resourcesPerNode": node}}})
    assert [t for t in forecast if t not in ours] == []  # each one forecast is on the pod
    added = [t for t in ours if t not in (pod.get("tolerations") or [])]
    assert [t for t in added if t["key"] in {*node.get("limits", {}), *node.get("requests", {})}
            and t not in forecast] == []  # and each one added for the node container's resources was forecast


# ---- the command ---------------------------------------------------------------------------------------------------

def test_the_apply_command_prints_what_the_api_server_answers(control_plane_api, tmp_path, capsys):
    """`python -m tests.control_plane apply FILE` (docs/multi-node-training.md): its own control plane, each
    object's answer, exit 1 when one is refused."""
    good = REPO / "manifests" / "trainer" / "torch-multinode.yaml"
    bad = tmp_path / "bad.yaml"
    bad.write_text("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: Bad_Name, namespace: kubeflow}\n")
    assert control_plane.main(["apply", str(good), str(bad)]) == 1
    out = capsys.readouterr().out
    assert re.search(r"^ClusterTrainingRuntime torch-multinode: 20[01] applied \(uid [0-9a-f-]{36}\)$", out, re.M)
    assert re.search(r"^ConfigMap kubeflow/Bad_Name: 422 .*metadata.name", out, re.M)
