"""KV-cache rollouts with an end token, teacher-forced log-probs, and the vmapped GRPO step."""

import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from algorithms.rl_scaling import grpo, rollout, tasks, trainer
from models.transformer import Transformer, TransformerConfig


@functools.cache
def _model():
    """(graphdef, params) of the policy; built once and shared (the tests only read it)."""
    cfg = TransformerConfig(vocab_size=258, max_len=14, d_model=32, num_layers=1, num_heads=2,
                            mlp_dim=32)
    return nnx.split(Transformer(cfg, rngs=nnx.Rngs(0)))


# The model's forward, teacher-forced log-probs and answer probabilities, compiled (an eager NNX
# call compiles every primitive on its own); one compilation per input shape.
@functools.partial(jax.jit, static_argnums=0)
def _forward(gd, params, tokens):
    return nnx.merge(gd, params)(tokens)


@functools.partial(jax.jit, static_argnums=0, static_argnames="temperature")
def _completion_logprobs(gd, params, prompts, completions, prompt_rows=None, temperature=1.0):
    return rollout.completion_logprobs(nnx.merge(gd, params), prompts, completions, prompt_rows,
                                       temperature=temperature)


_TX = optax.adam(1e-2)
_STEP_GRPO = grpo.GRPOConfig(inner_steps=2, clip_eps_high=0.28)


@functools.cache
def _vmapped_step(spec):
    """The RL step of ``spec`` with Adam(1e-2), vmapped over (params, opt_state, key, n) and
    jitted; shared by the tests that run the same spec (one compilation per pool shape)."""
    return jax.jit(jax.vmap(trainer.make_rl_step(_model()[0], _TX, spec),
                            in_axes=(0, 0, 0, 0, None, None)))


@functools.cache
def _self_target_pool():
    """A pool of 32 problems whose target is the policy's own most likely first byte, and a
    sampling temperature at which that byte is drawn about half the time (groups then have mixed
    rewards): (pool, temperature)."""
    gd, params = _model()
    ops = np.array([[a, b] for a in range(8) for b in range(4)])
    prompts = jnp.asarray(tasks.encode_prompts(ops, 7, 2))
    logits = _forward(gd, params, prompts)[:, -1]
    first = jnp.argmax(logits, axis=-1).astype(jnp.int32)
    temperature = next(t for t in (1.0, 0.3, 0.1, 0.03, 0.01, 0.003)
                       if float(jax.nn.softmax(logits / t).max(axis=-1).mean()) >= 0.4)
    targets = jnp.full((len(ops), 4), tasks.END_ID, jnp.int32).at[:, 0].set(first)
    pool = {"prompts": prompts, "targets": targets, "lens": jnp.ones((len(ops),), jnp.int32)}
    return pool, temperature


def test_completion_mask():
    t = jnp.array([[1, 2, 10, 3], [10, 10, 4, 5], [1, 1, 1, 1]])
    chex.assert_trees_all_equal(rollout.completion_mask(t, 10), jnp.array(
        [[1, 1, 1, 0], [1, 0, 0, 0], [1, 1, 1, 1]], bool))


def test_rollout_logprobs_match_teacher_forcing_and_stop_at_end():
    gd, params = _model()
    ops = np.array([[12, 34], [5, 99], [0, 0], [77, 8]])
    prompts = jnp.asarray(tasks.encode_prompts(ops, 7, 2))
    # end token = the most likely first byte, so that rows stop early
    end = int(jnp.argmax(_forward(gd, params, prompts)[0, -1]))
    toks, logp, mask = jax.jit(lambda p, k: rollout.rollout(
        gd, p, prompts, k, max_new_tokens=6, end_id=end, temperature=0.05))(params, jax.random.key(0))
    tf = _completion_logprobs(gd, params, prompts, toks, temperature=0.05)
    chex.assert_trees_all_close(jnp.where(mask, logp, 0), jnp.where(mask, tf, 0), atol=2e-5)
    # after the first end token every position holds the end token and is masked
    first = np.argmax(np.asarray(toks) == end, axis=1)
    has = (np.asarray(toks) == end).any(axis=1)
    assert has.any()
    for i in range(4):
        if has[i]:
            assert (np.asarray(toks)[i, first[i]:] == end).all()
            assert np.asarray(mask)[i].sum() == first[i] + 1


def _tempered_logprobs(gd, params, prompts, completions, temperature):
    """log softmax(logits / temperature) of each completion token from one causal forward pass
    over prompt + completion (no KV cache, no shared prefill), in float64 numpy: float64 [R, T]."""
    seq = np.concatenate([np.asarray(prompts), np.asarray(completions)], axis=1)
    p = prompts.shape[1]
    z = np.asarray(_forward(gd, params, jnp.asarray(seq[:, :-1]))[:, p - 1:], np.float64)
    z /= temperature
    z -= z.max(axis=-1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(axis=-1, keepdims=True))
    return np.take_along_axis(logp, seq[:, p:, None], axis=-1)[..., 0]


def test_loss_logprobs_are_the_sampling_policy_at_temperature():
    """At tau = 0.6 the rollout's log-probs, and those the loss takes (current, behaviour and
    reference alike, :func:`trainer.policy_logprobs`), are log softmax(logits / tau) of the sampled
    tokens, so the importance ratio of the sampling policy is 1 on-policy; temperature-1 log-probs
    are not those of the sampling policy."""
    gd, params = _model()
    tau = 0.6
    prompts = jnp.asarray(tasks.encode_prompts(np.array([[12, 34], [5, 99]]), 7, 2))
    rows = jnp.array([0, 0, 0, 1, 1, 1], jnp.int32)
    toks, roll_logp, mask = jax.jit(lambda p: rollout.rollout(
        gd, p, prompts, jax.random.key(5), max_new_tokens=5, end_id=tasks.END_ID,
        temperature=tau, prompt_rows=rows))(params)
    want = _tempered_logprobs(gd, params, prompts[rows], toks, tau)
    loss_logp = jax.jit(trainer.policy_logprobs, static_argnums=(0, 5))(gd, params, prompts, toks,
                                                                          rows, tau)
    m = np.asarray(mask)
    np.testing.assert_allclose(np.asarray(roll_logp)[m], want[m], atol=1e-5)
    np.testing.assert_allclose(np.asarray(loss_logp)[m], want[m], atol=1e-5)
    ratio = np.exp(np.asarray(loss_logp) - np.asarray(roll_logp))[m]
    np.testing.assert_allclose(ratio, 1.0, atol=1e-5)
    _, aux = grpo.grpo_loss(loss_logp, roll_logp, jnp.ones(6), mask, grpo.GRPOConfig())
    assert float(aux["clip_frac"]) == 0.0 and float(aux["ratio_mean"]) == pytest.approx(1, abs=1e-5)
    # the temperature-1 log-probs of the same tokens are a different policy
    t1 = _tempered_logprobs(gd, params, prompts[rows], toks, 1.0)
    assert np.abs(t1 - want)[m].max() > 0.1
    with pytest.raises(ValueError, match="temperature"):
        rollout.completion_logprobs(nnx.merge(gd, params), prompts, toks, rows, temperature=0.0)


def test_rl_step_with_kl_at_temperature_is_on_policy_and_probes_the_sampling_policy():
    """The GRPO step at tau = 0.6 with a KL penalty to a reference equal to the policy: the
    reference log-probs are at tau too (KL exactly 0), the first inner step is on-policy, and the
    pass-rate probe is the exact pass@1 of sampling at tau."""
    gd, params = _model()
    tau = 0.6
    ops = np.array([[a, b] for a in range(2) for b in range(4)])
    targets, lens = tasks.encode_answers(ops, 4)
    pool = {"prompts": jnp.asarray(tasks.encode_prompts(ops, 7, 2)),
            "targets": jnp.asarray(targets), "lens": jnp.asarray(lens)}
    spec = trainer.RLSpec(rollouts_per_step=8, max_new_tokens=4, temperature=tau,
                          grpo=grpo.GRPOConfig(kl_beta=0.5))
    tx = optax.sgd(0.0)  # no update: pass_after = pass_before
    step = jax.jit(trainer.make_rl_step(gd, tx, spec))
    _, _, m = step(params, tx.init(params), jax.random.key(0), jnp.int32(2), pool, params)
    assert float(m["kl"]) == 0.0 and float(m["ratio_mean"]) == 1.0
    assert float(m["clip_frac"]) == 0.0
    # the batch holds B_p = R / n = 4 problems, the first 4 that sample_batch draws with the step's
    # batch key; the probe is their mean exact pass@1 at tau, recomputed here from the definition
    ids = np.asarray(trainer.sample_batch(jax.random.split(jax.random.key(0))[0], 8, 8,
                                          jnp.int32(2))[1])[:4]
    tm = np.asarray(trainer.target_mask(jnp.asarray(lens), 4))
    logp = _tempered_logprobs(gd, params, pool["prompts"][ids], jnp.asarray(targets[ids]), tau)
    want = np.exp((logp * tm[ids]).sum(axis=1)).mean()
    assert float(m["pass_before"]) == pytest.approx(want, rel=1e-4)
    assert float(m["pass_after"]) == pytest.approx(want, rel=1e-4)


def test_answer_prob_is_probability_of_the_target_sequence():
    gd, params = _model()
    ops = np.array([[12, 34], [5, 9]])
    prompts = jnp.asarray(tasks.encode_prompts(ops, 7, 2))
    targets, lens = tasks.encode_answers(ops, 4)
    p = jax.jit(trainer.answer_prob, static_argnums=0)(gd, params, prompts, jnp.asarray(targets),
                                                       jnp.asarray(lens))
    for i in range(2):  # product of next-token probabilities, computed step by step
        seq = prompts[i]
        prob = 1.0
        for t in range(int(lens[i])):
            logits = _forward(gd, params, seq[None])[0, -1]
            prob *= float(jax.nn.softmax(logits)[targets[i, t]])
            seq = jnp.concatenate([seq, jnp.asarray(targets[i, t:t + 1])])
        assert float(p[i]) == pytest.approx(prob, rel=1e-4)


def test_vmapped_rl_step_with_traced_n_is_finite_and_updates():
    gd, params = _model()
    # the pool and spec of the distinct-rows test below (the same compiled step), with the true
    # answers as targets: an untrained policy essentially never samples them
    self_pool, temperature = _self_target_pool()
    ops = np.array([[a, b] for a in range(8) for b in range(4)])
    targets, lens = tasks.encode_answers(ops, 4)
    pool = {"prompts": self_pool["prompts"], "targets": jnp.asarray(targets),
            "lens": jnp.asarray(lens)}
    spec = trainer.RLSpec(rollouts_per_step=8, max_new_tokens=4, grpo=_STEP_GRPO,
                          temperature=temperature)
    step = _vmapped_step(spec)
    stacked = jax.tree.map(lambda x: jnp.stack([x, x]), params)
    opt = jax.vmap(_TX.init)(stacked)
    new, _, m = step(stacked, opt, jax.random.split(jax.random.key(0), 2), jnp.array([2, 4]),
                     pool, None)
    for v in m.values():
        assert np.isfinite(np.asarray(v)).all()
    assert m["reward"].shape == (2,)
    # with all-zero rewards there is no signal and the parameters must not move
    moved = [float(jnp.abs(a - b).max()) for a, b in zip(jax.tree.leaves(new),
                                                         jax.tree.leaves(stacked))]
    if float(np.asarray(m["informative"]).max()) == 0.0:
        assert max(moved) == 0.0
    assert ((np.asarray(m["fallen"]) >= 0) & (np.asarray(m["fallen"]) <= 1)).all()


@functools.partial(jax.jit, static_argnums=(0, 6))
def _flat_grad(gd, params, prompt, comps, msk, adv, cfg):
    def loss(p):
        model = nnx.merge(gd, p)
        prompts = jnp.broadcast_to(prompt, (comps.shape[0], prompt.shape[0]))
        logp = rollout.completion_logprobs(model, prompts, comps)
        return grpo.grpo_loss(logp, jax.lax.stop_gradient(logp), adv, msk, cfg)[0]
    return jnp.concatenate([x.ravel() for x in jax.tree.leaves(jax.grad(loss)(params))])


def test_per_problem_gradients_use_only_the_first_n_rollouts():
    gd, params = _model()
    cfg = grpo.GRPOConfig()
    rng = np.random.default_rng(0)
    prompts = jnp.asarray(tasks.encode_prompts(np.array([[12, 34], [56, 7]]), 7, 2))
    comps = jnp.asarray(rng.integers(48, 58, size=(2, 4, 4)), jnp.int32)
    mask = jnp.ones((2, 4, 4), bool)
    rewards = jnp.array([[1.0, 0.0, 1.0, 1.0], [0.0, 0.0, 1.0, 0.0]])
    grads = jax.jit(trainer.per_problem_gradients, static_argnums=(0, 7))(
        gd, params, prompts, comps, mask, rewards, jnp.int32(2), cfg)
    # problem 0: first two rewards (1, 0) are mixed -> direction of the 2-rollout GRPO gradient
    adv = grpo.group_advantages(rewards[0, :2], 2)
    ref = _flat_grad(gd, params, prompts[0], comps[0, :2], mask[0, :2], adv, cfg)
    cos = float(grads[0] @ ref / (jnp.linalg.norm(grads[0]) * jnp.linalg.norm(ref)))
    assert cos == pytest.approx(1.0, abs=1e-5)
    # seq_mean over N = 4 rows instead of 2: exactly half the 2-rollout loss gradient
    np.testing.assert_allclose(grads[0], 0.5 * ref, rtol=1e-4, atol=1e-7)
    # problem 1: first two rewards (0, 0) carry no signal -> zero gradient
    assert float(jnp.abs(grads[1]).max()) == 0.0


def test_group_gradient_cosine_without_signal_and_bad_group_size():
    gd, params = _model()
    ops = np.array([[3, 4], [10, 20], [7, 7]])
    targets, lens = tasks.encode_answers(ops, 4)
    prompts = jnp.asarray(tasks.encode_prompts(ops, 7, 2))
    cfg = grpo.GRPOConfig()
    fn = jax.jit(lambda p, k, a, b, c: trainer.group_gradient_cosine(
        gd, p, k, a, b, c, ns=(2, 4), max_new_tokens=4, cfg=cfg))
    # an untrained byte model essentially never samples the exact answer: every group has uniform
    # (zero) rewards, so no problem has a gradient, no pair counts and the mean cosine is 0 (not NaN)
    cos, pairs = fn(params, jax.random.key(0), prompts, jnp.asarray(targets), jnp.asarray(lens))
    assert cos.shape == (2,) and pairs.shape == (2,)
    np.testing.assert_array_equal(np.asarray(pairs), [0, 0])
    np.testing.assert_array_equal(np.asarray(cos), [0.0, 0.0])
    with pytest.raises(ValueError):
        trainer.group_gradient_cosine(gd, params, jax.random.key(0), prompts, jnp.asarray(targets),
                                      jnp.asarray(lens), ns=(1, 2), max_new_tokens=4, cfg=cfg)


def test_shared_prompt_prefill_matches_repeated_prompts():
    """Prefilling G distinct prompts once and gathering the cache to R rows samples the same
    tokens, and gives the same teacher-forced log-probs and gradients, as the R repeated prompts."""
    gd, params = _model()
    prompts = jnp.asarray(tasks.encode_prompts(np.array([[12, 34], [5, 99], [70, 8]]), 7, 2))
    rows = jnp.array([0, 0, 0, 1, 1, 1, 2, 2, 2], jnp.int32)  # n = 3 rollouts per prompt
    kw = dict(max_new_tokens=5, end_id=tasks.END_ID, temperature=1.5)
    key = jax.random.key(3)
    shared, full = jax.jit(lambda p: (rollout.rollout(gd, p, prompts, key, prompt_rows=rows, **kw),
                                      rollout.rollout(gd, p, prompts[rows], key, **kw)))(params)
    np.testing.assert_array_equal(np.asarray(shared[0]), np.asarray(full[0]))
    np.testing.assert_array_equal(np.asarray(shared[2]), np.asarray(full[2]))
    np.testing.assert_allclose(np.asarray(shared[1]), np.asarray(full[1]), atol=1e-6)
    comps = shared[0]
    w = jax.random.normal(jax.random.key(4), comps.shape)

    def loss(p, prompt_rows):  # (loss, teacher-forced log-probs [R, T])
        model = nnx.merge(gd, p)
        if prompt_rows is None:
            logp = rollout.completion_logprobs(model, prompts[rows], comps)
        else:
            logp = rollout.completion_logprobs(model, prompts, comps, prompt_rows)
        return (logp * w).sum(), logp

    # one compilation per layout gives the log-probs and their gradient
    grad = jax.jit(jax.grad(loss, has_aux=True))
    g_shared, logp_shared = grad(params, rows)
    g_full, logp_full = grad(params, None)
    np.testing.assert_allclose(np.asarray(logp_shared), np.asarray(logp_full), atol=1e-6)
    for a, b in zip(jax.tree.leaves(g_shared), jax.tree.leaves(g_full)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-6)
    with pytest.raises(ValueError, match="prompt_rows"):
        rollout.rollout(gd, params, prompts, key, prompt_rows=rows.astype(jnp.float32), **kw)
    with pytest.raises(ValueError, match="rows"):
        rollout.completion_logprobs(nnx.merge(gd, params), prompts, comps[:4], rows)


def test_rl_step_on_distinct_problem_rows_matches_all_rows():
    """max_problems = R // (smallest n) (prefill and pass-rate probe on G rows) gives the step
    of max_problems = R: the same metrics (clip fraction and ratio means over both inner steps
    included) and the same parameters."""
    gd, params = _model()
    # targets: the policy's own most likely first byte, sampled at a temperature at which it is
    # drawn about half the time, so that groups have mixed rewards
    pool, temperature = _self_target_pool()
    out = {}
    for g in (None, 4):  # lanes n = 2, 4 with R = 8: B_p <= 4
        spec = trainer.RLSpec(rollouts_per_step=8, max_new_tokens=4, grpo=_STEP_GRPO,
                              max_problems=g, temperature=temperature)
        stacked = jax.tree.map(lambda x: jnp.stack([x, x]), params)
        out[g] = _vmapped_step(spec)(stacked, jax.vmap(_TX.init)(stacked),
                                     jax.random.split(jax.random.key(1), 2), jnp.array([2, 4]),
                                     pool, None)
    (p_all, _, m_all), (p_g, _, m_g) = out[None], out[4]
    assert float(np.asarray(m_all["informative"]).max()) > 0  # the update has signal
    for k in m_all:
        np.testing.assert_allclose(np.asarray(m_g[k]), np.asarray(m_all[k]), rtol=1e-4,
                                   atol=1e-6, err_msg=k)
    for a, b in zip(jax.tree.leaves(p_g), jax.tree.leaves(p_all)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-5)
    with pytest.raises(ValueError, match="max_problems"):
        trainer.RLSpec(rollouts_per_step=8, max_new_tokens=4, max_problems=9)


def test_policy_config_follows_the_config_and_the_tokenizer():
    """The policy covers the tokenizer's vocabulary and takes its compute dtype and remat from the
    config (paper: bfloat16 compute, full remat of the GRPO backward pass)."""
    from core.data import ByteTokenizer
    from experiments.configs import rl_scaling as rl_config

    assert tasks.VOCAB_SIZE == ByteTokenizer().vocab_size
    assert tasks.BOS_ID == ByteTokenizer().bos_id
    paper = trainer.policy_config(rl_config.get_config("paper").model, 13, 5)
    assert (paper.dtype, paper.remat, paper.max_len, paper.d_model) == (jnp.bfloat16, "full", 18,
                                                                        512)
    tiny = trainer.policy_config(rl_config.get_config("tiny").model, 9, 4)
    assert (tiny.dtype, tiny.remat) == (jnp.float32, "none")


def test_rl_step_reports_the_mean_over_inner_steps_and_replays_the_second():
    """With inner_steps = 2 the step's clip_frac, ratio_mean, loss and grad_norm are the means over
    both optimizer steps (as TRL and verl log them), not the first step's: that step runs at the
    behaviour policy (ratio exactly 1, clip fraction 0 by construction). The second step is
    replayed here on the same rollouts, and its clip fraction counted in NumPy from the ratio."""
    gd, params = _model()
    pool, temperature = _self_target_pool()
    spec = trainer.RLSpec(rollouts_per_step=8, max_new_tokens=4, grpo=_STEP_GRPO,
                          temperature=temperature)
    key, n = jax.random.key(3), jnp.int32(2)
    new_params, _, m = jax.jit(trainer.make_rl_step(gd, _TX, spec))(
        params, _TX.init(params), key, n, pool)

    # Replay: the step's rollouts, advantages and two updates, from the public pieces (each piece
    # jitted: eager NNX calls compile every primitive on their own).
    @jax.jit
    def rollouts(params, key, n):
        k_batch, k_roll = jax.random.split(key)
        prob_of_rollout, ids = trainer.sample_batch(k_batch, pool["prompts"].shape[0], 8, n)
        rows = jnp.arange(8) // n
        prompts = pool["prompts"][ids[:8]]
        comps, _, mask = rollout.rollout(gd, params, prompts, k_roll, max_new_tokens=4,
                                         end_id=tasks.END_ID, temperature=temperature,
                                         prompt_rows=rows)
        rewards = tasks.exact_match(comps, pool["targets"][prob_of_rollout],
                                    pool["lens"][prob_of_rollout])
        adv = grpo.group_advantages(rewards, n, mode=_STEP_GRPO.advantage,
                                    eps=_STEP_GRPO.adv_eps)
        return prompts, rows, comps, mask, adv

    prompts, rows, comps, mask, adv = rollouts(params, key, n)

    @jax.jit
    def logp(p):
        return trainer.policy_logprobs(gd, p, prompts, comps, rows, temperature)

    old = logp(params)

    def loss(p):
        return grpo.grpo_loss(logp(p), old, adv, mask, _STEP_GRPO)[0]

    @jax.jit
    def update(p, o):
        """(loss, gradient norm, params and optimizer state after one Adam step) at ``p``."""
        value, grads = jax.value_and_grad(loss)(p)
        updates, o = _TX.update(grads, o, p)
        return value, optax.tree.norm(grads), optax.apply_updates(p, updates), o

    p, o, losses, norms, clip, ratio_mean = params, _TX.init(params), [], [], [], []
    for _ in range(2):
        ratio = np.exp(np.asarray(logp(p), np.float64) - np.asarray(old, np.float64))
        on = np.asarray(mask)
        clip.append(np.mean((ratio[on] > 1 + _STEP_GRPO.eps_high)
                            | (ratio[on] < 1 - _STEP_GRPO.clip_eps)))
        ratio_mean.append(ratio[on].mean())
        value, norm, p, o = update(p, o)
        losses.append(float(value))
        norms.append(float(norm))

    assert clip[0] == 0.0 and ratio_mean[0] == pytest.approx(1.0, abs=1e-6)
    assert clip[1] > 0.1  # the second step is off-policy and clips: the first alone reads 0
    assert float(m["clip_frac"]) == pytest.approx(np.mean(clip), abs=1e-6)
    assert float(m["ratio_mean"]) == pytest.approx(np.mean(ratio_mean), rel=1e-4)
    assert float(m["loss"]) == pytest.approx(np.mean(losses), rel=1e-4, abs=1e-6)
    assert float(m["grad_norm"]) == pytest.approx(np.mean(norms), rel=1e-4)
    for a, b in zip(jax.tree.leaves(new_params), jax.tree.leaves(p)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-5)
