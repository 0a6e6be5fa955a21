"""What the readers hand the step: one `Example` per input (decoded, or rejected with a reason) and a
`Source` (class names, expected counts, the stream of examples); and the content key that fixes an image's
split and finds its duplicates."""

from __future__ import annotations

import dataclasses
import hashlib
from typing import Iterator

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
    image: np.ndarray | None = None  # None when rejected
    reason: str = ""
    detail: str = ""


@dataclasses.dataclass
class Source:
    """What a reader knows before streaming: class names and how many inputs to expect per source split."""

    kind: str
    class_names: list[str]
    expected: dict[str | None, int]
    examples: Iterator[Example]
    class_locations: dict[int, str] = dataclasses.field(default_factory=dict)  # label -> folder, for messages



def content_key(raw: bytes) -> int:
    return int.from_bytes(hashlib.sha256(raw).digest()[:8], "big")
