"""What a KFP backend's launcher copies into and out of each step's pod: a model of its artifact rule.

Every step of a pipeline run on a KFP backend runs under the launcher (kubeflow/pipelines
backend/src/v2/component/launcher_v2.go; line numbers below are at tag 2.17.0). Before the step starts,
`downloadArtifacts` (927-1004) copies every input artifact into the pod's local disk, whether or not the step
opens its `.path` ("TODO: Selectively copy artifacts for which .path was actually specified", 977), except:

- an artifact whose metadata flags it as already in the run's workspace, `_kfp_workspace: true` (950-955);
- an artifact whose URI has no local path (`retrieveArtifactPath` fails: `LocalPathForURI`, 1239-1253, knows
  gs://, minio://, s3:// and oci://), skipped with a warning (956-961);
- an `oci://` artifact, mounted from a modelcar instead (963-971).

Copying an artifact is `objectstore.DownloadBlob` (backend/src/v2/objectstore/object_store.go:176-204): every
object listed under the artifact's key whose key is that key or below `key/` (`isBlobKeyUnderPrefix`, 171-174),
i.e. the whole folder. After the step succeeds, `uploadOutputArtifacts` (778-856) uploads every output
artifact's local path whole (`UploadBlob`, object_store.go:111-144, recursive), except `oci://` ones (819);
an output whose local path does not exist uploads nothing (824-833). Where the backend keeps the steps' logs, the
launcher also uploads the step's output log as the `executor-logs` artifact (getLogWriter, 628-653); the model leaves it
out: this project's steps log throttled progress lines, not a line per image.

`pod_transfers` applies that rule to a compiled pipeline: for each task, what its pod would download and upload,
given where each artifact lives and how large it is (a `Store`). Tests use it to show that the data-heavy steps
move manifests, not datasets (components/datadir.py).
"""

from __future__ import annotations

import dataclasses
import os
from typing import Callable, Protocol

WORKSPACE_FLAG = "_kfp_workspace"
LOCAL_SCHEMES = ("gs://", "minio://", "s3://", "oci://")  # LocalPathForURI, launcher_v2.go:1239-1253


class Store(Protocol):
    def bytes_under(self, uri: str) -> int:
        """The bytes of the objects DownloadBlob copies for an artifact at `uri`: the object `uri` and those
        below `uri/`."""


@dataclasses.dataclass
class Listing:
    """An object store as a listing {URI of each object: size}, with the launcher's prefix rule."""

    sizes: dict[str, int]

    def bytes_under(self, uri: str) -> int:
        key = uri.rstrip("/")  # isBlobKeyUnderPrefix, object_store.go:171-174
        return sum(size for name, size in self.sizes.items() if name == key or name.startswith(key + "/"))


@dataclasses.dataclass
class LocalTree:
    """Artifacts kept as local files or folders (a kfp.local run), measured as the launcher would list them; URIs
    under `uri_root` (as if the run's pipeline root were there) are the files under `local_root`."""

    uri_root: str = ""
    local_root: str = ""

    def bytes_under(self, uri: str) -> int:
        path = self.local_root + uri[len(self.uri_root):] if self.uri_root and uri.startswith(self.uri_root) else uri
        if os.path.isfile(path):
            return os.path.getsize(path)
        return sum(os.path.getsize(os.path.join(folder, name))
                   for folder, _, names in os.walk(path) for name in names)


@dataclasses.dataclass(frozen=True)
class RuntimeArtifact:
    """What the launcher sees of one artifact of the executor input."""

    name: str
    uri: str
    metadata: dict = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class Transfer:
    artifact: str
    uri: str
    bytes: int
    note: str  # "copied whole", or why it is not copied


def download(artifact: RuntimeArtifact, store: Store) -> Transfer:
    """What downloadArtifacts does with one input artifact (launcher_v2.go:950-1000)."""
    if artifact.metadata.get(WORKSPACE_FLAG) is True:
        return Transfer(artifact.name, artifact.uri, 0, "in the run's workspace")
    if not artifact.uri.startswith(LOCAL_SCHEMES):
        return Transfer(artifact.name, artifact.uri, 0, "no local path for the URI's scheme")
    if artifact.uri.startswith("oci://"):
        return Transfer(artifact.name, artifact.uri, 0, "mounted from a modelcar")
    return Transfer(artifact.name, artifact.uri, store.bytes_under(artifact.uri), "copied whole")


def upload(artifact: RuntimeArtifact, local_path: str, store: Store) -> Transfer:
    """What uploadOutputArtifacts does with one output artifact of a successful step (launcher_v2.go:811-837):
    `local_path`'s files, measured with `store` (nothing when the step wrote nothing there)."""
    if artifact.uri.startswith("oci://"):
        return Transfer(artifact.name, artifact.uri, 0, "an OCI artifact")
    if not artifact.uri.startswith(LOCAL_SCHEMES):
        return Transfer(artifact.name, artifact.uri, 0, "no local path for the URI's scheme")
    return Transfer(artifact.name, artifact.uri, store.bytes_under(local_path), "copied whole")


@dataclasses.dataclass
class PodTransfers:
    task: str
    downloads: list[Transfer]
    uploads: list[Transfer]

    @property
    def bytes(self) -> int:
        return sum(t.bytes for t in self.downloads + self.uploads)


def task_artifacts(spec: dict) -> dict[str, dict]:
    """Each container task of a compiled pipeline (its IR's pipelineSpec, with sub-DAGs such as dsl.If groups)
    -> {"inputs": {input name: (producer task, output key)}, "outputs": [output artifact names]}."""
    components = spec["components"]

    def walk(dag: dict, outer: dict[str, tuple[str, str]], found: dict) -> None:
        for task_name, task in dag["tasks"].items():
            inputs = {}
            for name, source in task.get("inputs", {}).get("artifacts", {}).items():
                if "taskOutputArtifact" in source:
                    inputs[name] = (source["taskOutputArtifact"]["producerTask"],
                                    source["taskOutputArtifact"]["outputArtifactKey"])
                elif "componentInputArtifact" in source:
                    inputs[name] = outer[source["componentInputArtifact"]]
            component = components[task["componentRef"]["name"]]
            if "dag" in component:
                walk(component["dag"], inputs, found)
            else:
                outputs = list(component.get("outputDefinitions", {}).get("artifacts", {}))
                found[task_name] = {"inputs": inputs, "outputs": outputs}

    found: dict[str, dict] = {}
    walk(spec["root"]["dag"], {}, found)
    return found


def pod_transfers(spec: dict, artifact_uri: Callable[[str, str], str | None],
                  local_path: Callable[[str, str], str | None], store: Store) -> dict[str, PodTransfers]:
    """For each task of `spec` that ran (`artifact_uri(task, output)` is None for one that did not), what its pod
    downloads and uploads. `local_path(task, output)` is where the step wrote the output."""
    result = {}
    for task, artifacts in task_artifacts(spec).items():
        outputs = {name: artifact_uri(task, name) for name in artifacts["outputs"]}
        if any(uri is None for uri in outputs.values()):
            continue
        downloads = [download(RuntimeArtifact(name, uri), store) for name, (producer, key) in
                     artifacts["inputs"].items() if (uri := artifact_uri(producer, key)) is not None]
        uploads = [upload(RuntimeArtifact(name, uri), local_path(task, name), store)
                   for name, uri in outputs.items()]
        result[task] = PodTransfers(task, downloads, uploads)
    return result
