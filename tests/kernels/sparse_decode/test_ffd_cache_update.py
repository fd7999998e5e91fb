"""The FFD cache's one-token update (the decode step) quantizes a key page once, in the step whose
token fills it: the same cache, bit for bit, as one multi-token update of the same tokens, with
the quantizer in a conditional that no page store passes through."""

import jax
import jax.extend
import jax.numpy as jnp
import numpy as np
import pytest

from kernels.sparse_decode import reference as ref

B, K, P, D, PAGE = 3, 2, 4, 32, 16


def _primitives(jaxpr, outside_cond=False):
    """Names of the primitives in ``jaxpr`` and its sub-jaxprs (with ``outside_cond``, not those
    of a conditional's branches)."""
    names = []
    for e in jaxpr.eqns:
        names.append(e.primitive.name)
        if not (outside_cond and e.primitive.name == "cond"):
            for sub in jax.extend.core.jaxprs_in_params(e.params):
                names += _primitives(sub, outside_cond)
    return names


@pytest.mark.parametrize("scan_copy", [False, True])
def test_one_token_steps_equal_one_multi_token_update(scan_copy):
    key = jax.random.PRNGKey(7)
    empty = ref.init_ffd_cache(B, P * PAGE, K, D, jnp.bfloat16, page_size=PAGE,
                               scan_copy=scan_copy)
    pre = np.array([5, 16, 0])  # ragged prompts: mid-page, a page boundary, empty
    steps = 2 * PAGE + 3  # crosses two or three page boundaries per row
    k = jax.random.normal(key, (B, K, pre.max() + steps, D)) * 3.0
    v = jax.random.normal(jax.random.fold_in(key, 1), k.shape)
    start0 = jnp.zeros((B,), jnp.int32)
    step_cache = empty
    for b in range(B):  # the prompts, row by row (one ragged multi-token write)
        if pre[b]:
            row = ref.update_ffd_cache(empty, k[:, :, :pre[b]], v[:, :, :pre[b]], start0)
            step_cache = jax.tree.map(lambda c, r, b=b: c.at[b].set(r[b]), step_cache, row)
    one = jax.jit(ref.update_ffd_cache)
    for i in range(steps):
        pos = jnp.asarray(pre + i, jnp.int32)
        ki = jnp.stack([k[b, :, pre[b] + i] for b in range(B)])[:, :, None]
        vi = jnp.stack([v[b, :, pre[b] + i] for b in range(B)])[:, :, None]
        step_cache = one(step_cache, ki, vi, pos)
    total = pre + steps
    for b in range(B):  # the same tokens in one write per row
        whole = ref.update_ffd_cache(empty, k[:, :, :total[b]], v[:, :, :total[b]], start0)
        for f in step_cache:
            np.testing.assert_array_equal(np.asarray(step_cache[f][b]).astype(np.float32),
                                          np.asarray(whole[f][b]).astype(np.float32), err_msg=f)


def test_pages_are_quantized_only_inside_the_conditional():
    cache = jax.eval_shape(lambda: ref.init_ffd_cache(B, P * PAGE, K, D, jnp.bfloat16,
                                                      page_size=PAGE))
    tok = jax.ShapeDtypeStruct((B, K, 1, D), jnp.float32)
    jaxpr = jax.make_jaxpr(ref.update_ffd_cache)(cache, tok, tok,
                                                 jax.ShapeDtypeStruct((B,), jnp.int32)).jaxpr
    (cond,) = [e for e in jaxpr.eqns if e.primitive.name == "cond"]
    # the quantizer (its rounding) runs only in the conditional, whose operands and results are
    # one page per row: no page store passes through it
    assert "round" not in _primitives(jaxpr, outside_cond=True)
    assert "round" in _primitives(cond.params["branches"][1].jaxpr)
    sizes = [v.aval.size for v in list(cond.invars[1:]) + list(cond.outvars)]
    assert max(sizes) <= B * K * PAGE * D < cache["resid"].size
