"""The Stochastic Path Follower: reduction to SGD, dimension-free parameters, equivariances, training."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from algorithms.spf import baselines as B
from algorithms.spf import problems as P
from algorithms.spf import spf as S


def _stream(kind, T=12, M=4, d=6, seed=0):
    rng = np.random.default_rng(seed)
    A = jnp.asarray(rng.standard_normal((T, M, d)), jnp.float32)
    y = rng.standard_normal((T, M)) if kind == "lsq" else rng.random((T, M)) < 0.5
    return A, jnp.asarray(y, jnp.float32), jnp.asarray(rng.standard_normal(d), jnp.float32)


def _random_params(params, scale=0.5, seed=1):
    leaves, tree = jax.tree.flatten(params)
    keys = jax.random.split(jax.random.key(seed), len(leaves))
    new = [scale * jax.random.normal(k, x.shape) for k, x in zip(keys, leaves, strict=True)]
    return jax.tree.unflatten(tree, new)


@pytest.mark.parametrize("kind", ["lsq", "logistic"])
def test_zero_network_is_sgd(kind):
    cfg = S.SPFConfig(step=0.07)
    graphdef, params = S.init_spf(cfg)
    A, y, x0 = _stream(kind)
    X_sgd = B.sgd(A, y, x0, kind, B.SGDConfig(step=0.07))
    chex.assert_trees_all_close(S.spf(graphdef, params, A, y, x0, kind, cfg), X_sgd, atol=1e-6)
    zero = jax.tree.map(jnp.zeros_like, params)
    chex.assert_trees_all_close(S.spf(graphdef, zero, A, y, x0, kind, cfg), X_sgd, atol=1e-6)
    trained_like = _random_params(params)
    assert float(jnp.abs(S.spf(graphdef, trained_like, A, y, x0, kind, cfg) - X_sgd).max()) > 1e-3


def test_parameter_count_does_not_depend_on_dimension():
    cfg = S.SPFConfig(hidden=16)
    graphdef, params = S.init_spf(cfg)
    n = S.param_count(params)
    assert n == (S.NUM_FEATURES * 16 + 16) + (16 * 16 + 16) + (16 * 2 + 2)
    params = _random_params(params, 0.3)
    for d in (10, 10_000):
        A, y, x0 = _stream("lsq", T=3, M=2, d=d)
        X = S.spf(graphdef, params, A, y, x0, "lsq", cfg)
        assert X.shape == (3, d) and bool(jnp.all(jnp.isfinite(X)))
        assert S.param_count(params) == n


def test_equivariant_to_gradient_scale_and_coordinate_permutation():
    # in float64: both identities are exact in real arithmetic, and float32 rounding amplified by
    # 12 steps would make the tolerance depend on the machine's code generation (FMA or not)
    cfg = S.SPFConfig(step=0.05)
    graphdef, params = S.init_spf(cfg)
    with jax.enable_x64(True):
        params = jax.tree.map(lambda x: jnp.asarray(x, jnp.float64), _random_params(params))
        A, y, x0 = (jnp.asarray(a, jnp.float64) for a in _stream("lsq"))
        X = S.spf(graphdef, params, A, y, x0, "lsq", cfg)
        assert X.dtype == jnp.float64
        # least squares: (y, x0) -> (c y, c x0) scales every gradient feature and the decision by
        # c, up to the normaliser's floor sqrt(mean(g^2) + 1e-12): a relative 1e-12 / mean(g^2)
        # that grows to about 3e-9 as the gradients shrink over the episode (float32 rounding
        # would be 1e-3)
        chex.assert_trees_all_close(S.spf(graphdef, params, A, 3.0 * y, 3.0 * x0, "lsq", cfg),
                                    3.0 * X, rtol=1e-7, atol=1e-12)
        perm = np.random.default_rng(0).permutation(A.shape[-1])
        Xp = S.spf(graphdef, params, A[..., perm], y, x0[perm], "lsq", cfg)
        chex.assert_trees_all_close(Xp, X[:, perm], rtol=1e-9, atol=1e-12)  # summation order


def test_aux_diagnostics_and_population_grad():
    cfg = S.SPFConfig()
    graphdef, params = S.init_spf(cfg)
    A, y, x0 = _stream("logistic")
    X, aux = S.spf_rollout(graphdef, params, A, y, x0, "logistic", cfg, return_aux=True)
    np.testing.assert_allclose(np.asarray(aux["gain"]), 1.0)  # zero network: gain exp(0)
    np.testing.assert_allclose(np.asarray(aux["drift"]), 0.0)
    theta = jnp.array([[0.3, -0.2, 0.5]])
    x = jnp.array([[0.1, 0.4, -0.3]])
    h = 1e-2
    fd = [(P.excess_risk("logistic", x + h * e, theta) - P.excess_risk("logistic", x - h * e, theta))
          / (2 * h) for e in jnp.eye(3)]
    np.testing.assert_allclose(np.asarray(S.population_grad("logistic", x, theta))[0],
                               np.asarray(fd)[:, 0], rtol=1e-2, atol=1e-4)
    chex.assert_trees_all_close(S.population_grad("lsq", x, theta), x - theta)


def test_training_step_lowers_the_objective():
    problem = P.Problem(kind="lsq", drift="rotation", dim=4, batch=4, steps=20, dt=0.1, noise=0.3)
    cfg = S.SPFConfig(step=0.1)
    graphdef, params = S.init_spf(cfg)
    ep = P.sample_episodes(jax.random.key(0), problem, 4)
    obj = jax.jit(lambda p: S.spf_objective(p, graphdef, ep.theta, ep.A, ep.y, "lsq", cfg)[0])
    grad = jax.jit(jax.grad(lambda p: S.spf_objective(p, graphdef, ep.theta, ep.A, ep.y, "lsq", cfg)[0]))
    tx = optax.adam(1e-2)
    state = tx.init(params)
    loss0 = float(obj(params))
    for _ in range(3):
        updates, state = tx.update(grad(params), state)
        params = optax.apply_updates(params, updates)
    assert float(obj(params)) < loss0
    # the objective at init is SGD's time-averaged excess risk plus the weighted residual
    X = jax.vmap(lambda a, b: B.sgd(a, b, jnp.zeros(4), "lsq", B.SGDConfig(0.1)))(ep.A, ep.y)
    exc = 0.5 * jnp.mean(jnp.sum((X - ep.theta) ** 2, -1))
    np.testing.assert_allclose(loss0, float(exc * (1 + 2 * cfg.residual_weight)), rtol=1e-5)


@pytest.mark.parametrize("kwargs", [dict(step=0.0), dict(step=-0.1), dict(hidden=0), dict(ema=1.0),
                                    dict(max_log_gain=0.0), dict(residual_weight=-1.0),
                                    dict(burn_in=1.0)])
def test_bad_config_raises(kwargs):
    with pytest.raises(ValueError):
        S.SPFConfig(**kwargs)


def test_mismatched_stream_raises():
    cfg = S.SPFConfig()
    graphdef, params = S.init_spf(cfg)
    A, y, x0 = _stream("lsq")
    with pytest.raises(ValueError, match="x0"):
        S.spf(graphdef, params, A, y, x0[:3], "lsq", cfg)
    with pytest.raises(ValueError):
        S.make_loss_fn(P.Problem(), cfg, episodes=0)


def test_episode_loss_equals_sampling_loss_and_checks_the_batch():
    problem = P.Problem(kind="logistic", drift="sinusoid", dim=3, batch=2, steps=8)
    cfg = S.SPFConfig(step=0.2, hidden=4)
    graphdef, params = S.init_spf(cfg)
    model = nnx.merge(graphdef, _random_params(params))
    key = jax.random.key(5)
    ep = P.sample_episodes(key, problem, 3)
    batch = (ep.theta, ep.A, ep.y)
    loss_b, aux_b = S.make_episode_loss_fn("logistic", cfg)(model, batch, key)
    loss_k, aux_k = S.make_loss_fn(problem, cfg, 3)(model, None, key)
    assert float(loss_b) == float(loss_k) and float(aux_b["excess"]) == float(aux_k["excess"])
    # the loss is the mean over episodes: splitting the batch and averaging the halves agrees
    # (the halves jitted: eager, every primitive of each batch shape compiles on its own)
    episode_loss = jax.jit(S.make_episode_loss_fn("logistic", cfg))
    halves = [episode_loss(model, tuple(x[s] for x in batch), key)[0]
              for s in (slice(0, 1), slice(1, 3))]
    np.testing.assert_allclose(float(loss_b), (float(halves[0]) + 2 * float(halves[1])) / 3, rtol=1e-6)
    with pytest.raises(ValueError, match="kind"):
        S.make_episode_loss_fn("huber", cfg)
    loss_fn = S.make_episode_loss_fn("logistic", cfg)
    with pytest.raises(ValueError, match="episode batch"):
        loss_fn(model, (ep.theta, ep.A, ep.y, ep.eps), key)
    with pytest.raises(ValueError, match="episode batch"):
        loss_fn(model, (ep.theta[:, :-1], ep.A, ep.y), key)
