"""Method implementations: pure, jitted algorithm modules (no I/O, no flags)."""
