"""Probabilistic forecasting with Parametric Prior Mapping (PPM) against four baselines.

    # CPU, minutes: the embedded hourly electricity-demand series shipped with statsmodels
    python -m experiments.forecasting --config=experiments/configs/forecasting.py:tiny --workdir=workdir
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

import ml_collections

from core import config as cfg_lib
from core import report


def base() -> ml_collections.ConfigDict:
    c = ml_collections.ConfigDict()
    c.seed = 2021
    c.data = ""                 # comma-separated public data sets by name (core.data.download)
    c.data_path = ""            # comma-separated files; with data "" too: statsmodels' mstl_elec_vic.csv
    c.data_dir = ""             # cache of downloaded data sets; "" = $XDG_CACHE_HOME/icml26-jax
    # The paper's case beside the others: the data set `benchmark.data` at `benchmark.horizons`,
    # measured when its file is cached or the download starts within `benchmark.timeout` seconds
    # (else "not measured here", with how to get it); num_seeds and max_steps_per_epoch, when
    # positive, replace the run's for this case.
    c.benchmark = ml_collections.ConfigDict(dict(data="", horizons=(192,), num_seeds=0,
                                                 max_steps_per_epoch=0, timeout=10.0))
    c.columns = ""              # comma-separated channel names to keep ("" = all)
    c.split = "auto"            # auto | ett_hour | ett_minute | ratio (70/10/20)
    # Timestamps must be at one step. "none": a missing step or value is an error naming the file
    # and line; "linear": missing rows and values are interpolated, and the report counts them.
    c.fill_gaps = "none"
    c.qice_out_of_range = "ppm"  # QICE: targets outside the samples' range in no bin (PPM code) | "card"
    c.input_len = 96
    c.horizons = (96,)
    # PPM (the authors' ETTh1 script: d_model 256, d_ff 512, K 100, tau 0.1, bandwidth 0.3).
    c.d_model = 256
    c.d_ff = 512
    c.train_samples = 100       # K prior draws per window in the hybrid loss
    c.eval_samples = 100        # samples per window for the metrics
    c.tau = 0.1
    c.bandwidth = 0.3
    # Optimisation: Adam, rate halved every epoch after the second, early stopping on val loss.
    c.batch_size = 64
    c.eval_batch_size = 64
    c.learning_rate = 1e-4
    c.max_epochs = 30
    c.patience = 5
    c.max_steps_per_epoch = 0   # 0 = one pass over the training windows
    c.val_stride = 1            # every k-th validation window scores early stopping
    c.test_stride = 1           # every k-th test window is scored (all methods share them)
    # Baselines.
    c.baselines = ("gaussian_prior", "linear", "seasonal_naive", "arima")
    c.gaussian_learning_rate = 1e-3
    c.linear_ridge = 1e-3
    c.seasonal_period = 0       # 0 = from the timestamps (data.seasonal_period_guess)
    c.arima_order = (2, 0, 1)
    c.arima_seasonal_order = (1, 0, 0, 24)
    c.arima_fit_steps = 1000    # the last this-many training steps fit the ARIMA parameters
    c.fan_windows = 3
    # Seeds (network initialisation, window shuffling and draws: seed, seed + 1, ...). PPM and the
    # Gaussian prior are refitted per seed; the claim counts a case as a PPM win when it wins in
    # most seeds, and as undecided when the 90% interval of its CRPS gap over seeds contains 0.
    c.num_seeds = 5
    # The authors' committed ETTh1 96->192 result is checked when ETTh1 is in the run
    # (etth1_192_vs_paper: the larger of our CRPS and MSE over theirs; missing otherwise).
    c.claim = report.claim_config(
        method="PPM forecasting",
        statement="ETTh1 96->192: CRPS 0.3369, MSE 0.4474, QICE 1.475% (authors' committed "
                  "result); better accuracy and calibration than baselines",
        checks=("ppm_crps_wins >= 1", "ppm_crps_wins >= cases", "ppm_qice_wins >= cases",
                "etth1_192_vs_paper <= 1.0"),
        ours="{summary}",
        # Sized to decide: in every case the seeds agree on the sign of PPM's CRPS gap.
        resolved=("crps_undecided == 0",))
    return c


VARIANTS = {
    # Embedded univariate series, two horizons, a smaller network, 5 seeds of the networks; and
    # the paper's case, ETTh1 96 -> 192, when its file is cached or downloads (3 seeds, at most
    # 50 steps per epoch: a few minutes on 2 cores).
    "tiny": {
        "horizons": (24, 96), "d_model": 64, "d_ff": 128, "train_samples": 50, "batch_size": 32,
        "learning_rate": 3e-3, "gaussian_learning_rate": 3e-3, "max_epochs": 6, "patience": 3,
        "test_stride": 2, "val_stride": 2, "arima_fit_steps": 600,
        "benchmark.data": "etth1", "benchmark.num_seeds": 3, "benchmark.max_steps_per_epoch": 50,
    },
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


_POSITIVE = cfg_lib.number(lo=0, lo_open=True)
_SERIES = ("etth1", "etth2", "exchange_rate")  # downloadable series (core.data.download)

# What each field accepts (checked once every override is in, before any work).
RULES = {
    "seed": cfg_lib.integer(lo=0),
    "data": cfg_lib.dataset_names(*_SERIES, several=True),
    "data_path": cfg_lib.path_or_empty(several=True),
    "data_dir": cfg_lib.string(),
    "benchmark.data": cfg_lib.dataset_names(*_SERIES),
    "benchmark.horizons": cfg_lib.tuple_of(cfg_lib.integer(lo=1)),
    "benchmark.num_seeds": cfg_lib.integer(lo=0),  # 0 = num_seeds
    "benchmark.max_steps_per_epoch": cfg_lib.integer(lo=0),  # 0 = max_steps_per_epoch
    "benchmark.timeout": cfg_lib.number(lo=0, lo_open=True),
    "columns": cfg_lib.string(),
    "split": cfg_lib.one_of("auto", "ett_hour", "ett_minute", "ratio"),
    "fill_gaps": cfg_lib.one_of("none", "linear"),
    "qice_out_of_range": cfg_lib.one_of("ppm", "card"),
    "input_len": cfg_lib.integer(lo=1),
    "horizons": cfg_lib.tuple_of(cfg_lib.integer(lo=1)),
    "d_model": cfg_lib.integer(lo=1),
    "d_ff": cfg_lib.integer(lo=1),
    "train_samples": cfg_lib.integer(lo=1),
    "eval_samples": cfg_lib.integer(lo=2),
    "tau": _POSITIVE,
    "bandwidth": _POSITIVE,
    "batch_size": cfg_lib.integer(lo=1),
    "eval_batch_size": cfg_lib.integer(lo=1),
    "learning_rate": _POSITIVE,
    "max_epochs": cfg_lib.integer(lo=1),
    "patience": cfg_lib.integer(lo=1),
    "max_steps_per_epoch": cfg_lib.integer(lo=0),  # 0 = one pass
    "val_stride": cfg_lib.integer(lo=1),
    "test_stride": cfg_lib.integer(lo=1),
    "baselines": cfg_lib.tuple_of(
        cfg_lib.one_of("gaussian_prior", "linear", "seasonal_naive", "arima")),
    "gaussian_learning_rate": _POSITIVE,
    "linear_ridge": cfg_lib.number(lo=0),
    "seasonal_period": cfg_lib.integer(lo=0),  # 0 = from the timestamps
    "arima_order": cfg_lib.tuple_of(cfg_lib.integer(lo=0), 3, 3),  # (p, d, q)
    "arima_seasonal_order": cfg_lib.tuple_of(cfg_lib.integer(lo=0), 4, 4),  # (P, D, Q, s)
    "arima_fit_steps": cfg_lib.integer(lo=1),
    "fan_windows": cfg_lib.integer(lo=0),
    "num_seeds": cfg_lib.integer(lo=1),
}


def check_seasonal_order(config: ml_collections.ConfigDict) -> None:
    """A seasonal ARIMA term needs a season of at least two steps.

    Raises:
      ValueError: P, D or Q > 0 with s < 2.
    """
    *pdq, season = config.arima_seasonal_order
    if any(pdq) and season < 2:
        raise ValueError(f"config field arima_seasonal_order = {config.arima_seasonal_order}: "
                         "expected a season s >= 2 when P, D or Q is positive")


CROSS_CHECKS = (check_seasonal_order,)


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
    return cfg_lib.build(arg, base, VARIANTS)
