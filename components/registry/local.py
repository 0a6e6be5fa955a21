"""A model registry in a local directory, with the same behaviour as the Vertex AI Model Registry."""

from __future__ import annotations

import contextlib
import datetime as _dt
import fcntl
import json
import os
import shutil
import tempfile
from typing import Iterator

from components.registry.base import CHAMPION, ChampionChanged, ModelVersion


class LocalRegistry:
    """A model registry in a local directory.

    Layout: `ROOT/MODEL/index.json` (versions, aliases; replaced atomically) and `ROOT/MODEL/versions/N/`
    (a copy of the registered model directory). A lock file serialises writers. Each version's entry in the
    index holds its digest, metrics, labels and `lineage` (the network and its pretrained weights; versions
    registered before lineage was recorded have none).
    """

    kind = "local"

    def __init__(self, root: str):
        if root.startswith("gs://"):
            raise ValueError(f"The local registry needs a local directory, got {root}; use registry=vertex for GCS.")
        self.root = os.path.abspath(root)

    def _model_dir(self, model: str) -> str:
        if not model or "/" in model or model.startswith("."):
            raise ValueError(f"Invalid model name {model!r}: use letters, digits, '-', '_' and '.'")
        return os.path.join(self.root, model)

    def _read_index(self, model: str) -> dict:
        path = os.path.join(self._model_dir(model), "index.json")
        if not os.path.exists(path):
            return {"model": model, "versions": []}
        with open(path) as f:
            return json.load(f)

    def _write_index(self, model: str, index: dict) -> None:
        directory = self._model_dir(model)
        fd, tmp = tempfile.mkstemp(dir=directory, prefix=".index-", suffix=".json")
        with os.fdopen(fd, "w") as f:
            json.dump(index, f, indent=2, sort_keys=True)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, os.path.join(directory, "index.json"))

    @contextlib.contextmanager
    def _locked(self, model: str) -> Iterator[dict]:
        directory = self._model_dir(model)
        os.makedirs(directory, exist_ok=True)
        with open(os.path.join(directory, ".lock"), "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                yield self._read_index(model)
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def _version(self, model: str, entry: dict) -> ModelVersion:
        return ModelVersion(registry=self.kind, model=model, **entry)

    def versions(self, model: str) -> list[ModelVersion]:
        return [self._version(model, v) for v in self._read_index(model)["versions"]]

    def find_by_digest(self, model: str, digest: str) -> ModelVersion | None:
        return next((v for v in self.versions(model) if v.digest == digest), None)

    def champion(self, model: str) -> ModelVersion | None:
        return next((v for v in self.versions(model) if CHAMPION in v.aliases), None)

    def upload(self, model: str, model_dir: str, *, digest: str, metrics: dict, labels: dict,
               description: str = "", artifact_uri: str | None = None, lineage: dict | None = None) -> ModelVersion:
        """Copies `model_dir` into the registry (`artifact_uri` is for remote registries and unused here)."""
        with self._locked(model) as index:
            for entry in index["versions"]:
                if entry["digest"] == digest:  # raced with another writer of the same model
                    return self._version(model, entry)
            number = str(1 + max((int(v["version"]) for v in index["versions"]), default=0))
            target = os.path.join(self._model_dir(model), "versions", number)
            staging = target + ".partial"
            shutil.rmtree(staging, ignore_errors=True)
            shutil.copytree(model_dir, staging)
            os.replace(staging, target)
            entry = {
                "version": number, "aliases": [], "uri": target, "digest": digest, "metrics": metrics,
                "labels": labels, "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
                "resource_name": "", "lineage": dict(lineage or {}),
            }
            if not index["versions"]:
                entry["aliases"].append("default")
            index["versions"].append(entry)
            self._write_index(model, index)
            return self._version(model, entry)

    def set_alias(self, model: str, version: str, alias: str) -> ModelVersion:
        with self._locked(model) as index:
            return self._move(model, index, version, alias)

    def move_champion(self, model: str, version: str, *, expected: str | None) -> ModelVersion:
        """Checks and moves under the one lock every writer takes, so no other run's move falls between the two."""
        with self._locked(model) as index:
            current = next((v for v in index["versions"] if CHAMPION in v["aliases"]), None)
            if current is not None and current["version"] == version:
                return self._version(model, current)
            if (current["version"] if current else None) != expected:
                raise ChampionChanged(model, expected, self._version(model, current) if current else None)
            return self._move(model, index, version, CHAMPION)

    def _move(self, model: str, index: dict, version: str, alias: str) -> ModelVersion:
        """Moves `alias` to `version` in `index` and writes it; the caller holds the lock."""
        target = next((v for v in index["versions"] if v["version"] == version), None)
        if target is None:
            raise KeyError(f"{model} has no version {version}")
        for entry in index["versions"]:
            if alias in entry["aliases"]:
                entry["aliases"].remove(alias)
        target["aliases"].append(alias)
        self._write_index(model, index)
        return self._version(model, target)
