"""The steps' shared command-line tail: one exit-code contract, errors as one line, results as JSON."""

import json
import os

import pytest

from components import augment, evaluate, gcp, predict, preprocess, stepcli, train
from components.dataio import data


class RemoteFailure(RuntimeError):
    """Stands for an error kind a later layer adds (a remote job's), unknown to stepcli."""


class BusyService(RemoteFailure):
    exit_code = stepcli.EXIT_RETRY  # states its own code, as the training step's errors do


@pytest.mark.parametrize("error, code", [
    (ValueError("bad setting"), stepcli.EXIT_PERMANENT),
    (data.DataError("no dataset.json"), stepcli.EXIT_PERMANENT),
    (train.NonFiniteLossError("Loss became nan"), stepcli.EXIT_PERMANENT),
    (train.PermanentFailure("failed before"), stepcli.EXIT_PERMANENT),
    (train.Preempted("SIGTERM"), stepcli.EXIT_RETRY),
    (KeyError("class_names"), stepcli.EXIT_BUG),
    (RemoteFailure("job failed"), stepcli.EXIT_BUG),
    (BusyService("quota"), stepcli.EXIT_RETRY),
])
def test_errors_map_to_the_documented_exit_codes(error, code):
    assert stepcli.exit_code_for(error) == code
    assert (code in stepcli.RETRYABLE_EXIT_CODES) == (code == stepcli.EXIT_RETRY)


def test_a_caller_adds_error_kinds_without_changing_the_helper():
    added = {RemoteFailure: stepcli.EXIT_PERMANENT}
    assert stepcli.exit_code_for(RemoteFailure("job failed"), added) == stepcli.EXIT_PERMANENT
    assert stepcli.exit_code_for(BusyService("quota"), added) == stepcli.EXIT_RETRY  # the nearer class wins
    assert stepcli.exit_code_for(ValueError("x"), {ValueError: stepcli.EXIT_BUG}) == stepcli.EXIT_BUG
    assert stepcli.exit_code_for(RemoteFailure("x")) == stepcli.EXIT_BUG  # the defaults are not changed
    with pytest.raises(TypeError):
        stepcli.EXIT_CODES[RemoteFailure] = 2  # read-only: additions are passed in, never made global


@pytest.mark.parametrize("error, code", [
    (gcp.JobFailed("projects/p/locations/l/batchPredictionJobs/1 ended JOB_STATE_FAILED"), stepcli.EXIT_PERMANENT),
    (gcp.JobTimedOut("did not finish in 3s; it was cancelled"), stepcli.EXIT_PERMANENT),
    (gcp.PermissionDenied("needs roles/aiplatform.user"), stepcli.EXIT_PERMANENT),
    (gcp.RegionMismatch("endpoint in europe-west4, model in us-central1"), stepcli.EXIT_PERMANENT),
    (gcp.JobStopped("SIGTERM: the job was cancelled"), stepcli.EXIT_RETRY),
    (gcp.QuotaExhausted("quota"), stepcli.EXIT_RETRY),
])
def test_the_google_cloud_layers_errors_keep_their_codes(error, code):
    """The job layer's errors state their codes; `python -m components.predict` and `pipectl predict` (both run
    through stepcli) report a Vertex AI batch job's failure alike, and as the layer itself documents."""
    assert isinstance(error, predict.VertexBatchError)
    assert stepcli.exit_code_for(error) == code == error.exit_code


def test_run_prints_the_result_as_json(capsys):
    class Result:
        def to_json(self):
            return {"count": 3}

    assert stepcli.run(Result) == stepcli.EXIT_OK
    assert json.loads(capsys.readouterr().out) == {"count": 3}


def test_run_reports_mapped_errors_in_one_line_and_raises_bugs(capsys):
    def bad_input():
        raise data.DataError("No images found under gs://b/imgs")

    assert stepcli.run(bad_input) == stepcli.EXIT_PERMANENT
    assert capsys.readouterr().err == "error: No images found under gs://b/imgs\n"
    assert stepcli.run(bad_input, prog="pipectl") == stepcli.EXIT_PERMANENT
    assert capsys.readouterr().err == "pipectl: error: No images found under gs://b/imgs\n"

    def bug():
        return {}["missing"]

    with pytest.raises(KeyError):  # the traceback shows, and the process exits 1
        stepcli.run(bug)

    def preempted():
        raise SystemExit(stepcli.EXIT_RETRY)

    assert stepcli.run(preempted) == stepcli.EXIT_RETRY


def test_every_steps_cli_reports_bad_input_as_exit_2(tmp_path, capsys):
    missing = str(tmp_path / "missing")
    calls = {
        "augment": lambda: augment.main(["--dataset-dir", missing, "--output-dir", str(tmp_path / "a")]),
        "evaluate": lambda: evaluate.main(["--model-dir", missing, "--dataset-dir", missing]),
        "predict": lambda: predict.main(["--model-dir", missing, "--images", missing, "--output-dir",
                                         str(tmp_path / "p")]),
        "preprocess": lambda: preprocess.main(["--source", missing, "--output-dir", str(tmp_path / "d")]),
        "train": lambda: train.main(["--dataset-dir", missing, "--model-dir", str(tmp_path / "m")]),
    }
    for step, call in calls.items():
        assert call() == stepcli.EXIT_PERMANENT, step
        captured = capsys.readouterr()
        errors = [line for line in captured.err.splitlines() if line.startswith("error: ")]
        assert len(errors) == 1 and missing in errors[0] and "Traceback" not in captured.err, step
        assert captured.out == "", step
    assert not os.path.exists(tmp_path / "m")


def test_log_lines_name_their_logger_and_parse_back():
    """A reader of a step's mixed output (pipectl run --local) tells the project's lines by their logger."""
    import io
    import logging

    buffer = io.StringIO()
    handler = logging.StreamHandler(buffer)
    handler.setFormatter(logging.Formatter(stepcli.LOG_FORMAT))
    for name, message in [("components.train.loop", "epoch 1/2 (0.5s) loss=0.1"), ("tensorflow", "Assets written")]:
        logger = logging.getLogger(name)
        logger.addHandler(handler)
        try:
            logger.warning(message)
        finally:
            logger.removeHandler(handler)
    ours, theirs = (stepcli.parse_log_line(line) for line in buffer.getvalue().splitlines())
    assert (ours.level, ours.logger, ours.message, ours.from_project) == (
        "WARNING", "components.train.loop", "epoch 1/2 (0.5s) loss=0.1", True)
    assert (theirs.logger, theirs.from_project) == ("tensorflow", False)
    assert stepcli.parse_log_line("[KFP Executor 2026-01-01 00:00:00,000 INFO]: Got executor_input:") is None
    assert stepcli.parse_log_line("The image 0.png is a Bag with a 90.00 percent confidence.") is None
