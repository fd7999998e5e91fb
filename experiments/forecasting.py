"""Experiment ``forecasting``: Parametric Prior Mapping (PPM) against four baselines.

For each data file and horizon H: PPM is trained with its hybrid KDE-NLL + MSE objective (Adam,
rate halved per epoch, early stopping on the validation objective); the baselines are the Gaussian
prior alone (trained by Gaussian NLL), a closed-form linear forecaster with Gaussian residuals, a
seasonal-naive forecast with empirical residual quantiles and, on univariate data, a statsmodels
seasonal ARIMA. Every method is scored on the same test windows by CRPS, CRPS-sum, QICE, MSE, MAE
and interval coverage on the standardised scale. Writes ``<workdir>/forecasting/metrics.json``, fan
charts and a CRPS bar chart.

    python -m experiments.forecasting --config=experiments/configs/forecasting.py:tiny --workdir=workdir
"""

from __future__ import annotations

import math
import os
import time
import warnings

import jax
import jax.numpy as jnp
import matplotlib.pyplot as plt
import ml_collections
import numpy as np
import optax
from flax import nnx
from scipy import stats
from tqdm.auto import tqdm

from algorithms.forecasting import baselines, data, metrics, training
from core import report, sharding
from core.data.files import read_text
from core.training import NonFiniteLossError, init_train_state, make_train_step
from experiments import common
from models.forecasting import PPM, GaussianPrior, PPMConfig

NAME = "forecasting"

# The authors' committed result (ljl8336/PPM, results/ETTh1.txt): ETTh1, L=96, H=192, K=100.
PAPER_ETTH1_192 = {"crps": 0.3369, "qice": 1.475, "mse": 0.4474, "mae": 0.4326}
METHODS = ("ppm", "gaussian_prior", "linear", "seasonal_naive", "arima")
LABELS = {"ppm": "PPM", "gaussian_prior": "Gaussian prior alone", "linear": "linear + Gaussian",
          "seasonal_naive": "seasonal naive", "arima": "seasonal ARIMA"}


def default_data_path() -> str:
    """statsmodels' hourly Victorian electricity demand (3,600 hours from 2012-01-01, one channel)."""
    import statsmodels

    path = os.path.join(os.path.dirname(statsmodels.__file__), "tsa", "stl", "tests", "results",
                        "mstl_elec_vic.csv")
    if not os.path.exists(path):
        raise FileNotFoundError(f"embedded default series {path!r} is missing from this statsmodels "
                                "install; pass --config.data_path")
    return path


def load_table(path: str, columns: str = "", fill_gaps: str = "none") -> data.Table:
    """Reads an ETT-style CSV or headerless numeric file (``.gz`` allowed) into a
    :class:`algorithms.forecasting.data.Table`; ``fill_gaps`` as in
    :func:`algorithms.forecasting.data.parse_table` (``"none"``: a gap in the timestamps or a
    missing value is an error naming the file and line; ``"linear"``: interpolated and counted).

    Raises:
      FileNotFoundError: no such file. ValueError: a directory, an unreadable, corrupt-gzip or
        non-UTF-8 file (:func:`core.data.read_text`), or see
        :func:`algorithms.forecasting.data.parse_table`.
    """
    text = read_text(path, "forecasting series")
    cols = tuple(c.strip() for c in columns.split(",") if c.strip()) or None
    return data.parse_table(text, os.path.basename(path), cols, fill_gaps=fill_gaps)


# ----------------------------------------------------------------------------------------------
# Training with early stopping


def _batches(series: np.ndarray, starts: np.ndarray, L: int, H: int, batch: int):
    for i in range(0, len(starts), batch):
        x, y = data.gather_windows(series, starts[i:i + batch], L, H)
        yield jnp.asarray(x), jnp.asarray(y)


def fit_network(model: nnx.Module, loss_fn, series: np.ndarray, train_starts: np.ndarray,
                val_starts: np.ndarray, config: ml_collections.ConfigDict, H: int, lr: float,
                key: jax.Array, desc: str) -> tuple[nnx.GraphDef, nnx.State, dict]:
    """Adam with the halving schedule, one pass per epoch over shuffled training windows
    (last partial batch dropped), early stopping on the mean validation objective; returns the
    graphdef, the best parameters and a history dict.

    Raises:
      NonFiniteLossError: a NaN/inf training loss.
    """
    L, B = config.input_len, config.batch_size
    graphdef, params = nnx.split(model)
    steps = len(train_starts) // B
    if config.max_steps_per_epoch:
        steps = min(steps, config.max_steps_per_epoch)
    if steps < 1:
        raise ValueError(f"{desc}: {len(train_starts)} training windows, fewer than one batch of {B}")
    tx = optax.adam(training.halving_schedule(lr, steps))
    step_fn = jax.jit(make_train_step(graphdef, tx, loss_fn), donate_argnums=0)
    mesh = sharding.make_mesh()  # data parallel over every device (one on a CPU run)
    state = sharding.replicate(init_train_state(params, tx), mesh)
    rng = np.random.default_rng(config.seed)
    best, best_val, bad, history = None, math.inf, 0, []
    t0 = time.perf_counter()
    bar = tqdm(range(config.max_epochs), desc=desc, leave=False)
    for epoch in bar:
        order = rng.permutation(train_starts)[:steps * B]
        losses_ = []
        for i, batch in enumerate(_batches(series, order, L, H, B)):
            state, m = step_fn(state, sharding.shard_batch(batch, mesh),
                               jax.random.fold_in(key, epoch * steps + i))
            losses_.append(m["loss"])
        train_loss = float(jnp.mean(jnp.stack(losses_)))
        if not math.isfinite(train_loss):
            raise NonFiniteLossError(epoch, train_loss, None)
        vkey = jax.random.fold_in(key, 10**9 + epoch)
        vals = [training.eval_loss(graphdef, state["params"], b, vkey, loss_fn) * b[0].shape[0]
                for b in _batches(series, val_starts, L, H, config.eval_batch_size)]
        val = float(sum(vals)) / len(val_starts)
        history.append({"epoch": epoch + 1, "train_loss": train_loss, "val_loss": val})
        bar.set_postfix(train=f"{train_loss:.4f}", val=f"{val:.4f}")
        if val < best_val:
            best_val, bad = val, 0
            best = jax.tree.map(np.asarray, jax.device_get(state["params"]))
        else:
            bad += 1
            if bad >= config.patience:
                break
    seconds = time.perf_counter() - t0
    return graphdef, best, {"epochs": history, "best_val_loss": best_val, "train_seconds": seconds,
                            "steps_per_epoch": steps}


# ----------------------------------------------------------------------------------------------
# Statsmodels seasonal ARIMA (univariate)


def fit_arima(train: np.ndarray, config: ml_collections.ConfigDict):
    """Fits SARIMAX (with a constant) by maximum likelihood on the last ``arima_fit_steps`` training
    values of a univariate series. Returns ``(results, fit_seconds)``."""
    from statsmodels.tsa.statespace.sarimax import SARIMAX

    t0 = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fitted = SARIMAX(train[-config.arima_fit_steps:], order=tuple(config.arima_order),
                         seasonal_order=tuple(config.arima_seasonal_order), trend="c").fit(disp=False)
    return fitted, time.perf_counter() - t0


def arima_sampler(fitted, H: int, S: int):
    """Forecasts each window from its own L inputs with the fitted SARIMAX parameters (the same
    information the other methods get); the predictive Gaussian is represented by its S quantiles
    at levels (s + 1/2)/S. Returns ``sample_fn(x [B, L, 1]) -> [B, S, H, 1]``."""
    z = stats.norm.ppf((np.arange(S) + 0.5) / S)

    def sample(x: np.ndarray) -> np.ndarray:
        out = np.empty((x.shape[0], S, H, 1), np.float32)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for b in range(x.shape[0]):
                fc = fitted.apply(x[b, :, 0]).get_forecast(H)
                mean, std = np.asarray(fc.predicted_mean), np.sqrt(np.asarray(fc.var_pred_mean))
                out[b, :, :, 0] = mean[None] + std[None] * z[:, None]
        return out

    return sample


# ----------------------------------------------------------------------------------------------
# One dataset and horizon


def run_horizon(series: np.ndarray, table: data.Table, split: str, H: int,
                config: ml_collections.ConfigDict, key: jax.Array, name: str,
                arima_cache: dict | None = None):
    """Trains/fits every method for horizon H and scores them on the same test windows.

    ``arima_cache`` keeps the fitted ARIMA between horizons of one series (its fit does not depend
    on H). Returns ``(results {method: metrics + train_seconds}, fan data, histories)``."""
    L, S = config.input_len, config.eval_samples
    borders = data.split_borders(len(series), L, H, split)

    def starts(seg, stride=1):
        a, b = borders[seg]
        return a + np.arange(0, data.num_windows(b - a, L, H), stride)

    tr, va, te = starts("train"), starts("val", config.val_stride), starts("test", config.test_stride)
    cfg = PPMConfig(input_len=L, horizon=H, d_model=config.d_model, d_ff=config.d_ff)
    samplers, seconds, histories = {}, {}, {}
    k_ppm, k_gauss, k_eval = jax.random.split(key, 3)

    graphdef, params, hist = fit_network(
        PPM(cfg, rngs=nnx.Rngs(config.seed)),
        training.ppm_loss_fn(config.tau, config.bandwidth, config.train_samples), series, tr, va,
        config, H, config.learning_rate, k_ppm, f"{name} H={H} PPM")
    samplers["ppm"] = lambda x, k, g=graphdef, p=params: training.sample_ppm(g, p, x, k, S)
    seconds["ppm"], histories["ppm"] = hist["train_seconds"], hist

    chosen = tuple(config.baselines)
    unknown = set(chosen) - set(METHODS[1:])
    if unknown:
        raise ValueError(f"unknown baseline(s) {sorted(unknown)}; expected some of {METHODS[1:]}")
    if "gaussian_prior" in chosen:
        gd, gp, ghist = fit_network(GaussianPrior(cfg, rngs=nnx.Rngs(config.seed)),
                                    training.gaussian_loss_fn(), series, tr, va, config, H,
                                    config.gaussian_learning_rate, k_gauss,
                                    f"{name} H={H} Gaussian prior")
        samplers["gaussian_prior"] = lambda x, k, g=gd, p=gp: training.sample_gaussian(g, p, x, k, S)
        seconds["gaussian_prior"], histories["gaussian_prior"] = ghist["train_seconds"], ghist
    x_tr, y_tr = data.gather_windows(series, tr, L, H)
    if "linear" in chosen:
        t0 = time.perf_counter()
        lin = jax.block_until_ready(baselines.fit_linear(jnp.asarray(x_tr), jnp.asarray(y_tr),
                                                         config.linear_ridge))
        seconds["linear"] = time.perf_counter() - t0
        samplers["linear"] = lambda x, k, m=lin: baselines.linear_samples(m, x, k, S)
    if "seasonal_naive" in chosen:
        period = config.seasonal_period or data.seasonal_period_guess(table.timestamps)
        period = min(period, L)
        t0 = time.perf_counter()
        q = jax.block_until_ready(baselines.residual_quantiles(jnp.asarray(x_tr), jnp.asarray(y_tr),
                                                               H, period, S))
        seconds["seasonal_naive"] = time.perf_counter() - t0
        samplers["seasonal_naive"] = lambda x, k, q=q, p=period: baselines.seasonal_naive_samples(
            x, q, H, p)
    if "arima" in chosen and series.shape[1] == 1:
        arima_cache = {} if arima_cache is None else arima_cache
        if "fitted" not in arima_cache:
            arima_cache["fitted"], arima_cache["seconds"] = fit_arima(
                series[:borders["train"][1], 0], config)
        seconds["arima"] = arima_cache["seconds"]
        fn = arima_sampler(arima_cache["fitted"], H, S)
        samplers["arima"] = lambda x, k, fn=fn: jnp.asarray(fn(np.asarray(x)))
    del x_tr, y_tr

    results, fan = {}, {}
    fan_idx = np.linspace(0, len(te) - 1, config.fan_windows).astype(int) if config.fan_windows else []
    fan["x"], fan["y"] = data.gather_windows(series, te[fan_idx], L, H) if len(fan_idx) else (None, None)
    for method, sampler in samplers.items():
        sums, t0 = None, time.perf_counter()
        for i, (x, y) in enumerate(tqdm(_batches(series, te, L, H, config.eval_batch_size),
                                        total=-(-len(te) // config.eval_batch_size),
                                        desc=f"{name} H={H} score {method}", leave=False)):
            sums = metrics.add_sums(sums, metrics.metric_sums(sampler(x, jax.random.fold_in(k_eval, i)),
                                                              y, out_of_range=config.qice_out_of_range))
        m = metrics.finalize_metrics(sums)
        bad = sorted(k for k, v in m.items() if not math.isfinite(v))
        if bad:
            raise ValueError(f"{name} H={H} {method}: metrics {bad} are not finite: the forecasts or "
                             "the test targets contain NaN or infinite values")
        m["qice"] *= 100.0  # percent, as the paper reports it
        m["train_seconds"] = seconds[method]
        m["sample_seconds"] = time.perf_counter() - t0
        m["test_windows"] = len(te)
        results[method] = m
        print(f"[forecasting] {name} H={H} {method}: CRPS {m['crps']:.4f}, QICE {m['qice']:.3f}%, "
              f"MSE {m['mse']:.4f}, MAE {m['mae']:.4f}, train {m['train_seconds']:.0f} s", flush=True)
        if len(fan_idx):
            fan[method] = np.asarray(sampler(jnp.asarray(fan["x"]), k_eval))
    return results, fan, histories


def _fan_figure(fan: dict, title: str, channel: int, channel_name: str) -> plt.Figure:
    methods = [m for m in ("ppm", "linear", "arima") if m in fan]
    n = fan["x"].shape[0]
    fig, axes = plt.subplots(len(methods), n, figsize=(4.2 * n, 2.6 * len(methods)), squeeze=False)
    L, H = fan["x"].shape[1], fan["y"].shape[1]
    t_in, t_out = np.arange(-L, 0), np.arange(H)
    for r, method in enumerate(methods):
        s = fan[method][..., channel]                                        # [n, S, H]
        for c in range(n):
            ax = axes[r, c]
            q = np.quantile(s[c], [0.05, 0.25, 0.5, 0.75, 0.95], axis=0)
            ax.plot(t_in, fan["x"][c, :, channel], color="black", lw=0.8)
            ax.plot(t_out, fan["y"][c, :, channel], color="black", lw=0.8, label="truth")
            ax.fill_between(t_out, q[0], q[4], color="tab:blue", alpha=0.2, label="90%")
            ax.fill_between(t_out, q[1], q[3], color="tab:blue", alpha=0.35, label="50%")
            ax.plot(t_out, q[2], color="tab:blue", lw=1.0, label="median")
            ax.set_title(f"{LABELS[method]}, window {c + 1}", fontsize=9)
            if r == 0 and c == 0:
                ax.legend(fontsize=7, loc="upper left")
    fig.suptitle(f"{title}: channel {channel_name} (standardised)", fontsize=10)
    return fig


def _crps_figure(results: dict) -> plt.Figure:
    keys = [(d, h) for d in results for h in results[d]]
    methods = [m for m in METHODS if any(m in results[d][h] for d, h in keys)]
    fig, ax = plt.subplots(figsize=(max(5, 1.6 * len(keys) + 2), 3.2))
    width = 0.8 / len(methods)
    for j, m in enumerate(methods):
        vals = [results[d][h].get(m, {}).get("crps", np.nan) for d, h in keys]
        ax.bar(np.arange(len(keys)) + j * width, vals, width, label=LABELS[m])
    ax.set_xticks(np.arange(len(keys)) + 0.4 - width / 2, [f"{d}\nH={h}" for d, h in keys], fontsize=8)
    ax.set_ylabel("CRPS (lower is better)")
    ax.legend(fontsize=7)
    return fig


def _headline(results: dict) -> dict[str, str]:
    claim = ("ETTh1 96->192: CRPS 0.3369, MSE 0.4474, QICE 1.475% (authors' committed result); "
             "better accuracy and calibration than baselines")
    etth1 = next((results[d]["192"]["ppm"] for d in results if d.lower().startswith("etth1")
                  and "192" in results[d]), None)
    if etth1 is not None:
        ours = f"ETTh1 96->192: CRPS {etth1['crps']:.4f}, MSE {etth1['mse']:.4f}, QICE {etth1['qice']:.2f}%"
        ratio = max(etth1["crps"] / PAPER_ETTH1_192["crps"], etth1["mse"] / PAPER_ETTH1_192["mse"])
        if ratio <= 1.0:
            verdict = "yes"
        elif ratio <= 1.05:
            verdict = "partly"
        else:
            verdict = "no"
        return {"method": "PPM forecasting", "claim": claim, "ours": ours, "reproduces": verdict}
    wins, total, parts = 0, 0, []
    for d in results:
        for h, res in results[d].items():
            best_base = min(v["crps"] for m, v in res.items() if m != "ppm")
            wins += res["ppm"]["crps"] < best_base
            total += 1
            parts.append(f"{d} H={h}: PPM CRPS {res['ppm']['crps']:.3f} vs best baseline {best_base:.3f}")
    ours = (f"PPM has the lowest CRPS in {wins} of {total}: " + "; ".join(parts)
            + " (ETTh1 not in this run)")
    # Without ETTh1 the authors' numbers cannot be checked; beating the baselines is part of the claim.
    return {"method": "PPM forecasting", "claim": claim, "ours": ours,
            "reproduces": "partly" if wins else "no"}


def run(config: ml_collections.ConfigDict, workdir: str) -> report.Section:
    out = common.experiment_dir(workdir, NAME)
    paths = [p.strip() for p in config.data_path.split(",") if p.strip()] or [default_data_path()]
    if not config.horizons:
        raise ValueError("config.horizons is empty")
    key = jax.random.key(config.seed)
    results, figures, histories, info = {}, [], {}, {}
    t_all = time.perf_counter()
    if config.qice_out_of_range not in metrics.OUT_OF_RANGE:
        raise ValueError(f"config.qice_out_of_range must be one of {metrics.OUT_OF_RANGE}, got "
                         f"{config.qice_out_of_range!r}")
    for di, path in enumerate(paths):
        table = load_table(path, config.columns, config.fill_gaps)
        name = table.source.split(".")[0]
        split = data.resolve_split(config.split, table.source)
        borders = data.split_borders(len(table.values), config.input_len, max(config.horizons), split)
        series, _, _ = data.standardize(table.values, borders["train"][1], table.columns)
        info[name] = {"file": table.source, "steps": len(series), "channels": list(table.columns),
                      "split": split, "step": table.step, "fill_gaps": config.fill_gaps,
                      "filled_rows": table.filled_rows, "filled_cells": table.filled_cells}
        if table.filled_rows or table.filled_cells:
            print(f"[forecasting] {table.source}: fill_gaps={config.fill_gaps!r} inserted "
                  f"{table.filled_rows} row(s) and interpolated {table.filled_cells} missing value(s)",
                  flush=True)
        results[name], histories[name], arima_cache = {}, {}, {}
        for H in config.horizons:
            res, fan, hist = run_horizon(series, table, split, int(H), config,
                                         jax.random.fold_in(key, 1000 * di + int(H)), name, arima_cache)
            results[name][str(H)] = res
            histories[name][str(H)] = hist
            if fan.get("x") is not None and H == max(config.horizons):
                ch = len(table.columns) - 1
                figures.append(report.save_figure(
                    _fan_figure(fan, f"{name}, L={config.input_len}, H={H}", ch, table.columns[ch]),
                    os.path.join(out, f"fan_{name}_{H}.png")))
    figures.append(report.save_figure(_crps_figure(results), os.path.join(out, "crps.png")))
    headline = _headline(results)
    report.write_json(os.path.join(out, "metrics.json"), {
        "results": results, "datasets": info, "paper_etth1_96_192": PAPER_ETTH1_192,
        "units": "standardised scale; qice in percent; *_seconds wall-clock",
        "config": config.to_dict(), "histories": histories, "headline": headline,
        "total_seconds": time.perf_counter() - t_all})

    rows = []
    for d in results:
        for h, res in results[d].items():
            for m, v in res.items():
                rows.append([d, h, LABELS[m], v["crps"], v["crps_sum"], v["qice"], v["mse"], v["mae"],
                             v["coverage_50"], v["coverage_90"], v["train_seconds"]])
    table_md = report.markdown_table(
        ["data", "H", "method", "CRPS", "CRPS-sum", "QICE %", "MSE", "MAE", "cov 50", "cov 90",
         "train s"], rows)
    filled = "; ".join(
        f"{d}: {v['filled_rows']} row(s) inserted for missing time steps and {v['filled_cells']} "
        f"missing value(s) interpolated (fill_gaps={v['fill_gaps']!r})"
        for d, v in info.items() if v["filled_rows"] or v["filled_cells"])
    body = (f"Input length {config.input_len}, {config.eval_samples} samples per window, metrics on "
            f"the standardised scale over the test windows (every {config.test_stride}-th); QICE "
            f"with the {config.qice_out_of_range.upper()} reference code's treatment of targets "
            f"outside the samples' range. Data as read: "
            f"{filled if filled else 'every series complete at one time step, nothing filled'}. The "
            f"authors report on ETTh1 96->192: CRPS {PAPER_ETTH1_192['crps']}, QICE "
            f"{PAPER_ETTH1_192['qice']}%, MSE {PAPER_ETTH1_192['mse']}, MAE {PAPER_ETTH1_192['mae']}."
            f"\n\n{table_md}\n")
    return report.Section(title="Probabilistic forecasting: Parametric Prior Mapping", body=body,
                          figures=figures, headline=headline)


if __name__ == "__main__":
    common.app_main(NAME, run)
