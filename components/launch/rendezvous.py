"""`python -m components.launch.rendezvous --framework torch|jax -- COMMAND...`: on a Vertex AI CustomJob replica,
turns the cluster Vertex describes into the variables torchrun or jax.distributed read, then runs COMMAND in its
place (exec: signals and the exit code are COMMAND's own).

Vertex AI gives every replica of a distributed CustomJob CLUSTER_SPEC (and TF_CONFIG), "In your training code, you
can use the CLUSTER_SPEC or TF_CONFIG environment variables" (cloud.google.com/vertex-ai/docs/training/
distributed-training, #cluster-variables): `cluster` maps each worker pool (`workerpool0`, the primary replica;
`workerpool1`, the workers) to its replicas' `host:port`, `task` says which pool and index this replica is. The
primary is node 0 and worker k node k + 1; the primary's address (host and port) is the coordinator's, the port Vertex
opened between the replicas. Variables the environment already has are left as they are, so a platform that sets them
itself wins; a single replica (no CLUSTER_SPEC) runs COMMAND as it is.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

PRIMARY, WORKERS = "workerpool0", "workerpool1"


def node_of(cluster_spec: dict) -> tuple[int, int, str, int]:
    """(this node's rank, the number of nodes, the primary's host, its port) from Vertex AI's CLUSTER_SPEC."""
    cluster, task = cluster_spec.get("cluster") or {}, cluster_spec.get("task") or {}
    primary, workers = cluster.get(PRIMARY) or [], cluster.get(WORKERS) or []
    if len(primary) != 1:
        raise ValueError(f"CLUSTER_SPEC has {len(primary)} replicas in {PRIMARY}; the primary pool has exactly one")
    pool, index = task.get("type"), int(task.get("index", 0))
    if pool not in (PRIMARY, WORKERS):
        raise ValueError(f"CLUSTER_SPEC's task is in {pool!r}: only {PRIMARY} and {WORKERS} train")
    host, _, port = primary[0].rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"CLUSTER_SPEC's primary replica {primary[0]!r} is not host:port")
    return (0 if pool == PRIMARY else index + 1), 1 + len(workers), host, int(port)


def framework_env(framework: str, cluster_spec: dict, processes_per_node: int) -> dict[str, str]:
    """What torchrun (PET_*) or jax.distributed (JAX_*) read, for this replica of `cluster_spec`."""
    rank, nodes, host, port = node_of(cluster_spec)
    if framework == "torch":
        return {"PET_NNODES": str(nodes), "PET_NPROC_PER_NODE": str(processes_per_node), "PET_NODE_RANK": str(rank),
                "PET_MASTER_ADDR": host, "PET_MASTER_PORT": str(port)}
    if framework == "jax":
        return {"JAX_NUM_PROCESSES": str(nodes), "JAX_PROCESS_ID": str(rank),
                "JAX_COORDINATOR_ADDRESS": f"{host}:{port}"}
    raise ValueError(f"no rendezvous variables for framework {framework!r} (torch, jax)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--framework", required=True, choices=("torch", "jax"))
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the command to run after --")
    env = dict(os.environ)
    if env.get("CLUSTER_SPEC"):
        try:
            wanted = framework_env(args.framework, json.loads(env["CLUSTER_SPEC"]),
                                   int(env.get("PET_NPROC_PER_NODE", "1")))
        except (ValueError, TypeError) as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        for name, value in wanted.items():
            env.setdefault(name, value)
    sys.stdout.flush()
    os.execvpe(command[0], command, env)


if __name__ == "__main__":
    raise SystemExit(main())
