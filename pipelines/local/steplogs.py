"""A local run's output, one step at a time: each step's complete output in RUN_DIR/logs/<step>.log; on the
console one line when a step starts, one when it ends (state, elapsed time, its key figures), and in between only
the project's own progress lines.

How the output is captured
--------------------------
kfp.local's SubprocessRunner runs each task as a child process (`subprocess.Popen`, stdout and stderr into one
pipe) and copies the child's lines, as they come, to this process's `sys.stdout` (with `print`, indented by four
spaces), framed by its own log lines: "Executing task 'preprocess-op'", "Streamed logs:", then after the child
exits "Task 'preprocess-op' finished with status SUCCESS" and the task's outputs. It warns about each task's image
through `warnings` (stderr) and reports retries and skipped tasks through the root logger (stderr). Tasks run one
after another, in the calling thread.

`captured_output` redirects this process's file descriptors 1 and 2 into one pipe (`os.dup2`) for the length of
the kfp.local call, and points `sys.stdout`, `sys.stderr` and the root logger at them: whatever is written, by
Python or C code of this process or by a child that inherited the descriptors, arrives in one stream in the order
it was written (the Python streams are line-buffered meanwhile, so their lines interleave as written; pointing
them at the descriptors also covers a caller that had replaced them, as pytest does). A reader thread splits the
stream into lines and hands them to `StepRouter.feed`, which keys each line on the running task: kfp.local's
"Executing task 'NAME'" line opens a task's section and its "Task 'NAME' finished with status S" line closes it,
so the lines in between are that task's output. Those two lines are kfp.local's own, unindented; a child's lines
always arrive indented, so nothing a step prints can be mistaken for them. Nothing in kfp.local is patched or
subclassed, the compiled pipeline runs exactly as `kfp.local` runs it, and the attribution holds however a step
writes (logging, print, TensorFlow's C++ logging, a subprocess of its own). Running tasks one by one ourselves
would be simpler to capture but would no longer run the compiled pipeline as kfp.local does. The tests run the
real kfp.local and check the attribution.

What the console gets: the start and end lines (the key figures are read from the task's executor_output.json,
what the KFP UI shows), the lines the project's loggers wrote (components/stepcli.py puts the logger's name in
every line, so they are told apart from TensorFlow's and the KFP executor's), and kfp.local's notes on retries
and skipped tasks. With `verbose`, every line as it arrives. A failed step's own error message is read from the
end of its output (the exception a traceback ends with, else its last error line): `StepFailed` carries it.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import io
import json
import logging
import os
import re
import sys
import threading
import time
from typing import Callable, Iterator, TextIO

from components import stepcli

ANSI = re.compile(r"\x1b\[[0-9;]*m")
RELAY_INDENT = " " * 4  # kfp.local's indented_print, around each child's lines
TASK_START = re.compile(r"Executing task '([^']+)'\s*$")
TASK_END = re.compile(r"Task '([^']+)' finished with status (\w+)")
TASK_RETRY = re.compile(r"Task (\S+) failed \(attempt (\d+)/(\d+)\)\. Retrying in ([\d.]+)s")
TASK_SKIPPED_CONDITION = re.compile(r"Skipping conditional task (\S+) ")
TASK_SKIPPED_UPSTREAM = re.compile(r"Skipping task (\S+): upstream task\(s\) \[(.*)\] failed")
TASK_CACHED = re.compile(r"Task (\S+) cache hit")
PIPELINE_END = re.compile(r"Pipeline '[^']+' finished with status")
TRACEBACK = "Traceback (most recent call last):"
# Project lines kept off the console (still in the step's log): they repeat every epoch and ask nothing of a
# user watching a local run.
QUIET = (re.compile(r"^train: checkpoint "),)
TAIL_LINES = 400  # of a task's current attempt, kept for its error message
PIPELINE_LOG = "pipeline"  # logs/pipeline.log: kfp.local's own lines outside any task, and this process's


@dataclasses.dataclass
class StepRecord:
    """One step of a local run, as the console and summary.json tell it."""

    step: str
    task: str
    log: str
    state: str = "pending"  # running | succeeded | failed | skipped | cached
    seconds: float = 0.0
    attempts: int = 0
    figures: str = ""
    error: str = ""
    started: float = dataclasses.field(default=0.0, repr=False)
    failed_before: list[str] = dataclasses.field(default_factory=list, repr=False)  # why it was skipped
    tail: collections.deque = dataclasses.field(default_factory=lambda: collections.deque(maxlen=TAIL_LINES),
                                                repr=False)

    def to_json(self) -> dict:
        out = {"step": self.step, "task": self.task, "state": self.state, "seconds": round(self.seconds, 3),
               "attempts": self.attempts, "figures": self.figures, "log": self.log}
        return out | ({"error": self.error} if self.error else {})


class StepFailed(Exception):
    """One or more steps of a local run failed. str() is the short block pipectl prints: each failed step, its
    own error message and the path of its full log."""

    def __init__(self, failures: list[StepRecord], shorten: Callable[[str], str] = lambda path: path):
        self.failures = failures
        lines = []
        for record in failures:
            message = record.error or "no error message in its output"
            first, *more = message.splitlines() or [""]
            lines.append(f"step {record.step} failed: {first}")
            lines += [f"  {line}" for line in more]
            lines.append(f"  full log: {shorten(record.log)}")
        super().__init__("\n".join(lines))


def error_message(lines: list[str], most: int = 6) -> str:
    """A failed step's own error message, from the end of its output: the exception its last traceback ends
    with (module path dropped from the class), else its last error line, else its last line."""
    lines = [line.rstrip() for line in lines]
    if TRACEBACK in lines:
        after = lines[len(lines) - 1 - lines[::-1].index(TRACEBACK) + 1:]
        start = next((i for i, line in enumerate(after) if line and not line.startswith(" ")), None)
        if start is not None:
            found = [line for line in after[start:] if line.strip()][:most]
            found[0] = re.sub(r"^(?:\w+\.)+(\w+:)", r"\1", found[0])
            return "\n".join(found)
    for line in reversed(lines):
        parsed = stepcli.parse_log_line(line)
        if parsed and parsed.level in ("ERROR", "CRITICAL"):
            return parsed.message
        if re.match(r"^(\S+: )?error: ", line):
            return line
    return next((line for line in reversed(lines) if line.strip()), "")


class StepRouter:
    """Sorts the lines of a kfp.local run by task (see the module docstring) into logs/<step>.log, and writes the
    console's lines. `steps` maps task names to step names (pipelines.training.task_names, inverted);
    `task_outputs(task)` returns the task's executor output (dict) once it finished, or None; `shorten` makes a
    progress line's paths readable on the console."""

    def __init__(self, logs_dir: str, steps: dict[str, str], console: TextIO, *, verbose: bool = False,
                 groups: dict[str, list[str]] | None = None,
                 task_outputs: Callable[[str], dict | None] = lambda task: None,
                 shorten: Callable[[str], str] = lambda text: text, clock: Callable[[], float] = time.monotonic):
        self.logs_dir, self.steps, self.console, self.verbose = logs_dir, steps, console, verbose
        self.groups = groups or {}  # a task group (dsl.If) -> the tasks inside: skipping it skips them
        self.task_outputs, self.shorten, self.clock = task_outputs, shorten, clock
        os.makedirs(logs_dir, exist_ok=True)
        self.records: dict[str, StepRecord] = {}
        self.files: dict[str, TextIO] = {}
        self.current: str | None = None  # the task whose section is open
        self.relaying = False  # between its start and end lines: indented lines are the child's
        self.width = max([len(s) for s in steps.values()] + [8])

    # ---------------------------------------------------------------------------------------------- files

    def log_path(self, name: str) -> str:
        return os.path.join(self.logs_dir, f"{name}.log")

    def _file(self, name: str) -> TextIO:
        if name not in self.files:
            self.files[name] = open(self.log_path(name), "w", encoding="utf-8", errors="replace")
        return self.files[name]

    def _write(self, name: str, line: str) -> None:
        f = self._file(name)
        f.write(line + "\n")
        f.flush()

    def close(self) -> None:
        for f in self.files.values():
            f.close()
        self.files.clear()

    # ---------------------------------------------------------------------------------------------- console

    def _say(self, text: str) -> None:
        self.console.write(text + "\n")
        self.console.flush()

    def _step_line(self, record: StepRecord, text: str) -> None:
        self._say(f"{time.strftime('%H:%M:%S')}  {record.step:<{self.width}}  {text}")

    def record(self, task: str) -> StepRecord:
        if task not in self.records:
            step = self.steps.get(task, task)
            self.records[task] = StepRecord(step, task, self.log_path(step))
        return self.records[task]

    # ---------------------------------------------------------------------------------------------- lines

    def feed(self, raw: str) -> None:
        """One line of the run's output (without its newline)."""
        line = ANSI.sub("", raw).rstrip("\r")
        if self.relaying and line.startswith(RELAY_INDENT):
            self._child_line(line[len(RELAY_INDENT):])
            return
        if self.verbose:
            self._say(line)
        if found := TASK_START.search(line):
            self._start(found.group(1), line)
        elif found := TASK_END.search(line):
            self._end(found.group(1), found.group(2), line)
        elif PIPELINE_END.search(line):
            self.current, self.relaying = None, False
            self._write(PIPELINE_LOG, line)
        elif not self._kfp_note(line):
            self._write(self.steps.get(self.current, self.current) if self.current else PIPELINE_LOG, line)

    def _child_line(self, line: str) -> None:
        record = self.records[self.current]
        self._write(record.step, line)
        record.tail.append(line)
        if self.verbose:
            self._say(line)
            return
        parsed = stepcli.parse_log_line(line)
        if parsed and parsed.from_project and parsed.level != "DEBUG" \
                and not any(p.search(parsed.message) for p in QUIET):
            self._say(f"{parsed.time[-8:]}  {'':<{self.width}}    {self.shorten(parsed.message)}")

    def _start(self, task: str, line: str) -> None:
        record = self.record(task)
        self.current, self.relaying = task, True
        record.attempts += 1
        record.state, record.started, record.error = "running", self.clock(), ""
        record.tail.clear()
        self._write(record.step, line)
        self._step_line(record, "started" if record.attempts == 1 else f"attempt {record.attempts} started")

    def _end(self, task: str, status: str, line: str) -> None:
        record = self.record(task)
        self._write(record.step, line)
        self.relaying = False
        record.seconds = self.clock() - record.started
        if status == "SUCCESS":
            record.state = "succeeded"
            record.figures = key_figures(record.step, self.task_outputs(task))
            text = f"succeeded in {record.seconds:.1f}s" + (f": {record.figures}" if record.figures else "")
        else:
            record.state = "failed"
            record.error = error_message(list(record.tail))
            text = f"FAILED after {record.seconds:.1f}s (full log: {self.shorten(record.log)})"
        self._step_line(record, text)

    def _kfp_note(self, line: str) -> bool:
        """kfp.local's lines about a task that did not run, or will run again: written to that task's log;
        False for any other line."""
        if found := TASK_RETRY.search(line):
            tasks = [found.group(1)]
            text = f"attempt {found.group(2)} of {found.group(3)} failed; retrying in {float(found.group(4)):.0f}s"
            state = None
        elif found := TASK_SKIPPED_CONDITION.search(line):
            tasks, state, text = self.groups.get(found.group(1), [found.group(1)]), "skipped", ""
        elif found := TASK_SKIPPED_UPSTREAM.search(line):
            tasks, state = self.groups.get(found.group(1), [found.group(1)]), "skipped"
            upstream = [t.strip(" '") for t in found.group(2).split(",")]
            upstream = [self.record(task) for name in upstream for task in self.groups.get(name, [name])]
            # What failed first, through the steps skipped because of it.
            failed = sorted({step for r in upstream for step in ([r.step] if r.state == "failed" else r.failed_before)})
            text = (f"skipped: {', '.join(failed)} failed" if failed else
                    f"skipped: {', '.join(r.step for r in upstream)} did not run")
        elif found := TASK_CACHED.search(line):
            tasks, state, text = [found.group(1)], "cached", "reused from kfp.local's cache"
        else:
            return False
        for task in tasks:
            record = self.record(task)
            record.state = state or record.state
            if found.re is TASK_SKIPPED_UPSTREAM:
                record.failed_before = failed
            self._write(record.step, line)
            if state == "skipped" and not text:
                self._step_line(record, "skipped: the model is not blessed" if record.step == "register"
                                else "skipped: its condition is false")
            else:
                self._step_line(record, text)
        return True

    def failures(self) -> list[StepRecord]:
        return [r for r in self.records.values() if r.state == "failed"]

    def summary(self) -> list[dict]:
        return [r.to_json() for r in self.records.values()]


def task_groups(pipeline_spec: dict) -> dict[str, list[str]]:
    """The task groups of a compiled pipeline (a dsl.If is a task running a DAG of its own) and the tasks each
    holds, nested groups flattened: kfp.local names the group when it skips it."""
    components = pipeline_spec.get("components", {})

    def inner(component: dict) -> list[str]:
        found = []
        for name, task in component.get("dag", {}).get("tasks", {}).items():
            nested = components.get(task.get("componentRef", {}).get("name", ""), {})
            found += inner(nested) if "dag" in nested else [name]
        return found

    groups = {}
    for dag in [pipeline_spec.get("root", {})] + list(components.values()):
        for name, task in dag.get("dag", {}).get("tasks", {}).items():
            nested = components.get(task.get("componentRef", {}).get("name", ""), {})
            if "dag" in nested:
                groups[name] = inner(nested)
    return groups


# ---------------------------------------------------------------------------------------------- key figures


def _metadata(outputs: dict, name: str) -> dict:
    return outputs["artifacts"][name]["artifacts"][0]["metadata"]


def key_figures(step: str, outputs: dict | None) -> str:
    """A finished step's key figures, from its executor output (the values the KFP UI shows); "" when the
    output does not hold them."""
    if not outputs:
        return ""
    values = outputs.get("parameterValues", {})
    try:
        if step == "preprocess":
            return ", ".join(f"{split} {int(values[split])}" for split in ("train", "validation", "test", "rejected"))
        if step == "augment":
            meta = _metadata(outputs, "augmented")
            if meta["mode"] == "online":
                return "online: training augments each batch"
            if not meta["copies"]:
                return f"no copies: the {int(meta['train'])} training images pass through"
            return f"{int(meta['copies'])} copies: {int(meta['train'])} training images"
        if step == "placement":
            chosen = values["node_selector"]
            return ", ".join(f"{key.rsplit('/', 1)[-1]}={value}" for key, value in chosen.items()) or "no GPU"
        if step == "images":  # the images' names in the repository: train gpu, evaluate cpu, predict gpu
            def name(image: str) -> str:
                return image.rsplit("/", 1)[-1].split("@")[0].split(":")[0]

            return ", ".join(f"{role} {name(values[role])}" for role in ("train", "evaluate", "predict"))
        if step == "train":
            meta = _metadata(outputs, "metrics")
            epochs = sum(1 for key in meta if re.fullmatch(r"epoch\d+_loss", key))
            text = f"{epochs} epoch{'s' * (epochs != 1)}, {meta['train_seconds']:.1f}s fitting"
            if "exported_val_accuracy" in meta and meta.get("exported_epoch", epochs) != epochs:
                text += (f", exported epoch {int(meta['exported_epoch'])} (best validation accuracy "
                         f"{meta['exported_val_accuracy']:.4f})")
            elif "final_val_accuracy" in meta:
                text += f", validation accuracy {meta['final_val_accuracy']:.4f}"
            gpus = sorted(int(m.group(1)) for m in map(re.compile(r"gpu(\d+)_utilization_mean").fullmatch, meta) if m)
            for gpu in gpus:  # components/train/gpu_usage.py, through results.log_to_kfp
                text += (f"; GPU {gpu}: mean {meta[f'gpu{gpu}_utilization_mean']:.0f}% "
                         f"(p95 {meta[f'gpu{gpu}_utilization_p95']:.0f}%), memory "
                         f"{meta[f'gpu{gpu}_memory_used_gib_max']:.1f}/{meta[f'gpu{gpu}_memory_total_gib']:.0f} GiB")
            return text
        if step == "evaluate":
            meta = _metadata(outputs, "metrics")
            return (f"test accuracy {meta['accuracy']:.4f}, "
                    f"{'blessed' if values.get('Output') else 'not blessed'}")
        if step == "predict":
            meta = _metadata(outputs, "predictions")
            return f"{int(meta['count'])} predictions, {int(meta['errors'])} errors"
        if step == "register":
            meta = _metadata(outputs, "registration")
            text = f"{meta['model']} version {meta['version']} ({meta['registry']} registry)"
            if meta.get("new_version") is False:  # the same digest: an identical retrain, or a retried task
                text += ", already registered (the same model)"
            if meta.get("champion_changed"):  # another run moved the champion after this run's evaluation
                text += f"; {meta['promotion']}"
            return text
    except (KeyError, IndexError, TypeError, ValueError):
        return ""
    return ", ".join(f"{k} {v}" for k, v in values.items() if isinstance(v, (int, float, str)))


def read_task_outputs(task_dir: str) -> dict | None:
    path = os.path.join(task_dir, "executor_output.json")
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


# ---------------------------------------------------------------------------------------------- capture


def console_stream() -> TextIO:
    """Where the console's lines go while descriptors 1 and 2 are redirected: a copy of descriptor 1 as it was,
    line-buffered, in stdout's encoding."""
    encoding = getattr(sys.stdout, "encoding", None) or "utf-8"
    return open(os.dup(1), "w", buffering=1, encoding=encoding, errors="replace")


def _pump(read_end: int, feed: Callable[[str], None], errors: list[BaseException]) -> None:
    """Reads the pipe to its end, feeding whole lines. Keeps reading after a failing feed (the writers must never
    block on a full pipe); the first error is kept for the caller."""
    pending = b""
    with open(read_end, "rb", buffering=0) as pipe:
        while chunk := pipe.read(65536):
            *lines, pending = (pending + chunk).split(b"\n")
            for line in lines:
                try:
                    feed(line.decode("utf-8", errors="replace"))
                except Exception as e:  # kept and raised by captured_output once the run is over
                    errors.append(e)
        if pending:
            try:
                feed(pending.decode("utf-8", errors="replace"))
            except Exception as e:
                errors.append(e)


@contextlib.contextmanager
def captured_output(feed: Callable[[str], None]) -> Iterator[None]:
    """For the block's length, everything this process writes goes, line by line and in order, to `feed` (called
    from a reader thread): whatever reaches file descriptors 1 and 2 (Python, C, children that inherit them), and
    what goes to `sys.stdout`, `sys.stderr` and the root logger, which are pointed at those descriptors meanwhile
    (line-buffered, so that their lines interleave as written; also when a caller had replaced them, as pytest
    does). Everything is restored afterwards, also when the block raises."""
    old_streams = sys.stdout, sys.stderr
    for stream in old_streams:
        if stream is not None:
            stream.flush()
    root = logging.getLogger()
    old_handlers, old_level = root.handlers[:], root.level
    saved = os.dup(1), os.dup(2)
    read_end, write_end = os.pipe()
    errors: list[BaseException] = []
    reader = threading.Thread(target=_pump, args=(read_end, feed, errors), name="steplogs", daemon=True)
    reader.start()
    try:
        os.dup2(write_end, 1)
        os.dup2(write_end, 2)
    finally:
        os.close(write_end)
    sys.stdout, sys.stderr = (io.TextIOWrapper(open(fd, "wb", closefd=False), encoding="utf-8", errors="replace",
                                               line_buffering=True) for fd in (1, 2))
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s %(message)s"))
    root.handlers = [handler]
    root.setLevel(min(root.getEffectiveLevel(), logging.INFO))  # kfp.local's notes on retries and skips are INFO
    try:
        yield
    finally:
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        sys.stdout, sys.stderr = old_streams
        root.handlers = old_handlers
        root.setLevel(old_level)
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for fd in saved:
            os.close(fd)
        # EOF once the write ends at 1 and 2 are gone; a process that inherited them and lives on (none of
        # kfp.local's) would hold it open, hence the bound.
        reader.join(timeout=30)
    if errors:
        raise errors[0]
