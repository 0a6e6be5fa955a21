"""The launchers' framework seam: each framework's launch facts live in its own module under
components/launch/frameworks/, complete, and the launchers read them instead of asking which framework runs.

What the facts make of a job (the manifests, the node variables on each platform) is checked in
tests/test_launch_frameworks.py and tests/test_trainjob.py; here, that the seam holds."""

from __future__ import annotations

import ast
import os

import pytest

from components.launch import frameworks, node, trainjob, training
from components.launch.frameworks.base import COMMON_LAUNCHERS, LaunchFacts
from components.params import FRAMEWORKS
from tests.conftest import REPO_ROOT

LAUNCH = os.path.join(REPO_ROOT, "components", "launch")
FACTS_PACKAGE = os.path.join(LAUNCH, "frameworks")
# Strings that spell a framework's name but name something else: the container the Training Operator looks for in a
# TFJob, and Trainer v2's MLPolicySource members (which the runtime check reads from a runtime).
NOT_FRAMEWORKS = {("tfjob.py", "CONTAINER_NAME"), ("trainjob.py", "FRAMEWORK_POLICIES")}


def _docstrings(tree: ast.AST) -> set[int]:
    return {id(body[0].value) for node in ast.walk(tree)
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
            for body in [node.body] if body and isinstance(body[0], ast.Expr)
            and isinstance(body[0].value, ast.Constant)}


def _names_framework(node: ast.AST) -> bool:
    return (isinstance(node, ast.Name) and node.id == "framework") or \
        (isinstance(node, ast.Attribute) and node.attr == "framework")


def _literal_strings(node: ast.AST) -> bool:
    if isinstance(node, ast.Constant):
        return isinstance(node.value, str)
    return isinstance(node, (ast.Tuple, ast.List, ast.Set)) and bool(node.elts) and all(map(_literal_strings,
                                                                                             node.elts))


def framework_branches(source: str, file: str) -> list[str]:
    """Where `source` (a launcher module) asks which framework runs: a framework's name spelled out (outside
    docstrings and NOT_FRAMEWORKS), or a framework compared with a literal (`job.framework == "mxnet"`)."""
    tree = ast.parse(source, file)
    docstrings, found = _docstrings(tree), []
    exempt = set()
    for statement in tree.body:
        targets = statement.targets if isinstance(statement, ast.Assign) else \
            [statement.target] if isinstance(statement, ast.AnnAssign) else []
        if any(isinstance(t, ast.Name) and (file, t.id) in NOT_FRAMEWORKS for t in targets):
            exempt.update(id(node) for node in ast.walk(statement))
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and node.value in FRAMEWORKS and id(node) not in docstrings | exempt:
            found.append(f"{file}:{node.lineno} names {node.value!r}")
        elif isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            if any(map(_names_framework, operands)) and any(map(_literal_strings, operands)):
                found.append(f"{file}:{node.lineno} compares a framework with a literal")
    return found


def launcher_modules() -> list[str]:
    paths = []
    for directory, _, files in os.walk(LAUNCH):
        if os.path.commonpath([directory, FACTS_PACKAGE]) == FACTS_PACKAGE:
            continue
        paths += [os.path.join(directory, file) for file in sorted(files) if file.endswith(".py")]
    return paths


def test_no_launcher_asks_which_framework_runs():
    paths = launcher_modules()
    assert {"trainjob.py", "jobset.py", "node.py", "vertex.py", "tfjob.py", "pytorchjob.py", "cli.py",
            "training.py"} <= {os.path.basename(path) for path in paths}
    found = []
    for path in paths:
        with open(path) as f:
            found += framework_branches(f.read(), os.path.relpath(path, LAUNCH))
    assert not found, ("a launcher asks which framework runs; put the fact in the framework's module under "
                       "components/launch/frameworks/ and read it there:\n" + "\n".join(found))


@pytest.mark.parametrize("source, expected", [
    ('if job.framework == "torch":\n    pass\n', ["x.py:1 compares a framework with a literal", "x.py:1 names "
                                                                                                    "'torch'"]),
    ('if framework in ("mxnet", "paddle"):\n    pass\n', ["x.py:1 compares a framework with a literal"]),
    ('RUNTIMES = {"jax": "jax-multinode"}\n', ["x.py:1 names 'jax'"]),
    ('"""tensorflow"""\nparser.add_argument("--framework", choices=("torch", "jax"))\n',
     ["x.py:2 names 'torch'", "x.py:2 names 'jax'"]),
    ('if framework != launch.framework or framework not in FRAMEWORKS:\n    pass\n', []),
])
def test_the_scan_finds_a_framework_branch(source, expected):
    assert framework_branches(source, "x.py") == expected


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_each_framework_has_complete_launch_facts(framework):
    facts = frameworks.setup(framework)
    assert isinstance(facts, LaunchFacts) and facts.name == framework
    assert facts.training and os.path.isfile(os.path.join(REPO_ROOT, trainjob.runtime_file(framework)))
    # Its nodes meet on every platform: Trainer's policy or the TrainJob's own variables, the JobSet's variables,
    # and on Vertex AI (which sets only TF_CONFIG and CLUSTER_SPEC) node.py's rendezvous from CLUSTER_SPEC.
    assert facts.trainer_policy in ("", *trainjob.FRAMEWORK_POLICIES)
    assert bool(facts.trainer_policy) != bool(facts.trainjob_env("job", 2, 1))
    jobset_env = [var["name"] for var in facts.jobset_env("job", 2, 1)]
    assert jobset_env and len(set(jobset_env)) == len(jobset_env)
    port_name, port = facts.node_port
    assert port_name and 0 < port < 65536
    assert facts.node_runner in ("", *node.NODE_RUNNERS)
    if facts.node_runner:
        spec = {"cluster": {"workerpool0": ["primary:2222"], "workerpool1": ["worker:2222"]},
                "task": {"type": "workerpool1", "index": 0}}
        assert list(node.framework_env(framework, spec, 1)) == jobset_env  # the same names on Vertex AI
        assert facts.node_command(["python", "-m", "components.train"])[1:3] == ["-m", "components.launch.node"]
    else:
        with pytest.raises(ValueError, match=f"no node variables for framework '{framework}'"):
            node.framework_env(framework, {}, 1)
    if facts.process_count_env:  # the process count is part of the rendezvous torchrun reads
        assert facts.process_count_env in jobset_env
        assert facts.process_env(4) == {facts.process_count_env: "4"}
    else:
        assert facts.process_env(4) == {}
    assert set(facts.legacy_launchers) <= set(training.KUBERNETES_LAUNCHERS) - set(COMMON_LAUNCHERS)
    assert set(facts.launchers) <= set(training.LAUNCHERS)


def test_every_launcher_runs_some_framework():
    runs = {launcher for framework in FRAMEWORKS for launcher in frameworks.setup(framework).launchers}
    assert runs == set(training.LAUNCHERS)
    assert training.LAUNCHER_FRAMEWORKS == {"tfjob": ("tensorflow",), "pytorchjob": ("torch",)}
    assert trainjob.RUNTIMES == {"tensorflow": "tensorflow-multiworker", "torch": "torch-multinode",
                                 "jax": "jax-multinode"}
    assert frameworks.node_frameworks() == ("torch", "jax")
