"""Where a step's bulk data goes: inside its KFP artifact, or by reference outside it.

A KFP backend's launcher copies every input artifact into the pod before a step starts, and every output artifact
whole out of it after the step ends (pipelines/backend/kfp_launcher.py models that rule, release by release). A dataset
of a million photos is tens of GB of shards, so on a KFP backend the data-heavy steps (preprocess, augment, predict)
write their shards and predictions *by reference*: into a data folder outside the artifact, and into the artifact itself
only a small manifest whose paths point there. Every reader of a dataset goes through the manifest
(`data.split_files`, `data.locate`), so training, evaluation and prediction stream the shards from where they live
(gs://, with tf.data) and the KFP UI's lineage still links each step to the dataset artifact it used.

The data folder must not start with the key of any artifact: before 2.17.0 the launcher downloads every object whose
key merely *starts with* an input artifact's key (objectstore.DownloadBlob lists with `Prefix: <artifact key>`, no
trailing slash, and keeps all it lists: backend/src/v2/objectstore/object_store.go:127-154 at kubeflow/pipelines
2.16.1, the same at 2.5.0:123-150); 2.17.0 keeps only the key and the keys below `key/` (`isBlobKeyUnderPrefix`,
object_store.go:171-174 at 2.17.0). So a sibling such as `ARTIFACT_URI.data`, which earlier releases of this
project wrote, is downloaded with the artifact by every backend from 2.5.0 through 2.16.1.

Where the data folder is (`bulk_dir`):

- `data_root` given (a gs:// URI, or a path every step mounts: a GCS FUSE volume, a shared PVC): below it, so each
  output of each run has its own folder: for an artifact in an object store, the bucket and key of its URI
  (`DATA_ROOT/<bucket>/<pipeline root key>/<pipeline>/<run id>/<task>/<uuid>/<output>`); for a local run (kfp.local,
  whose artifacts are `PIPELINE_ROOT/<run>/<task>/<output>`), the run, task and output (`DATA_ROOT/<run>/<task>/
  <output>`);
- else, `by_reference` (the pipeline compiled for a KFP backend) and a gs:// artifact: in its task's output folder,
  at `TASK_ROOT/.data/<output>` for the artifact `TASK_ROOT/<output>`. A KFP backend names every output artifact
  `TASK_ROOT/<output name>` (driver.go:775-786 at 2.17.0, 729-740 at 2.16.1, 2046 at 2.5.0), and an output name
  never starts with a dot (the SDK takes them from Python identifiers), so no artifact key is a prefix of it on
  any release;
- else (Vertex AI Pipelines, whose `.path` is a GCS FUSE mount of the artifact, and local runs) the artifact's own
  folder.

Datasets and predictions written by earlier releases (`ARTIFACT_URI.data`, `DATA_ROOT/<whole local path>`) read as
before: their manifests hold absolute paths, which readers follow as they are. With a MinIO or S3 pipeline root and
no data root, the data stays in the artifact (the step's container has no credentials for the launcher's object
store): the step says so in its log. A step where TensorFlow is not installed (batch prediction of a run on torch,
in the PyTorch image) writes its gs:// data folder through google-cloud-storage (components/dataio/gcs.py), as the
others do through tf.io.gfile.
"""

from __future__ import annotations

import json
import logging

from components.dataio import data

log = logging.getLogger(__name__)

BULK_FOLDER = ".data"  # below the task's output folder; no output name starts with a dot
PREDICTIONS_SUMMARY = "summary.json"


def artifact_key(artifact_uri: str) -> str:
    """The artifact URI without its scheme: bucket and object key (gs://b/root/run/task/dataset ->
    b/root/run/task/dataset), or a local path without its leading slash."""
    scheme, sep, rest = artifact_uri.partition("://")
    return (rest if sep else scheme).strip("/")


def bulk_dir(artifact_uri: str, artifact_path: str, *, data_root: str = "", by_reference: bool = False) -> str:
    """Where a step writes the bulk of an output artifact (see the module docstring). A gs:// folder is written
    through tf.io.gfile, or google-cloud-storage where TensorFlow is not installed (components/dataio/gcs.py)."""
    return _bulk_dir(artifact_uri, artifact_path, data_root=data_root, by_reference=by_reference)


def _bulk_dir(artifact_uri: str, artifact_path: str, *, data_root: str, by_reference: bool) -> str:
    if data_root:
        if "://" in artifact_uri:
            return data.join(data_root, artifact_key(artifact_uri))
        return data.join(data_root, *artifact_uri.rstrip("/").split("/")[-3:])  # <run>/<task>/<output>
    if by_reference and artifact_uri.startswith("gs://"):
        task_root, _, output = artifact_uri.rstrip("/").rpartition("/")
        return f"{task_root}/{BULK_FOLDER}/{output}"
    if by_reference and "://" in artifact_uri:
        log.warning("The data of %s stays in the artifact, so the KFP launcher copies it whole into every pod "
                    "that reads it: give the pipeline a data_root (gs://BUCKET/DIR, or a mounted path) to stream it",
                    artifact_uri)
    return artifact_path


def publish_dataset(data_dir: str, artifact_dir: str) -> dict:
    """Writes the artifact's manifest for a dataset written to `data_dir`: the manifest there, with every path made
    absolute (shards, rejected inputs, sample grid) and `data_dir` recorded. Nothing to do when they are one."""
    manifest = data.read_manifest(data_dir)
    if data_dir == artifact_dir:
        return manifest
    reference = {**manifest, "data_dir": data_dir,
                 "splits": {name: {**info, "path": data.locate(data_dir, info["path"])}
                            for name, info in manifest["splits"].items()}}
    if data.gfile().exists(data.join(data_dir, data.REJECTED)):
        reference["rejected_file"] = data.join(data_dir, data.REJECTED)
    if manifest.get("samples"):
        reference["samples"] = {**manifest["samples"], "file": data.locate(data_dir, manifest["samples"]["file"])}
    data.gfile().makedirs(artifact_dir)
    data.write_json(data.join(artifact_dir, data.MANIFEST), reference)
    return reference


def publish_predictions(data_dir: str, artifact_dir: str) -> dict:
    """The predictions artifact for predictions written to `data_dir`: their summary (counts, throughput and the
    absolute paths of the prediction files), with `data_dir` recorded."""
    with data.gfile().GFile(data.join(data_dir, PREDICTIONS_SUMMARY)) as f:
        summary = json.load(f)
    if data_dir == artifact_dir:
        return summary
    summary["data_dir"] = data_dir
    data.gfile().makedirs(artifact_dir)
    data.write_json(data.join(artifact_dir, PREDICTIONS_SUMMARY), summary)
    return summary
