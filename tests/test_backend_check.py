"""pipectl refuses to put the pipeline on a KFP host whose backend is older than the pipeline needs, as the host
reports its release (the real kfp.Client against the KFP API stand-in, whose healthz follows the API server)."""

import logging

import pytest

from pipelines import cli
from pipelines.backend import kfp_driver
from pipelines.hosts import backend_check
from pipelines.hosts.publish import make_client

UPLOADS = "/apis/v2beta1/pipelines/upload_version"


def test_the_host_reports_its_release(kfp_api):
    client = make_client(kfp_api.url)
    assert backend_check.backend_release(client) == "2.17.0"
    kfp_api.tag_name = "unknown"  # a build without TAG_NAME
    assert backend_check.backend_release(client) is None


@pytest.mark.parametrize("launcher,needs,feature", [
    ("trainjob", "2.15.0", "TaskConfig passthrough"),
    ("pod", "2.5.0", "nodeSelectorJson / tolerationJson"),
])
def test_upload_to_an_older_backend_is_refused_before_anything_is_sent(kfp_api, capsys, launcher, needs, feature):
    kfp_api.tag_name = "2.4.1"
    argv = ["upload", "--host", kfp_api.url, "--version", "v1", "--train-launcher", launcher]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert f"runs backend 2.4.1, but this pipeline needs {needs} or newer" in err and feature in err
    assert "--allow-older-backend" in err and "pipectl compile --explain --backend-release 2.4.1" in err
    assert kfp_api.requests_to("POST", UPLOADS) == [] and kfp_api.pipelines == {}


def test_allow_older_backend_uploads_with_a_warning(kfp_api, capsys, caplog):
    kfp_api.tag_name = "2.14.0"
    with caplog.at_level(logging.WARNING, logger="pipelines.hosts.backend_check"):
        assert cli.main(["upload", "--host", kfp_api.url, "--version", "v1", "--train-launcher", "jobset",
                         "--allow-older-backend"]) == 0
    assert "needs 2.15.0 or newer" in caplog.text
    assert len(kfp_api.requests_to("POST", UPLOADS)) == 1


def test_a_new_enough_or_silent_backend_gets_the_upload(kfp_api, capsys, caplog):
    kfp_api.tag_name = "2.15.0"
    assert cli.main(["upload", "--host", kfp_api.url, "--version", "v1", "--train-launcher", "trainjob"]) == 0
    kfp_api.tag_name = "unknown"
    with caplog.at_level(logging.WARNING, logger="pipelines.hosts.backend_check"):
        assert cli.main(["upload", "--host", kfp_api.url, "--version", "v2"]) == 0
    assert "does not report its release; this pipeline needs KFP 2.5.0 or newer" in caplog.text
    assert len(kfp_api.requests_to("POST", UPLOADS)) == 2


def test_a_latest_schedule_needs_a_backend_that_follows_the_newest_version(kfp_api, capsys):
    assert cli.main(["upload", "--host", kfp_api.url, "--version", "v1"]) == 0
    kfp_api.tag_name = "2.4.1"
    assert cli.main(["schedule", "--host", kfp_api.url, "--cron", "0 3 * * *"]) == 2
    err = capsys.readouterr().err
    assert "recurring runs on the pipeline's latest version (no version id) (since 2.5.0)" in err
    assert "--version NAME" in err
    assert kfp_api.recurring_runs == {}
    assert cli.main(["schedule", "--host", kfp_api.url, "--cron", "0 3 * * *", "--version", "v1"]) == 0
    assert len(kfp_api.recurring_runs) == 1


def test_the_table_in_the_docs_is_the_one_the_check_uses():
    """docs/kfp-compatibility.md lists each feature with the first release the check uses."""
    import pathlib

    text = (pathlib.Path(__file__).parent.parent / "docs" / "kfp-compatibility.md").read_text()
    for feature in kfp_driver.FEATURES.values():
        row = next(line for line in text.splitlines() if line.startswith(f"| {feature.description} |"))
        assert f"| {feature.first_release} |" in row, feature.name
