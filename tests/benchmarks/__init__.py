"""Benchmarks: `python -m tests.benchmarks.<topic>` prints ours next to a baseline measured in the same run."""
