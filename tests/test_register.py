"""The local registry: versions, the champion alias, idempotency on the model digest, atomic index."""

import json
import os
import threading

import pytest

from components.register import register
from components.registry import CHAMPION, LocalRegistry, model_digest, open_registry


def make_model(root, name, content):
    path = root / name
    (path / "saved_model").mkdir(parents=True)
    (path / "saved_model" / "saved_model.pb").write_bytes(content)
    (path / "training.json").write_text(json.dumps({"class_names": ["a", "b"]}))
    return str(path)


def test_versions_champion_and_digest_idempotency(tmp_path):
    registry = LocalRegistry(str(tmp_path / "registry"))
    first = register(make_model(tmp_path, "m1", b"one"), registry, model_name="clf", metrics={"accuracy": 0.9})
    assert first.new_version and first.version.version == "1"
    assert sorted(first.version.aliases) == ["champion", "default"]
    assert os.path.exists(os.path.join(first.version.uri, "saved_model", "saved_model.pb"))

    second = register(make_model(tmp_path, "m2", b"two"), registry, model_name="clf", metrics={"accuracy": 0.91})
    assert second.version.version == "2" and second.version.aliases == [CHAMPION]
    assert registry.champion("clf").version == "2"
    # The alias moved: version 1 kept its own id and lost `champion`.
    assert [(v.version, v.aliases) for v in registry.versions("clf")] == [("1", ["default"]), ("2", ["champion"])]

    retried = register(make_model(tmp_path, "m2-again", b"two"), registry, model_name="clf")
    assert not retried.new_version and retried.version.version == "2"
    assert len(registry.versions("clf")) == 2
    assert registry.champion("clf").metrics == {"accuracy": 0.91}


def test_without_promotion_the_champion_stays(tmp_path):
    registry = LocalRegistry(str(tmp_path / "registry"))
    register(make_model(tmp_path, "m1", b"one"), registry, model_name="clf")
    kept = register(make_model(tmp_path, "m2", b"two"), registry, model_name="clf", promote=False)
    assert kept.version.aliases == [] and registry.champion("clf").version == "1"


def test_concurrent_registrations_never_share_a_version(tmp_path):
    registry = LocalRegistry(str(tmp_path / "registry"))
    dirs = [make_model(tmp_path, f"m{i}", f"model {i}".encode()) for i in range(6)]
    threads = [threading.Thread(target=register, args=(d, registry), kwargs={"model_name": "clf"}) for d in dirs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    versions = registry.versions("clf")
    assert sorted(int(v.version) for v in versions) == [1, 2, 3, 4, 5, 6]
    assert len({v.digest for v in versions}) == 6
    assert sum(CHAMPION in v.aliases for v in versions) == 1
    assert not [n for n in os.listdir(tmp_path / "registry" / "clf") if n.startswith(".index-")]


def test_digest_covers_names_and_contents(tmp_path):
    a = make_model(tmp_path, "a", b"x")
    b = make_model(tmp_path, "b", b"x")
    assert model_digest(a) == model_digest(b)
    (tmp_path / "b" / "extra.txt").write_text("y")
    assert model_digest(a) != model_digest(b)


def test_clear_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="Model directory not found"):
        model_digest(str(tmp_path / "missing"))
    with pytest.raises(ValueError, match="registry=local needs a registry root"):
        open_registry("local")
    with pytest.raises(ValueError, match="Unknown registry 'mlflow'; known: local, vertex"):
        open_registry("mlflow", root=str(tmp_path))
    with pytest.raises(ValueError, match="use registry=vertex"):
        LocalRegistry("gs://bucket/registry")
    with pytest.raises(ValueError, match="Invalid model name"):
        LocalRegistry(str(tmp_path)).versions("../escape")


def test_registry_cli_shows_versions_and_champion(tmp_path, capsys):
    from components.registry.cli import main

    root = str(tmp_path / "registry")
    register(make_model(tmp_path, "m1", b"one"), LocalRegistry(root), model_name="clf")
    register(make_model(tmp_path, "m2", b"two"), LocalRegistry(root), model_name="clf", promote=False)
    assert main(["--registry-root", root, "--model-name", "clf"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert (shown["champion"], [v["version"] for v in shown["versions"]]) == ("1", ["1", "2"])
    assert main(["--registry", "vertex", "--model-name", "clf"]) == 2
    assert "registry=vertex needs a project and a location" in capsys.readouterr().err
