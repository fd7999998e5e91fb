"""QVG / KIVI decode with the chunk quantization in ``flush``, against references built from the
definitions.

A decode loop appends one token per step (``update``, no quantization) and calls ``flush``, which
quantizes a window's first N tokens once it holds N. The references here: the quantized chunks
are the quantizer (:func:`kernels.kv_quant.reference.qvg_quantize_chunk`,
:func:`~kernels.kv_quant.reference.kivi_quantize_chunk`) applied to each completed chunk, with
QVG's k-means keys ``fold_in(fold_in(seed, chunk), kv head)`` (values: one more ``fold_in(., 1)``)
and keys un-rotated from their positions (QVG stores them before RoPE); the window is exact; the
attention at position p is the softmax over positions 0..p of the dequantized keys / values of the
flushed chunks and the exact ones after them (QVG: the log-sum-exp merge of
:func:`~kernels.kv_quant.reference.qvg_chunk_attention_reference` and the window's attention;
KIVI: one dense softmax, with exact values for the last N positions, per-token codes before).

Sizes: B = 2 rows, K = 2 kv heads, 2 query heads per kv head, D = 32, chunks of N = 8, capacity
40 (5 chunks); every jitted function is compiled once per backend.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kernels import attention_math
from kernels.kv_quant import reference as ref
from kernels.kv_quant.cache import KIVICache, QVGCache
from kernels.rope import rope_slots

B, K, G, D, N, CAP = 2, 2, 2, 32, 8, 40
PRE = 3  # prefill tokens before the decode loop
QVG_CFG = ref.QVGConfig(bits=4, stages=1, block=16, num_centroids=2, chunk=N, kmeans_iters=2)
KIVI_CFG = ref.KIVIConfig(bits=4, group=4, block=16, residual=N)
BACKENDS = {
    "qvg": QVGCache(config=QVG_CFG, rope_base=10_000.0, seed=3),
    "kivi_xla": KIVICache(config=KIVI_CFG, implementation="xla"),
    "kivi_reference": KIVICache(config=KIVI_CFG, implementation="reference"),
}


def _data(seed=0, length=CAP):
    rng = np.random.default_rng(seed)
    k = jnp.asarray(rng.standard_normal((B, K, length, D)), jnp.float32)
    v = jnp.asarray(rng.standard_normal((B, K, length, D)), jnp.float32)
    q = jnp.asarray(2.0 * rng.standard_normal((length, B, K * G, 1, D)), jnp.float32)
    return k, v, q


@functools.cache
def _fns(name):
    """(update, attend, flush), jitted once per backend."""
    be = BACKENDS[name]
    return jax.jit(be.update), jax.jit(be.attend), jax.jit(be.flush)


def _starts(p):
    return jnp.full((B,), p, jnp.int32)


def _tree_equal(a, b):
    jax.tree.map(lambda x, y: np.testing.assert_array_equal(np.asarray(x), np.asarray(y)), a, b)


# -- references from the definitions -----------------------------------------------------------

NC = CAP // N  # chunks of the data (every test's positions lie below CAP)


@functools.cache
def _qvg_quantizer(cfg):
    return jax.jit(jax.vmap(lambda x, key: ref.qvg_quantize_chunk(x, cfg, key)))


def qvg_chunks(be: QVGCache, k, v):
    """QVG codes of every chunk of k, v [B, K, CAP, D] (keys un-rotated from their positions
    first): fields [B, K, NC, ...]."""
    base = jax.random.key(be.seed)
    xk = rope_slots(k, be.rope_base, 0, sign=-1).reshape(B, K, NC, N, D)  # pre-RoPE keys
    xv = v.reshape(B, K, NC, N, D)
    keys = [[[jax.random.fold_in(jax.random.fold_in(base, c), h) for c in range(NC)]
             for h in range(K)] for _ in range(B)]
    keys_k = jnp.stack([jnp.stack([jnp.stack(row) for row in per_b]) for per_b in keys])
    keys_v = jax.vmap(jax.vmap(jax.vmap(lambda key: jax.random.fold_in(key, 1))))(keys_k)
    quant = _qvg_quantizer(be.config)

    def run(x, key):
        out = quant(x.reshape(B * K * NC, N, D), key.reshape(B * K * NC))
        return jax.tree.map(lambda a: a.reshape(B, K, NC, *a.shape[1:]), out)

    return run(xk, keys_k), run(xv, keys_v)


@jax.jit
def kivi_key_chunks(k):
    """KIVI key codes (per channel) of every chunk of k [B, K, CAP, D]: fields [B, K, NC, ...]."""
    return jax.vmap(jax.vmap(jax.vmap(lambda x: ref.kivi_quantize_chunk(x, KIVI_CFG, True))))(
        k.reshape(B, K, NC, N, D))


@jax.jit
def _kivi_dense(k, v):
    """Every key of k dequantized from its chunk's codes, every value from its per-token codes:
    float32 [B, K, CAP, D] each."""
    deq_k = jax.vmap(jax.vmap(jax.vmap(lambda c: ref.kivi_dequantize_chunk(c, KIVI_CFG, True))))(
        kivi_key_chunks(k)).reshape(B, K, CAP, D)
    deq_v = jax.vmap(jax.vmap(lambda x: ref.kivi_dequantize_chunk(
        ref.kivi_quantize_chunk(x, KIVI_CFG, False), KIVI_CFG, False)))(v)
    return deq_k, deq_v


@functools.partial(jax.jit, static_argnums=0)
def _expected(name, k, v, q, p, nq, codes):
    s = jnp.arange(CAP)
    qr = q.reshape(B, K, G, D)
    if name == "qvg":
        be = BACKENDS[name]
        ck, cv = codes
        o1, l1 = ref.qvg_chunk_attention_reference(qr, ck, cv, be.config.bits, (s < nq) & (s <= p),
                                                   be.rope_base)
        o2, l2 = attention_math.partial_attention(qr, k, v, (s >= nq) & (s <= p))
        out = attention_math.merge_lse(o1, l1, o2, l2)
    else:
        deq_k, deq_v = codes
        keys = jnp.where((s < nq)[:, None], deq_k, k)
        vals = jnp.where((s < p + 1 - N)[:, None], deq_v, v)  # the last N values exact
        out, _ = attention_math.partial_attention(qr, keys, vals, s <= p)
    return out.reshape(B, K * G, 1, D)


def expected_attention(name, k, v):
    """``f(q, p, nq)`` -> float32 [B, H, 1, D]: the new token at position p attends positions
    0..p; those below ``nq`` from their chunks' codes (KIVI: values below p + 1 - N from their
    per-token codes), the others exact (module docstring)."""
    codes = qvg_chunks(BACKENDS[name], k, v) if name == "qvg" else _kivi_dense(k, v)
    return lambda q, p, nq: _expected(name, k, v, q, p, nq, codes)


def expected_chunks(name, k, v):
    """The key chunks' codes (QVG: keys and values) from the definitions, fields [B, K, NC, ...]."""
    if name == "qvg":
        return qvg_chunks(BACKENDS[name], k, v)
    return kivi_key_chunks(k), None


# -- tests ------------------------------------------------------------------------------------


def _decode(name, k, v, q, stop, flush_every, check=None):
    """Prefill PRE tokens, then decode positions PRE .. stop - 1 one at a time, flushing after
    every ``flush_every``-th step; ``check(p, out, nq)`` after each step's attention (``nq``: the
    positions flushed so far, as the definitions give them). Returns the cache."""
    update, attend, flush = _fns(name)
    cache = update(BACKENDS[name].init(B, CAP, K, D, jnp.float32), k[:, :, :PRE], v[:, :, :PRE],
                   _starts(0))
    nq = 0
    for i, p in enumerate(range(PRE, stop)):
        cache = update(cache, k[:, :, p:p + 1], v[:, :, p:p + 1], _starts(p))
        if check is not None:
            check(p, attend(cache, q[p], _starts(p)), nq)
        if (i + 1) % flush_every == 0:
            cache = flush(cache)
            if p + 1 - nq >= N:  # the window held a full chunk
                nq += N
    return cache


@pytest.mark.parametrize("flush_every", [1, N])
@pytest.mark.parametrize("name", sorted(BACKENDS))
def test_decode_with_flush_matches_the_definitions(name, flush_every):
    """Every step's attention (the step that fills a chunk attends it exact; with a flush every N
    steps the window holds up to 2N - 1 tokens) and, at the end, the quantized chunks (bit-equal
    codes) and the exact window."""
    k, v, q = _data(1)
    stop = 4 * N + 2  # four chunks complete
    want = expected_attention(name, k, v)

    def check(p, out, nq):
        np.testing.assert_allclose(np.asarray(out), np.asarray(want(q[p], p, nq)), rtol=2e-5,
                                   atol=2e-5, err_msg=f"position {p}")

    cache = _decode(name, k, v, q, stop, flush_every, check)
    cache = _fns(name)[2](cache)  # both schedules flushed: four chunks quantized
    np.testing.assert_array_equal(np.asarray(cache["num_quantized"]), [4 * N] * B)
    np.testing.assert_array_equal(np.asarray(cache["window_len"]), [2] * B)
    np.testing.assert_array_equal(np.asarray(cache["wk"][:, :, :2]), np.asarray(k[:, :, 4 * N:stop]))
    first4 = functools.partial(jax.tree.map, lambda a: a[:, :, :4])
    ck, cv = expected_chunks(name, k, v)
    _tree_equal(first4(cache["k"]), first4(ck))
    if name == "qvg":
        _tree_equal(first4(cache["v"]), first4(cv))
        np.testing.assert_array_equal(np.asarray(cache["wv"][:, :, :2]),
                                      np.asarray(v[:, :, 4 * N:stop]))


@pytest.mark.parametrize("name", ["qvg", "kivi_xla"])
def test_flushing_every_n_steps_equals_flushing_every_step(name):
    """Bit-equal caches (every leaf, windows included) once both schedules have flushed."""
    k, v, q = _data(2)
    stop = PRE + 3 * N
    every_step = _decode(name, k, v, q, stop, 1)
    every_n = _decode(name, k, v, q, stop, N)  # flushed after its last step
    assert int(every_n["num_quantized"][0]) == 3 * N
    _tree_equal(every_n, every_step)


@pytest.mark.parametrize("name", ["qvg", "kivi_xla"])
def test_flush_is_the_identity_without_a_full_window(name):
    k, v, _ = _data(3)
    update, _, flush = _fns(name)
    fresh = BACKENDS[name].init(B, CAP, K, D, jnp.float32)
    _tree_equal(flush(fresh), fresh)
    cache = update(fresh, k[:, :, :N + 5], v[:, :, :N + 5], _starts(0))  # window: 5 tokens
    for p in range(N + 5, 2 * N - 1):
        cache = update(cache, k[:, :, p:p + 1], v[:, :, p:p + 1], _starts(p))
    assert int(cache["window_len"][0]) == N - 1
    _tree_equal(flush(cache), cache)


@pytest.mark.parametrize("name", ["qvg", "kivi_xla"])
def test_update_past_the_window_without_flush(name):
    """Outside jit: ValueError that says to flush. Inside jit: that row is left bit-identical and
    attends NaN; the other row is served as when both rows are in their windows."""
    k, v, q = _data(4)
    update, attend, _ = _fns(name)
    be = BACKENDS[name]
    cache = update(be.init(B, CAP, K, D, jnp.float32), k[:, :, :PRE], v[:, :, :PRE], _starts(0))
    for p in range(PRE, 2 * N):  # the window's 2N slots filled, never flushed
        cache = update(cache, k[:, :, p:p + 1], v[:, :, p:p + 1], _starts(p))
    one_k, one_v = k[:, :, 2 * N:2 * N + 1], v[:, :, 2 * N:2 * N + 1]
    with pytest.raises(ValueError, match=rf"{type(be).__name__}\.update: row 0 needs position "
                       rf"{2 * N}, .* window holds positions 0\.\.{2 * N - 1} .* call "
                       rf"flush\(layer_cache\) at least once every N = {N} one-token updates"):
        be.update(cache, one_k, one_v, _starts(2 * N))
    with pytest.raises(ValueError, match=r"attend: row 0 needs position 16, .* call flush"):
        be.attend(cache, q[2 * N], _starts(2 * N))
    flushed = _fns(name)[2](cache)
    with pytest.raises(ValueError, match=r"row 1 writes position 3, below its 8 quantized "
                       r"positions"):
        be.update(flushed, one_k, one_v, jnp.asarray([2 * N, PRE], jnp.int32))

    starts = jnp.asarray([2 * N, 2 * N - 1], jnp.int32)  # row 0 past its window; row 1 rewrites
    after = update(cache, one_k, one_v, starts)
    for leaf_a, leaf_b in zip(jax.tree.leaves(after), jax.tree.leaves(cache), strict=True):
        np.testing.assert_array_equal(np.asarray(leaf_a[0]), np.asarray(leaf_b[0]))
    assert not np.array_equal(np.asarray(after["wk"][1]), np.asarray(cache["wk"][1]))
    out = np.asarray(attend(after, q[2 * N], starts))
    assert np.isnan(out[0]).all()
    both = update(cache, one_k, one_v, _starts(2 * N - 1))
    want = np.asarray(attend(both, q[2 * N], _starts(2 * N - 1)))
    assert np.isfinite(want).all()
    np.testing.assert_array_equal(out[1], want[1])


@pytest.mark.parametrize("name", ["qvg", "kivi_xla"])
def test_prefill_quantizes_every_completed_chunk(name):
    """A prefill of 2N + 3 tokens quantizes chunks 0 and 1 at once (the codes a prefill always
    wrote) and keeps 3 exact tokens; the decode after it quantizes chunk 2 in its flush. A
    multi-token write after unflushed one-token updates also quantizes the full chunk they
    left."""
    k, v, _ = _data(5)
    update, _, flush = _fns(name)
    be = BACKENDS[name]

    ck = expected_chunks(name, k, v)[0]

    def codes(num_chunks):
        return jax.tree.map(lambda a: a[:, :, :num_chunks], ck)

    cache = update(be.init(B, CAP, K, D, jnp.float32), k[:, :, :2 * N + 3], v[:, :, :2 * N + 3],
                   _starts(0))
    np.testing.assert_array_equal(np.asarray(cache["num_quantized"]), [2 * N] * B)
    np.testing.assert_array_equal(np.asarray(cache["window_len"]), [3] * B)
    np.testing.assert_array_equal(np.asarray(cache["wk"][:, :, :3]),
                                  np.asarray(k[:, :, 2 * N:2 * N + 3]))
    _tree_equal(jax.tree.map(lambda a: a[:, :, :2], cache["k"]), codes(2))
    for p in range(2 * N + 3, 3 * N + 1):
        cache = flush(update(cache, k[:, :, p:p + 1], v[:, :, p:p + 1], _starts(p)))
    _tree_equal(jax.tree.map(lambda a: a[:, :, :3], cache["k"]), codes(3))

    # one-token updates fill the window past N (no flush), then a PRE-token write
    cache = update(be.init(B, CAP, K, D, jnp.float32), k[:, :, :PRE], v[:, :, :PRE], _starts(0))
    for p in range(PRE, N + 2):
        cache = update(cache, k[:, :, p:p + 1], v[:, :, p:p + 1], _starts(p))
    p = N + 2
    cache = update(cache, k[:, :, p:p + PRE], v[:, :, p:p + PRE], _starts(p))
    np.testing.assert_array_equal(np.asarray(cache["num_quantized"]), [N] * B)
    np.testing.assert_array_equal(np.asarray(cache["window_len"]), [2 + PRE] * B)
    np.testing.assert_array_equal(np.asarray(cache["wk"][:, :, :2 + PRE]),
                                  np.asarray(k[:, :, N:N + 2 + PRE]))
    _tree_equal(jax.tree.map(lambda a: a[:, :, :1], cache["k"]), codes(1))


def test_flush_refuses_a_cache_that_is_not_its_own():
    qvg = BACKENDS["qvg"]
    with pytest.raises(ValueError, match=r"QVGCache\.flush: layer_cache must be a QVGCache layer "
                       r"cache"):
        qvg.flush({"k": jnp.zeros((B, K, 4, D)), "v": jnp.zeros((B, K, 4, D))})
    other = QVGCache(config=ref.QVGConfig(bits=4, stages=1, block=16, num_centroids=2,
                                          chunk=2 * N))
    with pytest.raises(ValueError, match=r"QVGCache\.flush: .* window of 2N = 32 slots"):
        other.flush(qvg.init(B, CAP, K, D, jnp.float32))
