"""gs:// paths without TensorFlow: the part of `tf.io.gfile`'s interface the steps use, on google-cloud-storage's
client (installed with google-cloud-aiplatform, a dependency of the project, so in every image; the PyTorch
image's build imports it). components/dataio/storage.py sends gs:// paths here where TensorFlow is not installed (the
PyTorch image) or `use_tensorflow_io(False)` was chosen; it imports nothing of the project.

What each call does follows TensorFlow's own GCS file system (tsl/platform/cloud/gcs_file_system.cc, the functions
named below) and tf.io.gfile's Python layer (tensorflow/python/lib/io/file_io.py, TensorFlow 2.21):
- a "directory" is a prefix: `isdir("gs://b/d")` is true when any object's name starts with `d/` (FolderExists), a
  bucket's root when the bucket exists; `exists` is true for an object or such a directory.
- `listdir` lists one level (objects.list with delimiter "/"): objects by their names under the directory, and
  subdirectories with a trailing "/" (GetChildrenBounded); `walk` is file_io.walk_v2 over it, top-down.
- globbing is components/dataio/storage.py's `glob` (one for local and gs:// paths), over `list_names` here.
- `copy` and `rename` refuse an existing target unless overwrite=True (file_io.copy_v2/rename_v2); rename is a
  server-side copy and a delete of the source (RenameObject); `rmtree` deletes every object under the prefix.
  Between gs:// paths both carry generation preconditions, so that the client retries their server errors
  (`_server_copy`), and a target that appears meanwhile is never replaced without overwrite=True.
- `makedirs` writes nothing: an object's name makes its directories (TensorFlow uploads an empty `d/` marker; no
  step looks for one).
- `GFile` reads stream in ranged requests (the client's BlobReader); writes collect in a local temporary file and
  upload on close (and on flush, as TensorFlow's writable GCS file uploads on Sync).

The client is made on first use with Application Default Credentials (Workload Identity on GKE; nothing of the
repository's); where there are none it falls back to anonymous access, which reads public buckets. Tests hand in a
client of their own with `set_client`.
"""

from __future__ import annotations

import io
import os
import tempfile
import types
from typing import Iterator

_READ_CHUNK = 4 << 20  # bytes per ranged request of a streamed read
_SPOOL = 16 << 20  # a write bigger than this goes to a temporary file on disk until it is uploaded

_client = None  # set by set_client, or made by client() on first use
_clients: dict[str, object] = {}  # made here, one per endpoint (STORAGE_EMULATOR_HOST points the client elsewhere)


def set_client(client) -> None:
    """Uses `client` (a google.cloud.storage.Client) for every gs:// path from now on; None: the default one."""
    global _client
    _client = client


def client():
    """The google.cloud.storage.Client in use; ImportError where google-cloud-storage is not installed."""
    if _client is not None:
        return _client
    endpoint = os.environ.get("STORAGE_EMULATOR_HOST", "")
    if endpoint not in _clients:
        from google.cloud import storage

        try:
            _clients[endpoint] = storage.Client()
        except Exception as e:  # google.auth's DefaultCredentialsError, or no project: public buckets still read
            import logging

            logging.getLogger(__name__).info("gs:// without credentials (%s): public buckets only",
                                             str(e).splitlines()[0] if str(e) else type(e).__name__)
            _clients[endpoint] = storage.Client.create_anonymous_client()
    return _clients[endpoint]


def split(uri: str) -> tuple[str, str]:
    """gs://BUCKET/NAME -> (BUCKET, NAME)."""
    if not uri.startswith("gs://"):
        raise ValueError(f"Not a gs:// URI: {uri}")
    bucket, _, name = uri[len("gs://"):].partition("/")
    if not bucket:
        raise ValueError(f"No bucket in {uri}")
    return bucket, name


def _blob(uri: str):
    bucket, name = split(uri)
    if not name or name.endswith("/"):
        raise IsADirectoryError(uri)
    return client().bucket(bucket).blob(name)


def _not_found(e: Exception) -> bool:
    return type(e).__name__ == "NotFound"  # google.api_core.exceptions.NotFound, without importing it here


def _prefix(name: str) -> str:
    return name.rstrip("/") + "/" if name.strip("/") else ""


def _bucket_exists(bucket: str) -> bool:
    try:  # objects.list of one item rather than buckets.get: reading a bucket's objects needs no bucket permission
        list(client().list_blobs(bucket, max_results=1))
    except Exception as e:
        if _not_found(e):
            return False
        raise
    return True


def _object_exists(uri: str) -> bool:
    bucket, name = split(uri)
    return bool(name) and not name.endswith("/") and client().bucket(bucket).blob(name).exists()


def isdir(path: str) -> bool:
    bucket, name = split(path)
    if not name.strip("/"):
        return _bucket_exists(bucket)
    try:
        return any(True for _ in client().list_blobs(bucket, prefix=_prefix(name), max_results=1))
    except Exception as e:
        if _not_found(e):
            return False
        raise


def exists(path: str) -> bool:
    return _object_exists(path) or isdir(path)


def makedirs(path: str) -> None:
    split(path)


def listdir(path: str) -> list[str]:
    """The objects directly under the directory and its subdirectories (with a trailing "/"); FileNotFoundError
    where it is no directory."""
    bucket, name = split(path)
    prefix = _prefix(name)
    try:
        blobs = client().list_blobs(bucket, prefix=prefix, delimiter="/")
        files = [blob.name[len(prefix):] for blob in blobs if blob.name != prefix]
    except Exception as e:
        if _not_found(e):
            raise FileNotFoundError(f"Could not find directory {path}") from None
        raise
    folders = [p[len(prefix):] for p in sorted(blobs.prefixes)]
    if not files and not folders and not isdir(path):
        raise FileNotFoundError(f"Could not find directory {path}")
    return files + folders


def walk(top: str) -> Iterator[tuple[str, list[str], list[str]]]:
    """Top-down (dirname, subdirs, files), as tf.io.gfile.walk; a directory that is not there yields nothing."""
    try:
        listing = listdir(top)
    except FileNotFoundError:
        return
    subdirs = [item for item in listing if item.endswith("/")]
    here = (top, subdirs, [item for item in listing if not item.endswith("/")])
    yield here
    for subdir in here[1]:  # the caller may reorder or prune them, as with os.walk
        yield from walk(top.rstrip("/") + "/" + subdir)


def list_names(bucket: str, prefix: str = "") -> Iterator[str]:
    """The names of every object of the bucket that starts with `prefix`, in name order (objects.list without a
    delimiter: folder markers such as `d/` included); nothing for a bucket that is not there.
    components/dataio/storage.py globs over it."""
    try:
        for blob in client().list_blobs(bucket, prefix=prefix):
            yield blob.name
    except Exception as e:
        if _not_found(e):
            return
        raise


def stat(path: str):
    """length and mtime_nsec of an object (a directory: length 0), as tf.io.gfile.stat."""
    blob = _blob(path) if not path.endswith("/") else None
    if blob is not None:
        try:
            blob.reload()
        except Exception as e:
            if not _not_found(e):
                raise
        else:
            mtime = int(blob.updated.timestamp() * 1e9) if blob.updated else 0
            return types.SimpleNamespace(length=blob.size, mtime_nsec=mtime, is_directory=False)
    if isdir(path):
        return types.SimpleNamespace(length=0, mtime_nsec=0, is_directory=True)
    raise FileNotFoundError(f"The specified path {path} was not found.")


def remove(path: str) -> None:
    try:
        _blob(path).delete()
    except Exception as e:
        if _not_found(e):
            raise FileNotFoundError(f"{path} does not exist") from None
        raise


def rmtree(path: str) -> None:
    bucket, name = split(path)
    if not isdir(path):
        raise FileNotFoundError(f"{path} doesn't exist or not a directory.")
    for blob in list(client().list_blobs(bucket, prefix=_prefix(name))):
        blob.delete()


def _refuse_existing(target: str, overwrite: bool) -> None:
    if not overwrite and (exists(target) if target.startswith("gs://") else os.path.exists(target)):
        raise FileExistsError(f"{target} already exists (pass overwrite=True to replace it)")


def _live_generation(blob) -> int:
    """The generation of the object now, 0 where there is none (what ifGenerationMatch=0 means)."""
    try:
        blob.reload()
    except Exception as e:
        if _not_found(e):
            return 0
        raise
    return blob.generation


def _server_copy(source: str, target: str, overwrite: bool) -> int:
    """objects.rewrite of `source` onto `target` (the bytes never leave Cloud Storage); returns the generation
    copied. Each call carries the preconditions ifGenerationMatch (the target's generation now, 0: it must not
    exist) and ifSourceGenerationMatch: with them the client retries a 5xx or a dropped connection, which its
    default for rewrite, DEFAULT_RETRY_IF_GENERATION_SPECIFIED, does only then (google/cloud/storage/blob.py:4045
    and retry.py:129-133 at 3.17.1); without them one 503 failed a checkpoint's publish. A retry of a rewrite that
    had already landed finds the target changed (412): it is done where the target now holds the source's bytes."""
    blob, destination = _blob(source), _blob(target)
    blob.reload()  # NotFound: the caller's FileNotFoundError
    expected = _live_generation(destination) if overwrite else 0
    preconditions = {"if_generation_match": expected, "if_source_generation_match": blob.generation}
    try:
        token, _, _ = destination.rewrite(blob, **preconditions)
        while token is not None:
            token, _, _ = destination.rewrite(blob, token=token, **preconditions)
    except Exception as e:
        if type(e).__name__ != "PreconditionFailed":  # google.api_core.exceptions.PreconditionFailed (412)
            raise
        now = _blob(target)  # (a blob that has a generation reads that one, not the live object)
        if _live_generation(now) and (now.crc32c, now.size) == (blob.crc32c, blob.size):
            return blob.generation  # an earlier try of this copy landed
        if not overwrite:
            raise FileExistsError(f"{target} already exists (pass overwrite=True to replace it)") from None
        raise OSError(f"{target} or {source} changed while {source} was copied onto it: copy again") from None
    return blob.generation


def copy(source: str, target: str, overwrite: bool = False) -> None:
    """One file between gs:// and gs:// (copied by the server) or a local path, either way."""
    _refuse_existing(target, overwrite)
    try:
        if source.startswith("gs://") and target.startswith("gs://"):
            _server_copy(source, target, overwrite)
        elif source.startswith("gs://"):
            _blob(source).download_to_filename(target)
        else:
            if not os.path.isfile(source):
                raise FileNotFoundError(f"{source} does not exist")
            _blob(target).upload_from_filename(source)
    except Exception as e:
        if _not_found(e):
            raise FileNotFoundError(f"{source} does not exist (copying to {target})") from None
        raise


def rename(source: str, target: str, overwrite: bool = False) -> None:
    """An object to another name: a copy on the server, then the source deleted, if it is still the version
    copied (a retried delete that had landed finds it gone, which is what a rename wants)."""
    if not (source.startswith("gs://") and target.startswith("gs://")):
        raise OSError(f"Cannot rename {source} to {target}: both must be on gs:// (copy, then remove, instead)")
    _refuse_existing(target, overwrite)
    try:
        copied = _server_copy(source, target, overwrite)
    except Exception as e:
        if _not_found(e):
            raise FileNotFoundError(f"{source} does not exist (renaming to {target})") from None
        raise
    try:
        _blob(source).delete(if_generation_match=copied)
    except Exception as e:
        if not _not_found(e):
            raise


class _Writer(io.BufferedIOBase):
    """Bytes for one object, kept in a spooled temporary file and uploaded on flush and close."""

    def __init__(self, uri: str):
        super().__init__()
        self.uri, self.blob = uri, _blob(uri)
        self.buffer = tempfile.SpooledTemporaryFile(max_size=_SPOOL)
        self.uploaded = -1  # the size last uploaded

    def writable(self) -> bool:
        return True

    def write(self, data) -> int:
        return self.buffer.write(data)

    def flush(self) -> None:
        if self.buffer.closed or self.uploaded == self.buffer.tell():
            return
        size = self.buffer.tell()
        self.buffer.seek(0)
        self.blob.upload_from_file(self.buffer, size=size)
        self.buffer.seek(size)
        self.uploaded = size

    def close(self) -> None:
        if self.closed:
            return
        try:
            self.flush()
        finally:
            self.buffer.close()
            super().close()


def GFile(path: str, mode: str = "r"):  # noqa: N802 (tf.io.gfile's name)
    """A file object for reading ("r", "rb": streamed in ranged requests) or writing ("w", "wb": uploaded on
    close); FileNotFoundError for reading an object that is not there."""
    if mode not in ("r", "rb", "w", "wb"):
        raise ValueError(f"Unsupported mode {mode!r} for {path} (r, rb, w or wb)")
    if mode.startswith("w"):
        writer = _Writer(path)
        return writer if mode == "wb" else io.TextIOWrapper(writer, encoding="utf-8", newline="")
    blob = _blob(path)
    try:
        blob.reload()  # size and generation: every ranged read then reads this version of the object
    except Exception as e:
        if _not_found(e):
            raise FileNotFoundError(f"{path} does not exist") from None
        raise
    reader = blob.open("rb", chunk_size=_READ_CHUNK)
    return reader if mode == "rb" else io.TextIOWrapper(reader, encoding="utf-8", newline="")
