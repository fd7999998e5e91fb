"""Data parsing/splits, baselines, the PPM network and its training step."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import properscoring
import pytest
from flax import nnx
from scipy import stats

from algorithms.forecasting import arima, baselines, data, metrics, training
from core.training import init_train_state, make_train_step
from models.forecasting import PPM, GaussianPrior, PPMConfig, instance_normalize

ETT_TEXT = "date,A,B\n2016-07-01 00:00:00,1.0,2\n2016-07-01 01:00:00,2.5,3\n2016-07-01 02:00:00,4,5\n"


def test_parse_ett_and_headerless():
    t = data.parse_table(ETT_TEXT, "x.csv")
    assert t.columns == ("A", "B") and t.timestamps[0] == "2016-07-01 00:00:00"
    np.testing.assert_array_equal(t.values, [[1, 2], [2.5, 3], [4, 5]])
    assert data.parse_table(ETT_TEXT, "x.csv", columns=("B",)).values[:, 0].tolist() == [2, 3, 5]
    h = data.parse_table("0.5,1\n0.6,2\n", "rates.txt")
    assert h.timestamps is None and h.values.shape == (2, 2)
    assert data.seasonal_period_guess(t.timestamps) == 24


# Every frequency pandas.infer_freq returns, with the period a seasonal-naive forecast repeats
# (the calendar cycle above the step; a multiple that does not divide the cycle: 1). Written out
# by hand, not computed by the code under test.
SEASONAL_PERIODS = [
    ("s", 3600), ("30s", 120), ("90s", 40), ("7s", 1), ("ms", 1), ("us", 1),
    ("min", 1440), ("2min", 720), ("7min", 1), ("10min", 144), ("15min", 96), ("30min", 48),
    ("h", 24), ("2h", 12), ("5h", 1), ("bh", 8),
    ("D", 7), ("2D", 1), ("B", 5),
    ("W-SUN", 52), ("W-WED", 52), ("2W-MON", 26), ("4W-SUN", 13), ("3W-SUN", 1),
    ("WOM-1MON", 12),
    ("MS", 12), ("ME", 12), ("BMS", 12), ("BME", 12), ("2MS", 6), ("5MS", 1),
    ("QS-JAN", 4), ("QE-DEC", 4), ("QS-MAR", 4), ("BQS-JAN", 4), ("BQE-DEC", 4), ("2QS-JAN", 2),
    ("YS-JAN", 1), ("YE-DEC", 1), ("BYS-JAN", 1), ("BYE-DEC", 1),
]


@pytest.mark.parametrize("freq,period", SEASONAL_PERIODS)
def test_seasonal_period_of_every_inferable_frequency(freq, period):
    import pandas as pd

    index = pd.date_range("2019-12-30 09:00", periods=40, freq=freq)
    stamps = tuple(str(t) for t in index)
    assert data.seasonal_period_guess(stamps) == period


def test_seasonal_period_of_files_as_the_reader_keeps_them():
    """Weekly and monthly files (which read 7 from the step before) give 52 and 12; quarters as
    YYYYQn 4; YYYYMMDD days 7; plain integers (undated) and two rows 1."""
    def stamps(first_column):
        text = "date,x\n" + "".join(f"{t},{i % 5}.5\n" for i, t in enumerate(first_column))
        return data.parse_table(text, "s.csv").timestamps

    weekly = [str(np.datetime64("2020-01-05") + np.timedelta64(7 * i, "D")) for i in range(30)]
    monthly = [f"{2000 + i // 12}-{i % 12 + 1:02d}-01" for i in range(30)]
    quarterly = [f"{1959 + i // 4}Q{i % 4 + 1}" for i in range(30)]
    compact = [str(np.datetime64("2020-02-20") + np.timedelta64(i, "D")).replace("-", "")
               for i in range(30)]
    assert data.seasonal_period_guess(stamps(weekly)) == 52
    assert data.seasonal_period_guess(stamps(monthly)) == 12
    assert data.seasonal_period_guess(stamps(quarterly)) == 4
    assert data.seasonal_period_guess(stamps(compact)) == 7
    assert data.seasonal_period_guess(stamps([str(1990 + i) for i in range(30)])) == 1
    assert data.seasonal_period_guess(stamps(weekly[:2])) == 1
    assert data.seasonal_period_guess(None) == 1


@pytest.mark.parametrize("text,match", [
    ("date,A\n2016,1\n2016,x1\n", r"x.csv, line 3, column 'A': non-numeric cell 'x1'"),
    ("date,A,B\n2016,1,2\n2016,1\n", r"line 3: 2 cells, expected 3"),
    ("date,A\n1,1\n2,\n3,nan\n4,2\n", r"column 'A' has 2 missing .* lines 3-4"),
    ("", "no data rows"),
    # a semicolon-separated file (decimal commas) is named as such, not "no value columns"
    ("date;A;B\n2016-01-01;1,5;2\n2016-01-02;2;3\n",
     r"x.csv, line 1: the first line is one cell when split on commas but 3 on semicolons "
     r".* looks semicolon-separated.* \(and decimal points\)"),
    ("date\tA\n2016-01-01\t1\n", r"but 2 on tabs"),
])
def test_parse_errors(text, match):
    with pytest.raises(ValueError, match=match):
        data.parse_table(text, "x.csv")


def test_missing_column_error():
    with pytest.raises(ValueError, match=r"missing column\(s\) \['OT'\]"):
        data.parse_table(ETT_TEXT, "x.csv", columns=("OT",))
    # the experiment's option to set is named
    with pytest.raises(ValueError, match=r"\['OT'\]; the header has \['A', 'B'\] after its first "
                                         r"column 'date', read as the timestamps \(set "
                                         r"--config\.columns=<name>,\.\.\. to some of them"):
        data.parse_table(ETT_TEXT, "x.csv", columns=("OT",), columns_option="--config.columns")
    # a file without its timestamp column: the first channel is named as read as the timestamps
    with pytest.raises(ValueError, match=r"the header has \['HULL'\] after its first column "
                                         r"'HUFL', read as the timestamps"):
        data.parse_table("HUFL,HULL\n5.8,2.0\n5.7,2.1\n", "x.csv", columns=("OT",))
    with pytest.raises(ValueError, match=r"a file with a header row reads its first column as the "
                                         r"timestamps"):
        data.parse_table("HUFL,HULL\n5.8,2.0\n5.7,2.1\n", "x.csv")
    with pytest.raises(ValueError, match=r"cannot be selected \(leave --config\.columns empty\)"):
        data.parse_table("0.5,1\n0.6,2\n", "x.txt", columns=("A",),
                         columns_option="--config.columns")


def test_splits_match_literature_conventions():
    b = data.split_borders(17420, 96, 192, data.resolve_split("auto", "dir/ETTh1.csv"))
    assert b == {"train": (0, 8640), "val": (8544, 11520), "test": (11424, 14400)}
    assert data.num_windows(b["test"][1] - b["test"][0], 96, 192) == 2689
    r = data.split_borders(7588, 96, 192, data.resolve_split("auto", "exchange_rate.txt.gz"))
    assert r == {"train": (0, 5311), "val": (5215, 6071), "test": (5975, 7588)}
    with pytest.raises(ValueError, match="too short"):
        data.split_borders(300, 96, 192, "ratio")
    with pytest.raises(ValueError, match="12/4/4"):
        data.split_borders(1000, 96, 192, "ett_hour")


def test_standardize_and_windows():
    v = np.arange(40, dtype=np.float64).reshape(20, 2)
    z, mean, std = data.standardize(v, 10)
    np.testing.assert_allclose(z[:10].mean(0), 0, atol=1e-6)
    np.testing.assert_allclose(z[:10].std(0), 1, rtol=1e-6)
    x, y = data.gather_windows(z, np.array([0, 3]), 4, 2)
    np.testing.assert_array_equal(x[1], z[3:7])
    np.testing.assert_array_equal(y[1], z[7:9])
    with pytest.raises(ValueError, match="constant"):
        data.standardize(np.ones((5, 1)), 5, ("OT",))


def test_linear_baseline_recovers_linear_process():
    rng = np.random.default_rng(0)
    L, H = 8, 3
    w_true = rng.normal(size=(L, H)) / L
    x = rng.normal(size=(500, L, 2))
    xc = x - x.mean(1, keepdims=True)
    y = np.einsum("bln,lh->bhn", xc, w_true) + x.mean(1, keepdims=True) + 0.1 * rng.normal(size=(500, H, 2))
    model = baselines.fit_linear(jnp.asarray(x, jnp.float32), jnp.asarray(y, jnp.float32), ridge=1e-6)
    # The centred window sums to zero over L, so W is identified only up to a constant added to
    # each column (that direction is fixed by the tiny ridge and float32 round-off): compare the
    # column-centred weights.
    w = np.asarray(model.weight)
    np.testing.assert_allclose(w - w.mean(0), w_true - w_true.mean(0), atol=0.03)
    np.testing.assert_allclose(np.asarray(model.std), 0.1, rtol=0.15)
    s = baselines.linear_samples(model, jnp.asarray(x[:2], jnp.float32), jax.random.key(0), 7)
    chex.assert_shape(s, (2, 7, H, 2))


def test_seasonal_naive_repeats_last_season():
    x = jnp.arange(10.0)[None, :, None]
    np.testing.assert_array_equal(np.asarray(baselines.seasonal_naive(x, 5, 3))[0, :, 0], [7, 8, 9, 7, 8])
    with pytest.raises(ValueError, match="period"):
        baselines.seasonal_naive(x, 5, 11)


def test_seasonal_naive_draws_resample_whole_residual_paths():
    # R = 5 integer residual paths [H=4, N=2] (exact in float32): every draw is the point forecast
    # plus one whole path, each path equally likely.
    rng = np.random.default_rng(1)
    r, h, n, period = 5, 4, 2, 3
    xs = jnp.asarray(rng.integers(-9, 9, size=(r, 10, n)), jnp.float32)
    paths = rng.integers(-20, 20, size=(r, h, n)).astype(np.float32)
    ys = baselines.seasonal_naive(xs, h, period) + paths
    resid = baselines.seasonal_residuals(xs, ys, h, period)
    np.testing.assert_array_equal(np.asarray(resid), paths)
    x = xs[:3]
    draws = np.asarray(baselines.seasonal_naive_samples(x, resid, jax.random.key(0), h, period, 3000))
    chex.assert_shape(draws, (3, 3000, h, n))
    offsets = draws - np.asarray(baselines.seasonal_naive(x, h, period))[:, None]
    match = np.all(offsets[:, :, None] == paths[None, None], axis=(-1, -2))     # [B, S, R]
    assert np.all(match.sum(-1) == 1)                       # each draw is exactly one path
    counts = match.sum((0, 1))
    expected = 3 * 3000 / r
    assert np.all(np.abs(counts - expected) < 5 * np.sqrt(expected * (1 - 1 / r))), counts
    with pytest.raises(ValueError, match="residuals must be"):
        baselines.seasonal_naive_samples(x, resid[:, :2], jax.random.key(0), h, period, 8)


def test_baseline_draws_score_their_predictive_distribution_without_bias():
    # Scored by the fair CRPS, the samplers' draws have the CRPS of the distribution they represent
    # in expectation: the linear forecaster's normal (properscoring.crps_gaussian), seasonal naive's
    # uniform distribution over the R residual paths (the plain CRPS of those R points).
    rng = np.random.default_rng(2)
    reps, s, L, h = 256, 100, 12, 3
    x = jnp.asarray(np.repeat(rng.normal(size=(1, L, 1)), reps, 0), jnp.float32)
    y = rng.normal(size=(h, 1)).astype(np.float32)
    lin = baselines.LinearForecaster(jnp.asarray(rng.normal(size=(L, h)) / L, jnp.float32),
                                     jnp.zeros((h,)), jnp.asarray([[0.5], [1.0], [2.0]], jnp.float32))
    point = np.asarray(baselines.linear_point(lin, x[:1]))[0]
    exact_lin = properscoring.crps_gaussian(y, point, np.asarray(lin.std))
    resid = jnp.asarray(rng.normal(size=(7, h, 1)), jnp.float32)
    naive = np.asarray(baselines.seasonal_naive(x[:1], h, 4))[0]
    exact_naive = properscoring.crps_ensemble(y, np.moveaxis(naive + np.asarray(resid), 0, -1))
    for draws, exact in ((baselines.linear_samples(lin, x, jax.random.key(3), s), exact_lin),
                         (baselines.seasonal_naive_samples(x, resid, jax.random.key(4), h, 4, s),
                          exact_naive)):
        target = jnp.broadcast_to(jnp.asarray(y), (reps, h, 1))
        fair = np.asarray(metrics.crps_ensemble(draws, target, axis=1), np.float64)
        se = fair.std(0, ddof=1) / np.sqrt(reps)
        assert np.all(np.abs(fair.mean(0) - exact) < 4 * se), (fair.mean(0), exact, se)


def test_arima_draws_come_from_the_ar1_predictive_normal():
    # AR(1) with a constant: the h-step predictive is N(mu + phi^h (x_L - mu),
    # sigma2 (1 - phi^(2h)) / (1 - phi^2)) with mu = c / (1 - phi), from the fitted parameters.
    rng = np.random.default_rng(4)
    z = np.zeros(400)
    for t in range(1, 400):
        z[t] = 0.3 + 0.7 * z[t - 1] + 0.5 * rng.normal()
    fitted, _ = arima.fit_arima(z, (1, 0, 0), (0, 0, 0, 0), 300)
    c, phi, sigma2 = (float(v) for v in fitted.params)
    mu = c / (1 - phi)
    x = z[-24:][None, :, None].astype(np.float32)
    hs = np.arange(1, 6)
    mean = mu + phi**hs * (x[0, -1, 0] - mu)
    std = np.sqrt(sigma2 * (1 - phi ** (2 * hs)) / (1 - phi**2))
    m, sd = arima.arima_predictive(fitted, x, 5)
    np.testing.assert_allclose(m[0], mean, rtol=1e-3, atol=1e-4)
    np.testing.assert_allclose(sd[0], std, rtol=1e-3)
    draws = arima.arima_sampler(fitted, 5, 4000)(x, jax.random.key(0))
    chex.assert_shape(draws, (1, 4000, 5, 1))
    for k in range(5):
        assert stats.kstest((draws[0, :, k, 0] - mean[k]) / std[k], "norm").pvalue > 1e-3
    again = arima.arima_sampler(fitted, 5, 4000)(x, jax.random.key(1))
    assert not np.allclose(draws, again)                    # draws, not a fixed quantile set


def test_halving_schedule():
    sched = training.halving_schedule(1e-3, 10)
    np.testing.assert_allclose([float(sched(s)) for s in (0, 9, 10, 19, 20, 30, 45)],
                               [1e-3, 1e-3, 1e-3, 1e-3, 5e-4, 2.5e-4, 1.25e-4], rtol=1e-6)


CFG = PPMConfig(input_len=12, horizon=5, d_model=8, d_ff=16)


def _split(seed=0):
    return nnx.split(PPM(CFG, rngs=nnx.Rngs(seed)))


def test_instance_normalization_roundtrip_and_equivariance():
    x = jax.random.normal(jax.random.key(0), (3, 12, 2)) * 4 + 1
    xn, mean, scale = jax.jit(instance_normalize)(x)
    chex.assert_trees_all_close(xn * scale + mean, x, atol=1e-5)
    np.testing.assert_allclose(np.asarray(xn).std(1, ddof=1), 1.0, rtol=1e-4)
    # PPM forecasts are affine-equivariant per channel: f(a x + b) = a f(x) + b (a > 0).
    graphdef, params = _split()
    key = jax.random.key(1)
    y1 = training.sample_ppm(graphdef, params, x, key, 4)
    y2 = training.sample_ppm(graphdef, params, 3.0 * x + 7.0, key, 4)
    chex.assert_shape(y1, (3, 4, 5, 2))
    chex.assert_trees_all_close(y2, 3.0 * y1 + 7.0, atol=2e-4, rtol=1e-4)


def test_ppm_channels_independent_and_samples_differ():
    graphdef, params = _split()
    x = jax.random.normal(jax.random.key(0), (2, 12, 3))
    key = jax.random.key(2)
    y = training.sample_ppm(graphdef, params, x, key, 6)
    x_changed = x.at[:, :, 2].add(jax.random.normal(key, (2, 12)))
    y_changed = training.sample_ppm(graphdef, params, x_changed, key, 6)
    chex.assert_trees_all_close(y[..., :2], y_changed[..., :2], atol=1e-6)
    assert float(jnp.std(y, axis=1).min()) > 0
    with pytest.raises(ValueError, match="L=12"):
        training.sample_ppm(graphdef, params, jnp.zeros((2, 11, 3)), key, 2)


def test_ppm_concat_split_equals_concat_layer():
    # The two-block first mapping layer equals a Linear on concat(z, E x~).
    graphdef, params = _split(3)
    x = jax.random.normal(jax.random.key(4), (2, 12, 1))
    key = jax.random.key(5)

    @jax.jit
    def by_hand(params):
        model = nnx.merge(graphdef, params)
        xn, mean, scale = instance_normalize(x)
        xt = jnp.swapaxes(xn, 1, 2)
        mu, logvar = model.prior(xt)
        eps = jax.random.normal(key, (2, 1, 3, CFG.d_model))
        z = mu[:, :, None] + jnp.exp(0.5 * logvar)[:, :, None] * eps
        cat = jnp.concatenate([z, jnp.broadcast_to(model.embed(xt)[:, :, None], z.shape)], -1)
        w = jnp.concatenate([model.map_in_z[...], model.map_in_c[...]], 0)
        out = model.map_out(jax.nn.gelu(cat @ w + model.map_in_b[...], approximate=False))
        return jnp.transpose(out, (0, 2, 3, 1)) * scale[:, None] + mean[:, None]

    chex.assert_trees_all_close(training.sample_ppm(graphdef, params, x, key, 3), by_hand(params),
                                atol=1e-5)


def test_training_reduces_loss_and_gaussian_prior_fits_noise_scale():
    rng = np.random.default_rng(0)
    t = np.arange(12 + 5)[None, :]
    phase = rng.uniform(0, 2 * np.pi, size=(64, 1))
    series = np.sin(0.5 * t + phase) + 0.2 * rng.normal(size=(64, 17))
    x = jnp.asarray(series[:, :12, None], jnp.float32)
    y = jnp.asarray(series[:, 12:, None], jnp.float32)
    graphdef, params = nnx.split(PPM(CFG, rngs=nnx.Rngs(0)))
    tx = optax.adam(1e-2)
    loss_fn = training.ppm_loss_fn(0.1, 0.3, 8)
    step = jax.jit(make_train_step(graphdef, tx, loss_fn), donate_argnums=0)
    state = init_train_state(params, tx)
    first = float(training.eval_loss(graphdef, state["params"], (x, y), jax.random.key(0), loss_fn))
    for i in range(120):
        state, _ = step(state, (x, y), jax.random.key(i))
    last = float(training.eval_loss(graphdef, state["params"], (x, y), jax.random.key(0), loss_fn))
    assert last < 0.5 * first
    assert np.isfinite(last)
    gd, gp = nnx.split(GaussianPrior(CFG, rngs=nnx.Rngs(0)))
    gstep = jax.jit(make_train_step(gd, tx, training.gaussian_loss_fn()), donate_argnums=0)
    gstate = init_train_state(gp, tx)
    for i in range(200):
        gstate, _ = gstep(gstate, (x, y), jax.random.key(i))
    _, std = jax.jit(lambda p: nnx.merge(gd, p)(x))(gstate["params"])
    # The noise is 0.2 on a sine the window determines: the fitted scale must be of that order.
    assert 0.12 < float(jnp.median(std)) < 0.4


def test_experiment_loader_reads_gzip_and_names_missing_file(tmp_path):
    import gzip

    from core.data.series import load_table

    path = tmp_path / "rates.txt.gz"
    with gzip.open(path, "wt") as f:
        f.write("0.5,1.0\n0.6,x\n")
    with pytest.raises(ValueError, match=r"rates.txt.gz, line 2, column 'c1': non-numeric cell 'x'"):
        load_table(str(path))
    with pytest.raises(FileNotFoundError, match="nope.csv"):
        load_table(str(tmp_path / "nope.csv"))
    csv = tmp_path / "ETTh9.csv"
    csv.write_text(ETT_TEXT)
    assert load_table(str(csv), "B").columns == ("B",)


# ----------------------------------------------------------------------------------------------
# Timestamps at one step (generated files in tmp_path, read through the experiment's loader).

T0 = np.datetime64("2016-07-01T00:00:00")


def _hourly_rows(n=200):
    """(timestamp text, A, B) for n hourly rows; A is linear in time so interpolation is exact."""
    t = np.arange(n)
    stamps = [str(T0 + np.timedelta64(int(h), "h")).replace("T", " ") for h in t]
    return [(s, 0.5 * float(h) + 3.0, float(np.sin(0.3 * h))) for s, h in zip(stamps, t, strict=True)]


def _write(tmp_path, rows, name="ETTh9.csv"):
    path = tmp_path / name
    path.write_text("date,A,B\n" + "".join(f"{s},{a!r},{b!r}\n" for s, a, b in rows))
    return str(path)


def test_dropped_rows_are_refused_with_file_and_line(tmp_path):
    from core.data.series import load_table

    rows = _hourly_rows()
    kept = rows[:100] + rows[160:]        # 60 rows (say, NaN rows) dropped: a 61-hour step
    # Header is line 1, kept row r is line r + 2: row 160 is now the 101st data row, line 102.
    with pytest.raises(ValueError, match=r"ETTh9.csv, line 102: timestamp '2016-07-07 16:00:00' comes "
                                         r"60 missing step\(s\) of 1:00:00 after '2016-07-05 03:00:00' "
                                         r"at line 101.*fill_gaps='linear'"):
        load_table(_write(tmp_path, kept))


def test_duplicated_rows_are_refused(tmp_path):
    from core.data.series import load_table

    rows = _hourly_rows()
    dup = rows[:74] + rows[50:74] + rows[74:]      # 24 rows repeated: time jumps back 23 hours
    with pytest.raises(ValueError, match=r"line 76: timestamp '2016-07-03 02:00:00' goes backwards "
                                         r"from '2016-07-04 01:00:00' at line 75"):
        load_table(_write(tmp_path, dup))
    with pytest.raises(ValueError, match=r"line 76: timestamp '2016-07-03 02:00:00' goes backwards"):
        load_table(_write(tmp_path, dup), fill_gaps="linear")   # never fillable
    twice = rows[:10] + rows[9:]                   # one row twice in a row
    with pytest.raises(ValueError, match=r"line 12: timestamp '2016-07-01 09:00:00' repeats "
                                         r"'2016-07-01 09:00:00' at line 11"):
        load_table(_write(tmp_path, twice))
    off = rows[:5] + [("2016-07-01 04:30:00", 1.0, 1.0)] + rows[5:]
    with pytest.raises(ValueError, match=r"line 7: timestamp '2016-07-01 04:30:00' is 0:30:00 after "
                                         r"'2016-07-01 04:00:00' at line 6, not a whole number of steps"):
        load_table(_write(tmp_path, off))
    # Blank lines count: the message gives the line in the file.
    path = tmp_path / "gap.csv"
    path.write_text("date,A\n\n2016-07-01 00:00:00,1\n2016-07-01 01:00:00,2\n\n2016-07-01 03:00:00,4\n")
    with pytest.raises(ValueError, match=r"gap.csv, line 6: .* comes 1 missing step"):
        load_table(str(path))


def test_fill_gaps_linear_inserts_and_reports_rows(tmp_path):
    from core.data.series import load_table

    rows = _hourly_rows()
    kept = rows[:100] + rows[160:]
    t = load_table(_write(tmp_path, kept), fill_gaps="linear")
    assert t.filled_rows == 60 and t.filled_cells == 0 and t.step == "1:00:00"
    assert t.timestamps == tuple(r[0] for r in rows)       # the regular hourly grid again
    # Column A is linear in time, so interpolation gives back the dropped values exactly (to
    # rounding); column B is interpolated on the straight line between rows 99 and 160.
    np.testing.assert_allclose(t.values[:, 0], [r[1] for r in rows], rtol=1e-12)
    h = np.arange(100, 160)
    want_b = rows[99][2] + (rows[160][2] - rows[99][2]) * (h - 99) / 61
    np.testing.assert_allclose(t.values[100:160, 1], want_b, rtol=1e-12)
    np.testing.assert_array_equal(t.values[160:, 1], [r[2] for r in rows[160:]])
    # A gap that would more than double the series is refused.
    far = str(T0 + np.timedelta64(9999, "h")).replace("T", " ")
    text = "date,A\n" + "".join(f"{r[0]},{r[1]}\n" for r in rows[:99]) + f"{far},1\n"
    with pytest.raises(ValueError, match=r"x.csv: filling the gaps would add 9900 rows to 100"):
        data.parse_table(text, "x.csv", fill_gaps="linear")


def test_fill_gaps_linear_interpolates_missing_values():
    text = "date,A,B\n1,1.0,10\n2,,20\n3,nan,30\n4,4.0,40\n"
    with pytest.raises(ValueError, match=r"column 'A' has 2 missing .* lines 3-4 .* fill_gaps='linear'"):
        data.parse_table(text, "x.csv")
    t = data.parse_table(text, "x.csv", fill_gaps="linear")
    np.testing.assert_allclose(t.values[:, 0], [1.0, 2.0, 3.0, 4.0])
    assert t.filled_cells == 2 and t.filled_rows == 0 and t.step == "1"
    with pytest.raises(ValueError, match=r"x.csv: column 'B' is missing at line 5, at the start or end"):
        data.parse_table("date,A,B\n1,1,1\n2,2,2\n3,3,3\n4,4,\n", "x.csv", fill_gaps="linear")
    with pytest.raises(ValueError, match="fill_gaps must be one of"):
        data.parse_table(text, "x.csv", fill_gaps="ffill")


def test_calendar_and_other_timestamp_formats():
    monthly = "date,A\n2015-11-01,1\n2015-12-01,2\n2016-01-01,3\n2016-02-01,4\n2016-03-01,5\n"
    t = data.parse_table(monthly, "m.csv")
    assert t.step == "1 month"                       # 30, 31, 31, 29 days: one calendar month
    with pytest.raises(ValueError, match=r"m.csv, line 4: timestamp '2016-02-01' comes 1 missing "
                                         r"step\(s\) of 1 month after '2015-12-01' at line 3"):
        data.parse_table(monthly.replace("2016-01-01,3\n", ""), "m.csv")
    filled = data.parse_table(monthly.replace("2016-01-01,3\n", ""), "m.csv", fill_gaps="linear")
    assert filled.timestamps[2] == "2016-01-01" and filled.filled_rows == 1
    quarterly = "period,A\n1974Q3,1\n1974Q4,2\n1975Q1,3\n1975Q3,5\n"
    with pytest.raises(ValueError, match=r"line 5: timestamp '1975Q3' comes 1 missing step\(s\) of "
                                         r"3 months"):
        data.parse_table(quarterly, "q.csv")
    assert data.parse_table(quarterly, "q.csv", fill_gaps="linear").timestamps[3] == "1975Q2"
    weekly = "date,co2\n19580329,316.1\n19580405,317.3\n19580419,317.5\n"
    w = data.parse_table(weekly, "co2.csv", fill_gaps="linear")
    assert w.step == "7 days" and w.timestamps[2] == "19580412"
    np.testing.assert_allclose(w.values[2, 0], 317.4)
    with pytest.raises(ValueError, match=r"years.csv, line 3: timestamp '1873' comes 1 missing "
                                         r"step\(s\) of 1 after '1871' at line 2"):
        data.parse_table("year,v\n1871,1\n1873,2\n1874,3\n1875,4\n1876,5\n", "years.csv")
    with pytest.raises(ValueError, match=r"x.csv, line 2: timestamp 'Jan-1-1995' is not understood"):
        data.parse_table("DATE,A\nJan-1-1995,1\nFeb-1-1995,2\n", "x.csv")


def test_halving_schedule_rejects_non_finite_rate():
    for bad in (float("nan"), float("inf"), 0.0):
        with pytest.raises(ValueError, match="base_lr > 0"):
            training.halving_schedule(bad, 10)
