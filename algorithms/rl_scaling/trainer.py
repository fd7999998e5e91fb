"""The jitted GRPO step, the supervised warm-start loss, exact pass probabilities and the
per-problem gradient probe.

Dimensions: N problems in a pool, R = B_p * n rollouts per step, B_p problems per step, n rollouts
per problem, Lp prompt length, T completion length, D parameter count.

One RL step (Cheng et al. 2026, Sec. 2; GRPO, Shao et al. 2024, Sec. 4.1):
  1. draw B_p distinct training problems, repeat each n times (rollout r solves problem r // n);
  2. sample R completions with the KV cache (:func:`rollout.rollout`), each prompt prefilled once
     and shared by its n rollouts, and score them with the exact-match checker;
  3. group-relative advantages;
  4. ``inner_steps`` optimizer steps on the GRPO loss over the same rollouts; the behaviour
     log-probs are the first inner step's own teacher-forced log-probs (taken at the current
     params, so its ratio is exactly 1), which saves a separate forward pass;
  5. diagnostics, among them interference: the exact pass probability of each batch problem before
     and after the update (one correct completion, so p = pi(answer | prompt) exactly).

Every log-prob of the step (current, behaviour, reference, and the pass-probability probes) is
under the sampling policy softmax(logits / tau) at the rollout temperature tau = ``RLSpec.temperature``
(:mod:`rollout`, "Temperature"), so the first inner step is exactly on-policy at any tau.

``n`` is a traced scalar and R is static, so every (n, B_p) with the same R = n * B_p runs in one
compiled function and can be ``vmap``-ed together with seeds. Shapes that depend on B_p = R / n
use the static bound G = ``RLSpec.max_problems`` >= R / n (rows past B_p are masked out).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from algorithms.rl_scaling import grpo, metrics, rollout, tasks
from models.transformer import TransformerConfig

PyTree = Any


@dataclasses.dataclass(frozen=True)
class RLSpec:
    """Static settings of one compiled RL step.

    Attributes:
      rollouts_per_step: R = n * B_p (static; n is passed at run time).
      max_new_tokens: T, completion length cap.
      grpo: the GRPO/Dr.GRPO loss configuration.
      temperature: rollout sampling temperature tau; the loss's log-probs (current, behaviour,
        reference) and the pass-rate probes are all under softmax(logits / tau).
      end_id: end-of-answer token.
      max_problems: G, the static number of distinct-problem rows per step: at least
        B_p = R / n for every n the step is called with, i.e. R // (smallest n); None = R (any n).
        Prompts are prefilled, and the pass rates probed, on G rows instead of R.
    """

    rollouts_per_step: int
    max_new_tokens: int
    grpo: grpo.GRPOConfig = grpo.GRPOConfig()
    temperature: float = 1.0
    end_id: int = tasks.END_ID
    max_problems: int | None = None

    def __post_init__(self):
        if self.rollouts_per_step < 2 or self.max_new_tokens < 1 or not self.temperature > 0:
            raise ValueError(f"RLSpec: need rollouts_per_step >= 2, max_new_tokens >= 1, "
                             f"temperature > 0; got {self}")
        if self.max_problems is not None and not 1 <= self.max_problems <= self.rollouts_per_step:
            raise ValueError(f"RLSpec.max_problems={self.max_problems}: expected 1 <= max_problems"
                             f" <= rollouts_per_step={self.rollouts_per_step}")

    @property
    def problem_rows(self) -> int:
        """G: distinct-problem rows per step (``max_problems``, default R)."""
        return self.rollouts_per_step if self.max_problems is None else self.max_problems


def policy_config(model: Any, prompt_len: int, answer_len: int) -> TransformerConfig:
    """The policy's :class:`~models.transformer.TransformerConfig` from a config's ``model``
    fields (``d_model``, ``num_layers``, ``num_heads``, ``mlp_dim``, ``dtype``, ``remat``: any
    object with those attributes) for prompts of ``prompt_len`` and answers of ``answer_len``
    tokens, over the byte vocabulary (:data:`tasks.VOCAB_SIZE`).

    Raises:
      ValueError: a field the model refuses (``TransformerConfig`` checks them).
    """
    return TransformerConfig(
        vocab_size=tasks.VOCAB_SIZE, max_len=prompt_len + answer_len, d_model=model.d_model,
        num_layers=model.num_layers, num_heads=model.num_heads, mlp_dim=model.mlp_dim,
        dtype=jnp.dtype(model.dtype), remat=model.remat)


def target_mask(target_len: jax.Array, length: int) -> jax.Array:
    """bool [N, T]: True on the first ``target_len`` tokens of each target."""
    return jnp.arange(length)[None, :] < target_len[:, None]


def answer_logprob(model: nnx.Module, prompts: jax.Array, targets: jax.Array,
                   target_len: jax.Array, temperature: float = 1.0) -> jax.Array:
    """log pi_tau(answer | prompt), float32 [N]: the teacher-forced log-probability of the one
    correct completion (digits + end token) under softmax(logits / ``temperature``). exp of it is
    the exact pass@1 of sampling at that temperature."""
    logp = rollout.completion_logprobs(model, prompts, targets, temperature=temperature)
    return (logp * target_mask(target_len, targets.shape[1])).sum(axis=1)


def answer_prob(graphdef: nnx.GraphDef, params: nnx.State, prompts: jax.Array,
                targets: jax.Array, target_len: jax.Array, temperature: float = 1.0
                ) -> jax.Array:
    """Exact pass@1 per problem of sampling at ``temperature``, float32 [N] in [0, 1] (see
    :func:`answer_logprob`)."""
    return jnp.exp(answer_logprob(nnx.merge(graphdef, params), prompts, targets, target_len,
                                  temperature))


def policy_logprobs(graphdef: nnx.GraphDef, params: nnx.State, prompts: jax.Array,
                    completions: jax.Array, prompt_rows: jax.Array | None, temperature: float
                    ) -> jax.Array:
    """The log-probs the GRPO loss uses, float32 [R, T]: teacher-forced log softmax(logits / tau)
    of ``completions`` [R, T] at the sampling temperature tau = ``temperature``, for the current,
    behaviour and reference parameters alike (:func:`make_rl_step`). ``prompts`` is [G, Lp] with
    ``prompt_rows`` int32 [R] (or [R, Lp] with None), as in :func:`rollout.completion_logprobs`.
    Differentiable in ``params``. On the rollout's own samples it equals the log-probs
    :func:`rollout.rollout` returns, so the first inner step's ratio is 1.

    Raises:
      ValueError: as :func:`rollout.completion_logprobs`.
    """
    return rollout.completion_logprobs(nnx.merge(graphdef, params), prompts, completions,
                                       prompt_rows, temperature=temperature)


def sft_loss(model: nnx.Module, batch: dict[str, jax.Array], key: jax.Array
             ) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Warm-start loss: mean negative log-likelihood per answer token of the correct completion.

    ``batch`` = {"prompts" [B, Lp], "targets" [B, T], "lens" [B]}. Signature of
    :func:`core.training.make_train_step`.
    """
    del key
    logp = rollout.completion_logprobs(model, batch["prompts"], batch["targets"])
    mask = target_mask(batch["lens"], batch["targets"].shape[1]).astype(jnp.float32)
    nll = -(logp * mask).sum() / mask.sum()
    seq_ok = jnp.exp((logp * mask).sum(axis=1)).mean()
    return nll, {"answer_prob": seq_ok}


def sample_batch(key: jax.Array, pool_size: int, rollouts: int, n: jax.Array
                 ) -> tuple[jax.Array, jax.Array]:
    """Problem ids for one step: (problem of each rollout int32 [R] (= ids[r // n]), the distinct
    problem ids int32 [R] of which the first B_p = R // n are in the batch).

    Raises:
      ValueError: the pool has fewer than R problems.
    """
    if pool_size < rollouts:
        raise ValueError(f"sample_batch: training pool of {pool_size} problems is smaller than "
                         f"R={rollouts} rollouts per step")
    ids = jax.random.permutation(key, pool_size)[:rollouts].astype(jnp.int32)
    return ids[jnp.arange(rollouts) // n], ids


def make_rl_step(graphdef: nnx.GraphDef, tx: optax.GradientTransformation, spec: RLSpec
                 ) -> Callable[..., tuple[nnx.State, PyTree, dict[str, jax.Array]]]:
    """A pure GRPO step ``step(params, opt_state, key, n, pool, ref_params, rollout_key)``.

    Args of the returned function:
      params, opt_state: policy parameters and optimizer state.
      key: PRNG key; the first half of ``split(key)`` draws the batch's problems, the second
        samples the rollouts unless ``rollout_key`` is given.
      n: int32 scalar, rollouts per problem; must divide R with R / n <= ``spec.problem_rows``
        (and n >= 2 for "grpo" advantages); checked by the caller, e.g. with
        :class:`allocation.Allocation`, since n may be traced.
      pool: {"prompts" int32 [N, Lp], "targets" int32 [N, T], "lens" int32 [N]} training problems.
      ref_params: reference-policy parameters for the KL term (None when kl_beta = 0).
      rollout_key: optional PRNG key of the rollouts' sampling, a stream separate from the
        batch's problems (``algorithms.rl_scaling.sweep.lane_keys``).

    Returns:
      (params, opt_state, metrics) with scalar metrics: reward (mean over rollouts), informative
      (share of groups with mixed rewards), loss, clip_frac, ratio_mean, kl and grad_norm (each
      the mean over the ``inner_steps`` optimizer steps, as TRL's GRPOTrainer and verl average
      them over their updates on one batch; the first step's ratio is exactly 1, so its own
      clip_frac is 0), pass_before / pass_after (mean exact pass@1 of the batch problems at the
      sampling temperature), fallen (share of batch problems whose pass@1 fell), length (mean
      completion tokens).
    """
    cfg = spec.grpo
    r, t, g = spec.rollouts_per_step, spec.max_new_tokens, spec.problem_rows
    ref_needed = cfg.kl_beta > 0

    def step(params, opt_state, key, n, pool, ref_params=None, rollout_key=None):
        if ref_needed and ref_params is None:
            raise ValueError("make_rl_step: kl_beta > 0 needs ref_params")
        k_batch, k_roll = jax.random.split(key)
        k_roll = k_roll if rollout_key is None else rollout_key
        prob_of_rollout, ids = sample_batch(k_batch, pool["prompts"].shape[0], r, n)
        rows = jnp.arange(r) // n  # rollout -> its problem's row among the first B_p of ids
        problems = ids[:g]
        prompts = pool["prompts"][problems]
        completions, _, mask = rollout.rollout(graphdef, params, prompts, k_roll,
                                               max_new_tokens=t, end_id=spec.end_id,
                                               temperature=spec.temperature, prompt_rows=rows)
        rewards = tasks.exact_match(completions, pool["targets"][prob_of_rollout],
                                    pool["lens"][prob_of_rollout])
        adv = grpo.group_advantages(rewards, n, mode=cfg.advantage, eps=cfg.adv_eps)

        def logp_fn(p):
            return policy_logprobs(graphdef, p, prompts, completions, rows, spec.temperature)

        ref_logp = jax.lax.stop_gradient(logp_fn(ref_params)) if ref_needed else None

        def loss_fn(p, old_logp, first):
            logp = logp_fn(p)
            # The first inner step runs at the behaviour policy: its own log-probs are old_logp.
            old_logp = jnp.where(first, jax.lax.stop_gradient(logp), old_logp)
            loss, aux = grpo.grpo_loss(logp, old_logp, adv, mask, cfg, ref_logp)
            return loss, (aux, old_logp)

        def inner(carry, first):
            p, o, old_logp = carry
            (loss, (aux, old_logp)), grads = jax.value_and_grad(loss_fn, has_aux=True)(
                p, old_logp, first)
            updates, o = tx.update(grads, o, p)
            return (optax.apply_updates(p, updates), o, old_logp), {
                "loss": loss, "grad_norm": optax.tree.norm(grads), **aux}

        # Exact pass@1 of the batch's distinct problems before and after the update.
        batch_valid = jnp.arange(g) < r // n
        probe = (prompts, pool["targets"][problems], pool["lens"][problems])
        before = answer_prob(graphdef, params, *probe, spec.temperature)
        firsts = jnp.arange(cfg.inner_steps) == 0
        (new_params, opt_state, _), inner_m = jax.lax.scan(
            inner, (params, opt_state, jnp.zeros((r, t), jnp.float32)), firsts)
        after = answer_prob(graphdef, new_params, *probe, spec.temperature)

        group_mean = jax.ops.segment_sum(rewards, rows, num_segments=g) / n
        mixed = ((group_mean > 0) & (group_mean < 1)).astype(jnp.float32)
        validf = batch_valid.astype(jnp.float32)
        out = {
            "reward": rewards.mean(),
            "informative": (mixed * validf).sum() / validf.sum(),
            "pass_before": (before * validf).sum() / validf.sum(),
            "pass_after": (after * validf).sum() / validf.sum(),
            "fallen": metrics.fraction_fallen(before, after, batch_valid),
            "length": mask.sum(axis=1).astype(jnp.float32).mean(),
            # Means over the inner steps, as TRL and verl log them: the first step's ratio is 1
            # by construction, so its clip_frac is 0 and it alone would say nothing.
            **{k: v.mean() for k, v in inner_m.items()},
        }
        return new_params, opt_state, out

    return step


def per_problem_gradients(graphdef: nnx.GraphDef, params: nnx.State, prompts: jax.Array,
                          completions: jax.Array, mask: jax.Array, rewards: jax.Array,
                          n: jax.Array | int, cfg: grpo.GRPOConfig, temperature: float = 1.0
                          ) -> jax.Array:
    """Flattened GRPO gradients of each problem's own loss from its first ``n`` rollouts.

    Args:
      prompts: int32 [G, Lp]; completions: int32 [G, N, T]; mask: bool [G, N, T];
      rewards: float32 [G, N] (N rollouts sampled per problem).
      n: group size, 1 <= n <= N; may be traced, so one compiled function serves every n.
      cfg: the loss configuration (first inner step: ratio 1, so the clip is inactive).
      temperature: the temperature the completions were sampled at (log-probs under
        softmax(logits / temperature)).

    Returns:
      float32 [G, D]: for each problem, a positive multiple of the gradient of the GRPO loss on
      rollouts 0..n-1 alone (the multiple comes from aggregation denominators that count all N rows;
      cosines are unaffected). Rows are 0 for problems whose first n rewards are all equal.
    """
    g, num, _ = completions.shape
    p = prompts.shape[1]
    valid = jnp.arange(num) < n
    validf = valid.astype(jnp.float32)
    size = jnp.asarray(n, jnp.float32)
    mean = (rewards * validf).sum(axis=1, keepdims=True) / size
    centred = (rewards - mean) * validf
    if cfg.advantage == "grpo":
        std = jnp.sqrt((centred**2).sum(axis=1, keepdims=True) / size)
        adv = centred / (std + cfg.adv_eps)
    else:
        adv = centred
    del g

    def one(args):
        prompt, comp, msk, ad = args

        def loss(prm):
            model = nnx.merge(graphdef, prm)
            logp = rollout.completion_logprobs(model, jnp.broadcast_to(prompt, (num, p)), comp,
                                               temperature=temperature)
            return grpo.grpo_loss(logp, jax.lax.stop_gradient(logp), ad, msk & valid[:, None],
                                  cfg)[0]

        grads = jax.grad(loss)(params)
        return jnp.concatenate([x.ravel() for x in jax.tree.leaves(grads)])

    return jax.lax.map(one, (prompts, completions, mask, adv))


def group_gradient_cosine(graphdef: nnx.GraphDef, params: nnx.State, key: jax.Array,
                          prompts: jax.Array, targets: jax.Array, target_len: jax.Array, *,
                          ns: tuple[int, ...], max_new_tokens: int, cfg: grpo.GRPOConfig,
                          end_id: int = tasks.END_ID, temperature: float = 1.0
                          ) -> tuple[jax.Array, jax.Array]:
    """Mean cosine between per-problem GRPO gradients estimated from n rollouts each, per n.

    For each of the G problems (``prompts`` [G, Lp], ``targets`` [G, T], ``target_len`` [G]) sample
    N = max(ns) completions once; for each n in ``ns`` take each problem's gradient from its first
    n rollouts (:func:`per_problem_gradients`, nested samples, one compilation for all n) and
    return :func:`metrics.mean_pairwise_cosine` over the problems with a non-zero gradient.
    The completions are sampled at ``temperature`` and the gradients taken with log-probs at the
    same temperature (the GRPO step's policy). Jittable with ``ns``, ``max_new_tokens``, ``cfg``,
    ``end_id`` and ``temperature`` static.

    Returns:
      (mean cosine float32 [K], number of contributing pairs int32 [K]) for K = len(ns).

    Raises:
      ValueError: empty ``ns`` or an n not allowed by ``cfg`` (n < 2 with group normalisation).
    """
    if not ns:
        raise ValueError("group_gradient_cosine: ns is empty")
    for n in ns:
        cfg.check_group_size(n)
    g, num = prompts.shape[0], max(ns)
    rep = jnp.repeat(jnp.arange(g), num)
    completions, _, mask = rollout.rollout(graphdef, params, prompts[rep], key,
                                           max_new_tokens=max_new_tokens, end_id=end_id,
                                           temperature=temperature)
    rewards = tasks.exact_match(completions, targets[rep], target_len[rep]).reshape(g, num)
    comp = completions.reshape(g, num, -1)
    msk = mask.reshape(g, num, -1)

    def for_n(n):
        return metrics.mean_pairwise_cosine(
            per_problem_gradients(graphdef, params, prompts, comp, msk, rewards, n, cfg,
                                  temperature))

    return jax.vmap(for_n)(jnp.asarray(ns, jnp.int32))


def sampled_correct(graphdef: nnx.GraphDef, params: nnx.State, key: jax.Array,
                    prompts: jax.Array, targets: jax.Array, target_len: jax.Array, *,
                    num_samples: int, temperature: float = 1.0, end_id: int = tasks.END_ID
                    ) -> jax.Array:
    """Correct completions out of ``num_samples`` sampled per problem: int32 [N].

    The input of the unbiased pass@k estimator (:func:`metrics.pass_at_k`, Chen et al. 2021,
    Eq. 1). Each prompt [N, Lp] is prefilled once and shared by its samples. Jittable with
    ``num_samples``, ``temperature`` and ``end_id`` static.

    Raises:
      ValueError: num_samples < 1.
    """
    if num_samples < 1:
        raise ValueError(f"sampled_correct: num_samples={num_samples}: expected >= 1")
    n = prompts.shape[0]
    rows = jnp.repeat(jnp.arange(n), num_samples)
    toks, _, _ = rollout.rollout(graphdef, params, prompts, key, max_new_tokens=targets.shape[1],
                                 end_id=end_id, temperature=temperature, prompt_rows=rows)
    correct = tasks.exact_match(toks, targets[rows], target_len[rows])
    return correct.reshape(n, num_samples).sum(axis=1).astype(jnp.int32)
