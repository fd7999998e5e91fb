"""Quantized KV cache: the jnp specification of QVG and KIVI (quantize, dequantize, attention).

Dimensions: B batch, K kv heads, H query heads (H = G * K), G queries per kv head, T new tokens,
N tokens in a chunk, D head dim, C centroids (k-means clusters), S residual stages, NB = D / block
scale blocks per token, P = D * bits / 8 packed bytes per token, NG = N / group token groups (KIVI).

QVG (Quant VideoGen, ICML 2026), Sec. 3: per (batch, kv head) and chunk of N tokens,

* semantic-aware smoothing: k-means (Euclidean, k-means++ seeding, Lloyd steps) over the chunk's
  vectors; each vector keeps its centroid id a_1 (uint8) and is replaced by its residual
  x - C_1[a_1], which is small because similar tokens share a centroid;
* progressive residual quantization: S stages of the same on the residual of the previous stage
  (QVG: S = 1; QVG-Pro: S = 4);
* the final residual r is quantized per token in blocks of ``block`` channels, symmetric INTn with
  ``scale = max|r| / (2^(n-1) - 1)`` stored as bfloat16 (rounded up), codes bit-packed into bytes.

Scale format. The paper stores FP8 E4M3 scales; E4M3's largest value is 448 and its smallest
normal 2^-6, so a block with ``max|r| > 448 (2^(n-1) - 1)`` had an infinite scale (dequantizing to
NaN) and small blocks lost their scale to subnormal rounding or zero. bfloat16 has float32's
exponent range: every finite float32 block gets a finite, non-zero scale (clamped to bfloat16's
largest finite value, 3.39e38), for 8 more bits per block (``effective_bits`` counts 16). Rounding
the scale up keeps ``|r| <= qmax * scale``, so the error is at most ``scale / 2`` per element.

Dequantization is ``x_hat = sum_s C_s[a_s] + scale * q``.

KIVI (Liu et al. 2024, "KIVI: A Tuning-Free Asymmetric 2bit Quantization for KV Cache", Sec. 3-4):
asymmetric INTn (``x_hat = zero + scale * q``, q in [0, 2^n - 1]); keys per channel with the
statistics taken over groups of ``group`` tokens, values per token over blocks of ``block``
channels; the most recent tokens stay in full precision (handled by the cache in ``cache.py``).
KIVI's scale and zero are 16-bit; we store them as bfloat16 rather than float16 (whose largest
value, 65504, a key channel can exceed: the zero then overflowed to inf and dequantized to NaN),
with the zero rounded down and the scale rounded up so that every element stays inside
``[zero, zero + qmax * scale]``.

Packing layout ("planar"): with ``ppb = 8 / bits`` codes per byte and ``P = D / ppb`` bytes per
token, byte ``i`` holds channels ``i, i + P, ..., i + (ppb - 1) P`` at bit offsets ``0, bits, ...``,
so unpacking is ``ppb`` shifted masks whose concatenation is the natural channel order (what the
Pallas kernels and the fused XLA path exploit). Packing itself is :func:`kernels.packing.pack_codes`
(8-bit words).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp

from kernels import attention_math, checks, packing
from kernels.rope import rope_slots

SCALE_DTYPE = jnp.bfloat16
CENTROID_DTYPE = jnp.bfloat16
VALID_BITS = (2, 4, 8)


def _check_bits(bits: int, where: str) -> None:
    if bits not in VALID_BITS:
        raise ValueError(f"{where}: bits={bits} is not supported; expected one of {VALID_BITS}")


def _check_block(block: int, head_dim: int, where: str) -> None:
    if block < 1 or head_dim % block:
        raise ValueError(f"{where}: block={block} must be >= 1 and divide the head dim {head_dim}")


# ----------------------------------------------------------------------------------------------
# Configurations


@dataclasses.dataclass(frozen=True)
class QVGConfig:
    """Static hyper-parameters of QVG quantization (hashable).

    Attributes:
      bits: n of the INTn residual codes, in {2, 4, 8}.
      stages: S >= 0 k-means stages (0 = plain per-block INTn, no smoothing).
      block: channels per scale block; must divide the head dim.
      num_centroids: C in [1, 256] (uint8 assignments); at most the chunk length.
      chunk: N tokens clustered together (per batch row and kv head).
      kmeans_iters: Lloyd iterations per stage.
      pre_rope: quantize keys before RoPE (QVG's choice; the cache undoes and re-applies RoPE).
      seed: k-means++ seeding key.
    """

    bits: int = 2
    stages: int = 1
    block: int = 64
    num_centroids: int = 256
    chunk: int = 1024
    kmeans_iters: int = 10
    pre_rope: bool = True
    seed: int = 0

    def __post_init__(self):
        _check_bits(self.bits, "QVGConfig")
        for name, low in (("stages", 0), ("block", 1), ("num_centroids", 1), ("chunk", 1),
                          ("kmeans_iters", 0), ("seed", None)):
            checks.integer(getattr(self, name), name, "QVGConfig", minimum=low)
        if self.pre_rope not in (True, False):
            raise checks.error("QVGConfig", "pre_rope", "a bool", repr(self.pre_rope))
        if self.stages < 0:
            raise ValueError(f"QVGConfig: stages={self.stages} must be >= 0")
        if not 1 <= self.num_centroids <= 256:
            raise ValueError(f"QVGConfig: num_centroids={self.num_centroids} must be in [1, 256] "
                             "(assignments are uint8)")
        if self.chunk < 1 or (self.stages and self.num_centroids > self.chunk):
            raise ValueError(f"QVGConfig: chunk={self.chunk} must be >= 1 and >= num_centroids="
                             f"{self.num_centroids}")
        if self.kmeans_iters < 0:
            raise ValueError(f"QVGConfig: kmeans_iters={self.kmeans_iters} must be >= 0")

    def check_head_dim(self, head_dim: int) -> None:
        """Raises ValueError unless ``block`` divides ``head_dim`` and the codes pack into bytes."""
        _check_block(self.block, head_dim, "QVGConfig")
        if head_dim % (8 // self.bits):
            raise ValueError(f"QVGConfig: head dim {head_dim} must be a multiple of "
                             f"{8 // self.bits} to pack {self.bits}-bit codes into bytes")


def qvg_preset(name: str, bits: int = 2, **overrides) -> QVGConfig:
    """The paper's presets: ``"qvg"`` (S = 1, block 64) and ``"qvg_pro"`` (S = 4, block 16).

    Raises:
      ValueError: unknown name or invalid overrides.
    """
    presets = {"qvg": dict(stages=1, block=64), "qvg_pro": dict(stages=4, block=16)}
    if name not in presets:
        raise ValueError(f"unknown QVG preset {name!r}; expected one of {sorted(presets)}")
    return QVGConfig(bits=bits, **{**presets[name], **overrides})


@dataclasses.dataclass(frozen=True)
class KIVIConfig:
    """KIVI hyper-parameters (hashable).

    Attributes:
      bits: n in {2, 4, 8} (the paper's headline is 2).
      group: tokens per key-statistics group (keys are quantized per channel).
      block: channels per value block (values are quantized per token).
      residual: full-precision recent tokens; quantization happens ``residual`` tokens at a time,
        so it must be a multiple of ``group``.
    """

    bits: int = 2
    group: int = 32
    block: int = 32
    residual: int = 128

    def __post_init__(self):
        _check_bits(self.bits, "KIVIConfig")
        for name in ("group", "block", "residual"):
            checks.integer(getattr(self, name), name, "KIVIConfig", minimum=1)
        if self.group < 1 or self.residual < 1 or self.residual % self.group:
            raise ValueError(f"KIVIConfig: residual={self.residual} must be a positive multiple of "
                             f"group={self.group}")

    @property
    def chunk(self) -> int:
        return self.residual

    def check_head_dim(self, head_dim: int) -> None:
        _check_block(self.block, head_dim, "KIVIConfig")
        if head_dim % (8 // self.bits):
            raise ValueError(f"KIVIConfig: head dim {head_dim} must be a multiple of "
                             f"{8 // self.bits}")


@dataclasses.dataclass(frozen=True)
class QuantizerSettings:
    """What the QVG, QVG-Pro and KIVI quantizers of one run share or set (hashable).

    Attributes:
      bits: n of every quantizer. chunk: tokens per k-means chunk (QVG) = KIVI's full-precision
        residual. num_centroids, kmeans_iters, seed: QVG's k-means.
      qvg_block, qvg_pro_block: channels per residual block (clamped to the head dim).
      qvg_pro_stages: QVG-Pro's residual stages S.
      kivi_group: tokens per key-statistics group. kivi_block: channels per value block (clamped).
    """

    bits: int
    chunk: int
    num_centroids: int
    kmeans_iters: int
    seed: int
    qvg_block: int
    qvg_pro_block: int
    qvg_pro_stages: int
    kivi_group: int
    kivi_block: int

    @classmethod
    def of(cls, fields) -> QuantizerSettings:
        """The settings read from any object with attributes of the same names (a run config).

        Raises:
          ValueError: ``fields`` lacks one of them (naming those missing).
        """
        names = [f.name for f in dataclasses.fields(cls)]
        missing = [n for n in names if not hasattr(fields, n)]
        if missing:
            raise ValueError(f"QuantizerSettings.of: the fields {missing} are missing; expected "
                             f"an object with attributes {names}")
        return cls(**{n: getattr(fields, n) for n in names})


def quantizer_configs(settings, head_dim: int) -> dict[str, QVGConfig | KIVIConfig]:
    """The quantizers of a run: ``"qvg"`` and ``"qvg_pro"`` (the paper presets,
    :func:`qvg_preset`, keys stored before RoPE), ``"qvg_post_rope"`` (the ``"qvg"`` preset with
    ``pre_rope=False``: keys stored after RoPE, as the model computes them, at the same bits per
    element) and ``"kivi"``, at ``settings``' bits, chunk and k-means, with their blocks clamped to
    ``head_dim``.

    Args:
      settings: a :class:`QuantizerSettings`, or any object with its attributes (a run config).
      head_dim: D of the keys and values.

    Raises:
      ValueError: settings a quantizer refuses (as :class:`QVGConfig` / :class:`KIVIConfig`).
    """
    common_qvg = dict(bits=settings.bits, num_centroids=settings.num_centroids,
                      chunk=settings.chunk, kmeans_iters=settings.kmeans_iters, seed=settings.seed)
    qvg = qvg_preset("qvg", block=min(settings.qvg_block, head_dim), **common_qvg)
    return {"qvg": qvg, "qvg_post_rope": dataclasses.replace(qvg, pre_rope=False),
            "qvg_pro": qvg_preset("qvg_pro", block=min(settings.qvg_pro_block, head_dim),
                                  stages=settings.qvg_pro_stages, **common_qvg),
            "kivi": KIVIConfig(bits=settings.bits, group=settings.kivi_group,
                               block=min(settings.kivi_block, head_dim),
                               residual=settings.chunk)}


# ----------------------------------------------------------------------------------------------
# Symmetric per-token block INTn (QVG's residual quantizer)


def _bf16_up(x: jax.Array) -> jax.Array:
    """float32 x >= 0 -> the smallest bfloat16 >= x, clamped to bfloat16's largest finite value."""
    big = float(jnp.finfo(jnp.bfloat16).max)
    x = jnp.minimum(x, big)
    y = x.astype(jnp.bfloat16)
    up = jnp.nextafter(y, jnp.asarray(jnp.inf, jnp.bfloat16))
    return jnp.where((y.astype(jnp.float32) < x) & (up.astype(jnp.float32) <= big), up, y)


def _bf16_down(x: jax.Array) -> jax.Array:
    """float32 x (finite) -> the largest bfloat16 <= x (bfloat16's lowest finite value at worst)."""
    lowest = float(jnp.finfo(jnp.bfloat16).min)
    x = jnp.maximum(x, lowest)
    y = x.astype(jnp.bfloat16)
    down = jnp.nextafter(y, jnp.asarray(-jnp.inf, jnp.bfloat16))
    return jnp.where((y.astype(jnp.float32) > x) & (down.astype(jnp.float32) >= lowest), down, y)


def quantize_symmetric(x: jax.Array, bits: int, block: int) -> tuple[jax.Array, jax.Array]:
    """Symmetric INTn per token in blocks of ``block`` channels, bfloat16 scales (QVG Sec. 3).

    ``scale = max|x_block| / (2^(n-1) - 1)`` rounded up to bfloat16; ``q = clip(round(x / scale))``
    in ``[-(2^(n-1) - 1), 2^(n-1) - 1]`` (so INT2 uses {-1, 0, 1}); stored as ``q + 2^(n-1)``.
    For finite x the scale is finite and ``|x - scale * q| <= scale / 2`` (exactly, up to the
    float32 rounding of ``x / scale``); an all-zero block gets scale 0 and codes for 0.

    Args:
      x: float [..., D].

    Returns:
      (packed codes uint8 [..., D * bits / 8], scales bfloat16 [..., D / block]).

    Raises:
      ValueError: bits not in {2, 4, 8}; block does not divide D.
    """
    _check_bits(bits, "quantize_symmetric")
    d = x.shape[-1]
    _check_block(block, d, "quantize_symmetric")
    qmax = 2 ** (bits - 1) - 1
    xb = x.astype(jnp.float32).reshape(*x.shape[:-1], d // block, block)
    scale = _bf16_up(jnp.max(jnp.abs(xb), axis=-1) / qmax)
    s = scale.astype(jnp.float32)[..., None]
    q = jnp.where(s > 0, jnp.clip(jnp.round(xb / jnp.where(s > 0, s, 1.0)), -qmax, qmax), 0.0)
    codes = (q + 2 ** (bits - 1)).astype(jnp.uint8).reshape(x.shape)
    return packing.pack_codes(codes, bits), scale


def dequantize_symmetric(packed: jax.Array, scales: jax.Array, bits: int) -> jax.Array:
    """float32 [..., D] from :func:`quantize_symmetric`'s output."""
    q = packing.unpack_codes(packed, bits).astype(jnp.float32) - 2 ** (bits - 1)
    nb = scales.shape[-1]
    s = jnp.repeat(scales.astype(jnp.float32), q.shape[-1] // nb, axis=-1)
    return q * s


# ----------------------------------------------------------------------------------------------
# k-means


def kmeans_objective(x: jax.Array, centroids: jax.Array, assign: jax.Array) -> jax.Array:
    """Sum of squared distances ``sum_i ||x_i - c_{a_i}||^2`` (float32 scalar) for x [N, D]."""
    diff = x.astype(jnp.float32) - centroids.astype(jnp.float32)[assign]
    return jnp.sum(diff * diff)


def _sq_dists(x: jax.Array, c: jax.Array) -> jax.Array:
    """[N, C] squared Euclidean distances ``sum_d (x_nd - c_kd)^2``, summed from the differences.

    The expansion ``|x|^2 - 2 x.c + |c|^2`` is not used: in float32 its terms grow with the
    data's common offset while the distances do not (at an offset of 100 and a spread of 0.1 it
    sends about half of the points to a centroid that is not their nearest). XLA fuses the
    broadcast difference into the reduction, so no [N, C, D] array is materialised.
    """
    diff = x[:, None, :] - c[None, :, :]
    return jnp.sum(diff * diff, -1)


def kmeans_pp_init(x: jax.Array, k: int, key: jax.Array) -> jax.Array:
    """k-means++ seeding (Arthur & Vassilvitskii 2007): each new centroid is drawn with probability
    proportional to the squared distance to the nearest chosen one (uniform when all are 0).

    Args:
      x: float [N, D]; k: 1 <= k <= N.

    Returns:
      float32 [k, D].
    """
    x = x.astype(jnp.float32)
    n = x.shape[0]
    u = jax.random.uniform(key, (k,))  # drawn once: inverse-CDF sampling inside the loop
    first = x[jnp.minimum((u[0] * n).astype(jnp.int32), n - 1)]
    cents = jnp.zeros((k, x.shape[1]), jnp.float32).at[0].set(first)
    d2 = jnp.sum((x - first) ** 2, -1)

    def body(i, carry):
        cents, d2 = carry
        cdf = jnp.cumsum(d2)
        total = cdf[-1]
        idx_d2 = jnp.searchsorted(cdf, u[i] * total, side="right")
        idx_unif = (u[i] * n).astype(jnp.int32)
        idx = jnp.minimum(jnp.where(total > 0, idx_d2, idx_unif), n - 1)
        c = x[idx]
        return cents.at[i].set(c), jnp.minimum(d2, jnp.sum((x - c) ** 2, -1))

    cents, _ = jax.lax.fori_loop(1, k, body, (cents, d2))
    return cents


def lloyd_step(x: jax.Array, centroids: jax.Array) -> tuple[jax.Array, jax.Array]:
    """One Lloyd iteration: assign to the nearest centroid, then move each centroid to its mean
    (an empty cluster keeps its centroid, so the objective never increases).

    Returns:
      (new centroids float32 [C, D], the assignments int32 [N] used for them).
    """
    x = x.astype(jnp.float32)
    assign = jnp.argmin(_sq_dists(x, centroids), axis=-1)
    k = centroids.shape[0]
    sums = jax.ops.segment_sum(x, assign, num_segments=k)
    counts = jax.ops.segment_sum(jnp.ones_like(assign, jnp.float32), assign, num_segments=k)
    new = jnp.where(counts[:, None] > 0, sums / jnp.maximum(counts, 1.0)[:, None], centroids)
    return new, assign


def kmeans(x: jax.Array, k: int, iters: int, key: jax.Array
           ) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Euclidean k-means: k-means++ seeding then ``iters`` Lloyd steps and a final assignment.

    Args:
      x: float [N, D]; k: 1 <= k <= N; iters >= 0.

    Returns:
      (centroids float32 [k, D], assignments int32 [N], objective float32 [iters + 1]: the
      objective after seeding and after each Lloyd step, non-increasing).

    Raises:
      ValueError: k out of range.
    """
    if not 1 <= k <= x.shape[0]:
        raise ValueError(f"kmeans: k={k} must be in [1, N={x.shape[0]}]")
    x = x.astype(jnp.float32)
    c0 = kmeans_pp_init(x, k, key)

    def body(c, _):
        assign = jnp.argmin(_sq_dists(x, c), axis=-1)
        obj = kmeans_objective(x, c, assign)
        new, _ = lloyd_step(x, c)
        return new, obj

    c, objs = jax.lax.scan(body, c0, None, length=iters)
    assign = jnp.argmin(_sq_dists(x, c), axis=-1).astype(jnp.int32)
    objs = jnp.concatenate([objs, kmeans_objective(x, c, assign)[None]])
    return c, assign, objs


# ----------------------------------------------------------------------------------------------
# QVG


class QVGCode(NamedTuple):
    """A QVG-quantized chunk (leading batch dims ``...`` are free), tokens minor.

    codes: uint8 [..., P, N] (packed byte i of every token: row i); scales: bfloat16 [..., NB, N];
    assign: uint8 [..., S, N]; centroids: bfloat16 [..., S, C, D].

    The token axis N is the minor one of codes, scales and assignments, so a chunk's per-token
    data is lane-dense on TPU (N a multiple of 128 fills the 128 lanes; P = 32 bytes or NB = 2
    scales as the minor dimension would pad a tile 4x or 64x) and is the layout the kernels read,
    with no relayout per decode step.
    """

    codes: jax.Array
    scales: jax.Array
    assign: jax.Array
    centroids: jax.Array


def qvg_quantize_chunk(x: jax.Array, cfg: QVGConfig, key: jax.Array) -> QVGCode:
    """QVG quantization of one chunk x [N, D] (Quant VideoGen Sec. 3, Alg. 1): S stages of
    k-means smoothing on the running residual, then symmetric INTn of the final residual.

    Raises:
      ValueError: invalid head dim / block (see :meth:`QVGConfig.check_head_dim`) or N < C.
    """
    n, d = x.shape
    cfg.check_head_dim(d)
    if cfg.stages and n < cfg.num_centroids:
        raise ValueError(f"qvg_quantize_chunk: {n} tokens < num_centroids={cfg.num_centroids}")
    resid = x.astype(jnp.float32)
    assigns, cents = [], []
    for s in range(cfg.stages):
        c, a, _ = kmeans(resid, cfg.num_centroids, cfg.kmeans_iters, jax.random.fold_in(key, s))
        c = c.astype(CENTROID_DTYPE)  # stored precision; the residual is taken against it
        resid = resid - c.astype(jnp.float32)[a]
        assigns.append(a.astype(jnp.uint8))
        cents.append(c)
    codes, scales = quantize_symmetric(resid, cfg.bits, cfg.block)
    codes, scales = codes.T, scales.T  # tokens minor ([P, N], [NB, N]), see QVGCode
    if cfg.stages:
        assign, centroids = jnp.stack(assigns), jnp.stack(cents)
    else:
        assign = jnp.zeros((0, n), jnp.uint8)
        centroids = jnp.zeros((0, cfg.num_centroids, d), CENTROID_DTYPE)
    return QVGCode(codes, scales, assign, centroids)


def qvg_quantize(x: jax.Array, cfg: QVGConfig, key: jax.Array | None = None) -> QVGCode:
    """QVG over x [..., N, D] with N a multiple of ``cfg.chunk``: each (leading index, chunk) is
    clustered on its own. Returns a :class:`QVGCode` with fields ``[..., N / chunk, ...]``.

    Raises:
      ValueError: ``x`` not a float array of rank >= 2, N not a multiple of the chunk, or see
        :func:`qvg_quantize_chunk`.
    """
    checks.array(x, "x", "qvg_quantize", kind="float")
    if x.ndim < 2:
        raise checks.error("qvg_quantize", "x", "an array [..., N, D] of rank >= 2",
                           f"shape {tuple(x.shape)}")
    *lead, n, d = x.shape
    if n % cfg.chunk:
        raise ValueError(f"qvg_quantize: {n} tokens is not a multiple of chunk={cfg.chunk}")
    key = jax.random.key(cfg.seed) if key is None else key
    flat = x.reshape(-1, cfg.chunk, d)
    keys = jax.random.split(key, flat.shape[0])
    out = jax.vmap(lambda c, k: qvg_quantize_chunk(c, cfg, k))(flat, keys)
    return jax.tree.map(lambda a: a.reshape(*lead, n // cfg.chunk, *a.shape[1:]), out)


def qvg_dequantize_chunk(code: QVGCode, bits: int) -> jax.Array:
    """``x_hat = sum_s C_s[a_s] + scale * q`` for one chunk: float32 [N, D]."""
    x = dequantize_symmetric(code.codes.T, code.scales.T, bits)
    for s in range(code.assign.shape[0]):
        x = x + code.centroids[s].astype(jnp.float32)[code.assign[s].astype(jnp.int32)]
    return x


def qvg_dequantize(code: QVGCode, cfg: QVGConfig) -> jax.Array:
    """Inverse of :func:`qvg_quantize`: float32 [..., N, D]."""
    lead = code.codes.shape[:-2]
    m = math.prod(lead)
    flat = jax.tree.map(lambda a: a.reshape(m, *a.shape[len(lead):]), code)
    x = jax.vmap(lambda c: qvg_dequantize_chunk(c, cfg.bits))(flat)
    return x.reshape(*lead[:-1], lead[-1] * x.shape[1], x.shape[2])


# ----------------------------------------------------------------------------------------------
# KIVI


class KIVICode(NamedTuple):
    """A KIVI-quantized chunk of N tokens (leading dims free).

    codes: uint8 [..., N, P]; scale, zero: bfloat16 — keys [..., NG, D] (per channel, per token
    group), values [..., N, NB] (per token, per channel block).
    """

    codes: jax.Array
    scale: jax.Array
    zero: jax.Array


def _asym(xg: jax.Array, bits: int, axis: int):
    """Asymmetric INTn of xg along ``axis``: zero = min rounded down, scale = range / qmax rounded
    up (both bfloat16), so every element lies in [zero, zero + qmax * scale] and its error is at
    most scale / 2. Computed as hi / qmax - zero / qmax so the range cannot overflow float32."""
    qmax = 2 ** bits - 1
    lo = _bf16_down(jnp.min(xg, axis=axis, keepdims=True))
    z = lo.astype(jnp.float32)
    hi = jnp.max(xg, axis=axis, keepdims=True)
    scale = _bf16_up(jnp.maximum(hi / qmax - z / qmax, 0.0))
    s = scale.astype(jnp.float32)
    q = jnp.where(s > 0, jnp.clip(jnp.round((xg - z) / jnp.where(s > 0, s, 1.0)), 0, qmax), 0.0)
    return q, jnp.squeeze(scale, axis), jnp.squeeze(lo, axis)


def kivi_quantize_chunk(x: jax.Array, cfg: KIVIConfig, per_channel: bool) -> KIVICode:
    """KIVI asymmetric INTn of x [N, D] (keys: ``per_channel=True``, statistics over groups of
    ``cfg.group`` tokens; values: per token over blocks of ``cfg.block`` channels).

    Raises:
      ValueError: N not a multiple of the group, or invalid head dim / block.
    """
    n, d = x.shape
    cfg.check_head_dim(d)
    x = x.astype(jnp.float32)
    if per_channel:
        if n % cfg.group:
            raise ValueError(f"kivi_quantize_chunk: {n} tokens not a multiple of group={cfg.group}")
        q, scale, zero = _asym(x.reshape(n // cfg.group, cfg.group, d), cfg.bits, axis=1)
    else:
        q, scale, zero = _asym(x.reshape(n, d // cfg.block, cfg.block), cfg.bits, axis=2)
    return KIVICode(packing.pack_codes(q.reshape(n, d).astype(jnp.uint8), cfg.bits), scale, zero)


def kivi_dequantize_chunk(code: KIVICode, cfg: KIVIConfig, per_channel: bool) -> jax.Array:
    """float32 [N, D] from :func:`kivi_quantize_chunk`."""
    q = packing.unpack_codes(code.codes, cfg.bits).astype(jnp.float32)
    n, d = q.shape
    s, z = code.scale.astype(jnp.float32), code.zero.astype(jnp.float32)
    if per_channel:
        return (q.reshape(n // cfg.group, cfg.group, d) * s[:, None] + z[:, None]).reshape(n, d)
    return (q.reshape(n, d // cfg.block, cfg.block) * s[..., None] + z[..., None]).reshape(n, d)


# ----------------------------------------------------------------------------------------------
# Effective bits


def effective_bits(cfg: QVGConfig | KIVIConfig, head_dim: int, context_len: int | None = None,
                   baseline_bits: int = 16) -> dict[str, float]:
    """True storage bits per cached K/V element, everything counted, next to the nominal bits.

    QVG, per chunk of N tokens: ``N D n`` code bits + ``N (D / block) 16`` (bf16 scales)
    + ``S N 8`` (uint8 assignments) + ``S C D 16`` (bf16 centroids). KIVI, per ``residual`` tokens:
    ``N D n`` + keys ``(N / group) D 2 16`` + values ``N (D / block) 2 16`` (bf16 scale and zero),
    averaged over K and V. With ``context_len`` the cache's full-precision parts at
    ``baseline_bits`` are included: QVG's and KIVI's incomplete key chunk (``context_len mod chunk``
    tokens) and KIVI's sliding window of the last ``residual`` values (beside their codes).

    Returns:
      {"nominal": n, "effective": bits per element, "compression": baseline_bits / effective}.

    Raises:
      ValueError: invalid head dim for ``cfg`` or context_len < 1.
    """
    cfg.check_head_dim(head_dim)
    n, d = cfg.chunk, head_dim
    if isinstance(cfg, QVGConfig):
        chunk_bits = (n * d * cfg.bits + n * (d // cfg.block) * 16 + cfg.stages * n * 8
                      + cfg.stages * cfg.num_centroids * d * 16)
    elif isinstance(cfg, KIVIConfig):
        k_bits = n * d * cfg.bits + (n // cfg.group) * d * 2 * 16
        v_bits = n * d * cfg.bits + n * (d // cfg.block) * 2 * 16
        chunk_bits = (k_bits + v_bits) / 2
    else:
        raise ValueError(f"effective_bits: unknown config {type(cfg).__name__}")
    per_elem = chunk_bits / (n * d)
    if context_len is not None:
        if context_len < 1:
            raise ValueError(f"effective_bits: context_len={context_len} must be >= 1")
        nq = (context_len // n) * n
        if isinstance(cfg, KIVIConfig):
            # keys: whole quantized chunks + the incomplete one exact; values: every token's codes
            # (quantized on arrival) + exact copies of the last min(L, residual) (the window)
            k_elem, v_elem = k_bits / (n * d), v_bits / (n * d)
            k_total = nq * k_elem + (context_len - nq) * baseline_bits
            v_total = context_len * v_elem + min(context_len, cfg.residual) * baseline_bits
            per_elem = (k_total + v_total) / (2 * context_len)
        else:
            per_elem = (nq * per_elem + (context_len - nq) * baseline_bits) / context_len
    return {"nominal": float(cfg.bits), "effective": float(per_elem),
            "compression": float(baseline_bits / per_elem)}


# ----------------------------------------------------------------------------------------------
# Attention over a dequantized cache (the specification the kernels match)


def qvg_chunk_attention_reference(q: jax.Array, k_code: QVGCode, v_code: QVGCode, bits: int,
                                  valid: jax.Array, rope_base: float | None = None
                                  ) -> tuple[jax.Array, jax.Array]:
    """Attention of q over QVG-quantized chunks: dequantize, (re-apply RoPE), attend.

    Args:
      q: [B, K, R, D] query rows (RoPE applied).
      k_code, v_code: :class:`QVGCode` with fields [B, K, NC, ...] (NC chunks of N tokens).
      bits: code width.
      valid: bool [B, K or 1, R, NC * N]: which slots each row may attend to.
      rope_base: if set, keys were stored before RoPE and are rotated to slot positions here.

    Returns:
      (out float32 [B, K, R, D], lse float32 [B, K, R]) as in
      :func:`kernels.attention_math.partial_attention`.
    """
    k = _dequant_chunks(k_code, bits)
    v = _dequant_chunks(v_code, bits)
    if rope_base is not None:
        k = rope_slots(k, rope_base)
    return attention_math.partial_attention(q, k, v, valid)


def _dequant_chunks(code: QVGCode, bits: int) -> jax.Array:
    b, kh, nc = code.codes.shape[:3]
    flat = jax.tree.map(lambda a: a.reshape(b * kh * nc, *a.shape[3:]), code)
    x = jax.vmap(lambda c: qvg_dequantize_chunk(c, bits))(flat)
    return x.reshape(b, kh, nc * x.shape[1], x.shape[2])


def kivi_cache_attention_reference(q: jax.Array, k_code: KIVICode, window_k: jax.Array,
                                   v_code: KIVICode, ring: jax.Array, cfg: KIVIConfig,
                                   start: jax.Array, num_new: int,
                                   num_quantized: jax.Array | None = None) -> jax.Array:
    """KIVI decode attention over the cache's layout: dequantize everything, then attend.

    With ``length = start + T`` and N = ``cfg.residual``: slots below ``nq = num_quantized``
    (default ``floor(length / N) N``) have quantized keys (per channel, chunks of N), slots
    ``nq + j`` the exact keys ``window_k[j]``; values are exact for the last N positions (the
    ring, position p at slot p mod N) and dequantized per token before them (KIVI, Sec. 3.3 and
    Alg. 1).

    Args:
      q: float [B, K, R, D] (R = G * T, row r is new token r % T, at ``start + r % T``).
      k_code: :class:`KIVICode` fields [B, K, NC, ...]; window_k: [B, K, W, D] (W: N, or 2N when
        a complete chunk waits in the window); v_code: :class:`KIVICode` fields [B, K, SP, ...]
        (one token per slot); ring: [B, K, N, D].
      start: int32 [B]; num_new: T; num_quantized: int32 [B] or None.

    Returns:
      float32 [B, K, R, D].
    """
    b, kh, rows, d = q.shape
    n = cfg.residual
    length = start + num_new
    nq = (length // n) * n if num_quantized is None else num_quantized
    nc = k_code.codes.shape[2]
    k_q = jax.vmap(lambda c: kivi_dequantize_chunk(c, cfg, True))(
        jax.tree.map(lambda a: a.reshape(-1, *a.shape[3:]), k_code)).reshape(b, kh, nc * n, d)
    v_q = jax.vmap(lambda c: kivi_dequantize_chunk(c, cfg, False))(  # one chunk of SP per head
        jax.tree.map(lambda a: a.reshape(-1, *a.shape[2:]), v_code)).reshape(b, kh, nc * n, d)
    sp = nc * n
    ringf = ring.astype(jnp.float32)

    def ring_values(slots):  # slots [B, M] -> [B, K, M, D] exact values at those positions
        return jax.vmap(lambda w, i: w[:, i % n])(ringf, slots)

    all_slots = jnp.broadcast_to(jnp.arange(sp), (b, sp))
    exact = (all_slots >= (length - n)[:, None])[:, None, :, None]  # the sliding window
    v_q = jnp.where(exact, ring_values(all_slots), v_q)
    pos = start[:, None] + jnp.arange(rows) % num_new  # [B, R]
    s = jnp.arange(sp)
    mask = ((s[None, None, :] < nq[:, None, None]) & (s[None, None, :] <= pos[:, :, None]))[:, None]
    o1, l1 = attention_math.partial_attention(q, k_q, v_q, mask)
    slot = nq[:, None] + jnp.arange(window_k.shape[2])  # [B, W]: the window's positions
    valid = (slot[:, None, :] <= pos[:, :, None])[:, None]
    v_win = jax.vmap(lambda x, i: x[:, i])(v_q, jnp.minimum(slot, sp - 1))  # past SP: masked
    o2, l2 = attention_math.partial_attention(q, window_k, v_win, valid)
    return attention_math.merge_lse(o1, l1, o2, l2)


@functools.partial(jax.jit, static_argnames=("cfg",))
def qvg_roundtrip(x: jax.Array, cfg: QVGConfig, key: jax.Array) -> jax.Array:
    """Quantize then dequantize x [..., N, D] (jitted convenience for measurements)."""
    return qvg_dequantize(qvg_quantize(x, cfg, key), cfg)


@functools.partial(jax.jit, static_argnames=("cfg",))
def kivi_roundtrip(k: jax.Array, v: jax.Array, cfg: KIVIConfig) -> tuple[jax.Array, jax.Array]:
    """KIVI quantize then dequantize k, v [..., N, D] (N a multiple of ``cfg.residual``), each
    ``residual`` chunk on its own (no full-precision tail; the cache adds that)."""
    def rt(x, per_channel):
        *lead, n, d = x.shape
        flat = x.reshape(-1, cfg.chunk, d)
        out = jax.vmap(lambda c: kivi_dequantize_chunk(kivi_quantize_chunk(c, cfg, per_channel),
                                                       cfg, per_channel))(flat)
        return out.reshape(x.shape)

    return rt(k, True), rt(v, False)

