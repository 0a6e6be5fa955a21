"""What the step keeps track of while it streams: seen content (for duplicates), progress, pixel statistics, and
the `Tally` of kept and rejected inputs that either runner (local, Beam) gathers."""

from __future__ import annotations

import collections
import dataclasses
import logging
import time
from typing import Callable

import numpy as np

log = logging.getLogger(__name__)

PROGRESS_SECONDS = 10.0
SAMPLES_PER_CLASS = 8
CARD_MAX_CLASSES = 100  # the card's sample grid shows this many classes at most (memory and page size)


class ContentIndex:
    """Content keys seen so far, each with the (label, split) it was kept under: 12 bytes per image.

    A Python dict would cost ~100 bytes per image (1 GB for 10M images); here recent keys sit in a small
    dict that is flushed into sorted numpy runs, merged like a log-structured merge tree, so lookups stay
    binary searches over at most log2(N / flush_size) runs.
    """

    def __init__(self, flush_size: int = 1 << 16):
        self._recent: dict[int, int] = {}
        self._runs: list[tuple[np.ndarray, np.ndarray]] = []
        self._flush_size = flush_size

    def __len__(self) -> int:
        return len(self._recent) + sum(len(k) for k, _ in self._runs)

    @property
    def nbytes(self) -> int:
        return sum(k.nbytes + v.nbytes for k, v in self._runs)

    def get(self, key: int) -> int | None:
        value = self._recent.get(key)
        if value is not None:
            return value
        probe = np.uint64(key)
        for keys, values in self._runs:
            i = int(np.searchsorted(keys, probe))
            if i < len(keys) and keys[i] == probe:
                return int(values[i])
        return None

    def add(self, key: int, value: int) -> None:
        self._recent[key] = value
        if len(self._recent) >= self._flush_size:
            self._flush()

    def _flush(self) -> None:
        keys = np.fromiter(self._recent.keys(), np.uint64, len(self._recent))
        values = np.fromiter(self._recent.values(), np.int32, len(self._recent))
        self._recent = {}
        order = np.argsort(keys)
        keys, values = keys[order], values[order]
        while self._runs and len(self._runs[-1][0]) <= len(keys):
            older_keys, older_values = self._runs.pop()
            keys, values = np.concatenate([older_keys, keys]), np.concatenate([older_values, values])
            order = np.argsort(keys, kind="stable")
            keys, values = keys[order], values[order]
        self._runs.append((keys, values))


class Progress:
    """Logs how far a long run is, at most every `every` seconds: count, percent, rate and time left."""

    def __init__(self, total: int, what: str, every: float = PROGRESS_SECONDS,
                 clock: Callable[[], float] = time.monotonic):
        self.total, self.what, self.every, self.clock = total, what, every, clock
        self.start = self.last = clock()

    def update(self, done: int) -> None:
        now = self.clock()
        if now - self.last < self.every:
            return
        self.last = now
        rate = done / max(now - self.start, 1e-9)
        left = (self.total - done) / rate if rate > 0 and self.total > done else 0.0
        percent = f" ({100 * done / self.total:.0f}%)" if self.total else ""
        log.info("%s: %d/%d%s, %.0f/s, about %s left", self.what, done, self.total, percent, rate,
                 time.strftime("%H:%M:%S", time.gmtime(left)))


class PixelStats:
    """Streaming per-channel mean and standard deviation of 0-255 pixel values, exact: a 256-bin histogram
    per channel (one bincount per image) instead of float sums."""

    def __init__(self, channels: int):
        self.channels = channels
        self.histogram = np.zeros(256 * channels, np.int64)

    def add(self, image: np.ndarray) -> None:
        """Adds the pixels of uint8 arrays (...xC, C 1 or 3): PIL's per-band histogram in C, half the time of a
        numpy bincount per channel (which copies each strided channel to int64 first) and nothing allocated."""
        from PIL import Image

        rows = np.ascontiguousarray(image, np.uint8).reshape(-1, image.shape[-2], self.channels)
        self.histogram += np.asarray(Image.fromarray(rows[..., 0] if self.channels == 1 else rows).histogram(),
                                     np.int64)

    def to_json(self) -> dict:
        per_channel = self.histogram.reshape(self.channels, 256)
        pixels = int(per_channel[0].sum())
        if not pixels:
            return {"mean": [], "std": [], "pixels": 0}
        levels = np.arange(256, dtype=np.float64)
        mean = per_channel @ levels / pixels
        std = np.sqrt(np.maximum(per_channel @ levels ** 2 / pixels - mean ** 2, 0.0))
        return {"mean": [round(float(m), 4) for m in mean], "std": [round(float(v), 4) for v in std],
                "pixels": pixels}


class SourceStats:
    """What the kept source files were (the manifest's `source_files`): how many kept their bytes and how many were
    re-encoded and why, their bytes, and the range of their sizes. Mergeable (the Beam runner combines them)."""

    def __init__(self):
        self.count = self.kept_bytes_as_is = self.source_bytes = self.pixels = 0
        self.reencoded: dict[str, int] = {}
        self.min_size: list[int] | None = None
        self.max_size: list[int] | None = None

    def add(self, size: tuple[int, int], source_bytes: int, reencoded: str) -> None:
        self.count += 1
        self.source_bytes += source_bytes
        self.pixels += size[0] * size[1]
        if reencoded:
            self.reencoded[reencoded] = self.reencoded.get(reencoded, 0) + 1
        else:
            self.kept_bytes_as_is += 1
        self.add_extremes(size)

    def to_row(self) -> tuple:
        return (self.count, self.kept_bytes_as_is, self.source_bytes, self.pixels, sorted(self.reencoded.items()),
                self.min_size, self.max_size)

    @classmethod
    def row_of(cls, size, source_bytes: int, reencoded: str) -> tuple:
        """The to_row() of one file."""
        one = cls()
        one.add(tuple(size), source_bytes, reencoded)
        return one.to_row()

    @classmethod
    def from_row(cls, row) -> "SourceStats":
        stats = cls()
        count, kept, source_bytes, pixels, reencoded, min_size, max_size = row
        stats.count, stats.kept_bytes_as_is, stats.source_bytes, stats.pixels = count, kept, source_bytes, pixels
        stats.reencoded = dict(reencoded)
        stats.min_size, stats.max_size = (list(min_size) if min_size else None), (list(max_size) if max_size else None)
        return stats

    @classmethod
    def combine(cls, rows) -> tuple:
        """Merges to_row() tuples (a Beam CombineGlobally function)."""
        total = cls()
        for row in rows:
            part = cls.from_row(row)
            if not part.count:
                continue
            total.count += part.count
            total.kept_bytes_as_is += part.kept_bytes_as_is
            total.source_bytes += part.source_bytes
            total.pixels += part.pixels
            for reason, n in part.reencoded.items():
                total.reencoded[reason] = total.reencoded.get(reason, 0) + n
            for size in (part.min_size, part.max_size):
                total.add_extremes(size)
        return total.to_row()

    def add_extremes(self, size: list[int]) -> None:
        if self.min_size is None or size[0] * size[1] < self.min_size[0] * self.min_size[1]:
            self.min_size = list(size)
        if self.max_size is None or size[0] * size[1] > self.max_size[0] * self.max_size[1]:
            self.max_size = list(size)

    def to_json(self, max_side: int) -> dict:
        return {"policy": "keep each JPEG/PNG file's bytes; re-encode other formats, colour modes TensorFlow does "
                          "not decode alike, EXIF-rotated files, and files with a side of at least twice max_side "
                          "(scaled down by a power of two, to at least max_side)",
                "max_side": max_side, "count": self.count, "kept_bytes_as_is": self.kept_bytes_as_is,
                "reencoded": dict(sorted(self.reencoded.items())), "source_bytes": self.source_bytes,
                "mean_megapixels": round(self.pixels / max(self.count, 1) / 1e6, 3),
                "smallest": self.min_size, "largest": self.max_size}


def image_histogram(image: np.ndarray, channels: int) -> np.ndarray:
    """One image's share of a split's PixelStats (added once the image's split is known)."""
    stats = PixelStats(channels)
    stats.add(image)
    return stats.histogram


@dataclasses.dataclass
class Tally:
    """What either runner gathers about the kept and rejected inputs; `finish` turns it into the manifest."""

    num_classes: int
    channels: int
    rejected_by_reason: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    rejected_by_class: dict = dataclasses.field(default_factory=lambda: collections.defaultdict(collections.Counter))
    samples: list = dataclasses.field(default_factory=list)  # per class (up to CARD_MAX_CLASSES): pixel arrays
    pixel_stats: PixelStats | None = None
    source_files: SourceStats = dataclasses.field(default_factory=SourceStats)  # source records only
    # groups of near-copies put in one split (per_image.NEAR_GROUP_FIELDS -> count)
    near_duplicates: collections.Counter = dataclasses.field(default_factory=collections.Counter)

    def __post_init__(self):
        self.pixel_stats = self.pixel_stats or PixelStats(self.channels)
        self.samples = self.samples or [[] for _ in range(min(self.num_classes, CARD_MAX_CLASSES))]

    def reject(self, label: int, reason: str) -> None:
        self.rejected_by_reason[reason] += 1
        if label >= 0:
            self.rejected_by_class[label][reason] += 1

    def wants_sample(self, label: int) -> bool:
        return label < len(self.samples) and len(self.samples[label]) < SAMPLES_PER_CLASS
