"""Every process on the whole time interval it accepts, [0, 1]: rates and per-token NELBOs are >= 0
everywhere and finite where promised (all of [0, 1] except GIDD's t = 0), for every family, and a
time outside [0, 1] is refused."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from algorithms.diffusion_lm import losses
from algorithms.diffusion_lm.families import (
    FAMILIES,
    FamilySpec,
    per_token_terms,
    transformer_config,
)
from algorithms.diffusion_lm.processes import Process, denoiser_log_probs
from models.transformer import Transformer

V, N, MASK, BOS = 8, 6, 6, 7
B, L = 2, 6
T_MIN = 1e-3
# Both ends, the sampled range's floor, the interior, and the corner where GIDD's old
# sqrt(t (1 - t)) schedule made the data-token rate and the NELBO negative.
T_GRID = np.array([0.0, 1e-7, T_MIN, 0.01, 0.25, 0.5, 0.9, 0.999, 0.9992, 0.9995, 0.9999, 1.0],
                  np.float32)

PROCESSES = {
    "masked": Process("masked", V, N, mask_id=MASK),
    "eso": Process("masked", V, N, mask_id=MASK, alpha0=0.5),
    "uniform": Process("uniform", V, N),
    "gidd": Process("gidd", V, N, mask_id=MASK, p_uniform=0.1),
    "gidd_heavy": Process("gidd", V, N, mask_id=MASK, p_uniform=0.9),
}


def _finite_where_promised(proc: Process) -> np.ndarray:
    return T_GRID > 0 if proc.kind == "gidd" and proc.p_uniform > 0 else np.ones_like(T_GRID, bool)


@pytest.mark.parametrize("name", list(PROCESSES))
def test_rates_are_nonnegative_and_alpha_decreases_on_all_of_0_1(name):
    proc = PROCESSES[name]
    t = jnp.asarray(T_GRID)
    rate = np.asarray(proc.rate_mass(t))
    assert not np.any(np.isnan(rate))
    assert np.all(rate >= 0), (name, T_GRID[np.any(rate < 0, -1)])
    assert np.all(np.isfinite(rate[_finite_where_promised(proc)]))
    if proc.kind == "gidd":  # only the data-id rate is singular, and only at t = 0
        assert np.isposinf(rate[0, :N]).all() and np.isfinite(rate[0, N:]).all()
    alpha, dalpha = np.asarray(proc.alpha(t)), np.asarray(proc.alpha_prime(t))
    assert np.all(np.diff(alpha) <= 0) and np.all(dalpha < 0)
    assert np.all((alpha > 0) & (alpha <= 1)) and np.all(np.isfinite(np.asarray(proc.sigma(t))))
    q = np.asarray(proc.marginal(jax.nn.one_hot(jnp.arange(T_GRID.size) % N, V), t))
    assert np.all(q >= 0) and np.allclose(q.sum(-1), 1.0, atol=1e-6)


@pytest.mark.parametrize("name", list(PROCESSES))
def test_closed_form_rates_equal_the_derivative_of_the_schedule(name):
    """``g_t = d/dt(beta_t pi_t) - (alpha'_t / alpha_t) beta_t pi_t`` by autodiff, in the interior."""
    proc = PROCESSES[name]
    t = jnp.linspace(0.02, 0.98, 9)
    mass, dmass = jax.jvp(proc.prior_mass, (t,), (jnp.ones_like(t),))
    dalpha = jax.jvp(proc.alpha, (t,), (jnp.ones_like(t),))[1]
    np.testing.assert_allclose(proc.alpha_prime(t), dalpha, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(proc.rate_mass(t), dmass - (dalpha / proc.alpha(t))[:, None] * mass,
                               rtol=1e-4, atol=1e-5)


def test_gidd_issue_corner_is_nonnegative():
    """vocab 6, [MASK] = 5, p_u = 0.1: the old schedule gave rate -0.09 at t = 0.9992, NELBO
    -1218 at t = 0.9999 and nan at t = 1."""
    proc = Process("gidd", 6, 5, mask_id=5, p_uniform=0.1)
    t = jnp.array([0.9992, 0.9999, 1.0])
    assert np.all(np.asarray(proc.rate_mass(t)) >= 0)
    logits = jax.random.normal(jax.random.key(0), (3, 4, 6)) * 3.0
    x = jax.random.randint(jax.random.key(1), (3, 4), 0, 5)
    z = proc.sample(jax.random.key(2), x, t)
    nelbo = np.asarray(losses.mixing_nelbo(proc, denoiser_log_probs(proc, logits, z), x, z, t))
    assert np.all(np.isfinite(nelbo)) and np.all(nelbo >= 0)


@pytest.mark.parametrize("name", list(PROCESSES))
def test_per_token_nelbo_on_the_grid(name):
    proc = PROCESSES[name]
    k1, k2, k3 = jax.random.split(jax.random.key(3), 3)
    n = T_GRID.size
    x = jax.random.randint(k1, (n, 16), 0, N)
    logits = 2.0 * jax.random.normal(k2, (n, 16, V))
    t = jnp.asarray(T_GRID)
    z = proc.sample(k3, x, t)
    logp = denoiser_log_probs(proc, logits, z)
    values = [losses.mixing_nelbo(proc, logp, x, z, t)]
    if proc.kind == "masked" and proc.alpha0 == 1.0:
        values.append(losses.masked_nelbo(proc, logp, x, z, t))
    if proc.kind == "uniform":
        values.append(losses.duo_nelbo(proc, logp, x, z, t))
    ok = _finite_where_promised(proc)
    for v in values:
        v = np.asarray(v)
        assert not np.any(np.isnan(v))
        assert v.min() >= -1e-5 * max(1.0, np.abs(v[ok]).max())
        assert np.all(np.isfinite(v[ok]))
    # a perfect denoiser pays nothing, wherever the rate is finite or not (exactly one-hot: one
    # off by e^-50 pays e^-50 times GIDD's infinite rate at t = 0)
    perfect = denoiser_log_probs(proc, jnp.where(jax.nn.one_hot(x, V) > 0, 0.0, -jnp.inf), z)
    v = np.asarray(losses.mixing_nelbo(proc, perfect, x, z, t))
    assert np.all(np.isfinite(v)) and np.all(np.abs(v) < 1e-3)


@pytest.mark.parametrize("family", FAMILIES)
def test_every_family_on_the_grid(family):
    """``families.per_token_terms`` (training and NELBO integrands) for a random model."""
    spec = FamilySpec(family, vocab_size=V, num_classes=N, mask_id=MASK, bos_id=BOS,
                      alpha0=0.5, p_uniform=0.1, t_min=T_MIN)
    model = Transformer(transformer_config(spec, L, d_model=16, num_layers=1, num_heads=2),
                        rngs=nnx.Rngs(0))
    n = T_GRID.size
    x = jax.random.randint(jax.random.key(4), (n, L), 0, N)
    train, nelbo = per_token_terms(spec, model, x, jax.random.key(5), jnp.asarray(T_GRID))
    ok = T_GRID > 0 if family == "gidd" else np.ones(n, bool)
    for v in (np.asarray(train), np.asarray(nelbo)):
        assert not np.any(np.isnan(v)), family
        assert v.min() >= -1e-5 * max(1.0, np.abs(v[ok]).max()), family
        assert np.all(np.isfinite(v[ok])), family


def test_times_outside_0_1_are_refused():
    proc = PROCESSES["gidd"]
    for bad in (-1e-6, 1.0001, float("nan")):
        with pytest.raises(ValueError, match=r"times must lie in \[0, 1\]"):
            proc.alpha(jnp.array([0.5, bad]))
    with pytest.raises(ValueError, match="rate_mass"):
        proc.rate_mass(1.5)
    x = jnp.zeros((1, 3), jnp.int32)
    with pytest.raises(ValueError, match="sample"):
        proc.sample(jax.random.key(0), x, jnp.array([2.0]))
    with pytest.raises(ValueError, match="t_min"):
        FamilySpec("mdlm", t_min=0.0)
