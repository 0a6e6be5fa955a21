"""preprocess_runner=dataflow: the options are checked and refused clearly when incomplete, the job is built
offline (its options and graph), and it is launched, followed and cancelled with the real Dataflow client library
(google-cloud-dataflow-client, REST) against a loopback stand-in of the Dataflow v1b3 jobs API."""

import os
import signal
import threading

import pytest

from tests.conftest import require_framework

require_framework("apache_beam")

from components import params  # noqa: E402
from components.dataio import data  # noqa: E402
from components import preprocess as pp  # noqa: E402
from components.gcp.errors import JobError, JobFailed, JobStopped  # noqa: E402
from components.stepcli import EXIT_PERMANENT, EXIT_RETRY  # noqa: E402
from components.preprocess import beam as beam_lib  # noqa: E402
from components.preprocess import dataflow  # noqa: E402
from components.preprocess.sources import open_source  # noqa: E402
from pipelines import parameters  # noqa: E402
from tests.standins.dataflow import DataflowStandIn  # noqa: E402

IMAGE = "us-docker.pkg.dev/my-project/images/cpu@sha256:" + "a" * 64


def settings_for(standin, tmp_path, **more) -> dataflow.DataflowSettings:
    values = dict(project="my-project", region="europe-west4", temp_location="gs://my-bucket/tmp",
                  staging_location=str(tmp_path / "staging"), service_account="prep@my-project.iam.gserviceaccount.com",
                  network="vpc", subnetwork="regions/europe-west4/subnetworks/data", max_workers=40,
                  machine_type="n2-highcpu-8", sdk_container_image=IMAGE, api_endpoint=standin.url, poll_seconds=0.05)
    return dataflow.DataflowSettings(**{**values, **more})


def job_graph(image_folder, tmp_path, settings):
    """The preprocessing pipeline of a small class-folder tree, with the Dataflow runner's options."""
    import apache_beam as beam

    src = open_source(image_folder(per_class=3), image_size=28, channels=1, limit=None, workers=1)
    inputs = str(tmp_path / "inputs.jsonl")
    beam_lib.write_inputs(src, inputs)
    pipeline = beam.Pipeline(options=settings.pipeline_options("preprocess-test-1"))
    beam_lib.build_graph(pipeline, inputs_path=inputs, output_dir="gs://my-bucket/run/dataset",
                         work_dir="gs://my-bucket/run/dataset/_beam", shards={"train": 2, "validation": 2, "test": 2},
                         settings=beam_lib.BeamSettings(image_size=28, channels=1, check_extension=True,
                                                        validation_fraction=0.1, test_fraction=0.1,
                                                        class_names=src.class_names, sample_classes=3,
                                                        samples_per_class=8))
    return pipeline


def test_incomplete_or_wrong_dataflow_parameters_are_refused_naming_each():
    defaults = {name: p.default for name, p in params.PARAMETERS.items()}
    assert parameters.problems({**defaults, "preprocess_runner": "local"}) == []
    found = parameters.problems({**defaults, "preprocess_runner": "dataflow", "project": "",
                                 "dataflow_subnetwork": "data", "dataflow_service_account": "prep"})
    text = "\n".join(found)
    assert "project is required with preprocess_runner=dataflow" in text
    assert "dataflow_temp_location must be a gs:// folder" in text
    assert "dataflow_subnetwork must be regions/REGION/subnetworks/NAME" in text
    assert "dataflow_service_account must be a service account email" in text
    assert f"data must be on gs:// for preprocess_runner=dataflow: Dataflow's workers cannot read " \
           f"{params.DEFAULT_SOURCE}" in text
    assert parameters.problems({"preprocess_runner": "spark"}) == [
        "preprocess_runner must be one of local, dataflow (got 'spark')"]
    good = {**defaults, "preprocess_runner": "dataflow", "project": "my-project", "location": "us-central1",
            "data": "gs://my-bucket/photos", "dataflow_temp_location": "gs://my-bucket/tmp",
            "dataflow_subnetwork": "regions/europe-west4/subnetworks/data"}
    assert parameters.problems(good) == [
        "dataflow_subnetwork is in region europe-west4 but the job runs in us-central1 (location)"]


def test_the_step_refuses_local_paths_before_reading_anything(image_folder, tmp_path):
    with DataflowStandIn() as standin:
        settings = settings_for(standin, tmp_path, temp_location="/tmp/x")
        with pytest.raises(data.DataError) as refused:
            pp.preprocess(image_folder(per_class=3), str(tmp_path / "out"), runner="dataflow", dataflow=settings)
        assert standin.requests == []
    message = str(refused.value)
    assert message.startswith("Cannot run preprocess on Dataflow:")
    assert "dataflow_temp_location must be a gs:// folder" in message
    assert "data must be on gs://" in message and "the dataset output must be on gs://" in message
    assert not os.path.exists(tmp_path / "out")


def test_the_job_is_built_offline_with_its_options_and_graph(image_folder, tmp_path):
    from apache_beam.portability.api import beam_runner_api_pb2

    with DataflowStandIn() as standin:
        settings = settings_for(standin, tmp_path)
        job, url = dataflow.build_job(job_graph(image_folder, tmp_path, settings), settings)
        assert standin.requests == []  # nothing sent while building
    assert job.name == "preprocess-test-1"
    environment = job.environment
    assert environment.service_account_email == "prep@my-project.iam.gserviceaccount.com"
    assert environment.temp_storage_prefix.startswith("storage.googleapis.com/my-bucket/tmp/preprocess-test-1")
    options = dict(environment.sdk_pipeline_options["options"])
    assert options["sdk_container_image"] == IMAGE and options["max_num_workers"] == 40
    assert options["machine_type"] == "n2-highcpu-8"
    assert options["network"] == "vpc" and options["subnetwork"] == "regions/europe-west4/subnetworks/data"
    assert options["region"] == "europe-west4" and options["project"] == "my-project"
    assert url == str(tmp_path / "staging" / "pipeline.pb")
    pipeline = beam_runner_api_pb2.Pipeline.FromString(open(url, "rb").read())
    names = {t.unique_name for t in pipeline.components.transforms.values()}
    assert {"Decode", "Group by content", "Keep first of each content", "train: write shards",
            "Rejects: write"} <= {n.split("/")[0] for n in names}
    images = {env.payload for env in pipeline.components.environments.values()}
    assert any(IMAGE.encode() in payload for payload in images)  # the workers run the project's CPU image


def test_the_job_is_created_followed_to_its_end_and_its_console_url_printed(image_folder, tmp_path, caplog):
    caplog.set_level("INFO")
    with DataflowStandIn() as standin:
        settings = settings_for(standin, tmp_path)
        jobs = dataflow.DataflowJobs("my-project", "europe-west4", api_endpoint=standin.url)
        followed = dataflow.launch(job_graph(image_folder, tmp_path, settings), settings, jobs)
        created = standin.created[0]
    assert followed.status.state == "JOB_STATE_DONE"
    assert created["environment"]["serviceAccountEmail"] == "prep@my-project.iam.gserviceaccount.com"
    assert [r.rpc for r in standin.requests][:2] == ["CreateJob", "GetJob"]
    url = dataflow.console_url("my-project", "europe-west4", followed.job.id)
    assert url in caplog.text and "JOB_STATE_RUNNING" in caplog.text  # one progress line per state


def test_a_failed_job_is_an_error_quoting_dataflow(image_folder, tmp_path):
    script = ("JOB_STATE_RUNNING", "JOB_STATE_FAILED")
    with DataflowStandIn(script, error_messages=("Workflow failed.", "ImportError: no module named components")) \
            as standin:
        settings = settings_for(standin, tmp_path)
        jobs = dataflow.DataflowJobs("my-project", "europe-west4", api_endpoint=standin.url)
        with pytest.raises(JobFailed) as failed:
            dataflow.launch(job_graph(image_folder, tmp_path, settings), settings, jobs)
    message = str(failed.value)
    assert "ended JOB_STATE_FAILED" in message and "ImportError: no module named components" in message
    assert "https://console.cloud.google.com/dataflow/jobs/europe-west4/" in message
    assert failed.value.exit_code == EXIT_PERMANENT and standin.cancelled == []


def test_a_job_name_clash_leaves_the_other_job_alone(image_folder, tmp_path):
    """Dataflow answers a create whose name is active with that job; its clientRequestId is not ours."""
    with DataflowStandIn(("JOB_STATE_RUNNING",) * 100_000) as standin:
        settings = settings_for(standin, tmp_path)
        jobs = dataflow.DataflowJobs("my-project", "europe-west4", api_endpoint=standin.url)
        theirs, _ = dataflow.build_job(job_graph(image_folder, tmp_path, settings), settings)
        theirs = jobs.create(theirs)
        with pytest.raises(JobError, match=f"already an active job named preprocess-test-1 \\({theirs.id}"):
            dataflow.launch(job_graph(image_folder, tmp_path, settings), settings, jobs)
        assert list(standin.jobs) == [theirs.id] and standin.cancelled == []
        assert [r.rpc for r in standin.requests] == ["CreateJob", "CreateJob"]  # never followed, never cancelled


def test_sigterm_cancels_the_job(image_folder, tmp_path):
    with DataflowStandIn(("JOB_STATE_RUNNING",) * 100_000) as standin:
        settings = settings_for(standin, tmp_path)
        jobs = dataflow.DataflowJobs("my-project", "europe-west4", api_endpoint=standin.url)

        def terminate_once_followed():
            standin.wait_for(lambda: len(standin.calls("GetJob")) >= 2)
            os.kill(os.getpid(), signal.SIGTERM)  # what a cancelled pipeline run sends the step

        killer = threading.Thread(target=terminate_once_followed, daemon=True)
        killer.start()
        with pytest.raises(JobStopped, match="it was cancelled") as stopped:
            dataflow.launch(job_graph(image_folder, tmp_path, settings), settings, jobs)
        killer.join()
        assert stopped.value.exit_code == EXIT_RETRY and standin.cancelled == list(standin.jobs)
        assert standin.jobs[standin.cancelled[0]]["requestedState"] == "JOB_STATE_CANCELLED"


def test_pipectl_refuses_an_incomplete_dataflow_run_before_anything_runs(tmp_path, capsys):
    from pipelines import cli

    out = tmp_path / "run"
    assert cli.main(["run", "--local", "--output-dir", str(out), "--preprocess-runner", "dataflow",
                     "--project", "my-project"]) == 2
    err = capsys.readouterr().err
    assert "dataflow_temp_location must be a gs:// folder" in err and "data must be on gs://" in err
    assert not (out / "pipeline_root").exists()


def test_the_compiled_pipeline_hands_the_runner_its_parameters_and_the_cpu_image(tmp_path):
    import yaml

    from pipelines import config
    from pipelines.training import compile_pipeline

    images = config.Images("r/cpu@sha256:" + "c" * 64, "r/gpu@sha256:" + "d" * 64)
    path = tmp_path / "pipeline.yaml"
    compile_pipeline(str(path), config.PipelineSettings(images=images))
    spec, _ = yaml.safe_load_all(path.read_text())
    inputs = spec["root"]["inputDefinitions"]["parameters"]
    assert inputs["preprocess_runner"]["defaultValue"] == "local"
    assert "Dataflow" in inputs["preprocess_runner"]["description"]
    task = spec["root"]["dag"]["tasks"]["preprocess-op"]["inputs"]["parameters"]
    assert task["image"]["runtimeValue"]["constant"] == images.cpu
    for name in ("project", "location", "dataflow_temp_location", "dataflow_subnetwork", "dataflow_max_workers",
                 "dataflow_machine_type", "dataflow_service_account", "dataflow_network", "dataflow_staging_location"):
        assert task[name]["componentInputParameter"] == name
    assert task["runner"]["componentInputParameter"] == "preprocess_runner"
