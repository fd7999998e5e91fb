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
# # Benchmarks as a Stackelberg game (ICML 2026)
#
# Chen, Zhang & Hardt, *Leaderboard Incentives*: providers pay for benchmark-specific training to
# climb a leaderboard; the designer can give every model `Delta` units of such training before the
# test ("tune-before-test"). This notebook builds the payoff tensor of a three-provider game, finds
# its equilibria with and without tune-before-test, checks when "no equilibrium at `Delta = 0`" can
# hold at all, and plots the designer's threshold.
#
# **Time.** The tutorial takes about a minute on a free Colab CPU runtime (2 cores). The last cell,
# *Optional: the full experiment*, runs the `tiny` variant and adds 0.5 to 1 minute on a 2-core CPU
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

# %%
import matplotlib.pyplot as plt
import numpy as np

import algorithms.benchmark_game as bg
from core import figures as style

LEVELS = nbu.size(smoke=11, colab=41)  # effort levels per provider

# %% [markdown]
# ## 1. The game
#
# Latent qualities `theta = (1.0, 0.8, 0.6)`; observed score `theta + (1 - exp(-t))` after `t`
# units of training; efforts on a grid; winner takes all; cost `0.25` per unit of effort.

# %%
theta = np.array([1.0, 0.8, 0.6])
score = bg.AdditiveSaturating(amplitude=1.0, rate=1.0)
cost = bg.PowerCost(scale=0.25, power=1.0)
rewards = bg.winner_take_all(3)
contest = bg.make_contest(theta, np.linspace(0.0, 5.0, LEVELS), rewards, cost)
scores = bg.ranking_scores(score, contest, 0.0)  # ranks like the observed scores, float32-safe
payoffs = bg.payoff_tensor(scores, contest.costs, contest.rewards)
print("payoff tensor U[player, e_1, e_2, e_3]:", payoffs.shape)
print("provider 3's payoff against zero effort, by its own effort:", np.round(np.asarray(payoffs[2, 0, 0, :6]), 3))

# %% [markdown]
# ## 2. Equilibria at `Delta = 0` and with tune-before-test
#
# A pure equilibrium is a profile where every provider's effort is a best response. At `Delta = 0`
# there is none: best responses cycle. The statement needs effort to be cheap relative to the
# reward gap: `zero_effort_margin` is the largest profit of just overtaking a better model from
# zero effort; if it is negative, zero effort is already an equilibrium.

# %%
for delta in (0.0, 2.0):
    eq = bg.pure_equilibria(score, contest, delta)
    print(f"Delta = {delta}: {int(eq.count)} pure equilibria, zero effort unique: {bool(eq.zero_effort_unique)}")
dyn = bg.best_response_dynamics(score, contest, 0.0, np.zeros(3, np.int32))
print("best responses at Delta = 0 cycle:", bool(dyn.cycled), "| cycle length", int(dyn.cycle_length))
for kappa in (0.25, 5.0):
    margin = bg.zero_effort_margin(score, bg.PowerCost(kappa, 1.0), theta, rewards)
    dear = bg.make_contest(theta, np.linspace(0.0, 5.0, LEVELS), rewards, bg.PowerCost(kappa, 1.0))
    print(f"cost {kappa}/unit: overtaking profit {margin:+.3f}, pure equilibria at Delta = 0: "
          f"{int(bg.pure_equilibria(score, dear, 0.0).count)}")

# %% [markdown]
# ## 3. The designer's threshold
#
# Above `Delta*` overtaking costs more than it wins for every pair, so the only equilibrium is zero
# effort ranked by quality (Kendall tau 1). Closed form against the grid:

# %%
deltas = np.linspace(0.0, 3.0, nbu.size(smoke=13, colab=31))
sweep = bg.sweep_deltas(score, contest, deltas)
taus, _ = bg.fidelity(score, contest, deltas, sweep)
closed = bg.delta_star_closed_form(score, cost, theta, rewards)
fig, ax = plt.subplots(figsize=(6.4, 3.6))
ax.step(deltas, np.asarray(sweep.count), where="mid", label="pure equilibria")
ax.plot(deltas, taus, "o-", ms=3, label="ranking fidelity (Kendall $\\tau$)")
ax.axvline(closed, color="gray", ls=":", label=f"closed-form $\\Delta^*$ = {closed:.2f}")
ax.set(xlabel="tune-before-test training $\\Delta$", ylabel="equilibria / Kendall $\\tau$")
style.legend_outside(ax, fontsize=8)
plt.show()
print("numeric Delta* on the grid:", bg.delta_star_numeric(deltas, np.asarray(sweep.zero_effort_unique)))

# %% [markdown]
# ## Optional: the full experiment (`tiny`, 0.5 to 1 minute on a 2-core CPU)
#
# Three games (two score families, five providers), `Delta*` against the quality gap, the mixed
# equilibrium of two providers, timing. From a shell:
# `python -m experiments.benchmark_game --config=experiments/configs/benchmark_game.py:tiny --workdir=workdir`;
# override any field, e.g. `--config.theta='(1.0, 0.7, 0.4)' --config.cost_scale=5`.

# %%
section = nbu.run_and_show("benchmark_game", "tiny", workdir="workdir")
