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
import statistics
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


def _noop() -> None:
    return None


class PlanDecoder:
    """One plan's way of decoding, kept from one chunk of inputs to the next (`decode`): its worker threads or
    processes start once (`startup` seconds, the processes' start included), so that a run can go from one plan to
    another and back between chunks without starting them again. `close` stops them.

    If worker processes cannot start (e.g. a calling script without an `if __name__ == "__main__"` guard), the
    plan decodes with threads instead, with a warning."""

    def __init__(self, plan: dict, *, height: int, width: int, channels: int, check_extension: bool,
                 clock: Callable[[], float] = time.monotonic):
        self.plan = plan
        self.args = (height, width, channels, check_extension)
        self.workers = max(1, plan["workers"])
        self.use_tensorflow = bool(plan.get("use_tensorflow"))
        self.use_processes = plan["use_processes"] and self.workers > 1 and not self.use_tensorflow
        start = clock()
        self.executor: concurrent.futures.Executor | None = None
        if self.use_processes:
            # forkserver: children start clean instead of inheriting TensorFlow's threads through fork.
            self.executor = concurrent.futures.ProcessPoolExecutor(
                self.workers, mp_context=multiprocessing.get_context("forkserver"))
            try:
                for future in [self.executor.submit(_noop) for _ in range(self.workers)]:
                    future.result()
            except concurrent.futures.process.BrokenProcessPool as e:
                self._to_threads(e)
        elif self.use_tensorflow or self.workers > 1:
            self.executor = concurrent.futures.ThreadPoolExecutor(self.workers)
        self.tensorflow = tensorflow_decoder(height, width, channels) if self.use_tensorflow else None
        self.traced = False
        self.startup = clock() - start

    def _to_threads(self, error: Exception) -> None:
        log.warning("decode worker processes could not start (%s); decoding with threads instead", error)
        self.executor.shutdown(wait=False, cancel_futures=True)
        self.executor = concurrent.futures.ThreadPoolExecutor(self.workers)
        self.use_processes = False

    def trace(self, items: list[Item]) -> None:
        """TensorFlow's plan: traces its decoders on these files' kinds (what a first call costs), once."""
        if self.tensorflow is not None and not self.traced:
            self.tensorflow.trace(items[:8])
            self.traced = True

    def decode(self, items: Iterable[Item], tensorflow_batch: int = 256) -> Iterator[Example]:
        """The examples of `items`, decoded with this plan, in input order, with at most a few batches per worker
        in flight (memory stays bounded whatever the number of files)."""
        height, width, channels, check_extension = self.args
        if self.tensorflow is not None:  # threads that hand whole batches to TensorFlow
            pending: collections.deque = collections.deque()
            for batch in data.batched(items, tensorflow_batch):
                pending.append(self.executor.submit(self.tensorflow.decode_examples, batch, check_extension))
                if len(pending) >= 2 * self.workers:
                    yield from pending.popleft().result()
            while pending:
                yield from pending.popleft().result()
            return
        if self.executor is None:
            for batch in data.batched(items, 64):
                yield from decode_files(batch, *self.args)
            return
        pending = collections.deque()
        yielded = False
        items = iter(items)
        submitted: list[list[Item]] = []  # the batches in flight, to decode again with threads if processes fail
        try:
            # processes return rows and one array (decode_batch), threads their examples as they are
            decode, unbatch = (decode_batch, _unbatch) if self.use_processes else (decode_files, iter)
            for batch in data.batched(items, 64 if self.use_processes else 8):
                pending.append(self.executor.submit(decode, batch, *self.args))
                submitted.append(batch)
                if len(pending) >= 4 * self.workers:
                    yield from unbatch(pending.popleft().result())
                    submitted.pop(0)
                    yielded = True
            while pending:
                yield from unbatch(pending.popleft().result())
                submitted.pop(0)
                yielded = True
        except concurrent.futures.process.BrokenProcessPool as e:
            if yielded:
                raise
            self._to_threads(e)
            yield from self.decode(itertools.chain.from_iterable(submitted + [list(items)]))

    def close(self) -> None:
        if self.executor is not None:
            self.executor.shutdown(wait=True, cancel_futures=True)
            self.executor = None


def parallel_decode(items: Callable[[], Iterable[Item]], *, height: int, width: int, channels: int,
                    check_extension: bool, workers: int, use_processes: bool,
                    use_tensorflow: bool = False, tensorflow_batch: int = 256) -> Iterator[Example]:
    """Decodes the files of `items()` with one plan (see `PlanDecoder`) and yields them in input order; see
    `planned_decode` for how the plan is chosen."""
    decoder = PlanDecoder({"workers": workers, "use_processes": use_processes, "use_tensorflow": use_tensorflow},
                          height=height, width=width, channels=channels, check_extension=check_extension)
    try:
        yield from decoder.decode(items(), tensorflow_batch)
    finally:
        decoder.close()


# Below this many inputs one worker is used: measuring would cost more than it could save.
MEASURE_MIN_INPUTS = 1000
MEASURE_SAMPLE = 300  # the first files, whose heads say which share TensorFlow's batches would decode themselves
# Files above this size on average are photos: below MEASURE_MIN_INPUTS they are decoded by one thread per CPU
# (PIL releases the GIL while decoding, resizing and encoding: 2 threads win on 480x480 JPEGs, see planned_decode)
# rather than by one worker, and above it one worker is not a candidate: on photos it decodes in the thread that
# builds and writes the records, which nothing overlaps. npm's 307x173 food photos average 17 KB: 2 threads decoded
# 2,000 of them in 0.93-0.97 s, one worker in 2.1-2.7 s.
PHOTO_BYTES = 8 << 10
# Worker processes take a second or two to start: they are only tried when the run would take longer than this.
PROCESSES_WORTH_SECONDS = 10.0

# How DecodePlanner measures. A chunk of 300 28x28 PNGs lasts 10-20 ms, less than one time slice another process
# takes on a busy machine: one such sample per plan picked one worker in one run of three on the same million files
# (7.7k images/s against 19.3k with TensorFlow's batches), so each plan decodes several longer chunks, interleaved.
PROBE_ROUNDS = 3  # chunks of each candidate before the first choice, in rounds of alternating order
CHUNK_SECONDS = 0.25  # a chunk of the probe or of a re-check lasts about this long at its plan's measured rate
# a chunk of the running plan, this long: each chunk ends with its last batches draining (a thread may wait while
# the other finishes its batch), which longer chunks pay less often
RUN_CHUNK_SECONDS = 1.0
FIRST_CHUNK = 128  # inputs of a plan's first chunk, before it has a rate
MIN_CHUNK = 50
MAX_CHUNK = 65536
PROBE_SHARE = 0.2  # the probe's chunks take at most this share of the expected inputs
# A plan simpler than the fastest (earlier in candidate_plans) and within this share of its rate is kept; a run
# switches plans only when the other is faster by this share
KEEP_MARGIN = 0.15
RECHECK_EVERY = 2  # chunks of the running plan before the runner-up decodes one; doubled after each re-check that
RECHECK_MAX = 16   # confirms the running plan, up to this; back to RECHECK_EVERY after a switch
WINDOW = 5  # a plan's rate: the median of its last WINDOW chunks


def plan_label(plan: dict) -> str:
    if plan.get("use_tensorflow"):
        return f"TensorFlow batches x{plan['workers']}"
    if plan["workers"] <= 1:
        return "one worker"
    return f"{plan['workers']} {'processes' if plan['use_processes'] else 'threads'}"


class DecodePlanner:
    """Which candidate plan decodes the next chunk of inputs, from the rates (files a second, the step's work on
    them included) of the chunks measured before; `planned_decode` asks it (`next_plan`, `chunk_size`) and tells it
    each chunk's measurement (`record`). It never sees a clock: tests drive it with measurements.

    Probe: PROBE_ROUNDS rounds, each running every candidate on one chunk, in alternating order (A B C, C B A,
    A B C), so that load that comes or goes during the probe hits every plan alike; a plan's rate is the median of its
    chunks, so one disturbed chunk moves nothing. The fastest wins, unless a simpler plan (earlier in `plans`) is
    within `margin` of it: that one is kept. Worker processes are dropped untried when a plan measured before them
    would finish the run within PROCESSES_WORTH_SECONDS.

    Then the run goes on in longer chunks of the chosen plan. Every `recheck_every` chunks the runner-up decodes one, and
    the run switches to it when the median of its last `window` chunks beats the running plan's by `margin` at two
    re-checks in a row (the second after one more chunk of the running plan). A
    re-check that finds the running plan ahead by `margin` doubles the interval (to `recheck_max`); a switch, or a
    re-check too close to tell, sets it back to `recheck_every`."""

    def __init__(self, plans: list[dict], *, expected: int, rounds: int | None = None, margin: float | None = None,
                 recheck_every: int | None = None, recheck_max: int | None = None, window: int | None = None,
                 chunk_seconds: float | None = None, run_chunk_seconds: float | None = None, first_chunk: int | None = None, min_chunk: int | None = None,
                 max_chunk: int | None = None, probe_share: float | None = None):
        """Each setting left None is the module's constant of that name (PROBE_ROUNDS, KEEP_MARGIN, ...)."""
        if not plans:
            raise ValueError("DecodePlanner needs at least one candidate plan")

        def setting(value, default):
            return default if value is None else value

        rounds, margin = setting(rounds, PROBE_ROUNDS), setting(margin, KEEP_MARGIN)
        recheck_every, recheck_max = setting(recheck_every, RECHECK_EVERY), setting(recheck_max, RECHECK_MAX)
        window, chunk_seconds = setting(window, WINDOW), setting(chunk_seconds, CHUNK_SECONDS)
        run_chunk_seconds = setting(run_chunk_seconds, RUN_CHUNK_SECONDS)
        first_chunk, min_chunk = setting(first_chunk, FIRST_CHUNK), setting(min_chunk, MIN_CHUNK)
        max_chunk, probe_share = setting(max_chunk, MAX_CHUNK), setting(probe_share, PROBE_SHARE)
        self.plans = {plan_label(plan): plan for plan in plans}
        self.candidates = list(self.plans)  # simplest first
        self.expected = expected
        self.margin, self.window = margin, window
        self.recheck_every, self.recheck_max = recheck_every, recheck_max
        self.chunk_seconds, self.first_chunk = chunk_seconds, first_chunk
        self.run_chunk_seconds = run_chunk_seconds
        self.min_chunk, self.max_chunk = min_chunk, max_chunk
        self.probe_chunk = max(min_chunk, int(expected * probe_share / (rounds * len(plans))))
        self.recent = {label: collections.deque(maxlen=window) for label in self.plans}
        self.history: dict[str, list[float]] = {label: [] for label in self.plans}
        self.inputs = {label: 0 for label in self.plans}
        self.startup = {label: 0.0 for label in self.plans}
        self.probe = [label for r in range(rounds) for label in (self.candidates if r % 2 == 0
                                                                 else reversed(self.candidates))]
        self.current: str | None = None  # the chosen plan, once the probe is over
        self.challenger: str | None = None  # the runner-up the re-checks measure
        self.running: str | None = None  # the plan of the chunk handed out last
        self.interval = recheck_every
        self.since_check = 0
        self.leading = False  # the runner-up was ahead at the last re-check
        self.done = 0
        self.switches: list[dict] = []
        self.decision = ""

    @property
    def probing(self) -> bool:
        return self.current is None

    def next_plan(self) -> dict:
        """The plan of the next chunk."""
        while self.probe and self.probe[0] not in self.candidates:
            self.probe.pop(0)
        if self.probe:
            self.running = self.probe.pop(0)
        else:
            if self.current is None:
                self._choose()
            self.running = (self.challenger if self.challenger and self.since_check >= self.interval
                            else self.current)
        return self.plans[self.running]

    def chunk_size(self, plan: dict) -> int:
        """Inputs for a chunk of `plan`: about `chunk_seconds` of it at its measured rate (`run_chunk_seconds` for
        the running plan once the probe is over)."""
        label = plan_label(plan)
        seconds = self.run_chunk_seconds if label == self.current else self.chunk_seconds
        size = (self.first_chunk if not self.recent[label]
                else int(statistics.median(self.recent[label]) * seconds))
        if self.probing:
            size = min(size, self.probe_chunk)
        return max(self.min_chunk, min(self.max_chunk, size))

    def record(self, plan: dict, inputs: int, files: int, seconds: float, startup: float = 0.0) -> None:
        """One chunk's measurement: `inputs` taken from the stream, `files` of them decoded (not rejected before
        decoding), in `seconds`; `startup`: the seconds the plan's workers took to start, if they started for it."""
        label = plan_label(plan)
        rate = max(files, 1) / max(seconds, 1e-9)
        self.recent[label].append(rate)
        self.history[label].append(rate)
        self.inputs[label] += inputs
        self.startup[label] += startup
        self.done += inputs
        if self.probing:
            left = max(self.expected - self.done, 0)
            if not plan["use_processes"] and left / rate < PROCESSES_WORTH_SECONDS:
                self.candidates = [c for c in self.candidates if not self.plans[c]["use_processes"]]
            return
        if label == self.current:
            self.since_check += 1
            return
        self.since_check = 0
        if self._rate(label) > self._rate(self.current) * (1 + self.margin) and not self.leading:
            # ahead once: looked at again after one more chunk of the running plan (whose window a few disturbed
            # chunks in a row can drag down), and switched to if still ahead
            self.leading = True
            self.interval = 1
        elif self._rate(label) > self._rate(self.current) * (1 + self.margin):
            self.leading = False
            self.switches.append({"at_input": self.done, "from": self.current, "to": label,
                                  "rates": {self.current: round(self._rate(self.current)),
                                            label: round(self._rate(label))}})
            log.info("preprocess: switched to decoding with %s (at input %d: %s %s/s against %s %s/s, the medians "
                     "of their last %d chunks)", label, self.done, label, f"{self._rate(label):,.0f}",
                     self.current, f"{self._rate(self.current):,.0f}", self.window)
            self.current, self.challenger = label, self.current
            self.interval = self.recheck_every
        elif self._rate(self.current) > self._rate(label) * (1 + self.margin):
            self.leading = False
            self.interval = min(2 * self.interval, self.recheck_max)
        else:  # too close to tell: looked at again as soon as at first
            self.leading = False
            self.interval = self.recheck_every

    def finish(self) -> None:
        """The inputs ran out: a probe cut short chooses from what it measured."""
        if self.current is None and any(self.recent.values()):
            self._choose()

    def _rate(self, label: str) -> float:
        return statistics.median(self.recent[label])

    def _choose(self) -> None:
        measured = [label for label in self.candidates if self.recent[label]]
        best = max(measured, key=self._rate)
        self.current = next(label for label in measured
                            if self._rate(label) * (1 + self.margin) >= self._rate(best))
        others = [label for label in measured if label != self.current]
        self.challenger = max(others, key=self._rate) if others else None
        chunks = "/".join(str(len(self.history[label])) for label in measured)
        kept = f"; kept within {self.margin:.0%} of {best}" if self.current != best else ""
        self.decision = (f"decoding with {self.current} (medians of {chunks} interleaved chunks, records built: "
                         + ", ".join(f"{label} {self._rate(label):,.0f}/s" for label in measured) + kept
                         + (f"; re-checking {self.challenger} as the run goes on" if self.challenger else "") + ")")
        log.info("preprocess: %s", self.decision)

    def report(self) -> dict:
        """What was measured and chosen: the step's result carries it (PreprocessResult.decode_plan)."""
        return {"measured": True, "chosen": self.switches[0]["from"] if self.switches else self.current,
                "final": self.current, "decision": self.decision, "switches": self.switches,
                "plans": {label: {"chunks": len(rates), "inputs": self.inputs[label],
                                  "median_per_s": round(statistics.median(rates)), "min_per_s": round(min(rates)),
                                  "max_per_s": round(max(rates)), "startup_s": round(self.startup[label], 3)}
                          for label, rates in self.history.items() if rates}}


def candidate_plans(source: str, cpus: int) -> list[dict]:
    """The ways to decode `source` with `cpus` CPUs that `planned_decode` chooses from, simplest first."""
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


def measured_candidates(items: Callable[[], Iterable[Item]], plans: list[dict], *, height: int, width: int,
                        channels: int) -> list[dict]:
    """The candidates worth measuring on these files: one worker not on photos (it decodes in the thread that
    builds and writes the records, which nothing overlaps: a sample of a hundred files on a busy machine measured
    it ahead of 2 threads in one run of three that the whole runs then lost by 2-3x); TensorFlow's batches only
    where they would decode at least half the files themselves (the rest need PIL's conversions: nothing for
    TensorFlow to win, a tracing to pay); plain threads not where TensorFlow's batches decode most files of raw
    records (they are the same threads less TensorFlow's C++ decode, and measuring them cost 0.003 ms of CPU a file
    over a 10,000-PNG run: 300 28x28 PNGs at 6.9k/s, GIL-bound, against 30k/s)."""
    photos = _photos(items)
    first = list(itertools.islice(items(), MEASURE_SAMPLE))
    share = (_share_for_tensorflow(first, height, width, channels) if any(p.get("use_tensorflow") for p in plans)
             else 0.0)
    threads_lose = not photos and share >= 0.5 and data.record_encoding(width, "file") == data.RAW
    kept = []
    for plan in plans:
        if plan.get("use_tensorflow"):
            if share < 0.5:
                continue
        elif plan["workers"] <= 1:
            if photos:
                continue
        elif not plan["use_processes"] and threads_lose:
            continue
        kept.append(plan)
    return kept or plans[:1]


def decode_plan(source: str, cpus: int, items: Callable[[], Iterable[Item]] | None = None, *, expected: int = 0,
                height: int = 28, width: int = 28, channels: int = 1, check_extension: bool = True,
                clock: Callable[[], float] = time.monotonic) -> dict:
    """The plan `planned_decode` would start the run of `source` with (its probe run on the first inputs of
    `items()`, their examples dropped)."""
    plans = candidate_plans(source, cpus)
    if len(plans) == 1 or items is None or expected < MEASURE_MIN_INPUTS:
        return plans[0]
    shape = dict(height=height, width=width, channels=channels)
    planner = DecodePlanner(measured_candidates(items, plans, **shape), expected=expected)
    for _ in _chunked(items, planner, shape=dict(shape, check_extension=check_extension), clock=clock,
                      probe_only=True):
        pass
    return planner.plans[planner.current]


def planned_decode(items: Callable[[], Iterable[Item]], *, source: str, cpus: int, expected: int, height: int,
                   width: int, channels: int, check_extension: bool, clock: Callable[[], float] = time.monotonic,
                   planner: DecodePlanner | None = None, report: dict | None = None) -> Iterator[Example]:
    """Decodes the inputs of `items()` in order with the plan that measures fastest here, measured as the run goes.

    Which plan wins depends on the files and the machine, not on a rule: for 28x28 PNGs on 2 CPUs, one worker
    decoded 14.8k/s, 2 threads 6.9k/s (GIL contention: most of a small decode is Python inside PIL), 2
    processes 18.2k/s and TensorFlow batches from 2 threads 30.1k/s; for 480x480 JPEGs, which need resizing (PIL's
    job), 2 threads win (PIL releases the GIL while decoding). So with at least MEASURE_MIN_INPUTS inputs expected,
    the inputs are decoded in chunks, each by the plan `planner` (a DecodePlanner over `measured_candidates`) names:
    first each candidate on a few chunks in turn, then the chosen plan, with the runner-up re-checked now and then.
    Each chunk's examples are yielded as they come, and its time runs until the last is taken (the step's work on
    them is part of the measurement): nothing is decoded twice, and every plan gives the same examples, so the
    stream is the same whichever plans ran. The choice and the measured rates are logged (one line, and one per
    switch) and, where `report` is given, put in it (DecodePlanner.report).
    """
    plans = candidate_plans(source, cpus)
    shape = dict(height=height, width=width, channels=channels, check_extension=check_extension)
    if planner is None and (len(plans) == 1 or expected < MEASURE_MIN_INPUTS):
        few = plans[0] if len(plans) == 1 or not _photos(items) else {"workers": cpus, "use_processes": False}
        if report is not None:
            report.update(measured=False, chosen=plan_label(few), final=plan_label(few), switches=[], plans={},
                          decision=f"decoding with {plan_label(few)} (by rule: "
                                   + ("one candidate" if len(plans) == 1 else
                                      f"under {MEASURE_MIN_INPUTS} inputs") + ")")
        yield from parallel_decode(items, **shape, **few)
        return
    if planner is None:
        planner = DecodePlanner(measured_candidates(items, plans, height=height, width=width, channels=channels),
                                expected=expected)
    yield from _chunked(items, planner, shape=shape, clock=clock)
    if report is not None:
        report.update(planner.report())


def _chunked(items: Callable[[], Iterable[Item]], planner: DecodePlanner, *, shape: dict,
             clock: Callable[[], float], probe_only: bool = False) -> Iterator[Example]:
    """The examples of `items()`, in order, decoded chunk by chunk with the plans `planner` names (each plan's
    workers started once and kept until the end, or until the plan is out of the running)."""
    decoders: dict[str, PlanDecoder] = {}
    remaining = iter(items())
    try:
        while True:
            plan = planner.next_plan()
            if probe_only and not planner.probing:
                break
            label = plan_label(plan)
            chunk = list(itertools.islice(remaining, planner.chunk_size(plan)))
            if not chunk:
                planner.finish()
                break
            startup = 0.0
            if label not in decoders:
                decoders[label] = PlanDecoder(plan, **shape, clock=clock)
                started = clock()
                decoders[label].trace(chunk)  # TensorFlow's tracing: start-up, not rate
                startup = decoders[label].startup + clock() - started
            decoder = decoders[label]
            workers = max(1, plan["workers"])
            per_thread = -(-len(chunk) // workers)  # a chunk in one batch per thread: every thread busy
            start = clock()
            yield from decoder.decode(chunk, tensorflow_batch=min(256, -(-per_thread // EXACT_REST) * EXACT_REST))
            planner.record(plan, len(chunk), sum(1 for item in chunk if not item.problem), clock() - start, startup)
            for gone in [name for name in decoders if not planner.probing
                         and name not in (planner.current, planner.challenger)]:
                decoders.pop(gone).close()
    finally:
        for decoder in decoders.values():
            decoder.close()


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
