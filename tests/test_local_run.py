"""`pipectl run --local` as a user meets it when something is wrong, and the pieces behind its output: the checks
before anything runs, a failed step's short block, the capture of a run's output, a step's error message.

The whole quiet run (one line per step start and end, the logs) is checked on the shared end-to-end run in
tests/test_local_e2e.py.
"""

import logging
import os
import re
import subprocess
import sys

import pytest
import yaml

from pipelines import training
from pipelines.local import local_checks, steplogs
from tests.conftest import REPO_ROOT, write_png


def pipectl(*argv: str, cwd=REPO_ROOT, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pipelines.cli", *argv], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout)


# ---------------------------------------------------------------------------------------------- before anything runs


def test_a_missing_source_is_refused_at_once_in_a_few_lines(tmp_path):
    out = tmp_path / "run"
    done = pipectl("run", "--local", "--output-dir", str(out), "--data", "/nonexistent/images")
    printed = (done.stdout + done.stderr).strip().splitlines()
    assert done.returncode == 2
    assert printed == ["pipectl: error: --data: /nonexistent/images does not exist; expected an idx directory, a "
                       "folder with one subfolder per class, a CSV/JSONL manifest or tfds:NAME"]
    assert not out.exists()


@pytest.fixture
def sources(tmp_path):
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty-files" / "Bag").mkdir(parents=True)
    (tmp_path / "empty-files" / "Bag" / "0.png").write_bytes(b"")
    (tmp_path / "nested" / "Bag").mkdir(parents=True)
    (tmp_path / "nested" / "Bag" / "0.png").write_bytes(b"\x89PNG")
    (tmp_path / "linked").mkdir()
    os.symlink(tmp_path / "nested" / "Bag", tmp_path / "linked" / "Bag")
    (tmp_path / "manifest.csv").write_text("uri,label\na.png,Bag\n")
    (tmp_path / "empty.csv").write_text("")
    return tmp_path


@pytest.mark.parametrize("params, problem", [
    ({"data": "{d}/empty"}, "--data: {d}/empty holds no readable file (it is empty)"),
    ({"data": "{d}/empty-files"}, "--data: {d}/empty-files holds no readable file (1 files, none readable or all "
                                  "empty)"),
    ({"data": "{d}/empty.csv"}, "--data: {d}/empty.csv cannot be read, or is empty"),
    ({"data": "{d}/nested", "predict_images": "{d}/nowhere"}, "--predict-images: {d}/nowhere does not exist"),
    ({"data": "{d}/nested", "predict_images": "{d}/nested/**/*.jpg"}, "--predict-images: {d}/nested/**/*.jpg "
                                                                      "matches no file"),
])
def test_local_sources_that_hold_nothing_readable_are_refused(sources, params, problem):
    with pytest.raises(ValueError) as refused:
        local_checks.check_local_sources({k: v.format(d=sources) for k, v in params.items()})
    assert str(refused.value).startswith(problem.format(d=sources) + "; expected ")


@pytest.mark.parametrize("params", [
    {"data": "{d}/nested"}, {"data": "{d}/linked"}, {"data": "{d}/manifest.csv"},
    {"data": "{d}/nested", "predict_images": "{d}/nested/**/*.png"},
    {"data": "tfds:mnist", "predict_images": "gs://bucket/images"},  # the steps check remote sources
    {"data": "gs://bucket/images", "predict_images": ""},
])
def test_local_sources_with_something_readable_pass(sources, params):
    local_checks.check_local_sources({k: v.format(d=sources) for k, v in params.items()})


def test_the_missing_default_dataset_says_how_to_install_it(monkeypatch, tmp_path):
    from components import params

    monkeypatch.setattr(params, "DEFAULT_SOURCE", str(tmp_path / "fashion-mnist"))
    monkeypatch.setitem(params.PARAMETERS, "data", params.Param("data", str, params.DEFAULT_SOURCE, ""))
    with pytest.raises(ValueError, match=r"does not exist; expected install the default dataset with `make data`"):
        local_checks.check_local_sources({})


# ---------------------------------------------------------------------------------------------- a failed step


def test_a_failed_step_ends_with_one_short_block_and_no_traceback(tmp_path, fashion_arrays):
    images, _ = fashion_arrays
    for i in range(5):
        write_png(str(tmp_path / "one-class" / "Bag" / f"{i}.png"), images[i])
    out = tmp_path / "run"
    done = pipectl("run", "--local", "--output-dir", "run", "--data", str(tmp_path / "one-class"), cwd=tmp_path)
    assert done.returncode == 1
    assert "Traceback" not in done.stdout + done.stderr
    assert done.stderr.splitlines() == [
        f"pipectl: step preprocess failed: DataError: Need at least 2 classes to train a classifier, found 1 in "
        f"{tmp_path / 'one-class'} (one subfolder per class): 'Bag'",
        "  full log: run/logs/preprocess.log"]  # as the user named the output directory
    assert re.search(r"  preprocess  FAILED after \d+\.\ds \(full log: run/logs/preprocess.log\)", done.stdout)
    for step in ("augment", "train", "evaluate", "predict", "register"):
        assert f"  {step:<10}  skipped: preprocess failed" in done.stdout, step
    log = (out / "logs" / "preprocess.log").read_text()
    assert "Traceback (most recent call last):" in log and "components.dataio.storage.DataError: Need at least 2" in log


# ---------------------------------------------------------------------------------------------- the pieces


def test_capture_takes_every_writer_in_order_and_restores_them(capfd):
    lines = []
    stdout, stderr, handlers = sys.stdout, sys.stderr, logging.getLogger().handlers[:]
    with steplogs.captured_output(lines.append):
        print("python stdout")
        print("python stderr", file=sys.stderr)
        os.write(1, b"descriptor 1\n")
        os.write(2, b"descriptor 2\n")
        subprocess.run([sys.executable, "-c", "import sys; print('child stdout'); print('child stderr', "
                                              "file=sys.stderr, flush=True)"], check=True)
        logging.getLogger("kfp.local").info("a root-logger note")
        print("no newline at the end", end="")
    assert lines[:6] == ["python stdout", "python stderr", "descriptor 1", "descriptor 2", "child stdout",
                         "child stderr"]
    assert lines[6].endswith("kfp.local INFO a root-logger note") and lines[7] == "no newline at the end"
    assert (sys.stdout, sys.stderr, logging.getLogger().handlers) == (stdout, stderr, handlers)
    print("after")
    os.write(2, b"after on 2\n")
    assert capfd.readouterr() == ("after\n", "after on 2\n")


def test_capture_restores_everything_when_the_block_raises():
    stdout, stderr = sys.stdout, sys.stderr
    with pytest.raises(RuntimeError, match="task failed"):
        with steplogs.captured_output(lambda line: None):
            raise RuntimeError("task failed")
    assert (sys.stdout, sys.stderr) == (stdout, stderr)
    assert os.write(1, b"") == 0  # descriptor 1 is usable again


def test_error_message_is_the_exception_a_traceback_ends_with():
    lines = ["2026-01-01 00:00:00,000 INFO [components.preprocess.step] preprocess: reading",
             "Traceback (most recent call last):", '  File "a.py", line 1, in <module>', "    f()",
             "KeyError: 'x'", "", "During handling of the above exception, another exception occurred:", "",
             "Traceback (most recent call last):", '  File "b.py", line 2, in f', "    raise DataError(...)",
             "    ^^^^^^^^^^^^^^^^", "components.dataio.data.DataError: Invalid parameters:", "  epochs must be >= 0",
             "", ""]
    assert steplogs.error_message(lines) == "DataError: Invalid parameters:\n  epochs must be >= 0"
    assert steplogs.error_message(["x", "2026-01-01 00:00:00,000 ERROR [components.train.loop] train: loss is NaN",
                                   "2026-01-01 00:00:01,000 INFO [root] done"]) == "train: loss is NaN"
    assert steplogs.error_message(["a", "error: no images found", "  "]) == "error: no images found"
    assert steplogs.error_message(["a", "last words", ""]) == "last words"


def test_task_groups_of_the_compiled_pipeline(tmp_path):
    package = training.compile_pipeline(str(tmp_path / "pipeline.yaml"))
    with open(package) as f:
        spec = next(yaml.safe_load_all(f))
    groups = steplogs.task_groups(spec)
    assert groups == {name: ["register-op"] for name in groups} and len(groups) == 1  # the dsl.If "blessed"


def test_router_keys_lines_on_the_running_task(tmp_path):
    """The kfp.local lines the router relies on, as kfp.local writes them (the e2e test runs the real thing)."""
    console = []

    class Console:
        def write(self, text):
            console.append(text)

        def flush(self):
            pass

    router = steplogs.StepRouter(str(tmp_path), {"train-op": "train", "register-op": "register"}, Console(),
                                 groups={"condition-1": ["register-op"]},
                                 task_outputs=lambda task: {"artifacts": {"metrics": {"artifacts": [
                                     {"metadata": {"epoch01_loss": 0.1, "train_seconds": 0.5}}]}}})
    for line in ["\x1b[0m12:00:00.000 - INFO - Running pipeline: 'p'",
                 "12:00:00.001 - INFO - Executing task \x1b[96m'train-op'\x1b[0m",
                 "/x/subprocess_task_handler.py:81: RuntimeWarning: You may be attemping to run ...",
                 "12:00:00.002 - INFO - Streamed logs:", "",
                 "    [KFP Executor 2026-01-01 12:00:00,100 INFO]: Got executor_input:",
                 "    Executing task 'a-line-a-step-printed'",
                 "    2026-01-01 12:00:01,000 INFO [components.train.loop] epoch 1/1 (0.5s) loss=0.1",
                 "    2026-01-01 12:00:01,000 INFO [tensorflow] Assets written to: /m",
                 "    2026-01-01 12:00:01,000 INFO [components.train.loop] train: checkpoint /c/ckpt-5 (epoch 1)",
                 "12:00:02.000 - INFO - Task \x1b[96m'train-op'\x1b[0m finished with status \x1b[92mSUCCESS\x1b[0m",
                 "    Output: 1.5",
                 "2026-01-01 12:00:02,000 root INFO Skipping conditional task condition-1 (condition evaluated to "
                 "False)",
                 "12:00:03.000 - INFO - Pipeline 'p' finished with status SUCCESS"]:
        router.feed(line)
    router.close()
    shown = "".join(console).splitlines()
    assert [line[10:] for line in shown] == ["train     started", "            epoch 1/1 (0.5s) loss=0.1",
                                             "train     succeeded in 0.0s: 1 epoch, 0.5s fitting",
                                             "register  skipped: the model is not blessed"]
    train_log = (tmp_path / "train.log").read_text().splitlines()
    assert train_log[0].endswith("Executing task 'train-op'") and "Executing task 'a-line-a-step-printed'" in train_log
    assert "2026-01-01 12:00:01,000 INFO [tensorflow] Assets written to: /m" in train_log  # de-indented, no colours
    assert train_log[-1] == "    Output: 1.5"  # kfp.local's list of outputs, as it wrote it
    assert "Skipping conditional task condition-1" in (tmp_path / "register.log").read_text()
    assert (tmp_path / "pipeline.log").read_text().splitlines()[0].endswith("Running pipeline: 'p'")
    assert [(s["step"], s["state"]) for s in router.summary()] == [("train", "succeeded"), ("register", "skipped")]


def test_key_figures_of_each_step():
    def artifact(**metadata):
        return {"artifacts": [{"metadata": metadata}]}

    assert steplogs.key_figures("preprocess", {"parameterValues": {"train": 9, "validation": 1, "test": 5,
                                                                   "rejected": 2}}) == \
        "train 9, validation 1, test 5, rejected 2"
    assert steplogs.key_figures("augment", {"artifacts": {"augmented": artifact(mode="offline", copies=2,
                                                                                train=30)}}) == \
        "2 copies: 30 training images"
    assert steplogs.key_figures("evaluate", {"parameterValues": {"Output": False},
                                             "artifacts": {"metrics": artifact(accuracy=0.61234)}}) == \
        "test accuracy 0.6123, not blessed"
    assert steplogs.key_figures("train", {"artifacts": {"metrics": artifact(epoch01_loss=1.0, epoch02_loss=0.5,
                                                                           train_seconds=3.21)}}) == \
        "2 epochs, 3.2s fitting"
    assert steplogs.key_figures("predict", {"artifacts": {}}) == ""  # what the output does not hold is left out
    assert steplogs.key_figures("train", None) == ""


def test_the_image_step_shows_which_image_runs_each_step():
    from pipelines.local.steplogs import key_figures

    picked = {"parameterValues": {"train": "r/torch@sha256:" + "c" * 64, "evaluate": "r/torch:abc",
                                  "predict": "europe-docker.pkg.dev/p/ml/gpu:dev"}}
    assert key_figures("images", picked) == "train torch, evaluate torch, predict gpu"
