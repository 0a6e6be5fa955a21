"""What the readers hand the step: one `Example` per input (decoded, or rejected with a reason) and a
`Source` (class names, expected counts, the stream of examples and, for file sources, of inputs)."""

from __future__ import annotations

import dataclasses
from typing import Callable, Iterator, NamedTuple

import numpy as np

# Reasons for rejections that are not about the image file itself (see data.py for the others).
DUPLICATE = "duplicate"
CONFLICTING_LABEL = "duplicate with a different label"
OUTSIDE_CLASSES = "outside any class folder"
BAD_ROW = "bad manifest row"


@dataclasses.dataclass
class Example:
    uri: str
    label: int
    split: str | None  # the source's own split ("train"/"test"), or None to assign by content
    key: int = 0  # 64 bits of the SHA-256 of the source bytes: the split and duplicate key
    image: np.ndarray | None = None  # the pixels at the dataset's size; None when rejected or `histogram` is set
    reason: str = ""
    detail: str = ""
    stored: bytes | None = None  # the record's image bytes when encoded (PNG/JPEG); None: the raw pixels
    encoding: str = "raw"  # data.RAW / PNG / SOURCE
    source_size: tuple[int, int] | None = None  # (height, width) of a source file
    source_bytes: int = 0  # its size in bytes
    reencoded: str = ""  # why a source record holds re-encoded bytes (images.REENCODE_REASONS), "" if it does not
    # A kept source record's pixel-statistics share (images.sampled_histogram), counted where it was decoded: its
    # pixels are not carried (a 224x224 RGB array per photo to copy, stack and count in the main process)
    histogram: np.ndarray | None = None
    # The near-duplicate key (images.near_keys) where it was taken at decoding (source records, whose pixels do
    # not travel); None: the runner takes it from `image`
    near_key: int | None = None

    @property
    def kept(self) -> bool:
        return not self.reason


@dataclasses.dataclass
class Source:
    """What a reader knows before streaming: class names and how many inputs to expect per source split."""

    kind: str
    class_names: list[str]
    expected: dict[str | None, int]
    examples: Iterator[Example]
    class_locations: dict[int, str] = dataclasses.field(default_factory=dict)  # label -> folder, for messages
    # File sources: every input in stream order as an `Item` (what the Beam runner distributes); None for
    # array sources (idx, tfds), which only run in process.
    items: Callable[[], Iterator["Item"]] | None = None
    # How the files were decoded (decoding.DecodePlanner.report), filled in as `examples` is streamed
    decode_report: dict = dataclasses.field(default_factory=dict)


class Item(NamedTuple):
    """One input of a file source: a file to decode, or one rejected before decoding (`problem`)."""

    uri: str
    label: int
    split: str | None
    problem: tuple[str, str] | None = None  # (reason, detail)
