"""Dependencies run one way: no import circles between the project's files, imports inside functions included.

A lazy import that closes a circle is still a circle (a module that cannot be understood, or moved, without the
one that imports it back), so every `import` statement counts wherever it stands. Importing a package's module
runs the package's __init__, but that edge is the package's own business and is not counted (as the before-stop
check does)."""

from __future__ import annotations

import ast
import os
import textwrap

from tests.conftest import REPO_ROOT

PACKAGES = ("components", "pipelines")


def import_graph(root: str, packages=PACKAGES) -> dict[str, set[str]]:
    """module -> the project's modules it imports anywhere in its body (relative imports resolved)."""
    modules: dict[str, set[str]] = {}
    for package in packages:
        for directory, _, files in os.walk(os.path.join(root, package)):
            for file in files:
                if not file.endswith(".py"):
                    continue
                path = os.path.join(directory, file)
                name = os.path.relpath(path, root)[:-3].replace(os.sep, ".").removesuffix(".__init__")
                is_package = file == "__init__.py"
                imported = set()
                with open(path) as f:
                    tree = ast.parse(f.read(), path)
                for node in ast.walk(tree):
                    if isinstance(node, ast.Import):
                        imported.update(alias.name for alias in node.names)
                    elif isinstance(node, ast.ImportFrom):
                        base = node.module or ""
                        if node.level:
                            parts = name.split(".")[:len(name.split(".")) - node.level + is_package]
                            base = ".".join(parts + ([base] if base else []))
                        imported.add(base)
                        imported.update(f"{base}.{alias.name}" for alias in node.names)
                modules[name] = imported
    return {name: {other for other in imported if other in modules and other != name
                   and not name.startswith(other + ".")}
            for name, imported in modules.items()}


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The groups of modules that import each other, directly or around a loop (Tarjan's strongly connected
    components of more than one module), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        for other in sorted(graph[module]):
            if other not in index:
                visit(other)
                low[module] = min(low[module], low[other])
            elif other in on_stack:
                low[module] = min(low[module], index[other])
        if low[module] == index[module]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == module:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return sorted(found)


def write_package(root, files: dict[str, str]) -> None:
    for path, text in files.items():
        target = root / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(textwrap.dedent(text))


def test_the_detector_finds_a_circle_closed_by_an_import_inside_a_function(tmp_path):
    write_package(tmp_path, {
        "components/__init__.py": "",
        "components/table.py": ("def check(value):\n    from components.step import vocabulary\n\n"
                                "    return value in vocabulary\n"),
        "components/step.py": "from components import table\nvocabulary = ('a',)\n",
        "components/helpers/__init__.py": "",
        "components/helpers/a.py": "from . import b\n",
        "components/helpers/b.py": "def f():\n    from .a import g\n",
        "components/leaf.py": "import os\nfrom components import table\n",
        "pipelines/__init__.py": "",
        "pipelines/top.py": "from components import leaf, step\n",
    })
    graph = import_graph(str(tmp_path))
    assert graph["components.table"] == {"components.step"}
    assert graph["components.helpers.b"] == {"components.helpers.a"}
    assert circles(graph) == [["components.helpers.a", "components.helpers.b"], ["components.step", "components.table"]]


def test_the_detector_passes_dependencies_that_run_one_way(tmp_path):
    write_package(tmp_path, {
        "components/__init__.py": "",
        "components/table.py": "CHOICES = ('a',)\n",
        "components/step.py": "from components import table\n\ndef run():\n    from components.table import CHOICES\n",
        "components/sub/__init__.py": "from components.sub.inner import x\n",
        "components/sub/inner.py": "import components.sub\nfrom components import step\nx = 1\n",
        "pipelines/__init__.py": "",
        "pipelines/top.py": "from components import step, table\n",
    })
    graph = import_graph(str(tmp_path))
    assert graph["pipelines.top"] == {"components", "components.step", "components.table"}
    assert circles(graph) == []


def test_the_project_has_no_import_circles():
    graph = import_graph(REPO_ROOT)
    assert "components.params" in graph and graph["components.augment"]  # it read the real tree
    assert circles(graph) == []


def test_the_parameter_table_imports_nothing_of_the_project():
    # Every layer reads it: anything it imported would sit both below and above it.
    assert import_graph(REPO_ROOT)["components.params"] == set()


def test_components_import_nothing_from_pipelines():
    graph = import_graph(REPO_ROOT)
    upward = {(module, other) for module, imported in graph.items() if module.startswith("components")
              for other in imported if other.startswith("pipelines")}
    assert upward == set()


# pipelines/ by room: what each may import of pipelines/ besides itself. The CLI sits on top; the models of what a
# KFP backend does sit at the bottom with the pipeline itself; nothing below imports the CLI, and the hosts, Vertex
# AI and the local run never import one another.
PIPELINES_ROOMS = {
    "cli": ("pipelines.cli", "pipelines.parameters", "pipelines.weights"),
    "pipeline": ("pipelines.training", "pipelines.config"),
    "cron": ("pipelines.cron",),
    "hosts": ("pipelines.hosts",),
    "backend": ("pipelines.backend",),
    "vertexai": ("pipelines.vertexai",),
    "local": ("pipelines.local",),
}
PIPELINES_MAY_IMPORT = {
    "cli": {"pipeline", "cron", "hosts", "backend", "vertexai", "local"},
    "pipeline": set(),
    "cron": set(),
    "hosts": {"backend", "cron"},
    "backend": set(),
    "vertexai": {"cron"},
    "local": set(),
}


def pipelines_room(module: str) -> str | None:
    for room, prefixes in PIPELINES_ROOMS.items():
        if any(module == p or module.startswith(p + ".") for p in prefixes):
            return room
    return None


def test_every_module_of_pipelines_has_a_room():
    graph = import_graph(REPO_ROOT)
    homeless = {m for m in graph if m.startswith("pipelines.") and pipelines_room(m) is None}
    assert homeless == set(), "place each in a room of PIPELINES_ROOMS (and say what it may import)"
    assert pipelines_room("pipelines.backend.kfp_driver") == "backend"  # it read the real tree
    assert "pipelines.backend.kfp_driver" in graph and "pipelines.hosts.publish" in graph


def test_pipelines_rooms_import_one_way():
    graph = import_graph(REPO_ROOT)
    wrong = {(module, other) for module, imported in graph.items() if module.startswith("pipelines.")
             for other in imported if other.startswith("pipelines.")
             and pipelines_room(other) not in PIPELINES_MAY_IMPORT[pipelines_room(module)] | {pipelines_room(module)}}
    assert wrong == set()


def test_the_room_rule_catches_a_model_that_imports_the_cli(tmp_path):
    write_package(tmp_path, {
        "components/__init__.py": "",
        "pipelines/__init__.py": "",
        "pipelines/cli.py": "from pipelines.backend import kfp_driver\n",
        "pipelines/backend/__init__.py": "",
        "pipelines/backend/kfp_driver.py": "def f():\n    from pipelines import cli\n",
    })
    graph = import_graph(str(tmp_path))
    assert graph["pipelines.backend.kfp_driver"] == {"pipelines.cli"}
    module, other = "pipelines.backend.kfp_driver", "pipelines.cli"
    assert pipelines_room(other) not in PIPELINES_MAY_IMPORT[pipelines_room(module)]


# What the data layer (components/dataio/) may import from the rest of the project: the parameter table every layer
# reads, and the GPU driver check (with the exit codes it stops with) that loading a TorchScript model runs first.
# Nothing of a step: every step reads its data through this package, so the package cannot lean on one.
DATA_LAYER_MAY_IMPORT = {"components.params", "components.gpu_driver", "components.stepcli"}


def test_the_data_layer_imports_no_step():
    graph = import_graph(REPO_ROOT)
    layer = {module for module in graph if module == "components.dataio" or module.startswith("components.dataio.")}
    assert {"components.dataio.storage", "components.dataio.records", "components.dataio.data"} <= layer
    outside = {(module, other) for module in layer for other in graph[module] - layer}
    assert {other for _, other in outside} <= DATA_LAYER_MAY_IMPORT, sorted(outside)
    # and what it may import reaches nothing else of the project either
    for other in DATA_LAYER_MAY_IMPORT:
        assert graph[other] <= DATA_LAYER_MAY_IMPORT, (other, graph[other])


def test_the_data_helpers_sit_in_the_data_layer_only():
    # A newcomer opening components/ sees the steps and one folder of data helpers: none beside the steps.
    helpers = ("augment_numpy", "data", "datadir", "gcs", "images", "pixels", "records", "storage")
    top = set(os.listdir(os.path.join(REPO_ROOT, "components")))
    assert {f"{name}.py" for name in helpers} & top == set()
    assert {f"{name}.py" for name in helpers} <= set(os.listdir(os.path.join(REPO_ROOT, "components", "dataio")))
