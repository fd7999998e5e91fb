"""Quantized KV cache: QVG (k-means smoothing + progressive residual quantization) and KIVI."""
