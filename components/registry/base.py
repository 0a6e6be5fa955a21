"""What every model registry is: versions of a named model, found by content digest, with a movable champion."""

from __future__ import annotations

import dataclasses
import hashlib
import os
from typing import Protocol

CHAMPION = "champion"


@dataclasses.dataclass
class ModelVersion:
    """One version of a registered model, as any registry reports it."""

    registry: str
    model: str
    version: str
    aliases: list[str]
    uri: str
    digest: str
    metrics: dict = dataclasses.field(default_factory=dict)
    labels: dict = dataclasses.field(default_factory=dict)
    created: str = ""
    resource_name: str = ""

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


class Registry(Protocol):
    """What the register and evaluate steps need from a model registry."""

    kind: str

    def find_by_digest(self, model: str, digest: str) -> ModelVersion | None: ...

    def champion(self, model: str) -> ModelVersion | None: ...

    def upload(self, model: str, model_dir: str, *, digest: str, metrics: dict, labels: dict,
               description: str, artifact_uri: str | None = None) -> ModelVersion: ...

    def set_alias(self, model: str, version: str, alias: str) -> ModelVersion: ...

    def versions(self, model: str) -> list[ModelVersion]: ...


def model_digest(model_dir: str) -> str:
    """A content digest of a model directory: sha256 over relative paths and file bytes, in sorted order."""
    if not os.path.isdir(model_dir):
        raise FileNotFoundError(f"Model directory not found: {model_dir}")
    sha = hashlib.sha256()
    for root, dirs, files in os.walk(model_dir):
        dirs.sort()
        for name in sorted(files):
            path = os.path.join(root, name)
            sha.update(os.path.relpath(path, model_dir).encode() + b"\0")
            with open(path, "rb") as f:
                for chunk in iter(lambda: f.read(1 << 20), b""):
                    sha.update(chunk)
            sha.update(b"\0")
    return "sha256:" + sha.hexdigest()
