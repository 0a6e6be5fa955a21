"""`make bench`: every benchmark, each side by side with its baseline measured in the same run, repeated; each
figure reported as min / median / max over the runs (tests/benchmarks/spread.py).

python -m tests.benchmarks [--runs N] [NAME ...]
    names: ingest, augment, train, predict, models, photos, portable_input, shards, staging, ceilings, frameworks;
    default: all; `accelerator` needs a GPU and runs only when named; `near_copies`, three trainings, too.
    --runs: runs of each benchmark, taken in turns (all named benchmarks once, then again), so that load that comes
    and goes hits each alike (default: BENCH_RUNS from the environment, else 3; `make bench BENCH_RUNS=1` for one).
"""

import argparse
import importlib
import json
import os
import sys
import time

from tests.benchmarks.spread import lines, merge

BENCHMARKS = ("ingest", "predict", "train", "models", "augment", "photos", "portable_input", "shards", "staging",
              "ceilings", "frameworks")
ON_REQUEST = ("accelerator", "near_copies")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.benchmarks", description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", help="benchmarks to run (default: all but the on-request ones)")
    parser.add_argument("--runs", type=int, default=int(os.environ.get("BENCH_RUNS") or 3),
                        help="runs of each, in turns (default: BENCH_RUNS, else 3)")
    args = parser.parse_args(argv if argv is not None else sys.argv[1:])
    names = args.names or list(BENCHMARKS)
    unknown = sorted(set(names) - set(BENCHMARKS) - set(ON_REQUEST))
    if unknown or args.runs < 1:
        print(f"unknown benchmark(s) {unknown}; known: {', '.join(BENCHMARKS + ON_REQUEST)}" if unknown else
              f"--runs must be at least 1, got {args.runs}", file=sys.stderr)
        return 2
    runs: dict[str, list] = {name: [] for name in names}
    seconds: dict[str, list[float]] = {name: [] for name in names}
    for run in range(args.runs):
        for name in names:
            print(f"\n=== {name} (run {run + 1} of {args.runs}) ===", flush=True)
            start = time.monotonic()
            runs[name].append(importlib.import_module(f"tests.benchmarks.{name}").main([]))
            seconds[name].append(time.monotonic() - start)
            print(f"({name}: {seconds[name][-1]:.0f}s)", flush=True)
    results = {name: {"spread": merge(runs[name]), "seconds": merge(seconds[name]), "runs": runs[name]}
               for name in names}
    out = os.environ.get("BENCH_JSON", "runs/bench.json")
    os.makedirs(os.path.dirname(out) or ".", exist_ok=True)
    with open(out, "w") as f:
        json.dump(results, f, indent=2, default=str)
    print(f"\n=== min / median / max over {args.runs} run(s) (what changed from run to run) ===")
    for name in names:
        print(f"\n{name} ({'; '.join(lines(results[name]['seconds'], 'seconds')) or 'seconds: same'})")
        for line in lines(results[name]["spread"]) or ["(every figure the same in each run)"]:
            print(f"  {line}")
    print(f"\nresults: {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
