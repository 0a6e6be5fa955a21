"""docs/cluster-setup.sh, the kubectl steps of docs/cluster-setup.md and docs/multi-node-training.md, run end to end
(twice) with kubectl v1.36.3 against a real kube-apiserver and etcd (tests/control_plane), started bare as a new GKE
cluster is, with KFP 2.17.0's, Trainer v2.3.0's (and its JobSet v0.12.0's) and Kueue v0.19.2's own manifests rendered
at those releases (tests/cluster_setup/README.md names each source).

No controller runs there, so no Deployment becomes a pod: the script runs with SKIP_WAIT=1, and the objects whose
server is one of those Deployments are left out, each named and counted (`NOT_SERVED`): admission webhooks (the API
server would call them on every TrainJob, runtime, JobSet and queue and fail: their Service has no endpoints) and
Kueue's aggregated visibility API.
"""

from __future__ import annotations

import collections
import hashlib
import os
import re
import subprocess
from pathlib import Path

import pytest
import yaml

from tests import control_plane
from tests.conftest import started_control_plane

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "docs" / "cluster-setup.sh"
VENDORED = REPO / "tests" / "cluster_setup"
PROJECT = "test-project"
# The rendered manifests the script applies: its variable -> (file, applied with `-k` (a folder) or `-f`).
SOURCES = {"KFP_CLUSTER_SCOPED": ("kfp-2.17.0-cluster-scoped-resources.yaml", True),
           "KFP_PLATFORM_AGNOSTIC": ("kfp-2.17.0-platform-agnostic.yaml", True),
           "TRAINER_MANAGER": ("trainer-v2.3.0-manager.yaml", True),
           "KUEUE_MANIFESTS": ("kueue-v0.19.2-manifests.yaml", False)}
# Kinds whose server is a Deployment of these manifests, which never runs here.
NOT_SERVED = {"MutatingWebhookConfiguration": "its webhook server (a Deployment) does not run: every create it "
                                              "intercepts would fail",
              "ValidatingWebhookConfiguration": "its webhook server (a Deployment) does not run: every create it "
                                                "intercepts would fail",
              "APIService": "its aggregated API server (a Deployment) does not run: discovery would report it "
                            "unavailable"}
APPLIED = re.compile(r"^(\S+/\S+) (created|configured|unchanged|serverside-applied)$", re.M)
OUR_MANIFESTS = ["tensorflow-multiworker.yaml", "torch-multinode.yaml", "jax-multinode.yaml", "launcher-rbac.yaml"]


def documents(text: str) -> list[str]:
    """The YAML documents of a `kubectl kustomize` output, each as its text."""
    return [doc for doc in re.split(r"^---\n", text, flags=re.M) if doc.strip()]


def stage(name: str, kustomize: bool, folder: Path) -> tuple[str, int, list[str]]:
    """The rendered file less NOT_SERVED kinds, where the script takes it (a kustomization folder or the file); the
    count of objects kept and a line for each one left out."""
    kept, skipped = [], []
    for doc in documents((VENDORED / name).read_text()):
        obj = yaml.safe_load(doc)
        if obj["kind"] in NOT_SERVED:
            skipped.append(f"{name}: {obj['kind']} {obj['metadata']['name']} skipped, {NOT_SERVED[obj['kind']]}")
        else:
            kept.append(doc)
    folder.mkdir()
    (folder / name).write_text("---\n".join(kept))
    if not kustomize:
        return str(folder / name), len(kept), skipped
    (folder / "kustomization.yaml").write_text(f"resources:\n- {name}\n")
    return str(folder), len(kept), skipped


@pytest.fixture(scope="module")
def setup_runs(tmp_path_factory):
    """A bare control plane; the script run on it twice. (the plane, the two runs, kept counts, skipped lines)."""
    with started_control_plane(crds=[]) as plane:
        env = dict(os.environ, PATH=f"{control_plane.cache_dir()}{os.pathsep}{os.environ['PATH']}",
                   KUBECONFIG=plane.kubeconfig, PROJECT_ID=PROJECT, SKIP_WAIT="1")
        kept, skipped = {}, []
        root = tmp_path_factory.mktemp("cluster-setup")
        for variable, (name, kustomize) in SOURCES.items():
            env[variable], kept[name], left_out = stage(name, kustomize, root / variable.lower())
            skipped += left_out
        print(f"\ncluster-setup.sh: {len(skipped)} rendered objects left out:\n  " + "\n  ".join(skipped))
        runs = [subprocess.run([str(SCRIPT)], env=env, capture_output=True, text=True, timeout=600) for _ in range(2)]
        yield plane, runs, kept, skipped


def test_the_setup_script_runs_end_to_end_twice(setup_runs):
    _, runs, kept, _ = setup_runs
    for run in runs:
        assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
        assert run.stderr == ""  # no error and no warning from the API server or kubectl
    ours = sum(len(documents((REPO / "manifests" / "trainer" / name).read_text())) for name in OUR_MANIFESTS)
    queues = 3  # the ResourceFlavor, ClusterQueue and LocalQueue of multi-node-training.md
    first, second = (APPLIED.findall(run.stdout) for run in runs)
    assert len(first) == len(second) == sum(kept.values()) + ours + queues
    print(f"\ncluster-setup.sh applied {len(first)} objects ({kept}, manifests/trainer {ours}, queues {queues}); "
          f"second run: {collections.Counter(verb for _, verb in second)}")
    assert [verb for _, verb in second if verb == "created"] == []  # the second run changes, creates nothing
    # SKIP_WAIT=1 skips each wait on Deployments, and says so
    assert [len(re.findall(r"^skipped \(SKIP_WAIT=1\): kubectl -n \S+ wait", run.stdout, re.M)) for run in runs] == [3, 3]


def test_kfp_launcher_gets_the_gs_root_on_the_configmap_kfp_made(setup_runs):
    from kubernetes import client

    plane, runs, _, _ = setup_runs
    core = client.CoreV1Api(plane.api_client())
    launcher = core.read_namespaced_config_map("kfp-launcher", "kubeflow")
    root = f"gs://{PROJECT}-kfp/pipeline-root"
    assert launcher.data["defaultPipelineRoot"] == root
    # KFP's own manifests made it, with an empty root (so `create` would fail with AlreadyExists)
    (rendered,) = [yaml.safe_load(doc) for doc in documents((VENDORED / SOURCES["KFP_PLATFORM_AGNOSTIC"][0]).read_text())
                   if "name: kfp-launcher\n" in doc]
    assert rendered["kind"] == "ConfigMap" and rendered["data"]["defaultPipelineRoot"] == ""
    # The second run's `kubectl apply -k` of KFP's manifests sets the root back to empty (kubectl's three-way merge
    # sends the manifest's value over the live one: the upgrade the doc warns of), then the patch puts it back
    assert "\nconfigmap/kfp-launcher configured\n" in runs[1].stdout
    assert all(f"\n{root}\n" in run.stdout for run in runs)
    runner = core.read_namespaced_service_account("pipeline-runner", "kubeflow")
    assert runner.metadata.annotations["iam.gke.io/gcp-service-account"] == \
        f"kfp-runner@{PROJECT}.iam.gserviceaccount.com"
    ui = core.read_namespaced_service("ml-pipeline-ui", "kubeflow")
    assert ui.spec.type == "LoadBalancer"
    assert ui.metadata.annotations["networking.gke.io/load-balancer-type"] == "Internal"


def test_the_runtimes_rbac_and_queues_are_stored(setup_runs):
    from kubernetes import client

    plane, _, _, _ = setup_runs
    api = plane.api_client()
    custom = client.CustomObjectsApi(api)
    runtimes = {r["metadata"]["name"] for r in custom.list_cluster_custom_object(
        "trainer.kubeflow.org", "v1alpha1", "clustertrainingruntimes")["items"]}
    ours = {yaml.safe_load(doc)["metadata"]["name"] for name in OUR_MANIFESTS[:3]
            for doc in documents((REPO / "manifests" / "trainer" / name).read_text())}
    assert ours <= runtimes
    queue = custom.get_namespaced_custom_object("kueue.x-k8s.io", "v1beta2", "kubeflow", "localqueues", "team-gpu")
    assert queue["spec"]["clusterQueue"] == "gpu"
    roles = client.RbacAuthorizationV1Api(api).list_namespaced_role("kubeflow").items
    rbac = [yaml.safe_load(doc) for doc in documents((REPO / "manifests" / "trainer" / "launcher-rbac.yaml").read_text())]
    assert {r["metadata"]["name"] for r in rbac if r["kind"] == "Role"} <= {r.metadata.name for r in roles}


def test_what_is_left_out_is_only_what_no_controller_serves(setup_runs):
    _, _, _, skipped = setup_runs
    by_kind = collections.Counter(line.split(": ", 1)[1].split(" ", 1)[0] for line in skipped)
    # Trainer v2.3.0 and JobSet v0.12.0: one validating and one mutating configuration each; Kueue v0.19.2: the
    # same, and its visibility API in two versions
    assert by_kind == {"MutatingWebhookConfiguration": 3, "ValidatingWebhookConfiguration": 3, "APIService": 2}


def test_the_vendored_manifests_are_the_ones_the_readme_names():
    readme = (VENDORED / "README.md").read_text()
    for name, _ in SOURCES.values():
        digest = hashlib.sha256((VENDORED / name).read_bytes()).hexdigest()
        assert re.search(rf"^\| `{re.escape(name)}` \|.*\| {digest} \|$", readme, re.M), name


def test_what_the_script_replaced_fails_on_the_set_up_cluster(setup_runs):
    """The step the docs had before (`create` of kfp-launcher) fails once KFP's manifests are applied, as the issue
    found by reading them; and `annotate` without --overwrite refuses a different service account (a changed
    RUNNER), which the script's --overwrite takes."""
    plane, _, _, _ = setup_runs
    env = dict(os.environ, PATH=f"{control_plane.cache_dir()}{os.pathsep}{os.environ['PATH']}",
               KUBECONFIG=plane.kubeconfig)

    def kubectl(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(["kubectl", "-n", "kubeflow", *args], env=env, capture_output=True, text=True)

    created = kubectl("create", "configmap", "kfp-launcher",
                      f"--from-literal=defaultPipelineRoot=gs://{PROJECT}-kfp/pipeline-root")
    assert created.returncode == 1
    assert 'configmaps "kfp-launcher" already exists' in created.stderr
    changed = kubectl("annotate", "serviceaccount", "pipeline-runner", "iam.gke.io/gcp-service-account=other@x")
    assert changed.returncode == 1 and "--overwrite is false" in changed.stderr
