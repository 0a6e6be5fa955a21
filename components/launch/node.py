"""`python -m components.launch.node --framework torch|jax -- ARGS...`: what a torch or JAX training node runs.

It starts the framework's processes the framework's own way, after two things the platforms leave undone:

- Vertex AI gives every replica of a distributed CustomJob CLUSTER_SPEC (and TF_CONFIG): "In your training code,
  you can use the CLUSTER_SPEC or TF_CONFIG environment variables" (cloud.google.com/vertex-ai/docs/training/
  distributed-training, #cluster-variables). `cluster` maps each worker pool (`workerpool0`, the primary replica;
  `workerpool1`, the workers) to its replicas' `host:port`, `task` says which pool and index this replica is. The
  primary is node 0 and worker k node k + 1; the primary's address (host and port, the port Vertex opens between
  the replicas) is the coordinator's. From it this fills in torchrun's PET_* or jax.distributed's JAX_*. Variables
  the environment already has are left alone (Trainer v2, the Training Operator and our JobSet set them), and a
  single replica (no CLUSTER_SPEC) runs as it is.
- torch: ARGS are torchrun's (`-m components.train ...`), run by torchrun's own entry point
  (torch.distributed.run.main, what the `torchrun` command runs), which reads its options from PET_*. torchrun
  itself ends with exit code 1 whatever stopped it: on SIGTERM it forwards the signal to its processes (which
  write the preemption checkpoint and exit 143) and then raises SignalException; when a process fails it raises
  ChildFailedError. Here those become the exit codes of components/stepcli.py that the jobs' failure rules read:
  128 + the signal (143 after SIGTERM: retryable), or the first failed process's own code (2 bad input, 1 a bug:
  permanent; 128 + N when it was killed by signal N, e.g. 137 out of memory: retryable).
- jax: ARGS are Python's (`-m components.train ...`), exec'd with this Python: one process per node, which calls
  jax.distributed.initialize with JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES and JAX_PROCESS_ID.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from components.launch.frameworks import node_frameworks, setup

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
    """What torchrun (PET_*) or jax.distributed (JAX_*) read, for this replica of `cluster_spec`: the
    framework's rendezvous (its launch facts)."""
    facts = setup(framework)
    if not facts.node_runner:
        raise ValueError(f"no node variables for framework {framework!r} ({', '.join(node_frameworks())})")
    rank, nodes, host, port = node_of(cluster_spec)
    return facts.rendezvous(nodes=nodes, rank=str(rank), host=host, port=port, processes_per_node=processes_per_node)


def exit_code(code: int) -> int:
    """A process's exit status as a container reports it: 128 + N when killed by signal N (Python gives -N)."""
    return 128 - code if code < 0 else code


def torchrun(args: list[str]) -> int:
    """torchrun with `args`, its end as an exit code of the steps' contract (see the module docstring)."""
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import main

    try:
        main(args)
    except SignalException as e:
        return 128 + int(e.sigval)
    except ChildFailedError as e:
        _, failure = e.get_first_failure()
        return exit_code(failure.exitcode) or 1
    return 0


def exec_python(args: list[str]) -> int:
    """This Python with `args`, in place of this process (its exit code is the node's)."""
    sys.stdout.flush()
    os.execv(sys.executable, [sys.executable, *args])


NODE_RUNNERS = {"torchrun": torchrun, "python": exec_python}  # a framework's node_runner (its launch facts)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--framework", required=True, choices=node_frameworks())
    parser.add_argument("args", nargs=argparse.REMAINDER, help="-- torchrun's arguments (torch) or Python's (jax)")
    args = parser.parse_args(argv)
    rest = args.args[1:] if args.args[:1] == ["--"] else args.args
    if not rest:
        parser.error("give the arguments after --")
    facts = setup(args.framework)
    if os.environ.get("CLUSTER_SPEC"):
        try:
            wanted = framework_env(args.framework, json.loads(os.environ["CLUSTER_SPEC"]),
                                   int(os.environ.get(facts.process_count_env, "1")))
        except (ValueError, TypeError) as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        for name, value in wanted.items():
            os.environ.setdefault(name, value)
    return NODE_RUNNERS[facts.node_runner](rest)


if __name__ == "__main__":
    raise SystemExit(main())
