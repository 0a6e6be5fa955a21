"""What the launchers ask of a framework: `LaunchFacts`, given once per framework (tensorflow.py, torch.py, jax.py).

The launchers (trainjob.py, jobset.py, vertex.py, tfjob.py, pytorchjob.py, node.py, cli.py, training.py) read these
facts and never ask which framework a job trains with: a node's command and process count, the variables through
which its nodes meet (their rendezvous), the Trainer v2 runtime and its policy, and the legacy job kinds that run it.
"""

from __future__ import annotations

import copy
import dataclasses

TRAIN_MODULE = "components.train"
NODE_MODULE = "components.launch.node"
# The replicated job (and its container) of a JobSet or a TrainJob's runtime: the name Trainer v2's trainer step
# overrides (jobset.py).
NODE = "node"
# Trainer v2's port for the nodes' own traffic (torch's c10d store, JAX's coordinator): kubeflow/trainer v2.3.0
# pkg/constants/constants.go:72 ContainerTrainerPort.
TRAINER_PORT = 29500
COMPLETION_INDEX_FIELD = "metadata.annotations['batch.kubernetes.io/job-completion-index']"
# A pod's node rank on a JobSet: its completion index, through the Downward API.
COMPLETION_INDEX = {"fieldRef": {"fieldPath": COMPLETION_INDEX_FIELD}}
# The launchers that run every framework; a framework adds the legacy job kinds that run it (`legacy_launchers`).
COMMON_LAUNCHERS = ("trainjob", "jobset", "vertex-job")


def node_host(name: str, index: int) -> str:
    """Node `index`'s address in a JobSet (or TrainJob) `name`: its pod hostname `{jobset}-{replicated job}-{job
    index}-{completion index}` in the JobSet's headless Service, whose subdomain is the name."""
    return f"{name}-{NODE}-0-{index}.{name}"


def coordinator_host(name: str) -> str:
    """Node 0's address in a JobSet (or TrainJob) `name`, as Trainer's torch and JAX plugins name it
    (`{trainjob}-node-0-0.{trainjob}`, torch.go:162, jax.go:92)."""
    return node_host(name, 0)


def env_list(variables: dict) -> list[dict]:
    """`variables` as a container's env list, in their order: a dict value is a `valueFrom` (a copy of it: no two
    manifests share one)."""
    return [{"name": name, "valueFrom": copy.deepcopy(value)} if isinstance(value, dict) else
            {"name": name, "value": value}
            for name, value in variables.items()]


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
class LaunchFacts:
    """One framework's launch facts. A subclass (one per framework module) fills in the fields and, where its nodes
    meet through a coordinator, `rendezvous`."""

    name: str  # the framework (components.params.FRAMEWORKS)
    training: str  # what its nodes do, in words ("PyTorch DDP under torchrun")
    runtime: str  # its ClusterTrainingRuntime in manifests/trainer/ (trainjob.py)
    # Trainer v2's ML policy (an MLPolicySource member) whose plugin gives its nodes their rendezvous; empty: a plain
    # runtime (Trainer's PlainML plugin), and the TrainJob brings the node variables itself (`jobset_env`).
    trainer_policy: str = ""
    legacy_launchers: tuple[str, ...] = ()  # the Training Operator v1 kinds that run it (training.py's launchers)
    # How node.py starts a node's processes: "torchrun" (one per GPU) or "python" (one per node); empty: each node
    # runs the training command itself.
    node_runner: str = ""
    # The variable that tells the node's launcher how many processes to start (torchrun's PET_NPROC_PER_NODE, which
    # a TrainJob sets through `numProcPerNode` and a PyTorchJob through `nprocPerNode`); empty: one process per
    # node drives all its GPUs.
    process_count_env: str = ""
    node_port: tuple[str, int] = ("rendezvous", TRAINER_PORT)  # the node container's port for the nodes' traffic

    @property
    def launchers(self) -> tuple[str, ...]:
        """Every launcher that runs this framework."""
        return (*COMMON_LAUNCHERS, *self.legacy_launchers)

    @property
    def runtime_kind(self) -> str:
        """What its runtime is called in messages: its policy's name, or plain."""
        return self.trainer_policy or "plain"

    def node_command(self, train_command: list[str]) -> list[str]:
        """What each node runs for the training command `train_command` (`python -m components.train ...`): with a
        node runner, node.py with torchrun's or Python's arguments (`-m components.train ... --framework F`)."""
        if not self.node_runner:
            if train_command[1:3] == ["-m", TRAIN_MODULE]:  # a training command that names another is refused
                _with_framework(list(train_command[3:]), self.name)
            return list(train_command)
        args = _with_framework(_train_args(train_command), self.name)
        return [train_command[0], "-m", NODE_MODULE, "--framework", self.name, "--", "-m", TRAIN_MODULE, *args]

    def process_env(self, processes_per_node: int) -> dict[str, str]:
        """The node's process count as its launcher reads it, where the platform does not set it (Vertex AI)."""
        return {self.process_count_env: str(processes_per_node)} if self.process_count_env else {}

    def rendezvous(self, *, nodes: int, rank: str | dict, host: str, port: int,
                   processes_per_node: int) -> dict[str, str | dict]:
        """The variables through which node `rank` of `nodes` finds the coordinator at `host:port`, in the order the
        framework's Trainer plugin sets them; `rank` a value or a `valueFrom`. ValueError for a framework whose
        platforms set its cluster themselves (TensorFlow's TF_CONFIG)."""
        raise ValueError(f"no node variables for framework {self.name!r}")

    def jobset_env(self, name: str, nodes: int, processes_per_node: int) -> list[dict]:
        """What each node of JobSet `name` needs to find the others: the rendezvous, node 0 the coordinator on
        Trainer's port, each node's rank its completion index (what Trainer's plugin would set)."""
        return env_list(self.rendezvous(nodes=nodes, rank=COMPLETION_INDEX, host=coordinator_host(name),
                                        port=TRAINER_PORT, processes_per_node=processes_per_node))

    def trainjob_env(self, name: str, nodes: int, processes_per_node: int) -> list[dict]:
        """What a TrainJob sets for its nodes to meet: nothing where the runtime's policy sets it (its webhook
        refuses a TrainJob that sets the PET_* itself: torch.go:65-77), else the JobSet's variables."""
        return [] if self.trainer_policy else self.jobset_env(name, nodes, processes_per_node)

    def ports(self) -> list[dict]:
        port_name, port = self.node_port
        return [{"name": port_name, "containerPort": port}]
