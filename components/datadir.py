"""Where a step's bulk data goes: inside its KFP artifact, or by reference under a data root.

A KFP backend's launcher copies every input artifact whole into the pod before a step starts, and every output
artifact whole out of it after the step ends (pipelines/kfp_launcher.py models that rule). A dataset of a million
photos is tens of GB of shards, so on a KFP backend the data-heavy steps (preprocess, augment, predict) write their
shards and predictions *by reference*: into a data folder outside the artifact, and into the artifact itself only a
small manifest whose paths point there. Every reader of a dataset goes through the manifest
(`data.split_files`, `data.locate`), so training, evaluation and prediction stream the shards from where they live
(gs://, with tf.data) and the KFP UI's lineage still links each step to the dataset artifact it used.

Where the data folder is (`bulk_dir`):

- `data_root` given (a gs:// URI, or a path every step mounts: a GCS FUSE volume, a shared PVC): the artifact's
  own location below it, `DATA_ROOT/<bucket and key of the artifact URI>`, so each output of each run has its own;
- else, `by_reference` (the pipeline compiled for a KFP backend) and a gs:// artifact: beside the artifact, at
  `ARTIFACT_URI.data`. The launcher fetches exactly the artifact's key and the keys below it
  (`isBlobKeyUnderPrefix`, backend/src/v2/objectstore/object_store.go:171-174 at kubeflow/pipelines 2.17.0), so a
  sibling is never copied;
- else (Vertex AI Pipelines, whose `.path` is a GCS FUSE mount of the artifact, and local runs) the artifact's own
  folder, as before; datasets written that way by earlier releases are read as they always were.

With a MinIO or S3 pipeline root and no data root, the data stays in the artifact (the step's container has no
credentials for the launcher's object store): the step says so in its log.
"""

from __future__ import annotations

import json
import logging

from components import data

log = logging.getLogger(__name__)

DATA_SUFFIX = ".data"
PREDICTIONS_SUMMARY = "summary.json"


def artifact_key(artifact_uri: str) -> str:
    """The artifact URI without its scheme: bucket and object key (gs://b/root/run/task/dataset ->
    b/root/run/task/dataset), or a local path without its leading slash."""
    scheme, sep, rest = artifact_uri.partition("://")
    return (rest if sep else scheme).strip("/")


def bulk_dir(artifact_uri: str, artifact_path: str, *, data_root: str = "", by_reference: bool = False) -> str:
    """Where a step writes the bulk of an output artifact (see the module docstring)."""
    if data_root:
        return data.join(data_root, artifact_key(artifact_uri))
    if by_reference and artifact_uri.startswith("gs://"):
        return artifact_uri.rstrip("/") + DATA_SUFFIX
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
