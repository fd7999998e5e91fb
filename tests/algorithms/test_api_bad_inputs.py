"""Bad input at the public algorithm entry points gives one clear ValueError naming the argument,
before XLA sees it: no RESOURCE_EXHAUSTED from an impossible request, no comparison TypeError
from a config field of the wrong type, no silently meaningless result.

Each case is (callable, args, kwargs, message fragment).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from algorithms.benchmark_game import game
from algorithms.forecasting import metrics as fc_metrics
from algorithms.kv_budget import entrokv
from algorithms.ranking import btl, inference
from algorithms.ranking import data as rk_data
from algorithms.rl_scaling import grpo
from algorithms.rl_scaling import metrics as rl_metrics
from core.testing import BadInputs

SCORE = game.AdditiveSaturating(amplitude=1.0, rate=1.0)


def _contest(n, m):
    theta = np.linspace(1.0, 0.0, n)
    return game.make_contest(theta, np.linspace(0.0, 1.0, m), game.linear_rewards(n),
                             game.PowerCost())


C3 = _contest(3, 4)
C_HUGE = _contest(6, 101)  # 101**6 profiles: ~1e12 payoffs per player
KEY = jax.random.key(0)
PARAMS = btl.Params(scores=jnp.zeros(3), log_discrimination=jnp.zeros(1), tie=jnp.zeros(()))
COV = jnp.eye(3)
SAMPLES = jnp.asarray(np.random.default_rng(0).standard_normal((2, 8, 3, 2)), jnp.float32)
TARGET = jnp.zeros((2, 3, 2), jnp.float32)


CASES = BadInputs()
# -- benchmark_game -----------------------------------------------------------------------
CASES.add("pure_equilibria-too-large", game.pure_equilibria, SCORE, C_HUGE, 0.0, match="memory")
CASES.add("pure_equilibria-negative-delta", game.pure_equilibria, SCORE, C3, -1.0, match="delta")
CASES.add("pure_equilibria-zero-K", game.pure_equilibria, SCORE, C3, 0.0, match="max_equilibria", max_equilibria=0)
CASES.add("best_response_dynamics-start-out-of-range", game.best_response_dynamics, SCORE, C3, 0.0,
          jnp.array([99, 99, 99]), match="start")
CASES.add("best_response_dynamics-float-start", game.best_response_dynamics, SCORE, C3, 0.0,
          jnp.array([0.0, 1.0, 2.0]), match="start")
CASES.add("best_response_dynamics-start-length", game.best_response_dynamics, SCORE, C3, 0.0, jnp.array([0, 1]),
          match="start")
CASES.add("payoff_tensor-costs-length", game.payoff_tensor, jnp.zeros((2, 4)), jnp.zeros(3), jnp.zeros(2),
          match="costs")
CASES.add("payoff_tensor-too-large", game.payoff_tensor, jnp.zeros((6, 101)), jnp.zeros(101), jnp.zeros(6),
          match="memory")
CASES.add("best_response-profile-out-of-range", game.best_response, jnp.zeros((3, 4)), jnp.zeros(4), jnp.zeros(3),
          jnp.array([0, 1, 9]), 0, match="profile")
CASES.add("best_response-player-out-of-range", game.best_response, jnp.zeros((3, 4)), jnp.zeros(4), jnp.zeros(3),
          jnp.array([0, 1, 2]), 5, match="player")
CASES.add("make_contest-cost-length", game.make_contest, np.array([1.0, 0.0]), np.array([0.0, 1.0]),
          np.array([1.0, 0.0]), np.array([0.0]), match="cost")
CASES.add("AdditiveSaturating-string", game.AdditiveSaturating, match="amplitude", amplitude="1")
CASES.add("PowerCost-np-negative", game.PowerCost, match="scale", scale=np.float32(-1.0))
CASES.add("winner_take_all-zero", game.winner_take_all, 0, match="n must")
CASES.add("kendall_tau-one-player", game.kendall_tau_to_quality, jnp.zeros((1,), jnp.int32), match="ranks")

# -- ranking --------------------------------------------------------------------------------
CASES.add("FitConfig-np-float32-negative-ridge", btl.FitConfig, match="ridge_scores", ridge_scores=np.float32(-1.0))
CASES.add("FitConfig-np-float32-nan-ridge", btl.FitConfig, match="ridge_alpha", ridge_alpha=np.float32(np.nan))
CASES.add("FitConfig-float-max_iter", btl.FitConfig, match="max_iter", max_iter=2.5)
CASES.add("FitConfig-string-tol", btl.FitConfig, match="tol", tol="1e-8")
CASES.add("FitConfig-bad-tie-model", btl.FitConfig, match="tie_model", tie_model="bogus")
CASES.add("rank_intervals-zero-draws", inference.rank_intervals, KEY, PARAMS, COV, match="num_draws", num_draws=0)
CASES.add("rank_intervals-level", inference.rank_intervals, KEY, PARAMS, COV, match="level", level=1.5)
CASES.add("rank_intervals-cov-shape", inference.rank_intervals, KEY, PARAMS, jnp.eye(2), match="cov")
CASES.add("intervals-cov-shape", inference.intervals, PARAMS, jnp.eye(2), match="cov")
CASES.add("aggregate-length-mismatch", rk_data.aggregate, [0, 1], [1], [0, 0], match="right")
CASES.add("aggregate-bad-outcome", rk_data.aggregate, [0, 1], [1, 0], [0, 7], match="outcome")
CASES.add("aggregate-negative-id", rk_data.aggregate, [0, -1], [1, 0], [0, 0], match="left")

# -- forecasting ------------------------------------------------------------------------------
CASES.add("evaluate-zero-bins", fc_metrics.evaluate, SAMPLES, TARGET, match="num_bins", num_bins=0)
CASES.add("evaluate-target-shape", fc_metrics.evaluate, SAMPLES, TARGET[:1], match="target")
CASES.add("evaluate-no-samples", fc_metrics.evaluate, SAMPLES[:, :0], TARGET, match="samples")
CASES.add("crps_ensemble-target-shape", fc_metrics.crps_ensemble, SAMPLES, TARGET[:1], match="target", axis=1)
CASES.add("crps_ensemble-axis-out-of-range", fc_metrics.crps_ensemble, SAMPLES, TARGET, match="axis", axis=7)

# -- kv_budget --------------------------------------------------------------------------------
CASES.add("EntroKVConfig-float-window", entrokv.EntroKVConfig, match="window", window=2.5)
CASES.add("EntroKVConfig-string-window", entrokv.EntroKVConfig, match="window", window="3")
CASES.add("EntroKVConfig-nan-alpha", entrokv.EntroKVConfig, match="alpha", alpha=np.float32(np.nan))
CASES.add("allocate_budgets-negative", entrokv.allocate_budgets, jnp.ones(4), -1, match="total")
CASES.add("allocate_budgets-total-below-minimum", entrokv.allocate_budgets, jnp.ones(4), 2, match="total", min_budget=1)
CASES.add("allocate_budgets-rank2-scores", entrokv.allocate_budgets, jnp.ones((2, 4)), 8, match="scores")
CASES.add("uniform_budgets-zero-heads", entrokv.uniform_budgets, 0, 8, match="num_heads")

# -- rl_scaling -------------------------------------------------------------------------------
CASES.add("GRPOConfig-zero-inner", grpo.GRPOConfig, match="inner_steps", inner_steps=0)
CASES.add("GRPOConfig-float-inner", grpo.GRPOConfig, match="inner_steps", inner_steps=1.5)
CASES.add("GRPOConfig-np-negative-kl", grpo.GRPOConfig, match="kl_beta", kl_beta=np.float32(-1.0))
CASES.add("GRPOConfig-string-clip", grpo.GRPOConfig, match="clip_eps", clip_eps="0.2")
CASES.add("group_advantages-not-dividing", grpo.group_advantages, jnp.zeros(6), 4, match="groups of size")
CASES.add("group_advantages-zero", grpo.group_advantages, jnp.zeros(6), 0, match="group_size must")
CASES.add("group_advantages-bad-mode", grpo.group_advantages, jnp.zeros(6), 3, match="mode", mode="bogus")
CASES.add("pass_at_k-zero-k", rl_metrics.pass_at_k, jnp.array([4]), jnp.array([1]), 0, match="k")
CASES.add("pass_at_k-correct-above-samples", rl_metrics.pass_at_k, jnp.array([4]), jnp.array([5]), 1,
          match="correct counts")
CASES.add("pass_at_k-length-mismatch", rl_metrics.pass_at_k, jnp.array([4, 4]), jnp.array([1]), 1, match="num_correct")


@pytest.mark.parametrize("case", CASES.params())
def test_bad_input_is_one_clear_value_error(case):
    case.check()


def test_size_guard_names_the_estimate_and_the_limit():
    with pytest.raises(ValueError, match=r"GiB.*limit") as err:
        game.pure_equilibria(SCORE, C_HUGE, 0.0)
    assert "6 players" in str(err.value) and "101" in str(err.value)


def test_good_input_still_passes_the_checks():
    eq = game.pure_equilibria(SCORE, C3, 0.0)
    assert int(eq.count) >= 0
    assert btl.FitConfig(ridge_scores=np.float32(0.5)).ridge_scores == np.float32(0.5)
    assert entrokv.EntroKVConfig(window=np.int64(4)).window == 4
