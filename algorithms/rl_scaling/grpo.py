"""GRPO and Dr.GRPO: group-relative advantages, the PPO-clip surrogate, and a KL penalty to a frozen
reference policy with a selectable estimator.

Dimensions: R rollouts in a batch (R = B_p * n: B_p problems, n rollouts per problem), T completion
tokens (padded), G groups (= problems).

GRPO (Shao et al. 2024, "DeepSeekMath", Sec. 4.1, Eq. 3) scores each of the n completions of one
prompt relative to its group, A_i = (r_i - mean_g r) / (std_g r + eps), and maximises the PPO-clip
surrogate (Schulman et al. 2017, Eq. 7) per token,

    J = agg_t [ min(rho_t A, clip(rho_t, 1 - eps_low, 1 + eps_high) A) ] - beta * agg_t [ kl_t ],
    rho_t = pi_theta(y_t | x, y_<t) / pi_old(y_t | x, y_<t),

with an asymmetric upper clip eps_high ("clip-higher", Yu et al. 2025, DAPO, Sec. 3.1) and a
per-token penalty kl_t whose expected gradient is that of KL(pi_theta || pi_ref), the KL of the
policy from the reference (reverse KL, mode-seeking).

KL estimators (``GRPOConfig.kl_estimator``). With q = log pi_ref(y_t) - log pi_theta(y_t) at a
sampled token, Schulman (2020, "Approximating KL divergence", joschu.net/blog/kl-approx.html)
gives three estimators of the value KL(pi_theta || pi_ref) from samples of pi_theta:
k1 = -q (unbiased), k2 = q^2 / 2 (biased, low variance) and k3 = exp(q) - q - 1 (unbiased, >= 0).
Used as a loss, what matters is the expected gradient of the penalty, which is not the gradient of
the expected value: the sample's distribution depends on theta too, and the loss differentiates
only the log-probs of fixed samples. Per sampled token, d kl_t / d log pi_theta(y_t) is

  * ``"k3_ratio"`` (default): rho_t * k3 with rho_t = pi_theta / pi_old (pi_old held constant):
    rho_t log(pi_theta / pi_ref). Its expectation under pi_old is the gradient of
    KL(pi_theta || pi_ref) for any behaviour policy, on- and off-policy. This is the "unbiased KL
    estimate" of DeepSeek-AI 2025 (DeepSeek-V3.2, arXiv:2512.02556, Sec. 3.1, Eq. 7; TRL's
    ``GRPOConfig.use_bias_correction_kl``). Its value is also an unbiased estimate of
    KL(pi_theta || pi_ref) from samples of pi_old.
  * ``"k2"``: log(pi_theta / pi_ref): on-policy (pi_old = pi_theta) its expectation is the gradient
    of KL(pi_theta || pi_ref) too, but not once the samples are off-policy (inner steps after the
    first).
  * ``"k3"``: 1 - pi_ref / pi_theta, whose expectation under pi_theta is the gradient of
    KL(pi_ref || pi_theta) (forward KL, mass-covering), not of the reverse KL: this is the penalty
    of DeepSeekMath Eq. 3-4 as usually implemented (GRPO; verl's ``low_var_kl``), kept to reproduce
    it.

k1 is not offered: as a loss its gradient, 1 per token, has expectation E[grad log pi] = 0.

Dr.GRPO (Liu et al. 2025, "Understanding R1-Zero-Like Training", Sec. 3.2) removes the two biases:
advantages are mean-centred only (no std division) and tokens are summed and divided by a constant
(R * T) rather than by each sequence's length.

Aggregation modes (``GRPOConfig.aggregation``):
  * ``"seq_mean"``: mean over sequences of each sequence's token mean (GRPO as published);
  * ``"token_mean"``: sum over all tokens / number of valid tokens (DAPO's token-level mean);
  * ``"constant"``: sum over all tokens / (R * T) (Dr.GRPO's constant normaliser).

Temperature: the log-probs passed here must be those of the sampling policy, softmax(logits / tau)
at the rollout temperature tau, for the policy, the behaviour and the reference alike
(:func:`rollout.completion_logprobs` with ``temperature=tau``); otherwise rho is not 1 on-policy
and the surrogate is off-policy.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from kernels import checks

ADVANTAGE_MODES = ("grpo", "drgrpo")
AGGREGATIONS = ("seq_mean", "token_mean", "constant")
KL_ESTIMATORS = ("k3_ratio", "k2", "k3")
# A group whose reward spread is within this many float32 ulps of its largest |reward| is constant.
FLAT_ULPS = 8


@dataclasses.dataclass(frozen=True)
class GRPOConfig:
    """Static GRPO hyper-parameters (hashable; safe as a jit static argument).

    Attributes:
      advantage: ``"grpo"`` ((r - mean) / (std + eps)) or ``"drgrpo"`` (r - mean).
      aggregation: ``"seq_mean"``, ``"token_mean"`` or ``"constant"`` (see the module docstring).
      clip_eps: lower clip epsilon (ratio floor 1 - clip_eps).
      clip_eps_high: upper clip epsilon (ratio ceiling 1 + clip_eps_high); None = clip_eps.
      kl_beta: weight of the KL penalty to the frozen reference policy (0 disables it).
      kl_estimator: the per-token penalty (module docstring): ``"k3_ratio"`` (default; expected
        gradient that of KL(pi || pi_ref) on- and off-policy), ``"k2"`` (the same on-policy only)
        or ``"k3"`` (expected gradient that of KL(pi_ref || pi)).
      adv_eps: epsilon in the std normaliser.
      inner_steps: optimizer steps taken on each batch of rollouts (>= 1).
    """

    advantage: str = "grpo"
    aggregation: str = "seq_mean"
    clip_eps: float = 0.2
    clip_eps_high: float | None = None
    kl_beta: float = 0.0
    kl_estimator: str = "k3_ratio"
    adv_eps: float = 1e-6
    inner_steps: int = 1

    def __post_init__(self):
        if self.advantage not in ADVANTAGE_MODES:
            raise ValueError(f"GRPOConfig.advantage={self.advantage!r}: expected one of "
                             f"{ADVANTAGE_MODES}")
        if self.aggregation not in AGGREGATIONS:
            raise ValueError(f"GRPOConfig.aggregation={self.aggregation!r}: expected one of "
                             f"{AGGREGATIONS}")
        if self.kl_estimator not in KL_ESTIMATORS:
            raise ValueError(f"GRPOConfig.kl_estimator={self.kl_estimator!r}: expected one of "
                             f"{KL_ESTIMATORS}")
        checks.number(self.clip_eps, "clip_eps", "GRPOConfig", minimum=0.0, open_min=True)
        if self.clip_eps_high is not None:
            checks.number(self.clip_eps_high, "clip_eps_high", "GRPOConfig", minimum=0.0,
                          open_min=True)
        checks.number(self.kl_beta, "kl_beta", "GRPOConfig", minimum=0.0)
        checks.number(self.adv_eps, "adv_eps", "GRPOConfig", minimum=0.0)
        checks.integer(self.inner_steps, "inner_steps", "GRPOConfig", minimum=1)
        if not self.clip_eps > 0 or (self.clip_eps_high is not None and not self.clip_eps_high > 0):
            raise ValueError(f"GRPOConfig: clip epsilons must be > 0, got clip_eps={self.clip_eps}, "
                             f"clip_eps_high={self.clip_eps_high}")
        if self.kl_beta < 0 or self.adv_eps < 0:
            raise ValueError(f"GRPOConfig: kl_beta={self.kl_beta} and adv_eps={self.adv_eps} "
                             "must be >= 0")
        if self.inner_steps < 1:
            raise ValueError(f"GRPOConfig.inner_steps={self.inner_steps}: must be >= 1")

    @property
    def eps_high(self) -> float:
        return self.clip_eps if self.clip_eps_high is None else self.clip_eps_high

    def check_group_size(self, n: int) -> None:
        """Raises ValueError if ``n`` rollouts per problem cannot be group-normalised."""
        if self.advantage == "grpo" and n < 2:
            raise ValueError(f"group normalisation needs n >= 2 rollouts per problem, got n={n} "
                             "(the group std of one sample is 0)")
        if n < 1:
            raise ValueError(f"rollouts per problem n={n}: must be >= 1")


def group_advantages(rewards: jax.Array, group_size: jax.Array | int, *, mode: str = "grpo",
                     eps: float = 1e-6) -> jax.Array:
    """Group-relative advantages (GRPO Eq. 3 outcome supervision; Dr.GRPO Sec. 3.2).

    Rollout ``r`` belongs to group ``r // group_size`` (the n rollouts of one problem are
    contiguous). ``group_size`` may be a traced integer, so runs with different n but equal
    R = B_p * n share one compiled function and can be vmapped together.

    The rewards are centred in two steps: first relative to the group's first reward (an exact
    float subtraction for rewards of similar magnitude, so equal rewards give exact zeros whatever
    their size), then by the mean of those differences. A group whose spread ``max - min`` is at the
    float32 rounding level of its rewards (at most :data:`FLAT_ULPS` units in the last place of
    ``max |r|``) counts as constant: its advantages are exactly 0 in both modes, rather than
    rounding noise divided by a tiny std.

    Args:
      rewards: float [R] (cast to float32); R must be a multiple of ``group_size``.
      group_size: n >= 1 (>= 2 for ``mode="grpo"``; the caller validates static n with
        :meth:`GRPOConfig.check_group_size`).
      mode: ``"grpo"``: (r - mean_g) / (std_g + eps) with the population std (ddof = 0);
        ``"drgrpo"``: r - mean_g.
      eps: normaliser epsilon (>= 0; constant groups give 0 even with ``eps = 0``).

    Returns:
      float32 [R]: zero mean within every group; unit population std within every group whose
      rewards are not all equal (up to eps) for ``"grpo"``; exactly 0 for constant groups. Shifting
      all rewards by a constant leaves the advantages unchanged (exactly so when the shifted rewards
      are exact in float32); scaling them by ``a > 0`` scales ``"drgrpo"`` advantages by ``a`` and
      leaves ``"grpo"`` ones unchanged (for ``eps`` small against the group std).

    Raises:
      ValueError: unknown mode, or R not a multiple of a concrete ``group_size``.
    """
    if mode not in ADVANTAGE_MODES:
        raise ValueError(f"advantage mode {mode!r}: expected one of {ADVANTAGE_MODES}")
    rewards = jnp.asarray(rewards, jnp.float32)
    checks.array(rewards, "rewards", "group_advantages", ndim=1)
    r = rewards.shape[0]
    if not checks.is_traced(group_size) and getattr(group_size, "ndim", 0) == 0:
        checks.integer(int(group_size) if hasattr(group_size, "dtype") and jnp.issubdtype(
            group_size.dtype, jnp.integer) else group_size, "group_size", "group_advantages",
            minimum=1)
    if isinstance(group_size, int) and (group_size < 1 or r % group_size):
        raise ValueError(f"group_advantages: {r} rewards are not a whole number of groups of "
                         f"size {group_size}")
    seg = jnp.arange(r) // group_size
    size = jnp.asarray(group_size, jnp.float32)
    # Differences to the group's first reward are exact for nearby values (Sterbenz), so a constant
    # group is exactly zero here and its mean below is exactly zero too.
    shifted = rewards - rewards[seg * group_size]
    mean = jax.ops.segment_sum(shifted, seg, num_segments=r) / size
    centred = shifted - mean[seg]
    spread = (jax.ops.segment_max(rewards, seg, num_segments=r)
              - jax.ops.segment_min(rewards, seg, num_segments=r))
    scale = jax.ops.segment_max(jnp.abs(rewards), seg, num_segments=r)
    flat = (spread <= FLAT_ULPS * jnp.finfo(jnp.float32).eps * scale)[seg]
    centred = jnp.where(flat, 0.0, centred)
    if mode == "drgrpo":
        return centred
    # The std is taken of the centred rewards divided by their largest magnitude m, so squares of
    # tiny rewards do not underflow: (r - mean) / (std + eps) = u / (std(u) + eps / m).
    m = jnp.where(flat, 1.0, jax.ops.segment_max(jnp.abs(centred), seg, num_segments=r)[seg])
    u = centred / m
    std_u = jnp.sqrt(jax.ops.segment_sum(u**2, seg, num_segments=r) / size)[seg]
    return jnp.where(flat, 0.0, u / jnp.where(flat, 1.0, std_u + eps / m))


def k3_kl(logp: jax.Array, ref_logp: jax.Array) -> jax.Array:
    """Per-token k3 estimate of the value KL(pi || pi_ref) from samples of pi: exp(q) - q - 1,
    q = ref_logp - logp (Schulman 2020). Non-negative; 0 where the log-probs agree. Same shape.

    As a loss its expected gradient is that of KL(pi_ref || pi), not KL(pi || pi_ref) (module
    docstring); :func:`kl_penalty` with ``"k3_ratio"`` is the penalty for the latter."""
    q = ref_logp - logp
    return jnp.exp(q) - q - 1.0


def kl_penalty(logp: jax.Array, old_logp: jax.Array, ref_logp: jax.Array,
               estimator: str = "k3_ratio") -> jax.Array:
    """Per-token KL penalty to the reference policy, to be minimised (module docstring).

    Args:
      logp: float [R, T] current-policy log-probs of the sampled tokens (differentiable).
      old_logp: float [R, T] behaviour-policy log-probs (held constant; used by ``"k3_ratio"``).
      ref_logp: float [R, T] reference-policy log-probs (held constant).
      estimator: ``"k3_ratio"``: exp(logp - old_logp) * k3 (DeepSeek-V3.2, Eq. 7), expected
        gradient grad KL(pi || pi_ref) under samples of pi_old; ``"k2"``: (logp - ref_logp)^2 / 2,
        the same gradient on-policy only; ``"k3"``: :func:`k3_kl`, expected gradient
        grad KL(pi_ref || pi) (Schulman 2020).

    Returns:
      float32 [R, T].

    Raises:
      ValueError: unknown estimator.
    """
    old_logp = jax.lax.stop_gradient(old_logp)
    ref_logp = jax.lax.stop_gradient(ref_logp)
    if estimator == "k3_ratio":
        return jnp.exp(logp - old_logp) * k3_kl(logp, ref_logp)
    if estimator == "k2":
        return 0.5 * jnp.square(logp - ref_logp)
    if estimator == "k3":
        return k3_kl(logp, ref_logp)
    raise ValueError(f"kl_penalty: estimator {estimator!r}: expected one of {KL_ESTIMATORS}")


def clipped_surrogate(logp: jax.Array, old_logp: jax.Array, adv: jax.Array, clip_eps: float,
                      clip_eps_high: float) -> jax.Array:
    """Per-token PPO-clip objective min(rho A, clip(rho, 1 - eps, 1 + eps_high) A) (to maximise).

    Its gradient in ``logp`` is zero where the clip is active in the direction the advantage pushes
    (rho > 1 + eps_high with A > 0; rho < 1 - eps with A < 0) and rho * A elsewhere.

    Args:
      logp, old_logp: float [R, T] log-probabilities of the sampled tokens (new, behaviour).
      adv: float [R] (broadcast over tokens) or [R, T].

    Returns:
      float32 [R, T].
    """
    adv = adv[:, None] if adv.ndim == 1 else adv
    ratio = jnp.exp(logp - old_logp)
    clipped = jnp.clip(ratio, 1.0 - clip_eps, 1.0 + clip_eps_high)
    return jnp.minimum(ratio * adv, clipped * adv)


def aggregate(per_token: jax.Array, mask: jax.Array, mode: str) -> jax.Array:
    """Reduces per-token values [R, T] with a validity mask [R, T] to a scalar (module docstring).

    Sequences with no valid token contribute 0 under ``"seq_mean"``.
    """
    mask = mask.astype(per_token.dtype)
    total = per_token * mask
    if mode == "seq_mean":
        length = mask.sum(axis=1)
        return jnp.mean(total.sum(axis=1) / jnp.maximum(length, 1.0))
    if mode == "token_mean":
        return total.sum() / jnp.maximum(mask.sum(), 1.0)
    if mode == "constant":
        return total.sum() / per_token.size
    raise ValueError(f"aggregation {mode!r}: expected one of {AGGREGATIONS}")


def grpo_loss(logp: jax.Array, old_logp: jax.Array, adv: jax.Array, mask: jax.Array,
              cfg: GRPOConfig, ref_logp: jax.Array | None = None
              ) -> tuple[jax.Array, dict[str, jax.Array]]:
    """The GRPO loss (negated objective, to minimise) and diagnostics.

    Args:
      logp: float [R, T] current-policy log-probs of the sampled tokens (differentiable).
      old_logp: float [R, T] behaviour-policy log-probs (treated as constants).
      adv: float [R] advantages (constants).
      mask: bool/float [R, T], 1 on completion tokens up to and including the end token.
      cfg: :class:`GRPOConfig`.
      ref_logp: float [R, T] reference-policy log-probs (constants); required iff
        ``cfg.kl_beta > 0``. All three log-prob arrays must be taken at the sampling temperature.

    Returns:
      (scalar loss, {"clip_frac", "kl", "ratio_mean"}) where clip_frac is the share of valid tokens
      whose ratio lies outside the trust region and kl (0 when ``kl_beta = 0``) the token mean of
      rho * k3, an unbiased estimate of KL(pi || pi_ref) per token from the behaviour samples,
      whichever estimator the penalty uses.

    Raises:
      ValueError: ``kl_beta > 0`` without ``ref_logp``, or mismatched shapes.
    """
    if logp.shape != old_logp.shape or logp.shape != mask.shape or adv.shape[0] != logp.shape[0]:
        raise ValueError(f"grpo_loss: shapes logp {logp.shape}, old_logp {old_logp.shape}, "
                         f"mask {mask.shape}, adv {adv.shape} do not agree ([R, T] and [R])")
    old_logp = jax.lax.stop_gradient(old_logp)
    adv = jax.lax.stop_gradient(adv)
    surr = clipped_surrogate(logp, old_logp, adv, cfg.clip_eps, cfg.eps_high)
    per_token = -surr
    ratio = jnp.exp(logp - old_logp)
    maskf = mask.astype(jnp.float32)
    kl = jnp.zeros((), jnp.float32)
    if cfg.kl_beta > 0:
        if ref_logp is None:
            raise ValueError("grpo_loss: kl_beta > 0 needs ref_logp (the reference policy's "
                             "log-probs)")
        if ref_logp.shape != logp.shape:
            raise ValueError(f"grpo_loss: ref_logp {ref_logp.shape} and logp {logp.shape} differ")
        ref_logp = jax.lax.stop_gradient(ref_logp)
        per_token = per_token + cfg.kl_beta * kl_penalty(logp, old_logp, ref_logp,
                                                         cfg.kl_estimator)
        kl = aggregate(ratio * k3_kl(logp, ref_logp), maskf, "token_mean")
    loss = aggregate(per_token, maskf, cfg.aggregation)
    outside = ((ratio > 1.0 + cfg.eps_high) | (ratio < 1.0 - cfg.clip_eps)).astype(jnp.float32)
    denom = jnp.maximum(maskf.sum(), 1.0)
    metrics = {"clip_frac": jax.lax.stop_gradient((outside * maskf).sum() / denom),
               "kl": jax.lax.stop_gradient(kl),
               "ratio_mean": jax.lax.stop_gradient((ratio * maskf).sum() / denom)}
    return loss, metrics
