"""Decoding image files in parallel (processes or threads, chosen by a measurement on this machine) with
bounded memory. What happens to each image is components/preprocess/per_image.py."""

from __future__ import annotations

import collections
import concurrent.futures
import logging
import math
import multiprocessing
import os
from typing import Callable, Iterable, Iterator

import numpy as np

from components import data
from components.preprocess import per_image
from components.preprocess.inputs import Example, Item

log = logging.getLogger(__name__)

def available_cpus() -> int:
    """CPUs this process may use: the affinity mask, capped by a cgroup CPU quota (a pod's CPU limit),
    which os.cpu_count() ignores (it reports the node's cores)."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    try:
        with open("/sys/fs/cgroup/cpu.max") as f:  # cgroup v2: "max 100000" or "200000 100000"
            quota, period = f.read().split()
        if quota != "max":
            cpus = min(cpus, max(1, math.ceil(int(quota) / int(period))))
    except (OSError, ValueError):
        pass
    return max(1, cpus)


def decode_batch(items: list[Item], height: int, width: int, channels: int,
                 check_extension: bool) -> tuple[list[tuple], np.ndarray]:
    """Decodes a batch into (uri, label, split, key, reason, detail, stored, encoding) rows and one array of the
    good images: a single array crosses a process boundary far cheaper than one per image."""
    examples = [Example(item.uri, item.label, item.split, reason=item.problem[0], detail=item.problem[1])
                if item.problem else
                per_image.decode_file(item.uri, item.label, item.split, height, width, channels, check_extension)
                for item in items]
    good = [e.image for e in examples if e.image is not None]
    images = np.stack(good) if good else np.zeros((0, height, width, channels), np.uint8)
    return [(e.uri, e.label, e.split, e.key, e.reason, e.detail, e.stored, e.encoding) for e in examples], images


def _unbatch(decoded: tuple[list[tuple], np.ndarray]) -> Iterator[Example]:
    rows, images = decoded
    next_image = 0
    for uri, label, split, key, reason, detail, stored, encoding in rows:
        if reason:
            yield Example(uri, label, split, key, None, reason, detail)
        else:
            yield Example(uri, label, split, key, images[next_image], stored=stored, encoding=encoding)
            next_image += 1


def parallel_decode(items: Callable[[], Iterable[Item]], *, height: int, width: int,
                    channels: int, check_extension: bool, workers: int, use_processes: bool) -> Iterator[Example]:
    """Decodes the files of `items()` in parallel and yields them in input order, with at most 4 batches per
    worker in flight (memory stays bounded whatever the number of files).

    See `decode_plan` for when processes and when threads are used. If worker processes cannot start (e.g. a
    calling script without an `if __name__ == "__main__"` guard), decoding falls back to threads with a warning.
    """
    args = (height, width, channels, check_extension)
    if workers <= 1:
        for batch in data.batched(items(), 64):
            yield from _unbatch(decode_batch(batch, *args))
        return
    if use_processes:
        # forkserver: children start clean instead of inheriting TensorFlow's threads through fork.
        executor = concurrent.futures.ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("forkserver"))
    else:
        executor = concurrent.futures.ThreadPoolExecutor(workers)
    yielded = False
    try:
        with executor:
            pending: collections.deque = collections.deque()
            for batch in data.batched(items(), 64 if use_processes else 8):
                pending.append(executor.submit(decode_batch, batch, *args))
                if len(pending) >= 4 * workers:
                    yield from _unbatch(pending.popleft().result())
                    yielded = True
            while pending:
                yield from _unbatch(pending.popleft().result())
                yielded = True
    except concurrent.futures.process.BrokenProcessPool as e:
        if yielded:
            raise
        log.warning("decode worker processes could not start (%s); decoding with threads instead", e)
        yield from parallel_decode(items, height=height, width=width, channels=channels,
                                   check_extension=check_extension, workers=workers, use_processes=False)


def decode_plan(source: str, cpus: int) -> dict:
    """How to decode the files of `source` with `cpus` CPUs (measured in tests/benchmarks/ingest.py):

    - remote files (gs://...): 4 threads per CPU, since their cost is waiting on the network;
    - local files with 3+ CPUs: worker processes, one per CPU beside the main process (which writes the
      shards). For small images about 75% of a decode is Python inside PIL holding the GIL (profiled), so
      threads cannot go beyond ~1.3x whatever the cores;
    - local files with 1-2 CPUs: decode threads (1 CPU: none) overlapping the main process's work. Processes
      cost a second or two to start and the pickling of every batch, which 2 CPUs do not win back (on a
      2-CPU machine they measured slower than a single worker).
    """
    if "://" in source:
        return {"workers": 4 * cpus, "use_processes": False}
    if cpus >= 3:
        return {"workers": cpus - 1, "use_processes": True}
    return {"workers": 2 if cpus == 2 else 1, "use_processes": False}
