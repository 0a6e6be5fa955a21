"""tests/benchmarks/serving_compat.py, the check that a serving container's TensorFlow loads and serves what training
writes, run here with this TensorFlow on both sides (the TF 2.15 and 2.20 results are in docs/registry.md)."""

from __future__ import annotations

import json

import numpy as np

from tests.benchmarks import serving_compat


def test_the_export_loads_and_predicts_the_same_and_a_difference_fails(tmp_path, capsys):
    out = str(tmp_path)
    (exported,) = serving_compat.export(out, names=["fashion-28x28x1"])
    assert exported["signatures"] == ["serve", "serving_default"]
    assert serving_compat.main(["check", out, "--model", "fashion-28x28x1"]) == 0
    (line,) = [json.loads(text) for text in capsys.readouterr().out.splitlines()]
    assert line["loads"] and line["session_max_abs_diff"] == line["function_max_abs_diff"] == 0.0

    # predictions that differ by more than the tolerance fail the check
    path = tmp_path / "fashion-28x28x1" / "compat.npz"
    arrays = dict(np.load(path, allow_pickle=True))
    arrays["expected_pixels"] = arrays["expected_pixels"] + 1e-3
    np.savez(path, **arrays)
    assert serving_compat.main(["check", out, "--model", "fashion-28x28x1"]) == 1
