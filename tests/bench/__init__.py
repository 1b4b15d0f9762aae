"""toolbus benchmarks, each figure measured side by side with its baseline: `python -m tests.bench`."""
