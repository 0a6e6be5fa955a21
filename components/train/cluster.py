"""Who this process is in a training cluster (`TF_CONFIG`), and the tf.distribute strategy that follows."""

from __future__ import annotations

import dataclasses
import json
import os


@dataclasses.dataclass(frozen=True)
class ClusterRole:
    workers: int  # training processes (chief + workers)
    is_chief: bool
    task: str  # e.g. "chief/0", "worker/1", "local"


def cluster_role(tf_config: str | None) -> ClusterRole:
    """Who this process is in `TF_CONFIG`: the chief is `chief/0`, or `worker/0` when there is no chief."""
    config = json.loads(tf_config or "{}")
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

    if cluster_role(tf_config if tf_config is not None else os.environ.get("TF_CONFIG")).workers > 1:
        return tf.distribute.MultiWorkerMirroredStrategy()
    if len(tf.config.list_physical_devices("GPU")) > 1:
        return tf.distribute.MirroredStrategy()
    return tf.distribute.get_strategy()
