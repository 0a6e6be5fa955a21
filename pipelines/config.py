"""Images, accelerators and node-pool labels: the pipeline's compile-time settings.

Nothing here is read from the environment: images are passed in when compiling (`pipectl compile
--image-repo R --image-tag T`, or `--cpu-image`/`--gpu-image` with digests), so a compiled pipeline is
pinned to exactly the images it names.
"""

from __future__ import annotations

import dataclasses

# The known accelerators (GKE label value -> Vertex AI accelerator type), GKE's node label for a pool's
# accelerator, the resource GPUs are requested as, and Kueue's queue label are facts the steps use too: they live
# in components/ (one table) and the pipeline reads them from there.
from components.gcp.accelerators import ACCELERATORS  # noqa: F401
from components.launch.placement import ACCELERATOR_NODE_LABEL, GPU_RESOURCE, KUEUE_QUEUE_LABEL  # noqa: F401
from components.launch.local_ssd import check_size
from components.launch.placement import SHARING_STRATEGIES, SharedGpu  # noqa: F401
# The TrainJob's default runtime: the plain ClusterTrainingRuntime shipped in manifests/trainer/.
from components.launch.trainjob import RUNTIME_NAME as DEFAULT_TRAIN_RUNTIME  # noqa: F401
# The reference setup: training on a T4 pool, batch prediction on an H100 pool (components/params.py).
from components.params import DEFAULT_PREDICT_ACCELERATOR, DEFAULT_TRAIN_ACCELERATOR  # noqa: F401
from components.params import FRAMEWORKS, default as parameter_default
# The serving container's version and its name in the image repository: the Vertex registry's (one place).
from components.registry.vertex import TF_SERVING_IMAGE_NAME, TF_SERVING_VERSION

DEFAULT_IMAGE_REPO = "localhost/kfp-image-classification"
DEFAULT_IMAGE_TAG = "dev"
CPU_IMAGE_NAME = "cpu"
GPU_IMAGE_NAME = "gpu"
TORCH_IMAGE_NAME = "torch"

TARGETS = ("kfp", "vertex")
GCS_FUSE_MOUNT = "/mnt/gcs"  # not under /gcs/, where the KFP launcher downloads gs:// artifacts (LocalPathForURI)
# The annotation that makes GKE inject the GCS FUSE CSI driver's sidecar into a pod
# (https://cloud.google.com/kubernetes-engine/docs/how-to/cloud-storage-fuse-csi-driver-pv).
GCS_FUSE_ANNOTATION = ("gke-gcsfuse/volumes", "true")
# The volume of the GCS FUSE sidecar's file cache: a pod volume of this name replaces the sidecar's own emptyDir
# (gcs-fuse-csi-driver v1.24.4, pkg/webhook/sidecar_spec.go:35 and mutatingwebhook.go:362-363); on a node pool with
# --ephemeral-storage-local-ssd, an emptyDir is on the local SSDs.
GCS_FUSE_CACHE_VOLUME = "gke-gcsfuse-cache"
GCS_FUSE_CACHE_MOUNT = "/gcsfuse-cache"  # where the sidecar mounts it (sidecar_spec.go:36); unused in the step
DATA_ROOT_UNDER_MOUNT = "kfp-data"
# Where training runs: "pod" trains in the pipeline task's own pod; "trainjob" launches a Kubeflow Trainer v2
# TrainJob (chief + workers) on the cluster, "jobset" the same pods as a JobSet where Trainer v2 is not installed,
# "tfjob" a legacy Kubeflow Training Operator v1 TFJob; "vertex-job" launches a Vertex AI CustomJob with worker pools.
CLUSTER_LAUNCHERS = ("trainjob", "jobset", "tfjob", "pytorchjob")  # pytorchjob: for framework torch
TRAIN_LAUNCHERS = ("pod", *CLUSTER_LAUNCHERS, "vertex-job")


@dataclasses.dataclass(frozen=True)
class Images:
    cpu: str
    gpu: str
    # What serves registered models on Vertex AI (the register step's `serving_image`): TensorFlow Serving, copied
    # into the image repository by Cloud Build (components/registry/vertex.py); empty: the registry's default.
    serving: str = ""
    # The TensorFlow-free image (images/Dockerfile's torch target: torch and JAX): training, evaluation and batch
    # prediction of runs with framework torch or jax, on KFP backends (components/step_images.py); empty: such
    # runs are refused at their start.
    torch: str = ""

    def pinned(self) -> dict[str, str]:
        """What the image-choosing step picks from (components/step_images.py)."""
        return {"cpu": self.cpu, "gpu": self.gpu, "torch": self.torch}

    @classmethod
    def from_repo(cls, repo: str = DEFAULT_IMAGE_REPO, tag: str = DEFAULT_IMAGE_TAG) -> "Images":
        repo = repo.rstrip("/")
        return cls(cpu=f"{repo}/{CPU_IMAGE_NAME}:{tag}", gpu=f"{repo}/{GPU_IMAGE_NAME}:{tag}",
                   serving=f"{repo}/{TF_SERVING_IMAGE_NAME}:{TF_SERVING_VERSION}",
                   torch=f"{repo}/{TORCH_IMAGE_NAME}:{tag}")


def check_accelerator(accelerator: str) -> str:
    if accelerator not in ACCELERATORS:
        raise ValueError(f"Unknown accelerator {accelerator!r}; known GKE accelerators: {', '.join(ACCELERATORS)}")
    return accelerator


@dataclasses.dataclass(frozen=True)
class PipelineSettings:
    """Compile-time choices: which images, which platform, which GPU pools."""

    images: Images = dataclasses.field(default_factory=Images.from_repo)
    target: str = "kfp"  # "kfp": GKE node selectors via kfp-kubernetes; "vertex": Vertex AI machine selection
    train_accelerator: str = DEFAULT_TRAIN_ACCELERATOR
    train_gpus: int = 1
    predict_accelerator: str = DEFAULT_PREDICT_ACCELERATOR
    predict_gpus: int = 1
    # A share of one GPU for batch prediction (GKE node pool labels; docs/cluster-setup.md): compile-time, as the
    # prediction accelerator is. Training's share is chosen per run (train_gpu_partition, train_gpu_sharing).
    predict_gpu_partition: str = ""
    predict_gpu_sharing: str = ""
    predict_max_shared_clients: int = 0
    train_retries: int = 3
    train_launcher: str = "pod"  # see TRAIN_LAUNCHERS
    train_namespace: str = "kubeflow"  # where the training job is created (the pipeline's namespace on Kubeflow)
    train_runtime: str = DEFAULT_TRAIN_RUNTIME  # the TrainJob's ClusterTrainingRuntime (train_launcher=trainjob)
    kueue_queue: str = ""  # Kueue LocalQueue for the GPU pods and the TFJob (empty: not queued by Kueue)
    # A bucket mounted into the data-heavy steps with the GCS FUSE CSI driver: the PersistentVolumeClaim bound to it
    # (manifests/gcsfuse/) and where it is mounted; the run's data_root defaults to a folder of that mount.
    gcs_fuse_pvc: str = ""
    gcs_fuse_mount: str = GCS_FUSE_MOUNT
    # The size of the GCS FUSE file cache's volume (a Kubernetes quantity, e.g. 50Gi): an emptyDir of that size named
    # gke-gcsfuse-cache in each data-heavy step; the PersistentVolume's file-cache:max-size-mb must stay below it.
    gcs_fuse_cache: str = ""
    # Vertex AI Pipelines runs the images fixed at compile time, so there the framework (and with it the images of
    # training, evaluation and batch prediction: components/step_images.py) is chosen when compiling; empty: the
    # run parameter's default. On a KFP backend a step picks the images per run, and this stays empty.
    framework: str = ""

    def __post_init__(self):
        if self.target not in TARGETS:
            raise ValueError(f"Unknown target {self.target!r}; known: {', '.join(TARGETS)}")
        if self.framework and self.framework not in FRAMEWORKS:
            raise ValueError(f"framework must be one of {', '.join(FRAMEWORKS)}, got {self.framework!r}")
        if self.framework and self.target != "vertex":
            raise ValueError(f"On a KFP backend the framework is chosen per run (a step picks its images): pass "
                             f"--framework {self.framework} to `pipectl run`, or compile with --target vertex, "
                             "where it is fixed when compiling")
        if self.train_launcher not in TRAIN_LAUNCHERS:
            raise ValueError(f"Unknown train launcher {self.train_launcher!r}; known: {', '.join(TRAIN_LAUNCHERS)}")
        if self.target == "vertex" and self.train_launcher in CLUSTER_LAUNCHERS:
            raise ValueError(f"--train-launcher {self.train_launcher} creates a job on the Kubernetes cluster that "
                             "runs the pipeline; on Vertex AI use pod or vertex-job")
        if self.gcs_fuse_pvc:
            if self.target != "kfp":
                raise ValueError("--gcs-fuse-pvc mounts a PersistentVolumeClaim of the cluster, which only a KFP "
                                 "backend has; on Vertex AI Pipelines artifacts already live on a GCS FUSE mount")
            if self.train_launcher != "pod":
                raise ValueError(f"--gcs-fuse-pvc mounts the bucket into the pipeline's own pods; the nodes of "
                                 f"--train-launcher {self.train_launcher} do not mount it, so they could not read "
                                 "the shards there. Use --train-launcher pod, or no mount and a gs:// data_root")
            if self.gcs_fuse_cache:
                check_size(self.gcs_fuse_cache, "--gcs-fuse-cache")
            if not self.gcs_fuse_mount.startswith("/") or self.gcs_fuse_mount.rstrip("/") in ("", "/gcs"):
                raise ValueError(f"--gcs-fuse-mount must be an absolute path other than / and /gcs (where the KFP "
                                 f"launcher puts gs:// artifacts), got {self.gcs_fuse_mount!r}")
        if self.gcs_fuse_cache and not self.gcs_fuse_pvc:
            raise ValueError("--gcs-fuse-cache sizes the file cache of the GCS FUSE mount: give --gcs-fuse-pvc too")
        check_accelerator(self.train_accelerator)
        check_accelerator(self.predict_accelerator)
        if self.train_gpus < 0 or self.predict_gpus < 0:
            raise ValueError("GPU counts must be >= 0")
        self.predict_shared_gpu.check(self.predict_accelerator, self.predict_gpus, launcher=self.pod_launcher,
                                      what="batch prediction")

    @property
    def compiled_framework(self) -> str:
        """The framework fixed into a pipeline for Vertex AI (the run parameter's default unless chosen)."""
        return self.framework or parameter_default("framework")

    @property
    def predict_shared_gpu(self) -> SharedGpu:
        return SharedGpu(self.predict_gpu_partition, self.predict_gpu_sharing, self.predict_max_shared_clients)

    @property
    def pod_launcher(self) -> str:
        """What creates a step's own pod, as the shared GPU checks name it: the KFP driver, or Vertex AI."""
        return "pod" if self.target == "kfp" else "vertex"

    @property
    def train_placement_launcher(self) -> str:
        """What creates the training pods, as the shared GPU checks name it."""
        return self.train_launcher if self.train_launcher != "pod" else self.pod_launcher

    @property
    def by_reference(self) -> bool:
        """On a KFP backend the launcher copies artifacts whole in and out of each pod, so the data-heavy steps
        write their data outside the artifacts (components/dataio/datadir.py); Vertex AI mounts them (GCS FUSE)."""
        return self.target == "kfp"

    @property
    def default_data_root(self) -> str:
        return f"{self.gcs_fuse_mount.rstrip('/')}/{DATA_ROOT_UNDER_MOUNT}" if self.gcs_fuse_pvc else ""
