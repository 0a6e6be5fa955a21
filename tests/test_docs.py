"""The README and docs/ stay true to the code: the README fits a first read and links every doc, every relative link
(and #anchor) resolves, and every `pipectl ...`, `make ...` and `make bench BENCH=...` command they show still parses
with the real argparse parser, Makefile and benchmark list.

Each check is a plain function returning what is wrong, so the tests below can also show that it finds a bad link,
an unknown verb or an unknown flag (a check that cannot fail proves nothing).
"""

import argparse
import contextlib
import io
import re
import shlex
from pathlib import Path

import pytest

from pipelines.cli import build_parser
from tests.benchmarks.__main__ import BENCHMARKS, ON_REQUEST

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
PAGES = [README, *DOCS]
README_MAX_LINES = 350

FENCE = re.compile(r"^```.*?^```[ \t]*$", re.M | re.S)
INLINE_CODE = re.compile(r"`([^`]+)`")
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
SHELL_END = {"|", "||", "&&", ";", ">", ">>", "2>", "&"}


def fenced_blocks(text: str) -> list[str]:
    return [block.split("\n", 1)[1].rsplit("\n", 1)[0] for block in FENCE.findall(text)]


def prose(text: str) -> str:
    """The text outside fenced blocks and inline code: where Markdown links are links."""
    return INLINE_CODE.sub("", FENCE.sub("", text))


def heading_anchors(text: str) -> set[str]:
    """The #anchors GitHub gives a page's headings: lower case, punctuation dropped, spaces to hyphens."""
    anchors = set()
    for line in FENCE.sub("", text).splitlines():
        match = re.match(r"#{1,6}\s+(.*)", line)
        if match:
            title = re.sub(r"[^\w\- ]", "", match.group(1).strip().lower())
            anchors.add(title.replace(" ", "-"))
    return anchors


def broken_links(page: Path) -> list[str]:
    """Relative links of PAGE whose file, or #anchor in it, does not exist."""
    broken = []
    for target in LINK.findall(prose(page.read_text())):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto:, ...
            continue
        path, _, anchor = target.partition("#")
        linked = (page.parent / path).resolve() if path else page
        if not linked.exists():
            broken.append(f"{page.name}: {target} (no such file)")
        elif anchor and linked.suffix == ".md" and anchor not in heading_anchors(linked.read_text()):
            broken.append(f"{page.name}: {target} (no heading with that anchor in {linked.name})")
    return broken


def shown_commands(text: str, program: str) -> list[str]:
    """Every command line of PROGRAM shown in TEXT: in fenced blocks (continuation lines joined) and in inline code.
    The program's name starts the line, after a `$ ` prompt or a path such as `.venv/bin/`, which are dropped."""
    candidates = []
    for block in fenced_blocks(text):
        candidates += block.replace("\\\n", " ").splitlines()
    candidates += [" ".join(code.split()) for code in INLINE_CODE.findall(FENCE.sub("", text))]
    commands = []
    for line in candidates:
        match = re.match(rf"(?:\$\s+)?(?:\S*/)?({re.escape(program)}(?:\s.*)?)$", line.strip())
        if match:
            commands.append(match.group(1))
    return commands


def subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    return next(a.choices for a in parser._actions if isinstance(a, argparse._SubParsersAction))


def pipectl_problems(command: str, parser: argparse.ArgumentParser) -> list[str]:
    """What in one shown `pipectl VERB ...` line the real parser does not know: the verb (a `run/schedule` names
    two), or a flag of that verb. Values, shell variables and `$(...)` are left as they are."""
    tokens = []
    for token in shlex.split(command, comments=True)[1:]:
        if token in SHELL_END:
            break
        tokens.append(token)
    if not tokens:
        return []  # `pipectl` named on its own
    verbs = subcommands(parser)
    problems = []
    for verb in tokens[0].split("/"):
        if verb not in verbs:
            problems.append(f"{command!r}: pipectl has no verb {verb!r} (it has {', '.join(verbs)})")
            continue
        known = verbs[verb]._option_string_actions
        for token in tokens[1:]:
            flag = token.split("=", 1)[0]
            if re.match(r"--?[A-Za-z]", flag) and flag not in known:
                problems.append(f"{command!r}: pipectl {verb} has no option {flag}")
    return problems


def make_targets() -> set[str]:
    return set(re.findall(r"^([A-Za-z][\w-]*):", (ROOT / "Makefile").read_text(), re.M))


def make_problems(command: str) -> list[str]:
    """A shown `make TARGET ... [BENCH="a b"]` whose target is not in the Makefile, or whose BENCH names no
    benchmark of tests/benchmarks."""
    problems = []
    tokens = shlex.split(command, comments=True)[1:]
    for token in tokens:
        if token in SHELL_END:
            break
        if token.startswith("BENCH="):
            unknown = set(token.removeprefix("BENCH=").split()) - set(BENCHMARKS) - set(ON_REQUEST)
            problems += [f"{command!r}: no benchmark {name!r}" for name in sorted(unknown)]
        elif "=" not in token and not token.startswith("-") and token not in make_targets():
            problems.append(f"{command!r}: the Makefile has no target {token!r}")
    return problems


# ------------------------------------------------------------------------------------------------ the checks


def test_the_readme_fits_a_first_read_and_keeps_the_quick_start():
    text = README.read_text()
    assert len(text.splitlines()) <= README_MAX_LINES
    assert "make run" in text and "make test" in text


def test_every_doc_is_linked_from_the_readme():
    linked = {(README.parent / t.partition("#")[0]).resolve() for t in LINK.findall(prose(README.read_text()))}
    assert DOCS, "docs/ holds no Markdown file"
    assert [doc.name for doc in DOCS if doc.resolve() not in linked] == []


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_relative_links_resolve(page):
    assert broken_links(page) == []


def test_every_pipectl_command_shown_parses():
    parser = build_parser()
    commands = [c for page in PAGES for c in shown_commands(page.read_text(), "pipectl")]
    # the README's quick reference alone shows compile, run and predict; a parse that finds nothing is a broken test
    assert len(commands) > 20
    assert [p for c in commands for p in pipectl_problems(c, parser)] == []


def test_pipectl_help_works_for_every_verb_shown():
    shown = {verb for page in PAGES for c in shown_commands(page.read_text(), "pipectl")
             for verb in (shlex.split(c, comments=True)[1:2] or [""])[0].split("/") if verb}
    assert {"compile", "run", "upload", "schedule", "predict", "weights"} <= shown
    for verb in sorted(shown):
        out = io.StringIO()
        with contextlib.redirect_stdout(out), pytest.raises(SystemExit) as exit_info:
            build_parser().parse_args([verb, "--help"])
        assert exit_info.value.code == 0, verb
        assert out.getvalue().startswith(f"usage: pipectl {verb}"), verb


def test_every_make_command_shown_names_a_target_and_benchmark():
    commands = [c for page in PAGES for c in shown_commands(page.read_text(), "make")]
    assert any(c.startswith("make bench BENCH=") for c in commands)
    assert [p for c in commands for p in make_problems(c)] == []


# -------------------------------------------------------------------------------- the checks can fail


def test_the_checks_find_a_broken_link_an_unknown_verb_and_an_unknown_flag(tmp_path):
    (tmp_path / "other.md").write_text("# Set-up on GKE: step 1\n")
    page = tmp_path / "page.md"
    page.write_text("[ok](other.md#set-up-on-gke-step-1) [gone](missing.md) [bad anchor](other.md#nowhere)\n"
                    "`[not a link](in-code.md)` [web](https://example.com/x.md)\n")
    assert broken_links(page) == ["page.md: missing.md (no such file)",
                                  "page.md: other.md#nowhere (no heading with that anchor in other.md)"]

    text = ("```sh\n.venv/bin/pipectl run --local \\\n  --no-such-flag 3   # a comment --not-a-flag\n"
            "$ pipectl frobnicate --x\n```\n"
            "and inline: `pipectl run/schedule --vertex --project \"my project\"`, `pipectl compile -o x.yaml`\n")
    commands = shown_commands(text, "pipectl")
    assert [" ".join(c.split()) for c in commands] == ["pipectl run --local --no-such-flag 3 # a comment --not-a-flag",
                                                       "pipectl frobnicate --x",
                                                       'pipectl run/schedule --vertex --project "my project"',
                                                       "pipectl compile -o x.yaml"]
    parser = build_parser()
    problems = [p for c in commands for p in pipectl_problems(c, parser)]
    assert len(problems) == 2
    assert "pipectl run has no option --no-such-flag" in problems[0]
    assert "pipectl has no verb 'frobnicate'" in problems[1]

    assert make_problems('make bench BENCH="train nosuch"') == [
        "'make bench BENCH=\"train nosuch\"': no benchmark 'nosuch'"]
    assert make_problems("make deploy") == ["'make deploy': the Makefile has no target 'deploy'"]
    assert make_problems('make test PYTEST_ARGS="-m \'not slow\'"') == []


SETUP_SCRIPT = ROOT / "docs" / "cluster-setup.sh"
SCRIPT_BLOCK = re.compile(r"^# >>> (\S+\.md): (.+?)\n(.*?)^# <<<$", re.M | re.S)


def setup_script_drift(script: str, docs: dict[str, str]) -> list[str]:
    """Where docs/cluster-setup.sh and the docs it is quoted in differ: a `# >>> DOC: title` block of the script that
    DOC does not show as a fenced block of its own, verbatim, and a fenced block of DOC that shares a command line
    with a block of the script but is not that block."""
    wrong = []
    blocks = [(doc, title, block.rstrip("\n")) for doc, title, block in SCRIPT_BLOCK.findall(script)]
    for doc, title, block in blocks:
        if block not in fenced_blocks(docs.get(doc, "")):
            wrong.append(f"{doc} does not quote docs/cluster-setup.sh's block {title!r} as a fenced block")
    for doc, text in docs.items():
        for shown in fenced_blocks(text):
            lines = {line for line in shown.splitlines() if line.strip() and not line.startswith("#")}
            for _, title, block in blocks:
                if shown != block and lines & set(block.splitlines()):
                    wrong.append(f"{doc}: a block shares lines with docs/cluster-setup.sh's {title!r} but differs "
                                 f"from it: {sorted(lines - set(block.splitlines()))[:3]}")
    return wrong


def test_the_setup_docs_quote_the_setup_script():
    script = SETUP_SCRIPT.read_text()
    named = {doc for doc, _, _ in SCRIPT_BLOCK.findall(script)}
    assert named == {"cluster-setup.md", "multi-node-training.md"}
    assert setup_script_drift(script, {name: (ROOT / "docs" / name).read_text() for name in named}) == []


def test_the_setup_script_check_finds_drift():
    script = SETUP_SCRIPT.read_text()
    docs = {name: (ROOT / "docs" / name).read_text() for name in ("cluster-setup.md", "multi-node-training.md")}
    # the script changes a command the doc shows
    changed = script.replace("--timeout=60s crd/applications.app.k8s.io", "--timeout=90s crd/applications.app.k8s.io")
    assert [w for w in setup_script_drift(changed, docs) if "3. Kubeflow Pipelines" in w]
    # the doc changes a line of a quoted block
    edited = dict(docs, **{"cluster-setup.md": docs["cluster-setup.md"].replace(
        "kubectl -n kubeflow annotate serviceaccount pipeline-runner --overwrite",
        "kubectl -n kubeflow annotate serviceaccount pipeline-runner")})
    assert len([w for w in setup_script_drift(script, edited) if "4. Storage" in w]) == 2
