"""Drifting problems: sample losses, gradients, HVPs, optimum paths and exact population risk."""

import math

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from algorithms.spf import problems as P


def _batch(kind, key, m=6, d=5):
    ka, kx, ky, kv = jax.random.split(key, 4)
    A = jax.random.normal(ka, (m, d))
    x = 0.7 * jax.random.normal(kx, (d,))
    v = jax.random.normal(kv, (d,))
    if kind == "lsq":
        y = jax.random.normal(ky, (m,))
    else:
        y = jax.random.bernoulli(ky, 0.4, (m,)).astype(jnp.float32)
    return x, A, y, v


@pytest.mark.parametrize("kind", P.KINDS)
def test_gradient_and_hvp_match_finite_differences(kind):
    x, A, y, v = _batch(kind, jax.random.key(0))
    loss = jax.jit(lambda z: P.sample_loss(kind, z, A, y))
    g = P.sample_grad(kind, x, A, y)
    chex.assert_trees_all_close(g, jax.grad(loss)(x), rtol=1e-5, atol=1e-6)
    h = 1e-2
    fd = np.array([(loss(x + h * e) - loss(x - h * e)) / (2 * h) for e in np.eye(x.size)])
    np.testing.assert_allclose(np.asarray(g), fd, rtol=2e-3, atol=2e-4)
    hv = P.sample_hvp(kind, x, A, y, v)
    fd_hv = (P.sample_grad(kind, x + h * v, A, y) - P.sample_grad(kind, x - h * v, A, y)) / (2 * h)
    np.testing.assert_allclose(np.asarray(hv), np.asarray(fd_hv), rtol=5e-3, atol=5e-4)
    # and against the autodiff Hessian-vector product
    hv_ad = jax.jvp(jax.grad(loss), (x,), (v,))[1]
    chex.assert_trees_all_close(hv, hv_ad, rtol=1e-4, atol=1e-5)


def test_gauss_hermite_exact_on_polynomials():
    # E[(s Z)^2] = s^2, E[(s Z)^4] = 3 s^4.
    s = jnp.array([0.5, 2.0])
    np.testing.assert_allclose(P.gaussian_expectation(lambda z: z ** 2, s), [0.25, 4.0], rtol=1e-5)
    np.testing.assert_allclose(P.gaussian_expectation(lambda z: z ** 4, s), [3 * 0.5 ** 4, 48.0],
                               rtol=1e-4)


def test_logistic_excess_risk_matches_monte_carlo():
    d, n = 4, 400_000
    theta = jnp.array([1.0, -0.5, 0.3, 0.8])
    x = jnp.array([0.4, 0.2, -0.6, 1.5])
    rng = np.random.default_rng(1)
    a = jnp.asarray(rng.standard_normal((n, d)), jnp.float32)
    y = jnp.asarray(rng.random(n) < np.asarray(jax.nn.sigmoid(a @ theta)), jnp.float32)
    per = (jax.nn.softplus(a @ x) - y * (a @ x)) - (jax.nn.softplus(a @ theta) - y * (a @ theta))
    mc, se = float(per.mean()), float(per.std() / math.sqrt(n))
    exact = float(P.excess_risk("logistic", x, theta))
    assert exact > 0
    assert abs(exact - mc) < 4 * se + 1e-4, (exact, mc, se)
    # the population risk itself, not just the difference
    risk_mc = float((jax.nn.softplus(a @ x) - y * (a @ x)).mean())
    assert abs(float(P.logistic_population_risk(x, theta)) - risk_mc) < 0.01


def test_excess_risk_zero_at_optimum_and_positive_elsewhere():
    theta = jnp.array([[0.5, -1.0, 2.0], [0.0, 0.3, 0.1]])
    for kind in P.KINDS:
        np.testing.assert_allclose(P.excess_risk(kind, theta, theta), 0.0, atol=1e-6)
        assert np.all(np.asarray(P.excess_risk(kind, theta + 0.3, theta)) > 0)
    np.testing.assert_allclose(P.excess_risk("lsq", theta + 0.5, theta), [0.375, 0.375], rtol=1e-6)


def test_lsq_population_risk_matches_monte_carlo():
    pr = P.Problem(kind="lsq", drift="sinusoid", dim=3, batch=50_000, steps=1, noise=0.7)
    ep = P.sample_episode(jax.random.key(2), pr)
    x = ep.theta[0] + jnp.array([0.3, -0.2, 0.5])
    emp = float(P.sample_loss("lsq", x, ep.A[0], ep.y[0]))
    exact = float(P.excess_risk("lsq", x, ep.theta[0])) + 0.5 * 0.7 ** 2
    assert abs(emp - exact) < 0.02


def test_rotation_preserves_pair_norms_and_ou_is_ar1():
    pr = P.Problem(drift="rotation", dim=7, steps=50, dt=0.1)
    th = np.asarray(P.theta_path(jax.random.key(3), pr))
    pair_norms = th[:, 0:6:2] ** 2 + th[:, 1:6:2] ** 2
    np.testing.assert_allclose(pair_norms, np.broadcast_to(pair_norms[0], pair_norms.shape), rtol=1e-4)
    np.testing.assert_allclose(th[:, 6], th[0, 6])  # odd last coordinate stays put
    assert np.abs(np.diff(th, axis=0)).max() > 1e-3  # it does move
    ou = P.Problem(drift="ou", dim=400, steps=200, dt=0.1, ou_kappa=0.5, ou_sigma=0.8)
    th = np.asarray(P.theta_path(jax.random.key(4), ou))
    stat_var = 0.8 ** 2 / (2 * 0.5)
    np.testing.assert_allclose(th.var(), stat_var, rtol=0.1)
    lag1 = (th[1:] * th[:-1]).mean() / (th ** 2).mean()
    np.testing.assert_allclose(lag1, ou.ou_phi, atol=0.02)


def test_episode_shapes_and_lsq_noise():
    pr = P.Problem(kind="lsq", dim=3, batch=4, steps=6, noise=0.25)
    ep = P.sample_episodes(jax.random.key(5), pr, 2)
    chex.assert_shape(ep.theta, (2, 6, 3))
    chex.assert_shape(ep.A, (2, 6, 4, 3))
    chex.assert_shape(ep.y, (2, 6, 4))
    resid = ep.y - jnp.einsum("etmd,etd->etm", ep.A, ep.theta)
    chex.assert_trees_all_close(resid, 0.25 * ep.eps, atol=1e-5)


@pytest.mark.parametrize("kwargs", [dict(noise=-0.1), dict(dt=0.0), dict(dim=0), dict(kind="huber"),
                                    dict(drift="jump"), dict(omega_min=2.0, omega_max=1.0),
                                    dict(ou_kappa=0.0), dict(ou_sigma=-1.0)])
def test_bad_problem_raises(kwargs):
    with pytest.raises(ValueError):
        P.Problem(**kwargs)


def test_check_stream_rejects_mismatched_dimensions():
    A, y = jnp.zeros((5, 3, 2)), jnp.zeros((5, 3))
    assert P.check_stream(A, y, jnp.zeros(2)) == (5, 3, 2)
    with pytest.raises(ValueError, match="y has shape"):
        P.check_stream(A, jnp.zeros((5, 4)))
    with pytest.raises(ValueError, match="x0"):
        P.check_stream(A, y, jnp.zeros(3))
    with pytest.raises(ValueError, match="expected A"):
        P.check_stream(jnp.zeros((5, 2)), y)
