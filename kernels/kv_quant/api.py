"""Quantized-KV attention: the public entry points and the op's implementation table (QVG, KIVI).

Dimensions: B batch, K kv heads, R = G * T query rows per kv head, T new tokens, D head dim,
N chunk tokens, NC chunks, SP = NC * N slots.

Implementations (``implementation=``):

* ``"reference"``: the jnp specification (:mod:`kernels.kv_quant.reference`): dequantize the whole
  cache to float32, then attend;
* ``"xla"``: dequantization fused into the attention (:mod:`kernels.kv_quant.xla`): one chunk of
  packed codes per loop step, no float copy of the cache; the CPU path;
* ``"pallas_tpu"``, ``"pallas_gpu"``: QVG kernels that dequantize in VMEM / registers
  (:mod:`kernels.kv_quant.pallas_tpu`, :mod:`kernels.kv_quant.pallas_gpu`);
* ``"auto"`` (or None): Pallas on TPU / GPU, ``"xla"`` elsewhere; KIVI has no Pallas kernel and
  uses ``"xla"`` on every backend.

One table (:data:`TABLE`) lists them with their platforms and the entry points they serve (the
Pallas kernels serve QVG only), resolved by the shared :func:`kernels.dispatch.resolve`, as in
every op: an implementation that is unknown, does not serve the entry point, or (on concrete
arrays) does not run on the call's platform is one ValueError of the same wording. A shape the
picked kernel cannot tile is a ValueError (GPU: chunk and head dim powers of two; TPU:
:func:`kernels.kv_quant.pallas_tpu.check_layout`), never a silent switch to another path;
``implementation="xla"`` serves any shape.

The cache backends that call these live in :mod:`kernels.kv_quant.cache` (``QVGCache``,
``KIVICache``, registered as ``"qvg"`` and ``"kivi"``).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from kernels import checks, dispatch
from kernels.kv_quant import reference as ref
from kernels.kv_quant.reference import KIVIConfig, QVGConfig

QVG, KIVI = "QVG", "KIVI"  # the entry points an implementation may serve
# The op's implementation table: where each runs, what it serves, what "auto" picks per platform.
TABLE = dispatch.Table(
    op="kv_quant",
    implementations=(
        dispatch.Implementation("reference"),
        dispatch.Implementation("xla"),
        dispatch.Implementation("pallas_tpu", ("tpu",), interpretable=True, serves=(QVG,)),
        dispatch.Implementation("pallas_gpu", ("gpu",), interpretable=True, serves=(QVG,)),
    ),
    auto={"tpu": ("pallas_tpu", "xla"), "gpu": ("pallas_gpu", "xla"), "*": ("xla",)},
)
IMPLEMENTATIONS = TABLE.names


def resolve_implementation(implementation: str | None, where: str = "kv_quant",
                           entry: str = QVG) -> str:
    """``"auto"`` / None -> what ``TABLE.auto`` picks for ``entry`` on this platform (QVG: Pallas
    on TPU / GPU, the fused XLA path elsewhere; KIVI: the fused XLA path); otherwise one of
    :data:`IMPLEMENTATIONS` that serves ``entry`` (:func:`kernels.dispatch.resolve` without a
    platform: the name only; the attention functions also refuse one that cannot run on the
    platform of their call).

    Raises:
      ValueError: an unknown name, or one that does not serve ``entry`` (the message lists those
        that do and every implementation's platforms).
    """
    return dispatch.resolve(TABLE, implementation, where, entry=entry)


def qvg_chunk_attention(q: jax.Array, k_code: ref.QVGCode, v_code: ref.QVGCode, cfg: QVGConfig,
                        start: jax.Array, num_quantized: jax.Array, num_new: int,
                        rope_base, implementation: str | None = "auto",
                        interpret: bool = False) -> tuple[jax.Array, jax.Array]:
    """Attention of query rows over QVG-quantized chunks, dequantizing on the fly.

    Args:
      q: [B, K, R, D] with R = G * T (row r is query head r // T of the group, new token r % T).
      k_code, v_code: :class:`~kernels.kv_quant.reference.QVGCode` with fields [B, K, NC, ...].
      cfg: the QVG config the codes were made with.
      start: int32 [B]; row r of batch b sits at position start[b] + r % T.
      num_quantized: int32 [B]; slots below it are quantized (the rest are ignored here).
      num_new: T.
      rope_base: RoPE base (a float or an object with ``inv_freq``) if keys were stored before
        RoPE, else None.
      implementation: see :func:`resolve_implementation`; on concrete arrays it must run on this
        platform (a Pallas kernel runs on any platform with ``interpret=True``).
      interpret: run a Pallas kernel in interpret mode (CPU tests); ignored otherwise.

    Returns:
      (out float32 [B, K, R, D], lse float32 [B, K, R]); rows that see no slot get (0, -inf).

    Raises:
      ValueError: ``q`` not float [B, K, R, D] matching the codes' B and K; ``start`` or
        ``num_quantized`` not int [B]; an unknown implementation or, on concrete arrays, one that
        does not run on this platform (:func:`kernels.dispatch.resolve`); a chunk or head dim the
        resolved kernel cannot tile (:func:`check_kernel_shape`).
    """
    where = "qvg_chunk_attention"
    b, kh = k_code.codes.shape[:2]
    checks.array(q, "q", where, ndim=4, kind="float", shape=(b, kh, None, None), nonempty=True)
    checks.array(start, "start", where, kind="int", shape=(b,))
    checks.array(num_quantized, "num_quantized", where, kind="int", shape=(b,))
    checks.integer(num_new, "num_new", where, minimum=1)
    impl = dispatch.resolve(TABLE, implementation, where, entry=QVG, interpret=interpret,
                            platform=dispatch.call_platform(q, k_code, v_code, start, num_quantized))
    nc, n = k_code.codes.shape[2], k_code.codes.shape[4]
    check_kernel_shape(impl, n, q.shape[-1], where)
    if impl == "reference":
        valid = quantized_mask(start, num_quantized, q.shape[2], num_new, nc * n)
        return ref.qvg_chunk_attention_reference(q, k_code, v_code, cfg.bits, valid, rope_base)
    if impl == "xla":
        from kernels.kv_quant import xla
        return xla.qvg_chunk_attention(q, k_code, v_code, cfg, start, num_quantized, num_new,
                                       rope_base)
    if impl == "pallas_tpu":
        from kernels.kv_quant import pallas_tpu
        return pallas_tpu.qvg_chunk_attention(q, k_code, v_code, cfg, start, num_quantized,
                                              num_new, rope_base, interpret=interpret)
    from kernels.kv_quant import pallas_gpu
    return pallas_gpu.qvg_chunk_attention(q, k_code, v_code, cfg, start, num_quantized, num_new,
                                          rope_base, interpret=interpret)


def kivi_attention(q: jax.Array, k_code: ref.KIVICode, window_k: jax.Array,
                   v_code: ref.KIVICode, ring: jax.Array, cfg: KIVIConfig, start: jax.Array,
                   num_new: int, implementation: str | None = "auto", *,
                   num_quantized: jax.Array | None = None) -> jax.Array:
    """KIVI decode attention over the cache's layout (:class:`kernels.kv_quant.cache.KIVICache`).

    Args:
      q: float [B, K, R, D] query rows (R = G * T, row r is new token r % T).
      k_code: key codes, fields [B, K, NC, ...] (per channel, chunks of N = ``cfg.residual``).
      window_k: [B, K, W, D] exact keys of the positions ``num_quantized + j`` (W a multiple of
        N: N, or the cache's 2N).
      v_code: value codes, fields [B, K, SP, ...] (per token).
      ring: [B, K, N, D] the exact last N values (position p at slot p mod N).
      cfg: the KIVI config; start: int [B]; num_new: T.
      implementation: ``"reference"``, ``"xla"``, or ``"auto"`` / None (= ``"xla"``, on every
        platform); the Pallas kernels do not serve KIVI (:data:`TABLE`).
      num_quantized: int [B], the slots with quantized keys (a multiple of N, at most
        ``start + T``); None: ``floor((start + T) / N) N``, every complete chunk.

    Returns:
      float32 [B, K, R, D].

    Raises:
      ValueError: ``q`` not float [B, K, R, D] matching the codes, ``start`` or
        ``num_quantized`` not int [B], ``window_k`` not [B, K, W, D] with W a positive multiple
        of N, or an implementation that is unknown or does not serve KIVI
        (:func:`kernels.dispatch.resolve`).
    """
    where = "kivi_attention"
    b, kh = k_code.codes.shape[:2]
    checks.array(q, "q", where, ndim=4, kind="float", shape=(b, kh, None, None), nonempty=True)
    checks.array(start, "start", where, kind="int", shape=(b,))
    checks.integer(num_new, "num_new", where, minimum=1)
    checks.array(window_k, "window_k", where, ndim=4, kind="float",
                 shape=(b, kh, None, q.shape[-1]))
    if window_k.shape[2] < 1 or window_k.shape[2] % cfg.residual:
        raise checks.error(where, "window_k", f"[B, K, W, D] with W a positive multiple of N = "
                           f"{cfg.residual}", f"shape {tuple(window_k.shape)}")
    if num_quantized is not None:
        checks.array(num_quantized, "num_quantized", where, kind="int", shape=(b,))
        num_quantized = num_quantized.astype(jnp.int32)
    impl = dispatch.resolve(TABLE, implementation, where, entry=KIVI,
                            platform=dispatch.call_platform(q, k_code, window_k, v_code, ring, start))
    start = start.astype(jnp.int32)
    if impl == "reference":
        return ref.kivi_cache_attention_reference(q, k_code, window_k, v_code, ring, cfg, start,
                                                  num_new, num_quantized)
    from kernels.kv_quant import xla
    return xla.kivi_attention(q, k_code, window_k, v_code, ring, cfg, start, num_new,
                              num_quantized)


def _pow2(*sizes: int) -> bool:
    return all(x > 0 and x & (x - 1) == 0 for x in sizes)


def check_kernel_shape(implementation: str, chunk: int, head_dim: int, where: str) -> None:
    """Raises ValueError, before anything is compiled, when the resolved ``implementation``'s
    kernel cannot tile a chunk of ``chunk`` tokens with head dim ``head_dim``: the GPU (Triton)
    kernel needs both to be powers of two. ``"auto"`` never swaps to another path in silence;
    ``implementation="xla"`` serves any shape.

    Raises:
      ValueError: naming the value, the shapes that work and the ``"xla"`` alternative.
    """
    if implementation != "pallas_gpu":
        return
    for name, x in (("chunk", chunk), ("head dim", head_dim)):
        if not _pow2(x):
            raise ValueError(
                f"{where}: the GPU kernel (implementation 'pallas_gpu', what 'auto' picks on a "
                f"GPU) needs a power-of-two {name} (Triton tiles); got {name} {x}. Use a chunk "
                f"of 128, 256, 512 or 1024 tokens and head dim 64, 128 or 256, or pass "
                f"implementation='xla' (the fused XLA path, any shape)")


def quantized_mask(start: jax.Array, num_quantized: jax.Array, rows: int, num_new: int,
                   slots: int) -> jax.Array:
    """bool [B, 1, R, SP]: row r (position ``start + r % T``) sees slot s iff
    ``s < num_quantized`` and ``s <= pos``."""
    pos = start[:, None] + jnp.arange(rows) % num_new  # [B, R]
    s = jnp.arange(slots)
    return ((s[None, None, :] < num_quantized[:, None, None])
            & (s[None, None, :] <= pos[:, :, None]))[:, None]
