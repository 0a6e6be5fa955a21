"""JAX's launch facts: `python -m components.train --framework jax` on every node, through node.py, one process per
node (JAX drives all the node's GPUs), which calls jax.distributed.initialize with JAX_COORDINATOR_ADDRESS,
JAX_NUM_PROCESSES and JAX_PROCESS_ID: Trainer v2's JAX plugin sets them (pkg/runtime/framework/plugins/jax/
jax.go:76-97), `jobset_env` the same on a bare JobSet, node.py on Vertex AI. No legacy job kind runs JAX."""

from __future__ import annotations

import dataclasses

from components.launch.frameworks.base import LaunchFacts


@dataclasses.dataclass(frozen=True)
class JaxFacts(LaunchFacts):
    def rendezvous(self, *, nodes: int, rank: str | dict, host: str, port: int,
                   processes_per_node: int) -> dict[str, str | dict]:
        """jax.distributed's JAX_* (jax.go:76-97)."""
        return {"JAX_NUM_PROCESSES": str(nodes), "JAX_PROCESS_ID": rank, "JAX_COORDINATOR_ADDRESS": f"{host}:{port}"}


FACTS = JaxFacts(name="jax", training="JAX multi-process training", runtime="jax-multinode", trainer_policy="jax",
                 node_runner="python")
