"""Tests of the FFD / Quest sparse decode attention (reference, XLA path, Pallas kernels)."""

import functools
import math

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kernels import attention_math
from kernels.attention_math import grouped_attention
from kernels.sparse_decode import api, pallas_tpu, quest, xla
from kernels.sparse_decode import cache as sd_cache
from kernels.sparse_decode import reference as ref
from tests.hypothesis_budget import examples

_update = jax.jit(ref.update_ffd_cache)


@functools.cache
def _jitted(fn, **static):
    """``fn(*arrays, **static)`` jitted (one compile per shape instead of one per eager op)."""
    return jax.jit(functools.partial(fn, **static))


def _filled_cache(key, b, kh, s, d, p, lengths=None, scan_copy=False):
    """A cache whose row ``i`` holds ``lengths[i]`` random tokens (default: full), plus raw k, v."""
    kk, kv = jax.random.split(key)
    k = jax.random.normal(kk, (b, kh, s, d)) * (1.0 + jnp.arange(d) / d)
    v = jax.random.normal(kv, (b, kh, s, d))
    rows = []
    for i, n in enumerate([s] * b if lengths is None else [int(x) for x in lengths]):
        c = ref.init_ffd_cache(1, s, kh, d, jnp.float32, p, scan_copy=scan_copy)
        rows.append(_update(c, k[i:i + 1, :, :n], v[i:i + 1, :, :n], jnp.zeros((1,), jnp.int32)))
    return jax.tree.map(lambda *x: jnp.concatenate(x), *rows), k, v


def test_pack_roundtrip_and_layout():
    codes = jax.random.randint(jax.random.key(0), (3, 5, 64), 0, 4).astype(jnp.uint8)
    words = ref.pack_codes(codes)
    assert words.shape == (3, 5, 4) and words.dtype == jnp.int32
    chex.assert_trees_all_equal(ref.unpack_codes(words), codes)
    # planar order: channel d sits in word d % W at bit 2 * (d // W)
    one = jnp.zeros((64,), jnp.uint8).at[37].set(3)  # W = 4: word 1, bits 18..19
    np.testing.assert_array_equal(np.asarray(ref.pack_codes(one)).view(np.uint32),
                                  [0, 3 << 18, 0, 0])


def test_quantization_roundtrip_bounds():
    k = jax.random.normal(jax.random.key(1), (2, 3, 16, 32)) * 3.0
    words, scale, resid = ref.quantize_pages(k)
    codes = ref.unpack_codes(words)
    assert int(codes.max()) <= 3 and int(codes.min()) >= 0
    np.testing.assert_allclose(scale, jnp.abs(k).max(-2) / 1.5, rtol=1e-6)
    k_hat = ref.dequantize_pages(words, scale)
    r_exact = (k - k_hat) / scale[..., None, :]
    assert float(jnp.abs(r_exact).max()) <= 0.5 + 1e-5  # nearest of the 4 levels
    err = jnp.abs(k - ref.dequantize_pages(words, scale, resid))
    # float8 e4m3: 3 mantissa bits (relative 2^-4) and subnormal spacing 2^-9 (half: 2^-10)
    bound = scale[..., None, :] * (jnp.abs(r_exact) / 16 + 2.0 ** -10) + 1e-6
    assert bool(jnp.all(err <= bound))
    assert float(err.max()) > 0  # the residual is lossy, the bound is not vacuous


def test_update_ragged_chunks_equal_one_shot():
    b, kh, s, d, p = 2, 2, 64, 32, 16
    cache_1, k, v = _filled_cache(jax.random.key(2), b, kh, s, d, p, None)
    cache_2 = ref.init_ffd_cache(b, s, kh, d, jnp.float32, p, scan_copy=True)
    pos = 0
    for t in (5, 1, 17, 1, 9, 31):  # crosses page boundaries in every way
        cache_2 = _update(cache_2, k[:, :, pos:pos + t], v[:, :, pos:pos + t],
                          jnp.full((b,), pos, jnp.int32))
        pos += t
    assert pos == s
    for name in ("codes", "scale", "resid", "v"):
        np.testing.assert_array_equal(np.asarray(cache_1[name], np.float32),
                                      np.asarray(cache_2[name], np.float32))
    chex.assert_trees_all_equal(ref.unpack_codes(ref.token_major_codes(cache_2["codes"])),
                                cache_2["codes_i8"].astype(jnp.uint8))


def test_dense_decode_matches_grouped_attention():
    b, h, kh, s, d = 2, 8, 2, 40, 16
    ks = jax.random.split(jax.random.key(3), 3)
    q = jax.random.normal(ks[0], (b, h, d))
    k = jax.random.normal(ks[1], (b, kh, s, d))
    v = jax.random.normal(ks[2], (b, kh, s, d))
    lengths = jnp.array([40, 13])
    mask = (jnp.arange(s)[None, :] < lengths[:, None])[:, None, None, None, :]
    want = grouped_attention(q[:, :, None], k, v, mask)[:, :, 0]
    np.testing.assert_allclose(ref.dense_decode(q, k, v, lengths), want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("impl", ["reference", "xla"])
def test_delta_infinity_is_dense(impl):
    b, h, kh, s, d, p = 2, 8, 2, 128, 32, 16
    lengths = jnp.array([128, 77])  # full cache; ragged with a partial tail page
    cache, k, v = _filled_cache(jax.random.key(4), b, kh, s, d, p, lengths, scan_copy=impl == "xla")
    q = jax.random.normal(jax.random.key(5), (b, h, d))
    out = _jitted(api.ffd_decode, delta=math.inf, implementation=impl)(q, cache, lengths)
    k_ref = _jitted(ref.refined_keys)(cache, lengths)
    dense = _jitted(ref.dense_decode)
    dense_refined = dense(q, k_ref, cache["v"].reshape(b, kh, s, d).astype(jnp.float32), lengths)
    np.testing.assert_allclose(out, dense_refined, atol=2e-5, rtol=2e-5)
    exact = dense(q, k, v, lengths)
    rel = float(jnp.linalg.norm(out - exact) / jnp.linalg.norm(exact))
    assert rel < 2e-2  # float8 residual + bf16 values


def test_selection_rule_and_xla_equals_reference():
    b, h, kh, s, d, p = 2, 8, 2, 256, 32, 16
    lengths = jnp.array([256, 150])
    cache, _, _ = _filled_cache(jax.random.key(6), b, kh, s, d, p, lengths, scan_copy=True)
    q = jax.random.normal(jax.random.key(7), (b, h, d)) * 3.0
    out, keep = _jitted(ref.ffd_decode_reference, delta=2.0)(q, cache, lengths)
    qg = attention_math.grouped_query(q, kh)
    pm = _jitted(ref.ffd_page_max)(qg, cache, lengths)
    pm_scan = _jitted(ref.ffd_scan_page_max)(qg, cache, lengths // p)
    np.testing.assert_allclose(jnp.where(jnp.isfinite(pm), pm, 0), jnp.where(jnp.isfinite(pm), pm_scan, 0),
                               atol=1e-4, rtol=1e-4)
    # brute-force rule: first and last full pages define theta
    nf = np.asarray(lengths // p)
    pmn = np.asarray(pm)
    for bi in range(b):
        theta = np.maximum(pmn[bi, :, :, 0], pmn[bi, :, :, nf[bi] - 1]) - 2.0
        want = (pmn[bi] >= theta[..., None]).any(1) & (np.arange(pmn.shape[-1]) < nf[bi])
        np.testing.assert_array_equal(np.asarray(keep[bi]), want)
    frac = float(keep.sum() / (nf.sum() * kh))
    assert 0.0 < frac < 1.0  # the rule is neither trivially dense nor empty here
    out_x, keep_x = _jitted(xla.ffd_decode_xla, delta=2.0, max_pages=16)(q, cache, lengths)
    np.testing.assert_array_equal(keep_x, keep)
    np.testing.assert_allclose(out_x, out, atol=2e-5, rtol=2e-5)
    # top-k variant keeps exactly k pages (continuous scores: no ties)
    _, keep_k = _jitted(ref.ffd_decode_reference, top_k=3)(q, cache, lengths)
    np.testing.assert_array_equal(keep_k.sum(-1), 3)


@functools.cache
def _kernel_case(g, b, seed, **rule):
    """(cache, q, lengths, the reference's output under ``rule``), shared by both kernels.

    Four pages of 16 (interpret mode unrolls one copy of the TPU kernel's page loop per page of a
    round: four pages cost half of eight); rows: a full cache, a ragged one with a skippable middle
    page and a partial tail, one of two full pages and a 1-token tail, one with only a tail.
    """
    kh, d, p, s = 2, 32, 16, 64
    lengths = jnp.array([64, 61, 33, 5][:b])
    cache, _, _ = _filled_cache(jax.random.key(seed), b, kh, s, d, p, lengths)
    q = jax.random.normal(jax.random.key(seed + 1), (b, g * kh, d)) * 3.0
    want = _jitted(ref.ffd_decode_reference, **rule)(q, cache, lengths)[0]
    return cache, q, lengths, want


@pytest.mark.parametrize("g,b", [(1, 2), (4, 3), (8, 2)])
@pytest.mark.parametrize("impl", ["pallas_tpu", "pallas_gpu"])
def test_pallas_interpret_matches_reference(impl, g, b):
    cache, q, lengths, want = _kernel_case(g, b, 10 + g, delta=3.0)
    # eager call: the kernels are jitted inside, so both tests' TPU attention kernels (same
    # shapes) compile once
    got = api.ffd_decode(q, cache, lengths, delta=3.0, implementation=impl, interpret=True,
                         num_splits=2)
    np.testing.assert_allclose(got, want, atol=3e-5, rtol=3e-5)


@pytest.mark.parametrize("pages_per_round", [1, 3])
def test_pallas_tpu_attention_over_several_dma_rounds(pages_per_round):
    """The TPU attention kernel copies ``pages_per_round`` kept pages per round, the next round's
    copies started (double-buffered) before this round's pages are attended: with fewer pages per
    round than kept pages it runs several rounds (3 per round: a partial last round), alternating
    buffer slots, and still equals the reference."""
    cache, q, lengths, want = _kernel_case(4, 3, 14, delta=3.0)  # the shapes of the case (4, 3)
    got, _, count = pallas_tpu.ffd_decode_tpu(q, cache, lengths, delta=3.0, interpret=True,
                                              pages_per_round=pages_per_round)
    counts = np.asarray(count)
    assert (counts > pages_per_round).any()  # some (row, kv head) runs several rounds
    assert pages_per_round == 1 or (counts % pages_per_round).any()  # and some a partial one
    np.testing.assert_allclose(got, want, atol=3e-5, rtol=3e-5)


def test_pallas_top_k_matches_reference():
    cache, q, lengths, want = _kernel_case(4, 3, 30, top_k=2)  # the shapes of the case (4, 3)
    for impl in ("pallas_tpu", "pallas_gpu"):
        got = api.ffd_decode(q, cache, lengths, top_k=2, implementation=impl, interpret=True)
        np.testing.assert_allclose(got, want, atol=3e-5, rtol=3e-5)


@pytest.mark.parametrize("d", [64, 96, 128, 256])
@pytest.mark.parametrize("platform,impl", [("tpu", "pallas_tpu"), ("cuda", "pallas_gpu")])
def test_kernels_lower_for_accelerators(platform, impl, d):
    """Lowering only (Triton's power-of-two rule on loads is checked here: D = 96 is loaded as
    64 + 32); true compiles are in test_sparse_decode_compile.py."""
    b, kh, g, p, n = 2, 2, 4, 16, 4
    cache = jax.eval_shape(lambda: ref.init_ffd_cache(b, n * p, kh, d, jnp.bfloat16, p))
    q = jax.ShapeDtypeStruct((b, kh * g, d), jnp.bfloat16)
    lengths = jax.ShapeDtypeStruct((b,), jnp.int32)
    f = jax.jit(lambda q, c, l: api.ffd_decode(q, c, l, delta=3.0, implementation=impl))
    # a Triton call carries no serialization-compatibility guarantee; we only check that it lowers
    checks = [jax.export.DisabledSafetyCheck.custom_call("__gpu$xla.gpu.triton")]
    exported = jax.export.export(f, platforms=[platform], disabled_checks=checks)(q, cache, lengths)
    text = exported.mlir_module()
    assert ("tpu_custom_call" in text) if platform == "tpu" else ("triton" in text.lower())


def test_delta_units_keep_the_same_pages():
    """The base-2 delta of the authors' kernel (8.656 = 6 / ln 2) keeps the pages of 6 nats; the rule written out
    on base-2 logits (page maxima times log2 e) agrees."""
    b, h, kh, s, d, p = 2, 8, 2, 256, 32, 16
    lengths = jnp.array([256, 150])
    cache, _, _ = _filled_cache(jax.random.key(12), b, kh, s, d, p, lengths)
    q = jax.random.normal(jax.random.key(13), (b, h, d)) * 10.0
    delta2 = 6.0 / math.log(2.0)
    keep_nats = _jitted(api.ffd_select, delta=6.0)(q, cache, lengths)
    keep_log2 = _jitted(api.ffd_select, delta=delta2, delta_unit="log2")(q, cache, lengths)
    np.testing.assert_array_equal(keep_log2, keep_nats)
    assert 0 < int(keep_nats.sum()) < int((lengths // p).sum()) * kh  # neither empty nor dense
    pm2 = np.asarray(_jitted(ref.ffd_scan_page_max)(attention_math.grouped_query(q, kh), cache,
                                                    lengths // p), np.float64) / math.log(2.0)
    nf = np.asarray(lengths // p)
    for bi in range(b):
        theta2 = np.maximum(pm2[bi, :, :, 0], pm2[bi, :, :, nf[bi] - 1]) - delta2
        margin = np.abs(pm2[bi, :, :, :nf[bi]] - theta2[..., None]).min()
        assert margin > 1e-3  # no page sits on the threshold: float rounding cannot flip one
        want = (pm2[bi] >= theta2[..., None]).any(1) & (np.arange(pm2.shape[-1]) < nf[bi])
        np.testing.assert_array_equal(np.asarray(keep_log2[bi]), want)
    out_nats = _jitted(api.ffd_decode, delta=6.0)(q, cache, lengths)
    out_log2 = _jitted(api.ffd_decode, delta=delta2, delta_unit="log2")(q, cache, lengths)
    np.testing.assert_array_equal(out_log2, out_nats)
    assert ref.delta_in_nats(8.7, "log2") == pytest.approx(6.030, abs=1e-3)


_quantize = jax.jit(ref.quantize_pages)


@settings(max_examples=examples(25), deadline=None)
@given(exponent=st.integers(-45, 38), mantissa=st.floats(1.0, 9.99),
       pattern=st.sampled_from(["normal", "one_large", "constant", "tiny_rest"]),
       seed=st.integers(0, 2**16))
def test_float8_residual_cannot_overflow(exponent, mantissa, pattern, seed):
    """For any finite keys (subnormal to ~1e38), the float8 residual is finite and in [-0.5, 0.5]
    (e4m3 overflows past 448), the scale is finite, and the refined key is within the residual's
    float8 rounding of the key."""
    mag = mantissa * 10.0 ** exponent
    rng = np.random.default_rng(seed)
    k = rng.standard_normal((2, 16, 32))
    if pattern == "one_large":
        k[:, 3, 5] = 1e4
    elif pattern == "constant":
        k[:] = 1.0
    elif pattern == "tiny_rest":
        k[:, 1:] *= 1e-30
    k = np.clip(k * mag, -np.finfo(np.float32).max, np.finfo(np.float32).max).astype(np.float32)
    assert np.isfinite(k).all()
    words, scale, resid = _quantize(jnp.asarray(k))
    r = np.asarray(resid.astype(jnp.float32))
    assert np.isfinite(r).all() and np.abs(r).max() <= 0.5
    assert np.isfinite(np.asarray(scale)).all()
    k_ref = np.asarray(ref.dequantize_pages(words, scale, resid), np.float64)
    sc = np.asarray(scale, np.float64)[..., None, :]
    # e4m3: 3 mantissa bits (2^-4 relative) and subnormal spacing 2^-9; float32 roundings; and
    # below float32's normal range XLA may flush to zero (an absolute 2 * tiny)
    tiny = float(np.finfo(np.float32).tiny)
    bound = sc * (np.abs(r) / 16 + 2.0 ** -10) * 1.01 + 4e-7 * np.abs(k.astype(np.float64))
    err = np.abs(k_ref - k.astype(np.float64))
    assert (err <= bound + 2 * tiny).all()


def test_f8_decoder_matches_xla_on_all_codes():
    codes = jnp.arange(256, dtype=jnp.uint8)
    x = jax.lax.bitcast_convert_type(codes, jnp.float8_e4m3fn)
    np.testing.assert_array_equal(np.asarray(xla.f8_to_f32(x)), np.asarray(x.astype(jnp.float32)))
    assert int(np.isnan(np.asarray(xla.f8_to_f32(x))).sum()) == 2  # S.1111.111


def test_tpu_residual_read_as_e4m3b11_on_all_codes():
    """pallas_tpu reads the float8 e4m3fn residuals through the e4m3b11fnuz unpack: 16 times the
    value is the e4m3fn value for every byte but the two NaNs (0x7f, 0xff: +-480, only ever written
    beside a NaN scale), and -0 (0x80, NaN in e4m3b11fnuz) reads as 0."""
    codes = jnp.arange(256, dtype=jnp.uint8)
    x = jax.lax.bitcast_convert_type(codes, jnp.float8_e4m3fn)
    got = np.asarray(pallas_tpu._residual_b11(x)) * 16
    want = np.asarray(x.astype(jnp.float32))
    nan = np.isnan(want)
    np.testing.assert_array_equal(np.flatnonzero(nan), [0x7F, 0xFF])
    np.testing.assert_array_equal(got[~nan], want[~nan])
    np.testing.assert_array_equal(got[nan], [480.0, -480.0])


def test_tpu_split_terms_are_exact_bfloat16_summing_to_the_value():
    """pallas_tpu._split3: three terms, each a bfloat16 number, whose float32 sum is the value
    exactly (normal magnitudes from 1e-30 to 1e30, both signs, and zero)."""
    rng = np.random.default_rng(0)
    x = (rng.standard_normal((8, 128)) * 10.0 ** rng.uniform(-30, 30, (8, 128))).astype(np.float32)
    x[0, :4] = [0.0, -0.0, 1.0, -3.0]
    terms = np.asarray(pallas_tpu._split3(jnp.asarray(x))).reshape(3, 8, 128)
    for t in terms:
        np.testing.assert_array_equal(t.astype(jnp.bfloat16).astype(np.float32), t)
    np.testing.assert_array_equal((terms[0] + terms[1]) + terms[2], x)


def test_quest_full_budget_is_dense_and_bound_holds():
    b, h, kh, s, d, p = 2, 4, 2, 64, 16, 16
    ks = jax.random.split(jax.random.key(8), 3)
    q = jax.random.normal(ks[0], (b, h, d))
    k = jax.random.normal(ks[1], (b, kh, s, d))
    v = jax.random.normal(ks[2], (b, kh, s, d))
    lengths = jnp.array([64, 50])
    kmin, kmax = quest.quest_metadata(k, p)
    out, _ = quest.quest_decode(q, k, v, kmin, kmax, lengths, top_k=4, page_size=p)
    np.testing.assert_allclose(out, ref.dense_decode(q, k, v, lengths), atol=1e-5, rtol=1e-5)
    # the score upper-bounds every logit of its page
    qg = attention_math.grouped_query(q, kh)
    ub = quest.quest_page_scores(qg, kmin, kmax)  # [B, K, P]
    logits = jnp.einsum("bkgd,bkptd->bkgpt", qg, k.reshape(b, kh, s // p, p, d)).max((2, 4))
    assert bool(jnp.all(logits <= ub + 1e-5))


def test_quest_ranks_pages_whose_bound_is_not_finite():
    """Finite keys whose channel-wise bound overflows float32 rank first, as FFD's rankable does:
    keys 16 and 17 (page 1) hold 2e19 in channel 0 and 1 respectively, the query 4e19 in both
    (1e19 after 1/sqrt(D)), so each has the finite logit 2e38 (the rest are O(1)) while the bound
    adds the two products, 4e38 = +inf. The softmax is then half key 16's value and half key 17's:
    dense attention's, and Quest's with page 1 attended (with top_k = 4, every full page, and with
    top_k = 1). A NaN key: its page is attended (top_k covers every page) and its rows are NaN as
    dense attention's."""
    b, h, kh, s, d, p = 1, 2, 1, 64, 16, 16
    ks = jax.random.split(jax.random.key(12), 3)
    q = jax.random.normal(ks[0], (b, h, d)).at[:, :, :2].set(4e19)
    k = jax.random.normal(ks[1], (b, kh, s, d)).at[:, :, :, :2].set(0.0)
    k = k.at[0, 0, 16, 0].set(2e19).at[0, 0, 17, 1].set(2e19)
    v = jax.random.normal(ks[2], (b, kh, s, d))
    lengths = jnp.array([64])
    kmin, kmax = quest.quest_metadata(k, p)
    bound = quest.quest_page_scores(attention_math.grouped_query(q, kh), kmin, kmax)
    assert np.isposinf(np.asarray(bound)[0, 0, 1]) and np.isfinite(np.asarray(bound)[0, 0, [0, 2, 3]]).all()
    want = np.broadcast_to((np.asarray(v)[0, 0, 16] + np.asarray(v)[0, 0, 17]) / 2, (b, h, d))
    np.testing.assert_allclose(ref.dense_decode(q, k, v, lengths), want, atol=1e-6)
    out, keep = quest.quest_decode(q, k, v, kmin, kmax, lengths, top_k=4, page_size=p)
    assert np.asarray(keep).all()
    np.testing.assert_allclose(out, want, atol=1e-6)
    out1, keep1 = quest.quest_decode(q, k, v, kmin, kmax, lengths, top_k=1, page_size=p)
    np.testing.assert_array_equal(np.asarray(keep1)[0, 0], [False, True, False, False])
    np.testing.assert_allclose(out1, want, atol=1e-6)
    # a NaN key in page 2 (finite keys elsewhere): NaN rows, as dense attention
    k_nan = jax.random.normal(ks[1], (b, kh, s, d)).at[0, 0, 37, 3].set(jnp.nan)
    kmin, kmax = quest.quest_metadata(k_nan, p)
    out, keep = quest.quest_decode(q / 1e19, k_nan, v, kmin, kmax, lengths, top_k=4, page_size=p)
    assert np.asarray(keep).all() and np.isnan(np.asarray(out)).all()
    assert np.isnan(np.asarray(ref.dense_decode(q / 1e19, k_nan, v, lengths))).all()


def test_bad_input_raises():
    b, kh, s, d, p = 1, 2, 64, 32, 16
    cache, _, _ = _filled_cache(jax.random.key(9), b, kh, s, d, p, None)
    q = jnp.ones((b, 4, d))
    with pytest.raises(ValueError, match="head dim"):
        api.ffd_decode(jnp.ones((b, 4, 16)), cache, jnp.array([10]))
    with pytest.raises(ValueError, match="capacity"):
        api.ffd_decode(q, cache, jnp.array([65]))
    with pytest.raises(ValueError, match="delta"):
        api.ffd_decode(q, cache, jnp.array([10]), delta=-1.0)
    with pytest.raises(ValueError, match="delta"):
        sd_cache.FFDCache(delta=-0.5)
    with pytest.raises(ValueError, match="divide"):
        ref.init_ffd_cache(1, 100, 2, 32, jnp.float32, 16)
    with pytest.raises(ValueError, match="divide"):
        sd_cache.QuestCache(page_size=16).init(1, 100, 2, 32, jnp.float32)
    with pytest.raises(ValueError, match=r"implementation 'cuda'.*'auto'.*pallas_gpu"):
        api.ffd_decode(q, cache, jnp.array([10]), implementation="cuda")
    with pytest.raises(ValueError, match="implementation"):
        sd_cache.FFDCache(implementation="triton")
    with pytest.raises(ValueError, match="q must be a floating-point"):
        api.ffd_decode(jnp.ones((b, 4, d), jnp.int32), cache, jnp.array([10]))
    with pytest.raises(ValueError, match="delta_unit"):
        api.ffd_decode(q, cache, jnp.array([10]), delta_unit="bits")
    with pytest.raises(ValueError, match="max_pages"):
        api.ffd_decode(q, cache, jnp.array([10]), max_pages=0)
    with pytest.raises(ValueError, match="num_splits"):
        api.ffd_decode(q, cache, jnp.array([10]), num_splits=0, implementation="pallas_tpu")
    # None and "auto" both dispatch by platform (XLA on this CPU)
    q = jax.random.normal(jax.random.key(14), (b, 4, d))
    want = api.ffd_decode(q, cache, jnp.array([50]), delta=2.0, implementation="xla")
    for impl in (None, "auto"):
        np.testing.assert_array_equal(
            api.ffd_decode(q, cache, jnp.array([50]), delta=2.0, implementation=impl), want)


def test_transformer_decode_with_backends():
    from flax import nnx

    from models.kv_cache import get_backend
    from models.transformer import Transformer, TransformerConfig

    cfg = TransformerConfig(vocab_size=40, max_len=64, d_model=64, num_layers=1, num_heads=4,
                            num_kv_heads=2, causal=True)
    model = Transformer(cfg, rngs=nnx.Rngs(0))
    graphdef, params = nnx.split(model)
    tokens = jax.random.randint(jax.random.key(11), (2, 40), 0, 40)
    want = jax.jit(lambda params, tokens: nnx.merge(graphdef, params)(tokens))(params, tokens)[:, -1]

    @functools.partial(jax.jit, static_argnums=4)
    def decode(params, tokens, cache, start, backend):
        return nnx.merge(graphdef, params).decode(tokens, cache, start, backend)

    def last_logits(backend):
        cache = model.init_cache(2, 64, backend)
        _, cache = decode(params, tokens[:, :37], cache, jnp.zeros((2,), jnp.int32), backend)
        for t in range(37, 40):  # decode steps across the page boundary at 32
            logits, cache = decode(params, tokens[:, t:t + 1], cache,
                                   jnp.full((2,), t, jnp.int32), backend)
        return logits[:, 0]

    ffd = get_backend("ffd", page_size=16, delta=math.inf)
    np.testing.assert_allclose(last_logits(ffd), want, atol=3e-2)
    quest = get_backend("quest", page_size=16, top_k=4)  # budget covers every page: exact
    np.testing.assert_allclose(last_logits(quest), want, atol=1e-4)
