"""Forward processes: marginals, posteriors, rates, antithetic times, continuous vs discrete NELBO."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from algorithms.diffusion_lm import losses
from algorithms.diffusion_lm.processes import Process, antithetic_times, denoiser_log_probs

V, N, MASK = 7, 5, 5  # data ids 0..4, [MASK] = 5, one more special id (6)

PROCESSES = {
    "masked": Process("masked", V, N, mask_id=MASK),
    "eso": Process("masked", V, N, mask_id=MASK, alpha0=0.6),
    "uniform": Process("uniform", V, N),
    "gidd": Process("gidd", V, N, mask_id=MASK, p_uniform=0.3),
}


def _random_probs(key, shape, proc):
    """A random distribution over data ids (what the denoiser outputs)."""
    logits = jax.random.normal(key, shape + (V,)) * 2.0
    return jnp.exp(denoiser_log_probs(proc, logits, jnp.full(shape, MASK)))


@pytest.mark.parametrize("name", list(PROCESSES))
def test_marginal_is_a_distribution_and_prior_mass_is_one_minus_alpha(name):
    proc = PROCESSES[name]
    t = jnp.linspace(0.0, 1.0, 11)
    mass = proc.prior_mass(t)
    np.testing.assert_allclose(mass.sum(-1), 1.0 - proc.alpha(t), atol=1e-6)
    x = jax.nn.one_hot(jnp.arange(11) % N, V)
    q = proc.marginal(x, t)
    np.testing.assert_allclose(q.sum(-1), 1.0, atol=1e-6)
    assert np.all(np.asarray(q) >= 0)
    assert np.all(np.asarray(proc.rate_mass(t[1:-1])) >= -1e-6)


def test_schedules_match_the_papers():
    t = jnp.array([0.0, 0.25, 1.0])
    t64 = np.asarray(t, np.float64)  # the schedule in float64: alpha_1 = 1e-3 to float32's digits
    np.testing.assert_allclose(PROCESSES["masked"].alpha(t), 1 - (1 - 1e-3) * t64, rtol=1e-6)
    np.testing.assert_allclose(PROCESSES["eso"].alpha(t), 0.6 * (1 - (1 - 1e-3) * t64), rtol=1e-6)
    np.testing.assert_allclose(PROCESSES["masked"].beta(t), (1 - 1e-3) * t64, rtol=1e-6)
    np.testing.assert_allclose(PROCESSES["masked"].alpha_prime(t), -(1 - 1e-3), rtol=1e-6)
    # GIDD: uniform share at t = 1/2 is p_u.
    gidd = PROCESSES["gidd"]
    mass = gidd.prior_mass(jnp.array(0.5))
    np.testing.assert_allclose(mass[:N].sum(), 0.3, rtol=1e-5)
    np.testing.assert_allclose(PROCESSES["uniform"].sigma(t), -np.log(1 - (1 - 1e-3) * t),
                               rtol=1e-5)


@pytest.mark.parametrize("name", list(PROCESSES))
@pytest.mark.parametrize("use_model", [False, True])
def test_posterior_sums_to_one_and_marginalises(name, use_model):
    """sum_z q(z_s | z, x) q_t(z | x) = q_s(z_s | x), for one-hot x and for a model's x_theta."""
    proc = PROCESSES[name]
    s, t = 0.3, 0.7
    key = jax.random.key(0)
    x = (_random_probs(key, (3,), proc) if use_model
         else jax.nn.one_hot(jnp.array([0, 2, 4]), V))
    zs = jnp.arange(V)
    post = proc.posterior(zs[None, :].repeat(3, 0), x[:, None, :], s, t)   # [3, V(z_t), V(z_s)]
    q_t = proc.marginal(x, t)                                                 # [3, V]
    support = np.asarray(q_t) > 0
    np.testing.assert_allclose(np.asarray(post.sum(-1))[support], 1.0, atol=1e-5)
    mixed = jnp.einsum("bz,bzs->bs", q_t, post)
    np.testing.assert_allclose(mixed, proc.marginal(x, s), atol=1e-5)


def test_masked_posterior_is_mdlm_and_carries_over():
    proc = PROCESSES["masked"]
    s, t = 0.2, 0.6
    x_theta = _random_probs(jax.random.key(1), (), proc)
    post = proc.posterior(jnp.array(MASK), x_theta, s, t)
    a_s, a_t = proc.alpha(s), proc.alpha(t)
    expected = ((a_s - a_t) * x_theta + (1 - a_s) * jax.nn.one_hot(MASK, V)) / (1 - a_t)
    np.testing.assert_allclose(post, expected, atol=1e-6)
    post = proc.posterior(jnp.array(3), jax.nn.one_hot(3, V), s, t)
    np.testing.assert_allclose(post, jax.nn.one_hot(3, V), atol=1e-7)


def test_gidd_without_uniform_is_masked_diffusion():
    gidd = Process("gidd", V, N, mask_id=MASK, p_uniform=0.0)
    masked = PROCESSES["masked"]
    t = jnp.linspace(0.01, 0.99, 7)
    np.testing.assert_allclose(gidd.alpha(t), masked.alpha(t), rtol=1e-6)
    np.testing.assert_allclose(gidd.prior_mass(t), masked.prior_mass(t), atol=1e-7)
    key = jax.random.key(3)
    x = jax.random.randint(key, (4, 6), 0, N)
    z = masked.sample(jax.random.key(4), x, t[:4])
    logits = jax.random.normal(key, (4, 6, V))
    tt = t[:4]
    a = losses.mixing_nelbo(gidd, denoiser_log_probs(gidd, logits, z), x, z, tt)
    b = losses.masked_nelbo(masked, denoiser_log_probs(masked, logits, z), x, z, tt)
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


def test_antithetic_times_are_stratified():
    b = 16
    t = np.asarray(antithetic_times(jax.random.key(5), b, t_min=0.1, t_max=0.9))
    strata = np.floor((t - 0.1) / 0.8 * b).astype(int)
    assert sorted(strata.tolist()) == list(range(b))
    assert t.min() >= 0.1 and t.max() <= 0.9


@pytest.mark.parametrize("name", list(PROCESSES))
@pytest.mark.parametrize("t", [0.0, 0.05, 0.5, 0.93, 1.0])
def test_sample_matches_marginal_frequencies(name, t):
    """Empirical frequencies of z_t equal q_t(. | x) within 5 binomial standard errors
    (plus one count), ids of zero mass never drawn."""
    proc = PROCESSES[name]
    n = 40_000
    x = jnp.full((n // 8, 8), 2)
    z = np.asarray(proc.sample(jax.random.key(6), x, jnp.full((n // 8,), t))).ravel()
    freq = np.bincount(z, minlength=V) / n
    q = np.asarray(proc.marginal(jax.nn.one_hot(2, V), t), np.float64)
    assert np.all(np.abs(freq - q) <= 5 * np.sqrt(q * (1 - q) / n) + 1 / n), (freq, q)
    assert np.all(freq[q == 0] == 0)


def _discrete_and_continuous(proc, x, table, t_min, num_steps, num_quad):
    """Exact (over z) discrete-time KL sum over T steps and the continuous-time NELBO integral for a
    single token x and a denoiser x_theta(z) = table[z] (no time dependence)."""
    zs = jnp.arange(V)
    onehot = jax.nn.one_hot(x, V)

    def kl_sum(t_grid):
        s_, t_ = t_grid[:-1], t_grid[1:]
        q_t = proc.marginal(onehot, t_)                                          # [T, V]
        post_x = proc.posterior(zs[None].repeat(t_.size, 0), onehot, s_[:, None], t_[:, None])
        post_m = proc.posterior(zs[None].repeat(t_.size, 0), table[None], s_[:, None], t_[:, None])
        kl = jnp.sum(jnp.where(post_x > 0, post_x * (jnp.log(jnp.where(post_x > 0, post_x, 1))
                                                     - jnp.log(jnp.clip(post_m, 1e-30))), 0), -1)
        return float(np.sum(np.asarray(q_t * kl, np.float64)))

    disc = kl_sum(jnp.linspace(t_min, 1.0, num_steps + 1))
    # Continuous: midpoint rule of E_z[integrand] with x_theta(z) = table[z].
    edges = np.linspace(t_min, 1.0, num_quad + 1)
    tq = jnp.asarray((edges[:-1] + edges[1:]) / 2, jnp.float32)
    z_all = jnp.broadcast_to(zs, (tq.size, V))
    log_table = jnp.log(jnp.clip(table, 1e-30))[None].repeat(tq.size, 0)        # [T, V, V]
    xx = jnp.full((tq.size, V), x)
    integrand = losses.mixing_nelbo(proc, log_table, xx, z_all, tq)              # [T, V]
    q_t = proc.marginal(onehot, tq)
    cont = float(np.sum(np.asarray(q_t * integrand, np.float64)) * (edges[1] - edges[0]))
    return disc, cont


@pytest.mark.parametrize("name", ["masked", "uniform", "gidd"])
def test_discrete_kl_sum_approaches_continuous_nelbo(name):
    proc = PROCESSES[name]
    key = jax.random.key(7)
    table = _random_probs(key, (V,), proc)                        # x_theta as a function of z
    if proc.kind == "masked":                                     # carry-over of unmasked tokens
        table = jnp.where((jnp.arange(V) < N)[:, None], jnp.eye(V), table)
    # t_min > 0 keeps the quadrature away from GIDD's sqrt(t) kink at t = 0.
    t_min = 1e-2
    coarse, cont = _discrete_and_continuous(proc, 1, table, t_min, 8, 2000)
    fine, _ = _discrete_and_continuous(proc, 1, table, t_min, 512, 2000)
    assert cont > 0.1
    assert abs(fine - cont) < 0.02 * cont, (fine, cont)
    if proc.kind == "masked":
        # With x_theta independent of t, masked diffusion's discrete NELBO does not depend on T.
        assert abs(coarse - cont) < 1e-4 * cont, (coarse, cont)
    else:
        assert abs(fine - cont) < 0.2 * abs(coarse - cont), (coarse, fine, cont)


def test_bad_processes_raise():
    with pytest.raises(ValueError, match="mask slot"):
        Process("masked", V, N, mask_id=None)
    with pytest.raises(ValueError, match="mask slot"):
        Process("masked", 5, 5, mask_id=5)          # vocabulary without a mask slot
    with pytest.raises(ValueError, match="mask slot"):
        Process("gidd", V, N, mask_id=2)            # a data id is not a mask slot
    for eps in (0.0, 1.0, -0.1, 1.5):
        with pytest.raises(ValueError, match="eps"):
            Process("uniform", V, N, eps=eps)
    with pytest.raises(ValueError, match="alpha0"):
        Process("masked", V, N, mask_id=MASK, alpha0=0.0)
    with pytest.raises(ValueError, match="p_uniform"):
        Process("gidd", V, N, mask_id=MASK, p_uniform=1.0)
    with pytest.raises(ValueError, match="batch_size"):
        antithetic_times(jax.random.key(0), 0)
    chex.assert_shape(PROCESSES["masked"].prior_mass(jnp.zeros((2, 3))), (2, 3, V))
