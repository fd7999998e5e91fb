"""IsoCompute allocation of RL rollouts: GRPO on verifiable arithmetic, n x B_p x M sweeps.

    python -m experiments.rl_scaling --config=experiments/configs/rl_scaling.py:tiny --workdir=workdir
    python -m experiments.rl_scaling --config=experiments/configs/rl_scaling.py:full --workdir=workdir
    python -m experiments.rl_scaling --config=experiments/configs/rl_scaling.py:paper --workdir=DIR  # accelerator

``tiny`` is the reduced sweep run by the main job (4 budgets x n in {2,4,8,16} x B_p in {4,8} x 3
seeds x 3 rollout streams); ``full`` is the whole CPU sweep (7 budgets, C = 64..4096, n up to 32,
B_p up to 16, 4 seeds x 3 streams); ``smoke``
runs every code path in seconds with meaningless numbers:

    python -m experiments.rl_scaling --config=experiments/configs/rl_scaling.py:smoke --workdir=workdir

GRPO loss in every variant (``tiny``, ``smoke``, ``full``, ``paper``): PPO-clip with eps = 0.2 /
eps_high = 0.28, two inner steps, rollouts sampled at temperature 1 (the loss's log-probs are always
taken at the sampling temperature), and no KL penalty (``kl_beta = 0``); a run that sets
``kl_beta > 0`` gets ``kl_estimator = "k3_ratio"``, the importance-weighted k3 whose expected
gradient is that of KL(pi || pi_ref) (DeepSeek-V3.2, arXiv:2512.02556, Eq. 7), unless it selects
``"k2"`` (the same gradient on-policy only) or ``"k3"`` (Schulman 2020, "Approximating KL
divergence": expected gradient that of KL(pi_ref || pi)); see ``algorithms/rl_scaling/grpo.py``.
"""

import ml_collections

from core import config as cfg_lib
from core import report
from models.transformer import COMPUTE_DTYPES, REMAT_POLICIES


def base() -> ml_collections.ConfigDict:
    c = ml_collections.ConfigDict()
    c.seed = 0
    # Tasks: sums of `terms` numbers of `digits` digits (answer reversed, exact-match reward).
    c.easy = ml_collections.ConfigDict(dict(terms=2, digits=2))
    c.hard = ml_collections.ConfigDict(dict(terms=3, digits=2))
    c.num_train = 4000  # training problems per split
    c.num_heldout = 256  # held-out problems per split
    # The policy; dtype is the compute dtype (parameters and optimizer state stay float32), remat
    # the per-block rematerialisation of the GRPO backward pass (models.transformer.REMAT_POLICIES).
    c.model = ml_collections.ConfigDict(dict(d_model=128, num_layers=3, num_heads=4, mlp_dim=256,
                                             dtype="float32", remat="none"))
    # Supervised warm start in two stages that end on exact pass@1 of `probe_problems` training
    # problems, checked every `check_every` steps: easy sums alone until easy >= `easy_target`
    # (a small model leaves its loss plateau much sooner on them, after a number of steps that
    # depends on the batch order), then a mixture with `hard_fraction` hard sums until
    # hard >= `hard_target`. Caps: `max_easy_steps` for the first stage, `max_steps` in all.
    c.warmup = ml_collections.ConfigDict(dict(
        batch_size=64, learning_rate=3e-3, warmup_steps=30, hard_fraction=0.35,
        easy_target=0.5, hard_target=0.02, check_every=50, probe_problems=256,
        max_easy_steps=2500, max_steps=4500))
    # GRPO.
    c.advantage = "grpo"  # or "drgrpo"
    c.aggregation = "seq_mean"  # "token_mean", "constant"
    c.clip_eps = 0.2
    c.clip_eps_high = 0.28
    c.kl_beta = 0.0  # no KL penalty in any variant
    # Estimator of the KL penalty when kl_beta > 0: "k3_ratio" (rho * k3, gradient of
    # KL(pi || pi_ref) on- and off-policy), "k2" (that gradient on-policy only) or "k3" (gradient
    # of KL(pi_ref || pi)); algorithms.rl_scaling.grpo.KL_ESTIMATORS.
    c.kl_estimator = "k3_ratio"
    c.inner_steps = 2
    c.learning_rate = 3e-4  # constant: a run at budget C is the prefix of the run at 2C
    c.grad_clip = 1.0
    c.temperature = 1.0  # rollout sampling temperature; every log-prob of the loss is taken at it
    c.hard_fraction_rl = 0.5  # share of hard problems in the RL training pool
    # Sweep: budgets C (rollouts) on a log2 grid, n and B_p grids, and the replicate runs of each
    # (n, B_p): seeds (orders of the training problems) x rollout streams (the rollouts'
    # randomness within a seed; what another CPU's rounding amounts to, docs/rl_scaling.md). The
    # intervals bootstrap over both. `paper` keeps one stream per seed: the lanes of its compiled
    # step (and its memory in AOT.md) are those of 4 seeds.
    c.smallest_budget = 64
    c.num_budgets = 4
    c.ns = (2, 4, 8, 16)
    c.problems_per_batch = (4, 8)
    c.num_seeds = 3
    c.num_streams = 2
    c.pass_k = 8  # k of pass@k / coverage on the hard split
    c.cosine_problems = 8  # problems in the per-problem gradient-cosine probe (0 = skip)
    c.sampled_eval = 16  # samples per held-out problem for the unbiased pass@k check (0 = skip)
    c.num_boot = 200  # bootstrap replicates of n* per budget
    c.fit_boot = 100  # bootstrap replicates of the power-law vs sigmoid comparison (0 = skip)
    c.claim = report.claim_config(
        method="IsoCompute Playbook (GRPO allocation)",
        statement="compute-optimal rollouts per problem n* grows with budget C, then saturates "
                  "(easy and hard)",
        # n* grows: the slope's 90% interval (bootstrap over seeds and streams) lies above 0.
        checks=("n_star_slope.easy.lo > 0", "n_star_slope.hard.lo > 0",
                "sigmoid_decisive.easy == 1"),
        ours="n* grows x{n_star_growth[easy]:.2f} (easy), x{n_star_growth[hard]:.2f} (hard) over "
             "the budgets; slope of log2 n* in log2 C [90% CI]: {n_star_slope_text}; fit: "
             "{fit_winner[easy]}/{fit_winner[hard]}",
        # Sized to decide: each split's slope interval lies wholly on one side of 0.
        resolved=("n_star_slope.easy.excludes_zero == 1", "n_star_slope.hard.excludes_zero == 1"))
    return c


VARIANTS = {
    "tiny": {},
    # A few seconds; runs every code path of run() (warm start, sweep, fits, probes, plots, report).
    # Its numbers mean nothing.
    "smoke": {
        "easy.digits": 1, "hard.digits": 1, "num_train": 64, "num_heldout": 16,
        "model.d_model": 32, "model.num_layers": 1, "model.num_heads": 2, "model.mlp_dim": 64,
        "warmup.max_easy_steps": 4, "warmup.max_steps": 8, "warmup.batch_size": 16,
        "warmup.warmup_steps": 2, "warmup.check_every": 2, "warmup.probe_problems": 16,
        "smallest_budget": 16, "num_budgets": 3, "ns": (2, 4, 8),
        "problems_per_batch": (2,), "num_seeds": 2, "num_streams": 2, "pass_k": 2,
        "sampled_eval": 2, "cosine_problems": 2, "num_boot": 10, "fit_boot": 4,
    },
    "full": {"num_budgets": 7, "ns": (2, 4, 8, 16, 32), "problems_per_batch": (4, 8, 16),
             "num_seeds": 4, "num_streams": 3},
    "paper": {
        "model.d_model": 512, "model.num_layers": 8, "model.num_heads": 8, "model.mlp_dim": 1536,
        "model.dtype": "bfloat16", "model.remat": "full",
        "easy.digits": 3, "hard.terms": 3, "hard.digits": 3, "num_train": 50_000,
        "num_heldout": 1024, "warmup.max_easy_steps": 10_000, "warmup.max_steps": 20_000,
        "warmup.batch_size": 256, "warmup.probe_problems": 1024,
        "smallest_budget": 1024, "num_budgets": 7, "ns": (2, 4, 8, 16, 32, 64, 128),
        "problems_per_batch": (8, 32, 64), "num_seeds": 4, "num_streams": 1, "pass_k": 32,
        "sampled_eval": 64,
        "cosine_problems": 32, "learning_rate": 1e-4,
    },
}


_POSITIVE = cfg_lib.number(lo=0, lo_open=True)
_FRACTION = cfg_lib.number(lo=0, hi=1)
_TARGET = cfg_lib.number(lo=0, hi=1, lo_open=True)

# What each field accepts (checked once every override is in, before any work).
RULES = {
    "seed": cfg_lib.integer(lo=0),
    "easy.terms": cfg_lib.integer(lo=2),
    "easy.digits": cfg_lib.integer(lo=1),
    "hard.terms": cfg_lib.integer(lo=2),
    "hard.digits": cfg_lib.integer(lo=1),
    "num_train": cfg_lib.integer(lo=1),
    "num_heldout": cfg_lib.integer(lo=1),
    "model.d_model": cfg_lib.integer(lo=1),
    "model.num_layers": cfg_lib.integer(lo=1),
    "model.num_heads": cfg_lib.integer(lo=1),
    "model.mlp_dim": cfg_lib.integer(lo=1),
    "model.dtype": cfg_lib.one_of(*COMPUTE_DTYPES),
    "model.remat": cfg_lib.one_of(*REMAT_POLICIES),
    "warmup.batch_size": cfg_lib.integer(lo=1),
    "warmup.learning_rate": _POSITIVE,
    "warmup.warmup_steps": cfg_lib.integer(lo=0),
    "warmup.hard_fraction": _FRACTION,
    "warmup.easy_target": _TARGET,
    "warmup.hard_target": _TARGET,
    "warmup.check_every": cfg_lib.integer(lo=1),
    "warmup.probe_problems": cfg_lib.integer(lo=1),
    "warmup.max_easy_steps": cfg_lib.integer(lo=1),
    "warmup.max_steps": cfg_lib.integer(lo=2),
    "advantage": cfg_lib.one_of("grpo", "drgrpo"),
    "aggregation": cfg_lib.one_of("seq_mean", "token_mean", "constant"),
    "clip_eps": _POSITIVE,
    "clip_eps_high": _POSITIVE,
    "kl_beta": cfg_lib.number(lo=0),
    "kl_estimator": cfg_lib.one_of("k3_ratio", "k2", "k3"),
    "inner_steps": cfg_lib.integer(lo=1),
    "learning_rate": _POSITIVE,
    "grad_clip": _POSITIVE,
    "temperature": _POSITIVE,
    "hard_fraction_rl": _FRACTION,
    "smallest_budget": cfg_lib.integer(lo=1),
    "num_budgets": cfg_lib.integer(lo=3),  # the n*(C) fit needs >= 3 budgets
    "ns": cfg_lib.tuple_of(cfg_lib.integer(lo=1), min_len=3),  # the parabola for n* needs 3
    "problems_per_batch": cfg_lib.tuple_of(cfg_lib.integer(lo=1)),
    "num_seeds": cfg_lib.integer(lo=2),  # intervals need >= 2
    "num_streams": cfg_lib.integer(lo=1),
    "pass_k": cfg_lib.integer(lo=1),
    "cosine_problems": cfg_lib.integer(lo=0),  # 0 = skip
    "sampled_eval": cfg_lib.integer(lo=0),  # 0 = skip
    "num_boot": cfg_lib.integer(lo=1),
    "fit_boot": cfg_lib.integer(lo=0),  # 0 = skip
}


def check_model(config: ml_collections.ConfigDict) -> None:
    """The policy's head dimension d_model / num_heads is an even integer (RoPE rotates pairs).

    Raises:
      ValueError: naming the fields.
    """
    m = config.model
    if m.d_model % m.num_heads or (m.d_model // m.num_heads) % 2:
        raise ValueError(f"config fields model.d_model={m.d_model} and model.num_heads="
                         f"{m.num_heads}: expected d_model / num_heads to be an even integer")


def check_warm_start(config: ml_collections.ConfigDict) -> None:
    """The first warm-start stage ends before the cap on both, and the probe draws training
    problems.

    Raises:
      ValueError: naming the fields.
    """
    w = config.warmup
    if w.max_easy_steps >= w.max_steps:
        raise ValueError(f"config fields warmup.max_easy_steps={w.max_easy_steps} and "
                         f"warmup.max_steps={w.max_steps}: expected max_easy_steps < max_steps")
    if w.probe_problems > config.num_train:
        raise ValueError(f"config fields warmup.probe_problems={w.probe_problems} and num_train="
                         f"{config.num_train}: expected probe_problems <= num_train")


def check_sweep(config: ml_collections.ConfigDict) -> None:
    """GRPO's group normalisation needs n >= 2; a batch of n x B_p rollouts draws distinct
    training problems; the unbiased pass@k needs k <= the samples per problem.

    Raises:
      ValueError: naming the fields.
    """
    if config.advantage == "grpo" and min(config.ns) < 2:
        raise ValueError(f"config fields ns={config.ns} and advantage='grpo': expected every n "
                         ">= 2 (group-normalised advantages)")
    worst = max(config.ns) * max(config.problems_per_batch)
    if worst > config.num_train:
        raise ValueError(f"config fields ns, problems_per_batch and num_train={config.num_train}: "
                         f"expected n * B_p <= num_train, got up to {worst}")
    if config.sampled_eval and config.pass_k > config.sampled_eval:
        raise ValueError(f"config fields pass_k={config.pass_k} and sampled_eval="
                         f"{config.sampled_eval}: expected pass_k <= sampled_eval (k <= n)")


CROSS_CHECKS = (check_model, check_warm_start, check_sweep)


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    return cfg_lib.build(arg, base, VARIANTS)
