"""Replicate runs of the sweep: seeds (problem order) x rollout streams, the two-stage bootstrap
over them, and a sweep that gives the same numbers when it is run again."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from algorithms.rl_scaling import analysis, fit, grpo, sweep, tasks
from models.transformer import Transformer, TransformerConfig


def test_two_stage_bootstrap_has_the_closed_form_mean_and_variance():
    """One replicate draws S seeds with replacement, then T streams within each drawn seed: its
    mean has expectation the grand mean and variance (B + W / T) / S, with B the population
    variance of the seed means and W the mean within-seed population variance; the Q
    configurations are drawn independently."""
    rng = np.random.default_rng(7)
    s, t, q = 3, 4, 2
    rewards = rng.normal(size=(s, 1, q)) + 0.5 * rng.normal(size=(s, t, q))
    draws = np.stack([fit.resample_mean(rng, rewards) for _ in range(20_000)])  # [K, Q]
    seed_means = rewards.mean(axis=1)  # [S, Q]
    between = seed_means.var(axis=0)
    within = rewards.var(axis=1).mean(axis=0)
    want_var = (between + within / t) / s
    np.testing.assert_allclose(draws.mean(axis=0), rewards.mean(axis=(0, 1)),
                               atol=4 * float(np.sqrt(want_var.max() / len(draws))))
    np.testing.assert_allclose(draws.var(axis=0), want_var, rtol=0.05)
    # neither the flat bootstrap over the S T runs nor the seeds alone: both give other variances
    assert not np.allclose(rewards.reshape(s * t, q).var(axis=0) / (s * t), want_var, rtol=0.1)
    assert not np.allclose(between / s, want_var, rtol=0.1)
    assert abs(np.corrcoef(draws.T)[0, 1]) < 0.03  # configurations resampled independently
    # leading axes (budgets) share the draw: a budget that adds a constant moves every replicate
    both = np.stack([rewards, rewards + 1.0])
    a, b = fit.resample_mean(np.random.default_rng(1), both)
    np.testing.assert_allclose(b, a + 1.0, rtol=1e-12)


def test_one_stream_is_the_bootstrap_over_seeds():
    rng = np.random.default_rng(3)
    log2_n, log2_c = np.arange(4.0), np.arange(6.0, 10.0)
    r = rng.normal(size=(4, 5, 4)) - (log2_n - 1.5) ** 2  # [C, S, Q]
    assert fit.bootstrap_n_star(log2_n, r[0], 20, 0) == fit.bootstrap_n_star(
        log2_n, r[0][:, None], 20, 0)
    a = fit.bootstrap_scaling(log2_c, log2_n, r, 6, 0, lo=0.0, hi_max=5.0)
    b = fit.bootstrap_scaling(log2_c, log2_n, r[:, :, None], 6, 0, lo=0.0, hi_max=5.0)
    np.testing.assert_array_equal(a.slope, b.slope)
    np.testing.assert_array_equal(a.loo_diff, b.loo_diff)
    with pytest.raises(ValueError, match="rewards must be"):
        fit.bootstrap_n_star(log2_n, r[:, :, None], 4, 0)  # [C, S, T, Q]: not one budget's
    with pytest.raises(ValueError, match="rewards must be"):
        fit.bootstrap_scaling(log2_c, log2_n, r[0], 4, 0, lo=0.0, hi_max=5.0)


def test_streams_widen_the_n_star_interval_that_seeds_alone_understate():
    """Records whose seeds agree and whose streams disagree: the interval over seeds x streams
    has width, the one that sees a single stream per seed none; the point estimate is the vertex
    of the mean over all runs."""
    budgets, ns, bp = (64, 128, 256), (2, 4, 8, 16), 4
    recs = []
    for c in budgets:
        for n in ns:
            for s in range(3):
                for t in range(2):
                    # stream 0 peaks at n = 4, stream 1 at n = 8: the mean peaks between them
                    peak = 2.0 if t == 0 else 3.0
                    recs.append({"budget": c, "n": n, "bp": bp, "seed": s, "stream": t,
                                 "easy_pass1": 1.0 - 0.1 * (np.log2(n) - peak) ** 2})
    rows = analysis.n_star_by_budget(recs, budgets, ns, "easy_pass1", 3, 40, 0, num_streams=2)
    assert [r["n_star"] for r in rows] == pytest.approx([2**2.5] * 3)
    assert all(r["lo"] < 2**2.5 < r["hi"] for r in rows)
    one = [r for r in recs if r["stream"] == 1]
    rows1 = analysis.n_star_by_budget(one, budgets, ns, "easy_pass1", 3, 40, 0)
    assert all(r["lo"] == r["hi"] == pytest.approx(8.0) for r in rows1)
    f = analysis.fit_n_star(recs, rows, ns, "easy_pass1", 3, 8, 0, num_streams=2)
    assert f["boot_budgets"] == list(budgets) and f["slope_ci"][0] < f["slope_ci"][1]
    assert analysis.seed_std(recs, 256, ns, (bp,), 3, num_streams=2)["4"] > 0
    assert analysis.seed_std(one, 256, ns, (bp,), 3)["4"] == 0.0


def _self_target_problems(gd, params):
    """32 problems whose target is the policy's own most likely first byte, and a temperature at
    which it is drawn about half the time (mixed rewards, so GRPO updates the policy)."""
    ops = np.array([[a, b] for a in range(8) for b in range(4)])
    prompts = jnp.asarray(tasks.encode_prompts(ops, 7, 2))
    logits = jax.jit(lambda p, x: nnx.merge(gd, p)(x))(params, prompts)[:, -1]
    first = jnp.argmax(logits, axis=-1).astype(jnp.int32)
    temperature = next(t for t in (1.0, 0.3, 0.1, 0.03, 0.01, 0.003)
                       if float(jax.nn.softmax(logits / t).max(axis=-1).mean()) >= 0.4)
    targets = jnp.full((len(ops), 4), tasks.END_ID, jnp.int32).at[:, 0].set(first)
    return {"prompts": prompts, "targets": targets,
            "lens": jnp.ones((len(ops),), jnp.int32)}, temperature


def test_sweep_rerun_is_identical_and_streams_share_their_seeds_problems():
    cfg_m = TransformerConfig(vocab_size=258, max_len=11, d_model=32, num_layers=1, num_heads=2,
                              mlp_dim=32)
    gd, params = nnx.split(Transformer(cfg_m, rngs=nnx.Rngs(0)))
    pool, temperature = _self_target_problems(gd, params)
    evals = {s: (pool["prompts"], pool["targets"], pool["lens"]) for s in ("easy", "hard")}
    cfg = sweep.SweepConfig(ns=(2,), problems_per_batch=(2,), num_seeds=2, num_streams=2,
                            budgets=(8, 16, 32), grpo=grpo.GRPOConfig(inner_steps=2),
                            learning_rate=1e-2, temperature=temperature, pass_k=2)
    runs = [sweep.run_sweep(cfg, gd, params, pool, evals) for _ in range(2)]  # two compilations
    (a, b) = runs
    assert a.records == b.records  # every number, bit for bit
    assert a.step_metrics.keys() == b.step_metrics.keys() == {
        (2, 2, s, t) for s in range(2) for t in range(2)}
    for lane in a.step_metrics:
        for k, v in a.step_metrics[lane].items():
            np.testing.assert_array_equal(v, b.step_metrics[lane][k], err_msg=f"{lane} {k}")
    sm = a.step_metrics
    assert max(float(v["informative"].max()) for v in sm.values()) > 0  # the policy learned
    assert len({r["easy_pass1"] for r in a.records}) > 4
    # step 1 starts every lane at the same parameters: the pass rate of its batch's problems is
    # a function of the problems alone, the same for the two streams of a seed
    for s in range(2):
        assert sm[(2, 2, s, 0)]["pass_before"][0] == sm[(2, 2, s, 1)]["pass_before"][0]
    assert sm[(2, 2, 0, 0)]["pass_before"][0] != sm[(2, 2, 1, 0)]["pass_before"][0]
    # ... while the streams sample other rollouts, and the runs part
    final = {(r["seed"], r["stream"]): r["easy_pass1"] for r in a.records if r["budget"] == 32}
    assert final[(0, 0)] != final[(0, 1)] and final[(1, 0)] != final[(1, 1)]
