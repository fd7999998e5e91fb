"""The KV-cache backend contract at its edges, for every registered backend.

The contract (:class:`kernels.cache_backend.KVCacheBackend`): a fresh cache can be donated to a
jitted
``update`` (no two leaves share a buffer); the capacity is ``init``'s ``max_len`` whatever the
backend allocates; a row whose new slots leave ``0 .. max_len - 1`` raises ``ValueError`` outside
``jit`` and, inside it, is left bit-identical by ``update`` and NaN in ``attend`` while the other
rows are served as usual.

Sizes: B=2 rows, K=1 kv head, H=2 query heads, D=16, capacity S=20; pages of 4 slots (FFD, Quest),
chunks of 8 (QVG, KIVI: their buffers round the capacity up to 24 slots, so positions 20..23 exist
in memory and must still be refused). Each backend compiles three functions (a 19-token prefill,
a one-token update, a one-token attend), shared by the tests.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kernels import cache_backend
from kernels.kv_quant.reference import KIVIConfig, QVGConfig
from models import kv_cache as kvc

B, K, H, D, S = 2, 1, 2, 16, 20
PREFILL = S - 1

# Small options for each registered backend; a backend registered without an entry here fails
# test_every_registered_backend_has_options (the contract must cover it).
OPTIONS = {
    "dense": {},
    "budgeted": {},
    "quest": dict(page_size=4, top_k=8),  # 8 >= 5 pages: exact attention
    "ffd": dict(page_size=4, delta=math.inf),  # dense over the refined keys
    "qvg": dict(config=QVGConfig(bits=4, stages=1, block=16, num_centroids=2, chunk=8,
                                 kmeans_iters=1)),
    "kivi": dict(config=KIVIConfig(bits=4, group=4, block=16, residual=8)),
}
OPTIONS["ffd_sharded"] = OPTIONS["ffd"]  # no mesh: the FFD backend's own paths
OPTIONS["qvg_sharded"] = OPTIONS["qvg"]
NAMES = kvc.registered_names()

_rng = np.random.default_rng(0)
_U = _rng.standard_normal(D)
_U /= np.linalg.norm(_U)
# Query of every head: 4 u, so a key's logit (q.k / sqrt(D)) is u.k. The prefill keys are N(0, 1)
# (logits ~ N(0, 1)); the key written at the last slot is 20 u (logit 20), whose softmax weight is
# then 1 - O(19 e^-17): the attention output of that row is its value, V_LAST, for any backend.
Q = jnp.asarray(np.broadcast_to(4.0 * _U, (B, H, 1, D)), jnp.float32)
K_PRE = jnp.asarray(_rng.standard_normal((B, K, PREFILL, D)), jnp.float32)
V_PRE = jnp.asarray(_rng.standard_normal((B, K, PREFILL, D)), jnp.float32)
V_LAST = np.linspace(-2.0, 2.0, D).astype(np.float32)
K1 = jnp.asarray(np.broadcast_to(20.0 * _U, (B, K, 1, D)), jnp.float32)
V1 = jnp.asarray(np.broadcast_to(V_LAST, (B, K, 1, D)), jnp.float32)


def _backend(name):
    return kvc.get_backend(name, **OPTIONS[name])


@functools.partial(jax.jit, static_argnums=0, donate_argnums=1)
def _update(backend, cache, k, v, start):
    return backend.update(cache, k, v, start)


@functools.partial(jax.jit, static_argnums=0)
def _attend(backend, cache, q, start):
    return backend.attend(cache, q, start)


def _copy(cache):
    return jax.tree.map(jnp.copy, cache)


def _rows(tree, b):
    """Bytes of row ``b`` of every leaf (every cache leaf leads with the batch axis)."""
    return [np.asarray(x[b]).tobytes() for x in jax.tree.leaves(tree)]


def _starts(*values):
    return jnp.asarray(values, jnp.int32)


@functools.cache
def _filled(name):
    """A cache of capacity S holding 19 random tokens in both rows (slots 0..18)."""
    be = _backend(name)
    return _update(be, be.init(B, S, K, D, jnp.float32), K_PRE, V_PRE, _starts(0, 0))


def test_every_registered_backend_has_options():
    missing = sorted(set(NAMES) - set(OPTIONS))
    assert not missing, f"registered backends without test options: {missing}"
    assert {"dense", "budgeted", "ffd", "quest", "qvg", "kivi", "ffd_sharded",
            "qvg_sharded"} <= set(NAMES)


@pytest.mark.parametrize("name", NAMES)
def test_get_backend_builds_each_registered_name_with_its_options(name):
    be = kvc.get_backend(name, **OPTIONS[name])
    assert type(be) is cache_backend.registered_backends()[name]
    assert isinstance(be, cache_backend.KVCacheBackend)
    for field, value in OPTIONS[name].items():
        assert getattr(be, field) == value
    hash(be)  # a static argument of jit
    # a config's dict selects the same backend
    assert kvc.get_backend(**dict(name=name, **OPTIONS[name])) == be


def test_get_backend_unknown_name_lists_the_registered_names():
    with pytest.raises(ValueError, match="unknown KV-cache backend 'ffdd'") as err:
        kvc.get_backend("ffdd", delta=6.0)
    for name in NAMES:
        assert repr(name)[1:-1] in str(err.value)


def test_get_backend_unknown_option_names_the_backend_fields():
    with pytest.raises(ValueError, match="no option bogus, deltaa") as err:
        kvc.get_backend("ffd", deltaa=6.0, bogus=1)
    assert "page_size" in str(err.value) and "delta" in str(err.value)
    with pytest.raises(ValueError, match="'dense' backend .* no option delta; its fields are: none"):
        kvc.get_backend("dense", delta=6.0)


def test_register_backend_refuses_a_class_that_is_not_a_dataclass():
    class Plain:
        def init(self): ...

        def update(self): ...

        def attend(self): ...

    with pytest.raises(ValueError, match="not a dataclass"):
        cache_backend.register_backend("plain")(Plain)
    assert "plain" not in cache_backend.registered_backends()


@pytest.mark.parametrize("name", NAMES)
def test_fresh_cache_can_be_donated(name):
    be = _backend(name)
    fresh = be.init(B, S, K, D, jnp.float32)
    leaves = jax.tree.leaves(fresh)
    pointers = [x.unsafe_buffer_pointer() for x in leaves]
    assert len(set(pointers)) == len(leaves), "two leaves of a fresh cache share a buffer"
    first = _update(be, fresh, K1, V1, _starts(0, 3))
    assert all(x.is_deleted() for x in leaves)  # donated, not silently copied
    first_leaves = jax.tree.leaves(first)
    _update(be, first, K1, V1, _starts(1, 4))  # and so is an update's output (a decode loop)
    assert all(x.is_deleted() for x in first_leaves)


@pytest.mark.parametrize("name", NAMES)
def test_outside_jit_a_write_past_capacity_raises(name):
    be = _backend(name)
    # the message names the class, or the class it extends (a sharded backend without a mesh
    # runs its base class's paths and checks)
    cls = "(?:" + "|".join(c.__name__ for c in type(be).__mro__[:-1]) + ")"
    cache = _filled(name)
    for method, args in (("update", (K1, V1)), ("attend", (Q,))):
        call = getattr(be, method)
        for bad, got in ((S, f"min {S - 1}, max {S}"), (-1, f"min -1, max {S - 1}")):
            with pytest.raises(ValueError, match=(
                    rf"^{cls}\.{method}: start must be in 0\.\.{S - 1} \(the cache capacity {S} "
                    rf"less the 1 new tokens\), got {got}$")):
                call(cache, *args, _starts(bad, S - 1))
    # a prefill that would straddle the end: T = 2 at position S - 1
    with pytest.raises(ValueError, match=rf"{cls}\.update: .* 0\.\.{S - 2} \(the cache capacity {S}"):
        be.update(cache, K_PRE[:, :, :2], V_PRE[:, :, :2], _starts(0, S - 1))


@pytest.mark.parametrize("name", ["qvg", "kivi"])
def test_rounded_up_buffers_do_not_widen_the_capacity(name):
    cache = _filled(name)
    slots = jax.tree.leaves(cache["k"])[0].shape[2] * 8
    assert slots == 24 > S  # the buffer holds 24 slots ...
    with pytest.raises(ValueError, match=f"capacity {S} less"):  # ... the cache only 20
        _backend(name).update(cache, K1, V1, _starts(S, 0))


@pytest.mark.parametrize("bad", [S, S + 3, -1, 2**31 - 1])
@pytest.mark.parametrize("name", NAMES)
def test_inside_jit_a_write_past_capacity_changes_nothing_and_poisons_its_row(name, bad):
    be = _backend(name)
    before = _filled(name)
    # row 0 writes out of capacity, row 1 at the last slot S - 1
    after = _update(be, _copy(before), K1, V1, _starts(bad, S - 1))
    assert _rows(after, 0) == _rows(before, 0), "an out-of-capacity write changed its row"
    assert _rows(after, 1) != _rows(before, 1), "the write at the last slot was dropped"

    out = np.asarray(_attend(be, after, Q, _starts(bad, S - 1)))
    assert np.isnan(out[0]).all()
    # the last slot holds the dominant key: row 1 attends (almost) only to its value
    np.testing.assert_allclose(out[1, :, 0], np.broadcast_to(V_LAST, (H, D)), atol=1e-2)
    # row 1 is served exactly as when both rows are in capacity
    both = _update(be, _copy(before), K1, V1, _starts(S - 1, S - 1))
    ref = np.asarray(_attend(be, both, Q, _starts(S - 1, S - 1)))
    np.testing.assert_array_equal(out[1], ref[1])
    # row 0 still attends to its 19 prefilled tokens as before the bad write (no clamped write)
    np.testing.assert_array_equal(np.asarray(_attend(be, after, Q, _starts(PREFILL - 1, 0)))[0],
                                  np.asarray(_attend(be, before, Q, _starts(PREFILL - 1, 0)))[0])


@pytest.mark.parametrize("name", NAMES)
def test_inside_jit_a_prefill_straddling_the_end_changes_nothing(name):
    be = _backend(name)
    fresh = be.init(B, S, K, D, jnp.float32)
    want = _rows(fresh, 0)
    got = _update(be, fresh, K_PRE, V_PRE, _starts(2, 0))  # row 0: slots 2..20, one too many
    assert _rows(got, 0) == want
    assert _rows(got, 1) == _rows(_filled(name), 1)


@pytest.mark.parametrize("name", NAMES)
def test_a_nan_key_makes_its_row_nan_as_dense_attention_does(name):
    """A NaN key at position 3 of row 0 (a quantized chunk for QVG and KIVI, a full page for FFD
    and Quest): row 0's attention is NaN, as dense attention's is (a backend that took the NaN
    partial for an empty one returned the attention over its window alone, finite); row 1 is
    served as from the clean cache."""
    be = _backend(name)
    nan_k = K_PRE.at[0, 0, 3, 5].set(jnp.nan)
    dirty = _update(be, be.init(B, S, K, D, jnp.float32), nan_k, V_PRE, _starts(0, 0))
    dense = kvc.get_backend("dense")
    want = np.asarray(_attend(dense, _update(dense, dense.init(B, S, K, D, jnp.float32), nan_k,
                                             V_PRE, _starts(0, 0)), Q, _starts(PREFILL, PREFILL)))
    assert np.isnan(want[0]).all() and np.isfinite(want[1]).all()
    out = np.asarray(_attend(be, dirty, Q, _starts(PREFILL, PREFILL)))
    assert np.isnan(out[0]).all(), f"{name}: a NaN key gave a finite row"
    clean = np.asarray(_attend(be, _filled(name), Q, _starts(PREFILL, PREFILL)))
    np.testing.assert_array_equal(out[1], clean[1])
