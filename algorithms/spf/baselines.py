"""Online baselines for time-varying stochastic optimization, each a ``lax.scan`` over a stream.

Dimensions: T time steps, M samples per step, d decision dimension.

Every method reads the stream ``A [T, M, d], y [T, M]`` and returns the decisions ``X [T, d]``, where
``X[k]`` is the decision after observing mini-batch ``k`` (a filtering estimate, adapted to the
data up to ``t_k``), started from ``x0 [d]``. ``kind`` selects the loss (see
:mod:`algorithms.spf.problems`). All functions are jitted with ``kind`` static; the configs are pytrees
whose float fields are traced, so a grid of step sizes runs through one compilation with ``jax.vmap``.

* :func:`sgd`: ``x_k = x_{k-1} - eta_k g_k(x_{k-1})`` with ``eta_k = eta / (1 + k / k0)^p``
  (``p = 0``: constant step, the classical tracker; ``p > 0``: Robbins-Monro decay).
* :func:`adam`: optax Adam on the stream (Kingma & Ba 2015).
* :func:`prediction_correction`: correction ``x_k = xhat_k - eta g_k(xhat_k)``, then prediction
  ``xhat_{k+1} = x_k + p_k`` with ``H_k p_k ~= -(g_k(x_k) - g_{k-1}(x_k))``: the time derivative of
  the gradient by a backward finite difference of mini-batch gradients at the same point, and the
  Newton system solved by a few gradient iterations on Hessian-vector products (the discrete
  implicit-function step ``dx*/dt = -H^{-1} d/dt grad F``; Simonetto, Mokhtari, Koppel, Leus & Ribeiro,
  "A class of prediction-correction methods for time-varying convex optimization", IEEE TSP 2016).
* :func:`rls`: recursive least squares with exponential forgetting ``lambda`` (Haykin, "Adaptive
  Filter Theory", ch. 10), least squares only, O(d^2 M) per step and O(d^2) memory.
* :func:`kalman`: the Kalman filter for ``theta_k = phi theta_{k-1} + w_k``, ``w ~ N(0, q I)``,
  ``y_k = A_k theta_k + N(0, noise^2 I)``; the minimum-MSE estimator when the OU drift of
  :mod:`~algorithms.spf.problems` is observed through least squares. Also returns ``tr P_{k|k}``, the
  Riccati-equation MSE.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax

from algorithms.spf.problems import check_stream, sample_grad, sample_hvp


def _concrete(*values) -> bool:
    """True when every value is a Python or NumPy number (configs are also rebuilt from tracers
    inside jit/vmap, where validation is skipped: it already ran on the concrete config)."""
    return all(isinstance(v, (int, float, np.number)) for v in values)


def _positive(obj, *names):
    for n in names:
        v = getattr(obj, n)
        if _concrete(v) and not v > 0:
            raise ValueError(f"{type(obj).__name__}.{n}={v}: must be positive")


def _pytree(*meta):
    """Registers a frozen config dataclass as a pytree: float fields are leaves (so a grid of
    step sizes can be vmapped through one compiled function), ``meta`` fields are static."""

    def wrap(cls):
        data = [f.name for f in dataclasses.fields(cls) if f.name not in meta]
        return jax.tree_util.register_dataclass(cls, data_fields=data, meta_fields=list(meta))

    return wrap


@_pytree()
@dataclasses.dataclass(frozen=True)
class SGDConfig:
    """``step``: eta > 0; ``decay_power``: p >= 0 (0 = constant step); ``decay_offset``: k0 > 0."""

    step: float = 0.05
    decay_power: float = 0.0
    decay_offset: float = 10.0

    def __post_init__(self):
        _positive(self, "step", "decay_offset")
        if _concrete(self.decay_power) and self.decay_power < 0:
            raise ValueError(f"SGDConfig.decay_power={self.decay_power}: must be >= 0")


@_pytree()
@dataclasses.dataclass(frozen=True)
class AdamConfig:
    """optax Adam: ``step`` (learning rate) > 0, ``b1``, ``b2`` in [0, 1)."""

    step: float = 0.05
    b1: float = 0.9
    b2: float = 0.999

    def __post_init__(self):
        _positive(self, "step")
        if _concrete(self.b1, self.b2) and not (0 <= self.b1 < 1 and 0 <= self.b2 < 1):
            raise ValueError(f"AdamConfig b1={self.b1}, b2={self.b2}: must lie in [0, 1)")


@_pytree("pred_iters")
@dataclasses.dataclass(frozen=True)
class PCConfig:
    """Prediction-correction: correction ``step`` > 0; ``pred_iters`` >= 0 gradient iterations of
    step ``pred_lr`` > 0 on ``p^T H p / 2 + p^T c``; ``pred_weight`` >= 0 scales the prediction."""

    step: float = 0.05
    pred_iters: int = 3
    pred_lr: float = 0.3
    pred_weight: float = 1.0

    def __post_init__(self):
        _positive(self, "step", "pred_lr")
        if self.pred_iters < 0 or (_concrete(self.pred_weight) and self.pred_weight < 0):
            raise ValueError(f"PCConfig pred_iters={self.pred_iters}, pred_weight={self.pred_weight}:"
                             " must be >= 0")


@_pytree()
@dataclasses.dataclass(frozen=True)
class RLSConfig:
    """Recursive least squares: ``forgetting`` lambda in (0, 1], ``init_scale`` P_0 = init_scale I > 0."""

    forgetting: float = 0.98
    init_scale: float = 10.0

    def __post_init__(self):
        _positive(self, "init_scale")
        if _concrete(self.forgetting) and not 0 < self.forgetting <= 1:
            raise ValueError(f"RLSConfig.forgetting={self.forgetting}: must lie in (0, 1]")


@_pytree()
@dataclasses.dataclass(frozen=True)
class KalmanConfig:
    """Linear-Gaussian drift: ``phi`` (AR coefficient), ``q`` >= 0 (innovation variance per
    coordinate), ``noise`` >= 0 (observation std), ``init_var`` > 0 (prior variance of theta_0, mean 0)."""

    phi: float
    q: float
    noise: float
    init_var: float

    def __post_init__(self):
        _positive(self, "init_var")
        if _concrete(self.q, self.noise) and (self.q < 0 or self.noise < 0):
            raise ValueError(f"KalmanConfig q={self.q}, noise={self.noise}: must be >= 0")


@functools.partial(jax.jit, static_argnames=("kind",))
def sgd(A: jax.Array, y: jax.Array, x0: jax.Array, kind: str, cfg: SGDConfig) -> jax.Array:
    """Online SGD (constant or decaying step). Returns X [T, d] float32."""
    check_stream(A, y, x0)

    def step(x, inp):
        k, a, b = inp
        eta = cfg.step / (1.0 + k / cfg.decay_offset) ** cfg.decay_power
        x = x - eta * sample_grad(kind, x, a, b)
        return x, x

    _, X = jax.lax.scan(step, x0, (jnp.arange(A.shape[0], dtype=jnp.float32), A, y))
    return X


@functools.partial(jax.jit, static_argnames=("kind",))
def adam(A: jax.Array, y: jax.Array, x0: jax.Array, kind: str, cfg: AdamConfig) -> jax.Array:
    """Online Adam (optax) on the mini-batch gradients. Returns X [T, d] float32."""
    check_stream(A, y, x0)
    tx = optax.adam(cfg.step, b1=cfg.b1, b2=cfg.b2)

    def step(carry, inp):
        x, opt_state = carry
        a, b = inp
        updates, opt_state = tx.update(sample_grad(kind, x, a, b), opt_state, x)
        x = optax.apply_updates(x, updates)
        return (x, opt_state), x

    _, X = jax.lax.scan(step, (x0, tx.init(x0)), (A, y))
    return X


def newton_direction(kind, x, A, y, c, iters: int, lr: float):
    """Approximate ``-H^{-1} c`` by ``iters`` gradient steps on ``p^T H p / 2 + p^T c`` from p = 0,
    with ``H`` the mini-batch Hessian at ``x`` (Hessian-vector products only). [d]."""

    def body(_, p):
        return p - lr * (sample_hvp(kind, x, A, y, p) + c)

    return jax.lax.fori_loop(0, iters, body, jnp.zeros_like(c))


@functools.partial(jax.jit, static_argnames=("kind",))
def prediction_correction(A: jax.Array, y: jax.Array, x0: jax.Array, kind: str,
                          cfg: PCConfig) -> jax.Array:
    """Prediction-correction tracking (see module docstring). Returns X [T, d] float32."""
    check_stream(A, y, x0)

    def step(carry, inp):
        xhat, a_prev, y_prev, k = carry
        a, b = inp
        x = xhat - cfg.step * sample_grad(kind, xhat, a, b)
        c = sample_grad(kind, x, a, b) - sample_grad(kind, x, a_prev, y_prev)
        c = jnp.where(k > 0, c, 0.0)
        p = newton_direction(kind, x, a, b, c, cfg.pred_iters, cfg.pred_lr)
        return (x + cfg.pred_weight * p, a, b, k + 1), x

    carry = (x0, jnp.zeros_like(A[0]), jnp.zeros_like(y[0]), jnp.zeros((), jnp.int32))
    _, X = jax.lax.scan(step, carry, (A, y))
    return X


@jax.jit
def rls(A: jax.Array, y: jax.Array, x0: jax.Array, cfg: RLSConfig) -> jax.Array:
    """Block recursive least squares with forgetting (least squares only). Returns X [T, d].

    ``K = P A^T (lambda I + A P A^T)^{-1}``, ``x += K (y - A x)``, ``P = (P - K A P) / lambda``.
    """
    _, M, d = check_stream(A, y, x0)
    lam = cfg.forgetting

    def step(carry, inp):
        x, P = carry
        a, b = inp
        PAt = P @ a.T
        S = lam * jnp.eye(M) + a @ PAt
        K = jax.scipy.linalg.solve(S, PAt.T, assume_a="pos").T
        x = x + K @ (b - a @ x)
        P = (P - K @ PAt.T) / lam
        return (x, 0.5 * (P + P.T)), x

    _, X = jax.lax.scan(step, (x0, cfg.init_scale * jnp.eye(d, dtype=A.dtype)), (A, y))
    return X


@jax.jit
def kalman(A: jax.Array, y: jax.Array, x0: jax.Array, cfg: KalmanConfig) -> tuple[jax.Array, jax.Array]:
    """Kalman filter for the linear-Gaussian drift (least squares only).

    ``x0`` is the prior mean of theta_0 (prior covariance ``init_var I``); for k >= 1 the predict
    step is ``x- = phi x``, ``P- = phi^2 P + q I``; the update is ``S = A P- A^T + noise^2 I``,
    ``K = P- A^T S^{-1}``, ``x = x- + K (y - A x-)``, ``P = P- - K S K^T``.

    Returns:
      (X [T, d] the filtered means ``E[theta_k | y_0..k]``, trace_P [T] the Riccati MSE ``tr P_{k|k}``).
    """
    _, M, d = check_stream(A, y, x0)
    eye = jnp.eye(d, dtype=A.dtype)

    def step(carry, inp):
        x, P, k = carry
        a, b = inp
        x_pred = jnp.where(k > 0, cfg.phi * x, x)
        P_pred = jnp.where(k > 0, cfg.phi ** 2 * P + cfg.q * eye, P)
        PAt = P_pred @ a.T
        S = a @ PAt + cfg.noise ** 2 * jnp.eye(M, dtype=A.dtype)
        K = jax.scipy.linalg.solve(S, PAt.T, assume_a="pos").T
        x = x_pred + K @ (b - a @ x_pred)
        P = P_pred - K @ PAt.T
        P = 0.5 * (P + P.T)
        return (x, P, k + 1), (x, jnp.trace(P))

    _, (X, trP) = jax.lax.scan(step, (x0, cfg.init_var * eye, jnp.zeros((), jnp.int32)), (A, y))
    return X, trP
