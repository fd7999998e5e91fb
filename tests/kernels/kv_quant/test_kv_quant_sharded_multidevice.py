"""QVG's quantized-chunk attention partitioned over 8 fake CPU devices (``shard_map``) equals the
unpartitioned call: the jnp reference and the Pallas TPU / GPU kernels in interpret mode (run in
its own process)."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec

from core import sharding
from kernels.kv_quant import api, sharded
from kernels.kv_quant import reference as ref
from kernels.kv_quant.cache import QVGCache

pytestmark = pytest.mark.multidevice

B, K, G, D, N, NC = 4, 4, 2, 32, 128, 3  # rows, kv heads, group, head dim, chunk (TPU: 128 lanes), chunks


def _mesh():
    if jax.device_count() < 8:
        pytest.fail("needs XLA_FLAGS=--xla_force_host_platform_device_count=8 (see Makefile)")
    return sharding.make_mesh(4, devices=jax.devices()[:8])  # data 2 x model 4


@functools.cache
def _filled(seed):
    """A QVG layer cache filled by the backend's own update with random keys/values (ragged rows:
    two, one and no chunks quantized, plus a partial window) and random query rows."""
    cfg = ref.qvg_preset("qvg", bits=2, block=16, num_centroids=4, chunk=N, kmeans_iters=2)
    backend = QVGCache(config=cfg, rope_base=10_000.0, implementation="reference")
    rng = np.random.default_rng(seed)
    cache = backend.init(B, N * NC, K, D, jnp.float32)
    k = jnp.asarray(rng.standard_normal((B, K, 2 * N + 5, D)), jnp.float32)
    v = jnp.asarray(rng.standard_normal((B, K, 2 * N + 5, D)), jnp.float32)
    cache = jax.jit(backend.update)(cache, k, v, jnp.zeros((B,), jnp.int32))
    q = jnp.asarray(2.0 * rng.standard_normal((B, K, G, D)), jnp.float32)
    start = jnp.asarray([2 * N + 5, 2 * N, N + 3, 7], jnp.int32)
    return cfg, cache, q, start


@pytest.mark.parametrize("impl", ["reference", "pallas_tpu", "pallas_gpu"])
def test_sharded_chunk_attention_equals_unsharded(impl):
    mesh = _mesh()
    cfg, cache, q, start = _filled(0)
    nq = (start // N) * N

    def plain(q, kc, vc, s, n):
        return api.qvg_chunk_attention(q, kc, vc, cfg, s, n, 1, 10_000.0, impl, impl != "reference")

    def part(q, kc, vc, s, n):
        return sharded.qvg_chunk_attention_sharded(q, kc, vc, cfg, s, n, 1, 10_000.0, mesh,
                                                   implementation=impl,
                                                   interpret=impl != "reference")

    args = (q, cache["k"], cache["v"], start, nq)
    (want, want_lse), (got, lse) = jax.jit(plain)(*args), jax.jit(part)(*args)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(np.asarray(lse), np.asarray(want_lse), rtol=1e-6)
    assert np.isneginf(np.asarray(lse)[3]).all()  # the row with nothing quantized sees no slot
    assert tuple(got.sharding.spec)[:2] == ("data", "model")


def test_sharded_backend_attends_like_the_plain_backend():
    mesh = _mesh()
    cfg, cache, q, start = _filled(0)
    plain = QVGCache(config=cfg, rope_base=10_000.0, implementation="reference")
    part = sharded.ShardedQVGCache(config=cfg, rope_base=10_000.0, implementation="pallas_tpu",
                                   mesh=mesh, interpret=True)
    placed = jax.device_put(cache, part.cache_sharding(cache))
    assert placed["wk"].sharding.spec == PartitionSpec("data", "model")
    qh = q.reshape(B, K * G, 1, D)
    want = jax.jit(plain.attend)(cache, qh, start)
    got = jax.jit(part.attend)(placed, qh, start)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-4, atol=1e-4)
    with pytest.raises(ValueError, match="has no mesh"):
        sharded.ShardedQVGCache(config=cfg).cache_sharding(cache)
    with pytest.raises(ValueError, match="mesh axis 'rows' is not one of"):
        sharded.qvg_chunk_attention_sharded(q, cache["k"], cache["v"], cfg, start, start, 1, None,
                                            mesh, batch_axis="rows")


def _plain_and_sharded():
    """A QVGCache (reference path, small k-means) and its ShardedQVGCache on the test mesh."""
    cfg = ref.qvg_preset("qvg", bits=2, block=16, num_centroids=4, chunk=N, kmeans_iters=2)
    plain = QVGCache(config=cfg, rope_base=10_000.0, implementation="reference")
    return plain, sharded.ShardedQVGCache(config=cfg, rope_base=10_000.0,
                                          implementation="reference", mesh=_mesh())


def test_sharded_update_equals_the_plain_update():
    """The update in shard_map (rows on data, kv heads on model) writes what the plain update
    writes, k-means codes included (each block seeds with its kv heads' global indices), over a
    prefill that fills two chunks and one more token that completes nothing, on ragged rows."""
    plain, part = _plain_and_sharded()
    rng = np.random.default_rng(1)
    cache = plain.init(B, N * NC, K, D, jnp.float32)
    k = jnp.asarray(rng.standard_normal((B, K, 2 * N + 5, D)), jnp.float32)
    v = jnp.asarray(rng.standard_normal((B, K, 2 * N + 5, D)), jnp.float32)
    start = jnp.asarray([0, 3, N, 2], jnp.int32)
    fits = start + k.shape[2] <= N * NC  # row 2 overflows: left unchanged by both
    want = jax.jit(plain.update)(cache, k, v, start)
    placed = jax.device_put(cache, part.cache_sharding(cache))
    got = jax.jit(part.update)(placed, k, v, start)
    assert not fits.all()
    jax.tree.map(lambda a, b: np.testing.assert_array_equal(np.asarray(a), np.asarray(b)),
                 got, want)
    assert got["wk"].sharding.spec[:2] == ("data", "model")
    one_k, one_v = k[:, :, :1], v[:, :, :1]
    nxt = jnp.where(fits, start + k.shape[2], 0).astype(jnp.int32)
    jax.tree.map(lambda a, b: np.testing.assert_array_equal(np.asarray(a), np.asarray(b)),
                 jax.jit(part.update)(got, one_k, one_v, nxt),
                 jax.jit(plain.update)(want, one_k, one_v, nxt))


def test_sharded_flush_equals_the_plain_flush():
    """The flush in shard_map quantizes what the plain flush quantizes (k-means codes included:
    each block seeds with its kv heads' global indices), on ragged rows: windows of N, N + 5 and
    2N - 1 tokens (quantized) and of 3 tokens (unchanged), above 0, 1 or 2 quantized chunks."""
    plain, part = _plain_and_sharded()
    rng = np.random.default_rng(2)
    _, cache, _, _ = _filled(0)  # two chunks quantized in every row
    window = (B, K, 2 * N, D)
    cache = dict(cache, wk=jnp.asarray(rng.standard_normal(window), jnp.float32),
                 wv=jnp.asarray(rng.standard_normal(window), jnp.float32),
                 num_quantized=jnp.asarray([0, N, 2 * N, N], jnp.int32),
                 window_len=jnp.asarray([N, N + 5, 3, 2 * N - 1], jnp.int32))
    want = jax.jit(plain.flush)(cache)
    got = jax.jit(part.flush)(jax.device_put(cache, part.cache_sharding(cache)))
    jax.tree.map(lambda a, b: np.testing.assert_array_equal(np.asarray(a), np.asarray(b)),
                 got, want)
    assert got["wk"].sharding.spec[:2] == ("data", "model")
    np.testing.assert_array_equal(np.asarray(want["num_quantized"]), [N, 2 * N, 2 * N, 2 * N])
    np.testing.assert_array_equal(np.asarray(want["window_len"]), [0, 5, 3, N - 1])
    # row 2 (3 tokens) is unchanged; in row 0 the chunk written is the window's first N slots
    for name in ("k", "v", "wk", "wv"):
        jax.tree.map(lambda a, b: np.testing.assert_array_equal(np.asarray(a[2]), np.asarray(b[2])),
                     want[name], cache[name])
    assert not np.array_equal(np.asarray(want["k"].codes[0, :, 0]),
                              np.asarray(cache["k"].codes[0, :, 0]))
