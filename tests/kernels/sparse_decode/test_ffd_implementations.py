"""One contract for every FFD decode implementation (reference, xla, pallas_tpu and pallas_gpu in
interpret mode), checked against an independent float64 oracle (``tests/kernels/oracles.py``):
the pages the top-delta rule keeps (up to pages within float32 rounding of the threshold), the
attention over them and the tail within the float32 error bound, dense attention at
delta = infinity, never NaN for finite input, NaN for a NaN key; and a test that the contract's
check rejects wrong outputs (zeros, outputs shuffled across rows, dense attention where the rule
skips pages) at the largest magnitudes drawn.

Shapes: every configuration below runs in every implementation (interpret-mode kernels compile
once per shape). Values, lengths, delta and the key pattern (random, all equal, a needle in the
last full page or in the tail, magnitudes 1e-2 to 1e4) are drawn by hypothesis.
"""

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kernels.sparse_decode import api, xla
from kernels.sparse_decode import reference as ref
from tests.hypothesis_budget import examples
from tests.kernels import oracles

# (batch, kv heads, group size G, head dim D, page size p, pages P, dtype of q and the tail)
CONFIGS = (
    (2, 1, 8, 64, 16, 4, jnp.float32),
    (3, 2, 3, 96, 16, 3, jnp.bfloat16),
    (2, 2, 1, 128, 16, 2, jnp.float32),
    (1, 1, 2, 256, 16, 2, jnp.bfloat16),
)
PATTERNS = ("random", "equal", "needle_last", "needle_tail")
MAGNITUDES = (1e-2, 1.0, 30.0, 1e4)
DELTAS = (0.0, math.inf, 1.5, 4.0)


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
    cache = {"codes": jnp.swapaxes(codes, -1, -2), "scale": scale, "resid": resid,
             "tail": tail.astype(dtype), "v": v.reshape(b, kh, n, p, d).astype(jnp.bfloat16)}
    if scan_copy:
        cache["codes_i8"] = ref.unpack_codes(codes).astype(jnp.int8)
    return cache


_make_cache = jax.jit(make_cache, static_argnums=(3, 4, 5))
_update = jax.jit(ref.update_ffd_cache)


def make_case(config, pattern, magnitude, seed, lengths, scan_copy=False):
    """(q, cache, lengths, k, v) for one configuration; k, v are the raw float32 keys/values.

    ``equal``: every key is ``magnitude`` in every channel and the queries are divided by the
    magnitude, so the logits stay O(1): equal logits of size L are resolved by float32 only to
    about ``sqrt(D) u L`` nats (u = 2^-24), so at L ~ 1e4 the exact weights of a uniform softmax are
    not determined by any float32 evaluation (the error bound would admit any output).
    """
    b, kh, g, d, p, n, dtype = config
    s = n * p
    rng = np.random.default_rng(seed)
    lengths = np.asarray(lengths)
    q = rng.standard_normal((b, kh * g, d)) * 2.0
    k = rng.standard_normal((b, kh, s, d)) * magnitude
    if pattern == "equal":
        k = np.full((b, kh, s, d), magnitude)
        q = q / magnitude
    elif pattern.startswith("needle"):
        # the needle points along the group's mean query: it dominates the row's softmax
        direction = q.reshape(b, kh, g, d).mean(2)
        direction /= np.linalg.norm(direction, axis=-1, keepdims=True)
        pos = (lengths // p) * p - 1 if pattern == "needle_last" else lengths - 1
        k[np.arange(b), :, pos] = direction * magnitude * 4.0 * math.sqrt(d)
    v = rng.standard_normal((b, kh, s, d))
    q = jnp.asarray(q, dtype)
    k, v = jnp.asarray(k, jnp.float32), jnp.asarray(v, jnp.float32)
    lengths = jnp.asarray(lengths, jnp.int32)
    return q, _make_cache(k, v, lengths, p, dtype, scan_copy), lengths, k, v


def draw_case(data, config, pattern, magnitude, scan_copy=False):
    """:func:`make_case` with the seed and the lengths drawn (``needle_last``: at least one full
    page, for the needle to sit on its last slot)."""
    b, p, s = config[0], config[4], config[4] * config[5]
    seed = data.draw(st.integers(0, 2**31 - 1), label="seed")
    low = p if pattern == "needle_last" else 1
    lengths = [data.draw(st.integers(low, s), label=f"length{i}") for i in range(b)]
    return make_case(config, pattern, magnitude, seed, lengths, scan_copy)


def check_against_oracle(q, cache, lengths, out, keep, **rule):
    """Asserts the kept pages and the output against the oracle; returns the oracle's attention.

    ``rule``: delta / top_k / max_pages as passed to the implementation. Pages whose decision lies
    within float32 rounding of the rule's threshold (``Selection.ambiguous``) may go either way;
    the oracle then attends what the implementation chose there and only there.
    """
    sel = oracles.ffd_select(q, cache, lengths, **rule)
    keep = np.asarray(keep)
    sure = ~sel.ambiguous
    np.testing.assert_array_equal(keep[sure], sel.keep[sure],
                                  err_msg="kept pages differ from the rule's")
    att = oracles.ffd_attention(q, cache, lengths, np.where(sel.ambiguous, keep, sel.keep))
    oracles.assert_close(out, att, bf16_output=q.dtype == jnp.bfloat16)
    return att


def check_superset_against_oracle(q, cache, lengths, out, keep, **rule):
    """The XLA path's contract (its int8 scan keeps a superset, kernels/sparse_decode/xla.py):
    every page the rule surely keeps is kept (unless a ``max_pages`` cap binds; then the cap
    holds), every extra top-delta page lies within the scan's margin of the threshold, and the
    output is the attention over the pages it reports; returns the oracle's attention."""
    sel = oracles.ffd_select(q, cache, lengths, **rule)
    keep = np.asarray(keep)
    if rule.get("max_pages") is None:
        missing = sel.keep & ~keep
        assert not missing.any(), f"pages of the rule not kept: {np.argwhere(missing)[:5]}"
    else:
        assert keep.sum(-1).max() <= rule["max_pages"]
    delta = rule.get("delta")
    if rule.get("top_k") is None and delta is not None and math.isfinite(delta):
        k_hat, _, _ = oracles.ffd_quantized_keys(cache)
        b, kh, n, p, d = k_hat.shape
        m = np.einsum("bkgd,bkptd->bkgpt", oracles.f64(q).reshape(b, kh, -1, d),
                      k_hat).max(-1) / math.sqrt(d)  # [B, K, G, P]
        mu = np.asarray(xla.margin_nats(q, cache, lengths), np.float64)
        for bi, f in enumerate(np.asarray(lengths) // p):
            if f == 0 or not np.isfinite(m[bi, ..., :f]).all():
                continue
            mb, ub = m[bi, ..., :f], mu[bi, ..., :f]
            # kept => m'_j + mu_j >= max(m'_0 - mu_0, m'_L - mu_L) - delta, and |m' - m| <= mu
            low = np.maximum(mb[..., 0] - 2 * ub[..., 0], mb[..., f - 1] - 2 * ub[..., f - 1])
            theta = low[..., None] - delta - 1e-5 * (1 + np.abs(low[..., None]))
            reach = (mb + 2 * ub >= theta).any(1)  # [K, f]
            extra = keep[bi, :, :f] & ~sel.keep[bi, :, :f] & ~sel.ambiguous[bi, :, :f]
            assert not (extra & ~reach).any(), "a page outside the scan's margin was kept"
    att = oracles.ffd_attention(q, cache, lengths, keep)
    oracles.assert_close(out, att, bf16_output=q.dtype == jnp.bfloat16)
    return att


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
    superset = False  # True: may attend a superset of the rule's pages (the XLA path's int8 scan)
    # True: the top-delta rule runs on the kernel's own float32 estimates (TPU scan, GPU fused
    # kernel), so pages within float32 rounding of the threshold may differ from ffd_select
    own_estimates = False

    def check(self, q, cache, lengths, out, keep, **rule):
        """The contract's page and value check for this implementation."""
        if self.superset:
            return check_superset_against_oracle(q, cache, lengths, out, keep, **rule)
        return check_against_oracle(q, cache, lengths, out, keep, **rule)

    def decode(self, q, cache, lengths, delta=8.0, **static):
        """api.ffd_decode -> (out, keep), jitted (one compile per shape instead of one per op)."""
        return _jitted_decode(self.impl, self.interpret, **static)(q, cache, lengths, delta)

    @pytest.mark.parametrize("ci", range(len(CONFIGS)))
    # one executor per subclass is the point of the shared contract (no state is kept on self)
    @settings(max_examples=examples(12),
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                     HealthCheck.differing_executors])
    @given(data=st.data(), pattern=st.sampled_from(PATTERNS),
           magnitude=st.sampled_from(MAGNITUDES), delta=st.sampled_from(DELTAS))
    def test_pages_and_values(self, ci, data, pattern, magnitude, delta):
        config = CONFIGS[ci]
        q, cache, lengths, _, _ = draw_case(data, config, pattern, magnitude, self.scan_copy)
        out, keep = self.decode(q, cache, lengths, delta=delta)
        assert out.dtype == q.dtype and out.shape == q.shape
        assert bool(jnp.all(jnp.isfinite(out))), "NaN/inf output for finite input"
        # the pages of the rule (oracle), and exactly those of api.ffd_select, which the exact
        # implementations are held to (a superset of them on the XLA path)
        self.check(q, cache, lengths, out, keep, delta=delta)
        rule = np.asarray(_select(q, cache, lengths, delta))
        if self.superset:
            assert not (rule & ~np.asarray(keep)).any(), "a page of ffd_select not attended"
        elif self.own_estimates:  # api.py: alike except within float32 rounding of the threshold
            sure = ~oracles.ffd_select(q, cache, lengths, delta=delta).ambiguous
            np.testing.assert_array_equal(np.asarray(keep)[sure], rule[sure])
        else:
            np.testing.assert_array_equal(np.asarray(keep), rule)
        nf = np.asarray(lengths) // config[4]
        full = np.arange(config[5])[None, None, :] < nf[:, None, None]
        if delta == math.inf:  # keeps everything: dense attention over the refined keys
            np.testing.assert_array_equal(np.asarray(keep), np.broadcast_to(full, keep.shape))
        # the page that sets the threshold is always kept
        assert np.all(np.asarray(keep).any(-1)[nf > 0])

    def test_threshold_page_survives_rounding(self):
        """Row 1 has one full page, which sets the threshold; at delta = 0 it is kept only because
        its estimate equals itself. Here XLA:CPU (loop emitter, LLVM level 0, a CPU with FMA)
        computes that estimate ``m - 1.5 s`` once with a fused multiply-add and once without, one
        bit apart: a selection that compared the two dropped the page from the masked maximum
        while the exponential sum attended it (inf / NaN output). Held on every code generation:
        finite, the page kept, the contract's values."""
        q, cache, lengths, _, _ = make_case(CONFIGS[2], "random", 1e-2, 1, (1, 16), self.scan_copy)
        out, keep = self.decode(q, cache, lengths, delta=0.0)
        assert bool(jnp.all(jnp.isfinite(out)))
        np.testing.assert_array_equal(np.asarray(keep)[1, :, 0], True)
        self.check(q, cache, lengths, out, keep, delta=0.0)

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
        self.check(q, cache, lengths, out, keep, top_k=1)
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
        sel = oracles.ffd_select(q, cache, lengths, delta=math.inf, max_pages=2)
        assert not sel.ambiguous.any()  # distinct scores: the top two are determined
        self.check(q, cache, lengths, out, keep, delta=math.inf, max_pages=2)
        dense = ref.dense_decode(q, k, v, lengths)
        assert float(jnp.abs(out - dense).max()) < 0.1  # the needle carries the softmax

    def test_paper_delta_in_base2_units(self):
        """The authors' delta (base-2 logits) passed as is with delta_unit="log2" selects and
        attends exactly what its value in nats (times ln 2) does."""
        # four pages (interpret mode unrolls the TPU kernel's page loop once per page of a round);
        # with these inputs the rule skips a full page of row 0
        config = (2, 2, 4, 64, 16, 4, jnp.float32)
        b, kh, g, d, p, n, _ = config
        q = jax.random.normal(jax.random.key(11), (b, kh * g, d)) * 2.0
        k = jax.random.normal(jax.random.key(12), (b, kh, n * p, d))
        v = jax.random.normal(jax.random.key(13), (b, kh, n * p, d))
        lengths = jnp.array([n * p - 5, 3 * p], jnp.int32)
        cache = _make_cache(k, v, lengths, p, jnp.float32, self.scan_copy)
        out2, keep2 = self.decode(q, cache, lengths, delta=2.0, delta_unit="log2")
        oute, keepe = self.decode(q, cache, lengths, delta=2.0 * math.log(2.0))
        # the inputs are informative: the rule skips a full page (the int8 scan may keep it)
        full = np.arange(n)[None, None, :] < (np.asarray(lengths) // p)[:, None, None]
        rule = oracles.ffd_select(q, cache, lengths, delta=2.0 * math.log(2.0)).keep
        assert (full & ~rule).any(), "delta 2 (base 2) should skip a full page here"
        assert not np.asarray(keep2).all()
        np.testing.assert_array_equal(np.asarray(keep2), np.asarray(keepe))
        np.testing.assert_array_equal(np.asarray(out2), np.asarray(oute))
        self.check(q, cache, lengths, out2, keep2, delta=2.0 * math.log(2.0))

    def test_nan_key_gives_nan_row(self):
        """A NaN key within a row's length (on a page the rule would skip, or on a reference page)
        makes the query heads of that row and kv head NaN, as dense attention does; the other kv
        head and the other row are unchanged."""
        config = (2, 2, 4, 64, 16, 4, jnp.float32)  # the shapes of the test above: one compile
        b, kh, g, d, p, n, _ = config
        q = jax.random.normal(jax.random.key(5), (b, kh * g, d)) * 3.0
        k = jax.random.normal(jax.random.key(6), (b, kh, n * p, d))
        v = jax.random.normal(jax.random.key(7), (b, kh, n * p, d))
        lengths = jnp.array([n * p - 3, n * p], jnp.int32)
        clean = _make_cache(k, v, lengths, p, jnp.float32, self.scan_copy)
        out_clean, keep_clean = self.decode(q, clean, lengths, delta=0.0)
        skipped = np.flatnonzero(~np.asarray(keep_clean)[0, 1, :(n * p - 3) // p])  # full pages
        assert skipped.size, "delta = 0 should skip some full page here"
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
    """The XLA path on the CPU layout, its default float32 scan: the rule's pages exactly."""

    impl = "xla"
    scan_copy = True


class TestXLAInt8Scan(FFDContract):
    """The XLA path's int8 scan (``xla_scan="int8"``): a superset of the rule's pages."""

    impl = "xla"
    scan_copy = True
    superset = True

    def decode(self, q, cache, lengths, delta=8.0, **static):
        return super().decode(q, cache, lengths, delta=delta, xla_scan="int8", **static)


class TestXLAPacked(FFDContract):
    """The XLA path on a cache without the scan copy: the rule's own mask."""

    impl = "xla"


class TestPallasTPUInterpret(FFDContract):
    impl = "pallas_tpu"
    interpret = True
    own_estimates = True


class TestPallasGPUInterpret(FFDContract):
    impl = "pallas_gpu"
    interpret = True
    own_estimates = True

    def test_top_delta_keep_is_the_fused_kernels_own(self):
        """api.py and pallas_gpu.py: with the top-delta rule the fused kernel selects from its own
        estimates and ``return_keep`` reports its flags (the rule's pages up to those the oracle
        finds within float32 rounding of the threshold); with ``max_pages`` the page list of
        ffd_select is attended as is."""
        from kernels import attention_math
        from kernels.sparse_decode import pallas_gpu

        config = (2, 2, 4, 64, 16, 4, jnp.float32)  # the shapes of test_paper_delta: one compile
        q, cache, lengths, _, _ = make_case(config, "random", 1.0, 9, (64, 61))
        delta = 1.5
        b, kh, n, p, d = cache["resid"].shape
        qg = attention_math.grouped_query(q, kh)
        *_, fused_keep = pallas_gpu.ffd_decode_fused(qg, cache["codes"], cache["scale"],
                                                     cache["resid"], cache["v"], lengths,
                                                     delta=delta, interpret=True)
        out, keep = self.decode(q, cache, lengths, delta=delta)
        np.testing.assert_array_equal(np.asarray(keep), np.asarray(fused_keep))
        self.check(q, cache, lengths, out, keep, delta=delta)
        _, keep_cap = self.decode(q, cache, lengths, delta=delta, max_pages=n)
        np.testing.assert_array_equal(
            np.asarray(keep_cap),
            np.asarray(api.ffd_select(q, cache, lengths, delta=delta, max_pages=n)))


def _shuffled(out, groups):
    """``out [B, H, D]`` with each (row, kv head)'s query heads moved to the next (row, kv head)."""
    b, h, d = out.shape
    x = np.asarray(out).reshape(groups, -1, d)
    return np.roll(x, 1, axis=0).reshape(b, h, d)


@pytest.mark.parametrize("ci", range(len(CONFIGS)))
def test_contract_rejects_wrong_outputs(ci):
    """At the largest magnitudes drawn, the contract's check accepts the oracle's output rounded
    to the output dtype and rejects an all-zero output and one shuffled across (row, kv head)
    pairs; for the needle patterns the float32 part of the tolerance is below 1e-5 of the value
    range. Where the rule skips pages, dense attention over every page is rejected too."""
    config = CONFIGS[ci]
    b, kh, g, d, p, n, dtype = config
    lengths = [p * n - 3 - i for i in range(b)]  # full pages and a tail in every row
    for pattern in PATTERNS:
        for magnitude in (30.0, 1e4):
            q, cache, lens, _, _ = make_case(config, pattern, magnitude, 7, lengths)
            sel = oracles.ffd_select(q, cache, lens, delta=4.0)
            att = oracles.ffd_attention(q, cache, lens, sel.keep)
            check = functools.partial(oracles.assert_close, want=att,
                                      bf16_output=dtype == jnp.bfloat16)
            check(jnp.asarray(att.out, jnp.float32).astype(dtype))
            with pytest.raises(AssertionError):
                check(np.zeros_like(att.out))
            if b * kh > 1:
                with pytest.raises(AssertionError):
                    check(_shuffled(att.out, b * kh))
            vmax = float(np.abs(oracles.f64(cache["v"])).max())
            if pattern.startswith("needle"):
                assert att.out_tol.max() <= 1e-5 * vmax, (pattern, magnitude)
    # dense instead of sparse: a weak needle on the last page of full caches (its logit about
    # 4 * magnitude * |mean query| = 6 nats above the rest) makes delta = 0 skip the other pages,
    # which still carry weight
    weak = 0.75 / math.sqrt(d / g)
    q, cache, lens, _, _ = make_case(config, "needle_last", weak, 8, [n * p] * b)
    sel = oracles.ffd_select(q, cache, lens, delta=0.0)
    nf = np.asarray(lens) // p
    every = np.arange(n)[None, None, :] < nf[:, None, None]
    assert (sel.keep != every).any(), "the rule should skip a page on this workload"
    att = oracles.ffd_attention(q, cache, lens, sel.keep)
    dense = oracles.ffd_attention(q, cache, lens, np.broadcast_to(every, sel.keep.shape))
    with pytest.raises(AssertionError):
        oracles.assert_close(dense.out, att, bf16_output=dtype == jnp.bfloat16)


def test_oracle_unpacking_and_rule_on_hand_made_pages():
    """The oracle's pieces on values worked out by hand: the planar 2-bit layout (channel d in word
    d % W at bit 2 (d // W)), k_hat = (c - 1.5) scale, and the top-delta rule with the first and
    last full pages as reference."""
    words = np.zeros((1, 4), np.uint32)
    words[0, 1] = 3 << 18  # W = 4: channel 37 = 9 * 4 + 1 -> word 1, bits 18..19
    codes = oracles.unpack_planar(words.view(np.int32), 2)
    assert codes.shape == (1, 64) and codes[0, 37] == 3 and codes.sum() == 3
    # one kv head, one query head, D = 16 (one word per key), 3 full pages of 1 slot, no tail;
    # q = e_0, the keys' channel 0 holds the codes 3, 0, 2 with scale 2 -> k_hat 3, -3, 1
    d = 16
    c = np.zeros((1, 1, 3, 1, 1), np.uint32)
    c[0, 0, :, 0, 0] = [3, 0, 2]  # channel 0 sits in bits 0..1 of word 0 ([W, p] = [1, 1])
    cache = {"codes": c.view(np.int32), "scale": np.full((1, 1, 3, d), 2.0, np.float32),
             "resid": np.zeros((1, 1, 3, 1, d), np.float32), "tail": np.zeros((1, 1, 1, d)),
             "v": np.arange(3.0).reshape(1, 1, 3, 1, 1) * np.ones((1, 1, 3, 1, d))}
    q = np.zeros((1, 1, d))
    q[0, 0, 0] = 4.0  # logits q.k_hat / sqrt(16) = 3, -3, 1
    # theta = max(m_0, m_last) - delta = 3 - delta: delta 2.5 keeps pages 0 and 2, delta 1 only 0
    for delta, want in ((2.5, [True, False, True]), (1.0, [True, False, False]),
                        (math.inf, [True, True, True])):
        sel = oracles.ffd_select(q, cache, np.array([3]), delta=delta)
        np.testing.assert_array_equal(sel.keep[0, 0], want)
        assert not sel.ambiguous.any()
    sel = oracles.ffd_select(q, cache, np.array([3]), top_k=2)
    np.testing.assert_array_equal(sel.keep[0, 0], [True, False, True])
    # refined keys without residual are k_hat: weights exp(3), exp(1) on values 0 and 2
    att = oracles.ffd_attention(q, cache, np.array([3]), np.array([[[True, False, True]]]))
    want = 2.0 * math.exp(1) / (math.exp(3) + math.exp(1))
    np.testing.assert_allclose(att.out[0, 0], want, rtol=1e-12)
    np.testing.assert_allclose(att.lse[0, 0], math.log(math.exp(3) + math.exp(1)), rtol=1e-12)


def test_make_cache_equals_update():
    """The helper builds what update_ffd_cache builds, row by row (ragged, with a tail)."""
    b, kh, d, p, n = 2, 2, 32, 16, 3
    k = jax.random.normal(jax.random.key(8), (b, kh, n * p, d))
    v = jax.random.normal(jax.random.key(9), (b, kh, n * p, d))
    lengths = jnp.array([24, 48], jnp.int32)  # a page and a half; a full cache
    got = _make_cache(k, v, lengths, p, jnp.float32, True)
    t = 24  # one update shape (one compile): row 0 in one step, row 1 in two
    for i, length in enumerate(np.asarray(lengths)):
        c = ref.init_ffd_cache(1, n * p, kh, d, jnp.float32, p, scan_copy=True)
        for s in range(0, int(length), t):
            c = _update(c, k[i:i + 1, :, s:s + t], v[i:i + 1, :, s:s + t],
                        jnp.full((1,), s, jnp.int32))
        for name in c:
            np.testing.assert_array_equal(np.asarray(got[name][i:i + 1], np.float32),
                                          np.asarray(c[name], np.float32), err_msg=name)


def test_unknown_xla_scan_is_one_error_before_tracing():
    q = jnp.ones((1, 2, 64), jnp.float32)
    cache = ref.init_ffd_cache(1, 256, 1, 64, jnp.float32, 128, scan_copy=True)
    with pytest.raises(ValueError, match=r"ffd_decode: xla_scan must be one of \('float32', 'int8'\), got 'int4'"):
        api.ffd_decode(q, cache, jnp.array([130], jnp.int32), xla_scan="int4")
