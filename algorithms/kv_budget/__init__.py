"""EntroKV: attention-entropy per-head KV budgets with SnapKV-style token selection."""
