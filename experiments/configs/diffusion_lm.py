"""Discrete diffusion LMs vs AR on the Shakespeare bytes: NELBO perplexity, IsoFLOP fits, and the
speed-quality Pareto of sampling (Sahoo et al. 2026, "Scaling Beyond Masked Diffusion Language
Models").

    python -m experiments.diffusion_lm --config=experiments/configs/diffusion_lm.py:tiny --workdir=workdir
    python -m experiments.diffusion_lm --config=experiments/configs/diffusion_lm.py:paper --workdir=DIR  # accelerator

Override fields with ``--config.<field>=value`` (e.g. ``--config.budgets='(1e10,2e10,4e10)'``) or
``:tiny,field=value``.
"""

import ml_collections

from core import config as cfg_lib


def base() -> ml_collections.ConfigDict:
    c = ml_collections.ConfigDict()
    c.seed = 0
    c.corpus = ""  # comma-separated text files or folders; empty = the Shakespeare plays
    c.val_fraction = 0.1
    c.seq_len = 64
    c.batch_size = 16
    # Model sizes of the IsoFLOP grid: (d_model, num_layers, num_heads).
    c.sizes = ((16, 2, 1), (24, 2, 2), (32, 2, 2), (48, 2, 3))
    c.reference_size = 2  # index into sizes: the size of the per-family comparison and sampling
    # Backbone kernels (TransformerConfig fields): compute dtype (parameters and optimizer state
    # stay float32), full-sequence attention implementation, per-block rematerialisation.
    c.backbone = ml_collections.ConfigDict(dict(
        dtype="float32", attention="reference", attention_block=512, remat="none"))
    c.model_parallelism = 1  # size of the mesh's model axis (tensor parallelism)
    c.param_sharding = "fsdp"  # "fsdp": FSDP over data + TP over model; "replicated"
    c.isoflop_families = ("ar", "mdlm", "mdlm_ce", "duo")
    c.families = ("ar", "mdlm", "mdlm_ce", "duo", "esolm", "gidd")
    c.budgets = (1e10, 2e10, 4e10)  # training FLOPs, C = 3 * F_fwd * tokens
    c.learning_rate = 3e-3
    c.warmup_steps = 20
    c.weight_decay = 0.0
    c.grad_clip = 1.0
    c.ema_decay = 0.0  # 0 disables the parameter EMA
    c.eps = 1e-3  # schedule floor alpha_1 = eps
    c.alpha0 = 0.5  # Eso-LM: clean fraction left to the diffusion phase
    c.p_uniform = 0.1  # GIDD
    c.gidd_max_weight = 2.0
    c.eval_windows = 128  # held-out windows per IsoFLOP evaluation (multiple of batch_size)
    c.eval_reps = 2  # time / mask draws per window at each evaluation
    c.final_eval_windows = 128
    c.final_eval_reps = 2
    c.sample_steps = (8, 32)
    c.sample_batches = 1  # batches of batch_size samples per setting
    c.log_every = 25
    c.bootstrap_samples = 500
    return c


VARIANTS = {
    "tiny": {},
    # seconds: executes every code path (tests and notebook smoke runs); numbers are meaningless
    "smoke": {
        "seq_len": 16, "batch_size": 8, "sizes": ((8, 1, 1), (12, 1, 1), (16, 1, 1)),
        "reference_size": 1, "isoflop_families": ("ar", "mdlm", "mdlm_ce"),
        "budgets": (2e7, 4e7, 8e7), "warmup_steps": 2, "eval_windows": 8, "eval_reps": 1,
        "final_eval_windows": 8, "final_eval_reps": 1, "sample_steps": (2,), "log_every": 2,
        "bootstrap_samples": 20,
    },
    "paper": {
        # DiT-small backbone (12 layers, d=768, 12 heads), L=1024, AdamW 3e-4, warmup 2500, EMA.
        "seq_len": 1024, "batch_size": 512,
        "sizes": ((512, 8, 8), (640, 10, 10), (768, 12, 12), (1024, 16, 16)),
        "reference_size": 2,
        "budgets": (3e18, 1e19, 3e19),
        "learning_rate": 3e-4, "warmup_steps": 2500, "weight_decay": 0.0, "ema_decay": 0.9999,
        "eval_windows": 2048, "eval_reps": 2, "final_eval_windows": 4096, "final_eval_reps": 4,
        "sample_steps": (16, 64, 256, 1024), "sample_batches": 1, "log_every": 100,
        "bootstrap_samples": 2000,
        "backbone.dtype": "bfloat16", "backbone.attention": "blockwise", "backbone.remat": "minimal",
    },
}


FAMILIES = ("ar", "mdlm", "mdlm_ce", "duo", "esolm", "gidd")  # algorithms.diffusion_lm.FAMILIES

# What each field accepts (checked once every override is in, before any work).
RULES = {
    "seed": cfg_lib.integer(lo=0),
    "corpus": cfg_lib.path_or_empty(several=True),
    "val_fraction": cfg_lib.number(lo=0, hi=1, lo_open=True, hi_open=True),
    "seq_len": cfg_lib.integer(lo=2),
    "batch_size": cfg_lib.integer(lo=1),
    # (d_model, num_layers, num_heads); the IsoFLOP fit needs >= 3 sizes
    "sizes": cfg_lib.tuple_of(cfg_lib.tuple_of(cfg_lib.integer(lo=1), 3, 3), min_len=3),
    "reference_size": cfg_lib.integer(lo=0),
    "backbone.dtype": cfg_lib.one_of("float32", "bfloat16", "float16"),
    "backbone.attention": cfg_lib.one_of("reference", "blockwise", "cudnn"),
    "backbone.attention_block": cfg_lib.integer(lo=1),
    "backbone.remat": cfg_lib.one_of("none", "full", "minimal", "dots"),
    "model_parallelism": cfg_lib.integer(lo=1),
    "param_sharding": cfg_lib.one_of("fsdp", "replicated"),
    "isoflop_families": cfg_lib.tuple_of(cfg_lib.one_of(*FAMILIES)),
    "families": cfg_lib.tuple_of(cfg_lib.one_of(*FAMILIES)),
    "budgets": cfg_lib.tuple_of(cfg_lib.number(lo=0, lo_open=True), min_len=2),
    "learning_rate": cfg_lib.number(lo=0, lo_open=True),
    "warmup_steps": cfg_lib.integer(lo=0),
    "weight_decay": cfg_lib.number(lo=0),
    "grad_clip": cfg_lib.number(lo=0, lo_open=True),
    "ema_decay": cfg_lib.number(lo=0, hi=1, hi_open=True),  # 0 disables the EMA
    "eps": cfg_lib.number(lo=0, hi=1, lo_open=True, hi_open=True),
    "alpha0": cfg_lib.number(lo=0, hi=1, lo_open=True),
    "p_uniform": cfg_lib.number(lo=0, hi=1, hi_open=True),
    "gidd_max_weight": cfg_lib.number(lo=0, lo_open=True),
    "eval_windows": cfg_lib.integer(lo=1),
    "eval_reps": cfg_lib.integer(lo=1),
    "final_eval_windows": cfg_lib.integer(lo=1),
    "final_eval_reps": cfg_lib.integer(lo=1),
    "sample_steps": cfg_lib.tuple_of(cfg_lib.integer(lo=1)),
    "sample_batches": cfg_lib.integer(lo=1),
    "log_every": cfg_lib.integer(lo=1),
    "bootstrap_samples": cfg_lib.integer(lo=1),
}


def check_sizes(config: ml_collections.ConfigDict) -> None:
    """``reference_size`` indexes ``sizes``; every size has an even head dimension
    d_model / num_heads (RoPE rotates pairs).

    Raises:
      ValueError: naming the fields.
    """
    if config.reference_size >= len(config.sizes):
        raise ValueError(f"config fields reference_size={config.reference_size} and sizes (len "
                         f"{len(config.sizes)}): expected reference_size < len(sizes)")
    for i, (d, _, h) in enumerate(config.sizes):
        if d % h or (d // h) % 2:
            raise ValueError(f"config field sizes[{i}] = {(d, _, h)}: expected d_model / num_heads "
                             "to be an even integer (the head dimension, rotated in pairs by RoPE)")


def check_windows(config: ml_collections.ConfigDict) -> None:
    """Evaluation runs whole batches: both window counts must be multiples of ``batch_size``.

    Raises:
      ValueError: naming the fields.
    """
    for field in ("eval_windows", "final_eval_windows"):
        if config[field] % config.batch_size:
            raise ValueError(f"config fields {field}={config[field]} and batch_size="
                             f"{config.batch_size}: expected {field} to be a multiple of batch_size")


def check_families(config: ml_collections.ConfigDict) -> None:
    """The AR model scores the samples of the other families, so ``families`` includes it.

    Raises:
      ValueError: ``"ar"`` not in ``families``.
    """
    if "ar" not in config.families:
        raise ValueError(f"config field families = {config.families!r}: expected it to include "
                         "'ar' (the AR model scores the samples)")


CROSS_CHECKS = (check_sizes, check_windows, check_families)


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    return cfg_lib.build(arg, base, VARIANTS)
