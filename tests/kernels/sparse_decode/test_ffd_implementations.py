"""One contract for every FFD decode implementation (reference, xla, pallas_tpu and pallas_gpu in
interpret mode): the same kept pages, the same output as a float64 oracle over those pages, dense
attention at delta = infinity, never NaN for finite input, NaN for a NaN key.

Shapes come from a few fixed configurations (interpret-mode kernels compile once per shape); values,
lengths, delta and the key pattern (random, all equal, needle in the last full page or in the tail,
magnitudes up to 1e4) are drawn by hypothesis.
"""

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kernels.sparse_decode import api
from kernels.sparse_decode import reference as ref

# (batch, kv heads, group size G, head dim D, page size p, pages P, dtype of q and the tail)
CONFIGS = (
    (2, 1, 8, 64, 16, 4, jnp.float32),
    (3, 2, 3, 96, 16, 3, jnp.bfloat16),
    (2, 2, 1, 128, 16, 2, jnp.float32),
    (1, 1, 2, 256, 16, 2, jnp.bfloat16),
)
PATTERNS = ("random", "equal", "needle_last", "needle_tail")
EPS32 = float(np.finfo(np.float32).eps)


def make_cache(k, v, lengths, p, dtype, scan_copy):
    """FFD cache holding ``lengths[b]`` tokens of keys/values [B, K, S, D] (see
    test_make_cache_equals_update for the equivalence with update_ffd_cache)."""
    b, kh, s, d = k.shape
    n = s // p
    num_full = lengths // p
    slot = jnp.arange(s)[None, :] < lengths[:, None]  # [B, S]
    k = jnp.where(slot[:, None, :, None], k.astype(dtype), 0)
    v = jnp.where(slot[:, None, :, None], v, 0)
    pages = k.reshape(b, kh, n, p, d)
    codes, scale, resid = ref.quantize_pages(pages)
    full = (jnp.arange(n)[None, :] < num_full[:, None])[:, None, :]  # [B, 1, P]
    codes = jnp.where(full[..., None, None], codes, 0)
    scale = jnp.where(full[..., None], scale, 0)
    resid = jnp.where(full[..., None, None], resid, jnp.zeros((), ref.F8))
    tail_page = jnp.minimum(num_full, n - 1)[:, None, None, None, None]
    tail = jnp.take_along_axis(pages, tail_page, axis=2)[:, :, 0]
    tail = jnp.where((num_full < n)[:, None, None, None], tail, 0)
    cache = {"codes": codes, "scale": scale, "resid": resid, "tail": tail.astype(dtype),
             "v": v.reshape(b, kh, n, p, d).astype(jnp.bfloat16)}
    if scan_copy:
        cache["codes_u8"] = ref.unpack_codes(codes)
    return cache


_make_cache = jax.jit(make_cache, static_argnums=(3, 4, 5))
_update = jax.jit(ref.update_ffd_cache)


def draw_case(data, config, pattern, magnitude, scan_copy=False):
    """(q, cache, lengths, k, v) for one configuration; k, v are the raw float32 keys/values."""
    b, kh, g, d, p, n, dtype = config
    s = n * p
    rng = np.random.default_rng(data.draw(st.integers(0, 2**31 - 1), label="seed"))
    lengths = np.array([data.draw(st.integers(1, s), label=f"length{i}") for i in range(b)])
    if pattern == "needle_last":  # at least one full page and a needle on the last one
        lengths = np.maximum(lengths, p)
    q = jnp.asarray(rng.standard_normal((b, kh * g, d)) * 2.0, dtype)
    k = jnp.asarray(rng.standard_normal((b, kh, s, d)) * magnitude, jnp.float32)
    if pattern == "equal":
        k = jnp.full((b, kh, s, d), magnitude, jnp.float32)
    elif pattern.startswith("needle"):
        # the needle points along the group's mean query: it dominates the row's softmax
        direction = q.astype(jnp.float32).reshape(b, kh, g, d).mean(2)
        direction = direction / jnp.linalg.norm(direction, axis=-1, keepdims=True)
        num_full = lengths // p
        pos = num_full * p - 1 if pattern == "needle_last" else lengths - 1  # tail if non-empty
        needle = direction * magnitude * 4.0 * math.sqrt(d)
        k = k.at[np.arange(b), :, pos].set(needle)
    v = jnp.asarray(rng.standard_normal((b, kh, s, d)), jnp.float32)
    lengths = jnp.asarray(lengths, jnp.int32)
    return q, _make_cache(k, v, lengths, p, dtype, scan_copy), lengths, k, v


def oracle(q, cache, lengths, keep):
    """float64 numpy softmax attention over the kept full pages (refined keys) and the tail, and
    the largest |logit| (for the float32 rounding budget)."""
    b, kh, n, p, d = cache["resid"].shape
    h = q.shape[1]
    g = h // kh
    codes = np.asarray(ref.unpack_codes(cache["codes"]), np.float64)
    resid = np.asarray(cache["resid"].astype(jnp.float32), np.float64)
    scale = np.asarray(cache["scale"], np.float64)
    keys = (codes - 1.5 + resid) * scale[..., None, :]  # [B, K, P, p, D]
    lengths = np.asarray(lengths)
    num_full = lengths // p
    tail = np.asarray(cache["tail"].astype(jnp.float32), np.float64)
    vals = np.asarray(cache["v"].astype(jnp.float32), np.float64)
    qn = np.asarray(q.astype(jnp.float32), np.float64).reshape(b, kh, g, d) / math.sqrt(d)
    keep = np.asarray(keep)
    out = np.zeros((b, kh, g, d))
    big = 0.0
    for bi in range(b):
        for ki in range(kh):
            ks, vs = [], []
            for j in range(n):
                if keep[bi, ki, j]:
                    ks.append(keys[bi, ki, j])
                    vs.append(vals[bi, ki, j])
            t = lengths[bi] % p
            if t:
                ks.append(tail[bi, ki, :t])
                vs.append(vals[bi, ki, num_full[bi], :t])
            kk, vv = np.concatenate(ks), np.concatenate(vs)
            logits = qn[bi, ki] @ kk.T
            big = max(big, float(np.abs(logits).max()))
            w = np.exp(logits - logits.max(-1, keepdims=True))
            out[bi, ki] = (w @ vv) / w.sum(-1, keepdims=True)
    return out.reshape(b, h, d), big


@jax.jit
def _scan_page_max(q, cache, num_full):
    return ref.ffd_scan_page_max(ref._grouped_query(q, cache["resid"].shape[1]), cache, num_full)


def rule_keep(q, cache, lengths, delta):
    """The top-delta rule written out in numpy on the scan's float32 page maxima."""
    kh, n, p = cache["resid"].shape[1], cache["resid"].shape[2], cache["resid"].shape[3]
    nf = np.asarray(lengths) // p
    pm = np.asarray(_scan_page_max(q, cache, jnp.asarray(nf)))
    want = np.zeros((q.shape[0], kh, n), bool)
    for bi in range(q.shape[0]):
        if nf[bi] == 0:
            continue
        theta = np.maximum(pm[bi, :, :, 0], pm[bi, :, :, nf[bi] - 1]) - delta  # [K, G]
        want[bi] = (pm[bi] >= theta[..., None]).any(1) & (np.arange(n) < nf[bi])
    return want


def assert_close_to_oracle(got, want, big, vmax):
    """float32 logits carry a relative rounding error of a few eps: the weights then move by
    ~eps * |logit| * sqrt(D), the output by that times the value range; a bf16 output adds its own
    rounding (2^-8 relative)."""
    d = want.shape[-1]
    tol = vmax * (3e-5 + 8 * math.sqrt(d) * EPS32 * big)
    if got.dtype == jnp.bfloat16:
        tol = tol + 2.0 ** -8 * float(np.abs(want).max())
    np.testing.assert_allclose(np.asarray(got.astype(jnp.float32), np.float64), want, atol=tol,
                               rtol=0)


_select = jax.jit(lambda q, cache, lengths, delta: api.ffd_select(q, cache, lengths, delta=delta))


@functools.cache
def _jitted_decode(impl, interpret, **static):
    return jax.jit(lambda q, cache, lengths, delta: api.ffd_decode(
        q, cache, lengths, delta=delta, implementation=impl, interpret=interpret,
        return_keep=True, **static))


class FFDContract:
    """What every implementation must do; subclasses set ``impl`` (and ``interpret``)."""

    impl: str
    interpret = False
    scan_copy = False  # the CPU layout (byte-per-code scan copy) for the XLA path

    def decode(self, q, cache, lengths, delta=8.0, **static):
        """api.ffd_decode -> (out, keep), jitted (one compile per shape instead of one per op)."""
        return _jitted_decode(self.impl, self.interpret, **static)(q, cache, lengths, delta)

    # one executor per subclass is the point of the shared contract (no state is kept on self)
    @settings(max_examples=6, deadline=None, derandomize=True,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                     HealthCheck.differing_executors])
    @given(data=st.data(), ci=st.sampled_from(range(len(CONFIGS))),
           pattern=st.sampled_from(PATTERNS), magnitude=st.sampled_from([1e-2, 1.0, 30.0, 1e4]),
           delta=st.sampled_from([0.0, math.inf, 1.5, 4.0]))
    def test_pages_and_values(self, data, ci, pattern, magnitude, delta):
        config = CONFIGS[ci]
        q, cache, lengths, _, _ = draw_case(data, config, pattern, magnitude, self.scan_copy)
        out, keep = self.decode(q, cache, lengths, delta=delta)
        assert out.dtype == q.dtype and out.shape == q.shape
        assert bool(jnp.all(jnp.isfinite(out))), "NaN/inf output for finite input"
        # the same pages as the rule and as every other implementation
        np.testing.assert_array_equal(np.asarray(keep), rule_keep(q, cache, lengths, delta))
        np.testing.assert_array_equal(np.asarray(keep),
                                      np.asarray(_select(q, cache, lengths, delta)))
        _, keep_ref = _jitted_decode("reference", False)(q, cache, lengths, delta)
        np.testing.assert_array_equal(np.asarray(keep), np.asarray(keep_ref))
        p = config[4]
        nf = np.asarray(lengths) // p
        full = np.arange(config[5])[None, None, :] < nf[:, None, None]
        if delta == math.inf:  # keeps everything: dense attention over the refined keys
            np.testing.assert_array_equal(np.asarray(keep), np.broadcast_to(full, keep.shape))
        # the page that sets the threshold is always kept
        has_full = nf > 0
        assert np.all(np.asarray(keep).any(-1)[has_full])
        want, big = oracle(q, cache, lengths, keep)
        vmax = float(jnp.abs(cache["v"].astype(jnp.float32)).max())
        assert_close_to_oracle(out, want, big, vmax)

    def test_top_k_one_on_all_equal_keys_keeps_one_page(self):
        """512 tokens, 4 full pages of 128, every score tied: exactly one page, finite output."""
        config = (1, 1, 4, 64, 128, 4, jnp.float32)
        b, kh, g, d, p, n, _ = config
        k = jnp.ones((b, kh, n * p, d))
        v = jax.random.normal(jax.random.key(0), (b, kh, n * p, d))
        lengths = jnp.array([512], jnp.int32)
        cache = _make_cache(k, v, lengths, p, jnp.float32, self.scan_copy)
        q = jax.random.normal(jax.random.key(1), (b, kh * g, d))
        out, keep = self.decode(q, cache, lengths, top_k=1)
        np.testing.assert_array_equal(np.asarray(keep), [[[True, False, False, False]]])
        want, big = oracle(q, cache, lengths, keep)
        assert_close_to_oracle(out, want, big, float(jnp.abs(cache["v"].astype(jnp.float32)).max()))
        # equal keys: the output is the mean of the first page's values
        np.testing.assert_allclose(
            out[0], np.broadcast_to(np.asarray(cache["v"][0, 0, 0], np.float64).mean(0), (g, d)),
            atol=1e-5)

    def test_max_pages_keeps_the_top_scores(self):
        """A needle on the last full page and max_pages = 2: the needle's page is attended, by
        score, in every implementation, and the output stays close to dense attention."""
        config = (2, 1, 4, 64, 16, 6, jnp.float32)
        b, kh, g, d, p, n, _ = config
        q = jax.random.normal(jax.random.key(2), (b, kh * g, d))
        k = jax.random.normal(jax.random.key(3), (b, kh, n * p, d))
        v = jax.random.normal(jax.random.key(4), (b, kh, n * p, d))
        lengths = jnp.array([n * p, 4 * p + 5], jnp.int32)
        last = np.asarray(lengths) // p - 1
        direction = q.reshape(b, kh, g, d).mean(2)
        k = k.at[np.arange(b), :, last * p + 3].set(
            direction / jnp.linalg.norm(direction, axis=-1, keepdims=True) * 12.0 * math.sqrt(d))
        cache = _make_cache(k, v, lengths, p, jnp.float32, self.scan_copy)
        out, keep = self.decode(q, cache, lengths, delta=math.inf, max_pages=2)
        keep = np.asarray(keep)
        assert keep.sum(-1).max() == 2 and keep[np.arange(b), 0, last].all()
        score = np.asarray(_scan_page_max(q, cache, lengths // p)).max(2)  # [B, K, P]
        for bi in range(b):
            kept = np.flatnonzero(keep[bi, 0])
            top2 = np.argsort(-score[bi, 0], kind="stable")[:2]
            assert set(kept) == set(top2)
        want, big = oracle(q, cache, lengths, keep)
        assert_close_to_oracle(out, want, big, float(jnp.abs(cache["v"].astype(jnp.float32)).max()))
        dense = ref.dense_decode(q, k, v, lengths)
        assert float(jnp.abs(out - dense).max()) < 0.1  # the needle carries the softmax

    def test_paper_delta_in_base2_units(self):
        """The authors' delta (base-2 logits) passed as is with delta_unit="log2" selects and
        attends exactly what its value in nats (times ln 2) does."""
        config = (2, 2, 4, 64, 16, 5, jnp.float32)
        b, kh, g, d, p, n, _ = config
        q = jax.random.normal(jax.random.key(11), (b, kh * g, d)) * 2.0
        k = jax.random.normal(jax.random.key(12), (b, kh, n * p, d))
        v = jax.random.normal(jax.random.key(13), (b, kh, n * p, d))
        lengths = jnp.array([n * p - 5, 3 * p], jnp.int32)
        cache = _make_cache(k, v, lengths, p, jnp.float32, self.scan_copy)
        out2, keep2 = self.decode(q, cache, lengths, delta=2.0, delta_unit="log2")
        oute, keepe = self.decode(q, cache, lengths, delta=2.0 * math.log(2.0))
        assert not np.asarray(keep2).all(), "delta 2 (base 2) should skip a page here"
        np.testing.assert_array_equal(np.asarray(keep2), np.asarray(keepe))
        np.testing.assert_array_equal(np.asarray(out2), np.asarray(oute))

    def test_nan_key_gives_nan_row(self):
        """A NaN key within a row's length (on a page the rule would skip, or on a reference page)
        makes the query heads of that row and kv head NaN, as dense attention does; the other kv
        head and the other row are unchanged."""
        config = (2, 2, 2, 64, 16, 6, jnp.float32)
        b, kh, g, d, p, n, _ = config
        q = jax.random.normal(jax.random.key(5), (b, kh * g, d)) * 3.0
        k = jax.random.normal(jax.random.key(6), (b, kh, n * p, d))
        v = jax.random.normal(jax.random.key(7), (b, kh, n * p, d))
        lengths = jnp.array([n * p - 3, n * p], jnp.int32)
        clean = _make_cache(k, v, lengths, p, jnp.float32, self.scan_copy)
        out_clean, keep_clean = self.decode(q, clean, lengths, delta=0.0)
        skipped = np.flatnonzero(~np.asarray(keep_clean)[0, 1])
        assert skipped.size, "delta = 0 should skip some page here"
        dense = ref.dense_decode(q, k.at[0, 1, 7, 11].set(jnp.nan), v, lengths)
        assert bool(jnp.all(jnp.isnan(dense[0, g:]))) and bool(jnp.all(jnp.isfinite(dense[0, :g])))
        # kv head 1 of row 0: a skipped page, a reference page; kv head 0 of row 0: the tail
        for head, pos in ((1, int(skipped[0]) * p + 7), (1, 7), (0, n * p - 4)):
            bad = _make_cache(k.at[0, head, pos, 11].set(jnp.nan), v, lengths, p, jnp.float32,
                              self.scan_copy)
            out = np.asarray(self.decode(q, bad, lengths, delta=0.0)[0])
            hit = slice(head * g, (head + 1) * g)
            assert np.isnan(out[0, hit]).all(), f"NaN key at kv head {head}, slot {pos}: finite"
            rest = np.ones(b * kh * g, bool).reshape(b, kh * g)
            rest[0, hit] = False
            np.testing.assert_allclose(out[rest], np.asarray(out_clean)[rest], atol=1e-6)


class TestReference(FFDContract):
    impl = "reference"


class TestXLA(FFDContract):
    impl = "xla"
    scan_copy = True


class TestPallasTPUInterpret(FFDContract):
    impl = "pallas_tpu"
    interpret = True


class TestPallasGPUInterpret(FFDContract):
    impl = "pallas_gpu"
    interpret = True


def test_make_cache_equals_update():
    """The helper builds what update_ffd_cache builds, row by row (ragged, with a tail)."""
    b, kh, d, p, n = 2, 2, 32, 16, 3
    k = jax.random.normal(jax.random.key(8), (b, kh, n * p, d))
    v = jax.random.normal(jax.random.key(9), (b, kh, n * p, d))
    lengths = jnp.array([37, 48], jnp.int32)
    got = make_cache(k, v, lengths, p, jnp.float32, True)
    for i, length in enumerate(np.asarray(lengths)):
        c = ref.init_ffd_cache(1, n * p, kh, d, jnp.float32, p, scan_copy=True)
        c = _update(c, k[i:i + 1, :, :length], v[i:i + 1, :, :length], jnp.zeros((1,), jnp.int32))
        for name in c:
            np.testing.assert_array_equal(np.asarray(got[name][i:i + 1], np.float32),
                                          np.asarray(c[name], np.float32), err_msg=name)
