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
# # Judge-aware Bradley-Terry-Luce ranking (ICML 2026)
#
# Xu et al., *A Judge-Aware Ranking Framework for Evaluating Large Language Models without Ground
# Truth*: judge `k` prefers model `i` to model `j` with probability
# `sigmoid(gamma_k (s_i - s_j))`, so reliable judges (large `gamma_k`) count for more than
# near-random ones. This notebook fits the model to real crowd judgements (LLMFAO, when the file is
# present; simulated judgements otherwise), draws confidence intervals for scores and ranks, and
# ends with the full experiment.
#
# **Time.** The tutorial takes about a minute on a free Colab CPU runtime (2 cores). The last cell,
# *Optional: the full experiment*, runs the `tiny` variant and adds 1 to 1.5 minutes on a 2-core CPU
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
import os

import jax
import matplotlib.pyplot as plt
import numpy as np

from algorithms.ranking import btl, data, inference, studies
from core import figures as style
from core.data import download, judgments

# %% [markdown]
# ## 1. Judgements
#
# One row per comparison: the two models, the judge and the outcome. `read_judgments` reads CSV,
# JSON lines or a JSON array and maps names to integer ids. LLMFAO comes by name from
# `core.data.download` (the cached file, else one short download attempt; the test suite reads
# the cache only); without it we simulate 20 models judged by 4 sharp, 5 near-random and
# 1 adversarial judge.

# %%
if download.is_cached("llmfao") or not nbu.size(smoke=False, colab=True):
    LLMFAO = download.cached_path("llmfao")
else:
    LLMFAO, _ = download.fetch_if_reachable("llmfao")
if LLMFAO and os.path.exists(LLMFAO):
    js = judgments.read_judgments(LLMFAO, judge="worker", outcome="winner")
    comps = studies.Comparisons(js.left, js.right, js.judge, js.outcome)
    models, n_judges = js.models, len(js.judges)
else:
    truth = studies.simulation_truth(20, studies.judge_panel(4, 5, 2.5, 0.25, 0.05), 1.5, seed=0)
    comps = studies.simulate_comparisons(truth, 20_000, jax.random.key(0))
    models, n_judges = [f"model_{i}" for i in range(20)], 10
print(f"{comps.left.shape[0]:,} comparisons, {len(models)} models, {n_judges} judges")

# %% [markdown]
# ## 2. Counts per (pair, judge) and the fit
#
# `aggregate` sums the outcomes of every `(i < j, judge)` cell, so each Newton iteration costs
# O(cells), not O(comparisons). `btl.fit` checks that the data identify the model, then runs the
# jitted Newton method in float64. With few comparisons per judge the judge-aware maximum
# likelihood estimate can sit at infinity (a judge who agrees with the order every time); a ridge
# on the log-discriminations (a Gaussian prior, the MAP) keeps it finite.

# %%
table = data.aggregate(comps.left, comps.right, comps.outcome, comps.judge,
                       n_models=len(models), n_judges=n_judges)
aware = btl.fit(table, btl.FitConfig(ridge_alpha=3.0))
plain = btl.fit(table, btl.FitConfig(judge_aware=False))
print(f"{table.num_rows:,} cells; judge-aware MAP: {int(aware.convergence.iterations)} Newton "
      f"iterations, converged {bool(aware.convergence.converged)}")
gamma = np.exp(np.asarray(aware.params.log_discrimination))
print("judge discriminations gamma, 5/50/95% quantiles:", np.round(np.quantile(gamma, [0.05, 0.5, 0.95]), 2))

# %% [markdown]
# ## 3. Intervals for scores and ranks
#
# The expected (Fisher) information at the estimate, as in the paper, gives Wald intervals for the
# scores (and, by the delta method, for `gamma`; `information="observed"` inverts the observed
# information instead); drawing scores from the asymptotic normal law gives an interval for each rank.

# %%
with jax.enable_x64(True):
    cov = inference.covariance(table.astype(np.float64), aware.params, aware.config)
    ci = inference.intervals(aware.params, cov)
    rank, lo, hi = (np.asarray(a) for a in inference.rank_intervals(
        jax.random.key(1), aware.params, cov, num_draws=nbu.size(smoke=500, colab=4000)))
top = np.argsort(rank)[:20]
fig, ax = plt.subplots(figsize=(6, 5))
ax.hlines(np.arange(len(top)), lo[top], hi[top], lw=3, label="95% rank interval")
ax.plot(rank[top], np.arange(len(top)), "k|", ms=10, label="estimated rank")
ax.set_yticks(np.arange(len(top)), [models[m] for m in top], fontsize=7)
ax.invert_yaxis()
ax.set(xlabel="rank (1 = best)", ylabel="model")
ax.set_title("judge-aware BTL: the top 20 with rank intervals")
style.legend_outside(ax, fontsize=8)
plt.show()
plain_rank = np.asarray(inference.ranks(plain.params.scores))
print("top 5, judge-aware:", [models[m] for m in top[:5]])
print("top 5, plain BTL:  ", [models[m] for m in np.argsort(plain_rank)[:5]])

# %% [markdown]
# Scores are identified only up to a shift and, together with the discriminations, a common
# scale; to compare two fits with a known truth, align the scales first:
# `studies.aligned_rmse(estimate, truth)` (least squares). The experiment reports recovery that way.
#
# ## Optional: the full experiment (`tiny`, 1 to 1.5 minutes on a 2-core CPU)
#
# Simulation, interval coverage, agreement with `choix`, speed against `choix` at 100 models and
# 1M comparisons, and, given a judgements file, the held-out evaluation on it. From a shell:
# `python -m experiments.judge_btl --config=experiments/configs/judge_btl.py:tiny --workdir=workdir`
# (`tiny` adds LLMFAO when it is cached or downloads), with `--config.data=llmfao`, or with
# `--config.data_path=FILE` (any judgements file).

# %%
section = nbu.run_and_show("judge_btl", "tiny", workdir="workdir")
