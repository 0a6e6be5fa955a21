"""Two runs at once: registration crowns only the model the gate preferred.

Tried as a new user would: two local runs into one registry, both evaluated while there was no champion, both
blessed against nothing, and the later registration moved `champion` to a model the gate never compared with the
earlier one. Here evaluations and registrations race against one registry (threads, processes), and the champion
must end on the model the gate prefers, with each registration saying what it did.
"""

import html
import json
import os
import shutil
import subprocess
import sys
import threading

import numpy as np
import pytest

from components.evaluate import Evaluation, evaluate, rejudge, score
from components.register import Gate, evaluation_metrics, gate_from_evaluation, register
from components.registry import CHAMPION, ChampionChanged, LocalRegistry
from tests.conftest import REPO_ROOT, accuracy_of

NAMES = ["zero", "one", "two", "three"]
TEST_SET = "sha256:" + "7" * 64


def evaluation_with(correct: int, *, test_set: str = TEST_SET, compared_with: str | None = None,
                    tolerance: float = 0.0) -> dict:
    """An evaluation's JSON as the evaluate step writes it: `correct` of 1000 balanced test images right."""
    labels = np.arange(1000) % 4
    predicted = labels.copy()
    predicted[:1000 - correct] = (labels[:1000 - correct] + 1) % 4
    probabilities = np.full((1000, 4), 0.1)
    probabilities[np.arange(1000), predicted] = 0.7
    scores = score(probabilities, labels, 4)
    result = Evaluation(NAMES, scores, True, [], "blessed", None, [], compared_with=compared_with, test_set=test_set,
                        gate={"min_accuracy": 0.5, "min_class_recall": None, "tolerance": tolerance})
    return json.loads(json.dumps(result.to_json()))


def make_model(root, name: str) -> str:
    path = root / name
    (path / "saved_model").mkdir(parents=True)
    (path / "saved_model" / "saved_model.pb").write_bytes(name.encode())
    (path / "training.json").write_text(json.dumps({"class_names": NAMES}))
    return str(path)


def champion_of(registry: LocalRegistry) -> str | None:
    champion = registry.champion("clf")
    return champion.version if champion else None


# -- the gate again, against a champion that changed --------------------------------------------------------------


def test_rejudge_compares_the_recorded_accuracy_only_on_the_same_test_set():
    challenger = evaluation_with(933)
    better = {"accuracy": 0.967, "test_set": TEST_SET}
    assert rejudge(challenger, "1", better) == (False, "not blessed: 0.933 >= 0.50 but < champion v1 0.967 - 0.00")
    worse = {"accuracy": 0.9, "test_set": TEST_SET}
    assert rejudge(challenger, "4", worse) == (True, "blessed: 0.933 >= 0.50 and >= champion v4 0.900 - 0.00")
    # Within the run's own tolerance, as evaluation would have judged it.
    assert rejudge(evaluation_with(933, tolerance=0.05), "1", better)[0] is True

    other = rejudge(challenger, "2", {"accuracy": 0.1, "test_set": "sha256:" + "8" * 64})
    assert other == (None, "champion v2 was not scored on this run's test set (its recorded test set differs)")
    older = rejudge(challenger, "3", {"accuracy": 0.1})  # registered before test sets were recorded
    assert older == (None, "champion v3 was not scored on this run's test set (its recorded test set is unknown)")
    # The champion was removed by hand: the thresholds alone decide, as with no champion at evaluation.
    assert rejudge(challenger, None, None) == (True, "blessed: 0.933 >= 0.50 (no champion yet)")


def test_registration_records_the_test_set_with_the_metrics(tmp_path):
    registry = LocalRegistry(str(tmp_path / "registry"))
    evaluation = evaluation_with(950)
    registered = register(make_model(tmp_path, "m1"), registry, model_name="clf",
                          metrics=evaluation_metrics(evaluation), gate=gate_from_evaluation(evaluation))
    assert registered.version.metrics["test_set"] == TEST_SET
    assert registered.version.metrics["accuracy"] == pytest.approx(0.95)
    assert registered.promotion == "champion moved to v1 (no champion, as at evaluation)"
    assert (registered.champion, registered.champion_changed) == ("1", False)


# -- the local registry: one check-and-move under its lock --------------------------------------------------------


def test_local_check_and_move_is_one_step_under_the_lock(tmp_path):
    root = str(tmp_path / "registry")
    versions = [LocalRegistry(root).upload("clf", make_model(tmp_path, f"m{i}"), digest=f"sha256:{i}", metrics={},
                                           labels={}).version for i in range(8)]
    start = threading.Barrier(len(versions))
    outcomes: dict[str, object] = {}

    def move(version: str) -> None:
        registry = LocalRegistry(root)  # each its own handle, as each run's register step has
        start.wait()
        try:
            outcomes[version] = registry.move_champion("clf", version, expected=None)
        except ChampionChanged as changed:
            outcomes[version] = changed

    threads = [threading.Thread(target=move, args=(v,)) for v in versions]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    winners = [v for v, outcome in outcomes.items() if not isinstance(outcome, ChampionChanged)]
    assert len(winners) == 1 and champion_of(LocalRegistry(root)) == winners[0]
    # Every other one was told who holds it; none moved it.
    assert {outcome.current.version for outcome in outcomes.values() if isinstance(outcome, ChampionChanged)} \
        == {winners[0]}
    # The version that already holds it is returned as it is (a retried register task), whatever was expected.
    assert LocalRegistry(root).move_champion("clf", winners[0], expected="5").version == winners[0]


def test_processes_racing_crown_the_model_the_gate_prefers(tmp_path):
    """Three register steps at once (`python -m components.register --evaluation`), each evaluated while there was
    no champion: whatever the order, the champion ends on the best, and each one says what it did."""
    root = str(tmp_path / "registry")
    accuracies = {"m80": 800, "m95": 950, "m90": 900}
    commands = []
    for name, correct in accuracies.items():
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps(evaluation_with(correct)))
        commands.append([sys.executable, "-m", "components.register", "--model-dir", make_model(tmp_path, name),
                         "--registry-root", root, "--model-name", "clf", "--evaluation", str(path)])
    env = {**os.environ, "PYTHONPATH": REPO_ROOT}
    processes = [subprocess.Popen(c, cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  text=True) for c in commands]
    results = {}
    for name, process in zip(accuracies, processes):
        out, err = process.communicate(timeout=120)
        assert process.returncode == 0, err
        results[name] = json.loads(out)
    registry = LocalRegistry(root)
    best = results["m95"]["version"]
    assert champion_of(registry) == best
    assert registry.champion("clf").metrics["accuracy"] == pytest.approx(0.95)
    for name, result in results.items():
        if name == "m95":
            assert result["promotion"].endswith(f"champion moved to v{best}" + (
                "" if result["champion_changed"] else " (no champion, as at evaluation)"))
        elif CHAMPION not in result["aliases"]:
            # It lost the alias to a better one, or never got it: then it says so.
            assert result["champion_changed"] and result["promotion"].endswith(
                f"registered v{result['version']} without the champion alias"), result["promotion"]
            assert "but < champion v" in result["promotion"]


# -- two real evaluations racing against one registry --------------------------------------------------------------


@pytest.fixture(scope="module")
def weaker_model(tiny_model, small_dataset, tmp_path_factory) -> str:
    """tiny_model with noise added to its output layer's weights: the same classes, a lower accuracy."""
    import keras

    out = tmp_path_factory.mktemp("weaker_model")
    shutil.copy(os.path.join(tiny_model, "training.json"), out / "training.json")
    model = keras.models.load_model(os.path.join(tiny_model, "model.keras"), compile=False)
    kernel, bias = model.layers[-1].get_weights()
    noise = np.random.default_rng(0).normal(0.0, 1.5 * float(np.abs(kernel).mean()), kernel.shape)
    model.layers[-1].set_weights([kernel + noise.astype(kernel.dtype), bias])
    model.save(str(out / "model.keras"))
    assert 0.3 < accuracy_of(str(out), small_dataset) < accuracy_of(tiny_model, small_dataset) - 0.02
    return str(out)


def evaluated(model_dir: str, dataset: str, registry: LocalRegistry) -> dict:
    """What the evaluate step does: score against the registry's champion now; its JSON, as register reads it."""
    champion = registry.champion("clf")
    result = evaluate(model_dir, dataset, min_accuracy=0.3, champion_model_dir=champion.uri if champion else None,
                      champion_version=champion.version if champion else "")
    return json.loads(json.dumps(result.to_json()))


def register_step(model_dir: str, evaluation: dict, registry: LocalRegistry):
    return register(model_dir, registry, model_name="clf", metrics=evaluation_metrics(evaluation),
                    gate=gate_from_evaluation(evaluation))


@pytest.mark.parametrize("order", ["better first", "weaker first", "at once"])
def test_two_evaluations_racing_against_one_registry(order, tiny_model, weaker_model, small_dataset, tmp_path):
    registry = LocalRegistry(str(tmp_path / "registry"))
    # Both evaluations run before either registers: both find no champion, both are blessed against nothing.
    better, weaker = evaluated(tiny_model, small_dataset, registry), evaluated(weaker_model, small_dataset, registry)
    assert better["blessed"] and weaker["blessed"]
    assert better["compared_with"] is None and weaker["compared_with"] is None
    assert better["test_set"] == weaker["test_set"]
    assert better["metrics"]["accuracy"] > weaker["metrics"]["accuracy"]

    runs = {"better": (tiny_model, better), "weaker": (weaker_model, weaker)}
    results = {}
    if order == "at once":
        start = threading.Barrier(2)

        def run(name):
            start.wait()
            results[name] = register_step(*runs[name], LocalRegistry(registry.root))

        threads = [threading.Thread(target=run, args=(name,)) for name in runs]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    else:
        for name in (["better", "weaker"] if order == "better first" else ["weaker", "better"]):
            results[name] = register_step(*runs[name], registry)

    # The champion is the model the gate prefers, whichever registered first.
    assert champion_of(registry) == results["better"].version.version == results["better"].champion
    weaker_line, better_line = results["weaker"].promotion, results["better"].promotion
    b, w = results["better"].version.version, results["weaker"].version.version
    acc_b, acc_w = better["metrics"]["accuracy"], weaker["metrics"]["accuracy"]
    if results["weaker"].champion_changed and not results["better"].champion_changed:  # the better one moved first
        assert better_line == f"champion moved to v{b} (no champion, as at evaluation)"
        assert weaker_line == (f"the champion became v{b} after evaluation (which found none); against v{b} on the "
                               f"same test set: not blessed: {acc_w:.3f} >= 0.30 but < champion v{b} {acc_b:.3f} "
                               f"- 0.00; registered v{w} without the champion alias")
        assert CHAMPION not in results["weaker"].version.aliases and results["weaker"].champion == b
    else:  # the weaker one moved first, and the better one took the champion from it
        assert order != "better first"
        assert weaker_line == f"champion moved to v{w} (no champion, as at evaluation)"
        assert better_line == (f"the champion became v{w} after evaluation (which found none); against v{w} on the "
                               f"same test set: blessed: {acc_b:.3f} >= 0.30 and >= champion v{w} {acc_w:.3f} "
                               f"- 0.00; champion moved to v{b}")
        assert results["better"].champion_changed and not results["weaker"].champion_changed


def test_a_champion_from_another_test_set_is_not_compared_and_keeps_the_alias(tiny_model, weaker_model,
                                                                               small_dataset, tmp_path):
    """The champion that took over was scored on other test data: comparing recorded accuracies would compare two
    test sets, so the model is registered without the alias, and the line says the gate never compared them."""
    registry = LocalRegistry(str(tmp_path / "registry"))
    better = evaluated(tiny_model, small_dataset, registry)
    other = evaluation_with(700, test_set="sha256:" + "9" * 64)
    first = register(make_model(tmp_path, "other"), registry, model_name="clf", metrics=evaluation_metrics(other),
                     gate=gate_from_evaluation(other))
    assert first.champion == "1"
    second = register_step(tiny_model, better, registry)
    assert second.promotion == ("the champion became v1 after evaluation (which found none); champion v1 was not "
                                "scored on this run's test set (its recorded test set differs); registered v2 "
                                "without the champion alias (the gate never compared it with v1)")
    assert champion_of(registry) == "1" and second.champion_changed


def test_without_a_gate_the_champion_moves_as_asked(tmp_path):
    """A person promoting by hand (no evaluation given): the alias moves, whoever holds it."""
    registry = LocalRegistry(str(tmp_path / "registry"))
    register(make_model(tmp_path, "m1"), registry, model_name="clf")
    second = register(make_model(tmp_path, "m2"), registry, model_name="clf")
    assert (second.promotion, champion_of(registry)) == ("champion moved to v2", "2")
    changed = register(make_model(tmp_path, "m3"), registry, model_name="clf", gate=Gate("1"))
    assert changed.promotion == ("the champion became v2 after evaluation (which compared with v1); registered v3 "
                                 "without the champion alias (the gate never compared it with v2)")


def test_a_champion_removed_after_evaluation_leaves_the_thresholds_to_decide(tmp_path):
    registry = LocalRegistry(str(tmp_path / "registry"))
    register(make_model(tmp_path, "m1"), registry, model_name="clf")
    index_path = tmp_path / "registry" / "clf" / "index.json"
    index = json.loads(index_path.read_text())
    index["versions"][0]["aliases"] = ["default"]  # a person took the alias away
    index_path.write_text(json.dumps(index))
    evaluation = evaluation_with(900, compared_with="1")
    second = register(make_model(tmp_path, "m2"), registry, model_name="clf", metrics=evaluation_metrics(evaluation),
                      gate=gate_from_evaluation(evaluation))
    assert second.promotion == ("the champion became none after evaluation (which compared with v1); with no "
                                "champion: blessed: 0.900 >= 0.50 (no champion yet); champion moved to v2")
    assert champion_of(registry) == "2"


# -- what a run shows: the step's end line, the summary's decision line, the run page -------------------------------


def test_the_register_steps_line_and_the_run_page_say_the_champion_was_kept():
    from pipelines.local import runpage, steplogs

    promotion = ("the champion became v1 after evaluation (which found none); against v1 on the same test set: not "
                 "blessed: 0.933 >= 0.50 but < champion v1 0.967 - 0.00; registered v2 without the champion alias")
    outputs = {"artifacts": {"registration": {"artifacts": [{"metadata": {
        "registry": "local", "model": "clf", "version": "2", "new_version": True, "promotion": promotion,
        "champion_changed": True}}]}}}
    assert steplogs.key_figures("register", outputs) == f"clf version 2 (local registry); {promotion}"
    moved = json.loads(json.dumps(outputs).replace('"champion_changed": true', '"champion_changed": false'))
    assert steplogs.key_figures("register", moved) == "clf version 2 (local registry)"

    summary = {"test_accuracy": 0.933, "test_loss": 0.2, "train_seconds": 1.0, "blessed": True,
               "images": {"train": 1, "validation": 1, "test": 1, "rejected": 0}, "artifacts": {}, "run_dir": "r",
               "decision": f"blessed: 0.933 >= 0.50 (no champion yet); at registration: {promotion}",
               "registered": {"registry": "local", "model": "clf", "version": "2", "aliases": [],
                              "promotion": promotion, "champion_changed": True, "champion": "1"},
               "predictions": {"path": "none.jsonl", "count": 0, "errors": 0}}
    page = runpage.render(summary, "out")
    # Blessed, but not the champion: the banner is not green, and a card names the champion that was kept.
    assert f"<p class='decision no'>{html.escape(summary['decision'])}</p>" in page
    assert "<b>v1</b><span>champion, kept: another run&#x27;s model took it after evaluation" in page
    summary["registered"].update(aliases=["champion"], champion="2", champion_changed=False)
    page = runpage.render(summary, "out")
    assert "<p class='decision ok'>" in page and "kept" not in page


# -- two local pipeline runs at once, into one registry ------------------------------------------------------------


@pytest.mark.slow
def test_two_local_runs_at_once_crown_the_model_the_gate_prefers(fashion_dir, tmp_path):
    """Two `pipectl run --local` at once, one registry, models of different accuracy (2 and 3 epochs). The test holds
    the registry's lock (as a third writer would) until both runs have evaluated, so both evaluations find no
    champion, as in the report; then both register at once. The champion must be the better model, and the run
    whose registration found the champion changed says so on its decision line, its console and its run page."""
    import fcntl
    import time

    base = tmp_path
    (base / "registry" / "image-classifier").mkdir(parents=True)
    lock = open(base / "registry" / "image-classifier" / ".lock", "w")  # LocalRegistry's lock file
    fcntl.flock(lock, fcntl.LOCK_EX)
    runs = {}
    for name, epochs in (("two", 2), ("three", 3)):
        runs[name] = subprocess.Popen(
            [sys.executable, "-m", "pipelines.cli", "run", "--local", "--output-dir", str(base / name),
             "--limit=600", f"--epochs={epochs}", "--min-accuracy=0.3", "--tolerance=0"], cwd=REPO_ROOT,
            env={**os.environ, "PYTHONPATH": REPO_ROOT}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 1200
        evaluated = {}
        while len(evaluated) < 2:
            for name in runs:
                found = list((base / name / "pipeline_root").glob("*/evaluate-op/evaluation"))
                if found and name not in evaluated:
                    evaluated[name] = json.loads(found[0].read_text())
                assert runs[name].poll() is None, runs[name].communicate()[0][-3000:]
            assert time.monotonic() < deadline, "the runs did not evaluate in 20 minutes"
            time.sleep(2)
    finally:
        fcntl.flock(lock, fcntl.LOCK_UN)
        lock.close()
    consoles = {name: run.communicate(timeout=1200)[0] for name, run in runs.items()}
    for name, run in runs.items():
        assert run.returncode == 0, consoles[name][-3000:]
    assert all(e["compared_with"] is None and e["blessed"] for e in evaluated.values())  # both blessed against none
    summaries = {name: json.loads((base / name / "summary.json").read_text()) for name in runs}

    index = json.loads((base / "registry" / "image-classifier" / "index.json").read_text())
    (champion,) = [v for v in index["versions"] if "champion" in v["aliases"]]
    best = max(summaries.values(), key=lambda s: s["test_accuracy"])
    assert champion["version"] == best["registered"]["version"]
    assert champion["metrics"]["accuracy"] == best["test_accuracy"]

    changed = [name for name, s in summaries.items() if s["registered"]["champion_changed"]]
    assert len(changed) == 1  # the second to register found the first one's model as champion
    summary, console = summaries[changed[0]], consoles[changed[0]]
    assert "; at registration: the champion became v" in summary["decision"]
    assert summary["decision"].endswith(("without the champion alias", f"champion moved to v{champion['version']}"))
    assert f"decision         {summary['decision']}" in console
    page = (base / changed[0] / "index.html").read_text()
    assert html.escape(summary["decision"]) in page
