"""Decode steps over dense, FFD and QVG KV caches, as ahead-of-time compile rows
(``core.aot_steps.StepSpec``): one new token per sequence through ``Model.decode`` (the call
``models.sampling.generate`` makes each token) over a cache of
``models.kv_cache.get_backend(name, **options)``, for the ``lm`` model and a Llama-3-8B-shaped
model (:data:`LLAMA3_8B`), with abstract arguments placed on a pod's mesh by ``core.sharding``.

Dimensions: B sequences, S cache slots, K kv heads, G query heads per kv head, D head dim, P pages.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from core import aot_steps, sharding, steps
from kernels.kv_quant.reference import QuantizerSettings, quantizer_configs
from kernels.sparse_decode import cost as sd_cost
from kernels.sparse_decode import pallas_tpu as sd_tpu
from kernels.sparse_decode import reference as ref
from models import kv_cache as kvc
from models.hf_checkpoint import config_from_hf
from models.llama import Llama
from models.transformer import (
    PARAM_AXES,
    Transformer,
    TransformerConfig,
    forward_flops_per_token,
    param_count,
)

DECODE_CONTEXT = 65536  # cache slots of the lm rows: a sparse_decode paper context
DECODE_BATCH = 16  # sequences per lm decode step: one per data shard on a 16-chip pod

# Meta Llama 3.1 8B's config.json (the fields the decoder reads; no weights are needed to compile).
LLAMA3_8B = {
    "model_type": "llama", "vocab_size": 128256, "hidden_size": 4096, "intermediate_size": 14336,
    "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
    "max_position_embeddings": 131072, "rms_norm_eps": 1e-5, "rope_theta": 500000.0,
    "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                     "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
    "hidden_act": "silu", "tie_word_embeddings": False,
}
LLAMA_CONTEXT = 131072  # cache slots: 128k, the model's longest context
LLAMA_MODEL_PARALLELISM = 8  # the `model` axis: one kv head per device (mesh data 2 x model 8)

BACKENDS = ("dense", "ffd", "qvg")


@dataclasses.dataclass(frozen=True)
class DecodeCaches:
    """The caches the decode rows run (hashable).

    Attributes:
      page_size: FFD's tokens per page.
      delta: FFD's top-delta margin, nats.
      quantizers: QVG's quantizer settings (its ``"qvg"`` quantizer of
        :func:`kernels.kv_quant.reference.quantizer_configs`, block clamped to the head dim).
    """

    page_size: int
    delta: float
    quantizers: QuantizerSettings


def decode_step(graphdef, backend):
    """``(params, cache, tokens int32 [B, T], start int32 [B]) -> (logits, cache)``: the model's
    ``decode`` over a cache of ``backend``, as ``models.sampling.generate`` calls it per token."""

    def step(params, cache, tokens, start):
        return nnx.merge(graphdef, params).decode(tokens, cache, start, backend)

    return step


def flush_step(graphdef, backend):
    """``(params, cache, tokens, start) -> cache``: the model's ``flush_cache`` (QVG quantizes a
    complete window chunk here, outside the one-token decode step), as ``models.sampling.generate``
    calls it after each decode step; ``tokens`` and ``start`` are unused (the decode step's
    signature, so that both compile from the same arguments)."""

    def step(params, cache, tokens, start):
        del tokens, start
        return nnx.merge(graphdef, params).flush_cache(cache, backend)

    return step


def cache_backend(name: str, caches: DecodeCaches, head_dim: int, rope_base: Any, *,
                  mesh: jax.sharding.Mesh | None = None, kernel: str = "xla",
                  kept_fraction: float | None = None, ffd_note: str = "",
                  qvg_pre_rope: bool = True) -> tuple[Any, str]:
    """The cache backend ``name`` (``"dense"``, ``"ffd"``, ``"qvg"``) of a decode row and the
    phrase describing it.

    Without ``mesh``, FFD and QVG take their XLA paths (``implementation="xla"`` /
    ``"reference"``). With ``mesh``, their sharded backends (``"ffd_sharded"``,
    ``"qvg_sharded"``) run ``kernel`` (``"pallas_tpu"``, ``"pallas_gpu"`` or ``"xla"``; QVG's
    ``"xla"`` is its reference path) inside ``shard_map``, and FFD's kernels declare
    ``kept_fraction`` of the pages attended (``pl.CostEstimate``). ``ffd_note`` is appended to
    FFD's phrase. ``rope_base``: the model's RoPE, as the QVG backend takes it.
    ``qvg_pre_rope``: QVG stores keys before RoPE (the paper's format, rotated in the kernel) or,
    when False, after it (``QVGConfig.pre_rope``).

    Raises:
      ValueError: an unknown ``name``.
    """
    where = "XLA path" if mesh is None else f"{kernel} in shard_map"
    if name == "dense":
        return kvc.get_backend("dense"), "dense"
    if name == "ffd":
        if mesh is None:
            backend = kvc.get_backend("ffd", page_size=caches.page_size, delta=caches.delta,
                                      implementation="xla", scan_copy=False)
        else:
            backend = kvc.get_backend("ffd_sharded", page_size=caches.page_size,
                                      delta=caches.delta, implementation=kernel, scan_copy=False,
                                      mesh=mesh, assumed_kept_fraction=kept_fraction)
        return backend, f"FFD (page {caches.page_size}, delta {caches.delta} nats, {where}{ffd_note})"
    if name == "qvg":
        qcfg = quantizer_configs(caches.quantizers, head_dim)[
            "qvg" if qvg_pre_rope else "qvg_post_rope"]
        if mesh is None:
            backend = kvc.get_backend("qvg", config=qcfg, rope_base=rope_base,
                                      implementation="reference")
        else:
            backend = kvc.get_backend("qvg_sharded", config=qcfg, rope_base=rope_base, mesh=mesh,
                                      implementation="reference" if kernel == "xla" else kernel)
        return backend, (f"QVG ({qcfg.bits}-bit, block {qcfg.block}, {qcfg.num_centroids} "
                         f"centroids, chunk {qcfg.chunk}, "
                         f"{'' if qvg_pre_rope else 'keys stored after RoPE, '}{where})")
    raise ValueError(f"cache_backend: backend {name!r} is not one of {', '.join(BACKENDS)}")


def lm_decode_spec(backend_name: str, devices, *, model_config: TransformerConfig,
                   caches: DecodeCaches, model_parallelism: int, param_rules,
                   context: int = DECODE_CONTEXT, batch: int = DECODE_BATCH
                   ) -> aot_steps.StepSpec:
    """One-token decode of the ``lm`` model (``model_config``, its ``max_len`` set to
    ``context``) over a ``context``-slot KV cache of ``backend_name`` (:func:`cache_backend`,
    unsharded: XLA paths; a Pallas kernel is partitioned only inside ``shard_map``, and the
    kernels' own compiles are the single-device compile tests), on ``devices``. The mesh has
    ``model_parallelism`` on ``model``; parameters are placed by ``param_rules`` (a
    ``core.sharding`` rules table); caches and rows are split over ``data`` when it divides
    ``batch`` (else replicated).

    Raises:
      ValueError: an unknown ``backend_name``.
    """
    mcfg = dataclasses.replace(model_config, max_len=context)
    d = mcfg.dim_per_head
    backend, what = cache_backend(backend_name, caches, d, mcfg.rope_base)
    model = nnx.eval_shape(lambda: Transformer(mcfg, rngs=nnx.Rngs(0)))
    graphdef, params = nnx.split(model)
    cache = jax.eval_shape(lambda: model.init_cache(batch, context, backend))
    mesh = sharding.make_mesh(model_parallelism, devices=devices)
    p_sh = sharding.param_shardings(params, PARAM_AXES, mesh, param_rules,
                                    logical_sizes=mcfg.logical_sizes)
    n_data = mesh.shape[sharding.DATA]

    def rows(x):  # batch-leading leaves on `data` when it divides the batch
        ok = len(x.shape) > 0 and x.shape[0] == batch and batch % n_data == 0
        return sharding.batch_sharding(mesh, len(x.shape)) if ok else sharding.replicated(mesh)

    rest = (cache, jax.ShapeDtypeStruct((batch, 1), jnp.int32),
            jax.ShapeDtypeStruct((batch,), jnp.int32))
    args = steps.place((params, *rest), (p_sh, *jax.tree.map(rows, rest)), True)
    n = param_count(params)
    return aot_steps.StepSpec(
        decode_step(graphdef, backend), args, (1,), forward_flops_per_token(mcfg, context) * batch,
        n, f"{what} cache, B {batch} x 1 new token over {context} slots, lm paper model "
        f"({n / 1e6:.0f}M params, {mcfg.kv_heads} kv heads x D {d})")


def llama_mesh(devices) -> jax.sharding.Mesh:
    """The Llama rows' mesh on ``devices``: ``model`` the gcd of
    :data:`LLAMA_MODEL_PARALLELISM` and the device count, the rest on ``data``."""
    return sharding.make_mesh(math.gcd(LLAMA_MODEL_PARALLELISM, len(devices)), devices=devices)


def ffd_analytic(batch: int, context: int, kept_fraction: float, mesh) -> str:
    """The FFD kernels' analytic bytes per chip and decode step of the :data:`LLAMA3_8B` shape
    (:mod:`kernels.sparse_decode.cost`, both TPU kernels, every layer, pages of
    ``kernels.sparse_decode.reference.PAGE_SIZE``, ``kept_fraction`` of them attended) beside
    dense bf16 attention's cache reads, as a phrase."""
    cfg = LLAMA3_8B
    rows = batch // mesh.shape[sharding.DATA] if batch % mesh.shape[sharding.DATA] == 0 else batch
    kv = cfg["num_key_value_heads"] // mesh.shape[sharding.MODEL]
    d = cfg["hidden_size"] // cfg["num_attention_heads"]
    g = cfg["num_attention_heads"] // cfg["num_key_value_heads"]
    p = ref.PAGE_SIZE
    n = context // p
    cache = jax.eval_shape(lambda: ref.init_ffd_cache(rows, context, kv, d, jnp.bfloat16, p))
    qg = jax.ShapeDtypeStruct((rows, kv, g, d), jnp.float32)
    pb = sd_tpu.scan_block(n)
    scan = sd_cost.ffd_tpu_scan_cost(qg, cache["codes"], cache["scale"], num_slots=n,
                                     pages_per_step=pb, sub=sd_tpu.sub_block(pb))
    attend = sd_cost.ffd_tpu_attend_cost(qg, cache["codes"], cache["scale"], cache["resid"],
                                         cache["v"], cache["tail"],
                                         jax.ShapeDtypeStruct((rows, kv, n), jnp.int32),
                                         kept_fraction=kept_fraction)
    layers = cfg["num_hidden_layers"]
    ffd = layers * (scan.bytes_accessed + attend.bytes_accessed)
    dense = layers * rows * kv * 2 * context * d * 2
    return (f"analytic kernel bytes per chip {ffd / 1e9:.2f} GB = {ffd / dense:.3f}x dense bf16 "
            f"attention's {dense / 1e9:.2f} GB")


def llama_decode_spec(backend_name: str, batch: int, devices, caches: DecodeCaches, *,
                      kept_fraction: float, context: int = LLAMA_CONTEXT, flush: bool = False,
                      kept_note: str = "", qvg_pre_rope: bool = True) -> aot_steps.StepSpec:
    """One-token decode of a Llama-3-8B-shaped model (bfloat16, :data:`LLAMA3_8B`) over a
    ``context``-slot cache of ``backend_name`` (:func:`cache_backend`, sharded), on ``devices``.
    Parameters are placed by ``core.sharding``'s FSDP + tensor-parallel rules on
    :func:`llama_mesh` (data 2 x model 8 on 16 chips); every cache leaf [B, K, ...] has its rows on
    ``data`` (when it divides B) and its 8 kv heads on ``model``. FFD and QVG run their Pallas
    kernel (TPU or GPU, by the devices' platform; the XLA / jnp path on CPU) inside ``shard_map``
    (``kernels.*.sharded``): a ``pallas_call`` is not partitioned by XLA itself.
    ``kept_fraction`` is the fraction of pages FFD's kernels declare (``pl.CostEstimate``) that
    they attend: it changes the cost XLA reports, not the program. With ``flush`` the step is the
    cache's flush (:func:`flush_step`: for QVG the k-means and chunk write of every full window,
    once per chunk of N tokens) instead of the decode step. ``kept_note`` (FFD) says where
    ``kept_fraction`` comes from, in the row's description. ``qvg_pre_rope``: QVG's key format
    (:func:`cache_backend`).

    Raises:
      ValueError: an unknown ``backend_name``.
    """
    cfg = config_from_hf(LLAMA3_8B, where="Llama-3-8B config", dtype=jnp.bfloat16,
                         max_len=context)
    mesh = llama_mesh(devices)
    kernel = {"tpu": "pallas_tpu", "gpu": "pallas_gpu", "cuda": "pallas_gpu"}.get(
        devices[0].platform, "xla")
    f = kept_fraction
    note = ""
    if backend_name == "ffd":
        note = (f"; kernel costs at kept fraction {f}{kept_note}, "
                f"{ffd_analytic(batch, context, f, mesh)}")
    backend, what = cache_backend(backend_name, caches, cfg.dim_per_head, cfg.rope, mesh=mesh,
                                  kernel=kernel, kept_fraction=f, ffd_note=note,
                                  qvg_pre_rope=qvg_pre_rope)
    if backend_name == "dense":
        what = "dense bf16"
    model = nnx.eval_shape(lambda: Llama(cfg, rngs=nnx.Rngs(0)))
    graphdef, params = nnx.split(model)
    cache = jax.eval_shape(lambda: model.init_cache(batch, context, backend))
    p_sh = sharding.param_shardings(params, PARAM_AXES, mesh, sharding.PARAM_RULES,
                                    logical_sizes={"heads": cfg.num_heads,
                                                   "kv_heads": cfg.kv_heads})
    rows = sharding.DATA if batch % mesh.shape[sharding.DATA] == 0 else None
    heads = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(rows, sharding.MODEL))
    per_row = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(rows))
    # rows on data and kv heads on model for [B, K, ...] leaves; per-row leaves [B] (a backend's
    # requested capacity) on data alone
    cache_sh = jax.tree.map(lambda x: heads if x.ndim >= 2 else per_row, cache)
    args = (steps.place(params, p_sh, True), steps.place(cache, cache_sh, True),
            jax.ShapeDtypeStruct((batch, 1), jnp.int32, sharding=per_row),
            jax.ShapeDtypeStruct((batch,), jnp.int32, sharding=per_row))
    n = param_count(params)
    flops = 2.0 * n + 4.0 * cfg.num_layers * cfg.num_heads * cfg.dim_per_head * context
    dynamic_trips = None
    if backend_name == "ffd" and kernel == "pallas_tpu":
        # the attention kernel's rounds over the kept pages (a runtime count): as many as its
        # cost estimate assumes, ceil(kept / pages per round)
        pages = context // caches.page_size
        per_round = inspect.signature(sd_tpu.ffd_pages_attention).parameters[
            "pages_per_round"].default
        dynamic_trips = {"ffd_pages_attention": math.ceil(
            sd_cost.kept_pages(pages, pages, f) / per_round)}
    if flush:
        return aot_steps.StepSpec(
            flush_step(graphdef, backend), args, (1,), None, n,
            f"{what} cache flush (every window holding a full chunk quantized), B {batch} over "
            f"{context} slots, Llama-3-8B shape ({cfg.kv_heads} kv heads x D {cfg.dim_per_head}), "
            f"mesh data {mesh.shape[sharding.DATA]} x model {mesh.shape[sharding.MODEL]}")
    return aot_steps.StepSpec(
        decode_step(graphdef, backend), args, (1,), flops * batch, n,
        f"{what} cache, B {batch} x 1 new token over {context} slots, Llama-3-8B shape "
        f"({n / 1e9:.2f}B params, bf16, {cfg.kv_heads} kv heads x D {cfg.dim_per_head}), mesh "
        f"data {mesh.shape[sharding.DATA]} x model {mesh.shape[sharding.MODEL]}",
        dynamic_trips=dynamic_trips)


def measured_kept_note(devices, batch: int, measured: tuple[float, float, float],
                       source: str) -> str:
    """Where a measured kept fraction comes from (``source``: the model, contexts and run it was
    measured in) and the analytic bytes (:func:`ffd_analytic` at :data:`LLAMA_CONTEXT`) at the
    ends of its interval ``measured = (value, low, high)``, as a phrase for an AOT row's
    description."""
    _, lo, hi = measured
    mesh = llama_mesh(devices)
    return (f" ({source}, power law "
            f"extrapolated to 128k: an extrapolation; 90% interval {lo:.3f}-{hi:.3f}: "
            f"{ffd_analytic(batch, LLAMA_CONTEXT, lo, mesh)} to "
            f"{ffd_analytic(batch, LLAMA_CONTEXT, hi, mesh).split('analytic kernel bytes per chip ')[1]})")
