"""Probabilistic multivariate forecasting with Parametric Prior Mapping (PPM, ICML 2026).

Modules: :mod:`.losses` (hybrid KDE-NLL + MSE objective), :mod:`.metrics` (CRPS, CRPS-sum, QICE,
coverage, MSE/MAE), :mod:`.baselines` (linear and seasonal-naive forecasters), :mod:`.data`
(parsing, splits, standardisation, windows), :mod:`.training` (schedule, objectives, jitted
sampling). The networks are in :mod:`models.forecasting`.
"""

from algorithms.forecasting import baselines, data, losses, metrics, training  # noqa: F401
