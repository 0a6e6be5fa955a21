"""How each framework's nodes find each other: the one place the launchers ask which framework a job trains with.

Each framework starts its processes and forms its group its own native way, and each platform hands a node its
place in the group differently. `NodeSetup` says, for one framework, what every node runs and the variables it
needs where the platform does not set them itself:

- tensorflow: `python -m components.train` on every node; MultiWorkerMirroredStrategy reads TF_CONFIG, which TFJob
  and Vertex AI set and which a JobSet/TrainJob node builds from TRAINING_NODE_HOSTS and TRAINING_NODE_INDEX
  (jobset.cluster_env, components/train/cluster.py).
- torch: torchrun with `-m components.train --framework torch` on every node, through `python -m
  components.launch.node` (node.py: torchrun's own entry point, with its exit codes made the steps' contract).
  torchrun reads its options from the PET_* variables (torch.distributed.run: every option's default is the
  environment variable PET_<OPTION>): PET_NNODES, PET_NPROC_PER_NODE, PET_NODE_RANK, PET_MASTER_ADDR,
  PET_MASTER_PORT; it starts PET_NPROC_PER_NODE processes (one per GPU, one on CPU) with RANK, WORLD_SIZE,
  LOCAL_RANK, MASTER_ADDR and MASTER_PORT, which the training step's DDP reads. Trainer v2's torch plugin
  (kubeflow/trainer v2.3.0, pkg/runtime/framework/plugins/torch/torch.go:145-166) and the Training Operator's
  PyTorchJob (kubeflow/trainer v1.9.4, pkg/controller.v1/pytorch/envvar.go:85-123, master.go:44-59) set the PET_*
  variables; on a bare JobSet `torch_env` sets the same from the pod's completion index; on Vertex AI node.py
  derives them from CLUSTER_SPEC.
- jax: `python -m components.train --framework jax` on every node, through node.py too, one process per node (JAX
  drives all the node's GPUs), which calls jax.distributed.initialize with JAX_COORDINATOR_ADDRESS,
  JAX_NUM_PROCESSES and JAX_PROCESS_ID: Trainer v2's JAX plugin sets them
  (pkg/runtime/framework/plugins/jax/jax.go:76-97), `jax_env` the same on a bare JobSet, node.py on Vertex AI.
"""

from __future__ import annotations

import dataclasses

from components.params import FRAMEWORKS  # noqa: F401 (the one list of frameworks; launchers read it from here)

TRAIN_MODULE = "components.train"
NODE_MODULE = "components.launch.node"
# Trainer v2's port for the nodes' own traffic (torch's c10d store, JAX's coordinator): kubeflow/trainer v2.3.0
# pkg/constants/constants.go:72 ContainerTrainerPort.
TRAINER_PORT = 29500
COMPLETION_INDEX_FIELD = "metadata.annotations['batch.kubernetes.io/job-completion-index']"
TORCHRUN_ENV = ("PET_NNODES", "PET_NPROC_PER_NODE", "PET_NODE_RANK", "PET_MASTER_ADDR", "PET_MASTER_PORT")


def check_framework(framework: str) -> str:
    if framework not in FRAMEWORKS:
        raise ValueError(f"framework must be one of {', '.join(FRAMEWORKS)}, got {framework!r}")
    return framework


def _train_args(command: list[str]) -> list[str]:
    """The training CLI's arguments in `command` (`python -m components.train ARGS`)."""
    if len(command) < 3 or command[1:3] != ["-m", TRAIN_MODULE]:
        raise ValueError(f"a torch or JAX job runs the training step (`python -m {TRAIN_MODULE} ...`), not "
                         f"{' '.join(command[:3])!r}")
    return list(command[3:])


def _with_framework(args: list[str], framework: str) -> list[str]:
    """`args` naming `framework`: added when they name none; refused when they name another."""
    named = [args[k + 1] if k + 1 < len(args) else "" for k, arg in enumerate(args) if arg == "--framework"]
    named += [arg.split("=", 1)[1] for arg in args if arg.startswith("--framework=")]
    if any(other != framework for other in named):
        raise ValueError(f"the training command trains with --framework {named[0]!r}, but the job is launched for "
                         f"{framework!r}: give both the same framework")
    return args if named else [*args, "--framework", framework]


@dataclasses.dataclass(frozen=True)
class NodeSetup:
    """One framework's way of starting a node (torchrun starts one process per GPU, one on CPU:
    TrainingJob.processes_per_node)."""

    framework: str

    def node_command(self, train_command: list[str]) -> list[str]:
        """What each node runs for the training command `train_command` (`python -m components.train ...`): for
        torch and JAX, node.py with torchrun's or Python's arguments (`-m components.train ... --framework F`)."""
        if self.framework == "tensorflow":
            if train_command[1:3] == ["-m", TRAIN_MODULE]:  # a training command that names torch or JAX is refused
                _with_framework(list(train_command[3:]), self.framework)
            return list(train_command)
        args = _with_framework(_train_args(train_command), self.framework)
        return [train_command[0], "-m", NODE_MODULE, "--framework", self.framework, "--", "-m", TRAIN_MODULE, *args]


def setup(framework: str) -> NodeSetup:
    return NodeSetup(check_framework(framework))


def coordinator_host(name: str) -> str:
    """Node 0's address in a JobSet (or TrainJob) `name`: its pod hostname in the JobSet's headless Service, as
    Trainer's torch and JAX plugins name it (`{trainjob}-node-0-0.{trainjob}`, torch.go:162, jax.go:92)."""
    return f"{name}-node-0-0.{name}"


def torch_env(name: str, nodes: int, processes_per_node: int) -> list[dict]:
    """The PET_* variables torchrun reads, for the nodes of JobSet `name`: what Trainer v2.3.0's torch plugin sets
    (torch.go:145-166), the node rank from the pod's completion index."""
    return [{"name": "PET_NNODES", "value": str(nodes)},
            {"name": "PET_NPROC_PER_NODE", "value": str(processes_per_node)},
            {"name": "PET_NODE_RANK", "valueFrom": {"fieldRef": {"fieldPath": COMPLETION_INDEX_FIELD}}},
            {"name": "PET_MASTER_ADDR", "value": coordinator_host(name)},
            {"name": "PET_MASTER_PORT", "value": str(TRAINER_PORT)}]


def jax_env(name: str, nodes: int) -> list[dict]:
    """jax.distributed's variables for the nodes of JobSet `name`: what Trainer v2.3.0's JAX plugin sets
    (jax.go:76-97)."""
    return [{"name": "JAX_NUM_PROCESSES", "value": str(nodes)},
            {"name": "JAX_PROCESS_ID", "valueFrom": {"fieldRef": {"fieldPath": COMPLETION_INDEX_FIELD}}},
            {"name": "JAX_COORDINATOR_ADDRESS", "value": f"{coordinator_host(name)}:{TRAINER_PORT}"}]
