"""Training-length attention that never materialises the L x L scores, and the dispatch between it,
the jnp reference and the platforms' fused kernels.

Dimensions: B batch, H query heads, K key/value heads (GQA: H = G * K), G = H // K, L query length,
S key length, D head dim, N key blocks of size T (S = N * T after padding).

Implementations (``TransformerConfig.attention``):

* ``"reference"``: :func:`kernels.attention_math.grouped_attention`, float32 scores
  [B, K, G, L, S] in
  memory; the specification, and the default on CPU.
* ``"blockwise"``: :func:`blockwise_attention`, the memory-efficient exact attention of Rabe &
  Staats (2021, "Self-attention does not need O(n^2) memory") with the FlashAttention backward of
  Dao (2023, "FlashAttention-2", Alg. 2): a scan over key blocks keeps a running maximum, normaliser
  and output (online softmax); the backward pass recomputes each block's probabilities from the
  saved log-sum-exp instead of storing them. Peak memory O(B H L T) instead of O(B H L S); any mask
  (causal, bidirectional, Eso-LM's permuted orders), plain jnp on every platform.
* ``"cudnn"``: ``jax.nn.dot_product_attention(implementation="cudnn")``, cuDNN's fused flash
  attention on NVIDIA GPUs, for the causal and bidirectional masks (an arbitrary mask raises).
* ``"splash"``: :func:`splash_attention`, JAX's Pallas TPU splash attention
  (``jax.experimental.pallas.ops.tpu.splash_attention``: block-sparse FlashAttention, Dao et al.
  2022 "FlashAttention" and Dao 2023 "FlashAttention-2", with the static mask's all-zero blocks
  skipped, as in Google's MaxText) for the causal and bidirectional masks; fused on chip, forward
  and backward kernels (custom VJP), GQA by the kernel's grouped heads. A per-example custom mask
  (Eso-LM's permuted orders) cannot be one of splash's static masks, and a dynamic mask would
  cost a [B, H, L, S] boolean array per layer, so ``"custom"`` falls back to ``"blockwise"``
  (:func:`fallback_reason` says so in one line). A Mosaic kernel is not partitioned by XLA, so
  under a multi-device mesh in context (``jax.set_mesh`` or ``jax.sharding.use_abstract_mesh``
  while tracing) the kernel runs inside ``jax.shard_map`` (rows over ``data``, kv heads over
  ``model``, each where it divides); with no mesh in context and several devices, over a 1-D mesh
  of ``jax.devices()`` (rows, where they divide); on one device it is called directly. TPU only
  (``interpret=True`` runs it on the CPU for tests).
* ``"auto"``: the platform's fused kernel, chosen when the program is lowered for a platform
  (``jax.lax.platform_dependent``, so a compile for another target picks that target's): splash on
  TPU, cuDNN on NVIDIA GPUs when JAX runs on one (cuDNN is looked up while tracing), blockwise
  everywhere else and for custom masks.

All return the same values as the reference to float tolerance (tests: values and gradients for every
mask kind); softmax statistics are float32 whatever the input dtype.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

IMPLEMENTATIONS = ("reference", "blockwise", "cudnn", "splash", "auto")
SPLASH_LANES = 128  # splash tiles the sequence in multiples of the TPU lane width
MASK_KINDS = ("causal", "full", "custom")


def check_implementation(implementation: str) -> None:
    """Raises ValueError for an unknown attention implementation name."""
    if implementation not in IMPLEMENTATIONS:
        raise ValueError(f"attention implementation {implementation!r} is not one of "
                         f"{IMPLEMENTATIONS}")


def check_platform(implementation: str, platform: str | None = None) -> None:
    """Raises ValueError when ``implementation`` cannot run on ``platform`` (default: JAX's default
    backend): ``"cudnn"`` needs an NVIDIA GPU, ``"splash"`` a TPU. Call it before compiling (a
    config check)."""
    check_implementation(implementation)
    platform = platform or jax.default_backend()
    if implementation == "cudnn" and platform not in ("gpu", "cuda"):
        raise ValueError(f"attention='cudnn' needs an NVIDIA GPU, but JAX runs on {platform!r}; use "
                         "attention='blockwise' (every platform) or 'reference'")
    if implementation == "splash" and platform != "tpu":
        raise ValueError(f"attention='splash' needs a TPU, but JAX runs on {platform!r}; use "
                         "attention='blockwise' (every platform) or 'reference'")


def fallback_reason(implementation: str, mask_kind: str) -> str | None:
    """One line saying why ``implementation`` runs ``mask_kind`` by another implementation, or None
    when it runs it itself: ``"splash"`` and ``"auto"`` with a ``"custom"`` mask run
    ``"blockwise"``.

    Raises:
      ValueError: an unknown implementation or mask kind.
    """
    check_implementation(implementation)
    if mask_kind not in MASK_KINDS:
        raise ValueError(f"fallback_reason: mask_kind={mask_kind!r} is not one of {MASK_KINDS}")
    if implementation in ("splash", "auto") and mask_kind == "custom":
        return (f"attention={implementation!r} runs custom (per-example) masks with 'blockwise': "
                "splash's masks are static, a dynamic one would store a [B, H, L, S] bool per "
                "layer, and cuDNN takes causal or full masks only")
    return None


def _block_mask(mask_kind: str, mask, q_pos, k_pos, k_valid):
    """bool [B or 1, 1, 1, L, T]: which (query, key) pairs of one key block may attend.

    ``q_pos`` [L] and ``k_pos`` [T] are sequence indices, ``k_valid`` [T] marks real (not padding)
    keys, ``mask`` [B or 1, L, T] is the block of a custom mask (None otherwise)."""
    allowed = k_valid[None, :]
    if mask_kind == "causal":
        allowed = allowed & (k_pos[None, :] <= q_pos[:, None])
    allowed = allowed[None]
    if mask_kind == "custom":
        allowed = allowed & mask
    return allowed[:, None, None]


def _blocks(x, block: int, axis: int):
    """Splits ``axis`` of x into [N, ..., T, ...] (N leading), zero-padding to a multiple of T."""
    s = x.shape[axis]
    n = -(-s // block)
    pad = [(0, 0)] * x.ndim
    pad[axis] = (0, n * block - s)
    x = jnp.pad(x, pad)
    x = x.reshape(*x.shape[:axis], n, block, *x.shape[axis + 1:])
    return jnp.moveaxis(x, axis, 0)


def _positions(s: int, block: int):
    """Key indices [N, T] of each block; the padding of the last block gets indices >= S."""
    n = -(-s // block)
    return jnp.arange(n * block).reshape(n, block)


def _forward(q, k, v, mask, mask_kind: str, block: int):
    """Online-softmax forward. q [B, K, G, L, D] f32, k/v [B, K, S, D]; returns (out f32
    [B, K, G, L, D], lse f32 [B, K, G, L])."""
    b, kh, g, l, d = q.shape
    s = k.shape[2]
    scale = 1.0 / jnp.sqrt(jnp.float32(d))
    kb, vb = _blocks(k, block, 2), _blocks(v, block, 2)  # [N, B, K, T, D]
    mb = _blocks(mask, block, 2) if mask is not None else None  # [N, B or 1, L, T]
    pos = _positions(s, block)  # [N, T]
    q_pos = jnp.arange(l)

    def body(carry, xs):
        m, den, acc = carry
        k_j, v_j, p_j, m_j = xs
        allowed = _block_mask(mask_kind, m_j, q_pos, p_j, p_j < s)
        scores = jnp.einsum("bkgld,bktd->bkglt", q, k_j.astype(jnp.float32)) * scale
        scores = jnp.where(allowed, scores, -jnp.inf)
        m_new = jnp.maximum(m, jnp.max(scores, axis=-1))
        m_safe = jnp.where(jnp.isfinite(m_new), m_new, 0.0)  # rows with nothing allowed yet
        p = jnp.exp(scores - m_safe[..., None])
        corr = jnp.exp(m - m_safe)
        den = den * corr + jnp.sum(p, axis=-1)
        acc = acc * corr[..., None] + jnp.einsum("bkglt,bktd->bkgld", p, v_j.astype(jnp.float32))
        return (m_new, den, acc), None

    init = (jnp.full((b, kh, g, l), -jnp.inf, jnp.float32), jnp.zeros((b, kh, g, l), jnp.float32),
            jnp.zeros((b, kh, g, l, d), jnp.float32))
    xs = (kb, vb, pos, mb if mb is not None else jnp.zeros((pos.shape[0],), bool))
    (m, den, acc), _ = jax.lax.scan(body, init, xs)
    out = acc / den[..., None]
    return out, m + jnp.log(den)


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5))
def _flash(q, k, v, mask, mask_kind, block):
    return _forward(q, k, v, mask, mask_kind, block)[0]


def _flash_fwd(q, k, v, mask, mask_kind, block):
    out, lse = _forward(q, k, v, mask, mask_kind, block)
    return out, (q, k, v, mask, out, lse)


def _flash_bwd(mask_kind, block, res, d_out):
    q, k, v, mask, out, lse = res
    d = q.shape[-1]
    s = k.shape[2]
    scale = 1.0 / jnp.sqrt(jnp.float32(d))
    kb, vb = _blocks(k, block, 2), _blocks(v, block, 2)
    mb = _blocks(mask, block, 2) if mask is not None else None
    pos = _positions(s, block)
    q_pos = jnp.arange(q.shape[3])
    delta = jnp.sum(d_out * out, axis=-1)  # [B, K, G, L]: rowsum(dO * O)

    def body(dq, xs):
        k_j, v_j, p_j, m_j = xs
        k_f, v_f = k_j.astype(jnp.float32), v_j.astype(jnp.float32)
        allowed = _block_mask(mask_kind, m_j, q_pos, p_j, p_j < s)
        scores = jnp.einsum("bkgld,bktd->bkglt", q, k_f) * scale
        p = jnp.where(allowed, jnp.exp(scores - lse[..., None]), 0.0)
        dv = jnp.einsum("bkglt,bkgld->bktd", p, d_out)
        dp = jnp.einsum("bkgld,bktd->bkglt", d_out, v_f)
        ds = p * (dp - delta[..., None]) * scale
        dq = dq + jnp.einsum("bkglt,bktd->bkgld", ds, k_f)
        dk = jnp.einsum("bkglt,bkgld->bktd", ds, q)
        return dq, (dk, dv)

    xs = (kb, vb, pos, mb if mb is not None else jnp.zeros((pos.shape[0],), bool))
    dq, (dk, dv) = jax.lax.scan(body, jnp.zeros_like(q), xs)

    def unblock(x):  # [N, B, K, T, D] -> [B, K, S, D]
        n, b, kh, t, dd = x.shape
        return jnp.moveaxis(x, 0, 2).reshape(b, kh, n * t, dd)[:, :, :s]

    d_mask = None if mask is None else np.zeros(mask.shape, jax.dtypes.float0)  # bool: no tangent
    return dq, unblock(dk).astype(k.dtype), unblock(dv).astype(v.dtype), d_mask


_flash.defvjp(_flash_fwd, _flash_bwd)


def blockwise_attention(q: jax.Array, k: jax.Array, v: jax.Array, *, mask_kind: str = "causal",
                        mask: jax.Array | None = None, block_size: int = 512) -> jax.Array:
    """Exact softmax attention without the L x S score matrix (see the module docstring).

    Args:
      q: [B, H, L, D] queries (any float dtype); k, v: [B, K, S, D] with H = G * K.
      mask_kind: ``"causal"`` (query i sees keys j <= i; needs L = S), ``"full"`` (bidirectional),
        or ``"custom"`` (``mask`` below).
      mask: bool [B or 1, L, S] (True = may attend), only with ``mask_kind="custom"``. Every query row
        must allow at least one key (as for the reference).
      block_size: T, keys per block (the last block is zero-padded and masked).

    Returns:
      [B, H, L, D] in ``q``'s dtype; float32 accumulation. Differentiable in q, k and v (custom VJP:
      the backward recomputes each block's probabilities from the saved log-sum-exp).

    Raises:
      ValueError: shapes that do not fit together, an unknown ``mask_kind``, a mask given with
        another kind or missing with ``"custom"``, ``block_size < 1``.
    """
    if q.ndim != 4 or k.ndim != 4 or k.shape != v.shape:
        raise ValueError(f"blockwise_attention: q must be [B, H, L, D] and k, v [B, K, S, D] of one "
                         f"shape, got q {q.shape}, k {k.shape}, v {v.shape}")
    b, h, l, d = q.shape
    kh, s = k.shape[1], k.shape[2]
    if k.shape[0] != b or k.shape[3] != d or h % kh:
        raise ValueError(f"blockwise_attention: q {q.shape} and k {k.shape} disagree on batch or "
                         "head dim, or H is not a multiple of K")
    if mask_kind not in MASK_KINDS:
        raise ValueError(f"blockwise_attention: mask_kind={mask_kind!r} is not one of {MASK_KINDS}")
    if (mask is not None) != (mask_kind == "custom"):
        raise ValueError("blockwise_attention: pass a mask exactly when mask_kind='custom'")
    if mask_kind == "causal" and l != s:
        raise ValueError(f"blockwise_attention: a causal mask needs L = S, got L={l}, S={s}")
    if mask is not None and (mask.ndim != 3 or mask.shape[1:] != (l, s)
                             or mask.shape[0] not in (1, b)):
        raise ValueError(f"blockwise_attention: mask must be [B or 1, L, S] = [{b} or 1, {l}, {s}], "
                         f"got {mask.shape}")
    if block_size < 1:
        raise ValueError(f"blockwise_attention: block_size={block_size} must be >= 1")
    qg = q.reshape(b, kh, h // kh, l, d).astype(jnp.float32)
    out = _flash(qg, k, v, None if mask is None else mask.astype(bool), mask_kind,
                 min(block_size, s))
    return out.reshape(b, h, l, d).astype(q.dtype)


def _round_up(n: int, m: int) -> int:
    return -(-n // m) * m


def _splash_local(q, k, v, *, mask_kind: str, l: int, s: int, block: int, interpret: bool):
    """The splash kernel on one device's rows and heads. q [B, H, Lp, D] (already scaled by
    1/sqrt(D)), k/v [B, K, Sp, D] with Lp, Sp multiples of ``block``; the true lengths are l, s."""
    from jax.experimental.pallas.ops.tpu import splash_attention as sa

    h, lp, sp = q.shape[1], q.shape[2], k.shape[2]
    head = sa.CausalMask((lp, sp)) if mask_kind == "causal" else sa.FullMask((lp, sp))
    sizes = sa.BlockSizes(block_q=block, block_kv=block, block_kv_compute=block,
                          block_q_dkv=block, block_kv_dkv=block, block_kv_dkv_compute=block,
                          block_q_dq=block, block_kv_dq=block)
    kernel = sa.make_splash_mha(sa.MultiHeadMask([head] * h), block_sizes=sizes, head_shards=1,
                                q_seq_shards=1, interpret=interpret)
    segments = None
    if mask_kind == "full" and sp > s:
        # padding keys form their own segment: real queries never see them, padding queries (the
        # rows dropped afterwards) do, so no row is empty
        segments = sa.SegmentIds(q=(jnp.arange(lp) >= l).astype(jnp.int32),
                                 kv=(jnp.arange(sp) >= s).astype(jnp.int32))
    # causal: padding keys sit after every real query, which the causal mask already hides
    return jax.vmap(lambda q1, k1, v1: kernel(q1, k1, v1, segment_ids=segments))(q, k, v)


def splash_attention(q: jax.Array, k: jax.Array, v: jax.Array, *, mask_kind: str = "causal",
                     block_size: int = 512, interpret: bool = False) -> jax.Array:
    """Exact softmax attention by JAX's Pallas TPU splash attention kernel (module docstring).

    Args:
      q: [B, H, L, D] queries (bfloat16 or float32); k, v: [B, K, S, D] with H = G * K (query head
        h reads kv head h // G, as in the reference).
      mask_kind: ``"causal"`` (needs L = S) or ``"full"`` (bidirectional). Custom masks are not
        supported here (:func:`attention` runs them by :func:`blockwise_attention`).
      block_size: query and key tile of the forward and backward kernels, rounded up to a multiple
        of 128 (the TPU lane width) and capped at the padded length; L and S are zero-padded to a
        multiple of it (padding keys are masked, padding queries dropped).
      interpret: run the Pallas kernels in interpret mode (any platform, slow: tests).

    Returns:
      [B, H, L, D] in ``q``'s dtype; the kernel accumulates in float32 (scores, softmax statistics
      and output), with q @ k and p @ v multiplied in the input dtype. Differentiable in q, k and v
      (the kernel's custom VJP: FlashAttention-2 backward from the saved log-sum-exp).

    Raises:
      ValueError: shapes that do not fit together, a mask kind other than causal / full,
        ``block_size < 1``.
    """
    if q.ndim != 4 or k.ndim != 4 or k.shape != v.shape:
        raise ValueError(f"splash_attention: q must be [B, H, L, D] and k, v [B, K, S, D] of one "
                         f"shape, got q {q.shape}, k {k.shape}, v {v.shape}")
    b, h, l, d = q.shape
    kh, s = k.shape[1], k.shape[2]
    if k.shape[0] != b or k.shape[3] != d or h % kh:
        raise ValueError(f"splash_attention: q {q.shape} and k {k.shape} disagree on batch or head "
                         "dim, or H is not a multiple of K")
    if mask_kind not in ("causal", "full"):
        raise ValueError(f"splash_attention: mask_kind={mask_kind!r} is not one of ('causal', "
                         "'full'); custom masks run by blockwise_attention")
    if mask_kind == "causal" and l != s:
        raise ValueError(f"splash_attention: a causal mask needs L = S, got L={l}, S={s}")
    if block_size < 1:
        raise ValueError(f"splash_attention: block_size={block_size} must be >= 1")
    block = min(_round_up(block_size, SPLASH_LANES), _round_up(max(l, s), SPLASH_LANES))
    lp, sp = _round_up(l, block), _round_up(s, block)
    scale = 1.0 / np.sqrt(d)
    qs = jnp.pad((q.astype(jnp.float32) * scale).astype(q.dtype),
                 ((0, 0), (0, 0), (0, lp - l), (0, 0)))
    ks = jnp.pad(k.astype(q.dtype), ((0, 0), (0, 0), (0, sp - s), (0, 0)))
    vs = jnp.pad(v.astype(q.dtype), ((0, 0), (0, 0), (0, sp - s), (0, 0)))
    local = functools.partial(_splash_local, mask_kind=mask_kind, l=l, s=s, block=block,
                              interpret=interpret)
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty and jax.device_count() > 1:
        mesh = jax.sharding.Mesh(np.asarray(jax.devices()), ("data",))
    if not mesh.empty and mesh.size > 1:
        # A Mosaic kernel is not partitioned by XLA: run it per device on its rows and heads.
        names = mesh.axis_names
        rows = "data" if "data" in names and b % mesh.shape["data"] == 0 else None
        heads = "model" if "model" in names and kh % mesh.shape["model"] == 0 else None
        spec = jax.sharding.PartitionSpec(rows, heads, None, None)
        local = jax.shard_map(local, mesh=mesh, in_specs=(spec, spec, spec), out_specs=spec,
                              check_vma=False)
    return local(qs, ks, vs)[:, :, :l]


def attention(q: jax.Array, k: jax.Array, v: jax.Array, *, implementation: str, mask_kind: str,
              mask: jax.Array | None = None, block_size: int = 512,
              interpret: bool = False) -> jax.Array:
    """Full-sequence attention by the named implementation (see the module docstring).

    Args:
      q: [B, H, L, D]; k, v: [B, K, S, D].
      implementation: one of :data:`IMPLEMENTATIONS` (``"auto"``: chosen at lowering, module
        docstring).
      mask_kind: ``"causal"``, ``"full"`` or ``"custom"``; mask: bool [B or 1, L, S] for custom.
      block_size: key block of the blockwise implementation, query and key tile of splash.
      interpret: run splash's Pallas kernels in interpret mode (tests on the CPU).

    Returns:
      [B, H, L, D] in ``q``'s dtype.

    Raises:
      ValueError: an unknown implementation, or ``"cudnn"`` with a custom mask.
    """
    from kernels.attention_math import grouped_attention

    check_implementation(implementation)
    fused = fallback_reason(implementation, mask_kind) is None
    if implementation == "splash" and fused:
        return splash_attention(q, k, v, mask_kind=mask_kind, block_size=block_size,
                                interpret=interpret)
    if implementation == "auto" and fused:
        blockwise = functools.partial(blockwise_attention, mask_kind=mask_kind,
                                      block_size=block_size)
        on_gpu = jax.default_backend() == "gpu"
        return jax.lax.platform_dependent(
            q, k, v, default=blockwise,
            tpu=functools.partial(splash_attention, mask_kind=mask_kind, block_size=block_size),
            cuda=functools.partial(attention, implementation="cudnn", mask_kind=mask_kind)
            if on_gpu else blockwise)
    if implementation in ("blockwise", "splash", "auto"):
        return blockwise_attention(q, k, v, mask_kind=mask_kind, mask=mask, block_size=block_size)
    if implementation == "cudnn":
        if mask_kind == "custom":
            raise ValueError("attention='cudnn' supports the causal and bidirectional masks only; "
                             "use attention='blockwise' for custom masks (e.g. Eso-LM)")
        out = jax.nn.dot_product_attention(
            q.transpose(0, 2, 1, 3), k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3),
            is_causal=mask_kind == "causal", implementation="cudnn")
        return out.transpose(0, 2, 1, 3)
    l, s = q.shape[2], k.shape[2]
    if mask_kind == "causal":
        full_mask = jnp.tril(jnp.ones((l, s), bool))[None]
    elif mask_kind == "full":
        full_mask = jnp.ones((1, l, s), bool)
    else:
        full_mask = mask
    return grouped_attention(q, k, v, full_mask[:, None, None, :, :])


__all__ = ["IMPLEMENTATIONS", "MASK_KINDS", "attention", "blockwise_attention",
           "check_implementation", "check_platform", "fallback_reason", "splash_attention"]
