"""pipectl's commands, called as a user calls them (through main(argv))."""

import json

import pytest
import yaml

from pipelines import cli


def test_compile_pins_the_images_given(tmp_path, capsys):
    out = tmp_path / "pipeline.yaml"
    assert cli.main(["compile", "-o", str(out), "--image-repo", "europe-docker.pkg.dev/p/ml", "--image-tag", "abc123"]) == 0
    spec = next(yaml.safe_load_all(out.read_text()))
    images = {e["container"]["image"] for e in spec["deploymentSpec"]["executors"].values()}
    chosen = "{{$.inputs.parameters['pipelinechannel--step-images-op-%s']}}"
    assert images == {"europe-docker.pkg.dev/p/ml/cpu:abc123", *(chosen % s for s in ("train", "evaluate", "predict"))}
    # what the image step picks from, per run (tests/test_compile.py)
    assert spec["root"]["dag"]["tasks"]["step-images-op"]["inputs"]["parameters"]["images"]["runtimeValue"][
        "constant"] == {kind: f"europe-docker.pkg.dev/p/ml/{kind}:abc123" for kind in ("cpu", "gpu", "torch")}
    assert f"wrote {out}" in capsys.readouterr().out


def test_compile_with_explicit_digests_and_other_pools(tmp_path):
    out = tmp_path / "pipeline.yaml"
    cpu, gpu, torch = "r/cpu@sha256:" + "1" * 64, "r/gpu@sha256:" + "2" * 64, "r/torch@sha256:" + "3" * 64
    assert cli.main(["compile", "-o", str(out), "--cpu-image", cpu, "--gpu-image", gpu, "--torch-image", torch,
                     "--train-accelerator", "nvidia-l4", "--train-gpus", "2"]) == 0
    spec, platform = yaml.safe_load_all(out.read_text())
    assert spec["root"]["dag"]["tasks"]["step-images-op"]["inputs"]["parameters"]["images"]["runtimeValue"][
        "constant"] == {"cpu": cpu, "gpu": gpu, "torch": torch}
    assert spec["deploymentSpec"]["executors"]["exec-preprocess-op"]["container"]["image"] == cpu
    # The compile-time choice becomes the default of the per-run training GPU parameters.
    inputs = spec["root"]["inputDefinitions"]["parameters"]
    assert inputs["train_accelerator_type"]["defaultValue"] == "nvidia-l4"
    assert inputs["train_gpu_count"]["defaultValue"] == 2.0


def _register_serving_image(spec: dict) -> str:
    """The serving image the compiled pipeline hands the register step (a constant of its task)."""
    def tasks(dag):
        for task in dag["tasks"].values():
            yield task
    found = [task for comp in spec["components"].values() if "dag" in comp for task in tasks(comp["dag"])
             if task["componentRef"]["name"] == "comp-register-op"]
    (task,) = found
    return task["inputs"]["parameters"]["serving_image"]["runtimeValue"]["constant"]


def test_compile_names_the_serving_container_of_registered_models(tmp_path):
    out = tmp_path / "pipeline.yaml"
    assert cli.main(["compile", "-o", str(out), "--image-repo", "europe-docker.pkg.dev/p/ml", "--image-tag", "t"]) == 0
    from components.registry.vertex import TF_SERVING_VERSION

    default = _register_serving_image(next(yaml.safe_load_all(out.read_text())))
    assert default == f"europe-docker.pkg.dev/p/ml/tensorflow-serving:{TF_SERVING_VERSION}"
    pinned = "europe-docker.pkg.dev/p/ml/tensorflow-serving@sha256:" + "3" * 64
    assert cli.main(["compile", "-o", str(out), "--image-repo", "europe-docker.pkg.dev/p/ml", "--serving-image", pinned]) == 0
    assert _register_serving_image(next(yaml.safe_load_all(out.read_text()))) == pinned


def test_compile_refuses_an_unknown_accelerator(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["compile", "-o", str(tmp_path / "p.yaml"), "--train-accelerator", "nvidia-k80"])
    assert exit_info.value.code == 2
    assert "invalid choice: 'nvidia-k80'" in capsys.readouterr().err


@pytest.mark.parametrize("argv, message", [
    (["--epochs", "-1"], "epochs must be >= 0, 0 for the recipe's (got -1)"),
    (["--channels", "2"], "channels must be 1 or 3 (got 2)"),
    (["--recipe", "turbo"], "recipe must be one of"),
    (["--augment-policy", '{"spin": 3}'], "Unknown augmentation policy keys ['spin']"),
    (["--validation-fraction", "0.7", "--test-fraction", "0.5"], "sum to less than 1"),
    (["--registry", "mlflow"], "registry must be one of local, vertex"),
])
def test_run_refuses_bad_parameters_before_running_anything(tmp_path, capsys, argv, message):
    out = tmp_path / "run"
    assert cli.main(["run", "--local", "--output-dir", str(out), *argv]) == 2
    assert message in capsys.readouterr().err
    assert not (out / "pipeline_root").exists()


def test_run_refuses_a_wrongly_typed_parameter(capsys):
    with pytest.raises(SystemExit):
        cli.main(["run", "--local", "--epochs", "twelve"])
    assert "argument --epochs: invalid int value: 'twelve'" in capsys.readouterr().err


def test_validate_parameters_lists_what_is_allowed():
    with pytest.raises(ValueError, match=r"Unknown pipeline parameter\(s\) \['epoch'\]; allowed: data, "):
        cli.validate_parameters({"epoch": 3})
    with pytest.raises(ValueError, match="Parameter epochs must be int, got '3'"):
        cli.validate_parameters({"epochs": "3"})
    assert cli.validate_parameters({"learning_rate": 1}) == {"learning_rate": 1.0}


def test_predict_standalone(tiny_model, image_folder, tmp_path, capsys):
    folder = image_folder(per_class=4)
    out = tmp_path / "predictions"
    assert cli.main(["predict", "--model", tiny_model, "--images", folder, "--output", str(out)]) == 0
    printed = capsys.readouterr().out
    rows = [json.loads(line) for line in (out / "predictions.jsonl").read_text().splitlines()]
    assert len(rows) == 12
    assert {r["uri"].split("/")[-2] for r in rows} == {"Sandal", "Sneaker", "Bag"}
    assert all(len(r["top_k"]) == 3 and 0 < r["confidence"] <= 1 for r in rows)
    assert printed.count("percent confidence.") == 12
    assert json.loads(printed[printed.index("{"):])["count"] == 12


def help_sections(text: str) -> dict[str, str]:
    """argparse's help split into its groups: title -> the group's lines."""
    sections, title = {}, ""
    for line in text.splitlines():
        if line and not line.startswith(" ") and line.endswith(":"):
            title = line[:-1]
            sections[title] = ""
        elif title:
            sections[title] += line + "\n"
    return sections


@pytest.mark.parametrize("verb", ["run", "compile", "schedule"])
def test_help_shows_each_parameters_help_and_choices_grouped_by_step(verb, capsys, monkeypatch):
    from components import augment, params
    from components.registry import REGISTRIES
    from components.train import models, recipes

    monkeypatch.setenv("COLUMNS", "2000")  # one line per flag: no wrapping inside the phrases asserted on
    with pytest.raises(SystemExit) as exit_info:
        cli.main([verb, "--help"])
    assert exit_info.value.code == 0
    sections = help_sections(capsys.readouterr().out)
    groups = {step: sections[f"pipeline parameters, {title}"] for step, title in params.STEPS.items()}
    flags = {}
    for step, lines in groups.items():
        for entry in ("\n" + lines).split("\n  --")[1:]:  # a flag, then its help (on the next line after a long one)
            flag, _, text = entry.partition(" ")
            flags["--" + flag.strip()] = (step, " ".join(text.split()))
    # Every parameter of the pipeline, once, in the group of the step that reads it, with the table's help.
    assert set(flags) == {"--" + name.replace("_", "-") for name in params.PARAMETERS}
    for name, param in params.PARAMETERS.items():
        step, text = flags["--" + name.replace("_", "-")]
        assert step == param.step and param.help in text, (name, text)
    assert "Choices: " + ", ".join(models.MODELS) + "; or module:function. Default: 'reference-cnn'." \
        in flags["--model"][1]
    assert f"Choices: {', '.join(sorted(recipes.RECIPES))}. Default: 'fast'." in flags["--recipe"][1]
    assert f"Choices: {', '.join(REGISTRIES)}." in flags["--registry"][1]
    assert f"Choices: {', '.join(sorted(augment.PRESETS))}; or a JSON policy" in flags["--augment-policy"][1]
    assert "Choices: offline, online." in flags["--augment-mode"][1]
    assert "Choices: local, dataflow." in flags["--preprocess-runner"][1]
    assert "Choices: 1, 3. Default: 1." in flags["--channels"][1]
    assert flags["--min-accuracy"] == ("evaluate", f"FLOAT {params.PARAMETERS['min_accuracy'].help} Default: 0.88.")
    assert flags["--train-spot"][1].startswith("BOOL ")
