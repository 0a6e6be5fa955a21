"""The GCS FUSE option (`pipectl compile --gcs-fuse-pvc`): the bucket's claim mounted into the data-heavy steps with
the GCS FUSE annotation, as the KFP backend turns the compiled YAML into pods, valid against the Kubernetes schemas
together with the PersistentVolume and claim of manifests/gcsfuse/; and data passed by reference on a KFP backend."""

import glob
import os
import re

import pytest
import yaml

from pipelines import cli, config, training
from tests.conftest import REPO_ROOT
from tests.standins.validation import resource_problems
from tests.test_images import DOCKERFILE, TARGETS, target  # the Dockerfile parser the image tests use

MANIFEST = os.path.join(REPO_ROOT, "manifests", "gcsfuse", "training-data.yaml")
DATA_STEPS = {"preprocess-op", "augment-op", "train-op", "evaluate-op", "predict-op"}


def compile_yaml(tmp_path, settings: config.PipelineSettings) -> tuple[dict, dict]:
    path = training.compile_pipeline(str(tmp_path / "pipeline.yaml"), settings)
    with open(path) as f:
        spec, *platform = yaml.safe_load_all(f)
    executors = platform[0]["platforms"]["kubernetes"]["deploymentSpec"]["executors"] if platform else {}
    return spec, executors


def cluster_objects() -> dict[str, dict]:
    with open(MANIFEST) as f:
        text = f.read().replace("BUCKET", "acme-training-data").replace("NAMESPACE", "kubeflow")
    return {doc["kind"]: doc for doc in yaml.safe_load_all(text)}


def pod_of(spec: dict, executors: dict, task: str) -> dict:
    """The parts of the pod a KFP 2.17.0 backend makes for `task` that the option sets: the volume and mount per
    PVC mount (backend/src/v2/driver/k8s.go:156-172 and makeVolumeMountPatch, 1111-1170: both named after the
    claim), and the pod annotations (compiler/argocompiler/container.go:744-787 extendPodMetadata, called at
    :590-592: the executor template's metadata)."""
    config_ = executors.get(f"exec-{task}", {})
    mounts = config_.get("pvcMount", [])
    claims = [m["pvcNameParameter"]["runtimeValue"]["constant"] for m in mounts]
    container = spec["deploymentSpec"]["executors"][f"exec-{task}"]["container"]
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": task, "namespace": "kubeflow",
                     "annotations": config_.get("podMetadata", {}).get("annotations", {})},
        "spec": {"serviceAccountName": "pipeline-runner",
                 "containers": [{"name": "main", "image": container["image"],
                                 "volumeMounts": [{"name": claim, "mountPath": m["mountPath"]}
                                                  for claim, m in zip(claims, mounts)]}],
                 "volumes": [{"name": claim, "persistentVolumeClaim": {"claimName": claim}} for claim in claims]},
    }


def test_the_data_heavy_steps_mount_the_bucket_with_the_gcs_fuse_sidecar(tmp_path):
    objects = cluster_objects()
    claim = objects["PersistentVolumeClaim"]["metadata"]["name"]
    spec, executors = compile_yaml(tmp_path, config.PipelineSettings(gcs_fuse_pvc=claim))
    for task in training.task_names().values():
        pod = pod_of(spec, executors, task)
        if task not in DATA_STEPS:
            assert pod["spec"]["volumes"] == [] and pod["metadata"]["annotations"] == {}, task
            continue
        assert pod["metadata"]["annotations"] == {"gke-gcsfuse/volumes": "true"}, task
        assert pod["spec"]["volumes"] == [{"name": claim, "persistentVolumeClaim": {"claimName": claim}}], task
        assert pod["spec"]["containers"][0]["volumeMounts"] == [{"name": claim, "mountPath": "/mnt/gcs"}], task
        assert resource_problems(pod) == [], task
    # The steps write their data under the mount unless the run says otherwise.
    assert spec["root"]["inputDefinitions"]["parameters"]["data_root"]["defaultValue"] == "/mnt/gcs/kfp-data"


def test_the_volume_and_claim_are_valid_and_bound_to_each_other():
    objects = cluster_objects()
    volume, claim = objects["PersistentVolume"], objects["PersistentVolumeClaim"]
    assert resource_problems(volume) == [] and resource_problems(claim) == []
    assert volume["spec"]["csi"] == {"driver": "gcsfuse.csi.storage.gke.io", "volumeHandle": "acme-training-data"}
    assert claim["spec"]["volumeName"] == volume["metadata"]["name"]
    assert volume["spec"]["claimRef"] == {"namespace": claim["metadata"]["namespace"],
                                          "name": claim["metadata"]["name"]}
    # A static binding matches class, access modes and capacity (the driver's docs/usage.md).
    assert volume["spec"]["storageClassName"] == claim["spec"]["storageClassName"]
    assert volume["spec"]["accessModes"] == claim["spec"]["accessModes"] == ["ReadWriteMany"]
    assert volume["spec"]["capacity"]["storage"] == claim["spec"]["resources"]["requests"]["storage"]


def dockerfile_user(path: str, name: str | None = None) -> tuple[int, int]:
    """The uid and gid the image's containers run as: the last USER of the target (default: the final stage) or of
    a stage it is built FROM (root, 0:0, when there is none). Only numeric `uid:gid` is taken: the mount options
    need numbers, runAsNonRoot can only verify a numeric user, and a USER without a group would take it from the
    image's /etc/passwd."""
    users = [args for keyword, args in target(name, path) if keyword == "USER"]
    if not users:
        return 0, 0
    match = re.fullmatch(r"(\d+):(\d+)", users[-1])
    if not match:
        raise ValueError(f"USER {users[-1]} is not a numeric uid:gid")
    return int(match[1]), int(match[2])


def mount_options(volume: dict) -> dict[str, str]:
    """The PersistentVolume's mountOptions as the driver's sidecar reads them: flag=value, or a flag alone, each
    replacing the flag's default (sidecar_mounter_config.go:286-304 and 393 at v1.24.4)."""
    return dict(option.partition("=")[::2] for option in volume["spec"]["mountOptions"])


def test_the_dockerfile_user_is_read_from_the_final_stage(tmp_path):
    def user(text: str) -> tuple[int, int]:
        (tmp_path / "Dockerfile").write_text(text)
        return dockerfile_user(str(tmp_path / "Dockerfile"))

    assert user("FROM a AS build\nUSER 5:5\nFROM b\nRUN useradd \\\n --uid 7 x\n# USER 0:0\nUSER 7:8\n") == (7, 8)
    assert user("FROM a\nUSER 10001:10001\nFROM b\n") == (0, 0)  # the final stage runs as root
    assert user("FROM a AS base\nUSER 10001:10001\nFROM base AS cpu\nRUN true\n") == (10001, 10001)  # inherited
    for name in ("app", "10001", "app:app"):
        with pytest.raises(ValueError, match="not a numeric uid:gid"):
            user(f"FROM b\nUSER {name}\n")


def test_the_volume_is_owned_by_the_user_the_images_run_as():
    """The sidecar mounts the bucket as 0:0 with default_permissions unless uid/gid say otherwise (gcs-fuse-csi-driver
    v1.24.4: pkg/sidecar_mounter/sidecar_mounter_config.go:232-233, pkg/util/util.go:455-462), and KFP gives the
    steps' pods no fsGroup: the owner must be the images' own user, with write permission."""
    users = {f"images/Dockerfile --target {name}": dockerfile_user(DOCKERFILE, name) for name in TARGETS}
    for path in sorted(glob.glob(os.path.join(REPO_ROOT, "images", "*", "Dockerfile"))):  # TensorFlow Serving's copy
        users[os.path.relpath(path, REPO_ROOT)] = dockerfile_user(path)
    assert len(users) == 4
    options = mount_options(cluster_objects()["PersistentVolume"])
    owner = (int(options["uid"]), int(options["gid"]))
    assert owner != (0, 0)
    assert set(users.values()) == {owner}, f"the PV mounts as {owner}; the images run as {users}"
    assert int(options["file-mode"], 8) & 0o600 == 0o600 and int(options["dir-mode"], 8) & 0o700 == 0o700
    assert "implicit-dirs" in options


def test_a_misspelt_field_is_caught_by_the_schema_check():
    volume = cluster_objects()["PersistentVolume"]
    volume["spec"]["csi"] = {"drvier": "gcsfuse.csi.storage.gke.io", "volumeHandle": "b"}
    assert resource_problems(volume)


@pytest.mark.parametrize("settings, problem", [
    (dict(target="vertex"), "only a KFP backend has"),
    (dict(train_launcher="trainjob"), "do not mount it"),
    (dict(gcs_fuse_mount="/gcs"), "must be an absolute path other than"),
    (dict(gcs_fuse_mount="data"), "must be an absolute path other than"),
])
def test_settings_the_mount_cannot_serve_are_refused(settings, problem):
    with pytest.raises(ValueError, match=problem):
        config.PipelineSettings(gcs_fuse_pvc="training-data", **settings)


def test_pipectl_compile_takes_the_option(tmp_path):
    out = tmp_path / "pipeline.yaml"
    assert cli.main(["compile", "--output", str(out), "--gcs-fuse-pvc", "training-data",
                     "--gcs-fuse-mount", "/mnt/bucket"]) == 0
    platform = list(yaml.safe_load_all(out.read_text()))[1]["platforms"]["kubernetes"]["deploymentSpec"]
    assert platform["executors"]["exec-predict-op"]["pvcMount"][0]["mountPath"] == "/mnt/bucket"


def step_inputs(spec: dict, task: str) -> dict:
    return spec["root"]["dag"]["tasks"][task]["inputs"]["parameters"]


@pytest.mark.parametrize("target, by_reference", [("kfp", True), ("vertex", False)])
def test_data_by_reference_on_a_kfp_backend_only(tmp_path, target, by_reference):
    """On a KFP backend the data-heavy steps write beside their artifacts (the launcher would copy them whole);
    Vertex AI mounts the artifacts, so they stay in them there."""
    spec, _ = compile_yaml(tmp_path, config.PipelineSettings(target=target))
    for task in ("preprocess-op", "augment-op", "predict-op"):
        inputs = step_inputs(spec, task)
        assert inputs["by_reference"] == {"runtimeValue": {"constant": by_reference}}, task
        assert inputs["data_root"] == {"componentInputParameter": "data_root"}, task
    assert spec["root"]["inputDefinitions"]["parameters"]["data_root"]["defaultValue"] == ""


def test_the_file_cache_volume_reaches_each_data_heavy_steps_pod(tmp_path):
    """--gcs-fuse-cache: the pod of each data-heavy step, as the driver makes it from emptyDirMounts (k8s.go:589-613
    at 2.17.0, kfp_driver.empty_dir_mounts), has the emptyDir named gke-gcsfuse-cache that the GCS FUSE sidecar
    takes for its file cache instead of its own (gcs-fuse-csi-driver v1.24.4, pkg/webhook/sidecar_spec.go:35,
    mutatingwebhook.go:362-363), with the size given; the pods stay valid against the Kubernetes schema."""
    from pipelines.backend import explain

    out = tmp_path / "pipeline.yaml"
    assert cli.main(["compile", "--output", str(out), "--gcs-fuse-pvc", "training-data",
                     "--gcs-fuse-cache", "50Gi"]) == 0
    steps = {step["task"]: step for step in explain.explain(str(out), {})["steps"]}
    for task in DATA_STEPS:
        volumes = {v["name"]: v for v in steps[task]["volumes"]}
        assert volumes[config.GCS_FUSE_CACHE_VOLUME] == {"name": "gke-gcsfuse-cache", "emptyDir": {"sizeLimit": "50Gi"}}
        assert "training-data" in volumes
        pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": task},
               "spec": {"containers": [{"name": "main", "image": "i", "volumeMounts": steps[task]["volume_mounts"]}],
                        "volumes": steps[task]["volumes"]}}
        assert resource_problems(pod) == []
    assert not any(config.GCS_FUSE_CACHE_VOLUME in {v["name"] for v in step.get("volumes", [])}
                   for task, step in steps.items() if task not in DATA_STEPS)


@pytest.mark.parametrize("settings, problem", [
    (dict(gcs_fuse_cache="50Gi"), "^--gcs-fuse-cache sizes the file cache of the GCS FUSE mount: give --gcs-fuse-pvc"),
    (dict(gcs_fuse_pvc="training-data", gcs_fuse_cache="50GB"), "^--gcs-fuse-cache must be a Kubernetes quantity"),
])
def test_a_file_cache_without_a_mount_or_a_size_is_refused_in_one_line(settings, problem):
    with pytest.raises(ValueError, match=problem) as e:
        config.PipelineSettings(**settings)
    assert "\n" not in str(e.value)
