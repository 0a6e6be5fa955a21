"""Cloud Storage, the reads of the JSON API v1 that google-cloud-storage's `Client` makes for listing and reading
objects, over a local folder: gs://BUCKET/NAME is ROOT/BUCKET/NAME. Tests point the real client at it with
`STORAGE_EMULATOR_HOST` (the client then uses anonymous credentials and this endpoint: google-cloud-storage 3.17.1,
client.py:191-205 and 250-262).

Follows the public JSON API reference (cloud.google.com/storage/docs/json_api/v1):
- `GET /storage/v1/b/{bucket}/o` (objects.list): `prefix`; the objects of the bucket whose names start with it, in
  lexicographic order, as `{"kind": "storage#objects", "items": [object resource, ...]}` (one page: `maxResults`
  is not needed at the sizes tests use); an unknown bucket is 404.
- `GET /storage/v1/b/{bucket}/o/{object}` (objects.get): the object resource (`name`, `bucket`, `size` as a string,
  `generation`, `contentType`), 404 when absent. The object name is percent-encoded, slashes included.
- `GET /download/storage/v1/b/{bucket}/o/{object}?alt=media` (objects.get with alt=media; the client's download URL,
  blob.py:85): the object's bytes; with `Range: bytes=A-B` (B inclusive) or `bytes=A-`, those bytes answered 206
  with `Content-Range: bytes A-B/SIZE`, and 416 with `Content-Range: bytes */SIZE` when A is past the end (RFC 9110
  14.4; the client's BlobReader reads in ranges and takes 416 as the end of the file, fileio.py:141-157).
"""

from __future__ import annotations

import os
import re
import urllib.parse

from tests.standins.base import ApiError, Request, StandIn, google_error, route

_OBJECT = r"(?P<object>[^/]+)"
_BUCKET = r"(?P<bucket>[^/]+)"


class GcsStandIn(StandIn):
    name = "Cloud Storage"

    def __init__(self, root: str, **kwargs):
        super().__init__(**kwargs)
        self.root = str(root)

    def routes(self):
        return [route("GET", rf"/storage/v1/b/{_BUCKET}/o", "storage.objects.list", self._list),
                route("GET", rf"/storage/v1/b/{_BUCKET}/o/{_OBJECT}", "storage.objects.get", self._get),
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
        stat = os.stat(os.path.join(self.root, bucket, name))
        return {"kind": "storage#object", "bucket": bucket, "name": name, "size": str(stat.st_size),
                "generation": str(int(stat.st_mtime * 1e6)), "contentType": "application/octet-stream"}

    def _get(self, request: Request) -> dict:
        self._path(request)
        return self._resource(request.params["bucket"], request.params["object"])

    def _list(self, request: Request) -> dict:
        bucket = request.params["bucket"]
        folder = os.path.join(self.root, bucket)
        if not os.path.isdir(folder):
            raise ApiError("NOT_FOUND", "The specified bucket does not exist.")
        prefix = request.arg("prefix")
        names = sorted(os.path.relpath(os.path.join(d, f), folder).replace(os.sep, "/")
                       for d, _, files in os.walk(folder) for f in files)
        return {"kind": "storage#objects", "items": [self._resource(bucket, n) for n in names if n.startswith(prefix)]}

    def _serve(self, http_handler) -> None:
        """Media downloads answer bytes, not JSON: served here; everything else as every stand-in serves it."""
        split = urllib.parse.urlsplit(http_handler.path)
        if not split.path.startswith("/download/"):
            return super()._serve(http_handler)
        request = Request(method=http_handler.command, path=urllib.parse.unquote(split.path),
                          query=urllib.parse.parse_qs(split.query, keep_blank_values=True),
                          headers={k.lower(): v for k, v in http_handler.headers.items()}, raw=b"")
        headers: dict[str, str] = {}
        with self.lock:
            self.requests.append(request)
            try:
                path = self._dispatch(request, split.path)[1]
                with open(path, "rb") as f:
                    contents = f.read()
                status, body = 200, contents
                wanted = re.fullmatch(r"bytes=(\d+)-(\d*)", request.headers.get("range", ""))
                if wanted:
                    start = int(wanted.group(1))
                    end = min(int(wanted.group(2)) if wanted.group(2) else len(contents) - 1, len(contents) - 1)
                    if start >= len(contents):
                        status, body = 416, b""
                        headers["Content-Range"] = f"bytes */{len(contents)}"
                    else:
                        status, body = 206, contents[start:end + 1]
                        headers["Content-Range"] = f"bytes {start}-{end}/{len(contents)}"
            except ApiError as error:
                import json

                status, body = error.http_status, json.dumps(google_error(error)).encode()
            request.status = status
        http_handler.send_response(status)
        http_handler.send_header("Content-Type", "application/octet-stream")
        http_handler.send_header("Content-Length", str(len(body)))
        for name, value in headers.items():
            http_handler.send_header(name, value)
        http_handler.end_headers()
        http_handler.wfile.write(body)
