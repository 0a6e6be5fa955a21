"""The spread of repeated runs: min / median / max, what every benchmark reports. On a shared machine one run's
figure moves with the load (the ingest benchmark gave 7.7k and 19.3k images/s on the same files); the median of
several runs says what to expect, min and max how far one run may fall from it.

`spread` is one figure's; `merge` takes every run's result of one benchmark (the dicts their `main` returns) and
puts the spread of each number in its place; `lines` prints them (tests/benchmarks/__main__.py does both for
every benchmark that `make bench` runs, over BENCH_RUNS runs)."""

from __future__ import annotations

import statistics


def spread(values: list[float]) -> dict:
    """{"min", "median", "max", "runs"} of `values` (numbers, at least one)."""
    if not values:
        raise ValueError("no values to take the spread of")
    return {"min": min(values), "median": statistics.median(values), "max": max(values), "runs": len(values)}


def is_spread(value) -> bool:
    return (isinstance(value, dict) and set(value) == {"min", "median", "max", "runs"}
            and all(_number(v) for v in value.values()))


def figure(x: float) -> str:
    """A number as the tables show it: whole above 100 (with thousands separators), else 3 significant digits."""
    return f"{x:,.0f}" if abs(x) >= 100 else f"{x:.3g}"


def text(value: dict, pattern: str | None = None) -> str:
    """"min / median / max" (one figure where the runs agree)."""
    figures = [pattern.format(value[k]) if pattern else figure(value[k]) for k in ("min", "median", "max")]
    return figures[0] if len(set(figures)) == 1 else " / ".join(figures)


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def merge(results: list):
    """One value for the results of several runs of the same benchmark: each number that every run has in the same
    place becomes its spread; anything else stays as it is where the runs agree, else becomes {"each run": [each
    run's]} (e.g. the decode plan each run chose)."""
    if not results:
        return None
    first = results[0]
    if all(_number(r) for r in results):
        return spread([float(r) for r in results])
    if all(isinstance(r, dict) for r in results) and all(set(r) == set(first) for r in results):
        return {key: merge([r[key] for r in results]) for key in first}
    if all(isinstance(r, list) for r in results) and len({len(r) for r in results}) == 1 and first and \
            all(isinstance(x, (dict, list)) or _number(x) for x in first):
        return [merge([r[i] for r in results]) for i in range(len(first))]
    return first if all(r == first for r in results) else {"each run": list(results)}


def lines(merged, prefix: str = "") -> list[str]:
    """"path: min / median / max" for each spread in `merged` whose runs differ (what varies from run to run)."""
    out = []
    if is_spread(merged):
        if merged["min"] != merged["max"]:
            out.append(f"{prefix}: {text(merged)}")
    elif isinstance(merged, dict) and set(merged) == {"each run"}:
        out.append(f"{prefix}: each run: {'; '.join(str(v) for v in merged['each run'])}")
    elif isinstance(merged, dict):
        for key, value in merged.items():
            out.extend(lines(value, f"{prefix}.{key}" if prefix else str(key)))
    elif isinstance(merged, list) and merged and any(is_spread(v) or isinstance(v, (dict, list)) for v in merged):
        for i, value in enumerate(merged):
            out.extend(lines(value, f"{prefix}[{i}]"))
    return out
