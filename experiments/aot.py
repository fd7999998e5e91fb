"""Ahead-of-time compile of every experiment's ``paper`` step for TPU and GPU pods -> ``AOT.md``.

For each registered step (:data:`STEPS`) and pod topology (``core.aot_steps.POD_TOPOLOGIES``) the
step is built from the experiment's ``paper`` config with abstract values only (``nnx.eval_shape``
for the model, ``jax.eval_shape`` for the optimizer state: nothing is allocated), placed with the
project's mesh and parameter sharding rules (``core.sharding``) on the topology's compile-only
devices, and compiled by XLA for that chip. ``AOT.md`` gets a steps x topologies table (fits or by
how much it does not, per device), the per-device bytes XLA assigned, a roofline step time and MFU
on TPU, and the compile time. A step that fails to compile is a row with XLA's one-line reason.

    make aot                                                  # .venv-aot, every step x topology
    JAX_PLATFORMS=cpu .venv-aot/bin/python -m experiments.aot --steps=lm/train \\
        --topologies=v5e:4x4,h100:1x2x8 --out=AOT.md

    JAX_PLATFORMS=cpu .venv-aot/bin/python -m experiments.aot --only='llama3_8b/*@v5e:4x4'

Results are kept in ``<out>.json`` beside the table and merged across runs (``--fresh`` drops
them), so that steps can be compiled a few at a time; the table lists what has not run yet.
``--only`` recompiles exactly the rows its shell patterns name (``<step>@<topology>``) and merges
them in; every write of the table and its store is atomic. A program XLA refuses with a known
symptom of compiling without a device is compiled again with the target's fallback options
(``core.aot.FALLBACKS``), and a builder may state a change it made for a target (the judge_btl fit
in float32 on TPU); AOT.md lists both with the reason.
Needs ``jax[tpu]`` and the CUDA plugin (``make aot-env``); JAX must start with ``JAX_PLATFORMS=cpu``;
without them the run stops with one line before writing anything.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import sys
import tempfile
from collections.abc import Callable, Sequence
from typing import Any

from core import aot, aot_steps, timing

DEFAULT_TOPOLOGIES = ("v5e:4x4", "v6e:4x4", "h100:1x2x8", "h200:1x2x8")


@dataclasses.dataclass(frozen=True)
class StepSpec:
    """A step ready to compile.

    Attributes:
      fn: the step function (not jitted).
      args: pytrees of ``ShapeDtypeStruct`` with ``NamedSharding``s on the pod's mesh.
      donate_argnums: donated arguments (the train state).
      model_flops: useful FLOPs of one call over the whole pod (``3 F_fwd tokens`` for training);
        None where there is no analytic count (then no MFU).
      params: parameter count.
      shape: one line describing the sizes (batch, sequence, model).
      x64: the step computes in float64 (it is compiled under ``jax.enable_x64``).
      fallback: (what differs from the experiment's own step, why) when the builder had to
        change the step for this target; None otherwise. Shown in ``AOT.md``.
    """

    fn: Callable
    args: tuple
    donate_argnums: tuple[int, ...]
    model_flops: float | None
    params: int
    shape: str
    x64: bool = False  # built and compiled under jax.enable_x64 (float64 programs)
    fallback: tuple[str, str] | None = None  # (what differs from the paper step, why) on this target
    # the layers run in one loop (scan_layers): XLA's cost analysis counts one block, so no roofline
    layer_loop: bool = False


# ----------------------------------------------------------------------------------------------
# Step builders: devices -> StepSpec


def _train_spec(devices, config, mcfg, make_step, init_state, tx, batch, tokens, flops_per_token,
                shape) -> StepSpec:
    """A train step of a ``Transformer`` on ``devices`` with the config's sharding rules."""
    import jax
    from flax import nnx

    from core import sharding
    from models.transformer import PARAM_AXES, Transformer, param_count

    abstract = aot_steps.abstract
    mcfg.check_model_parallelism(config.model_parallelism)
    graphdef, params = nnx.split(nnx.eval_shape(lambda: Transformer(mcfg, rngs=nnx.Rngs(0))))
    state = jax.eval_shape(lambda p: init_state(p, tx), params)
    mesh = sharding.make_mesh(config.model_parallelism, devices=devices)
    p_sh = sharding.param_shardings(params, PARAM_AXES, mesh,
                                    sharding.rules_named(config.param_sharding),
                                    logical_sizes=mcfg.logical_sizes)
    st_sh = sharding.train_state_shardings(state, p_sh, tx, mesh)
    step = sharding.constrain_step(make_step(graphdef), st_sh)
    a_batch = jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=(
            sharding.batch_sharding(mesh, len(x.shape)) if len(x.shape) else
            sharding.replicated(mesh))), batch)
    a_key = abstract(jax.eval_shape(lambda: jax.random.key(0)), sharding.replicated(mesh))
    n = param_count(params)
    return StepSpec(step, (abstract(state, st_sh), a_batch, a_key), (0,),
                    3.0 * flops_per_token * tokens, n, f"{shape}, {n / 1e6:.0f}M params",
                    layer_loop=mcfg.scan_layers)


def lm_train(**overrides) -> Callable:
    """``experiments.lm`` paper train step (AdamW, next-token loss), with config ``overrides``
    (dotted field -> value; e.g. a larger model for the scale rows)."""

    def build(devices) -> StepSpec:
        import jax
        import jax.numpy as jnp

        from algorithms.lm import training as lm
        from core.data import ByteTokenizer
        from core.training import init_train_state, make_train_step
        from experiments.configs import lm as lm_config
        from models.transformer import forward_flops_per_token

        config = lm_config.get_config("paper")
        config.update_from_flattened_dict(overrides)
        mcfg = lm.model_config(config, ByteTokenizer().vocab_size)
        tx = lm.optimizer(config)
        b, L = config.batch_size, config.seq_len
        return _train_spec(
            devices, config, mcfg, lambda g: make_train_step(g, tx, lm.lm_loss), init_train_state,
            tx, jax.ShapeDtypeStruct((b, L), jnp.int32), b * L, forward_flops_per_token(mcfg, L),
            f"B {b} x L {L}, d {mcfg.d_model} x {mcfg.num_layers} "
            f"{'scanned ' if mcfg.scan_layers else ''}layers, {mcfg.dtype.name}, "
            f"{mcfg.attention} attention, remat {mcfg.remat}")

    return build


# Larger `lm` models for the scale rows (memory): the paper batch (B 256 x L 1024) and one
# sequence per chip of a 16-chip slice, the blocks fully rematerialised and scanned, as one would
# run them (unrolled, the 1.1B step needs 18.9 GiB of temporaries on v5e against 6.1 GiB scanned).
# XLA's cost analysis counts a scanned block once, so those rows have no roofline; the 4-block row
# at the 1.1B model's width, unrolled, gives the roofline at that width.
LM_SCALE = {
    "lm/train@1.1B": {"model.d_model": 2048, "model.num_layers": 24, "model.num_heads": 16,
                      "model.num_kv_heads": 4, "model.remat": "full", "model.scan_layers": True},
    # the 1.1B model's width and batch over 4 unrolled blocks: its roofline (MFU by width)
    "lm/train@d2048x4": {"model.d_model": 2048, "model.num_layers": 4, "model.num_heads": 16,
                         "model.num_kv_heads": 4, "model.remat": "full"},
    "lm/train@5.6B-b16": {"model.d_model": 4096, "model.num_layers": 32, "model.num_heads": 32,
                          "model.num_kv_heads": 8, "model.remat": "full",
                          "model.scan_layers": True, "batch_size": 16},
}


def diffusion_train(family: str, size_index: int | None = None, **overrides) -> Callable:
    """The ``experiments.diffusion_lm`` paper train step of ``family`` at ``sizes[size_index]``
    (default: the reference size), with config ``overrides`` (dotted field -> value)."""

    def build(devices) -> StepSpec:
        import jax
        import jax.numpy as jnp

        from algorithms.diffusion_lm import grid
        from algorithms.diffusion_lm.families import transformer_config
        from algorithms.diffusion_lm.training import init_state, make_step
        from core.data import ByteTokenizer
        from experiments.configs import diffusion_lm as dl_config
        from models.transformer import forward_flops_per_token

        config = dl_config.get_config("paper")
        config.update_from_flattened_dict(overrides)
        idx = config.reference_size if size_index is None else size_index
        d, layers, heads = config.sizes[idx]
        spec = grid.family_spec(config, family, ByteTokenizer())
        backbone = config.backbone.to_dict()
        backbone["dtype"] = jnp.dtype(backbone["dtype"])
        mcfg = transformer_config(spec, config.seq_len, d_model=d, num_layers=layers,
                                  num_heads=heads, **backbone)
        tx = grid.optimizer(config.optim)
        b, L = config.batch_size, config.seq_len
        # per data token, as the grid counts a run's compute (FamilySpec.train_passes)
        fpt = sum(n * forward_flops_per_token(mcfg, n * L) for n in spec.train_passes)
        batch = {"x": jax.ShapeDtypeStruct((b, L), jnp.int32),
                 "train": jax.ShapeDtypeStruct((), jnp.float32),
                 "ce": jax.ShapeDtypeStruct((), jnp.float32)}
        return _train_spec(
            devices, config, mcfg, lambda g: make_step(g, tx, spec, config.ema_decay),
            lambda p, t: init_state(p, t, config.ema_decay), tx, batch, b * L, fpt,
            f"{family}, B {b} x L {L}, d {d} x {layers} layers, {mcfg.dtype.name}, "
            f"{mcfg.attention} attention, remat {mcfg.remat}, EMA")

    return build


DECODE_CONTEXT = 65536  # cache slots: a sparse_decode paper context
DECODE_BATCH = 16  # sequences per decode step: one per data shard on a 16-chip pod


def lm_decode(backend_name: str, context: int = DECODE_CONTEXT, batch: int = DECODE_BATCH
              ) -> Callable:
    """One-token decode of the ``lm`` paper model over a ``context``-slot KV cache of backend
    ``backend_name`` (``"dense"``, ``"ffd"``: sparse_decode's FFD at its paper page size and delta,
    ``"qvg"``: kv_quant's paper QVG preset). Caches and rows are split over ``data`` when it
    divides ``batch`` (else replicated); parameters by the lm config's rules. The FFD and QVG
    caches use their XLA paths: a Pallas kernel is partitioned only inside ``shard_map``, and the
    kernels' own compiles are the single-device compile tests."""

    def build(devices) -> StepSpec:
        import dataclasses as dc

        import jax
        import jax.numpy as jnp
        from flax import nnx

        from algorithms.lm import training as lm
        from core import sharding
        from core.data import ByteTokenizer
        from experiments.configs import lm as lm_config
        from models import kv_cache as kvc
        from models.transformer import PARAM_AXES, Transformer, forward_flops_per_token, param_count

        config = lm_config.get_config("paper")
        mcfg = dc.replace(lm.model_config(config, ByteTokenizer().vocab_size), max_len=context)
        d = mcfg.dim_per_head
        if backend_name == "dense":
            backend, what = kvc.get_backend("dense"), "dense"
        elif backend_name == "ffd":
            from experiments.configs import sparse_decode as sd_config

            sd = sd_config.get_config("paper")
            backend = kvc.get_backend("ffd", page_size=sd.page_size, delta=sd.delta,
                                      implementation="xla", scan_copy=False)
            what = f"FFD (page {sd.page_size}, delta {sd.delta} nats, XLA path)"
        elif backend_name == "qvg":
            qcfg = qvg_paper_config(d)
            backend = kvc.get_backend("qvg", config=qcfg, rope_base=mcfg.rope_base,
                                      implementation="reference")
            what = (f"QVG ({qcfg.bits}-bit, block {qcfg.block}, {qcfg.num_centroids} centroids, "
                    f"chunk {qcfg.chunk}, XLA path)")
        else:
            raise ValueError(f"lm_decode: backend {backend_name!r} is not dense, ffd or qvg")
        model = nnx.eval_shape(lambda: Transformer(mcfg, rngs=nnx.Rngs(0)))
        graphdef, params = nnx.split(model)
        cache = jax.eval_shape(lambda: model.init_cache(batch, context, backend))
        mesh = sharding.make_mesh(config.model_parallelism, devices=devices)
        p_sh = sharding.param_shardings(params, PARAM_AXES, mesh,
                                        sharding.rules_named(config.param_sharding),
                                        logical_sizes=mcfg.logical_sizes)
        n_data = mesh.shape[sharding.DATA]

        def rows(x):  # batch-leading leaves on `data` when it divides the batch
            ok = len(x.shape) > 0 and x.shape[0] == batch and batch % n_data == 0
            return sharding.batch_sharding(mesh, len(x.shape)) if ok else sharding.replicated(mesh)

        def step(params, cache, tokens, start):
            return nnx.merge(graphdef, params).decode(tokens, cache, start, backend)

        args = (aot_steps.abstract(params, p_sh),
                jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=rows(x)),
                             cache),
                jax.ShapeDtypeStruct((batch, 1), jnp.int32, sharding=rows(jnp.zeros((batch, 1)))),
                jax.ShapeDtypeStruct((batch,), jnp.int32, sharding=rows(jnp.zeros((batch,)))))
        n = param_count(params)
        return StepSpec(step, args, (1,), forward_flops_per_token(mcfg, context) * batch, n,
                        f"{what} cache, B {batch} x 1 new token over {context} slots, lm paper "
                        f"model ({n / 1e6:.0f}M params, {mcfg.kv_heads} kv heads x D {d})")

    return build


def qvg_paper_config(head_dim: int):
    """The kv_quant ``paper`` variant's QVG config for keys of ``head_dim`` (block clamped to it)."""
    from experiments.configs import kv_quant as kq_config
    from kernels.kv_quant import reference as kq_ref

    c = kq_config.get_config("paper")
    return kq_ref.qvg_preset("qvg", bits=c.bits, block=min(c.qvg_block, head_dim),
                             num_centroids=c.num_centroids, chunk=c.chunk,
                             kmeans_iters=c.kmeans_iters, seed=c.seed)


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


# the fraction of the pages FFD's top-delta rule (delta 6 nats, pages of 128) keeps on
# kernels.sparse_decode.workload.concentrated_workload at 131072 tokens: 63 of 1024 pages per kv
# head (the same for two seeds)
FFD_KEPT_FRACTION = 0.0615


def ffd_analytic(batch: int, context: int, kept_fraction: float, mesh) -> str:
    """The FFD kernels' analytic bytes per chip and decode step (:mod:`kernels.sparse_decode.cost`,
    both TPU kernels, every layer) beside dense bf16 attention's cache reads, as a phrase."""
    import jax
    import jax.numpy as jnp

    from core import sharding
    from kernels.sparse_decode import cost as sd_cost
    from kernels.sparse_decode import pallas_tpu as sd_tpu
    from kernels.sparse_decode import reference as sd_ref

    cfg = LLAMA3_8B
    rows = batch // mesh.shape[sharding.DATA] if batch % mesh.shape[sharding.DATA] == 0 else batch
    kv = cfg["num_key_value_heads"] // mesh.shape[sharding.MODEL]
    d = cfg["hidden_size"] // cfg["num_attention_heads"]
    g = cfg["num_attention_heads"] // cfg["num_key_value_heads"]
    p = sd_ref.PAGE_SIZE
    n = context // p
    cache = jax.eval_shape(lambda: sd_ref.init_ffd_cache(rows, context, kv, d, jnp.bfloat16, p))
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


def llama_decode(backend_name: str, batch: int, context: int = LLAMA_CONTEXT) -> Callable:
    """One-token decode of a Llama-3-8B-shaped model (bfloat16, :data:`LLAMA3_8B`) over a
    ``context``-slot cache of ``backend_name``: ``"dense"``, ``"ffd"`` (sparse_decode's paper page
    size and delta) or ``"qvg"`` (kv_quant's paper QVG at head dim 128). Parameters are placed by
    ``core.sharding``'s FSDP + tensor-parallel rules on a (data, model 8) mesh (data 2 on 16
    chips; ``model`` the gcd of 8 and the device count); every cache leaf [B, K, ...] has its rows
    on ``data`` (when it divides B) and its 8 kv heads on ``model``. FFD and QVG run their Pallas
    kernel (TPU or GPU, by the topology; the XLA / jnp path on CPU) inside ``shard_map``
    (``kernels.*.sharded``): a ``pallas_call`` is not partitioned by XLA itself."""

    def build(devices) -> StepSpec:
        import jax
        import jax.numpy as jnp
        from flax import nnx

        from core import sharding
        from models import kv_cache as kvc
        from models.hf_checkpoint import config_from_hf
        from models.llama import Llama
        from models.transformer import PARAM_AXES

        cfg = config_from_hf(LLAMA3_8B, where="Llama-3-8B config", dtype=jnp.bfloat16,
                             max_len=context)
        import math

        mesh = sharding.make_mesh(math.gcd(LLAMA_MODEL_PARALLELISM, len(devices)), devices=devices)
        kernel = {"tpu": "pallas_tpu", "gpu": "pallas_gpu", "cuda": "pallas_gpu"}.get(
            devices[0].platform, "xla")
        if backend_name == "dense":
            backend, what = kvc.get_backend("dense"), "dense bf16"
        elif backend_name == "ffd":
            from experiments.configs import sparse_decode as sd_config

            sd = sd_config.get_config("paper")
            f = FFD_KEPT_FRACTION
            backend = kvc.get_backend("ffd_sharded", page_size=sd.page_size, delta=sd.delta,
                                      implementation=kernel, scan_copy=False, mesh=mesh,
                                      assumed_kept_fraction=f)
            what = (f"FFD (page {sd.page_size}, delta {sd.delta} nats, {kernel} in shard_map; "
                    f"kernel costs at kept fraction {f}, {ffd_analytic(batch, context, f, mesh)})")
        elif backend_name == "qvg":
            qcfg = qvg_paper_config(cfg.dim_per_head)
            backend = kvc.get_backend("qvg_sharded", config=qcfg, rope_base=cfg.rope, mesh=mesh,
                                      implementation="reference" if kernel == "xla" else kernel)
            what = (f"QVG ({qcfg.bits}-bit, block {qcfg.block}, {qcfg.num_centroids} centroids, "
                    f"chunk {qcfg.chunk}, {kernel} in shard_map)")
        else:
            raise ValueError(f"llama_decode: backend {backend_name!r} is not dense, ffd or qvg")
        model = nnx.eval_shape(lambda: Llama(cfg, rngs=nnx.Rngs(0)))
        graphdef, params = nnx.split(model)
        cache = jax.eval_shape(lambda: model.init_cache(batch, context, backend))
        p_sh = sharding.param_shardings(params, PARAM_AXES, mesh, sharding.PARAM_RULES,
                                        logical_sizes={"heads": cfg.num_heads,
                                                       "kv_heads": cfg.kv_heads})
        rows = sharding.DATA if batch % mesh.shape[sharding.DATA] == 0 else None
        heads = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(rows, sharding.MODEL))
        per_row = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(rows))

        def step(params, cache, tokens, start):
            return nnx.merge(graphdef, params).decode(tokens, cache, start, backend)

        # rows on data and kv heads on model for [B, K, ...] leaves; per-row leaves [B] (a
        # backend's requested capacity) on data alone
        cache_sh = jax.tree.map(lambda x: heads if x.ndim >= 2 else per_row, cache)
        args = (aot_steps.abstract(params, p_sh), aot_steps.abstract(cache, cache_sh),
                jax.ShapeDtypeStruct((batch, 1), jnp.int32, sharding=per_row),
                jax.ShapeDtypeStruct((batch,), jnp.int32, sharding=per_row))
        n = sum(int(x.size) for x in jax.tree.leaves(params))
        flops = 2.0 * n + 4.0 * cfg.num_layers * cfg.num_heads * cfg.dim_per_head * context
        return StepSpec(step, args, (1,), flops * batch, n,
                        f"{what} cache, B {batch} x 1 new token over {context} slots, Llama-3-8B "
                        f"shape ({n / 1e9:.2f}B params, bf16, {cfg.kv_heads} kv heads x D "
                        f"{cfg.dim_per_head}), mesh data {mesh.shape[sharding.DATA]} x model "
                        f"{mesh.shape[sharding.MODEL]}")

    return build


FORECAST_CHANNELS = 7  # ETTh1's channels (the paper's first data set)


def forecasting_train(devices) -> StepSpec:
    """``experiments.forecasting`` paper train step: PPM with the hybrid KDE-NLL + MSE loss at the
    longest paper horizon, Adam; parameters replicated and windows split over ``data`` (as the
    experiment does), replicated when ``data`` does not divide the batch. No analytic FLOP count:
    the roofline uses XLA's and reports no MFU."""
    import jax
    import jax.numpy as jnp
    import optax
    from flax import nnx

    from algorithms.forecasting import training as ftrain
    from core import sharding
    from core.training import init_train_state, make_train_step
    from experiments.configs import forecasting as f_config
    from models.forecasting import PPM, PPMConfig
    from models.transformer import param_count

    config = f_config.get_config("paper")
    h, L, b, n = max(config.horizons), config.input_len, config.batch_size, FORECAST_CHANNELS
    cfg = PPMConfig(input_len=L, horizon=h, d_model=config.d_model, d_ff=config.d_ff)
    graphdef, params = nnx.split(nnx.eval_shape(lambda: PPM(cfg, rngs=nnx.Rngs(0))))
    tx = optax.adam(config.learning_rate)
    state = jax.eval_shape(lambda p: init_train_state(p, tx), params)
    loss = ftrain.ppm_loss_fn(config.tau, config.bandwidth, config.train_samples)
    mesh = sharding.make_mesh(1, devices=devices)
    rep = sharding.replicated(mesh)
    split = (sharding.batch_sharding(mesh, 3) if b % mesh.shape[sharding.DATA] == 0 else rep)
    batch = (jax.ShapeDtypeStruct((b, L, n), jnp.float32, sharding=split),
             jax.ShapeDtypeStruct((b, h, n), jnp.float32, sharding=split))
    key = aot_steps.abstract(jax.eval_shape(lambda: jax.random.key(0)), rep)
    k = param_count(params)
    return StepSpec(make_train_step(graphdef, tx, loss), (aot_steps.abstract(state, rep), batch, key),
                    (0,), None, k, f"PPM, B {b} windows x L {L} -> H {h} x {n} channels, "
                    f"K {config.train_samples} prior draws, d {config.d_model}, {k / 1e6:.2f}M params")


def spf_train(devices) -> StepSpec:
    """``experiments.spf`` paper train step: the SPF coordinate network unrolled over
    ``train_episode_steps`` of ``train_episodes`` simulated drifting least-squares episodes (rotation
    drift, the paper's ``dim``), Adam with clipping; parameters replicated and episodes split over
    ``data`` when it divides them (as ``experiments.spf.data_parallel_mesh``), else replicated. The
    step size (tuned on data in the experiment) is the config default: it changes no shape. No
    analytic FLOP count (no MFU)."""
    import dataclasses as dc

    import jax
    import optax
    from flax import nnx

    from algorithms.spf import problems as P
    from algorithms.spf import spf as S
    from algorithms.spf.training import make_problem
    from core import sharding
    from core.training import init_train_state, make_train_step
    from experiments.configs import spf as spf_config

    config = spf_config.get_config("paper")
    problem = dc.replace(make_problem("lsq_rotation", config), steps=config.train_episode_steps)
    cfg = S.SPFConfig(hidden=config.hidden, depth=config.depth,
                      residual_weight=config.residual_weight, burn_in=config.burn_in)
    graphdef, params = nnx.split(nnx.eval_shape(lambda: S.CoordinateMLP(cfg, rngs=nnx.Rngs(0))))
    tx = optax.chain(optax.clip_by_global_norm(config.grad_clip), optax.adam(config.learning_rate))
    state = jax.eval_shape(lambda p: init_train_state(p, tx), params)
    e = config.train_episodes
    batch = jax.eval_shape(lambda k: tuple(P.sample_episodes(k, problem, e)[:3]),
                           jax.random.key(0))
    mesh = sharding.make_mesh(1, devices=devices)
    rep = sharding.replicated(mesh)
    split = e % mesh.shape[sharding.DATA] == 0
    a_batch = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=(
        sharding.batch_sharding(mesh, len(x.shape)) if split else rep)), batch)
    key = aot_steps.abstract(jax.eval_shape(lambda: jax.random.key(0)), rep)
    step = make_train_step(graphdef, tx, S.make_episode_loss_fn(problem.kind, cfg))
    k = sum(int(x.size) for x in jax.tree.leaves(params))
    return StepSpec(step, (aot_steps.abstract(state, rep), a_batch, key), (0,), None, k,
                    f"{e} episodes x {problem.steps} steps x batch {problem.batch}, d {problem.dim}, "
                    f"hidden {cfg.hidden} x depth {cfg.depth}, {k} params")


def judge_btl_fit(devices) -> StepSpec:
    """``algorithms.ranking.btl`` Newton fit (judge-aware BTL, float64 as ``fit`` defaults to) at
    the judge_btl timing scale: every (i < j, judge) cell of ``timing.num_models`` models and
    ``timing.num_judges`` judges a row. Replicated on the mesh (one small dense solve)."""
    import jax
    import jax.numpy as jnp

    from algorithms.ranking import btl
    from algorithms.ranking.data import ComparisonTable
    from core import sharding
    from experiments.configs import judge_btl as jb_config

    t = jb_config.get_config("paper").timing
    n, nj = t.num_models, t.num_judges
    rows = n * (n - 1) // 2 * nj
    rep = sharding.replicated(sharding.make_mesh(1, devices=devices))
    x64, fallback = judge_btl_precision(devices[0].platform)
    with jax.enable_x64(x64):
        ints = jax.ShapeDtypeStruct((rows,), jnp.int32, sharding=rep)
        counts = jax.ShapeDtypeStruct((rows,), jnp.float64 if x64 else jnp.float32, sharding=rep)
    table = ComparisonTable(ints, ints, ints, counts, counts, counts, n, nj)
    return StepSpec(lambda tb: btl.solve(tb, btl.FitConfig()), (table,), (), None, n + nj + 1,
                    f"{n} models x {nj} judges, {rows} rows, float{64 if x64 else 32} Newton",
                    x64=x64, fallback=fallback)


def judge_btl_precision(platform: str) -> tuple[bool, tuple[str, str] | None]:
    """(fit in float64, fallback) for the judge_btl fit on ``platform`` (a device's
    ``platform``): float64 as the experiment fits, except on TPU, where the fit is compiled in
    float32 with the stated reason (measured with libtpu 0.0.42: XLA:TPU refuses the float64
    Newton fit on a 16-chip mesh with "A tuple parameter that is being flattened shouldn't have
    frontend attributes"; TPUs have no float64 units and XLA:TPU emulates float64, without e.g. an
    LU decomposition for it; the float32 fit compiles on the mesh in seconds)."""
    if platform != "tpu":
        return True, None
    return False, ("float32 counts and Newton steps (the experiment fits in float64)",
                   "TPUs have no float64 units: XLA:TPU emulates float64 and refuses this float64 "
                   "fit on a pod mesh (\"A tuple parameter that is being flattened shouldn't have "
                   "frontend attributes\"); the float32 fit compiles. Run the float64 fit on a CPU or "
                   "GPU host: it is one small dense solve")


def benchmark_game_sweep(providers: int) -> Callable:
    """``algorithms.benchmark_game`` pure-equilibrium sweep over the Delta grid of the paper
    variant: ``providers`` = 3 (``levels`` effort levels, ``num_deltas`` deltas) or 5 (``levels5``,
    ``num_deltas5``), additive score family. One payoff tensor [N, M**N] per Delta; replicated."""

    def build(devices) -> StepSpec:
        import jax
        import numpy as np

        from algorithms import benchmark_game as bg
        from algorithms.benchmark_game import designer
        from core import sharding
        from experiments.configs import benchmark_game as bg_config

        c = bg_config.get_config("paper")
        if providers == 3:
            theta, rw, levels, deltas, top = c.theta, c.rewards, c.levels, c.num_deltas, c.max_delta
        else:
            theta, rw, levels, deltas, top = (c.theta5, c.rewards5, c.levels5, c.num_deltas5,
                                              c.max_delta5)
        theta = np.asarray(theta, np.float64)
        contest = bg.make_contest(theta, np.linspace(0.0, c.max_effort, levels),
                                  bg.named_rewards(rw, len(theta)),
                                  bg.PowerCost(c.cost_scale, c.cost_power))
        score = bg.AdditiveSaturating(c.amplitude, c.rate)
        rep = sharding.replicated(sharding.make_mesh(1, devices=devices))
        tree = (score, contest, np.linspace(0.0, top, deltas, dtype=np.float32))
        args = jax.tree.map(lambda x: jax.ShapeDtypeStruct(np.shape(x), jax.numpy.asarray(x).dtype,
                                                           sharding=rep), tree)
        return StepSpec(lambda sc, ct, d: designer._sweep_deltas(sc, ct, d, 16), args, (), None,
                        0, f"N {len(theta)} providers x {levels} effort levels, {deltas} deltas "
                        f"(payoff tensor {len(theta)} x {levels}^{len(theta)} per delta)")

    return build


def rl_scaling_train(devices) -> StepSpec:
    """``experiments.rl_scaling`` paper GRPO step at its largest rollouts-per-step group: the step
    vmapped over every (n, B_p, seed) lane that shares R = n B_p (padded to a multiple of the
    ``data`` axis, lanes split over it, as ``run_sweep`` does), each lane sampling R rollouts from
    the policy, scoring them and taking ``inner_steps`` clipped-surrogate updates. No analytic FLOP
    count (no MFU)."""
    import collections

    import jax
    import jax.numpy as jnp
    import optax
    from flax import nnx

    from algorithms.rl_scaling import allocation, grpo, tasks, trainer
    from core import sharding
    from experiments.configs import rl_scaling as rl_config
    from models.transformer import Transformer, param_count

    config = rl_config.get_config("paper")
    budgets = allocation.budget_grid(config.smallest_budget, config.num_budgets)
    easy = tasks.ArithmeticTask(config.easy.terms, config.easy.digits, "easy")
    hard = tasks.ArithmeticTask(config.hard.terms, config.hard.digits, "hard")
    prompt_len = 1 + max(easy.prompt_chars, hard.prompt_chars)
    answer_len = max(easy.answer_chars, hard.answer_chars)
    mcfg = trainer.policy_config(config.model, prompt_len, answer_len)
    gd, params = nnx.split(nnx.eval_shape(lambda: Transformer(mcfg, rngs=nnx.Rngs(0))))
    tx = optax.chain(optax.clip_by_global_norm(config.grad_clip), optax.adam(config.learning_rate))
    gcfg = grpo.GRPOConfig(advantage=config.advantage, aggregation=config.aggregation,
                           clip_eps=config.clip_eps, clip_eps_high=config.clip_eps_high,
                           kl_beta=config.kl_beta, kl_estimator=config.kl_estimator,
                           inner_steps=config.inner_steps)
    groups = collections.defaultdict(list)
    for n in config.ns:
        for bp in config.problems_per_batch:
            if allocation.feasible(budgets[-1], n, bp):
                groups[n * bp].append((n, bp))
    r = max(groups)
    mesh = sharding.make_mesh(1, devices=devices)
    lanes = len(groups[r]) * config.num_seeds
    lanes += -lanes % mesh.shape[sharding.DATA]
    spec = trainer.RLSpec(rollouts_per_step=r, max_new_tokens=answer_len, grpo=gcfg,
                          temperature=config.temperature,
                          max_problems=r // min(n for n, _ in groups[r]))  # as run_sweep
    step = jax.vmap(trainer.make_rl_step(gd, tx, spec), in_axes=(0, 0, 0, 0, None, None))
    stacked = jax.tree.map(lambda x: jax.ShapeDtypeStruct((lanes, *x.shape), x.dtype), params)
    opt = jax.eval_shape(jax.vmap(tx.init), stacked)
    split = lambda t: jax.tree.map(  # noqa: E731
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype,
                                       sharding=sharding.batch_sharding(mesh, len(x.shape))), t)
    rep = sharding.replicated(mesh)
    keys = jax.eval_shape(lambda: jax.random.split(jax.random.key(0), lanes))
    pool = {"prompts": jax.ShapeDtypeStruct((config.num_train, prompt_len), jnp.int32, sharding=rep),
            "targets": jax.ShapeDtypeStruct((config.num_train, answer_len), jnp.int32, sharding=rep),
            "lens": jax.ShapeDtypeStruct((config.num_train,), jnp.int32, sharding=rep)}
    args = (split(stacked), split(opt), split(keys),
            split(jax.ShapeDtypeStruct((lanes,), jnp.int32)), pool, None)
    k = param_count(params)
    return StepSpec(step, args, (0, 1), None, k,
                    f"{lanes} lanes x R {r} rollouts ({len(groups[r])} (n, B_p) x "
                    f"{config.num_seeds} seeds, padded), prompt {prompt_len} + {answer_len} "
                    f"tokens, d {mcfg.d_model} x {mcfg.num_layers} layers, {mcfg.dtype.name}, remat "
                    f"{mcfg.remat}, {k / 1e6:.0f}M params")


# name -> (builder, what it is). Order is the table's order.
STEPS: dict[str, tuple[Callable[[Sequence[Any]], StepSpec], str]] = {
    "lm/train": (lm_train(), "byte LM train step"),
    **{name: (lm_train(**o), "byte LM train step, larger model") for name, o in LM_SCALE.items()},
    "diffusion_lm/mdlm": (diffusion_train("mdlm"), "MDLM train step, reference size"),
    "diffusion_lm/ar": (diffusion_train("ar"), "AR train step, reference size"),
    "diffusion_lm/duo": (diffusion_train("duo"), "Duo train step, reference size"),
    "diffusion_lm/gidd": (diffusion_train("gidd"), "GIDD train step, reference size"),
    "diffusion_lm/esolm": (diffusion_train("esolm"), "Eso-LM train step, reference size"),
    "diffusion_lm/mdlm@largest": (diffusion_train("mdlm", -1), "MDLM train step, largest grid size"),
    "diffusion_lm/mdlm@largest-remat-full": (
        diffusion_train("mdlm", -1, **{"backbone.remat": "full"}),
        "MDLM train step, largest grid size, blocks fully rematerialised (for v5e)"),
    "lm/decode-dense": (lm_decode("dense"), "lm decode step, dense KV cache"),
    "lm/decode-ffd": (lm_decode("ffd"), "lm decode step, FFD KV cache"),
    "lm/decode-qvg": (lm_decode("qvg"), "lm decode step, QVG KV cache"),
    "forecasting/train": (forecasting_train, "PPM train step, longest horizon"),
    "spf/train": (spf_train, "SPF train step"),
    "rl_scaling/grpo": (rl_scaling_train, "GRPO step, largest rollouts-per-step group"),
    "judge_btl/fit": (judge_btl_fit, "judge-aware BTL Newton fit"),
    "benchmark_game/n3": (benchmark_game_sweep(3), "pure-equilibrium sweep, 3 providers"),
    "benchmark_game/n5": (benchmark_game_sweep(5), "pure-equilibrium sweep, 5 providers"),
    **{f"llama3_8b/decode-{b}@128k-b{n}": (llama_decode(b, n), f"Llama-3-8B decode, {b} cache, "
                                           f"batch {n}, 128k context")
       for b in ("dense", "ffd", "qvg") for n in (1, 8)},
}

# Steps of the paper variants not yet registered here (listed in AOT.md so that the gap is visible).
NOT_REGISTERED: tuple[str, ...] = ()


# ----------------------------------------------------------------------------------------------
# One compile -> one result row


def one_line(err: BaseException, limit: int = 240) -> str:
    """``Type: first non-empty line of the message``, at most ``limit`` characters."""
    lines = [ln.strip() for ln in str(err).splitlines() if ln.strip()]
    text = f"{type(err).__name__}: {lines[0] if lines else ''}".rstrip(": ")
    return text if len(text) <= limit else text[:limit - 3] + "..."


def compile_row(step: str, topology: str) -> dict:
    """Builds and compiles ``step`` for ``topology``; a dict for the table (``status`` ``"ok"``
    or ``"error"`` with ``reason``). Never raises for a failed build or compile.

    Raises:
      core.aot.CompileExtrasMissing: the topology's compile extras are missing (no row is made).
    """
    import jax

    topo = aot_steps.pod_topology(topology)
    row: dict[str, Any] = {"step": step, "topology": topology, "chip": topo.chip,
                           "chips": topo.num_devices}
    with timing.Stopwatch() as clock:
        try:
            devices = aot_steps.pod_devices(topology)
            spec = STEPS[step][0](devices)
            row.update(shape=spec.shape, params=spec.params, model_flops=spec.model_flops)
            if spec.layer_loop:
                row["layer_loop"] = True
            with jax.enable_x64(spec.x64):
                result = aot_steps.compile_step(spec.fn, spec.args, donate_argnums=spec.donate_argnums)
        except aot.CompileExtrasMissing:
            raise  # the machine cannot compile for this topology at all: not a row of the table
        except Exception as e:  # noqa: BLE001 (a failed compile is a row, not a crash)
            row.update(status="error", reason=one_line(e), seconds=clock.seconds)
            return row
    row.update(status="ok", seconds=result.seconds, memory=result.memory,
               needed_bytes=result.needed_bytes, flops=result.flops,
               bytes_accessed=result.bytes_accessed)
    if spec.fallback is not None:
        row.update(fallback_change=spec.fallback[0], fallback=spec.fallback[1])
    if result.fallback is not None:
        row.update(compile_options=result.fallback.options, fallback=result.fallback.reason,
                   fallback_change=", ".join(f"`{k}={v}`" for k, v in
                                             result.fallback.options.items()))
    return row


def add_roofline(row: dict) -> dict:
    """Adds ``roofline`` (step seconds, bound, MFU, which FLOP count was used) to an ``ok`` row
    that has XLA's cost analysis (TPU) of every layer; others (and rows whose layers run in one
    loop, whose cost XLA counts for one block) are returned unchanged."""
    if (row.get("status") != "ok" or row.get("flops") is None or row.get("bytes_accessed") is None
            or row.get("layer_loop")):
        return row
    model = row.get("model_flops")
    per_chip_model = 0.0 if model is None else model / row["chips"]
    flops = max(row["flops"], per_chip_model)
    r = aot_steps.roofline(row["chip"], flops_per_chip=flops, bytes_per_chip=row["bytes_accessed"],
                           model_flops=model or 0.0, num_chips=row["chips"])
    return {**row, "roofline": {"step_seconds": r.step_seconds, "bound": r.bound,
                                "mfu": None if model is None else r.mfu,
                                "flops_source": "xla" if row["flops"] >= per_chip_model
                                else "model"}}


# ----------------------------------------------------------------------------------------------
# Table


def _gib(n: float) -> str:
    return f"{n / 2 ** 30:.2f} GiB"


def _si(x: float) -> str:
    for unit, scale in (("P", 1e15), ("T", 1e12), ("G", 1e9), ("M", 1e6)):
        if abs(x) >= scale:
            return f"{x / scale:.2f}{unit}"
    return f"{x:.0f}"


_UNITS = {"K": 2 ** 10, "M": 2 ** 20, "G": 2 ** 30, "T": 2 ** 40}


def hbm_exhausted(reason: str) -> tuple[float, float] | None:
    """(required, available) bytes from libtpu's refusal of a program that does not fit ("... the
    total memory required for HLO temporaries (16.85G) exceeds available HBM (15.75G)"; G read as
    GiB), or None for another reason."""
    m = re.search(r"\(([\d.]+)([KMGT])\) exceeds available HBM \(([\d.]+)([KMGT])\)", reason)
    if m is None:
        return None
    return float(m[1]) * _UNITS[m[2]], float(m[3]) * _UNITS[m[4]]


def usable_bytes(topology: str) -> float:
    """Usable HBM per device of ``topology`` (``core.aot_steps.CHIPS``)."""
    return aot_steps.CHIPS[aot_steps.pod_topology(topology).chip].usable_bytes


def _percent(x: float) -> str:
    """Two significant digits: ``19%``, ``8.4%``, ``0.031%``."""
    return f"{100 * x:.2g}%" if x < 0.1 else f"{100 * x:.0f}%"


def fit_cell(row: dict | None) -> str:
    """The steps x topologies cell: ``fits 6.1/15.8 GiB``, ``over by 3.0 GiB``, ``error`` or
    ``not run``."""
    if row is None:
        return "not run"
    if row["status"] != "ok":
        oom = hbm_exhausted(row.get("reason", ""))
        if oom is None:
            return "error"
        return (f"**over by {_gib(oom[0] - oom[1])}** (temporaries {oom[0] / 2 ** 30:.1f}/"
                f"{oom[1] / 2 ** 30:.1f} GiB)")
    need, usable = row["needed_bytes"], usable_bytes(row["topology"])
    mark = " (fallback)" if row.get("fallback") else ""
    if need <= usable:
        return f"fits {need / 2 ** 30:.1f}/{usable / 2 ** 30:.1f} GiB{mark}"
    return (f"**over by {_gib(need - usable)}** ({need / 2 ** 30:.1f}/{usable / 2 ** 30:.1f} GiB)"
            f"{mark}")


def _fallback_change(row: dict) -> str:
    """What a fallback row changed: the builder's words, else the compile options."""
    return row.get("fallback_change") or ", ".join(
        f"`{k}={v}`" for k, v in row.get("compile_options", {}).items())


def render(rows: Sequence[dict], steps: Sequence[str], topologies: Sequence[str],
           header: str = "") -> str:
    """``AOT.md``'s text: the steps x topologies fit table, the details of each compiled row, the
    failures with their reasons, and what has not run."""
    by = {(r["step"], r["topology"]): r for r in rows}
    out = ["# Ahead-of-time compiles for TPU and GPU pods", ""]
    if header:
        out += [header, ""]
    out += ["## Fits per device (needed / usable HBM)", "",
            "| step | " + " | ".join(topologies) + " |",
            "|---|" + "---|" * len(topologies)]
    for s in steps:
        out.append(f"| {s} | " + " | ".join(fit_cell(by.get((s, t))) for t in topologies) + " |")
    ok = [r for r in rows if r["status"] == "ok"]
    out += ["", "## Details (per device)", ""]
    if ok:
        out += ["| step | topology | sizes | arguments | outputs (aliased) | temporaries | code | "
                "XLA FLOPs | XLA bytes | roofline step | bound | MFU | compile s |",
                "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in sorted(ok, key=lambda r: (list(steps).index(r["step"]) if r["step"] in steps
                                           else len(steps), r["topology"])):
            m = r["memory"]
            rf = r.get("roofline")
            flops = "-" if r["flops"] is None else _si(r["flops"])
            if rf is not None and rf["flops_source"] == "model":
                flops += f" (model: {_si(r['model_flops'] / r['chips'])})"
            nbytes = "-" if r["bytes_accessed"] is None else _si(r["bytes_accessed"]) + "B"
            step_t = "-" if rf is None else f"{rf['step_seconds'] * 1e3:.1f} ms"
            if rf is not None and r.get("model_flops") is None:
                step_t = ">= " + step_t  # XLA's counts alone: a loop body counted once
            out.append(" | ".join([
                f"| {r['step']}", r["topology"], r.get("shape", ""), _gib(m["argument"]),
                f"{_gib(m['output'])} ({_gib(m['alias'])})", _gib(m["temp"]),
                _gib(m["generated_code"]), flops, nbytes, step_t,
                "-" if rf is None else rf["bound"],
                "-" if rf is None or rf["mfu"] is None else _percent(rf["mfu"]),
                f"{r['seconds']:.0f} |"]))
    else:
        out.append("No step has compiled yet.")
    fell_back = [r for r in ok if r.get("fallback")]
    if fell_back:
        out += ["", "## Compiled with a fallback", "",
                "These rows differ from the experiment's own step on this target: compile options "
                "(`core.aot.FALLBACKS`: XLA's defaults refused the program with a known symptom "
                "of compiling without a device) or a change the step's builder states.",
                "", "| step | topology | what changed | why |", "|---|---|---|---|"]
        out += [f"| {r['step']} | {r['topology']} | {_fallback_change(r)} | {r['fallback']} |"
                for r in fell_back]
    bad = [r for r in rows if r["status"] != "ok"]
    if bad:
        out += ["", "## Failed or refused", "", "| step | topology | reason | note |",
                "|---|---|---|---|"]
        out += [f"| {r['step']} | {r['topology']} | {r['reason'].replace('|', '/')} | "
                f"{failure_note(r['reason'])} |" for r in bad]
    missing = [(s, t) for s in steps for t in topologies if (s, t) not in by]
    out += ["", "## Not yet run", ""]
    if missing:
        out += [f"- {s} on {t}" for s, t in missing]
    else:
        out.append("Every registered step has been compiled for every topology above.")
    out += [f"- not registered: {n}" for n in NOT_REGISTERED]
    others = [t for t in aot_steps.POD_TOPOLOGIES if t not in topologies]
    if others:
        out += ["", f"Other topologies (`--topologies`): {', '.join(others)}."]
    return "\n".join(out) + "\n"


# What was found out about a failure, by a substring of its reason (measured on this machine).
FAILURE_NOTES = {
    "tuple parameter that is being flattened": (
        "float64 on TPU is emulated: the same fit compiles for one v5e chip (225 s at 1000 rows) "
        "and in float32 on the 16-chip mesh (10 s); `judge_btl_precision` compiles it in float32 "
        "on TPU"),
}


def failure_note(reason: str) -> str:
    """The note of :data:`FAILURE_NOTES` that matches ``reason`` (``""`` if none)."""
    return next((note for key, note in FAILURE_NOTES.items() if key in reason), "")


def write_atomic(path: str, text: str) -> None:
    """Writes ``text`` to ``path`` through a temporary file in the same directory and a rename,
    so that a reader never sees a half-written file."""
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".aot-", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


NOTES = (
    "Built by `make aot` (`experiments/aot.py`): each experiment's `paper` step, from abstract "
    "values only, placed by `core.sharding` (FSDP over `data`, tensor parallelism over `model`, "
    "the config's `model_parallelism`), compiled by XLA for compile-only devices of each "
    "topology on a CPU-only machine. Needed = arguments + outputs not aliased onto the donated "
    "state + temporaries + code, per device (XLA's buffer assignment); usable HBM: what libtpu "
    "reports available on TPU (15.75 GiB v5e, 31.25 GiB v6e; libtpu refuses to compile a program "
    "that does not fit, and the cell gives its numbers), 75% of the chip on GPU (JAX's default "
    "preallocation; `core/aot_steps.py`). Roofline (TPU "
    "only; XLA:GPU gives no cost analysis): max(FLOPs/peak, bytes/HBM bandwidth) per chip, "
    "MFU = model FLOPs (3 x analytic forward FLOPs x tokens) / (step time x peak x chips). XLA "
    "counts a loop body once (layer scans, blockwise attention), so the roofline uses the larger "
    "of XLA's FLOP count and the model's share per chip (shown as \"model: ...\" when larger); "
    "XLA's byte count is its estimate of HBM traffic after fusion (a loop body again counted "
    "once; rows whose layers are scanned therefore have no roofline). Train steps with "
    "attention 'auto' run splash attention on TPU; on GPU they run "
    "blockwise attention here, because cuDNN's is chosen only when a GPU is attached while "
    "tracing, so their GPU temporaries are an upper bound. The Llama-3-8B decode rows run FFD's "
    "and QVG's Pallas kernels inside `shard_map` (`kernels/*/sharded.py`); the `lm` decode rows "
    "use their XLA paths. Recompile chosen rows "
    "with `python -m experiments.aot --only='<step>@<topology>,...'` (shell patterns; merged into "
    "this table). Kernel compiles (single device, Pallas TPU and GPU) are the compile tests: "
    "`make test-aot` (`tests/**/test_*_compile.py`).")


def load_rows(path: str) -> list[dict]:
    """Rows saved beside the table (``[]`` when absent). Raises ValueError for a damaged file."""
    if not os.path.exists(path):
        return []
    try:
        with open(path) as f:
            rows = json.load(f)
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not a JSON list of AOT rows ({e}); delete it or pass --fresh"
                         ) from None
    if not isinstance(rows, list) or not all(isinstance(r, dict) and "step" in r for r in rows):
        raise ValueError(f"{path}: expected a JSON list of rows with a 'step'")
    return rows


def parse_list(text: str, valid: Sequence[str], what: str) -> list[str]:
    """Comma list -> names, each checked against ``valid`` (ValueError naming the bad ones)."""
    names = [s.strip() for s in text.split(",") if s.strip()]
    bad = [n for n in names if n not in valid]
    if bad or not names:
        raise ValueError(f"--{what}: {bad or 'empty'} not in {list(valid)}")
    return names


def select_rows(steps: Sequence[str], topologies: Sequence[str], only: Sequence[str]
                ) -> list[tuple[str, str]]:
    """The (step, topology) pairs of ``steps x topologies`` that a pattern of ``only`` names:
    shell-style patterns (``fnmatch``) matched against the step name or ``<step>@<topology>``,
    e.g. ``llama3_8b/*``, ``lm/decode-ffd@v5e:4x4`` or ``*@h100:1x2x8``.

    Raises:
      ValueError: a pattern that matches no pair (naming it).
    """
    import fnmatch

    pairs = [(s, t) for s in steps for t in topologies]
    for pattern in only:
        if not any(fnmatch.fnmatchcase(s, pattern) or fnmatch.fnmatchcase(f"{s}@{t}", pattern)
                   for s, t in pairs):
            raise ValueError(f"--only: {pattern!r} matches no row of the {len(steps)} steps x "
                             f"{list(topologies)}; rows are named <step>@<topology>")
    return [(s, t) for s, t in pairs if any(
        fnmatch.fnmatchcase(s, p) or fnmatch.fnmatchcase(f"{s}@{t}", p) for p in only)]


def run(out: str, steps: Sequence[str], topologies: Sequence[str], fresh: bool = False,
        retry_failed: bool = False, only: Sequence[str] = (),
        log: Callable[[str], None] = print) -> list[dict]:
    """Compiles every step x topology not already in ``<out>.json`` (all of them with ``fresh``;
    also those that failed with ``retry_failed``; with ``only``, exactly the rows its patterns
    name (:func:`select_rows`), whatever is stored for them) and rewrites ``out`` and
    ``<out>.json`` atomically after each compile, merging into what is stored. Returns the rows.

    Raises:
      ValueError: an ``only`` pattern that names no row; a damaged ``<out>.json``; an unknown
        topology.
      core.aot.CompileExtrasMissing: a topology's compile extras are not installed (checked
        before anything is written; one line naming the ``pip install``).
    """
    import hashlib

    import filelock

    forced = set(select_rows(steps, topologies, only)) if only else None
    for t in topologies:  # before anything is written: a machine that cannot compile for them
        aot.require_extras(aot_steps.pod_topology(t).chip, repr(t))
    store = out + ".json"
    # Several runs may share one table (e.g. TPU and GPU topologies in two processes): each save
    # re-reads the store under a lock and merges this run's rows into it.
    lock = filelock.FileLock(os.path.join(tempfile.gettempdir(), "aot-" + hashlib.sha1(
        os.path.abspath(store).encode()).hexdigest()[:16] + ".lock"))
    mine: dict[tuple[str, str], dict] = {}

    def save() -> list[dict]:
        with lock:
            rows = [r for r in load_rows(store) if (r["step"], r["topology"]) not in mine]
            rows += list(mine.values())
            all_steps = list(dict.fromkeys([*STEPS, *(r["step"] for r in rows)]))
            order = list(aot_steps.POD_TOPOLOGIES)  # TPU first, then GPU; small to large
            all_topos = sorted({*topologies, *(r["topology"] for r in rows)}, key=order.index)
            write_atomic(store, json.dumps(rows, indent=1, sort_keys=True))
            write_atomic(out, render(rows, all_steps, all_topos, NOTES))
        return rows

    if fresh:
        with lock:
            write_atomic(store, "[]")
    rows = save()

    def finished(r):  # a program libtpu refused for its size is a result, not a failure
        return not (retry_failed and r["status"] != "ok"
                    and hbm_exhausted(r.get("reason", "")) is None)

    done = {(r["step"], r["topology"]) for r in rows if finished(r)}
    for s in steps:
        for t in topologies:
            if forced is not None:
                if (s, t) not in forced or (s, t) in mine:
                    continue
            elif (s, t) in done:
                continue
            with lock:  # another run sharing the table may have compiled it meanwhile
                if forced is None and any((r["step"], r["topology"]) == (s, t) and (finished(r) or r not in rows)
                       for r in load_rows(store)):
                    continue
            log(f"compiling {s} for {t} ...")
            row = add_roofline(compile_row(s, t))
            mine[(s, t)] = row
            rows = save()
            log(f"  {fit_cell(row)}" + (f": {row['reason']}" if row["status"] != "ok" else "")
                + f" ({row['seconds']:.0f} s)")
    return rows


def main(argv: Sequence[str]) -> None:
    from absl import flags

    del argv
    f = flags.FLAGS
    try:
        steps = parse_list(f.steps, list(STEPS), "steps") if f.steps != "all" else list(STEPS)
        topos = parse_list(f.topologies, aot_steps.topology_names(), "topologies")
        only = [p.strip() for p in f.only.split(",") if p.strip()]
        run(f.out, steps, topos, fresh=f.fresh, retry_failed=f.retry_failed, only=only)
    except (ValueError, aot.CompileExtrasMissing) as e:
        print(f"aot: {e}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    from absl import app, flags

    flags.DEFINE_string("out", "AOT.md", "the table to write (results kept in <out>.json)")
    flags.DEFINE_string("steps", "all", f"comma list of: {', '.join(STEPS)}")
    flags.DEFINE_string("topologies", ",".join(DEFAULT_TOPOLOGIES),
                        f"comma list of: {', '.join(aot_steps.topology_names())}")
    flags.DEFINE_bool("fresh", False, "ignore the results kept from earlier runs")
    flags.DEFINE_string("only", "", "comma list of row patterns (<step>@<topology>, shell-style: "
                        "'llama3_8b/*', '*@h100:1x2x8'): compile exactly those rows again and merge "
                        "them into the table")
    flags.DEFINE_bool("retry_failed", False, "compile again the steps that failed before (not "
                      "those refused for not fitting in HBM)")
    app.run(main)
