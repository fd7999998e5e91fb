"""Paired evaluation and the pieces around it: per-window NELBO from the forward-only evaluation
equals the train step's metric; common random numbers across processes; paired differences and
the paired bootstrap of the CE/NELBO compute ratio; generative perplexity's interval; the
budget-matched cosine schedule (against optax); GIDD's dynamic weights (from their definition);
Eso-LM's sampling alpha_0 apart from training."""

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from algorithms.diffusion_lm import evaluator as evaluator_lib
from algorithms.diffusion_lm import grid, losses, scaling
from algorithms.diffusion_lm.families import FamilySpec, transformer_config
from algorithms.diffusion_lm.processes import Process, denoiser_log_probs
from algorithms.diffusion_lm.training import init_state, make_eval, make_step
from core.data import ByteTokenizer
from experiments.configs import diffusion_lm as dlm_config
from models.transformer import Transformer


def _config(extra=""):
    return dlm_config.get_config("smoke,eval_windows=8,eval_reps=1" + extra)


def test_forward_only_evaluation_equals_the_steps_nelbo_metric():
    spec = FamilySpec("duo")
    cfg = transformer_config(spec, 16, d_model=16, num_layers=1, num_heads=2)
    graphdef, params = nnx.split(Transformer(cfg, rngs=nnx.Rngs(0)))
    tx = optax.sgd(0.1)
    state = init_state(params, tx)
    x = jnp.asarray(np.random.default_rng(0).integers(0, 256, (8, 16)), jnp.int32)
    key = jax.random.key(5)
    batch = {"x": x, "train": jnp.float32(0), "ce": jnp.float32(0)}
    _, metrics = jax.jit(make_step(graphdef, tx, spec))(state, batch, key)
    rows = jax.jit(make_eval(graphdef, spec))(state, batch, key)
    assert rows.shape == (8,)
    np.testing.assert_allclose(float(rows.mean()), float(metrics["nelbo"]), rtol=1e-6)


def test_masked_and_uniform_samples_keep_the_same_positions_with_one_key():
    x = jnp.asarray(np.random.default_rng(1).integers(0, 256, (4, 64)), jnp.int32)
    t = jnp.asarray([0.1, 0.4, 0.7, 0.95], jnp.float32)
    key = jax.random.key(2)
    masked = Process("masked", 258, 256, mask_id=256).sample(key, x, t)
    uniform = Process("uniform", 258, 256).sample(key, x, t)
    kept_m = np.asarray(masked != 256)
    # a uniform draw may land on x by chance (1/256): compare where the masked one keeps x
    kept_u = np.asarray(uniform == x)
    assert np.all(kept_u[kept_m]) and kept_m.sum() > 20
    assert np.mean(kept_u[~kept_m]) < 0.02


def test_paired_difference_closed_form_and_identical_models_give_zero():
    a, b = np.array([1.0, 2.0, 4.0, 5.0]), np.array([0.5, 1.0, 3.5, 5.0])
    d = grid.paired_difference(a, b)
    diff = a - b  # 0.5, 1, 0.5, 0: mean 0.5, sd sqrt(1/6)
    assert d["mean"] == pytest.approx(0.5)
    assert d["se"] == pytest.approx(math.sqrt(np.var(diff, ddof=1) / 4))
    assert d["lo"] == pytest.approx(0.5 - 1.96 * d["se"])
    with pytest.raises(ValueError, match="one shape"):
        grid.paired_difference(a, b[:3])
    # Two copies of one model evaluated with one key: every window's difference is exactly 0,
    # although each evaluation's own s.e. is not.
    config = _config()
    runner = grid.Runner(config, ByteTokenizer())
    windows = np.random.default_rng(0).integers(0, 256, (8, config.seq_len)).astype(np.int32)
    m1, m2 = runner.model("mdlm", (8, 1, 1)), runner.model("mdlm_ce", (8, 1, 1))
    key = jax.random.key(3)
    e1, e2 = (runner.evaluate(m, windows, 2, key) for m in (m1, m2))
    assert e1["se"] > 0 and len(e1["windows"]) == 8
    assert grid.paired_difference(e1["windows"], e2["windows"])["se"] == 0.0
    # another key draws other times: the values differ
    e3 = runner.evaluate(m1, windows, 2, jax.random.key(4))
    assert e3["windows"] != e1["windows"]


def _grid(rng, shift=0.0):
    budgets = [1e10, 2e10, 4e10]
    sizes = np.array([1e4, 2e4, 4e4, 8e4])
    log_n = np.log(sizes)[None, :]
    base = 3.0 - 0.1 * np.log(np.array(budgets) / 1e10)[:, None] + 0.05 * (log_n - 10.0) ** 2
    noise = rng.normal(0, 0.3, (3, 4, 64))  # per-window noise shared by both grids
    return budgets, sizes, base[..., None] + noise, base[..., None] + shift + noise


def test_paired_bootstrap_cancels_shared_noise():
    budgets, sizes, w1, w2 = _grid(np.random.default_rng(0))
    same = scaling.paired_bootstrap_ratio(budgets, sizes, w1, w2.copy(), num_samples=50)
    assert same["ratio"] == pytest.approx(1.0, abs=1e-9)
    assert same["lo95"] == pytest.approx(1.0, abs=1e-9) == same["hi95"]
    # a constant loss offset: the paired interval is narrow, the unpaired parametric one wide
    budgets, sizes, w1, w2 = _grid(np.random.default_rng(0), shift=0.02)
    paired = scaling.paired_bootstrap_ratio(budgets, sizes, w1, w2, num_samples=200)
    point = scaling.matched_compute_ratio(scaling.fit_isoflop(budgets, sizes, w1.mean(-1)),
                                          scaling.fit_isoflop(budgets, sizes, w2.mean(-1)))
    assert paired["ratio"] == pytest.approx(point)
    se1 = w1.std(-1, ddof=1) / 8
    unpaired = scaling.bootstrap_ratio(budgets, sizes, w1.mean(-1), se1, w2.mean(-1), se1,
                                       num_samples=200)
    assert paired["hi"] - paired["lo"] < 0.5 * (unpaired["hi"] - unpaired["lo"])
    assert paired["lo95"] <= paired["lo"] <= paired["ratio"] <= paired["hi"] <= paired["hi95"]
    with pytest.raises(ValueError, match="C, S, W"):
        scaling.paired_bootstrap_ratio(budgets, sizes, w1, w2[..., :3])


def test_perplexity_interval_closed_form():
    nll = np.array([1.0, 2.0, 3.0, 2.0])
    ci = evaluator_lib.perplexity_interval(nll)
    se = math.sqrt(np.var(nll, ddof=1) / 4)
    assert ci["ppl"] == pytest.approx(math.exp(2.0))
    assert ci["lo"] == pytest.approx(math.exp(2.0 - 1.96 * se))
    assert ci["hi"] == pytest.approx(math.exp(2.0 + 1.96 * se)) and ci["n"] == 4
    with pytest.raises(ValueError, match="n >= 2"):
        evaluator_lib.perplexity_interval(np.array([1.0]))


def test_learning_rate_schedule_closed_form():
    lr = lambda c, h: float(grid.learning_rate(c, h, 1.0, 10, 0.1))  # noqa: E731
    assert lr(0, 0) == 0.0 and lr(5, 0) == pytest.approx(0.5) and lr(500, 0) == 1.0
    assert lr(5, 110) == pytest.approx(0.5)           # warmup, whatever the horizon
    assert lr(10, 110) == pytest.approx(1.0)          # cosine starts at the peak
    assert lr(60, 110) == pytest.approx(0.55)         # half way: (1 + 0.1) / 2
    assert lr(110, 110) == pytest.approx(0.1)         # the horizon: final fraction
    assert lr(200, 110) == pytest.approx(0.1)


def test_constant_schedule_is_optax_adamw_with_warmup():
    optim = _config().optim
    optim.update(dict(learning_rate=0.01, warmup_steps=3, weight_decay=0.1))
    ours = grid.optimizer(optim)
    sched = optax.join_schedules([optax.linear_schedule(0.0, 0.01, 3), optax.constant_schedule(0.01)],
                                 [3])
    ref = optax.chain(optax.clip_by_global_norm(optim.grad_clip),
                      optax.adamw(sched, b1=0.9, b2=0.98, weight_decay=0.1))
    params = {"w": jnp.asarray(np.random.default_rng(0).normal(size=(5,)), jnp.float32)}
    s_ours, s_ref = ours.init(params), ref.init(params)
    for i in range(6):
        g = {"w": jnp.asarray(np.random.default_rng(i + 1).normal(size=(5,)), jnp.float32)}
        u_ours, s_ours = ours.update(g, s_ours, params)
        u_ref, s_ref = ref.update(g, s_ref, params)
        np.testing.assert_allclose(u_ours["w"], u_ref["w"], rtol=1e-6, atol=1e-9)
    # with a horizon the rate decays: at the horizon the step is final_lr_fraction as large
    state = grid.with_horizon({"opt_state": ours.init(params)}, 4)
    horizons = [s.horizon for s in jax.tree.leaves(
        state["opt_state"], is_leaf=lambda s: isinstance(s, grid.ScheduleState))
        if isinstance(s, grid.ScheduleState)]
    assert [int(h) for h in horizons] == [4]


def test_gidd_dynamic_weight_from_its_definition():
    proc = Process("gidd", 258, 256, mask_id=256, p_uniform=0.1)
    x = jnp.asarray([[5, 5, 5, 7]], jnp.int32)
    z = jnp.asarray([[5, 256, 9, 7]], jnp.int32)   # clean, [MASK], noise, clean
    for t in (0.05, 0.5, 0.97):
        w = np.asarray(losses.gidd_dynamic_weight(proc, x, z, jnp.asarray([t]), 2.0))[0]
        # B from the uniform share at t = 1/2: c / (1 + c) = p_u with c = B sqrt(t a_t)
        a_half = 1 - (1 - proc.eps) * 0.5
        b = 0.1 / 0.9 / math.sqrt(0.5 * a_half)
        clean = b / 258 * math.exp(0.5 / (1 + math.exp(t)))
        np.testing.assert_allclose(w, [clean, 2.0, 1.0, clean], rtol=1e-6)
    capped = losses.gidd_dynamic_weight(proc, x, z, jnp.asarray([0.5]), 1.5)
    assert float(capped[0, 1]) == 1.5
    # the training integrand is that weight times the ELBO's divergence
    rng = np.random.default_rng(0)
    xs = jnp.asarray(rng.integers(0, 256, (3, 8)), jnp.int32)
    t = jnp.asarray([0.2, 0.5, 0.8], jnp.float32)
    zs = proc.sample(jax.random.key(0), xs, t)
    logp = denoiser_log_probs(proc, jnp.asarray(rng.normal(size=(3, 8, 258)), jnp.float32), zs)
    elbo = losses.mixing_nelbo(proc, logp, xs, zs, t)
    w_elbo = (np.take_along_axis(np.asarray(proc.rate_mass(t[:, None])), np.asarray(zs)[..., None],
                                 -1)[..., 0]
              / np.take_along_axis(np.asarray(proc.marginal(jax.nn.one_hot(xs, 258), t[:, None])),
                                   np.asarray(zs)[..., None], -1)[..., 0])
    dyn = losses.mixing_nelbo(proc, logp, xs, zs, t, max_weight=2.0, weighting="dynamic")
    expected = np.asarray(losses.gidd_dynamic_weight(proc, xs, zs, t, 2.0)) * np.asarray(elbo) / w_elbo
    np.testing.assert_allclose(np.asarray(dyn), expected, rtol=1e-5)
    with pytest.raises(ValueError, match="weighting"):
        losses.mixing_nelbo(proc, logp, xs, zs, t, max_weight=2.0, weighting="none")
    with pytest.raises(ValueError, match="gidd"):
        losses.gidd_dynamic_weight(Process("uniform", 258, 256), xs, zs, t, 2.0)
    with pytest.raises(ValueError, match="gidd_weighting"):
        FamilySpec("gidd", gidd_weighting="snr")


def test_esolm_samples_at_its_own_alpha0_and_its_runs_ignore_it():
    spec = FamilySpec("esolm", alpha0=0.5, sampling_alpha0=0.25)
    assert spec.process.alpha0 == 1.0 and spec.sampling_process.alpha0 == 0.25
    ablation = FamilySpec("esolm_nelbo", alpha0=0.5, sampling_alpha0=0.25)
    assert ablation.process.alpha0 == 0.5 and ablation.sampling_process.alpha0 == 0.25
    config = _config()
    assert grid.family_spec(config, "esolm").sampling_alpha0 == config.sampling.alpha0
    runner = grid.Runner(config, ByteTokenizer())
    m = runner.model("esolm", (8, 1, 1))
    other = dataclasses.replace(m, spec=dataclasses.replace(m.spec, sampling_alpha0=0.9))
    assert runner.fingerprint(m) == runner.fingerprint(other)
    assert runner.fingerprint(m, 10) != runner.fingerprint(m, 20)
    with pytest.raises(ValueError, match="sampling_alpha0"):
        FamilySpec("esolm", sampling_alpha0=0.0)
