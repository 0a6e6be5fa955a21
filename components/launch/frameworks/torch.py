"""PyTorch's launch facts: torchrun with `-m components.train --framework torch` on every node, through `python -m
components.launch.node` (node.py: torchrun's own entry point, with its exit codes made the steps' contract).

torchrun reads its options from the PET_* variables (torch.distributed.run: every option's default is the
environment variable PET_<OPTION>): PET_NNODES, PET_NPROC_PER_NODE, PET_NODE_RANK, PET_MASTER_ADDR,
PET_MASTER_PORT; it starts PET_NPROC_PER_NODE processes (one per GPU, one on CPU) with RANK, WORLD_SIZE,
LOCAL_RANK, MASTER_ADDR and MASTER_PORT, which the training step's DDP reads. Trainer v2's torch plugin
(kubeflow/trainer v2.3.0, pkg/runtime/framework/plugins/torch/torch.go:145-166) and the Training Operator's
PyTorchJob (kubeflow/trainer v1.9.4, pkg/controller.v1/pytorch/envvar.go:85-123, master.go:44-59) set the PET_*
variables; on a bare JobSet `jobset_env` sets the same from the pod's completion index; on Vertex AI node.py derives
them from CLUSTER_SPEC.
"""

from __future__ import annotations

import dataclasses

from components.launch.frameworks.base import LaunchFacts

TORCHRUN_ENV = ("PET_NNODES", "PET_NPROC_PER_NODE", "PET_NODE_RANK", "PET_MASTER_ADDR", "PET_MASTER_PORT")


@dataclasses.dataclass(frozen=True)
class TorchFacts(LaunchFacts):
    def rendezvous(self, *, nodes: int, rank: str | dict, host: str, port: int,
                   processes_per_node: int) -> dict[str, str | dict]:
        """torchrun's PET_* (torch.go:145-166)."""
        return dict(zip(TORCHRUN_ENV, (str(nodes), str(processes_per_node), rank, host, str(port))))


FACTS = TorchFacts(name="torch", training="PyTorch DDP under torchrun", runtime="torch-multinode",
                   trainer_policy="torch", legacy_launchers=("pytorchjob",), node_runner="torchrun",
                   process_count_env="PET_NPROC_PER_NODE")
