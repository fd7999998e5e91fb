"""Benchmark: KV-cache decoding against recomputing the full forward pass for every new token.

    python -m experiments.bench.decode
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from flax import nnx

from core.report import markdown_table
from experiments.bench.timing import median_seconds
from models.sampling import generate
from models.transformer import Transformer, TransformerConfig


def run(batch: int = 8, prompt_len: int = 64, new_tokens: int = 64) -> str:
    cfg = TransformerConfig(vocab_size=258, max_len=prompt_len + new_tokens, d_model=128,
                            num_layers=4, num_heads=4, num_kv_heads=2)
    graphdef, params = nnx.split(Transformer(cfg, rngs=nnx.Rngs(0)))
    prompt = jax.random.randint(jax.random.key(0), (batch, prompt_len), 0, 256)

    @functools.partial(jax.jit, static_argnames="n")
    def no_cache(params, prompt, n):
        model = nnx.merge(graphdef, params)
        seq = jnp.concatenate([prompt, jnp.zeros((batch, n), prompt.dtype)], axis=1)

        def body(i, seq):
            logits = model(seq)  # full recomputation over the padded sequence (causal)
            nxt = jnp.argmax(logits[:, prompt_len + i - 1], -1).astype(seq.dtype)
            return seq.at[:, prompt_len + i].set(nxt)

        return jax.lax.fori_loop(0, n, body, seq)[:, prompt_len:]

    t_cache = median_seconds(lambda: generate(graphdef, params, prompt, jax.random.key(1),
                                              max_new_tokens=new_tokens, temperature=0.0), 3)
    t_full = median_seconds(lambda: no_cache(params, prompt, new_tokens), 3)
    same = bool((generate(graphdef, params, prompt, jax.random.key(1), max_new_tokens=new_tokens,
                          temperature=0.0)[0] == no_cache(params, prompt, new_tokens)).all())
    rows = [["full recompute (baseline)", t_full * 1e3, batch * new_tokens / t_full, 1.0],
            ["KV cache (dense)", t_cache * 1e3, batch * new_tokens / t_cache, t_full / t_cache]]
    return "\n".join([
        "## Transformer decoding: KV cache vs recomputation",
        "",
        f"Greedy decoding of {new_tokens} tokens after a {prompt_len}-token prompt, batch {batch}, "
        f"{cfg.num_layers} layers, d_model {cfg.d_model}, GQA {cfg.num_heads}/{cfg.kv_heads} heads. "
        f"Same tokens: {same}. Command: `python -m experiments.bench.decode`.",
        "",
        markdown_table(["method", "ms", "tokens/s", "speed-up"], rows, fmt=".3g"),
    ])


if __name__ == "__main__":
    print(run())
