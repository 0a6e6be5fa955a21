"""The Vertex AI Model Registry behind the `Registry` interface (components/registry/base.py).

One registered model is one Vertex AI `Model` (looked up by display name); every upload is a new version of
it (`parentModel`), and `champion` is a Vertex version alias moved with `mergeVersionAliases`. The client is
the generated `google.cloud.aiplatform_v1.ModelServiceClient`, built and called through the Google Cloud layer
(components/gcp/: regional endpoint, REST transport, one retry policy and its IAM messages), imported lazily
so importing this module stays cheap.

Where things are kept on Vertex:

- the artifacts: `artifactUri`, a `gs://` directory holding the exported SavedModel, served by a pinned
  prebuilt TensorFlow serving container (`SERVING_IMAGES`);
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
  `pretrained_sha256` (`sha256-` and the first 56 hex digits of the weights file's digest, when known).

Production: `VertexRegistry(project="my-project", location="us-central1")` uses Application Default
Credentials and `https://us-central1-aiplatform.googleapis.com`. Tests: pass `api_endpoint="http://127.0.0.1:PORT"`
(the generated REST transport keeps an explicit http:// scheme; such an endpoint gets anonymous credentials)
and a fake `sleep`.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import time
from typing import Any, Callable

from components import gcp
from components.registry.base import CHAMPION, ChampionChanged, ModelVersion

log = logging.getLogger(__name__)

# Prebuilt Vertex AI TensorFlow serving containers, pinned to one TensorFlow minor version (the version is the
# image name: `tf2-cpu.2-15`; Google publishes each of them under the `latest` tag only, which moves between
# patch builds of that minor version). 2.15 is the newest TensorFlow serving image the installed
# google-cloud-aiplatform knows (aiplatform/constants/prediction.py). Pass `serving_image=` to use another one
# (e.g. pinned by digest). The `us-docker.pkg.dev` host is swapped for `europe-`/`asia-docker.pkg.dev` in
# those regions.
SERVING_IMAGES = {
    "cpu": "us-docker.pkg.dev/vertex-ai/prediction/tf2-cpu.2-15:latest",
    "gpu": "us-docker.pkg.dev/vertex-ai/prediction/tf2-gpu.2-15:latest",
}

DIGEST_LABEL = "model_digest"
NETWORK_LABEL = "network"
PRETRAINED_LABEL = "pretrained"
PRETRAINED_DIGEST_LABEL = "pretrained_sha256"
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


def serving_image_for(location: str, accelerator: str = "cpu") -> str:
    """The pinned prebuilt TensorFlow serving image for a region (from the nearest Artifact Registry host)."""
    if accelerator not in SERVING_IMAGES:
        raise ValueError(f"accelerator must be one of {sorted(SERVING_IMAGES)}, got {accelerator!r}")
    image = SERVING_IMAGES[accelerator]
    if location.startswith("europe-"):
        return image.replace("us-docker.pkg.dev", "europe-docker.pkg.dev", 1)
    if location.startswith(("asia-", "australia-")):
        return image.replace("us-docker.pkg.dev", "asia-docker.pkg.dev", 1)
    return image


class VertexRegistry(gcp.VertexService):
    """The Vertex AI Model Registry of one project and region, as a `Registry`."""

    kind = "vertex"

    def __init__(self, project: str, location: str, *, api_endpoint: str | None = None, credentials: Any = None,
                 transport: str = "rest", accelerator: str = "cpu", serving_image: str | None = None,
                 gcs_fuse_root: str = "/gcs", max_attempts: int = 5, initial_backoff_s: float = 1.0,
                 max_backoff_s: float = 32.0, poll_seconds: float = 2.0, upload_timeout_seconds: float = 1800.0,
                 sleep: Callable[[float], None] = time.sleep, monotonic: Callable[[], float] = time.monotonic,
                 bucket_location: Callable[[str], str | None] | None = None):
        """
        project, location: where the models live (`projects/{project}/locations/{location}`).
        api_endpoint, credentials, transport: where and how calls go (see components/gcp/clients.py); a
            regional endpoint of another region than `location` is refused.
        accelerator / serving_image: the serving container: the pinned `SERVING_IMAGES[accelerator]` for the
            region unless `serving_image` names one.
        gcs_fuse_root: local paths under it are Cloud Storage paths (`/gcs/BUCKET/PATH` is `gs://BUCKET/PATH`
            on Vertex AI Pipelines), so a step can hash the model locally and register its gs:// URI.
        max_attempts, initial_backoff_s, max_backoff_s, sleep: the retry policy (components/gcp/retry.py);
            `sleep` is injectable for tests.
        poll_seconds, upload_timeout_seconds, monotonic: how the upload's long-running operation is followed.
        bucket_location: optional `bucket name -> location` lookup (e.g. with google-cloud-storage, which needs
            storage.buckets.get); when given, an artifact bucket in another single region is refused before
            uploading.
        """
        if not project:
            raise ValueError("VertexRegistry needs a project")
        if not location or location == "global":
            raise ValueError(f"VertexRegistry needs a region such as us-central1 (models are regional), got {location!r}")
        super().__init__(project, location, api_endpoint=api_endpoint, credentials=credentials, transport=transport,
                         retry=gcp.RetryPolicy(max_attempts, initial_backoff_s, max_backoff_s, sleep),
                         monotonic=monotonic)
        self.serving_image = serving_image or serving_image_for(location, accelerator)
        self.gcs_fuse_root = gcs_fuse_root.rstrip("/") if gcs_fuse_root else ""
        self.poll_seconds = poll_seconds
        self.upload_timeout_seconds = upload_timeout_seconds
        self._bucket_location = bucket_location
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

        uri = self.artifact_uri_for(artifact_uri or model_dir)
        if os.path.isfile(os.path.join(model_dir, "saved_model", "saved_model.pb")):
            # Training writes the SavedModel (what Vertex's TensorFlow serving loads) in a subfolder.
            uri += "/saved_model"
        self._check_bucket_region(uri)
        version_labels = {sanitize_label_key(k): sanitize_label_value(v) for k, v in (labels or {}).items()}
        version_labels.update(lineage_labels(lineage))  # the registry's own labels win over the caller's
        version_labels[DIGEST_LABEL] = digest_label(digest)
        body = types.Model(
            display_name=model, artifact_uri=uri, labels=version_labels,
            container_spec=types.ModelContainerSpec(image_uri=self.serving_image),
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
