"""Benchmark: decode attention over QVG- and KIVI-quantized KV caches against the dense bf16 cache.

    python -m experiments.bench.kv_quant [smoke|cpu|accelerator]

Dimensions: S cache slots, D head dim, K kv heads, G queries per kv head. One new query token
attends to a full cache of S slots through :class:`kernels.kv_quant.cache.QVGCache` (INT2, one
k-means stage, keys stored before RoPE) and :class:`kernels.kv_quant.cache.KIVICache` (INT2), each
with the fused XLA path (``implementation="xla"``, the CPU default: one chunk of packed codes
dequantized per loop step) and with the jnp reference (dequantize the whole cache, then attend),
and through the dense bf16 cache (:class:`kernels.cache_backend.DenseKVCache`), all timed in
alternation
in one run (:func:`core.timing.best_seconds`). On GPU / TPU ``auto`` picks the Pallas kernel for
QVG. The caches are filled the way a model fills them, one chunk per ``update`` call.

Reported per cache: time and time / dense; the bytes a decode step reads (the whole cache: packed
codes, scales, zeros, assignments, centroids and the full-precision windows) and dense bf16 bytes /
those bytes (the paper's baseline dtype); the true storage bits per element
(:func:`kernels.kv_quant.reference.effective_bits`). A breakdown row times the fused QVG path
without the RoPE rotation of its pre-RoPE keys. The machine's read bandwidth
(:func:`core.timing.read_bandwidth_gbs`) is measured beside, with the bandwidth dense reaches.

Sizes (``SIZES``): ``cpu`` (default; S 65536, D 128, K 8, G 4, a few minutes on a 2-core CPU);
``accelerator`` (the same shape, more repeats) for a GPU / TPU; ``smoke`` runs in seconds.
"""

from __future__ import annotations

import sys

import jax
import jax.numpy as jnp

from core.report import markdown_table
from core.timing import best_seconds, read_bandwidth_gbs
from experiments.bench.timing import pick_size
from kernels.kv_quant import api, cache
from kernels.kv_quant import reference as ref
from models.kv_cache import get_backend

SIZES = {
    "smoke": dict(slots=512, head_dim=64, kv_heads=2, groups=2, chunk=128, num_centroids=16,
                  repeats=1, bandwidth_mb=16),
    "cpu": dict(slots=65536, head_dim=128, kv_heads=8, groups=4, chunk=1024, num_centroids=64,
                repeats=3, bandwidth_mb=256),
    "accelerator": dict(slots=65536, head_dim=128, kv_heads=8, groups=4, chunk=1024,
                        num_centroids=64, repeats=10, bandwidth_mb=1024),
}


def _fill(backend, b, slots, kv_heads, head_dim, k, v, step):
    """A layer cache holding k, v [B, K, S, D], written ``step`` tokens per update call."""
    layer = backend.init(b, slots, kv_heads, head_dim, jnp.bfloat16)
    update = jax.jit(backend.update)
    for s0 in range(0, slots, step):
        layer = update(layer, k[:, :, s0:s0 + step], v[:, :, s0:s0 + step],
                       jnp.full((b,), s0, jnp.int32))
    return jax.block_until_ready(layer)


@jax.jit
def dense_bf16_products(q: jax.Array, layer: dict, start: jax.Array) -> jax.Array:
    """A second dense baseline: one query token q [B, H, 1, D] over the bf16 cache ``layer``
    (k, v [B, K, S, D]) with bf16 operands and float32 accumulation (no float32 copy of the
    cache, unlike :class:`kernels.cache_backend.DenseKVCache`, which converts the cache to float32
    first); slots ``s <= start[b]`` are attended. Returns float32 [B, H, 1, D]."""
    b, h, _, d = q.shape
    kh = layer["k"].shape[1]
    qg = q.reshape(b, kh, h // kh, d).astype(jnp.bfloat16)
    s = jnp.einsum("bkgd,bksd->bkgs", qg, layer["k"], preferred_element_type=jnp.float32)
    valid = jnp.arange(layer["k"].shape[2])[None, :] <= start[:, None]
    p = jax.nn.softmax(jnp.where(valid[:, None, None], s / jnp.sqrt(d), -jnp.inf), axis=-1)
    out = jnp.einsum("bkgs,bksd->bkgd", p.astype(jnp.bfloat16), layer["v"],
                     preferred_element_type=jnp.float32)
    return out.reshape(b, h, 1, d)


def run(size: str = "cpu") -> str:
    """Times QVG, KIVI and dense decode attention at ``SIZES[size]``; returns a markdown section.

    Raises:
      ValueError: unknown ``size``.
    """
    s = pick_size(SIZES, size, "bench kv_quant")
    slots, d, kh, n = s["slots"], s["head_dim"], s["kv_heads"], s["chunk"]
    b, h = 1, kh * s["groups"]
    qcfg = ref.QVGConfig(bits=2, stages=1, block=64, num_centroids=s["num_centroids"], chunk=n,
                         kmeans_iters=4)
    kcfg = ref.KIVIConfig(bits=2, group=32, block=32, residual=128)
    ks = jax.random.split(jax.random.key(0), 3)
    k = jax.random.normal(ks[0], (b, kh, slots, d), jnp.bfloat16)
    v = jax.random.normal(ks[1], (b, kh, slots, d), jnp.bfloat16)
    q = jax.random.normal(ks[2], (b, h, 1, d), jnp.float32)
    start = jnp.full((b,), slots - 1, jnp.int32)

    dense = get_backend("dense")
    backends = {
        "qvg_xla": get_backend("qvg", config=qcfg, implementation="xla"),
        "qvg_ref": get_backend("qvg", config=qcfg, implementation="reference"),
        "kivi_xla": get_backend("kivi", config=kcfg, implementation="xla"),
        "kivi_ref": get_backend("kivi", config=kcfg, implementation="reference"),
    }
    layers = {"dense": _fill(dense, b, slots, kh, d, k, v, slots)}
    layers["qvg"] = _fill(backends["qvg_xla"], b, slots, kh, d, k, v, n)
    layers["kivi"] = _fill(backends["kivi_xla"], b, slots, kh, d, k, v, kcfg.residual)
    del k, v
    attends = {name: jax.jit(be.attend) for name, be in backends.items()}
    d_attend = jax.jit(dense.attend)
    qr = q.reshape(b, kh, s["groups"], d)
    nq = jnp.full((b,), slots, jnp.int32)
    no_rope = jax.jit(lambda layer: api.qvg_chunk_attention(
        qr, layer["k"], layer["v"], qcfg, start, nq, 1, None, implementation="xla"))
    fns = {"dense": lambda: d_attend(layers["dense"], q, start),
           "dense_bf16": lambda: dense_bf16_products(q, layers["dense"], start),
           "qvg_no_rope": lambda: no_rope(layers["qvg"])}
    for name, fn in attends.items():
        layer = layers[name.split("_")[0]]
        fns[name] = (lambda fn=fn, layer=layer: fn(layer, q, start))
    t = best_seconds(fns, s["repeats"])
    same = {m: float(jnp.max(jnp.abs(fns[f"{m}_xla"]() - fns[f"{m}_ref"]()).astype(jnp.float32)))
            for m in ("qvg", "kivi")}
    bandwidth = read_bandwidth_gbs(s["bandwidth_mb"])

    bytes_d = cache.cache_bytes([layers["dense"]])
    bits = {"qvg": ref.effective_bits(qcfg, d, context_len=slots),
            "kivi": ref.effective_bits(kcfg, d, context_len=slots)}
    rows = [["dense bf16 (baseline, `DenseKVCache`)", f"{1e3 * t['dense']:.1f}", "1.00x", "",
             f"{bytes_d:,}", "1.0x", "16"],
            ["dense bf16, bf16 products (second baseline)", f"{1e3 * t['dense_bf16']:.1f}",
             f"{t['dense_bf16'] / t['dense']:.2f}x", "1.00x", f"{bytes_d:,}", "1.0x", "16"]]
    labels = {"qvg_xla": "QVG INT2, fused XLA", "qvg_ref": "QVG INT2, reference",
              "kivi_xla": "KIVI INT2, fused XLA", "kivi_ref": "KIVI INT2, reference"}
    for name, label in labels.items():
        m = name.split("_")[0]
        nbytes = cache.cache_bytes([layers[m]])
        rows.append([label, f"{1e3 * t[name]:.1f}", f"{t[name] / t['dense']:.2f}x",
                     f"{t[name] / t['dense_bf16']:.2f}x", f"{nbytes:,}", f"{bytes_d / nbytes:.1f}x",
                     f"{bits[m]['effective']:.2f}"])
    rows.append(["QVG fused XLA without the RoPE rotation (breakdown)",
                 f"{1e3 * t['qvg_no_rope']:.1f}", f"{t['qvg_no_rope'] / t['dense']:.2f}x",
                 f"{t['qvg_no_rope'] / t['dense_bf16']:.2f}x", "", "", ""])
    dense_gbs = bytes_d / t["dense"] / 1e9
    fast_gbs = bytes_d / t["dense_bf16"] / 1e9
    return "\n".join([
        "## kv_quant: quantized decode attention (QVG, KIVI) vs dense bf16",
        "",
        f"One new token against {slots:,} cached slots, D={d}, {kh} kv heads x {s['groups']} "
        f"queries; QVG chunk {n} with {qcfg.num_centroids} centroids, block {qcfg.block}, keys "
        f"stored before RoPE; KIVI group {kcfg.group}, block {kcfg.block}, residual "
        f"{kcfg.residual} (size `{size}`, best of {s['repeats']} interleaved calls after a "
        f"warm-up, backend `{jax.default_backend()}`). Time / dense > 1 means slower than dense. "
        "Bytes read per step: everything the cache holds (codes, scales, zeros, assignments, "
        "centroids and the full-precision windows); dense / that is the reduction against the "
        "paper's bf16 baseline. The fused path reads the packed codes as stored (the "
        "reference writes and reads a float32 copy of the whole cache besides).",
        "",
        markdown_table(["cache", "ms per decode step", "time / dense",
                        "time / dense (bf16 products)", "bytes read per step",
                        "dense bf16 bytes / bytes", "true bits per element"], rows),
        "",
        f"Read bandwidth of this machine: {bandwidth:.1f} GB/s; dense bf16 attention reads "
        f"{dense_gbs:.1f} GB/s ({dense_gbs / bandwidth:.0%} of it), with bf16 products "
        f"{fast_gbs:.1f} GB/s ({fast_gbs / bandwidth:.0%}). Fused vs reference, largest "
        f"output difference: QVG {same['qvg']:.1e}, KIVI {same['kivi']:.1e}.",
        "",
        f"Command: `python -m experiments.bench.kv_quant {size}`",
    ])


if __name__ == "__main__":
    print(run(sys.argv[1] if len(sys.argv) > 1 else "cpu"))
