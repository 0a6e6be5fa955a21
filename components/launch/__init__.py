"""Launch: run training on several machines, as a Kubeflow TFJob (GKE) or a Vertex AI CustomJob, and follow it.

A pipeline step can only ask for one pod. For multi-node training the step instead creates a job that runs
the same image and the same training command on a chief and N workers (the platform sets `TF_CONFIG`, so
components/train/ picks MultiWorkerMirroredStrategy), follows its status and the chief's log, fails when
the job fails, and deletes (cancels) the job when it is itself stopped: a cancelled pipeline run sends
SIGTERM to the step's pod, and a GPU job must not outlive the run that asked for it.

- placement.py: GPU placement (`gpu_placement`): node selector, tolerations, Spot, node pool, Kueue label;
  shared with the single-pod path of the pipeline.
- job.py: `TrainingJob`, `job_name`, and `Launcher`, which runs any kind of job on components/gcp's
  `follow_job` (polling, progress lines, cancel on SIGTERM/timeout/failure, errors and exit codes).
- k8s.py: the Kubernetes client, the pod-log follower, and `CustomResourceLauncher` for jobs that are custom
  resources.
- tfjob.py: the TFJob manifest, its status reader and `TFJobLauncher`.
- vertex.py: the Vertex AI CustomJob and `VertexJobLauncher`.
- training.py: `launch_training`, what the train step's multi-node path calls.
- cli.py: `python -m components.launch` (a TFJob from the command line).

Adding a launcher (e.g. a Kubeflow Trainer v2 TrainJob) is a manifest builder and a status reader: subclass
`CustomResourceLauncher` (group, version, plural, the pod whose log to stream, `resource_status`) or, for
another API, `Launcher` (create, get, cancel, status), and add it to `launch_training`.
"""

from components.gcp.accelerators import VERTEX_MACHINES, vertex_machine_type
from components.launch.cli import main
from components.launch.job import Cancelled, JobOutcome, LaunchError, Launcher, TrainingJob, job_name
from components.launch.k8s import CustomResourceLauncher, LogFollower, kubernetes_client
from components.launch.placement import (ACCELERATOR_NODE_LABEL, GPU_RESOURCE, KUEUE_QUEUE_LABEL, NODE_POOL_LABEL,
                                         SPOT_NODE_LABEL, Placement, gpu_placement)
from components.launch.tfjob import CONTAINER_NAME, TFJobLauncher, tfjob_manifest, tfjob_status
from components.launch.training import LAUNCHERS, LaunchSettings, copy_tree, launch_training
from components.launch.vertex import VertexJobLauncher, custom_job

__all__ = [
    "ACCELERATOR_NODE_LABEL", "CONTAINER_NAME", "Cancelled", "CustomResourceLauncher", "GPU_RESOURCE",
    "JobOutcome", "KUEUE_QUEUE_LABEL", "LAUNCHERS", "LaunchError", "LaunchSettings", "Launcher", "LogFollower", "NODE_POOL_LABEL",
    "Placement", "SPOT_NODE_LABEL", "TFJobLauncher", "TrainingJob", "VERTEX_MACHINES", "VertexJobLauncher",
    "copy_tree", "custom_job", "gpu_placement", "job_name", "kubernetes_client", "launch_training", "main",
    "tfjob_manifest", "tfjob_status", "vertex_machine_type",
]
