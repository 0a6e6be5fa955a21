"""Decoding image files in parallel (processes or threads, chosen by a measurement on this machine) with
bounded memory. What happens to each image is components/preprocess/per_image.py."""

from __future__ import annotations

import collections
import concurrent.futures
import functools
import itertools
import logging
import multiprocessing
import os
import time
from typing import Callable, Iterable, Iterator

import numpy as np

from components.dataio import data
from components.dataio.images import available_cpus  # noqa: F401 (the step and benchmarks take it from here too)
from components.preprocess import per_image
from components.preprocess.inputs import Example, Item

log = logging.getLogger(__name__)


def decode_batch(items: list[Item], height: int, width: int, channels: int,
                 check_extension: bool) -> tuple[list[tuple], np.ndarray]:
    """Decodes a batch into (uri, label, split, key, reason, detail, stored, encoding, source) rows and one array
    of the good images: a single array crosses a process boundary far cheaper than one per image."""
    return _batched(decode_files(items, height, width, channels, check_extension), height, width, channels)


def decode_files(items: list[Item], height: int, width: int, channels: int,
                 check_extension: bool) -> list[Example]:
    """The examples of a batch, decoded in this process (threads take them as they are, with no round trip
    through decode_batch's rows and array)."""
    return [Example(item.uri, item.label, item.split, reason=item.problem[0], detail=item.problem[1])
            if item.problem else
            per_image.decode_file(item.uri, item.label, item.split, height, width, channels, check_extension)
            for item in items]


def _batched(examples: list[Example], height: int, width: int, channels: int) -> tuple[list[tuple], np.ndarray]:
    good = [e.image for e in examples if e.image is not None]
    images = np.stack(good) if good else np.zeros((0, height, width, channels), np.uint8)
    return [(e.uri, e.label, e.split, e.key, e.reason, e.detail, e.stored, e.encoding,
             (e.source_size, e.source_bytes, e.reencoded, e.histogram, e.near_key)) for e in examples], images


def _share_for_tensorflow(sample: list[Item], height: int, width: int, channels: int) -> float:
    """The share of the sample's files that TensorFlowDecoder would decode itself (their first 64 KB read)."""
    files = [item.uri for item in sample if not item.problem and "://" not in item.uri]
    routed = 0
    for uri in files:
        try:
            with open(uri, "rb") as f:
                routed += per_image.exact_format(f.read(65536), height, width, channels) is not None
        except OSError:
            pass
    return routed / max(len(files), 1)


# TensorFlowDecoder's traced decoders take this many files a call: one decode op per file, side by side in one
# graph; what is left of a batch goes EXACT_REST at a time, the last call padded with copies of its last file
EXACT_CHUNK = 128
EXACT_REST = 16


@functools.lru_cache(maxsize=16)
def _exact_decoder(kind: str, shape: tuple[int, int, int], size: int = EXACT_CHUNK):
    """A traced function: `size` files' bytes -> uint8 size x H x W x C, one `decode_png` or
    `decode_jpeg` (the exact integer DCT) per file, unrolled in one graph that TensorFlow's executor runs in
    parallel. tf.map_fn's loop (batch prediction's `batch_decoder`) spends about ten ops a file around the decode:
    25.4 us of CPU a 28x28 PNG in batches of 256, 14.7 unrolled by 128, and its tracing took 0.15 s, this 0.06."""
    import tensorflow as tf

    channels = shape[2]

    def decode_one(contents):
        if kind == "PNG":
            return tf.io.decode_png(contents, channels=channels)
        return tf.io.decode_jpeg(contents, channels=channels, dct_method="INTEGER_ACCURATE")

    @tf.function(input_signature=[tf.TensorSpec([size], tf.string)])
    def decode(contents):
        with tf.device("/CPU:0"):
            # stack fails (an OpError, as a corrupt file does) unless every image has the routed shape
            return tf.ensure_shape(tf.stack([decode_one(c) for c in tf.unstack(contents, size)]), [size, *shape])

    return decode


def _decode_exact(kind: str, shape: tuple[int, int, int], contents: list[bytes]) -> np.ndarray:
    """The images of `contents` (files `per_image.exact_format` routes to `kind`), decoded by `_exact_decoder`."""
    parts = []
    start = 0
    while start < len(contents):
        size = EXACT_CHUNK if len(contents) - start >= EXACT_CHUNK else EXACT_REST
        chunk = contents[start:start + size]
        padded = chunk + [chunk[-1]] * (size - len(chunk))
        parts.append(_exact_decoder(kind, shape, size)(padded).numpy()[:len(chunk)])
        start += size
    return parts[0] if len(parts) == 1 else np.concatenate(parts)


@functools.lru_cache(maxsize=4)
def tensorflow_decoder(height: int, width: int, channels: int) -> "TensorFlowDecoder":
    """One decoder per shape and process: its tf.function is traced once (measuring, then decoding)."""
    return TensorFlowDecoder(height, width, channels)


class TensorFlowDecoder:
    """Decodes, in TensorFlow's C++ decoders over a whole batch (in parallel, without the GIL), the files that need
    no conversion: 8-bit PNGs and JPEGs already of the target size and colour type (JPEG: the exact integer DCT, as
    Pillow uses), without EXIF orientation. These decode to the same pixels as `data.decode_image`
    (tests/test_preprocess.py checks); every other file, and a batch that fails, goes through it (PIL), which
    converts what it can and gives the reason for what it cannot.

    The files are read and routed in Python (`route`), and only the decoding runs in TensorFlow, one op per file
    (`_exact_decoder`, EXACT_CHUNK files a call): with reading and routing inside the graph, a dozen ops per file
    in tf.map_fn's loop, `decode_examples` cost 0.060-0.062 ms of CPU per 28x28 PNG; with only the decode in
    that loop 0.049 (10,000 files, the same examples). Unrolled, without the loop: `decode_examples` alone, one
    thread, 2,816 PNGs in batches of 256, 0.031-0.034 ms a file against 0.041-0.048 with the loop."""

    def __init__(self, height: int, width: int, channels: int):
        import tensorflow as tf

        self.shape = (height, width, channels)
        self.errors = (tf.errors.OpError,)

    def trace(self, items: list[Item]) -> None:
        """Traces and runs once the decoders of the kinds of these files (what a first call costs): on one file of
        each kind, copied, whose pixels are dropped."""
        kinds: dict[str, bytes] = {}
        for item in items:
            if not item.problem and "://" not in item.uri:
                try:
                    raw = data.read_bytes(item.uri)
                except data.ImageError:
                    continue
                kinds.setdefault(self.route(raw), raw)
        kinds.pop(None, None)
        for kind, raw in sorted(kinds.items()):
            for size in (EXACT_CHUNK, EXACT_REST):
                try:
                    _exact_decoder(kind, self.shape, size)([raw] * size)
                except self.errors:  # a corrupt file: traced all the same
                    pass

    def route(self, raw: bytes) -> str | None:
        """What TensorFlow decodes: "PNG", "JPEG" or None."""
        return per_image.exact_format(raw, *self.shape)

    def decode_examples(self, items: list[Item], check_extension: bool) -> list[Example]:
        """The examples of a batch, TensorFlow decoding what it can. A file that cannot be read gets its reason as
        `decode_file` gives it; a decoder batch holding a file TensorFlow cannot decode (corrupt) goes through
        `per_image.decode_contents` (PIL) file by file, which says why. (Threads only: examples stay in this
        process, with no round trip through decode_batch's arrays.)"""
        height, width, channels = self.shape
        examples: list[Example | None] = [None] * len(items)
        routed: dict[str, list[tuple[int, bytes]]] = {"PNG": [], "JPEG": []}
        for position, item in enumerate(items):
            problem = item.problem or (per_image.extension_problem(item.uri) if check_extension else None)
            if problem:
                examples[position] = Example(item.uri, item.label, item.split, reason=problem[0], detail=problem[1])
                continue
            if "://" in item.uri:  # remote files: decode_plan never picks this plan for them
                return decode_files(items, height, width, channels, check_extension)
            try:
                raw = data.read_bytes(item.uri)
            except data.ImageError as e:
                examples[position] = Example(item.uri, item.label, item.split, reason=e.reason, detail=e.detail)
                continue
            kind = self.route(raw)
            if kind:
                routed[kind].append((position, raw))
            else:
                examples[position] = per_image.decode_contents(item, raw, height, width, channels)
        for kind, files in routed.items():
            if not files:
                continue
            try:
                images = _decode_exact(kind, self.shape, [raw for _, raw in files])
            except self.errors:
                for position, raw in files:
                    examples[position] = per_image.decode_contents(items[position], raw, height, width, channels)
                continue
            encoding = data.record_encoding(width, kind)
            source_size = (height, width) if encoding == data.SOURCE else None
            key = per_image.content_key
            for (position, raw), image in zip(files, images):
                item = items[position]
                # an exact file is its own stored form (per_image.stored_form); raw records store the pixels. A
                # source record's near-duplicate key is the one decode_source gives it (from its check decode)
                examples[position] = Example(item.uri, item.label, item.split, key(raw), image,
                                             stored=None if encoding == data.RAW else raw, encoding=encoding,
                                             source_size=source_size, source_bytes=len(raw),
                                             near_key=None if source_size is None else
                                             data.source_near_key(raw, channels))
        return examples


def _unbatch(decoded: tuple[list[tuple], np.ndarray]) -> Iterator[Example]:
    rows, images = decoded
    next_image = 0
    for uri, label, split, key, reason, detail, stored, encoding, (source_size, source_bytes, reencoded,
                                                                   histogram, near_key) in rows:
        if reason:
            yield Example(uri, label, split, key, None, reason, detail)
        elif histogram is not None:  # a source record: no pixels travel
            yield Example(uri, label, split, key, None, stored=stored, encoding=encoding, source_size=source_size,
                          source_bytes=source_bytes, reencoded=reencoded, histogram=histogram, near_key=near_key)
        else:
            yield Example(uri, label, split, key, images[next_image], stored=stored, encoding=encoding,
                          source_size=source_size, source_bytes=source_bytes, reencoded=reencoded,
                          near_key=near_key)
            next_image += 1


def parallel_decode(items: Callable[[], Iterable[Item]], *, height: int, width: int, channels: int,
                    check_extension: bool, workers: int, use_processes: bool,
                    use_tensorflow: bool = False, tensorflow_batch: int = 256) -> Iterator[Example]:
    """Decodes the files of `items()` in parallel and yields them in input order, with at most 4 batches per
    worker in flight (memory stays bounded whatever the number of files).

    See `decode_plan` for when processes and when threads are used. If worker processes cannot start (e.g. a
    calling script without an `if __name__ == "__main__"` guard), decoding falls back to threads with a warning.
    """
    args = (height, width, channels, check_extension)
    if use_tensorflow:  # threads that hand whole batches to TensorFlow, overlapping the main process's work
        decoder = tensorflow_decoder(height, width, channels)
        with concurrent.futures.ThreadPoolExecutor(max(1, workers)) as executor:
            pending: collections.deque = collections.deque()
            for batch in data.batched(items(), tensorflow_batch):
                pending.append(executor.submit(decoder.decode_examples, batch, check_extension))
                if len(pending) >= 2 * max(1, workers):
                    yield from pending.popleft().result()
            while pending:
                yield from pending.popleft().result()
        return
    if workers <= 1:
        for batch in data.batched(items(), 64):
            yield from decode_files(batch, *args)
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
            # processes return rows and one array (decode_batch), threads their examples as they are
            decode, unbatch = (decode_batch, _unbatch) if use_processes else (decode_files, iter)
            for batch in data.batched(items(), 64 if use_processes else 8):
                pending.append(executor.submit(decode, batch, *args))
                if len(pending) >= 4 * workers:
                    yield from unbatch(pending.popleft().result())
                    yielded = True
            while pending:
                yield from unbatch(pending.popleft().result())
                yielded = True
    except concurrent.futures.process.BrokenProcessPool as e:
        if yielded:
            raise
        log.warning("decode worker processes could not start (%s); decoding with threads instead", e)
        yield from parallel_decode(items, height=height, width=width, channels=channels,
                                   check_extension=check_extension, workers=workers, use_processes=False)


# Below this many inputs one worker is used: measuring would cost more than it could save.
MEASURE_MIN_INPUTS = 1000
MEASURE_SAMPLE = 300  # the most files each candidate plan decodes (fewer for smaller runs: 5% of them)
# Files above this size on average are photos: below MEASURE_MIN_INPUTS they are decoded by one thread per CPU
# (PIL releases the GIL while decoding, resizing and encoding: 2 threads win on 480x480 JPEGs, see planned_decode)
# rather than by one worker, and above it one worker is measured but not chosen (see _measure_plans). npm's
# 307x173 food photos average 17 KB: 2 threads decoded 2,000 of them in 0.93-0.97 s, one worker in 2.1-2.7 s.
PHOTO_BYTES = 8 << 10
# Worker processes take a second or two to start: they are only tried when the run would take longer than this.
PROCESSES_WORTH_SECONDS = 10.0


def candidate_plans(source: str, cpus: int) -> list[dict]:
    """The ways to decode `source` with `cpus` CPUs that `decode_plan` chooses from."""
    if "://" in source:
        # Remote files: the cost is waiting on the network, which threads overlap; a short sample of a bucket's
        # latency says little about the rest of the run, so this one stays a rule.
        return [{"workers": 4 * cpus, "use_processes": False}]
    one = {"workers": 1, "use_processes": False}
    if cpus <= 1:
        return [one]
    # Processes: one per CPU (the main process's share, building and writing records, is small next to decoding);
    # threads: they overlap file reads and the GIL-free parts of PIL's decoders (most of a large JPEG's decode,
    # little of a small PNG's).
    # TensorFlow: files that need no conversion are decoded by batches in C++, beside the main process.
    # One thread per CPU hands batches to TensorFlow: while one waits on C++ the other does its batch's Python
    # (measured on 28x28 PNGs: 1 thread 14-19k/s, 2 threads 27-29k/s, records built).
    return [one, {"workers": cpus, "use_processes": False}, {"workers": cpus, "use_processes": True},
            {"workers": cpus, "use_processes": False, "use_tensorflow": True}]


def _label(plan: dict) -> str:
    if plan.get("use_tensorflow"):
        return f"TensorFlow batches x{plan['workers']}"
    if plan["workers"] <= 1:
        return "one worker"
    return f"{plan['workers']} {'processes' if plan['use_processes'] else 'threads'}"


def decode_plan(source: str, cpus: int, items: Callable[[], Iterable[Item]] | None = None, *, expected: int = 0,
                height: int = 28, width: int = 28, channels: int = 1, check_extension: bool = True,
                clock: Callable[[], float] = time.monotonic) -> dict:
    """How to decode the files of `source` with `cpus` CPUs: measured on this machine and these files (see
    `planned_decode`, which yields what the measurement decoded instead of dropping it)."""
    plans = candidate_plans(source, cpus)
    if len(plans) == 1 or items is None or expected < MEASURE_MIN_INPUTS:
        return plans[0]
    chosen: dict = {}
    for _ in _measure_plans(items, _sample_size(expected), plans, expected, (height, width, channels, check_extension),
                            clock, chosen=chosen):
        pass
    return chosen["plan"]


def planned_decode(items: Callable[[], Iterable[Item]], *, source: str, cpus: int, expected: int, height: int,
                   width: int, channels: int, check_extension: bool,
                   clock: Callable[[], float] = time.monotonic) -> Iterator[Example]:
    """Decodes the inputs of `items()` in order with the plan that measures fastest here.

    Which plan wins depends on the files and the machine, not on a rule: for 28x28 PNGs on 2 CPUs, one worker
    decoded 14.8k/s, 2 threads 6.9k/s (GIL contention: most of a small decode is Python inside PIL), 2
    processes 18.2k/s and TensorFlow batches from 2 threads 30.1k/s; for 480x480 JPEGs, which need resizing (PIL's
    job), 2 threads win (PIL releases the GIL while decoding). So with at least MEASURE_MIN_INPUTS inputs expected,
    each candidate (`candidate_plans`) decodes the next few hundred inputs, which are yielded as they come (the
    step's own work on them is part of the measured time), and the shortest projected time for `expected` inputs
    (worker start-up included) wins: the measurement's decodes are the run's own, nothing is decoded twice. The
    choice and the measured rates are logged.
    """
    plans = candidate_plans(source, cpus)
    shape = dict(height=height, width=width, channels=channels, check_extension=check_extension)
    if len(plans) == 1 or expected < MEASURE_MIN_INPUTS:
        few = plans[0] if len(plans) == 1 or not _photos(items) else {"workers": cpus, "use_processes": False}
        yield from parallel_decode(items, **shape, **few)
        return
    chosen: dict = {}
    yield from _measure_plans(items, _sample_size(expected), plans, expected,
                              (height, width, channels, check_extension), clock, photos=_photos(items), chosen=chosen)
    yield from parallel_decode(lambda: itertools.islice(items(), chosen["consumed"], None), **shape, **chosen["plan"])


def _photos(items: Callable[[], Iterable[Item]], sample: int = 16) -> bool:
    """Whether the first local files average more than PHOTO_BYTES."""
    sizes = []
    for item in itertools.islice(items(), sample):
        if not item.problem and "://" not in item.uri:
            try:
                sizes.append(os.path.getsize(item.uri))
            except OSError:
                pass
    return bool(sizes) and sum(sizes) / len(sizes) > PHOTO_BYTES


def _sample_size(expected: int) -> int:
    return max(50, min(MEASURE_SAMPLE, expected // 20))


def _measure_plans(items: Callable[[], Iterable[Item]], sample: int, plans: list[dict], expected: int, args: tuple,
                   clock: Callable[[], float], photos: bool = False, *, chosen: dict) -> Iterator[Example]:
    """Yields, in input order, the examples of the inputs the candidate plans decode while they are measured,
    each plan on the next `sample` inputs (a run with too few inputs for that measures the later plans on the first
    inputs again and drops what they decode). Then sets chosen["plan"] (the best plan) and chosen["consumed"] (how
    many inputs were yielded). With `photos`, one worker is measured but another plan is chosen: on photos it
    decodes in the thread that builds and writes the records, which nothing overlaps, and a sample of a hundred
    files on a busy machine measured it ahead of 2 threads in one run of three that the whole runs then lost by
    2-3x."""
    remaining = iter(items())
    consumed = 0
    first: list[Item] = list(itertools.islice(remaining, sample))
    remaining = itertools.chain(first, remaining)
    # The share of the files TensorFlow's batches would decode themselves, from the first sample (their heads read)
    tensorflow_share = (_share_for_tensorflow(first, *args[:3]) if any(p.get("use_tensorflow") for p in plans)
                        else 0.0)
    # Raw records (pixels, below data.ENCODED_MIN_SIZE) decode every file whole whichever plan runs. Where most files
    # are TensorFlow's, its batches run in as many threads as plain threads would, the same PIL code for the rest
    # and the routed files' decode in C++ without the GIL: plain threads cannot win there, and measuring them cost
    # 0.003 ms of CPU a file over a 10,000-PNG run (300 28x28 PNGs at 6.9k/s, GIL-bound, against 30k/s).
    threads_lose = (not photos and tensorflow_share >= 0.5
                    and data.record_encoding(args[1], "file") == data.RAW)
    measured: list[tuple[float, float, dict]] = []
    for plan in plans:
        if plan["use_processes"] and measured and min(m[0] for m in measured) < PROCESSES_WORTH_SECONDS:
            continue
        if threads_lose and plan["workers"] > 1 and not plan["use_processes"] and not plan.get("use_tensorflow"):
            continue
        batch = list(itertools.islice(remaining, sample))
        fresh = bool(batch)
        batch = batch or first
        if plan.get("use_tensorflow") and tensorflow_share < 0.5:
            # most files need PIL's conversions: nothing for TensorFlow to win, a tracing to pay
            if fresh:  # these inputs go to the next plan measured, or to the chosen one
                remaining = itertools.chain(batch, remaining)
            continue
        files = sum(1 for item in batch if not item.problem) or len(batch)
        timing: list[tuple[float, float]] = []
        decoded = _measured(batch, files, plan, args, clock, timing)
        if fresh:
            yield from decoded
            consumed += len(batch)
        else:
            for _ in decoded:
                pass
        rate, startup = timing[0]
        measured.append((startup + expected / rate, rate, plan))
    best = min(measured[1:] if photos and len(measured) > 1 else measured, key=lambda m: m[0])[2]
    log.info("preprocess: decoding with %s (measured on %d files each, records built: %s)", _label(best), sample,
             ", ".join(f"{_label(plan)} {rate:,.0f}/s" for _, rate, plan in measured))
    chosen.update(plan=best, consumed=consumed)


def _noop() -> None:
    return None


def _measured(batch: list[Item], count: int, plan: dict, args: tuple, clock: Callable[[], float],
              timing: list[tuple[float, float]]) -> Iterator[Example]:
    """Yields the examples of `batch` decoded with `plan`, then appends to `timing` its (files per second once
    started, start-up seconds): the time between the yields, the consumer's work on each example, counts."""
    shape = dict(zip(("height", "width", "channels", "check_extension"), args))
    start = clock()
    if plan.get("use_tensorflow"):
        tensorflow_decoder(*args[:3]).trace(batch[:8])  # start-up, not rate
        started = clock()
        # the sample in one batch per thread, as the run keeps every thread busy: in batches of 256, 300 files were
        # one thread's 256 beside another's 44, measured at about one thread's rate
        share = -(-len(batch) // max(1, plan["workers"]))
        yield from parallel_decode(lambda: batch, **shape, **plan, tensorflow_batch=-(-share // EXACT_REST) * EXACT_REST)
        timing.append((count / max(clock() - started, 1e-9), started - start))
        return
    if not plan["use_processes"]:
        yield from parallel_decode(lambda: batch, **shape, **plan)
        timing.append((count / max(clock() - start, 1e-9), 0.0))
        return
    executor = concurrent.futures.ProcessPoolExecutor(plan["workers"],
                                                      mp_context=multiprocessing.get_context("forkserver"))
    yielded = False
    try:
        with executor:
            for future in [executor.submit(_noop) for _ in range(plan["workers"])]:
                future.result()
            started = clock()
            futures = [executor.submit(decode_batch, part, *args) for part in data.batched(batch, 64)]
            for future in futures:
                examples = list(_unbatch(future.result()))
                yielded = True
                yield from examples
            timing.append((count / max(clock() - started, 1e-9), started - start))
            return
    except concurrent.futures.process.BrokenProcessPool:
        if yielded:
            raise
        # processes cannot start here (parallel_decode would fall back to threads): one worker decodes the batch
    yield from parallel_decode(lambda: batch, **shape, workers=1, use_processes=False)
    timing.append((1e-9, 0.0))
