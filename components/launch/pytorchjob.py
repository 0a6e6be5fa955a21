"""Kubeflow PyTorchJob (Kubeflow Training Operator v1, `kubeflow.org/v1`): the manifest for a master + workers, its
status, and the launcher (a custom resource). The legacy option for PyTorch, as the TFJob (tfjob.py) is for
TensorFlow: for clusters that still run Training Operator v1; a new cluster runs Trainer v2's TrainJob on the torch
runtime (trainjob.py).

Followed at the operator's last release, kubeflow/trainer v1.9.4 (the repository was kubeflow/training-operator):
- every replica runs torchrun (through components.launch.node, frameworks/torch.py), which reads the PET_* variables the
  operator sets on every container (pkg/controller.v1/pytorch/envvar.go:85-123: WORLD_SIZE, RANK and PET_NODE_RANK =
  the replica's rank, master 0 and worker k k+1; PET_NPROC_PER_NODE = spec.nprocPerNode; PET_NNODES = all replicas;
  master.go:44-59: MASTER_ADDR and PET_MASTER_ADDR = `{job}-master-0`, MASTER_PORT and PET_MASTER_PORT = the master
  container's port named `pytorchjob-port`). `nprocPerNode` is set (one per GPU, one on CPU): its default `auto`
  (pkg/apis/kubeflow.org/v1/pytorch_defaults.go:68-74) would start one process per CPU on a CPU node.
- the operator's webhook wants a container named `pytorch` in every replica and exactly one Master
  (pkg/webhooks/pytorch/pytorchjob_webhook.go:137-157).
- `restartPolicy: ExitCode`: a replica exiting 128-255 (SIGTERM after its checkpoint, SIGKILL) is restarted, 1-127
  fails the job (pkg/controller.v1/common/pod.go:352-367, pkg/util/train/train_util.go:24-26); the job succeeds when
  the master does (pkg/controller.v1/pytorch/pytorchjob_controller.go:383-401).
"""

from __future__ import annotations

from components import gcp
from components.launch.frameworks import setup
from components.launch.job import TrainingJob
from components.launch.tfjob import (OPERATOR_GROUP, OPERATOR_VERSION, OperatorJobLauncher, operator_job_manifest,
                                    tfjob_status)

OPERATOR_RELEASE = "v1.9.4"
PYTORCHJOB_GROUP, PYTORCHJOB_VERSION, PYTORCHJOB_PLURAL = OPERATOR_GROUP, OPERATOR_VERSION, "pytorchjobs"
CONTAINER_NAME = "pytorch"  # the container the operator looks for (pytorch_types.go:27)
PORT_NAME, PORT = "pytorchjob-port", 23456  # the master's port the operator reads (pytorch_types.go:25-29)


def pytorchjob_manifest(job: TrainingJob, namespace: str) -> dict:
    """The kubeflow.org/v1 PyTorchJob for `job`: master + workers running torchrun, ExitCode restarts."""
    runs_on = setup(job.framework).launchers
    if "pytorchjob" not in runs_on:
        raise ValueError(f"a PyTorchJob trains with torch, not {job.framework}: use another launcher "
                         f"({', '.join(runs_on)})")
    container = {"name": CONTAINER_NAME, "image": job.image, "command": list(job.command), "env": job.env_list(),
                 "ports": [{"name": PORT_NAME, "containerPort": PORT}], "resources": job.container_resources()}
    return operator_job_manifest(job, namespace, kind="PyTorchJob", container=container, primary="Master",
                                 replica_specs="pytorchReplicaSpecs",
                                 spec={"nprocPerNode": str(job.processes_per_node)})


def pytorchjob_status(pytorchjob: dict) -> gcp.JobStatus:
    """The job's current condition (the operator's conditions are the TFJob's: Created, Running, Restarting,
    Succeeded, Failed)."""
    return tfjob_status(pytorchjob)


class PyTorchJobLauncher(OperatorJobLauncher):
    """Creates a PyTorchJob through the Kubernetes API, follows it and the master's log to the end, deletes it when
    stopped (see CustomResourceLauncher)."""

    kind = "PyTorchJob"
    group, version, plural = PYTORCHJOB_GROUP, PYTORCHJOB_VERSION, PYTORCHJOB_PLURAL
    container = CONTAINER_NAME
    primary = "master"
