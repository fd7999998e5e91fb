"""Malliavin derivatives by autodiff against closed forms; Clark-Ocone variance against Monte Carlo."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from algorithms.spf import baselines as B
from algorithms.spf import malliavin as ML


def _dW(seed, n, d, dt):
    return jnp.asarray(np.random.default_rng(seed).standard_normal((n, d)) * math.sqrt(dt), jnp.float32)


def test_ou_malliavin_derivative_closed_form():
    # dX = -kappa X dt + sigma dW: D_s X_T = sigma exp(-kappa (T - s)) (Euler: sigma (1 - kappa dt)^(N-1-k)).
    kappa, sigma, N, dt = 1.5, 0.7, 200, 0.01
    dW = _dW(0, N, 1, dt)
    D = ML.malliavin_derivative(lambda x, t: -kappa * x, lambda x, t: sigma * jnp.ones_like(x),
                                jnp.array([0.3]), dW, dt)[0, :, 0]
    k = np.arange(N)
    np.testing.assert_allclose(np.asarray(D), sigma * (1 - kappa * dt) ** (N - 1 - k), rtol=1e-4)
    s = k * dt
    np.testing.assert_allclose(np.asarray(D), sigma * np.exp(-kappa * (N * dt - s)), rtol=0.03)
    # Clark-Ocone + Ito isometry: Var X_T = int_0^T D_s^2 ds (deterministic D); compare the continuum
    var = float(ML.clark_ocone_variance(D[None, :, None], dt)[0])
    T = N * dt
    np.testing.assert_allclose(var, sigma ** 2 * (1 - math.exp(-2 * kappa * T)) / (2 * kappa), rtol=0.03)


def test_gbm_malliavin_derivative_closed_form():
    # dX = mu X dt + sigma X dW: D_s X_T = sigma X_T; Euler: sigma X_N / (1 + mu dt + sigma dW_k).
    mu, sigma, N, dt = 0.1, 0.4, 400, 0.0025
    dW = _dW(1, N, 2, dt)
    drift, diff = (lambda x, t: mu * x), (lambda x, t: sigma * x)
    x0 = jnp.array([1.0, 2.0])
    D = ML.malliavin_derivative(drift, diff, x0, dW, dt)
    XN = ML.euler_maruyama(drift, diff, x0, dW, dt)[-1]
    exact = sigma * XN[:, None] / (1 + mu * dt + sigma * dW.T)
    np.testing.assert_allclose(np.asarray(D[[0, 1], :, [0, 1]]), np.asarray(exact), rtol=1e-4)
    np.testing.assert_allclose(np.asarray(D[0, :, 1]), 0.0, atol=1e-7)  # coordinates are independent
    # continuum limit: each factor 1 / (1 + O(sqrt(dt))) deviates by a few percent, the average by less
    np.testing.assert_allclose(np.asarray(D[0, :, 0]), sigma * float(XN[0]), rtol=0.1)
    np.testing.assert_allclose(float(D[0, :, 0].mean()), sigma * float(XN[0]), rtol=0.01)


def test_clark_ocone_variance_matches_monte_carlo_for_ou():
    kappa, sigma, N, dt, n = 2.0, 1.0, 50, 0.02, 4000
    drift, diff = (lambda x, t: -kappa * x), (lambda x, t: sigma * jnp.ones_like(x))
    dWs = _dW(2, n * N, 1, dt).reshape(n, N, 1)
    XT = jax.vmap(lambda w: ML.euler_maruyama(drift, diff, jnp.array([1.0]), w, dt)[-1, 0])(dWs)
    D = ML.malliavin_derivative(drift, diff, jnp.array([1.0]), dWs[0], dt)
    var = float(ML.clark_ocone_variance(D, dt)[0])
    mc = float(jnp.var(XT))
    assert abs(mc - var) < 4 * var * math.sqrt(2 / n), (mc, var)
    # and the mean is the deterministic part of the representation, E X_T = (1 - kappa dt)^N x0
    assert abs(float(XT.mean()) - (1 - kappa * dt) ** N) < 4 * math.sqrt(var / n)


def test_noise_sensitivity_gives_sgd_variance_given_the_design():
    # SGD on least squares is linear in y = A theta + noise * eps, so Var(x_T | A) = |d x_T / d eps|^2.
    T, M, d, noise, eta, n = 20, 3, 4, 0.5, 0.1, 3000
    rng = np.random.default_rng(3)
    A = jnp.asarray(rng.standard_normal((T, M, d)), jnp.float32)
    theta = jnp.asarray(rng.standard_normal((T, d)), jnp.float32)
    signal = jnp.einsum("tmd,td->tm", A, theta)
    cfg = B.SGDConfig(step=eta)
    rollout = lambda eps: B.sgd(A, signal + noise * eps, jnp.zeros(d), "lsq", cfg)[-1]
    eps0 = jnp.asarray(rng.standard_normal((T, M)), jnp.float32)
    D = ML.noise_sensitivity(rollout, eps0)
    assert D.shape == (d, T, M)
    predicted = np.sum(np.asarray(D) ** 2, axis=(1, 2))  # D already carries the noise scale
    eps = jnp.asarray(rng.standard_normal((n, T, M)), jnp.float32)
    mc = np.var(np.asarray(jax.vmap(rollout)(eps)), axis=0)
    np.testing.assert_allclose(mc, predicted, rtol=4 * math.sqrt(2 / n))
    # the newest observation enters with weight eta * a / M; older ones are contracted
    np.testing.assert_allclose(np.asarray(D[:, -1, :]), eta * noise * np.asarray(A[-1]).T / M, rtol=1e-5)


def test_bad_inputs_raise():
    f = lambda x, t: x
    with pytest.raises(ValueError):
        ML.euler_maruyama(f, f, jnp.zeros(2), jnp.zeros((5, 3)), 0.1)
    with pytest.raises(ValueError):
        ML.euler_maruyama(f, f, jnp.zeros(2), jnp.zeros((5, 2)), 0.0)
