"""Simulated comparisons from a known judge-aware BTL model (for recovery and coverage studies).

Dimension legend: C raw comparisons, M table rows, N models, J judges.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp

from algorithms.ranking.btl import Params, outcome_logprobs
from algorithms.ranking.data import LEFT, RIGHT, TIE, ComparisonTable


def outcome_probs(params: Params, i, j, judge, tie_model: str = "half") -> jax.Array:
    """Generative probabilities of (i wins, j wins, tie), float [..., 3].

    ``"half"`` generates no ties (the half-win rule is an estimation convention, not a law for ties).
    """
    d = jnp.exp(params.log_discrimination[judge]) * (params.scores[i] - params.scores[j])
    if tie_model == "half":
        p = jax.nn.sigmoid(d)
        return jnp.stack([p, 1 - p, jnp.zeros_like(p)], axis=-1)
    return jnp.exp(outcome_logprobs(d, params.tie, tie_model))


@functools.partial(jax.jit, static_argnames=("num", "tie_model"))
def sample_comparisons(key: jax.Array, params: Params, num: int, tie_model: str = "half"):
    """C = ``num`` comparisons: a uniformly random ordered pair of distinct models, a uniformly random
    judge, and an outcome from the model.

    Returns:
      (left, right, judge, outcome), int32 [C] each; outcome in {LEFT, RIGHT, TIE}.
    """
    n, nj = params.scores.shape[0], params.log_discrimination.shape[0]
    k1, k2, k3, k4 = jax.random.split(key, 4)
    left = jax.random.randint(k1, (num,), 0, n)
    right = (left + jax.random.randint(k2, (num,), 1, n)) % n
    judge = jax.random.randint(k3, (num,), 0, nj)
    logits = jnp.log(outcome_probs(params, left, right, judge, tie_model))
    oc = jax.random.categorical(k4, logits, axis=-1)
    outcome = jnp.asarray([LEFT, RIGHT, TIE], jnp.int32)[oc]
    return left.astype(jnp.int32), right.astype(jnp.int32), judge.astype(jnp.int32), outcome


@functools.partial(jax.jit, static_argnames=("tie_model",))
def resample_counts(key: jax.Array, params: Params, design: ComparisonTable,
                    tie_model: str = "half") -> ComparisonTable:
    """A new data set on the fixed design of ``design``: same rows and comparisons per row, outcomes
    drawn from the model (Multinomial per row). ``jax.vmap`` over keys for many data sets."""
    n = design.wins + design.losses + design.ties
    p = outcome_probs(params, design.i, design.j, design.judge, tie_model)
    c = jax.random.multinomial(key, n, p, dtype=design.wins.dtype)
    return dataclasses.replace(design, wins=c[:, 0], losses=c[:, 1], ties=c[:, 2])


def full_design(n_models: int, n_judges: int, per_cell: int, dtype=jnp.float32) -> ComparisonTable:
    """Every unordered pair judged ``per_cell`` times by every judge (counts in ``wins``; resample them)."""
    i, j = jnp.triu_indices(n_models, k=1)
    m = i.shape[0]
    ii = jnp.repeat(i, n_judges).astype(jnp.int32)
    jj = jnp.repeat(j, n_judges).astype(jnp.int32)
    kk = jnp.tile(jnp.arange(n_judges, dtype=jnp.int32), m)
    z = jnp.zeros(m * n_judges, dtype)
    return ComparisonTable(ii, jj, kk, z + per_cell, z, z, n_models, n_judges)
