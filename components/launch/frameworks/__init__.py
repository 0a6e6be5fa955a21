"""How each framework's nodes are launched: the one place the launchers learn what differs between frameworks.

Each framework starts its processes and forms its group its own native way, and each platform hands a node its
place in the group differently. One interface, one module per framework (as components/train/frameworks/ for the
training loop): `base.LaunchFacts` is what the launchers ask of a framework, and `tensorflow.py`, `torch.py` and
`jax.py` each give it once:

- a node's command and process count (`node_command`, `node_runner`, `process_count_env`): TensorFlow nodes run the
  training command; torch nodes torchrun (one process per GPU) and JAX nodes Python (one process per node), both
  through node.py;
- how its nodes meet (`rendezvous`, `jobset_env`, `trainjob_env`, `node_port`): TF_CONFIG for TensorFlow (built by
  each node from TRAINING_NODE_HOSTS and TRAINING_NODE_INDEX, components/train/cluster.py), torchrun's PET_* for
  torch, jax.distributed's JAX_* for JAX;
- its Trainer v2 runtime and policy (`runtime`, `trainer_policy`): plain for TensorFlow, Trainer's torch and jax
  policies for the others;
- the legacy Training Operator v1 job kinds that run it (`legacy_launchers`): TFJob for TensorFlow, PyTorchJob for
  torch, none for JAX.

The launchers (jobset.py, trainjob.py, vertex.py, tfjob.py, pytorchjob.py, node.py, cli.py, training.py) read these
facts and never compare a framework's name (tests/test_launch_frameworks.py holds them to it).
"""

from __future__ import annotations

import importlib

from components.launch.frameworks.base import NODE, LaunchFacts  # noqa: F401 (NODE: the JobSet's replicated job)
from components.launch.frameworks.torch import TORCHRUN_ENV  # noqa: F401
from components.params import FRAMEWORKS  # the one list of frameworks; launchers read it from here

DEFAULT_FRAMEWORK = FRAMEWORKS[0]


def check_framework(framework: str) -> str:
    if framework not in FRAMEWORKS:
        raise ValueError(f"framework must be one of {', '.join(FRAMEWORKS)}, got {framework!r}")
    return framework


def setup(framework: str) -> LaunchFacts:
    """The launch facts of `framework` (its module's FACTS)."""
    return importlib.import_module(f"{__name__}.{check_framework(framework)}").FACTS


def legacy_launchers() -> dict[str, tuple[str, ...]]:
    """Each legacy job kind's launcher and the frameworks it runs (the other launchers run them all)."""
    runs: dict[str, tuple[str, ...]] = {}
    for framework in FRAMEWORKS:
        for launcher in setup(framework).legacy_launchers:
            runs[launcher] = (*runs.get(launcher, ()), framework)
    return runs


def node_frameworks() -> tuple[str, ...]:
    """The frameworks whose nodes node.py starts."""
    return tuple(framework for framework in FRAMEWORKS if setup(framework).node_runner)
