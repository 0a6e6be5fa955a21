"""What every stand-in in tests/standins/ shares: a loopback-only HTTP server, a route table, JSON in and out, one
request log, scripted failures and one clock.

A stand-in subclasses `StandIn`, lists its `routes()` (method, path pattern, API method name, handler) and says how
its API writes an error (`error_body`: `google_error`, `grpc_gateway_error` or `kubernetes_status` below, or its
own). The API itself (its resources, validation and state machines) stays in the stand-in's module, whose docstring
names the public definition it follows.

Contract:
- The server binds 127.0.0.1 on a free port and nothing else (ValueError for any other host): tests reach no other
  machine and no other machine reaches them. `url` is `http://127.0.0.1:PORT`. Start and stop it with `with`.
- Every request is recorded in `requests`, in arrival order, whatever its outcome, as a `Request`: method, path
  (percent-decoded, no query), query (`parse_qs` lists), headers (lower-case names), raw body, `body` (parsed JSON or
  None), `rpc` (the name of the route that matched, "" when none) and the HTTP `status` answered.
- Handlers run one at a time under `lock`, so a stand-in's state needs no locking of its own; a test that reads
  state while requests are in flight takes `lock` too. A handler returns a JSON payload (answered 200), a
  `(status, payload)` pair, or a `Stream`, which is written chunk by chunk outside the lock (a log that follows a
  running process).
- Errors are `ApiError`s, named by google.rpc.Code (`"NOT_FOUND"`, ...) with the HTTP status those map to; the
  stand-in renders them in its API's own shape. A bug in a stand-in answers 500 with its repr instead of hanging.
- `fail_next(code, count, rpc=..., message=..., details=...)` answers the next `count` calls (of one API method, or
  of any) with that error; without a message, `scripted_error` words it as the API would.
- `now()` is RFC 3339 from `clock` (seconds since the epoch; `time.time` unless the test passes its own).
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import http.server
import json
import re
import threading
import time
import urllib.parse
from typing import Any, Callable, Iterable

LOOPBACK = "127.0.0.1"

# google.rpc.Code, in code order (google/rpc/code.proto), with the HTTP status Google APIs and grpc-gateway answer.
HTTP_STATUS = {
    "OK": 200, "CANCELLED": 499, "UNKNOWN": 500, "INVALID_ARGUMENT": 400, "DEADLINE_EXCEEDED": 504, "NOT_FOUND": 404,
    "ALREADY_EXISTS": 409, "PERMISSION_DENIED": 403, "RESOURCE_EXHAUSTED": 429, "FAILED_PRECONDITION": 400,
    "ABORTED": 409, "OUT_OF_RANGE": 400, "UNIMPLEMENTED": 501, "INTERNAL": 500, "UNAVAILABLE": 503, "DATA_LOSS": 500,
    "UNAUTHENTICATED": 401,
}
RPC_CODE = {name: number for number, name in enumerate(HTTP_STATUS)}
# The status a scripted HTTP code stands for (`fail_next(429)`); other codes are UNKNOWN with that HTTP status.
STATUS_FOR_HTTP = {400: "INVALID_ARGUMENT", 401: "UNAUTHENTICATED", 403: "PERMISSION_DENIED", 404: "NOT_FOUND",
                   409: "ALREADY_EXISTS", 429: "RESOURCE_EXHAUSTED", 499: "CANCELLED", 500: "INTERNAL",
                   501: "UNIMPLEMENTED", 503: "UNAVAILABLE", 504: "DEADLINE_EXCEEDED"}


class ApiError(Exception):
    """An error answer: a google.rpc.Code name, a message and optional details (google.rpc.Status.details).

    `http_status` overrides the status the code maps to (Kubernetes' 422, grpc-gateway's 405); `reason` is the
    machine-readable reason of APIs that have one (a Kubernetes StatusReason)."""

    def __init__(self, status: str, message: str, details: list | None = None, *, http_status: int | None = None,
                 reason: str = ""):
        if status not in HTTP_STATUS:
            raise ValueError(f"unknown google.rpc.Code {status!r}")
        super().__init__(message)
        self.status, self.message, self.details = status, message, list(details or [])
        self.http_status = http_status or HTTP_STATUS[status]
        self.reason = reason

    @property
    def code(self) -> int:
        """The numeric google.rpc.Code."""
        return RPC_CODE[self.status]


def google_error(error: ApiError) -> dict:
    """Google APIs' JSON error body (AIP-193): {"error": {code (HTTP), message, status, details}}."""
    body = {"code": error.http_status, "message": error.message, "status": error.status}
    if error.details:
        body["details"] = error.details
    return {"error": body}


def grpc_gateway_error(error: ApiError) -> dict:
    """grpc-gateway's error body: {code (google.rpc.Code number), message, details}."""
    return {"code": error.code, "message": error.message, "details": error.details}


# metav1.StatusReason for the HTTP statuses the API server answers.
K8S_REASONS = {400: "BadRequest", 401: "Unauthorized", 403: "Forbidden", 404: "NotFound", 405: "MethodNotAllowed",
               409: "AlreadyExists", 410: "Gone", 422: "Invalid", 429: "TooManyRequests", 500: "InternalError",
               503: "ServiceUnavailable", 504: "Timeout"}


def kubernetes_status(error: ApiError) -> dict:
    """A Kubernetes `Status` object (meta/v1) with status Failure."""
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": error.message,
            "reason": error.reason or K8S_REASONS.get(error.http_status, "Unknown"), "code": error.http_status}


def rfc3339(seconds: float, digits: int = 6, *, trim: bool = False) -> str:
    """`seconds` since the epoch as RFC 3339 in UTC with `digits` (0-9) fractional digits; `trim` drops trailing
    zeros, as Go's RFC3339Nano does."""
    moment = _dt.datetime.fromtimestamp(seconds, _dt.timezone.utc)
    text = moment.strftime("%Y-%m-%dT%H:%M:%S")
    fraction = f"{moment.microsecond:06d}".ljust(9, "0")[:digits]
    if trim:
        fraction = fraction.rstrip("0")
    return f"{text}.{fraction}Z" if fraction else f"{text}Z"


@dataclasses.dataclass
class Request:
    """One request as a stand-in received it."""

    method: str
    path: str  # percent-decoded, without the query string, e.g. /v1/projects/p/locations/us-central1/models
    query: dict[str, list[str]]
    headers: dict[str, str]  # names lower-cased
    raw: bytes
    rpc: str = ""  # the API method of the route that matched ("UploadModel", "CreateRun", ...); "" when none did
    status: int = 0  # the HTTP status answered; 0 while it is being handled
    params: dict[str, str] = dataclasses.field(default_factory=dict, repr=False, compare=False)  # route groups

    @property
    def body(self) -> Any:
        """The body parsed as JSON; None when it is empty or not JSON."""
        try:
            return json.loads(self.raw) if self.raw else None
        except ValueError:
            return None

    def json(self) -> dict:
        """The body as a JSON object ({} when empty) for a handler; INVALID_ARGUMENT when it is anything else."""
        if not self.raw:
            return {}
        try:
            body = json.loads(self.raw)
        except ValueError:
            raise ApiError("INVALID_ARGUMENT", "Invalid JSON payload received.") from None
        if not isinstance(body, dict):
            raise ApiError("INVALID_ARGUMENT", "Invalid JSON payload received: the body must be a JSON object.")
        return body

    def arg(self, name: str, default: str = "") -> str:
        """The first value of query parameter `name`."""
        return (self.query.get(name) or [default])[0]


@dataclasses.dataclass
class Route:
    method: str
    pattern: re.Pattern  # matched in full against the path as sent; named groups become `params`, percent-decoded
    rpc: str  # the API method it serves: what `requests`, `calls()` and `fail_next(rpc=...)` name it by
    handler: Callable[[Request], Any]


def route(method: str, pattern: str, rpc: str, handler: Callable[[Request], Any]) -> Route:
    return Route(method, re.compile(pattern), rpc, handler)


@dataclasses.dataclass
class Stream:
    """A 200 answer sent as `chunks` come (chunked transfer encoding), until they end or the client goes away."""

    chunks: Iterable[bytes]
    content_type: str = "text/plain"


@dataclasses.dataclass
class _Failure:
    remaining: int
    status: str
    http_status: int
    message: str | None
    details: list | None
    rpc: str | None


class StandIn:
    """Base of the stand-ins; see the module docstring for the contract."""

    name = "API"  # in messages: "condition not reached in the {name} stand-in"
    content_type = "application/json"
    # Names `fail_next(rpc=...)` accepts besides the routes': outcomes of work that ends later (an upload
    # operation, a job). A failure scripted for any rpc never lands on these.
    scripted_outcomes: tuple[str, ...] = ()

    def __init__(self, *, host: str = LOOPBACK, clock: Callable[[], float] = time.time):
        if host != LOOPBACK:
            raise ValueError(f"a stand-in serves {LOOPBACK} only, not {host!r}: tests must not be reachable from, "
                             f"or reach, another machine")
        self.host = host
        self.clock = clock
        self.requests: list[Request] = []
        self.lock = threading.RLock()
        self._failures: list[_Failure] = []
        self._routes: list[Route] | None = None
        self._server: http.server.ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # -- what a stand-in provides ----------------------------------------------------------------------

    def routes(self) -> list[Route]:
        raise NotImplementedError

    def error_body(self, error: ApiError, request: Request) -> dict:
        """The JSON body of an error answer, in the API's shape."""
        return google_error(error)

    def authorize(self, request: Request) -> None:
        """Called before routing; raises ApiError to refuse the request (a missing token)."""

    def check(self, request: Request) -> None:
        """Called after routing and scripted failures, before the handler (a request for another region)."""

    def no_route(self, request: Request, path_known: bool) -> ApiError:
        """The error for a path no route serves, or (`path_known`) a method the path does not take."""
        return ApiError("NOT_FOUND", f"The requested URL {request.path} was not found on this server.")

    def render(self, request: Request, payload: Any) -> Any:
        """A successful answer's payload as the API writes it (left out defaults, enums as numbers...)."""
        return payload

    def scripted_error(self, status: str, rpc: str, request: Request) -> tuple[str, list]:
        """Message and details of a scripted failure given no message."""
        return f"Scripted {status} error.", []

    # -- lifecycle -------------------------------------------------------------------------------------

    def start(self) -> None:
        standin = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive, as the real servers: every answer has a length or is chunked
            disable_nagle_algorithm = True  # headers and body go out in separate writes: no delayed-ACK stalls

            def log_message(self, *args) -> None:  # quiet: tests assert on `requests` instead
                pass

            def serve(self) -> None:
                standin._serve(self)

            do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = serve

        self._routes = self.routes()
        self._server = http.server.ThreadingHTTPServer((self.host, 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.02},
                                        name=type(self).__name__, daemon=True)  # short poll: fast shutdown
        self._thread.start()

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._thread.join(timeout=5)
            self._server = self._thread = None

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    @property
    def url(self) -> str:
        assert self._server is not None, f"start the stand-in first (with {type(self).__name__}() as api: ...)"
        return f"http://{self.host}:{self._server.server_address[1]}"

    @property
    def api_endpoint(self) -> str:
        """`url`, by the name Google Cloud clients take it (`client_options={"api_endpoint": ...}`)."""
        return self.url

    # -- test controls ---------------------------------------------------------------------------------

    def fail_next(self, code: int | str, count: int = 1, *, rpc: str | None = None, message: str | None = None,
                  details: list | None = None) -> None:
        """Answers the next `count` calls of `rpc` (a route's API method or a scripted outcome), or of any route's,
        with an error. `code` is an HTTP status (403, 429, ...) or a google.rpc.Code name ("PERMISSION_DENIED")."""
        known = {r.rpc for r in (self._routes or self.routes())} | set(self.scripted_outcomes)
        if rpc is not None and rpc not in known:
            raise ValueError(f"{type(self).__name__} has no API method {rpc!r}; it serves {sorted(known)}")
        if isinstance(code, str):
            status, http_status = code, HTTP_STATUS[code]
        else:
            status, http_status = STATUS_FOR_HTTP.get(code, "UNKNOWN"), code
        with self.lock:
            self._failures.append(_Failure(count, status, http_status, message, details, rpc))

    def take_failure(self, rpc: str, request: Request) -> ApiError | None:
        """The failure scripted for this call of `rpc`, if any (and counts it)."""
        with self.lock:
            for failure in self._failures:
                if failure.remaining > 0 and (failure.rpc == rpc or
                                              (failure.rpc is None and rpc not in self.scripted_outcomes)):
                    failure.remaining -= 1
                    message, details = failure.message, failure.details
                    if message is None:
                        message, default_details = self.scripted_error(failure.status, rpc, request)
                        details = default_details if details is None else details
                    return ApiError(failure.status, message, details, http_status=failure.http_status)
        return None

    def calls(self, rpc: str | None = None) -> list[Request]:
        """Recorded requests of one API method (or all), oldest first."""
        with self.lock:
            return [r for r in self.requests if rpc is None or r.rpc == rpc]

    def requests_to(self, method: str, path: str, *, prefix: bool = False) -> list[Request]:
        """Recorded requests with that method to exactly `path` (or under it, with `prefix`)."""
        with self.lock:
            return [r for r in self.requests
                    if r.method == method and (r.path.startswith(path) if prefix else r.path == path)]

    def now(self, digits: int = 6) -> str:
        return rfc3339(self.clock(), digits)

    def wait_for(self, predicate: Callable[[], Any], timeout: float = 60.0) -> None:
        """Returns once `predicate()` is true; TimeoutError after `timeout` seconds."""
        deadline = time.monotonic() + timeout
        while not predicate():
            if time.monotonic() > deadline:
                raise TimeoutError(f"condition not reached in the {self.name} stand-in within {timeout:g}s")
            time.sleep(0.05)

    # -- HTTP ------------------------------------------------------------------------------------------

    def _serve(self, http_handler: http.server.BaseHTTPRequestHandler) -> None:
        split = urllib.parse.urlsplit(http_handler.path)
        length = int(http_handler.headers.get("Content-Length") or 0)
        request = Request(method=http_handler.command, path=urllib.parse.unquote(split.path),
                          query=urllib.parse.parse_qs(split.query, keep_blank_values=True),
                          headers={k.lower(): v for k, v in http_handler.headers.items()},
                          raw=http_handler.rfile.read(length) if length else b"")
        with self.lock:
            self.requests.append(request)
            try:
                answer = self._dispatch(request, split.path)
            except ApiError as error:
                answer = (error.http_status, self.error_body(error, request))
            except Exception as error:  # a bug in the stand-in: answer like a server error and keep serving
                answer = (500, self.error_body(ApiError("INTERNAL", f"stand-in error: {error!r}"), request))
            request.status = 200 if isinstance(answer, Stream) else answer[0]
        if isinstance(answer, Stream):
            _write_stream(http_handler, answer)
            return
        data = json.dumps(answer[1]).encode()
        http_handler.send_response(answer[0])
        http_handler.send_header("Content-Type", self.content_type)
        http_handler.send_header("Content-Length", str(len(data)))
        http_handler.end_headers()
        http_handler.wfile.write(data)

    def _dispatch(self, request: Request, raw_path: str) -> tuple[int, Any] | Stream:
        self.authorize(request)
        path_known = False
        for candidate in self._routes:
            match = candidate.pattern.fullmatch(raw_path)
            if match is None:
                continue
            path_known = True
            if candidate.method == request.method:
                break
        else:
            raise self.no_route(request, path_known)
        request.rpc = candidate.rpc
        request.params = {k: urllib.parse.unquote(v) for k, v in match.groupdict().items() if v is not None}
        failure = self.take_failure(request.rpc, request)
        if failure is not None:
            raise failure
        self.check(request)
        answer = candidate.handler(request)
        if isinstance(answer, Stream):
            return answer
        status, payload = answer if isinstance(answer, tuple) else (200, answer)
        return status, (self.render(request, payload) if status < 300 else payload)


def _write_stream(http_handler: http.server.BaseHTTPRequestHandler, stream: Stream) -> None:
    http_handler.send_response(200)
    http_handler.send_header("Content-Type", stream.content_type)
    http_handler.send_header("Transfer-Encoding", "chunked")
    http_handler.end_headers()
    try:
        for chunk in stream.chunks:
            if chunk:
                http_handler.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                http_handler.wfile.flush()
        http_handler.wfile.write(b"0\r\n\r\n")
    except (BrokenPipeError, ConnectionResetError):  # the client stopped following
        pass
