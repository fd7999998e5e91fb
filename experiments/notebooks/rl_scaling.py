# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # IsoCompute Playbook: how many rollouts per problem? (GRPO, step by step)
#
# Cheng et al. (ICML 2026) spend a rollout budget C = n x B_p x M (rollouts per problem x problems
# per batch x update steps) and ask which n is compute-optimal: n*(C) grows with C, then saturates.
# This notebook builds the pieces of `algorithms/rl_scaling/` on small sums: the verifiable task,
# a supervised warm start, GRPO steps whose n prompts share one KV-cache prefill, exact and
# sampled pass@k, and a small iso-compute sweep with its n*(C); then it runs the full experiment.
#
# **Time.** The tutorial takes about a minute on a free Colab CPU runtime (2 cores). The last cell,
# *Optional: the full experiment*, runs the `tiny` variant and adds 4 to 12 minutes on a 2-core CPU
# (idle to busy); skip it for the tutorial alone.

# %%
# Set-up: installs the project from its repository when it is not importable (e.g. on Colab).
import importlib
import importlib.util
import subprocess
import sys

REPO = "https://github.com/icml26-jax/icml26-jax"
if importlib.util.find_spec("experiments") is None:
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", f"git+{REPO}"], check=True)
    importlib.invalidate_caches()
from experiments import notebook_utils as nbu

nbu.setup()  # installs the data packages, prints the runtime and the variant

# %% [markdown]
# ## A verifiable task
# A problem is a sum shown as `<BOS>` + padding + `"a+b="`; the one correct completion is the sum
# written least-significant digit first, then `"\n"`. The reward is exact match (1 or 0).

# %%
import jax
import jax.numpy as jnp
import matplotlib.pyplot as plt
import numpy as np
from flax import nnx

from algorithms.rl_scaling import analysis, grpo, metrics, sweep, tasks, trainer, warmstart
from models.transformer import Transformer, TransformerConfig

easy, hard = tasks.ArithmeticTask(2, 1, "easy"), tasks.ArithmeticTask(3, 1, "hard")
train, held, prompt_len, answer_len = tasks.problem_sets((easy, hard), 80, 20, seed=0)
print(f"P = {prompt_len} prompt tokens, T = {answer_len} answer tokens")
print(repr(bytes(train["easy"]["prompts"][0, 1:].tolist()).decode()), "->",
      repr(bytes(train["easy"]["targets"][0].tolist()).decode()))
print("checker:", tasks.check_answer("21\n", 12), tasks.check_answer("12\n", 12))

# %% [markdown]
# ## Warm start
# A small transformer learns the sums by supervised training, in two stages that stop on measured
# pass rates (easy sums alone, then a mixture with hard ones), checkpointed under `workdir/`.

# %%
cfg = TransformerConfig(vocab_size=258, max_len=prompt_len + answer_len, d_model=64,
                        num_layers=2, num_heads=4, mlp_dim=128)
graphdef, params = nnx.split(Transformer(cfg, rngs=nnx.Rngs(0)))
warm_cfg = warmstart.WarmStartConfig(
    batch_size=32, learning_rate=3e-3, warmup_steps=10, easy_target=0.3, hard_target=0.02,
    check_every=nbu.size(smoke=2, colab=25), probe_problems=64,
    max_easy_steps=nbu.size(smoke=4, colab=600), max_steps=nbu.size(smoke=8, colab=1200))
params, info = warmstart.warm_start(warm_cfg, graphdef, params, train["easy"], train["hard"],
                                    workdir="workdir/notebook_warmstart")
evals = {k: tuple(jnp.asarray(v[f]) for f in ("prompts", "targets", "lens"))
         for k, v in held.items()}
for split in ("easy", "hard"):
    p = trainer.answer_prob(graphdef, params, *evals[split])  # exact pass@1 per problem
    print(f"{split}: held-out pass@1 {float(p.mean()):.3f}, pass@8 "
          f"{float(metrics.expected_pass_at_k(p, 8).mean()):.3f}")
print(info)

# %% [markdown]
# ## Exact and sampled pass@k
# With one correct completion, pass@1 of a problem is exactly p = pi(answer | prompt) and pass@k is
# 1 - (1 - p)^k. The unbiased estimator from c correct out of s samples (Chen et al. 2021) agrees.

# %%
s = nbu.size(smoke=4, colab=32)
correct = trainer.sampled_correct(graphdef, params, jax.random.key(1), *evals["easy"],
                                  num_samples=s)
p = trainer.answer_prob(graphdef, params, *evals["easy"])
print(f"pass@4: sampled {float(metrics.pass_at_k(jnp.full_like(correct, s), correct, 4).mean()):.3f}"
      f", exact {float(metrics.expected_pass_at_k(p, 4).mean()):.3f}")

# %% [markdown]
# ## GRPO steps
# One step draws B_p problems, samples n completions of each (each prompt prefilled once), scores
# them, normalises rewards within each group and takes clipped-surrogate updates. n is a traced
# argument: every (n, B_p) with the same R = n B_p shares one compiled step.

# %%
import optax

pool = {k: jnp.asarray(v) for k, v in tasks.mixed_pool(train["easy"], train["hard"], 80,
                                                       0.5).items()}
tx = optax.chain(optax.clip_by_global_norm(1.0), optax.adam(3e-4))
spec = trainer.RLSpec(rollouts_per_step=16, max_new_tokens=answer_len,
                      grpo=grpo.GRPOConfig(inner_steps=2, clip_eps_high=0.28), max_problems=4)
step = jax.jit(trainer.make_rl_step(graphdef, tx, spec))
p_rl, opt = params, tx.init(params)
for m in range(nbu.size(smoke=2, colab=20)):
    p_rl, opt, met = step(p_rl, opt, jax.random.key(m), jnp.int32(4), pool, None)
print({k: round(float(v), 3) for k, v in met.items()})

# %% [markdown]
# ## A small iso-compute sweep and n*(C)
# Each (n, B_p, seed) run is trained once to the largest budget with a constant learning rate and
# read off at every budget; n* is the vertex of a parabola in log2 n through the seed-mean
# held-out pass@1, with a bootstrap over seeds.

# %%
sw_cfg = sweep.SweepConfig(ns=(2, 4, 8), problems_per_batch=(4,), num_seeds=2,
                           budgets=nbu.size(smoke=(32, 64, 128), colab=(32, 64, 128, 256)),
                           grpo=spec.grpo, pass_k=4)
res = sweep.run_sweep(sw_cfg, graphdef, params, pool, evals)
rows = analysis.n_star_by_budget(res.records, sw_cfg.budgets, sw_cfg.ns, "easy_pass1",
                                 sw_cfg.num_seeds, num_boot=50, seed=0)
print(f"{res.rollouts_per_second:,.0f} rollouts/s")
fig, ax = plt.subplots(figsize=(5, 3.2))
ax.errorbar([r["budget"] for r in rows], [r["n_star"] for r in rows],
            yerr=np.maximum(0, [[r["n_star"] - r["lo"] for r in rows],
                                [r["hi"] - r["n_star"] for r in rows]]), fmt="o-", capsize=3)
ax.set(xscale="log", yscale="log", xlabel="rollout budget C", ylabel="n* (easy pass@1)")
plt.show()

# %% [markdown]
# ## Optional: the full experiment (`tiny`, 4 to 12 minutes on a 2-core CPU)
# Two-digit sums, n up to 16 (32 in `full`), B_p in {4, 8}, three seeds, four budgets; n*(C) on
# both splits, power law vs sigmoid with a bootstrap of their comparison, interference and seed
# variance. From a shell:
# `python -m experiments.rl_scaling --config=experiments/configs/rl_scaling.py:tiny --workdir=workdir`.

# %%
section = nbu.run_and_show("rl_scaling", "tiny", workdir="workdir")
