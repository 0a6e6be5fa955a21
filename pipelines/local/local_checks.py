"""What a local run checks before anything runs: that the files it will read are there.

A local `--data`, `--predict-images` or `--pretrained` path that does not exist, or holds no readable, non-empty file, is refused
at once with the path and what is expected, instead of a step failing minutes later. Remote sources (gs://,
tfds:) are the steps' to check, with their credentials and downloads.
"""

from __future__ import annotations

import glob
import os
import re

GLOB_CHARS = re.compile(r"[*?\[]")  # as batch prediction tells a glob (components/predict/sources.py)

LOCAL_SOURCES = {"data": ("--data", "an idx directory, a folder with one subfolder per class, a CSV/JSONL manifest "
                                    "or tfds:NAME"),
                 "predict_images": ("--predict-images", "a folder of images, a glob, a manifest or TFRecord shards"),
                 "pretrained": ("--pretrained", "none, imagenet, a .weights.h5 or .keras file or a registered model's "
                                               "directory")}
NOT_PATHS = {"pretrained": ("none", "imagenet")}  # values of a source parameter that name no file


def _readable(path: str) -> bool:
    try:
        with open(path, "rb") as f:
            return bool(f.read(1))
    except OSError:
        return False


def _source_problem(path: str) -> str | None:
    """Why a local source path cannot be read: it does not exist, or holds no readable, non-empty file."""
    if GLOB_CHARS.search(path):
        matches = glob.glob(path, recursive=True)
        if not any(os.path.isfile(m) and _readable(m) for m in matches):
            return f"{path} matches no readable file" if matches else f"{path} matches no file"
        return None
    if not os.path.exists(path):
        return f"{path} does not exist"
    if os.path.isfile(path):
        return None if _readable(path) else f"{path} cannot be read, or is empty"
    if not os.access(path, os.R_OK | os.X_OK):
        return f"{path} cannot be read (permissions)"
    seen, folders, visited = 0, [path], set()
    while folders:  # depth first, links followed once; stops at the first readable file
        folder = folders.pop()
        try:
            identity = os.stat(folder)
            if (identity.st_dev, identity.st_ino) in visited:
                continue
            visited.add((identity.st_dev, identity.st_ino))
            entries = sorted(os.scandir(folder), key=lambda e: e.name)
        except OSError:
            continue
        for entry in entries:
            if entry.is_dir():
                folders.append(entry.path)
                continue
            seen += 1
            if _readable(entry.path):
                return None
    return f"{path} holds no readable file" + (f" ({seen} files, none readable or all empty)" if seen else
                                               " (it is empty)")


def check_local_sources(params: dict) -> None:
    """Refuses, before anything runs, a local --data, --predict-images or --pretrained path that does not exist or holds nothing
    readable, naming the path and what is expected."""
    from components import params as parameters

    problems = []
    for name, (flag, expected) in LOCAL_SOURCES.items():
        path = params.get(name, parameters.default(name))
        if not path or "://" in path or path.startswith("tfds:") or path in NOT_PATHS.get(name, ()):
            continue
        problem = _source_problem(path)
        if problem is None:
            continue
        if name == "data" and path == parameters.DEFAULT_SOURCE:
            expected = ("install the default dataset with `make data` (Debian's dataset-fashion-mnist), or give "
                        "--data " + expected)
        problems.append(f"{flag}: {problem}; expected {expected}")
    if problems:
        raise ValueError("\n".join(problems))
