"""One dataset and horizon: fit PPM and its baselines, score all on the same test windows.

The protocol of the PPM paper's tables: chronological train/val/test segments
(:func:`algorithms.forecasting.data.split_borders`), networks trained with early stopping on the
validation windows (:func:`algorithms.forecasting.training.fit_network`), and every method scored
by CRPS, CRPS-sum, QICE, MSE, MAE and interval coverage (:mod:`algorithms.forecasting.metrics`) on
the standardised scale. Every method is scored on the same footing: each sampler returns S iid
draws from its predictive distribution (the closed-form baselines too), and CRPS is the fair
ensemble CRPS, unbiased for such draws (the plain one is kept as ``crps_plain``).

Dimension legend: T time steps, N channels, L input length, H horizon, B windows, S samples.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from tqdm.auto import tqdm

from algorithms.forecasting import arima, baselines, data, metrics, training
from core.timing import Stopwatch
from models.forecasting import PPM, GaussianPrior, PPMConfig

METHODS = ("ppm", "gaussian_prior", "linear", "seasonal_naive", "arima")


@dataclasses.dataclass(frozen=True)
class BenchmarkConfig:
    """Settings of :func:`run_horizon` (the experiment config's fields of the same names).

    Attributes:
      input_len: L. seed: network initialisation and shuffling seed.
      d_model, d_ff: PPM's widths (:class:`models.forecasting.PPMConfig`).
      train_samples: K prior draws per window in the hybrid loss; eval_samples: S per window scored.
      tau, bandwidth: the hybrid loss's MSE weight and KDE bandwidth.
      batch_size, eval_batch_size, learning_rate, max_epochs, patience, max_steps_per_epoch: the
        networks' training (:class:`algorithms.forecasting.training.FitConfig`);
        gaussian_learning_rate: the Gaussian-prior baseline's rate.
      val_stride, test_stride: every k-th validation / test window is used.
      baselines: which of ``METHODS[1:]`` to run (ARIMA only on univariate series).
      linear_ridge: the linear forecaster's ridge. seasonal_period: 0 = from the timestamps.
      arima_order, arima_seasonal_order, arima_fit_steps: the SARIMAX baseline.
      fan_windows: test windows whose samples are returned for fan charts.
      qice_out_of_range: ``"ppm"`` or ``"card"`` (:data:`algorithms.forecasting.metrics.OUT_OF_RANGE`).
      progress: progress bars.
    """

    input_len: int = 96
    seed: int = 0
    d_model: int = 256
    d_ff: int = 512
    train_samples: int = 100
    eval_samples: int = 100
    tau: float = 0.1
    bandwidth: float = 0.3
    batch_size: int = 64
    eval_batch_size: int = 64
    learning_rate: float = 1e-4
    gaussian_learning_rate: float = 1e-3
    max_epochs: int = 30
    patience: int = 5
    max_steps_per_epoch: int = 0
    val_stride: int = 1
    test_stride: int = 1
    baselines: tuple[str, ...] = METHODS[1:]
    linear_ridge: float = 1e-3
    seasonal_period: int = 0
    arima_order: tuple[int, ...] = (2, 0, 1)
    arima_seasonal_order: tuple[int, ...] = (1, 0, 0, 24)
    arima_fit_steps: int = 1000
    fan_windows: int = 3
    qice_out_of_range: str = "ppm"
    progress: bool = True

    def __post_init__(self):
        unknown = set(self.baselines) - set(METHODS[1:])
        if unknown:
            raise ValueError(f"unknown baseline(s) {sorted(unknown)}; expected some of "
                             f"{METHODS[1:]}")
        if self.qice_out_of_range not in metrics.OUT_OF_RANGE:
            raise ValueError(f"qice_out_of_range must be one of {metrics.OUT_OF_RANGE}, got "
                             f"{self.qice_out_of_range!r}")

    @classmethod
    def from_mapping(cls, config: Mapping[str, Any]) -> BenchmarkConfig:
        """The fields of this class read from a config (a ``ConfigDict`` or dict) by name; tuples
        are made of sequences."""
        names = [f.name for f in dataclasses.fields(cls) if f.name in config]
        return cls(**{n: tuple(config[n]) if isinstance(config[n], (list, tuple)) else config[n]
                      for n in names})

    def fit_config(self, horizon: int, learning_rate: float) -> training.FitConfig:
        """The :class:`~algorithms.forecasting.training.FitConfig` of one network."""
        return training.FitConfig(
            input_len=self.input_len, horizon=horizon, batch_size=self.batch_size,
            eval_batch_size=self.eval_batch_size, learning_rate=learning_rate,
            max_epochs=self.max_epochs, patience=self.patience,
            max_steps_per_epoch=self.max_steps_per_epoch, seed=self.seed, progress=self.progress)

    def ppm(self, horizon: int) -> tuple[PPMConfig, Callable]:
        """(network config, training objective) of PPM at ``horizon``: the hybrid KDE-NLL + MSE
        loss (:func:`~algorithms.forecasting.training.ppm_loss_fn`) on ``train_samples`` prior
        draws per window. Create the objective once per fit (it keys a jit cache)."""
        return (PPMConfig(input_len=self.input_len, horizon=horizon, d_model=self.d_model,
                          d_ff=self.d_ff),
                training.ppm_loss_fn(self.tau, self.bandwidth, self.train_samples))


@dataclasses.dataclass
class HorizonResult:
    """What :func:`run_horizon` returns.

    Attributes:
      results: {method: metrics (``crps`` fair, ``crps_plain``, ``crps_sum`` normalised,
        ``crps_sum_raw``, ``qice`` in percent, ``mse``, ``mae``, ``coverage_50``, ``coverage_90``; see
        :func:`algorithms.forecasting.metrics.finalize_metrics`) + ``train_seconds``,
        ``sample_seconds``, ``test_windows``}.
      fan: ``{"x": f32 [F, L, N], "y": f32 [F, H, N], method: f32 [F, S, H, N]}`` for F fan
        windows (``x`` is ``None`` without fan windows).
      histories: {network method: its fit history}.
    """

    results: dict[str, dict[str, float]]
    fan: dict[str, Any]
    histories: dict[str, dict[str, Any]]


def score(sampler: Callable[[jax.Array, jax.Array], jax.Array], series: np.ndarray,
          starts: np.ndarray, input_len: int, horizon: int, batch_size: int, key: jax.Array,
          out_of_range: str = "ppm", desc: str = "score", progress: bool = True
          ) -> dict[str, float]:
    """Metrics of ``sampler(x [B, L, N], key) -> samples [B, S, H, N]`` over the windows starting
    at ``starts`` (batch ``i`` uses ``fold_in(key, i)``); QICE in percent. ``samples`` must be S >= 2
    iid draws from the method's predictive distribution: the fair CRPS is unbiased for those (a
    deterministic quantile set would need the plain estimator, module doc of
    :mod:`algorithms.forecasting.metrics`).

    Raises:
      ValueError: a metric is not finite (NaN/inf forecasts or targets).
    """
    sums = None
    for i, (x, y) in enumerate(tqdm(training.window_batches(series, starts, input_len, horizon,
                                                            batch_size),
                                    total=-(-len(starts) // batch_size), desc=desc, leave=False,
                                    disable=not progress)):
        sums = metrics.add_sums(sums, metrics.metric_sums(sampler(x, jax.random.fold_in(key, i)),
                                                          y, out_of_range=out_of_range))
    m = metrics.finalize_metrics(sums)
    bad = sorted(k for k, v in m.items() if not math.isfinite(v))
    if bad:
        raise ValueError(f"{desc}: metrics {bad} are not finite: the forecasts or the test "
                         "targets contain NaN or infinite values")
    m["qice"] *= 100.0  # percent, as the paper reports it
    return m


def run_horizon(series: np.ndarray, timestamps: tuple[str, ...] | None, split: str, horizon: int,
                config: BenchmarkConfig, key: jax.Array, name: str = "series",
                arima_cache: dict | None = None,
                log: Callable[[str], None] | None = None) -> HorizonResult:
    """Trains/fits every method for one horizon and scores them on the same test windows.

    Args:
      series: f32 [T, N] standardised series.
      timestamps: the table's timestamps (for the seasonal period) or ``None``.
      split: a resolved split name (:func:`algorithms.forecasting.data.resolve_split`).
      horizon: H.
      config: :class:`BenchmarkConfig`.
      key: PRNG key (split into PPM, Gaussian-prior and scoring keys).
      name: the series' name in labels and messages.
      arima_cache: a dict kept between horizons of one series: the fitted ARIMA (its fit does
        not depend on H) is stored there.
      log: called with one line per method scored.

    Returns:
      :class:`HorizonResult`.

    Raises:
      ValueError: the series is too short for the split (see ``split_borders``); non-finite
        metrics; see :func:`algorithms.forecasting.training.fit_network`.
    """
    L, S, H = config.input_len, config.eval_samples, horizon
    borders = data.split_borders(len(series), L, H, split)

    def starts(seg, stride=1):
        a, b = borders[seg]
        return a + np.arange(0, data.num_windows(b - a, L, H), stride)

    tr, va, te = starts("train"), starts("val", config.val_stride), starts("test", config.test_stride)
    cfg, ppm_loss = config.ppm(H)
    samplers, seconds, histories = {}, {}, {}
    k_ppm, k_gauss, k_eval = jax.random.split(key, 3)

    fit = training.fit_network(
        PPM(cfg, rngs=nnx.Rngs(config.seed)), ppm_loss, series, tr, va,
        config.fit_config(H, config.learning_rate), k_ppm, f"{name} H={H} PPM")
    samplers["ppm"] = lambda x, k, g=fit.graphdef, p=fit.params: training.sample_ppm(g, p, x, k, S)
    seconds["ppm"], histories["ppm"] = fit.train_seconds, fit.history()

    chosen = tuple(config.baselines)
    if "gaussian_prior" in chosen:
        g = training.fit_network(GaussianPrior(cfg, rngs=nnx.Rngs(config.seed)),
                                 training.gaussian_loss_fn(), series, tr, va,
                                 config.fit_config(H, config.gaussian_learning_rate), k_gauss,
                                 f"{name} H={H} Gaussian prior")
        samplers["gaussian_prior"] = lambda x, k, g=g: training.sample_gaussian(
            g.graphdef, g.params, x, k, S)
        seconds["gaussian_prior"], histories["gaussian_prior"] = g.train_seconds, g.history()
    x_tr, y_tr = data.gather_windows(series, tr, L, H)
    if "linear" in chosen:
        with Stopwatch() as sw:
            lin = jax.block_until_ready(baselines.fit_linear(jnp.asarray(x_tr), jnp.asarray(y_tr),
                                                             config.linear_ridge))
        seconds["linear"] = sw.seconds
        samplers["linear"] = lambda x, k, m=lin: baselines.linear_samples(m, x, k, S)
    if "seasonal_naive" in chosen:
        period = min(config.seasonal_period or data.seasonal_period_guess(timestamps), L)
        with Stopwatch() as sw:
            resid = jax.block_until_ready(baselines.seasonal_residuals(
                jnp.asarray(x_tr), jnp.asarray(y_tr), H, period))
        seconds["seasonal_naive"] = sw.seconds
        samplers["seasonal_naive"] = lambda x, k, r=resid, p=period: \
            baselines.seasonal_naive_samples(x, r, k, H, p, S)
    if "arima" in chosen and series.shape[1] == 1:
        arima_cache = {} if arima_cache is None else arima_cache
        if "fitted" not in arima_cache:
            arima_cache["fitted"], arima_cache["seconds"] = arima.fit_arima(
                series[:borders["train"][1], 0], config.arima_order, config.arima_seasonal_order,
                config.arima_fit_steps)
        seconds["arima"] = arima_cache["seconds"]
        fn = arima.arima_sampler(arima_cache["fitted"], H, S)
        samplers["arima"] = lambda x, k, fn=fn: jnp.asarray(fn(np.asarray(x), k))
    del x_tr, y_tr

    results, fan = {}, {}
    fan_idx = np.linspace(0, len(te) - 1, config.fan_windows).astype(int) if config.fan_windows \
        else []
    fan["x"], fan["y"] = data.gather_windows(series, te[fan_idx], L, H) if len(fan_idx) \
        else (None, None)
    for method, sampler in samplers.items():
        with Stopwatch() as sw:
            m = score(sampler, series, te, L, H, config.eval_batch_size, k_eval,
                      config.qice_out_of_range, f"{name} H={H} score {method}", config.progress)
        m["train_seconds"] = seconds[method]
        m["sample_seconds"] = sw.seconds
        m["test_windows"] = len(te)
        results[method] = m
        if log is not None:
            log(f"{name} H={H} {method}: CRPS {m['crps']:.4f}, QICE {m['qice']:.3f}%, MSE "
                f"{m['mse']:.4f}, MAE {m['mae']:.4f}, train {m['train_seconds']:.0f} s")
        if len(fan_idx):
            fan[method] = np.asarray(sampler(jnp.asarray(fan["x"]), k_eval))
    return HorizonResult(results, fan, histories)
