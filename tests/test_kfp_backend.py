"""The real Kubeflow Pipelines backend (its compiler and driver at a release commit, tests/kfp_backend) against
`pipectl compile --explain` (pipelines/backend/kfp_driver.py's model), field by field, for every pipeline variant we
compile, at every release the harness is built for. A difference fails with both sides shown."""

from __future__ import annotations

import json

import pytest

from pipelines.backend import kfp_driver
from tests import kfp_backend

VARIANTS = kfp_backend.VARIANTS


def compiled(tmp_path_factory, variant: str) -> tuple[str, dict]:
    return kfp_backend.compile_variant(variant, str(tmp_path_factory.mktemp(variant)))


@pytest.mark.parametrize("release", list(kfp_backend.RELEASES))
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_real_driver_makes_the_pods_explain_says(kfp_backend_built, variant, release):
    result = kfp_backend.variant_comparison(variant, release)
    explained, real, diffs = result.explained, result.real, result.differences
    assert real and result.fields > 10 * len(real), "the real driver made no pod, or too little was compared"
    assert not diffs, (f"{variant} at KFP {release}: the real backend and `pipectl compile --explain` differ:\n"
                       + "\n".join(diffs) + "\n--- explain:\n" + json.dumps(explained["steps"], indent=1)
                       + "\n--- real:\n" + json.dumps(real, indent=1))


@pytest.mark.parametrize("release", list(kfp_backend.RELEASES))
def test_a_pvc_sub_path_is_mounted_as_the_model_says(kfp_backend_built, tmp_path, release):
    """A PVC mounted at a sub-path (kfp-kubernetes mount_pvc(sub_path=...); pipectl compiles none, so the GCS FUSE
    variant's mounts get one here): each release's real backend does what the model says. 2.15.0's API server
    refuses the run (its compiler does not know the field); the model once kept the sub-path at every release."""
    import yaml

    path, parameters = kfp_backend.compile_variant("gcs-fuse", str(tmp_path))
    with open(path) as f:
        spec, platform = yaml.safe_load_all(f)
    executors = platform["platforms"]["kubernetes"]["deploymentSpec"]["executors"]
    mounts = [m for config in executors.values() for m in config.get("pvcMount", [])]
    assert mounts
    for mount in mounts:
        mount["subPath"] = "runs"
    with open(path, "w") as f:
        yaml.safe_dump_all([spec, platform], f, sort_keys=False)
    if not kfp_driver.has(release, "pvc_sub_path"):
        from pipelines.backend import explain

        with pytest.raises(RuntimeError, match='unknown field \\"subPath\\"'):
            kfp_backend.run(path, parameters, {}, release)
        steps = explain.explain(path, parameters, release)["steps"]
        assert any('unknown field "subPath"' in step.get("fails", "") for step in steps), steps
        return
    result = kfp_backend.compare(path, parameters, release)
    assert not result.differences, "\n".join(result.differences)
    mounted = [m for pod in result.real for m in pod.get("volume_mounts") or []]
    assert mounted and all(m.get("subPath") == "runs" for m in mounted), mounted


def test_a_broken_model_rule_fails_the_comparison(kfp_backend_built, tmp_path_factory, monkeypatch):
    """The control: with the model's GPU limit rule broken on purpose (the accelerator count read as no GPU, the
    bug an earlier reading of the driver had), the real driver's pods no longer match and the comparison says
    where."""
    path, parameters = compiled(tmp_path_factory, "default")
    real_rule = kfp_driver.container_resources

    def no_gpu_limit(container, inputs, release):
        resources = real_rule(container, inputs, release)
        limits = {k: v for k, v in (resources.get("limits") or {}).items() if "gpu" not in k}
        return {**resources, "limits": limits} if limits else {k: v for k, v in resources.items() if k != "limits"}

    monkeypatch.setattr(kfp_driver, "container_resources", no_gpu_limit)
    diffs = kfp_backend.compare(path, parameters, next(iter(kfp_backend.RELEASES))).differences
    assert any(d.startswith("train-op: resources:") and "nvidia.com/gpu" in d for d in diffs), diffs


def test_comparison_reports_each_field_with_both_sides():
    explained = {"steps": [{"task": "t", "image": "a", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}
    real = [{"task": "t", "image": "b", "resources": {}, "node_selector": {"k": "v"}, "labels": {},
             "volumes": [{"name": "v", "persistentVolumeClaim": {"claimName": "v"}}]}]
    assert kfp_backend.differences(explained, real) == [
        't: image: explain "a" / real "b"',
        't: resources: explain {"limits": {"nvidia.com/gpu": "1"}} / real null',
        't: node_selector: explain null / real {"k": "v"}',
        't: volumes: explain null / real [{"name": "v", "persistentVolumeClaim": {"claimName": "v"}}]']


def test_explain_names_the_releases_it_was_checked_against(tmp_path_factory):
    """explain says which releases' real backend its answer was compared with: those the harness is built for."""
    from pipelines.backend import explain

    assert set(kfp_driver.CHECKED_AGAINST) == set(kfp_backend.RELEASES)
    path, parameters = compiled(tmp_path_factory, "default")
    assert explain.explain(path, parameters, "2.17.0")["checked_against"].startswith(
        "the real KFP 2.17.0 compiler and driver give these pods")
    assert explain.explain(path, parameters, "2.5.0")["checked_against"].startswith("the model only")


@pytest.mark.parametrize("release", list(kfp_backend.RELEASES))
def test_the_metadata_store_answers_as_ml_metadata_does(kfp_backend_built, release):
    """harness/mlmd_test.go: the in-memory store behind each release's real driver's metadata client, in the cases
    upstream's container_test.go feeds the driver (a repeated execution is AlreadyExists, and from 2.16 on is found
    by name: mlmd_by_name_test.go)."""
    done = kfp_backend.go_test(release)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize("release", list(kfp_backend.RELEASES))
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_the_compiled_workflow_validates_against_argos_workflow_crd(kfp_backend_built, variant, release):
    """The Argo Workflow the release's API server makes (argocompiler.Compile) is one Argo's own Workflow CRD, at
    the Argo version that release's go.mod pins, accepts."""
    version, errors, shape = kfp_backend.variant_workflow_errors(variant, release)
    assert shape["kind"] == "Workflow" and shape["templates"], shape
    assert errors == [], f"Argo {version}'s Workflow CRD rejects it:\n" + "\n".join(errors)


def test_the_crd_check_fails_a_workflow_argo_would_reject(kfp_backend_built, tmp_path_factory):
    """The control: a template whose retry limit is a list is refused by the same check."""
    path, parameters = compiled(tmp_path_factory, "default")
    release = next(iter(kfp_backend.RELEASES))
    _, schema = kfp_backend.argo_workflow_schema(release)
    workflow = kfp_backend.workflow(path, parameters, release)
    workflow["spec"]["templates"][0]["retryStrategy"] = {"limit": ["three"]}
    assert any("retryStrategy/limit" in e for e in kfp_backend.workflow_errors(workflow, schema))


@pytest.mark.parametrize("release", list(kfp_backend.RELEASES))
@pytest.mark.parametrize("variant", ["default", "data-root"])
def test_the_real_download_rule_copies_what_the_launcher_model_says(kfp_backend_built, tmp_path_factory, variant,
                                                                     release):
    """objectstore.DownloadBlob of the release, on an in-memory bucket laid out as our steps write a run (each
    artifact at its KFP URI, the bulk data by reference beside it or under data_root), copies for every input
    artifact exactly what pipelines/backend/kfp_launcher.py says. The launcher's private skip rules (workspace, scheme,
    modelcar) stay modelled: they are not reachable from outside its package."""
    from pipelines.backend import explain, kfp_launcher

    path, parameters = compiled(tmp_path_factory, variant)
    spec, _ = kfp_driver.read_package(path)
    objects = explain.run_layout(spec, parameters)
    inputs = {uri for task in explain.pod_downloads(spec, parameters, release).values() for uri in
              (entry["uri"] for entry in task)}
    assert inputs
    for uri in sorted(inputs):
        model = sorted(kfp_launcher.downloaded(uri, kfp_launcher.Listing(objects), release))
        assert kfp_backend.downloaded(list(objects), uri, release) == model, uri


def test_the_download_check_sees_a_sibling_copy(kfp_backend_built):
    """The control: a model that also copies objects whose keys only start with the artifact's (the rule before
    2.17.0) disagrees with 2.17.0's DownloadBlob on a bulk folder beside the artifact."""
    from pipelines.backend import kfp_launcher

    objects = {"gs://b/r/t/u/dataset/dataset.json": 1, "gs://b/r/t/u/dataset.data/train/a.tfrecord": 1}
    older = sorted(kfp_launcher.downloaded("gs://b/r/t/u/dataset", kfp_launcher.Listing(objects), "2.16.1"))
    assert kfp_backend.downloaded(list(objects), "gs://b/r/t/u/dataset", "2.17.0") == [
        "gs://b/r/t/u/dataset/dataset.json"] != older


@pytest.mark.parametrize("release", list(kfp_backend.RELEASES))
def test_the_real_download_rule_on_a_sibling_folder_is_the_models(kfp_backend_built, release):
    """A folder beside an artifact whose name starts with the artifact's key (`dataset.data/` beside `dataset/`):
    each release's own DownloadBlob copies it exactly when pipelines/backend/kfp_launcher.py says that release does (before
    2.17.0 it does), so the rule's release boundary is the real code's, not our reading of it."""
    from pipelines.backend import kfp_launcher

    objects = {"gs://b/r/t/u/dataset/dataset.json": 1, "gs://b/r/t/u/dataset.data/train/a.tfrecord": 1,
               "gs://b/r/t/u/datasets/other.json": 1}
    model = sorted(kfp_launcher.downloaded("gs://b/r/t/u/dataset", kfp_launcher.Listing(objects), release))
    assert kfp_backend.downloaded(list(objects), "gs://b/r/t/u/dataset", release) == model


def test_the_docs_rows_are_what_the_real_backend_gives_now(kfp_backend_built):
    """docs/kfp-compatibility.md's real-backend rows are regenerated by `python -m tests.kfp_backend --write-docs`;
    stale rows fail here. The rows are made of the real runs the tests above already ran in this session
    (kfp_backend.variant_comparison, variant_workflow_errors), so they are checked against the same runs, and run
    here only when this test runs alone."""
    assert kfp_backend.documented_rows() == kfp_backend.doc_rows(), \
        "docs/kfp-compatibility.md is stale: run python -m tests.kfp_backend --write-docs"
