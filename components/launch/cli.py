"""`python -m components.launch`: launch a TFJob from the command line (in-cluster or with the local kubeconfig).

Exit codes are the steps' contract (components/stepcli.py): 0 succeeded, 143 stopped (SIGTERM; the job was
deleted), 2 bad input or a job that failed, 1 a bug.
"""

from __future__ import annotations

import argparse
import dataclasses

from components import stepcli
from components.gcp.accelerators import ACCELERATORS
from components.launch.job import TrainingJob
from components.launch.k8s import kubernetes_client
from components.launch.placement import gpu_placement
from components.launch.tfjob import TFJobLauncher, tfjob_manifest


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Run a training command as a Kubeflow TFJob and follow it.")
    parser.add_argument("--name", required=True)
    parser.add_argument("--namespace", default="kubeflow")
    parser.add_argument("--image", required=True)
    parser.add_argument("--workers", type=int, default=1, help="workers besides the chief")
    parser.add_argument("--accelerator", default="nvidia-tesla-t4")
    parser.add_argument("--gpus", type=int, default=0)
    parser.add_argument("--spot", action="store_true")
    parser.add_argument("--node-pool", default="")
    parser.add_argument("--kueue-queue", default="")
    parser.add_argument("--known-accelerators", default=",".join(ACCELERATORS))
    parser.add_argument("--api-server", help="Kubernetes API URL (default: in-cluster, else ~/.kube/config)")
    parser.add_argument("--poll-seconds", type=float, default=10.0)
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- the training command")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command

    def launch() -> dict:
        placement = gpu_placement(args.accelerator, args.gpus, known_accelerators=args.known_accelerators.split(","),
                                  spot=args.spot, node_pool=args.node_pool)
        job = TrainingJob(name=args.name, image=args.image, command=command, workers=args.workers,
                          placement=placement, kueue_queue=args.kueue_queue)
        launcher = TFJobLauncher(kubernetes_client(args.api_server), args.namespace, poll_seconds=args.poll_seconds)
        return dataclasses.asdict(launcher.run(tfjob_manifest(job, args.namespace)))

    return stepcli.run(launch)
