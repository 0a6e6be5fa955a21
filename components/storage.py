"""Paths that are local or gs:// (everything goes through `tf.io.gfile`), and the error for input data that cannot
be used. The bottom of the data helpers: components/images.py and components/data.py build on it."""

from __future__ import annotations

import os


def gfile():
    import tensorflow as tf

    return tf.io.gfile


def join(base: str, *parts: str) -> str:
    """os.path.join that keeps `gs://` URIs intact."""
    return "/".join([base.rstrip("/"), *parts]) if "://" in base else os.path.join(base, *parts)


class DataError(ValueError):
    """Input data that cannot be used, with a message saying what to do about it."""
