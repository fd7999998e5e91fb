"""The seasonal ARIMA baseline (statsmodels' SARIMAX), univariate.

Parameters are fitted once by maximum likelihood on the end of the training segment; each test
window is then forecast from its own L inputs with those parameters (the information the other
methods get), and the forecast is S iid draws from its Gaussian predictive distribution, the
representation every method is scored in (:mod:`algorithms.forecasting.metrics`).

Dimension legend: B windows, L input length, H horizon, S samples.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable

import jax
import numpy as np

from core.timing import Stopwatch


def fit_arima(train: np.ndarray, order: tuple[int, int, int],
              seasonal_order: tuple[int, int, int, int], fit_steps: int):
    """Fits SARIMAX with a constant (``trend="c"``) by maximum likelihood on the last
    ``fit_steps`` values of ``train``.

    Args:
      train: f32/f64 [T] training values (one channel).
      order: (p, d, q). seasonal_order: (P, D, Q, s).
      fit_steps: how many of the last training values the fit sees (>= 1).

    Returns:
      ``(fitted statsmodels results, fit seconds)``.

    Raises:
      ValueError: ``train`` not one-dimensional, or ``fit_steps < 1``.
    """
    from statsmodels.tsa.statespace.sarimax import SARIMAX

    train = np.asarray(train)
    if train.ndim != 1 or fit_steps < 1:
        raise ValueError(f"fit_arima: need a 1-D series and fit_steps >= 1, got shape "
                         f"{train.shape} and fit_steps={fit_steps}")
    with Stopwatch() as sw, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fitted = SARIMAX(train[-fit_steps:], order=tuple(order),
                         seasonal_order=tuple(seasonal_order), trend="c").fit(disp=False)
    return fitted, sw.seconds


def arima_predictive(fitted, x: np.ndarray, horizon: int) -> tuple[np.ndarray, np.ndarray]:
    """Mean and standard deviation f64 [B, H] of the Gaussian predictive distribution of each
    window, forecast from its own inputs ``x`` f32 [B, L, 1] (``fitted.apply``)."""
    mean = np.empty((x.shape[0], horizon))
    std = np.empty((x.shape[0], horizon))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for b in range(x.shape[0]):
            fc = fitted.apply(np.asarray(x[b, :, 0], np.float64)).get_forecast(horizon)
            mean[b] = np.asarray(fc.predicted_mean)
            std[b] = np.sqrt(np.asarray(fc.var_pred_mean))
    return mean, std


def arima_sampler(fitted, horizon: int, num_samples: int
                  ) -> Callable[[np.ndarray, jax.Array], np.ndarray]:
    """A forecaster from fitted SARIMAX parameters.

    Each window is forecast from its own inputs; a forecast is ``num_samples`` iid draws from the
    marginal predictive normal ``N(mean_h, var_h)`` of each step h (:func:`arima_predictive`).

    Returns:
      ``sample(x f32 [B, L, 1], key) -> f32 [B, S, H, 1]`` (host arrays; ``key`` a PRNG key).
    """

    def sample(x: np.ndarray, key: jax.Array) -> np.ndarray:
        x = np.asarray(x)
        mean, std = arima_predictive(fitted, x, horizon)
        z = np.asarray(jax.random.normal(key, (x.shape[0], num_samples, horizon)), np.float64)
        return (mean[:, None] + std[:, None] * z).astype(np.float32)[..., None]

    return sample
