"""Time-varying stochastic optimization problems with known optimum paths.

Dimensions: T time steps, M samples observed per step, d decision dimension, E episodes.

A problem is ``min_x F(x, t) = E_{xi ~ P_t}[l(x; xi)]`` at every time ``t_k = k * dt``, observed as a
stream of mini-batches ``xi_k = (A_k [M, d], y_k [M])``. Features are isotropic Gaussian,
``a ~ N(0, I_d)``, so every population quantity depends on ``x`` and the true parameter
``theta*(t)`` through the three scalars ``|x|^2``, ``x . theta*`` and ``|theta*|^2``.

* ``lsq`` (least squares): ``y = a . theta*(t) + noise * eps``, ``eps ~ N(0, 1)``,
  ``l(x; a, y) = (a . x - y)^2 / 2``. Population ``F(x, t) = (|x - theta*|^2 + noise^2) / 2``, so the
  optimum path is ``theta*(t)`` exactly and the excess risk is ``|x - theta*|^2 / 2``.
* ``logistic``: ``y ~ Bernoulli(sigmoid(a . theta*(t)))``, ``l(x; a, y) = softplus(a . x) - y a . x``.
  The model is well specified, so the population optimum is again ``theta*(t)``. The population risk
  is computed by Gauss-Hermite quadrature (:func:`logistic_population_risk`).

Drift of ``theta*``:

* ``rotation``: coordinates are paired and each pair rotates at its own angular speed
  ``omega_j ~ U[omega_min, omega_max]`` (random sign), from a random start of norm ``sqrt(d) * scale``
  (a d-dimensional rotation, block diagonal, O(d) per step).
* ``sinusoid``: ``theta*_i(t) = scale * sin(omega_i t + phase_i)``.
* ``ou``: Ornstein-Uhlenbeck ``d theta = -kappa theta dt + sigma dB``, sampled exactly,
  ``theta_k = phi theta_{k-1} + sqrt(q) xi`` with ``phi = exp(-kappa dt)``,
  ``q = sigma^2 (1 - phi^2) / (2 kappa)``, started from its stationary law ``N(0, sigma^2/(2 kappa))``.
  With ``lsq`` this is a linear-Gaussian state-space model, for which the Kalman filter is the
  minimum mean-squared-error estimator.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

KINDS = ("lsq", "logistic")
DRIFTS = ("rotation", "sinusoid", "ou")


@dataclasses.dataclass(frozen=True)
class Problem:
    """A drifting stochastic optimization problem (static, hashable: a valid jit static argument).

    Attributes:
      kind: ``"lsq"`` or ``"logistic"``.
      drift: ``"rotation"``, ``"sinusoid"`` or ``"ou"``.
      dim: d, the decision dimension.
      batch: M, samples observed per time step.
      steps: T, time steps per episode.
      dt: time step (units of t).
      noise: observation noise std of ``lsq`` (ignored by ``logistic``).
      scale: per-coordinate amplitude of theta* (rotation: ``|theta*| = scale * sqrt(d)``).
      omega_min, omega_max: range of angular speeds (rad per unit time) for rotation / sinusoid.
      ou_kappa, ou_sigma: mean reversion rate and volatility of the ``ou`` drift.

    Raises:
      ValueError: unknown kind or drift, non-positive dim / batch / steps / dt, negative noise or
        scale, ``omega_min > omega_max``, non-positive ``ou_kappa`` or negative ``ou_sigma``.
    """

    kind: str = "lsq"
    drift: str = "rotation"
    dim: int = 10
    batch: int = 8
    steps: int = 200
    dt: float = 0.05
    noise: float = 0.5
    scale: float = 1.0
    omega_min: float = 0.2
    omega_max: float = 1.0
    ou_kappa: float = 0.5
    ou_sigma: float = 0.5

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"Problem.kind={self.kind!r}: expected one of {KINDS}")
        if self.drift not in DRIFTS:
            raise ValueError(f"Problem.drift={self.drift!r}: expected one of {DRIFTS}")
        for name in ("dim", "batch", "steps"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"Problem.{name}={getattr(self, name)}: must be a positive integer")
        if not self.dt > 0:
            raise ValueError(f"Problem.dt={self.dt}: the time step must be positive")
        if self.noise < 0 or self.scale < 0 or self.ou_sigma < 0:
            raise ValueError(f"Problem noise={self.noise}, scale={self.scale}, ou_sigma={self.ou_sigma}:"
                             " noise scales must be non-negative")
        if self.omega_min > self.omega_max:
            raise ValueError(f"Problem omega_min={self.omega_min} > omega_max={self.omega_max}")
        if not self.ou_kappa > 0:
            raise ValueError(f"Problem.ou_kappa={self.ou_kappa}: must be positive")

    @property
    def ou_phi(self) -> float:
        """AR(1) coefficient of the exactly sampled OU drift, ``exp(-kappa dt)``."""
        return math.exp(-self.ou_kappa * self.dt)

    @property
    def ou_q(self) -> float:
        """Per-step, per-coordinate innovation variance of the OU drift."""
        phi = self.ou_phi
        return self.ou_sigma ** 2 * (1.0 - phi ** 2) / (2.0 * self.ou_kappa)


class Episode(NamedTuple):
    """One simulated stream. ``theta`` [T, d] the optimum path; ``A`` [T, M, d] features;
    ``y`` [T, M] targets (float32; 0/1 for logistic); ``eps`` [T, M] the standard-normal
    observation noise of ``lsq`` (zeros for logistic)."""

    theta: jax.Array
    A: jax.Array
    y: jax.Array
    eps: jax.Array


# ----------------------------------------------------------------------------- optimum paths


def stream_key(key: jax.Array) -> jax.Array:
    """A key of the ``rbg`` implementation derived deterministically from ``key`` (any impl).

    The simulators draw O(T M d) normals; on the XLA CPU backend, compiling large threefry draws
    (with ``jax_threefry_partitionable``, the default) took 10-30 s per shape here, against ~1 s
    for ``rbg``. Streams are therefore generated from ``rbg`` keys; results stay a pure function of
    the caller's key.
    """
    return jax.random.wrap_key_data(jax.random.bits(key, (4,), jnp.uint32), impl="rbg")


def theta_path(key: jax.Array, problem: Problem) -> jax.Array:
    """Samples the optimum path ``theta*(t_k)``, k = 0..T-1. Returns float32 [T, d]."""
    T, d = problem.steps, problem.dim
    t = jnp.arange(T, dtype=jnp.float32) * problem.dt
    k_start, k_omega, k_sign, k_phase = jax.random.split(stream_key(key), 4)
    if problem.drift == "ou":
        phi, q = problem.ou_phi, problem.ou_q
        stat_std = problem.ou_sigma / math.sqrt(2.0 * problem.ou_kappa)
        x0 = stat_std * jax.random.normal(k_start, (d,))
        shocks = math.sqrt(q) * jax.random.normal(k_omega, (T - 1, d))

        def ar1(x, s):
            x = phi * x + s
            return x, x

        _, rest = jax.lax.scan(ar1, x0, shocks)
        return jnp.concatenate([x0[None], rest], axis=0)
    n_freq = (d + 1) // 2 if problem.drift == "rotation" else d
    omega = jax.random.uniform(k_omega, (n_freq,), minval=problem.omega_min, maxval=problem.omega_max)
    omega = omega * jnp.where(jax.random.bernoulli(k_sign, 0.5, (n_freq,)), 1.0, -1.0)
    if problem.drift == "sinusoid":
        phase = jax.random.uniform(k_phase, (d,), maxval=2.0 * math.pi)
        return problem.scale * jnp.sin(t[:, None] * omega[None, :] + phase[None, :])
    # rotation: pairs (2j, 2j+1) rotate by angle omega_j t; an odd last coordinate stays fixed.
    x0 = problem.scale * jax.random.normal(k_start, (2 * n_freq,))
    u, v = x0[0::2], x0[1::2]
    ang = t[:, None] * omega[None, :]
    c, s = jnp.cos(ang), jnp.sin(ang)
    if d % 2:
        c, s = c.at[:, -1].set(1.0), s.at[:, -1].set(0.0)
    pairs = jnp.stack([c * u - s * v, s * u + c * v], axis=-1).reshape(T, 2 * n_freq)
    return pairs[:, :d]


def sample_episode(key: jax.Array, problem: Problem) -> Episode:
    """Samples the optimum path and the observed stream (see module docstring)."""
    k_theta, k_a, k_y = jax.random.split(stream_key(key), 3)
    theta = theta_path(k_theta, problem)
    T, M, d = problem.steps, problem.batch, problem.dim
    A = jax.random.normal(k_a, (T, M, d), jnp.float32)
    signal = jnp.einsum("tmd,td->tm", A, theta)
    if problem.kind == "lsq":
        eps = jax.random.normal(k_y, (T, M), jnp.float32)
        y = signal + problem.noise * eps
    else:
        eps = jnp.zeros((T, M), jnp.float32)
        y = jax.random.bernoulli(k_y, jax.nn.sigmoid(signal)).astype(jnp.float32)
    return Episode(theta, A, y, eps)


@functools.partial(jax.jit, static_argnames=("problem", "num"))
def sample_episodes(key: jax.Array, problem: Problem, num: int) -> Episode:
    """``num`` independent episodes stacked on a leading axis E (each field gets [E, ...])."""
    return jax.vmap(lambda k: sample_episode(k, problem))(jax.random.split(key, num))


# ----------------------------------------------------------------------------- sample losses


def sample_loss(kind: str, x: jax.Array, A: jax.Array, y: jax.Array) -> jax.Array:
    """Mean loss over a mini-batch: x [d], A [M, d], y [M] -> scalar float32.

    ``lsq``: ``mean (A x - y)^2 / 2``; ``logistic``: ``mean softplus(A x) - y A x``.
    """
    z = A @ x
    if kind == "lsq":
        return 0.5 * jnp.mean((z - y) ** 2)
    if kind == "logistic":
        return jnp.mean(jax.nn.softplus(z) - y * z)
    raise ValueError(f"unknown problem kind {kind!r}; expected one of {KINDS}")


def sample_grad(kind: str, x: jax.Array, A: jax.Array, y: jax.Array) -> jax.Array:
    """Stochastic gradient of :func:`sample_loss` in closed form: ``A^T r / M``, [d].

    ``r = A x - y`` (lsq) or ``sigmoid(A x) - y`` (logistic). O(M d).
    """
    z = A @ x
    r = z - y if kind == "lsq" else jax.nn.sigmoid(z) - y
    return A.T @ r / A.shape[0]


def sample_hvp(kind: str, x: jax.Array, A: jax.Array, y: jax.Array, v: jax.Array) -> jax.Array:
    """Mini-batch Hessian-vector product ``H v = A^T W A v / M``, [d]; ``W = I`` (lsq) or
    ``diag(sigmoid'(A x))`` (logistic). O(M d), the Hessian is never formed."""
    del y
    w = 1.0 if kind == "lsq" else jax.nn.sigmoid(A @ x) * jax.nn.sigmoid(-(A @ x))
    return A.T @ (w * (A @ v)) / A.shape[0]


# ----------------------------------------------------------------------------- population risk

_GH_NODES = 64


@functools.lru_cache(maxsize=4)
def _hermite_e(n: int) -> tuple[np.ndarray, np.ndarray]:
    """Probabilists' Gauss-Hermite nodes and weights normalised to integrate against N(0, 1)."""
    z, w = np.polynomial.hermite_e.hermegauss(n)
    return z.astype(np.float32), (w / math.sqrt(2.0 * math.pi)).astype(np.float32)


def gaussian_expectation(f, std: jax.Array, n: int = _GH_NODES) -> jax.Array:
    """``E[f(std * Z)]``, Z ~ N(0, 1), by n-node Gauss-Hermite quadrature (exact for polynomials
    of degree < 2n). ``std`` may be any shape; ``f`` is applied elementwise."""
    z, w = _hermite_e(n)
    std = jnp.asarray(std)[..., None]
    return jnp.sum(jnp.asarray(w) * f(std * jnp.asarray(z)), axis=-1)


def logistic_population_risk(x: jax.Array, theta: jax.Array) -> jax.Array:
    """Population logistic risk ``R(x) = E[softplus(a.x) - y a.x]`` with ``a ~ N(0, I)``,
    ``y ~ Bernoulli(sigmoid(a.theta))``; x, theta [..., d] -> [...].

    Derivation (ours): with ``u = a.x``, ``v = a.theta`` jointly Gaussian,
    ``E[y u] = E[sigmoid(v) u] = (x.theta) E[sigmoid'(v)]`` by Stein's lemma, so
    ``R(x) = E[softplus(|x| Z)] - (x.theta) E[sigmoid'(|theta| Z)]``: two 1-D Gauss-Hermite integrals.
    """
    xx = jnp.sum(x * x, axis=-1)
    xt = jnp.sum(x * theta, axis=-1)
    tt = jnp.sum(theta * theta, axis=-1)
    e_softplus = gaussian_expectation(jax.nn.softplus, jnp.sqrt(xx + 1e-30))
    e_dsig = gaussian_expectation(lambda v: jax.nn.sigmoid(v) * jax.nn.sigmoid(-v), jnp.sqrt(tt))
    return e_softplus - xt * e_dsig


def excess_risk(kind: str, x: jax.Array, theta: jax.Array) -> jax.Array:
    """Population excess risk ``F(x, t) - F(theta*(t), t) >= 0``; x, theta [..., d] -> [...].

    ``lsq``: ``|x - theta|^2 / 2`` (closed form). ``logistic``: difference of
    :func:`logistic_population_risk` values (quadrature; accurate to ~1e-6 for |x|, |theta| <~ 30).
    """
    if kind == "lsq":
        return 0.5 * jnp.sum((x - theta) ** 2, axis=-1)
    if kind == "logistic":
        return logistic_population_risk(x, theta) - logistic_population_risk(theta, theta)
    raise ValueError(f"unknown problem kind {kind!r}; expected one of {KINDS}")


def check_stream(A: jax.Array, y: jax.Array, x0: jax.Array | None = None) -> tuple[int, int, int]:
    """Validates a stream's shapes: A [T, M, d], y [T, M], x0 [d]. Returns (T, M, d).

    Raises:
      ValueError: wrong ranks or mismatched T, M or d (the message gives the shapes).
    """
    if A.ndim != 3 or y.ndim != 2:
        raise ValueError(f"stream: expected A [T, M, d] and y [T, M], got A {A.shape} and y {y.shape}")
    T, M, d = A.shape
    if y.shape != (T, M):
        raise ValueError(f"stream: y has shape {y.shape}, expected (T, M) = {(T, M)} from A {A.shape}")
    if x0 is not None and x0.shape != (d,):
        raise ValueError(f"stream: initial decision x0 has shape {x0.shape}, expected ({d},) from A "
                         f"{A.shape}")
    return T, M, d
