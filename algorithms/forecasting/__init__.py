"""Probabilistic multivariate forecasting with Parametric Prior Mapping (PPM, ICML 2026).

Modules: :mod:`.losses` (hybrid KDE-NLL + MSE objective), :mod:`.metrics` (CRPS, CRPS-sum, QICE,
coverage, MSE/MAE), :mod:`.baselines` (linear and seasonal-naive forecasters), :mod:`.arima`
(statsmodels seasonal ARIMA), :mod:`.data` (splits, standardisation, windows; tables are read by
``core.data.series``), :mod:`.training` (schedule, objectives, jitted sampling, ``fit_network``
with early stopping on ``core.training.train_loop``), :mod:`.benchmark` (one dataset and horizon:
every method fitted and scored on the same windows). The networks are in
:mod:`models.forecasting`.
"""

from algorithms.forecasting import (  # noqa: F401
    arima,
    baselines,
    benchmark,
    data,
    losses,
    metrics,
    training,
)
