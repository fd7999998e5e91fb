"""Quality of quantized KV caches: attention-output error of QVG / QVG-Pro / KIVI round trips on
captured activations and on synthetic long-context keys with outlier channels.

Dimensions: B batch, H query heads, K kv heads, L query positions, S key positions, D head dim,
C synthetic clusters, Q synthetic queries.

The error measure is the relative Frobenius error of the attention output,
``||attn(q, k_hat, v_hat) - attn(q, k, v)|| / ||attn(q, k, v)||``, in float32, accumulated over
layers as ``sqrt(sum ||err||^2 / sum ||exact||^2)`` (the measure of Quant VideoGen's Table 2
applied to attention outputs rather than to generated frames).

Every function here returns Python floats or concrete arrays, so bad values are refused with a
``ValueError`` (NaN or infinite activations, a zero reference norm) instead of a NaN result; only
:func:`attention` and :func:`roundtrip` may be traced, and then a non-finite input gives NaN.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import jax
import jax.numpy as jnp

from algorithms.kv_budget.entrokv import check_finite
from kernels import attention_math, checks
from kernels.kv_quant import reference as ref
from kernels.kv_quant.reference import KIVIConfig, QVGConfig
from kernels.rope import rope_slots


def _check_qkv(q, k, v, where: str) -> None:
    checks.array(q, "q", where, ndim=4, kind="float")
    checks.array(k, "k", where, ndim=4, kind="float")
    b, h, _, d = q.shape
    checks.array(k, "k", where, shape=(b, None, None, d))
    checks.array(v, "v", where, ndim=4, kind="float", shape=k.shape)
    if h % k.shape[1]:
        raise checks.error(where, "k", f"[B, K, S, D] with K dividing the {h} query heads",
                           f"K={k.shape[1]}")
    for name, x in (("q", q), ("k", k), ("v", v)):
        check_finite(x, name, where)


def attention(q: jax.Array, k: jax.Array, v: jax.Array, causal: bool = True) -> jax.Array:
    """Exact grouped attention in float32: q [B, H, L, D], k, v [B, K, S, D] -> [B, H, L, D]
    (causal: query l sees keys s <= l + S - L; scores scaled by 1 / sqrt(D)).

    Raises:
      ValueError: not float arrays of rank 4 with matching B and D, v not of k's shape; H not a
        multiple of K; causal with L > S (a query row would see no key); outside ``jit``, a NaN
        or infinite entry (traced, it gives NaN outputs).
    """
    _check_qkv(q, k, v, "attention")
    l, s = q.shape[2], k.shape[2]
    if causal and l > s:
        raise checks.error("attention", "q", f"at most S = {s} query positions when causal",
                           f"L = {l}")
    mask = jnp.tril(jnp.ones((l, s), bool), s - l) if causal else jnp.ones((l, s), bool)
    return attention_math.grouped_attention(q.astype(jnp.float32), k, v, mask[None, None, None])


def relative_error(a: jax.Array, b: jax.Array) -> float:
    """``||a - b|| / ||b||`` (Frobenius, in float32), a Python float; ``b`` is the reference.

    Raises:
      ValueError: shapes differ; a NaN or infinite entry in ``a`` or ``b``; ``||b|| == 0``.
    """
    where = "relative_error"
    checks.array(a, "a", where, kind="real")
    checks.array(b, "b", where, kind="real", shape=tuple(a.shape))
    check_finite(a, "a", where)
    check_finite(b, "b", where)
    norm_b = jnp.linalg.norm(jnp.asarray(b, jnp.float32))
    if not float(norm_b) > 0:
        raise checks.error(where, "b", "a reference with a non-zero norm", "||b|| = 0")
    return float(jnp.linalg.norm(jnp.asarray(a, jnp.float32) - jnp.asarray(b, jnp.float32))
                 / norm_b)


def roundtrip(cfg: QVGConfig | KIVIConfig, k: jax.Array, v: jax.Array, key: jax.Array,
              pre_rope_base=None) -> tuple[jax.Array, jax.Array]:
    """Quantize then dequantize keys and values [B, K, N, D] (N a multiple of the chunk).

    QVG: keys are un-rotated first and re-rotated after when ``pre_rope_base`` is set (keys
    stored before RoPE, Quant VideoGen Sec. 3); values use ``fold_in(key, 1)``. KIVI: keys per
    channel, values per token, each chunk on its own.

    Returns:
      (k_hat, v_hat) float32 [B, K, N, D].

    Raises:
      ValueError: outside ``jit``, a NaN or infinite entry of ``k`` or ``v``; as the quantizer.
    """
    check_finite(k, "k", "roundtrip")
    check_finite(v, "v", "roundtrip")
    if isinstance(cfg, KIVIConfig):
        return ref.kivi_roundtrip(k, v, cfg)
    kk = k if pre_rope_base is None else rope_slots(k, pre_rope_base, 0, sign=-1)
    k_hat = ref.qvg_roundtrip(kk, cfg, key)
    if pre_rope_base is not None:
        k_hat = rope_slots(k_hat, pre_rope_base, 0)
    return k_hat, ref.qvg_roundtrip(v, cfg, jax.random.fold_in(key, 1))


def attention_error(acts: Sequence[tuple[jax.Array, jax.Array, jax.Array]],
                    cfg: QVGConfig | KIVIConfig, key: jax.Array, pre_rope_base=None) -> float:
    """Relative attention-output error over layers (module docstring) of the round trip.

    Args:
      acts: per layer (q [B, H, N, D], k, v [B, K, N, D]) with RoPE applied (e.g. from
        :func:`models.capture.capture_attention_inputs`).
      cfg: the quantizer; key: PRNG key (layer i uses ``fold_in(key, i)``).
      pre_rope_base: for QVG, quantize keys before RoPE with this base.

    Raises:
      ValueError: no layers; a layer's q, k or v malformed or not finite (the layer is named);
        a non-finite round trip; exact outputs that are all zero.
    """
    where = "attention_error"
    if len(acts) == 0:
        raise checks.error(where, "acts", "at least one layer's (q, k, v)", "an empty sequence")
    for i, (q, k, v) in enumerate(acts):  # every layer before any work
        _check_qkv(q, k, v, f"{where} (layer {i})")
    num = den = 0.0
    for i, (q, k, v) in enumerate(acts):
        k_hat, v_hat = roundtrip(cfg, k, v, jax.random.fold_in(key, i), pre_rope_base)
        check_finite(k_hat, "the dequantized keys", f"{where} (layer {i})")
        check_finite(v_hat, "the dequantized values", f"{where} (layer {i})")
        exact = attention(q, k, v)
        num += float(jnp.sum((attention(q, k_hat, v_hat) - exact) ** 2))
        den += float(jnp.sum(exact ** 2))
    if not den > 0:
        raise checks.error(where, "acts", "activations with a non-zero exact attention output",
                           "all-zero outputs")
    return math.sqrt(num / den)


def synthetic_keys(key: jax.Array, tokens: int, head_dim: int, heads: int, clusters: int,
                   outlier_channels: int, queries: int) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Long-context keys and values with cluster structure and outlier key channels.

    Keys and values are cluster centres (standard normal, ``clusters`` per head) plus 0.3 N(0, 1)
    noise; the first ``outlier_channels`` key channels are scaled by 10 (the outlier channels
    KIVI's per-channel key quantization is built for) and the queries, standard normal, by 1/10
    there.

    Returns:
      (q [1, K, Q, D], k [1, K, N, D], v [1, K, N, D]) float32 with K = ``heads``.

    Raises:
      ValueError: a size not an integer >= 1, or ``outlier_channels`` not in [0, head_dim].
    """
    for name, value in (("tokens", tokens), ("head_dim", head_dim), ("heads", heads),
                        ("clusters", clusters), ("queries", queries)):
        checks.integer(value, name, "synthetic_keys", minimum=1)
    checks.integer(outlier_channels, "outlier_channels", "synthetic_keys", minimum=0,
                   maximum=head_dim)
    ks = jax.random.split(key, 6)
    centers_k = jax.random.normal(ks[0], (heads, clusters, head_dim))
    centers_v = jax.random.normal(ks[1], (heads, clusters, head_dim))
    lab = jax.random.randint(ks[2], (heads, tokens), 0, clusters)
    take = jax.vmap(lambda cen, a: cen[a])
    k = take(centers_k, lab) + 0.3 * jax.random.normal(ks[3], (heads, tokens, head_dim))
    v = take(centers_v, lab) + 0.3 * jax.random.normal(ks[4], (heads, tokens, head_dim))
    outlier = jnp.ones((head_dim,)).at[:outlier_channels].set(10.0)
    q = jax.random.normal(ks[5], (heads, queries, head_dim)) / outlier
    return q[None], (k * outlier)[None], v[None]


def synthetic_error(q: jax.Array, k: jax.Array, v: jax.Array, cfg: QVGConfig | KIVIConfig,
                    key: jax.Array) -> dict[str, float]:
    """Attention and key errors of the round trip on :func:`synthetic_keys` (no causal mask).

    Returns:
      {"rel_err", "key_rel_err", "compression", "effective_bits"} (the last two from
      :func:`kernels.kv_quant.reference.effective_bits`).

    Raises:
      ValueError: as :func:`attention` and :func:`relative_error` (non-finite inputs or round
        trips, a zero reference).
    """
    exact = attention(q, k, v, causal=False)
    k_hat, v_hat = roundtrip(cfg, k, v, key)
    bits = ref.effective_bits(cfg, k.shape[-1])
    return {"rel_err": relative_error(attention(q, k_hat, v_hat, causal=False), exact),
            "key_rel_err": relative_error(k_hat, k), "compression": bits["compression"],
            "effective_bits": bits["effective"]}
