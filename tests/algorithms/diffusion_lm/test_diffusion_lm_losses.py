"""NELBOs and objectives: closed forms against the general form, limits, Eso-LM structure."""

from decimal import Decimal, localcontext

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from hypothesis import given, settings
from hypothesis import strategies as st

from algorithms.diffusion_lm import esolm, losses
from algorithms.diffusion_lm.families import (
    FamilySpec,
    per_token_terms,
    train_loss,
    transformer_config,
)
from algorithms.diffusion_lm.processes import Process, denoiser_log_probs
from models.transformer import Transformer
from tests.hypothesis_budget import examples

V, N, MASK = 9, 7, 7
B, L = 4, 6


def _batch(seed=0):
    k1, k2 = jax.random.split(jax.random.key(seed))
    x = jax.random.randint(k1, (B, L), 0, N)
    logits = jax.random.normal(k2, (B, L, V)) * 1.5
    t = jnp.array([0.05, 0.3, 0.6, 0.95])
    return x, logits, t


def test_duo_closed_form_equals_general_form_and_is_nonnegative():
    proc = Process("uniform", V, N)
    x, logits, t = _batch()
    z = proc.sample(jax.random.key(1), x, t)
    logp = denoiser_log_probs(proc, logits, z)
    duo = losses.duo_nelbo(proc, logp, x, z, t)
    np.testing.assert_allclose(duo, losses.mixing_nelbo(proc, logp, x, z, t), rtol=2e-4,
                               atol=1e-5)
    assert float(duo.min()) >= -1e-6 and float(duo.max()) > 0.05


def test_duo_nelbo_is_zero_at_a_perfect_prediction():
    proc = Process("uniform", V, N)
    x, _, t = _batch(1)
    z = proc.sample(jax.random.key(2), x, t)
    perfect = jnp.where(jax.nn.one_hot(x, V) > 0, 0.0, -jnp.inf)
    np.testing.assert_allclose(losses.duo_nelbo(proc, perfect, x, z, t), 0.0, atol=1e-5)
    # ... and strictly positive for a slightly wrong one.
    off = jnp.log(0.9 * jax.nn.one_hot(x, V) + 0.1 * jax.nn.one_hot((x + 1) % N, V))
    assert float(losses.duo_nelbo(proc, off, x, z, t).min()) > 0


def _duo_nelbo_exact(proc, log_x_theta, x, z, t):
    """The module docstring's closed form in 40-digit decimal arithmetic on the float32 inputs,
    ``x_theta = softmax(log_x_theta)``, ``alpha_t = 1 - (1 - eps) t`` (linear schedule)."""
    n = proc.num_classes
    t, eps = Decimal(float(t)), Decimal(proc.eps)
    alpha, dalpha = 1 - (1 - eps) * t, -(1 - eps)
    p = [Decimal(float(v)).exp() if np.isfinite(v) else Decimal(0) for v in log_x_theta[:n]]
    x_th = [v / sum(p) for v in p]
    xbar = [n * alpha * (j == x) + (1 - alpha) for j in range(n)]
    xbar_th = [n * alpha * x_th[j] + (1 - alpha) for j in range(n)]
    i = z
    inner = n / xbar_th[i] - n / xbar[i]
    for j in range(n):
        if xbar[j] > 0:
            inner += xbar[j] / xbar[i] * (xbar_th[i] * xbar[j] / (xbar_th[j] * xbar[i])).ln()
    return float(-dalpha / (n * alpha) * inner)


def test_uniform_nelbos_keep_relative_precision_near_zero():
    # Near-perfect predictions (the true class leads by up to 16 nats) and t down to 0 give
    # NELBOs from 1e-14 to 6e7 nats; the closed form evaluated as written in float32 lost every
    # digit below 1e-4 (relative error up to 1e5, some values negative).
    proc = Process("uniform", V, N)
    ts = np.array([0.0, 1e-7, 1e-5, 1e-3, 0.1, 0.5, 0.9, 1.0], np.float32)
    rng = np.random.default_rng(0)
    x = rng.integers(0, N, (len(ts), L))
    lead = np.array([0.0, 2.0, 5.0, 9.0, 12.0, 16.0])
    logits = rng.normal(size=(len(ts), L, V)) + lead[:, None] * np.eye(V)[x]
    logits[..., N:] = -np.inf
    logp = np.asarray(jax.nn.log_softmax(jnp.asarray(logits, jnp.float32), -1))
    z = np.where(rng.random(x.shape) < 0.7, x, rng.integers(0, N, x.shape))
    z[0] = x[0]                                     # at t = 0 every token is clean
    with localcontext() as ctx:
        ctx.prec = 40
        want = np.array([[_duo_nelbo_exact(proc, logp[b, l], x[b, l], z[b, l], ts[b])
                          for l in range(L)] for b in range(len(ts))])
    assert want.min() < 1e-13 and want.max() > 1e7
    args = jnp.asarray(logp), jnp.asarray(x), jnp.asarray(z), jnp.asarray(ts)
    for nelbo in (losses.duo_nelbo(proc, *args), losses.mixing_nelbo(proc, *args)):
        nelbo = np.asarray(nelbo, np.float64)
        assert np.all(nelbo > 0)
        np.testing.assert_allclose(nelbo, want, rtol=2e-6)
    # The gradient through the series and the direct branches is finite.
    grad = jax.grad(lambda lg: losses.duo_nelbo(
        proc, jax.nn.log_softmax(lg, -1), *args[1:]).sum())(jnp.asarray(logits, jnp.float32))
    assert np.all(np.isfinite(np.asarray(grad)[..., :N]))


def test_masked_closed_form_equals_general_form_and_ce_is_t_times_nelbo():
    proc = Process("masked", V, N, mask_id=MASK)
    x, logits, t = _batch(2)
    z = proc.sample(jax.random.key(3), x, t)
    logp = denoiser_log_probs(proc, logits, z)
    nelbo = losses.masked_nelbo(proc, logp, x, z, t)
    np.testing.assert_allclose(nelbo, losses.mixing_nelbo(proc, logp, x, z, t), rtol=2e-4,
                               atol=1e-5)
    ce = losses.masked_ce(proc, logp, x, z)
    # log-linear schedule: weight -alpha'/(1-alpha) = 1/t exactly, so CE = t * NELBO per sample.
    np.testing.assert_allclose(ce.sum(1), t * nelbo.sum(1), rtol=1e-5)
    assert np.all(np.asarray(nelbo)[np.asarray(z) != MASK] == 0)


def test_mdlm_training_losses_share_the_forward():
    spec_nelbo, spec_ce = FamilySpec("mdlm", vocab_size=V, num_classes=N, mask_id=MASK, bos_id=8), \
        FamilySpec("mdlm_ce", vocab_size=V, num_classes=N, mask_id=MASK, bos_id=8)
    cfg = transformer_config(spec_nelbo, L, d_model=16, num_layers=1, num_heads=2)
    model = Transformer(cfg, rngs=nnx.Rngs(0))
    x, _, _ = _batch(3)
    key = jax.random.key(4)
    l_nelbo, aux = train_loss(spec_nelbo, model, x, key)
    l_ce, aux_ce = train_loss(spec_ce, model, x, key)
    np.testing.assert_allclose(aux["nelbo"], aux_ce["nelbo"], rtol=1e-6)
    np.testing.assert_allclose(l_nelbo, aux["nelbo"], rtol=1e-6)
    assert float(l_ce) < float(l_nelbo)      # CE drops the 1/t >= 1 weight
    np.testing.assert_allclose(train_loss(spec_nelbo, model, x, key, ce_mix=1.0)[0], l_ce,
                               rtol=1e-5)
    np.testing.assert_allclose(train_loss(spec_ce, model, x, key, ce_mix=0.0)[0], l_nelbo,
                               rtol=1e-5)


def test_ar_nll_matches_log_softmax():
    x, logits, _ = _batch(4)
    expected = -np.take_along_axis(np.asarray(jax.nn.log_softmax(logits)), np.asarray(x)[..., None],
                                   -1)[..., 0]
    np.testing.assert_allclose(losses.ar_nll(logits, x), expected, rtol=1e-5)
    np.testing.assert_array_equal(losses.shift_right(x, 8)[:, 0], 8)
    np.testing.assert_array_equal(losses.shift_right(x, 8)[:, 1:], x[:, :-1])


def _fixed_logits_fn(seed):
    table = jax.random.normal(jax.random.key(seed), (V, 2 * L, V))

    def apply_fn(tokens, positions, mask):
        del mask
        return table[tokens, positions]

    return apply_fn


def test_esolm_with_alpha0_one_is_masked_diffusion():
    proc = Process("masked", V, N, mask_id=MASK, alpha0=1.0)
    x, _, t = _batch(5)
    key = jax.random.key(6)
    apply_fn = _fixed_logits_fn(0)
    diff, ar = esolm.nelbo_terms(apply_fn, proc, x, key, t)
    np.testing.assert_array_equal(ar, 0.0)
    z = proc.sample(jax.random.split(key, 4)[0], x, t)
    pos = jnp.broadcast_to(jnp.arange(L), (B, L))
    logp = denoiser_log_probs(proc, apply_fn(z, pos, None), z)
    np.testing.assert_allclose(diff, losses.masked_nelbo(proc, logp, x, z, t), rtol=1e-6)


def test_esolm_ar_part_covers_exactly_the_tokens_left_masked():
    proc = Process("masked", V, N, mask_id=MASK, alpha0=0.5)
    x, _, t = _batch(6)
    diff, ar = esolm.nelbo_terms(_fixed_logits_fn(1), proc, x, jax.random.key(7), t)
    frac = float((np.asarray(ar) > 0).mean())
    assert 0.15 < frac < 0.85
    assert np.all(np.asarray(diff) >= 0) and np.all(np.asarray(ar) >= 0)


def test_esolm_masks_follow_the_clean_first_causal_order():
    clean = jnp.array([[True, False, True, False, True, False]])
    rank = esolm.clean_first_ranks(jax.random.key(0), clean)
    r = np.asarray(rank)[0]
    assert sorted(r.tolist()) == list(range(L))
    assert set(r[np.asarray(clean)[0]].tolist()) == {0, 1, 2}
    m = np.asarray(esolm.diffusion_mask(clean, rank))[0]
    c = np.asarray(clean)[0]
    for i in range(L):
        for j in range(L):
            expected = (i == j) or (c[j] and r[j] <= r[i])
            assert m[i, j] == expected
    ranks_lr = np.asarray(esolm.clean_first_ranks(jax.random.key(1), clean, True))[0]
    np.testing.assert_array_equal(ranks_lr[~c], [3, 4, 5])          # masked: left to right


def test_esolm_ar_queries_do_not_see_their_own_or_later_tokens():
    """Changing the last-ranked token leaves every AR query's output unchanged (no leak)."""
    spec = FamilySpec("esolm", vocab_size=V, num_classes=N, mask_id=MASK, bos_id=8)
    model = Transformer(transformer_config(spec, L, d_model=16, num_layers=2, num_heads=2),
                        rngs=nnx.Rngs(1))
    x = jax.random.randint(jax.random.key(2), (1, L), 0, N)
    clean = jnp.array([[True, False, True, False, False, True]])
    rank = esolm.clean_first_ranks(jax.random.key(3), clean, masked_left_to_right=True)
    mask = esolm.ar_mask(rank)
    pos = jnp.concatenate([jnp.arange(L), jnp.arange(L)])[None]

    def queries(x):
        tokens = jnp.concatenate([x, jnp.full_like(x, MASK)], axis=1)
        return model(tokens, positions=pos, mask=mask)[:, L:]

    last = int(np.argmax(np.asarray(rank)[0]))
    x2 = x.at[0, last].set((x[0, last] + 1) % N)
    np.testing.assert_allclose(queries(x), queries(x2), atol=1e-5)
    first_masked = 1                                   # rank 3: later AR queries depend on it
    x3 = x.at[0, first_masked].set((x[0, first_masked] + 1) % N)
    assert float(jnp.abs(queries(x) - queries(x3)).max()) > 1e-4


def test_bad_family_specs_raise():
    with pytest.raises(ValueError, match="expected one of"):
        FamilySpec("sedd")
    with pytest.raises(ValueError, match="mask slot"):
        FamilySpec("mdlm", vocab_size=258, num_classes=256, mask_id=12)
    with pytest.raises(ValueError, match="eps"):
        FamilySpec("duo", eps=0.0)
    with pytest.raises(ValueError, match="ce_mix"):
        train_loss(FamilySpec("duo", vocab_size=V, num_classes=N, mask_id=MASK, bos_id=8),
                   None, jnp.zeros((2, 3), jnp.int32), jax.random.key(0), ce_mix=1.0)


_masked_proc = Process("masked", V, N, mask_id=MASK)
_uniform_proc = Process("uniform", V, N)


@jax.jit
def _nelbos(x, logits, t, key):
    """Per-token NELBOs of the masked (MDLM) and uniform-state (Duo) processes at times t."""
    zm = _masked_proc.sample(key, x, t)
    zu = _uniform_proc.sample(key, x, t)
    return (losses.masked_nelbo(_masked_proc, denoiser_log_probs(_masked_proc, logits, zm), x, zm,
                                t),
            losses.duo_nelbo(_uniform_proc, denoiser_log_probs(_uniform_proc, logits, zu), x, zu, t))


@settings(max_examples=examples(25), deadline=None)
@given(seed=st.integers(0, 2 ** 31 - 1), scale=st.sampled_from([1e-3, 1.0, 30.0, 1e3]),
       t=st.floats(1e-3, 1.0 - 1e-3))
def test_nelbo_is_nonnegative_and_finite_for_any_denoiser(seed, scale, t):
    """A NELBO is a sum of KL divergences (MDLM Eq. 10; Duo's closed form): >= 0 for every
    denoiser, every time in the sampled range [t_min, 1) and any logit magnitude; zero only on
    positions the process left clean. (Round-off allowance: a few float32 ulps of the term size.)"""
    k1, k2, k3 = jax.random.split(jax.random.key(seed), 3)
    x = jax.random.randint(k1, (B, L), 0, N)
    logits = scale * jax.random.normal(k2, (B, L, V))
    masked, duo = _nelbos(x, logits, jnp.full((B,), t, jnp.float32), k3)
    for nelbo in (masked, duo):
        nelbo = np.asarray(nelbo)
        assert np.all(np.isfinite(nelbo))
        assert nelbo.min() >= -1e-5 * max(1.0, np.abs(nelbo).max())


def test_esolm_is_trained_the_authors_way_and_the_ablation_ours():
    """``esolm``: alpha_0 = 1 and the cross-entropy objective in training (CE x weight = NELBO,
    no AR pass), alpha_0 < 1 only in the sampler; ``esolm_nelbo``: alpha_0 < 1 and its NELBO."""
    kw = dict(vocab_size=V, num_classes=N, mask_id=MASK, bos_id=8, alpha0=0.5)
    paper, ablation = FamilySpec("esolm", **kw), FamilySpec("esolm_nelbo", **kw)
    assert paper.process.alpha0 == 1.0 and paper.sampling_process.alpha0 == 0.5
    assert ablation.process.alpha0 == ablation.sampling_process.alpha0 == 0.5
    assert paper.train_passes == (1,) and ablation.train_passes == (1, 2)
    model = Transformer(transformer_config(paper, L, d_model=16, num_layers=1, num_heads=2),
                        rngs=nnx.Rngs(0))
    x, _, t = _batch(8)
    key = jax.random.key(9)
    ce, nelbo = per_token_terms(paper, model, x, key, t)
    weight = np.asarray(losses.masked_weight(paper.process, t))[:, None]
    np.testing.assert_allclose(np.asarray(ce) * weight, nelbo, rtol=1e-5, atol=1e-7)
    apply_fn = lambda tok, pos, mask: model(tok, positions=pos, mask=mask)  # noqa: E731
    diff, ar = esolm.nelbo_terms(apply_fn, paper.process, x, key, t)
    np.testing.assert_allclose(nelbo, diff, rtol=1e-6)
    np.testing.assert_array_equal(ar, 0.0)
    assert float(np.asarray(ce).sum()) > 0
    train, nelbo_ab = per_token_terms(ablation, model, x, key, t)
    np.testing.assert_array_equal(train, nelbo_ab)
    diff, ar = esolm.nelbo_terms(apply_fn, ablation.process, x, key, t)
    np.testing.assert_allclose(nelbo_ab, diff + ar, rtol=1e-6)
    assert float(np.asarray(ar).sum()) > 0


@pytest.mark.parametrize("name", ["ar", "mdlm", "mdlm_ce", "duo", "esolm", "esolm_nelbo", "gidd"])
@pytest.mark.parametrize("weighting", ["dynamic", "clip"])
def test_training_gradients_are_finite_with_zero_mass_ids(name, weighting):
    """Every family's training objective has a finite gradient when the vocabulary holds ids
    with zero mass in both q_t(. | x) and q_t(. | x_theta) ([BOS] here): the divergences'
    zero-mass terms are exact zeros, not log(0) in a branch that is not taken (whose backward
    pass gives 0 * inf = NaN)."""
    if name != "gidd" and weighting == "clip":
        pytest.skip("the weighting applies to GIDD only")
    spec = FamilySpec(name, vocab_size=V, num_classes=N, mask_id=MASK, bos_id=8,
                      gidd_weighting=weighting)
    graphdef, params = nnx.split(Transformer(
        transformer_config(spec, L, d_model=16, num_layers=1, num_heads=2), rngs=nnx.Rngs(0)))
    x, _, _ = _batch(3)

    def loss(p):
        return train_loss(spec, nnx.merge(graphdef, p), x, jax.random.key(4))[0]

    value, grads = jax.jit(jax.value_and_grad(loss))(params)
    leaves = jax.tree.leaves(grads)
    assert np.isfinite(float(value)) and float(value) > 0
    assert all(np.all(np.isfinite(np.asarray(g))) for g in leaves)
    assert sum(float(jnp.abs(g).sum()) for g in leaves) > 0
