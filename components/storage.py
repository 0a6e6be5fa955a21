"""Paths that are local or gs:// (through `tf.io.gfile`), and the error for input data that cannot be used. The
bottom of the data helpers: components/images.py and components/data.py build on it.

Training on PyTorch or JAX runs where TensorFlow may not be installed (the PyTorch GPU image): that step calls
`use_tensorflow_io(False)` first, and gfile() is then `LocalFiles`: local paths (a GCS FUSE mount included) with
Python's own file functions, `gs://` URIs with google-cloud-storage's client (components/gcs.py, the same calls
with tf.io.gfile's meaning). Where TensorFlow is not installed at all (evaluation and batch prediction of a run on
PyTorch, in the PyTorch image), gfile() is LocalFiles whatever was chosen. Other URI schemes need TensorFlow."""

from __future__ import annotations

import glob as glob_lib
import os
import shutil
import types

_tensorflow_io = True  # whether gfile() is tf.io.gfile (the default) or LocalFiles
_tensorflow_installed: bool | None = None


def use_tensorflow_io(enabled: bool) -> None:
    """Chooses what gfile() returns: tf.io.gfile (True, the default) or LocalFiles (False)."""
    global _tensorflow_io
    _tensorflow_io = enabled


def tensorflow_or_none():
    """TensorFlow, or None where it cannot be imported (tried once; a step that has it imports it anyway)."""
    global _tensorflow_installed
    if _tensorflow_installed is False:
        return None
    try:
        import tensorflow as tf
    except ImportError:
        _tensorflow_installed = False
        return None
    _tensorflow_installed = True
    return tf


def gfile():
    tf = tensorflow_or_none() if _tensorflow_io else None
    return LocalFiles if tf is None else tf.io.gfile


def join(base: str, *parts: str) -> str:
    """os.path.join that keeps `gs://` URIs intact."""
    return "/".join([base.rstrip("/"), *parts]) if "://" in base else os.path.join(base, *parts)


class DataError(ValueError):
    """Input data that cannot be used, with a message saying what to do about it."""



def locate(dataset_dir: str, path: str) -> str:
    """A manifest's path: relative ones are inside the dataset directory; absolute paths and URIs point elsewhere
    (augment's pass-through, data written by reference under a data root: components/datadir.py)."""
    if "://" in path or os.path.isabs(path):
        return path
    return join(dataset_dir if "://" in dataset_dir else os.path.abspath(dataset_dir), path)


def _uri_files(path: str):
    """What reads and writes a URI here: components/gcs.py for gs:// (google-cloud-storage), tf.io.gfile for any
    other scheme, or DataError saying what to do where that cannot be."""
    if path.startswith("gs://"):
        try:
            import google.cloud.storage  # noqa: F401 (installed with google-cloud-aiplatform: in every image)
        except ImportError as e:
            raise DataError(f"{path}: gs:// without TensorFlow needs google-cloud-storage ({e}): pip install "
                            "google-cloud-storage, or mount the bucket with GCS FUSE and pass its local path "
                            "(docs/data-by-reference.md)") from None
        from components import gcs

        return gcs
    tf = tensorflow_or_none()
    if tf is None:
        raise DataError(f"{path}: without TensorFlow only local paths and gs:// URIs are read and written; mount "
                        "the storage locally and pass its path (docs/data-by-reference.md)")
    return tf.io.gfile


class LocalFiles:
    """The part of tf.io.gfile's interface the steps use, without TensorFlow: local paths with Python's own file
    functions, gs:// URIs with components/gcs.py."""

    @staticmethod
    def exists(path: str) -> bool:
        return _uri_files(path).exists(path) if "://" in path else os.path.exists(path)

    @staticmethod
    def isdir(path: str) -> bool:
        return _uri_files(path).isdir(path) if "://" in path else os.path.isdir(path)

    @staticmethod
    def makedirs(path: str) -> None:
        if "://" in path:
            return _uri_files(path).makedirs(path)
        os.makedirs(path, exist_ok=True)

    @staticmethod
    def glob(pattern: str) -> list[str]:
        return _uri_files(pattern).glob(pattern) if "://" in pattern else glob_lib.glob(pattern)

    @staticmethod
    def listdir(path: str) -> list[str]:
        return _uri_files(path).listdir(path) if "://" in path else os.listdir(path)

    @staticmethod
    def copy(source: str, target: str, overwrite: bool = False) -> None:
        if "://" in source or "://" in target:
            return _uri_files(source if "://" in source else target).copy(source, target, overwrite=overwrite)
        if not overwrite and os.path.exists(target):
            raise FileExistsError(target)
        shutil.copyfile(source, target)

    @staticmethod
    def rename(source: str, target: str, overwrite: bool = False) -> None:
        if "://" in source or "://" in target:
            return _uri_files(source if "://" in source else target).rename(source, target, overwrite=overwrite)
        if not overwrite and os.path.exists(target):
            raise FileExistsError(target)
        os.replace(source, target)

    @staticmethod
    def remove(path: str) -> None:
        return _uri_files(path).remove(path) if "://" in path else os.remove(path)

    @staticmethod
    def rmtree(path: str) -> None:
        return _uri_files(path).rmtree(path) if "://" in path else shutil.rmtree(path)

    @staticmethod
    def walk(top: str):
        """(dirname, subdirs, files) top-down; gs://: subdirs end with "/", as tf.io.gfile's on GCS."""
        return _uri_files(top).walk(top) if "://" in top else os.walk(top)

    @staticmethod
    def stat(path: str):
        """The size and modification time, by tf.io.gfile's names (length, mtime_nsec)."""
        if "://" in path:
            return _uri_files(path).stat(path)
        found = os.stat(path)
        return types.SimpleNamespace(length=found.st_size, mtime_nsec=found.st_mtime_ns)

    @staticmethod
    def GFile(path: str, mode: str = "r"):  # noqa: N802 (tf.io.gfile's name)
        if "://" in path:
            return _uri_files(path).GFile(path, mode)
        return open(path, mode)
