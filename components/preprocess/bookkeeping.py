"""What the step keeps track of while it streams: seen content (for duplicates), progress, pixel statistics."""

from __future__ import annotations

import logging
import time
from typing import Callable

import numpy as np

log = logging.getLogger(__name__)

PROGRESS_SECONDS = 10.0


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
        self._offsets = (np.arange(channels, dtype=np.int64) * 256) if channels > 1 else None

    def add(self, image: np.ndarray) -> None:
        values = image.ravel() if self._offsets is None else (image.reshape(-1, self.channels) + self._offsets).ravel()
        self.histogram += np.bincount(values, minlength=256 * self.channels)

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


def image_histogram(image: np.ndarray, channels: int) -> np.ndarray:
    """One image's share of a split's PixelStats (added once the image's split is known)."""
    stats = PixelStats(channels)
    stats.add(image)
    return stats.histogram
