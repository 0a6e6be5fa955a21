"""The Vertex AI Model Registry behind the `Registry` interface (components/registry/base.py).

One registered model is one Vertex AI `Model` (looked up by display name); every upload is a new version of
it (`parentModel`), and `champion` is a Vertex version alias moved with `mergeVersionAliases`. The client is
the generated `google.cloud.aiplatform_v1.ModelServiceClient`, built and called through the Google Cloud layer
(components/gcp/: regional endpoint, REST transport, one retry policy and its IAM messages), imported lazily
so importing this module stays cheap.

Where things are kept on Vertex:

- the artifacts: `artifactUri`, a `gs://` directory: by default `MODEL_DIR/serving`, holding the exported
  SavedModel as `1/` (staged by `upload`), served by TensorFlow Serving (`serving_container`); with a Vertex AI
  prebuilt image, the SavedModel directory itself;
- the model digest: label `model_digest` (label values are limited to 63 characters of [a-z0-9_-], so it is
  `sha256-` and the first 56 hex digits), which `find_by_digest` filters versions on; the full digest is also
  kept in the version description;
- the evaluation metrics: the version description (`versionDescription`): the human-readable line the
  register step writes, then one line `kfp-image-classification: {"digest": ..., "metrics": {...}}` (JSON,
  sorted keys) that `champion()` and `find_by_digest()` read back. The description shows in the console;
  labels cannot hold floats (no '.' allowed);
- the origin: the caller's labels (pipeline run id, git commit, data fingerprint, ...), sanitised to Vertex
  label rules (`sanitize_label_key`, `sanitize_label_value`);
- the lineage (the network and the pretrained weights it started from, components/registry/identity.py): in full
  in the description's JSON line (`"lineage": {"name", "pretrained": {"source", "sha256"}, ...}`), which
  `ModelVersion.lineage` reads back, and as labels to filter on in the console or `gcloud ai models list`
  (`lineage_labels`): `network` (e.g. `mobilenet-v3-small`; a `module:function` becomes `module-function`),
  `pretrained` (`none`, `imagenet`, or the sanitised path/URI, hashed when longer than 63 characters) and
  `pretrained_sha256` (`sha256-` and the first 56 hex digits of the weights file's digest, when known), and what
  trained it and how it serves: `framework` (`tensorflow`, `torch`, `jax`) and `serving_format`
  (`keras-saved_model`, i.e. keras+saved_model sanitised, or `torchscript`), from training.json;
- a TorchScript model (a torch.nn.Module trained on PyTorch) is refused before anything is uploaded
  (`ServingFormatUnsupported`): both serving containers here load SavedModels only.

Production: `VertexRegistry(project="my-project", location="us-central1")` uses Application Default
Credentials and `https://us-central1-aiplatform.googleapis.com`. Tests: pass `api_endpoint="http://127.0.0.1:PORT"`
(the generated REST transport keeps an explicit http:// scheme; such an endpoint gets anonymous credentials)
and a fake `sleep`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable

from components import gcp
from components.registry.base import CHAMPION, ChampionChanged, ModelVersion
from components.registry.identity import SAVED_MODEL_PENDING, TORCHSCRIPT, model_lineage

log = logging.getLogger(__name__)

# The serving container: the one place it is chosen (`serving_container`).
#
# The default is TensorFlow Serving of the TensorFlow that trains (pyproject.toml pins tensorflow 2.21; TensorFlow
# Serving's newest release is 2.20.0, tag 2.20.0 of tensorflow/serving, 2026-04-23; a SavedModel of 2.21 loads and
# predicts the same in 2.20 and in 2.15: tests/benchmarks/serving_compat.py). Vertex AI takes serving images only
# from Artifact Registry or Container Registry (ModelContainerSpec.image_uri), so the image is Docker Hub's
# `tensorflow/serving`, copied into the project's repository by Cloud Build (cloudbuild.yaml, step
# build-serving) and named there by digest when the pipeline is compiled. How Vertex AI runs it:
#
# - command and args replace the image's entrypoint (tools/docker/Dockerfile:55-60 at 2.20.0 starts
#   tensorflow_model_server with --model_base_path=/models/model): REST on 8501, the model read straight from the
#   gs:// copy Vertex AI makes of the artifacts (`$(AIP_STORAGE_URI)`, expanded by Vertex AI; the server is built
#   with TensorFlow's GCS file system, model_servers/BUILD:565);
# - predict and health routes: POST /v1/models/NAME:predict takes Vertex AI's {"instances": [...]} and answers
#   {"predictions": [...]} (util/json_tensor.cc:60,74); GET /v1/models/NAME is the model's status
#   (model_servers/http_rest_api_handler.cc:86-104);
# - TensorFlow Serving loads numbered version folders under its base path, skipping anything else
#   (sources/storage_path/file_system_storage_path_source.cc:87-111, 313-317): the artifact is a folder holding
#   the SavedModel as `1/` (`stage_versioned`), staged next to the model by the register step.
TF_SERVING_VERSION = "2.20.0"
TF_SERVING_IMAGE_NAME = "tensorflow-serving"  # its name in the project's Artifact Registry repository
TF_SERVING_MODEL_NAME = "model"
TF_SERVING_PORT = 8501
SERVING_FOLDER = "serving"  # the versioned copy of the SavedModel, beside it: MODEL_DIR/serving/1/

# Vertex AI's prebuilt TensorFlow prediction containers, still selectable by passing their URI as the serving
# image. 2.15 is the newest (google-cloud-aiplatform's aiplatform/constants/prediction.py lists no later one);
# Vertex AI's prebuilt-container page gives it end of support 2026-01-14 and end of availability 2027-01-14.
# Google publishes them under `latest` only. The `us-docker.pkg.dev` host becomes `europe-`/`asia-docker.pkg.dev`
# in those regions. They load the SavedModel straight from the artifact URI.
PREBUILT_TF_IMAGES = {
    "cpu": "us-docker.pkg.dev/vertex-ai/prediction/tf2-cpu.2-15:latest",
    "gpu": "us-docker.pkg.dev/vertex-ai/prediction/tf2-gpu.2-15:latest",
}
PREBUILT_IMAGE_RE = re.compile(r"^[a-z0-9-]+-docker\.pkg\.dev/vertex-ai(-restricted)?/prediction/")


@dataclasses.dataclass(frozen=True)
class ServingContainer:
    """How Vertex AI runs the model's serving container (ModelContainerSpec), and the artifact layout it reads."""

    image_uri: str
    command: tuple[str, ...] = ()
    args: tuple[str, ...] = ()
    port: int | None = None
    predict_route: str = ""
    health_route: str = ""
    versioned_artifact: bool = False  # the SavedModel as ARTIFACT/1/ (TensorFlow Serving), not ARTIFACT itself

    def spec(self) -> dict:
        """The ModelContainerSpec fields (unset ones left out, for Vertex AI's defaults)."""
        spec = {"image_uri": self.image_uri}
        if self.command:
            spec["command"] = list(self.command)
        if self.args:
            spec["args"] = list(self.args)
        if self.port:
            spec["ports"] = [{"container_port": self.port}]
        if self.predict_route:
            spec["predict_route"] = self.predict_route
        if self.health_route:
            spec["health_route"] = self.health_route
        return spec


def tf_serving_container(image_uri: str) -> ServingContainer:
    """TensorFlow Serving (`image_uri`: tensorflow/serving or an image built on it) as Vertex AI runs it."""
    name = TF_SERVING_MODEL_NAME
    return ServingContainer(
        image_uri=image_uri, command=("/usr/bin/tensorflow_model_server",),
        args=("--port=8500", f"--rest_api_port={TF_SERVING_PORT}", f"--model_name={name}",
              "--model_base_path=$(AIP_STORAGE_URI)"),
        port=TF_SERVING_PORT, predict_route=f"/v1/models/{name}:predict", health_route=f"/v1/models/{name}",
        versioned_artifact=True)


def default_serving_image(project: str, location: str, repository: str = "kfp/image-classification") -> str:
    """Where Cloud Build's defaults put the TensorFlow Serving copy (`_IMAGE_REPO` of cloudbuild.yaml), by tag;
    a compiled pipeline names the copy by digest instead (`pipectl compile --serving-image`)."""
    return f"{location}-docker.pkg.dev/{project}/{repository}/{TF_SERVING_IMAGE_NAME}:{TF_SERVING_VERSION}"


def serving_container(image_uri: str) -> ServingContainer:
    """The container spec for a serving image: a Vertex AI prebuilt prediction image (recognised by its
    documented registry path) runs as built, on the SavedModel itself; any other image is run as TensorFlow
    Serving (tensorflow/serving or an image built on it), on the versioned copy."""
    if not image_uri or any(c.isspace() for c in image_uri):
        raise ValueError(f"serving image must be an image URI, got {image_uri!r}")
    if PREBUILT_IMAGE_RE.match(image_uri):
        return ServingContainer(image_uri=image_uri)
    return tf_serving_container(image_uri)


# A model trained where TensorFlow is not installed (the PyTorch GPU image) comes with model.keras and
# SAVED_MODEL_PENDING, not saved_model/. Its SavedModel is made here from model.keras, by the train step's own
# exporter in a process of its own (a process holds Keras on one backend only; the CLI is a contract, not an
# import: the registry imports no step), into a scratch directory, and staged as MODEL_DIR/serving/1/ (the train
# step's output artifact cannot be written by a later step on a cluster; serving/ is already this step's).
EXPORT_MODULE = "components.train.export"
EXPORT_NO_TENSORFLOW = 3  # components/train/export.py's NO_TENSORFLOW


class SavedModelUnavailable(ValueError):
    """No SavedModel to serve, and none could be made from model.keras here: the message says why and what to run."""


class ServingFormatUnsupported(ValueError):
    """The model's serving format (training.json's) is not one the serving container loads: refused before
    anything is uploaded, in one line saying why and what to do."""


DIGEST_LABEL = "model_digest"
NETWORK_LABEL = "network"
PRETRAINED_LABEL = "pretrained"
PRETRAINED_DIGEST_LABEL = "pretrained_sha256"
FRAMEWORK_LABEL = "framework"
SERVING_FORMAT_LABEL = "serving_format"
METADATA_MARKER = "kfp-image-classification:"
ALIAS_RE = re.compile(r"^[a-z][a-zA-Z0-9-]{0,126}[a-z0-9]$")

# The registry's errors are the Google Cloud layer's (one family, one set of exit codes), under the names its
# callers catch.
VertexRegistryError = gcp.RemoteError
VertexPermissionError = gcp.PermissionDenied
VertexQuotaError = gcp.QuotaExhausted
VertexRegionError = gcp.RegionMismatch


def sanitize_label_key(key: str) -> str:
    """A Vertex label key: starts with a lowercase letter, at most 63 of [a-z0-9_-]."""
    text = re.sub(r"[^a-z0-9_-]", "_", str(key).lower())
    if not text or not text[0].isalpha():
        text = "k_" + text
    return _fit(text, str(key))


def sanitize_label_value(value: Any) -> str:
    """A Vertex label value: at most 63 of [a-z0-9_-]; longer values keep a prefix and a hash of the whole.

    A digest (`sha256:HEX`) becomes `sha256-` and a prefix of its hex digits, like `digest_label`."""
    if re.fullmatch(r"[a-z0-9]+:[0-9a-f]+", str(value)):
        return digest_label(str(value))
    text = re.sub(r"[^a-z0-9_-]", "-", str(value).lower())
    return _fit(text, str(value))


def _fit(text: str, original: str) -> str:
    if len(text) <= 63:
        return text
    return text[:54] + "-" + hashlib.sha256(original.encode()).hexdigest()[:8]


def digest_label(digest: str) -> str:
    """The `model_digest` label value of a digest: `sha256-` and the first 56 hex digits (224 bits)."""
    algorithm, _, hexdigits = digest.partition(":")
    if re.fullmatch(r"[a-z0-9]+", algorithm) and re.fullmatch(r"[0-9a-f]+", hexdigits):
        return f"{algorithm}-{hexdigits}"[:63]
    return "sha256-" + hashlib.sha256(digest.encode()).hexdigest()[:56]


def lineage_labels(lineage: dict | None) -> dict:
    """Labels for a version's lineage (see the module docstring); {} when the lineage is unknown."""
    if not lineage or not lineage.get("name"):
        return {}
    pretrained = lineage.get("pretrained") or {}
    labels = {NETWORK_LABEL: sanitize_label_value(lineage["name"]),
              PRETRAINED_LABEL: sanitize_label_value(pretrained.get("source") or "none")}
    weights_digest = str(pretrained.get("sha256") or "")
    if weights_digest:
        labels[PRETRAINED_DIGEST_LABEL] = digest_label(weights_digest if ":" in weights_digest
                                                       else "sha256:" + weights_digest.lower())
    for label, key in ((FRAMEWORK_LABEL, "framework"), (SERVING_FORMAT_LABEL, "serving_format")):
        if lineage.get(key):
            labels[label] = sanitize_label_value(lineage[key])
    return labels


def version_description(description: str, *, digest: str, metrics: dict, lineage: dict | None = None) -> str:
    """The version description: the human-readable text, then the machine-readable line."""
    meta = {"digest": digest, "metrics": metrics, **({"lineage": lineage} if lineage else {})}
    payload = json.dumps(meta, sort_keys=True, separators=(",", ":"))
    return (description.strip() + "\n\n" if description.strip() else "") + f"{METADATA_MARKER} {payload}"


def parse_version_description(text: str) -> dict:
    """The {"digest", "metrics", "lineage"} written by `version_description` ("lineage" only where it was
    known), or {} for a version registered otherwise."""
    for line in reversed((text or "").splitlines()):
        if line.startswith(METADATA_MARKER):
            try:
                payload = json.loads(line[len(METADATA_MARKER):])
            except ValueError:
                return {}
            return payload if isinstance(payload, dict) else {}
    return {}


def prebuilt_image_for(location: str, accelerator: str = "cpu") -> str:
    """Vertex AI's prebuilt TensorFlow 2.15 serving image for a region (from the nearest Artifact Registry host):
    the container this registry used by default before TensorFlow Serving; pass it as `serving_image` to keep it."""
    if accelerator not in PREBUILT_TF_IMAGES:
        raise ValueError(f"accelerator must be one of {sorted(PREBUILT_TF_IMAGES)}, got {accelerator!r}")
    image = PREBUILT_TF_IMAGES[accelerator]
    if location.startswith("europe-"):
        return image.replace("us-docker.pkg.dev", "europe-docker.pkg.dev", 1)
    if location.startswith(("asia-", "australia-")):
        return image.replace("us-docker.pkg.dev", "asia-docker.pkg.dev", 1)
    return image


def stage_versioned(saved_model_dir: str, serving_dir: str) -> None:
    """Copies the SavedModel at local `saved_model_dir` to `serving_dir/1/`, the layout TensorFlow Serving loads.

    A copy already there is kept when its files are the SavedModel's, byte for byte (a retried task), and completed
    when files are missing (an interrupted copy on gs://, where nothing can be renamed into place); one with other
    files or other bytes is refused, never overwritten. `serving_dir` is a local path (e.g. under the /gcs mount) or
    a gs:// URI (written with tf.io.gfile)."""
    if "://" in serving_dir:
        from components.dataio.storage import gfile

        fs = gfile()
        exists, listing, read = fs.exists, fs.walk, lambda path: fs.GFile(path, "rb").read()
    else:
        fs, exists, listing, read = None, os.path.exists, os.walk, _read
    source_files = _relative_files(saved_model_dir, os.walk)
    target = serving_dir.rstrip("/") + "/1"
    missing = source_files
    if exists(target):
        there = _relative_files(target, listing)
        differs = sorted(set(there) - set(source_files)) or [
            rel for rel in there if _read(os.path.join(saved_model_dir, rel)) != read(f"{target}/{rel}")]
        if differs:
            raise VertexRegistryError(
                f"{target} already holds another model ({differs[0]} is not {saved_model_dir}'s); TensorFlow "
                f"Serving would serve that one. Remove {target}, or register a fresh export.")
        missing = [rel for rel in source_files if rel not in there]
        if not missing:
            return
    # saved_model.pb last: a folder without it is no SavedModel yet, whoever looks at it midway.
    missing = sorted(missing, key=lambda rel: rel == "saved_model.pb")
    if fs is not None or exists(target):
        for rel in missing:
            if fs is not None:
                fs.makedirs(f"{target}/{os.path.dirname(rel)}".rstrip("/"))
                fs.copy(os.path.join(saved_model_dir, rel), f"{target}/{rel}")
            else:
                os.makedirs(os.path.dirname(os.path.join(target, rel)), exist_ok=True)
                shutil.copyfile(os.path.join(saved_model_dir, rel), os.path.join(target, rel))
        return
    partial = target + ".partial"
    shutil.rmtree(partial, ignore_errors=True)
    for rel in missing:
        os.makedirs(os.path.dirname(os.path.join(partial, rel)), exist_ok=True)
        shutil.copyfile(os.path.join(saved_model_dir, rel), os.path.join(partial, rel))
    os.rename(partial, target)  # locally, 1/ appears whole or not at all


def _relative_files(root: str, walk) -> list[str]:
    """The files under `root`, relative to it; a top-level `serving/` (the copy, when the model directory is
    itself the SavedModel) is not part of it."""
    root = root.rstrip("/")
    files = []
    for folder, dirs, names in walk(root):
        relative = str(folder).rstrip("/")[len(root):].strip("/")
        if not relative and SERVING_FOLDER in dirs:
            dirs.remove(SERVING_FOLDER)
        files += [f"{relative}/{name}" if relative else name for name in names]
    return sorted(files)


def _read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


class VertexRegistry(gcp.VertexService):
    """The Vertex AI Model Registry of one project and region, as a `Registry`."""

    kind = "vertex"

    def __init__(self, project: str, location: str, *, api_endpoint: str | None = None, credentials: Any = None,
                 transport: str = "rest", serving_image: str | None = None,
                 gcs_fuse_root: str = "/gcs", max_attempts: int = 5, initial_backoff_s: float = 1.0,
                 max_backoff_s: float = 32.0, poll_seconds: float = 2.0, upload_timeout_seconds: float = 1800.0,
                 sleep: Callable[[float], None] = time.sleep, monotonic: Callable[[], float] = time.monotonic,
                 uniform: Callable[[float, float], float] = random.uniform,
                 bucket_location: Callable[[str], str | None] | None = None, export_python: str | None = None):
        """
        project, location: where the models live (`projects/{project}/locations/{location}`).
        api_endpoint, credentials, transport: where and how calls go (see components/gcp/clients.py); a
            regional endpoint of another region than `location` is refused.
        serving_image: the serving container's image (`serving_container` says how it is run): by default
            TensorFlow Serving where Cloud Build copies it (`default_serving_image`); a Vertex AI prebuilt
            image (`prebuilt_image_for`) keeps the prebuilt TensorFlow 2.15 container.
        gcs_fuse_root: local paths under it are Cloud Storage paths (`/gcs/BUCKET/PATH` is `gs://BUCKET/PATH`
            on Vertex AI Pipelines), so a step can hash the model locally and register its gs:// URI.
        max_attempts, initial_backoff_s, max_backoff_s, sleep, uniform: the retry policy
            (components/gcp/retry.py); `sleep` and `uniform` (the backoff's jitter) are injectable for tests.
        poll_seconds, upload_timeout_seconds, monotonic: how the upload's long-running operation is followed.
        bucket_location: optional `bucket name -> location` lookup (e.g. with google-cloud-storage, which needs
            storage.buckets.get); when given, an artifact bucket in another single region is refused before
            uploading.
        export_python: the Python that writes a pending model's SavedModel from its model.keras (default: this
            one; it needs TensorFlow and this project).
        """
        if not project:
            raise ValueError("VertexRegistry needs a project")
        if not location or location == "global":
            raise ValueError(f"VertexRegistry needs a region such as us-central1 (models are regional), got {location!r}")
        super().__init__(project, location, api_endpoint=api_endpoint, credentials=credentials, transport=transport,
                         retry=gcp.RetryPolicy(max_attempts, initial_backoff_s, max_backoff_s, sleep, uniform),
                         monotonic=monotonic)
        self.serving = serving_container(serving_image or default_serving_image(project, location))
        self.gcs_fuse_root = gcs_fuse_root.rstrip("/") if gcs_fuse_root else ""
        self.poll_seconds = poll_seconds
        self.upload_timeout_seconds = upload_timeout_seconds
        self._bucket_location = bucket_location
        self._export_python = export_python or sys.executable
        self._client_instance = None

    # -- plumbing --------------------------------------------------------------------------------------

    @property
    def _client(self):
        if self._client_instance is None:
            from google.cloud import aiplatform_v1

            self._client_instance = self.vertex.client(aiplatform_v1.ModelServiceClient)
        return self._client_instance

    def _call(self, what: str, fn: Callable[[], Any], *, idempotent: bool = True, artifact_uri: str = "") -> Any:
        """`fn()` under the layer's retry policy; reads are idempotent, uploads are not."""
        return self.vertex.call(what, fn, idempotent=idempotent, artifact_uri=artifact_uri)

    def _model_id_for(self, model: str) -> str:
        """The resource id a new model gets: derived from its name, so concurrent first uploads collide."""
        text = re.sub(r"[^a-z0-9_-]", "-", model.lower()).strip("-")
        if not text or not (text[0].isalpha() or text[0] == "_"):
            text = "m-" + text
        return text[:63]

    def _find_model(self, model: str):
        """The model (its default version) with display name `model`, or None. The oldest if several."""
        if not model:
            raise ValueError("model name must not be empty")
        escaped = model.replace("\\", "\\\\").replace('"', '\\"')
        models = self._call(f"look up model {model!r}", lambda: list(
            self._client.list_models(request={"parent": self.parent, "filter": f'display_name="{escaped}"',
                                              "page_size": 100})))
        models = [m for m in models if m.display_name == model]
        if len(models) > 1:
            log.warning("%d Vertex AI models are named %r in %s; using the oldest, %s", len(models), model,
                        self.parent, min(models, key=lambda m: gcp.rfc3339(m.create_time)).name)
        return min(models, key=lambda m: gcp.rfc3339(m.create_time)) if models else None

    def _version(self, pb: Any) -> ModelVersion:
        labels = dict(pb.labels)
        meta = parse_version_description(pb.version_description)
        return ModelVersion(
            registry=self.kind, model=pb.display_name, version=pb.version_id, aliases=list(pb.version_aliases),
            uri=pb.artifact_uri, digest=meta.get("digest") or labels.get(DIGEST_LABEL, ""),
            metrics=dict(meta.get("metrics") or {}), labels=labels, created=gcp.rfc3339(pb.version_create_time, timespec="seconds"),
            resource_name=f"{pb.name}@{pb.version_id}", lineage=dict(meta.get("lineage") or {}))

    # -- artifacts -------------------------------------------------------------------------------------

    def artifact_uri_for(self, model_dir: str) -> str:
        """The gs:// URI Vertex AI reads the model from: `model_dir` itself, or its path under the GCS mount."""
        if model_dir.startswith("gs://"):
            if len(model_dir) <= len("gs://") or model_dir[len("gs://"):].startswith("/"):
                raise ValueError(f"Invalid Cloud Storage URI {model_dir!r}")
            return model_dir.rstrip("/")
        root = self.gcs_fuse_root
        if root and model_dir.startswith(root + "/") and len(model_dir) > len(root) + 1:
            return "gs://" + model_dir[len(root) + 1:].rstrip("/")
        raise ValueError(
            f"Vertex AI serves models from Cloud Storage, but the model directory {model_dir!r} is not a gs:// URI "
            f"(nor a path under the {root or '/gcs'}/ mount of Vertex AI Pipelines). Export the model to a gs:// "
            f"location (e.g. under the pipeline root), or pass artifact_uri='gs://...' naming where it was copied.")

    def _check_bucket_region(self, artifact_uri: str) -> None:
        if self._bucket_location is None:
            return
        bucket = artifact_uri[len("gs://"):].split("/", 1)[0]
        where = (self._bucket_location(bucket) or "").lower()
        # Single regions look like us-central1; multi- and dual-regions (US, EU, NAM4) are left to the API.
        if re.fullmatch(r"[a-z]+-[a-z]+\d+", where) and where != self.location:
            raise VertexRegionError(
                f"The model artifacts are in gs://{bucket}, a bucket in {where}, but the model registry location "
                f"is {self.location}: keep the exported model in a bucket in {self.location} (set the pipeline "
                f"root there), or register in location={where}.")

    # -- Registry interface ----------------------------------------------------------------------------

    def find_by_digest(self, model: str, digest: str) -> ModelVersion | None:
        parent = self._find_model(model)
        if parent is None:
            return None
        label = digest_label(digest)
        versions = self._call(f"list versions of {model!r}", lambda: list(self._client.list_model_versions(
            request={"name": parent.name, "filter": f'labels.{DIGEST_LABEL}="{label}"', "page_size": 100})))
        for pb in sorted(versions, key=lambda v: int(v.version_id) if v.version_id.isdigit() else 0):
            version = self._version(pb)
            if version.digest in (digest, label):  # the label is a prefix; the description keeps the whole
                return version
        return None

    def champion(self, model: str) -> ModelVersion | None:
        parent = self._find_model(model)
        return None if parent is None else self._champion_of(parent)

    def _champion_of(self, parent: Any) -> ModelVersion | None:
        from google.api_core import exceptions as gexc

        try:
            pb = self._call(f"get the {CHAMPION} of {parent.display_name!r}",
                            lambda: self._client.get_model(name=f"{parent.name}@{CHAMPION}"))
        except gexc.NotFound:
            return None
        return self._version(pb)

    def upload(self, model: str, model_dir: str, *, digest: str, metrics: dict, labels: dict,
               description: str = "", artifact_uri: str | None = None, lineage: dict | None = None) -> ModelVersion:
        """Uploads the model at `model_dir` (gs://, or under the GCS mount) as a new version of `model`; the
        lineage goes into labels (sanitised) and, in full, into the version description."""
        from google.api_core import exceptions as gexc
        from google.cloud.aiplatform_v1 import types

        self._check_serving_format(model_dir, lineage)
        uri = self.artifact_uri_for(artifact_uri or model_dir)
        saved_model_dir = model_dir
        if os.path.isfile(os.path.join(model_dir, "saved_model", "saved_model.pb")):
            # Training writes the SavedModel (what the serving container loads) in a subfolder.
            saved_model_dir = os.path.join(model_dir, "saved_model")
            uri += "/saved_model"
            if self.serving.versioned_artifact:
                uri = self._stage_versioned(model_dir, saved_model_dir, artifact_uri)
        elif os.path.isfile(os.path.join(model_dir, SAVED_MODEL_PENDING)):
            uri = self._stage_pending(model_dir, artifact_uri)
        elif self.serving.versioned_artifact:
            uri = self._stage_versioned(model_dir, saved_model_dir, artifact_uri)
        self._check_bucket_region(uri)
        version_labels = {sanitize_label_key(k): sanitize_label_value(v) for k, v in (labels or {}).items()}
        version_labels.update(lineage_labels(lineage))  # the registry's own labels win over the caller's
        version_labels[DIGEST_LABEL] = digest_label(digest)
        body = types.Model(
            display_name=model, artifact_uri=uri, labels=version_labels,
            container_spec=types.ModelContainerSpec(**self.serving.spec()),
            version_description=version_description(description, digest=digest, metrics=metrics, lineage=lineage))
        what = f"upload a version of model {model!r}"

        def request_for(parent_model) -> Any:
            if parent_model is not None:
                return types.UploadModelRequest(parent=self.parent, model=body, parent_model=parent_model.name)
            return types.UploadModelRequest(parent=self.parent, model=body, model_id=self._model_id_for(model))

        parent_model = self._find_model(model)
        try:
            operation = self._call(what, lambda: self._client.upload_model(request=request_for(parent_model)),
                                   idempotent=False, artifact_uri=uri)
        except gexc.Conflict:  # 409 ALREADY_EXISTS
            # Another run created the model between our lookup and upload: become a version of it.
            parent_model = self._created_by_another_run(model)
            operation = self._call(what, lambda: self._client.upload_model(request=request_for(parent_model)),
                                   idempotent=False, artifact_uri=uri)
        response = self._wait(operation, what, uri)
        pb = self._call(f"get the new version of {model!r}",
                        lambda: self._client.get_model(name=f"{response.model}@{response.model_version_id}"))
        return self._version(pb)

    def _check_serving_format(self, model_dir: str, lineage: dict | None) -> None:
        """Refuses a model whose serving format (training.json's, through the lineage) the container cannot
        load: TensorFlow Serving and Vertex AI's prebuilt TensorFlow containers load SavedModels only."""
        if lineage is None and os.path.isdir(model_dir):
            lineage = model_lineage(model_dir)
        serving_format = (lineage or {}).get("serving_format")
        if serving_format == TORCHSCRIPT:
            raise ServingFormatUnsupported(
                f"Not uploading {model_dir} to Vertex AI: it is a TorchScript model (a torch.nn.Module trained on "
                f"PyTorch), and the serving container {self.serving.image_uri} loads TensorFlow SavedModels only "
                "(why not Triton: docs/registry.md#torchscript-on-vertex-ai); train a keras.Model builder (on any "
                "framework, Vertex AI Pipelines included) for a SavedModel Vertex AI serves, or register this one "
                "in the local registry (registry local) on a KFP backend or locally.")

    def _created_by_another_run(self, model: str) -> Any:
        """The model whose id our upload found taken. Another run's first upload holds the id from its request
        to the end of its operation, when the model appears (with its first version): until then it is waited
        for. A model of that id with another display name is refused."""
        from google.api_core import exceptions as gexc

        model_id = self._model_id_for(model)
        deadline = self._monotonic() + self.upload_timeout_seconds
        while True:
            parent_model = self._find_model(model)
            if parent_model is not None:
                return parent_model
            try:
                taken = self._call(f"get model {model_id!r}",
                                   lambda: self._client.get_model(name=f"{self.parent}/models/{model_id}"))
                if taken.display_name == model:  # its upload finished between the two reads
                    return taken
            except gexc.NotFound:
                if self._monotonic() < deadline:  # still being created by the other run's upload
                    self._sleep(self.poll_seconds)
                    continue
                raise VertexRegistryError(
                    f"Cannot create model {model!r}: another upload holds the model id {model_id!r} in "
                    f"{self.parent} and has not finished in {self.upload_timeout_seconds:.0f}s; register again "
                    "later.") from None
            raise VertexRegistryError(
                f"Cannot create model {model!r}: the model id {model_id!r} is taken in {self.parent} by a model "
                f"with another display name; register under another name.")

    def _stage_versioned(self, model_dir: str, saved_model_dir: str, artifact_uri: str | None) -> str:
        """Stages MODEL_DIR/serving/1/ (`stage_versioned`) and returns its parent's gs:// URI, the artifact URI
        TensorFlow Serving's base path is set to."""
        if not os.path.isfile(os.path.join(saved_model_dir, "saved_model.pb")):
            raise ValueError(
                f"No SavedModel in {model_dir} (looked for saved_model/saved_model.pb and saved_model.pb): the serving "
                f"container {self.serving.image_uri} loads it from a versioned copy the register step makes, so the "
                f"model directory must be readable here (a local path, or under the {self.gcs_fuse_root or '/gcs'}/ "
                f"mount).")
        base = self.artifact_uri_for(artifact_uri or model_dir) + "/" + SERVING_FOLDER
        # Written where the files are seen: under the /gcs mount when the model is there, else to gs:// itself.
        stage_versioned(saved_model_dir, os.path.join(model_dir, SERVING_FOLDER) if not artifact_uri else base)
        return base

    def _stage_pending(self, model_dir: str, artifact_uri: str | None) -> str:
        """The SavedModel of a model that has none yet (SAVED_MODEL_PENDING), exported from its model.keras into
        a scratch directory and staged as MODEL_DIR/serving/1/; returns the artifact URI (serving/ for TensorFlow
        Serving, serving/1 for a prebuilt container). A serving/1/ that already holds a SavedModel is the one an
        earlier attempt staged (the export is not byte-stable, so it is kept rather than made again and refused
        as different). Raises SavedModelUnavailable, before anything is uploaded, when it cannot be made."""
        base = self.artifact_uri_for(artifact_uri or model_dir) + "/" + SERVING_FOLDER
        serving_dir = os.path.join(model_dir, SERVING_FOLDER) if not artifact_uri else base
        if "://" in serving_dir:
            from components.dataio.storage import gfile

            staged = gfile().exists(f"{serving_dir}/1/saved_model.pb")
        else:
            staged = os.path.isfile(os.path.join(serving_dir, "1", "saved_model.pb"))
        if not staged:
            with tempfile.TemporaryDirectory(prefix="serving-export-") as scratch:
                saved_model_dir = os.path.join(scratch, "saved_model")
                self._export_pending(model_dir, saved_model_dir)
                stage_versioned(saved_model_dir, serving_dir)
        return base if self.serving.versioned_artifact else base + "/1"

    def _export_pending(self, model_dir: str, saved_model_dir: str) -> None:
        """`python -m components.train.export MODEL_DIR --output-dir DIR` with Keras on TensorFlow."""
        env = {**os.environ, "KERAS_BACKEND": "tensorflow", "TF_CPP_MIN_LOG_LEVEL": "2"}
        try:
            done = subprocess.run([self._export_python, "-m", EXPORT_MODULE, model_dir, "--output-dir",
                                   saved_model_dir], env=env, capture_output=True, text=True)
            returncode, stderr = done.returncode, done.stderr
        except OSError as e:
            returncode, stderr = -1, str(e)
        if returncode == 0 and os.path.isfile(os.path.join(saved_model_dir, "saved_model.pb")):
            return
        last = next((line.strip() for line in reversed(stderr.splitlines()) if line.strip()), "no output")
        why = (f"no TensorFlow in {self._export_python}" if returncode == EXPORT_NO_TENSORFLOW
               else f"exporting it failed (exit {returncode}: {last[:300]})")
        raise SavedModelUnavailable(
            f"Not uploading {model_dir}: it was trained where TensorFlow is not installed and has no SavedModel "
            f"({SAVED_MODEL_PENDING}), and none could be made from its model.keras here: {why}. Run `python -m "
            f"{EXPORT_MODULE} {model_dir}` where TensorFlow is installed (e.g. the CPU image), then register again.")

    def _wait(self, operation: Any, what: str, artifact_uri: str) -> Any:
        """Follows the upload's long-running operation (each poll retried for quota) and returns its response.

        The operation is not ours to cancel: an upload that outlives the timeout may still finish."""
        gcp.follow_job(
            lambda: self._call(f"poll the operation to {what}", operation.done, artifact_uri=artifact_uri), None,
            status=lambda done: gcp.JobStatus("done", gcp.Phase.SUCCEEDED) if done else gcp.JobStatus("running"),
            what=f"the operation {operation.operation.name} to {what}", poll_seconds=self.poll_seconds,
            max_poll_seconds=30.0, backoff=1.5, timeout_seconds=self.upload_timeout_seconds, sleep=self._sleep,
            monotonic=self._monotonic)
        # Done: result() returns the response or raises the operation's error, without another call.
        return self._call(what, lambda: operation.result(timeout=0), idempotent=False, artifact_uri=artifact_uri)

    def set_alias(self, model: str, version: str, alias: str) -> ModelVersion:
        if alias != "default" and not ALIAS_RE.match(alias):
            raise ValueError(f"Invalid Vertex version alias {alias!r}: it must match {ALIAS_RE.pattern}")
        parent = self._find_model(model)
        if parent is None:
            raise KeyError(f"{model} has no version {version}")
        return self._merge_alias(parent, model, version, alias)

    def _merge_alias(self, parent: Any, model: str, version: str, alias: str) -> ModelVersion:
        from google.api_core import exceptions as gexc

        try:
            pb = self._call(f"move alias {alias!r} to version {version} of {model!r}",
                            lambda: self._client.merge_version_aliases(name=f"{parent.name}@{version}",
                                                                       version_aliases=[alias]))
        except gexc.NotFound:
            raise KeyError(f"{model} has no version {version}") from None
        return self._version(pb)

    def move_champion(self, model: str, version: str, *, expected: str | None) -> ModelVersion:
        """Reads the champion right before moving it, and moves it only if it is still `expected`.

        Vertex offers no conditional alias move: MergeVersionAliasesRequest holds only the version's name and
        the aliases (googleapis/googleapis google/cloud/aiplatform/v1/model_service.proto:619-646 at f8291d2b),
        UpdateModel cannot change aliases (its supported fields, :549-550), and `Model.etag` serves UpdateModel
        only (model.proto:431-433). So a move by another run between this read and the merge (one round trip)
        is not seen; the window between evaluation and registration (training's end to the register step) is."""
        parent = self._find_model(model)
        if parent is None:
            raise KeyError(f"{model} has no version {version}")
        current = self._champion_of(parent)
        if current is not None and current.version == version:
            return current
        if (current.version if current else None) != expected:
            raise ChampionChanged(model, expected, current)
        return self._merge_alias(parent, model, version, CHAMPION)

    def versions(self, model: str) -> list[ModelVersion]:
        """All versions of `model`, oldest first (like LocalRegistry.versions)."""
        parent = self._find_model(model)
        if parent is None:
            return []
        pbs = self._call(f"list versions of {model!r}", lambda: list(
            self._client.list_model_versions(request={"name": parent.name, "page_size": 100})))
        return sorted((self._version(pb) for pb in pbs), key=lambda v: int(v.version) if v.version.isdigit() else 0)
