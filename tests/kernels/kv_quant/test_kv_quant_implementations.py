"""One contract for every implementation of the kv_quant attention ops: QVG's chunk attention
(reference, xla, pallas_tpu and pallas_gpu in interpret mode) and KIVI's cache attention
(reference, xla), checked against independent float64 oracles (``tests/kernels/oracles.py``: own
unpacking, dequantization and RoPE) within the float32 error bound; rows that see nothing give
(0, -inf), never NaN for finite input, and a NaN key that a row sees makes it NaN; and a test
that the check rejects wrong outputs (zeros, outputs shuffled across rows) at the largest
magnitudes drawn.

Shapes: every configuration below runs in every implementation (interpret-mode kernels compile
once per shape): GQA 1 to 8, head dims 64 / 96 / 128 / 256, 2 / 4 / 8 bits, 0 / 1 / 2 k-means
stages, bf16 queries, one or two new tokens. Codes, scales, zeros, centroids, ragged lengths (not
multiples of the chunk or group), RoPE or not and the key pattern (random, all equal, a needle
along the query in the last quantized chunk) are drawn by hypothesis, with magnitudes up to 1e4.
Inputs are drawn with numpy (no XLA compilation per example).
"""

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kernels import packing
from kernels.kv_quant import api
from kernels.kv_quant import reference as ref
from tests.hypothesis_budget import examples
from tests.kernels import oracles

SETTINGS = settings(max_examples=examples(12),
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                           HealthCheck.differing_executors])

# (batch, kv heads, G, T, D, chunk N, chunks NC, bits, block, stages, centroids, q dtype)
# chunks of 128 tokens: the TPU kernel's lanes (a smaller chunk is refused, tested in
# test_kv_quant_pallas); GQA 16, 3, 1, 2; head dims 64, 96, 128, 256
QVG_CONFIGS = (
    (2, 1, 16, 1, 64, 128, 3, 2, 64, 1, 4, jnp.float32),
    (3, 2, 3, 1, 96, 128, 2, 2, 32, 1, 4, jnp.bfloat16),
    (2, 2, 1, 2, 128, 128, 2, 4, 64, 2, 4, jnp.float32),
    (1, 1, 2, 1, 256, 128, 2, 8, 64, 0, 4, jnp.bfloat16),
)
PATTERNS = ("random", "equal", "needle")
MAGNITUDES = (1e-2, 1.0, 30.0, 1e4)


def _equal_keys_query(q: np.ndarray, key_max: float) -> np.ndarray:
    """Queries for the all-equal-keys pattern: divided by the largest key element, so that the
    logits stay O(1). Equal logits of size L are resolved by float32 only to about sqrt(D) u L
    nats (u = 2^-24): with keys of 1e4 no float32 evaluation determines the weights of the
    uniform softmax, and the error bound would admit any output."""
    return q / max(1.0, key_max)


@pytest.mark.parametrize("bits", [2, 4, 8])
def test_packing_matches_the_documented_layout(bits):
    """kernels.packing.pack_codes writes channel d to byte d % P at bit bits * (d // P) (the
    oracle's reading of the format), and unpack_codes inverts it."""
    codes = np.random.default_rng(bits).integers(0, 2 ** bits, (3, 5, 64), dtype=np.uint8)
    packed = packing.pack_codes(jnp.asarray(codes), bits)
    np.testing.assert_array_equal(oracles.unpack_planar(packed, bits), codes)
    np.testing.assert_array_equal(packing.unpack_codes(packed, bits), codes)


# -- QVG --------------------------------------------------------------------------------------


def make_qvg(config, pattern, magnitude, seed, lengths):
    """(q, k_code, v_code, cfg, start, num_quantized) for one configuration; row ``b`` holds
    ``lengths[b]`` tokens (the T new ones last) and its complete chunks are quantized. ``needle``
    needs a k-means stage (the needle is a centroid); without one it is ``random``."""
    b, kh, g, t, d, n, nc, bits, block, stages, c, dtype = config
    cfg = ref.QVGConfig(bits=bits, stages=stages, block=block, num_centroids=c, chunk=n)
    rng = np.random.default_rng(seed)
    lengths = np.asarray(lengths)
    nq = np.minimum((lengths // n) * n, nc * n)
    p = d * bits // 8

    def code(scale_range):
        codes = rng.integers(0, 256, (b, kh, nc, p, n), dtype=np.uint8)  # tokens minor
        scales = rng.uniform(*scale_range, (b, kh, nc, d // block, n)) * magnitude
        assign = rng.integers(0, c, (b, kh, nc, stages, n), dtype=np.uint8)
        cents = rng.standard_normal((b, kh, nc, stages, c, d)) * magnitude
        return [codes, scales, assign, cents]

    q = rng.standard_normal((b, kh, g * t, d)) * 2.0
    kc, vc = code((0.05, 0.6)), code((0.05, 0.6))
    if pattern == "equal":  # every key the same vector
        kc[0][:] = kc[0][0, 0, 0, :, :1]  # token 0's bytes and scales for every token
        kc[1][:] = kc[1][0, 0, 0, :, :1]
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
    if pattern == "equal":
        q = _equal_keys_query(q, float(oracles.qvg_dequantize(*k_code, bits)[1].max()))
    start = jnp.asarray(lengths - t, jnp.int32)
    return jnp.asarray(q, dtype), k_code, v_code, cfg, start, jnp.asarray(nq, jnp.int32)


def draw_qvg(data, config, pattern, magnitude):
    """:func:`make_qvg` with the seed and the lengths (T .. NC N + N - 1) drawn."""
    b, t, n, nc = config[0], config[3], config[5], config[6]
    seed = data.draw(st.integers(0, 2**31 - 1), label="seed")
    lengths = [data.draw(st.integers(t, nc * n + n - 1), label=f"length{i}") for i in range(b)]
    return make_qvg(config, pattern, magnitude, seed, lengths)


def qvg_oracle(q, kc, vc, cfg, start, nq, t, rope):
    return oracles.qvg_attention(q, kc, vc, bits=cfg.bits, stages=cfg.stages, start=start,
                                 num_quantized=nq, num_new=t, rope_base=rope)


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

    @pytest.mark.parametrize("ci", range(len(QVG_CONFIGS)))
    @SETTINGS
    @given(data=st.data(), pattern=st.sampled_from(PATTERNS),
           magnitude=st.sampled_from(MAGNITUDES), rope=st.sampled_from([None, 10_000.0]))
    def test_matches_oracle_and_finite(self, ci, data, pattern, magnitude, rope):
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
        oracles.assert_close(out, qvg_oracle(q, kc, vc, cfg, start, nq, t, rope), lse=lse)
        # rows that see no quantized slot: (0, -inf)
        empty = np.asarray(nq) == 0
        assert np.all(np.asarray(out)[empty] == 0) and np.all(np.isneginf(np.asarray(lse)[empty]))

    def test_nan_key_in_a_quantized_chunk_gives_nan_rows(self):
        """A NaN key scale at slot 131 of row 0 (chunk 1, seen by every query row of row 0): those
        rows are NaN, out and lse, as in the oracle and dense attention (not (0, -inf), the
        answer for a row that sees no slot). A NaN key at a slot row 1 does not see (its chunk 2,
        past its quantized prefix) changes nothing there."""
        config = QVG_CONFIGS[0]  # the shapes of the contract test above: no new compile
        q, kc, vc, cfg, start, nq = make_qvg(config, "random", 1.0, 5, [3 * 128 + 5, 200])
        run = _jitted_qvg(self.impl, self.interpret, cfg, config[3], None)
        out_clean, lse_clean = run(q, kc, vc, start, nq)
        bad = kc._replace(scales=kc.scales.at[0, 0, 1, 0, 3].set(jnp.nan)
                          .at[1, 0, 2, 0, 7].set(jnp.nan))
        out, lse = (np.asarray(a) for a in run(q, bad, vc, start, nq))
        assert np.isnan(qvg_oracle(q, bad, vc, cfg, start, nq, config[3], None).out[0]).all()
        assert np.isnan(out[0]).all() and np.isnan(lse[0]).all()
        np.testing.assert_array_equal(out[1], np.asarray(out_clean)[1])
        np.testing.assert_array_equal(lse[1], np.asarray(lse_clean)[1])


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
        """Triton tiles need a power-of-two chunk and head dim (``auto`` raises on a GPU too)."""
        d, n = config[4], config[5]
        if (d & (d - 1)) == 0 and (n & (n - 1)) == 0:
            return None
        bad = "head dim" if d & (d - 1) else "chunk"  # the API names the first that fails
        return rf"qvg_chunk_attention: the GPU kernel .* needs a power-of-two {bad} .*got {bad}"


# -- KIVI -------------------------------------------------------------------------------------

# (batch, kv heads, G, T, D, residual N, chunks NC, bits, group, block, q dtype)
KIVI_CONFIGS = (
    (2, 1, 8, 1, 64, 16, 3, 2, 8, 32, jnp.float32),
    (3, 2, 3, 2, 96, 16, 2, 2, 16, 32, jnp.bfloat16),
    (2, 2, 1, 1, 128, 32, 2, 4, 16, 64, jnp.float32),
    (1, 1, 4, 1, 256, 16, 2, 8, 8, 64, jnp.bfloat16),
)


def make_kivi(config, pattern, magnitude, seed, lengths):
    """(q, k_code, window_k, v_code, ring, cfg, start) for one configuration: the fields of a
    :class:`kernels.kv_quant.cache.KIVICache` holding ``lengths[b]`` tokens in row ``b`` (the T new
    ones last)."""
    b, kh, g, t, d, n, nc, bits, group, block, dtype = config
    cfg = ref.KIVIConfig(bits=bits, group=group, block=block, residual=n)
    rng = np.random.default_rng(seed)
    lengths = np.asarray(lengths)
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
    if pattern == "equal":  # the largest key element: (2^bits - 1) scale + |zero|, or a window key
        q = _equal_keys_query(q, max((2 ** bits - 1) * k_scale.max() + np.abs(k_zero).max(),
                                     np.abs(window_k).max()))
    bf = functools.partial(jnp.asarray, dtype=ref.SCALE_DTYPE)
    k_code = ref.KIVICode(jnp.asarray(k_codes), bf(k_scale), bf(k_zero))
    v_code = ref.KIVICode(jnp.asarray(v_codes), bf(v_scale), bf(v_zero))
    start = jnp.asarray(lengths - t, jnp.int32)
    return (jnp.asarray(q, dtype), k_code, jnp.asarray(window_k, jnp.bfloat16), v_code,
            jnp.asarray(ring, jnp.bfloat16), cfg, start)


def draw_kivi(data, config, pattern, magnitude):
    """:func:`make_kivi` with the seed and the lengths (T .. NC N - 1: the incomplete key chunk
    must fit) drawn."""
    b, t, n, nc = config[0], config[3], config[5], config[6]
    seed = data.draw(st.integers(0, 2**31 - 1), label="seed")
    lengths = [data.draw(st.integers(t, nc * n - 1), label=f"length{i}") for i in range(b)]
    return make_kivi(config, pattern, magnitude, seed, lengths)


def kivi_oracle(q, kc, wk, vc, ring, cfg, start, t):
    return oracles.kivi_attention(q, kc, wk, vc, ring, bits=cfg.bits, group=cfg.group,
                                  block=cfg.block, residual=cfg.residual, start=start, num_new=t)


@functools.cache
def _jitted_kivi(impl, cfg, t):
    return jax.jit(lambda q, kc, wk, vc, ring, start: api.kivi_attention(
        q, kc, wk, vc, ring, cfg, start, t, implementation=impl))


class KIVIContract:
    """What every KIVI implementation must do; subclasses set ``impl``."""

    impl: str

    @pytest.mark.parametrize("ci", range(len(KIVI_CONFIGS)))
    @SETTINGS
    @given(data=st.data(), pattern=st.sampled_from(PATTERNS),
           magnitude=st.sampled_from(MAGNITUDES))
    def test_matches_oracle_and_finite(self, ci, data, pattern, magnitude):
        config = KIVI_CONFIGS[ci]
        q, kc, wk, vc, ring, cfg, start = draw_kivi(data, config, pattern, magnitude)
        t = config[3]
        out = _jitted_kivi(self.impl, cfg, t)(q, kc, wk, vc, ring, start)
        assert out.dtype == jnp.float32 and out.shape == q.shape
        assert bool(jnp.all(jnp.isfinite(out))), "NaN/inf output for finite input"
        oracles.assert_close(out, kivi_oracle(q, kc, wk, vc, ring, cfg, start, t))

    def test_nan_key_in_a_quantized_chunk_gives_nan_rows(self):
        """A NaN key scale in row 0's first quantized chunk (attended by the loop over quantized
        chunks, whose partial is merged with the window's): row 0 is NaN, as in the oracle and
        dense attention, not the window's attention alone. A NaN key in a chunk row 1 has not
        quantized (its chunk 2) changes nothing there."""
        config = KIVI_CONFIGS[0]  # the shapes of the contract test above: no new compile
        q, kc, wk, vc, ring, cfg, start = make_kivi(config, "random", 1.0, 5, [40, 30])
        run = _jitted_kivi(self.impl, cfg, config[3])
        clean = np.asarray(run(q, kc, wk, vc, ring, start))
        bad = kc._replace(scale=kc.scale.at[0, 0, 0, 0, 3].set(jnp.nan)
                          .at[1, 0, 2, 0, 3].set(jnp.nan))
        out = np.asarray(run(q, bad, wk, vc, ring, start))
        assert np.isnan(kivi_oracle(q, bad, wk, vc, ring, cfg, start, config[3]).out[0]).all()
        assert np.isnan(out[0]).all()
        np.testing.assert_array_equal(out[1], clean[1])


class TestKIVIReference(KIVIContract):
    impl = "reference"


class TestKIVIXLA(KIVIContract):
    impl = "xla"


# -- the checks reject wrong outputs ----------------------------------------------------------


def _shuffled(out):
    """``out [B, K, R, D]`` with each (row, kv head)'s rows moved to the next (row, kv head)."""
    b, kh, r, d = out.shape
    return np.roll(out.reshape(b * kh, r, d), 1, axis=0).reshape(out.shape)


@pytest.mark.parametrize("ci", range(len(QVG_CONFIGS)))
def test_qvg_check_rejects_wrong_outputs(ci):
    """At the largest magnitudes drawn, with and without RoPE, the QVG check accepts the oracle's
    output and rejects an all-zero output and one shuffled across (row, kv head) pairs; for the
    needle the tolerance is below 1e-4 of the value range."""
    config = QVG_CONFIGS[ci]
    b, kh, t, n, nc, stages = config[0], config[1], config[3], config[5], config[6], config[9]
    lengths = [nc * n + n - 1 - i for i in range(b)]  # every chunk quantized, ragged rows
    for pattern in PATTERNS:
        for magnitude in (30.0, 1e4):
            for rope in (None, 10_000.0):
                q, kc, vc, cfg, start, nq = make_qvg(config, pattern, magnitude, 3, lengths)
                att = qvg_oracle(q, kc, vc, cfg, start, nq, t, rope)
                oracles.assert_close(att.out, att, lse=att.lse)
                with pytest.raises(AssertionError):
                    oracles.assert_close(np.zeros_like(att.out), att)
                if b * kh > 1:
                    with pytest.raises(AssertionError):
                        oracles.assert_close(_shuffled(att.out), att)
                if pattern == "needle" and stages and magnitude == 1e4:
                    vmax = float(np.abs(oracles.qvg_dequantize(*vc, cfg.bits)[0]).max())
                    assert att.out_tol.max() <= 1e-4 * vmax, (rope, att.out_tol.max() / vmax)


@pytest.mark.parametrize("ci", range(len(KIVI_CONFIGS)))
def test_kivi_check_rejects_wrong_outputs(ci):
    """At the largest magnitudes drawn, the KIVI check accepts the oracle's output and rejects an
    all-zero output and one shuffled across (row, kv head) pairs; for the needle the tolerance is
    below 1e-4 of the value range."""
    config = KIVI_CONFIGS[ci]
    b, kh, t, n, nc = config[0], config[1], config[3], config[5], config[6]
    lengths = [nc * n - 1 - i for i in range(b)]
    for pattern in PATTERNS:
        for magnitude in (30.0, 1e4):
            q, kc, wk, vc, ring, cfg, start = make_kivi(config, pattern, magnitude, 3, lengths)
            att = kivi_oracle(q, kc, wk, vc, ring, cfg, start, t)
            oracles.assert_close(att.out, att)
            with pytest.raises(AssertionError):
                oracles.assert_close(np.zeros_like(att.out), att)
            if b * kh > 1:
                with pytest.raises(AssertionError):
                    oracles.assert_close(_shuffled(att.out), att)
            if pattern == "needle" and magnitude == 1e4:
                vmax = max(float(np.abs(oracles.f64(ring)).max()),
                           float(np.abs(oracles.unpack_planar(vc.codes, cfg.bits)
                                        * np.repeat(oracles.f64(vc.scale), cfg.block, -1)
                                        + np.repeat(oracles.f64(vc.zero), cfg.block, -1)).max()))
                assert att.out_tol.max() <= 1e-4 * vmax, att.out_tol.max() / vmax


def test_oracles_on_hand_made_codes():
    """The QVG and KIVI oracles on values worked out by hand: one token, D = 4, 2-bit codes."""
    # QVG: codes 3, 0, 1, 2 (offset 2: +1, -2, -1, 0) with scale 0.5 and one centroid (1, 1, 1, 1):
    # x = (1.5, 0, 0.5, 1). D = 4 at 2 bits is P = 1 byte: channel d sits at bit 2 d
    byte = 3 | (0 << 2) | (1 << 4) | (2 << 6)
    codes = np.array([[[[[byte]]]]], np.uint8)  # [B, K, NC, P, N]
    scales = np.full((1, 1, 1, 1, 1), 0.5)
    assign = np.zeros((1, 1, 1, 1, 1), np.uint8)
    cents = np.ones((1, 1, 1, 1, 1, 4))
    x, xabs = oracles.qvg_dequantize(codes, scales, assign, cents, 2)
    np.testing.assert_array_equal(x[0, 0, 0], [1.5, 0.0, 0.5, 1.0])
    np.testing.assert_array_equal(xabs[0, 0, 0], [1.5, 2.0, 1.5, 1.0])
    # RoPE at position 1 with base 1 (every angle 1 radian): (x0, x2) and (x1, x3) rotated
    r = oracles.rope_rotate(np.array([[1.0, 0.0, 0.0, 1.0]]), np.array([1]), 1.0)
    np.testing.assert_allclose(r[0], [math.cos(1), -math.sin(1), math.sin(1), math.cos(1)],
                               rtol=1e-15)
    # KIVI: a key code 2 with scale 0.25 and zero -1 -> -0.5; one token, group 1, no window
    att = oracles.kivi_attention(
        np.ones((1, 1, 1, 4)), (np.array([[[[[byte]]]]], np.uint8), np.full((1, 1, 1, 1, 4), 0.25),
                                np.full((1, 1, 1, 1, 4), -1.0)),
        np.zeros((1, 1, 1, 4)), (np.array([[[[byte]]]], np.uint8), np.full((1, 1, 1, 1), 0.5),
                                 np.zeros((1, 1, 1, 1))),
        np.full((1, 1, 1, 4), 7.0), bits=2, group=1, block=4, residual=1, start=np.array([0]),
        num_new=1)
    # one slot, attended alone: the output is its value, the exact ring value (the last N = 1)
    np.testing.assert_array_equal(att.out[0, 0, 0], [7.0] * 4)
    # logit = sum_c (c_code * 0.25 - 1) / 2 = ((0.75 - 1) + (0 - 1) + (0.25 - 1) + (0.5 - 1)) / 2
    np.testing.assert_allclose(att.lse[0, 0, 0], -1.25, rtol=1e-15)
