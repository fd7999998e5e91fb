"""Quantized-KV attention: the public entry points and the op's implementation table (QVG, KIVI).

Dimensions: B batch, K kv heads, R = G * T query rows per kv head, T new tokens, D head dim,
N chunk tokens, NC chunks, SP = NC * N slots.

Implementations (``implementation=``):

* ``"reference"``: the jnp specification (:mod:`kernels.kv_quant.reference`): dequantize the whole
  cache to float32, then attend;
* ``"xla"``: dequantization fused into the attention (:mod:`kernels.kv_quant.xla`): one chunk of
  packed codes per loop step, no float copy of the cache; the CPU path;
* ``"pallas_tpu"``, ``"pallas_gpu"``: QVG kernels that read the codes in VMEM / registers (the
  TPU kernel feeds them to the MXU as exact bfloat16 operands, the GPU kernel dequantizes them)
  (:mod:`kernels.kv_quant.pallas_tpu`, :mod:`kernels.kv_quant.pallas_gpu`);
* ``"auto"`` (or None): Pallas on TPU / GPU, ``"xla"`` elsewhere; KIVI has no Pallas kernel and
  uses ``"xla"`` on every backend.

One table (:data:`TABLE`) lists them per entry point they serve (the Pallas kernels serve QVG
only), with the function each calls, its platforms and its ``supports`` hook (the shapes it
tiles), resolved by the shared :func:`kernels.dispatch.resolve`, as in every op: an
implementation that is unknown, does not serve the entry point, or (on concrete arrays) does not
run on the call's platform is one ValueError of the same wording. A shape the picked kernel
cannot tile is a ValueError (GPU: chunk and head dim powers of two, its ``supports`` hook; TPU:
:func:`kernels.kv_quant.pallas_tpu.check_layout`), never a silent switch to another path,
``"auto"`` included; ``implementation="xla"`` serves any shape.

The cache backends that call these live in :mod:`kernels.kv_quant.cache` (``QVGCache``,
``KIVICache``, registered as ``"qvg"`` and ``"kivi"``).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from kernels import checks, dispatch
from kernels.kv_quant import pallas_gpu, pallas_tpu, xla
from kernels.kv_quant import reference as ref
from kernels.kv_quant.reference import KIVIConfig, QVGConfig

QVG, KIVI = "QVG", "KIVI"  # the entry points an implementation may serve


# Calling conventions of the implementations (the table's ``fn``), after the entry points' checks:
# QVG: fn(q, k_code, v_code, cfg, start, num_quantized, num_new, rope_base, interpret=...)
#   -> (out float32 [B, K, R, D], lse float32 [B, K, R]) (:func:`qvg_chunk_attention`);
# KIVI: fn(q, k_code, window_k, v_code, ring, cfg, start int32 [B], num_new, num_quantized)
#   -> float32 [B, K, R, D] (:func:`kivi_attention`).

def _qvg_reference(q, k_code, v_code, cfg, start, num_quantized, num_new, rope_base,
                   interpret=False):
    """QVG's specification: every chunk dequantized to float32, then attended."""
    del interpret
    valid = quantized_mask(start, num_quantized, q.shape[2], num_new,
                           k_code.codes.shape[2] * k_code.codes.shape[4])
    return ref.qvg_chunk_attention_reference(q, k_code, v_code, cfg.bits, valid, rope_base)


def _qvg_xla(q, k_code, v_code, cfg, start, num_quantized, num_new, rope_base, interpret=False):
    """QVG's fused XLA path (:func:`kernels.kv_quant.xla.qvg_chunk_attention`)."""
    del interpret
    return xla.qvg_chunk_attention(q, k_code, v_code, cfg, start, num_quantized, num_new,
                                   rope_base)


def _pow2(*sizes: int) -> bool:
    return all(x > 0 and x & (x - 1) == 0 for x in sizes)


def _gpu_supports(shapes: dispatch.Shapes, platform: str | None) -> str | None:
    """The GPU (Triton) kernel tiles a chunk of ``chunk`` tokens with head dim ``head_dim`` only
    when both are powers of two; ``implementation="xla"`` serves any shape."""
    del platform
    for name, x in (("chunk", shapes["chunk"]), ("head dim", shapes["head_dim"])):
        if not _pow2(x):
            return (f"the GPU kernel (implementation 'pallas_gpu', what 'auto' picks on a GPU) "
                    f"needs a power-of-two {name} (Triton tiles); got {name} {x}. Use a chunk "
                    f"of 128, 256, 512 or 1024 tokens and head dim 64, 128 or 256, or pass "
                    f"implementation='xla' (the fused XLA path, any shape)")
    return None


# The op's implementation table: what each calls per entry point, where it runs, which shapes it
# tiles (shapes: "chunk" N, "head_dim" D), and what "auto" picks per platform.
TABLE = dispatch.Table(
    op="kv_quant",
    implementations=(
        dispatch.Implementation("reference", _qvg_reference, entry=QVG),
        dispatch.Implementation("reference", ref.kivi_cache_attention_reference, entry=KIVI),
        dispatch.Implementation("xla", _qvg_xla, entry=QVG),
        dispatch.Implementation("xla", xla.kivi_attention, entry=KIVI),
        dispatch.Implementation("pallas_tpu", pallas_tpu.qvg_chunk_attention, ("tpu",),
                                interpretable=True, entry=QVG),
        dispatch.Implementation("pallas_gpu", pallas_gpu.qvg_chunk_attention, ("gpu",),
                                interpretable=True, supports=_gpu_supports, entry=QVG),
    ),
    auto={"tpu": ("pallas_tpu", "xla"), "gpu": ("pallas_gpu", "xla"), "*": ("xla",)},
)
IMPLEMENTATIONS = TABLE.names


def resolve_implementation(implementation: str | None, where: str = "kv_quant",
                           entry: str = QVG) -> str:
    """``"auto"`` (or None) -> what ``TABLE.auto`` picks for ``entry`` on this platform (QVG:
    Pallas on TPU / GPU, the fused XLA path elsewhere; KIVI: the fused XLA path); otherwise one of
    :data:`IMPLEMENTATIONS` that serves ``entry`` (:func:`kernels.dispatch.resolve` without a
    platform: the name only; the attention functions also refuse one that cannot run on the
    platform of their call or cannot tile its shapes).

    Raises:
      ValueError: an unknown name, or one that does not serve ``entry`` (the message lists those
        that do and every implementation's platforms).
    """
    return dispatch.resolve(TABLE, implementation, where, entry=entry).name


def kernel_shapes(chunk: int, head_dim: int) -> dict[str, int]:
    """The shapes an implementation's ``supports`` hook is asked about (QVG): ``chunk`` N tokens
    per chunk and ``head_dim`` D."""
    return {"chunk": chunk, "head_dim": head_dim}


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
      implementation: ``"auto"`` (the default) or a name, see :func:`resolve_implementation`; on
        concrete arrays it must run on this platform (a Pallas kernel runs on any platform with
        ``interpret=True``).
      interpret: run a Pallas kernel in interpret mode (CPU tests); ignored otherwise.

    Returns:
      (out float32 [B, K, R, D], lse float32 [B, K, R]); rows that see no slot get (0, -inf).

    Raises:
      ValueError: ``q`` not float [B, K, R, D] matching the codes' B and K; ``start`` or
        ``num_quantized`` not int [B]; an unknown implementation or, on concrete arrays, one that
        does not run on this platform (:func:`kernels.dispatch.resolve`); a chunk or head dim the
        resolved kernel cannot tile (its ``supports`` hook, :func:`kernel_shapes`).
    """
    where = "qvg_chunk_attention"
    b, kh = k_code.codes.shape[:2]
    checks.array(q, "q", where, ndim=4, kind="float", shape=(b, kh, None, None), nonempty=True)
    checks.array(start, "start", where, kind="int", shape=(b,))
    checks.array(num_quantized, "num_quantized", where, kind="int", shape=(b,))
    checks.integer(num_new, "num_new", where, minimum=1)
    impl = dispatch.resolve(TABLE, implementation, where, entry=QVG, interpret=interpret,
                            platform=dispatch.call_platform(q, k_code, v_code, start, num_quantized),
                            shapes=kernel_shapes(k_code.codes.shape[4], q.shape[-1]))
    return impl.fn(q, k_code, v_code, cfg, start, num_quantized, num_new, rope_base,
                   interpret=interpret)


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
    return impl.fn(q, k_code, window_k, v_code, ring, cfg, start.astype(jnp.int32), num_new,
                   num_quantized)


def quantized_mask(start: jax.Array, num_quantized: jax.Array, rows: int, num_new: int,
                   slots: int) -> jax.Array:
    """bool [B, 1, R, SP]: row r (position ``start + r % T``) sees slot s iff
    ``s < num_quantized`` and ``s <= pos``."""
    pos = start[:, None] + jnp.arange(rows) % num_new  # [B, R]
    s = jnp.arange(slots)
    return ((s[None, None, :] < num_quantized[:, None, None])
            & (s[None, None, :] <= pos[:, :, None]))[:, None]
