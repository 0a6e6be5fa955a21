"""Register a trained model in a model registry with versions and a `champion` alias.

The step talks to a registry through the narrow `Registry` interface below. `LocalRegistry` keeps the
registry in a directory (an index written atomically, one folder per version); the Vertex AI Model
Registry implements the same interface, so a local run behaves like a Vertex run:

- every registration of a new model digest is a new version of one model;
- registering the same digest again returns the existing version (a retried task creates nothing);
- `champion` points at the blessed version that evaluation compares against, and moves, never copies.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime as _dt
import fcntl
import hashlib
import json
import os
import shutil
import sys
import tempfile
from typing import Iterator, Protocol

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


@dataclasses.dataclass
class Registration:
    version: ModelVersion
    new_version: bool  # False when the same digest was already registered (a retried task)

    def to_json(self) -> dict:
        return {**self.version.to_json(), "new_version": self.new_version}


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


def register(model_dir: str, registry: Registry, *, model_name: str, metrics: dict | None = None,
             labels: dict | None = None, promote: bool = True, artifact_uri: str | None = None) -> Registration:
    """Registers `model_dir` as a new version of `model_name` (or finds the version that already holds it).

    `model_dir` is read locally (for the digest); `artifact_uri` says where a remote registry finds the same
    files (the artifact's gs:// URI on a cluster). With `promote`, the `champion` alias moves to this version.
    """
    digest = model_digest(model_dir)
    metrics = dict(metrics or {})
    existing = registry.find_by_digest(model_name, digest)
    if existing is not None:
        version, new_version = existing, False
    else:
        description = ", ".join(f"{k}={v:.4f}" if isinstance(v, float) else f"{k}={v}" for k, v in sorted(metrics.items()))
        version = registry.upload(model_name, model_dir, digest=digest, metrics=metrics, labels=dict(labels or {}),
                                  description=description, artifact_uri=artifact_uri)
        new_version = True
    if promote and CHAMPION not in version.aliases:
        version = registry.set_alias(model_name, version.version, CHAMPION)
    return Registration(version=version, new_version=new_version)


class LocalRegistry:
    """A model registry in a local directory.

    Layout: `ROOT/MODEL/index.json` (versions, aliases; replaced atomically) and `ROOT/MODEL/versions/N/`
    (a copy of the registered model directory). A lock file serialises writers.
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
               description: str = "", artifact_uri: str | None = None) -> ModelVersion:
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
                "resource_name": "",
            }
            if not index["versions"]:
                entry["aliases"].append("default")
            index["versions"].append(entry)
            self._write_index(model, index)
            return self._version(model, entry)

    def set_alias(self, model: str, version: str, alias: str) -> ModelVersion:
        with self._locked(model) as index:
            target = next((v for v in index["versions"] if v["version"] == version), None)
            if target is None:
                raise KeyError(f"{model} has no version {version}")
            for entry in index["versions"]:
                if alias in entry["aliases"]:
                    entry["aliases"].remove(alias)
            target["aliases"].append(alias)
            self._write_index(model, index)
            return self._version(model, target)


REGISTRIES = ("local", "vertex")


def open_registry(kind: str, *, root: str = "", project: str = "", location: str = "") -> Registry:
    """The registry named by pipeline parameters: `local` (a directory) or `vertex` (Vertex AI Model Registry)."""
    if kind == "local":
        if not root:
            raise ValueError("registry=local needs a registry root directory (registry_root)")
        return LocalRegistry(root)
    if kind == "vertex":
        if not project or not location:
            raise ValueError("registry=vertex needs a project and a location (region)")
        from components.registry_vertex import VertexRegistry

        return VertexRegistry(project=project, location=location)
    raise ValueError(f"Unknown registry {kind!r}; known: {', '.join(REGISTRIES)}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-dir", required=True, help="the exported model directory to register")
    parser.add_argument("--registry-root", required=True, help="local registry directory")
    parser.add_argument("--model-name", default="image-classifier")
    parser.add_argument("--metrics", default="{}", help="JSON object of evaluation metrics to record")
    parser.add_argument("--no-promote", action="store_true", help="do not move the champion alias")
    args = parser.parse_args(argv)
    result = register(args.model_dir, LocalRegistry(args.registry_root), model_name=args.model_name,
                      metrics=json.loads(args.metrics), promote=not args.no_promote)
    json.dump(result.to_json(), sys.stdout, indent=2)
    print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
