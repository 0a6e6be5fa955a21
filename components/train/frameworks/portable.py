"""What the frameworks other than TensorFlow share: their training input as numpy batches, the sample of training
images BatchNormalization statistics are re-estimated over, and their checkpoint file (numpy arrays and JSON)."""

from __future__ import annotations

import io
import json
import logging
import os
import re
import subprocess
import sys
import tempfile

import numpy as np

from components.dataio import data
from components.train import batchnorm
from components.train.export import NO_TENSORFLOW
from components.train.model import SAVED_MODEL_PENDING
from components.train.frameworks import base

log = logging.getLogger(__name__)


class _Reiterable:
    def __init__(self, make):
        self.make = make

    def __iter__(self):
        return iter(self.make())


class Deferred:
    """An iterable made on first iteration (the input exists once training has started); `once`: kept after."""

    def __init__(self, make, once: bool = False):
        self.make, self.once, self.made = make, once, None

    def __iter__(self):
        if self.once:
            if self.made is None:
                self.made = self.make()
            return iter(self.made)
        return iter(self.make())


class NumpyInput:
    """This process's training batches and the evaluation splits as (float32 NHWC 0-255, int32 labels) numpy
    batches, without TensorFlow (components/train/portable_input.py: the tf.data input's twin, same order and
    sharding). Its decoding threads: `workers` when given, else this process's share of the machine's CPUs among
    the `local_processes` training processes on it (one per GPU under torchrun), logged once."""

    def __init__(self, spec: base.InputSpec, *, pipeline_id: int, num_pipelines: int, workers: int | None = None,
                 local_processes: int = 1):
        from components.dataio.images import available_cpus
        from components.train.portable_input import PortableTrainInput, input_workers

        self.workers = input_workers(workers, local_processes)
        log.info("train: input on %d thread(s) (%s)", self.workers, "as asked" if workers else
                 f"{available_cpus()} CPU(s) shared by {max(1, local_processes)} process(es) on this machine")
        self.train = PortableTrainInput(spec.train_dir, spec.image_shape, pipeline_id=pipeline_id,
                                        num_pipelines=num_pipelines, recipe=spec.recipe,
                                        online_policy=spec.online_policy, mode=spec.mode, workers=self.workers)
        self.mode = self.train.mode

    def batches(self, epoch: int, first_batch: int, num_batches: int, batch: int):
        return self.train.batches(epoch, first_batch, num_batches, batch)

    def eval_batches(self, dataset_dir: str, split: str, batch: int):
        """A split decoded once and held (validation runs every epoch), iterable again and again."""
        from components.train.portable_input import PortableEvalInput

        held = PortableEvalInput(dataset_dir, split, batch, workers=self.workers)
        return _Reiterable(held.batches)

    def stream_batches(self, dataset_dir: str, split: str, batch: int):
        """One pass over a split, decoded as it goes (a sample of it needs only its first batches)."""
        from components.train.portable_input import eval_batches

        return eval_batches(dataset_dir, split, batch, workers=self.workers)


def train_input(spec: base.InputSpec, *, pipeline_id: int, num_pipelines: int, workers: int | None = None,
                local_processes: int = 1):
    """This process's share of the training split, seekable (see components/train/portable_input.py)."""
    return NumpyInput(spec, pipeline_id=pipeline_id, num_pipelines=num_pipelines, workers=workers,
                      local_processes=local_processes)


def recalibration_sample(batches, *, limit: int = batchnorm.RECALIBRATION_IMAGES,
                         batch: int = batchnorm.RECALIBRATION_BATCH, seed: int = 0) -> list:
    """A fixed sample of `limit` training images (from the first 4 x limit, as the shards hold them, often class by
    class: a seeded pick among them), un-augmented, as float32 batches of `batch`."""
    held, count = [], 0
    for images, _ in batches:
        held.append(np.asarray(images, np.float32))
        count += len(images)
        if count >= 4 * limit:
            break
    if not held:
        return []
    pool = np.concatenate(held)[:4 * limit]
    picks = np.sort(np.random.default_rng(seed).permutation(len(pool))[:limit])
    sample = pool[picks]
    return [sample[i:i + batch] for i in range(0, len(sample), batch)]


CHECKPOINT_NAME = re.compile(r"ckpt-(\d+)\.npz$")


class NumpyCheckpoint(base.Checkpoint):
    """`ckpt-<step>.npz` in backup_dir (the chief's; the others' in scratch): every variable of the model (weights,
    BatchNormalization statistics, dropout seed states) and of the optimizers (their step counters included), the
    extras, and the random generators' state (`rng_state` / `set_rng_state`, the framework's); the newest two kept.
    Written to a temporary name and renamed, so a kill while saving leaves the previous checkpoint whole."""

    KEEP = 2

    def __init__(self, model, optimizers: dict, *, backup_dir: str, checkpoint_dir: str, rng_state, set_rng_state):
        self.model, self.optimizers = model, optimizers
        self.backup_dir, self.checkpoint_dir = backup_dir, checkpoint_dir
        self.rng_state, self.set_rng_state = rng_state, set_rng_state

    @staticmethod
    def _numbered(directory: str) -> list[tuple[int, str]]:
        if not data.gfile().exists(directory):
            return []
        found = [(int(m.group(1)), data.join(directory, name)) for name in data.gfile().listdir(directory)
                 for m in [CHECKPOINT_NAME.search(name)] if m]
        return sorted(found)

    def _groups(self):
        yield "model", self.model.variables
        for name, optimizer in self.optimizers.items():
            yield name, optimizer.variables

    def save(self, step: int, extras: dict) -> str:
        import keras

        arrays = {f"{group}/{i}": keras.ops.convert_to_numpy(variable)
                  for group, variables in self._groups() for i, variable in enumerate(variables)}
        arrays.update({f"rng/{name}": value for name, value in self.rng_state().items()})
        arrays["extras"] = np.array(json.dumps({k: (v.tolist() if isinstance(v, np.ndarray) else v)
                                                for k, v in extras.items()}))
        data.gfile().makedirs(self.checkpoint_dir)
        path = data.join(self.checkpoint_dir, f"ckpt-{step}.npz")
        buffer = io.BytesIO()
        np.savez(buffer, **arrays)
        partial = path + ".partial"
        with data.gfile().GFile(partial, "wb") as f:
            f.write(buffer.getvalue())
        data.gfile().rename(partial, path, overwrite=True)
        for _, old in self._numbered(self.checkpoint_dir)[:-self.KEEP]:
            data.gfile().remove(old)
        return path

    def restore_latest(self):
        numbered = self._numbered(self.backup_dir)
        if not numbered:
            return None
        _, path = numbered[-1]
        with data.gfile().GFile(path, "rb") as f:
            arrays = np.load(io.BytesIO(f.read()), allow_pickle=False)
            stored = {name: arrays[name] for name in arrays.files}
        for group, variables in self._groups():
            count = sum(1 for name in stored if name.startswith(group + "/"))
            if count != len(variables):
                raise ValueError(f"{path} holds {count} {group} variables, this model has {len(variables)}: "
                                 "use a new backup directory for a different model")
            for i, variable in enumerate(variables):
                variable.assign(stored[f"{group}/{i}"])
        self.set_rng_state({name[len("rng/"):]: value for name, value in stored.items() if name.startswith("rng/")})
        return path, json.loads(str(stored["extras"]))


def scratch_checkpoint_dir(backup_dir: str, scratch: str | None, is_chief: bool) -> str:
    return backup_dir if is_chief else os.path.join(scratch or tempfile.mkdtemp(), "checkpoints")


def tensorflow_installed() -> bool:
    import importlib.util

    return importlib.util.find_spec("tensorflow") is not None


def export_saved_model(model_dir: str, image_shape, model_name: str) -> dict:
    """The SavedModel beside model.keras: written now by a TensorFlow process where TensorFlow is installed
    (`python -m components.train.export`), else left to a step that has it, with SAVED_MODEL_PENDING as the note.
    Returns training.json's word on it ({"saved_model": "written" | "pending"})."""
    if tensorflow_installed():
        env = {**os.environ, "KERAS_BACKEND": "tensorflow", "TF_CPP_MIN_LOG_LEVEL": "2"}
        done = subprocess.run([sys.executable, "-m", "components.train.export", model_dir, "--image-shape",
                               ",".join(map(str, image_shape)), "--model", model_name], env=env,
                              capture_output=True, text=True)
        if done.returncode == 0:
            return {"saved_model": "written"}
        if done.returncode != NO_TENSORFLOW:
            raise RuntimeError(f"Writing the SavedModel from model.keras failed: {done.stderr[-2000:]}")
    data.write_json(data.join(model_dir, SAVED_MODEL_PENDING), {
        "reason": "trained where TensorFlow is not installed",
        "complete_with": f"python -m components.train.export {model_dir}"})
    log.info("train: no TensorFlow here: model.keras written, the SavedModel is left to a step that has it (%s)",
             SAVED_MODEL_PENDING)
    return {"saved_model": "pending"}

