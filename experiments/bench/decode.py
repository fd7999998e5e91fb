"""Benchmark: KV-cache decoding against recomputing the full forward pass for every new token.

    python -m experiments.bench.decode [smoke|cpu|accelerator]

Dimensions: B batch, P prompt length, N new tokens. Greedy decoding of N tokens after a random
P-token prompt with :func:`models.sampling.generate` (jitted prefill + ``lax.scan`` of one-token
steps through the dense KV cache) against a jitted loop that runs the whole causal forward pass
over the padded [B, P + N] sequence for every new token; both produce the same tokens (checked).

Sizes (``SIZES``): ``cpu`` (default; B 8, P 64, N 64, 4 layers, d_model 128) takes about 30 s on
a 2-core CPU; ``accelerator`` (B 32, P 512, N 256, 8 layers, d_model 512) is meant for a GPU/TPU;
``smoke`` runs in seconds with meaningless numbers.
"""

from __future__ import annotations

import functools
import sys

import jax
import jax.numpy as jnp
from flax import nnx

from core.data import ByteTokenizer
from core.report import markdown_table
from core.timing import best_seconds
from experiments.bench.timing import pick_size
from models.sampling import generate
from models.transformer import Transformer, TransformerConfig

SIZES = {
    "smoke": dict(batch=2, prompt_len=8, new_tokens=4, d_model=32, num_layers=1, num_heads=2,
                  num_kv_heads=1, repeats=1),
    "cpu": dict(batch=8, prompt_len=64, new_tokens=64, d_model=128, num_layers=4, num_heads=4,
                num_kv_heads=2, repeats=5),
    "accelerator": dict(batch=32, prompt_len=512, new_tokens=256, d_model=512, num_layers=8,
                        num_heads=8, num_kv_heads=2, repeats=5),
}


def run(size: str = "cpu") -> str:
    """Times both decoders at ``SIZES[size]``; returns a markdown section with the speed-up.

    Raises:
      ValueError: unknown ``size``.
    """
    s = pick_size(SIZES, size, "bench decode")
    batch, prompt_len, new_tokens = s["batch"], s["prompt_len"], s["new_tokens"]
    tokenizer = ByteTokenizer()
    cfg = TransformerConfig(vocab_size=tokenizer.vocab_size, max_len=prompt_len + new_tokens, d_model=s["d_model"],
                            num_layers=s["num_layers"], num_heads=s["num_heads"],
                            num_kv_heads=s["num_kv_heads"])
    graphdef, params = nnx.split(Transformer(cfg, rngs=nnx.Rngs(0)))
    prompt = jax.random.randint(jax.random.key(0), (batch, prompt_len), 0, tokenizer.num_bytes)

    @functools.partial(jax.jit, static_argnames="n")
    def no_cache(params, prompt, n):
        model = nnx.merge(graphdef, params)
        seq = jnp.concatenate([prompt, jnp.zeros((batch, n), prompt.dtype)], axis=1)

        def body(i, seq):
            logits = model(seq)  # full recomputation over the padded sequence (causal)
            nxt = jnp.argmax(logits[:, prompt_len + i - 1], -1).astype(seq.dtype)
            return seq.at[:, prompt_len + i].set(nxt)

        return jax.lax.fori_loop(0, n, body, seq)[:, prompt_len:]

    def cached():
        return generate(graphdef, params, prompt, jax.random.key(1), max_new_tokens=new_tokens,
                        temperature=0.0)[0]

    t = best_seconds({"cache": cached, "full": lambda: no_cache(params, prompt, new_tokens)},
                     s["repeats"])
    t_cache, t_full = t["cache"], t["full"]
    same = bool((cached() == no_cache(params, prompt, new_tokens)).all())
    tokens = batch * new_tokens
    rows = [["full recompute (baseline)", f"{t_full * 1e3:.1f}", f"{tokens / t_full:,.0f}", "1.0x"],
            ["KV cache (dense)", f"{t_cache * 1e3:.1f}", f"{tokens / t_cache:,.0f}",
             f"{t_full / t_cache:.1f}x"]]
    return "\n".join([
        "## decode: transformer decoding, KV cache vs recomputation",
        "",
        f"Greedy decoding of {new_tokens} tokens after a {prompt_len}-token prompt, batch {batch}, "
        f"{cfg.num_layers} layers, d_model {cfg.d_model}, GQA {cfg.num_heads}/{cfg.kv_heads} heads "
        f"(size `{size}`, best of {s['repeats']} interleaved calls after a warm-up). Same tokens: {same}.",
        "",
        markdown_table(["method", "ms", "tokens/s", "speed-up"], rows),
        "",
        f"Command: `python -m experiments.bench.decode {size}`",
    ])


if __name__ == "__main__":
    print(run(sys.argv[1] if len(sys.argv) > 1 else "cpu"))
