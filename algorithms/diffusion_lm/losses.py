"""Per-token NELBOs and training objectives of the diffusion LM families.

Dimensions: B batch, L sequence, V vocabulary. All per-token quantities are float32 [B, L] in nats;
times ``t`` are float32 [B]. ``log_x_theta`` is :func:`processes.denoiser_log_probs` of the logits.

* :func:`masked_nelbo` (MDLM, Sahoo et al. 2024, Eq. 10): ``-alpha'_t / (1 - alpha_t) *
  (-log x_theta(x))`` on masked positions; ``= (1/t) CE`` for the log-linear schedule.
  :func:`masked_ce` drops the weight: the cross-entropy ("low-variance") objective of Sahoo et al.
  2026, so that ``CE loss = t * NELBO`` per sample.
* :func:`duo_nelbo` (UDLM, Schiff et al. 2025, Eq. 18; Duo, Sahoo et al. 2025, Eq. 6): the closed
  form for the uniform process, with ``xbar = N alpha_t x + (1 - alpha_t)``,
  ``xbar_theta = N alpha_t x_theta + (1 - alpha_t)`` and ``i = z_t``::

      -alpha'_t / (N alpha_t) * [ N / xbar_theta_i - N / xbar_i
                                  + sum_j (xbar_j / xbar_i) log(xbar_theta_i xbar_j
                                                                / (xbar_theta_j xbar_i)) ].

* :func:`mixing_nelbo` (any process of :mod:`processes`, GIDD Thm. 3.6):
  ``w_t(z_t, x) [KL(q_t(.|x) || q_t(.|x_theta)) + r - log r - 1]``, ``r = q_t(z_t|x) /
  q_t(z_t|x_theta)``, ``w_t = g_t(z_t) / q_t(z_t|x)``. It equals the two closed forms above.
  For training, GIDD caps ``w_t`` (``"clip"``) or replaces it (``"dynamic"``,
  :func:`gidd_dynamic_weight`).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from algorithms.diffusion_lm.processes import Process


def _gather(a: jax.Array, idx: jax.Array) -> jax.Array:
    return jnp.take_along_axis(a, idx[..., None], axis=-1)[..., 0]


_SERIES_RADIUS = 0.5
# (-1)^k / k for k = 24 .. 2: u - log1p(u) = u^2 sum_k (-1)^k u^(k-2) / k; at |u| < 1/2 the
# terms left out weigh below 2 * 2^-23 / 25 of the sum, under float32's rounding.
_SERIES = tuple((-1.0) ** k / k for k in range(24, 1, -1))


def _ratio_divergence(num: jax.Array, den: jax.Array, d: jax.Array) -> jax.Array:
    """``h(u) = u - log(1 + u) = r - 1 - log r >= 0`` for ``r = num / den``, ``u = r - 1 = d /
    den``, where ``num, den >= 0`` and ``d = num - den`` is given apart (formed without
    subtracting them). No cancellation: the Taylor series of ``h`` for ``|u| < 1/2`` (where
    ``u - log1p(u)`` keeps only ``|u| / 2`` of the digits), ``u - log(num / den)`` elsewhere (the
    ratio keeps ``log r`` exact as ``r -> 0``); ``+inf`` at ``r = 0`` or ``den = 0 < num``, 0 at
    ``num = den = 0``."""
    pos = den > 0
    den = jnp.where(pos, den, 1.0)
    u = d / den
    small = pos & (jnp.abs(u) < _SERIES_RADIUS)
    us = jnp.where(small, u, 0.0)
    poly = jnp.zeros_like(us)
    for coef in _SERIES:
        poly = poly * us + coef
    # Every branch gets safe operands, so that none puts a NaN into another's gradient: the
    # logarithm sees r only where r > 0 and it is taken (a zero-mass entry such as [BOS], with
    # num = den = 0, would otherwise give 0 * inf in the backward pass); h is constant (+inf or
    # 0) where r = 0 or den = 0.
    finite = pos & (num > 0) & ~small
    ud = jnp.where(finite, u, _SERIES_RADIUS)
    rd = jnp.where(finite, num / den, 1.0 + _SERIES_RADIUS)
    direct = jnp.where(finite, ud - jnp.log(rd), jnp.where(pos | (num > 0), jnp.inf, 0.0))
    return jnp.where(small, us * us * poly, direct)


def _divergences(q: jax.Array, q_th: jax.Array, diff: jax.Array, i: jax.Array
                 ) -> tuple[jax.Array, jax.Array]:
    """The two divergences of the NELBOs, each a sum of non-negative terms (no cancellation).

    For two non-negative measures of equal mass ``q`` (of ``x``) and ``q_th`` (of ``x_theta``)
    [B, L, V] whose difference ``diff = q - q_th`` is given apart, and the state ``i = z_t``
    [B, L]:

    * ``sum_j q_j log(q_j / q_th_j) = sum_j q_j h(q_th_j / q_j)`` (the terms of ``q_th - q``,
      which sum to 0, added; ``q_th_j`` where ``q_j = 0``),
    * ``r - 1 - log r = h(r)`` with ``r = q_i / q_th_i``,

    ``h(r) = r - 1 - log r >= 0`` (:func:`_ratio_divergence`). Returns (the first [B, L], the
    second [B, L]).
    """
    pos = q > 0
    kl_terms = jnp.where(pos, q * _ratio_divergence(q_th, q, -diff), q_th)
    is_div = _ratio_divergence(_gather(q, i), _gather(q_th, i), _gather(diff, i))
    return jnp.sum(kl_terms, axis=-1), is_div


def _one_hot_minus(log_x_theta: jax.Array, x: jax.Array) -> jax.Array:
    """``onehot(x) - x_theta`` [B, L, V] from ``log x_theta``, with ``1 - x_theta(x)`` taken as
    ``sum_{j != x} x_theta_j``: a sum of positive terms, exact where ``x_theta(x)`` is within
    float32's rounding of 1 (where ``log x_theta(x)`` has lost the digits), and it makes the
    entries sum to 0 as the identities of :func:`_divergences` need. With ``log x_theta`` a
    log-softmax the result is that of ``x_theta = softmax(log x_theta)``."""
    is_x = jnp.arange(log_x_theta.shape[-1]) == x[..., None]
    others = jnp.where(is_x, 0.0, jnp.exp(log_x_theta))
    return jnp.where(is_x, jnp.sum(others, axis=-1, keepdims=True), -others)


def _check(process: Process, kind: str | tuple[str, ...], where: str) -> None:
    kinds = (kind,) if isinstance(kind, str) else kind
    if process.kind not in kinds:
        raise ValueError(f"{where}: needs a process of kind {kinds}, got {process.kind!r}")


def masked_ce(process: Process, log_x_theta: jax.Array, x: jax.Array, z_t: jax.Array
              ) -> jax.Array:
    """Cross-entropy ``-log x_theta(x)`` on masked positions, 0 elsewhere. float32 [B, L]."""
    _check(process, "masked", "masked_ce")
    ce = -_gather(log_x_theta, x)
    return jnp.where(z_t == process.mask_id, ce, 0.0)


def masked_weight(process: Process, t: jax.Array) -> jax.Array:
    """The NELBO weight ``-alpha'_t / (1 - alpha_t)`` [B] (``1/t`` for MDLM's schedule)."""
    _check(process, "masked", "masked_weight")
    return -process.alpha_prime(t) / process.beta(t)


def masked_nelbo(process: Process, log_x_theta: jax.Array, x: jax.Array, z_t: jax.Array,
                 t: jax.Array) -> jax.Array:
    """MDLM's per-token continuous-time NELBO integrand at time ``t`` [B] in [0, 1]. float32
    [B, L], >= 0 and finite on all of [0, 1] (at ``t = 0`` nothing is masked and the weight's
    ``1/t`` never multiplies a term)."""
    weight = masked_weight(process, t)[:, None]
    return jnp.where(z_t == process.mask_id, weight * -_gather(log_x_theta, x), 0.0)


def duo_nelbo(process: Process, log_x_theta: jax.Array, x: jax.Array, z_t: jax.Array,
              t: jax.Array) -> jax.Array:
    """Uniform-state per-token NELBO integrand (closed form, see the module docstring).

    Evaluated without cancellation: as ``sum_j xbar_j = sum_j xbar_theta_j = N``, the bracket is
    ``N [h(u) + sum_j (xbar_j / N) h(w_j)]`` with ``h(u) = u - log(1 + u) >= 0``,
    ``u = (xbar_i - xbar_theta_i) / xbar_theta_i`` and ``w_j = (xbar_theta_j - xbar_j) / xbar_j``,
    where ``xbar - xbar_theta = N alpha_t (x - x_theta)`` is formed directly, ``1 - alpha_t`` is
    :meth:`Process.beta` and ``h`` is a series near 0; so small values (a near-perfect
    ``x_theta``, ``t -> 0``) keep float32's relative precision.

    Returns float32 [B, L], >= 0 and finite for ``t`` in [0, 1] (``+inf`` only at ``t = 0`` for
    ``x_theta(x) = 0``), exactly 0 where ``x_theta`` is the one-hot of ``x`` (terms with
    ``xbar_j = 0``, at ``t = 0``, are 0: ``0 log 0 = 0``).
    """
    _check(process, "uniform", "duo_nelbo")
    n = process.num_classes
    alpha = process.alpha(t)[:, None, None]
    beta = process.beta(t)[:, None, None]
    dalpha = process.alpha_prime(t)[:, None]
    log_x_theta = log_x_theta[..., :n].astype(jnp.float32)
    xbar = n * alpha * jax.nn.one_hot(x, n) + beta
    xbar_th = n * alpha * jnp.exp(log_x_theta) + beta
    diff = n * alpha * _one_hot_minus(log_x_theta, x)                  # xbar - xbar_theta
    kl, is_div = _divergences(xbar, xbar_th, diff, z_t)
    inner = (n * is_div + kl) / _gather(xbar, z_t)
    return (-dalpha / (n * alpha[..., 0])) * inner


WEIGHTINGS = ("clip", "dynamic")


def gidd_dynamic_weight(process: Process, x: jax.Array, z_t: jax.Array, t: jax.Array,
                        max_weight: float) -> jax.Array:
    """GIDD's "dynamic" training weight per token, float32 [B, L], in ``[0, max_weight]``.

    It replaces the ELBO weight ``w_t(z_t, x)`` by one set by the token's state (von Rütte et al.
    2025, the default of their training config; the form is that of the authors' code,
    ``gidd/loss.py``, ``GiddLoss.get_weights`` with ``loss_weighting="dynamic"``)::

        2                                   if z_t = [MASK]
        1                                   if z_t is a data id other than x (uniform noise)
        (B / V) exp((gamma / 2) s_t)        if z_t = x,  s_t = sigmoid(-t)

    then clipped to ``[0, max_weight]``. ``B`` is the process's uniform-weight scale (``c_t = B
    sqrt(t a_t)``, so ``gamma = 1``), ``V`` the vocabulary size; the authors' ``s_t`` stands in for
    the log-SNR (their comment: "not exactly the log-SNR"). Clean tokens thus weigh about
    ``B / V`` (1e-3 at ``p_u = 0.1``, V = 258), where the ELBO weight is unbounded near ``t = 1``.

    Args:
      x, z_t: int [B, L] clean and noised tokens.
      t: float32 [B] times in [0, 1].
      max_weight: the clip, > 0.

    Raises:
      ValueError: ``process`` not of kind ``gidd``; ``max_weight <= 0``.
    """
    _check(process, "gidd", "gidd_dynamic_weight")
    if not max_weight > 0:
        raise ValueError(f"gidd_dynamic_weight: max_weight={max_weight} must be > 0")
    gamma = 1.0
    s = jax.nn.sigmoid(-jnp.asarray(t, jnp.float32))[:, None]
    on_x = process._b / process.vocab_size * jnp.exp(gamma / 2.0 * s)
    w = jnp.where(z_t == x, on_x, jnp.where(z_t == process.mask_id, 2.0, 1.0))
    return jnp.clip(w, 0.0, max_weight)


def mixing_nelbo(process: Process, log_x_theta: jax.Array, x: jax.Array, z_t: jax.Array,
                 t: jax.Array, max_weight: float | None = None, weighting: str = "clip"
                 ) -> jax.Array:
    """General interpolating-process NELBO integrand (GIDD form). float32 [B, L], >= 0 for ``t``
    in [0, 1] and finite where the process's rate is (everywhere but GIDD's ``t = 0``, where an
    imperfect prediction gives ``+inf``; a divergence of 0 contributes 0 whatever the weight).
    A state ``z_t`` the process cannot reach from ``x`` (``q_t(z_t | x) = 0``, probability 0)
    gets 0. The divergences are sums of non-negative terms, as in :func:`duo_nelbo`, so small
    values keep float32's relative precision.

    Args:
      max_weight: ``None`` = the true ELBO weights ``w_t`` (always used for validation);
        otherwise a training weighting capped at this value.
      weighting: with ``max_weight``: ``"clip"`` = ``min(w_t, max_weight)``; ``"dynamic"`` =
        :func:`gidd_dynamic_weight` (GIDD processes only) in place of ``w_t``.

    Raises:
      ValueError: an unknown ``weighting``; ``"dynamic"`` for a process not of kind ``gidd``.
    """
    if weighting not in WEIGHTINGS:
        raise ValueError(f"mixing_nelbo: weighting={weighting!r}, expected one of {WEIGHTINGS}")
    log_x_theta = log_x_theta.astype(jnp.float32)
    q = process.marginal(jax.nn.one_hot(x, process.vocab_size), t[:, None])       # [B, L, V]
    q_th = process.marginal(jnp.exp(log_x_theta), t[:, None])
    diff = process.alpha(t)[:, None, None] * _one_hot_minus(log_x_theta, x)       # q - q_th
    kl, is_div = _divergences(q, q_th, diff, z_t)
    g = _gather(process.rate_mass(t[:, None]), z_t)                                # [B, L]
    q_i = _gather(q, z_t)
    w = g / jnp.clip(q_i, 1e-30, None)
    if max_weight is not None:
        w = (gidd_dynamic_weight(process, x, z_t, t, max_weight) if weighting == "dynamic"
             else jnp.minimum(w, max_weight))
    div = kl + is_div
    return jnp.where((div > 0) & (q_i > 0), w * div, 0.0)


def ar_nll(logits: jax.Array, x: jax.Array) -> jax.Array:
    """Per-token NLL of ``x`` [B, L] under a causal model fed ``[BOS, x_1 .. x_{L-1}]`` that
    returned ``logits`` [B, L, V] (every one of the L tokens is predicted). float32 [B, L]."""
    return -_gather(jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1), x)


def shift_right(x: jax.Array, bos_id: int) -> jax.Array:
    """``[BOS, x_1 .. x_{L-1}]`` for int [B, L]."""
    return jnp.concatenate([jnp.full_like(x[:, :1], bos_id), x[:, :-1]], axis=1)
