"""What training returns and writes beside the model: `TrainResult`, training.json, and the KFP metrics."""

from __future__ import annotations

import dataclasses

TRAINING_INFO = "training.json"


@dataclasses.dataclass
class TrainResult:
    model_dir: str
    epochs: int
    steps: int  # optimizer steps taken in all attempts together: always epochs x steps_per_epoch
    steps_per_epoch: int
    global_batch_size: int
    replicas: int
    workers: int
    strategy: str
    learning_rate: float  # peak rate after scaling
    precision: str
    jit_compile: bool
    input_mode: str
    resumed_from_step: int
    history: dict
    train_seconds: float  # this attempt: from the first to the last step, validation included
    images_per_second: float  # this attempt's training images per second of train_seconds
    exported_epoch: int = 0  # the epoch whose weights were exported: the best on validation, else the last
    best_on_validation: dict | None = None  # {"epoch", "val_accuracy", "val_loss"} when validation ran
    batchnorm_recalibrated: bool = False  # the statistics were re-estimated for the exported weights
    framework: str = "tensorflow"  # what trained it (components/train/frameworks)
    serving_format: str = "keras+saved_model"  # what model_dir holds for serving (frameworks' write_model)

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


def log_to_kfp(info: dict, metrics, model) -> None:
    """Per-epoch and final metrics, timings and throughput into a KFP Metrics artifact; facts onto the Model."""
    for name, values in info["history"].items():
        for epoch, value in enumerate(values, start=1):
            metrics.log_metric(f"epoch{epoch:02d}_{name}", round(value, 6))
        if values:
            metrics.log_metric(f"final_{name}", round(values[-1], 6))
    best = info.get("best_on_validation") or {}
    if info.get("exported_epoch"):
        metrics.log_metric("exported_epoch", info["exported_epoch"])
    if best.get("epoch") == info.get("exported_epoch"):
        metrics.log_metric("exported_val_accuracy", round(best["val_accuracy"], 6))
    metrics.log_metric("train_seconds", round(info["train_seconds"], 2))
    metrics.log_metric("images_per_second", round(info["images_per_second"], 1))
    metrics.log_metric("steps", info["steps"])
    metrics.log_metric("resumed_from_step", info["resumed_from_step"])
    for gpu in (info.get("gpu_usage") or {}).get("gpus", []):  # components/train/gpu_usage.py
        if gpu["run"].get("samples"):
            for name in ("utilization_mean", "utilization_p95", "memory_used_gib_max"):
                metrics.log_metric(f"gpu{gpu['index']}_{name}", gpu["run"][name])
            metrics.log_metric(f"gpu{gpu['index']}_memory_total_gib", gpu["memory_total_gib"])
    model.metadata.update({"framework": info.get("framework", "tensorflow"),
                           "serving_format": info.get("serving_format", "keras+saved_model"),
                           "strategy": info["strategy"], "replicas": info["replicas"],
                           "workers": info["workers"], "global_batch_size": info["global_batch_size"]})
