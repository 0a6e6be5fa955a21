"""PyTorch under the training loop: Keras models on Keras' torch backend, trained by a loop of torch autograd and
the Keras optimizer (what keras/src/backend/torch/trainer.py's train_step does), one process per device.

Distribution: DDP as torchrun starts it. Each process reads torchrun's RANK, WORLD_SIZE, LOCAL_RANK and
MASTER_ADDR/MASTER_PORT (torch.distributed's env:// rendezvous), joins the process group (nccl on GPUs, gloo on
CPUs), trains on its share of the shards (shard by file, as TensorFlow's workers do) and averages gradients with the
others each step. For a Keras model the gradients are all-reduced explicitly, in one flat buffer per step with the
step's loss sums, rather than by wrapping the model in torch's DistributedDataParallel: a Keras model's forward
takes Keras' own arguments (training=) and its variables are Keras variables, which DDP's parameter buckets and
buffer broadcasts do not know; the explicit all-reduce is the same arithmetic (the sum over replicas of the
gradients of sum(loss) / global batch, as tf.distribute's), with the same single collective per step. Every process
starts from rank 0's weights (broadcast after restore).

Rank 0 is the chief: it alone writes the model, training.json, TensorBoard logs and checkpoints in backup_dir.
"""

from __future__ import annotations

import datetime
import logging
import os

import numpy as np

from components.train.cluster import ClusterRole
from components.train.frameworks import base, events, portable
from components.train.model import check_gpus_visible, write_keras_model

log = logging.getLogger(__name__)

RANK_ENV, WORLD_ENV, LOCAL_RANK_ENV = "RANK", "WORLD_SIZE", "LOCAL_RANK"  # torchrun's (torch.distributed.run)
# torchrun's processes on this node (torch v2.13.0, torch/distributed/elastic/agent/server/local_elastic_agent.py:420)
LOCAL_WORLD_ENV = "LOCAL_WORLD_SIZE"
COLLECTIVE_TIMEOUT = datetime.timedelta(minutes=10)  # a peer silent this long is lost


class Backend(base.Backend):
    name = "torch"

    def __init__(self, settings):
        super().__init__(settings)
        self.world = 1
        self.rank = 0
        self.local_processes = 1  # on this node: they share its CPUs
        self.device = None
        self.input = None
        self.process_group = False

    # ------------------------------------------------------------------------------- prepare

    def role(self, tf_config):
        self.world = int(os.environ.get(WORLD_ENV, "1"))
        self.rank = int(os.environ.get(RANK_ENV, "0"))
        self.local_processes = int(os.environ.get(LOCAL_WORLD_ENV, "1"))
        if not 0 <= self.rank < self.world:
            raise ValueError(f"{RANK_ENV}={self.rank} is outside {WORLD_ENV}={self.world}")
        task = f"rank/{self.rank}" if self.world > 1 else "local"
        return ClusterRole(self.world, self.rank == 0, task)

    def start(self, role):
        import torch
        import torch.distributed as dist

        gpus = torch.cuda.device_count()
        check_gpus_visible(list(range(gpus)))
        if gpus:
            local_rank = int(os.environ.get(LOCAL_RANK_ENV, "0"))
            self.device = torch.device("cuda", local_rank % gpus)
            torch.cuda.set_device(self.device)
        else:
            self.device = torch.device("cpu")
        kind = "nccl" if gpus else "gloo"
        if self.world > 1:
            dist.init_process_group(kind, timeout=COLLECTIVE_TIMEOUT)
            self.process_group = True
        distribution = f"torch.distributed({kind}, {self.world} processes)" if self.world > 1 else "one process"
        return base.Runtime(self.world, distribution, 1 if gpus else 0)

    def gpu_capability(self):
        import torch

        return tuple(torch.cuda.get_device_capability(self.device)) if self.device.type == "cuda" else None

    def resolve_jit(self, requested):
        if requested == "on":
            log.warning("train: jit_compile on is TensorFlow's and JAX's XLA; on torch the step runs eagerly")
        return False

    # ------------------------------------------------------------------------------- build

    def _to_device(self, array, dtype=None):
        import torch

        tensor = array if isinstance(array, torch.Tensor) else torch.from_numpy(np.require(array, requirements="W"))
        if dtype is not None:
            tensor = tensor.to(dtype)
        return tensor.to(self.device, non_blocking=True)

    def step_function(self, model, optimizer, variables, loss_fn, global_batch, use_jit):
        import torch
        import torch.distributed as dist

        world = self.world

        def one_step(images, labels):
            images, labels = self._to_device(images), self._to_device(labels, torch.int64)
            for variable in variables:
                variable.value.grad = None
            logits = model(images, training=True)
            per_example = loss_fn(labels, logits)
            loss = per_example.sum() / global_batch
            optimizer.scale_loss(loss).backward()
            grads = [v.value.grad if v.value.grad is not None else torch.zeros_like(v.value) for v in variables]
            with torch.no_grad():
                sums = torch.stack([per_example.detach().sum().float(),
                                    (logits.argmax(-1) == labels).sum().float(),
                                    torch.tensor(float(labels.shape[0]), device=self.device)])
                if world > 1:  # one collective per step: the gradients and the step's sums together
                    flat = torch.cat([g.reshape(-1).float() for g in grads] + [sums])
                    dist.all_reduce(flat)
                    offset = 0
                    for i, g in enumerate(grads):
                        grads[i] = flat[offset:offset + g.numel()].view_as(g).to(g.dtype)
                        offset += g.numel()
                    sums = flat[offset:]
                optimizer.apply(grads, variables)
            return sums

        def run(iterator, count):
            return torch.stack([one_step(*next(iterator)) for _ in range(count)]).cpu().numpy()

        if world > 1:
            self._broadcast_weights(model)
        return run

    def _broadcast_weights(self, model):
        """Every process starts from rank 0's variables (the same seed builds the same ones, restores agree, but a
        step must never average different models)."""
        import torch
        import torch.distributed as dist

        with torch.no_grad():
            for variable in model.variables:
                tensor = variable.value.data
                dist.broadcast(tensor, src=0)

    def predict_function(self, model):
        import torch

        def predict(images):
            with torch.no_grad():
                return model(self._to_device(images, torch.float32), training=False)

        return predict

    def checkpoint(self, model, optimizers, *, backup_dir, scratch, is_chief, setup):
        if not backup_dir:
            return None
        return portable.NumpyCheckpoint(model, optimizers, backup_dir=backup_dir,
                                        checkpoint_dir=portable.scratch_checkpoint_dir(backup_dir, scratch, is_chief),
                                        rng_state=self._rng_state, set_rng_state=self._set_rng_state)

    @staticmethod
    def _rng_state() -> dict:
        import torch

        state = {"torch": torch.get_rng_state().numpy()}
        if torch.cuda.is_available():
            state["cuda"] = torch.cuda.get_rng_state().numpy()
        return state

    @staticmethod
    def _set_rng_state(state: dict) -> None:
        import torch

        if "torch" in state:
            torch.set_rng_state(torch.from_numpy(state["torch"]))
        if "cuda" in state and torch.cuda.is_available():
            torch.cuda.set_rng_state(torch.from_numpy(state["cuda"]))

    def agree(self, flags):
        import torch
        import torch.distributed as dist

        tensor = torch.tensor(flags, dtype=torch.float32, device=self.device)
        dist.all_reduce(tensor)
        return tensor.cpu().tolist()

    # ------------------------------------------------------------------------------- run epochs

    def batches(self, spec, epoch, first_step):
        if self.input is None:
            self.input = portable.train_input(spec, pipeline_id=self.rank, num_pipelines=self.world,
                                              local_processes=self.local_processes)
        return iter(self.input.batches(epoch, first_step, spec.steps_per_epoch - first_step, spec.recipe.batch_size))

    def input_mode(self):
        return self.input.mode if self.input is not None else None

    def _eval_source(self):
        if self.input is None:
            raise RuntimeError("the training input is made by the first batches() call")
        return self.input

    def eval_batches(self, dataset_dir, split, batch):
        return portable.Deferred(lambda: self._eval_source().eval_batches(dataset_dir, split, batch))

    def recalibration_batches(self, dataset_dir):
        return portable.Deferred(lambda: portable.recalibration_sample(
            self._eval_source().stream_batches(dataset_dir, "train", 256)), once=True)

    def summary_writer(self, logdir):
        return events.EventWriter(logdir)

    def is_peer_loss(self, error):
        # NCCL's and the rendezvous' errors have their own classes; gloo's transport raises a RuntimeError
        # naming the connection (third_party/gloo/gloo/transport/tcp/pair.cc: "Connection closed by peer",
        # "Connection reset by peer", "Timed out waiting ...").
        import torch.distributed as dist

        if not self.process_group:
            return False
        if isinstance(error, (dist.DistBackendError, dist.DistNetworkError)):
            return True
        text = str(error)
        return isinstance(error, RuntimeError) and "gloo" in text and any(
            sign in text for sign in ("Connection closed by peer", "Connection reset by peer", "Timed out"))

    # ------------------------------------------------------------------------------- export

    def write_model(self, model, image_shape, num_classes, model_dir, model_name):
        write_keras_model(model, image_shape, num_classes, model_dir, model_name)
        return {"framework": self.name, "serving_format": "keras+saved_model",
                **portable.export_saved_model(model_dir, image_shape, model_name)}

    def finish(self):
        import torch.distributed as dist

        if self.process_group:
            dist.destroy_process_group()
            self.process_group = False
