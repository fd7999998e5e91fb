"""Discrete diffusion LMs vs AR on the Shakespeare bytes: NELBO perplexity, IsoFLOP fits, and the
speed-quality Pareto of sampling (Sahoo et al. 2026, "Scaling Beyond Masked Diffusion Language
Models").

    python -m experiments.diffusion_lm --config=experiments/configs/diffusion_lm.py:tiny --workdir=workdir
    python -m experiments.diffusion_lm --config=experiments/configs/diffusion_lm.py:paper --workdir=DIR  # accelerator

``data_path``: the text to train and evaluate on (a text file, or comma-separated files /
folders); empty = the bundled Shakespeare plays.

Override fields with ``--config.<field>=value`` (e.g. ``--config.budgets='(1e10,2e10,4e10)'``) or
``:tiny,field=value``; grouped fields by their dotted path (``--config.optim.learning_rate=1e-3``).
"""

import jax.numpy as jnp
import ml_collections

from algorithms.diffusion_lm import evaluator, grid
from algorithms.diffusion_lm.families import FAMILIES, transformer_config
from core import config as cfg_lib
from core import report
from experiments.configs import lm
from models.attention import IMPLEMENTATIONS
from models.transformer import COMPUTE_DTYPES, REMAT_POLICIES


def base() -> ml_collections.ConfigDict:
    c = ml_collections.ConfigDict()
    c.seed = 0
    # The text to train and evaluate on: a text file, or comma-separated files / folders of
    # them; empty = the bundled Shakespeare plays (held-out plays are the validation split).
    c.data_path = ""
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
    c.families = ("ar", "mdlm", "mdlm_ce", "duo", "esolm", "esolm_nelbo", "gidd")
    c.budgets = (1e10, 2e10, 4e10)  # training FLOPs, C = 3 * F_fwd * tokens
    # AdamW, linear warmup, then (schedule "cosine") a cosine decay to final_lr_fraction of the
    # peak at each run's last step: one run per (size, budget), as Chinchilla's Approach 2 and
    # the paper; or ("constant") no decay: one run per size read at every budget (cheaper).
    c.optim = ml_collections.ConfigDict(dict(
        learning_rate=3e-3, warmup_steps=20, weight_decay=0.0, grad_clip=1.0,
        schedule="cosine", final_lr_fraction=0.1))
    c.ema_decay = 0.0  # 0 disables the parameter EMA
    c.eps = 1e-3  # schedule floor alpha_1 = eps
    # FamilySpec fields: t_min (times ~ U[t_min, 1] in every NELBO estimate), the training
    # alpha0 of the Eso-LM ablation esolm_nelbo (esolm trains at 1; sampling.alpha0 is the one
    # used at sampling), GIDD's uniform share p_uniform, its training weights gidd_weighting
    # ("dynamic": the authors' default; "clip": the ELBO weights capped) and their cap.
    c.process = ml_collections.ConfigDict(dict(
        t_min=1e-3, alpha0=0.5, p_uniform=0.1, gidd_max_weight=2.0, gidd_weighting="dynamic"))
    # Held-out evaluation: every model on the same windows with the same time / mask draws
    # (paired). The IsoFLOP cells (fits and the CE/NELBO ratio) use eval_reps draws per window;
    # the per-family comparison final_eval_reps.
    c.eval_windows = 128  # held-out windows per IsoFLOP evaluation (multiple of batch_size)
    c.eval_reps = 8  # time / mask draws per window at each IsoFLOP evaluation
    c.final_eval_windows = 128
    c.final_eval_reps = 16
    c.sampling = ml_collections.ConfigDict(dict(
        steps=(8, 32),  # sampling steps of the diffusion families (AR: seq_len)
        batches=4,  # batches of batch_size samples per setting (generative perplexity's interval)
        alpha0=0.5))  # Eso-LM's clean fraction at sampling (diffusion, then AR)
    # The generative-perplexity evaluator: a larger causal LM trained once on the same split
    # (algorithms.lm.training fields); it scores every family's samples.
    c.evaluator = ml_collections.ConfigDict(dict(
        model=ml_collections.ConfigDict(dict(
            d_model=96, num_layers=3, num_heads=4, num_kv_heads=2, max_len=64, mlp_dim=0,
            dtype="float32", attention="reference", attention_block=512, remat="none")),
        seq_len=64, batch_size=32, steps=400, learning_rate=3e-3, warmup_steps=40,
        weight_decay=0.1, grad_clip=1.0, log_every=50, checkpoint_every=200))
    c.log_every = 25
    c.bootstrap_samples = 500
    c.claim = report.claim_config(
        method="Discrete diffusion LMs (AR / MDLM / Duo / Eso-LM / GIDD)",
        statement="ppl AR < masked < uniform; MDLM-CE ~12% more FLOPs-efficient",
        # paired differences (95% intervals) and the paired-bootstrap ratio's 95% interval
        checks=("paired_diff_bpb.mdlm_minus_ar.lo > 0", "paired_diff_bpb.duo_minus_mdlm.lo > 0",
                "ce_vs_nelbo_flops_ratio.hi95 < 1"),
        # each of the three 95% intervals excludes its threshold (0, 0, 1), and the size grid
        # brackets both MDLM objectives' optima at every budget (the CE/NELBO ratio compares
        # their compute-optimal frontiers; a minimum at the grid's edge is not one); else "not
        # resolved at this size", whatever the checks say
        resolved=("paired_diff_bpb.mdlm_minus_ar.resolved == 1",
                  "paired_diff_bpb.duo_minus_mdlm.resolved == 1",
                  "ce_vs_nelbo_flops_ratio.resolved == 1",
                  "isoflop.mdlm.resolved == 1", "isoflop.mdlm_ce.resolved == 1"),
        ours="bpb AR {val_bpb[ar]:.3f}, MDLM {val_bpb[mdlm]:.3f}, Duo {val_bpb[duo]:.3f}; "
             "Duo - MDLM {paired_diff_bpb[duo_minus_mdlm][mean]:+.3f} "
             "[{paired_diff_bpb[duo_minus_mdlm][lo]:+.3f}, "
             "{paired_diff_bpb[duo_minus_mdlm][hi]:+.3f}]; CE/NELBO FLOPs "
             "{ce_vs_nelbo_flops_ratio[ratio]:.2f} [{ce_vs_nelbo_flops_ratio[lo95]:.2f}, "
             "{ce_vs_nelbo_flops_ratio[hi95]:.2f}]")
    return c


VARIANTS = {
    "tiny": {},
    # seconds: executes every code path (tests and notebook smoke runs); numbers are meaningless
    "smoke": {
        "seq_len": 16, "batch_size": 8, "sizes": ((8, 1, 1), (12, 1, 1), (16, 1, 1)),
        "reference_size": 1, "isoflop_families": ("ar", "mdlm", "mdlm_ce"),
        "budgets": (2e7, 4e7, 8e7), "optim.warmup_steps": 2, "eval_windows": 8, "eval_reps": 1,
        "final_eval_windows": 8, "final_eval_reps": 1, "sampling.steps": (2,), "log_every": 2,
        "sampling.batches": 1,
        "bootstrap_samples": 20, "evaluator.model.d_model": 16, "evaluator.model.num_layers": 1,
        "evaluator.model.num_heads": 2, "evaluator.model.num_kv_heads": 1,
        "evaluator.model.max_len": 16, "evaluator.seq_len": 16, "evaluator.batch_size": 8,
        "evaluator.steps": 4, "evaluator.warmup_steps": 1, "evaluator.log_every": 2,
        "evaluator.checkpoint_every": 2,
    },
    "paper": {
        # DiT-small backbone (12 layers, d=768, 12 heads), L=1024, AdamW 3e-4, warmup 2500, EMA.
        "seq_len": 1024, "batch_size": 512,
        "sizes": ((512, 8, 8), (640, 10, 10), (768, 12, 12), (1024, 16, 16)),
        "reference_size": 2,
        "budgets": (3e18, 1e19, 3e19),
        "optim.learning_rate": 3e-4, "optim.warmup_steps": 2500, "optim.weight_decay": 0.0,
        "ema_decay": 0.9999,
        "eval_windows": 2048, "eval_reps": 4, "final_eval_windows": 4096, "final_eval_reps": 8,
        "sampling.steps": (16, 64, 256, 1024), "sampling.batches": 4, "log_every": 100,
        "bootstrap_samples": 2000,
        # attention 'auto': splash on TPU, cuDNN on GPU, blockwise for Eso-LM's per-example masks
        "backbone.dtype": "bfloat16", "backbone.attention": "auto", "backbone.remat": "minimal",
        # the evaluator: GPT-2 medium-sized, as the papers score with a larger AR model
        "evaluator.model.d_model": 1024, "evaluator.model.num_layers": 24,
        "evaluator.model.num_heads": 16, "evaluator.model.num_kv_heads": 16,
        "evaluator.model.max_len": 1024, "evaluator.seq_len": 1024, "evaluator.batch_size": 256,
        "evaluator.steps": 50_000, "evaluator.learning_rate": 3e-4,
        "evaluator.warmup_steps": 2000, "evaluator.log_every": 100,
        "evaluator.checkpoint_every": 1000, "evaluator.model.dtype": "bfloat16",
        "evaluator.model.attention": "auto", "evaluator.model.remat": "minimal",
    },
}


# What each field accepts (checked once every override is in, before any work).
RULES = {
    "seed": cfg_lib.integer(lo=0),
    "data_path": cfg_lib.path_or_empty(several=True),
    "val_fraction": cfg_lib.number(lo=0, hi=1, lo_open=True, hi_open=True),
    "seq_len": cfg_lib.integer(lo=2),
    "batch_size": cfg_lib.integer(lo=1),
    # (d_model, num_layers, num_heads), each checked by TransformerConfig (check_backbone); the
    # IsoFLOP fit needs >= 3 sizes
    "sizes": cfg_lib.tuple_of(cfg_lib.tuple_of(cfg_lib.integer(), 3, 3), min_len=3),
    "reference_size": cfg_lib.integer(lo=0),
    "backbone.dtype": cfg_lib.one_of(*COMPUTE_DTYPES),
    "backbone.attention": cfg_lib.one_of(*IMPLEMENTATIONS),
    "backbone.attention_block": cfg_lib.integer(),
    "backbone.remat": cfg_lib.one_of(*REMAT_POLICIES),
    "model_parallelism": cfg_lib.integer(lo=1),
    "param_sharding": cfg_lib.one_of("fsdp", "replicated"),
    "isoflop_families": cfg_lib.tuple_of(cfg_lib.one_of(*FAMILIES)),
    "families": cfg_lib.tuple_of(cfg_lib.one_of(*FAMILIES)),
    "budgets": cfg_lib.tuple_of(cfg_lib.number(lo=0, lo_open=True), min_len=2),
    **cfg_lib.optimizer_rules("optim."),
    "optim.schedule": cfg_lib.one_of("cosine", "constant"),
    "optim.final_lr_fraction": cfg_lib.number(lo=0, hi=1),
    "ema_decay": cfg_lib.number(lo=0, hi=1, hi_open=True),  # 0 disables the EMA
    "eps": cfg_lib.number(lo=0, hi=1, lo_open=True, hi_open=True),
    "process.t_min": cfg_lib.number(lo=0, hi=1, lo_open=True, hi_open=True),
    "process.alpha0": cfg_lib.number(lo=0, hi=1, lo_open=True),
    "process.p_uniform": cfg_lib.number(lo=0, hi=1, hi_open=True),
    "process.gidd_max_weight": cfg_lib.number(lo=0, lo_open=True),
    "process.gidd_weighting": cfg_lib.one_of("clip", "dynamic"),
    "eval_windows": cfg_lib.integer(lo=1),
    "eval_reps": cfg_lib.integer(lo=1),
    "final_eval_windows": cfg_lib.integer(lo=1),
    "final_eval_reps": cfg_lib.integer(lo=1),
    "sampling.steps": cfg_lib.tuple_of(cfg_lib.integer(lo=1)),
    "sampling.batches": cfg_lib.integer(lo=1),
    "sampling.alpha0": cfg_lib.number(lo=0, hi=1, lo_open=True),
    # the evaluator: an LM config's model and training fields (experiments/configs/lm.py)
    **lm.model_rules("evaluator.model.", names=tuple(base().evaluator.model)),
    **cfg_lib.training_rules("evaluator."),
    "log_every": cfg_lib.integer(lo=1),
    "bootstrap_samples": cfg_lib.integer(lo=1),
}


def check_sizes(config: ml_collections.ConfigDict) -> None:
    """``reference_size`` indexes ``sizes``.

    Raises:
      ValueError: naming the fields.
    """
    if config.reference_size >= len(config.sizes):
        raise ValueError(f"config fields reference_size={config.reference_size} and sizes (len "
                         f"{len(config.sizes)}): expected reference_size < len(sizes)")


def check_backbone(config: ml_collections.ConfigDict) -> None:
    """Builds each family's ``FamilySpec`` (:func:`algorithms.diffusion_lm.grid.family_spec`) and
    the ``TransformerConfig`` of every size with the ``backbone`` fields, as the runs do, so that
    the library's own checks apply (e.g. an even head dimension d_model / num_heads for RoPE, a
    ``model_parallelism`` that divides the heads and MLP width).

    Raises:
      ValueError: one line naming the refused fields' paths (:func:`core.config.check_built`).
    """
    spec_fields = {"eps": ("eps", config.eps), "sampling_alpha0": ("sampling.alpha0",
                                                                    config.sampling.alpha0),
                   **{n: (f"process.{n}", v) for n, v in config.process.items()}}
    specs = [cfg_lib.check_built(lambda f=f: grid.family_spec(config, f), spec_fields, "FamilySpec")
             for f in config.families]
    backbone = {**config.backbone.to_dict(), "dtype": jnp.dtype(config.backbone.dtype)}
    for i, size in enumerate(config.sizes):
        fields = {n: (f"sizes[{i}]", size) for n in ("d_model", "num_layers", "num_heads")}
        fields.update({n: (f"backbone.{n}", v) for n, v in config.backbone.items()})
        fields.update(max_len=("seq_len", config.seq_len),
                      model_parallelism=("model_parallelism", config.model_parallelism))
        for spec in specs:
            cfg_lib.check_built(
                lambda spec=spec, size=size: transformer_config(
                    spec, config.seq_len, d_model=size[0], num_layers=size[1], num_heads=size[2],
                    **backbone).check_model_parallelism(config.model_parallelism),
                fields, "TransformerConfig", derived={"head_dim": ("d_model", "num_heads")})


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
    """The headline compares AR, MDLM and Duo, so ``families`` includes them.

    Raises:
      ValueError: one of ``"ar"``, ``"mdlm"``, ``"duo"`` not in ``families``.
    """
    missing = [f for f in ("ar", "mdlm", "duo") if f not in config.families]
    if missing:
        raise ValueError(f"config field families = {config.families!r}: expected it to include "
                         f"{missing} (the claim orders AR < masked < uniform-state)")


def check_evaluator(config: ml_collections.ConfigDict) -> None:
    """The evaluator scores samples of ``seq_len`` tokens and trains on ``evaluator.seq_len``
    windows, both within its ``evaluator.model.max_len``; its model is one that ``TransformerConfig``
    accepts (:func:`experiments.configs.lm.check_model`).

    Raises:
      ValueError: naming the fields.
    """
    ev = config.evaluator
    for field, n in (("seq_len", config.seq_len), ("evaluator.seq_len", ev.seq_len)):
        if n > ev.model.max_len:
            raise ValueError(f"config fields {field}={n} and evaluator.model.max_len="
                             f"{ev.model.max_len}: expected {field} <= evaluator.model.max_len")
    lm.check_model(evaluator.evaluator_config(config), prefix="evaluator.")


CROSS_CHECKS = (check_sizes, check_backbone, check_windows, check_families, check_evaluator)


FIELD_HELP = {
    "data_path": "the text to train on: a text file, or comma-separated files / folders of *.txt; "
                 "'' = the bundled Shakespeare plays",
}


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    return cfg_lib.build(arg, base, VARIANTS)
