"""Shared pytest setup: float32 defaults and a tiny transformer config."""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
