"""Benchmarks: kubeddp against hand-written baselines measured in the same run (`python -m
tests.bench.run`). Files are named bench_*.py / *_worker.py so pytest never collects them."""
