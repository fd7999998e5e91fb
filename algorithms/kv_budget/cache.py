"""A budgeted KV cache for :meth:`models.transformer.Transformer.decode`, and prompt statistics.

Dimensions: B batch, K kv heads, H query heads, P prompt tokens, S cache slots, D head dim,
L layers (in :func:`teacher_forced_nll`, L is the window length).

:class:`BudgetedKVCache` (``models.kv_cache.get_backend("budgeted")``, defined in
:mod:`models.kv_cache` with the other backends so that the one lookup knows it) is the dense cache
plus a keep mask ``[B, K, S]``: evicted prompt slots are masked out of attention, new tokens are
always kept. This module fills the masks (:func:`with_keep`, :func:`budgets_and_keep`).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from algorithms.kv_budget import entrokv
from models import capture
from models import kv_cache as kvc

BudgetedKVCache = kvc.BudgetedKVCache  # the "budgeted" backend; defined with the others


def with_keep(cache: Any, keep: list[jax.Array]) -> Any:
    """Installs keep masks bool [B, K, P] (one per layer) on the first P slots of each layer of a
    budgeted cache: a list of layer caches, or one stacked cache (``scan_layers``; every leaf
    [N, ...]). Returns the cache in the layout it was given.

    Raises:
      ValueError: a different number of masks and layers.
    """
    if isinstance(cache, list | tuple):
        if len(cache) != len(keep):
            raise ValueError(f"with_keep: {len(keep)} keep masks for {len(cache)} layers")
        return [{**layer, "keep": layer["keep"].at[:, :, :m.shape[2]].set(m)}
                for layer, m in zip(cache, keep, strict=True)]
    if cache["keep"].shape[0] != len(keep):
        raise ValueError(f"with_keep: {len(keep)} keep masks for {cache['keep'].shape[0]} layers")
    m = jnp.stack(keep)
    return {**cache, "keep": cache["keep"].at[:, :, :, :m.shape[3]].set(m)}


def prompt_queries_keys(model, tokens: jax.Array) -> list[tuple[jax.Array, jax.Array]]:
    """Per layer (q [B, H, P, D], k [B, K, P, D]) of a causal, unconditioned decoder on
    ``tokens`` [B, P] (RoPE applied), from the same computation as its forward pass
    (:func:`models.capture.attention_inputs`)."""
    return [(q, k) for q, k, _ in capture.attention_inputs(model, tokens)]


def budgets_and_keep(qk: list[tuple[jax.Array, jax.Array]], cfg: entrokv.EntroKVConfig,
                     fraction: float, method: str) -> tuple[jax.Array, list[jax.Array]]:
    """Budgets over all layers x kv heads (jointly) and SnapKV keep masks.

    Args:
      qk: from :func:`prompt_queries_keys`.
      fraction: budget as a fraction of the prompt, per head on average (0, 1].
      method: ``"entrokv"`` (entropy-proportional) or ``"uniform"`` (SnapKV).

    Returns:
      (budgets int32 [B, L * K], keep masks: L arrays bool [B, K, P]).

    Raises:
      ValueError: unknown method, fraction out of range, or a total below one slot per head.
    """
    if method not in ("entrokv", "uniform"):
        raise ValueError(f"budgets_and_keep: unknown method {method!r}")
    if not 0.0 < fraction <= 1.0:
        raise ValueError(f"budgets_and_keep: fraction={fraction} must be in (0, 1]")
    b, kh, p, _ = qk[0][1].shape
    nl = len(qk)
    per_head = max(1, round(fraction * p))
    total = per_head * nl * kh
    probs = [entrokv.observation_probs(q, k, cfg.window) for q, k in qk]
    ent = jnp.concatenate([entrokv.head_entropy(pr, valid) for pr, valid in probs], axis=1)
    if method == "entrokv":
        scores = entrokv.blend_scores(ent, cfg)
        budgets = jax.vmap(lambda s: entrokv.allocate_budgets(s, total, cfg.min_budget, p))(scores)
    else:
        budgets = jnp.broadcast_to(entrokv.uniform_budgets(nl * kh, total, p), (b, nl * kh))
    keep = []
    for i, (pr, _) in enumerate(probs):
        votes = entrokv.snapkv_votes(pr.sum(axis=2), cfg.window, cfg.pool)  # [B, K, P]
        bud = budgets[:, i * kh:(i + 1) * kh]
        keep.append(jax.vmap(entrokv.select_tokens)(votes, bud))
    return budgets, keep


def head_entropies(qk: list[tuple[jax.Array, jax.Array]], cfg: entrokv.EntroKVConfig
                   ) -> jax.Array:
    """Normalised attention entropy of every (layer, kv head): float32 [B, L * K] in [0, 1], the
    quantity EntroKV's budgets are proportional to (after the blend with the prior), in the
    order of :func:`budgets_and_keep`'s budgets."""
    probs = [entrokv.observation_probs(q, k, cfg.window) for q, k in qk]
    return jnp.concatenate([entrokv.head_entropy(pr, valid) for pr, valid in probs], axis=1)


def _layers(model) -> list[tuple[nnx.GraphDef, nnx.State]]:
    """Each decoder block as ``(graphdef, params)``: the blocks of a list, or the slices of the
    stacked parameters of ``scan_layers``."""
    if getattr(model.cfg, "scan_layers", False):
        block_def, stacked = nnx.split(model.blocks)
        return [(block_def, jax.tree.map(lambda a, i=i: a[i], stacked))
                for i in range(model.cfg.num_layers)]
    return [nnx.split(block) for block in model.blocks]


@dataclasses.dataclass(frozen=True)
class _TeacherForcedDecode:
    """A KV-cache backend wrapping ``inner`` for one layer of :func:`teacher_forced_nll`.

    Given a block's whole sequence at once, its ``update`` only holds the new keys and values;
    its ``attend`` then makes on ``inner``'s cache (``cache["cache"]``) the calls of decoding: the
    first ``prompt_len`` positions prefilled and attended, the keep mask ``cache["keep"]``
    installed when there is one, then each later position appended and attended alone, followed
    by ``inner.flush``. The block's projections and MLP thus run on every position in one batch
    while the cache sees exactly what token-by-token decoding shows it.
    """

    inner: Any
    prompt_len: int

    def update(self, layer_cache, k, v, start):
        return {**layer_cache, "k": k, "v": v}

    def attend(self, layer_cache, q, start):
        p, inner, k, v = self.prompt_len, self.inner, layer_cache["k"], layer_cache["v"]
        zero = jnp.zeros_like(start)
        cache = inner.update(layer_cache["cache"], k[:, :, :p], v[:, :, :p], zero)
        prompt_out = inner.attend(cache, q[:, :, :p], zero)
        if layer_cache["keep"] is not None:
            cache = with_keep([cache], [layer_cache["keep"]])[0]
        flush = getattr(inner, "flush", lambda c: c)

        def step(cache, i):
            one = [jax.lax.dynamic_slice_in_dim(a, i, 1, axis=2) for a in (q, k, v)]
            pos = jnp.full_like(start, i)
            cache = inner.update(cache, one[1], one[2], pos)
            return flush(cache), inner.attend(cache, one[0], pos)[:, :, 0]

        _, decoded = jax.lax.scan(step, cache, jnp.arange(p, q.shape[2]))  # [T - P, B, H, D]
        return jnp.concatenate([prompt_out, decoded.transpose(1, 2, 0, 3)], axis=2)


@functools.partial(jax.jit, static_argnames=("block_def", "backend", "prompt_len", "cache_len"))
def _layer_teacher_forced(block_def, block_params, x, keep, *, backend, prompt_len, cache_len):
    """One layer of :func:`teacher_forced_nll`: its inputs x [B, T, E] at positions 0..T-1 ->
    its outputs [B, T, E], through a fresh ``backend`` cache of ``cache_len`` slots driven as
    decoding drives it (:class:`_TeacherForcedDecode`)."""
    block = nnx.merge(block_def, block_params)
    b, t, _ = x.shape
    cfg = block.attn.cfg
    cache = {"cache": backend.init(b, cache_len, cfg.kv_heads, cfg.dim_per_head, cfg.dtype),
             "keep": keep}
    positions = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t))
    out, _ = block.decode(x, positions, cache, _TeacherForcedDecode(backend, prompt_len))
    return out


@functools.partial(jax.jit, static_argnames=("graphdef",))
def _embed(graphdef, params, tokens):
    return nnx.merge(graphdef, params).embed(tokens)


@functools.partial(jax.jit, static_argnames=("graphdef",))
def _nll_sum(graphdef, params, x, targets):
    logits = nnx.merge(graphdef, params).head_logits(x)
    return jnp.sum(optax.softmax_cross_entropy_with_integer_labels(logits, targets))


def teacher_forced_nll(graphdef: nnx.GraphDef, params: nnx.State, tokens: jax.Array,
                       backend, prompt_len: int, keep: list[jax.Array] | None = None
                       ) -> tuple[jax.Array, int]:
    """Held-out negative log-likelihood of ``tokens`` decoded through a KV-cache backend.

    Prefills ``tokens[:, :P]`` (P = ``prompt_len``) into a cache of ``L`` slots, optionally
    restricts each head to the prompt slots ``keep`` marks (a :class:`BudgetedKVCache`), then
    decodes one token per step (``lax.scan``), teacher-forced: the logits after token i-1 score
    token i for i = P .. L-1. With the dense backend this equals the forward pass's next-token
    NLL on the same positions; a lossy cache (quantized, sparse, budgeted) shows its cost here.

    Evaluated layer by layer: a layer's cache depends only on that layer's keys and values, and
    with the tokens known in advance (teacher forcing) every layer's inputs are known once the
    layer below is done. So each layer prefills and decodes all positions through its own cache
    (the same ``decode`` and ``flush`` calls, in the same order, as decoding the whole model one
    token at a time) before the next layer starts. The result is that of token-major decoding
    (the tests compare the two); one compiled program serves every layer of the same
    structure (one compile per block graphdef, backend, P and token shape, instead of a program
    that unrolls all layers), and the projections and MLP see all positions at once.

    Args:
      graphdef, params: ``nnx.split`` of a causal decoder with ``init_cache`` / ``decode``
        (:class:`models.transformer.Transformer`, :class:`models.llama.Llama`).
      tokens: int [B, L], L <= the model's ``max_len``.
      backend: a hashable KV-cache backend (:mod:`models.kv_cache` protocol).
      prompt_len: P, 0 < P < L.
      keep: per layer bool [B, K, P] keep masks (from :func:`budgets_and_keep`); needs a backend
        whose cache has a ``keep`` entry (:class:`BudgetedKVCache`).

    Returns:
      (sum of the B * (L - P) next-token NLLs in nats, float32 scalar; B * (L - P)). Divide
      by the count, and by ln 2, for bits per token.

    Raises:
      ValueError: tokens not [B, L]; P outside (0, L); ``keep`` with a backend that has no keep
        mask, or not one mask per layer; a model with a sliding window shorter than L - 1
        tokens (not applied by the layer-by-layer evaluation); L > the model's ``max_len``.
    """
    if getattr(tokens, "ndim", None) != 2:
        raise ValueError(f"teacher_forced_nll: tokens must be [B, L] integers, got shape "
                         f"{getattr(tokens, 'shape', None)}")
    b, l = tokens.shape
    if not (isinstance(prompt_len, int) and 0 < prompt_len < l):
        raise ValueError(f"teacher_forced_nll: prompt_len={prompt_len!r}, expected an integer in "
                         f"(0, {l}) for windows of {l} tokens")
    if keep is not None and not isinstance(backend, BudgetedKVCache):
        raise ValueError(f"teacher_forced_nll: keep masks need a BudgetedKVCache backend, got "
                         f"{type(backend).__name__}")
    model = nnx.merge(graphdef, params)
    layers = _layers(model)
    if keep is not None and len(keep) != len(layers):
        raise ValueError(f"teacher_forced_nll: {len(keep)} keep masks for {len(layers)} layers")
    if l > model.cfg.max_len:
        raise ValueError(f"teacher_forced_nll: windows of {l} tokens exceed the model's "
                         f"max_len={model.cfg.max_len}")
    windows = [w for w in getattr(model.cfg, "layer_windows", None) or () if w and w < l - 1]
    if windows:
        raise ValueError(f"teacher_forced_nll: the model has a sliding window of {min(windows)} "
                         f"tokens, shorter than the {l}-token windows; expected windows of at "
                         f"most {min(windows) + 1} tokens (a layer's window is not applied here)")
    tokens = jnp.asarray(tokens)
    # Position L-1 is only ever a target: the hidden states of positions 0..L-2 are all it needs.
    x = _embed(graphdef, params, tokens[:, :-1])
    for i, (block_def, block_params) in enumerate(layers):
        x = _layer_teacher_forced(block_def, block_params, x, None if keep is None else keep[i],
                                  backend=backend, prompt_len=prompt_len, cache_len=l)
    total = _nll_sum(graphdef, params, x[:, prompt_len - 1:], tokens[:, prompt_len:])
    return total, b * (l - prompt_len)
