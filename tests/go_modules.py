"""The environment of a `go` build whose modules the Go module proxy may refuse (some mirrors do): each such
repository is fetched from a local clone named by an environment variable instead. A refusal from the proxy falls
through to the clone (GOPROXY `|direct`: on any error) through `git config url.<clone>.insteadOf <repository>`, and
the checksum database is not asked about those modules, which the go.sum of the build already pins."""

from __future__ import annotations

import os
import shutil


class GoMissing(RuntimeError):
    """What a Go build of the tests needs is not here (Go, or modules): the one line says what to install or set."""


def go(hint: str) -> str:
    """The `go` command, or GoMissing(hint)."""
    found = shutil.which("go") or ("/usr/local/go/bin/go" if os.path.exists("/usr/local/go/bin/go") else None)
    if not found:
        raise GoMissing(hint)
    return found


def build_env(clones: dict[str, str]) -> dict:
    """os.environ plus, for each `https://github.com/OWNER/REPO` -> VARIABLE of `clones` whose VARIABLE names a
    local clone, the git and Go settings that fetch that repository's modules from it."""
    env = dict(os.environ)
    local = {repository: env[variable] for repository, variable in clones.items() if env.get(variable)}
    if not local:
        return env
    count = int(env.get("GIT_CONFIG_COUNT", "0"))
    for i, (repository, clone) in enumerate(local.items(), start=count):
        env[f"GIT_CONFIG_KEY_{i}"] = f"url.{clone}.insteadOf"
        env[f"GIT_CONFIG_VALUE_{i}"] = repository
    env["GIT_CONFIG_COUNT"] = str(count + len(local))
    env["GOPROXY"] = env.get("GOPROXY", "https://proxy.golang.org") + "|direct"
    env["GONOSUMDB"] = ",".join([*filter(None, [env.get("GONOSUMDB")]),
                                 *(r.removeprefix("https://") for r in local)])
    return env
