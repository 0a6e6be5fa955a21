"""What every step's command line shares: logging, the exit-code contract, and the result as JSON on stdout.

The exit codes are one contract for every step (components/train/__init__.py explains it for training, where
retries matter most):

    0    ok
    143  preempted, or retryable (128 + SIGTERM): a retry can succeed, and resumes where the step can
    137  killed (128 + SIGKILL, e.g. out of memory): set by the kernel, never returned here; a retry resumes
    2    bad input or settings (ValueError, which data.DataError is), or a permanent failure: retrying cannot help
    1    a bug: any error not known to be one of the above; its traceback is printed

Codes 128-255 are what a Kubeflow TFJob with `restartPolicy: ExitCode` restarts, and 1-127 what it does not.

`exit_code_for` maps an error to its code: the nearest of its classes that `exit_codes` (a caller's additions
to `EXIT_CODES`) names, or that states an `exit_code` of its own (as the training step's errors do). A new kind
of error therefore plugs in either way, without changing this module.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import re
import sys
from types import MappingProxyType
from typing import Any, Callable, Mapping

EXIT_OK = 0
EXIT_BUG = 1
EXIT_PERMANENT = 2
EXIT_KILLED = 137  # 128 + SIGKILL: set by the kernel, not by a step; listed for the docs and the launchers
EXIT_RETRY = 143  # 128 + SIGTERM, what a TFJob's ExitCode policy and a KFP retry restart
RETRYABLE_EXIT_CODES = frozenset(range(128, 256))

# Errors every step maps the same way; a step passes its own additions to `run` / `exit_code_for`.
EXIT_CODES: Mapping[type, int] = MappingProxyType({ValueError: EXIT_PERMANENT})

# The logger's name is in the line so that a reader of the mixed output of a step (its own lines, TensorFlow's,
# the KFP executor's) can tell the project's progress lines from the rest: `pipectl run --local` shows only those
# (pipelines/local/steplogs.py), the step's log file keeps everything.
LOG_FORMAT = "%(asctime)s %(levelname)s [%(name)s] %(message)s"
_LOG_LINE = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),\d+ (DEBUG|INFO|WARNING|ERROR|CRITICAL) "
                       r"\[([^\]\s]+)\] (.*)$")
PROJECT_LOGGERS = ("components",)  # every step logs through logging.getLogger(__name__) under components/


@dataclasses.dataclass(frozen=True)
class LogLine:
    time: str
    level: str
    logger: str
    message: str

    @property
    def from_project(self) -> bool:
        return self.logger.split(".")[0] in PROJECT_LOGGERS


def parse_log_line(line: str) -> LogLine | None:
    """A line written in LOG_FORMAT, split into its fields; None for any other line (a continuation of a
    multi-line message, a print, a library's own format)."""
    found = _LOG_LINE.match(line)
    return LogLine(*found.groups()) if found else None


def setup_logging(*, force: bool = False) -> None:
    """INFO and up to stderr, in the steps' format. `force` replaces handlers already set up (a KFP executor
    sets its own, which would hide the steps' progress lines)."""
    logging.basicConfig(level=logging.INFO, format=LOG_FORMAT, force=force)


def exit_code_for(error: BaseException, exit_codes: Mapping[type, int] | None = None) -> int:
    """The documented exit code for `error` (see the module docstring); EXIT_BUG when nothing claims it."""
    table = {**EXIT_CODES, **(exit_codes or {})}
    for cls in type(error).__mro__:
        if cls in table:
            return table[cls]
        stated = vars(cls).get("exit_code")
        if isinstance(stated, int):
            return stated
    return EXIT_BUG


def print_json(result: Any) -> None:
    """The step's result on stdout: its `to_json()` when it has one."""
    json.dump(result.to_json() if hasattr(result, "to_json") else result, sys.stdout, indent=2)
    print()


def run(step: Callable[[], Any], *, exit_codes: Mapping[type, int] | None = None, prog: str = "") -> int:
    """Runs `step()` for a command line and returns the exit code for `main()` to return.

    Logging is set up first (unless the caller already did). The result is printed as JSON. An error with a
    code other than EXIT_BUG prints `[PROG: ]error: MESSAGE` on stderr (the message says what to fix) and
    returns the code; an error nothing claims is a bug and is raised, so its traceback shows and the process
    exits 1. A step that ends itself with SystemExit (training, preempted after its checkpoint) returns its code.
    """
    setup_logging()
    try:
        result = step()
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else (EXIT_OK if e.code is None else EXIT_BUG)
    except Exception as e:
        code = exit_code_for(e, exit_codes)
        if code == EXIT_BUG:
            raise
        print(f"{prog}: error: {e}" if prog else f"error: {e}", file=sys.stderr)
        return code
    print_json(result)
    return EXIT_OK
