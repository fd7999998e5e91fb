"""The seasonal ARIMA baseline (statsmodels' SARIMAX), univariate.

Parameters are fitted once by maximum likelihood on the end of the training segment; each test
window is then forecast from its own L inputs with those parameters (the information the other
methods get), and the Gaussian predictive distribution is represented by S quantiles.

Dimension legend: B windows, L input length, H horizon, S samples.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable

import numpy as np
from scipy import stats

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


def arima_sampler(fitted, horizon: int, num_samples: int) -> Callable[[np.ndarray], np.ndarray]:
    """A forecaster from fitted SARIMAX parameters.

    Each window is forecast from its own inputs (``fitted.apply``); the predictive Gaussian
    ``N(mean_h, var_h)`` is represented by its quantiles at levels ``(s + 1/2) / S``.

    Returns:
      ``sample(x f32 [B, L, 1]) -> f32 [B, S, H, 1]`` (host arrays).
    """
    z = stats.norm.ppf((np.arange(num_samples) + 0.5) / num_samples)

    def sample(x: np.ndarray) -> np.ndarray:
        out = np.empty((x.shape[0], num_samples, horizon, 1), np.float32)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for b in range(x.shape[0]):
                fc = fitted.apply(x[b, :, 0]).get_forecast(horizon)
                mean, std = np.asarray(fc.predicted_mean), np.sqrt(np.asarray(fc.var_pred_mean))
                out[b, :, :, 0] = mean[None] + std[None] * z[:, None]
        return out

    return sample
