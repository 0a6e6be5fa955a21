"""The releases the set-up docs install are the ones the code and its tests are built against, and the pairs hold.

- KFP: docs/cluster-setup.md installs the release whose driver and launcher the tests model
  (pipelines/backend/kfp_driver.py PINNED_RELEASE), which is at least every feature's first release.
- Kubeflow Trainer and Kueue: docs/multi-node-training.md installs the Trainer release the launcher and the vendored
  CRDs follow, and Kueue v0.19.2. Kueue v0.19.2 is built and end-to-end tested against Trainer v2.2.1 (its go.mod:14;
  hack/make/deps.mk:38 installs that version for the e2e tests); Trainer v2.3.0 came to Kueue's main branch only
  (commit 22553e5417, kubernetes-sigs/kueue#14504, no change to Kueue's TrainJob controller). Kueue reads and writes
  our TrainJobs through Trainer v2.2.1's Go types, so the TrainJob we create keeps to the fields Trainer v2.2.1's
  TrainJob schema knows (tests/schemas/kueue-v0.19.2/, vendored from v2.2.1): none of ours can be lost in Kueue's
  round trip, and the runtime patch Kueue adds (`spec.runtimePatches`) is the same field in both releases.
"""

from __future__ import annotations

import copy
import os
import re

import jsonschema
import yaml

from components import launch
from components.launch.trainjob import TRAINER_RELEASE
from pipelines.backend.kfp_driver import FEATURES, PINNED_RELEASE, release_tuple
from tests.conftest import REPO_ROOT
from tests.standins.validation import _strict, crd_problems
from tests.test_trainjob import gpu_job

KUEUE_RELEASE = "v0.19.2"
KUEUE_TRAINER = "v2.2.1"  # what Kueue v0.19.2 is built and tested against (go.mod:14)


def doc(name: str) -> str:
    with open(os.path.join(REPO_ROOT, "docs", name)) as f:
        return f.read()


def test_cluster_setup_installs_the_kfp_release_the_pipeline_is_built_for():
    (version,) = re.findall(r"^export PIPELINE_VERSION=(\S+)$", doc("cluster-setup.md"), re.M)
    assert version == PINNED_RELEASE
    assert all(release_tuple(version) >= release_tuple(feature.first_release) for feature in FEATURES.values())
    # 2.5.0 through 2.14.x pull a MinIO image that is gone (kubeflow/community-distribution#3356)
    assert release_tuple(version) >= (2, 15, 0)


def test_multi_node_setup_installs_the_trainer_and_kueue_the_code_follows():
    text = doc("multi-node-training.md")
    assert set(re.findall(r"kubeflow/trainer\.git/manifests/overlays/manager\?ref=(v[\d.]+)", text)) == {TRAINER_RELEASE}
    assert set(re.findall(r"kubernetes-sigs/kueue/releases/download/(v[\d.]+)/", text)) == {KUEUE_RELEASE}
    with open(os.path.join(REPO_ROOT, "tests", "schemas", "README.md")) as f:
        vendored = f.read()
    assert f"`trainer.kubeflow.org_trainjobs.yaml` | github.com/kubeflow/trainer | " \
           f"`manifests/base/crds/trainer.kubeflow.org_trainjobs.yaml` | `{TRAINER_RELEASE}`" in vendored


def kueue_trainjob_problems(trainjob: dict) -> list[str]:
    """Fields of `trainjob` that Trainer v2.2.1's TrainJob schema (Kueue v0.19.2's view of it) does not know."""
    with open(os.path.join(REPO_ROOT, "tests", "schemas", "kueue-v0.19.2", "trainer.kubeflow.org_trainjobs.yaml")) as f:
        crd = yaml.safe_load(f)
    (served,) = [v for v in crd["spec"]["versions"] if v["name"] == trainjob["apiVersion"].split("/")[1]]
    validator = jsonschema.Draft7Validator(_strict(copy.deepcopy(served["schema"]["openAPIV3Schema"])))
    return [f"{'.'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(trainjob)]


def test_our_trainjob_keeps_to_what_kueue_v0_19_2_knows_of_a_trainjob():
    for nodes in (1, 2, 4):
        trainjob = launch.trainjob_manifest(gpu_job(nodes), "ml")
        assert crd_problems(trainjob) == []  # the installed Trainer accepts it
        assert kueue_trainjob_problems(trainjob) == []  # and Kueue's types hold all of it
    # The check can fail: a field Trainer v2.3.0 added to the runtime patches (terminationGracePeriodSeconds of a
    # pod template patch) is one Kueue v0.19.2 does not know.
    newer = launch.trainjob_manifest(gpu_job(2), "ml")
    newer["spec"]["runtimePatches"][0]["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"][0]["template"][
        "spec"]["template"]["spec"]["terminationGracePeriodSeconds"] = 30
    assert crd_problems(newer) == []
    assert any("terminationGracePeriodSeconds" in problem for problem in kueue_trainjob_problems(newer))
