"""Judge-aware Bradley-Terry-Luce ranking: simulation, interval coverage, choix check, speed, LLMFAO.

    python -m experiments.judge_btl --config=experiments/configs/judge_btl.py:tiny --workdir=workdir
    python -m experiments.judge_btl --config=experiments/configs/judge_btl.py:paper --workdir=workdir
    # another comparisons file (CSV, JSON lines or a JSON array) with its own column names:
    python -m experiments.judge_btl --config=experiments/configs/judge_btl.py:tiny \
        --config.data_path=my_votes.jsonl --config.columns.judge=annotator \
        --config.columns.outcome=label --config.columns.left_value=A --config.columns.right_value=B

    # the LLMFAO crowd-sourced comparisons, by name (downloaded once into the cache folder):
    python -m experiments.judge_btl --config=experiments/configs/judge_btl.py:tiny \
        --config.data=llmfao --workdir=workdir

Comparisons are read from ``data_path`` when it is set, or from the public data set named by
``data`` (``llmfao``: downloaded on first use into ``data_dir``, default
``$XDG_CACHE_HOME/icml26-jax`` or ``~/.cache/icml26-jax``; :mod:`core.data.download`; offline
the run stops with one line naming the URL and where to place the file by hand). By default both
are empty: the simulation parts run alone and the held-out numbers come from the simulation; a
path that is set must name an existing file, or the run stops with an error naming it. ``tiny``
sets ``benchmark.data=llmfao``: with neither field set, LLMFAO is fitted beside the studies when
its file is cached or its download starts within ``benchmark.timeout`` seconds; otherwise the
report says it was not measured and how to get the file. With a file, ``data_only`` (default
True) fits that file alone; ``--config.data_only=False`` runs the simulation, coverage, choix and
timing studies as well. A file whose columns have other names is read with
``--config.columns.left=... --config.columns.right=... --config.columns.judge=...
--config.columns.outcome=...``; a missing column's error names the one to set. The file is read and validated before
any other work; rows whose outcome is none of the configured values stop the run unless
``--config.drop_unknown_outcomes`` (then they are dropped and counted).
"""

import ml_collections

from core import config as cfg_lib
from core import report


def base() -> ml_collections.ConfigDict:
    c = ml_collections.ConfigDict()
    c.seed = 0
    c.level = 0.95
    c.rank_draws = 4000
    # Real data: a CSV, JSON-lines or JSON-array file of pairwise judgements.
    c.data_path = ""            # "" = no real data (simulation only); a set path must exist
    c.data = ""                 # or a public data set by name: "llmfao" (core.data.download)
    c.data_dir = ""             # cache of downloaded data sets; "" = $XDG_CACHE_HOME/icml26-jax
    # With neither data_path nor data: the data set `benchmark.data` is fitted beside the studies
    # when cached or downloadable within `benchmark.timeout` s, else "not measured here".
    c.benchmark = ml_collections.ConfigDict(dict(data="", timeout=10.0))
    c.data_name = ""            # label in reports and metrics; "" = the file name without extension
    c.drop_unknown_outcomes = False  # drop (and count) rows whose outcome is none of the *_value
    # With a data_path: fit the user's comparisons only (True) or also run the simulation,
    # coverage, choix and timing studies (False). Without a data_path the studies always run.
    c.data_only = True
    c.columns = ml_collections.ConfigDict(dict(
        left="left", right="right", judge="worker", outcome="winner",
        left_value="left", right_value="right", tie_value="tie"))
    c.heldout_fraction = 0.2
    c.num_splits = 1            # random train/held-out splits of the real data
    c.cv_folds = 3              # folds of the ridge cross-validation inside each training split
    c.ridge_grid = (1.0, 3.0, 10.0)   # weights of the Gaussian prior on log-discriminations
    c.bootstrap_samples = 0     # multinomial bootstrap replicates for the real-data leaderboard
    # Simulation with known truth.
    c.sim = ml_collections.ConfigDict(dict(
        num_models=20, num_reliable=4, num_noisy=5, reliable_gamma=2.5, noisy_gamma=0.25,
        adversarial_gamma=0.05, score_spread=1.5, num_comparisons=20_000,
        num_replicates=20))  # data sets of the replicate recovery study (this panel and equal judges)
    # Coverage of the 95% intervals over many simulated data sets of one fixed design.
    c.coverage = ml_collections.ConfigDict(dict(num_datasets=200, num_models=8, num_judges=5,
                                                per_cell=6))
    # Agreement with choix (plain BTL, judge-free data).
    c.choix = ml_collections.ConfigDict(dict(num_models=30, num_comparisons=20_000))
    # Speed at the scale; choix estimators timed on the same comparisons.
    c.timing = ml_collections.ConfigDict(dict(num_models=100, num_judges=20,
                                              num_comparisons=1_000_000, choix_estimators=("ilsr",),
                                              repeats=2))  # best of, fit and choix alternating
    c.claim = report.claim_config(
        method="Judge-aware BTL ranking",
        statement="judge discriminations improve on plain BTL; MLE asymptotically normal, "
                  "calibrated score/rank intervals",
        checks=("headline.ci_coverage >= 0.93", "headline.ci_coverage <= 0.97",
                "headline.choix_max_abs_diff <= 1e-6", "headline.speedup_vs_choix >= 10",
                "headline.heldout_loglik_judge_aware > headline.heldout_loglik_btl",
                "sim_rmse_judge_aware < sim_rmse_btl"),
        # coverage, choix, speed-up and simulation checks are "not measured here" in a data-only
        # run; the summary says what was measured (experiments.judge_btl._summary)
        ours="{summary}",
        # Sized to decide: the coverage's Monte Carlo standard error is at most half the
        # distance from 0.95 to either end of the [0.93, 0.97] band (left out in a data-only run).
        resolved=("coverage.scores_mc_se <= 0.01",))
    return c


VARIANTS = {
    "tiny": {"benchmark.data": "llmfao"},
    # seconds: executes every code path (tests and notebook smoke runs); numbers are meaningless
    "smoke": {"rank_draws": 200, "cv_folds": 2, "ridge_grid": (1.0, 3.0), "data_path": "",
              "sim.num_models": 8, "sim.num_reliable": 2, "sim.num_noisy": 2,
              "sim.num_comparisons": 2000, "sim.num_replicates": 2, "coverage.num_datasets": 8,
              "coverage.num_models": 4,
              "coverage.num_judges": 3, "choix.num_models": 6, "choix.num_comparisons": 500,
              "timing.num_models": 10, "timing.num_judges": 3, "timing.num_comparisons": 5000},
    "paper": {
        "num_splits": 5, "cv_folds": 5, "ridge_grid": (0.1, 0.3, 1.0, 2.0, 3.0, 5.0, 10.0, 30.0),
        "bootstrap_samples": 200, "rank_draws": 20_000,
        "sim.num_comparisons": 200_000, "coverage.num_datasets": 1000,
        "timing.choix_estimators": ("ilsr", "mm", "opt"), "timing.repeats": 1,
        "sim.num_replicates": 100,
    },
}


_COUNT = cfg_lib.integer(lo=1)
_MODELS = cfg_lib.integer(lo=2)  # a ranking needs two models
_NAME = cfg_lib.string(nonempty=True)

# What each field accepts (checked once every override is in, before any work).
RULES = {
    "seed": cfg_lib.integer(lo=0),
    "level": cfg_lib.number(lo=0, hi=1, lo_open=True, hi_open=True),
    "rank_draws": _COUNT,
    "data_path": cfg_lib.path_or_empty(),
    "data": cfg_lib.dataset_names("llmfao"),
    "data_dir": cfg_lib.string(),
    "benchmark.data": cfg_lib.dataset_names("llmfao"),
    "benchmark.timeout": cfg_lib.number(lo=0, lo_open=True),
    "data_name": cfg_lib.string(),
    "drop_unknown_outcomes": cfg_lib.boolean(),
    "data_only": cfg_lib.boolean(),
    "columns.left": _NAME,
    "columns.right": _NAME,
    "columns.judge": _NAME,
    "columns.outcome": _NAME,
    "columns.left_value": _NAME,
    "columns.right_value": _NAME,
    "columns.tie_value": _NAME,
    # both parts must hold comparisons: a fraction strictly inside (0, 1)
    "heldout_fraction": cfg_lib.number(lo=0, hi=1, lo_open=True, hi_open=True),
    "num_splits": _COUNT,
    "cv_folds": cfg_lib.integer(lo=2),  # each fold is held out once, the rest fit
    "ridge_grid": cfg_lib.tuple_of(cfg_lib.number(lo=0)),  # 0 = no prior (MLE)
    "bootstrap_samples": cfg_lib.integer(lo=0),  # 0 = no bootstrap
    "sim.num_models": _MODELS,
    "sim.num_reliable": cfg_lib.integer(lo=0),
    "sim.num_noisy": cfg_lib.integer(lo=0),
    "sim.reliable_gamma": cfg_lib.number(lo=0, lo_open=True),
    "sim.noisy_gamma": cfg_lib.number(lo=0, lo_open=True),
    "sim.adversarial_gamma": cfg_lib.number(),  # any sign: an adversarial judge may invert
    "sim.score_spread": cfg_lib.number(lo=0, lo_open=True),
    "sim.num_comparisons": _COUNT,
    "sim.num_replicates": _COUNT,
    "coverage.num_datasets": _COUNT,
    "coverage.num_models": _MODELS,
    "coverage.num_judges": _COUNT,
    "coverage.per_cell": _COUNT,
    "choix.num_models": _MODELS,
    "choix.num_comparisons": _COUNT,
    "timing.num_models": _MODELS,
    "timing.num_judges": _COUNT,
    "timing.num_comparisons": _COUNT,
    "timing.choix_estimators": cfg_lib.tuple_of(cfg_lib.one_of("ilsr", "mm", "opt"), min_len=0),
    "timing.repeats": _COUNT,
}


def check_outcome_values(config: ml_collections.ConfigDict) -> None:
    """The three outcome values of the comparisons file must differ, or a row would be ambiguous.

    Raises:
      ValueError: two of columns.left_value, right_value and tie_value are equal.
    """
    c = config.columns
    values = (c.left_value, c.right_value, c.tie_value)
    if len(set(values)) < 3:
        raise ValueError(f"config fields columns.left_value={c.left_value!r}, right_value="
                         f"{c.right_value!r} and tie_value={c.tie_value!r}: expected three "
                         "different values")


def check_one_source(config: ml_collections.ConfigDict) -> None:
    """One comparisons file: by path or by name, not both.

    Raises:
      ValueError: data_path and data both set.
    """
    if config.data_path and config.data:
        raise ValueError(f"config fields data_path={config.data_path!r} and data={config.data!r}: "
                         "expected one comparisons file, by path or by name")


CROSS_CHECKS = (check_outcome_values, check_one_source)


FIELD_HELP = {
    "data": "a public comparisons data set by name: llmfao (downloaded once into data_dir)",
    "data_dir": "folder of downloaded data sets; '' = $XDG_CACHE_HOME/icml26-jax or "
                "~/.cache/icml26-jax",
    "data_path": "your pairwise judgements: a CSV, JSON-lines or JSON-array file (column names in "
                 "--config.columns.*); '' = simulated judgements only",
    "data_only": "with a data_path: fit your comparisons only (True) or also run the simulation, "
                 "coverage, choix and timing studies (False); ignored without a data_path",
}


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    return cfg_lib.build(arg, base, VARIANTS)
