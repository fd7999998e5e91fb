"""Time-varying stochastic optimization: the Stochastic Path Follower (SPF) and its baselines.

* :mod:`algorithms.spf.problems` — drifting least squares / logistic regression with known optimum
  paths, mini-batch losses, gradients, Hessian-vector products and exact population excess risk.
* :mod:`algorithms.spf.baselines` — online SGD, Adam, prediction-correction, RLS, Kalman filter.
* :mod:`algorithms.spf.malliavin` — Euler-Maruyama paths and Malliavin derivatives by autodiff.
* :mod:`algorithms.spf.spf` — the SPF network, rollout and training objective.
* :mod:`algorithms.spf.training` — problems from run settings, the data-parallel mesh, the stream of
  simulated training episodes (``EpisodeBatches``) and the pieces ``core.training.train_loop`` takes.
* :mod:`algorithms.spf.tuning` — every baseline tuned over all of its usual hyper-parameters.
* :mod:`algorithms.spf.evaluation` — tracking metrics, the paired comparison, the Malliavin noise
  memory and the dimension sweep.
"""
