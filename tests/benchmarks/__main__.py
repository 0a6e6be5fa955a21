"""`make bench`: every benchmark, each side by side with its baseline measured in the same run.

python -m tests.benchmarks [NAME ...]   (names: ingest, augment, train, predict, models, photos, portable_input,
                                         shards, staging, ceilings, frameworks; default: all;
                                         `accelerator` needs a GPU and runs only when named; `near_copies`,
                                         three trainings, too)
"""

import importlib
import json
import os
import sys
import time

BENCHMARKS = ("ingest", "predict", "train", "models", "augment", "photos", "portable_input", "shards", "staging",
              "ceilings", "frameworks")
ON_REQUEST = ("accelerator", "near_copies")


def main(argv: list[str] | None = None) -> int:
    names = (argv if argv is not None else sys.argv[1:]) or list(BENCHMARKS)
    unknown = sorted(set(names) - set(BENCHMARKS) - set(ON_REQUEST))
    if unknown:
        print(f"unknown benchmark(s) {unknown}; known: {', '.join(BENCHMARKS + ON_REQUEST)}", file=sys.stderr)
        return 2
    results = {}
    for name in names:
        print(f"\n=== {name} ===", flush=True)
        start = time.monotonic()
        results[name] = importlib.import_module(f"tests.benchmarks.{name}").main([])
        print(f"({name}: {time.monotonic() - start:.0f}s)", flush=True)
    out = os.environ.get("BENCH_JSON", "runs/bench.json")
    os.makedirs(os.path.dirname(out) or ".", exist_ok=True)
    with open(out, "w") as f:
        json.dump(results, f, indent=2, default=str)
    print(f"\nresults: {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
