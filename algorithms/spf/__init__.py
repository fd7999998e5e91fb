"""Time-varying stochastic optimization: the Stochastic Path Follower (SPF) and its baselines.

* :mod:`algorithms.spf.problems` — drifting least squares / logistic regression with known optimum
  paths, mini-batch losses, gradients, Hessian-vector products and exact population excess risk.
* :mod:`algorithms.spf.baselines` — online SGD, Adam, prediction-correction, RLS, Kalman filter.
* :mod:`algorithms.spf.malliavin` — Euler-Maruyama paths and Malliavin derivatives by autodiff.
* :mod:`algorithms.spf.spf` — the SPF network, rollout and training objective.
"""
