"""Vertex AI JobService batch prediction, as a part of the Vertex AI stand-in (vertex_api.py), which runs the jobs.

Follows the public v1 REST reference for `projects.locations.batchPredictionJobs` and the BatchPredictionJob
resource (google.cloud.aiplatform.v1). Tests point `aiplatform_v1.JobServiceClient(transport="rest")` at
`VertexStandIn(storage_root=..., serve=...)`:

- `POST v1/{parent=projects/*/locations/*}/batchPredictionJobs`: checks the request as the service does for a
  custom-trained model: a display name; a model resource name, `ID`, `ID@VERSION` or `ID@ALIAS`, of a model in
  the stand-in's Model Registry (NOT_FOUND otherwise); `inputConfig.instancesFormat` and `gcsSource.uris` on
  gs://; `outputConfig` with `predictionsFormat` and a gs:// `gcsDestination.outputUriPrefix`;
  `dedicatedResources.machineSpec.machineType`, which custom-trained models require; `instanceConfig.keyField`
  only with object instances. It answers the job in `JOB_STATE_PENDING`, named with the project number and with
  the `modelVersionId` the reference resolved to.
- `GET v1/{name=projects/*/locations/*/batchPredictionJobs/*}`: the job moves PENDING -> RUNNING -> SUCCEEDED as
  it is polled (`batch_polls`: GETs spent PENDING, then RUNNING). On success it has run: it read the JSONL
  instances, sent them (without the key field) to `serve`, the model server, and wrote what the service writes
  for a custom-trained model without schemata into `outputInfo.gcsOutputDirectory`,
  `OUTPUT_PREFIX/prediction-MODEL_DISPLAY_NAME-TIMESTAMP/` (the directory: batch_prediction_job.proto:188-191 and
  249-255 in googleapis/googleapis at f8291d2b): `prediction.results-00000-of-00001`, one line per predicted
  instance, `{"key": K, "prediction": P}` with a key field (`{"instance": I, "prediction": P}` without); and, when
  the model server refused instances (`serve` raised ValueError), `prediction.errors_stats-00000-of-00001` with one
  `('MESSAGE', COUNT)` line per error message and no instance (Google's Cloud ML batch prediction Dataflow pipeline,
  `batch_prediction_pipeline.py`: `Count.PerKey` of its errors, written with WriteToText; no tagged public copy:
  the failed instances are known only by their absence from the results).
  `completionStats` counts both (completion_stats.proto: successful, failed, incomplete). A job whose instances cannot
  be read, or that has no model server to go to, ends `JOB_STATE_FAILED` saying so; `fail_next_batch_job(message)` (or
  `fail_next(..., rpc=BATCH_RESULT)`) makes the next job created end `JOB_STATE_FAILED` with that error.
- `POST v1/{name=...}:cancel`: a job not yet ended becomes `JOB_STATE_CANCELLED`.

gs:// is a folder here: gs://BUCKET/PATH is STORAGE_ROOT/BUCKET/PATH (as Vertex AI Pipelines' /gcs mount shows it).
"""

from __future__ import annotations

import collections
import copy
import json
import os
import re
from typing import Callable

from tests.standins.base import ApiError, Request, route
from tests.standins.vertex_common import LOCATION, VertexService

# fail_next(rpc=BATCH_RESULT): the next batch prediction job created ends JOB_STATE_FAILED with that error.
BATCH_RESULT = "BatchPredictionJob:result"
INSTANCE_FORMATS = {"jsonl", "csv", "tf-record", "tf-record-gzip", "file-list", "bigquery"}
PREDICTION_FORMATS = {"jsonl", "csv", "bigquery"}
ACTIVE = ("JOB_STATE_PENDING", "JOB_STATE_RUNNING")


class BatchPredictionService(VertexService):
    """The batch prediction part of VertexStandIn; models come from its Model Registry (ModelService)."""

    def _init_batch(self, storage_root: str | None, serve: Callable[[list], list] | None,
                    polls: tuple[int, int]) -> None:
        self.storage_root = None if storage_root is None else str(storage_root)
        self.serve = serve  # list of instances -> list of predictions; ValueError refuses an instance
        self.batch_polls = polls  # GETs a job spends PENDING, then RUNNING
        self._batch_jobs: dict[str, dict] = {}  # job id -> {"job": JSON, "polls", "failure", "model_display_name"}

    def _batch_routes(self) -> list:
        jobs = LOCATION + "/batchPredictionJobs"
        return [
            route("POST", jobs, "CreateBatchPredictionJob", self._CreateBatchPredictionJob),
            route("GET", jobs + r"/(?P<job>[^/:]+)", "GetBatchPredictionJob", self._GetBatchPredictionJob),
            route("POST", jobs + r"/(?P<job>[^/:]+):cancel", "CancelBatchPredictionJob",
                  self._CancelBatchPredictionJob),
        ]

    # -- test controls ---------------------------------------------------------------------------------

    def fail_next_batch_job(self, message: str) -> None:
        """The next batch prediction job created ends JOB_STATE_FAILED with `message`."""
        self.fail_next("INVALID_ARGUMENT", rpc=BATCH_RESULT, message=message)

    def batch_jobs(self) -> list[dict]:
        """The batch prediction jobs (BatchPredictionJob JSON), oldest first."""
        with self.lock:
            return [copy.deepcopy(stored["job"]) for stored in self._batch_jobs.values()]

    # -- JobService ------------------------------------------------------------------------------------

    def _CreateBatchPredictionJob(self, req: Request) -> dict:
        body = req.json()
        if not body.get("displayName"):
            raise ApiError("INVALID_ARGUMENT", "BatchPredictionJob.display_name is required.")
        found = re.match(r"^(projects/[^/]+/locations/[^/]+/models/[^/@]+)(?:@(.+))?$", body.get("model", ""))
        if not found:
            raise ApiError("INVALID_ARGUMENT", f"Invalid resource name for model: {body.get('model')!r}.")
        model_id = self._parse_model_name(found.group(1), "batch_prediction_job.model")
        version = self._resolve_version(model_id, found.group(2))
        source = body.get("inputConfig") or {}
        if source.get("instancesFormat") not in INSTANCE_FORMATS:
            raise ApiError("INVALID_ARGUMENT", f"Unsupported instances format {source.get('instancesFormat')!r}.")
        uris = (source.get("gcsSource") or {}).get("uris") or []
        if not uris or not all(u.startswith("gs://") for u in uris):
            raise ApiError("INVALID_ARGUMENT", "input_config.gcs_source.uris must list Cloud Storage (gs://) URIs.")
        output = body.get("outputConfig") or {}
        prefix = (output.get("gcsDestination") or {}).get("outputUriPrefix", "")
        if output.get("predictionsFormat") not in PREDICTION_FORMATS or not prefix.startswith("gs://"):
            raise ApiError("INVALID_ARGUMENT", "output_config needs a predictions_format and a gs:// "
                                               "gcs_destination.output_uri_prefix.")
        spec = ((body.get("dedicatedResources") or {}).get("machineSpec") or {})
        if not spec.get("machineType"):
            raise ApiError("INVALID_ARGUMENT", "BatchPredictionJob.dedicated_resources.machine_spec.machine_type "
                                               "must be set: this model supports only dedicated resources.")
        instance_config = body.get("instanceConfig") or {}
        if instance_config.get("keyField") and instance_config.get("instanceType", "object") != "object":
            raise ApiError("INVALID_ARGUMENT", "instance_config.key_field needs object instances.")
        job_id, now = self._next_id(), self.now()
        job = copy.deepcopy(body)
        job.update(name=f"{self._location_path()}/batchPredictionJobs/{job_id}",
                   model=f"{self._location_path()}/models/{model_id}", modelVersionId=version["versionId"],
                   state="JOB_STATE_PENDING", createTime=now, updateTime=now)
        self._batch_jobs[job_id] = {"job": job, "polls": 0, "failure": self.take_failure(BATCH_RESULT, req),
                                    "model_display_name": version["displayName"]}
        return copy.deepcopy(job)

    def _batch_job(self, req: Request) -> dict:
        stored = self._batch_jobs.get(req.params["job"])
        if stored is None:
            raise ApiError("NOT_FOUND", f"BatchPredictionJob {self._location_path()}/batchPredictionJobs/"
                                        f"{req.params['job']} does not exist.")
        return stored

    def _GetBatchPredictionJob(self, req: Request) -> dict:
        stored = self._batch_job(req)
        stored["polls"] += 1
        job, now = stored["job"], self.now()
        pending, running = self.batch_polls
        if job["state"] == "JOB_STATE_PENDING" and stored["polls"] >= pending:
            job.update(state="JOB_STATE_RUNNING", startTime=now, updateTime=now)
        elif job["state"] == "JOB_STATE_RUNNING" and stored["polls"] >= pending + running:
            failure = stored["failure"] or self._run(job, stored["model_display_name"])
            if failure is not None:
                job.update(state="JOB_STATE_FAILED", endTime=now, updateTime=now,
                           error={"code": failure.code, "message": failure.message})
            else:
                job.update(state="JOB_STATE_SUCCEEDED", endTime=now, updateTime=now)
        return copy.deepcopy(job)

    def _CancelBatchPredictionJob(self, req: Request) -> dict:
        job = self._batch_job(req)["job"]
        if job["state"] in ACTIVE:
            now = self.now()
            job.update(state="JOB_STATE_CANCELLED", endTime=now, updateTime=now)
        return {}

    # -- the job ---------------------------------------------------------------------------------------

    def _local(self, uri: str) -> str:
        return os.path.join(self.storage_root, uri[len("gs://"):])

    def _run(self, job: dict, model_display_name: str) -> ApiError | None:
        """What the service does for a jsonl job: instances in, one results file out. The error that ends the job,
        or None when it succeeded."""
        if job["inputConfig"]["instancesFormat"] != "jsonl":
            return ApiError("UNIMPLEMENTED", f"The stand-in runs jsonl jobs only, not "
                                             f"{job['inputConfig']['instancesFormat']}.")
        if self.serve is None or self.storage_root is None:
            return ApiError("FAILED_PRECONDITION", "No model server to send the instances to: the stand-in runs "
                                                   "batch jobs when it is given storage_root= and serve=.")
        instances = []
        for uri in job["inputConfig"]["gcsSource"]["uris"]:
            try:
                with open(self._local(uri)) as f:
                    instances += [json.loads(line) for line in f if line.strip()]
            except (OSError, ValueError) as e:
                return ApiError("INVALID_ARGUMENT", f"Failed to read the instances in {uri}: {e}")
        key_field = (job.get("instanceConfig") or {}).get("keyField")
        stamp = self._moment().strftime("%Y_%m_%dT%H_%M_%S_%fZ")[:-4] + "Z"  # milliseconds, as the service names it
        directory = f"{job['outputConfig']['gcsDestination']['outputUriPrefix'].rstrip('/')}/" \
                    f"prediction-{model_display_name}-{stamp}"
        os.makedirs(self._local(directory), exist_ok=True)
        succeeded, failures = 0, collections.Counter()
        with open(os.path.join(self._local(directory), "prediction.results-00000-of-00001"), "w") as out:
            for instance in instances:
                key = instance.pop(key_field, None) if key_field else None
                head = {"key": key} if key_field else {"instance": instance}
                try:
                    prediction = self.serve([instance])[0]
                except ValueError as e:
                    failures[f"Post request fails. Cannot get predictions. Error: {e}"] += 1
                else:
                    out.write(json.dumps({**head, "prediction": prediction}) + "\n")
                    succeeded += 1
        if failures:  # the failed instances themselves are not written anywhere: only a count per message
            with open(os.path.join(self._local(directory), "prediction.errors_stats-00000-of-00001"), "w") as out:
                out.writelines(f"{(message, count)!r}\n" for message, count in failures.items())
        job["outputInfo"] = {"gcsOutputDirectory": directory}
        job["completionStats"] = {"successfulCount": str(succeeded), "failedCount": str(sum(failures.values())),
                                  "incompleteCount": "0"}
        return None
