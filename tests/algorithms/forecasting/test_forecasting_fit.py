"""fit_network on core.training.train_loop: the epoch stream, early stopping and the kept best
parameters; the benchmark settings."""

import jax
import numpy as np
import pytest
from flax import nnx

from algorithms.forecasting import benchmark, data, training
from models.forecasting import GaussianPrior, PPMConfig

L, H = 8, 4


def series(T=400, seed=0):
    t = np.arange(T)
    rng = np.random.default_rng(seed)
    return (np.sin(2 * np.pi * t / 12)[:, None] + 0.1 * rng.standard_normal((T, 1))).astype(np.float32)


def test_epoch_windows_replays_one_permutation_per_epoch_from_any_position():
    s = series()
    starts = np.arange(50)
    it = training.EpochWindows(s, starts, L, H, batch_size=8, steps_per_epoch=3, seed=5)
    rng = np.random.default_rng(5)
    for _ in range(3):  # three epochs, 3 batches each, the tail of each permutation dropped
        order = rng.permutation(starts)
        for i in range(3):
            x, y = next(it)
            ex, ey = data.gather_windows(s, order[8 * i:8 * i + 8], L, H)
            np.testing.assert_array_equal(np.asarray(x), ex)
            np.testing.assert_array_equal(np.asarray(y), ey)
    again = training.EpochWindows(s, starts, L, H, 8, 3, seed=5)
    again.position = 7  # epoch 2, batch 1: as if resumed there
    np.testing.assert_array_equal(np.asarray(next(again)[0]),
                                  data.gather_windows(s, order[8:16], L, H)[0])
    with pytest.raises(ValueError, match="cannot fill 7 step"):
        training.EpochWindows(s, starts, L, H, 8, 7, seed=5)


def test_fit_network_stops_on_patience_and_keeps_the_best_epochs_parameters():
    s = series()
    tr, va = np.arange(0, 200), np.arange(220, 300, 4)
    cfg = PPMConfig(input_len=L, horizon=H, d_model=8, d_ff=16)
    loss_fn = training.gaussian_loss_fn()
    fit_cfg = training.FitConfig(input_len=L, horizon=H, batch_size=16, eval_batch_size=32,
                                 learning_rate=0.5, max_epochs=12, patience=2, seed=0,
                                 progress=False)
    key = jax.random.key(0)
    fit = training.fit_network(GaussianPrior(cfg, rngs=nnx.Rngs(0)), loss_fn, s, tr, va, fit_cfg,
                               key)
    vals = [e["val_loss"] for e in fit.epochs]
    assert fit.steps_per_epoch == 200 // 16
    assert [e["epoch"] for e in fit.epochs] == list(range(1, len(vals) + 1))
    best = int(np.argmin(vals))
    assert fit.best_epoch == best + 1 and fit.best_val_loss == vals[best]
    # stopped after `patience` epochs without a new best, or ran every epoch
    assert len(vals) == min(12, best + 1 + 2)
    # the kept parameters give the best epoch's validation objective again
    vkey = jax.random.fold_in(key, 10**9 + best)
    again = sum(float(training.eval_loss(fit.graphdef, fit.params, b, vkey, loss_fn)) * b[0].shape[0]
                for b in training.window_batches(s, va, L, H, 32)) / len(va)
    assert again == pytest.approx(fit.best_val_loss, rel=1e-5)
    assert all(np.isfinite(e["train_loss"]) for e in fit.epochs)


def test_fit_and_benchmark_settings_are_checked():
    with pytest.raises(ValueError, match="invalid FitConfig"):
        training.FitConfig(input_len=L, horizon=H, patience=0)
    with pytest.raises(ValueError, match="unknown baseline"):
        benchmark.BenchmarkConfig(baselines=("prophet",))
    with pytest.raises(ValueError, match="qice_out_of_range"):
        benchmark.BenchmarkConfig(qice_out_of_range="clip")
    c = benchmark.BenchmarkConfig.from_mapping({"input_len": 24, "baselines": ["linear"],
                                                "unrelated": 1})
    assert c.input_len == 24 and c.baselines == ("linear",)
    assert c.fit_config(H, 0.01).learning_rate == 0.01
