"""Vertex AI CustomJob: the job for a chief + workers (worker pools), and its launcher."""

from __future__ import annotations

import logging

from components import gcp
from components.gcp.accelerators import vertex_machine_type
from components.launch import local_ssd
from components.launch.frameworks import setup
from components.launch.job import Launcher, TrainingJob
from components.launch.network import check_network
from components.launch.placement import DNS_LABEL_CHARS

log = logging.getLogger(__name__)


def custom_job(job: TrainingJob, *, vertex_accelerators: dict, spot: bool, machine_type: str = "",
               base_output_dir: str = ""):
    """The Vertex AI CustomJob for `job`: worker pool 0 is the chief, pool 1 the workers. Vertex sets TF_CONFIG and
    CLUSTER_SPEC; a torch or JAX node (node.py) turns CLUSTER_SPEC into their variables."""
    from google.cloud import aiplatform_v1 as v1

    check_network(job.network, job.placement, launcher="vertex-job")
    gpus = job.placement.gpus
    machine = v1.MachineSpec(machine_type=machine_type or vertex_machine_type(job.placement.accelerator, gpus))
    if gpus:
        machine.accelerator_type = vertex_accelerators[job.placement.accelerator]
        machine.accelerator_count = gpus
    env = {**job.env, **setup(job.framework).process_env(job.processes_per_node)}
    container = v1.ContainerSpec(image_uri=job.image, command=list(job.command),
                                 env=[v1.EnvVar(name=k, value=str(v)) for k, v in sorted(env.items())])
    # Staged data (local_ssd.py): a worker has no emptyDir or local SSD, but a boot disk (an SSD persistent disk)
    # made larger by the staged bytes.
    disk = {"disk_spec": v1.DiskSpec(boot_disk_type="pd-ssd", boot_disk_size_gb=local_ssd.vertex_boot_disk_gb(
        job.local_ssd))} if job.local_ssd else {}
    pools = [v1.WorkerPoolSpec(machine_spec=machine, replica_count=1, container_spec=container, **disk)]
    if job.workers:
        pools.append(v1.WorkerPoolSpec(machine_spec=machine, replica_count=job.workers, container_spec=container,
                                       **disk))
    spec = v1.CustomJobSpec(
        worker_pool_specs=pools,
        # A restarted worker cannot rejoin a running all-reduce: restart them all (they resume from checkpoints).
        # STANDARD, not ON_DEMAND: ON_DEMAND is `deprecated = true` in Scheduling.Strategy (googleapis/googleapis,
        # google/cloud/aiplatform/v1/custom_job.proto:379 at f8291d2b), STANDARD (:385) is its on-demand successor.
        scheduling=v1.Scheduling(strategy=v1.Scheduling.Strategy.SPOT if spot else v1.Scheduling.Strategy.STANDARD,
                                 restart_job_on_worker_restart=job.workers > 0),
    )
    if job.service_account:
        spec.service_account = job.service_account
    if base_output_dir:
        spec.base_output_directory = v1.GcsDestination(output_uri_prefix=base_output_dir)
    return v1.CustomJob(display_name=job.name, job_spec=spec, labels={k: DNS_LABEL_CHARS.sub("-", str(v).lower())[:63]
                                                                      for k, v in job.labels.items()})


class VertexJobLauncher(Launcher):
    """Creates a CustomJob with `aiplatform_v1.JobServiceClient`, polls it to the end, cancels it when stopped.

    `client` is a JobServiceClient for `location` (components.gcp.job_client builds one); its calls go through
    the layer's retry policy.
    """

    kind = "CustomJob"

    def __init__(self, client, project: str, location: str, *, poll_seconds: float = 15.0,
                 timeout_seconds: float | None = None, retry: gcp.RetryPolicy | None = None):
        super().__init__(poll_seconds=poll_seconds, timeout_seconds=timeout_seconds)
        self.client = client
        self.parent = f"projects/{project}/locations/{location}"
        self.location = location
        self.retry = retry or gcp.RetryPolicy()

    def _call(self, what: str, fn, *, idempotent: bool = True):
        return self.retry.call(what, fn, parent=self.parent, idempotent=idempotent)

    def create(self, job) -> str:
        created = self._call("create a CustomJob",
                             lambda: self.client.create_custom_job(parent=self.parent, custom_job=job),
                             idempotent=False)
        log.info("launch: created Vertex AI CustomJob %s (console: https://console.cloud.google.com/vertex-ai/"
                 "locations/%s/training/%s)", created.name, self.location, created.name.rsplit("/", 1)[-1])
        return created.name

    def get(self, name: str):
        return self._call(f"get CustomJob {name}", lambda: self.client.get_custom_job(name=name))

    def cancel(self, name: str) -> None:
        self._call(f"cancel CustomJob {name}", lambda: self.client.cancel_custom_job(name=name))

    def status(self, job) -> gcp.JobStatus:
        return gcp.vertex_job_status(job)
