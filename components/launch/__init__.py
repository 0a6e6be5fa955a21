"""Launch: run training on several machines, as a Kubeflow Trainer v2 TrainJob or a JobSet (GKE), a legacy Kubeflow
TFJob or PyTorchJob, or a Vertex AI CustomJob, and follow it.

A pipeline step can only ask for one pod. For multi-node training the step instead creates a job that runs
the same image and the same training command on a chief and N workers (each framework its own way, frameworks/:
for TensorFlow the platform sets `TF_CONFIG`, or each pod builds it from its environment, so components/train/
picks MultiWorkerMirroredStrategy; torch nodes run torchrun on the platform's PET_* variables; JAX nodes
jax.distributed on JAX_*), follows its status
and the chief's log, fails when the job fails, and deletes (cancels) the job when it is itself stopped: a
cancelled pipeline run sends SIGTERM to the step's pod, and a GPU job must not outlive the run that asked for it.

- placement.py: GPU placement (`gpu_placement`, `placement_from_task_config`): node selector, tolerations, Spot,
  node pool, Kueue label, a shared GPU (`SharedGpu`); shared with the single-pod path of the pipeline.
- network.py: GPUDirect networking on A3 Mega, A3 Ultra and A4 nodes (`check_network`, the pod fields).
- local_ssd.py: each node's room for staged data (`check_staging`, the emptyDir, its mount and request).
- job.py: `TrainingJob`, `job_name`, and `Launcher`, which runs any kind of job on components/gcp's
  `follow_job` (polling, progress lines, cancel on SIGTERM/timeout/failure, errors and exit codes).
- k8s.py: the Kubernetes client, the pod-log follower, and `CustomResourceLauncher` for jobs that are custom
  resources.
- jobset.py: the JobSet pods, failure rules and TF cluster env that TrainJob and JobSet share; `JobSetLauncher`
  (for clusters with JobSet but without Trainer v2).
- trainjob.py: the Kubeflow Trainer v2 TrainJob, the plain ClusterTrainingRuntime shipped in manifests/trainer/,
  and `TrainJobLauncher`: the default on GKE.
- frameworks/: each framework's launch facts, one module per framework: what its nodes run, how they meet, its
  Trainer runtime and policy, the legacy job kinds that run it;
  node.py: what a torch or JAX node runs (torchrun with the steps' exit codes; on Vertex AI, CLUSTER_SPEC turned
  into torchrun's or JAX's variables first).
- tfjob.py, pytorchjob.py: the Kubeflow Training Operator v1 TFJob and PyTorchJob (legacy: for clusters that
  still run it).
- vertex.py: the Vertex AI CustomJob and `VertexJobLauncher`.
- training.py: `launch_training`, what the train step's multi-node path calls; `training_job` (the job it runs,
  placed by the task's TaskConfig or the launch settings) and `job_manifests`.
- cli.py: `python -m components.launch` (a job from the command line, or `--dry-run` to print its manifests).

Adding a launcher is a manifest builder and a status reader: subclass `CustomResourceLauncher` (group, version,
plural, the pod whose log to stream, `resource_status`) or, for another API, `Launcher` (create, get, cancel,
status), and add it to training.py's `KUBERNETES_LAUNCHERS` / `launch_training`.
"""

from components.gcp.accelerators import VERTEX_MACHINES, vertex_machine_type
from components.launch.cli import main
from components.launch.job import Cancelled, JobOutcome, LaunchError, Launcher, TrainingJob, job_name
from components.launch.k8s import CustomResourceLauncher, LogFollower, kubernetes_client
from components.launch.jobset import JobSetLauncher, jobset_manifest, jobset_status
from components.launch.local_ssd import check_staging
from components.launch.network import check_network
from components.launch.frameworks import FRAMEWORKS
from components.launch.placement import (ACCELERATOR_NODE_LABEL, GPU_RESOURCE, KUEUE_QUEUE_LABEL, NODE_POOL_LABEL,
                                         SPOT_NODE_LABEL, Placement, SharedGpu, gpu_placement, node_resources,
                                         placement_from_task_config)
from components.launch.pytorchjob import PyTorchJobLauncher, pytorchjob_manifest, pytorchjob_status
from components.launch.tfjob import CONTAINER_NAME, TFJobLauncher, tfjob_manifest, tfjob_status
from components.launch.trainjob import (RUNTIME_NAME, TrainJobLauncher, runtime_manifest, trainjob_manifest,
                                        trainjob_status)
from components.launch.training import (KUBERNETES_LAUNCHERS, LAUNCHERS, LaunchSettings, copy_tree, job_manifests,
                                        launch_pipeline_training, launch_training, training_job)
from components.launch.vertex import VertexJobLauncher, custom_job

__all__ = [
    "ACCELERATOR_NODE_LABEL", "CONTAINER_NAME", "Cancelled", "CustomResourceLauncher", "FRAMEWORKS", "GPU_RESOURCE",
    "JobOutcome", "JobSetLauncher", "KUBERNETES_LAUNCHERS", "KUEUE_QUEUE_LABEL", "LAUNCHERS", "LaunchError",
    "LaunchSettings", "Launcher", "LogFollower", "NODE_POOL_LABEL", "Placement", "PyTorchJobLauncher",
    "RUNTIME_NAME", "SPOT_NODE_LABEL", "SharedGpu", "TFJobLauncher", "TrainJobLauncher", "TrainingJob",
    "VERTEX_MACHINES", "VertexJobLauncher", "check_network", "check_staging", "copy_tree", "custom_job", "gpu_placement",
    "job_manifests", "job_name", "jobset_manifest", "jobset_status", "kubernetes_client",
    "launch_pipeline_training", "launch_training", "main", "node_resources", "placement_from_task_config",
    "pytorchjob_manifest", "pytorchjob_status", "runtime_manifest", "tfjob_manifest", "tfjob_status",
    "training_job", "trainjob_manifest", "trainjob_status", "vertex_machine_type",
]
