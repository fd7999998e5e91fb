"""The timed workload and the selection statistics (kernels.sparse_decode.workload / benchmark)."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kernels.sparse_decode import benchmark, workload
from kernels.sparse_decode import reference as ref

# jitted: one compile per shape instead of one per eager op
_keep = jax.jit(ref.ffd_keep, static_argnums=3)
_kept_mass = jax.jit(workload.kept_mass)
_update = jax.jit(ref.update_ffd_cache)
_workload = jax.jit(workload.concentrated_workload, static_argnums=(1, 2, 3, 4, 5, 6, 7))


def test_concentrated_workload_delta_rule_keeps_few_pages_and_the_mass():
    """The paper's regime: top-delta keeps a small fraction of the pages, and they carry >= 99% of
    the exact softmax mass (8k tokens, 64 pages of 128)."""
    b, h, kh, s, d, p = 2, 8, 2, 8192, 64, 128
    q, k, v = _workload(jax.random.key(0), b, h, kh, s, d, p, workload.Concentration())
    assert q.shape == (b, h, d) and k.shape == v.shape == (b, kh, s, d)
    np.testing.assert_allclose(jnp.linalg.norm(q, axis=-1), math.sqrt(d), rtol=1e-5)
    lengths = jnp.full((b,), s, jnp.int32)
    cache = _update(ref.init_ffd_cache(b, s, kh, d, jnp.float32, p), k, v,
                    jnp.zeros((b,), jnp.int32))
    keep = _keep(q, cache, lengths, 6.0)
    frac = float(keep.mean())
    mass = np.asarray(_kept_mass(q, k, keep, lengths))
    assert frac <= 0.2, frac
    assert mass.min() >= 0.99, mass.min()
    # the sink page and the last full page (the rule's reference pages) are kept
    assert bool(keep[..., 0].all()) and bool(keep[..., -1].all())
    # without the concentration the same rule keeps most pages (flat attention)
    flat = workload.Concentration(hot_page_fraction=0.0, sink_tokens=0, recent_tokens=0)
    q2, k2, v2 = _workload(jax.random.key(0), b, h, kh, s, d, p, flat)
    c2 = _update(ref.init_ffd_cache(b, s, kh, d, jnp.float32, p), k2, v2,
                 jnp.zeros((b,), jnp.int32))
    assert float(_keep(q2, c2, lengths, 6.0).mean()) > 0.5


def test_kept_mass_closed_forms():
    b, h, kh, s, d, p = 1, 4, 2, 64, 16, 16
    q = jax.random.normal(jax.random.key(1), (b, h, d))
    k = jax.random.normal(jax.random.key(2), (b, kh, s, d)) * 2
    lengths = jnp.array([50], jnp.int32)  # 3 full pages, a tail of 2 tokens
    every = jnp.ones((b, kh, s // p), bool)
    np.testing.assert_allclose(workload.kept_mass(q, k, every, lengths), 1.0, rtol=1e-6)
    none = jnp.zeros((b, kh, s // p), bool)
    logits = np.einsum("kgd,ksd->kgs", np.asarray(q[0]).reshape(kh, 2, d),
                       np.asarray(k[0])[:, :50]) / math.sqrt(d)
    w = np.exp(logits - logits.max(-1, keepdims=True))
    want = w[..., 48:50].sum(-1) / w.sum(-1)  # the tail page only
    np.testing.assert_allclose(workload.kept_mass(q, k, none, lengths)[0], want, rtol=1e-5)
    with pytest.raises(ValueError, match="keep must"):
        workload.kept_mass(q, k, jnp.ones((b, kh, 5), bool), lengths)


def test_cache_with_lengths_equals_row_by_row_updates():
    b, kh, d, p, n = 2, 2, 32, 16, 3
    k = jax.random.normal(jax.random.key(3), (b, kh, n * p, d))
    v = jax.random.normal(jax.random.key(4), (b, kh, n * p, d))
    lengths = jnp.array([37, 16], jnp.int32)
    got = workload.cache_with_lengths(k, v, lengths, p)
    for i, length in enumerate(np.asarray(lengths)):
        c = ref.init_ffd_cache(1, n * p, kh, d, jnp.float32, p)
        c = _update(c, k[i:i + 1, :, :length], v[i:i + 1, :, :length],
                    jnp.zeros((1,), jnp.int32))
        full = length // p
        for name in ("codes", "scale", "resid", "v"):  # the pages the row has filled
            np.testing.assert_array_equal(np.asarray(got[name][i, :, :full], np.float32),
                                          np.asarray(c[name][0, :, :full], np.float32), err_msg=name)
        np.testing.assert_array_equal(np.asarray(got["tail"][i]), np.asarray(c["tail"][0]))


def test_bytes_closed_forms_and_slot_capacity():
    s, kh, d, p, b = 4096, 8, 128, 128, 1
    n = s // p
    assert benchmark.dense_bytes(s, kh, d, b, 2) == s * kh * d * 2 * 2
    accel = benchmark.ffd_bytes(s, kh, d, p, b, kept_pages=4)
    want = kh * (n * p * d / 4 + n * d * 4 + 4 * (p * d * 3 + d * 4) + p * d * 6)
    assert accel == want
    cpu = benchmark.ffd_bytes(s, kh, d, p, b, kept_pages=4, layout="cpu")
    assert cpu == kh * (n * p * d + n * d * 4 + 4 * (p * d * 4 + d * 4) + p * d * 6)
    with pytest.raises(ValueError, match="layout must"):
        benchmark.ffd_bytes(s, kh, d, p, b, 4, layout="gpu")
    keep = np.zeros((2, 3, 40), bool)
    keep[1, 2, :11] = True
    assert benchmark.slot_capacity(jnp.asarray(keep)) == 16
    assert benchmark.slot_capacity(jnp.zeros((1, 1, 5), bool)) == 5


def test_time_decode_reports_the_rule_pages():
    setup = benchmark.SpeedSetup(num_heads=4, num_kv_heads=2, head_dim=32, page_size=16,
                                 budget_fraction=0.25, repeats=3)
    row = benchmark.time_decode(jax.random.key(5), 512, 1, setup, bandwidth_gbs=10.0)
    assert row["pages"] == 32 and row["budget_pages"] == 8 and row["rounds"] == 3
    assert 0 < row["rule_kept_fraction"] <= row["kept_fraction"] <= 1
    assert row["kept_mass"] >= 0.99
    assert row["slots"] % benchmark.SLOT_MULTIPLE == 0 or row["slots"] == 32
    for key in ("dense_f32", "dense_bf16", "dense", "ffd", "ffd_scan", "ffd_attend", "ffd_budget",
                "quest", "ffd_over_dense", "speedup"):
        assert 0 < row[key]["min"] <= row[key]["median"] <= row[key]["max"], key
    assert row["dense"] == row["dense_" + row["dense_variant"]]
    parts = row["ffd_median_round"]  # one round's stages add up to its total, the median
    assert parts["scan"] + parts["attend"] == pytest.approx(parts["total"], rel=1e-12)
    assert parts["total"] == pytest.approx(row["ffd"]["median"], rel=1e-12)
    assert row["bytes_ratio"] > row["cpu_bytes_ratio"] > 0
    with pytest.raises(ValueError, match="context must"):
        benchmark.time_decode(jax.random.key(5), 500, 1, setup, 10.0)


def test_interleaved_seconds_alternates_and_sums_stages():
    """With a clock that advances one second per read, the call order, the per-stage times and
    their sums are exact."""
    t = [0.0]

    def clock():
        t[0] += 1.0
        return t[0]

    order = []
    fns = {"a": lambda: order.append("a"),
           "b": [lambda: order.append("b0"), lambda: order.append("b1")]}
    sec = benchmark.interleaved_seconds(fns, repeats=3, warmup=1, clock=clock)
    assert order == ["a", "b0", "b1"] + ["a", "b0", "b1", "b0", "b1", "a", "a", "b0", "b1"]
    assert sec == {"a": [1.0] * 3, "b/0": [1.0] * 3, "b/1": [1.0] * 3, "b": [2.0] * 3}
    assert benchmark.summary([3.0, 1.0, 2.0]) == {"median": 2.0, "min": 1.0, "max": 3.0}
    with pytest.raises(ValueError, match="repeats >= 1"):
        benchmark.interleaved_seconds(fns, repeats=0)


def test_bad_setups():
    with pytest.raises(ValueError, match="hot_page_fraction must"):
        workload.Concentration(hot_page_fraction=1.5)
    with pytest.raises(ValueError, match="logit_high must"):
        workload.Concentration(logit_low=5.0, logit_high=4.0)
    with pytest.raises(ValueError, match="budget_fraction must"):
        benchmark.SpeedSetup(budget_fraction=0.0)
    with pytest.raises(ValueError, match="seq_len must"):
        workload.concentrated_workload(jax.random.key(0), 1, 4, 2, 100, 16, 16)


def test_selection_quality_head_density_averages_to_the_density():
    """Per kv head kept fractions average to the overall one; with delta = inf every page is kept
    and the only error left is the key storage's (codes + float8 residual), below 5%."""
    key = jax.random.key(3)
    kq, kk, kv = jax.random.split(key, 3)
    kh, s, d, p = 2, 256, 32, 32
    q = jax.random.normal(kq, (3, 2 * kh, d))
    k = jax.random.normal(kk, (kh, s, d))
    v = jax.random.normal(kv, (kh, s, d))
    lengths = jnp.asarray([100, 200, 256], jnp.int32)
    r = workload.selection_quality(q, k, v, lengths, p, 1.0)
    assert len(r["head_density"]) == kh
    assert np.mean(r["head_density"]) == pytest.approx(r["density"], rel=1e-12)
    full = workload.selection_quality(q, k, v, lengths, p, float("inf"))
    assert full["density"] == 1.0 and full["head_density"] == [1.0] * kh
    assert full["kept_mass"] == pytest.approx(1.0, abs=1e-6)
    assert 0.0 < full["rel_err"] < 0.05
