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

import dataclasses
from typing import Annotated, Literal

import jax.numpy as jnp
import ml_collections

from algorithms.diffusion_lm import grid
from algorithms.diffusion_lm.families import FAMILIES, transformer_config
from core import config as cfg_lib
from core import report
from experiments.configs import lm


@dataclasses.dataclass(frozen=True)
class Backbone:
    """Backbone kernels (TransformerConfig fields): compute dtype (parameters and optimizer state
    stay float32), full-sequence attention implementation, per-block rematerialisation."""

    dtype: lm.Dtype = "float32"
    attention: lm.Attention = "reference"
    attention_block: int = 512
    remat: lm.Remat = "none"


@dataclasses.dataclass(frozen=True)
class Optim(lm.Optimizer):
    """AdamW, linear warmup, then (schedule "cosine") a cosine decay to final_lr_fraction of the
    peak at each run's last step: one run per (size, budget), as Chinchilla's Approach 2 and the
    paper; or ("constant") no decay: one run per size read at every budget (cheaper)."""

    schedule: Literal["cosine", "constant"] = "cosine"
    final_lr_fraction: cfg_lib.Fraction = 0.1


@dataclasses.dataclass(frozen=True)
class Process:
    """FamilySpec fields: t_min (times ~ U[t_min, 1] in every NELBO estimate), the training alpha0
    of the Eso-LM ablation esolm_nelbo (esolm trains at 1; sampling.alpha0 is the one used at
    sampling), GIDD's uniform share p_uniform, its training weights gidd_weighting ("dynamic":
    the authors' default; "clip": the ELBO weights capped) and their cap."""

    t_min: cfg_lib.OpenFraction = 1e-3
    alpha0: Annotated[float, cfg_lib.Range(0, 1, lo_open=True)] = 0.5
    p_uniform: Annotated[float, cfg_lib.Range(0, 1, hi_open=True)] = 0.1
    gidd_max_weight: cfg_lib.Positive = 2.0
    gidd_weighting: Literal["clip", "dynamic"] = "dynamic"


@dataclasses.dataclass(frozen=True)
class Sampling:
    steps: tuple[cfg_lib.Count, ...] = (8, 32)  # of the diffusion families (AR: seq_len)
    # batches of batch_size samples per setting (generative perplexity's interval)
    batches: cfg_lib.Count = 4
    # Eso-LM's clean fraction at sampling (diffusion, then AR)
    alpha0: Annotated[float, cfg_lib.Range(0, 1, lo_open=True)] = 0.5


@dataclasses.dataclass(frozen=True)
class Config:
    seed: cfg_lib.NonNegInt = 0
    # The text to train and evaluate on: a text file, or comma-separated files / folders of
    # them; empty = the bundled Shakespeare plays (held-out plays are the validation split).
    data_path: cfg_lib.Paths = ""
    val_fraction: cfg_lib.OpenFraction = 0.1
    seq_len: Annotated[int, cfg_lib.Range(2)] = 64
    batch_size: cfg_lib.Count = 16
    # Model sizes of the IsoFLOP grid: (d_model, num_layers, num_heads), each checked by
    # TransformerConfig; the IsoFLOP fit needs >= 3 sizes.
    sizes: Annotated[tuple[tuple[int, int, int], ...], cfg_lib.Items(3)] = (
        (16, 2, 1), (24, 2, 2), (32, 2, 2), (48, 2, 3))
    # index into sizes: the size of the per-family comparison and sampling
    reference_size: cfg_lib.NonNegInt = 2
    # The per-family comparison's size (d_model, num_layers, num_heads) when it is not one of
    # sizes ((): sizes[reference_size]), and its training FLOPs (0: the largest budget). Every
    # family trains there for the same steps; outside the grid each family has its own run.
    reference: Annotated[tuple[cfg_lib.Count, ...], cfg_lib.Items(0, 3)] = ()
    reference_budget: cfg_lib.NonNegative = 0.0
    backbone: Backbone = Backbone()
    model_parallelism: cfg_lib.Count = 1  # size of the mesh's model axis (tensor parallelism)
    # "fsdp": FSDP over data + TP over model; "replicated"
    param_sharding: Literal["fsdp", "replicated"] = "fsdp"
    isoflop_families: tuple[Literal[FAMILIES], ...] = ("ar", "mdlm", "mdlm_ce", "duo")
    families: tuple[Literal[FAMILIES], ...] = (
        "ar", "mdlm", "mdlm_ce", "duo", "esolm", "esolm_nelbo", "gidd")
    # training FLOPs, C = 3 * F_fwd * tokens
    budgets: Annotated[tuple[cfg_lib.Positive, ...], cfg_lib.Items(2)] = (1e10, 2e10, 4e10)
    optim: Optim = Optim(warmup_steps=20, weight_decay=0.0)
    # 0 disables the parameter EMA
    ema_decay: Annotated[float, cfg_lib.Range(0, 1, hi_open=True)] = 0.0
    eps: cfg_lib.OpenFraction = 1e-3  # schedule floor alpha_1 = eps
    process: Process = Process()
    # Held-out evaluation: every model on the same windows with the same time / mask draws
    # (paired). The IsoFLOP cells (fits and the CE/NELBO ratio) use eval_reps draws per window;
    # the per-family comparison final_eval_reps.
    eval_windows: cfg_lib.Count = 128  # per IsoFLOP evaluation (a multiple of batch_size)
    eval_reps: cfg_lib.Count = 8  # time / mask draws per window at each IsoFLOP evaluation
    final_eval_windows: cfg_lib.Count = 128
    final_eval_reps: cfg_lib.Count = 16
    sampling: Sampling = Sampling()
    # The generative-perplexity evaluator: a larger causal LM trained once on the same split
    # (algorithms.lm.training fields); it scores every family's samples.
    evaluator: lm.Training = lm.Training(
        model=lm.TransformerFields(d_model=96, num_layers=3, num_heads=4, num_kv_heads=2,
                                   max_len=64, mlp_dim=0),
        seq_len=64, batch_size=32, steps=400, learning_rate=3e-3, warmup_steps=40,
        weight_decay=0.1, grad_clip=1.0, log_every=50, checkpoint_every=200)
    log_every: cfg_lib.Count = 25
    bootstrap_samples: cfg_lib.Count = 500
    claim: report.Claim = report.Claim(
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

    def __post_init__(self):
        if self.reference_size >= len(self.sizes):
            raise cfg_lib.FieldError("expected reference_size < len(sizes)",
                                     reference_size=self.reference_size, sizes=self.sizes)
        if len(self.reference) not in (0, 3):
            raise cfg_lib.FieldError("expected () or (d_model, num_layers, num_heads)",
                                     reference=self.reference)
        check_backbone(self)
        for field in ("eval_windows", "final_eval_windows"):
            if getattr(self, field) % self.batch_size:  # evaluation runs whole batches
                raise cfg_lib.FieldError(f"expected {field} to be a multiple of batch_size",
                                         **{field: getattr(self, field)},
                                         batch_size=self.batch_size)
        missing = [f for f in ("ar", "mdlm", "duo") if f not in self.families]
        if missing:
            raise cfg_lib.FieldError(f"expected it to include {missing} (the claim orders AR < "
                                     "masked < uniform-state)", families=self.families)
        # the evaluator scores samples of seq_len tokens
        if self.seq_len > self.evaluator.model.max_len:
            raise cfg_lib.FieldError("expected seq_len <= evaluator.model.max_len",
                                     seq_len=self.seq_len,
                                     **{"evaluator.model.max_len": self.evaluator.model.max_len})
        lm.check_model(self.evaluator.model, self.model_parallelism, prefix="evaluator.")


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
    # CPU, about 25 minutes idle (42 min of CPU time): decides the claim where tiny cannot. At tiny's budgets (1e10-4e10
    # FLOPs) every model sits at the unigram level and the smallest size learns that fastest
    # (MDLM at 1e10: 4.85 bits/byte at d_model 4, 4.90 at 16, unigram 4.89), so no grid brackets
    # an optimum there. Here the MDLM objectives' grid spends 5e10-2e11 FLOPs on one-layer
    # models of 5k-53k parameters, where the optimum moves from about d_model 16 to 32 (MDLM at
    # 2e11: 4.33 / 4.20 / 4.31 at d_model 24 / 32 / 48); every family is then compared at a
    # larger model (2 layers, d_model 64: 134k parameters, Duo and GIDD 200k) trained for
    # 3.2e12 FLOPs (3,909 steps), below the bigram level for every family (at 1.6e12 Duo sat at
    # it), on 1024 held-out windows; the evaluator trains 5x longer than tiny's so that it stays
    # ahead of the AR model it scores.
    "small": {
        "sizes": ((8, 1, 1), (12, 1, 1), (16, 1, 1), (24, 1, 2), (32, 1, 2), (48, 1, 3)),
        "reference_size": 4, "reference": (64, 2, 4), "reference_budget": 3.2e12,
        "isoflop_families": ("mdlm", "mdlm_ce"), "budgets": (5e10, 1e11, 2e11),
        "optim.warmup_steps": 50, "eval_windows": 256, "eval_reps": 8,
        "final_eval_windows": 1024, "final_eval_reps": 8, "log_every": 50,
        "bootstrap_samples": 1000, "evaluator.steps": 2000, "evaluator.checkpoint_every": 500,
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


def check_backbone(config: "Config") -> None:
    """Builds each family's ``FamilySpec`` (:func:`algorithms.diffusion_lm.grid.family_spec`) and
    the ``TransformerConfig`` of every size with the ``backbone`` fields, as the runs do, so that
    the library's own checks apply (e.g. an even head dimension d_model / num_heads for RoPE, a
    ``model_parallelism`` that divides the heads and MLP width).

    Raises:
      ValueError: one line naming the refused fields' paths (:func:`core.config.check_built`).
    """
    config = ml_collections.ConfigDict(dataclasses.asdict(config))  # the library reads a config
    spec_fields = {"eps": ("eps", config.eps), "sampling_alpha0": ("sampling.alpha0",
                                                                    config.sampling.alpha0),
                   **{n: (f"process.{n}", v) for n, v in config.process.items()}}
    specs = [cfg_lib.check_built(lambda f=f: grid.family_spec(config, f), spec_fields, "FamilySpec")
             for f in config.families]
    backbone = {**config.backbone.to_dict(), "dtype": jnp.dtype(config.backbone.dtype)}
    named = [(f"sizes[{i}]", size) for i, size in enumerate(config.sizes)]
    if config.reference:
        named.append(("reference", tuple(config.reference)))
    for path, size in named:
        fields = {n: (path, size) for n in ("d_model", "num_layers", "num_heads")}
        fields.update({n: (f"backbone.{n}", v) for n, v in config.backbone.items()})
        fields.update(max_len=("seq_len", config.seq_len),
                      model_parallelism=("model_parallelism", config.model_parallelism))
        for spec in specs:
            cfg_lib.check_built(
                lambda spec=spec, size=size: transformer_config(
                    spec, config.seq_len, d_model=size[0], num_layers=size[1], num_heads=size[2],
                    **backbone).check_model_parallelism(config.model_parallelism),
                fields, "TransformerConfig", derived={"head_dim": ("d_model", "num_heads")})


FIELD_HELP = {
    "data_path": "the text to train on: a text file, or comma-separated files / folders of *.txt; "
                 "'' = the bundled Shakespeare plays",
}


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    return cfg_lib.build(arg, Config, VARIANTS)
