"""Quantized KV cache (QVG, QVG-Pro, KIVI) and EntroKV budgets on the trained byte-level LM.

    python -m experiments.kv_quant --config=experiments/configs/kv_quant.py:tiny --workdir=workdir
    python -m experiments.kv_quant --config=experiments/configs/kv_quant.py:paper --workdir=DIR  # accelerator

The ``lm`` experiment's checkpoint in ``<workdir>/lm`` is used (trained first if absent).
"""

import ml_collections

from core import config as cfg_lib


def base() -> ml_collections.ConfigDict:
    c = ml_collections.ConfigDict()
    c.seed = 0
    c.windows = 8  # held-out windows of `context` bytes
    c.context = 128  # the LM's training length (RoPE does not extrapolate past it)
    c.prompt_len = 64  # prefill; the rest of each window is decoded teacher-forced
    c.bits = 2
    c.chunk = 64  # tokens per k-means chunk (QVG) = KIVI's full-precision residual
    c.num_centroids = 2  # 2 bf16 centroids of D=32 over 64 tokens: 0.5 bit/element
    c.kmeans_iters = 8
    c.qvg_block = 64  # paper: 64 (clamped to the head dim when larger)
    c.qvg_pro_block = 16
    c.qvg_pro_stages = 4
    c.kivi_group = 32
    c.kivi_block = 32
    c.budget_fraction = 0.3
    c.entrokv_window = 32
    c.entrokv_alpha = 0.5
    c.entrokv_prior = 0.3
    c.entrokv_pool = 7
    # Synthetic keys with outlier channels (long context, the paper's centroid count).
    c.synth_tokens = 16384
    c.synth_head_dim = 64
    c.synth_heads = 2
    c.synth_centroids = 256
    c.synth_clusters = 64
    c.synth_outlier_channels = 4
    c.synth_queries = 64
    c.lm_config = ""  # "" = the lm experiment's tiny config
    return c


VARIANTS = {
    "tiny": {},
    # seconds: executes every code path (tests and notebook smoke runs); numbers are meaningless
    "smoke": {"windows": 2, "context": 64, "prompt_len": 32, "chunk": 16, "kmeans_iters": 2,
              "kivi_group": 16, "kivi_block": 16, "qvg_pro_block": 8, "entrokv_window": 8,
              "entrokv_pool": 3, "synth_tokens": 512, "synth_centroids": 8,
              "synth_clusters": 4, "synth_queries": 4, "lm_config": "smoke"},
    "paper": {"windows": 64, "context": 1024, "prompt_len": 768, "chunk": 256, "num_centroids": 16,
              "kmeans_iters": 20, "synth_tokens": 65536, "synth_heads": 8, "lm_config": "paper"},
}


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    return cfg_lib.build(arg, base, VARIANTS)
