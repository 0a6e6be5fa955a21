"""TensorFlow's launch facts: `python -m components.train` on every node; MultiWorkerMirroredStrategy reads
TF_CONFIG, which TFJob and Vertex AI set and which a JobSet/TrainJob node builds from TRAINING_NODE_HOSTS and
TRAINING_NODE_INDEX (`cluster_env`, components/train/cluster.py). Its TrainJob runtime is plain (no Trainer policy
would give it TF_CONFIG), so the TrainJob brings those two variables itself."""

from __future__ import annotations

import dataclasses

from components.launch.frameworks.base import COMPLETION_INDEX, LaunchFacts, env_list, node_host
from components.train.cluster import HOSTS_ENV, INDEX_ENV

TRAINING_PORT = 2222  # TensorFlow's gRPC port between the nodes (the TFJob default)


def node_hosts(name: str, nodes: int) -> list[str]:
    """Every node's address: its pod hostname in the JobSet's headless Service (the subdomain is the name)."""
    return [f"{node_host(name, k)}:{TRAINING_PORT}" for k in range(nodes)]


def cluster_env(name: str, nodes: int) -> list[dict]:
    """The two variables from which each node builds its TF_CONFIG (components/train/cluster.py)."""
    return env_list({HOSTS_ENV: ",".join(node_hosts(name, nodes)), INDEX_ENV: COMPLETION_INDEX})


@dataclasses.dataclass(frozen=True)
class TensorFlowFacts(LaunchFacts):
    def jobset_env(self, name: str, nodes: int, processes_per_node: int) -> list[dict]:
        return cluster_env(name, nodes)


FACTS = TensorFlowFacts(name="tensorflow", training="TensorFlow multi-worker training",
                        runtime="tensorflow-multiworker", legacy_launchers=("tfjob",),
                        node_port=("tf-training", TRAINING_PORT))
