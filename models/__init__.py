"""Flax NNX models: the transformer LM (KV cache, optional time conditioning) and helpers."""
