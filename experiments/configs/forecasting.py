"""Probabilistic forecasting with Parametric Prior Mapping (PPM) against four baselines.

    # CPU, minutes: the embedded hourly electricity-demand series shipped with statsmodels
    python -m experiments.forecasting --config=experiments/configs/forecasting.py:tiny --workdir=workdir
    # CPU, about 20 minutes: tiny's network with more seeds and every test window, to decide
    python -m experiments.forecasting --config=experiments/configs/forecasting.py:small --workdir=workdir
    # CPU benchmark, ETTh1 96 -> 192 at the paper's model size (K = 32 training, 100 test samples)
    python -m experiments.forecasting --config=experiments/configs/forecasting.py:bench \
        --config.data=etth1 --workdir=workdir
    # Accelerator: the paper's protocol on several data sets and all four horizons
    python -m experiments.forecasting --config=experiments/configs/forecasting.py:paper \
        --config.data=etth1,etth2 --workdir=workdir

``data`` names public data sets (``etth1``, ``etth2``, ``exchange_rate``): each is downloaded on
first use into the cache folder ``data_dir`` (default ``$XDG_CACHE_HOME/icml26-jax`` or
``~/.cache/icml26-jax``; :mod:`core.data.download`), and offline the run stops with one line naming
the URL and where to place the file by hand. ``data_path`` is a comma-separated list of your own
ETT-style CSVs (timestamp column, then channels) or headerless numeric files (optionally gzipped).
With neither, the embedded default. ``benchmark.data`` (set in ``tiny``) adds the paper's case
(ETTh1 96 -> 192) when the file is cached or can be downloaded; otherwise the report says it was
not measured and how to get the file.
"""

import dataclasses
from typing import Annotated, Literal

import ml_collections

from core import config as cfg_lib
from core import report

SERIES = ("etth1", "etth2", "exchange_rate")  # downloadable series (core.data.download)


@dataclasses.dataclass(frozen=True)
class Benchmark:
    data: cfg_lib.datasets(*SERIES) = ""
    horizons: tuple[cfg_lib.Count, ...] = (192,)
    num_seeds: cfg_lib.NonNegInt = 0  # 0 = num_seeds
    max_steps_per_epoch: cfg_lib.NonNegInt = 0  # 0 = max_steps_per_epoch
    timeout: cfg_lib.Positive = 10.0


@dataclasses.dataclass(frozen=True)
class Config:
    seed: cfg_lib.NonNegInt = 2021
    # comma-separated public data sets by name (core.data.download)
    data: cfg_lib.datasets(*SERIES, several=True) = ""
    # comma-separated files; with data "" too: statsmodels' mstl_elec_vic.csv
    data_path: cfg_lib.Paths = ""
    data_dir: str = ""  # cache of downloaded data sets; "" = $XDG_CACHE_HOME/icml26-jax
    # The paper's case beside the others: the data set `benchmark.data` at `benchmark.horizons`,
    # measured when its file is cached or the download starts within `benchmark.timeout` seconds
    # (else "not measured here", with how to get it); num_seeds and max_steps_per_epoch, when
    # positive, replace the run's for this case.
    benchmark: Benchmark = Benchmark()
    columns: str = ""  # comma-separated channel names to keep ("" = all)
    split: Literal["auto", "ett_hour", "ett_minute", "ratio"] = "auto"  # ratio: 70/10/20
    # Timestamps must be at one step. "none": a missing step or value is an error naming the file
    # and line; "linear": missing rows and values are interpolated, and the report counts them.
    fill_gaps: Literal["none", "linear"] = "none"
    # QICE: targets outside the samples' range in no bin (PPM code) | "card"
    qice_out_of_range: Literal["ppm", "card"] = "ppm"
    input_len: cfg_lib.Count = 96
    horizons: tuple[cfg_lib.Count, ...] = (96,)
    # PPM (the authors' ETTh1 script: d_model 256, d_ff 512, K 100, tau 0.1, bandwidth 0.3).
    d_model: cfg_lib.Count = 256
    d_ff: cfg_lib.Count = 512
    train_samples: cfg_lib.Count = 100  # K prior draws per window in the hybrid loss
    eval_samples: Annotated[int, cfg_lib.Range(2)] = 100  # samples per window for the metrics
    tau: cfg_lib.Positive = 0.1
    bandwidth: cfg_lib.Positive = 0.3
    # Optimisation: Adam, rate halved every epoch after the second, early stopping on val loss.
    batch_size: cfg_lib.Count = 64
    eval_batch_size: cfg_lib.Count = 64
    learning_rate: cfg_lib.Positive = 1e-4
    max_epochs: cfg_lib.Count = 30
    patience: cfg_lib.Count = 5
    max_steps_per_epoch: cfg_lib.NonNegInt = 0  # 0 = one pass over the training windows
    val_stride: cfg_lib.Count = 1  # every k-th validation window scores early stopping
    test_stride: cfg_lib.Count = 1  # every k-th test window is scored (all methods share them)
    # Baselines.
    baselines: tuple[Literal["gaussian_prior", "linear", "seasonal_naive", "arima"], ...] = (
        "gaussian_prior", "linear", "seasonal_naive", "arima")
    gaussian_learning_rate: cfg_lib.Positive = 1e-3
    linear_ridge: cfg_lib.NonNegative = 1e-3
    seasonal_period: cfg_lib.NonNegInt = 0  # 0 = from the timestamps (data.seasonal_period_guess)
    # (p, d, q)
    arima_order: tuple[cfg_lib.NonNegInt, cfg_lib.NonNegInt, cfg_lib.NonNegInt] = (2, 0, 1)
    arima_seasonal_order: tuple[cfg_lib.NonNegInt, cfg_lib.NonNegInt, cfg_lib.NonNegInt,
                                cfg_lib.NonNegInt] = (1, 0, 0, 24)  # (P, D, Q, s)
    # the last this-many training steps fit the ARIMA parameters
    arima_fit_steps: cfg_lib.Count = 1000
    fan_windows: cfg_lib.NonNegInt = 3
    # Seeds (network initialisation, window shuffling and draws: seed, seed + 1, ...). PPM and the
    # Gaussian prior are refitted per seed; the claim counts a case as a PPM win when it wins in
    # most seeds, and as undecided when the 90% interval of its CRPS gap over seeds contains 0.
    num_seeds: cfg_lib.Count = 5
    # The authors' committed ETTh1 96->192 result is checked when ETTh1 is in the run
    # (etth1_192_vs_paper: the larger of our CRPS and MSE over theirs; missing otherwise).
    claim: report.Claim = report.Claim(
        method="PPM forecasting",
        statement="ETTh1 96->192: CRPS 0.3369, MSE 0.4474, QICE 1.475% (authors' committed "
                  "result); better accuracy and calibration than baselines",
        checks=("ppm_crps_wins >= 1", "ppm_crps_wins >= cases", "ppm_qice_wins >= cases",
                "etth1_192_vs_paper <= 1.0"),
        ours="{summary}",
        # Sized to decide: in every case the seeds agree on the sign of PPM's CRPS gap.
        resolved=("crps_undecided == 0",))

    def __post_init__(self):
        *pdq, season = self.arima_seasonal_order  # a seasonal term needs a season of >= 2 steps
        if any(pdq) and season < 2:
            raise cfg_lib.FieldError("expected a season s >= 2 when P, D or Q is positive",
                                     arima_seasonal_order=self.arima_seasonal_order)


# Embedded univariate series, two horizons, a smaller network, 5 seeds of the networks; and
# the paper's case, ETTh1 96 -> 192, when its file is cached or downloads (3 seeds, at most
# 50 steps per epoch: a few minutes on 2 cores).
_TINY = {
    "horizons": (24, 96), "d_model": 64, "d_ff": 128, "train_samples": 50, "batch_size": 32,
    "learning_rate": 3e-3, "gaussian_learning_rate": 3e-3, "max_epochs": 6, "patience": 3,
    "test_stride": 2, "val_stride": 2, "arima_fit_steps": 600,
    "benchmark.data": "etth1", "benchmark.num_seeds": 3, "benchmark.max_steps_per_epoch": 50,
}

VARIANTS = {
    "tiny": _TINY,
    # CPU, 21 minutes on 2 cores with ETTh1 cached (13 of them ETTh1's; 8 without): decides the
    # claim that tiny leaves undecided. tiny's network and training, with 12 seeds on the
    # embedded series (tiny's H = 96 gap, +0.6% [-0.1, +1.3]% over 5 seeds, has a per-seed
    # spread of about 0.7%: 12 seeds narrow the interval to about +-0.4%) and 5 on ETTh1
    # 96 -> 192, every test window scored. The H = 96 gap is decided by a narrow margin
    # (+0.45% [+0.01, +0.89]% over 12 seeds); 30 seeds, same seeds first, confirm its sign
    # (+0.82% [+0.57, +1.06]%, PPM wins 5 of 30).
    "small": {**_TINY, "num_seeds": 12, "test_stride": 1, "benchmark.num_seeds": 5},
    # seconds: executes every code path (tests and notebook smoke runs); numbers are meaningless
    "smoke": {
        "horizons": (12,), "input_len": 24, "d_model": 8, "d_ff": 16, "train_samples": 4,
        "eval_samples": 8, "batch_size": 16, "learning_rate": 3e-3, "max_epochs": 1, "patience": 1,
        "max_steps_per_epoch": 2, "val_stride": 64, "test_stride": 64, "arima_fit_steps": 200,
        "fan_windows": 1, "num_seeds": 2,
    },
    # ETTh1-sized CPU run at the paper's model size; early stopping and the halving rate stop
    # learning after a few epochs, so the epoch cap mostly bounds the wall time.
    # Training uses K = 32 prior draws per window (scoring still uses 100) to fit 2 CPU cores.
    "bench": {
        "horizons": (192,), "baselines": ("gaussian_prior", "linear", "seasonal_naive"),
        "train_samples": 32, "max_epochs": 4, "patience": 2, "val_stride": 8, "num_seeds": 1,
    },
    # The paper's protocol (accelerator): four horizons, up to 30 epochs, patience 5.
    "paper": {"horizons": (96, 192, 336, 720), "baselines": ("gaussian_prior", "linear",
                                                              "seasonal_naive")},
}


FIELD_HELP = {
    "data": "public data sets by name, comma-separated: etth1, etth2, exchange_rate (downloaded "
            "once into data_dir)",
    "data_dir": "folder of downloaded data sets; '' = $XDG_CACHE_HOME/icml26-jax or "
                "~/.cache/icml26-jax",
    "data_path": "your series: comma-separated CSV files (header row, first column the timestamps, "
                 "then numeric channels) or headerless numeric rows; '' = statsmodels' "
                 "mstl_elec_vic.csv",
    "columns": "comma-separated channel names to keep, e.g. --config.columns=OT,HUFL; '' = all",
}


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    return cfg_lib.build(arg, Config, VARIANTS)
