"""Bad input at the public kernel and cache entry points gives one clear ValueError.

Each case is (callable, args, kwargs, message fragment): the call must raise ``ValueError`` whose
message contains the fragment (the argument's name and what was expected), before XLA sees the
input: no raw broadcasting error, no deep traceback, no silently meaningless result.

Sizes: B=2 rows, K=2 kv heads, H=4 query heads, D=16, page p=4, capacity S=16 (P=4 pages).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kernels.kv_quant import api as kvq
from kernels.kv_quant import cache as kvq_cache
from kernels.kv_quant import reference as kvq_ref
from kernels.sparse_decode import api as sd
from kernels.sparse_decode import cache as sd_cache
from kernels.sparse_decode import reference as sd_ref

B, K, H, D, P_SIZE, S = 2, 2, 4, 16, 4, 16
_rng = np.random.default_rng(0)


def _f32(*shape):
    return jnp.asarray(_rng.standard_normal(shape), jnp.float32)


Q = _f32(B, H, D)
KD = _f32(B, K, S, D)
VD = _f32(B, K, S, D)
LEN = jnp.array([5, 16], jnp.int32)
KNEW = _f32(B, K, 3, D)
VNEW = _f32(B, K, 3, D)
START = jnp.array([0, 2], jnp.int32)

FFD = sd_cache.FFDCache(page_size=P_SIZE)
FFD_CACHE = sd_ref.init_ffd_cache(B, S, K, D, jnp.float32, P_SIZE)
QUEST = sd_cache.QuestCache(page_size=P_SIZE, top_k=2)
QUEST_CACHE = QUEST.init(B, S, K, D, jnp.float32)
QVG = kvq_cache.QVGCache(config=kvq_ref.QVGConfig(bits=4, stages=1, block=16, num_centroids=2, chunk=4,
                                            kmeans_iters=1))
QVG_CACHE = QVG.init(B, S, K, D, jnp.float32)
KIVI = kvq_cache.KIVICache(config=kvq_ref.KIVIConfig(bits=4, group=4, block=16, residual=4))
KIVI_CACHE = KIVI.init(B, S, K, D, jnp.float32)
Q4 = _f32(B, H, 1, D)


def _cases():
    c = []

    def add(fn, args, kwargs, frag, id_):
        c.append(pytest.param(fn, args, kwargs, frag, id=id_))

    # -- sparse_decode: init / update / dense decode ------------------------------------------
    init = sd_ref.init_ffd_cache
    add(init, (-1, S, K, D, jnp.float32, P_SIZE), {}, "batch_size must", "init_ffd_cache-negative-batch")
    add(init, (B, 0, K, D, jnp.float32, P_SIZE), {}, "max_len must", "init_ffd_cache-zero-capacity")
    add(init, (B, S, 0, D, jnp.float32, P_SIZE), {}, "num_kv_heads must", "init_ffd_cache-zero-heads")
    add(init, (B, S, K, D, jnp.int32, P_SIZE), {}, "dtype must", "init_ffd_cache-int-dtype")
    add(init, (B, S, K, D, jnp.float32, 0), {}, "page_size must", "init_ffd_cache-zero-page")
    add(init, (2.0, S, K, D, jnp.float32, P_SIZE), {}, "batch_size must", "init_ffd_cache-float-batch")
    upd = sd_ref.update_ffd_cache
    add(upd, (FFD_CACHE, KNEW, VNEW, jnp.int32(0)), {}, "start must", "update_ffd_cache-scalar-start")
    add(upd, (FFD_CACHE, KNEW, VNEW, jnp.zeros((3,), jnp.int32)), {}, "start must",
        "update_ffd_cache-start-length")
    add(upd, (FFD_CACHE, KNEW, VNEW, jnp.zeros((B,), jnp.float32)), {}, "start must",
        "update_ffd_cache-float-start")
    add(upd, (FFD_CACHE, KNEW[0], VNEW[0], START), {}, "k must", "update_ffd_cache-rank3-k")
    add(upd, (FFD_CACHE, _f32(B, K, 3, 32), _f32(B, K, 3, 32), START), {}, "k must",
        "update_ffd_cache-head-dim")
    add(upd, (FFD_CACHE, _f32(3, K, 3, D), _f32(3, K, 3, D), START), {}, "k must",
        "update_ffd_cache-batch")
    add(upd, (FFD_CACHE, KNEW, _f32(B, K, 2, D), START), {}, "v must", "update_ffd_cache-v-shape")
    add(upd, (FFD_CACHE, KNEW.astype(jnp.int32), VNEW, START), {}, "k must",
        "update_ffd_cache-int-keys")
    add(upd, (FFD_CACHE, KNEW, VNEW, jnp.array([0, 15], jnp.int32)), {}, "start must",
        "update_ffd_cache-beyond-capacity")
    add(upd, (FFD_CACHE, KNEW, VNEW, jnp.array([-1, 0], jnp.int32)), {}, "start must",
        "update_ffd_cache-negative-start")
    dense = sd_ref.dense_decode
    add(dense, (Q, KD, VD, jnp.int32(5)), {}, "lengths must", "dense_decode-scalar-lengths")
    add(dense, (Q, KD, VD, jnp.array([1, 2, 3], jnp.int32)), {}, "lengths must",
        "dense_decode-lengths-batch")
    add(dense, (Q, KD, VD, jnp.array([0, 4], jnp.int32)), {}, "lengths must", "dense_decode-zero-length")
    add(dense, (Q, KD, VD, jnp.array([4, 17], jnp.int32)), {}, "lengths must",
        "dense_decode-beyond-capacity")
    add(dense, (Q, KD, VD, LEN.astype(jnp.float32)), {}, "lengths must", "dense_decode-float-lengths")
    add(dense, (Q[0], KD, VD, LEN), {}, "q must", "dense_decode-rank2-q")
    add(dense, (_f32(B, 3, D), KD, VD, LEN), {}, "query heads", "dense_decode-heads")
    add(dense, (Q, KD, VD[:, :, :8], LEN), {}, "v must", "dense_decode-kv-mismatch")
    add(dense, (_f32(B, H, 32), KD, VD, LEN), {}, "k must", "dense_decode-head-dim")
    add(dense, (Q.astype(jnp.int32), KD, VD, LEN), {}, "q must", "dense_decode-int-q")
    add(dense, (_f32(0, H, D), KD[:0], VD[:0], LEN[:0]), {}, "q must", "dense_decode-empty-batch")

    # -- sparse_decode: FFD decode / select -----------------------------------------------------
    for fn in (sd.ffd_decode, sd.ffd_select):
        n = fn.__name__
        add(fn, (Q, FFD_CACHE, jnp.int32(5)), {}, "lengths must", f"{n}-scalar-lengths")
        add(fn, (Q, FFD_CACHE, 5), {}, "lengths must", f"{n}-python-int-lengths")
        add(fn, (Q, FFD_CACHE, jnp.array([5, 6, 7], jnp.int32)), {}, "lengths must",
            f"{n}-lengths-batch")
        add(fn, (Q, FFD_CACHE, LEN.astype(jnp.float32)), {}, "lengths must", f"{n}-float-lengths")
        add(fn, (Q, FFD_CACHE, jnp.array([0, 5], jnp.int32)), {}, "lengths must", f"{n}-zero-length")
        add(fn, (Q, FFD_CACHE, jnp.array([5, 17], jnp.int32)), {}, "lengths must",
            f"{n}-beyond-capacity")
        add(fn, (_f32(0, H, D), sd_ref.init_ffd_cache(1, S, K, D, jnp.float32, P_SIZE),
                 jnp.zeros((0,), jnp.int32)), {}, "q must", f"{n}-empty-batch")
        add(fn, (Q, FFD_CACHE, LEN), {"top_k": np.int64(0)}, "top_k must", f"{n}-top_k-zero")
        add(fn, (Q, FFD_CACHE, LEN), {"delta": np.float32(-1.0)}, "delta must", f"{n}-negative-delta")
        add(fn, (Q, FFD_CACHE, LEN), {"delta": "8"}, "delta must", f"{n}-string-delta")
        add(fn, (Q, {"v": FFD_CACHE["v"]}, LEN), {}, "cache must", f"{n}-not-an-ffd-cache")
    add(sd.ffd_decode, (Q, FFD_CACHE, LEN), {"implementation": "bogus"}, "implementation",
        "ffd_decode-bogus-implementation")

    # -- sparse_decode: backends ------------------------------------------------------------------
    add(sd_cache.FFDCache, (), {"implementation": "bogus"}, "implementation", "FFDCache-bogus-impl")
    add(sd_cache.FFDCache, (), {"page_size": 4.5}, "page_size must", "FFDCache-float-page")
    add(sd_cache.FFDCache, (), {"delta": np.float32(-1.0)}, "delta must", "FFDCache-np-negative-delta")
    add(sd_cache.FFDCache, (), {"delta_unit": "bits"}, "delta_unit must", "FFDCache-bad-unit")
    add(sd_cache.FFDCache, (), {"scan_copy": "yes"}, "scan_copy must", "FFDCache-scan_copy-string")
    add(sd_cache.QuestCache, (), {"top_k": 2.5}, "top_k must", "QuestCache-float-top_k")
    add(sd_cache.QuestCache, (), {"page_size": 0}, "page_size must", "QuestCache-zero-page")
    add(FFD.init, (-1, S, K, D, jnp.float32), {}, "batch_size must", "FFDCache.init-negative-batch")
    add(FFD.update, (FFD_CACHE, KNEW, VNEW, jnp.int32(0)), {}, "start must", "FFDCache.update-scalar")
    add(FFD.attend, (FFD_CACHE, Q4, jnp.int32(3)), {}, "start must", "FFDCache.attend-scalar")
    add(FFD.attend, (FFD_CACHE, Q, START), {}, "q must", "FFDCache.attend-rank3-q")
    add(FFD.attend, (FFD_CACHE, _f32(B, 3, 1, D), START), {}, "query heads",
        "FFDCache.attend-heads")
    add(QUEST.init, (B, S, -2, D, jnp.float32), {}, "num_kv_heads must", "QuestCache.init-neg-heads")
    add(QUEST.update, (QUEST_CACHE, KNEW, VNEW, jnp.int32(0)), {}, "start must",
        "QuestCache.update-scalar")
    add(QUEST.update, (QUEST_CACHE, KNEW, _f32(B, K, 3, 32), START), {}, "v must",
        "QuestCache.update-v-shape")
    add(QUEST.attend, (QUEST_CACHE, Q4, jnp.int32(3)), {}, "start must", "QuestCache.attend-scalar")
    add(QUEST.attend, (QUEST_CACHE, Q4, START.astype(jnp.float32)), {}, "start must",
        "QuestCache.attend-float")

    # -- kv_quant: QVG / KIVI backends ----------------------------------------------------------
    for name, be, cache in (("QVGCache", QVG, QVG_CACHE), ("KIVICache", KIVI, KIVI_CACHE)):
        add(be.init, (-1, S, K, D, jnp.float32), {}, "batch_size must", f"{name}.init-negative-batch")
        add(be.init, (B, 0, K, D, jnp.float32), {}, "max_len must", f"{name}.init-zero-capacity")
        add(be.init, (B, S, K, D, jnp.int8), {}, "dtype must", f"{name}.init-int-dtype")
        add(be.update, (cache, KNEW, VNEW, jnp.int32(0)), {}, "start must", f"{name}.update-scalar")
        add(be.update, (cache, KNEW, VNEW, jnp.zeros((3,), jnp.int32)), {}, "start must",
            f"{name}.update-start-batch")
        add(be.update, (cache, KNEW, VNEW, jnp.zeros((B,), jnp.float32)), {}, "start must",
            f"{name}.update-float-start")
        add(be.update, (cache, _f32(B, K, 3, 32), _f32(B, K, 3, 32), START), {}, "k must",
            f"{name}.update-head-dim")
        add(be.update, (cache, KNEW, _f32(B, K, 2, D), START), {}, "v must", f"{name}.update-v-shape")
        add(be.update, (cache, KNEW[0], VNEW[0], START), {}, "k must", f"{name}.update-rank3")
        add(be.update, (cache, KNEW, VNEW, jnp.array([0, 15], jnp.int32)), {}, "start must",
            f"{name}.update-beyond-capacity")
        add(be.attend, (cache, Q4, jnp.int32(3)), {}, "start must", f"{name}.attend-scalar")
        add(be.attend, (cache, Q4, jnp.zeros((3,), jnp.int32)), {}, "start must",
            f"{name}.attend-start-batch")
        add(be.attend, (cache, _f32(B, 3, 1, D), START), {}, "query heads", f"{name}.attend-heads")
        add(be.attend, (cache, _f32(B, H, 1, 32), START), {}, "q must", f"{name}.attend-head-dim")
        add(be.attend, (cache, Q, START), {}, "q must", f"{name}.attend-rank3")
        add(be.attend, (cache, Q4.astype(jnp.int32), START), {}, "q must", f"{name}.attend-int-q")
    add(kvq_cache.QVGCache, (), {"implementation": "bogus"}, "implementation", "QVGCache-bogus-impl")
    add(kvq_cache.QVGCache, (), {"rope_base": -1.0}, "rope_base must", "QVGCache-negative-rope")
    add(kvq_cache.QVGCache, (), {"seed": 1.5}, "seed must", "QVGCache-float-seed")
    add(kvq_ref.QVGConfig, (), {"chunk": 2.5, "num_centroids": 2}, "chunk must", "QVGConfig-float-chunk")
    add(kvq_ref.QVGConfig, (), {"stages": np.float32(1.0)}, "stages must", "QVGConfig-float-stages")
    add(kvq_ref.QVGConfig, (), {"block": 0}, "block must", "QVGConfig-zero-block")
    add(kvq_ref.QVGConfig, (), {"kmeans_iters": "10"}, "kmeans_iters must", "QVGConfig-string-iters")
    add(kvq_ref.KIVIConfig, (), {"group": 2.0, "residual": 4}, "group must", "KIVIConfig-float-group")
    add(kvq_ref.KIVIConfig, (), {"block": -1}, "block must", "KIVIConfig-negative-block")
    add(kvq_ref.qvg_quantize, (_f32(8), QVG.config), {}, "x must", "qvg_quantize-rank1")
    add(kvq_ref.qvg_quantize, (_f32(8, D).astype(jnp.int32), QVG.config), {}, "x must",
        "qvg_quantize-int")
    add(kvq.qvg_chunk_attention, (Q, QVG_CACHE["k"], QVG_CACHE["v"], QVG.config, START,
                                  START, 1, None), {}, "q must", "qvg_chunk_attention-rank3-q")
    return c


CASES = _cases()


@pytest.mark.parametrize("fn, args, kwargs, fragment", CASES)
def test_bad_input_is_one_clear_value_error(fn, args, kwargs, fragment):
    with pytest.raises(ValueError, match=fragment):
        fn(*args, **kwargs)


def _call(fn, *args):
    """``fn(*args)`` on the concrete arguments, its work compiled as one program.

    The arguments are closed over, not traced: the entry point sees them as concrete arrays, so
    every check it makes outside ``jit`` (value ranges, the platform) runs as in an eager call;
    only the computation after the checks is traced (one compile instead of one per eager op).
    """
    return jax.jit(lambda: fn(*args))()


def test_good_input_still_passes_the_checks():
    """The same entry points accept the well-formed arguments the cases perturb."""
    out = _call(sd.ffd_decode, Q, FFD_CACHE, LEN)
    assert out.shape == (B, H, D)
    assert _call(sd.ffd_select, Q, FFD_CACHE, LEN).shape == (B, K, S // P_SIZE)
    assert _call(sd_ref.dense_decode, Q, KD, VD, LEN).shape == (B, H, D)
    c = _call(sd_ref.update_ffd_cache, FFD_CACHE, KNEW, VNEW, START)
    assert jax.tree.structure(c) == jax.tree.structure(FFD_CACHE)
    for be, cache in ((QVG, QVG_CACHE), (KIVI, KIVI_CACHE), (FFD, FFD_CACHE),
                      (QUEST, QUEST_CACHE)):
        cache = _call(be.update, cache, KNEW, VNEW, START)
        assert _call(be.attend, cache, Q4, START + 3).shape == Q4.shape
    assert sd_cache.FFDCache(top_k=np.int64(2)).top_k == 2  # NumPy integers are integers
