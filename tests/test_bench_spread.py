"""`make bench` reports min / median / max over repeated runs (tests/benchmarks/spread.py, __main__.py)."""

import inspect
import json

from tests.benchmarks import __main__ as bench
from tests.benchmarks.spread import lines, merge, spread, text


def test_the_spread_of_runs_keeps_what_agrees_and_lists_what_does_not():
    runs = [{"images": 20000, "ours_images_per_s": 7712.0, "ours_decode_plans": ["one worker"],
             "decode_only_images_per_s": {"1 worker": 13649.0}, "peak_memory": {"10000": {"main_mb": 536.0}}},
            {"images": 20000, "ours_images_per_s": 19300.0, "ours_decode_plans": ["TensorFlow batches x2"],
             "decode_only_images_per_s": {"1 worker": 14100.0}, "peak_memory": {"10000": {"main_mb": 536.0}}},
            {"images": 20000, "ours_images_per_s": 8400.0, "ours_decode_plans": ["TensorFlow batches x2"],
             "decode_only_images_per_s": {"1 worker": 12900.0}, "peak_memory": {"10000": {"main_mb": 540.0}}}]
    merged = merge(runs)
    assert merged["ours_images_per_s"] == {"min": 7712.0, "median": 8400.0, "max": 19300.0, "runs": 3}
    assert merged["images"] == spread([20000.0] * 3)
    assert merged["ours_decode_plans"] == {"each run": [["one worker"], ["TensorFlow batches x2"],
                                                        ["TensorFlow batches x2"]]}
    assert lines(merged) == [
        "ours_images_per_s: 7,712 / 8,400 / 19,300",
        "ours_decode_plans: each run: ['one worker']; ['TensorFlow batches x2']; ['TensorFlow batches x2']",
        "decode_only_images_per_s.1 worker: 12,900 / 13,649 / 14,100",
        "peak_memory.10000.main_mb: 536 / 536 / 540"]
    assert text(merged["ours_images_per_s"], "{:,.0f}") == "7,712 / 8,400 / 19,300"
    assert text(merged["images"], "{:,.0f}") == "20,000"  # the runs agree: one figure
    json.dumps(merged)  # what __main__ writes to runs/bench.json
    assert merge([3, "3"]) == {"each run": [3, "3"]} and merge([None, None]) is None
    # a benchmark that reports its own repeats' spread (shards): each of its figures gets the spread over the runs
    nested = merge([{"read": spread([1.0, 2.0, 4.0])}, {"read": spread([1.5, 3.0, 3.5])}])
    assert nested["read"]["median"] == {"min": 2.0, "median": 2.5, "max": 3.0, "runs": 2}
    assert lines(nested) == ["read.min: 1 / 1.25 / 1.5", "read.median: 2 / 2.5 / 3", "read.max: 3.5 / 3.75 / 4"]


def test_every_benchmark_make_bench_names_has_a_main_that_takes_its_arguments():
    """`make bench BENCH=x` imports tests.benchmarks.x and calls main([]) once a run."""
    import importlib

    for name in bench.BENCHMARKS + bench.ON_REQUEST:
        module = importlib.import_module(f"tests.benchmarks.{name}")
        assert list(inspect.signature(module.main).parameters) == ["argv"], name


def test_make_bench_refuses_unknown_names_and_no_runs(capsys):
    assert bench.main(["nosuch"]) == 2
    assert "unknown benchmark(s) ['nosuch']" in capsys.readouterr().err
    assert bench.main(["--runs", "0", "ingest"]) == 2
    assert "--runs must be at least 1" in capsys.readouterr().err
