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


def _cases():
    c = []

    def add(fn, args, kwargs, frag, id_):
        c.append(pytest.param(fn, args, kwargs, frag, id=id_))

    # -- benchmark_game -----------------------------------------------------------------------
    add(game.pure_equilibria, (SCORE, C_HUGE, 0.0), {}, "memory", "pure_equilibria-too-large")
    add(game.pure_equilibria, (SCORE, C3, -1.0), {}, "delta", "pure_equilibria-negative-delta")
    add(game.pure_equilibria, (SCORE, C3, 0.0), {"max_equilibria": 0}, "max_equilibria",
        "pure_equilibria-zero-K")
    add(game.best_response_dynamics, (SCORE, C3, 0.0, jnp.array([99, 99, 99])), {}, "start",
        "best_response_dynamics-start-out-of-range")
    add(game.best_response_dynamics, (SCORE, C3, 0.0, jnp.array([0.0, 1.0, 2.0])), {}, "start",
        "best_response_dynamics-float-start")
    add(game.best_response_dynamics, (SCORE, C3, 0.0, jnp.array([0, 1])), {}, "start",
        "best_response_dynamics-start-length")
    add(game.payoff_tensor, (jnp.zeros((2, 4)), jnp.zeros(3), jnp.zeros(2)), {}, "costs",
        "payoff_tensor-costs-length")
    add(game.payoff_tensor, (jnp.zeros((6, 101)), jnp.zeros(101), jnp.zeros(6)), {}, "memory",
        "payoff_tensor-too-large")
    add(game.best_response, (jnp.zeros((3, 4)), jnp.zeros(4), jnp.zeros(3),
                             jnp.array([0, 1, 9]), 0), {}, "profile",
        "best_response-profile-out-of-range")
    add(game.best_response, (jnp.zeros((3, 4)), jnp.zeros(4), jnp.zeros(3),
                             jnp.array([0, 1, 2]), 5), {}, "player",
        "best_response-player-out-of-range")
    add(game.make_contest, (np.array([1.0, 0.0]), np.array([0.0, 1.0]), np.array([1.0, 0.0]),
                            np.array([0.0])), {}, "cost", "make_contest-cost-length")
    add(game.AdditiveSaturating, (), {"amplitude": "1"}, "amplitude", "AdditiveSaturating-string")
    add(game.PowerCost, (), {"scale": np.float32(-1.0)}, "scale", "PowerCost-np-negative")
    add(game.winner_take_all, (0,), {}, "n must", "winner_take_all-zero")
    add(game.kendall_tau_to_quality, (jnp.zeros((1,), jnp.int32),), {}, "ranks",
        "kendall_tau-one-player")

    # -- ranking --------------------------------------------------------------------------------
    add(btl.FitConfig, (), {"ridge_scores": np.float32(-1.0)}, "ridge_scores",
        "FitConfig-np-float32-negative-ridge")
    add(btl.FitConfig, (), {"ridge_alpha": np.float32(np.nan)}, "ridge_alpha",
        "FitConfig-np-float32-nan-ridge")
    add(btl.FitConfig, (), {"max_iter": 2.5}, "max_iter", "FitConfig-float-max_iter")
    add(btl.FitConfig, (), {"tol": "1e-8"}, "tol", "FitConfig-string-tol")
    add(btl.FitConfig, (), {"tie_model": "bogus"}, "tie_model", "FitConfig-bad-tie-model")
    add(inference.rank_intervals, (KEY, PARAMS, COV), {"num_draws": 0}, "num_draws",
        "rank_intervals-zero-draws")
    add(inference.rank_intervals, (KEY, PARAMS, COV), {"level": 1.5}, "level",
        "rank_intervals-level")
    add(inference.rank_intervals, (KEY, PARAMS, jnp.eye(2)), {}, "cov",
        "rank_intervals-cov-shape")
    add(inference.intervals, (PARAMS, jnp.eye(2)), {}, "cov", "intervals-cov-shape")
    add(rk_data.aggregate, ([0, 1], [1], [0, 0]), {}, "right", "aggregate-length-mismatch")
    add(rk_data.aggregate, ([0, 1], [1, 0], [0, 7]), {}, "outcome", "aggregate-bad-outcome")
    add(rk_data.aggregate, ([0, -1], [1, 0], [0, 0]), {}, "left", "aggregate-negative-id")

    # -- forecasting ------------------------------------------------------------------------------
    add(fc_metrics.evaluate, (SAMPLES, TARGET), {"num_bins": 0}, "num_bins", "evaluate-zero-bins")
    add(fc_metrics.evaluate, (SAMPLES, TARGET[:1]), {}, "target", "evaluate-target-shape")
    add(fc_metrics.evaluate, (SAMPLES[:, :0], TARGET), {}, "samples", "evaluate-no-samples")
    add(fc_metrics.crps_ensemble, (SAMPLES, TARGET[:1]), {"axis": 1}, "target",
        "crps_ensemble-target-shape")
    add(fc_metrics.crps_ensemble, (SAMPLES, TARGET), {"axis": 7}, "axis",
        "crps_ensemble-axis-out-of-range")

    # -- kv_budget --------------------------------------------------------------------------------
    add(entrokv.EntroKVConfig, (), {"window": 2.5}, "window", "EntroKVConfig-float-window")
    add(entrokv.EntroKVConfig, (), {"window": "3"}, "window", "EntroKVConfig-string-window")
    add(entrokv.EntroKVConfig, (), {"alpha": np.float32(np.nan)}, "alpha",
        "EntroKVConfig-nan-alpha")
    add(entrokv.allocate_budgets, (jnp.ones(4), -1), {}, "total", "allocate_budgets-negative")
    add(entrokv.allocate_budgets, (jnp.ones(4), 2), {"min_budget": 1}, "total",
        "allocate_budgets-total-below-minimum")
    add(entrokv.allocate_budgets, (jnp.ones((2, 4)), 8), {}, "scores",
        "allocate_budgets-rank2-scores")
    add(entrokv.uniform_budgets, (0, 8), {}, "num_heads", "uniform_budgets-zero-heads")

    # -- rl_scaling -------------------------------------------------------------------------------
    add(grpo.GRPOConfig, (), {"inner_steps": 0}, "inner_steps", "GRPOConfig-zero-inner")
    add(grpo.GRPOConfig, (), {"inner_steps": 1.5}, "inner_steps", "GRPOConfig-float-inner")
    add(grpo.GRPOConfig, (), {"kl_beta": np.float32(-1.0)}, "kl_beta", "GRPOConfig-np-negative-kl")
    add(grpo.GRPOConfig, (), {"clip_eps": "0.2"}, "clip_eps", "GRPOConfig-string-clip")
    add(grpo.group_advantages, (jnp.zeros(6), 4), {}, "groups of size",
        "group_advantages-not-dividing")
    add(grpo.group_advantages, (jnp.zeros(6), 0), {}, "group_size must", "group_advantages-zero")
    add(grpo.group_advantages, (jnp.zeros(6), 3), {"mode": "bogus"}, "mode",
        "group_advantages-bad-mode")
    add(rl_metrics.pass_at_k, (jnp.array([4]), jnp.array([1]), 0), {}, "k",
        "pass_at_k-zero-k")
    add(rl_metrics.pass_at_k, (jnp.array([4]), jnp.array([5]), 1), {}, "correct counts",
        "pass_at_k-correct-above-samples")
    add(rl_metrics.pass_at_k, (jnp.array([4, 4]), jnp.array([1]), 1), {}, "num_correct",
        "pass_at_k-length-mismatch")
    return c


CASES = _cases()


@pytest.mark.parametrize("fn, args, kwargs, fragment", CASES)
def test_bad_input_is_one_clear_value_error(fn, args, kwargs, fragment):
    with pytest.raises(ValueError, match=fragment):
        fn(*args, **kwargs)


def test_size_guard_names_the_estimate_and_the_limit():
    with pytest.raises(ValueError, match=r"GiB.*limit") as err:
        game.pure_equilibria(SCORE, C_HUGE, 0.0)
    assert "6 players" in str(err.value) and "101" in str(err.value)


def test_good_input_still_passes_the_checks():
    eq = game.pure_equilibria(SCORE, C3, 0.0)
    assert int(eq.count) >= 0
    assert btl.FitConfig(ridge_scores=np.float32(0.5)).ridge_scores == np.float32(0.5)
    assert entrokv.EntroKVConfig(window=np.int64(4)).window == 4
