"""Cloud Storage, the calls of the JSON API v1 that google-cloud-storage's `Client` makes for listing, reading,
writing, copying and deleting objects, over a local folder: gs://BUCKET/NAME is ROOT/BUCKET/NAME. Tests point the
real client at it with `STORAGE_EMULATOR_HOST` (the client then uses anonymous credentials and this endpoint:
google-cloud-storage 3.17.1, client.py:191-205 and 250-262).

Any object name Cloud Storage allows is held (cloud.google.com/storage/docs/naming-objects: any UTF-8 but CR and
LF, so names a folder cannot hold as files are written with those): the folder marker `d/` that TensorFlow's
makedirs uploads is the file `d/<LF>`, an object `d` beside objects under `d/` is the file `d/<LF><LF>`, and the
segments "." and ".." are `<LF>.` and `<LF>..`. Names without those are plain files, so a test may lay out or read
a bucket with ordinary file calls.

Generations (cloud.google.com/storage/docs/metadata#generation-number) are the file's modification time in
microseconds, raised on each write here so that every write of a name gets a greater one. Requests honour
`generation` (objects.get, a media download, ranged or not, and objects.delete: 404 when the live object has
another) and the preconditions `ifGenerationMatch` (0: the object must not exist) and `ifSourceGenerationMatch`
(cloud.google.com/storage/docs/request-preconditions): 412 when one does not hold.

Follows the public JSON API reference (cloud.google.com/storage/docs/json_api/v1):
- `GET /storage/v1/b/{bucket}/o` (objects.list): `prefix`; the objects of the bucket whose names start with it, in
  lexicographic order, as `{"kind": "storage#objects", "items": [object resource, ...]}`; an unknown bucket is 404.
  With `delimiter` ("/"), an object whose name has the delimiter after the prefix is not listed; the names up to
  and including that delimiter are listed once each in `prefixes`, in lexicographic order
  (cloud.google.com/storage/docs/json_api/v1/objects/list, "delimiter" and "prefixes[]"). `maxResults` caps the
  items of a page, and `nextPageToken` then says where the next page (`pageToken`) starts.
- `GET /storage/v1/b/{bucket}/o/{object}` (objects.get): the object resource (`name`, `bucket`, `size` as a string,
  `generation`, `contentType`, `updated` in RFC 3339, and `crc32c` and `md5Hash` in base64, the CRC32C big-endian:
  cloud.google.com/storage/docs/json_api/v1/objects#resource; the client checks the crc32c of a finished
  resumable upload), 404 when absent. The object name is percent-encoded,
  slashes included.
- `DELETE /storage/v1/b/{bucket}/o/{object}` (objects.delete): 204 with an empty body; 404 when absent
  (cloud.google.com/storage/docs/json_api/v1/objects/delete).
- `POST /upload/storage/v1/b/{bucket}/o?uploadType=multipart` (objects.insert, a multipart upload: the client's
  URL, blob.py:86-89, used for uploads up to 8 MiB, blob.py:148): a `multipart/related` body of the object's JSON
  metadata (`name`) and its bytes; creates or replaces the object and answers its resource
  (cloud.google.com/storage/docs/uploading-objects#uploading-an-object, "multipart upload";
  cloud.google.com/storage/docs/json_api/v1/objects/insert).
- Resumable uploads (the client's for bigger files, blob.py:90 and 147-148): `POST .../o?uploadType=resumable` with
  the object's JSON metadata answers 200 with the session URI in `Location`; each `PUT` to it carries
  `Content-Range: bytes A-B/TOTAL` (TOTAL `*` while unknown) and answers 308 with `Range: bytes=0-N` (what is
  stored so far) until the last byte of TOTAL arrives, then 200 with the object's resource
  (cloud.google.com/storage/docs/performing-resumable-uploads, "Upload the data" and "Upload in multiple
  chunks"; cloud.google.com/storage/docs/json_api/v1/how-tos/resumable-upload). A chunk that does not start where
  the stored bytes end is 400 here (the real service answers 308 with what it has; the client never sends one).
- `POST /storage/v1/b/{srcBucket}/o/{srcObject}/rewriteTo/b/{dstBucket}/o/{dstObject}` (objects.rewrite; the
  client's path, blob.py:4188): copies in one call, answering `{"kind": "storage#rewriteResponse", "done": true,
  "totalBytesRewritten", "objectSize", "resource"}` (cloud.google.com/storage/docs/json_api/v1/objects/rewrite); 404
  when the source is absent.
- `GET /download/storage/v1/b/{bucket}/o/{object}?alt=media` (objects.get with alt=media; the client's download URL,
  blob.py:85): the object's bytes; with `Range: bytes=A-B` (B inclusive) or `bytes=A-`, those bytes answered 206
  with `Content-Range: bytes A-B/SIZE`, and 416 with `Content-Range: bytes */SIZE` when A is past the end (RFC 9110
  14.4; the client's BlobReader reads in ranges and takes 416 as the end of the file, fileio.py:141-157). Every
  download answers `x-goog-hash: crc32c=...` and `x-goog-hash: md5=...` (two headers, of the whole object, as
  Cloud Storage sends them: cloud.google.com/storage/docs/json_api/v1/objects/get "Response" and
  cloud.google.com/storage/docs/hashes-etags#json-api), `x-goog-generation` and
  `x-goog-stored-content-length`: the client checks a whole download against the hash
  (google/cloud/storage/_media/requests/download.py:117-184 at 3.17.1; a 206 is not checked). `corrupt_next`
  flips a byte of the next downloads' bodies (of names ending with `corrupt_suffix`), to show that check fails.
- An error the stand-in did not foresee answers 500 with Google's JSON error body (INTERNAL), as the service does,
  instead of dropping the connection (cloud.google.com/storage/docs/json_api/v1/status-codes, 500).
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import struct
import urllib.parse

import google_crc32c
from tests.standins.base import ApiError, Request, StandIn, google_error, rfc3339, route

_OBJECT = r"(?P<object>[^/]+)"
_BUCKET = r"(?P<bucket>[^/]+)"
# The file names of the segments a folder cannot hold as files (see above); no object name contains a LF.
_SEGMENTS = {"": "\n", ".": "\n.", "..": "\n.."}
_NAMES = {escaped: segment for segment, escaped in _SEGMENTS.items()}
_SELF = "\n\n"  # the object `d` where `d` is also a folder (objects under `d/`)


def _precondition_failed() -> ApiError:
    return ApiError("FAILED_PRECONDITION", "At least one of the pre-conditions you specified did not hold.",
                    http_status=412)


def _hashes(contents: bytes) -> tuple[str, str]:
    """The object's crc32c (big-endian) and MD5, base64, as the JSON API and x-goog-hash write them."""
    return (base64.b64encode(struct.pack(">I", google_crc32c.value(contents))).decode(),
            base64.b64encode(hashlib.md5(contents).digest()).decode())


class GcsStandIn(StandIn):
    name = "Cloud Storage"

    def __init__(self, root: str, **kwargs):
        super().__init__(**kwargs)
        self.root = str(root)
        self.uploads: dict[str, dict] = {}  # resumable upload sessions: upload_id -> bucket, name, bytes so far
        self.corrupt_next = 0  # the next downloads whose body has a byte flipped (the hash stays the object's)
        self.corrupt_suffix = ""  # with corrupt_next: only downloads of objects whose names end with this
        self.lost_answers: dict[str, int] = {}  # rpc -> calls carried out whose answer is then a 503 (lose_answer)

    def lose_answer(self, rpc: str, count: int = 1) -> None:
        """The next `count` calls of `rpc` are carried out, then answered 503, as when a change lands and its
        answer does not reach the client: what a retry then finds (fail_next answers before anything changes)."""
        with self.lock:
            self.lost_answers[rpc] = self.lost_answers.get(rpc, 0) + count

    def _dispatch(self, request: Request, raw_path: str):
        answer = super()._dispatch(request, raw_path)
        if self.lost_answers.get(request.rpc):
            self.lost_answers[request.rpc] -= 1
            raise ApiError("UNAVAILABLE", "Backend Error")
        return answer

    def routes(self):
        return [route("GET", rf"/storage/v1/b/{_BUCKET}/o", "storage.objects.list", self._list),
                route("GET", rf"/storage/v1/b/{_BUCKET}/o/{_OBJECT}", "storage.objects.get", self._get),
                route("DELETE", rf"/storage/v1/b/{_BUCKET}/o/{_OBJECT}", "storage.objects.delete", self._delete),
                route("POST", rf"/upload/storage/v1/b/{_BUCKET}/o", "storage.objects.insert", self._insert),
                route("POST", rf"/storage/v1/b/(?P<source_bucket>[^/]+)/o/(?P<source>[^/]+)/rewriteTo/b/{_BUCKET}/o/"
                      rf"{_OBJECT}", "storage.objects.rewrite", self._rewrite),
                route("GET", rf"/download/storage/v1/b/{_BUCKET}/o/{_OBJECT}", "storage.objects.media",
                      lambda request: self._path(request))]

    def error_body(self, error: ApiError, request: Request) -> dict:
        return google_error(error)

    # -- objects as files ------------------------------------------------------------------------------

    def _bucket_dir(self, bucket: str) -> str:
        folder = os.path.join(self.root, bucket)
        if not os.path.isdir(folder):
            raise ApiError("NOT_FOUND", "The specified bucket does not exist.")
        return folder

    def _file(self, bucket: str, name: str) -> str:
        """Where the object lives (whether or not it exists)."""
        path = os.path.join(self.root, bucket, *(_SEGMENTS.get(part, part) for part in name.split("/")))
        return os.path.join(path, _SELF) if os.path.isdir(path) else path

    def _names(self, bucket: str) -> list[str]:
        folder = self._bucket_dir(bucket)
        names = []
        for directory, _, files in os.walk(folder):
            for file in files:
                parts = os.path.relpath(os.path.join(directory, file), folder).split(os.sep)
                if parts[-1] == _SELF:
                    parts.pop()
                names.append("/".join(_NAMES.get(part, part) for part in parts))
        return sorted(names)

    def _generation(self, path: str) -> int:
        return os.stat(path).st_mtime_ns // 1000

    def _write(self, bucket: str, name: str, contents: bytes, request: Request) -> dict:
        """Creates or replaces an object, after its preconditions; each write of a name a greater generation."""
        folder = self._bucket_dir(bucket)
        if not name or "\n" in name or "\r" in name or len(name.encode()) > 1024:
            raise ApiError("INVALID_ARGUMENT", f"Invalid object name {name!r}.")
        path = self._file(bucket, name)
        previous = self._generation(path) if os.path.isfile(path) else 0
        self._check_generation(request, previous)
        parent = folder
        for part in name.split("/")[:-1]:  # an object `d` becomes d/<SELF> once objects go under `d/`
            parent = os.path.join(parent, _SEGMENTS.get(part, part))
            if os.path.isfile(parent):
                os.rename(parent, parent + _SELF)
                os.makedirs(parent)
                os.rename(parent + _SELF, os.path.join(parent, _SELF))
        path = self._file(bucket, name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(contents)
        if self._generation(path) <= previous:  # file times are coarser than writes can come
            os.utime(path, ns=((previous + 1) * 1000,) * 2)
        return self._resource(bucket, name)

    def _check_generation(self, request: Request, live: int, *, source: bool = False) -> None:
        """ifGenerationMatch (ifSourceGenerationMatch): `live` is the object's generation, 0 when it is absent."""
        wanted = request.arg("ifSourceGenerationMatch" if source else "ifGenerationMatch")
        if wanted and int(wanted) != live:
            raise _precondition_failed()

    def _object(self, bucket: str, name: str, request: Request | None = None, *, generation: str = "") -> str:
        """The file of a live object, of `generation` when one is asked for; NOT_FOUND otherwise."""
        self._bucket_dir(bucket)
        path = self._file(bucket, name)
        generation = generation or (request.arg("generation") if request else "")
        if not os.path.isfile(path) or (generation and int(generation) != self._generation(path)):
            suffix = f"#{generation}" if generation else ""
            raise ApiError("NOT_FOUND", f"No such object: {bucket}/{name}{suffix}")
        return path

    def _path(self, request: Request) -> str:
        return self._object(request.params["bucket"], request.params["object"], request)

    def _resource(self, bucket: str, name: str) -> dict:
        path = self._file(bucket, name)
        stat = os.stat(path)
        with open(path, "rb") as f:
            contents = f.read()
        crc, md5 = _hashes(contents)
        return {"kind": "storage#object", "bucket": bucket, "name": name, "size": str(stat.st_size),
                "generation": str(stat.st_mtime_ns // 1000), "metageneration": "1",
                "contentType": "application/octet-stream", "updated": rfc3339(stat.st_mtime, 3),
                "crc32c": crc, "md5Hash": md5,
                # The object's media download URL (objects#resource "mediaLink"), which gcloud storage downloads from
                # (googlecloudsdk/api_lib/storage/gcs_json/client.py, get_download_serialization_data).
                "mediaLink": f"{self.url}/download/storage/v1/b/{bucket}/o/{urllib.parse.quote(name, safe='')}"
                             f"?generation={stat.st_mtime_ns // 1000}&alt=media"}

    def _get(self, request: Request) -> dict:
        self._path(request)
        return self._resource(request.params["bucket"], request.params["object"])

    def _list(self, request: Request) -> dict:
        bucket = request.params["bucket"]
        prefix, delimiter = request.arg("prefix"), request.arg("delimiter")
        names = [n for n in self._names(bucket) if n.startswith(prefix)]
        prefixes = []
        if delimiter:
            prefixes = sorted({n[:n.index(delimiter, len(prefix)) + len(delimiter)] for n in names
                               if delimiter in n[len(prefix):]})
            names = [n for n in names if delimiter not in n[len(prefix):]]
        start = int(request.arg("pageToken") or 0)
        end = start + int(request.arg("maxResults") or len(names) or 1)
        page = {"kind": "storage#objects", "items": [self._resource(bucket, n) for n in names[start:end]]}
        if start == 0 and prefixes:
            page["prefixes"] = prefixes
        if end < len(names):
            page["nextPageToken"] = str(end)
        return page

    def _delete(self, request: Request) -> tuple[int, None]:
        path = self._path(request)
        self._check_generation(request, self._generation(path))
        os.remove(path)
        return 204, None

    def _insert(self, request: Request) -> dict:
        if request.arg("uploadType") != "multipart":
            raise ApiError("INVALID_ARGUMENT", f"uploadType {request.arg('uploadType')!r} is not served here")
        # The boundary quoted or not; gcloud storage's apitools client writes it as a Python repr, in single quotes
        # (apitools/base/py/transfer.py, Upload.__ConfigureMultipartRequest: "boundary=%r").
        boundary = re.search(r"""boundary=["']?([^"';]+)["']?""", request.headers.get("content-type", ""))
        if not boundary:
            raise ApiError("INVALID_ARGUMENT", "A multipart upload needs a multipart/related body with a boundary.")
        parts = request.raw.split(b"--" + boundary.group(1).encode())[1:-1]  # after the last one: "--"
        if len(parts) != 2:
            raise ApiError("INVALID_ARGUMENT", f"A multipart upload has 2 parts, not {len(parts)}.")
        # headers, a blank line, the body and the line end before the next boundary: CRLF from google-cloud-storage,
        # LF from apitools (it writes the body with Python's email generator, transfer.py __ConfigureMultipartRequest)
        metadata, media = (re.split(rb"\r?\n\r?\n", part, maxsplit=1)[1].removesuffix(b"\n").removesuffix(b"\r")
                           for part in parts)
        name = json.loads(metadata).get("name") or request.arg("name")
        return self._write(request.params["bucket"], name, media, request)

    def _rewrite(self, request: Request) -> dict:
        source = self._object(request.params["source_bucket"], request.params["source"],
                              generation=request.arg("sourceGeneration"))
        self._check_generation(request, self._generation(source), source=True)
        with open(source, "rb") as f:
            contents = f.read()
        resource = self._write(request.params["bucket"], request.params["object"], contents, request)
        size = str(len(contents))
        return {"kind": "storage#rewriteResponse", "totalBytesRewritten": size, "objectSize": size, "done": True,
                "resource": resource}

    def _serve(self, http_handler) -> None:
        """Media downloads answer bytes, not JSON, deletes no body, resumable uploads their own protocol: served
        here; everything else as every stand-in serves it."""
        split = urllib.parse.urlsplit(http_handler.path)
        if http_handler.command == "DELETE":  # objects.delete answers 204 without a body
            return self._exchange(http_handler, split, lambda request, headers: (
                self._dispatch(request, split.path)[0], b""), content_type=None)
        if split.path.startswith("/upload/") and "uploadType=resumable" in split.query:
            length = int(http_handler.headers.get("Content-Length") or 0)
            return self._exchange(http_handler, split, lambda request, headers: self._resumable(request, split, headers),
                                  raw=http_handler.rfile.read(length) if length else b"", rpc="storage.objects.insert")
        if not split.path.startswith("/download/"):
            return super()._serve(http_handler)
        return self._exchange(http_handler, split, lambda request, headers: self._download(request, split, headers),
                              content_type="application/octet-stream")

    def _download(self, request: Request, split, headers: dict) -> tuple[int, bytes]:
        """objects.get with alt=media: the object's bytes, or the range asked for (206, or 416 past the end)."""
        path = self._dispatch(request, split.path)[1]
        with open(path, "rb") as f:
            contents = f.read()
        crc, md5 = _hashes(contents)
        headers["x-goog-hash"] = [f"crc32c={crc}", f"md5={md5}"]
        headers["x-goog-generation"] = str(self._generation(path))
        headers["x-goog-stored-content-length"] = str(len(contents))
        body, status = contents, 200
        wanted = re.fullmatch(r"bytes=(\d+)-(\d*)", request.headers.get("range", ""))
        if wanted:
            start = int(wanted.group(1))
            end = min(int(wanted.group(2)) if wanted.group(2) else len(contents) - 1, len(contents) - 1)
            if start >= len(contents):
                headers["Content-Range"] = f"bytes */{len(contents)}"
                return 416, b""
            headers["Content-Range"] = f"bytes {start}-{end}/{len(contents)}"
            body, status = contents[start:end + 1], 206
        if self.corrupt_next and body and path.endswith(self.corrupt_suffix):
            self.corrupt_next -= 1
            body = bytes([body[0] ^ 0xFF]) + body[1:]
        return status, body

    def _exchange(self, http_handler, split, answer, *, content_type: str | None = "application/json",
                  raw: bytes = b"", rpc: str | None = None) -> None:
        """One request recorded and answered by `answer(request, headers) -> (status, body)`; an ApiError becomes
        Google's JSON error body."""
        request = Request(method=http_handler.command, path=urllib.parse.unquote(split.path),
                          query=urllib.parse.parse_qs(split.query, keep_blank_values=True),
                          headers={k.lower(): v for k, v in http_handler.headers.items()}, raw=raw)
        if rpc:
            request.rpc = rpc
        headers: dict[str, str | list[str]] = {}
        with self.lock:
            self.requests.append(request)
            try:
                status, body = answer(request, headers)
            except Exception as error:  # an ApiError, or a bug of the stand-in: answered, never a dropped connection
                if not isinstance(error, ApiError):
                    error = ApiError("INTERNAL", f"stand-in error: {error!r}")
                    headers.clear()
                status, body, content_type = error.http_status, json.dumps(google_error(error)).encode(), \
                    "application/json"
            request.status = status
        http_handler.send_response(status)
        if content_type:
            http_handler.send_header("Content-Type", content_type)
        http_handler.send_header("Content-Length", str(len(body)))
        for name, values in headers.items():
            for value in values if isinstance(values, list) else [values]:
                http_handler.send_header(name, value)
        http_handler.end_headers()
        http_handler.wfile.write(body)

    def _resumable(self, request: Request, split, headers: dict) -> tuple[int, bytes]:
        bucket = re.fullmatch(rf"/upload/storage/v1/b/{_BUCKET}/o", split.path)
        if not bucket or not os.path.isdir(os.path.join(self.root, bucket.group("bucket"))):
            raise ApiError("NOT_FOUND", "The specified bucket does not exist.")
        if request.method == "POST":
            name = request.json().get("name") or request.arg("name")
            if not name:
                raise ApiError("INVALID_ARGUMENT", f"Invalid object name {name!r}.")
            upload_id = str(len(self.uploads) + 1)
            self.uploads[upload_id] = {"bucket": bucket.group("bucket"), "name": name, "data": bytearray(),
                                       "if_generation_match": request.arg("ifGenerationMatch")}
            headers["Location"] = f"{self.url}{split.path}?uploadType=resumable&upload_id={upload_id}"
            return 200, b""
        session = self.uploads.get(request.arg("upload_id"))
        if request.method != "PUT" or session is None:
            raise ApiError("NOT_FOUND", "No such upload session.")
        wanted = re.fullmatch(r"bytes (?:(\d+)-(\d+)|\*)/(\d+|\*)", request.headers.get("content-range", ""))
        if not wanted:
            raise ApiError("INVALID_ARGUMENT", "A resumable upload's PUT needs Content-Range: bytes A-B/TOTAL.")
        if wanted.group(1) is not None:
            if int(wanted.group(1)) != len(session["data"]) or \
                    int(wanted.group(2)) - int(wanted.group(1)) + 1 != len(request.raw):
                raise ApiError("INVALID_ARGUMENT", "The chunk does not follow the bytes stored so far.")
            session["data"] += request.raw
        total = wanted.group(3)
        if total != "*" and len(session["data"]) == int(total):
            del self.uploads[request.arg("upload_id")]
            start = Request(method="POST", path=split.path, headers={}, raw=b"",  # the session's preconditions
                            query={"ifGenerationMatch": [session["if_generation_match"]]})
            resource = self._write(session["bucket"], session["name"], bytes(session["data"]), start)
            return 200, json.dumps(resource).encode()
        if session["data"]:
            headers["Range"] = f"bytes=0-{len(session['data']) - 1}"
        return 308, b""
