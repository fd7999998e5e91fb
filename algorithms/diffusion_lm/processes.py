"""Discrete forward (noising) processes of the diffusion LM families, as one interpolating family.

Dimensions: B batch, L sequence, V model vocabulary (outputs), N data classes (ids ``0..N-1``;
ids ``>= N`` such as ``[MASK]`` and ``[BOS]`` are never data).

Every process here has the marginal (Sahoo et al. 2026, "Scaling Beyond Masked Diffusion Language
Models", Sec. 2; von Rütte et al. 2025, GIDD, Eq. 1)

    q_t(z | x) = alpha_t * x + beta_t * pi_t,        beta_t = 1 - alpha_t,

with ``x`` one-hot (or a probability vector for the model's prediction ``x_theta``) and ``pi_t`` a
distribution over the vocabulary:

* ``masked`` (MDLM, Sahoo et al. 2024; Eso-LM's diffusion part): ``pi = [MASK]``,
  ``alpha_t = alpha_0 * (1 - (1 - eps) t)`` (log-linear; ``alpha_0 = 1`` is MDLM);
* ``uniform`` (UDLM / Duo, Schiff et al. 2025, Sahoo et al. 2025): ``pi = Uniform(N)``,
  ``alpha_t = 1 - (1 - eps) t``;
* ``gidd`` (GIDD mask <-> uniform): unnormalised weights ``a_t`` on ``x``, ``1 - a_t`` on
  ``[MASK]`` and ``c_t`` spread uniformly, divided by ``1 + c_t``; ``a_t = 1 - (1 - eps) t`` and
  ``c_t = B sqrt(t a_t)``, GIDD's ``B sqrt(t (1 - t))`` with the schedule floor ``eps`` in the
  ``(1 - t)`` factor, ``B`` set so that the uniform share at ``t = 1/2`` is ``p_u``; ``p_u = 0`` is
  exactly the masked process. The floor matters near ``t = 1``: the rate into data ids is
  ``>= 0`` iff ``d log c_t / dt >= d log a_t / dt``, which ``sqrt(t (1 - t))`` violates for
  ``1 - t`` below about ``eps / 2`` (with ``a_1 = eps > 0``) and ``sqrt(t a_t)`` never does.

``beta_t pi_t`` is exposed as one vector ("prior mass") so a time-dependent ``pi_t`` (GIDD) needs
no special case. From it follow the transition ``q(z_t | z_s) = alpha_{t|s} 1[z_t = z_s] +
gamma_{t|s}(z_t)`` with ``gamma_{t|s} = beta_t pi_t - alpha_{t|s} beta_s pi_s``, the posterior
``q(z_s | z_t, x)`` (Bayes) and the continuous-time NELBO weight ``w_t(z, x) = g_t(z) / q_t(z|x)``,
``g_t = d/dt(beta_t pi_t) - (alpha'_t / alpha_t) beta_t pi_t`` (GIDD, Thm. 3.6; derived here from
the reverse-rate form of the continuous-time ELBO), in closed form per process.

Time domain: every method takes ``t`` in [0, 1] (``t = 0`` clean data, ``t = 1`` the limit
distribution) and raises ``ValueError`` for a concrete time outside it (traced times are the
caller's contract). On the whole of [0, 1] the marginals are distributions, ``alpha_t`` decreases
and every rate is ``>= 0``; all are finite except GIDD's at ``t = 0`` (``c_t ~ sqrt(t)``, so the
rate into data ids is ``+inf``, an integrable singularity). The NELBO estimates of
:mod:`families` average the integrand over ``t ~ U[t_min, 1]`` (see ``FamilySpec.t_min``).
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np

from core import sampling

KINDS = ("masked", "uniform", "gidd")


def _times(t: jax.Array, where: str) -> jax.Array:
    """``t`` as float32; a concrete time outside [0, 1] raises ``ValueError`` naming ``where``."""
    t = jnp.asarray(t, jnp.float32)
    if not isinstance(t, jax.core.Tracer):
        bad = np.asarray(t)
        bad = bad[~((bad >= 0.0) & (bad <= 1.0))]
        if bad.size:
            raise ValueError(f"Process.{where}: times must lie in [0, 1] (t = 0 clean, t = 1 the "
                             f"limit distribution), got t = {bad.ravel()[0]}")
    return t


@dataclasses.dataclass(frozen=True)
class Process:
    """A forward process (static, hashable: safe as a ``jit`` static argument).

    Attributes:
      kind: ``"masked"``, ``"uniform"`` or ``"gidd"``.
      vocab_size: V, the model's output width.
      num_classes: N, data ids are ``0..N-1``; the uniform prior spreads over them.
      mask_id: the ``[MASK]`` id (``>= N``, ``< V``); required for ``masked`` and ``gidd``.
      eps: ``alpha_1 = alpha_0 * eps`` (masked, uniform) or ``a_1 = eps`` (gidd); in (0, 1).
      alpha0: Eso-LM's clean fraction at ``t = 0`` (masked only); in (0, 1].
      p_uniform: GIDD's uniform share at ``t = 1/2``; in [0, 1).

    Raises:
      ValueError: an unknown kind, no mask slot in the vocabulary (``mask_id`` missing, ``< N`` or
        ``>= V``), ``eps`` outside (0, 1), ``alpha0`` outside (0, 1], ``p_uniform`` outside [0, 1).
    """

    kind: str
    vocab_size: int
    num_classes: int
    mask_id: int | None = None
    eps: float = 1e-3
    alpha0: float = 1.0
    p_uniform: float = 0.0

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"Process.kind={self.kind!r}: expected one of {KINDS}")
        if not 1 <= self.num_classes <= self.vocab_size:
            raise ValueError(f"Process: num_classes={self.num_classes} must be in "
                             f"[1, vocab_size={self.vocab_size}]")
        if self.kind in ("masked", "gidd"):
            if self.mask_id is None or not self.num_classes <= self.mask_id < self.vocab_size:
                raise ValueError(
                    f"Process({self.kind}): the vocabulary has no mask slot: mask_id="
                    f"{self.mask_id} must be a non-data id in [{self.num_classes}, "
                    f"{self.vocab_size}) (data ids are 0..{self.num_classes - 1})")
        if not 0.0 < self.eps < 1.0:
            raise ValueError(f"Process: eps={self.eps} must be in (0, 1)")
        if not 0.0 < self.alpha0 <= 1.0:
            raise ValueError(f"Process: alpha0={self.alpha0} must be in (0, 1]")
        if self.alpha0 != 1.0 and self.kind != "masked":
            raise ValueError("Process: alpha0 != 1 (Eso-LM) is defined for kind='masked' only")
        if not 0.0 <= self.p_uniform < 1.0:
            raise ValueError(f"Process: p_uniform={self.p_uniform} must be in [0, 1)")

    # -- schedule ---------------------------------------------------------------------------------

    def _a(self, t: jax.Array) -> jax.Array:
        # 1 - (1 - eps) t, summed so that it keeps float32's relative precision at t -> 1 (= eps).
        return (1.0 - t) + self.eps * t

    @property
    def _b(self) -> float:
        # GIDD's B, set so that the uniform share c / (1 + c) at t = 1/2 is exactly p_u.
        return self.p_uniform / (1.0 - self.p_uniform) / math.sqrt(0.5 * (1.0 - 0.5 * (1.0 -
                                                                                      self.eps)))

    def _c(self, t: jax.Array) -> jax.Array:
        return self._b * jnp.sqrt(t * self._a(t))

    def alpha(self, t: jax.Array) -> jax.Array:
        """alpha_t (same shape as ``t``, float32) for ``t`` in [0, 1].

        Raises:
          ValueError: a concrete ``t`` outside [0, 1] (traced times are the caller's contract).
        """
        t = _times(t, "alpha")
        if self.kind == "gidd":
            return self._a(t) / (1.0 + self._c(t))
        return self.alpha0 * self._a(t)

    def alpha_prime(self, t: jax.Array) -> jax.Array:
        """d alpha_t / dt (same shape as ``t``, float32, < 0) for ``t`` in [0, 1], in closed form;
        finite except GIDD's ``-inf`` at ``t = 0`` (``c_t ~ sqrt(t)``).

        Raises:
          ValueError: a concrete ``t`` outside [0, 1].
        """
        t = _times(t, "alpha_prime")
        da = -(1.0 - self.eps)
        if self.kind != "gidd":
            return jnp.full_like(t, self.alpha0 * da)
        a, c = self._a(t), self._c(t)
        dc = self._b * (a + t * da) / (2.0 * jnp.sqrt(t * a))        # +inf at t = 0
        return (da * (1.0 + c) - a * dc) / (1.0 + c) ** 2

    def beta(self, t: jax.Array) -> jax.Array:
        """``beta_t = 1 - alpha_t`` (same shape as ``t``, float32) for ``t`` in [0, 1], from the
        schedule's own terms rather than as ``1 - alpha_t``: its relative precision holds as
        ``t -> 0`` (``1 - alpha_t`` in float32 keeps about ``1e-7 / t`` of it).

        Raises:
          ValueError: a concrete ``t`` outside [0, 1].
        """
        t = _times(t, "beta")
        one_minus_a = (1.0 - self.eps) * t                              # 1 - a_t
        if self.kind == "gidd":
            c = self._c(t)
            return (c + one_minus_a) / (1.0 + c)                        # 1 - a / (1 + c)
        return (1.0 - self.alpha0) + self.alpha0 * one_minus_a

    def sigma(self, t: jax.Array) -> jax.Array:
        """Noise level ``-log alpha_t`` (the time conditioning of Duo / GIDD); finite on [0, 1]."""
        return -jnp.log(self.alpha(t))

    def prior_mass(self, t: jax.Array) -> jax.Array:
        """``beta_t pi_t``: float32 [..., V] for ``t`` [...] in [0, 1]; sums to ``1 - alpha_t``.

        Raises:
          ValueError: a concrete ``t`` outside [0, 1].
        """
        mask, data = self._prior_parts(_times(t, "prior_mass"))
        ids = jnp.arange(self.vocab_size)
        out = jnp.where(ids < self.num_classes, data[..., None], 0.0)
        if self.mask_id is None:
            return out
        return jnp.where(ids == self.mask_id, mask[..., None], out)

    def _prior_parts(self, t: jax.Array) -> tuple[jax.Array, jax.Array]:
        """``beta_t pi_t`` as (mass on ``[MASK]``, mass on each data id), float32 [...] each:
        every ``pi_t`` here mixes ``[MASK]`` and the uniform law on data ids (0 for ``uniform``'s
        mask, ``masked``'s data ids)."""
        zero = jnp.zeros_like(t)
        if self.kind == "uniform":
            return zero, self.beta(t) / self.num_classes
        if self.kind == "masked":
            return self.beta(t), zero
        c = self._c(t)
        return (1.0 - self.eps) * t / (1.0 + c), c / self.num_classes / (1.0 + c)

    def rate_mass(self, t: jax.Array) -> jax.Array:
        """The forward jump rate into each state, ``g_t = d/dt(beta_t pi_t) - (alpha'_t / alpha_t)
        beta_t pi_t``: float32 [..., V] for ``t`` [...], in closed form.

        ``g_t >= 0`` on the whole of [0, 1] for every process, and finite there except GIDD's
        rate into data ids at ``t = 0`` (``+inf``: ``c_t ~ sqrt(t)``, an integrable singularity).
        Closed forms: masked ``g[MASK] = -alpha'/alpha``; uniform ``g[j] = -alpha'/(N alpha)``;
        GIDD ``g[MASK] = -a'/(a (1 + c))`` and ``g[j] = c (1/t - a'/a) / (2 N (1 + c))``.

        Raises:
          ValueError: a concrete ``t`` outside [0, 1].
        """
        t = _times(t, "rate_mass")[..., None]
        ids = jnp.arange(self.vocab_size)
        is_data = (ids < self.num_classes).astype(jnp.float32)
        if self.kind != "gidd":
            g = -self.alpha_prime(t) / self.alpha(t)
            if self.kind == "uniform":
                return g * is_data / self.num_classes
            return g * (ids == self.mask_id).astype(jnp.float32)
        a, c, da = self._a(t), self._c(t), 1.0 - self.eps
        g_mask = da / (a * (1.0 + c))
        # c (1/t - a'/a) with c / t = B sqrt(a / t): +inf (not nan) at t = 0.
        g_data = (self._b * jnp.sqrt(a / t) + c * da / a) / (2.0 * self.num_classes * (1.0 + c))
        if self.p_uniform == 0.0:
            g_data = jnp.zeros_like(g_data)
        return jnp.where(ids == self.mask_id, g_mask, jnp.where(is_data > 0, g_data, 0.0))

    # -- distributions ----------------------------------------------------------------------------

    def marginal(self, x_probs: jax.Array, t: jax.Array) -> jax.Array:
        """``q_t(. | x)`` [..., V] for ``x_probs`` [..., V] (one-hot or a distribution), ``t`` [...]
        broadcastable to ``x_probs.shape[:-1]``, in [0, 1]."""
        t = _times(t, "marginal")
        return self.alpha(t)[..., None] * x_probs + self.prior_mass(t)

    def posterior(self, z_t: jax.Array, x_probs: jax.Array, s: jax.Array, t: jax.Array
                  ) -> jax.Array:
        """``q(z_s | z_t, x)`` [..., V] for s < t: ``q(z_t | z_s) q_s(z_s | x) / q_t(z_t | x)``.

        With the model's ``x_theta`` in place of ``x`` this is the ancestral sampler's reverse step
        (MDLM Eq. 7 for the masked process; Duo's exact posterior for the uniform one); the
        samplers draw from it with :meth:`posterior_sample`, which never forms this [..., V] law.

        Args:
          z_t: int [...] current states.
          x_probs: float [..., V].
          s, t: float, broadcastable to ``z_t.shape``; ``0 <= s < t <= 1``.
        """
        s = jnp.broadcast_to(_times(s, "posterior"), z_t.shape)
        t = jnp.broadcast_to(_times(t, "posterior"), z_t.shape)
        a_ts = self.alpha(t) / self.alpha(s)
        gamma = self.prior_mass(t) - a_ts[..., None] * self.prior_mass(s)   # [..., V] over z_t
        gamma_zt = jnp.take_along_axis(gamma, z_t[..., None], axis=-1)      # [..., 1]
        onehot = jax.nn.one_hot(z_t, self.vocab_size, dtype=jnp.float32)
        trans = a_ts[..., None] * onehot + gamma_zt
        joint = jnp.clip(trans, 0.0, None) * self.marginal(x_probs, s)
        return joint / jnp.clip(joint.sum(-1, keepdims=True), 1e-30, None)

    def posterior_sample(self, key: jax.Array, z_t: jax.Array, x_log_probs: jax.Array,
                         s: jax.Array, t: jax.Array) -> jax.Array:
        """Draws ``z_s ~ q(z_s | z_t, x)``, the law :meth:`posterior` returns, exactly and without
        forming it. int32, ``z_t.shape``.

        Every transition here is ``q(z_t | z_s) = alpha_{t|s} 1[z_s = z_t] + gamma(z_t)``, so the
        posterior ``q(z_t | z_s) q_s(z_s | x) / q_t(z_t | x)`` is the mixture of ``z_s = z_t``
        (weight ``alpha_{t|s} q_s(z_t | x)``) and ``z_s ~ q_s(. | x) = alpha_s x + beta_s pi_s``
        (weight ``gamma(z_t)``); ``pi_s`` mixes ``[MASK]`` and uniform data ids. One exact draw
        (:func:`core.sampling.categorical`) picks the branch:

            stay      alpha_{t|s} q_s(z_t | x)           z_s = z_t
            denoise   gamma(z_t) alpha_s                 z_s ~ x (a second exact draw)
            mask      gamma(z_t) beta_s pi_s([MASK])     z_s = [MASK]
            uniform   gamma(z_t) beta_s pi_s(data ids)   z_s ~ Uniform(0..N-1)

        (``gamma`` clipped at 0 against rounding, as in :meth:`posterior`). A denoised token's law
        is ``x`` itself at any step size: the product (unmask probability) x ``x(v)``, which at
        many steps sinks below what float32 Gumbel noise can draw (Zheng et al. 2024, arXiv
        2409.02908: fewer rare tokens, lower generative perplexity and entropy), is
        never formed. For the masked process this is MDLM's step (Eq. 7): unmask with probability
        ``(alpha_s - alpha_t) / (1 - alpha_t)``, then draw the token from ``x``.

        Args:
          key: PRNG key.
          z_t: int [...] current states.
          x_log_probs: float [..., V] log-probabilities of ``x`` (one-hot or the model's
            ``x_theta``), its batch axes broadcastable to ``z_t.shape`` (one shared law is not
            copied). Only data ids may carry mass, as :func:`denoiser_log_probs` gives: the
            denoise branch draws among ids ``0..N-1``.
          s, t: float, broadcastable to ``z_t.shape``; ``0 <= s < t <= 1``.

        Raises:
          ValueError: a concrete ``s`` or ``t`` outside [0, 1]; ``x_log_probs`` not [..., V] with
            batch axes broadcastable to ``z_t.shape``.
        """
        z_t = jnp.asarray(z_t)
        if x_log_probs.ndim < 1 or x_log_probs.shape[-1] != self.vocab_size:
            raise ValueError(f"Process.posterior_sample: x_log_probs must be [..., V={self.vocab_size}]"
                             f", got shape {x_log_probs.shape}")
        lead = z_t.ndim - (x_log_probs.ndim - 1)
        try:
            fits = lead >= 0 and jnp.broadcast_shapes(z_t.shape, x_log_probs.shape[:-1]) == z_t.shape
        except ValueError:
            fits = False
        if not fits:
            raise ValueError(f"Process.posterior_sample: x_log_probs batch shape "
                             f"{x_log_probs.shape[:-1]} must broadcast to z_t's {z_t.shape}")
        x_log = jnp.asarray(x_log_probs, jnp.float32).reshape((1,) * lead + x_log_probs.shape)
        s = jnp.broadcast_to(_times(s, "posterior_sample"), z_t.shape)
        t = jnp.broadcast_to(_times(t, "posterior_sample"), z_t.shape)
        a_s = self.alpha(s)
        a_ts = self.alpha(t) / a_s
        mask_s, data_s = self._prior_parts(s)
        mask_t, data_t = self._prior_parts(t)
        is_mask = (z_t == self.mask_id) if self.mask_id is not None else jnp.zeros(z_t.shape, bool)
        is_data = z_t < self.num_classes
        gamma = jnp.where(is_mask, mask_t - a_ts * mask_s,
                          jnp.where(is_data, data_t - a_ts * data_s, 0.0))
        gamma = jnp.maximum(gamma, 0.0)
        x_zt = jnp.exp(jnp.take_along_axis(x_log, z_t[..., None].astype(jnp.int32), axis=-1,
                                           mode="clip")[..., 0])
        q_s_zt = a_s * x_zt + jnp.where(is_mask, mask_s, jnp.where(is_data, data_s, 0.0))
        weights = jnp.stack([a_ts * q_s_zt, gamma * a_s, gamma * mask_s,
                             gamma * (self.num_classes * data_s)], axis=-1)
        k_branch, k_token, k_uniform = jax.random.split(key, 3)
        branch = sampling.categorical(k_branch, jnp.log(weights))
        token = sampling.categorical(k_token, x_log[..., :self.num_classes], shape=z_t.shape)
        uniform = jax.random.randint(k_uniform, z_t.shape, 0, self.num_classes)
        mask_id = 0 if self.mask_id is None else self.mask_id
        return jnp.select([branch == 0, branch == 1, branch == 2],
                          [z_t.astype(jnp.int32), token, jnp.full(z_t.shape, mask_id, jnp.int32)],
                          uniform.astype(jnp.int32))

    def sample(self, key: jax.Array, x: jax.Array, t: jax.Array) -> jax.Array:
        """Draws ``z_t ~ q_t(. | x)`` for int tokens ``x`` [B, L] and times ``t`` [B] in [0, 1].
        int32 [B, L].

        Every process is ``x`` with probability ``alpha_t``, else a draw from ``pi_t``, and every
        ``pi_t`` here is a mix of ``[MASK]`` and uniform data ids, so one uniform number per token
        picks the branch and one uniform data id fills the uniform branch: O(B L) random bits,
        never a [B, L, V] Gumbel draw (which XLA generates whole on every device of a
        batch-sharded mesh: 95 GiB per chip for GIDD at the paper size).

        Every kind draws its branch number ``u`` from the same sub-key, so two processes sampled
        with one key and one ``t`` keep the same positions clean wherever their ``alpha_t`` agree
        (masked and uniform: everywhere): common random numbers for paired comparisons.
        """
        t = _times(t, "sample")[:, None]
        k_branch, k_data = jax.random.split(key)
        u = jax.random.uniform(k_branch, x.shape)
        keep = u < self.alpha(t)
        if self.kind == "masked":
            return jnp.where(keep, x, self.mask_id).astype(jnp.int32)
        data = jax.random.randint(k_data, x.shape, 0, self.num_classes)
        if self.kind == "uniform":
            return jnp.where(keep, x, data).astype(jnp.int32)
        # GIDD: [MASK] with mass (1 - a_t) / (1 + c_t), the data ids c_t / (1 + c_t) between them.
        to_mask = u < self.alpha(t) + (1.0 - self._a(t)) / (1.0 + self._c(t))
        return jnp.where(keep, x, jnp.where(to_mask, self.mask_id, data)).astype(jnp.int32)

    def prior_sample(self, key: jax.Array, shape: tuple[int, ...]) -> jax.Array:
        """``z_1`` from the limit distribution: all ``[MASK]`` (masked, gidd up to ``eps``) or
        uniform data ids (uniform). int32 ``shape``."""
        if self.kind == "uniform":
            return jax.random.randint(key, shape, 0, self.num_classes).astype(jnp.int32)
        return jnp.full(shape, self.mask_id, jnp.int32)


def antithetic_times(key: jax.Array, batch_size: int, t_min: float = 1e-3,
                     t_max: float = 1.0) -> jax.Array:
    """Stratified ("antithetic", MDLM Sec. 3.5) diffusion times: one uniform offset ``u``, then
    ``t_i = t_min + (t_max - t_min) * ((u + i / B) mod 1)``: exactly one time per stratum of width
    ``1/B``. float32 [B].

    Raises:
      ValueError: ``batch_size < 1`` or not ``0 <= t_min < t_max <= 1``.
    """
    if batch_size < 1:
        raise ValueError(f"antithetic_times: batch_size={batch_size} must be >= 1")
    if not 0.0 <= t_min < t_max <= 1.0:
        raise ValueError(f"antithetic_times: need 0 <= t_min < t_max <= 1, got {t_min}, {t_max}")
    u = jax.random.uniform(key, ())
    frac = jnp.mod(u + jnp.arange(batch_size, dtype=jnp.float32) / batch_size, 1.0)
    return t_min + (t_max - t_min) * frac


def denoiser_log_probs(process: Process, logits: jax.Array, z_t: jax.Array) -> jax.Array:
    """``log x_theta`` [B, L, V] float32 from raw logits: non-data ids (``[MASK]``, ``[BOS]``) get
    probability 0 (the "mask logit forced off"); for the masked process an unmasked ``z_t`` is
    carried over (``x_theta = onehot(z_t)``, MDLM's SUBS parametrisation)."""
    ids = jnp.arange(process.vocab_size)
    logits = jnp.where(ids < process.num_classes, logits.astype(jnp.float32), -jnp.inf)
    logp = jax.nn.log_softmax(logits, axis=-1)
    if process.kind == "masked":
        carry = jnp.where(ids == z_t[..., None], 0.0, -jnp.inf)
        logp = jnp.where((z_t != process.mask_id)[..., None], carry, logp)
    return logp


def nats_to_bpb(nats_per_token: float, bytes_per_token: float = 1.0) -> float:
    """Nats per token -> bits per byte."""
    return nats_per_token / math.log(2.0) / bytes_per_token
