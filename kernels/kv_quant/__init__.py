"""Quantized KV cache: QVG (k-means smoothing + progressive residual quantization) and KIVI.

Importing the package registers the ``"qvg"`` and ``"kivi"`` cache backends
(:mod:`kernels.kv_quant.cache`) with :func:`kernels.cache_backend.register_backend`.
"""

from kernels.kv_quant import cache  # noqa: F401  (registers the backends)
