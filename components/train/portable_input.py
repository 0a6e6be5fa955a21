"""The training and evaluation input without TensorFlow, for the torch and JAX training paths: the shards read with
components/dataio/records.py, decoded with Pillow and numpy (components/dataio/pixels.py), augmented online with
components/dataio/augment_numpy.py; numpy batches out (float32 N x H x W x C pixel values 0-255, int32 labels), which
either framework takes as they are.

Semantics are those of inputs.TrainInput, the TensorFlow input (read its docstring): worker i of n reads shard files
i, i+n, ... (every n-th record when there are fewer files than workers); every worker takes the same number of
steps per epoch, cycling through its share; epoch e's order is a pure function of (seed, e, worker), so an attempt
that resumes at step k of epoch e gets exactly the batches the interrupted one would have; "memory" holds the
worker's share (pixels, or the files' bytes for source records with online augmentation) and gathers each batch from
a seeded permutation, "stream" reads the shards every epoch through a seeded shuffle buffer (the order of
tf.data's shuffle(buffer).repeat(), by its algorithm) and skips the batches already taken without decoding them.
Records are read in TensorFlow's interleave order, so an example's index (the augmentation's key) is the same as on
the TensorFlow path. The random streams are numpy's, not TensorFlow's: the same semantics, other permutations.

Work: a planner thread reads records (stream mode) and hands each batch, in slices, to a thread pool sized by
input_workers() (the process's share of images.available_cpus(); Pillow decodes and numpy's array operations
release the GIL); each slice writes into the batch's preallocated array; at most `prefetch` batches are in flight,
so memory stays flat.
"""

from __future__ import annotations

import concurrent.futures
import logging
import math
import queue
import threading
from typing import Callable, Iterator

import numpy as np

from components.dataio import augment_numpy, pixels, records
from components.dataio.storage import DataError
from components.train.inputs import worker_share  # its TensorFlow is inside functions

log = logging.getLogger(__name__)

# A slice of a batch handed to one worker holds at least this many pixels: below it the hand-over costs more than
# the work (a 28x28 batch goes whole to one worker).
MIN_SLICE_PIXELS = 1 << 16
_SHUFFLE_DRAWS = 4096


def _policy(online_policy: dict | None):
    from components.augment import AugmentPolicy  # TF-free at import: its TensorFlow is inside functions

    return AugmentPolicy.from_json(online_policy) if online_policy else None


def _generator(*words: int) -> np.random.Generator:
    """A numpy generator that is a pure function of the words (seed, epoch, ...)."""
    return np.random.Generator(np.random.Philox(np.random.SeedSequence([w % (1 << 63) for w in words])))


class _Pipeline:
    """Batches computed ahead by a thread pool: `plan` yields one job per batch, a (size, fill) pair where
    fill(out_images, out_labels, begin, end) fills examples [begin, end) of the batch; batches come out in order."""

    def __init__(self, pool: concurrent.futures.Executor, workers: int, image_shape, prefetch: int):
        self.pool, self.workers, self.image_shape, self.prefetch = pool, workers, list(image_shape), prefetch

    def run(self, plan: Iterator[tuple[int, Callable]]) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        ready: queue.Queue = queue.Queue(maxsize=self.prefetch)
        stop = threading.Event()
        per_slice = max(1, MIN_SLICE_PIXELS // max(1, math.prod(self.image_shape[:2])))

        def put(item) -> bool:
            while not stop.is_set():
                try:
                    ready.put(item, timeout=0.1)
                    return True
                except queue.Full:
                    continue
            return False

        def planner():
            try:
                for size, fill in plan:
                    if stop.is_set():
                        return
                    images = np.empty((size, *self.image_shape), dtype=np.float32)
                    labels = np.empty((size,), dtype=np.int32)
                    step = max(per_slice, -(-size // self.workers))
                    futures = [self.pool.submit(fill, images, labels, begin, min(size, begin + step))
                               for begin in range(0, size, step)]
                    if not put((images, labels, futures)):
                        return
                put(None)
            except BaseException as e:  # handed to the consumer, which raises it
                put(e)

        thread = threading.Thread(target=planner, name="portable-input-planner", daemon=True)
        thread.start()
        try:
            while True:
                item = ready.get()
                if item is None:
                    return
                if isinstance(item, BaseException):
                    raise item
                images, labels, futures = item
                for future in futures:
                    future.result()
                yield images, labels
        finally:
            stop.set()
            while thread.is_alive():
                try:
                    leftover = ready.get(timeout=0.1)
                    for future in (leftover[2] if isinstance(leftover, tuple) else ()):
                        future.cancel()
                except queue.Empty:
                    pass


def input_workers(workers: int | None = None, local_processes: int = 1) -> int:
    """Threads of one process's input: `workers` when given; else its share of the CPUs it may use
    (images.available_cpus()) among the `local_processes` training processes on the machine (torchrun's
    LOCAL_WORLD_SIZE, one per GPU), at least 1, so that N processes do not each start a pool of every CPU."""
    from components.dataio.images import available_cpus

    if workers:
        return max(1, workers)
    return max(1, available_cpus() // max(1, local_processes))


class PortableTrainInput:
    """The training batches of one input pipeline (one per worker), seekable to any step of any epoch, without
    TensorFlow (see the module docstring; inputs.TrainInput is the TensorFlow twin)."""

    def __init__(self, train_dir: str, image_shape, *, pipeline_id: int, num_pipelines: int, recipe,
                 online_policy: dict | None, mode: str = "auto", workers: int | None = None, prefetch: int = 2):
        self.image_shape = list(image_shape)
        self.recipe = recipe
        self.seed = recipe.seed * 1_000_003 + pipeline_id
        self.policy = _policy(online_policy)
        manifest = records.read_manifest(train_dir)
        files = records.split_files(train_dir, "train", manifest)
        self.total_count = manifest["splits"]["train"]["count"]
        self.encoding = manifest.get("image_encoding", pixels.RAW)
        if self.encoding not in pixels.IMAGE_ENCODINGS:
            raise DataError(f"Unknown image_encoding {self.encoding!r} in dataset.json (known: "
                            f"{', '.join(pixels.IMAGE_ENCODINGS)}); was the dataset written by a newer version?")
        # Source records with online augmentation are held and read as their bytes: each step decodes what it
        # needs (the crop's DCT scale for the random resized crop).
        self.source_bytes = self.encoding == pixels.SOURCE and self.policy is not None
        self.files, self.record_shard, self.mode = worker_share(
            files, pipeline_id, num_pipelines, mode, self.total_count, self.image_shape,
            manifest["splits"]["train"].get("bytes") if self.source_bytes else None)
        self.workers = input_workers(workers)
        self.prefetch = max(1, prefetch)
        self._pool = concurrent.futures.ThreadPoolExecutor(self.workers, thread_name_prefix="portable-input")
        self.images = self.contents = self.labels = None  # memory mode: pixels (or the files' bytes) and labels
        if self.mode == "memory":
            self._load()

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    def __del__(self):
        pool = getattr(self, "_pool", None)
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)

    # ------------------------------------------------------------------------------------------ records

    def _share(self, files: list[str]) -> Iterator[bytes]:
        """The worker's records of `files` in interleave order (every n-th record under record sharding)."""
        stream = records.interleave(files)
        if not self.record_shard:
            return stream
        index, count = self.record_shard
        return (record for position, record in enumerate(stream) if position % count == index)

    def _load(self) -> None:
        contents, labels = [], []
        for record in self._share(self.files):
            image, label = records.image_label(record)
            contents.append(image)
            labels.append(label)
        if not labels:
            raise DataError(f"This worker's share of the training shards is empty ({len(self.files)} files)")
        self.labels = np.asarray(labels, dtype=np.int32)
        if self.source_bytes:
            self.contents = contents
            held = sum(len(c) for c in contents)
        elif self.encoding == pixels.RAW:
            size = math.prod(self.image_shape)
            joined = b"".join(contents)
            if len(joined) != size * len(contents):
                raise DataError(f"Raw records of {self.files[0]}...: not all hold {size} bytes (the dataset's "
                                f"image_shape {self.image_shape})")
            self.images = np.frombuffer(joined, dtype=np.uint8).reshape(len(contents), *self.image_shape)
            held = self.images.nbytes
        else:  # PNG/JPEG/source without augmentation: decoded once, in parallel
            decoded = self._pool.map(lambda c: pixels.decode_record_image(c, self.image_shape, self.encoding),
                                     contents, chunksize=64)
            self.images = np.stack(list(decoded))
            held = self.images.nbytes
        log.info("train: %d training images held in memory (%.0f MB%s)", len(self.labels), held / 1e6,
                 ", as their source files" if self.source_bytes else "")

    # ------------------------------------------------------------------------------------------ examples

    def _examples(self, payloads: list, indices: np.ndarray, copy: int) -> np.ndarray:
        """uint8 N x H x W x C of some examples: pixels held (memory), stored image bytes (stream) or source files'
        bytes (source records with augmentation), augmented when the policy says so."""
        if self.source_bytes:
            return augment_numpy.augment_sources(payloads, indices, copy, self.policy, self.image_shape)
        if isinstance(payloads, np.ndarray):
            images = payloads
        else:
            images = np.stack([pixels.decode_record_image(p, self.image_shape, self.encoding) for p in payloads])
        if self.policy is None or self.policy.is_identity:
            return images
        return augment_numpy.augment_batch(images, indices, copy, self.policy)

    def order(self, epoch: int) -> np.ndarray:
        """Memory mode: the epoch's permutation of the held examples."""
        return _generator(self.seed, epoch).permutation(len(self.labels))

    def _memory_plan(self, epoch: int, first_batch: int, num_batches: int, batch: int):
        order = self.order(epoch)
        count = len(order)
        for index in range(first_batch, first_batch + num_batches):
            picks = order[(index * batch + np.arange(batch)) % count]

            def fill(images, labels, begin, end, picks=picks):
                chosen = picks[begin:end]
                payloads = [self.contents[i] for i in chosen] if self.source_bytes else self.images[chosen]
                images[begin:end] = self._examples(payloads, chosen, epoch + 1)
                labels[begin:end] = self.labels[chosen]

            yield batch, fill

    def _stream(self, epoch: int) -> Iterator[tuple[int, bytes]]:
        """(index, record) in the epoch's order, endlessly: the share in a seeded file order (the files' own order
        when the share is every n-th record, so that the workers' shares stay disjoint), enumerated, through a
        seeded shuffle buffer (tf.data's algorithm: a buffer filled from the input, each output a uniformly drawn
        slot refilled with the next input), repeated with the same order."""
        files = [self.files[i] for i in _generator(self.seed, epoch, 1).permutation(len(self.files))]
        if self.record_shard:  # every n-th record of the files in their own order: a share disjoint from the others'
            files = self.files
        capacity = max(1, self.recipe.shuffle_buffer)
        while True:
            draws = _generator(self.seed * 7919 + epoch, 2)
            pending: np.ndarray = np.empty(0)
            buffer: list = []
            produced = 0
            source = enumerate(self._share(files))
            for item in source:
                buffer.append(item)
                if len(buffer) >= capacity:
                    break
            upcoming = next(source, None)
            while buffer:
                if not len(pending):
                    pending = draws.random(_SHUFFLE_DRAWS)
                slot = int(pending[0] * len(buffer))
                pending = pending[1:]
                chosen = buffer[slot]
                if upcoming is not None:
                    buffer[slot] = upcoming
                    upcoming = next(source, None)
                else:
                    buffer[slot] = buffer[-1]
                    buffer.pop()
                produced += 1
                yield chosen
            if not produced:
                raise DataError(f"This worker's share of the training shards is empty ({len(self.files)} files)")

    def _stream_plan(self, epoch: int, first_batch: int, num_batches: int, batch: int):
        stream = self._stream(epoch)
        for _ in range(first_batch * batch):  # taken already: read past, not decoded
            next(stream)
        for _ in range(num_batches):
            taken = [next(stream) for _ in range(batch)]
            indices = np.array([index for index, _ in taken], dtype=np.int64)
            parsed = [records.image_label(record) for _, record in taken]

            def fill(images, labels, begin, end, indices=indices, parsed=parsed):
                images[begin:end] = self._examples([p[0] for p in parsed[begin:end]], indices[begin:end], epoch + 1)
                labels[begin:end] = [p[1] for p in parsed[begin:end]]

            yield batch, fill

    def batches(self, epoch: int, first_batch: int, num_batches: int, batch: int
                ) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """Batches [first_batch, first_batch + num_batches) of `epoch`, each of `batch` examples: (float32
        N x H x W x C pixel values 0-255, int32 N labels)."""
        plan = (self._memory_plan if self.mode == "memory" else self._stream_plan)(epoch, first_batch, num_batches,
                                                                                   batch)
        return _Pipeline(self._pool, self.workers, self.image_shape, self.prefetch).run(plan)


def eval_batches(dataset_dir: str, split: str, batch: int, *, workers: int | None = None, prefetch: int = 2
                 ) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """A split in data.read_split's order, in batches of `batch` (the last one smaller): (float32 N x H x W x C,
    int32 N), as inputs.make_eval_dataset gives them."""
    manifest = records.read_manifest(dataset_dir)
    files = records.split_files(dataset_dir, split, manifest)
    shape = list(manifest["image_shape"])
    encoding = manifest.get("image_encoding", pixels.RAW)
    count = input_workers(workers)

    def plan():
        chunk = []
        for record in records.interleave(files):
            chunk.append(records.image_label(record))
            if len(chunk) == batch:
                yield len(chunk), _fill_decoded(chunk, shape, encoding)
                chunk = []
        if chunk:
            yield len(chunk), _fill_decoded(chunk, shape, encoding)

    with concurrent.futures.ThreadPoolExecutor(count, thread_name_prefix="portable-eval") as pool:
        yield from _Pipeline(pool, count, shape, prefetch).run(plan())


def _fill_decoded(parsed: list[tuple[bytes, int]], shape, encoding: str):
    def fill(images, labels, begin, end):
        for i in range(begin, end):
            images[i] = pixels.decode_record_image(parsed[i][0], shape, encoding)
            labels[i] = parsed[i][1]

    return fill


class PortableEvalInput:
    """A split's batches for evaluation after every epoch (inputs.make_eval_dataset's `.cache()`): decoded once, on
    the first pass, and held as uint8 (a quarter of float32's bytes); later passes only convert."""

    def __init__(self, dataset_dir: str, split: str, batch: int, *, workers: int | None = None):
        self.dataset_dir, self.split, self.batch, self.workers = dataset_dir, split, batch, workers
        self._held: list[tuple[np.ndarray, np.ndarray]] | None = None

    def batches(self) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        if self._held is not None:
            for images, labels in self._held:
                yield images.astype(np.float32), labels
            return
        held = []
        for images, labels in eval_batches(self.dataset_dir, self.split, self.batch, workers=self.workers):
            held.append((images.astype(np.uint8), labels))
            yield images, labels
        self._held = held  # only a whole pass is kept: one stopped early decodes again next time
