import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from kernels.rope import apply_rope
from models import kv_cache as kvc
from models.sampling import generate
from models.transformer import Transformer, TransformerConfig, forward_flops_per_token

V = 50


@functools.cache
def make(**kw):
    """(config, model); built once per configuration and shared (the tests only read it)."""
    cfg = TransformerConfig(**{**dict(vocab_size=V, max_len=32, d_model=32, num_layers=2,
                                      num_heads=4, num_kv_heads=2), **kw})
    return cfg, Transformer(cfg, rngs=nnx.Rngs(0))


@functools.partial(jax.jit, static_argnums=0, static_argnames="return_hidden")
def _forward(graphdef, params, x, cond=None, *, return_hidden=False):
    return nnx.merge(graphdef, params)(x, cond, return_hidden=return_hidden)


@functools.partial(jax.jit, static_argnums=0)
def _decode(graphdef, params, x, cache, start):
    return nnx.merge(graphdef, params).decode(x, cache, start)


def jitted(m):
    """The model's forward and decode, each compiled once per (model, input shape)."""
    graphdef, params = nnx.split(m)
    return (functools.partial(_forward, graphdef, params),
            functools.partial(_decode, graphdef, params))


def tokens(b=2, l=12, seed=0):
    return jax.random.randint(jax.random.key(seed), (b, l), 0, V)


def test_shapes_and_dtype():
    _, m = make()
    out = m(tokens())
    chex.assert_shape(out, (2, 12, V))
    assert out.dtype == jnp.float32
    chex.assert_tree_all_finite(out)
    chex.assert_shape(m(tokens(), return_hidden=True), (2, 12, 32))


def test_causality_by_gradient():
    """d logits[t] / d embedding[s] is zero for every s > t (and non-zero for some s <= t)."""
    _, m = make()
    x = tokens(1, 10)
    emb = m.embed(x)
    graphdef, params = nnx.split(m)

    def out(e):
        model = nnx.merge(graphdef, params)
        # run the blocks from a given embedding (same path as __call__)
        pos = jnp.arange(10)[None]
        mask = jnp.tril(jnp.ones((10, 10), bool))[None]
        h = e
        for blk in model.blocks:
            h = blk(h, pos, mask)
        return model.head_logits(h, None)[0].sum(-1)  # [L]: row t is logits[t] summed over the vocab

    jac = jax.jit(jax.jacrev(out))(emb)[:, 0]  # [L (output t), L (input s), E]
    for t in range(10):
        norms = jnp.linalg.norm(jac[t], axis=-1)
        assert float(norms[t + 1:].max(initial=0.0)) == 0.0
        assert float(norms[: t + 1].min()) > 0.0


def test_bidirectional_sees_the_future():
    _, m = make(causal=False)
    forward = jitted(m)[0]
    x = tokens(1, 8)
    y = x.at[0, -1].set((x[0, -1] + 1) % V)
    assert float(jnp.abs(forward(x)[0, 0] - forward(y)[0, 0]).max()) > 1e-6


@pytest.mark.parametrize("kv_heads", [1, 2, 4])
def test_kv_cache_decode_equals_full_forward(kv_heads):
    _, m = make(num_kv_heads=kv_heads)
    forward, decode = jitted(m)
    x = tokens(3, 14, seed=kv_heads)
    full = forward(x)
    cache = m.init_cache(3, 20)
    logits, cache = decode(x[:, :9], cache, jnp.zeros(3, jnp.int32))
    outs = [logits]
    for i in range(9, 14):
        logits, cache = decode(x[:, i:i + 1], cache, jnp.full((3,), i, jnp.int32))
        outs.append(logits)
    np.testing.assert_allclose(jnp.concatenate(outs, 1), full, atol=2e-5, rtol=2e-5)


def test_ragged_rows_decode_independently():
    """Rows at different lengths in one batch match their own single-row decode."""
    _, m = make()
    forward, decode = jitted(m)
    x = tokens(2, 10, seed=5)
    # row 0 gets a 6-token prefix, row 1 a 3-token prefix; then one step each at its own position
    c0 = m.init_cache(1, 16)
    l0, c0 = decode(x[:1, :6], c0, jnp.zeros(1, jnp.int32))
    c1 = m.init_cache(1, 16)
    l1, c1 = decode(x[1:, :3], c1, jnp.zeros(1, jnp.int32))
    cache = jax.tree.map(lambda a, b: jnp.concatenate([a, b]), c0, c1)
    step_tok = jnp.stack([x[0, 6], x[1, 3]])[:, None]
    logits, _ = decode(step_tok, cache, jnp.array([6, 3], jnp.int32))
    np.testing.assert_allclose(logits[0, 0], forward(x[:1, :7])[0, 6], atol=2e-5, rtol=2e-5)
    np.testing.assert_allclose(logits[1, 0], forward(x[1:, :4])[0, 3], atol=2e-5, rtol=2e-5)


def check_greedy_against_full_forward(m, prompt, toks, logp, banned=()):
    """Greedy tokens are the argmax, and their log-probs the log-softmax, of the full forward over
    prompt + tokens, with ``banned`` ids removed (logits -inf) before both."""
    p = prompt.shape[1]
    logits = jitted(m)[0](jnp.concatenate([prompt, toks], axis=1))[:, p - 1:-1]
    if banned:
        logits = jnp.where(jnp.isin(jnp.arange(logits.shape[-1]), jnp.asarray(banned)), -jnp.inf,
                           logits)
    np.testing.assert_array_equal(toks, jnp.argmax(logits, -1))
    ref = jnp.take_along_axis(jax.nn.log_softmax(logits), toks[..., None], -1)[..., 0]
    np.testing.assert_allclose(logp, ref, atol=1e-5)


def test_generate_greedy_matches_argmax_of_full_forward():
    cfg, m = make()
    graphdef, params = nnx.split(m)
    prompt = tokens(2, 5, seed=9)
    toks, logp = generate(graphdef, params, prompt, jax.random.key(0), max_new_tokens=6,
                          temperature=0.0)
    check_greedy_against_full_forward(m, prompt, toks, logp)


def test_generate_never_samples_banned_ids_and_renormalises():
    cfg, m = make()
    graphdef, params = nnx.split(m)
    prompt = tokens(2, 5, seed=3)
    greedy, _ = generate(graphdef, params, prompt, jax.random.key(0), max_new_tokens=6,
                         temperature=0.0)
    banned = tuple(int(t) for t in np.unique(greedy))  # every token greedy decoding would pick
    toks, logp = generate(graphdef, params, prompt, jax.random.key(0), max_new_tokens=6,
                          temperature=0.0, banned_ids=banned)
    assert not np.isin(np.asarray(toks), banned).any()
    # the log-probs are those of the model renormalised over the allowed ids
    check_greedy_against_full_forward(m, prompt, toks, logp, banned)
    with pytest.raises(ValueError, match="banned_ids"):
        generate(graphdef, params, prompt, jax.random.key(0), max_new_tokens=2,
                 banned_ids=(cfg.vocab_size,))


def test_rope_is_relative_and_orthogonal():
    k1, k2 = jax.random.split(jax.random.key(0))
    q = jax.random.normal(k1, (1, 1, 1, 16))
    k = jax.random.normal(k2, (1, 1, 1, 16))

    def score(pq, pk):
        return jnp.sum(apply_rope(q, jnp.array([[pq]])) * apply_rope(k, jnp.array([[pk]])))

    np.testing.assert_allclose(score(7, 3), score(104, 100), rtol=1e-4)
    np.testing.assert_allclose(apply_rope(apply_rope(q, jnp.array([[5]])), jnp.array([[-5]])), q,
                               atol=1e-6)
    np.testing.assert_allclose(jnp.linalg.norm(apply_rope(q, jnp.array([[9]]))),
                               jnp.linalg.norm(q), rtol=1e-6)


@pytest.mark.parametrize("time_conditioning", [False, True])
def test_flops_count_matches_xla_cost_analysis(time_conditioning):
    cfg = TransformerConfig(vocab_size=256, max_len=128, d_model=128, num_layers=2, num_heads=4,
                            num_kv_heads=2, time_conditioning=time_conditioning)
    graphdef, params = nnx.split(Transformer(cfg, rngs=nnx.Rngs(0)))
    b, l = 4, 128
    cond = jnp.ones((b,)) if time_conditioning else None
    f = jax.jit(lambda p, x, c: nnx.merge(graphdef, p)(x, c))
    cost = f.lower(params, jnp.zeros((b, l), jnp.int32), cond).compile().cost_analysis()
    cost = cost[0] if isinstance(cost, list) else cost
    xla = cost["flops"] / (b * l)
    ours = forward_flops_per_token(cfg, l)
    # XLA also counts norms, softmax, RoPE and activations (O(E + L) per token): a few percent more.
    assert ours <= xla <= 1.06 * ours, (ours, xla)


def test_adaln_zero_is_identity_at_init():
    cfg, m = make(time_conditioning=True, causal=False)
    graphdef, params = nnx.split(m)
    x = tokens(2, 8)
    emb = m.embed(x)
    hidden = _forward(graphdef, params, x, jnp.array([0.1, 0.9]), return_hidden=True)
    np.testing.assert_allclose(hidden, emb, atol=1e-6)
    out_a = _forward(graphdef, params, x, jnp.array([0.1, 0.9]))
    out_b = _forward(graphdef, params, x, jnp.array([0.7, 0.2]))
    np.testing.assert_allclose(out_a, out_b, atol=1e-6)
    # ... and stops being the identity once the adaLN maps are non-zero
    params = jax.tree.map(lambda p: p + 0.05, params)
    assert float(jnp.abs(_forward(graphdef, params, x, jnp.array([0.1, 0.9]))
                         - _forward(graphdef, params, x, jnp.array([0.7, 0.2]))).max()) > 1e-4


def test_bad_input_raises():
    cfg, m = make()
    with pytest.raises(ValueError, match="exceeds the model's max_len=32"):
        m(tokens(1, 33))
    with pytest.raises(ValueError, match="exceeds the model's max_len"):
        m.init_cache(1, 64)
    with pytest.raises(ValueError, match="time_conditioning=False"):
        m(tokens(), jnp.ones(2))
    _, mt = make(time_conditioning=True)
    with pytest.raises(ValueError, match="time-conditioned"):
        mt(tokens())
    with pytest.raises(ValueError, match="not a multiple of num_kv_heads"):
        TransformerConfig(vocab_size=10, max_len=8, d_model=32, num_heads=4, num_kv_heads=3)
    graphdef, params = nnx.split(m)
    with pytest.raises(ValueError, match="exceeds max_len"):
        generate(graphdef, params, tokens(1, 30), jax.random.key(0), max_new_tokens=5)
    with pytest.raises(ValueError, match="unknown KV-cache backend 'nope'.*dense"):
        kvc.get_backend("nope")
