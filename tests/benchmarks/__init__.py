"""The benchmark runner's own logic (benchmarks/run.py), without timing anything."""
