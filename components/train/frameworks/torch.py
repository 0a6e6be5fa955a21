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

PyTorch-native models: a bring-your-own builder may return a torch.nn.Module taking float32 N x C x H x W pixels
(0-255) and returning N x classes logits. It trains inside a Keras model (`module_classifier`: images N x H x W x C
in, as every model here takes them, permuted to N x C x H x W, the module's logits out, as the catalogue's models
output logits), so the loop, the optimizers, the all-reduce, checkpoints and resume are the same as for Keras
layers. Its serving format is TorchScript (`write_torchscript`): the module in inference mode with the permutation
and the softmax, `model.torchscript.pt`, which loads with torch alone (components/dataio/data.py's `load_classifier`),
without the builder's code; no model.keras or SavedModel is written (Keras would pickle the module into
model.keras, and loading that runs the builder's code: a later step must not have to).
"""

from __future__ import annotations

import copy
import datetime
import functools
import logging
import os
import shutil
import sys
import tempfile

import numpy as np

from components import gpu_driver
from components.dataio import data
from components.train import models
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
    # torch allocates as needed already, but its caching allocator keeps freed blocks reserved, and fixed-size
    # segments fragment, so a process holds more than it uses; expandable segments grow and shrink one mapping per
    # stream instead, keeping what it holds near what it uses (https://pytorch.org/docs/stable/notes/cuda.html,
    # "Optimizing memory usage with PYTORCH_CUDA_ALLOC_CONF"). Read when CUDA's allocator is first used.
    SHARED_GPU_ENV = {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}

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

        gpu_driver.check_driver(torch.version.cuda, framework=f"torch {torch.__version__}")  # before CUDA starts
        gpus = torch.cuda.device_count()
        check_gpus_visible(list(range(gpus)), framework="PyTorch",
                           probe="python3 -c \"import torch; print(torch.cuda.device_count(), torch.version.cuda)\"")
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

    @staticmethod
    def native_model(name, built, image_shape, num_classes):
        import keras

        if not models.is_torch_module(built):
            return models.check_output(name, built, image_shape, num_classes)
        check_module_output(name, built, image_shape, num_classes)
        precision = keras.config.dtype_policy().compute_dtype  # models.build's policy for this run
        return models.check_output(name, module_classifier(built, image_shape, num_classes, precision),
                                   image_shape, num_classes)

    @staticmethod
    def check_native(name, built, image_shape, num_classes):
        if not models.is_torch_module(built):
            models.check_output(name, built, image_shape, num_classes)
            return
        check_module_output(name, built, image_shape, num_classes)

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
        wrapped = torch_module_of(model)
        if wrapped is not None:
            write_torchscript(wrapped, image_shape, model_dir)
            return {"framework": self.name, "serving_format": data.TORCHSCRIPT, "serving_file": data.TORCHSCRIPT_FILE,
                    "saved_model": "none"}
        write_keras_model(model, image_shape, num_classes, model_dir, model_name)
        return {"framework": self.name, "serving_format": "keras+saved_model",
                **portable.export_saved_model(model_dir, image_shape, model_name)}

    def finish(self):
        import torch.distributed as dist

        if self.process_group:
            dist.destroy_process_group()
            self.process_group = False


# ------------------------------------------------------------------------------------------ PyTorch-native models


def check_module_output(name: str, module, image_shape, num_classes: int) -> None:
    """ModelError unless `module` maps a float32 batch of 2 x C x H x W pixels to (2, num_classes) logits (run
    in inference mode, without gradients, where the module's parameters are)."""
    import torch

    height, width, channels = (int(n) for n in image_shape)
    was_training = module.training
    try:
        device = next(module.parameters()).device
    except StopIteration:
        device = torch.device("cpu")
    module.eval()
    try:
        with torch.no_grad():
            out = module(torch.zeros((2, channels, height, width), dtype=torch.float32, device=device))
    except Exception as e:
        raise models.ModelError(f"model {name} (a torch.nn.Module) fails on a float32 batch of shape "
                                f"(2, {channels}, {height}, {width}) (N x C x H x W): "
                                f"{str(e).splitlines()[0] if str(e) else type(e).__name__}") from e
    finally:
        module.train(was_training)
    shape = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
    if shape != (2, num_classes):
        raise models.ModelError(f"model {name} (a torch.nn.Module) returns {shape} for a batch of shape "
                                f"(2, {channels}, {height}, {width}) (N x C x H x W); it must return a tensor of "
                                f"(batch, num_classes) = (2, {num_classes}) logits")


@functools.cache
def _module_layer_class():
    """The Keras layer that trains a torch.nn.Module (made on first use: keras is imported only once the step has
    chosen its backend)."""
    import keras
    import torch

    class TorchModuleLayer(keras.layers.TorchModuleWrapper):
        """keras.layers.TorchModuleWrapper (keras/src/utils/torch_utils.py) that also holds the module's buffers
        (BatchNorm statistics) as non-trainable Keras variables sharing their storage, so that the checkpoints,
        the best epoch's weights and the broadcast from rank 0 include them; it takes N x H x W x C images,
        gives the module N x C x H x W, and runs it under torch.autocast in a mixed precision (the module's
        parameters stay float32)."""

        def __init__(self, module, autocast_dtype=None, **kwargs):
            self.autocast_dtype = autocast_dtype
            super().__init__(module, dtype="float32", **kwargs)  # float32 in: the module casts under autocast

        def _track_module_parameters(self):
            for param in self.module.parameters():
                self._track_variable(keras.Variable(initializer=param, trainable=param.requires_grad))
            persistent = self.module.state_dict(keep_vars=True)  # a non-persistent buffer is no state
            for name, buffer in self.module.named_buffers():
                if name not in persistent:
                    continue
                shared = torch.nn.Parameter(buffer, requires_grad=False)  # the same storage as the buffer
                self._track_variable(keras.Variable(initializer=shared, trainable=False,
                                                    dtype=str(buffer.dtype).removeprefix("torch.")))
            self.built = True

        def call(self, images, training=None):
            self.module.train(bool(training))
            pixels = images.permute(0, 3, 1, 2)
            if self.autocast_dtype:
                with torch.autocast(pixels.device.type, dtype=getattr(torch, self.autocast_dtype)):
                    return self.module(pixels).float()
            return self.module(pixels).float()

    return TorchModuleLayer


TORCH_MODULE_LAYER = "torch_module"  # the layer's name in the Keras model


def module_classifier(module, image_shape, num_classes: int, precision: str = "float32"):
    """A Keras model taking N x H x W x C float32 pixels (0-255) and returning the module's N x num_classes
    logits; `precision` is the compute dtype (bfloat16, float16: torch.autocast)."""
    import keras

    autocast = precision if precision in ("bfloat16", "float16") else None
    inputs = keras.Input(shape=tuple(int(n) for n in image_shape), name="image")
    outputs = _module_layer_class()(module, autocast, name=TORCH_MODULE_LAYER, output_shape=(None, num_classes))(
        inputs)
    model = keras.Model(inputs, outputs, name="torch_module_classifier")
    setattr(model, models.NATIVE_KIND, "torch.nn.Module")
    return model


def torch_module_of(model):
    """The torch.nn.Module a Keras model from `module_classifier` trains, else None."""
    if "torch" not in sys.modules:
        return None
    layer = next((layer for layer in getattr(model, "layers", []) if isinstance(layer, _module_layer_class())),
                 None)
    return layer.module if layer is not None else None


def serving_module(module):
    """The inference function TorchScript holds: N x H x W x C float32 pixels (0-255) -> class probabilities,
    the module in inference mode on the CPU, in float32."""
    import torch

    class Serving(torch.nn.Module):
        def __init__(self, classifier):
            super().__init__()
            self.classifier = classifier

        def forward(self, pixels: torch.Tensor) -> torch.Tensor:
            return torch.softmax(self.classifier(pixels.permute(0, 3, 1, 2)).float(), dim=-1)

    return Serving(copy.deepcopy(module).cpu().float().eval()).eval()


def write_torchscript(module, image_shape, model_dir: str) -> str:
    """model_dir/model.torchscript.pt: `serving_module` compiled by torch.jit.script, or recorded by
    torch.jit.trace where the module cannot be scripted; the file, loaded again, must give the module's own
    probabilities on a batch of another size (a trace that fixed a shape or a branch is refused). Returns how
    it was made (script or trace)."""
    import torch

    serving = serving_module(module)
    height, width, channels = (int(n) for n in image_shape)
    generator = torch.Generator().manual_seed(0)
    probe = torch.rand((3, height, width, channels), generator=generator) * 255
    with torch.no_grad():
        expected = serving(probe)
        try:
            compiled, how = torch.jit.script(serving), "script"
        except Exception as scripting:  # noqa: BLE001 (torch raises many kinds; trace is the fallback)
            log.info("train: torch.jit.script cannot compile the module (%s); tracing it",
                     str(scripting).splitlines()[0] if str(scripting) else type(scripting).__name__)
            compiled, how = torch.jit.trace(serving, probe[:2]), "trace"
    local_dir = tempfile.mkdtemp(prefix="torchscript-")
    try:
        local = os.path.join(local_dir, data.TORCHSCRIPT_FILE)
        torch.jit.save(compiled, local)
        with torch.no_grad():
            got = torch.jit.load(local, map_location="cpu")(probe)
        if not torch.allclose(got, expected, atol=1e-5):
            raise RuntimeError(f"The TorchScript of the model ({how}) does not reproduce the module's outputs on "
                               f"a batch of 3 (largest difference {float((got - expected).abs().max()):.3g}): "
                               "make the module scriptable (torch.jit.script) or free of shape-dependent Python")
        data.gfile().makedirs(model_dir)
        data.gfile().copy(local, data.join(model_dir, data.TORCHSCRIPT_FILE), overwrite=True)
    finally:
        shutil.rmtree(local_dir, ignore_errors=True)
    log.info("train: TorchScript (%s) of the torch.nn.Module written to %s", how,
             data.join(model_dir, data.TORCHSCRIPT_FILE))
    return how
