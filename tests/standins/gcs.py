"""Cloud Storage, the calls of the JSON API v1 that google-cloud-storage's `Client` makes for listing, reading,
writing, copying and deleting objects, over a local folder: gs://BUCKET/NAME is ROOT/BUCKET/NAME. Tests point the
real client at it with `STORAGE_EMULATOR_HOST` (the client then uses anonymous credentials and this endpoint:
google-cloud-storage 3.17.1, client.py:191-205 and 250-262).

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
  14.4; the client's BlobReader reads in ranges and takes 416 as the end of the file, fileio.py:141-157).
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import shutil
import struct
import urllib.parse

from components.records import crc32c
from tests.standins.base import ApiError, Request, StandIn, google_error, rfc3339, route

_OBJECT = r"(?P<object>[^/]+)"
_BUCKET = r"(?P<bucket>[^/]+)"


class GcsStandIn(StandIn):
    name = "Cloud Storage"

    def __init__(self, root: str, **kwargs):
        super().__init__(**kwargs)
        self.root = str(root)
        self.uploads: dict[str, dict] = {}  # resumable upload sessions: upload_id -> bucket, name, bytes so far

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

    def _path(self, request: Request) -> str:
        bucket = os.path.join(self.root, request.params["bucket"])
        if not os.path.isdir(bucket):
            raise ApiError("NOT_FOUND", "The specified bucket does not exist.")
        path = os.path.join(bucket, request.params["object"])
        if not os.path.isfile(path):
            raise ApiError("NOT_FOUND", f"No such object: {request.params['bucket']}/{request.params['object']}")
        return path

    def _resource(self, bucket: str, name: str) -> dict:
        path = os.path.join(self.root, bucket, name)
        stat = os.stat(path)
        with open(path, "rb") as f:
            contents = f.read()
        return {"kind": "storage#object", "bucket": bucket, "name": name, "size": str(stat.st_size),
                "generation": str(int(stat.st_mtime * 1e6)), "contentType": "application/octet-stream",
                "updated": rfc3339(stat.st_mtime, 3),
                "crc32c": base64.b64encode(struct.pack(">I", crc32c(contents))).decode(),
                "md5Hash": base64.b64encode(hashlib.md5(contents).digest()).decode()}

    def _get(self, request: Request) -> dict:
        self._path(request)
        return self._resource(request.params["bucket"], request.params["object"])

    def _list(self, request: Request) -> dict:
        bucket = request.params["bucket"]
        folder = os.path.join(self.root, bucket)
        if not os.path.isdir(folder):
            raise ApiError("NOT_FOUND", "The specified bucket does not exist.")
        prefix, delimiter = request.arg("prefix"), request.arg("delimiter")
        names = sorted(os.path.relpath(os.path.join(d, f), folder).replace(os.sep, "/")
                       for d, _, files in os.walk(folder) for f in files)
        names = [n for n in names if n.startswith(prefix)]
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
        os.remove(self._path(request))
        return 204, None

    def _insert(self, request: Request) -> dict:
        if request.arg("uploadType") != "multipart":
            raise ApiError("INVALID_ARGUMENT", f"uploadType {request.arg('uploadType')!r} is not served here")
        boundary = re.search(r'boundary="?([^";]+)"?', request.headers.get("content-type", ""))
        if not boundary:
            raise ApiError("INVALID_ARGUMENT", "A multipart upload needs a multipart/related body with a boundary.")
        parts = request.raw.split(b"--" + boundary.group(1).encode())[1:-1]  # after the last one: "--"
        if len(parts) != 2:
            raise ApiError("INVALID_ARGUMENT", f"A multipart upload has 2 parts, not {len(parts)}.")
        metadata, media = (part.split(b"\r\n\r\n", 1)[1][:-2] for part in parts)  # headers, body, CRLF
        name = json.loads(metadata).get("name") or request.arg("name")
        if not name or name.endswith("/"):
            raise ApiError("INVALID_ARGUMENT", f"Invalid object name {name!r}.")
        bucket = request.params["bucket"]
        if not os.path.isdir(os.path.join(self.root, bucket)):
            raise ApiError("NOT_FOUND", "The specified bucket does not exist.")
        path = os.path.join(self.root, bucket, name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(media)
        return self._resource(bucket, name)

    def _rewrite(self, request: Request) -> dict:
        source = self._path(Request(method="GET", path="", query={}, headers={}, raw=b"",
                                    params={"bucket": request.params["source_bucket"],
                                            "object": request.params["source"]}))
        bucket, name = request.params["bucket"], request.params["object"]
        if not os.path.isdir(os.path.join(self.root, bucket)):
            raise ApiError("NOT_FOUND", "The specified bucket does not exist.")
        path = os.path.join(self.root, bucket, name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        shutil.copyfile(source, path)
        size = str(os.path.getsize(path))
        return {"kind": "storage#rewriteResponse", "totalBytesRewritten": size, "objectSize": size, "done": True,
                "resource": self._resource(bucket, name)}

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
        with open(self._dispatch(request, split.path)[1], "rb") as f:
            contents = f.read()
        wanted = re.fullmatch(r"bytes=(\d+)-(\d*)", request.headers.get("range", ""))
        if not wanted:
            return 200, contents
        start = int(wanted.group(1))
        end = min(int(wanted.group(2)) if wanted.group(2) else len(contents) - 1, len(contents) - 1)
        if start >= len(contents):
            headers["Content-Range"] = f"bytes */{len(contents)}"
            return 416, b""
        headers["Content-Range"] = f"bytes {start}-{end}/{len(contents)}"
        return 206, contents[start:end + 1]

    def _exchange(self, http_handler, split, answer, *, content_type: str | None = "application/json",
                  raw: bytes = b"", rpc: str | None = None) -> None:
        """One request recorded and answered by `answer(request, headers) -> (status, body)`; an ApiError becomes
        Google's JSON error body."""
        request = Request(method=http_handler.command, path=urllib.parse.unquote(split.path),
                          query=urllib.parse.parse_qs(split.query, keep_blank_values=True),
                          headers={k.lower(): v for k, v in http_handler.headers.items()}, raw=raw)
        if rpc:
            request.rpc = rpc
        headers: dict[str, str] = {}
        with self.lock:
            self.requests.append(request)
            try:
                status, body = answer(request, headers)
            except ApiError as error:
                status, body, content_type = error.http_status, json.dumps(google_error(error)).encode(), \
                    "application/json"
            request.status = status
        http_handler.send_response(status)
        if content_type:
            http_handler.send_header("Content-Type", content_type)
        http_handler.send_header("Content-Length", str(len(body)))
        for name, value in headers.items():
            http_handler.send_header(name, value)
        http_handler.end_headers()
        http_handler.wfile.write(body)

    def _resumable(self, request: Request, split, headers: dict) -> tuple[int, bytes]:
        bucket = re.fullmatch(rf"/upload/storage/v1/b/{_BUCKET}/o", split.path)
        if not bucket or not os.path.isdir(os.path.join(self.root, bucket.group("bucket"))):
            raise ApiError("NOT_FOUND", "The specified bucket does not exist.")
        if request.method == "POST":
            name = request.json().get("name") or request.arg("name")
            if not name or name.endswith("/"):
                raise ApiError("INVALID_ARGUMENT", f"Invalid object name {name!r}.")
            upload_id = str(len(self.uploads) + 1)
            self.uploads[upload_id] = {"bucket": bucket.group("bucket"), "name": name, "data": bytearray()}
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
            path = os.path.join(self.root, session["bucket"], session["name"])
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "wb") as f:
                f.write(session["data"])
            del self.uploads[request.arg("upload_id")]
            return 200, json.dumps(self._resource(session["bucket"], session["name"])).encode()
        if session["data"]:
            headers["Range"] = f"bytes=0-{len(session['data']) - 1}"
        return 308, b""
