"""The XLA path's int8 page scan (kernels/sparse_decode/xla.py) against its proof.

* The lemma: the int8 estimate ``m'`` is within its margin ``mu`` of the reference scan's float32
  estimate and of the float64 estimate (from the stored codes and scales), at head dims 16 to 256
  and key magnitudes 1e-3 to 1e4.
* The superset: every page the reference rule keeps is kept, on random caches and on adversarial
  ones where a page's estimate sits exactly on the threshold (delta set from the reference's own
  float32 estimates, then moved by one float32 step either way), and on pages that are scaled
  copies of the reference page (equal codes, estimates equal up to the scale).
* Not vacuous: a page whose float64 estimate lies more than twice the margins below the threshold
  is skipped.
* Non-finite keys keep their page (on a reference page, every page), as the reference does.
"""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kernels import attention_math
from kernels.sparse_decode import reference as ref
from kernels.sparse_decode import workload
from kernels.sparse_decode import xla as xs
from tests.kernels import oracles


def make_cache(k, p):
    """An FFD cache with the int8 scan copy holding all of ``k [B, K, S, D]``."""
    b, kh, s, d = k.shape
    return workload.cache_with_lengths(k, jnp.zeros_like(k), jnp.full((b,), s, jnp.int32), p,
                                       scan_copy=True)


def estimates64(q, cache):
    """float64 [B, K, G, P]: the largest estimated logit of each page, from the stored codes."""
    k_hat, _, _ = oracles.ffd_quantized_keys(cache)
    b, kh, n, p, d = k_hat.shape
    qg = oracles.f64(q).reshape(b, kh, -1, d)
    return np.einsum("bkgd,bkptd->bkgpt", qg, k_hat).max(-1) / math.sqrt(d)


_bounds = jax.jit(lambda qg, cache, nf: xs.page_bounds(qg, cache["codes_i8"], cache["scale"], nf))
_scan = jax.jit(ref.ffd_scan_page_max)
# the rule and the superset, jitted with delta traced (one compile per cache shape for every delta)
_rule = jax.jit(ref.ffd_keep)
_superset = jax.jit(xs.ffd_keep_superset)


@pytest.mark.parametrize("d", [16, 128, 256])
def test_estimate_within_margin(d):
    b, kh, g, p, n = 2, 2, 3, 16, 4
    rng = np.random.default_rng(d)
    for magnitude in (1e-3, 1.0, 1e4):
        k = jnp.asarray(rng.standard_normal((b, kh, n * p, d)) * magnitude, jnp.float32)
        # heavy-tailed queries: a few large channels make the int8 step coarse for the rest
        q = jnp.asarray(rng.standard_t(2, (b, kh * g, d)) / magnitude, jnp.float32)
        cache = make_cache(k, p)
        qg = attention_math.grouped_query(q, kh)
        nf = jnp.full((b,), n, jnp.int32)
        est, mu = (np.asarray(x, np.float64) for x in _bounds(qg, cache, nf))
        m32 = np.asarray(_scan(qg, cache, nf), np.float64)
        m64 = estimates64(q, cache)
        assert np.all(np.abs(est - m32) <= mu), float(np.max(np.abs(est - m32) / mu))
        assert np.all(np.abs(est - m64) <= mu), float(np.max(np.abs(est - m64) / mu))


def test_query_quantization_error_is_half_a_step_per_channel():
    rng = np.random.default_rng(5)
    qs = rng.standard_t(2, (64, 128)).astype(np.float32) * 10.0 ** rng.uniform(-30, 30, (64, 1))
    qs[0] = 0.0  # an all-zero query: step 1, codes 0, no error
    codes, step, err, s = (np.asarray(x, np.float64) for x in xs.quantize_query(jnp.asarray(qs)))
    assert codes.min() >= -127 and codes.max() <= 127
    assert np.all(np.abs(codes).max(-1)[1:] == 127)  # the largest channel uses the full range
    per = np.abs(step[:, None] * codes - qs.astype(np.float64))
    assert np.all(per <= step[:, None] * (0.5 + 1e-6))
    np.testing.assert_allclose(err, per.sum(-1), rtol=1e-5, atol=0)
    np.testing.assert_allclose(s, np.abs(qs.astype(np.float64)).sum(-1), rtol=1e-5)
    assert step[0] == 1.0 and err[0] == 0.0 and not codes[0].any()
    bad = qs.copy()
    bad[1, 3], bad[2, 0] = np.nan, np.inf
    _, step, err, s = (np.asarray(x) for x in xs.quantize_query(jnp.asarray(bad)))
    assert np.isnan(step[1:3]).all() and np.isnan(err[1:3]).all() and np.isfinite(err[3:]).all()


def _assert_superset(q, cache, lengths, delta):
    delta = jnp.float32(delta)
    want = np.asarray(_rule(q, cache, lengths, delta))
    got = np.asarray(_superset(q, cache, lengths, delta))
    missing = want & ~got
    assert not missing.any(), f"pages of the rule not kept: {np.argwhere(missing)[:5]}"
    return want, got


def test_superset_on_random_caches_and_deltas():
    b, kh, g, d, p, n = 3, 2, 4, 64, 16, 8
    rng = np.random.default_rng(0)
    for _ in range(6):
        scale = 10.0 ** rng.uniform(-2, 3)
        k = jnp.asarray(rng.standard_normal((b, kh, n * p, d)) * scale, jnp.float32)
        q = jnp.asarray(rng.standard_normal((b, kh * g, d)) * 2.0 / scale, jnp.float32)
        lengths = jnp.asarray(rng.integers(p, n * p + 1, b), jnp.int32)
        cache = workload.cache_with_lengths(k, k, lengths, p, scan_copy=True)
        for delta in (0.0, 0.5, 2.0, 6.0):
            _assert_superset(q, cache, lengths, jnp.float32(delta))


def test_superset_with_a_page_exactly_on_the_threshold():
    """delta chosen so that a page's float32 estimate equals the float32 threshold, then one
    float32 step either side: the rule's decision flips there and the superset follows it."""
    b, kh, g, d, p, n = 1, 2, 4, 128, 16, 6
    rng = np.random.default_rng(1)
    k = jnp.asarray(rng.standard_normal((b, kh, n * p, d)), jnp.float32)
    q = jnp.asarray(rng.standard_normal((b, kh * g, d)) * 3.0, jnp.float32)
    lengths = jnp.full((b,), n * p, jnp.int32)
    cache = make_cache(k, p)
    m = np.asarray(_scan(attention_math.grouped_query(q, kh), cache, lengths // p))  # float32 [B,K,G,P]
    top = np.maximum(m[..., 0], m[..., n - 1])  # [B, K, G]
    flips = 0
    for kv in range(kh):
        for head in range(g):
            for j in range(1, n - 1):
                gap = np.float32(top[0, kv, head] - m[0, kv, head, j])
                if not gap > 0:
                    continue
                for delta in (np.nextafter(gap, np.float32(-1)), gap,
                              np.nextafter(gap, np.float32(1e9))):
                    want, _ = _assert_superset(q, cache, lengths, jnp.float32(delta))
                    flips += int(want[0, kv, j])
    assert flips > 0, "no delta put a page on the kept side of the threshold"


def test_superset_on_scaled_copies_of_the_reference_page():
    """Pages that are copies of page 0 times c: equal codes, estimates c * m_0; with
    delta = (1 - c) m_0 each copy sits on the threshold."""
    b, kh, g, d, p, n = 1, 1, 2, 32, 16, 5
    rng = np.random.default_rng(2)
    first = rng.standard_normal((p, d))
    cs = np.array([1.0, 0.75, 0.5, 0.9, 1.0])  # page 4 (last) = page 0: theta from both
    k = jnp.asarray(np.concatenate([first * c for c in cs])[None, None], jnp.float32)
    q = jnp.asarray(rng.standard_normal((b, kh * g, d)), jnp.float32)
    lengths = jnp.full((b,), n * p, jnp.int32)
    cache = make_cache(k, p)
    m = np.asarray(_scan(attention_math.grouped_query(q, kh), cache, lengths // p))[0, 0]  # [G, P]
    for j in (1, 2, 3):
        for head in range(g):
            gap = np.float32(max(m[head, 0], m[head, 4]) - m[head, j])
            for delta in (np.nextafter(gap, np.float32(-1)), gap, np.nextafter(gap, np.float32(9))):
                if delta >= 0:
                    _assert_superset(q, cache, lengths, jnp.float32(delta))


def test_far_pages_are_skipped():
    """The converse of the superset: a page whose float64 estimate is below the threshold by
    more than twice its margin plus twice the reference pages' is skipped (on the concentrated
    workload, where most pages are far below)."""
    b, h, kh, s, d, p = 1, 8, 2, 4096, 128, 128
    q, k, v = jax.jit(workload.concentrated_workload, static_argnums=(1, 2, 3, 4, 5, 6))(
        jax.random.key(0), b, h, kh, s, d, p)  # one compile instead of one per op
    lengths = jnp.full((b,), s, jnp.int32)
    cache = workload.cache_with_lengths(k, v, lengths, p, scan_copy=True)
    for delta in (1.0, 3.47, 6.0):
        want, got = _assert_superset(q, cache, lengths, delta)
        m64 = estimates64(q, cache)  # [B, K, G, P]
        mu = np.asarray(jax.jit(xs.margin_nats)(q, cache, lengths), np.float64)
        n = m64.shape[-1]
        ref_mu = np.maximum(mu[..., 0], mu[..., n - 1])[..., None]
        theta = np.maximum(m64[..., 0], m64[..., n - 1])[..., None] - delta
        far = (m64 + 2 * mu + 2 * ref_mu + 1e-4 < theta).all(2)  # every head of the group
        assert not (got & far).any()
        assert (~far).sum() < got.size  # the check above has pages to bite on


def test_nan_key_keeps_its_page_and_a_nan_reference_page_keeps_all():
    b, kh, g, d, p, n = 1, 1, 2, 32, 16, 6
    rng = np.random.default_rng(3)
    k = rng.standard_normal((b, kh, n * p, d))
    q = jnp.asarray(rng.standard_normal((b, kh * g, d)), jnp.float32)
    lengths = jnp.full((b,), n * p, jnp.int32)
    k[0, 0, p:5 * p] *= 0.01  # pages 1-4: estimates near 0, far below the reference pages' ~2.5
    for page, everything in ((3, False), (0, True)):
        bad = k.copy()
        bad[0, 0, page * p + 1, 3] = np.nan
        cache = make_cache(jnp.asarray(bad, jnp.float32), p)
        want, got = _assert_superset(q, cache, lengths, 0.0)
        assert got[0, 0, page]
        assert got[0, 0].all() == everything


def test_requires_the_int8_scan_copy():
    k = jnp.ones((1, 1, 32, 16))
    cache = workload.cache_with_lengths(k, k, jnp.array([32]), 16)
    with pytest.raises(ValueError, match="codes_i8"):
        xs.ffd_keep_superset(jnp.ones((1, 1, 16)), cache, jnp.array([32]), 1.0)


def test_api_refuses_shapes_the_gpu_kernel_cannot_tile_before_tracing():
    """One ValueError naming the value and what works, raised before any selection runs."""
    from kernels.sparse_decode import api

    b, kh, d = 1, 1, 16
    for p, g, match in ((24, 2, "page size 24"), (16, 17, "got 17")):
        cache = ref.init_ffd_cache(b, 2 * p, kh, d, jnp.float32, p)
        q = jnp.ones((b, g * kh, d))
        with pytest.raises(ValueError, match=match) as err:
            api.ffd_decode(q, cache, jnp.array([2 * p]), implementation="pallas_gpu",
                           interpret=True)
        assert "implementation='xla'" in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(ValueError, match=r"assumed_kept_fraction .*\(0, 1\].* got 1.5"):
        api.ffd_decode(jnp.ones((1, 1, 16)), ref.init_ffd_cache(1, 32, 1, 16, jnp.float32, 16),
                       jnp.array([32]), implementation="pallas_gpu", assumed_kept_fraction=1.5)


def test_authors_default_deltas_in_nats():
    assert ref.delta_in_nats(5.0, "log2") == pytest.approx(5 * math.log(2))  # 3.466
    assert ref.delta_in_nats(7.0, "log2") == pytest.approx(4.852, abs=1e-3)
    assert 6.0 / math.log(2) == pytest.approx(8.656, abs=1e-3)
