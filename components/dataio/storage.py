"""Paths that are local or gs:// (through `tf.io.gfile`), the one glob of every step (`glob`: tf.io.gfile.glob's
answer, with or without TensorFlow), and the error for input data that cannot be used. The bottom of the data
helpers: components/dataio/images.py and components/dataio/data.py build on it.

Training on PyTorch or JAX runs where TensorFlow may not be installed (the PyTorch GPU image): that step calls
`use_tensorflow_io(False)` first, and gfile() is then `LocalFiles`: local paths (a GCS FUSE mount included) with
Python's own file functions, `gs://` URIs with google-cloud-storage's client (components/dataio/gcs.py, the same calls
with tf.io.gfile's meaning). Where TensorFlow is not installed at all (evaluation and batch prediction of a run on
PyTorch, in the PyTorch image), gfile() is LocalFiles whatever was chosen. Other URI schemes need TensorFlow."""

from __future__ import annotations

import functools
import os
import re
import shutil
import types

_tensorflow_io = True  # whether gfile() is tf.io.gfile (the default) or LocalFiles
_tensorflow_installed: bool | None = None


def use_tensorflow_io(enabled: bool) -> None:
    """Chooses what gfile() returns: tf.io.gfile (True, the default) or LocalFiles (False)."""
    global _tensorflow_io
    _tensorflow_io = enabled


def tensorflow_or_none():
    """TensorFlow, or None where it cannot be imported (tried once; a step that has it imports it anyway)."""
    global _tensorflow_installed
    if _tensorflow_installed is False:
        return None
    try:
        import tensorflow as tf
    except ImportError:
        _tensorflow_installed = False
        return None
    _tensorflow_installed = True
    return tf


def gfile():
    tf = tensorflow_or_none() if _tensorflow_io else None
    return LocalFiles if tf is None else tf.io.gfile


def join(base: str, *parts: str) -> str:
    """os.path.join that keeps `gs://` URIs intact."""
    return "/".join([base.rstrip("/"), *parts]) if "://" in base else os.path.join(base, *parts)


def copy_tree(source: str, destination: str) -> int:
    """Copies the directory tree `source` into `destination`, between local paths and gs:// (`gfile()`), files
    overwritten; returns the number of files copied."""
    files, copied = gfile(), 0
    for directory, _, names in files.walk(source):
        relative = directory[len(source.rstrip("/")):].strip("/")
        target = join(destination, relative) if relative else destination
        files.makedirs(target)
        for name in names:
            files.copy(join(directory, name), join(target, name), overwrite=True)
            copied += 1
    return copied


class DataError(ValueError):
    """Input data that cannot be used, with a message saying what to do about it."""



def locate(dataset_dir: str, path: str) -> str:
    """A manifest's path: relative ones are inside the dataset directory; absolute paths and URIs point elsewhere
    (augment's pass-through, data written by reference under a data root: components/dataio/datadir.py)."""
    if "://" in path or os.path.isabs(path):
        return path
    return join(dataset_dir if "://" in dataset_dir else os.path.abspath(dataset_dir), path)


def _uri_files(path: str):
    """What reads and writes a URI here: components/dataio/gcs.py for gs:// (google-cloud-storage), tf.io.gfile for any
    other scheme, or DataError saying what to do where that cannot be."""
    if path.startswith("gs://"):
        try:
            import google.cloud.storage  # noqa: F401 (installed with google-cloud-aiplatform: in every image)
        except ImportError as e:
            raise DataError(f"{path}: gs:// without TensorFlow needs google-cloud-storage ({e}): pip install "
                            "google-cloud-storage, or mount the bucket with GCS FUSE and pass its local path "
                            "(docs/data-by-reference.md)") from None
        from components.dataio import gcs

        return gcs
    tf = tensorflow_or_none()
    if tf is None:
        raise DataError(f"{path}: without TensorFlow only local paths and gs:// URIs are read and written; mount "
                        "the storage locally and pass its path (docs/data-by-reference.md)")
    return tf.io.gfile


# ---------------------------------------------------------------------------------------------- glob
#
# One glob for local and gs:// paths, giving tf.io.gfile.glob's answer whichever framework reads the files (the
# TensorFlow files named below are under third_party/xla/xla/tsl/platform/ of its repository, formerly
# tensorflow/tsl/platform/; tests/test_paths_agree.py holds the answers to tf.io.gfile.glob of TensorFlow 2.21 and
# to the C library's fnmatch):
# - a path matches as POSIX fnmatch(pattern, path, FNM_PATHNAME) decides, which is TensorFlow's FileSystem::Match
#   on POSIX (file_system.cc): `*`, `?` and `[...]` never match "/", `\` escapes the next character, and a leading
#   "." is matched like any other character (no FNM_PERIOD: Python's glob.glob skips hidden files, TensorFlow
#   does not);
# - local paths are expanded level by level from the last folder without a glob character, each child of a matching
#   folder matched against the pattern cut at that level (GetMatchingPaths, file_system_helper.cc);
# - gs:// lists every object under the folder of the pattern's fixed prefix once, adds every parent folder of each
#   name, leaves out that folder's own marker object (`d/` for `gs://b/d/*`) and matches the full paths
#   (GcsFileSystem::GetMatchingPaths and AddAllSubpaths, cloud/gcs_file_system.cc). A marker below that folder
#   still matches a pattern ending in "/*" (`gs://b/d/*/*` gives `gs://b/d/sub/`), as TensorFlow's does.

GLOB_CHARS = "*?[\\"  # kGlobbingChars: a pattern's fixed prefix ends before the first of these


def _fixed_prefix(pattern: str) -> str:
    return pattern[:min((pattern.find(c) for c in GLOB_CHARS if c in pattern), default=len(pattern))]


_CLASSES = {"alnum": "a-zA-Z0-9", "alpha": "a-zA-Z", "blank": " \\t", "cntrl": "\\x00-\\x1f\\x7f", "digit": "0-9",
            "graph": "!-~", "lower": "a-z", "print": " -~", "punct": "!-/:-@\\[-`{-~", "space": " \\t\\n\\r\\f\\v",
            "upper": "A-Z", "xdigit": "0-9A-Fa-f"}


class _Invalid(Exception):
    """A pattern glibc's fnmatch refuses (a bad collating element or range end): it matches nothing."""


def _bracket_char(pattern: str, i: int) -> tuple[str | None, int]:
    """One element of a bracket expression at pattern[i]: (the character, the index after it), or (None, index
    after) for a character class, whose regex is then in the returned... see _bracket."""
    if pattern.startswith(("[.", "[="), i):
        closing = pattern[i + 1] + "]"
        if pattern.startswith(closing, i + 3):
            return pattern[i + 2], i + 5
        raise _Invalid
    if pattern[i] == "\\" and i + 1 < len(pattern):
        return pattern[i + 1], i + 2
    return pattern[i], i + 1


def _bracket(pattern: str, start: int) -> tuple[str, int] | None:
    """The regex of the bracket expression at pattern[start] ("[") and the index after it; None where it is not
    closed (the "[" is then an ordinary character, as fnmatch takes it). Never matches "/" (FNM_PATHNAME: a "/"
    inside the brackets is no element)."""
    i = start + 1
    negate = i < len(pattern) and pattern[i] in "!^"
    i += negate
    items: list[str] = []
    first = True
    while i < len(pattern):
        if pattern[i] == "]" and not first:
            body = "".join(items)
            if negate:
                return f"[^/{body}]", i + 1
            return (f"(?:(?!/)[{body}])" if body else "(?!)"), i + 1
        first = False
        if pattern.startswith("[:", i):
            end = pattern.find(":]", i + 2)
            if end > 0 and pattern[i + 2:end] in _CLASSES:
                items.append(_CLASSES[pattern[i + 2:end]])
                i = end + 2
                continue
        low, i = _bracket_char(pattern, i)
        if i + 1 == len(pattern) and pattern[i] == "-":
            raise _Invalid  # a range without its end
        if i + 1 < len(pattern) and pattern[i] == "-" and pattern[i + 1] != "]":
            high, i = _bracket_char(pattern, i + 1)  # a range's end is one character, never a class
            if low != "/" and high != "/" and low <= high:  # a reversed range holds nothing
                items.append(re.escape(low) + "-" + re.escape(high))
            continue
        if low != "/":
            items.append(re.escape(low))
    return None


@functools.lru_cache(maxsize=256)
def glob_regex(pattern: str, recursive: bool = False) -> re.Pattern:
    """The regex of a glob pattern, matched against a whole path (`match` or `fullmatch`): fnmatch with
    FNM_PATHNAME, and with `recursive` (batch prediction's input globs, components/predict/sources.py) `**` also
    crosses folders, `**/` matching zero or more of them, as Python's glob(recursive=True) reads it."""
    out, i = [], 0
    try:
        while i < len(pattern):
            ch = pattern[i]
            if recursive and pattern.startswith("**/", i):
                out.append("(?:.*/)?")
                i += 3
                continue
            if recursive and pattern.startswith("**", i):
                out.append(".*")
                i += 2
                continue
            if ch == "*":
                out.append("[^/]*")
            elif ch == "?":
                out.append("[^/]")
            elif ch == "[" and (bracket := _bracket(pattern, i)) is not None:
                out.append(bracket[0])
                i = bracket[1]
                continue
            elif ch == "\\":
                if i + 1 == len(pattern):
                    raise _Invalid  # a lone "\\" at the end escapes nothing
                i += 1
                out.append(re.escape(pattern[i]))
            else:
                out.append(re.escape(ch))
            i += 1
    except _Invalid:
        return re.compile("(?!)")
    return re.compile("".join(out) + r"\Z", re.DOTALL)


def match(path: str, pattern: str) -> bool:
    """Whether `path` matches the glob `pattern` as fnmatch(pattern, path, FNM_PATHNAME) says."""
    return glob_regex(pattern).match(path) is not None


def _directory_prefixes(pattern: str) -> list[str]:
    """AllDirectoryPrefixes: the pattern cut after each "/", parent first (a relative pattern without a folder
    is read as ./PATTERN, PatchPattern)."""
    if not os.path.dirname(_fixed_prefix(pattern)):
        pattern = os.path.join(".", pattern)
    path = pattern[:-1] if pattern.endswith("/") else pattern
    prefixes = []
    while path:
        prefixes.append(path)
        parent = os.path.dirname(path)
        if parent == path:
            break
        path = parent
    return prefixes[::-1]


def _local_glob(pattern: str) -> list[str]:
    levels = _directory_prefixes(pattern)
    first = next(i for i, level in enumerate(levels) if _fixed_prefix(level) != level)
    found, queue = [], [levels[first - 1]]
    for index in range(first, len(levels)):
        following = []
        for parent in queue:
            try:
                children = os.listdir(parent)
            except OSError:  # not a folder, gone, or not readable: nothing below it matches
                continue
            for child in children:
                path = os.path.join(parent, child)
                if not match(path, levels[index]):
                    continue
                if index == len(levels) - 1:
                    found.append(path)
                elif os.path.isdir(path):
                    following.append(path)
        queue = following
    return found


def _dirname(path: str) -> str:
    """tsl's io::Dirname: up to the last "/" ("a//b" -> "a/", where os.path.dirname gives "a")."""
    last = path.rfind("/")
    return "" if last < 0 else "/" if last == 0 else path[:last]


def _gcs_glob(pattern: str) -> list[str]:
    from components.dataio import gcs  # google-cloud-storage's client (the import is checked by _uri_files)

    folder = _dirname(_fixed_prefix(pattern)[len("gs://"):])  # BUCKET or BUCKET/FOLDER
    bucket, _, prefix = folder.partition("/")
    if not bucket:
        raise DataError(f"A gs:// pattern needs a bucket name before its first glob character: {pattern}")
    prefix = prefix + "/" if prefix else ""
    paths: set[str] = set()
    for name in gcs.list_names(bucket, prefix):
        relative = name[len(prefix):]
        if not relative:
            continue  # the folder's own marker object (include_self_directory_marker=false)
        paths.add(relative)
        parent = _dirname(relative)
        while parent and parent != "/":
            paths.add(parent)
            parent = _dirname(parent)
    return [full for full in (f"gs://{folder}/{path}" for path in paths) if match(full, pattern)]


def glob(pattern: str) -> list[str]:
    """The files and folders matching a glob pattern (`*`, `?`, `[...]`, `\\`), local or gs://, sorted: what
    tf.io.gfile.glob answers (see above), with or without TensorFlow. Every step globs through here."""
    if not pattern:
        return []
    if _fixed_prefix(pattern) == pattern:
        return [pattern] if LocalFiles.exists(pattern) else []
    if pattern.startswith("gs://"):
        _uri_files(pattern)
        return sorted(_gcs_glob(pattern))
    if "://" in pattern:
        return sorted(_uri_files(pattern).glob(pattern))
    return sorted(_local_glob(pattern))


class LocalFiles:
    """The part of tf.io.gfile's interface the steps use, without TensorFlow: local paths with Python's own file
    functions, gs:// URIs with components/dataio/gcs.py."""

    @staticmethod
    def exists(path: str) -> bool:
        return _uri_files(path).exists(path) if "://" in path else os.path.exists(path)

    @staticmethod
    def isdir(path: str) -> bool:
        return _uri_files(path).isdir(path) if "://" in path else os.path.isdir(path)

    @staticmethod
    def makedirs(path: str) -> None:
        if "://" in path:
            return _uri_files(path).makedirs(path)
        os.makedirs(path, exist_ok=True)

    @staticmethod
    def glob(pattern: str) -> list[str]:
        return glob(pattern)

    @staticmethod
    def listdir(path: str) -> list[str]:
        return _uri_files(path).listdir(path) if "://" in path else os.listdir(path)

    @staticmethod
    def copy(source: str, target: str, overwrite: bool = False) -> None:
        if "://" in source or "://" in target:
            return _uri_files(source if "://" in source else target).copy(source, target, overwrite=overwrite)
        if not overwrite and os.path.exists(target):
            raise FileExistsError(target)
        shutil.copyfile(source, target)

    @staticmethod
    def rename(source: str, target: str, overwrite: bool = False) -> None:
        if "://" in source or "://" in target:
            return _uri_files(source if "://" in source else target).rename(source, target, overwrite=overwrite)
        if not overwrite and os.path.exists(target):
            raise FileExistsError(target)
        os.replace(source, target)

    @staticmethod
    def remove(path: str) -> None:
        return _uri_files(path).remove(path) if "://" in path else os.remove(path)

    @staticmethod
    def rmtree(path: str) -> None:
        return _uri_files(path).rmtree(path) if "://" in path else shutil.rmtree(path)

    @staticmethod
    def walk(top: str):
        """(dirname, subdirs, files) top-down; gs://: subdirs end with "/", as tf.io.gfile's on GCS."""
        return _uri_files(top).walk(top) if "://" in top else os.walk(top)

    @staticmethod
    def stat(path: str):
        """The size and modification time, by tf.io.gfile's names (length, mtime_nsec)."""
        if "://" in path:
            return _uri_files(path).stat(path)
        found = os.stat(path)
        return types.SimpleNamespace(length=found.st_size, mtime_nsec=found.st_mtime_ns)

    @staticmethod
    def GFile(path: str, mode: str = "r"):  # noqa: N802 (tf.io.gfile's name)
        if "://" in path:
            return _uri_files(path).GFile(path, mode)
        return open(path, mode)
