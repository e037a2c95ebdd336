"""Benchmarks of mmq (run as modules: `python -m bench.overhead`)."""
