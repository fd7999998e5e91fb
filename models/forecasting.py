"""Probabilistic forecasting networks: Parametric Prior Mapping (PPM) and its Gaussian prior alone.

PPM (Parametric Prior Mapping, ICML 2026) forecasts a distribution over the next ``H`` steps of each
channel from its last ``L`` steps in three parts (channels are handled independently, with shared
weights):

1. *Instance normalisation*: each window is centred and scaled by its own mean and standard
   deviation over time, ``x~ = (x - m) / (s + eps)``; forecasts are mapped back with
   ``y = y~ * (s + eps) + m``.
2. *Parametric prior*: ``h = GELU(W_1 x~ + b_1)``, ``mu = W_mu h + b_mu``,
   ``log sigma^2 = W_v h + b_v``; ``S`` reparameterised draws ``z_s = mu + sigma * eps_s``,
   ``eps_s ~ N(0, I_d)`` — a window-adaptive Gaussian in a ``d``-dimensional latent space.
3. *Learnable mapping*: ``y~_s = W_3 GELU(W_2 [z_s ; E x~] + b_2) + b_3`` with ``E`` a linear
   embedding of the window; the ``S`` mapped draws are samples of the predictive distribution.

The concatenation ``[z_s ; E x~]`` times ``W_2`` is computed as ``W_2z z_s + W_2c E x~`` so the
window term is computed once per series rather than once per sample (same function, ~half the
FLOPs of the first mapping layer when ``S`` is large).

:class:`GaussianPrior` is the ablation "prior alone": the same encoder with ``mu`` and
``log sigma^2`` heads of width ``H`` read directly as a per-step Gaussian forecast (no mapping).

Dimension legend: B windows (batch), L input length (time steps), H horizon (time steps),
N channels, S samples per window, d latent width, F mapping hidden width.
Values are on whatever scale the caller feeds (the experiments use the globally standardised scale).
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
from flax import nnx

# Added to the per-window standard deviation before dividing, as in the authors' code.
NORM_EPS = 1e-6


@dataclasses.dataclass(frozen=True)
class PPMConfig:
    """Static hyper-parameters of :class:`PPM` and :class:`GaussianPrior`.

    Attributes:
      input_len: L, input window length (time steps).
      horizon: H, forecast length (time steps).
      d_model: d, width of the prior's hidden layer, of the latent ``z`` and of the window embedding.
      d_ff: F, hidden width of the mapping MLP (the authors' scripts use 512 with ``d_model=256``).
    """

    input_len: int = 96
    horizon: int = 192
    d_model: int = 256
    d_ff: int = 512

    def __post_init__(self):
        for name in ("input_len", "horizon", "d_model", "d_ff"):
            v = getattr(self, name)
            if not isinstance(v, int) or v < 1:
                raise ValueError(f"PPMConfig.{name} must be a positive int, got {v!r}")


def _torch_linear(fan_in: int, fan_out: int, rngs: nnx.Rngs) -> nnx.Linear:
    """A dense layer initialised like ``torch.nn.Linear``: weights and bias ~ U(+-1/sqrt(fan_in))."""
    bound = 1.0 / math.sqrt(fan_in)

    def bias_init(key, shape, dtype=jnp.float32):
        return jax.random.uniform(key, shape, dtype, -bound, bound)

    return nnx.Linear(fan_in, fan_out, rngs=rngs,
                      kernel_init=nnx.initializers.variance_scaling(1.0 / 3.0, "fan_in", "uniform"),
                      bias_init=bias_init)


def instance_normalize(x: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Per-window, per-channel normalisation over time.

    Args:
      x: f32 [B, L, N].

    Returns:
      ``(x_norm [B, L, N], mean [B, 1, N], scale [B, 1, N])`` with ``scale = std + 1e-6`` (std with
      Bessel's correction, like ``torch.std``), so that ``x = x_norm * scale + mean``.
    """
    mean = jnp.mean(x, axis=1, keepdims=True)
    std = jnp.std(x, axis=1, keepdims=True, ddof=1)
    scale = std + NORM_EPS
    return (x - mean) / scale, mean, scale


def _check_input(x: jax.Array, cfg: PPMConfig) -> None:
    if x.ndim != 3 or x.shape[1] != cfg.input_len:
        raise ValueError(f"expected inputs of shape [B, L={cfg.input_len}, N], got {x.shape}")


class PPM(nnx.Module):
    """Parametric Prior Mapping forecaster (see the module docstring).

    Args:
      cfg: :class:`PPMConfig`.
      rngs: initialisation keys.
    """

    def __init__(self, cfg: PPMConfig, *, rngs: nnx.Rngs):
        self.cfg = cfg
        L, d, F, H = cfg.input_len, cfg.d_model, cfg.d_ff, cfg.horizon
        self.prior_in = _torch_linear(L, d, rngs)
        self.prior_mu = _torch_linear(d, d, rngs)
        self.prior_logvar = _torch_linear(d, d, rngs)
        self.embed = _torch_linear(L, d, rngs)
        # The first mapping layer acts on [z ; E x~] (2d inputs); it is stored as two blocks.
        bound = 1.0 / math.sqrt(2 * d)
        k1, k2, k3 = jax.random.split(rngs.params(), 3)
        self.map_in_z = nnx.Param(jax.random.uniform(k1, (d, F), jnp.float32, -bound, bound))
        self.map_in_c = nnx.Param(jax.random.uniform(k2, (d, F), jnp.float32, -bound, bound))
        self.map_in_b = nnx.Param(jax.random.uniform(k3, (F,), jnp.float32, -bound, bound))
        self.map_out = _torch_linear(F, H, rngs)

    def prior(self, x_norm_t: jax.Array) -> tuple[jax.Array, jax.Array]:
        """The parametric prior: ``(mu, logvar)``, each f32 [B, N, d], from x~ laid out [B, N, L]."""
        h = jax.nn.gelu(self.prior_in(x_norm_t), approximate=False)
        return self.prior_mu(h), self.prior_logvar(h)

    def __call__(self, x: jax.Array, key: jax.Array, num_samples: int) -> jax.Array:
        """Samples forecasts.

        Args:
          x: f32 [B, L, N] input windows.
          key: PRNG key for the prior draws.
          num_samples: S (static).

        Returns:
          f32 [B, S, H, N]: S forecast samples per window, on the scale of ``x``.

        Raises:
          ValueError: ``x`` is not [B, L, N] with L = ``cfg.input_len``.
        """
        _check_input(x, self.cfg)
        x_norm, mean, scale = instance_normalize(x)
        xt = jnp.swapaxes(x_norm, 1, 2)                                   # [B, N, L]
        mu, logvar = self.prior(xt)                                       # [B, N, d]
        eps = jax.random.normal(key, (*mu.shape[:2], num_samples, mu.shape[-1]), mu.dtype)
        z = mu[:, :, None, :] + jnp.exp(0.5 * logvar)[:, :, None, :] * eps  # [B, N, S, d]
        cond = self.embed(xt) @ self.map_in_c[...] + self.map_in_b[...]  # [B, N, F]
        hidden = jax.nn.gelu(z @ self.map_in_z[...] + cond[:, :, None, :], approximate=False)
        y = self.map_out(hidden)                                          # [B, N, S, H]
        y = jnp.transpose(y, (0, 2, 3, 1))                                # [B, S, H, N]
        return y * scale[:, None] + mean[:, None]


class GaussianPrior(nnx.Module):
    """The parametric prior alone: a per-step Gaussian forecast ``N(mu_t, sigma_t^2)`` (no mapping).

    Same encoder as :class:`PPM` (``Linear(L -> d)``, GELU) with heads ``Linear(d -> H)`` for the
    mean and the log-variance of each forecast step, de-normalised with the window's statistics.
    """

    def __init__(self, cfg: PPMConfig, *, rngs: nnx.Rngs):
        self.cfg = cfg
        self.prior_in = _torch_linear(cfg.input_len, cfg.d_model, rngs)
        self.head_mu = _torch_linear(cfg.d_model, cfg.horizon, rngs)
        self.head_logvar = _torch_linear(cfg.d_model, cfg.horizon, rngs)

    def __call__(self, x: jax.Array) -> tuple[jax.Array, jax.Array]:
        """Predictive mean and standard deviation.

        Args:
          x: f32 [B, L, N].

        Returns:
          ``(mean, std)``, each f32 [B, H, N], on the scale of ``x``.

        Raises:
          ValueError: ``x`` is not [B, L, N] with L = ``cfg.input_len``.
        """
        _check_input(x, self.cfg)
        x_norm, mean, scale = instance_normalize(x)
        h = jax.nn.gelu(self.prior_in(jnp.swapaxes(x_norm, 1, 2)), approximate=False)
        mu = jnp.swapaxes(self.head_mu(h), 1, 2)                           # [B, H, N]
        logvar = jnp.clip(jnp.swapaxes(self.head_logvar(h), 1, 2), -20.0, 20.0)
        return mu * scale + mean, jnp.exp(0.5 * logvar) * scale

    def sample(self, x: jax.Array, key: jax.Array, num_samples: int) -> jax.Array:
        """f32 [B, S, H, N] draws from the Gaussian forecast."""
        mean, std = self(x)
        eps = jax.random.normal(key, (mean.shape[0], num_samples, *mean.shape[1:]), mean.dtype)
        return mean[:, None] + std[:, None] * eps
