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
# # Discrete diffusion LMs beside AR, step by step
#
# *Scaling Beyond Masked Diffusion Language Models* (Sahoo et al., ICML 2026) compares
# autoregressive, masked (MDLM), uniform-state (Duo) and interpolating (Eso-LM, GIDD) language
# models at equal compute. Every diffusion family here is one forward process
# `q_t(z | x) = alpha_t x + beta_t pi_t` with a per-token NELBO; validation numbers are that NELBO
# in bits per byte.
#
# This notebook builds the pieces with the library's public API on the Shakespeare bytes: the
# families and their processes, a NELBO estimate per family, a small masked diffusion model trained
# for about a minute on a Colab CPU and sampled, then the full `diffusion_lm` experiment.
#
# **Time.** The tutorial takes about a minute on a free Colab CPU runtime (2 cores). The last cell,
# *Optional: the full experiment*, runs the `tiny` variant and adds 2 to 7 minutes on a 2-core CPU
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
# ## The families
# A run is a config (`experiments/configs/diffusion_lm.py`); `grid.family_spec` turns a family
# name into a `FamilySpec` with the tokenizer's ids and the config's process settings. Each spec
# has the process it trains on and the one its sampler reverses (they differ for Eso-LM, which is
# trained at `alpha_0 = 1` with the cross-entropy objective and samples at `alpha_0 < 1`).

# %%
import jax
import jax.numpy as jnp
import numpy as np

from algorithms.diffusion_lm import grid
from algorithms.diffusion_lm.families import FAMILIES
from core.data import ByteTokenizer, load_corpus
from experiments.configs import diffusion_lm as dlm_config

tokenizer = ByteTokenizer()
config = dlm_config.get_config(nbu.size(smoke="smoke", colab="tiny"))
corpus = load_corpus(None, val_fraction=config.val_fraction, tokenizer=tokenizer)
for name in FAMILIES:
    spec = grid.family_spec(config, name, tokenizer)
    proc, samp = spec.process, spec.sampling_process
    print(f"{name:12s} train: {proc.kind if proc else 'causal'}"
          + (f" alpha_0={proc.alpha0}" if proc and proc.kind == "masked" else "")
          + (f"; sampler alpha_0={samp.alpha0}" if samp is not proc else ""))

# %% [markdown]
# ## A NELBO estimate per family, and where in time it comes from
# `Runner.model` builds a family's transformer (time-conditioned for Duo and GIDD) and
# `Runner.evaluate` averages the per-token NELBO over held-out windows with diffusion times drawn
# from `U[t_min, 1]`. An untrained model is near `log 256` nats per byte for every family. The plot
# shows the integrand `E[L_t]` over `t` for the untrained models: most of the masked NELBO comes
# from small `t`, where the weight `1/t` is large and almost nothing is masked.

# %%
import matplotlib.pyplot as plt
from flax import nnx

from algorithms.diffusion_lm.families import per_token_terms
from algorithms.diffusion_lm.processes import nats_to_bpb
from core.data.text import sequential_windows

runner = grid.Runner(config, tokenizer)
size = config.sizes[config.reference_size]
windows = sequential_windows(corpus.val, config.seq_len, config.eval_windows)
models = {name: runner.model(name, size) for name in ("ar", "mdlm", "duo", "gidd")}
for name, m in models.items():
    ev = runner.evaluate(m, windows, reps=1, key=jax.random.key(0))
    print(f"{name:5s} untrained: {nats_to_bpb(ev['mean']):.2f} bits/byte "
          f"(s.e. {nats_to_bpb(ev['se']):.2f})")

ts = np.linspace(config.process.t_min, 1.0, nbu.size(smoke=4, colab=24))
x = jnp.asarray(windows[:config.batch_size])
fig, ax = plt.subplots(figsize=(5, 3))
for name in ("mdlm", "duo", "gidd"):
    m = models[name]

    @jax.jit  # one compilation per family; every t reuses it
    def integrand(params, t, m=m):
        model = nnx.merge(m.graphdef, params)
        return per_token_terms(m.spec, model, x, jax.random.key(1),
                               jnp.full((x.shape[0],), t))[1].mean()

    curve = [float(integrand(m.eval_params, t)) for t in ts]
    ax.plot(ts, curve, label=name)
ax.set(xlabel="diffusion time t", ylabel="E[L_t] (nats/token)", yscale="log",
       title="NELBO integrand, untrained models")
ax.legend()
plt.show()

# %% [markdown]
# ## Train a small masked diffusion model and sample from it
# `Runner.train` runs `core.training.train_loop` (checkpoints, exact resume, a settings
# fingerprint) and evaluates at the given steps; rerunning the cell restores the finished run.
# The ancestral sampler starts from all-`[MASK]` and reveals tokens over `num_steps` steps.

# %%
steps = nbu.size(smoke=4, colab=150, accelerator=600)
mdlm = runner.model("mdlm", size)
result = runner.train(mdlm, corpus.train, [steps], windows, "workdir/tutorial_diffusion/mdlm",
                      cache={})
print(f"MDLM after {steps} steps: {nats_to_bpb(result['evals'][str(steps)]['mean']):.2f} bits/byte "
      f"held-out (NELBO bound)")
samples, tokens_per_s = runner.samples(mdlm, num_steps=nbu.size(smoke=2, colab=32))
print(f"{tokens_per_s:,.0f} tokens/s; first sample:")
print(tokenizer.decode(samples[0]))

# %% [markdown]
# ## Optional: the full experiment (`tiny`, 2 to 7 minutes on a 2-core CPU)
# The IsoFLOP grid (AR, MDLM with both objectives, Duo at four sizes and three budgets), Eso-LM,
# its ablation and GIDD at the reference size, samples of every family scored by one larger AR
# evaluator, and the fits (`tiny` on a CPU takes several minutes; `paper` is sized for a TPU or GPU
# pod). From a shell:
# `python -m experiments.diffusion_lm --config=experiments/configs/diffusion_lm.py:tiny --workdir=workdir`.

# %%
section = nbu.run_and_show("diffusion_lm", "tiny", workdir="workdir")
