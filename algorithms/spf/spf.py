"""The Stochastic Path Follower (SPF): a learned, dimension-free tracker of a moving optimum.

Dimensions: T time steps, M samples per step, d decision dimension, E episodes, P per-coordinate
features (``NUM_FEATURES``), W hidden width.

What is the paper's and what is ours
------------------------------------
Amidzadeh, Viitasaari & Di Francesco, "Non-Parametric Optimization for Scalable Learning in Stochastic
Decision Problems" (ICML 2026) pose ``min E[l(X_t; xi_t)]`` over decisions ``X_t`` that are
stochastic processes adapted to the data filtration ``F_t``, derive non-parametric optimality
conditions with a Malliavin-calculus variational framework, and learn the decision process with a
scalable deep-learning algorithm, the Stochastic Path Follower, whose cost does not grow with the
parameterization dimension. That summary is all we take from the paper; its body and code were not
available to us, so everything below is our reconstruction from those principles.

1. Optimality (conditional form). An adapted decision is optimal when the conditional first-order
   condition ``E[grad l(X_t; xi_t) | F_t] = grad F(X_t, t) = 0`` holds along the path.
2. Path following. Differentiating ``grad F(x*(t), t) = 0`` in t gives the implicit-function motion of
   the optimum ``dx*/dt = -H^{-1} d/dt grad F`` (H the Hessian). A decision process
   ``dX_t = a_t dt + b_t dW_t`` tracks it when its drift predicts that motion and corrects the
   optimality residual, ``a_t ~= -H^{-1} d/dt grad F - gamma grad F``.
3. Noise and Clark-Ocone. The decision only sees mini-batch gradients
   ``g_t = grad F(X_t, t) + (martingale noise)``; the noise is the Brownian motion ``W`` that drives
   the decision SDE. By Clark-Ocone, ``X_t = E X_t + int_0^t E[D_s X_t | F_s] dW_s``, so the diffusion
   coefficient ``b_t`` is the response of the decision to the current innovation (the integrand at
   ``s = t``), and the variance part of the tracking error is ``E int |E[D_s X_t | F_s]|^2 ds``. We
   compute ``D_s X_t`` by automatic differentiation of the simulated decision path with respect to its
   noise (:mod:`algorithms.spf.malliavin`), as a diagnostic only: neither the update (item 4) nor its
   training objective uses it. How the paper puts it into the algorithm is in the body we lack.
4. Learning (ours). One small MLP ``phi`` is shared by all coordinates and reads P local features of
   coordinate i, all in gradient units and divided by one scalar ``S_k`` (the RMS of the mini-batch
   gradient over coordinates), which makes the update equivariant to the gradient scale and its
   parameter count independent of d:

     ``z_i = [g_i, v_i, c_i, m_i, (H m)_i] / S_k``  with ``g = g_k(X_{k-1})`` (mini-batch gradient),
     ``v`` an EMA of ``g`` (rate ``ema``), ``c = g_k(X_{k-1}) - g_{k-1}(X_{k-1})`` (the change of the
     gradient in time at a fixed point: ``dt * d/dt grad F`` plus noise), ``m = (X_{k-1} - X_{k-2}) / eta``
     (the last move) and ``H m`` a mini-batch Hessian-vector product.

   ``(u_i, s_i) = phi(z_i)`` give a drift correction and a log-gain, and the Euler-Maruyama step is

     ``X_k = X_{k-1} - eta * exp(s) * g + eta * S_k * u``                                    (SPF)

   i.e. drift ``a = (-exp(s) grad F + S u) eta / dt`` and diffusion ``b dW = -eta exp(s) (g - grad F)``.
   With ``phi == 0`` this is online SGD with step ``eta`` (the last layer is zero-initialised, so
   training starts from SGD). ``phi`` is trained by backpropagation through simulated drift episodes
   (``lax.scan``) on the integrated excess risk plus ``residual_weight`` times the squared optimality
   residual ``|grad F(X_t, t)|^2`` (:func:`spf_objective`); deployment is one forward pass per step,
   O(M d + d W^2) time and O(d) memory.

Data parallelism: the training batch is E simulated episodes (:func:`make_episode_loss_fn`). Given
the shared parameters the episodes are independent and the objective is a mean over them, so the
batch is split along E over a mesh's ``data`` axis (``core.sharding``) with the parameters
replicated: each device rolls out and backpropagates through E / n episodes, and only the loss and
the gradient are summed across devices.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from flax import nnx

from algorithms.spf.problems import (
    KINDS,
    Problem,
    check_stream,
    excess_risk,
    logistic_population_risk,
    sample_episodes,
    sample_grad,
    sample_hvp,
)

NUM_FEATURES = 5  # g, EMA(g), time-difference of g, last move, H * last move


@dataclasses.dataclass(frozen=True)
class SPFConfig:
    """SPF hyper-parameters (static).

    Attributes:
      step: eta > 0, the base step (the SGD step SPF reduces to with a zero network).
      hidden: W > 0, hidden width of the shared per-coordinate MLP.
      depth: number of hidden layers >= 1.
      ema: rate in [0, 1) of the gradient EMA feature.
      max_log_gain: |s| is softly limited to this (> 0) by ``s = L tanh(s_raw / L)``.
      residual_weight: weight >= 0 of the squared optimality residual in the training objective.
      burn_in: fraction in [0, 1) of each episode's first steps left out of the objective.
    """

    step: float = 0.05
    hidden: int = 32
    depth: int = 2
    ema: float = 0.9
    max_log_gain: float = 3.0
    residual_weight: float = 0.1
    burn_in: float = 0.0

    def __post_init__(self):
        if not self.step > 0:
            raise ValueError(f"SPFConfig.step={self.step}: the step must be positive")
        if self.hidden < 1 or self.depth < 1:
            raise ValueError(f"SPFConfig hidden={self.hidden}, depth={self.depth}: must be >= 1")
        if not 0 <= self.ema < 1:
            raise ValueError(f"SPFConfig.ema={self.ema}: must lie in [0, 1)")
        if not self.max_log_gain > 0:
            raise ValueError(f"SPFConfig.max_log_gain={self.max_log_gain}: must be positive")
        if self.residual_weight < 0:
            raise ValueError(f"SPFConfig.residual_weight={self.residual_weight}: must be >= 0")
        if not 0 <= self.burn_in < 1:
            raise ValueError(f"SPFConfig.burn_in={self.burn_in}: must lie in [0, 1)")


class CoordinateMLP(nnx.Module):
    """``phi``: [..., P] features -> [..., 2] (drift u, raw log-gain), applied to every coordinate
    with the same weights. tanh hidden layers; the output layer starts at zero (SPF == SGD)."""

    def __init__(self, cfg: SPFConfig, *, rngs: nnx.Rngs):
        widths = [NUM_FEATURES] + [cfg.hidden] * cfg.depth
        pairs = zip(widths[:-1], widths[1:], strict=True)
        self.hidden = nnx.List([nnx.Linear(a, b, rngs=rngs) for a, b in pairs])
        self.out = nnx.Linear(cfg.hidden, 2, kernel_init=nnx.initializers.zeros_init(), rngs=rngs)

    def __call__(self, z: jax.Array) -> jax.Array:
        for layer in self.hidden:
            z = jnp.tanh(layer(z))
        return self.out(z)


def init_spf(cfg: SPFConfig, seed: int = 0) -> tuple[nnx.GraphDef, nnx.State]:
    """``(graphdef, params)`` of a fresh :class:`CoordinateMLP` (use functionally, see DESIGN)."""
    return nnx.split(CoordinateMLP(cfg, rngs=nnx.Rngs(seed)))


def param_count(params: nnx.State) -> int:
    """Number of scalars in ``params``; depends on ``hidden``/``depth`` only, never on d."""
    return int(sum(x.size for x in jax.tree.leaves(params)))


def features(kind: str, x: jax.Array, a: jax.Array, b: jax.Array, a_prev: jax.Array,
             b_prev: jax.Array, v: jax.Array, m: jax.Array, first: jax.Array, ema: float):
    """Per-coordinate features at the current decision ``x`` [d] (see module docstring, item 4).

    Args:
      x: [d] decision ``X_{k-1}``; a, b: batch k ([M, d], [M]); a_prev, b_prev: batch k-1;
      v: [d] gradient EMA before this step; m: [d] last move / eta; first: bool scalar, k == 0
      (no previous batch: ``c = 0`` and the EMA starts at ``g``); ema: the EMA rate.

    Returns:
      (z [d, P] normalised features, g [d] mini-batch gradient, v [d] updated EMA, S [] normaliser).
    """
    g = sample_grad(kind, x, a, b)
    c = jnp.where(first, 0.0, g - sample_grad(kind, x, a_prev, b_prev))
    v = jnp.where(first, g, ema * v + (1.0 - ema) * g)
    hm = sample_hvp(kind, x, a, b, m)
    scale = jnp.sqrt(jnp.mean(g * g) + 1e-12)
    z = jnp.stack([g, v, c, m, hm], axis=-1) / scale
    return z, g, v, scale


def spf_rollout(graphdef: nnx.GraphDef, params: nnx.State, A: jax.Array, y: jax.Array, x0: jax.Array,
                kind: str, cfg: SPFConfig, return_aux: bool = False):
    """Runs SPF forward on a stream (Euler-Maruyama in ``lax.scan``; not jitted itself, so it can be
    differentiated and vmapped inside a caller's jit).

    Args:
      graphdef, params: the shared network (from :func:`init_spf` or training).
      A: [T, M, d] features; y: [T, M] targets; x0: [d] initial decision.
      kind: ``"lsq"`` or ``"logistic"``.
      cfg: SPF hyper-parameters.
      return_aux: also return per-step diagnostics.

    Returns:
      X [T, d] float32 (``X[k]`` after observing batch k); with ``return_aux`` also a dict of
      ``gain`` [T] (mean of exp(s)) and ``drift`` [T] (RMS of ``eta S u``).

    Raises:
      ValueError: mismatched stream shapes.
    """
    check_stream(A, y, x0)

    def step(carry, inp):
        x, m, v, a_prev, b_prev, first = carry
        a, b = inp
        z, g, v_new, scale = features(kind, x, a, b, a_prev, b_prev, v, m, first, cfg.ema)
        out = nnx.merge(graphdef, params)(z)
        u, s = out[:, 0], cfg.max_log_gain * jnp.tanh(out[:, 1] / cfg.max_log_gain)
        gain = jnp.exp(s)
        drift = cfg.step * scale * u
        x_new = x - cfg.step * gain * g + drift
        aux = {"gain": jnp.mean(gain), "drift": jnp.sqrt(jnp.mean(drift ** 2))}
        return (x_new, (x_new - x) / cfg.step, v_new, a, b, jnp.zeros((), bool)), (x_new, aux)

    carry = (x0, jnp.zeros_like(x0), jnp.zeros_like(x0), jnp.zeros_like(A[0]), jnp.zeros_like(y[0]),
             jnp.ones((), bool))
    _, (X, aux) = jax.lax.scan(step, carry, (A, y))
    return (X, aux) if return_aux else X


@functools.partial(jax.jit, static_argnames=("graphdef", "kind", "cfg"))
def spf(graphdef: nnx.GraphDef, params: nnx.State, A: jax.Array, y: jax.Array, x0: jax.Array,
        kind: str, cfg: SPFConfig) -> jax.Array:
    """Jitted :func:`spf_rollout` (decisions only). Returns X [T, d]."""
    return spf_rollout(graphdef, params, A, y, x0, kind, cfg)


def population_grad(kind: str, x: jax.Array, theta: jax.Array) -> jax.Array:
    """``grad_x F(x, t)`` [..., d]: ``x - theta`` (lsq); autodiff of the quadrature risk (logistic)."""
    if kind == "lsq":
        return x - theta
    f = lambda xi, ti: logistic_population_risk(xi, ti)
    flat_x, flat_t = x.reshape(-1, x.shape[-1]), theta.reshape(-1, theta.shape[-1])
    return jax.vmap(jax.grad(f))(flat_x, flat_t).reshape(x.shape)


def spf_objective(params: nnx.State, graphdef: nnx.GraphDef, theta: jax.Array, A: jax.Array,
                  y: jax.Array, kind: str, cfg: SPFConfig) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Training objective on E simulated episodes (theta [E, T, d], A [E, T, M, d], y [E, T, M]):
    the time-averaged population excess risk plus ``residual_weight * |grad F|^2``, over the steps
    after ``burn_in``, averaged over episodes. Starts from ``x0 = 0``.

    Returns:
      (scalar loss, {"excess": ..., "residual": ...}).
    """
    x0 = jnp.zeros(A.shape[-1], A.dtype)
    X = jax.vmap(lambda a, b: spf_rollout(graphdef, params, a, b, x0, kind, cfg))(A, y)
    start = int(cfg.burn_in * A.shape[1])
    X, th = X[:, start:], theta[:, start:]
    excess = jnp.mean(excess_risk(kind, X, th))
    residual = jnp.mean(jnp.sum(population_grad(kind, X, th) ** 2, axis=-1))
    return excess + cfg.residual_weight * residual, {"excess": excess, "residual": residual}


def make_episode_loss_fn(kind: str, cfg: SPFConfig):
    """``loss_fn(model, batch, key) -> (loss, aux)`` for :func:`core.training.make_train_step` on a
    batch of simulated episodes: :func:`spf_objective` of ``batch = (theta, A, y)``.

    Args:
      kind: ``"lsq"`` or ``"logistic"``.
      cfg: SPF hyper-parameters.

    The returned function takes ``batch`` = (theta [E, T, d], A [E, T, M, d], y [E, T, M]) float32
    (e.g. the first three fields of :func:`~algorithms.spf.problems.sample_episodes`); ``key`` is
    unused. The batch may be split along E over a mesh's ``data`` axis with replicated parameters
    (``core.sharding.shard_batch``): the result is the single-device one up to the order of the
    sums over episodes.

    Raises:
      ValueError: unknown ``kind`` (here); a batch that is not three arrays with matching E, T, M,
        d (when the returned function is traced).
    """
    if kind not in KINDS:
        raise ValueError(f"make_episode_loss_fn: kind={kind!r}; expected one of {KINDS}")

    def loss_fn(model, batch, key):
        del key
        if not isinstance(batch, (tuple, list)) or len(batch) != 3:
            raise ValueError("SPF episode batch: expected (theta [E, T, d], A [E, T, M, d], "
                             f"y [E, T, M]), got {type(batch).__name__}")
        theta, A, y = batch
        if A.ndim != 4 or theta.shape != A.shape[:2] + A.shape[3:] or y.shape != A.shape[:3]:
            raise ValueError(f"SPF episode batch: theta {theta.shape}, A {A.shape}, y {y.shape}; "
                             "expected [E, T, d], [E, T, M, d], [E, T, M]")
        graphdef, params = nnx.split(model)
        return spf_objective(params, graphdef, theta, A, y, kind, cfg)

    return loss_fn


def make_loss_fn(problem: Problem, cfg: SPFConfig, episodes: int):
    """``loss_fn(model, batch, key) -> (loss, aux)`` for :func:`core.training.make_train_step`:
    samples ``episodes`` fresh episodes of ``problem`` from ``key`` (``batch`` is unused) and
    evaluates :func:`spf_objective` (single-device form; the data-parallel form takes the episodes
    as its batch, :func:`make_episode_loss_fn`, and gives the same value for the same episodes).

    Raises:
      ValueError: ``episodes < 1``.
    """
    if episodes < 1:
        raise ValueError(f"make_loss_fn: episodes={episodes} must be >= 1")
    episode_loss = make_episode_loss_fn(problem.kind, cfg)

    def loss_fn(model, batch, key):
        del batch
        ep = sample_episodes(key, problem, episodes)
        return episode_loss(model, (ep.theta, ep.A, ep.y), key)

    return loss_fn
