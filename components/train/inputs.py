"""The training input: each worker's share of the shards, in memory or streamed, seekable to any step of any
epoch (so that a resumed attempt sees the batches the interrupted one would have); and the evaluation input."""

from __future__ import annotations

import logging
import math

from components import augment as augment_lib
from components.dataio import data
from components.train.recipes import Recipe

log = logging.getLogger(__name__)

# Up to this many bytes of a worker's training images are held in memory as one array (fast, exactly
# resumable); larger datasets stream from the shards.
MEMORY_INPUT_LIMIT_BYTES = 2 << 30


def worker_share(files: list[str], pipeline_id: int, num_pipelines: int, mode: str, count: int, image_shape,
                 held_bytes: int | None = None) -> tuple[list[str], tuple[int, int] | None, str]:
    """Worker i (`pipeline_id`) of n's part of the training shards `files` and its input mode, the rule of both inputs
    (TrainInput, portable_input.PortableTrainInput): (files i, i+n, ..., None) with at least n files (shard by file, as
    tf.data's FILE auto-shard policy does); else (every file, (i, n)): the worker keeps every n-th record. Mode auto:
    memory when the worker's share of the `count` records' pixels (of `held_bytes` when the source files' bytes are
    held instead) is at most MEMORY_INPUT_LIMIT_BYTES, else stream."""
    if len(files) >= num_pipelines:
        mine, record_shard = files[pipeline_id::num_pipelines], None
    else:
        log.warning("train: %d training shard(s) for %d workers: each worker reads all and keeps every %d-th "
                    "record (preprocess with min_shards >= %d to shard by file)", len(files), num_pipelines,
                    num_pipelines, num_pipelines)
        mine, record_shard = files, (pipeline_id, num_pipelines)
    share_bytes = count / num_pipelines * math.prod(image_shape)
    if held_bytes is not None:
        share_bytes = held_bytes / num_pipelines
    if mode == "auto":
        mode = "memory" if share_bytes <= MEMORY_INPUT_LIMIT_BYTES else "stream"
    if mode not in ("memory", "stream"):
        raise ValueError(f"input mode must be auto, memory or stream, got {mode!r}")
    return mine, record_shard, mode


def _parse_fn(image_shape, encoding: str = "raw"):
    """record -> (image uint8, label int32), decoding PNG/JPEG records in the tf.data map (data.record_parser)."""
    return data.record_parser({"image_shape": list(image_shape), "image_encoding": encoding})


def _read_files(files: list[str], image_shape, *, seed: int | None = None, encoding: str = "raw",
                decode: bool = True):
    """(image uint8, label int32) records of some shard files, in a fixed order (or a seeded file order);
    (stored image bytes, label int32) without `decode`."""
    import tensorflow as tf

    ds = tf.data.Dataset.from_tensor_slices(files)
    if seed is not None:  # the same file order on every pass of a repeat (the default reshuffles each one)
        ds = ds.shuffle(len(files), seed=seed, reshuffle_each_iteration=False)
    ds = ds.interleave(tf.data.TFRecordDataset, cycle_length=min(len(files), 8),
                       num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    if not decode:
        spec = {"image": tf.io.FixedLenFeature([], tf.string), "label": tf.io.FixedLenFeature([], tf.int64)}
        return ds.map(lambda record: (lambda ex: (ex["image"], tf.cast(ex["label"], tf.int32)))(
            tf.io.parse_single_example(record, spec)), num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    return ds.map(_parse_fn(image_shape, encoding), num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)


class TrainInput:
    """The training batches of one input pipeline (one per worker), seekable to any step of any epoch.

    Sharding: worker i of n reads shard files i, i+n, i+2n, ... (shard by file, as tf.data's FILE auto-shard
    policy does); with fewer files than workers it falls back to every n-th record. Every worker takes the same
    number of steps per epoch (from the split's total count), cycling through its share as needed: with
    uneven shares, a worker running dry mid-epoch would otherwise leave its peers waiting in the all-reduce.

    Order: epoch e's order is a pure function of (seed, e, worker), so an attempt that resumes at step k of
    epoch e sees exactly the batches the interrupted one would have seen.

    "memory" holds the worker's share as one uint8 array and gathers each batch from a seeded permutation
    (no per-record work after loading, a full shuffle). "stream" reads the shards every epoch through a
    seeded shuffle buffer, for data larger than memory; resuming skips the batches already taken.
    """

    def __init__(self, train_dir: str, image_shape, *, pipeline_id: int, num_pipelines: int, recipe: Recipe,
                 online_policy: dict | None, mode: str = "auto"):
        self.image_shape = list(image_shape)
        self.recipe = recipe
        self.seed = recipe.seed * 1_000_003 + pipeline_id
        self.policy = augment_lib.AugmentPolicy.from_json(online_policy) if online_policy else None
        files = data.split_files(train_dir, "train")
        manifest = data.read_manifest(train_dir)
        self.total_count = manifest["splits"]["train"]["count"]
        self.encoding = data.manifest_encoding(manifest)
        # Source records (camera-sized files) with online augmentation are held and read as their bytes: each
        # step decodes what it needs (only the crop's blocks for the random resized crop), from all the pixels.
        self.source_bytes = self.encoding == data.SOURCE and self.policy is not None
        self.files, self.record_shard, self.mode = worker_share(
            files, pipeline_id, num_pipelines, mode, self.total_count, self.image_shape,
            manifest["splits"]["train"].get("bytes") if self.source_bytes else None)
        self.images = self.labels = None  # tensors in host memory (memory mode)
        if self.mode == "memory":
            self._load()

    def _records(self, seed: int | None = None):
        if self.record_shard:  # every n-th record of the files in their own order: a share disjoint from the others'
            seed = None
        if self.source_bytes:  # (file bytes, label): decoded by augment_source
            ds = _read_files(self.files, self.image_shape, seed=seed, encoding=data.SOURCE, decode=False)
        else:
            ds = _read_files(self.files, self.image_shape, seed=seed, encoding=self.encoding)
        if self.record_shard:
            ds = ds.shard(self.record_shard[1], self.record_shard[0])
        return ds

    def _load(self):
        import numpy as np
        import tensorflow as tf

        height, width, channels = self.image_shape
        spec = {"image": tf.io.FixedLenFeature([], tf.string), "label": tf.io.FixedLenFeature([], tf.int64)}

        def parse_batch(records):  # whole batches at once: loading is a few times faster than record by record
            ex = tf.io.parse_example(records, spec)
            images = tf.reshape(tf.io.decode_raw(ex["image"], tf.uint8), [-1, height, width, channels])
            return images, tf.cast(ex["label"], tf.int32)

        parse_encoded = _parse_fn(self.image_shape, self.encoding)

        records = tf.data.Dataset.from_tensor_slices(self.files).interleave(
            tf.data.TFRecordDataset, cycle_length=min(len(self.files), 8), num_parallel_calls=tf.data.AUTOTUNE,
            deterministic=True)  # the order of data.read_split, so online augmentation matches offline copies
        if self.record_shard:
            records = records.shard(self.record_shard[1], self.record_shard[0])
        images, labels = [], []
        if self.encoding == data.RAW:
            batches = records.batch(8192).map(parse_batch)
        elif self.source_bytes:  # the files' bytes, decoded per step
            batches = records.batch(8192).map(lambda r: (lambda ex: (ex["image"], tf.cast(ex["label"], tf.int32)))(
                tf.io.parse_example(r, spec)))
        else:  # PNG/JPEG: decoded record by record, in parallel
            batches = records.map(parse_encoded, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True).batch(8192)
        for image_batch, label_batch in batches.as_numpy_iterator():
            images.append(image_batch)
            labels.append(label_batch)
        if not images:
            raise data.DataError(f"This worker's share of the training shards is empty ({len(self.files)} files)")
        with tf.device("/CPU:0"):  # host memory: the input pipeline runs on the CPU and feeds the accelerators
            self.images, self.labels = tf.constant(np.concatenate(images)), tf.constant(np.concatenate(labels))
        held = (float(tf.reduce_sum(tf.strings.length(self.images))) if self.source_bytes else
                self.images.shape.num_elements())
        log.info("train: %d training images held in memory (%.0f MB%s)", int(self.labels.shape[0]), held / 1e6,
                 ", as their source files" if self.source_bytes else "")

    def _source_examples(self, epoch: int, first_batch: int, num_batches: int, batch: int):
        """Memory mode of source records: the same seeded permutation as for pixels, each example decoded and
        augmented in its own parallel map call (a file's decode is the work here, not the gather)."""
        import tensorflow as tf

        contents, labels, shape, policy = self.images, self.labels, self.image_shape, self.policy
        count = int(labels.shape[0])
        order = tf.random.experimental.stateless_shuffle(tf.range(count, dtype=tf.int64), seed=[self.seed, epoch])

        def example(position):
            pick = tf.gather(order, position % count)
            image = augment_lib.augment_source(tf.gather(contents, pick), pick, epoch + 1, policy, shape)
            return tf.cast(image, tf.float32), tf.gather(labels, pick)

        return (tf.data.Dataset.range(first_batch * batch, (first_batch + num_batches) * batch)
                .map(example, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
                .batch(batch, drop_remainder=True))

    def dataset(self, epoch: int, first_batch: int, num_batches: int, batch: int):
        """Batches [first_batch, first_batch + num_batches) of `epoch`, each of `batch` examples."""
        import tensorflow as tf

        if self.mode == "memory" and self.source_bytes:
            ds = self._source_examples(epoch, first_batch, num_batches, batch)
        elif self.mode == "memory":
            images, labels = self.images, self.labels
            count = int(labels.shape[0])
            order = tf.random.experimental.stateless_shuffle(tf.range(count, dtype=tf.int64),
                                                             seed=[self.seed, epoch])

            def gather(index):
                picks = tf.gather(order, (index * batch + tf.range(batch, dtype=tf.int64)) % count)
                x = tf.gather(images, picks)
                if self.policy is not None:
                    x = tf.map_fn(lambda args: augment_lib.augment_image(args[0], args[1], epoch + 1, self.policy),
                                  (x, picks), fn_output_signature=tf.uint8)
                return tf.cast(x, tf.float32), tf.gather(labels, picks)

            ds = tf.data.Dataset.range(first_batch, first_batch + num_batches).map(
                gather, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
        else:
            ds = self._records(seed=self.seed + epoch).enumerate()
            if self.source_bytes:
                ds = ds.map(lambda i, ex: (augment_lib.augment_source(ex[0], i, epoch + 1, self.policy,
                                                                      self.image_shape), ex[1]),
                            num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
            elif self.policy is not None:
                ds = ds.map(lambda i, ex: (augment_lib.augment_image(ex[0], i, epoch + 1, self.policy), ex[1]),
                            num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
            else:
                ds = ds.map(lambda i, ex: ex)
            ds = (ds.shuffle(self.recipe.shuffle_buffer, seed=self.seed * 7919 + epoch, reshuffle_each_iteration=False)
                  .repeat().map(lambda x, y: (tf.cast(x, tf.float32), y), num_parallel_calls=tf.data.AUTOTUNE,
                                deterministic=True)
                  .batch(batch, drop_remainder=True).skip(first_batch).take(num_batches))
        options = tf.data.Options()
        options.deterministic = True
        options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
        return ds.prefetch(tf.data.AUTOTUNE).with_options(options)


def make_eval_dataset(dataset_dir: str, split: str, batch: int):
    import tensorflow as tf

    ds = data.read_split(dataset_dir, split)
    return ds.map(lambda image, label: (tf.cast(image, tf.float32), label),
                  num_parallel_calls=tf.data.AUTOTUNE).cache().batch(batch).prefetch(tf.data.AUTOTUNE)
