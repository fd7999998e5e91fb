"""Benchmark: RL rollout throughput with the KV cache against recomputing the forward pass.

    python -m experiments.bench.rl_rollouts [smoke|cpu|accelerator]

Dimensions: R rollouts, P prompt length, T new tokens, V vocabulary. Samples R completions of P
prompt tokens with :func:`algorithms.rl_scaling.rollout.rollout` (jitted prefill, then a
``lax.scan`` of one-token steps through the dense KV cache; rows stop at the end token) and with a
plain jnp baseline written here: the same sampling loop (same PRNG keys, end-token handling and
log-probs) that runs the whole causal forward pass over the padded [R, P + T] sequence for every
new token. The policy is the ``rl_scaling`` experiment's transformer (random weights: speed does
not depend on them) at two completion lengths: the experiment's arithmetic answers (P and T of
its ``hard`` task) and a longer completion. Reports rollouts/s and the KV-cache speed-up, and the
fraction of sampled tokens on which the two samplers agree (1 up to float rounding).

A second table times what GRPO does with n rollouts of each prompt, per-rollout against shared
prompts (``prompt_rows``: each of the R / n prompts prefilled once into the KV cache and gathered to
its n rollouts): sampling the R completions, and the gradient of their teacher-forced log-probs
(the update's forward and backward pass), with the largest difference between the two paths.

Sizes (``SIZES``; the model and task geometry come from the variant of
``experiments/configs/rl_scaling.py`` named there): ``cpu`` (``tiny`` model, R 64, long
completion 64 tokens; about a minute on a 2-core CPU); ``accelerator`` (``paper`` model, R 512, long
completion 256 tokens) is meant for a GPU/TPU; ``smoke`` runs in seconds.
"""

from __future__ import annotations

import sys

import jax
import jax.numpy as jnp
from flax import nnx

from algorithms.rl_scaling import rollout, tasks
from core import sampling
from core.report import markdown_table
from core.timing import best_seconds
from experiments.bench.timing import pick_size
from experiments.configs import rl_scaling as rl_config
from models.transformer import Transformer, TransformerConfig

SIZES = {
    "smoke": dict(variant="smoke", rollouts=4, long_tokens=8, repeats=1, group=2),
    "cpu": dict(variant="tiny", rollouts=64, long_tokens=64, repeats=3, group=8),
    "accelerator": dict(variant="paper", rollouts=512, long_tokens=256, repeats=5, group=8),
}


def recompute_rollout(graphdef: nnx.GraphDef, params: nnx.State, prompts: jax.Array,
                      key: jax.Array, *, max_new_tokens: int, end_id: int,
                      temperature: float = 1.0) -> tuple[jax.Array, jax.Array, jax.Array]:
    """The baseline sampler: :func:`rollout.rollout` without a cache (full forward per token).

    Traceable; ``graphdef``, ``max_new_tokens``, ``end_id`` and ``temperature`` are static.

    Args:
      graphdef, params: a causal :class:`models.transformer.Transformer`, split with nnx.
      prompts: int32 [R, P].
      key: PRNG key (split per step exactly as :func:`rollout.rollout` does).
      max_new_tokens: T >= 1 with P + T <= the model's max_len.
      end_id: the end token; a row emits only ``end_id`` after it.
      temperature: sampling temperature tau (> 0); tokens and their log-probs are under
        softmax(logits / tau), as in :func:`rollout.rollout`.

    Returns:
      (tokens int32 [R, T], logp float32 [R, T], mask bool [R, T]) as :func:`rollout.rollout`.

    Raises:
      ValueError: T < 1 or temperature <= 0.
    """
    if max_new_tokens < 1 or not temperature > 0:
        raise ValueError(f"recompute_rollout: need max_new_tokens >= 1 and temperature > 0, got "
                         f"{max_new_tokens}, {temperature}")
    model = nnx.merge(graphdef, params)
    r, p = prompts.shape
    seq = jnp.concatenate([prompts.astype(jnp.int32),
                           jnp.full((r, max_new_tokens), end_id, jnp.int32)], axis=1)

    def body(carry, xs):
        seq, done = carry
        i, key_t = xs
        logits = model(seq)  # [R, P + T, V]; causal, so the padding after p + i does not matter
        last = jax.lax.dynamic_index_in_dim(logits, p + i - 1, axis=1, keepdims=False)
        scaled = last / temperature
        tok = sampling.categorical(key_t, scaled)
        tok = jnp.where(done, end_id, tok)
        logp = jnp.take_along_axis(jax.nn.log_softmax(scaled), tok[:, None], axis=-1)[:, 0]
        seq = jax.lax.dynamic_update_slice_in_dim(seq, tok[:, None], p + i, axis=1)
        return (seq, done | (tok == end_id)), (tok, logp)

    steps = (jnp.arange(max_new_tokens), jax.random.split(key, max_new_tokens))
    _, (toks, logps) = jax.lax.scan(body, (seq, jnp.zeros((r,), bool)), steps)
    toks, logps = toks.T, logps.T
    return toks, logps, rollout.completion_mask(toks, end_id)


def _measure(config, rollouts: int, prompt_len: int, new_tokens: int, repeats: int) -> dict:
    m = config.model
    cfg = TransformerConfig(vocab_size=258, max_len=prompt_len + new_tokens, d_model=m.d_model,
                            num_layers=m.num_layers, num_heads=m.num_heads, mlp_dim=m.mlp_dim)
    graphdef, params = nnx.split(Transformer(cfg, rngs=nnx.Rngs(config.seed)))
    prompts = jax.random.randint(jax.random.key(config.seed), (rollouts, prompt_len), 0, 256)
    key = jax.random.key(config.seed + 1)
    kw = dict(max_new_tokens=new_tokens, end_id=tasks.END_ID, temperature=config.temperature)
    cached = jax.jit(lambda params, prompts, key: rollout.rollout(graphdef, params, prompts, key, **kw))
    full = jax.jit(lambda params, prompts, key: recompute_rollout(graphdef, params, prompts, key, **kw))
    t = best_seconds({"cache": lambda: cached(params, prompts, key),
                      "full": lambda: full(params, prompts, key)}, repeats)
    t_cache, t_full = t["cache"], t["full"]
    agree = float(jnp.mean(cached(params, prompts, key)[0] == full(params, prompts, key)[0]))
    return dict(t_cache=t_cache, t_full=t_full, agree=agree, params=cfg)


def _measure_shared(config, rollouts: int, group: int, prompt_len: int, new_tokens: int,
                    repeats: int) -> dict:
    """Sampling and log-prob gradient with the prompts repeated per rollout vs shared by groups
    of ``group`` rollouts (seconds, and the largest log-prob / gradient difference)."""
    m = config.model
    cfg = TransformerConfig(vocab_size=258, max_len=prompt_len + new_tokens, d_model=m.d_model,
                            num_layers=m.num_layers, num_heads=m.num_heads, mlp_dim=m.mlp_dim)
    graphdef, params = nnx.split(Transformer(cfg, rngs=nnx.Rngs(config.seed)))
    prompts = jax.random.randint(jax.random.key(config.seed), (rollouts // group, prompt_len),
                                 0, 256)
    rows = jnp.arange(rollouts) // group
    key = jax.random.key(config.seed + 1)
    kw = dict(max_new_tokens=new_tokens, end_id=tasks.END_ID, temperature=config.temperature)
    sample = {"repeated": jax.jit(lambda p: rollout.rollout(graphdef, p, prompts[rows], key, **kw)),
              "shared": jax.jit(lambda p: rollout.rollout(graphdef, p, prompts, key,
                                                          prompt_rows=rows, **kw))}
    comps = sample["shared"](params)[0]
    weights = jax.random.normal(jax.random.key(config.seed + 2), comps.shape)

    def loss(p, shared):
        model = nnx.merge(graphdef, p)
        logp = (rollout.completion_logprobs(model, prompts, comps, rows) if shared else
                rollout.completion_logprobs(model, prompts[rows], comps))
        return (logp * weights).sum(), logp

    grad = {name: jax.jit(jax.grad(lambda p, s=name == "shared": loss(p, s), has_aux=True))
            for name in ("repeated", "shared")}
    t = best_seconds({**{f"sample_{k}": (lambda f=f: f(params)) for k, f in sample.items()},
                      **{f"grad_{k}": (lambda f=f: f(params)) for k, f in grad.items()}}, repeats)
    (g_rep, lp_rep), (g_sh, lp_sh) = grad["repeated"](params), grad["shared"](params)
    t["logp_diff"] = float(jnp.abs(lp_rep - lp_sh).max())
    t["grad_diff"] = max(float(jnp.abs(a - b).max())
                         for a, b in zip(jax.tree.leaves(g_rep), jax.tree.leaves(g_sh)))
    t["same_tokens"] = bool((sample["repeated"](params)[0] == comps).all())
    return t


def run(size: str = "cpu") -> str:
    """Times both samplers at ``SIZES[size]``; returns a markdown section with the speed-ups.

    Raises:
      ValueError: unknown ``size``.
    """
    s = pick_size(SIZES, size, "bench rl_rollouts")
    config = rl_config.get_config(s["variant"])
    task = tasks.ArithmeticTask(config.hard.terms, config.hard.digits, "hard")
    prompt_len = 1 + task.prompt_chars  # BOS + "a+b+c="
    r = s["rollouts"]
    rows = []
    for label, t in ((f"arithmetic answer ({config.hard.terms} terms of {config.hard.digits} digits)",
                      task.answer_chars), ("long completion", s["long_tokens"])):
        res = _measure(config, r, prompt_len, t, s["repeats"])
        rows.append([label, prompt_len, t, "full recompute (baseline)", f"{res['t_full'] * 1e3:.1f}",
                     f"{r / res['t_full']:,.0f}", "1.0x", ""])
        rows.append(["", "", "", "KV cache (`rollout.rollout`)", f"{res['t_cache'] * 1e3:.1f}",
                     f"{r / res['t_cache']:,.0f}", f"{res['t_full'] / res['t_cache']:.1f}x",
                     f"{res['agree']:.3f}"])
    g = s["group"]
    sh = _measure_shared(config, r, g, prompt_len, task.answer_chars, s["repeats"])
    shared_rows = [[f"sampling {r} completions", f"{sh['sample_repeated'] * 1e3:.1f}",
                    f"{sh['sample_shared'] * 1e3:.1f}", f"{r / sh['sample_shared']:,.0f}"],
                   ["gradient of their log-probs", f"{sh['grad_repeated'] * 1e3:.1f}",
                    f"{sh['grad_shared'] * 1e3:.1f}", f"{r / sh['grad_shared']:,.0f}"]]
    m = config.model
    return "\n".join([
        "## rl_rollouts: RL rollout sampling, KV cache vs recomputation",
        "",
        f"{r} rollouts per call (temperature {config.temperature}) from the `rl_scaling` policy "
        f"(`{s['variant']}` model: {m.num_layers} layers, d_model {m.d_model}, {m.num_heads} heads, "
        f"MLP {m.mlp_dim}; random weights); size `{size}`, best of {s['repeats']} interleaved calls "
        "after a warm-up. The baseline runs the full forward pass over the padded prompt + completion for "
        "every token; 'same tokens' is the fraction of sampled tokens equal in the two samplers "
        "(same keys).",
        "",
        markdown_table(["completion", "P", "T", "sampler", "ms per call", "rollouts/s",
                        "speed-up", "same tokens"], rows),
        "",
        f"GRPO with n = {g} rollouts per prompt ({r // g} prompts, arithmetic answers): each "
        "prompt prefilled per rollout (repeated) or once and shared by its n rollouts "
        f"(`prompt_rows`). Sharing speeds sampling up {sh['sample_repeated'] / sh['sample_shared']:.1f}"
        f"-fold and the log-prob gradient {sh['grad_repeated'] / sh['grad_shared']:.1f}-fold; same "
        f"tokens: {sh['same_tokens']}; largest log-prob difference {sh['logp_diff']:.1e}, "
        f"gradient difference {sh['grad_diff']:.1e}.",
        "",
        markdown_table(["step", "ms repeated", "ms shared", "rollouts/s shared"], shared_rows),
        "",
        f"Command: `python -m experiments.bench.rl_rollouts {size}`",
    ])


if __name__ == "__main__":
    print(run(sys.argv[1] if len(sys.argv) > 1 else "cpu"))
