"""Preprocess: read a source of labelled images and write sharded TFRecords for train / validation / test.

Sources:
  - a directory of MNIST-format idx files (`*-images-idx3-ubyte[.gz]` + `*-labels-idx1-ubyte[.gz]`);
    `train-*` feeds train and validation, `t10k-*`/`test-*` is the test split;
  - a folder with one subfolder per class holding PNG/JPEG files (local or `gs://`);
  - `tfds:NAME[:SPLIT]` through tensorflow-datasets.

Splits are deterministic: an image's split is fixed by a hash of its bytes, so the same input gives the same
split on any machine and in any order, and identical images never straddle two splits. Where the source
has its own test split, it stays the test split and training copies of test images are dropped (leakage).
Unusable inputs are listed in `rejected.jsonl` with their reason and counted; nothing is dropped silently.
"""

from __future__ import annotations

import argparse
import collections
import concurrent.futures
import dataclasses
import hashlib
import json
import logging
import os
import sys
import time
from typing import Iterator

import numpy as np

from components import data

log = logging.getLogger(__name__)


@dataclasses.dataclass
class Example:
    image: np.ndarray | None  # None when rejected
    label: int
    uri: str
    split: str | None  # the source's own split ("train"/"test"), or None to assign by content
    reason: str = ""


@dataclasses.dataclass
class Source:
    """What a reader knows before streaming: class names and how many images to expect per source split."""

    kind: str
    class_names: list[str]
    expected: dict[str | None, int]
    examples: Iterator[Example]


@dataclasses.dataclass
class PreprocessResult:
    output_dir: str
    class_names: list[str]
    image_shape: list[int]
    counts: dict[str, int]
    rejected: int
    rejected_by_reason: dict[str, int]
    seconds: float

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


# ---------------------------------------------------------------------------------------------- readers


def idx_source(directory: str, image_size: int, channels: int, limit: int | None) -> Source:
    pairs = data.find_idx_pairs(directory)
    if not pairs:
        raise data.DataError(f"No idx files found in {directory} (looked for *-images-idx3-ubyte[.gz] "
                             "with matching *-labels-idx1-ubyte[.gz])")
    loaded = []
    for pair in sorted(pairs, key=lambda p: p.split != "test"):  # test first: its hashes guard train
        images, labels = data.read_idx(pair.images), data.read_idx(pair.labels)
        if images.ndim != 3 or labels.ndim != 1:
            raise data.DataError(f"{pair.images} should hold N x rows x cols images and {pair.labels} N labels; "
                                 f"found shapes {images.shape} and {labels.shape}")
        if len(images) != len(labels):
            raise data.DataError(f"idx counts disagree: {pair.images} has {len(images)} images but "
                                 f"{pair.labels} has {len(labels)} labels")
        if limit is not None:
            images, labels = images[:limit], labels[:limit]
        loaded.append((pair, images, labels))
    num_classes = int(max(int(lab.max()) for _, _, lab in loaded if len(lab)) + 1)
    class_names = data.idx_class_names(directory, num_classes)

    def examples() -> Iterator[Example]:
        for pair, images, labels in loaded:
            base = os.path.basename(pair.images)
            for i, (image, label) in enumerate(zip(images, labels)):
                image = image[..., None]
                if image.shape != (image_size, image_size, channels):
                    image = _conform(image, image_size, channels)
                yield Example(image, int(label), f"{base}#{i}", pair.split)

    return Source("idx", class_names, {p.split: len(lab) for p, _, lab in loaded}, examples())


def _conform(image: np.ndarray, image_size: int, channels: int) -> np.ndarray:
    from PIL import Image

    img = Image.fromarray(image.squeeze(-1) if image.shape[-1] == 1 else image)
    img = img.convert("L" if channels == 1 else "RGB").resize((image_size, image_size), Image.Resampling.BILINEAR)
    return np.asarray(img, dtype=np.uint8).reshape(image_size, image_size, channels)


def folder_source(root: str, image_size: int, channels: int, limit: int | None, workers: int) -> Source:
    if not data.gfile().exists(root):
        raise data.DataError(f"Source not found: {root}")
    entries = sorted(data.gfile().listdir(root))
    class_names = [e.rstrip("/") for e in entries if data.gfile().isdir(data.join(root, e.rstrip("/")))]
    if not class_names:
        raise data.DataError(f"No class folders found under {root}: expected one subfolder per class "
                             f"holding {', '.join(data.IMAGE_EXTENSIONS)} files")
    listing: list[tuple[str, int]] = []
    stray = [data.join(root, e) for e in entries if e.rstrip("/") not in class_names]
    for label, name in enumerate(class_names):
        files = list(data.list_files(data.join(root, name)))
        listing.extend((f, label) for f in (files[:limit] if limit else files))
    if not listing:
        raise data.DataError(f"No images found under {root} (looked for {', '.join(data.IMAGE_EXTENSIONS)} "
                             f"in {len(class_names)} class folders)")

    def decode(item: tuple[str, int]) -> Example:
        uri, label = item
        if not uri.lower().endswith(data.IMAGE_EXTENSIONS):
            return Example(None, label, uri, None, f"not an image file (extension not in {data.IMAGE_EXTENSIONS})")
        try:
            image = data.decode_image(data.read_bytes(uri), image_size, image_size, channels)
        except data.ImageError as e:
            return Example(None, label, uri, None, str(e))
        return Example(image, label, uri, None)

    def examples() -> Iterator[Example]:
        for uri in stray:
            yield Example(None, -1, uri, None, "outside any class folder")
        with concurrent.futures.ThreadPoolExecutor(max_workers=workers) as pool:
            for chunk in data.batched(listing, 256 * workers):  # bounded: never the whole listing in flight
                yield from pool.map(decode, chunk)

    return Source("folder", class_names, {None: len(listing)}, examples())


def tfds_source(spec: str, image_size: int, channels: int, limit: int | None, data_dir: str | None) -> Source:
    import tensorflow_datasets as tfds

    parts = spec.split(":")
    if len(parts) not in (2, 3) or not parts[1]:
        raise data.DataError(f"Bad TFDS source {spec!r}: use tfds:NAME or tfds:NAME:SPLIT (e.g. tfds:mnist:train)")
    name = parts[1]
    builder = tfds.builder(name, data_dir=data_dir)
    builder.download_and_prepare()
    label_feature = builder.info.features["label"]
    class_names = list(label_feature.names)
    if len(parts) == 3:
        wanted = {parts[2]: None}
    else:
        wanted = {s: ("test" if s == "test" else "train") for s in ("test", "train") if s in builder.info.splits}
    expected = collections.Counter()
    for split_name, split in wanted.items():
        total = builder.info.splits[split_name].num_examples
        expected[split] += min(total, limit) if limit else total

    def examples() -> Iterator[Example]:
        for split_name, split in wanted.items():
            ds = builder.as_dataset(split=split_name, shuffle_files=False)
            if limit:
                ds = ds.take(limit)
            for i, ex in enumerate(ds.as_numpy_iterator()):
                image = ex["image"]
                if image.ndim == 2:
                    image = image[..., None]
                if image.shape != (image_size, image_size, channels):
                    image = _conform(image, image_size, channels)
                yield Example(image.astype(np.uint8), int(ex["label"]), f"tfds:{name}:{split_name}#{i}", split)

    return Source("tfds", class_names, dict(expected), examples())


def open_source(source: str, *, image_size: int, channels: int, limit: int | None, workers: int,
                tfds_data_dir: str | None = None) -> Source:
    if source.startswith("tfds:"):
        return tfds_source(source, image_size, channels, limit, tfds_data_dir)
    if not source.startswith("gs://") and not os.path.exists(source):
        hint = ""
        if source == data.DEFAULT_SOURCE:
            hint = (" Install the embedded default dataset with `sudo apt-get install dataset-fashion-mnist` "
                    "(Debian/Ubuntu), or point --data at an idx directory, an image folder or tfds:NAME.")
        raise data.DataError(f"Source not found: {source}.{hint}")
    if not source.startswith("gs://") and any("-images-idx3-ubyte" in n for n in os.listdir(source)):
        return idx_source(source, image_size, channels, limit)
    return folder_source(source, image_size, channels, limit, workers)


# ---------------------------------------------------------------------------------------------- the step


def preprocess(source: str, output_dir: str, *, validation_fraction: float = 0.1, test_fraction: float = 0.1,
               image_size: int = 28, channels: int = 1, limit: int | None = None, min_shards: int = 2,
               workers: int | None = None, tfds_data_dir: str | None = None) -> PreprocessResult:
    """Reads `source` and writes the dataset directory `output_dir` (see components/data.py for its layout).

    `limit` caps images per source split (for quick runs); `min_shards` is the number of readers that will
    share a split (training workers), so each gets at least one shard.
    """
    if not 0 <= validation_fraction < 1 or not 0 <= test_fraction < 1 or validation_fraction + test_fraction >= 1:
        raise ValueError("validation_fraction and test_fraction must be in [0, 1) and sum to less than 1")
    if channels not in (1, 3):
        raise ValueError(f"channels must be 1 (grayscale) or 3 (RGB), got {channels}")
    start = time.monotonic()
    workers = workers or os.cpu_count() or 1
    src = open_source(source, image_size=image_size, channels=channels, limit=limit, workers=workers,
                      tfds_data_dir=tfds_data_dir)
    has_test = "test" in src.expected
    total = sum(src.expected.values())
    if has_test:
        train_total = total - src.expected["test"]
        expected = {"train": train_total * (1 - validation_fraction),
                    "validation": train_total * validation_fraction, "test": src.expected["test"]}
    else:
        expected = {"train": total * (1 - validation_fraction - test_fraction),
                    "validation": total * validation_fraction, "test": total * test_fraction}
    image_bytes = image_size * image_size * channels
    data.gfile().makedirs(output_dir)
    writers = {s: data.ShardWriter(output_dir, s, data.num_shards_for(int(expected[s]), image_bytes,
                                                                      min_shards=min_shards))
               for s in data.SPLITS}
    rejected_by_reason: collections.Counter = collections.Counter()
    test_digests: set[bytes] = set()
    seen = 0
    last_report = time.monotonic()
    with data.gfile().GFile(data.join(output_dir, data.REJECTED), "w") as rejected_file:
        def reject(uri: str, reason: str) -> None:
            rejected_file.write(json.dumps({"uri": uri, "reason": reason}) + "\n")
            rejected_by_reason[reason.split(":")[0]] += 1

        for ex in src.examples:
            seen += 1
            if ex.image is None:
                reject(ex.uri, ex.reason)
                continue
            raw = ex.image.tobytes()
            digest = hashlib.sha256(raw).digest()
            if ex.split == "test":
                split = "test"
                test_digests.add(digest[:16])
            else:
                if digest[:16] in test_digests:
                    reject(ex.uri, "duplicate of a test image (kept in test only)")
                    continue
                u = int.from_bytes(digest[:8], "big") / 2.0**64
                if ex.split == "train":
                    split = "validation" if u < validation_fraction else "train"
                else:
                    split = ("validation" if u < validation_fraction else
                             "test" if u < validation_fraction + test_fraction else "train")
            writers[split].write(ex.image, ex.label, ex.uri)
            if time.monotonic() - last_report > 10:
                last_report = time.monotonic()
                log.info("preprocess: %d/%d inputs read (%.0f/s)", seen, total, seen / (last_report - start))
    for w in writers.values():
        w.close()
    counts = {s: w.count for s, w in writers.items()}
    rejected = sum(rejected_by_reason.values())
    if counts["train"] == 0:
        raise data.DataError(f"No usable training images in {source} ({rejected} inputs rejected; "
                             f"see {data.join(output_dir, data.REJECTED)})")
    if len(src.class_names) < 2:
        raise data.DataError(f"Need at least 2 classes, found {len(src.class_names)} in {source}")
    manifest = {
        "source": source,
        "source_kind": src.kind,
        "class_names": src.class_names,
        "image_shape": [image_size, image_size, channels],
        "splits": {s: w.summary() for s, w in writers.items()},
        "rejected": rejected,
        "rejected_by_reason": dict(rejected_by_reason),
    }
    data.write_json(data.join(output_dir, data.MANIFEST), manifest)
    seconds = time.monotonic() - start
    log.info("preprocess: wrote %s (train %d, validation %d, test %d, rejected %d) in %.1fs", output_dir,
             counts["train"], counts["validation"], counts["test"], rejected, seconds)
    return PreprocessResult(output_dir, src.class_names, [image_size, image_size, channels], counts, rejected,
                            dict(rejected_by_reason), seconds)


def dataset_card(dataset_dir: str) -> str:
    """A Markdown card for the KFP UI: images per split and class, rejected inputs per reason."""
    manifest = data.read_manifest(dataset_dir)
    names = manifest["class_names"]
    splits = manifest["splits"]
    lines = [f"# Dataset card", "", f"Source: `{manifest['source']}` ({manifest['source_kind']}), "
             f"images {'x'.join(map(str, manifest['image_shape']))}", "",
             "| class | " + " | ".join(splits) + " |", "|---|" + "---:|" * len(splits)]
    for index, name in enumerate(names):
        lines.append(f"| {name} | " + " | ".join(str(s["class_counts"].get(str(index), 0)) for s in splits.values())
                     + " |")
    lines.append("| **total** | " + " | ".join(f"**{s['count']}**" for s in splits.values()) + " |")
    lines += ["", f"Rejected inputs: **{manifest['rejected']}**"]
    for reason, count in sorted(manifest["rejected_by_reason"].items(), key=lambda kv: -kv[1]):
        lines.append(f"- {reason}: {count}")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Preprocess a labelled image source into TFRecord shards.")
    parser.add_argument("--source", default=data.DEFAULT_SOURCE,
                        help="idx directory, class-per-folder image tree (local or gs://), or tfds:NAME[:SPLIT]")
    parser.add_argument("--output-dir", required=True)
    parser.add_argument("--validation-fraction", type=float, default=0.1)
    parser.add_argument("--test-fraction", type=float, default=0.1, help="used when the source has no test split")
    parser.add_argument("--image-size", type=int, default=28)
    parser.add_argument("--channels", type=int, default=1, choices=(1, 3))
    parser.add_argument("--limit", type=int, help="at most this many images per source split")
    parser.add_argument("--min-shards", type=int, default=2)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    try:
        result = preprocess(args.source, args.output_dir, validation_fraction=args.validation_fraction,
                            test_fraction=args.test_fraction, image_size=args.image_size, channels=args.channels,
                            limit=args.limit, min_shards=args.min_shards)
    except (data.DataError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    json.dump(result.to_json(), sys.stdout, indent=2)
    print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
