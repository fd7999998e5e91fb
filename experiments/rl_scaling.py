"""Experiment ``rl_scaling``: compute-optimal allocation of RL rollouts (IsoCompute Playbook).

A small byte-level transformer is warm-started by supervised training on sums (an easy and a hard
split), then trained with GRPO under rollout budgets C = n * B_p * M for a grid of rollouts per
problem n, problems per batch B_p and seeds. With a constant learning rate the run at budget C is
the first C / (n B_p) steps of the run at the largest budget, so each (n, B_p, seed) is trained once
and evaluated at every budget on the log grid. All (n, B_p, seed) lanes with the same rollouts per
step R = n B_p run as one vmapped, jitted step; on several devices (or hosts) the lanes are split
over the data axis of a mesh of all devices (independent runs: no cross-device traffic).

Measured: held-out exact pass@1 (easy) and pass@k / coverage (hard), n*(C) with bootstrap
intervals, a sigmoid-vs-power-law fit of n*(C), interference (share of batch problems whose pass
rate falls after an update; cosine between per-problem gradients), seed variance per B_p, and
rollout throughput.

    python -m experiments.rl_scaling --config=experiments/configs/rl_scaling.py:tiny --workdir=workdir
"""

from __future__ import annotations

import collections
import functools
import os
import time

import jax
import jax.numpy as jnp
import matplotlib.pyplot as plt
import ml_collections
import numpy as np
import optax
from flax import nnx
from tqdm.auto import tqdm

from algorithms.rl_scaling import allocation, fit, grpo, metrics, rollout, tasks, trainer
from algorithms.rl_scaling.tasks import MixtureBatches
from core import report, sharding
from core.training import (
    LoopConfig,
    config_fingerprint,
    init_train_state,
    make_train_step,
    train_loop,
)
from experiments import common
from models.transformer import Transformer, TransformerConfig, param_count

NAME = "rl_scaling"


# ------------------------------------------------------------------------------------------------
# Data


def encode(ops: np.ndarray, task: tasks.ArithmeticTask, prompt_len: int, answer_len: int) -> dict:
    targets, lens = tasks.encode_answers(ops, answer_len)
    return {"prompts": tasks.encode_prompts(ops, prompt_len, task.num_digits),
            "targets": targets, "lens": lens}


def validate(config: ml_collections.ConfigDict) -> tuple[int, ...]:
    """Checks the sweep settings; returns the budget grid.

    Raises:
      ValueError: bad warm-start targets or caps, n < 2 with group normalisation, k > n_eval,
        a budget grid whose largest budget no configuration divides, or too small a training
        pool.
    """
    for field in ("ns", "problems_per_batch"):
        values = config[field]
        if not isinstance(values, tuple | list) or not all(
                isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in values):
            raise ValueError(f"{field}={values!r}: expected a tuple of positive integers")
    budgets = allocation.budget_grid(config.smallest_budget, config.num_budgets)
    w = config.warmup
    checks = {"easy_target": 0 < w.easy_target <= 1, "hard_target": 0 < w.hard_target <= 1,
              "max_easy_steps": 0 < w.max_easy_steps < w.max_steps,
              "probe_problems": 1 <= w.probe_problems <= config.num_train,
              "check_every": w.check_every >= 1}
    bad = [f"warmup.{k}={w[k]}" for k, ok in checks.items() if not ok]
    if bad:
        raise ValueError(f"bad warm-start setting(s) {', '.join(bad)}: need targets in (0, 1], "
                         "0 < max_easy_steps < max_steps, 1 <= probe_problems <= num_train, "
                         "check_every >= 1")
    grpo.GRPOConfig(advantage=config.advantage, aggregation=config.aggregation)
    if config.num_budgets < 3:
        raise ValueError(f"rl_scaling: num_budgets={config.num_budgets}; the n*(C) fit needs >= 3")
    grpo.GRPOConfig(advantage=config.advantage).check_group_size(min(config.ns))
    if len(config.ns) < 3:
        raise ValueError(f"rl_scaling: ns={config.ns}; the parabola for n* needs >= 3 values")
    if config.sampled_eval and config.pass_k > config.sampled_eval:
        raise ValueError(f"rl_scaling: pass_k={config.pass_k} exceeds the sampled_eval="
                         f"{config.sampled_eval} samples per problem (k <= n)")
    if config.num_seeds < 2:
        raise ValueError(f"rl_scaling: num_seeds={config.num_seeds}; intervals need >= 2")
    for n in config.ns:
        for bp in config.problems_per_batch:
            if allocation.feasible(budgets[-1], n, bp):
                allocation.Allocation(budgets[-1], n, bp, config.advantage == "grpo")
            if n * bp > config.num_train:
                raise ValueError(f"rl_scaling: n * B_p = {n * bp} exceeds num_train="
                                 f"{config.num_train}")
    return budgets


# ------------------------------------------------------------------------------------------------
# Warm start


def warm_start(config, gd, params, easy, hard, out):
    """Supervised warm start in two stages that end on measured pass rates, not step counts.

    A small model sits on a loss plateau (digits predicted without using the operands) for a
    number of steps that depends on the batch order, and learns nothing about hard sums from easy
    ones. So: (1) easy sums alone until the exact pass@1 on ``probe_problems`` easy *training*
    problems reaches ``easy_target``; (2) a mixture with ``hard_fraction`` hard sums until the
    hard probe reaches ``hard_target``. Each stage is capped (``max_easy_steps``, ``max_steps`` in
    all) and checked every ``check_every`` steps; the held-out sets are never looked at.

    Returns:
      (params, info) with info = {"easy_steps", "mixed_steps", "probe_easy", "probe_hard",
      "reached": both targets met}.
    """
    w = config.warmup
    tx = optax.chain(optax.clip_by_global_norm(config.grad_clip),
                     optax.adam(optax.warmup_constant_schedule(0.0, w.learning_rate,
                                                               w.warmup_steps)))
    step_fn = make_train_step(gd, tx, trainer.sft_loss)
    probe_fn = jax.jit(lambda p, *e: trainer.answer_prob(gd, p, *e).mean())
    probes = {name: tuple(jnp.asarray(split[f][:w.probe_problems])
                          for f in ("prompts", "targets", "lens"))
              for name, split in (("easy", easy), ("hard", hard))}
    last = {}

    def reached(name, target):
        def stop_when(step, state):
            last.update({k: float(probe_fn(state["params"], *v)) for k, v in probes.items()})
            return last[name] >= target
        return stop_when

    state = init_train_state(params, tx)
    steps = {}
    for stage, (hard_fraction, seed, cap, name, target) in enumerate((
            (0.0, config.seed, w.max_easy_steps, "easy", w.easy_target),
            (w.hard_fraction, config.seed + 1, w.max_steps - w.max_easy_steps, "hard",
             w.hard_target))):
        label = ("easy", "mixed")[stage]
        result = train_loop(step_fn, state, MixtureBatches(easy, hard, w.batch_size, hard_fraction,
                                                           seed),
                            jax.random.key(config.seed),
                            LoopConfig(num_steps=cap, log_every=w.check_every, checkpoint_every=0,
                                       desc=f"{NAME} warm start ({label})"),
                            workdir=os.path.join(out, "warmstart", label),
                            stop_when=reached(name, target),
                            fingerprint=config_fingerprint(label, config.seed, config.grad_clip,
                                                           config.warmup, config.model,
                                                           config.easy, config.hard,
                                                           config.num_train))
        state = result.state
        steps[f"{label}_steps"] = result.stopped_early_at or cap
    last.update({k: float(probe_fn(state["params"], *v)) for k, v in probes.items()})
    info = {**steps, "probe_easy": last["easy"], "probe_hard": last["hard"],
            "reached": last["easy"] >= w.easy_target and last["hard"] >= w.hard_target}
    return state["params"], info


# ------------------------------------------------------------------------------------------------
# Sweep


def stack(tree, num: int):
    return jax.tree.map(lambda x: jnp.broadcast_to(x, (num, *x.shape)), tree)


def pad_lanes(lanes: list, num_devices: int) -> list:
    """``lanes`` extended by copies of its last entry to a multiple of ``num_devices``; the copies
    recompute that lane (same key), their results are dropped."""
    return lanes + [lanes[-1]] * (-len(lanes) % num_devices)


def run_sweep(config, gd, params0, pool, evals, budgets, mesh=None):
    """Trains every (n, B_p, seed) lane to the largest budget, evaluating at each budget.

    Lanes sharing R = n B_p are vmapped in one jitted step, and the lane axis is split over the
    ``data`` axis of ``mesh`` (default: every device), padded with repeated lanes to a multiple of
    its size. Results do not depend on the number of devices.

    Returns (records: list of dicts per lane and budget, step metrics per lane, timing dict).
    """
    mesh = mesh or sharding.make_mesh()
    num_dev = mesh.shape[sharding.DATA]
    pool, evals = sharding.replicate((pool, evals), mesh)
    tx = optax.chain(optax.clip_by_global_norm(config.grad_clip), optax.adam(config.learning_rate))
    gcfg = grpo.GRPOConfig(advantage=config.advantage, aggregation=config.aggregation,
                           clip_eps=config.clip_eps, clip_eps_high=config.clip_eps_high,
                           kl_beta=config.kl_beta, inner_steps=config.inner_steps)
    answer_len = pool["targets"].shape[1]
    ref = sharding.replicate(params0, mesh) if config.kl_beta > 0 else None
    c_max = budgets[-1]
    groups = collections.defaultdict(list)
    for n in config.ns:
        for bp in config.problems_per_batch:
            if allocation.feasible(c_max, n, bp):
                groups[n * bp].append((n, bp))

    @jax.jit
    def evaluate(params):
        def one(p):
            return (trainer.answer_prob(gd, p, *evals["easy"]),
                    trainer.answer_prob(gd, p, *evals["hard"]))
        return jax.vmap(one)(params)

    records, step_metrics = [], {}
    rollouts_done, step_seconds = 0, 0.0
    total_steps = sum(c_max // r for r in groups)
    bar = tqdm(total=total_steps, desc=f"{NAME} sweep", mininterval=2.0, leave=False)
    for r in sorted(groups):
        lanes = [(n, bp, s) for n, bp in groups[r] for s in range(config.num_seeds)]
        run_lanes = pad_lanes(lanes, num_dev)
        spec = trainer.RLSpec(rollouts_per_step=r, max_new_tokens=answer_len, grpo=gcfg,
                              temperature=config.temperature)
        step = jax.jit(jax.vmap(trainer.make_rl_step(gd, tx, spec),
                                in_axes=(0, 0, 0, 0, None, None)), donate_argnums=(0, 1))
        params = sharding.shard_batch(stack(params0, len(run_lanes)), mesh)
        opt_state = jax.vmap(tx.init)(params)
        ns = sharding.shard_batch(np.asarray([n for n, _, _ in run_lanes], np.int32), mesh)
        base_keys = [jax.random.fold_in(jax.random.fold_in(jax.random.key(config.seed + 1 + s), n),
                                        bp) for n, bp, s in run_lanes]
        hist = []
        for m in range(1, c_max // r + 1):
            keys = jax.device_put(jnp.stack([jax.random.fold_in(k, m) for k in base_keys]),
                                  sharding.batch_sharding(mesh, 1))
            t0 = time.perf_counter()
            params, opt_state, met = step(params, opt_state, keys, ns, pool, ref)
            met = jax.device_get(met)
            if m > 1:  # exclude compilation
                step_seconds += time.perf_counter() - t0
                rollouts_done += r * len(run_lanes)
            hist.append(met)
            bar.update(1)
            if m * r in budgets:
                pe, ph = jax.device_get(evaluate(params))
                for i, (n, bp, s) in enumerate(lanes):
                    records.append({
                        "budget": m * r, "n": n, "bp": bp, "seed": s, "steps": m,
                        "easy_pass1": float(pe[i].mean()), "hard_pass1": float(ph[i].mean()),
                        "hard_passk": float(metrics.expected_pass_at_k(ph[i], config.pass_k).mean()),
                        "easy_passk": float(metrics.expected_pass_at_k(pe[i], config.pass_k).mean()),
                        "train_reward": float(np.mean([h["reward"][i] for h in hist]))})
        for i, lane in enumerate(lanes):
            step_metrics[lane] = {k: np.asarray([h[k][i] for h in hist]) for k in hist[0]}
    bar.close()
    return records, step_metrics, {"rollouts": rollouts_done, "seconds": step_seconds}


# ------------------------------------------------------------------------------------------------
# Analysis


def best_curve(records, budget, ns, objective, num_seeds):
    """Per n, the per-seed values [S] of ``objective`` at ``budget`` for the B_p with the best
    seed mean; returns (ns present, [S, K] values, chosen B_p per n)."""
    present, cols, chosen = [], [], []
    for n in ns:
        best = None
        for bp in sorted({r["bp"] for r in records}):
            vals = [r[objective] for r in records
                    if r["budget"] == budget and r["n"] == n and r["bp"] == bp]
            if len(vals) == num_seeds and (best is None or np.mean(vals) > np.mean(best[0])):
                best = (vals, bp)
        if best is not None:
            present.append(n)
            cols.append(best[0])
            chosen.append(best[1])
    return present, np.asarray(cols).T, chosen


def analyse(config, records, budgets):
    out = {}
    for split, objective in (("easy", "easy_pass1"), ("hard", "hard_passk")):
        rows = []
        for j, c in enumerate(budgets):
            present, vals, chosen = best_curve(records, c, config.ns, objective, config.num_seeds)
            if len(present) < 1:
                continue
            x = np.log2(present)
            point, lo, hi = fit.bootstrap_n_star(x, vals, config.num_boot, config.seed + j)
            rows.append({"budget": c, "n_star": 2**point, "lo": 2**lo, "hi": 2**hi,
                         "ns": present, "bp": chosen, "mean": vals.mean(axis=0).tolist()})
        out[split] = rows
    return out


def fit_nstar(config, rows):
    x = np.log2([r["budget"] for r in rows])
    y = np.log2([r["n_star"] for r in rows])
    f = fit.fit_scaling(x, y, lo=np.log2(min(config.ns)), hi_max=np.log2(2 * max(config.ns)))
    return {"power": f.power, "sigmoid": f.sigmoid, "loo_mse_power": f.loo_power,
            "loo_mse_sigmoid": f.loo_sigmoid, "winner": f.winner}


def sampled_check(config, gd, params, evals, key):
    """Unbiased pass@k from ``sampled_eval`` samples per hard held-out problem vs. the exact value."""
    s = config.sampled_eval
    prompts, targets, lens = evals["hard"]
    rep = jnp.repeat(jnp.arange(prompts.shape[0]), s)

    @jax.jit
    def go(p, key):
        toks, _, _ = rollout.rollout(gd, p, prompts[rep], key,
                                     max_new_tokens=targets.shape[1], end_id=tasks.END_ID)
        return tasks.exact_match(toks, targets[rep], lens[rep]).reshape(-1, s).sum(axis=1)

    correct = go(params, key)
    exact = trainer.answer_prob(gd, params, prompts, targets, lens)
    out = {}
    for k in sorted({1, config.pass_k}):
        out[f"pass@{k}_unbiased"] = float(metrics.pass_at_k(jnp.full_like(correct, s), correct,
                                                            k).mean())
        out[f"pass@{k}_exact"] = float(metrics.expected_pass_at_k(exact, k).mean())
    out["coverage_sampled"] = float((correct > 0).mean())
    return out


# ------------------------------------------------------------------------------------------------
# Plots


def plot_reward_vs_c(config, records, budgets, path):
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.4))
    for ax, (obj, label) in zip(axes, (("easy_pass1", "easy held-out pass@1"),
                                       ("hard_passk", f"hard held-out pass@{config.pass_k}"))):
        for n in config.ns:
            xs, ys = [], []
            for c in budgets:
                present, vals, _ = best_curve(records, c, [n], obj, config.num_seeds)
                if present:
                    xs.append(c)
                    ys.append(vals.mean())
            ax.plot(xs, ys, "o-", label=f"n={n}")
        ax.set(xscale="log", xlabel="rollout budget C", ylabel=label)
        ax.set_xscale("log", base=2)
    axes[0].legend(fontsize=8)
    return report.save_figure(fig, path)


def plot_nstar(config, nstar, fits, path):
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.4))
    for ax, split in zip(axes, ("easy", "hard")):
        rows = nstar[split]
        c = np.asarray([r["budget"] for r in rows], float)
        y = np.asarray([r["n_star"] for r in rows])
        err = np.stack([y - [r["lo"] for r in rows], np.asarray([r["hi"] for r in rows]) - y])
        ax.errorbar(c, y, yerr=np.maximum(err, 0), fmt="o", capsize=3, label="n*(C), 90% CI")
        grid = np.linspace(np.log2(c.min()), np.log2(c.max()), 50)
        f = fits[split]
        ax.plot(2**grid, 2**fit.power_law(grid, **f["power"]), "--",
                label=f"power law (LOO {f['loo_mse_power']:.2f})")
        ax.plot(2**grid, 2**fit.sigmoid_law(grid, **f["sigmoid"]), "-",
                label=f"sigmoid (LOO {f['loo_mse_sigmoid']:.2f})")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log", base=2)
        ax.set(xlabel="rollout budget C", ylabel="n*", title=f"{split} split")
        ax.legend(fontsize=7)
    return report.save_figure(fig, path)


def plot_pass_k(config, records, budget, path):
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.4))
    for ax, split in zip(axes, ("easy", "hard")):
        for obj, label in ((f"{split}_pass1", "pass@1"), (f"{split}_passk",
                                                          f"pass@{config.pass_k}")):
            present, vals, _ = best_curve(records, budget, config.ns, obj, config.num_seeds)
            ax.errorbar(present, vals.mean(axis=0), yerr=vals.std(axis=0), fmt="o-", capsize=3,
                        label=label)
        ax.set_xscale("log", base=2)
        ax.set(xlabel="rollouts per problem n", ylabel="held-out", title=f"{split}, C={budget}")
        ax.legend(fontsize=8)
    return report.save_figure(fig, path)


# ------------------------------------------------------------------------------------------------


def run(config: ml_collections.ConfigDict, workdir: str) -> report.Section:
    t_start = time.perf_counter()
    out = common.experiment_dir(workdir, NAME)
    budgets = validate(config)
    easy_t = tasks.ArithmeticTask(config.easy.terms, config.easy.digits, "easy")
    hard_t = tasks.ArithmeticTask(config.hard.terms, config.hard.digits, "hard")
    prompt_len = 1 + max(easy_t.prompt_chars, hard_t.prompt_chars)
    answer_len = max(easy_t.answer_chars, hard_t.answer_chars)
    data = {}
    for i, t in enumerate((easy_t, hard_t)):
        tr, ho = tasks.make_split(t, config.num_train, config.num_heldout, config.seed + i)
        data[t.name] = (encode(tr, t, prompt_len, answer_len), encode(ho, t, prompt_len,
                                                                       answer_len))
    evals = {k: tuple(jnp.asarray(v[1][f]) for f in ("prompts", "targets", "lens"))
             for k, v in data.items()}

    mcfg = TransformerConfig(vocab_size=258, max_len=prompt_len + answer_len,
                             d_model=config.model.d_model, num_layers=config.model.num_layers,
                             num_heads=config.model.num_heads, mlp_dim=config.model.mlp_dim)
    gd, params = nnx.split(Transformer(mcfg, rngs=nnx.Rngs(config.seed)))
    params0, warm_info = warm_start(config, gd, params, data["easy"][0], data["hard"][0], out)
    warm = {k: np.asarray(trainer.answer_prob(gd, params0, *evals[k])) for k in evals}
    warm_metrics = {"easy_pass1": float(warm["easy"].mean()),
                    "hard_pass1": float(warm["hard"].mean()),
                    "hard_passk": float(metrics.expected_pass_at_k(warm["hard"],
                                                                   config.pass_k).mean()),
                    **warm_info}

    # RL training pool: a mixture of easy and hard training problems.
    n_hard = int(round(config.num_train * config.hard_fraction_rl))
    pool = {k: jnp.asarray(np.concatenate([data["easy"][0][k][:config.num_train - n_hard],
                                           data["hard"][0][k][:n_hard]]))
            for k in ("prompts", "targets", "lens")}
    records, step_metrics, timing = run_sweep(config, gd, params0, pool, evals, budgets)

    nstar = analyse(config, records, budgets)
    fits = {split: fit_nstar(config, nstar[split]) for split in nstar}

    # Interference per n: share of batch problems whose exact pass@1 fell after an update, and
    # the cosine between per-problem gradients at the warm start.
    interference = {}
    cosines = None
    if config.cosine_problems:
        gcfg = grpo.GRPOConfig(advantage=config.advantage, aggregation=config.aggregation)
        probe_ids = np.linspace(0, pool["lens"].shape[0] - 1, config.cosine_problems).astype(int)
        cos_fn = jax.jit(functools.partial(trainer.group_gradient_cosine, gd,
                                           ns=tuple(config.ns), max_new_tokens=answer_len,
                                           cfg=gcfg))
        cosines = jax.device_get(cos_fn(params0, jax.random.key(config.seed + 7),
                                        *(pool[f][probe_ids] for f in ("prompts", "targets",
                                                                       "lens"))))
    for j, n in enumerate(config.ns):
        fallen = [v["fallen"].mean() for (ln, _, _), v in step_metrics.items() if ln == n]
        informative = [v["informative"].mean() for (ln, _, _), v in step_metrics.items()
                       if ln == n]
        entry = {"fallen": float(np.mean(fallen)), "informative_groups": float(np.mean(informative))}
        if cosines is not None:
            entry["grad_cosine"] = float(cosines[0][j])
            entry["grad_cosine_pairs"] = int(cosines[1][j])
        interference[str(n)] = entry

    c_max = budgets[-1]
    seed_std = {}
    for bp in config.problems_per_batch:
        stds = []
        for n in config.ns:
            vals = [r["easy_pass1"] for r in records
                    if r["budget"] == c_max and r["n"] == n and r["bp"] == bp]
            if len(vals) == config.num_seeds:
                stds.append(np.std(vals, ddof=1))
        seed_std[str(bp)] = float(np.mean(stds)) if stds else None

    def table(obj):
        return {str(c): {str(n): {str(bp): float(np.mean([
            r[obj] for r in records if r["budget"] == c and r["n"] == n and r["bp"] == bp]))
            for bp in config.problems_per_batch
            if any(r["budget"] == c and r["n"] == n and r["bp"] == bp for r in records)}
            for n in config.ns} for c in budgets}

    best_lane = max((r for r in records if r["budget"] == c_max), key=lambda r: r["easy_pass1"])
    sampled = {}
    if config.sampled_eval:
        sampled["warm_start"] = sampled_check(config, gd, params0, evals,
                                              jax.random.key(config.seed + 11))

    rollouts_per_s = timing["rollouts"] / timing["seconds"] if timing["seconds"] else float("nan")
    result = {
        "n_star": nstar, "fit": fits,
        "easy_pass1": table("easy_pass1"), "hard_coverage": table("hard_passk"),
        "hard_pass1": table("hard_pass1"), "interference": interference, "seed_std": seed_std,
        "rollouts_per_s": rollouts_per_s, "warm_start": warm_metrics, "budgets": list(budgets),
        "pass_k": config.pass_k, "sampled_check": sampled, "params": param_count(params0),
        "best_at_max_budget": best_lane, "records": records,
        "seconds": time.perf_counter() - t_start,
    }
    report.write_json(os.path.join(out, "metrics.json"), result)
    figs = [plot_reward_vs_c(config, records, budgets, os.path.join(out, "reward_vs_c.png")),
            plot_nstar(config, nstar, fits, os.path.join(out, "n_star.png")),
            plot_pass_k(config, records, c_max, os.path.join(out, "pass_k.png"))]

    # Report.
    easy_n = [r["n_star"] for r in nstar["easy"]]
    hard_n = [r["n_star"] for r in nstar["hard"]]
    grows = easy_n[-1] > easy_n[0] and hard_n[-1] > hard_n[0]
    grows_any = easy_n[-1] > easy_n[0] or hard_n[-1] > hard_n[0]
    rows = [[r["budget"], f"{r['n_star']:.1f} [{r['lo']:.1f}, {r['hi']:.1f}]",
             f"{h['n_star']:.1f} [{h['lo']:.1f}, {h['hi']:.1f}]"]
            for r, h in zip(nstar["easy"], nstar["hard"])]
    inter_rows = [[n, v["fallen"], v["informative_groups"], v.get("grad_cosine", float("nan"))]
                  for n, v in interference.items()]
    body = "\n".join([
        f"Policy: {param_count(params0):,}-parameter transformer; easy = sums of "
        f"{easy_t.num_terms} {easy_t.num_digits}-digit numbers, hard = {hard_t.num_terms} "
        f"{hard_t.num_digits}-digit numbers (answers reversed, exact match). Warm start: held-out "
        f"easy pass@1 {warm_metrics['easy_pass1']:.3f}, hard pass@1 {warm_metrics['hard_pass1']:.3f}"
        f", hard pass@{config.pass_k} {warm_metrics['hard_passk']:.3f} after "
        f"{warm_info['easy_steps']} easy-only and {warm_info['mixed_steps']} mixed steps"
        + ("." if warm_info["reached"] else " (a stage hit its step cap before its target)."),
        "",
        f"Sweep: budgets C = {', '.join(map(str, budgets))} rollouts; n in {tuple(config.ns)}; "
        f"B_p in {tuple(config.problems_per_batch)}; {config.num_seeds} seeds; GRPO "
        f"({config.advantage}, {config.aggregation}, {config.inner_steps} inner steps).",
        "",
        report.markdown_table(["C", "n* easy (pass@1) [90% CI]",
                               f"n* hard (pass@{config.pass_k}) [90% CI]"], rows),
        "",
        f"Fit of log2 n*(C): easy -> {fits['easy']['winner']} (LOO MSE power "
        f"{fits['easy']['loo_mse_power']:.3f}, sigmoid {fits['easy']['loo_mse_sigmoid']:.3f}); "
        f"hard -> {fits['hard']['winner']} (power {fits['hard']['loo_mse_power']:.3f}, sigmoid "
        f"{fits['hard']['loo_mse_sigmoid']:.3f}).",
        "",
        report.markdown_table(["n", "share of batch problems whose pass@1 fell",
                               "informative groups", "per-problem gradient cosine"], inter_rows),
        "",
        f"Seed std of final easy pass@1 per B_p: "
        f"{', '.join(f'B_p={k}: {v:.4f}' for k, v in seed_std.items() if v is not None)}. "
        f"Rollout+update throughput {rollouts_per_s:,.0f} rollouts/s (vmapped lanes, "
        "compilation excluded).",
    ])
    if sampled:
        w = sampled["warm_start"]
        body += (f"\n\nUnbiased pass@k from {config.sampled_eval} samples vs exact (warm start, hard):"
                 f" pass@1 {w['pass@1_unbiased']:.3f} vs {w['pass@1_exact']:.3f}; pass@"
                 f"{config.pass_k} {w[f'pass@{config.pass_k}_unbiased']:.3f} vs "
                 f"{w[f'pass@{config.pass_k}_exact']:.3f}.")
    return report.Section(
        title="Compute-optimal RL rollouts: GRPO IsoCompute sweep (rl_scaling)", body=body,
        figures=figs,
        headline={"method": "IsoCompute Playbook (GRPO allocation)",
                  "claim": "compute-optimal rollouts per problem n* grows with budget C, then "
                           "saturates (easy and hard)",
                  "ours": f"n* easy {easy_n[0]:.1f}->{easy_n[-1]:.1f}, hard {hard_n[0]:.1f}->"
                          f"{hard_n[-1]:.1f} over C={budgets[0]}..{budgets[-1]}; fit: "
                          f"{fits['easy']['winner']}/{fits['hard']['winner']}",
                  "reproduces": "yes" if grows and fits["easy"]["winner"] == "sigmoid" else
                  ("partly" if grows_any else "no")})


if __name__ == "__main__":
    common.app_main(NAME, run)
