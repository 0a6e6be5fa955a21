"""Launch: run training on several machines, as a Kubeflow TFJob (GKE) or a Vertex AI CustomJob, and follow it.

A pipeline step can only ask for one pod. For multi-node training the step instead creates a job that runs
the same image and the same training command on a chief and N workers (the platform sets `TF_CONFIG`, so
components/train.py picks MultiWorkerMirroredStrategy), follows its status and the chief's log, fails when
the job fails, and deletes (cancels) the job when it is itself stopped: a cancelled pipeline run sends
SIGTERM to the step's pod, and a GPU job must not outlive the run that asked for it.

Retries inside the job: replicas use `restartPolicy: ExitCode`, so a preempted replica (exit 143 after its
checkpoint, or 137 when killed) is restarted and resumes from the checkpoints in durable storage, while a
bug or bad input (exit 1 or 2) fails the job at once (see components/train.py for the codes).

Scheduling (`pod_scheduling`) is shared with the single-pod path of the pipeline: GKE accelerator node
selector and GPU toleration, Spot VMs (`cloud.google.com/gke-spot`), a named node pool, and Kueue's queue
label for clusters that queue GPU work.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import re
import signal
import sys
import threading
import time
from typing import Callable

log = logging.getLogger(__name__)

# GKE and Kubernetes API facts (the pipeline's copies of the first two live in pipelines/config.py).
ACCELERATOR_NODE_LABEL = "cloud.google.com/gke-accelerator"
GPU_RESOURCE = "nvidia.com/gpu"
SPOT_NODE_LABEL = "cloud.google.com/gke-spot"
NODE_POOL_LABEL = "cloud.google.com/gke-nodepool"
KUEUE_QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
TFJOB_GROUP, TFJOB_VERSION, TFJOB_PLURAL = "kubeflow.org", "v1", "tfjobs"
CONTAINER_NAME = "tensorflow"  # the container the training operator looks for
MAX_GPUS_PER_REPLICA = 16  # the largest GKE GPU machine shapes (a2-megagpu-16g)

# Vertex AI machine type for (accelerator, GPUs per replica): the smallest machine holding that many.
VERTEX_MACHINES = {
    "nvidia-tesla-t4": {1: "n1-standard-8", 2: "n1-standard-16", 4: "n1-standard-32"},
    "nvidia-l4": {1: "g2-standard-8", 2: "g2-standard-24", 4: "g2-standard-48", 8: "g2-standard-96"},
    "nvidia-tesla-a100": {1: "a2-highgpu-1g", 2: "a2-highgpu-2g", 4: "a2-highgpu-4g", 8: "a2-highgpu-8g",
                          16: "a2-megagpu-16g"},
    "nvidia-a100-80gb": {1: "a2-ultragpu-1g", 2: "a2-ultragpu-2g", 4: "a2-ultragpu-4g", 8: "a2-ultragpu-8g"},
    "nvidia-h100-80gb": {1: "a3-highgpu-1g", 2: "a3-highgpu-2g", 4: "a3-highgpu-4g", 8: "a3-highgpu-8g"},
    "nvidia-h200-141gb": {8: "a3-ultragpu-8g"},
}
VERTEX_CPU_MACHINE = "n1-standard-8"
_DNS_LABEL = re.compile(r"[^a-z0-9-]+")


class LaunchError(RuntimeError):
    """The training job could not be created, failed, or was cancelled."""


class Cancelled(LaunchError):
    """The launcher was stopped (SIGTERM: the pipeline run was cancelled); the job was deleted."""


# ---------------------------------------------------------------------------------------------- scheduling


@dataclasses.dataclass(frozen=True)
class Scheduling:
    """Where a training pod may run: its node selector, tolerations and GPU limit."""

    node_selector: dict[str, str]
    tolerations: list[dict]
    gpus: int
    accelerator: str

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


def pod_scheduling(accelerator: str, gpus: int, *, known_accelerators, spot: bool = False,
                   node_pool: str = "") -> Scheduling:
    """Validates a per-run GPU choice and turns it into node selector + tolerations.

    `accelerator` is a GKE accelerator label value (nvidia-tesla-t4, nvidia-l4, ...); with `gpus=0` the pod runs
    on CPU nodes and the accelerator is ignored. Spot adds the `cloud.google.com/gke-spot` selector and its
    toleration (GKE taints Spot pools when asked to, and the toleration is harmless when it does not).
    """
    known = list(known_accelerators)
    if not isinstance(gpus, int) or isinstance(gpus, bool) or not 0 <= gpus <= MAX_GPUS_PER_REPLICA:
        raise ValueError(f"GPU count must be an integer from 0 to {MAX_GPUS_PER_REPLICA}, got {gpus!r}")
    if gpus and accelerator not in known:
        raise ValueError(f"Unknown accelerator {accelerator!r}; known GKE accelerators: {', '.join(known)}")
    if node_pool and (len(node_pool) > 40 or _DNS_LABEL.search(node_pool)):
        raise ValueError(f"Node pool {node_pool!r} is not a GKE node pool name (lowercase letters, digits, '-')")
    selector: dict[str, str] = {}
    tolerations: list[dict] = []
    if gpus:
        selector[ACCELERATOR_NODE_LABEL] = accelerator
        tolerations.append({"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"})
    if spot:
        selector[SPOT_NODE_LABEL] = "true"
        tolerations.append({"key": SPOT_NODE_LABEL, "operator": "Equal", "value": "true", "effect": "NoSchedule"})
    if node_pool:
        selector[NODE_POOL_LABEL] = node_pool
    return Scheduling(selector, tolerations, gpus, accelerator if gpus else "")


def job_name(prefix: str, run_id: str, task: str = "") -> str:
    """A DNS-1123 name (<= 63 chars) that is the same for every attempt of one run's task, so a retried
    launcher finds the job its previous attempt created instead of starting a second one."""
    base = _DNS_LABEL.sub("-", f"{prefix}-{run_id}-{task}".lower()).strip("-")
    if len(base) > 63:
        import hashlib

        digest = hashlib.sha256(base.encode()).hexdigest()[:8]
        base = f"{base[:54].rstrip('-')}-{digest}"
    return base


@dataclasses.dataclass(frozen=True)
class TrainingJob:
    """A multi-worker training job: one chief and `workers` more replicas, all running `command` in `image`."""

    name: str
    image: str
    command: list[str]
    workers: int = 1  # in addition to the chief
    scheduling: Scheduling = Scheduling({}, [], 0, "")
    cpu: str = "4"
    memory: str = "16Gi"
    kueue_queue: str = ""
    labels: dict = dataclasses.field(default_factory=dict)
    env: dict = dataclasses.field(default_factory=dict)
    backoff_limit: int = 6  # replica restarts (preemptions) before the job fails
    service_account: str = ""
    grace_seconds: int = 30  # SIGTERM to SIGKILL: time to write the preemption checkpoint

    def __post_init__(self):
        if self.workers < 0:
            raise ValueError(f"workers must be >= 0, got {self.workers}")
        if not self.command:
            raise ValueError("the training command is empty")


# ---------------------------------------------------------------------------------------------- TFJob


def tfjob_manifest(job: TrainingJob, namespace: str) -> dict:
    """The kubeflow.org/v1 TFJob for `job`: chief + workers, same image and command, ExitCode restarts."""
    container = {
        "name": CONTAINER_NAME,
        "image": job.image,
        "command": list(job.command),
        "env": [{"name": k, "value": str(v)} for k, v in sorted(job.env.items())],
        "resources": {"requests": {"cpu": job.cpu, "memory": job.memory}},
    }
    if job.scheduling.gpus:
        container["resources"]["limits"] = {GPU_RESOURCE: str(job.scheduling.gpus)}
    labels = {**job.labels, "app.kubernetes.io/component": "training"}
    pod_spec = {
        "containers": [container],
        "terminationGracePeriodSeconds": job.grace_seconds,
    }
    if job.scheduling.node_selector:
        pod_spec["nodeSelector"] = dict(job.scheduling.node_selector)
    if job.scheduling.tolerations:
        pod_spec["tolerations"] = [dict(t) for t in job.scheduling.tolerations]
    if job.service_account:
        pod_spec["serviceAccountName"] = job.service_account

    def replicas(count: int) -> dict:
        return {"replicas": count, "restartPolicy": "ExitCode",
                "template": {"metadata": {"labels": dict(labels)}, "spec": json.loads(json.dumps(pod_spec))}}

    specs = {"Chief": replicas(1)}
    if job.workers:
        specs["Worker"] = replicas(job.workers)
    metadata = {"name": job.name, "namespace": namespace, "labels": dict(labels)}
    if job.kueue_queue:
        metadata["labels"][KUEUE_QUEUE_LABEL] = job.kueue_queue  # Kueue admits (un-suspends) the job
    return {
        "apiVersion": f"{TFJOB_GROUP}/{TFJOB_VERSION}",
        "kind": "TFJob",
        "metadata": metadata,
        "spec": {"runPolicy": {"backoffLimit": job.backoff_limit, "cleanPodPolicy": "Running"},
                 "tfReplicaSpecs": specs},
    }


def tfjob_state(tfjob: dict) -> tuple[str, str]:
    """The job's current condition (type, message): the last condition whose status is True."""
    conditions = [c for c in tfjob.get("status", {}).get("conditions", []) if c.get("status") == "True"]
    if not conditions:
        return "Pending", ""
    return conditions[-1]["type"], conditions[-1].get("message", "")


class _SigtermAsCancel:
    """SIGTERM (a cancelled pipeline run) sets a flag the polling loop acts on; restores the old handler."""

    def __init__(self):
        self.event = threading.Event()
        self._previous = None

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGTERM, lambda *_: self.event.set())
        return self

    def __exit__(self, *exc):
        if self._previous is not None:
            signal.signal(signal.SIGTERM, self._previous)
        return False


@dataclasses.dataclass
class JobOutcome:
    name: str
    state: str
    message: str
    seconds: float
    restarts: int = 0


class TFJobLauncher:
    """Creates a TFJob through the Kubernetes API, follows it to the end, deletes it when stopped.

    `api_client` is a `kubernetes.client.ApiClient` (in a pod: `kubernetes.config.load_incluster_config()`
    then `ApiClient()`; the step's service account needs create/get/delete on tfjobs and get on pods/log).
    """

    def __init__(self, api_client, namespace: str, *, poll_seconds: float = 10.0,
                 echo: Callable[[str], None] | None = None, timeout_seconds: float | None = None):
        from kubernetes import client

        self.custom = client.CustomObjectsApi(api_client)
        self.core = client.CoreV1Api(api_client)
        self.namespace = namespace
        self.poll_seconds = poll_seconds
        self.echo = echo or (lambda line: print(line, flush=True))
        self.timeout_seconds = timeout_seconds

    def _api(self, verb: str, **kwargs):
        method = getattr(self.custom, f"{verb}_namespaced_custom_object")
        return method(group=TFJOB_GROUP, version=TFJOB_VERSION, namespace=self.namespace, plural=TFJOB_PLURAL,
                      **kwargs)

    def create(self, manifest: dict) -> dict:
        """Creates the TFJob; when it already exists (a retried launcher), follows the existing one."""
        from kubernetes.client.rest import ApiException

        name = manifest["metadata"]["name"]
        try:
            created = self._api("create", body=manifest)
            log.info("launch: created TFJob %s/%s", self.namespace, name)
            return created
        except ApiException as e:
            if e.status == 409:
                log.info("launch: TFJob %s/%s exists (an earlier attempt created it): following it",
                         self.namespace, name)
                return self._api("get", name=name)
            raise LaunchError(f"Could not create TFJob {self.namespace}/{name}: {_api_reason(e)}") from None

    def delete(self, name: str) -> bool:
        from kubernetes.client.rest import ApiException

        try:
            self._api("delete", name=name, body={"propagationPolicy": "Foreground"})
            log.info("launch: deleted TFJob %s/%s", self.namespace, name)
            return True
        except ApiException as e:
            if e.status == 404:
                return False
            raise

    def run(self, manifest: dict) -> JobOutcome:
        """Creates the job and blocks until it succeeds; raises LaunchError (failed) or Cancelled (SIGTERM)."""
        from kubernetes.client.rest import ApiException

        name = manifest["metadata"]["name"]
        start = time.monotonic()
        finished = False
        chief_pod = f"{name}-chief-0"
        with _SigtermAsCancel() as cancel:
            self.create(manifest)
            follower = _LogFollower(self.core, self.namespace, chief_pod, self.echo)
            follower.start()
            try:
                last = None
                while True:
                    if cancel.event.is_set():
                        raise Cancelled(f"Stopped while TFJob {self.namespace}/{name} was running; it was deleted")
                    try:
                        tfjob = self._api("get", name=name)
                    except ApiException as e:
                        if e.status == 404:
                            finished = True
                            raise LaunchError(f"TFJob {self.namespace}/{name} was deleted by someone else") from None
                        raise
                    state, message = tfjob_state(tfjob)
                    if state != last:
                        log.info("launch: TFJob %s is %s %s", name, state, f"({message})" if message else "")
                        last = state
                    if state in ("Succeeded", "Failed"):
                        finished = True
                        follower.stop(wait=True)
                        restarts = sum(1 for c in tfjob["status"].get("conditions", []) if c["type"] == "Restarting")
                        outcome = JobOutcome(name, state, message, time.monotonic() - start, restarts)
                        if state == "Failed":
                            raise LaunchError(f"TFJob {self.namespace}/{name} failed: {message}"
                                              + follower.tail_text())
                        return outcome
                    if self.timeout_seconds and time.monotonic() - start > self.timeout_seconds:
                        raise LaunchError(f"TFJob {self.namespace}/{name} did not finish in {self.timeout_seconds}s")
                    cancel.event.wait(self.poll_seconds)
            finally:
                follower.stop()
                if not finished:  # cancelled, timed out, or the launcher itself failed: leave no GPU job behind
                    self.delete(name)


class _LogFollower(threading.Thread):
    """Streams a pod's log (kubectl logs -f) into the launcher's output, re-attaching after restarts.

    Lines are read with their timestamps, so re-attaching (the stream ends when the container exits, and the
    restarted container starts a new log) shows only lines not yet shown.
    """

    def __init__(self, core_api, namespace: str, pod: str, echo: Callable[[str], None]):
        super().__init__(daemon=True, name=f"logs-{pod}")
        self.core, self.namespace, self.pod, self.echo = core_api, namespace, pod, echo
        self.stopped = threading.Event()
        self.tail: list[str] = []
        self.last_seen: tuple = ()

    def run(self) -> None:
        from kubernetes.client.rest import ApiException

        while not self.stopped.is_set():
            try:
                response = self.core.read_namespaced_pod_log(self.pod, self.namespace, container=CONTAINER_NAME,
                                                             follow=True, timestamps=True, _preload_content=False)
                pending = b""
                for chunk in response.stream(4096):
                    pending += chunk
                    *lines, pending = pending.split(b"\n")
                    for line in lines:
                        self._emit(line.decode(errors="replace"))
                if pending:
                    self._emit(pending.decode(errors="replace"))
                response.release_conn()
            except ApiException as e:
                if e.status not in (400, 404):  # 400/404: the pod is not there or not started yet
                    log.warning("launch: cannot read the log of %s: %s", self.pod, _api_reason(e))
            except Exception as e:  # the log is a convenience; never fail the launch over it
                log.debug("launch: log stream of %s ended: %s", self.pod, e)
            self.stopped.wait(1.0)

    def _emit(self, stamped: str) -> None:
        stamp, _, line = stamped.partition(" ")
        seen = _log_time(stamp)
        if seen <= self.last_seen:
            return
        self.last_seen = seen
        self.tail = (self.tail + [line])[-20:]
        self.echo(f"[{self.pod}] {line}")

    def tail_text(self) -> str:
        return ("\nLast lines of the chief's log:\n" + "\n".join(self.tail)) if self.tail else ""

    def stop(self, wait: bool = False) -> None:
        if wait and self.is_alive():
            self.join(timeout=5.0)  # the stream ends by itself once the pod has exited
        self.stopped.set()


def _log_time(stamp: str) -> tuple:
    """An RFC 3339 timestamp as a sortable tuple (Kubernetes trims trailing zeros of the fraction)."""
    whole, _, fraction = stamp.rstrip("Z").partition(".")
    return (whole, fraction.ljust(9, "0"))


def _api_reason(e) -> str:
    try:
        return json.loads(e.body).get("message") or str(e.reason)
    except (TypeError, ValueError, AttributeError):
        return f"{e.status} {e.reason}"


# ---------------------------------------------------------------------------------------------- Vertex AI


def vertex_machine_type(accelerator: str, gpus: int) -> str:
    if not gpus:
        return VERTEX_CPU_MACHINE
    shapes = VERTEX_MACHINES.get(accelerator, {})
    if gpus not in shapes:
        raise ValueError(f"Vertex AI has no machine with {gpus} x {accelerator}; choose one of "
                         f"{sorted(shapes) or 'none'} GPUs (or pass machine_type)")
    return shapes[gpus]


def custom_job(job: TrainingJob, *, vertex_accelerators: dict, spot: bool, machine_type: str = "",
               base_output_dir: str = ""):
    """The Vertex AI CustomJob for `job`: worker pool 0 is the chief, pool 1 the workers (Vertex sets TF_CONFIG)."""
    from google.cloud import aiplatform_v1 as v1

    gpus = job.scheduling.gpus
    machine = v1.MachineSpec(machine_type=machine_type or vertex_machine_type(job.scheduling.accelerator, gpus))
    if gpus:
        machine.accelerator_type = vertex_accelerators[job.scheduling.accelerator]
        machine.accelerator_count = gpus
    container = v1.ContainerSpec(image_uri=job.image, command=list(job.command),
                                 env=[v1.EnvVar(name=k, value=str(v)) for k, v in sorted(job.env.items())])
    pools = [v1.WorkerPoolSpec(machine_spec=machine, replica_count=1, container_spec=container)]
    if job.workers:
        pools.append(v1.WorkerPoolSpec(machine_spec=machine, replica_count=job.workers, container_spec=container))
    spec = v1.CustomJobSpec(
        worker_pool_specs=pools,
        # A restarted worker cannot rejoin a running all-reduce: restart them all (they resume from checkpoints).
        scheduling=v1.Scheduling(strategy=v1.Scheduling.Strategy.SPOT if spot else v1.Scheduling.Strategy.ON_DEMAND,
                                 restart_job_on_worker_restart=job.workers > 0),
    )
    if job.service_account:
        spec.service_account = job.service_account
    if base_output_dir:
        spec.base_output_directory = v1.GcsDestination(output_uri_prefix=base_output_dir)
    return v1.CustomJob(display_name=job.name, job_spec=spec, labels={k: _DNS_LABEL.sub("-", str(v).lower())[:63]
                                                                      for k, v in job.labels.items()})


VERTEX_TERMINAL = {"JOB_STATE_SUCCEEDED", "JOB_STATE_FAILED", "JOB_STATE_CANCELLED", "JOB_STATE_EXPIRED"}


class VertexJobLauncher:
    """Creates a CustomJob with `aiplatform_v1.JobServiceClient`, polls it to the end, cancels it when stopped."""

    def __init__(self, client, project: str, location: str, *, poll_seconds: float = 15.0,
                 timeout_seconds: float | None = None):
        self.client = client
        self.parent = f"projects/{project}/locations/{location}"
        self.location = location
        self.poll_seconds = poll_seconds
        self.timeout_seconds = timeout_seconds

    def run(self, job) -> JobOutcome:
        start = time.monotonic()
        created = self.client.create_custom_job(parent=self.parent, custom_job=job)
        name = created.name
        log.info("launch: created Vertex AI CustomJob %s (console: https://console.cloud.google.com/vertex-ai/"
                 "locations/%s/training/%s)", name, self.location, name.rsplit("/", 1)[-1])
        finished = False
        with _SigtermAsCancel() as cancel:
            try:
                last = None
                while True:
                    if cancel.event.is_set():
                        raise Cancelled(f"Stopped while CustomJob {name} was running; it was cancelled")
                    current = self.client.get_custom_job(name=name)
                    state = current.state.name
                    if state != last:
                        log.info("launch: CustomJob %s is %s", name, state)
                        last = state
                    if state in VERTEX_TERMINAL:
                        finished = True
                        outcome = JobOutcome(name, state, current.error.message, time.monotonic() - start)
                        if state != "JOB_STATE_SUCCEEDED":
                            raise LaunchError(f"CustomJob {name} ended {state}: {current.error.message or 'no message'}")
                        return outcome
                    if self.timeout_seconds and time.monotonic() - start > self.timeout_seconds:
                        raise LaunchError(f"CustomJob {name} did not finish in {self.timeout_seconds}s")
                    cancel.event.wait(self.poll_seconds)
            finally:
                if not finished:
                    self.client.cancel_custom_job(name=name)
                    log.info("launch: cancelled CustomJob %s", name)



# ---------------------------------------------------------------------------------------------- CLI


def training_command(dataset: str, model_dir: str, backup_dir: str, *, recipe: str, epochs: int = 0,
                     batch_size: int = 0, learning_rate: float = 0.0, augmented: str = "",
                     tensorboard_dir: str = "") -> list[str]:
    """The command every replica runs: components/train.py's CLI (TF_CONFIG tells it its role)."""
    command = ["python", "-m", "components.train", "--dataset-dir", dataset, "--model-dir", model_dir,
               "--backup-dir", backup_dir, "--recipe", recipe]
    for flag, value in (("--augmented-dir", augmented), ("--epochs", epochs), ("--batch-size", batch_size),
                        ("--learning-rate", learning_rate), ("--tensorboard-dir", tensorboard_dir)):
        if value:
            command += [flag, str(value)]
    return command


def copy_tree(source: str, destination: str) -> int:
    """Copies a directory tree between local paths and gs:// (tf.io.gfile); returns the number of files."""
    import tensorflow as tf

    if not tf.io.gfile.isdir(source):
        raise LaunchError(f"The training job finished but wrote nothing to {source}")
    copied = 0
    for directory, _, files in tf.io.gfile.walk(source):
        relative = directory[len(source.rstrip("/")):].lstrip("/")
        target = "/".join(p for p in (destination.rstrip("/"), relative) if p)
        tf.io.gfile.makedirs(target)
        for name in files:
            tf.io.gfile.copy(f"{directory.rstrip('/')}/{name}", f"{target}/{name}", overwrite=True)
            copied += 1
    return copied


def launch_training(*, launcher: str, dataset_uri: str, augmented_uri: str, model_path: str, tensorboard_path: str,
                    staging_dir: str, backup_dir: str, recipe: str, epochs: int, batch_size: int,
                    learning_rate: float, image: str, workers: int, accelerator: str, gpus: int, spot: bool,
                    node_pool: str, known_accelerators: dict, kueue_queue: str, namespace: str, project: str,
                    location: str, run_id: str, task_name: str, api_client=None, vertex_client=None,
                    poll_seconds: float | None = None) -> dict:
    """Runs components/train.py on a chief + `workers` as a TFJob or a Vertex AI CustomJob and returns its
    training.json. The replicas write the model and TensorBoard logs under `staging_dir` (durable storage they
    can reach); they are then copied into the step's own output paths."""
    import tensorflow as tf

    if launcher not in ("tfjob", "vertex-job"):
        raise ValueError(f"launcher must be tfjob or vertex-job, got {launcher!r}")
    for uri in (dataset_uri, staging_dir, backup_dir):
        if uri.startswith(("minio://", "s3://")):
            raise ValueError(f"The training job's replicas cannot read or write {uri}: run the pipeline with a gs:// "
                             "pipeline root (or a checkpoint_root and pipeline root they can reach)")
    scheduling = pod_scheduling(accelerator, gpus, known_accelerators=known_accelerators, spot=spot,
                                node_pool=node_pool)
    staged_model, staged_logs = f"{staging_dir.rstrip('/')}/model", f"{staging_dir.rstrip('/')}/tensorboard"
    command = training_command(dataset_uri, staged_model, backup_dir, recipe=recipe, epochs=epochs,
                               batch_size=batch_size, learning_rate=learning_rate, augmented=augmented_uri,
                               tensorboard_dir=staged_logs)
    job = TrainingJob(name=job_name("train", run_id, task_name), image=image, command=command, workers=workers,
                      scheduling=scheduling, kueue_queue=kueue_queue,
                      labels={"pipeline-run": job_name("", run_id)[:63], "pipeline-task": job_name("", task_name)})
    if launcher == "tfjob":
        launcher_impl = TFJobLauncher(api_client or kubernetes_client(), namespace,
                                      **({"poll_seconds": poll_seconds} if poll_seconds else {}))
        outcome = launcher_impl.run(tfjob_manifest(job, namespace))
    else:
        if not project:
            raise ValueError("launcher=vertex-job needs the Google Cloud project")
        client = vertex_client or _vertex_job_client(location)
        launcher_impl = VertexJobLauncher(client, project, location,
                                          **({"poll_seconds": poll_seconds} if poll_seconds else {}))
        outcome = launcher_impl.run(custom_job(job, vertex_accelerators=known_accelerators, spot=spot))
    log.info("launch: %s %s after %.0fs", outcome.name, outcome.state, outcome.seconds)
    copy_tree(staged_model, model_path)
    if tf.io.gfile.isdir(staged_logs):
        copy_tree(staged_logs, tensorboard_path)
    with tf.io.gfile.GFile(f"{model_path.rstrip('/')}/training.json") as f:
        return json.load(f)


def _vertex_job_client(location: str):
    from google.cloud import aiplatform_v1

    return aiplatform_v1.JobServiceClient(client_options={"api_endpoint": f"{location}-aiplatform.googleapis.com"})


def main(argv: list[str] | None = None) -> int:
    """Launch a TFJob from the command line (in-cluster or with the local kubeconfig); exits 0 on success."""
    parser = argparse.ArgumentParser(description="Run a training command as a Kubeflow TFJob and follow it.")
    parser.add_argument("--name", required=True)
    parser.add_argument("--namespace", default="kubeflow")
    parser.add_argument("--image", required=True)
    parser.add_argument("--workers", type=int, default=1, help="workers besides the chief")
    parser.add_argument("--accelerator", default="nvidia-tesla-t4")
    parser.add_argument("--gpus", type=int, default=0)
    parser.add_argument("--spot", action="store_true")
    parser.add_argument("--node-pool", default="")
    parser.add_argument("--kueue-queue", default="")
    parser.add_argument("--known-accelerators", default=",".join(VERTEX_MACHINES))
    parser.add_argument("--api-server", help="Kubernetes API URL (default: in-cluster, else ~/.kube/config)")
    parser.add_argument("--poll-seconds", type=float, default=10.0)
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- the training command")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    try:
        scheduling = pod_scheduling(args.accelerator, args.gpus, known_accelerators=args.known_accelerators.split(","),
                                    spot=args.spot, node_pool=args.node_pool)
        job = TrainingJob(name=args.name, image=args.image, command=command, workers=args.workers,
                          scheduling=scheduling, kueue_queue=args.kueue_queue)
        launcher = TFJobLauncher(kubernetes_client(args.api_server), args.namespace, poll_seconds=args.poll_seconds)
        outcome = launcher.run(tfjob_manifest(job, args.namespace))
    except Cancelled as e:
        print(f"cancelled: {e}", file=sys.stderr)
        return 143
    except (LaunchError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(json.dumps(dataclasses.asdict(outcome)))
    return 0


def kubernetes_client(api_server: str | None = None):
    """An ApiClient: for `api_server` when given, else in-cluster credentials, else the local kubeconfig."""
    from kubernetes import client, config

    if api_server:
        configuration = client.Configuration()
        configuration.host = api_server
        return client.ApiClient(configuration)
    try:
        config.load_incluster_config()
    except config.ConfigException:
        config.load_kube_config()
    return client.ApiClient()


if __name__ == "__main__":
    raise SystemExit(main())
