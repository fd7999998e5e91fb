"""Online baselines: Kalman filter by hand, RLS against batch least squares, SGD / PC identities."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from algorithms.spf import baselines as B


def test_kalman_two_step_scalar_by_hand():
    phi, q, r, p0 = 0.8, 0.3, 0.5, 2.0
    a = np.array([1.5, -0.7])
    y = np.array([0.9, 0.4])
    # step 0: prior N(0, p0)
    s0 = a[0] ** 2 * p0 + r ** 2
    k0 = p0 * a[0] / s0
    x0 = k0 * y[0]
    P0 = p0 - k0 ** 2 * s0
    # step 1: predict, then update
    pp = phi ** 2 * P0 + q
    xp = phi * x0
    s1 = a[1] ** 2 * pp + r ** 2
    k1 = pp * a[1] / s1
    x1 = xp + k1 * (y[1] - a[1] * xp)
    P1 = pp - k1 ** 2 * s1
    X, trP = B.kalman(jnp.asarray(a, jnp.float32).reshape(2, 1, 1), jnp.asarray(y, jnp.float32)[:, None],
                      jnp.zeros(1), B.KalmanConfig(phi=phi, q=q, noise=r, init_var=p0))
    np.testing.assert_allclose(np.asarray(X)[:, 0], [x0, x1], rtol=1e-5)
    np.testing.assert_allclose(np.asarray(trP), [P0, P1], rtol=1e-5)


def test_kalman_matches_batch_gaussian_posterior():
    # theta_{0:T-1} is jointly Gaussian; the filter's last mean is the batch posterior mean of theta_{T-1}.
    T, M, d, phi, q, r, p0 = 3, 2, 2, 0.9, 0.2, 0.4, 1.5
    rng = np.random.default_rng(0)
    A = rng.standard_normal((T, M, d))
    y = rng.standard_normal((T, M))
    # prior covariance of the stacked state (block k, l) = phi^|k-l| Var_min(k,l) I
    var = [p0]
    for _ in range(T - 1):
        var.append(phi ** 2 * var[-1] + q)
    C = np.zeros((T * d, T * d))
    for k in range(T):
        for l in range(T):
            C[k * d:(k + 1) * d, l * d:(l + 1) * d] = phi ** abs(k - l) * var[min(k, l)] * np.eye(d)
    H = np.zeros((T * M, T * d))
    for k in range(T):
        H[k * M:(k + 1) * M, k * d:(k + 1) * d] = A[k]
    S = H @ C @ H.T + r ** 2 * np.eye(T * M)
    post_mean = C @ H.T @ np.linalg.solve(S, y.reshape(-1))
    post_cov = C - C @ H.T @ np.linalg.solve(S, H @ C)
    X, trP = B.kalman(jnp.asarray(A, jnp.float32), jnp.asarray(y, jnp.float32), jnp.zeros(d),
                      B.KalmanConfig(phi=phi, q=q, noise=r, init_var=p0))
    np.testing.assert_allclose(np.asarray(X[-1]), post_mean[-d:], rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(float(trP[-1]), np.trace(post_cov[-d:, -d:]), rtol=1e-4)


def test_rls_without_forgetting_is_ridge_least_squares():
    T, M, d, c = 6, 3, 4, 100.0
    rng = np.random.default_rng(1)
    A = rng.standard_normal((T, M, d))
    y = rng.standard_normal((T, M))
    X = B.rls(jnp.asarray(A, jnp.float32), jnp.asarray(y, jnp.float32), jnp.zeros(d),
              B.RLSConfig(forgetting=1.0, init_scale=c))
    Af, yf = A.reshape(-1, d), y.reshape(-1)
    ridge = np.linalg.solve(Af.T @ Af + np.eye(d) / c, Af.T @ yf)
    np.testing.assert_allclose(np.asarray(X[-1]), ridge, rtol=1e-3, atol=1e-4)


def _stream(kind, T=7, M=3, d=4, seed=2):
    rng = np.random.default_rng(seed)
    A = jnp.asarray(rng.standard_normal((T, M, d)), jnp.float32)
    y = rng.standard_normal((T, M)) if kind == "lsq" else rng.random((T, M)) < 0.5
    return A, jnp.asarray(y, jnp.float32), jnp.asarray(rng.standard_normal(d), jnp.float32)


@pytest.mark.parametrize("kind", ["lsq", "logistic"])
def test_sgd_steps_and_pc_without_prediction(kind):
    A, y, x0 = _stream(kind)
    eta = 0.1
    X = B.sgd(A, y, x0, kind, B.SGDConfig(step=eta))
    x = np.asarray(x0, np.float64)
    for k in range(A.shape[0]):
        a, b = np.asarray(A[k], np.float64), np.asarray(y[k], np.float64)
        z = a @ x
        r = z - b if kind == "lsq" else 1 / (1 + np.exp(-z)) - b
        x = x - eta * a.T @ r / a.shape[0]
        np.testing.assert_allclose(np.asarray(X[k]), x, rtol=1e-4, atol=1e-5)
    # prediction-correction with no prediction is SGD
    Xpc = B.prediction_correction(A, y, x0, kind, B.PCConfig(step=eta, pred_weight=0.0))
    chex.assert_trees_all_close(Xpc, X, rtol=1e-5, atol=1e-6)
    # decay: the step at k is eta / (1 + k / k0)^p
    Xd = B.sgd(A, y, x0, kind, B.SGDConfig(step=eta, decay_power=1.0, decay_offset=1.0))
    chex.assert_trees_all_close(Xd[0], X[0], rtol=1e-6)
    g1 = (X[1] - X[0]) / -eta
    chex.assert_trees_all_close(Xd[1] - Xd[0], -eta / 2 * jax.grad(
        lambda z: jnp.mean(0.5 * (A[1] @ z - y[1]) ** 2) if kind == "lsq" else
        jnp.mean(jax.nn.softplus(A[1] @ z) - y[1] * (A[1] @ z)))(Xd[0]), rtol=1e-4, atol=1e-6)
    del g1


def test_prediction_recovers_linear_motion_when_noiseless():
    # Full-rank, noiseless, identical designs: c = H (theta_{k-1} - theta_k), so the exact Newton step
    # moves the decision by exactly the optimum's displacement. With a negligible correction step the
    # decision, started at theta_0, follows the path with a constant one-step lag: X_k = theta_{k-1}.
    T, M, d = 6, 8, 3
    rng = np.random.default_rng(3)
    a = rng.standard_normal((M, d))
    A = np.broadcast_to(a, (T, M, d))
    theta = np.array([0.5, -1.0, 0.2]) + np.arange(T)[:, None] * np.array([0.1, 0.05, -0.2])
    y = np.einsum("tmd,td->tm", A, theta)
    lam_max = np.linalg.eigvalsh(a.T @ a / M).max()
    cfg = B.PCConfig(step=1e-6, pred_iters=400, pred_lr=1.0 / lam_max)
    X = B.prediction_correction(jnp.asarray(A, jnp.float32), jnp.asarray(y, jnp.float32),
                                jnp.asarray(theta[0], jnp.float32), "lsq", cfg)
    np.testing.assert_allclose(np.asarray(X[1:]), theta[:-1], atol=2e-3)
    Xsgd = B.sgd(jnp.asarray(A, jnp.float32), jnp.asarray(y, jnp.float32),
                 jnp.asarray(theta[0], jnp.float32), "lsq", B.SGDConfig(step=1e-6))
    np.testing.assert_allclose(np.asarray(Xsgd[-1]), theta[0], atol=1e-4)  # without prediction: stuck


def test_adam_first_step_is_signed_lr():
    A, y, x0 = _stream("lsq")
    X = B.adam(A, y, x0, "lsq", B.AdamConfig(step=0.01))
    g = jax.grad(lambda z: jnp.mean(0.5 * (A[0] @ z - y[0]) ** 2))(x0)
    chex.assert_trees_all_close(X[0], x0 - 0.01 * jnp.sign(g), atol=1e-6)


@pytest.mark.parametrize("make", [
    lambda: B.SGDConfig(step=0.0), lambda: B.SGDConfig(step=-1.0), lambda: B.SGDConfig(decay_power=-1),
    lambda: B.AdamConfig(step=0.0), lambda: B.PCConfig(step=0.0), lambda: B.PCConfig(pred_iters=-1),
    lambda: B.RLSConfig(forgetting=1.5), lambda: B.RLSConfig(init_scale=0.0),
    lambda: B.KalmanConfig(phi=0.9, q=0.1, noise=-0.5, init_var=1.0),
    lambda: B.KalmanConfig(phi=0.9, q=-0.1, noise=0.5, init_var=1.0)])
def test_bad_configs_raise(make):
    with pytest.raises(ValueError):
        make()


def test_mismatched_stream_raises():
    A, y, x0 = _stream("lsq")
    with pytest.raises(ValueError):
        B.sgd(A, y[:, :2], x0, "lsq", B.SGDConfig())
    with pytest.raises(ValueError):
        B.kalman(A, y, jnp.zeros(7), B.KalmanConfig(phi=0.9, q=0.1, noise=0.5, init_var=1.0))
