"""Benchmarks: each module has run() -> markdown; run_all writes BENCHMARKS.md."""
