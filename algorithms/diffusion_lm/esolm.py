"""Eso-LM: interpolating autoregressive and masked diffusion (Sahoo et al. 2025, "Esoteric Language
Models"; the Eso-LM (B) variant with causal attention in a permuted order).

Dimensions: B batch, L sequence, V vocabulary.

Generation has two phases. A masked diffusion with ``alpha_t = alpha_0 (1 - (1 - eps) t)`` turns the
all-``[MASK]`` sequence into ``z_0`` in which a fraction ``alpha_0`` of tokens is clean; then an
autoregressive pass fills the remaining masks left to right. The NELBO (Eso-LM Eq. 9) is the sum of
the two parts::

    -log p(x) <= E_{z_0 ~ q_0} sum_{l: z_0^l = m} -log p(x^l | z_0, x^{<l})          (AR part)
                 + int_0^1 -alpha'_t / (1 - alpha_t) E_{z_t} sum_{l: z_t^l = m} -log p(x^l | z_t) dt.

Attention follows a *rank* order: clean tokens first (in the order they were revealed, random),
then the masked ones. Clean tokens attend causally in that order, so their keys and values never
change once written (the property that allows Eso-LM's KV cache); a ``[MASK]`` query attends to every
clean token and itself. ``alpha_0 = 1`` removes the AR part and leaves masked diffusion.

The AR part is computed in one forward of length 2L: L clean "key" copies of ``x`` followed by L
``[MASK]`` queries at the same RoPE positions, with ranks clean-of-``z_0`` first (random order) and
then the masked positions left to right.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from algorithms.diffusion_lm.processes import Process, denoiser_log_probs
from core import sampling


def clean_first_ranks(key: jax.Array, clean: jax.Array, masked_left_to_right: bool = False
                      ) -> jax.Array:
    """A permutation rank [B, L] int32 per row: clean positions get ranks ``0..n_clean-1`` in random
    order; masked positions follow (random order, or left to right if ``masked_left_to_right``)."""
    b, l = clean.shape
    u = jax.random.uniform(key, (b, l))
    if masked_left_to_right:
        sort_key = jnp.where(clean, u, 1.0 + jnp.arange(l) / l)
    else:
        sort_key = jnp.where(clean, u, 1.0 + u)
    return jnp.argsort(jnp.argsort(sort_key, axis=-1), axis=-1).astype(jnp.int32)


def diffusion_mask(clean: jax.Array, rank: jax.Array) -> jax.Array:
    """bool [B, L, L] (query i, key j): clean keys with ``rank_j <= rank_i``, and the diagonal."""
    l = clean.shape[1]
    vis = clean[:, None, :] & (rank[:, None, :] <= rank[:, :, None])
    return vis | jnp.eye(l, dtype=bool)[None]


def ar_mask(rank: jax.Array) -> jax.Array:
    """bool [B, 2L, 2L] for the sequence ``[x copies (L); [MASK] queries (L)]``: copies attend
    copies with ``rank_j <= rank_i``; query i attends copies with ``rank_j < rank_i`` and itself."""
    b, l = rank.shape
    copies = rank[:, None, :] <= rank[:, :, None]
    q_to_copies = rank[:, None, :] < rank[:, :, None]
    eye = jnp.broadcast_to(jnp.eye(l, dtype=bool), (b, l, l))
    top = jnp.concatenate([copies, jnp.zeros_like(copies)], axis=2)
    bottom = jnp.concatenate([q_to_copies, eye], axis=2)
    return jnp.concatenate([top, bottom], axis=1)


def nelbo_terms(apply_fn, process: Process, x: jax.Array, key: jax.Array, t: jax.Array
                ) -> tuple[jax.Array, jax.Array]:
    """Per-token (diffusion part, AR part), float32 [B, L] each; their sum is the NELBO integrand.

    Args:
      apply_fn: ``(tokens [B, T], positions [B, T], mask [B, T, T]) -> logits [B, T, V]``.
      process: a ``masked`` process (its ``alpha0`` sets the AR share).
      x: int [B, L] clean tokens.
      key: PRNG key.
      t: float32 [B] diffusion times.

    Raises:
      ValueError: the process is not ``masked``.
    """
    if process.kind != "masked":
        raise ValueError(f"Eso-LM needs a masked process, got {process.kind!r}")
    b, l = x.shape
    k_zt, k_rt, k_z0, k_r0 = jax.random.split(key, 4)
    pos = jnp.broadcast_to(jnp.arange(l, dtype=jnp.int32), (b, l))
    z_t = process.sample(k_zt, x, t)
    clean_t = z_t != process.mask_id
    logits = apply_fn(z_t, pos, diffusion_mask(clean_t, clean_first_ranks(k_rt, clean_t)))
    logp = denoiser_log_probs(process, logits, z_t)
    ce = -jnp.take_along_axis(logp, x[..., None], axis=-1)[..., 0]
    weight = -process.alpha_prime(t) / process.beta(t)
    diffusion = jnp.where(clean_t, 0.0, weight[:, None] * ce)
    if process.alpha0 == 1.0:
        return diffusion, jnp.zeros_like(diffusion)
    clean_0 = jax.random.uniform(k_z0, (b, l)) < process.alpha0
    rank = clean_first_ranks(k_r0, clean_0, masked_left_to_right=True)
    tokens = jnp.concatenate([x, jnp.full_like(x, process.mask_id)], axis=1)
    logits2 = apply_fn(tokens, jnp.concatenate([pos, pos], axis=1), ar_mask(rank))[:, l:]
    all_masked = jnp.full_like(x, process.mask_id)
    logp2 = denoiser_log_probs(process, logits2, all_masked)
    ar = jnp.where(clean_0, 0.0, -jnp.take_along_axis(logp2, x[..., None], axis=-1)[..., 0])
    return diffusion, ar


def sample(apply_fn, process: Process, key: jax.Array, batch_size: int, seq_len: int,
           num_steps: jax.Array) -> jax.Array:
    """Eso-LM generation: ``num_steps`` diffusion steps, then AR over the remaining masks.

    At the step ``t -> s`` the number of tokens revealed is ``k ~ Binomial(remaining,
    (alpha_s - alpha_t) / (1 - alpha_t))`` (Eso-LM Sec. 4.2), taken in a random order drawn up front;
    each is sampled from ``x_theta`` over the data ids with the exact float32 draw
    :func:`core.sampling.categorical` (as is every AR token). The AR phase then decodes the masked
    positions left to right.
    Every forward uses the clean-first causal order of training (one full pass per step here; the
    clean tokens' keys/values are the ones a KV cache would keep).

    Args:
      apply_fn: as in :func:`nelbo_terms`.
      num_steps: int32 scalar >= 1 (may be traced: one compilation serves every setting).

    Returns:
      int32 [B, L] with no ``[MASK]`` left.
    """
    b, l = batch_size, seq_len
    k_perm, k_steps, k_ar = jax.random.split(key, 3)
    order = jax.random.uniform(k_perm, (b, l))
    reveal_rank = jnp.argsort(jnp.argsort(order, axis=-1), axis=-1).astype(jnp.int32)
    pos = jnp.broadcast_to(jnp.arange(l, dtype=jnp.int32), (b, l))
    num_steps = jnp.asarray(num_steps, jnp.int32)

    def x_theta_logits(z, rank):
        clean = z != process.mask_id
        logits = apply_fn(z, pos, diffusion_mask(clean, rank))
        return denoiser_log_probs(process, logits, z)

    def diffusion_step(i, carry):
        z, n_rev = carry
        t = 1.0 - i / num_steps
        s = 1.0 - (i + 1) / num_steps
        a_t, a_s = process.alpha(t), process.alpha(s)
        p = jnp.clip((a_s - a_t) / (1.0 - a_t), 0.0, 1.0)
        k_i = jax.random.fold_in(k_steps, i)
        k_num, k_tok = jax.random.split(k_i)
        remaining = (l - n_rev).astype(jnp.float32)
        k = jax.random.binomial(k_num, remaining, p).astype(jnp.int32)
        logp = x_theta_logits(z, reveal_rank)
        draw = sampling.categorical(k_tok, logp[..., :process.num_classes])
        new = (reveal_rank >= n_rev[:, None]) & (reveal_rank < (n_rev + k)[:, None])
        return jnp.where(new, draw, z), n_rev + k

    z0 = process.prior_sample(k_steps, (b, l))
    z, n_rev = jax.lax.fori_loop(0, num_steps, diffusion_step, (z0, jnp.zeros((b,), jnp.int32)))

    # AR phase: ranks after the diffusion-revealed tokens, left to right.
    masked = z == process.mask_id
    ar_rank = jnp.where(masked, n_rev[:, None] + jnp.cumsum(masked, axis=1) - 1, reveal_rank)

    def ar_step(j, z):
        def decode(z):
            logp = x_theta_logits(z, ar_rank)
            draw = sampling.categorical(jax.random.fold_in(k_ar, j),
                                        logp[:, j, :process.num_classes])
            return z.at[:, j].set(jnp.where(z[:, j] == process.mask_id, draw, z[:, j]))

        return jax.lax.cond(jnp.any(z[:, j] == process.mask_id), decode, lambda z: z, z)

    return jax.lax.fori_loop(0, l, ar_step, z)
