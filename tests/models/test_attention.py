"""Blockwise (flash-style) attention, splash attention (Pallas TPU kernels in interpret mode) and
the model's attention / remat switches against the jnp reference: values and gradients for every
mask kind, ragged block sizes, GQA and bf16."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from hypothesis import given, settings
from hypothesis import strategies as st

from kernels.attention_math import grouped_attention
from models import attention as attn
from models.transformer import Transformer, TransformerConfig
from tests.hypothesis_budget import examples


def _inputs(seed, b, h, k, l, d, dtype=jnp.float32, scale=1.0):
    rng = np.random.default_rng(seed)
    q, kk, v = (scale * rng.normal(size=s) for s in ((b, h, l, d), (b, k, l, d), (b, k, l, d)))
    custom = rng.random((b, l, l)) < 0.3
    custom[:, np.arange(l), rng.integers(0, l, l)] = True  # every query row sees at least one key
    return (jnp.asarray(q, dtype), jnp.asarray(kk, dtype), jnp.asarray(v, dtype),
            jnp.asarray(custom))


def _dense_mask(kind, custom, l):
    return {"causal": jnp.tril(jnp.ones((l, l), bool))[None], "full": jnp.ones((1, l, l), bool),
            "custom": custom}[kind]


@pytest.mark.parametrize("kind", ["causal", "full", "custom"])
@pytest.mark.parametrize("block", [1, 8, 64])
def test_blockwise_equals_reference_values_and_grads(kind, block):
    b, h, k, l, d = 2, 4, 2, 37, 16  # 37 keys: the last block is padded for every block size > 1
    q, kk, v, custom = _inputs(block, b, h, k, l, d)
    mask = custom if kind == "custom" else None
    cot = jnp.asarray(np.random.default_rng(1).normal(size=(b, h, l, d)), jnp.float32)

    def ref(q, kk, v):
        return grouped_attention(q, kk, v, _dense_mask(kind, custom, l)[:, None, None])

    def ours(q, kk, v):
        return attn.blockwise_attention(q, kk, v, mask_kind=kind, mask=mask, block_size=block)

    np.testing.assert_allclose(ours(q, kk, v), ref(q, kk, v), rtol=2e-5, atol=2e-6)
    g_ref = jax.vjp(ref, q, kk, v)[1](cot)
    g_our = jax.vjp(ours, q, kk, v)[1](cot)
    for a, r in zip(g_our, g_ref, strict=True):
        np.testing.assert_allclose(a, r, rtol=1e-4, atol=1e-5 * float(jnp.max(jnp.abs(r))))


@settings(max_examples=examples(12), deadline=None)
@given(seed=st.integers(0, 2 ** 31 - 1), group=st.sampled_from([1, 2, 4]),
       kind=st.sampled_from(["causal", "full", "custom"]),
       scale=st.sampled_from([1e-3, 1.0, 30.0]))
def test_blockwise_matches_reference_over_gqa_and_magnitudes(seed, group, kind, scale):
    b, k, l, d = 1, 2, 24, 8
    q, kk, v, custom = _inputs(seed, b, group * k, k, l, d, scale=scale)
    mask = custom if kind == "custom" else None
    out = attn.blockwise_attention(q, kk, v, mask_kind=kind, mask=mask, block_size=8)
    ref = grouped_attention(q, kk, v, _dense_mask(kind, custom, l)[:, None, None])
    assert bool(jnp.all(jnp.isfinite(out)))
    # A score perturbed by delta moves a softmax-weighted mean of v by at most 2 delta max|v|; f32
    # scores computed in another order differ by a few ulps of the largest |q||k| / sqrt(D); the
    # weighted sum itself rounds at a few ulps of max|v|.
    s_max = float(jnp.max(jnp.linalg.norm(q, axis=-1)) * jnp.max(jnp.linalg.norm(kk, axis=-1)))
    eps = np.finfo(np.float32).eps
    delta = 8 * eps * s_max / np.sqrt(d)
    np.testing.assert_allclose(out, ref, rtol=1e-5,
                               atol=(2 * delta + 16 * eps) * float(jnp.max(jnp.abs(v))))


def test_blockwise_bf16_within_bf16_resolution():
    q, kk, v, _ = _inputs(3, 2, 4, 2, 40, 32)
    ref = attn.blockwise_attention(q, kk, v, mask_kind="causal", block_size=16)
    lo = attn.blockwise_attention(q.astype(jnp.bfloat16), kk.astype(jnp.bfloat16),
                                  v.astype(jnp.bfloat16), mask_kind="causal", block_size=16)
    assert lo.dtype == jnp.bfloat16
    # inputs rounded to bf16 (relative 2^-8) and the output rounded once more
    np.testing.assert_allclose(np.asarray(lo, np.float32), ref, atol=3 * 2.0 ** -8 * 4)


@pytest.mark.parametrize("kind, l", [("causal", 200), ("full", 200)])
def test_splash_equals_reference_values_and_grads(kind, l):
    """GQA (G = 2), L = 200 padded to two 128-wide tiles (the full mask then masks the padding
    keys by segment ids; causal needs nothing); float32 inputs, so the
    kernel's q @ k and p @ v are float32 too and agree with the reference to float32 rounding."""
    b, h, k, d = 2, 4, 2, 32
    q, kk, v, _ = _inputs(l, b, h, k, l, d)
    cot = jnp.asarray(np.random.default_rng(1).normal(size=(b, h, l, d)), jnp.float32)

    def ref(q, kk, v):
        return grouped_attention(q, kk, v, _dense_mask(kind, None, l)[:, None, None])

    def ours(q, kk, v):
        return attn.attention(q, kk, v, implementation="splash", mask_kind=kind, block_size=128,
                              interpret=True)

    out, vjp = jax.jit(lambda *a: jax.vjp(ours, *a))(q, kk, v)
    np.testing.assert_allclose(out, ref(q, kk, v), rtol=2e-5, atol=2e-6)
    g_ref = jax.vjp(ref, q, kk, v)[1](cot)
    for a, r in zip(jax.jit(vjp)(cot), g_ref, strict=True):
        np.testing.assert_allclose(a, r, rtol=1e-4, atol=1e-5 * float(jnp.max(jnp.abs(r))))


def test_splash_bf16_within_bf16_resolution_and_custom_masks_run_blockwise():
    q, kk, v, custom = _inputs(5, 1, 4, 1, 128, 64)  # MQA: four query heads on one kv head
    ref = attn.blockwise_attention(q, kk, v, mask_kind="causal")
    lo = attn.splash_attention(*(x.astype(jnp.bfloat16) for x in (q, kk, v)), mask_kind="causal",
                               interpret=True)
    assert lo.dtype == jnp.bfloat16
    # inputs, q / sqrt(D) (exact: D = 64), the probabilities fed to p @ v and the output are
    # rounded to bf16 (relative 2^-8 each)
    np.testing.assert_allclose(np.asarray(lo, np.float32), ref, atol=4 * 2.0 ** -8 * 4)
    # custom masks cannot be splash's static masks: they run blockwise, with the same values
    via_splash = attn.attention(q, kk, v, implementation="splash", mask_kind="custom", mask=custom)
    np.testing.assert_array_equal(via_splash, attn.blockwise_attention(
        q, kk, v, mask_kind="custom", mask=custom))
    assert "blockwise" in attn.fallback_reason("splash", "custom")
    assert "blockwise" in attn.fallback_reason("auto", "custom")
    assert attn.fallback_reason("splash", "causal") is None
    assert attn.fallback_reason("blockwise", "custom") is None


@pytest.mark.parametrize("kind", ["causal", "full", "custom"])
def test_auto_is_blockwise_off_tpu_and_gpu(kind):
    """On the CPU, "auto" lowers the blockwise branch of ``lax.platform_dependent``: the same
    values and gradients bit for bit (the splash branch is traced, not lowered)."""
    q, kk, v, custom = _inputs(7, 2, 4, 2, 40, 16)
    mask = custom if kind == "custom" else None

    def run(impl):
        def f(q, kk, v):
            return attn.attention(q, kk, v, implementation=impl, mask_kind=kind, mask=mask,
                                  block_size=16)
        out, vjp = jax.jit(lambda *a: jax.vjp(f, *a))(q, kk, v)
        return out, vjp(jnp.ones_like(out))

    for a, r in zip(jax.tree.leaves(run("auto")), jax.tree.leaves(run("blockwise")), strict=True):
        np.testing.assert_array_equal(a, r)


def test_blockwise_bad_input():
    q, kk, v, custom = _inputs(0, 1, 2, 1, 8, 4)
    with pytest.raises(ValueError, match="mask_kind"):
        attn.blockwise_attention(q, kk, v, mask_kind="sliding")
    with pytest.raises(ValueError, match="exactly when"):
        attn.blockwise_attention(q, kk, v, mask_kind="causal", mask=custom)
    with pytest.raises(ValueError, match="mask must be"):
        attn.blockwise_attention(q, kk, v, mask_kind="custom", mask=custom[:, :4])
    with pytest.raises(ValueError, match="multiple of K"):
        attn.blockwise_attention(q[:, :1], jnp.concatenate([kk, kk], 1), jnp.concatenate([v, v], 1))
    with pytest.raises(ValueError, match="not one of"):
        TransformerConfig(vocab_size=8, max_len=8, attention="flash3")
    with pytest.raises(ValueError, match="needs an NVIDIA GPU"):
        attn.check_platform("cudnn", "cpu")
    attn.check_platform("cudnn", "gpu")
    attn.check_platform("blockwise", "tpu")
    with pytest.raises(ValueError, match="needs a TPU"):
        attn.check_platform("splash", "gpu")
    attn.check_platform("splash", "tpu")
    for platform in ("cpu", "gpu", "tpu"):
        attn.check_platform("auto", platform)
    with pytest.raises(ValueError, match="custom masks run by blockwise"):
        attn.splash_attention(q, kk, v, mask_kind="custom")
    with pytest.raises(ValueError, match="causal mask needs L = S"):
        attn.splash_attention(q, kk[:, :, :4], v[:, :, :4], mask_kind="causal")
    with pytest.raises(ValueError, match="multiple of K"):
        attn.splash_attention(q[:, :1], jnp.concatenate([kk, kk], 1), jnp.concatenate([v, v], 1))
    with pytest.raises(ValueError, match="mask_kind"):
        attn.fallback_reason("splash", "sliding")
    with pytest.raises(ValueError, match="custom masks"):
        attn.attention(q, kk, v, implementation="cudnn", mask_kind="custom", mask=custom)
    with pytest.raises(ValueError, match="remat"):
        TransformerConfig(vocab_size=8, max_len=8, remat="some")
    with pytest.raises(ValueError, match="does not divide"):
        TransformerConfig(vocab_size=8, max_len=8, d_model=32, num_heads=4).check_model_parallelism(8)


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("scan_layers", [False, True])
def test_model_attention_and_remat_switches_keep_logits_and_grads(causal, scan_layers):
    base = dict(vocab_size=32, max_len=24, d_model=32, num_layers=2, num_heads=4, num_kv_heads=2,
                causal=causal, scan_layers=scan_layers)
    tokens = jnp.asarray(np.random.default_rng(0).integers(0, 32, (2, 24)), jnp.int32)
    custom = jnp.asarray(np.tril(np.ones((24, 24), bool))[::-1, ::-1].copy())[None]  # anti-causal

    switches = [{},  # the reference: dense attention, no remat
                {"attention": "blockwise", "attention_block": 8}, {"remat": "full"},
                # "auto" on the CPU: the blockwise branch of lax.platform_dependent, under remat
                {"remat": "minimal", "attention": "auto", "attention_block": 5}]
    models = [nnx.split(Transformer(TransformerConfig(**base, **over), rngs=nnx.Rngs(0)))
              for over in switches]

    def loss(graphdef, p, mask):
        logits = nnx.merge(graphdef, p)(tokens, mask=mask)
        return jnp.mean(jax.nn.logsumexp(logits, -1) - jnp.take_along_axis(
            logits, tokens[..., None], -1)[..., 0])

    @jax.jit
    def loss_and_grads(params):
        """[switch][mask] -> (loss, grads), every switch and mask in one compilation."""
        return [[jax.value_and_grad(functools.partial(loss, graphdef))(p, m) for m in (None, custom)]
                for (graphdef, _), p in zip(models, params, strict=True)]

    ref, *others = loss_and_grads([p for _, p in models])
    for got in others:
        for (lv, lg), (rv, rg) in zip(got, ref, strict=True):
            np.testing.assert_allclose(float(lv), float(rv), rtol=1e-6)
            for a, r in zip(jax.tree.leaves(lg), jax.tree.leaves(rg), strict=True):
                np.testing.assert_allclose(a, r, rtol=2e-4, atol=2e-6)
