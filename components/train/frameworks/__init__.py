"""The frameworks training runs on: TensorFlow (tf.distribute, the default), PyTorch (DDP started by torchrun) and
JAX (jax.distributed with Keras' distribution API). The models are Keras 3 models whatever the framework: Keras
runs them on the backend named by KERAS_BACKEND, which must be set before keras is first imported, so the step's
entry calls `use(name)` first (the CLI's main, `train()`, `TrainingLoop()`); nothing in components/train imports
keras or a framework at module level.

One interface, one module per framework (as Keras' own trainers: keras/src/trainers/trainer.py and
keras/src/backend/{tensorflow,torch,jax}/trainer.py): `base.Backend` is what the training loop asks of a framework;
`tensorflow.py`, `torch.py` and `jax.py` each implement it, and a module is imported only when its framework is
chosen. The loop (components/train/loop.py) never asks which framework it runs on.
"""

from __future__ import annotations

import importlib
import os
import sys

from components.dataio import storage
from components.params import FRAMEWORKS

DEFAULT_FRAMEWORK = FRAMEWORKS[0]
KERAS_BACKENDS = {"tensorflow": "tensorflow", "torch": "torch", "jax": "jax"}


def check(name: str) -> None:
    if name not in FRAMEWORKS:
        raise ValueError(f"framework must be one of {', '.join(FRAMEWORKS)}, got {name!r}")


def use(name: str) -> None:
    """Makes this process train on framework `name`: KERAS_BACKEND for the first import of keras, and, off
    TensorFlow, the data helpers' own local file functions (no TensorFlow needed). RuntimeError when keras is
    already loaded on another backend (a process trains on one framework: start the step in its own process)."""
    check(name)
    wanted = KERAS_BACKENDS[name]
    if "keras" in sys.modules:
        loaded = sys.modules["keras"].backend.backend()
        if loaded != wanted:
            raise RuntimeError(f"Keras is already loaded on its {loaded} backend in this process; training on {name} "
                               f"needs KERAS_BACKEND={wanted} before keras is first imported: run the training step "
                               f"in a process of its own (python -m components.train --framework {name})")
    os.environ["KERAS_BACKEND"] = wanted
    storage.use_tensorflow_io(name == "tensorflow")


def backend_class(name: str):
    """The framework's `base.Backend` implementation; imports that framework's module (and only that one)."""
    check(name)
    return importlib.import_module(f"{__name__}.{name}").Backend


def shared_gpu_env() -> dict[str, str]:
    """Every framework's variables for a GPU whose memory is shared (`base.Backend.SHARED_GPU_ENV`), for a pod
    whose framework is chosen per run (batch prediction): each framework reads only its own."""
    env: dict[str, str] = {}
    for name in FRAMEWORKS:
        env.update(backend_class(name).SHARED_GPU_ENV)
    return env
