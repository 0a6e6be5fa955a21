"""Batch prediction on Vertex AI: a BatchPredictionJob on a model registered there, fed with instances decoded
here exactly as local prediction decodes them, its results written as local prediction writes them."""

from __future__ import annotations

import concurrent.futures
import json
import logging
import os
import re
import time

import numpy as np

from components import gcp
from components.dataio import data
from components.predict.decode import Decoder, iter_batches
from components.predict.output import (SHARDS, ChunkWriter, PredictResult, _copy_lines, _gather,
                                       _remove_stale_shards, _rename, claim_output, model_here, shard_paths)
from components.predict.sources import _is_remote, iter_chunks, resolve_source

log = logging.getLogger(__name__)


# ---------------------------------------------------------------------------------------------- Vertex AI


# A Vertex AI batch prediction job could not be created or did not succeed; the message says why. The name
# callers catch for the Google Cloud layer's errors (components/gcp/errors.py, which also gives the exit codes).
VertexBatchError = gcp.RemoteError


def serving_input_name(model_dir: str) -> str:
    """The input name of the exported SavedModel's serving signature: Vertex AI's TensorFlow serving container
    takes instances keyed by it."""
    import tensorflow as tf

    saved = data.join(model_dir, "saved_model")
    saved = saved if data.gfile().exists(data.join(saved, "saved_model.pb")) else model_dir
    if not data.gfile().exists(data.join(saved, "saved_model.pb")):
        info_path = data.join(model_dir, "training.json")
        if data.gfile().exists(info_path):
            with data.gfile().GFile(info_path) as f:
                if json.load(f).get("serving_format") == data.TORCHSCRIPT:
                    raise data.DataError(f"{model_dir} is a TorchScript model (a torch.nn.Module trained on PyTorch) "
                                         "and Vertex AI's TensorFlow serving containers load SavedModels only: "
                                         "predict locally (no Vertex AI batch prediction), or train a keras.Model "
                                         "builder")
        raise data.DataError(f"No SavedModel in {model_dir} (looked for saved_model/saved_model.pb): Vertex AI "
                             "serves the SavedModel that training exports")
    names = list(tf.saved_model.load(saved).signatures["serving_default"].structured_input_signature[1])
    if len(names) != 1:
        raise data.DataError(f"The serving signature of {saved} takes {len(names)} inputs ({names}); expected one")
    return names[0]


def write_vertex_instances(source: str, instances_path: str, errors_path: str, image_shape: list[int],
                           input_name: str, *, batch_size: int = 256, chunk_size: int = 10_000,
                           exclude: str | None = None) -> dict:
    """Vertex AI batch prediction's input, built from any source this module reads: JSONL with one line per
    readable image, `{"uri": URI, INPUT_NAME: HxWxC pixels}`, decoded exactly as local prediction decodes them
    (the job's `instanceConfig.keyField` is `uri`, so predictions come back keyed by it). Inputs that cannot
    be read go to `errors_path` with the reason. Returns {"instances": n, "errors": m, "keys": the n keys sent}."""
    where = resolve_source(source)
    counts = {"instances": 0, "errors": 0, "keys": []}
    workers = 32 if _is_remote(where.location) else 2 * data.available_cpus()
    with concurrent.futures.ThreadPoolExecutor(max_workers=workers) as pool, \
            data.gfile().GFile(instances_path, "w") as instances, data.gfile().GFile(errors_path, "w") as errors:
        decoder = Decoder(image_shape, pool, raw_ok=where.kind == "tfrecord")
        for chunk in iter_chunks(where, chunk_size, exclude=exclude):
            for keys, images, failures in map(decoder.decode, iter_batches(chunk, batch_size, pool)):
                instances.write("".join(json.dumps({"uri": key, input_name: image.tolist()}) + "\n"
                                        for key, image in zip(keys, images)))
                errors.write("".join(json.dumps({"uri": uri, "reason": reason}) + "\n" for uri, reason in failures))
                counts["instances"] += len(keys)
                counts["keys"] += keys
                counts["errors"] += len(failures)
    return counts


def run_vertex_batch_job(client, *, model: str, instances_uri: str, output_uri_prefix: str, display_name: str,
                         machine_type: str = "n1-standard-4", accelerator_type: str = "", accelerator_count: int = 0,
                         replicas: int = 1, max_replicas: int = 1, labels: dict | None = None,
                         poll_seconds: float = 30.0, timeout_seconds: float = 24 * 3600, sleep=None):
    """Creates a BatchPredictionJob for a model registered in Vertex AI and follows it to its end.

    `client` is a `google.cloud.aiplatform_v1.JobServiceClient` for the model's region (`gcp.job_client`).
    `model` is the model's resource name, optionally with `@VERSION` or `@ALIAS`
    (`projects/P/locations/L/models/ID@champion`). Returns the succeeded job; raises VertexBatchError when it
    cannot be created, fails or runs past the timeout. The job is ours: it is cancelled on a timeout, on SIGTERM
    (`gcp.JobStopped`) and when this process fails, so an interrupted prediction leaves no paid job running.
    `sleep` (tests) replaces the real wait.
    """
    from google.api_core import exceptions
    from google.cloud import aiplatform_v1

    found = re.match(r"^(projects/[^/]+/locations/[^/]+)/models/[^/@]+(@[A-Za-z0-9_-]+)?$", model)
    if not found:
        raise ValueError(f"Not a Vertex AI model resource name: {model!r} (expected "
                         "projects/PROJECT/locations/REGION/models/ID[@VERSION_OR_ALIAS])")
    parent = found.group(1)
    machine_spec = {"machine_type": machine_type}
    if accelerator_count:
        machine_spec.update(accelerator_type=accelerator_type, accelerator_count=accelerator_count)
    request = aiplatform_v1.BatchPredictionJob(
        display_name=display_name, model=model, labels=labels or {},
        input_config={"instances_format": "jsonl", "gcs_source": {"uris": [instances_uri]}},
        instance_config={"instance_type": "object", "key_field": "uri"},
        output_config={"predictions_format": "jsonl", "gcs_destination": {"output_uri_prefix": output_uri_prefix}},
        dedicated_resources={"machine_spec": machine_spec, "starting_replica_count": replicas,
                             "max_replica_count": max(replicas, max_replicas)})
    retry = gcp.RetryPolicy(sleep=sleep or time.sleep)
    with gcp.sigterm_stops():  # a SIGTERM while the job is being created cancels it too
        try:
            job = retry.call(f"create a batch prediction job for {model}", lambda: client.create_batch_prediction_job(
                parent=parent, batch_prediction_job=request), parent=parent)
        except exceptions.GoogleAPICallError as e:  # what the retry policy leaves as the API answered it
            hint = " (is the model registered in this project and region?)" if e.code == 404 else ""
            raise VertexBatchError(f"Creating the batch prediction job for {model} failed: {e.message}{hint}") from e
        followed = gcp.follow_job(
            lambda: retry.call(f"get {job.name}", lambda: client.get_batch_prediction_job(name=job.name),
                               parent=parent, idempotent=True),
            lambda: retry.call(f"cancel {job.name}", lambda: client.cancel_batch_prediction_job(name=job.name),
                               parent=parent, idempotent=True),
            status=gcp.vertex_job_status, what=f"Batch prediction job {job.name}", job=job,
            poll_seconds=poll_seconds, timeout_seconds=timeout_seconds, sleep=sleep)
    return followed.job


# The files a BatchPredictionJob writes into `output_info.gcs_output_directory`. A model with instance and prediction
# schemata gets `predictions_0001.jsonl, ...` and, for failed instances, `errors_0001.jsonl, ...`: each instance
# followed by an `error` field, a google.rpc.Status (googleapis/googleapis, google/cloud/aiplatform/v1/
# batch_prediction_job.proto:188-209 at f8291d2b). A custom-trained model without schemata, as ours is, gets
# `prediction.results-NNNNN-of-NNNNN` with the instances that were predicted, and `prediction.errors_stats-NNNNN-of-
# NNNNN`, which only counts the failures per error message (`('MESSAGE', COUNT)` lines, as Google's Cloud ML batch
# prediction Dataflow pipeline writes them, `batch_prediction_pipeline.py`: Beam's Count.PerKey of its errors, then
# WriteToText; its public copies carry no release tag, so any other line is kept whole); which instances failed is
# only known by their absence from the results.
RESULT_FILES = ("prediction.results-*", "predictions_*")
ERROR_FILES = ("errors_*",)
ERROR_STATS_FILES = ("prediction.errors_stats-*",)


def _files(results_dir: str, patterns: tuple[str, ...]) -> list[str]:
    return sorted(path for pattern in patterns for path in data.glob(data.join(results_dir, pattern)))


def _error_stats(paths: list[str]) -> list[tuple[str, int | None]]:
    """(message, count) per line of `prediction.errors_stats-*`; a line that is not such a pair is kept whole,
    its count unknown."""
    import ast

    stats = []
    for path in paths:
        with data.gfile().GFile(path) as f:
            for line in f:
                if not line.strip():
                    continue
                try:
                    message, count = ast.literal_eval(line.strip())
                    stats.append((str(message), int(count)))
                except (ValueError, SyntaxError, TypeError):
                    stats.append((line.strip(), None))
    return stats


def read_vertex_predictions(results_dir: str, output_dir: str, class_names: list[str], *, sent_keys: list[str],
                            top_k: int = 3, batch_size: int = 1024, settings: dict | None = None) -> dict:
    """Writes this module's outputs (shards, errors) from a job's output files (see RESULT_FILES): predictions
    from the results files, whose lines are `{"key": URI, "prediction": probabilities}`, errors from an `"error"`
    in them or in the per-instance error files, and every key of `sent_keys` (the instances sent) that came back
    in neither as an error too, with the job's error summary (`prediction.errors_stats-*`) as its reason. So every
    instance sent is counted once, as a prediction or as an error; none is dropped. Each chunk's marker records
    `settings` (what the rows depend on besides the inputs: output.claim_output)."""
    results, error_files = _files(results_dir, RESULT_FILES), _files(results_dir, ERROR_FILES)
    stats = _error_stats(_files(results_dir, ERROR_STATS_FILES))
    if not (results or error_files or stats):
        raise VertexBatchError(f"The job wrote none of its output files ({', '.join(RESULT_FILES + ERROR_FILES)}, "
                               f"{ERROR_STATS_FILES[0]}) under {results_dir}")
    top_k = min(top_k, len(class_names))
    totals = {"count": 0, "errors": 0, "inputs": 0, "chunks": 0}
    answered: set[str] = set()

    def chunk(lines, label: str, extra=lambda: ()) -> None:
        """One output chunk from result or error lines, then the (key, reason) errors `extra()` gives."""
        writer = ChunkWriter(output_dir, totals["chunks"], class_names, top_k)
        keys, rows = [], []

        def flush():
            if keys:
                writer.write(list(keys), np.asarray(rows, dtype=np.float64))
                keys.clear()
                rows.clear()

        for entry in lines:
            key = entry.get("key") or (entry.get("instance") or {}).get("uri") or \
                json.dumps(entry.get("instance", entry))[:200]
            answered.add(key)
            prediction = entry.get("prediction")
            if isinstance(prediction, dict) and len(prediction) == 1:  # a signature with one named output
                prediction = next(iter(prediction.values()))
            if "error" in entry or not isinstance(prediction, list) or len(prediction) != len(class_names):
                error = entry.get("error") or {}
                writer.error(key, f"Vertex AI: {error.get('message', error) or 'no prediction'}")
                continue
            keys.append(key)
            rows.append(prediction)
            if len(keys) >= batch_size:
                flush()
        flush()
        for key, reason in extra():
            writer.error(key, reason)
        writer.commit({"chunk": totals["chunks"], "fingerprint": f"vertex:{label}", "settings": settings,
                       "inputs": writer.count + writer.errors})
        for name, value in (("count", writer.count), ("errors", writer.errors),
                            ("inputs", writer.count + writer.errors)):
            totals[name] += value
        totals["chunks"] += 1

    for path in results:
        chunk(_jsonl(path), path)
    summary = "; ".join(f"{message} ({count if count is not None else '?'} instances)"
                        for message, count in stats) or "the job reported no error for it"
    reason = f"Vertex AI returned no prediction for it ({ERROR_STATS_FILES[0]}: {summary})"
    missing: list[str] = []

    def unanswered() -> list[tuple[str, str]]:  # after the per-instance error files were read
        missing.extend(key for key in sent_keys if key not in answered)
        return [(key, reason) for key in missing]

    if error_files or any(key not in answered for key in sent_keys):
        chunk((entry for path in error_files for entry in _jsonl(path)), ",".join(error_files) or "missing",
              extra=unanswered)
    counted = sum(count or 0 for _, count in stats)
    if stats and counted != len(missing):
        log.warning("predict: the job's error summary counts %d failed instances, %d sent instances came back "
                    "without a prediction; all %d are reported as errors", counted, len(missing), len(missing))
    totals["missing"] = len(missing)
    return totals


def _jsonl(path: str):
    with data.gfile().GFile(path) as f:
        for line in f:
            if line.strip():
                yield json.loads(line)


def vertex_batch_predict(model_dir: str, vertex_model: str, source: str, output_dir: str, *, client,
                         staging_uri: str, storage_root: str | None = None, top_k: int = 3,
                         machine_type: str = "n1-standard-4", accelerator_type: str = "", accelerator_count: int = 0,
                         replicas: int = 1, max_replicas: int = 1, poll_seconds: float = 30.0,
                         timeout_seconds: float = 24 * 3600, sleep=None, overwrite: bool = False) -> PredictResult:
    """Batch prediction on Vertex AI for a model registered there, with the same inputs and outputs as `predict`.

    The instances file is built here from the inputs (`staging_uri/instances.jsonl`, a gs:// location the job
    can read), the job writes under `staging_uri/results/`, and its results are turned into predictions.jsonl,
    predictions.csv and errors.jsonl in `output_dir`. `model_dir` is the trained model's directory (local or
    gs://), for the image size, the class names and the serving input's name. `storage_root`, when given, is
    where gs:// is mounted (`/gcs` under Vertex AI Pipelines' GCS FUSE): gs://BUCKET/PATH is read and written as
    STORAGE_ROOT/BUCKET/PATH; otherwise gs:// is used directly.
    """
    if not staging_uri.startswith("gs://"):
        raise ValueError(f"The staging location must be a gs:// folder Vertex AI can read and write, got {staging_uri}")
    start = time.monotonic()

    def local(uri: str) -> str:
        return os.path.join(storage_root, uri[len("gs://"):]) if storage_root and uri.startswith("gs://") else uri

    with model_here(model_dir) as (here, digest):  # a gs:// model is read once, for all three
        classifier_info = data.load_classifier(here)
        input_name = serving_input_name(here)
    top_k = min(top_k, len(classifier_info.class_names))
    # What the rows depend on besides the inputs (as for local prediction): a folder holding another model's
    # predictions, or other options', is refused before a job is paid for; the job's output then replaces all
    # chunks of the same model and options.
    settings = {"model": digest, "top_k": top_k, "image_shape": list(classifier_info.image_shape),
                "vertex_model": vertex_model}
    claim_output(output_dir, settings, overwrite=overwrite)
    staging_uri = staging_uri.rstrip("/")
    instances_uri = f"{staging_uri}/instances.jsonl"
    data.gfile().makedirs(local(staging_uri))
    data.gfile().makedirs(data.join(output_dir, SHARDS))
    built = write_vertex_instances(source, local(instances_uri), data.join(output_dir, "instance-errors.jsonl"),
                                   classifier_info.image_shape, input_name, exclude=output_dir)
    log.info("predict: %d instances in %s (%d inputs could not be read)", built["instances"], instances_uri,
             built["errors"])
    if built["instances"] == 0:
        raise data.DataError(f"No image in {source} could be read ({built['errors']} inputs failed; see "
                             f"{data.join(output_dir, 'instance-errors.jsonl')})")
    job = run_vertex_batch_job(client, model=vertex_model, instances_uri=instances_uri,
                               output_uri_prefix=f"{staging_uri}/results", display_name=f"predict-{int(time.time())}",
                               machine_type=machine_type, accelerator_type=accelerator_type,
                               accelerator_count=accelerator_count, replicas=replicas, max_replicas=max_replicas,
                               poll_seconds=poll_seconds, timeout_seconds=timeout_seconds, sleep=sleep)
    totals = read_vertex_predictions(local(job.output_info.gcs_output_directory), output_dir,
                                     classifier_info.class_names, sent_keys=built["keys"], top_k=top_k,
                                     settings=settings)
    stats = job.completion_stats
    log.info("predict: the job predicted %d instances, %d failed (%d of them came back only as a count); %d "
             "not finished", stats.successful_count, stats.failed_count, totals["missing"], stats.incomplete_count)
    _remove_stale_shards(output_dir, totals["chunks"])
    # Inputs that never became instances are errors too: they lead errors.jsonl.
    _copy_lines([data.join(output_dir, "instance-errors.jsonl")]
                + [shard_paths(output_dir, i)["errors"] for i in range(totals["chunks"])],
                data.join(output_dir, "all-errors.jsonl"))
    totals["errors"] += built["errors"]
    totals["inputs"] += built["errors"]
    seconds = time.monotonic() - start
    where = resolve_source(source)
    path = _gather(output_dir, totals["chunks"], totals, classifier_info.class_names, where, combine_max=1_000_000,
                   seconds=seconds, rate=totals["inputs"] / seconds, skipped=0)
    _rename(data.join(output_dir, "all-errors.jsonl"), data.join(output_dir, "errors.jsonl"))
    return PredictResult(output_dir, path, totals["count"], totals["errors"], totals["chunks"], 0, seconds,
                         totals["inputs"] / seconds)
