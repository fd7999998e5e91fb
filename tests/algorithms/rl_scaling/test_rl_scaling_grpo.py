"""GRPO advantages, clipped loss, k3 KL, pass@k, checker, allocation and fits."""

import itertools
import math

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from algorithms.rl_scaling import allocation, fit, grpo, metrics, tasks

# --- advantages ---------------------------------------------------------------------------------

def test_grpo_advantages_zero_mean_unit_std():
    rewards = jax.random.uniform(jax.random.key(0), (4 * 6,))
    adv = grpo.group_advantages(rewards, 6, eps=0.0).reshape(4, 6)
    chex.assert_trees_all_close(adv.mean(axis=1), jnp.zeros(4), atol=1e-6)
    chex.assert_trees_all_close(adv.std(axis=1), jnp.ones(4), atol=1e-5)


def test_drgrpo_advantages_are_mean_only_and_constant_groups_zero():
    rewards = jnp.array([1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0])
    dr = grpo.group_advantages(rewards, 4, mode="drgrpo")
    chex.assert_trees_all_close(dr, jnp.array([0.75, -0.25, -0.25, -0.25, 0, 0, 0, 0]))
    g = grpo.group_advantages(rewards, 4)
    # group 1: mean 1/4, population std sqrt(3)/4
    chex.assert_trees_all_close(g[:4], jnp.array([3.0, -1, -1, -1]) / math.sqrt(3), atol=1e-5)
    chex.assert_trees_all_close(g[4:], jnp.zeros(4))


def test_traced_group_size_matches_static_under_vmap():
    rewards = jax.random.bernoulli(jax.random.key(1), 0.4, (2, 16)).astype(jnp.float32)
    out = jax.vmap(lambda r, n: grpo.group_advantages(r, n))(rewards, jnp.array([2, 8]))
    chex.assert_trees_all_close(out[0], grpo.group_advantages(rewards[0], 2), atol=1e-6)
    chex.assert_trees_all_close(out[1], grpo.group_advantages(rewards[1], 8), atol=1e-6)


# --- clipped objective and KL -------------------------------------------------------------------

@pytest.mark.parametrize("log_ratio, adv, zero", [
    (math.log(1.5), 1.0, True),    # above 1 + eps_high with A > 0: clipped, no push further up
    (math.log(0.5), -1.0, True),   # below 1 - eps with A < 0: clipped, no push further down
    (math.log(0.5), 1.0, False),   # below the region with A > 0: gradient pulls back up
    (math.log(1.5), -1.0, False),  # above the region with A < 0: gradient pulls back down
    (math.log(1.1), 1.0, False),   # inside the region
])
def test_clip_gradient_zero_outside_trust_region_in_the_right_direction(log_ratio, adv, zero):
    def f(lp):
        return grpo.clipped_surrogate(lp, jnp.zeros((1, 1)), jnp.array([adv]), 0.2, 0.28).sum()

    g = float(jax.grad(f)(jnp.full((1, 1), log_ratio)).squeeze())
    if zero:
        assert g == 0.0
    else:  # d(rho A)/d logp = rho A
        assert g == pytest.approx(math.exp(log_ratio) * adv, rel=1e-5)


def test_k3_nonnegative_and_zero_at_equal_policies():
    a, b = jax.random.normal(jax.random.key(2), (2, 64))
    assert float(grpo.k3_kl(a, b).min()) >= 0.0
    chex.assert_trees_all_close(grpo.k3_kl(a, a), jnp.zeros(64))
    # Unbiased: E_{x~p}[k3] = KL(p || q) for two categoricals.
    p, q = jnp.array([0.2, 0.5, 0.3]), jnp.array([0.4, 0.4, 0.2])
    k3 = (p * grpo.k3_kl(jnp.log(p), jnp.log(q))).sum()
    assert float(k3) == pytest.approx(float((p * jnp.log(p / q)).sum()), rel=1e-5)


# One position over V = 4 outcomes: logits z, uniform reference, zero advantages, kl_beta = 1.
_Z = np.array([2.0, 0.0, -1.0, 0.5])
_REF = np.full(4, 0.25)


def _expected_loss_gradient(estimator, old_logits=None):
    """sum_a pi_old(a) * d loss(a) / dz, exactly over the V = 4 outcomes, with the loss's own
    stop-gradients: on-policy (``old_logits`` None) old_logp is stop_gradient(logp), as the first
    inner step of the trainer; otherwise the behaviour log-probs of ``old_logits`` (constants)."""
    cfg = grpo.GRPOConfig(kl_beta=1.0, kl_estimator=estimator, adv_eps=0.0)
    ref_logp = jnp.log(jnp.asarray(_REF, jnp.float32))
    z = jnp.asarray(_Z, jnp.float32)
    old = None if old_logits is None else jax.nn.log_softmax(jnp.asarray(old_logits, jnp.float32))

    def loss(z, a):
        logp = jax.nn.log_softmax(z)[a].reshape(1, 1)
        old_logp = jax.lax.stop_gradient(logp) if old is None else old[a].reshape(1, 1)
        return grpo.grpo_loss(logp, old_logp, jnp.zeros(1), jnp.ones((1, 1)), cfg,
                              ref_logp[a].reshape(1, 1))

    weights = jax.nn.softmax(z) if old is None else jnp.exp(old)
    grads = jnp.stack([jax.grad(lambda z, a=a: loss(z, a)[0])(z) for a in range(4)])
    kls = jnp.stack([loss(z, a)[1]["kl"] for a in range(4)])
    return np.asarray(weights @ grads), float(weights @ kls)


def _reverse_kl_gradient():
    """d KL(pi || ref) / dz for pi = softmax(z), from the definition: pi * (log(pi / ref) - KL)."""
    pi = np.exp(_Z - _Z.max())
    pi /= pi.sum()
    kl = float(pi @ np.log(pi / _REF))
    return pi * (np.log(pi / _REF) - kl), kl


def test_kl_penalty_expected_gradient_is_that_of_reverse_kl():
    """The default penalty (rho * k3) descends KL(pi || ref) as the docstring states; plain k3's
    expected gradient is that of KL(ref || pi) (= pi - ref for a softmax), a different vector."""
    want, _ = _reverse_kl_gradient()
    np.testing.assert_allclose(want, [0.3806, -0.1407, -0.0871, -0.1528], atol=5e-5)
    assert grpo.GRPOConfig().kl_estimator == "k3_ratio"
    for estimator in ("k3_ratio", "k2"):  # k2: the same gradient on-policy
        got, _ = _expected_loss_gradient(estimator)
        np.testing.assert_allclose(got, want, atol=1e-6, err_msg=estimator)
    old_k3, _ = _expected_loss_gradient("k3")
    np.testing.assert_allclose(old_k3, [0.4601, -0.1539, -0.2146, -0.0916], atol=5e-5)
    pi = np.exp(_Z) / np.exp(_Z).sum()
    np.testing.assert_allclose(old_k3, pi - _REF, atol=1e-6)  # grad of KL(ref || pi)
    assert np.abs(old_k3 - want).max() > 0.1


def test_k3_ratio_is_unbiased_off_policy_and_its_kl_metric_too():
    """Samples from a behaviour policy pi_old != pi (a later inner step): rho * k3 still has the
    expected gradient of KL(pi || ref), and the reported kl is an unbiased estimate of its value;
    k2 loses the gradient off-policy."""
    want, kl = _reverse_kl_gradient()
    old_logits = [0.0, 1.0, 0.0, -1.0]
    got, kl_metric = _expected_loss_gradient("k3_ratio", old_logits)
    np.testing.assert_allclose(got, want, atol=1e-6)
    assert kl_metric == pytest.approx(kl, rel=1e-5)
    k2, _ = _expected_loss_gradient("k2", old_logits)
    assert np.abs(k2 - want).max() > 0.05


def test_kl_estimator_is_validated_and_named_by_the_experiment_config():
    with pytest.raises(ValueError, match="kl_estimator"):
        grpo.GRPOConfig(kl_estimator="k1")
    with pytest.raises(ValueError, match="estimator"):
        grpo.kl_penalty(jnp.zeros((1, 1)), jnp.zeros((1, 1)), jnp.zeros((1, 1)), "kl")
    import typing

    from core import config as cfg_lib
    from experiments.configs import rl_scaling as rl_config
    kind = typing.get_type_hints(rl_config.Config, include_extras=True)["kl_estimator"]
    for name in ("tiny", "smoke", "full", "paper"):
        assert rl_config.get_config(name).kl_estimator == "k3_ratio"
    assert all(cfg_lib.refusal(kind, e) is None for e in grpo.KL_ESTIMATORS)
    assert cfg_lib.refusal(kind, "k1")


def test_aggregation_modes_closed_form():
    per_tok = jnp.array([[1.0, 2.0, 3.0], [4.0, 0.0, 0.0]])
    mask = jnp.array([[1, 1, 1], [1, 0, 0]], bool)
    assert float(grpo.aggregate(per_tok, mask, "seq_mean")) == pytest.approx((2.0 + 4.0) / 2)
    assert float(grpo.aggregate(per_tok, mask, "token_mean")) == pytest.approx(10.0 / 4)
    assert float(grpo.aggregate(per_tok, mask, "constant")) == pytest.approx(10.0 / 6)


def test_grpo_step_on_two_armed_policy_matches_hand_computation():
    # Policy softmax(theta) over two arms; group of n = 2 with one pull of each arm, arm 0
    # rewarded. A = (+1, -1); grad of the (seq_mean) loss = -(1/2) sum_i A_i (e_{a_i} - pi) =
    # (-1/2, +1/2) at theta = 0, so one SGD step with lr 1 gives theta = (1/2, -1/2) and
    # pi(arm 0) = sigmoid(1).
    actions = jnp.array([0, 1])
    rewards = jnp.array([1.0, 0.0])
    cfg = grpo.GRPOConfig(adv_eps=0.0)
    adv = grpo.group_advantages(rewards, 2, eps=0.0)

    def loss(theta):
        logp = jax.nn.log_softmax(theta)[actions][:, None]
        return grpo.grpo_loss(logp, jax.lax.stop_gradient(logp), adv, jnp.ones((2, 1)), cfg)[0]

    theta = jnp.zeros(2)
    tx = optax.sgd(1.0)
    g = jax.grad(loss)(theta)
    chex.assert_trees_all_close(g, jnp.array([-0.5, 0.5]), atol=1e-6)
    theta = optax.apply_updates(theta, tx.update(g, tx.init(theta))[0])
    assert float(jax.nn.softmax(theta)[0]) == pytest.approx(1 / (1 + math.exp(-1.0)), rel=1e-6)


def test_grpo_loss_kl_needs_reference():
    z = jnp.zeros((2, 3))
    with pytest.raises(ValueError, match="ref_logp"):
        grpo.grpo_loss(z, z, jnp.zeros(2), z, grpo.GRPOConfig(kl_beta=0.1))


# --- pass@k -------------------------------------------------------------------------------------

@pytest.mark.parametrize("n, c, k", [(5, 0, 1), (5, 2, 1), (6, 2, 3), (7, 3, 5), (8, 1, 8),
                                     (10, 4, 4), (4, 4, 2)])
def test_pass_at_k_matches_enumeration(n, c, k):
    outcomes = [1] * c + [0] * (n - c)
    subsets = list(itertools.combinations(range(n), k))
    brute = np.mean([any(outcomes[i] for i in s) for s in subsets])
    assert float(metrics.pass_at_k(n, c, k)) == pytest.approx(brute, abs=1e-5)


def test_pass_at_k_rejects_k_above_n_and_expected_form():
    with pytest.raises(ValueError, match="exceeds"):
        metrics.pass_at_k(jnp.array([4]), jnp.array([1]), 5)
    p = jnp.array([0.1, 0.5])
    chex.assert_trees_all_close(metrics.expected_pass_at_k(p, 3), 1 - (1 - p) ** 3)


# --- tasks and checker --------------------------------------------------------------------------

@pytest.mark.parametrize("text, target, reward", [
    ("521\n", 125, 1.0), ("521\nzzz", 125, 1.0), ("521", 125, 0.0), ("125\n", 125, 0.0),
    ("5210\n", 125, 0.0), (" 521\n", 125, 0.0), ("-521\n", 125, 0.0), ("52 1\n", 125, 0.0),
    ("\n", 125, 0.0), ("0\n", 0, 1.0), ("00\n", 0, 0.0), ("11\n", 11, 1.0), ("5a1\n", 125, 0.0),
])
def test_checker_hand_written_cases(text, target, reward):
    assert tasks.check_answer(text, target) == reward


def test_token_checker_agrees_with_text_checker():
    ops = np.array([[57, 68], [0, 0], [99, 1], [10, 20]])
    targets, lens = tasks.encode_answers(ops, 5)
    cands = ["521\n", "0\n", "001\n", "03\n", "52", "125\n", "5\n12", "03\n\n\n"]
    for text in cands:
        toks = np.full((4, 5), tasks.END_ID, np.int32)  # the rollout fills rows with END
        b = np.frombuffer(text.encode()[:5], np.uint8)
        toks[:, :len(b)] = b
        got = tasks.exact_match(jnp.asarray(toks), jnp.asarray(targets), jnp.asarray(lens))
        decoded = bytes(toks[0].astype(np.uint8)).decode()
        want = [tasks.check_answer(decoded, s) for s in ops.sum(1)]
        chex.assert_trees_all_equal(np.asarray(got), np.asarray(want, np.float32))
    # truncated: five digits and no end byte
    toks = np.frombuffer(b"52111", np.uint8).astype(np.int32)[None].repeat(4, 0)
    assert float(tasks.exact_match(jnp.asarray(toks), jnp.asarray(targets),
                                   jnp.asarray(lens)).max()) == 0.0


def test_split_is_disjoint_and_prompts_encode():
    task = tasks.ArithmeticTask(2, 2)
    tr, ho = tasks.make_split(task, 500, 100, seed=0)
    assert not {tuple(r) for r in tr} & {tuple(r) for r in ho}
    assert len({tuple(r) for r in tr}) == 500
    p = tasks.encode_prompts(np.array([[7, 45]]), 8, 2)
    assert p[0, 0] == tasks.BOS_ID and bytes(p[0, 1:].astype(np.uint8)).decode() == " 07+45="
    with pytest.raises(ValueError):
        tasks.make_split(task, 9_999, 2, seed=0)


# --- allocation ---------------------------------------------------------------------------------

def test_allocation_validation():
    a = allocation.Allocation(1024, 8, 16)
    assert (a.steps, a.rollouts_per_step) == (8, 128)
    with pytest.raises(ValueError, match="n >= 2"):
        allocation.Allocation(1024, 1, 16)
    assert allocation.Allocation(1024, 1, 16, group_normalized=False).steps == 64
    with pytest.raises(ValueError, match="not divisible"):
        allocation.Allocation(1000, 8, 16)
    with pytest.raises(ValueError, match="n >= 2"):
        grpo.GRPOConfig().check_group_size(1)
    with pytest.raises(ValueError):
        grpo.GRPOConfig(aggregation="sum")
    assert allocation.budget_grid(64, 4) == (64, 128, 256, 512)


# --- fits ---------------------------------------------------------------------------------------

def test_n_star_parabola_vertex_and_boundary():
    x = np.log2([2, 4, 8, 16, 32])
    y = -(x - 2.6) ** 2
    assert fit.n_star(x, y) == pytest.approx(2.6)
    assert fit.n_star(x, x) == pytest.approx(x[-1])  # increasing: best grid point


def test_fit_scaling_prefers_the_true_form():
    c = np.arange(6, 16, 1.0)
    sat = fit.sigmoid_law(c, 5.0, 10.0, 0.8, 1.0)
    assert fit.fit_scaling(c, sat, lo=1.0, hi_max=7.0).winner == "sigmoid"
    lin = 0.3 * c - 1.0
    f = fit.fit_scaling(c, lin, lo=min(lin) - 1, hi_max=10.0)
    assert f.winner == "power" and f.power["b"] == pytest.approx(0.3)


def test_bootstrap_interval_contains_point():
    x = np.log2([2, 4, 8])
    r = np.array([[0.1, 0.3, 0.2], [0.12, 0.28, 0.25], [0.09, 0.31, 0.22]])
    p, lo, hi = fit.bootstrap_n_star(x, r, 50, 0)
    assert lo <= p <= hi and 1.0 <= lo and hi <= 3.0


def test_warm_start_mixture_batches_and_resumable():
    from algorithms.rl_scaling.tasks import MixtureBatches
    easy = {"lens": np.zeros(50, np.int32), "src": np.zeros(50, np.int32)}
    hard = {"lens": np.ones(30, np.int32), "src": np.ones(30, np.int32)}
    it = MixtureBatches(easy, hard, batch_size=20, hard_fraction=0.35, seed=3)
    batches = [next(it) for _ in range(4)]
    assert [int(b["src"].sum()) for b in batches] == [7] * 4  # round(20 * 0.35) hard rows
    assert next(MixtureBatches(easy, hard, 20, 0.0, seed=3))["src"].sum() == 0
    again = MixtureBatches(easy, hard, batch_size=20, hard_fraction=0.35, seed=3)
    again.position = 3
    np.testing.assert_array_equal(next(again)["src"], batches[3]["src"])
    with pytest.raises(ValueError):
        MixtureBatches(easy, hard, batch_size=20, hard_fraction=1.5, seed=3)
