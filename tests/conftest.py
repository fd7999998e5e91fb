"""Shared pytest setup: quiet XLA logging. (Fixtures live beside the tests that use them.)"""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
