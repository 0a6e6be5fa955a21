"""The shared stand-in base (tests/standins/base.py): loopback only, routes, one request log, scripted failures in
each API's error shape, streamed answers, the clock."""

from __future__ import annotations

import http.client
import json
import threading
import urllib.error
import urllib.request

import pytest

from tests.standins.base import (
    ApiError,
    StandIn,
    Stream,
    google_error,
    grpc_gateway_error,
    kubernetes_status,
    rfc3339,
    route,
)


class Things(StandIn):
    """A tiny API: things by id, created by POST; a log that streams until released."""

    name = "things"

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.things: dict[str, dict] = {}
        self.release = threading.Event()

    def routes(self):
        return [
            route("POST", r"/v1/things", "CreateThing", self.create),
            route("GET", r"/v1/things/(?P<thing>[^/:]+)", "GetThing", self.get),
            route("GET", r"/v1/things/(?P<thing>[^/:]+)/log", "ReadLog", self.log),
            route("GET", r"/v1/broken", "Broken", lambda request: 1 / 0),
        ]

    def create(self, request):
        body = request.json()
        if not body.get("name"):
            raise ApiError("INVALID_ARGUMENT", "thing.name is required.")
        self.things[body["name"]] = {**body, "createTime": self.now()}
        return 201, self.things[body["name"]]

    def get(self, request):
        if request.params["thing"] not in self.things:
            raise ApiError("NOT_FOUND", f"Thing {request.params['thing']} does not exist.")
        return self.things[request.params["thing"]]

    def log(self, request):
        def chunks():
            yield b"first line\n"
            self.release.wait(30)
            yield b"second line\n"

        return Stream(chunks())


def call(url: str, method: str = "GET", body: bytes | None = None, headers: dict | None = None):
    req = urllib.request.Request(url, data=body, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=30) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def test_only_loopback_is_served():
    for host in ("0.0.0.0", "localhost", "::", "192.168.1.10"):
        with pytest.raises(ValueError, match="127.0.0.1 only"):
            Things(host=host)
    with Things() as api:
        assert api.url.startswith("http://127.0.0.1:")


def test_routes_answers_and_the_request_log():
    ticks = iter([1_767_225_600.25])
    with Things(clock=lambda: next(ticks)) as api:
        assert call(api.url + "/v1/things", "POST", b'{"name": "a b"}', {"Content-Type": "application/json",
                                                                         "X-Trace": "t1"}) == \
            (201, {"name": "a b", "createTime": "2026-01-01T00:00:00.250000Z"})
        assert call(api.url + "/v1/things/a%20b?view=FULL&view=BASIC&empty=") == \
            (200, {"name": "a b", "createTime": "2026-01-01T00:00:00.250000Z"})
        assert call(api.url + "/v1/things/zz") == \
            (404, {"error": {"code": 404, "message": "Thing zz does not exist.", "status": "NOT_FOUND"}})
        assert call(api.url + "/v1/things", "POST", b"[1]")[0] == 400
        assert call(api.url + "/v1/nothing")[0] == 404
        status, body = call(api.url + "/v1/broken")
        assert status == 500 and "ZeroDivisionError" in body["error"]["message"]

    create, get, missing, bad, unknown, broken = api.requests
    assert (create.method, create.path, create.rpc, create.status) == ("POST", "/v1/things", "CreateThing", 201)
    assert create.headers["x-trace"] == "t1" and create.raw == b'{"name": "a b"}' and create.body == {"name": "a b"}
    assert (get.path, get.rpc, get.params, get.status) == ("/v1/things/a b", "GetThing", {"thing": "a b"}, 200)
    assert get.query == {"view": ["FULL", "BASIC"], "empty": [""]} and get.arg("view") == "FULL" and get.body is None
    assert (missing.status, bad.status, bad.body) == (404, 400, [1])
    assert (unknown.rpc, unknown.status, broken.status) == ("", 404, 500)
    assert api.calls("GetThing") == [get, missing]
    assert api.requests_to("GET", "/v1/things/", prefix=True) == [get, missing]


def test_scripted_failures_name_the_method_and_count_down():
    with Things() as api:
        api.fail_next(429, count=2, rpc="GetThing")
        api.fail_next("PERMISSION_DENIED", message="no", details=[{"reason": "IAM_PERMISSION_DENIED"}])
        with pytest.raises(ValueError, match="no API method 'GetThings'"):
            api.fail_next(500, rpc="GetThings")
        assert call(api.url + "/v1/things", "POST", b'{"name": "a"}') == \
            (403, {"error": {"code": 403, "message": "no", "status": "PERMISSION_DENIED",
                             "details": [{"reason": "IAM_PERMISSION_DENIED"}]}})
        assert call(api.url + "/v1/things/a")[1]["error"]["status"] == "RESOURCE_EXHAUSTED"
        assert call(api.url + "/v1/things/a")[1]["error"]["message"] == "Scripted RESOURCE_EXHAUSTED error."
        assert call(api.url + "/v1/things/a")[0] == 404  # the scripted ones are used up; "a" was never created
    assert [r.status for r in api.requests] == [403, 429, 429, 404]


def test_each_api_error_shape():
    error = ApiError("ALREADY_EXISTS", "taken", [{"x": 1}])
    assert error.code == 6 and error.http_status == 409
    assert google_error(error) == {"error": {"code": 409, "message": "taken", "status": "ALREADY_EXISTS",
                                             "details": [{"x": 1}]}}
    assert grpc_gateway_error(error) == {"code": 6, "message": "taken", "details": [{"x": 1}]}
    assert kubernetes_status(error) == {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                                        "message": "taken", "reason": "AlreadyExists", "code": 409}
    invalid = ApiError("INVALID_ARGUMENT", "bad", http_status=422)
    assert kubernetes_status(invalid)["reason"] == "Invalid" and kubernetes_status(invalid)["code"] == 422
    with pytest.raises(ValueError, match="unknown google.rpc.Code"):
        ApiError("NOT_A_CODE", "x")


def test_a_stream_is_sent_as_it_comes_and_outside_the_lock():
    with Things() as api:
        api.things["a"] = {"name": "a"}
        connection = http.client.HTTPConnection("127.0.0.1", int(api.url.rsplit(":", 1)[1]), timeout=30)
        connection.request("GET", "/v1/things/a/log")
        answer = connection.getresponse()
        assert answer.status == 200 and answer.getheader("Transfer-Encoding") == "chunked"
        assert answer.readline() == b"first line\n"
        assert call(api.url + "/v1/things/a")[0] == 200  # other calls go on while the log is open
        api.release.set()
        assert answer.read() == b"second line\n"
        connection.close()


def test_wait_for_and_the_clock():
    with Things() as api:
        api.wait_for(lambda: True)
        with pytest.raises(TimeoutError, match="condition not reached in the things stand-in within 0.1s"):
            api.wait_for(lambda: False, timeout=0.1)
    assert rfc3339(1_767_225_600.5, 0) == "2026-01-01T00:00:00Z"
    assert rfc3339(1_767_225_600.5) == "2026-01-01T00:00:00.500000Z"
    assert rfc3339(1_767_225_600.5, 9) == "2026-01-01T00:00:00.500000000Z"
    assert rfc3339(1_767_225_600.5, 9, trim=True) == "2026-01-01T00:00:00.5Z"
    assert rfc3339(1_767_225_600, 6, trim=True) == "2026-01-01T00:00:00Z"
