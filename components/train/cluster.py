"""Who this process is in a training cluster (`TF_CONFIG`), and the tf.distribute strategy that follows.

Where `TF_CONFIG` comes from:
- a Kubeflow TFJob (Training Operator v1) or a Vertex AI CustomJob sets it in every replica;
- a Kubeflow Trainer v2 TrainJob or a JobSet (components/launch/trainjob.py, jobset.py) runs N identical pods of one
  Indexed Job and sets no TF_CONFIG: every pod builds its own from two variables the launcher puts in the pod:

    TRAINING_NODE_HOSTS  every node's `host:port`, in node order, comma-separated: the pods' stable DNS names
                         `{job}-node-0-{k}.{job}:2222` (JobSet's hostname `{jobset}-{replicated job}-{job index}-
                         {completion index}` in its headless Service, the subdomain `{jobset}`)
    TRAINING_NODE_INDEX  this pod's index k, from the Downward API (the annotation
                         `batch.kubernetes.io/job-completion-index`); without it, Kubernetes' own
                         `JOB_COMPLETION_INDEX` of Indexed Jobs

  Node 0 is the chief and the others are workers, as in a TFJob: with hosts h0..hN-1, node k gets
  `{"cluster": {"chief": [h0], "worker": [h1, ..., hN-1]}, "task": {"type": "chief", "index": 0}}` for k = 0 and
  `"task": {"type": "worker", "index": k - 1}` otherwise. One node needs no cluster: no TF_CONFIG.

`None` for a TF_CONFIG argument below means "this process's": its `TF_CONFIG`, else the one built from those
variables. `choose_strategy` exports a built one to the environment before it creates MultiWorkerMirroredStrategy,
which reads `TF_CONFIG` itself.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Mapping

HOSTS_ENV = "TRAINING_NODE_HOSTS"
INDEX_ENV = "TRAINING_NODE_INDEX"
JOB_INDEX_ENV = "JOB_COMPLETION_INDEX"  # set by Kubernetes in every pod of an Indexed Job


@dataclasses.dataclass(frozen=True)
class ClusterRole:
    workers: int  # training processes (chief + workers)
    is_chief: bool
    task: str  # e.g. "chief/0", "worker/1", "local"


def tf_config_from_pod_env(environ: Mapping[str, str]) -> str | None:
    """The TF_CONFIG of a TrainJob/JobSet node (see the module docstring); None outside one, or for one node.

    Raises ValueError, naming the variable, when the variables are there but do not describe this node."""
    hosts_text = environ.get(HOSTS_ENV, "").strip()
    if not hosts_text:
        return None
    hosts = [host.strip() for host in hosts_text.split(",")]
    if any(not host or ":" not in host for host in hosts):
        raise ValueError(f"{HOSTS_ENV} must list host:port for every node, comma-separated (got {hosts_text!r})")
    index_text = environ.get(INDEX_ENV) or environ.get(JOB_INDEX_ENV)
    if index_text is None:
        raise ValueError(f"{HOSTS_ENV} is set but neither {INDEX_ENV} nor {JOB_INDEX_ENV} says which node this is")
    try:
        index = int(index_text)
    except ValueError:
        raise ValueError(f"{INDEX_ENV}/{JOB_INDEX_ENV} must be a node index, got {index_text!r}") from None
    if not 0 <= index < len(hosts):
        raise ValueError(f"Node index {index} is outside the {len(hosts)} node(s) of {HOSTS_ENV}")
    if len(hosts) == 1:
        return None
    cluster = {"chief": hosts[:1], "worker": hosts[1:]}
    task = {"type": "chief", "index": 0} if index == 0 else {"type": "worker", "index": index - 1}
    return json.dumps({"cluster": cluster, "task": task})


def process_tf_config(environ: Mapping[str, str] | None = None) -> str | None:
    """This process's TF_CONFIG: the platform's, else the one its TrainJob/JobSet pod environment describes."""
    environ = os.environ if environ is None else environ
    return environ.get("TF_CONFIG") or tf_config_from_pod_env(environ)


def cluster_role(tf_config: str | None) -> ClusterRole:
    """Who this process is in `TF_CONFIG` (None: this process's, see the module): the chief is `chief/0`, or
    `worker/0` when there is no chief."""
    config = json.loads((process_tf_config() if tf_config is None else tf_config) or "{}")
    cluster = config.get("cluster", {})
    workers = sum(len(cluster.get(role, [])) for role in ("chief", "worker"))
    task = config.get("task", {})
    task_type, index = task.get("type", ""), int(task.get("index", 0))
    if workers <= 1:
        return ClusterRole(1, True, "local" if not task_type else f"{task_type}/{index}")
    if task_type not in ("chief", "worker"):
        raise ValueError(f"TF_CONFIG task type {task_type!r} is not supported (chief and worker are)")
    is_chief = task_type == "chief" or (task_type == "worker" and index == 0 and not cluster.get("chief"))
    return ClusterRole(workers, is_chief, f"{task_type}/{index}")


def strategy_name(strategy) -> str:
    import tensorflow as tf

    if isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):  # the class is CollectiveAllReduceStrategy
        return "MultiWorkerMirroredStrategy"
    if isinstance(strategy, tf.distribute.MirroredStrategy):
        return "MirroredStrategy"
    return "DefaultStrategy"


def choose_strategy(tf_config: str | None = None):
    """MultiWorkerMirrored when TF_CONFIG names several workers, Mirrored over several local GPUs, else default."""
    import tensorflow as tf

    if tf_config is None:
        tf_config = process_tf_config()
        if tf_config and not os.environ.get("TF_CONFIG"):
            os.environ["TF_CONFIG"] = tf_config  # built from the pod's environment: the strategy reads it from here
    if cluster_role(tf_config).workers > 1:
        return tf.distribute.MultiWorkerMirroredStrategy()
    if len(tf.config.list_physical_devices("GPU")) > 1:
        return tf.distribute.MirroredStrategy()
    return tf.distribute.get_strategy()
