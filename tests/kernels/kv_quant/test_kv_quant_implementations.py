"""One contract for every implementation of the kv_quant attention ops: QVG's chunk attention
(reference, xla, pallas_tpu and pallas_gpu in interpret mode) and KIVI's cache attention
(reference, xla): the same output as a float64 oracle over the dequantized cache, rows that see
nothing give (0, -inf), never NaN for finite input.

Shapes come from a few fixed configurations (interpret-mode kernels compile once per shape): GQA 1
to 8, head dims 64 / 96 / 128 / 256, 2 / 4 / 8 bits, 0 / 1 / 2 k-means stages, bf16 queries, one or
two new tokens. Codes, scales, zeros, centroids, ragged lengths (not multiples of the chunk or
group), RoPE or not and the key pattern (random, all equal, a needle along the query in the last
quantized chunk) are drawn by hypothesis, with magnitudes up to 1e4. Inputs are drawn with numpy
(no XLA compilation per example).
"""

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kernels import common
from kernels.kv_quant import api
from kernels.kv_quant import reference as ref

EPS32 = float(np.finfo(np.float32).eps)
SETTINGS = settings(max_examples=6, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                           HealthCheck.differing_executors])

# (batch, kv heads, G, T, D, chunk N, chunks NC, bits, block, stages, centroids, q dtype)
QVG_CONFIGS = (
    (2, 1, 8, 1, 64, 16, 3, 2, 64, 1, 4, jnp.float32),
    (3, 2, 3, 1, 96, 16, 2, 2, 32, 1, 4, jnp.bfloat16),
    (2, 2, 1, 2, 128, 16, 2, 4, 64, 2, 4, jnp.float32),
    (1, 1, 2, 1, 256, 16, 2, 8, 64, 0, 4, jnp.bfloat16),
)
PATTERNS = ("random", "equal", "needle")
MAGNITUDES = (1e-2, 1.0, 30.0, 1e4)


def _unpack(codes: np.ndarray, bits: int) -> np.ndarray:
    return np.asarray(common.unpack_codes(jnp.asarray(codes), bits), np.float64)


def _rope64(k: np.ndarray, base: float) -> np.ndarray:
    """RoPE on k [B, K, S, D] at slot positions, float64 (the reference's float32 angles)."""
    s, d = k.shape[2], k.shape[3]
    ang = np.asarray(common.rope_angles(jnp.arange(s), d, base), np.float64)  # [S, D/2]
    cos, sin = np.cos(ang), np.sin(ang)
    k1, k2 = k[..., :d // 2], k[..., d // 2:]
    return np.concatenate([k1 * cos - k2 * sin, k2 * cos + k1 * sin], axis=-1)


def _attend64(q, k, v, mask):
    """float64 softmax attention of q [B, K, R, D] over k, v [B, K, S, D] (mask [B, K, R, S]);
    (out, lse, the largest sum_c |q_c k_c| / sqrt(D) over visible slots)."""
    d = q.shape[-1]
    logits = np.einsum("bkrd,bksd->bkrs", q, k) / math.sqrt(d)
    absdot = np.einsum("bkrd,bksd->bkrs", np.abs(q), np.abs(k)) / math.sqrt(d)
    big = float(np.where(mask, absdot, 0.0).max(initial=0.0))
    logits = np.where(mask, logits, -np.inf)
    m = logits.max(-1, keepdims=True)
    m = np.where(np.isfinite(m), m, 0.0)
    w = np.exp(logits - m)
    l = w.sum(-1, keepdims=True)
    out = np.einsum("bkrs,bksd->bkrd", w, v) / np.where(l > 0, l, 1.0)
    lse = np.where(l[..., 0] > 0, m[..., 0] + np.log(np.where(l > 0, l, 1.0))[..., 0], -np.inf)
    return out, lse, big


def _assert_close(got_out, got_lse, want_out, want_lse, big, vmax, max_pos):
    """float32 logits carry a rounding error of about eps * sqrt(D) * big (big: the largest
    sum |q_c k_c| / sqrt(D)), RoPE angles (angle addition in the fused path) differ by about
    eps * position radians; the weights move by that, the output by that times the value range."""
    d = got_out.shape[-1]
    logit_err = (8 * math.sqrt(d) + 2 * max_pos) * EPS32 * big
    tol = vmax * (3e-5 + 2 * logit_err)
    np.testing.assert_allclose(np.asarray(got_out, np.float64), want_out, atol=tol, rtol=0)
    got_lse = np.asarray(got_lse, np.float64)
    np.testing.assert_array_equal(np.isneginf(got_lse), np.isneginf(want_lse))
    seen = np.isfinite(want_lse)
    np.testing.assert_allclose(got_lse[seen], want_lse[seen], rtol=3e-6, atol=3e-5 + logit_err)


# -- QVG --------------------------------------------------------------------------------------


def draw_qvg(data, config, pattern, magnitude):
    """(q, k_code, v_code, cfg, start, num_quantized) for one configuration."""
    b, kh, g, t, d, n, nc, bits, block, stages, c, dtype = config
    cfg = ref.QVGConfig(bits=bits, stages=stages, block=block, num_centroids=c, chunk=n)
    rng = np.random.default_rng(data.draw(st.integers(0, 2**31 - 1), label="seed"))
    lengths = np.array([data.draw(st.integers(t, nc * n + n - 1), label=f"length{i}")
                        for i in range(b)])
    nq = np.minimum((lengths // n) * n, nc * n)
    p = d * bits // 8

    def code(scale_range):
        codes = rng.integers(0, 256, (b, kh, nc, n, p), dtype=np.uint8)
        scales = rng.uniform(*scale_range, (b, kh, nc, n, d // block)) * magnitude
        assign = rng.integers(0, c, (b, kh, nc, stages, n), dtype=np.uint8)
        cents = rng.standard_normal((b, kh, nc, stages, c, d)) * magnitude
        return [codes, scales, assign, cents]

    q = rng.standard_normal((b, kh, g * t, d)) * 2.0
    kc, vc = code((0.05, 0.6)), code((0.05, 0.6))
    if pattern == "equal":  # every key the same vector
        kc[0][:] = kc[0][0, 0, 0, 0]
        kc[1][:] = kc[1][0, 0, 0, 0]
        kc[2][:] = 0
        kc[3][:] = kc[3][:1, :1, :1, :, :1]
    elif pattern == "needle" and stages:  # one key along the group's mean query dominates
        direction = q.mean(2)
        direction /= np.linalg.norm(direction, axis=-1, keepdims=True)
        for bi in range(b):
            if nq[bi]:
                last, slot = divmod(int(nq[bi]) - 1, n)
                kc[3][bi, :, last, 0, 0] = direction[bi] * magnitude * 4.0 * math.sqrt(d)
                kc[2][bi, :, last, 0, slot] = 0
                kc[2][bi, :, last, 0, :slot] = 1
    to = [jnp.asarray, functools.partial(jnp.asarray, dtype=ref.SCALE_DTYPE), jnp.asarray,
          functools.partial(jnp.asarray, dtype=ref.CENTROID_DTYPE)]
    k_code = ref.QVGCode(*[f(x) for f, x in zip(to, kc, strict=True)])
    v_code = ref.QVGCode(*[f(x) for f, x in zip(to, vc, strict=True)])
    start = jnp.asarray(lengths - t, jnp.int32)
    return jnp.asarray(q, dtype), k_code, v_code, cfg, start, jnp.asarray(nq, jnp.int32)


def qvg_dequant64(code: ref.QVGCode, cfg: ref.QVGConfig) -> np.ndarray:
    """float64 [B, K, NC * N, D]: ``sum_s C_s[a_s] + scale * (code - 2^(n-1))``."""
    b, kh, nc, n, _ = code.codes.shape
    x = _unpack(np.asarray(code.codes), cfg.bits) - 2 ** (cfg.bits - 1)
    d = x.shape[-1]
    s = np.repeat(np.asarray(code.scales.astype(jnp.float32), np.float64), cfg.block, axis=-1)
    x = x * s
    cents = np.asarray(code.centroids.astype(jnp.float32), np.float64)
    assign = np.asarray(code.assign).astype(int)
    for st_ in range(cfg.stages):
        x = x + np.take_along_axis(cents[:, :, :, st_], assign[:, :, :, st_, :, None], axis=3)
    return x.reshape(b, kh, nc * n, d)


def qvg_oracle(q, k_code, v_code, cfg, start, nq, t, rope_base):
    k = qvg_dequant64(k_code, cfg)
    v = qvg_dequant64(v_code, cfg)
    if rope_base is not None:
        k = _rope64(k, rope_base)
    rows = q.shape[2]
    pos = np.asarray(start)[:, None] + np.arange(rows) % t
    s = np.arange(k.shape[2])
    mask = (s[None, None] < np.asarray(nq)[:, None, None]) & (s[None, None] <= pos[..., None])
    qf = np.asarray(q.astype(jnp.float32), np.float64)
    out, lse, big = _attend64(qf, k, v, np.broadcast_to(mask[:, None], qf.shape[:3] + s.shape))
    return out, lse, big, float(np.abs(v).max())


@functools.cache
def _jitted_qvg(impl, interpret, cfg, t, rope_base):
    return jax.jit(lambda q, kc, vc, start, nq: api.qvg_chunk_attention(
        q, kc, vc, cfg, start, nq, t, rope_base, implementation=impl, interpret=interpret))


class QVGContract:
    """What every QVG implementation must do; subclasses set ``impl`` (and ``interpret``)."""

    impl: str
    interpret = False

    def rejects(self, config) -> str | None:
        """A message the implementation must raise (ValueError) for this config, else None."""
        del config
        return None

    @SETTINGS
    @given(data=st.data(), ci=st.sampled_from(range(len(QVG_CONFIGS))),
           pattern=st.sampled_from(PATTERNS), magnitude=st.sampled_from(MAGNITUDES),
           rope=st.sampled_from([None, 10_000.0]))
    def test_matches_oracle_and_finite(self, data, ci, pattern, magnitude, rope):
        config = QVG_CONFIGS[ci]
        q, kc, vc, cfg, start, nq = draw_qvg(data, config, pattern, magnitude)
        t = config[3]
        reason = self.rejects(config)
        if reason is not None:
            with pytest.raises(ValueError, match=reason):
                _jitted_qvg(self.impl, self.interpret, cfg, t, rope)(q, kc, vc, start, nq)
            return
        out, lse = _jitted_qvg(self.impl, self.interpret, cfg, t, rope)(q, kc, vc, start, nq)
        assert out.dtype == lse.dtype == jnp.float32 and out.shape == q.shape
        assert bool(jnp.all(jnp.isfinite(out))), "NaN/inf output for finite input"
        want, want_lse, big, vmax = qvg_oracle(q, kc, vc, cfg, start, nq, t, rope)
        _assert_close(out, lse, want, want_lse, big, vmax, int(jnp.max(nq)))
        # rows that see no quantized slot: (0, -inf)
        empty = np.asarray(nq) == 0
        assert np.all(np.asarray(out)[empty] == 0) and np.all(np.isneginf(np.asarray(lse)[empty]))


class TestQVGReference(QVGContract):
    impl = "reference"


class TestQVGXLA(QVGContract):
    impl = "xla"


class TestQVGPallasTPUInterpret(QVGContract):
    impl = "pallas_tpu"
    interpret = True


class TestQVGPallasGPUInterpret(QVGContract):
    impl = "pallas_gpu"
    interpret = True

    def rejects(self, config):
        """Triton tiles need a power-of-two chunk and head dim (``auto`` falls back to xla)."""
        d, n = config[4], config[5]
        return None if (d & (d - 1)) == 0 and (n & (n - 1)) == 0 else "power-of-two"


# -- KIVI -------------------------------------------------------------------------------------

# (batch, kv heads, G, T, D, residual N, chunks NC, bits, group, block, q dtype)
KIVI_CONFIGS = (
    (2, 1, 8, 1, 64, 16, 3, 2, 8, 32, jnp.float32),
    (3, 2, 3, 2, 96, 16, 2, 2, 16, 32, jnp.bfloat16),
    (2, 2, 1, 1, 128, 32, 2, 4, 16, 64, jnp.float32),
    (1, 1, 4, 1, 256, 16, 2, 8, 8, 64, jnp.bfloat16),
)


def draw_kivi(data, config, pattern, magnitude):
    """(q, k_code, window_k, v_code, ring, cfg, start) for one configuration: the fields of a
    :class:`kernels.kv_quant.cache.KIVICache` holding ``start + T`` tokens per row."""
    b, kh, g, t, d, n, nc, bits, group, block, dtype = config
    cfg = ref.KIVIConfig(bits=bits, group=group, block=block, residual=n)
    rng = np.random.default_rng(data.draw(st.integers(0, 2**31 - 1), label="seed"))
    # the incomplete key chunk must fit: length < NC * N
    lengths = np.array([data.draw(st.integers(t, nc * n - 1), label=f"length{i}")
                        for i in range(b)])
    p, sp = d * bits // 8, nc * n
    k_codes = rng.integers(0, 256, (b, kh, nc, n, p), dtype=np.uint8)
    k_scale = rng.uniform(0.05, 0.6, (b, kh, nc, n // group, d)) * magnitude
    k_zero = rng.standard_normal((b, kh, nc, n // group, d)) * magnitude
    window_k = rng.standard_normal((b, kh, n, d)) * magnitude
    if pattern == "equal":
        k_codes[:] = k_codes[0, 0, 0, 0]
        k_scale[:] = k_scale[0, 0, 0, 0]
        k_zero[:] = k_zero[0, 0, 0, 0]
    q = rng.standard_normal((b, kh, g * t, d)) * 2.0
    if pattern == "needle":  # the last quantized key group points along the mean query
        direction = q.mean(2)
        direction /= np.linalg.norm(direction, axis=-1, keepdims=True)
        for bi in range(b):
            nq = (lengths[bi] // n) * n
            if nq:
                last = nq // n - 1
                k_zero[bi, :, last, -1] = direction[bi] * magnitude * 4.0 * math.sqrt(d)
    v_codes = rng.integers(0, 256, (b, kh, sp, p), dtype=np.uint8)
    v_scale = rng.uniform(0.05, 0.6, (b, kh, sp, d // block)) * magnitude
    v_zero = rng.standard_normal((b, kh, sp, d // block)) * magnitude
    ring = rng.standard_normal((b, kh, n, d)) * magnitude
    bf = functools.partial(jnp.asarray, dtype=ref.SCALE_DTYPE)
    k_code = ref.KIVICode(jnp.asarray(k_codes), bf(k_scale), bf(k_zero))
    v_code = ref.KIVICode(jnp.asarray(v_codes), bf(v_scale), bf(v_zero))
    start = jnp.asarray(lengths - t, jnp.int32)
    return (jnp.asarray(q, dtype), k_code, jnp.asarray(window_k, jnp.bfloat16), v_code,
            jnp.asarray(ring, jnp.bfloat16), cfg, start)


def kivi_oracle(q, k_code, window_k, v_code, ring, cfg, start, t):
    """float64 attention over the KIVI cache's contents (KIVI Sec. 3.3): quantized keys below
    nq, exact keys after; exact values for the last N positions, quantized before."""
    b, kh, nc, n, _ = k_code.codes.shape
    f64 = lambda a: np.asarray(jnp.asarray(a).astype(jnp.float32), np.float64)  # noqa: E731
    kq = _unpack(np.asarray(k_code.codes), cfg.bits).reshape(b, kh, nc, n // cfg.group,
                                                             cfg.group, -1)
    kq = kq * f64(k_code.scale)[:, :, :, :, None] + f64(k_code.zero)[:, :, :, :, None]
    d = kq.shape[-1]
    kq = kq.reshape(b, kh, nc * n, d)
    vq = _unpack(np.asarray(v_code.codes), cfg.bits)
    vq = (vq * np.repeat(f64(v_code.scale), cfg.block, -1)
          + np.repeat(f64(v_code.zero), cfg.block, -1))
    length = np.asarray(start) + t
    nq = (length // n) * n
    sp = nc * n
    keys = kq.copy()
    vals = vq.copy()
    wk, rg = f64(window_k), f64(ring)
    for bi in range(b):
        for s_ in range(nq[bi], min(nq[bi] + n, sp)):
            keys[bi, :, s_] = wk[bi, :, s_ - nq[bi]]
        for s_ in range(max(length[bi] - n, 0), length[bi]):
            vals[bi, :, s_] = rg[bi, :, s_ % n]
    rows = q.shape[2]
    pos = np.asarray(start)[:, None] + np.arange(rows) % t
    s = np.arange(sp)
    mask = (s[None, None] < length[:, None, None]) & (s[None, None] <= pos[..., None])
    qf = np.asarray(q.astype(jnp.float32), np.float64)
    out, _, big = _attend64(qf, keys, vals, np.broadcast_to(mask[:, None], qf.shape[:3] + s.shape))
    return out, big, float(np.abs(vals).max())


@functools.cache
def _jitted_kivi(impl, cfg, t):
    return jax.jit(lambda q, kc, wk, vc, ring, start: api.kivi_attention(
        q, kc, wk, vc, ring, cfg, start, t, implementation=impl))


class KIVIContract:
    """What every KIVI implementation must do; subclasses set ``impl``."""

    impl: str

    @SETTINGS
    @given(data=st.data(), ci=st.sampled_from(range(len(KIVI_CONFIGS))),
           pattern=st.sampled_from(PATTERNS), magnitude=st.sampled_from(MAGNITUDES))
    def test_matches_oracle_and_finite(self, data, ci, pattern, magnitude):
        config = KIVI_CONFIGS[ci]
        q, kc, wk, vc, ring, cfg, start = draw_kivi(data, config, pattern, magnitude)
        t = config[3]
        out = _jitted_kivi(self.impl, cfg, t)(q, kc, wk, vc, ring, start)
        assert out.dtype == jnp.float32 and out.shape == q.shape
        assert bool(jnp.all(jnp.isfinite(out))), "NaN/inf output for finite input"
        want, big, vmax = kivi_oracle(q, kc, wk, vc, ring, cfg, start, t)
        logit_err = 8 * math.sqrt(q.shape[-1]) * EPS32 * big
        np.testing.assert_allclose(np.asarray(out, np.float64), want,
                                   atol=vmax * (3e-5 + 2 * logit_err), rtol=0)


class TestKIVIReference(KIVIContract):
    impl = "reference"


class TestKIVIXLA(KIVIContract):
    impl = "xla"
