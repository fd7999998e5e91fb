"""Experiments: configs, one module per experiment, the main job, benchmarks and notebooks."""
