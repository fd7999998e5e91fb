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
# # The Stochastic Path Follower (SPF), step by step
#
# Amidzadeh, Viitasaari & Di Francesco (ICML 2026) optimise over decisions that are stochastic
# processes adapted to a data stream and learn them with the Stochastic Path Follower. The paper's
# body is not available to us: `algorithms/spf/` is our reconstruction (a small network shared by
# all coordinates corrects each SGD step, trained through simulated drift episodes; see
# `docs/spf.md`). The Malliavin derivative is a diagnostic here; the update does not use it.
#
# This notebook follows a rotating optimum from a stream of noisy least-squares mini-batches, tunes
# the baselines over all their hyper-parameters on separate episodes, trains SPF for about a minute
# on a free Colab CPU, and compares tracking errors; then it runs the full `spf` experiment.
#
# **Time.** The tutorial takes about a minute on a free Colab CPU runtime (2 cores). The last cell,
# *Optional: the full experiment*, runs the `tiny` variant and adds 1 to 2 minutes on a 2-core CPU
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
# ## A drifting problem with a known optimum path
# `y = a . theta*(t) + 0.5 eps` with `a ~ N(0, I_d)`, M samples per step; pairs of coordinates of
# `theta*` rotate at random speeds. Tuning and test episodes are drawn from separate keys.

# %%
import jax
import numpy as np

from algorithms.spf import problems as P

problem = P.Problem(kind="lsq", drift="rotation", dim=nbu.size(smoke=4, colab=10),
                    batch=8, steps=nbu.size(smoke=20, colab=200), dt=0.05, noise=0.5,
                    ou_sigma=1.0)
tune_eps = P.sample_episodes(jax.random.key(1), problem, nbu.size(smoke=2, colab=8))
test_eps = P.sample_episodes(jax.random.key(2), problem, nbu.size(smoke=2, colab=16))
start = problem.steps // 4  # the first quarter is burn-in
print(f"d = {problem.dim}, M = {problem.batch}, T = {problem.steps}; theta* path "
      f"{tuple(test_eps.theta.shape)}, mini-batches {tuple(test_eps.A.shape)}")

# %% [markdown]
# ## Tune the baselines over all their hyper-parameters
# `tuning.candidates` is the product of every grid (Adam: rate x b1 x b2; prediction-correction:
# step x prediction weight x inner step; RLS: forgetting x initial scale); `tune` runs each grid in
# one vmapped call on the tuning episodes and keeps the lowest tracking error.

# %%
from algorithms.spf import tuning

grids = tuning.BaselineGrids()
chosen = {}
for name, (runner, configs) in tuning.candidates("lsq", grids).items():
    chosen[name], scores = tuning.tune(runner, configs, tune_eps, start)
    print(f"{name}: {len(configs)} candidates, chose {chosen[name]}")

# %% [markdown]
# ## Train SPF
# SPF starts as SGD with the tuned step (the network's last layer is zero) and is trained by
# backpropagation through fresh simulated episodes; `spf_training` gives what
# `core.training.train_loop` needs (data-parallel over every device).

# %%
from algorithms.spf import spf as S
from algorithms.spf.training import TrainSettings, spf_training
from core.training import LoopConfig, train_loop

cfg = S.SPFConfig(step=chosen["sgd"].step, hidden=nbu.size(smoke=8, colab=32), burn_in=0.25)
t = spf_training(problem, cfg, TrainSettings(steps=nbu.size(smoke=2, colab=60),
                                             episodes=nbu.size(smoke=2, colab=6),
                                             episode_steps=nbu.size(smoke=10, colab=100)))
result = train_loop(t.step_fn, t.state, t.batches, t.key,
                    LoopConfig(num_steps=nbu.size(smoke=2, colab=60), log_every=nbu.size(smoke=1, colab=10)))
params = jax.device_get(result.state["params"])
print(f"{S.param_count(params)} parameters; training objective "
      f"{result.history[0]['loss']:.4f} -> {result.history[-1]['loss']:.4f} "
      f"in {result.seconds:.0f} s")

# %% [markdown]
# ## Tracking error on held-out episodes
# `||x_t - x*(t)||^2` averaged over the test episodes; the paired test compares SPF with the best
# tuned baseline on the same episodes (a win needs a gap beyond two standard errors).

# %%
import jax.numpy as jnp
import matplotlib.pyplot as plt

from algorithms.spf import evaluation as EV
from core import figures as style
from experiments.spf import COLORS, LABELS

x0 = jnp.zeros(problem.dim)
runners = EV.lsq_runners(t.graphdef, params, cfg, chosen)
scores, curves = {}, {}
for name, run in runners.items():
    X = jax.vmap(lambda a, y, run=run: run(a, y, x0))(test_eps.A, test_eps.y)
    scores[name], curves[name] = EV.tracking_metrics("lsq", X, test_eps.theta, start)
best = min((m for m in scores if m != "spf"), key=lambda m: scores[m]["tracking_mse"])
paired = EV.paired_comparison(scores["spf"]["per_episode_mse"], scores[best]["per_episode_mse"])
for name in sorted(scores, key=lambda m: scores[m]["tracking_mse"]):
    print(f"{name:5s} tracking MSE {scores[name]['tracking_mse']:.4f}")
print(f"SPF minus {best}: {paired['difference']:+.4f} ± {paired['se']:.4f}: SPF {paired['outcome']}")

fig, ax = plt.subplots(figsize=(6, 3.2))
for name, c in curves.items():
    ax.plot(np.arange(c.size) * problem.dt, c, label=LABELS[name], color=COLORS[name],
            lw=2 if name == "spf" else 1)
ax.axvline(start * problem.dt, color="grey", ls=":", label="scoring starts")
ax.set(yscale="log", xlabel="time t", ylabel="tracking error $\\|x_t - x^*(t)\\|^2$")
style.legend_outside(ax, fontsize=8)
plt.show()

# %% [markdown]
# ## Optional: the full experiment (`tiny`, 1 to 2 minutes on a 2-core CPU)
# Three problems (rotation and OU drift in least squares, rotating logistic regression), the
# Kalman oracle, the Malliavin noise memory and the dimension sweep, writing
# `workdir/spf/metrics.json`, plots and a report section. From a shell:
# `python -m experiments.spf --config=experiments/configs/spf.py:tiny --workdir=workdir`.

# %%
section = nbu.run_and_show("spf", "tiny", workdir="workdir")
