"""FFD decode partitioned over 8 fake CPU devices (``shard_map``) equals the unpartitioned decode:
the XLA path and the Pallas TPU / GPU kernels in interpret mode (run in its own process)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec

from core import sharding
from kernels.sparse_decode import api, sharded
from kernels.sparse_decode import reference as ref
from kernels.sparse_decode.cache import FFDCache

pytestmark = pytest.mark.multidevice

B, K, G, D, P, PAGES = 4, 4, 2, 64, 16, 6  # rows, kv heads, group, head dim, page size, pages


def _mesh(model):
    if jax.device_count() < 8:
        pytest.fail("needs XLA_FLAGS=--xla_force_host_platform_device_count=8 (see Makefile)")
    return sharding.make_mesh(model, devices=jax.devices()[:8])


def _filled_cache(seed, lengths):
    """An FFD cache holding ``lengths[b]`` random tokens per row (written by the backend's own
    update, one prefill per row length) and fresh random queries [B, H, D]."""
    rng = np.random.default_rng(seed)
    s = PAGES * P
    cache = jax.jit(ref.init_ffd_cache, static_argnums=range(6))(B, s, K, D, jnp.float32, P)
    k = jnp.asarray(rng.standard_normal((B, K, s, D)) * 2.0, jnp.float32)
    v = jnp.asarray(rng.standard_normal((B, K, s, D)), jnp.float32)
    # a needle page per row so that the top-delta rule keeps some pages and skips others
    k = k.at[:, :, 2 * P + 3].multiply(6.0)
    cache = jax.jit(ref.update_ffd_cache)(cache, k, v, jnp.zeros((B,), jnp.int32))
    q = jnp.asarray(rng.standard_normal((B, K * G, D)), jnp.float32)
    return q, cache, jnp.asarray(lengths, jnp.int32)


@pytest.mark.parametrize("impl", ["xla", "pallas_tpu", "pallas_gpu"])
def test_sharded_decode_equals_unsharded(impl):
    mesh = _mesh(4)  # data 2 x model 4: two rows and one kv head per device
    q, cache, lengths = _filled_cache(0, [PAGES * P, 5 * P + 3, 2 * P + 1, 3 * P])
    kw = dict(delta=2.0, implementation=impl, interpret=impl != "xla", return_keep=True)
    want, want_keep = jax.jit(lambda q, c, n: api.ffd_decode(q, c, n, **kw))(q, cache, lengths)
    got, keep = jax.jit(lambda q, c, n: sharded.ffd_decode_sharded(q, c, n, mesh, **kw))(
        q, cache, lengths)
    np.testing.assert_array_equal(np.asarray(keep), np.asarray(want_keep))
    assert 0 < np.asarray(keep).mean() < 1  # some pages skipped, some kept
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-6, atol=1e-6)
    # the output stays partitioned as the operands: rows over `data`, heads over `model`
    assert tuple(got.sharding.spec)[:2] == ("data", "model")


def test_axes_that_do_not_divide_are_replicated_and_unknown_axes_refused():
    mesh = _mesh(8)  # data 1, model 8: 8 does not divide K = 4
    assert sharded.partition_specs(mesh, B, K) == ("data", None)
    mesh = sharding.make_mesh(1, devices=jax.devices()[:8])  # data 8 does not divide B = 4
    assert sharded.partition_specs(mesh, B, K) == (None, "model")
    q, cache, lengths = _filled_cache(0, [P, 2 * P, 3 * P, 4 * P])
    got = jax.jit(lambda q, c, n: sharded.ffd_decode_sharded(q, c, n, mesh, delta=2.0))(
        q, cache, lengths)
    want = jax.jit(lambda q, c, n: api.ffd_decode(q, c, n, delta=2.0))(q, cache, lengths)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-6)
    with pytest.raises(ValueError, match="mesh axis 'heads' is not one of"):
        sharded.ffd_decode_sharded(q, cache, lengths, mesh, head_axis="heads")
    with pytest.raises(ValueError, match="does not match a cache"):
        sharded.ffd_decode_sharded(q[:2], cache, lengths, mesh)


def _decode(graphdef, params, cache, tokens, backend):
    """Prefill of ``tokens`` [B, 40], then one decode step of their first token at slot 40."""
    from flax import nnx

    m = nnx.merge(graphdef, params)
    _, cache = m.decode(tokens, cache, jnp.zeros((B,), jnp.int32), backend)
    return m.decode(tokens[:, :1], cache, jnp.full((B,), 40, jnp.int32), backend)


def test_sharded_backend_decodes_like_the_plain_backend_in_a_transformer():
    from flax import nnx

    from models.transformer import Transformer, TransformerConfig

    mesh = _mesh(2)
    cfg = TransformerConfig(vocab_size=32, max_len=64, d_model=128, num_layers=1, num_heads=8,
                            num_kv_heads=4)
    model = Transformer(cfg, rngs=nnx.Rngs(0))
    plain = FFDCache(page_size=16, delta=2.0, implementation="xla")
    part = sharded.ShardedFFDCache(page_size=16, delta=2.0, implementation="pallas_tpu",
                                   mesh=mesh, interpret=True)
    tokens = jnp.asarray(np.random.default_rng(1).integers(0, 32, (B, 40)), jnp.int32)
    graphdef, params = nnx.split(model)
    outs = []
    for backend in (plain, part):
        cache = model.init_cache(B, 64, backend)
        if backend is part:
            cache = [jax.device_put(c, backend.cache_sharding(c)) for c in cache]
        logits, cache = jax.jit(lambda p, c, b=backend: _decode(graphdef, p, c, tokens, b))(
            params, cache)
        outs.append(np.asarray(logits))
    np.testing.assert_allclose(outs[1], outs[0], rtol=1e-4, atol=1e-4)
    with pytest.raises(ValueError, match="has no mesh"):
        sharded.ShardedFFDCache().cache_sharding(model.init_cache(B, 64, plain)[0])
    assert isinstance(part.cache_sharding(cache[0])["v"], NamedSharding)
    assert part.cache_sharding(cache[0])["v"].spec == PartitionSpec("data", "model")


def test_sharded_backend_poisons_a_row_past_capacity_inside_jit():
    """The capacity rule holds on the mesh path too: inside jit, a row whose position is past the
    cache's capacity attends to nothing (its output is NaN) and the other rows equal the plain
    backend's output."""
    mesh = _mesh(2)
    q, cache, _ = _filled_cache(3, [PAGES * P] * B)
    plain = FFDCache(page_size=P, delta=2.0, implementation="xla")
    part = sharded.ShardedFFDCache(page_size=P, delta=2.0, implementation="xla", mesh=mesh)
    start = jnp.asarray([PAGES * P, PAGES * P - 1, 5, 2**31 - 1], jnp.int32)  # rows 0, 3 past
    good = jnp.where(start >= PAGES * P, 0, start)
    cache = jax.device_put(cache, part.cache_sharding(cache))
    out = np.asarray(jax.jit(part.attend)(cache, q[:, :, None], start))
    want = np.asarray(jax.jit(plain.attend)(cache, q[:, :, None], good))
    assert np.isnan(out[[0, 3]]).all()
    np.testing.assert_allclose(out[[1, 2]], want[[1, 2]], rtol=1e-5, atol=1e-5)
