"""pipelines.hosts.publish driven through the real kfp.Client against the KFP API stand-in (no mocks)."""

# No `from __future__ import annotations` here: kfp reads the component's annotations as real types.
import json
import logging

import kfp
import pytest
from kfp import compiler, dsl
from kfp_server_api import ApiException, V2beta1Pipeline

from pipelines.hosts import publish
from pipelines.hosts.publish import PublishError
from tests.standins.kfp_api import KfpStandIn

TOKEN = "tok-5ecret-never-print-me"
P = "/apis/v2beta1"


@dsl.component(base_image="python:3.11-slim")
def _echo(msg: str, epochs: int) -> str:
    return f"{msg} x{epochs}"


@dsl.pipeline(name="tiny")
def _tiny(msg: str = "hi", epochs: int = 1):
    _echo(msg=msg, epochs=epochs)


@pytest.fixture(scope="module")
def package(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("pkg") / "pipeline.yaml"
    compiler.Compiler().compile(_tiny, str(path))
    return str(path)


@pytest.fixture
def client(kfp_api) -> kfp.Client:
    return publish.make_client(kfp_api.url, token=TOKEN)


def _body(kfp_api, method: str, path: str) -> dict:
    return kfp_api.requests_to(method, path)[-1].body


def _versions(client, pipeline_id: str) -> list[str]:
    resp = client.list_pipeline_versions(pipeline_id, sort_by="created_at")
    return [v.name for v in resp.pipeline_versions or []]


def _schedules(client, experiment: str) -> list:
    experiment_id = client.get_experiment(experiment_name=experiment).experiment_id
    return client.list_recurring_runs(experiment_id=experiment_id).recurring_runs or []


# --- upload ---------------------------------------------------------------------------------------------
def test_new_pipeline_gets_exactly_one_version_named_as_asked(kfp_api, client, package):
    info = publish.upload_version(client, package, name="flowers", version="v1", description="first")

    assert info["created"] is True and info["version_name"] == "v1"
    assert client.get_pipeline_id("flowers") == info["pipeline_id"]
    assert _versions(client, info["pipeline_id"]) == ["v1"]  # no version named after the pipeline
    assert info["url"] == f"{kfp_api.url}/#/pipelines/details/{info['pipeline_id']}/version/{info['version_id']}"
    assert kfp_api.requests_to("POST", f"{P}/pipelines")  # created empty, then given its first version:
    assert not kfp_api.requests_to("POST", f"{P}/pipelines/upload")  # the endpoint that names it after the pipeline
    assert kfp_api.requests_to("POST", f"{P}/pipelines/upload_version")[0].query["name"] == ["v1"]


def test_second_version_is_added_to_the_same_pipeline(client, package):
    first = publish.upload_version(client, package, name="flowers", version="v1")
    second = publish.upload_version(client, package, name="flowers", version="v2")

    assert second["pipeline_id"] == first["pipeline_id"] and second["created"] is True
    assert _versions(client, first["pipeline_id"]) == ["v1", "v2"]


def test_duplicate_version_is_an_error_that_says_how_to_skip(kfp_api, client, package):
    first = publish.upload_version(client, package, name="flowers", version="v1")

    with pytest.raises(PublishError, match=r"already has a version named 'v1'.*if_exists='skip'"):
        publish.upload_version(client, package, name="flowers", version="v1")
    assert _versions(client, first["pipeline_id"]) == ["v1"]
    assert len(kfp_api.requests_to("POST", f"{P}/pipelines/upload_version")) == 1  # nothing re-uploaded


def test_duplicate_version_with_skip_returns_the_existing_one(client, package):
    first = publish.upload_version(client, package, name="flowers", version="v1")
    again = publish.upload_version(client, package, name="flowers", version="v1", if_exists="skip")

    assert again["created"] is False
    assert (again["pipeline_id"], again["version_id"]) == (first["pipeline_id"], first["version_id"])


def test_upload_rejects_a_missing_package_before_any_request(kfp_api, client, tmp_path):
    kfp_api.requests.clear()
    with pytest.raises(PublishError, match="package not found"):
        publish.upload_version(client, str(tmp_path / "nope.yaml"), name="flowers", version="v1")
    assert kfp_api.requests == []


def test_stand_in_answers_duplicates_like_kfp(kfp_api, client, package):
    """409 with the upload endpoints' body shape, and gRPC-gateway's ALREADY_EXISTS elsewhere."""
    client.upload_pipeline(package, pipeline_name="dup")
    with pytest.raises(ApiException) as upload_err:
        client.upload_pipeline(package, pipeline_name="dup")
    assert upload_err.value.status == 409
    assert json.loads(upload_err.value.body) == {"error_message": "Failed to create a pipeline and a pipeline version",
                                                 "error_details": "Failed to create a pipeline and a pipeline version"}
    versions = client.list_pipeline_versions(client.get_pipeline_id("dup")).pipeline_versions
    assert [v.name for v in versions] == ["dup"]  # upload_pipeline names the first version after the pipeline

    with pytest.raises(ApiException) as create_err:
        client.pipelines.pipeline_service_create_pipeline(
            pipeline=V2beta1Pipeline(display_name="dup"))
    assert create_err.value.status == 409 and json.loads(create_err.value.body)["code"] == 6


# --- runs ------------------------------------------------------------------------------------------------
def test_run_creates_the_experiment_and_uses_the_newest_version(kfp_api, client, package):
    publish.upload_version(client, package, name="flowers", version="v1")
    v2 = publish.upload_version(client, package, name="flowers", version="v2")
    with pytest.raises(ValueError):
        client.get_experiment(experiment_name="nightly")

    info = publish.start_run(client, pipeline_name="flowers", run_name="r1", experiment="nightly",
                             params={"msg": "hello", "epochs": 3})

    experiment = client.get_experiment(experiment_name="nightly")
    sent = _body(kfp_api, "POST", f"{P}/runs")
    assert sent["experiment_id"] == experiment.experiment_id == info["experiment_id"]
    assert sent["pipeline_version_reference"] == {"pipeline_id": v2["pipeline_id"],
                                                  "pipeline_version_id": v2["version_id"]}
    assert sent["runtime_config"]["parameters"] == {"msg": "hello", "epochs": 3}
    assert info["version_name"] == "v2"
    assert info["url"] == f"{kfp_api.url}/#/runs/details/{info['run_id']}"
    assert client.get_run(info["run_id"]).display_name == "r1"


def test_run_of_a_pinned_version_in_an_existing_experiment(kfp_api, client, package):
    v1 = publish.upload_version(client, package, name="flowers", version="v1")
    publish.upload_version(client, package, name="flowers", version="v2")

    info = publish.start_run(client, pipeline_name="flowers", run_name="r1", version="v1")
    publish.start_run(client, pipeline_name="flowers", run_name="r2", version="v1")

    assert info["version_id"] == v1["version_id"]
    assert info["experiment_id"] == kfp_api.default_experiment_id
    assert not kfp_api.requests_to("POST", f"{P}/experiments")  # "Default" exists on every KFP


def test_run_of_an_unknown_pipeline_or_version_fails_clearly(kfp_api, client, package):
    with pytest.raises(PublishError, match="no pipeline named 'ghost'"):
        publish.start_run(client, pipeline_name="ghost", run_name="r")
    publish.upload_version(client, package, name="flowers", version="v1")
    with pytest.raises(PublishError, match="no version named 'v9'"):
        publish.start_run(client, pipeline_name="flowers", run_name="r", version="v9")
    assert not kfp_api.requests_to("POST", f"{P}/runs")


def test_run_with_an_unknown_parameter_reports_the_server_message(client, package):
    publish.upload_version(client, package, name="flowers", version="v1")
    with pytest.raises(PublishError, match=r"HTTP 400.*Unrecognized input parameter: lr"):
        publish.start_run(client, pipeline_name="flowers", run_name="r", params={"lr": 0.1})


def test_latest_is_ambiguous_within_one_second_and_says_so(caplog, package):
    with KfpStandIn(clock=lambda: 1_767_225_600) as api:  # a frozen clock: both versions in the same second
        client = publish.make_client(api.url)
        publish.upload_version(client, package, name="flowers", version="v1")
        publish.upload_version(client, package, name="flowers", version="v2")
        publish.start_run(client, pipeline_name="flowers", run_name="r")
    assert "created in the same second, so 'latest' is ambiguous" in caplog.text


def test_wait_follows_the_run_until_it_succeeds(kfp_api, client, package):
    publish.upload_version(client, package, name="flowers", version="v1")
    info = publish.start_run(client, pipeline_name="flowers", run_name="ok", wait=True, poll_seconds=0)

    assert info["state"] == "SUCCEEDED"
    assert len(kfp_api.requests_to("GET", f"{P}/runs/{info['run_id']}")) == 2  # RUNNING, then SUCCEEDED


@pytest.mark.parametrize("outcome", ["FAILED", "CANCELED"])  # kfp's own wait loop never ends on CANCELED
def test_wait_raises_when_the_run_does_not_succeed(kfp_api, client, package, outcome):
    publish.upload_version(client, package, name="flowers", version="v1")
    kfp_api.run_outcomes["bad"] = outcome

    with pytest.raises(PublishError, match=rf"run 'bad' ended {outcome}.*#/runs/details/"):
        publish.start_run(client, pipeline_name="flowers", run_name="bad", wait=True, poll_seconds=0)


def test_wait_gives_up_after_the_timeout_and_says_the_run_goes_on(client, package):
    publish.upload_version(client, package, name="flowers", version="v1")
    with pytest.raises(PublishError, match="still RUNNING after 0s; it goes on running"):
        publish.start_run(client, pipeline_name="flowers", run_name="slow", wait=True, timeout_seconds=0,
                          poll_seconds=0)


def test_caching_override_submits_the_stored_spec_with_caching_off(kfp_api, client, package):
    publish.upload_version(client, package, name="flowers", version="v1")
    publish.start_run(client, pipeline_name="flowers", run_name="fresh", enable_caching=False)

    sent = _body(kfp_api, "POST", f"{P}/runs")
    assert "pipeline_version_reference" not in sent
    tasks = sent["pipeline_spec"]["root"]["dag"]["tasks"]
    assert tasks and all(not t.get("cachingOptions", {}).get("enableCache", False) for t in tasks.values())


# --- schedules -------------------------------------------------------------------------------------------
def test_schedule_follows_the_newest_version_with_a_converted_cron(kfp_api, client, package):
    v1 = publish.upload_version(client, package, name="flowers", version="v1")

    info = publish.schedule(client, name="nightly", pipeline_name="flowers", cron="0 3 * * *",
                            experiment="sched", params={"epochs": 2})

    sent = _body(kfp_api, "POST", f"{P}/recurringruns")
    assert sent["trigger"] == {"cron_schedule": {"cron": "0 0 3 * * *"}}
    assert sent["pipeline_version_reference"] == {"pipeline_id": v1["pipeline_id"]}  # no version id = latest
    assert (sent["mode"], sent["max_concurrency"], sent["no_catchup"]) == ("ENABLE", "1", False)
    [created] = _schedules(client, "sched")
    assert created.recurring_run_id == info["recurring_run_id"] and created.status == "ENABLED"
    assert info["url"] == f"{kfp_api.url}/#/recurringrun/details/{info['recurring_run_id']}"


def test_schedule_of_a_pinned_version(kfp_api, client, package):
    v1 = publish.upload_version(client, package, name="flowers", version="v1")
    publish.upload_version(client, package, name="flowers", version="v2")

    info = publish.schedule(client, name="weekly", pipeline_name="flowers", cron="30 6 * * MON", version="v1",
                            max_concurrency=2, catchup=False, enabled=False)

    sent = _body(kfp_api, "POST", f"{P}/recurringruns")
    assert sent["pipeline_version_reference"]["pipeline_version_id"] == v1["version_id"] == info["version_id"]
    assert (sent["mode"], sent["max_concurrency"], sent["no_catchup"]) == ("DISABLE", 2, True)
    assert client.get_recurring_run(info["recurring_run_id"]).status == "DISABLED"


def test_schedule_update_replaces_the_old_one_creating_first(kfp_api, client, package):
    publish.upload_version(client, package, name="flowers", version="v1")
    old = publish.schedule(client, name="nightly", pipeline_name="flowers", cron="0 3 * * *")
    other = publish.schedule(client, name="hourly", pipeline_name="flowers", cron="0 * * * *")

    new = publish.schedule(client, name="nightly", pipeline_name="flowers", cron="15 4 * * *")

    assert new["replaced"] == [old["recurring_run_id"]]
    by_name = {r.display_name: r for r in _schedules(client, "Default")}
    assert sorted(by_name) == ["hourly", "nightly"]
    assert by_name["nightly"].recurring_run_id == new["recurring_run_id"]
    assert by_name["nightly"].trigger.cron_schedule.cron == "0 15 4 * * *"
    assert by_name["hourly"].recurring_run_id == other["recurring_run_id"]
    calls = [(r.method, r.path) for r in kfp_api.requests if r.path.startswith(f"{P}/recurringruns")]
    assert calls.index(("DELETE", f"{P}/recurringruns/{old['recurring_run_id']}")) > \
        len(calls) - 1 - calls[::-1].index(("POST", f"{P}/recurringruns"))  # delete only after the create


def test_schedule_heals_duplicates_left_by_an_interrupted_update(client, package):
    v1 = publish.upload_version(client, package, name="flowers", version="v1")
    experiment_id = client.get_experiment(experiment_name="Default").experiment_id
    for _ in range(2):  # what a crash between "create new" and "delete old" leaves behind
        client.create_recurring_run(experiment_id, "nightly", cron_expression="0 0 3 * * *",
                                    pipeline_id=v1["pipeline_id"], version_id=v1["version_id"])

    info = publish.schedule(client, name="nightly", pipeline_name="flowers", cron="0 3 * * *")

    assert len(info["replaced"]) == 2
    assert [r.recurring_run_id for r in _schedules(client, "Default")] == [info["recurring_run_id"]]


def test_schedule_failure_keeps_the_existing_schedule(kfp_api, client, package):
    publish.upload_version(client, package, name="flowers", version="v1")
    old = publish.schedule(client, name="nightly", pipeline_name="flowers", cron="0 3 * * *")

    with pytest.raises(PublishError, match="Unrecognized input parameter: lr"):
        publish.schedule(client, name="nightly", pipeline_name="flowers", cron="0 4 * * *", params={"lr": 1})
    assert [r.recurring_run_id for r in _schedules(client, "Default")] == [old["recurring_run_id"]]
    assert not kfp_api.requests_to("DELETE", f"{P}/recurringruns/", prefix=True)


@pytest.mark.parametrize("name", ["flowers+daisies", "flowers 100%", "flowers%2B"])
def test_names_with_plus_or_percent_are_found(kfp_api, client, package, name):
    """The server URL-unescapes a list filter once more (list_request_util.go:143 at 2.17.0): sent unescaped, '+'
    would become a space, '%2B' a '+' and a lone '%' a 400. Every look-up by name must still find the name."""
    look_alike = name.replace("+", " ").replace("%2B", "+")
    if look_alike != name:  # what an unescaped filter would match instead
        publish.upload_version(client, package, name=look_alike, version=look_alike)
        publish.schedule(client, name=look_alike, pipeline_name=look_alike, cron="0 2 * * *", experiment=look_alike)
    first = publish.upload_version(client, package, name=name, version=name)
    again = publish.upload_version(client, package, name=name, version=name, if_exists="skip")
    assert (again["created"], again["pipeline_id"], again["version_id"]) == \
        (False, first["pipeline_id"], first["version_id"])
    old = publish.schedule(client, name=name, pipeline_name=name, version=name, cron="0 3 * * *", experiment=name)
    new = publish.schedule(client, name=name, pipeline_name=name, cron="0 4 * * *", experiment=name)
    assert new["replaced"] == [old["recurring_run_id"]] and new["experiment_id"] == old["experiment_id"]
    run = publish.start_run(client, pipeline_name=name, run_name="r1", experiment=name)
    assert run["experiment_id"] == old["experiment_id"] and run["version_name"] == name
    assert [e.display_name for e in client.list_experiments(page_size=100).experiments].count(name) == 1
    assert publish.delete_schedule(client, name=name, experiment=name)["recurring_run_ids"] == \
        [new["recurring_run_id"]]


def test_stand_in_unescapes_filters_like_kfp(client):
    """kfp.Client sends a filter as it is given; the stand-in reads it as the server does (one more unescape)."""
    client.create_experiment("a b")
    plain = json.dumps({"predicates": [{"operation": 1, "key": "display_name", "stringValue": "a+b"}]})
    assert [e.display_name for e in client.list_experiments(filter=plain).experiments] == ["a b"]
    broken = json.dumps({"predicates": [{"operation": 1, "key": "display_name", "stringValue": "100%"}]})
    with pytest.raises(ApiException, match="invalid URL escape"):
        client.list_experiments(filter=broken)


def test_disable_then_delete_a_schedule_by_name(client, package):
    publish.upload_version(client, package, name="flowers", version="v1")
    info = publish.schedule(client, name="nightly", pipeline_name="flowers", cron="0 3 * * *", experiment="ops")

    assert publish.disable_schedule(client, name="nightly", experiment="ops")["recurring_run_ids"] == \
        [info["recurring_run_id"]]
    assert client.get_recurring_run(info["recurring_run_id"]).status == "DISABLED"

    publish.delete_schedule(client, name="nightly", experiment="ops")
    assert _schedules(client, "ops") == []
    with pytest.raises(PublishError, match="no schedule named 'nightly' in experiment 'ops'"):
        publish.delete_schedule(client, name="nightly", experiment="ops")
    with pytest.raises(PublishError, match="experiment 'nope'"):
        publish.disable_schedule(client, name="nightly", experiment="nope")


@pytest.mark.parametrize("cron, why", [
    ("0 3 * *", "5 standard fields"),
    ("0 0 3 * * *", "5 standard fields"),  # already KFP's 6-field form: ambiguous, refused
    ("60 * * * *", "minute field '60'.*outside 0-59"),
    ("0 24 * * *", "hour field"),
    ("0 0 0 * *", "day of month field"),
    ("0 0 * 13 *", "month field"),
    ("0 0 * * 7", "use 0 for Sunday"),
    ("*/0 * * * *", "step must be at least 1"),
    ("0 0 * * FUNDAY", "not a number or a name"),
    ("@daily", "5 standard fields"),
    ("TZ=Europe/Berlin 0 3 * * *", "no time zone prefix here"),  # KFP runs crons in the server's zone
    ("0 0 31 2 *", "day of month '31' never comes in month '2'"),  # KFP's cron library would take it, never to run
    ("0 0 31 APR,JUN,SEP,NOV *", "never comes"),
])
def test_bad_cron_is_rejected_before_any_request(kfp_api, client, package, cron, why):
    kfp_api.requests.clear()  # the client's construction probed /healthz
    with pytest.raises(PublishError, match=why):
        publish.schedule(client, name="nightly", pipeline_name="flowers", cron=cron)
    assert kfp_api.requests == []


def test_stand_in_reads_cron_like_kfp(client, package):
    """KFP takes 5 fields too, as seconds-first: the reason schedule() converts them itself."""
    v1 = publish.upload_version(client, package, name="flowers", version="v1")
    experiment_id = client.get_experiment(experiment_name="Default").experiment_id
    ref = dict(pipeline_id=v1["pipeline_id"], version_id=v1["version_id"])
    accepted = client.create_recurring_run(experiment_id, "hourly-at-:03", cron_expression="0 3 * * *", **ref)
    assert accepted.trigger.cron_schedule.cron == "0 3 * * *"
    with pytest.raises(ApiException) as err:
        client.create_recurring_run(experiment_id, "bad", cron_expression="0 0 3 * * 7", **ref)
    assert err.value.status == 400 and "Schedule cron is not a supported format" in err.value.body


@pytest.mark.parametrize("cron, kfp_cron", [
    ("0 3 * * *", "0 0 3 * * *"),
    ("*/15 9-17 * * MON-FRI", "0 */15 9-17 * * MON-FRI"),
    ("0 0 1 jan,jul *", "0 0 0 1 jan,jul *"),
    ("5,35 0-23/2 1-7 * 0", "0 5,35 0-23/2 1-7 * 0"),
])
def test_standard_cron_becomes_kfp_cron(cron, kfp_cron):
    assert publish.to_kfp_cron(cron) == kfp_cron


# --- authentication and secrets ---------------------------------------------------------------------------
def test_bearer_token_is_sent_but_never_shown(caplog, capsys, package):
    caplog.set_level(logging.DEBUG)
    errors = []
    with KfpStandIn(require_token=TOKEN) as api:
        client = publish.make_client(api.url, token=TOKEN)
        publish.upload_version(client, package, name="flowers", version="v1")
        api.run_outcomes["bad"] = "FAILED"
        for attempt in (lambda: publish.upload_version(client, package, name="flowers", version="v1"),
                        lambda: publish.start_run(client, pipeline_name="flowers", run_name="bad", wait=True,
                                                  poll_seconds=0)):
            with pytest.raises(PublishError) as err:
                attempt()
            errors.append(err.value)

        # a wrong token: the proxy's 401 becomes a PublishError (namespace given: skips kfp's healthz retries)
        intruder = publish.make_client(api.url, token="wrong-" + TOKEN, namespace="team")
        with pytest.raises(PublishError, match="HTTP 401.*check the token") as err:
            publish.upload_version(intruder, package, name="flowers", version="v2")
        errors.append(err.value)

    assert "uploaded version 'v1'" in caplog.text and "ended FAILED" in str(errors[1])  # the checks below see real text
    good = [r for r in api.requests if r.headers.get("authorization") == f"Bearer {TOKEN}"]
    assert len(good) == len(api.requests) - 1  # all but the intruder's one call
    out = capsys.readouterr()
    for text in [caplog.text, out.out, out.err, repr(client), repr(intruder)] + [
            str(e) + repr(e) + str(e.__cause__) + str(e.__context__) for e in errors]:
        assert TOKEN not in text


def test_make_client_refuses_ambiguous_or_missing_settings():
    with pytest.raises(PublishError, match="not both"):
        publish.make_client("http://kfp", token="t", iap_client_id="abc.apps.googleusercontent.com")
    with pytest.raises(PublishError, match="no KFP host"):
        publish.make_client("")


def test_iap_without_service_account_credentials_fails_clearly(monkeypatch, tmp_path):
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(tmp_path / "missing.json"))
    with pytest.raises(PublishError, match="Google ID token for IAP client id abc.apps"):
        publish.make_client("https://kfp.example.com", iap_client_id="abc.apps.googleusercontent.com")


def test_unreachable_host_fails_clearly():
    with pytest.raises(PublishError, match="cannot reach KFP at http://127.0.0.1:9"):
        publish.make_client("http://127.0.0.1:9", token=TOKEN)
