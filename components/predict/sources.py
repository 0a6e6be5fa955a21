"""Where batch prediction's inputs come from: folders, globs, manifests, single files and TFRecord shards,
listed lazily in a stable order and cut into chunks (the unit of work and of restart)."""

from __future__ import annotations

import csv
import dataclasses
import hashlib
import json
import os
import re
from typing import Iterator

from components.dataio import data

TFRECORD_SUFFIXES = (".tfrecord", ".tfrecords", ".tfrec", ".tfrecord.gz", ".tfrecords.gz", ".tfrec.gz")
MANIFEST_SUFFIXES = (".txt", ".csv", ".jsonl")
GLOB_CHARS = re.compile(r"[*?\[]")


@dataclasses.dataclass(frozen=True)
class Source:
    kind: str  # folder | glob | manifest | tfrecord | file
    location: str

    def __str__(self) -> str:
        return f"{self.kind} {self.location}"


def _is_remote(path: str) -> bool:
    return "://" in path


def _exists(path: str) -> bool:
    return data.gfile().exists(path) if _is_remote(path) else os.path.exists(path)


def _isdir(path: str) -> bool:
    return data.gfile().isdir(path) if _is_remote(path) else os.path.isdir(path)


def resolve_source(source: str) -> Source:
    """What kind of input `source` names; raises DataError saying what is accepted when it names nothing."""
    if not source:
        raise data.DataError("No image source given: pass a folder, a glob, a manifest or TFRecord shards")
    lowered = source.lower()
    if GLOB_CHARS.search(source):  # shards when the pattern's file name says so: DIR/train-*.tfrecord*
        return Source("tfrecord" if ".tfrec" in lowered.rsplit("/", 1)[-1] else "glob", source)
    if not _exists(source):
        raise data.DataError(f"Image source not found: {source}")
    if _isdir(source):
        return Source("folder", source)
    if lowered.endswith(TFRECORD_SUFFIXES):
        return Source("tfrecord", source)
    if lowered.endswith(MANIFEST_SUFFIXES):
        return Source("manifest", source)
    if lowered.endswith(data.IMAGE_EXTENSIONS):
        return Source("file", source)
    raise data.DataError(
        f"Cannot tell how to read {source}: give a folder of images, a glob (e.g. 'DIR/**/*.png'), a manifest "
        f"({', '.join(MANIFEST_SUFFIXES)}: one uri per line) or TFRecord shards ({', '.join(TFRECORD_SUFFIXES[:3])})")


def _normal(path: str) -> str:
    return path.rstrip("/") if _is_remote(path) else os.path.abspath(path)


class Unlisted(str):
    """A folder that could not be listed, passed along as an input so that it is reported (with the reason)
    in errors.jsonl and counted, rather than silently missing."""

    reason: str = ""

    @classmethod
    def of(cls, path: str, error: Exception) -> "Unlisted":
        unlisted = cls(path)
        unlisted.reason = f"folder could not be listed: {type(error).__name__}: {getattr(error, 'strerror', '') or error}"
        return unlisted


def walk_files(root: str, exclude: str | None = None) -> Iterator[str]:
    """Every file below `root`, lazily and in a stable order: a folder's files sorted, then its sub-folders in
    sorted order. Only one folder's listing is held at a time. `exclude` (a folder) is not entered; linked
    folders are followed once (no loops)."""
    excluded = _normal(exclude) if exclude else None
    if _is_remote(root):
        for directory, subdirs, files in data.gfile().walk(root):
            subdirs.sort()
            subdirs[:] = [d for d in subdirs if _normal(data.join(directory, d)) != excluded]
            for name in sorted(files):
                yield data.join(directory, name)
        return
    stack, seen = [root], set()
    while stack:
        directory = stack.pop()
        files, subdirs = [], []
        try:
            identity = os.stat(directory)
            if (identity.st_dev, identity.st_ino) in seen:
                continue
            seen.add((identity.st_dev, identity.st_ino))
            with os.scandir(directory) as entries:
                for entry in entries:
                    (subdirs if entry.is_dir() else files).append(entry.name)
        except OSError as e:
            yield Unlisted.of(directory, e)
            continue
        for name in sorted(files):
            yield os.path.join(directory, name)
        for name in sorted(subdirs, reverse=True):
            path = os.path.join(directory, name)
            if _normal(path) != excluded:
                stack.append(path)


def glob_regex(pattern: str) -> re.Pattern:
    """A regex for an input glob: storage's (fnmatch's rule: `*`, `?` and `[...]` stay within a folder), where `**`
    also crosses folders."""
    return data.glob_regex(pattern, recursive=True)


def _glob_base(pattern: str) -> str:
    """The longest folder of `pattern` without glob characters."""
    head = pattern[:GLOB_CHARS.search(pattern).start()]
    if _is_remote(pattern):
        scheme, rest = head.split("://", 1)
        return f"{scheme}://{rest.rsplit('/', 1)[0]}" if "/" in rest else f"{scheme}://{rest}"
    return os.path.dirname(head) or "."


def iter_glob(pattern: str, exclude: str | None = None) -> Iterator[str]:
    """Files matching `pattern`, streamed by walking its fixed prefix folder (stable order, bounded memory)."""
    base = _glob_base(pattern)
    if not _isdir(base):
        return
    if not _is_remote(pattern) and not os.path.isabs(pattern):
        pattern = os.path.join(os.getcwd(), pattern)
        base = os.path.join(os.getcwd(), base)
    matcher = glob_regex(pattern)
    for path in walk_files(base, exclude):
        if matcher.match(path):
            yield path


def iter_manifest(path: str) -> Iterator[str]:
    """The uris listed in a manifest (.txt: one per line, '#' comments; .csv: `uri` column or the first;
    .jsonl: `uri` or `content`), streamed; relative entries are resolved against the manifest's folder."""
    folder = path.rsplit("/", 1)[0] if _is_remote(path) else os.path.dirname(os.path.abspath(path))
    lowered = path.lower()

    def resolve(entry: str) -> str:
        entry = entry.strip()
        return entry if _is_remote(entry) or os.path.isabs(entry) else data.join(folder, entry)

    with data.gfile().GFile(path) as f:
        if lowered.endswith(".csv"):
            reader = csv.reader(f)
            column = 0
            for line_number, row in enumerate(reader, start=1):
                if line_number == 1 and "uri" in [c.strip().lower() for c in row]:
                    column = [c.strip().lower() for c in row].index("uri")
                    continue
                if len(row) > column and row[column].strip():
                    yield resolve(row[column])
        elif lowered.endswith(".jsonl"):
            for line_number, line in enumerate(f, start=1):
                if not line.strip():
                    continue
                try:
                    entry = json.loads(line)
                except json.JSONDecodeError as e:
                    raise data.DataError(f"{path} line {line_number} is not JSON: {e}") from None
                uri = entry.get("uri") or entry.get("content") if isinstance(entry, dict) else None
                if not isinstance(uri, str):
                    raise data.DataError(f"{path} line {line_number} has no 'uri' (or 'content') string")
                yield resolve(uri)
        else:
            for line in f:
                line = line.strip()
                if line and not line.startswith("#"):
                    yield resolve(line)


def iter_uris(source: Source, exclude: str | None = None) -> Iterator[str]:
    if source.kind == "folder":
        return walk_files(source.location, exclude)
    if source.kind == "glob":
        return iter_glob(source.location, exclude)
    if source.kind == "manifest":
        return iter_manifest(source.location)
    if source.kind == "file":
        return iter([source.location])
    raise ValueError(f"{source} is not a list of files")


def tfrecord_shards(source: Source) -> list[str]:
    if GLOB_CHARS.search(source.location):
        return data.glob(source.location)
    return [source.location]


# ---------------------------------------------------------------------------------------------- chunks


@dataclasses.dataclass
class Chunk:
    """A unit of work and of restart: a run of uris from a file source, or one TFRecord shard."""

    index: int
    fingerprint: str
    uris: list[str] | None = None
    shard: str | None = None

    @property
    def label(self) -> str:
        return self.shard or (f"{self.uris[0]} .. {self.uris[-1]}" if self.uris else "")


def settings_key(settings: dict) -> str:
    """What a chunk's rows depend on besides its inputs (the model's digest, top_k, the image size, the JPEG
    decoder), as canonical JSON: part of every chunk's fingerprint."""
    return json.dumps(settings, sort_keys=True, separators=(",", ":"))


def iter_chunks(source: Source, chunk_size: int, exclude: str | None = None,
                settings: dict | None = None) -> Iterator[Chunk]:
    """The chunks of `source`; each one's fingerprint covers its inputs and `settings` (see `settings_key`), so a
    finished chunk is only ever kept for a rerun with the same inputs, model and options."""
    prefix = settings_key(settings or {}) + "\0"
    if source.kind == "tfrecord":
        for index, shard in enumerate(tfrecord_shards(source)):
            stat = data.gfile().stat(shard)
            key = f"{prefix}{shard}\0{stat.length}\0{stat.mtime_nsec}"
            yield Chunk(index, "sha256:" + hashlib.sha256(key.encode()).hexdigest(), shard=shard)
        return
    for index, uris in enumerate(data.batched(iter_uris(source, exclude), chunk_size)):
        digest = hashlib.sha256((prefix + "\n".join(uris)).encode()).hexdigest()
        yield Chunk(index, "sha256:" + digest, uris=uris)
