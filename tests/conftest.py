"""Shared fixtures: small real data (slices of Fashion-MNIST) and a model trained on it once per session."""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import itertools  # noqa: E402

import numpy as np  # noqa: E402
import pytest  # noqa: E402

from components import data  # noqa: E402
from tests.standins.kfp_api import KfpStandIn  # noqa: E402

FASHION_DIR = data.DEFAULT_SOURCE


@pytest.fixture(scope="session")
def fashion_dir() -> str:
    """The embedded default dataset; `make test` installs it (Debian's dataset-fashion-mnist)."""
    if not os.path.exists(os.path.join(FASHION_DIR, "train-images-idx3-ubyte.gz")):
        pytest.fail(f"Fashion-MNIST is missing under {FASHION_DIR}: run `make data` "
                    "(sudo apt-get install dataset-fashion-mnist)")
    return FASHION_DIR


@pytest.fixture(scope="session")
def fashion_arrays(fashion_dir):
    """The first 2000 training images and labels, as arrays."""
    images = data.read_idx(os.path.join(fashion_dir, "train-images-idx3-ubyte.gz"))[:2000]
    labels = data.read_idx(os.path.join(fashion_dir, "train-labels-idx1-ubyte.gz"))[:2000]
    return images, labels


@pytest.fixture(scope="session")
def small_dataset(fashion_dir, tmp_path_factory) -> str:
    """A preprocessed slice of Fashion-MNIST: 1500 train-source images (train + validation), 1500 test."""
    from components.preprocess import preprocess

    out = str(tmp_path_factory.mktemp("small_dataset"))
    preprocess(fashion_dir, out, limit=1500, min_shards=2)
    return out


@pytest.fixture(scope="session")
def tiny_model(small_dataset, tmp_path_factory) -> str:
    """A model trained for 2 epochs on the small slice (enough to be well above chance)."""
    from components.train import train

    out = str(tmp_path_factory.mktemp("tiny_model"))
    train(small_dataset, out, epochs=2)
    return out


def write_png(path: str, array: np.ndarray, mode: str | None = None) -> None:
    from PIL import Image

    os.makedirs(os.path.dirname(path), exist_ok=True)
    Image.fromarray(array, mode=mode).save(path)


@pytest.fixture
def image_folder(tmp_path, fashion_arrays):
    """A class-per-folder tree of real Fashion-MNIST PNGs: 3 classes x `per_class` images."""

    def make(per_class: int = 20, classes=("Sandal", "Sneaker", "Bag")):
        images, labels = fashion_arrays
        wanted = {5: "Sandal", 7: "Sneaker", 8: "Bag", 0: "T-shirt", 1: "Trouser"}
        root = tmp_path / "images"
        for label, name in wanted.items():
            if name not in classes:
                continue
            picks = np.flatnonzero(labels == label)[:per_class]
            for i in picks:
                write_png(str(root / name / f"{i:05d}.png"), images[i])
        return str(root)

    return make


@pytest.fixture
def kfp_api():
    """A running KFP v2beta1 API stand-in; point ``kfp.Client(host=kfp_api.url)`` at it.

    Its clock advances one second per reading, so every object gets a distinct ``created_at``
    (KFP stores whole seconds) and "newest version" is deterministic.
    """
    ticks = itertools.count(1_767_225_600)  # 2026-01-01T00:00:00Z
    with KfpStandIn(clock=lambda: next(ticks)) as api:
        yield api
