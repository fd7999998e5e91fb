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

import dataclasses
from typing import Annotated, Literal

import ml_collections

from core import config as cfg_lib
from core import report

Models = Annotated[int, cfg_lib.Range(2)]  # a ranking needs two models


@dataclasses.dataclass(frozen=True)
class Benchmark:
    data: cfg_lib.datasets("llmfao") = ""
    timeout: cfg_lib.Positive = 10.0


@dataclasses.dataclass(frozen=True)
class Columns:
    left: cfg_lib.NonEmpty = "left"
    right: cfg_lib.NonEmpty = "right"
    judge: cfg_lib.NonEmpty = "worker"
    outcome: cfg_lib.NonEmpty = "winner"
    left_value: cfg_lib.NonEmpty = "left"
    right_value: cfg_lib.NonEmpty = "right"
    tie_value: cfg_lib.NonEmpty = "tie"

    def __post_init__(self):
        if len({self.left_value, self.right_value, self.tie_value}) < 3:  # else a row is ambiguous
            raise cfg_lib.FieldError("expected three different values", left_value=self.left_value,
                                     right_value=self.right_value, tie_value=self.tie_value)


@dataclasses.dataclass(frozen=True)
class Sim:
    num_models: Models = 20
    num_reliable: cfg_lib.NonNegInt = 4
    num_noisy: cfg_lib.NonNegInt = 5
    reliable_gamma: cfg_lib.Positive = 2.5
    noisy_gamma: cfg_lib.Positive = 0.25
    adversarial_gamma: float = 0.05  # any sign: an adversarial judge may invert
    score_spread: cfg_lib.Positive = 1.5
    num_comparisons: cfg_lib.Count = 20_000
    # data sets of the replicate recovery study (this panel and equal judges)
    num_replicates: cfg_lib.Count = 20


@dataclasses.dataclass(frozen=True)
class Coverage:
    num_datasets: cfg_lib.Count = 200
    num_models: Models = 8
    num_judges: cfg_lib.Count = 5
    per_cell: cfg_lib.Count = 6


@dataclasses.dataclass(frozen=True)
class Choix:
    num_models: Models = 30
    num_comparisons: cfg_lib.Count = 20_000


@dataclasses.dataclass(frozen=True)
class Timing:
    num_models: Models = 100
    num_judges: cfg_lib.Count = 20
    num_comparisons: cfg_lib.Count = 1_000_000
    choix_estimators: Annotated[tuple[Literal["ilsr", "mm", "opt"], ...], cfg_lib.Items(0)] = (
        "ilsr",)
    repeats: cfg_lib.Count = 2  # best of, fit and choix alternating


@dataclasses.dataclass(frozen=True)
class Config:
    seed: cfg_lib.NonNegInt = 0
    level: cfg_lib.OpenFraction = 0.95
    rank_draws: cfg_lib.Count = 4000
    # Real data: a CSV, JSON-lines or JSON-array file of pairwise judgements.
    data_path: cfg_lib.Path = ""  # "" = no real data (simulation only); a set path must exist
    # or a public data set by name: "llmfao" (core.data.download)
    data: cfg_lib.datasets("llmfao") = ""
    data_dir: str = ""  # cache of downloaded data sets; "" = $XDG_CACHE_HOME/icml26-jax
    # With neither data_path nor data: the data set `benchmark.data` is fitted beside the studies
    # when cached or downloadable within `benchmark.timeout` s, else "not measured here".
    benchmark: Benchmark = Benchmark()
    data_name: str = ""  # label in reports and metrics; "" = the file name without extension
    # drop (and count) rows whose outcome is none of the *_value
    drop_unknown_outcomes: bool = False
    # With a data_path: fit the user's comparisons only (True) or also run the simulation,
    # coverage, choix and timing studies (False). Without a data_path the studies always run.
    data_only: bool = True
    columns: Columns = Columns()
    # both parts must hold comparisons: a fraction strictly inside (0, 1)
    heldout_fraction: cfg_lib.OpenFraction = 0.2
    num_splits: cfg_lib.Count = 1  # random train/held-out splits of the real data
    # folds of the ridge cross-validation inside each training split (each is held out once, the
    # rest fit)
    cv_folds: Annotated[int, cfg_lib.Range(2)] = 3
    # weights of the Gaussian prior on log-discriminations (0 = no prior: MLE)
    ridge_grid: tuple[cfg_lib.NonNegative, ...] = (1.0, 3.0, 10.0)
    # multinomial bootstrap replicates for the real-data leaderboard (0 = no bootstrap)
    bootstrap_samples: cfg_lib.NonNegInt = 0
    # Simulation with known truth.
    sim: Sim = Sim()
    # Coverage of the 95% intervals over many simulated data sets of one fixed design.
    coverage: Coverage = Coverage()
    # Agreement with choix (plain BTL, judge-free data).
    choix: Choix = Choix()
    # Speed at the scale; choix estimators timed on the same comparisons.
    timing: Timing = Timing()
    claim: report.Claim = report.Claim(
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

    def __post_init__(self):
        if self.data_path and self.data:
            raise cfg_lib.FieldError("expected one comparisons file, by path or by name",
                                     data_path=self.data_path, data=self.data)


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
    return cfg_lib.build(arg, Config, VARIANTS)
