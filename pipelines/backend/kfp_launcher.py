"""What a KFP backend's launcher copies into and out of each step's pod: a model of its artifact rule, by release.

Every step of a pipeline run on a KFP backend runs under the launcher (kubeflow/pipelines
backend/src/v2/component/launcher_v2.go). Line numbers below are at tag 2.17.0, then at 2.16.1 in brackets; the
code is the same at both except where a rule says so. Before the step starts, `downloadArtifacts` (927-1004
[896-973]) copies every input artifact into the pod's local disk, whether or not the step opens its `.path` ("TODO:
Selectively copy artifacts for which .path was actually specified", 977 [946]), except:

- an artifact whose metadata flags it as already in the run's workspace, `_kfp_workspace: true` (950-955
  [919-924]; first in 2.15.0, launcher_v2.go 2.15.0:720);
- an artifact whose URI has no local path (`retrieveArtifactPath` fails: `LocalPathForURI`, 1239-1253
  [1208-1222], knows gs://, minio://, s3:// and oci://), skipped with a warning (956-961 [925-930]);
- an `oci://` artifact, mounted from a modelcar instead (963-971 [932-940]).

Copying an artifact is `objectstore.DownloadBlob(ctx, bucket, localPath, blobKey)` (997 [966]), with the
artifact's key (`KeyFromURI`: the URI without scheme, bucket and bucket prefix). It lists the bucket with
`ListOptions{Prefix: blobKey}`, no trailing slash, and then:

- 2.17.0 (object_store.go:176-204): keeps an object only if its key is the artifact's key or below `key/`
  (`isBlobKeyUnderPrefix`, 171-174, from kubeflow/pipelines #12928; in no 2.x tag before 2.17.0);
- 2.5.0 through 2.16.1 (object_store.go 2.16.1:127-154, 2.5.0:123-150): downloads *every* listed object, so every
  object whose key starts with the artifact's key: `dataset` brings `dataset.data/...` and `dataset_v2` with it.

After the step succeeds, `uploadOutputArtifacts` (778-856 [747-825]) uploads every output artifact's local path
whole (`UploadBlob`, object_store.go:111-144 [92-125], recursive), except `oci://` ones (819 [788]); an output
whose local path does not exist uploads nothing (824-833 [793-802]). Where the backend keeps the steps' logs, the
launcher also uploads the step's output log as the `executor-logs` artifact (getLogWriter, 628-653 [597-622]); the
model leaves it out: this project's steps log throttled progress lines, not a line per image.

`pod_transfers` applies that rule to a compiled pipeline: for each task, what its pod would download and upload,
given where each artifact lives and how large it is (a `Store`), and the backend release. Tests use it to show that
the data-heavy steps move manifests, not datasets, on every release (components/dataio/datadir.py).
"""

from __future__ import annotations

import dataclasses
import os
from typing import Callable, Protocol

from pipelines.backend.kfp_driver import PINNED_RELEASE, release_tuple

WORKSPACE_FLAG = "_kfp_workspace"
LOCAL_SCHEMES = ("gs://", "minio://", "s3://", "oci://")  # LocalPathForURI, launcher_v2.go:1239-1253 [1208-1222]
UNDER_PREFIX_ONLY = "2.17.0"  # isBlobKeyUnderPrefix, object_store.go:171-174 at 2.17.0
WORKSPACE_SKIP = "2.15.0"  # the _kfp_workspace skip, launcher_v2.go 2.15.0:720


def downloads_siblings(release: str) -> bool:
    """Whether `release`'s DownloadBlob also copies the objects whose keys only start with the artifact's."""
    return release_tuple(release) < release_tuple(UNDER_PREFIX_ONLY)


def output_uri(pipeline_root: str, pipeline: str, run_id: str, task: str, salt: str, output: str) -> str:
    """An output artifact's URI on a KFP backend: the run's root `PIPELINE_ROOT/<pipeline>/<run id>`
    (metadata/client.go:420 [379], 2.5.0:316; GenerateOutputURI 391-406), then `<task>/<salt>/<output>`, the salt a
    new uuid per execution (driver.go:775-786 and driver/container.go:116-122 [driver.go:729-740, container.go:119];
    2.5.0: driver.go:2046 and :320). So every output of a task is `TASK_ROOT/<output name>`."""
    return "/".join([pipeline_root.rstrip("/"), pipeline, run_id, task, salt, output])


class Store(Protocol):
    def listing(self, prefix: str) -> dict[str, int]:
        """Every object whose URI starts with `prefix` (what the bucket's List with that Prefix returns), with its
        size in bytes."""


def downloaded(uri: str, store: Store, release: str) -> dict[str, int]:
    """The objects DownloadBlob copies for an artifact at `uri` on `release` (see the module docstring)."""
    listed = store.listing(uri)
    if downloads_siblings(release):
        return listed
    key = uri.rstrip("/")  # isBlobKeyUnderPrefix trims the trailing slash (object_store.go:172)
    return {name: size for name, size in listed.items() if name == key or name.startswith(key + "/")}


@dataclasses.dataclass
class Listing:
    """An object store as a listing {URI of each object: size}."""

    sizes: dict[str, int]

    def listing(self, prefix: str) -> dict[str, int]:
        return {name: size for name, size in self.sizes.items() if name.startswith(prefix)}


@dataclasses.dataclass
class LocalTree:
    """Artifacts kept as local files or folders (a kfp.local run), listed as an object store would list them; URIs
    under `uri_root` (as if the run's pipeline root were there) are the files under `local_root`."""

    uri_root: str = ""
    local_root: str = ""

    def listing(self, prefix: str) -> dict[str, int]:
        mapped = self.uri_root and prefix.startswith(self.uri_root)
        path = self.local_root + prefix[len(self.uri_root):] if mapped else prefix
        folder = path if path.endswith("/") else os.path.dirname(path) or "."
        found = {}
        for parent, _, names in os.walk(folder):
            for name in names:
                file = os.path.join(parent, name)
                if file.startswith(path):
                    found[self.uri_root + file[len(self.local_root):] if mapped else file] = os.path.getsize(file)
        return found


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
    beside: tuple[str, ...] = ()  # objects copied that are not the artifact's: their keys only start with its key

    def beside_folders(self) -> list[str]:
        """The folders (or files) beside the artifact that `beside` comes from: `URI.data/`, `URI_v2`."""
        return sorted({self.uri + name[len(self.uri):].split("/")[0] + ("/" if "/" in name[len(self.uri):] else "")
                       for name in self.beside})


def download(artifact: RuntimeArtifact, store: Store, release: str = PINNED_RELEASE) -> Transfer:
    """What downloadArtifacts does with one input artifact on `release` (launcher_v2.go:950-1000 [919-969])."""
    if artifact.metadata.get(WORKSPACE_FLAG) is True and release_tuple(release) >= release_tuple(WORKSPACE_SKIP):
        return Transfer(artifact.name, artifact.uri, 0, "in the run's workspace")
    if not artifact.uri.startswith(LOCAL_SCHEMES):
        return Transfer(artifact.name, artifact.uri, 0, "no local path for the URI's scheme")
    if artifact.uri.startswith("oci://"):
        return Transfer(artifact.name, artifact.uri, 0, "mounted from a modelcar")
    copied = downloaded(artifact.uri, store, release)
    key = artifact.uri.rstrip("/")
    beside = tuple(sorted(name for name in copied if name != key and not name.startswith(key + "/")))
    return Transfer(artifact.name, artifact.uri, sum(copied.values()), "copied whole", beside)


def upload(artifact: RuntimeArtifact, local_path: str, store: Store) -> Transfer:
    """What uploadOutputArtifacts does with one output artifact of a successful step (launcher_v2.go:811-837
    [780-806], the same on every release the model covers): `local_path`'s files, measured with `store` (nothing
    when the step wrote nothing there)."""
    if artifact.uri.startswith("oci://"):
        return Transfer(artifact.name, artifact.uri, 0, "an OCI artifact")
    if not artifact.uri.startswith(LOCAL_SCHEMES):
        return Transfer(artifact.name, artifact.uri, 0, "no local path for the URI's scheme")
    path = local_path.rstrip("/")
    files = {name: size for name, size in store.listing(path).items() if name == path or name.startswith(path + "/")}
    return Transfer(artifact.name, artifact.uri, sum(files.values()), "copied whole")


@dataclasses.dataclass
class PodTransfers:
    task: str
    downloads: list[Transfer]
    uploads: list[Transfer]

    @property
    def bytes(self) -> int:
        return sum(t.bytes for t in self.downloads + self.uploads)

    @property
    def beside(self) -> list[str]:
        """The objects this pod downloads that belong to no input artifact."""
        return [name for t in self.downloads for name in t.beside]


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
                  local_path: Callable[[str, str], str | None], store: Store,
                  release: str = PINNED_RELEASE) -> dict[str, PodTransfers]:
    """For each task of `spec` that ran (`artifact_uri(task, output)` is None for one that did not), what its pod
    downloads and uploads on `release`. `local_path(task, output)` is where the step wrote the output."""
    result = {}
    for task, artifacts in task_artifacts(spec).items():
        outputs = {name: artifact_uri(task, name) for name in artifacts["outputs"]}
        if any(uri is None for uri in outputs.values()):
            continue
        downloads = [download(RuntimeArtifact(name, uri), store, release) for name, (producer, key) in
                     artifacts["inputs"].items() if (uri := artifact_uri(producer, key)) is not None]
        uploads = [upload(RuntimeArtifact(name, uri), local_path(task, name), store)
                   for name, uri in outputs.items()]
        result[task] = PodTransfers(task, downloads, uploads)
    return result
