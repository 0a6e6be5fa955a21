"""Train: the image classifier on TensorFlow (a tf.distribute strategy, the default), PyTorch (DDP under torchrun)
or JAX (jax.distributed), resumable to the step after a preemption. What differs between them is in `frameworks`
(one module per framework behind `frameworks.base.Backend`); the rest below holds for all three, with torchrun's
RANK/WORLD_SIZE or JAX_NUM_PROCESSES/JAX_PROCESS_ID in place of TF_CONFIG.

Distribution. The strategy comes from the machine: `TF_CONFIG` naming several workers ->
MultiWorkerMirroredStrategy; several local GPUs -> MirroredStrategy; otherwise the default strategy (one
device). The global batch is the per-replica batch times the replicas, and the learning rate is scaled with it
(linear scaling, ramped up over the recipe's warm-up epochs; `scale_lr=False` turns it off). Each worker reads
its own share of the training shards (shard by file, see `TrainInput`), and only the chief writes the model,
the metrics and the TensorBoard logs; the other workers write theirs to scratch space and delete it.

Fault tolerance. Checkpoints (weights, optimizer state, step, the epoch's running metrics and the history) go
to `backup_dir`, which the pipeline keys by run and task in durable storage: at the end of every epoch, every
`checkpoint_seconds` within one, and when SIGTERM arrives (a Spot VM preemption or a pod eviction). A new
attempt with the same `backup_dir` resumes from the last checkpoint, mid-epoch, on the same batches it would
have seen, and runs exactly the planned number of steps. Exit codes of `main()` (and of the pipeline step;
every step's CLI keeps the same contract, components/stepcli.py):

    0    trained (or found already trained in backup_dir: the model is written again)
    143  preempted (SIGTERM; a checkpoint was saved) or a peer worker was lost, in any phase (start-up, restore,
         training, export): retry, it resumes
    137  killed (SIGKILL, out of memory): retry, it resumes from the last periodic checkpoint
    2    bad input or settings, or the loss became NaN/inf: permanent, retrying cannot help
    1    an unexpected error (a bug): permanent

Codes 128-255 are what a Kubeflow TFJob with `restartPolicy: ExitCode` restarts, and 1-127 what it does not.
A KFP task retry restarts on any failure, so a permanent failure leaves `FAILED.json` in `backup_dir`: a
retried attempt finds it and fails at once with the original reason instead of spending GPU time again.

Outputs in `model_dir`: `model.keras` (Keras, float32), `saved_model/` (TF SavedModel returning class
probabilities, what Vertex AI's TensorFlow serving containers load), `training.json` (recipe, class names,
image shape, per-epoch history, steps, timings, throughput, framework and serving format); for a torch.nn.Module
trained on PyTorch, `model.torchscript.pt` (TorchScript returning class probabilities) instead of the first two.

Where things are: `loop` (`TrainingLoop`, the training loop in named phases, and `train`), `settings`
(`TrainSettings`, everything a run is told), `recipes` (the presets), `learning_rate`, `models` (the catalogue:
the reference CNN, backbones, bring-your-own; the transfer-learning phases), `pretrained` (weights: fetch, cache,
load, digest), `model` (precision, XLA, GPU visibility, export), `export` (the SavedModel of a model trained on torch/JAX),
`frameworks` (TensorFlow, PyTorch, JAX under the loop), `cluster` (TF_CONFIG and the strategy), `inputs` (the
seekable training input), `faults` (preemption, exit codes, the failure marker, the checkpoint directory), `results`
(`TrainResult`, training.json, KFP metrics), `cli`.
"""

from components.train.cli import build_parser, main
from components.stepcli import EXIT_BUG, EXIT_KILLED, EXIT_OK, EXIT_PERMANENT, EXIT_RETRY, RETRYABLE_EXIT_CODES
from components.train.faults import (FAILED_MARKER, NonFiniteLossError, PermanentFailure, Preempted, attempt,
                                     backup_dir_for)
from components.train.loop import TrainingLoop, train
from components.train.models import build_model
from components.train.recipes import DEFAULT_RECIPE, PRECISIONS, RECIPES, Recipe, resolve_recipe
from components.train.results import TRAINING_INFO, TrainResult, log_to_kfp
from components.train.settings import TrainSettings

__all__ = ["DEFAULT_RECIPE", "EXIT_BUG", "EXIT_KILLED", "EXIT_OK", "EXIT_PERMANENT", "EXIT_RETRY", "FAILED_MARKER",
           "PRECISIONS", "RECIPES", "RETRYABLE_EXIT_CODES", "TRAINING_INFO", "NonFiniteLossError", "PermanentFailure",
           "Preempted", "Recipe", "TrainResult", "TrainSettings", "TrainingLoop", "attempt", "backup_dir_for",
           "build_model", "build_parser", "log_to_kfp", "main", "resolve_recipe", "train"]
