"""pipectl upload / run --host / schedule, as a user (or Cloud Build) types them, against the KFP API stand-in.

The client is the real kfp.Client; the stand-in serves the KFP v2beta1 REST API on 127.0.0.1.
"""

import json

import pytest

from pipelines import cli

TOKEN = "kfp-token-do-not-log-9f8e7d"


@pytest.fixture
def host(kfp_api, monkeypatch):
    monkeypatch.setenv("KFP_TOKEN", TOKEN)
    kfp_api.require_token = TOKEN
    return kfp_api.url


def output(capsys) -> dict:
    out = capsys.readouterr().out
    return json.loads(out[out.index("{"):])


def test_upload_compiles_pinned_and_never_overwrites(kfp_api, host, capsys):
    argv = ["upload", "--host", host, "--version", "abc1234", "--image-repo", "europe-docker.pkg.dev/p/ml",
            "--image-tag", "abc1234"]
    assert cli.main(argv) == 0
    first = output(capsys)
    assert first["version_name"] == "abc1234" and first["created"] is True
    uploaded = kfp_api.requests_to("POST", "/apis/v2beta1/pipelines/upload_version")[-1].raw
    assert b"europe-docker.pkg.dev/p/ml/gpu:abc1234" in uploaded

    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert "abc1234" in err and "--if-exists skip" in err
    assert cli.main(argv + ["--if-exists", "skip"]) == 0
    assert output(capsys)["created"] is False

    assert cli.main(argv[:3] + ["--version", "def5678"]) == 0
    assert output(capsys)["version_name"] == "def5678"
    for request in kfp_api.requests:
        assert request.headers.get("authorization") == f"Bearer {TOKEN}"


def test_run_on_host_waits_and_fails_loudly(kfp_api, host, capsys):
    assert cli.main(["upload", "--host", host, "--version", "v1"]) == 0
    capsys.readouterr()
    assert cli.main(["run", "--host", host, "--run-name", "ok-run", "--epochs", "3", "--wait", "--poll-seconds",
                     "0.01", "--experiment", "nightly"]) == 0
    result = output(capsys)
    assert result["state"] == "SUCCEEDED" and "/#/runs/details/" in result["url"]
    body = kfp_api.requests_to("POST", "/apis/v2beta1/runs")[-1].body
    assert body["runtime_config"]["parameters"] == {"epochs": 3}

    kfp_api.run_outcomes["bad-run"] = "FAILED"
    assert cli.main(["run", "--host", host, "--run-name", "bad-run", "--wait", "--poll-seconds", "0.01"]) == 2
    err = capsys.readouterr().err
    assert "FAILED" in err and TOKEN not in err


def test_run_on_host_refuses_bad_parameters_before_sending(kfp_api, host, capsys):
    sent = len(kfp_api.requests)
    assert cli.main(["run", "--host", host, "--epochs", "-1"]) == 2
    assert "epochs must be >= 0" in capsys.readouterr().err
    assert len(kfp_api.requests) == sent


def test_schedule_create_update_disable_delete_keeps_one(kfp_api, host, capsys):
    assert cli.main(["upload", "--host", host, "--version", "v1"]) == 0
    base = ["schedule", "--host", host, "--name", "nightly", "--experiment", "retrain"]
    assert cli.main(base + ["--cron", "0 3 * * *", "--no-catchup"]) == 0
    assert cli.main(base + ["--cron", "30 4 * * *", "--epochs", "6"]) == 0
    capsys.readouterr()
    listed = [r for r in kfp_api.requests_to("GET", "/apis/v2beta1/recurringruns")]
    assert listed  # schedules are looked up by name before changing them
    live = [r.body for r in kfp_api.requests_to("POST", "/apis/v2beta1/recurringruns")]
    assert live[-1]["trigger"]["cron_schedule"]["cron"] == "0 30 4 * * *"
    assert "pipeline_version_id" not in live[-1]["pipeline_version_reference"]  # newest version at each trigger
    assert len(kfp_api.requests_to("DELETE", "/apis/v2beta1/recurringruns/", prefix=True)) == 1

    assert cli.main(base + ["--disable"]) == 0
    assert cli.main(base + ["--delete"]) == 0
    assert cli.main(base + ["--cron", "0 3 * * 1-5"]) == 0
    assert "--cron is needed" not in capsys.readouterr().err
    assert cli.main(base) == 2
    assert "--cron is needed" in capsys.readouterr().err


def test_cache_switch_keeps_the_registry_steps_uncached(kfp_api, host, capsys):
    assert cli.main(["upload", "--host", host, "--version", "v1"]) == 0
    assert cli.main(["run", "--host", host, "--run-name", "cached", "--cache"]) == 0
    body = kfp_api.requests_to("POST", "/apis/v2beta1/runs")[-1].body
    # "--cache" is the compiled per-step setting: the run refers to the version, whose evaluate/register
    # steps never cache.
    assert body["pipeline_version_reference"]["pipeline_version_id"] and "pipeline_spec" not in body

    assert cli.main(["run", "--host", host, "--run-name", "fresh", "--no-cache"]) == 0
    spec = kfp_api.requests_to("POST", "/apis/v2beta1/runs")[-1].body["pipeline_spec"]
    spec = spec.get("pipeline_spec", spec)
    dags = [spec["root"]["dag"]] + [c["dag"] for c in spec["components"].values() if "dag" in c]
    flags = {name: t.get("cachingOptions", {}).get("enableCache", False) for dag in dags for name, t in dag["tasks"].items()}
    assert "register-op" in flags and "train-op" in flags
    assert not any(flags.values())
