"""Shared plumbing: configs, sharding, checkpoints, the training loop, metrics, reports and data."""
