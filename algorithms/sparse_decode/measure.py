"""Faster Flash Decoding (FFD) measured on a real decoder: which pages its top-delta rule keeps on
captured attention, how that fraction falls with context, and what its cache does to retrieval,
perplexity and greedy decoding against the dense cache (and Quest at the same page budget).

Dimensions: n windows, W window length (tokens), B rows, L prompt length, T new tokens, H query
heads, K kv heads, D head dim, C measured contexts, U (layer, kv head) units.

The model comes in its functional form: ``graphdef, params = nnx.split(model)`` of a
:class:`models.transformer.Transformer` or :class:`models.llama.Llama`, with its config (for the
RoPE and ``max_len``); text arrives as int32 token windows already cut, so nothing here reads
files. Deltas are in nats (:func:`kernels.sparse_decode.reference.delta_in_nats` converts the
authors' base-2 values).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from kernels.sparse_decode import workload
from models import capture
from models import kv_cache as kvc
from models.sampling import generate


def context_window_shape(real_context: int, real_page_size: int, max_len: int,
                         stitch: bool) -> tuple[int, int]:
    """(window length W, window count n) of the token windows whose captures make a measured
    context of about ``real_context`` tokens: with ``stitch`` (a model of short ``max_len``, the
    byte LM) ``real_context // max_len`` windows of ``max_len`` laid end to end; otherwise one
    window of ``min(real_context, max_len)`` tokens rounded down to whole pages of
    ``real_page_size``.

    Raises:
      ValueError: without ``stitch``, a context of fewer than two pages.
    """
    if stitch:
        return max_len, real_context // max_len
    p = real_page_size
    s = min(real_context, max_len) // p * p
    if s < 2 * p:
        raise ValueError(f"real_context={real_context} and real_page_size={p}: the model's "
                         f"max_len={max_len} allows a context of {min(real_context, max_len)} "
                         "tokens, fewer than two pages; expected a smaller real_page_size")
    return s, 1


def quality_contexts(fit_contexts: Sequence[int], page_size: int, s: int) -> list[int]:
    """The contexts (tokens) at which :func:`real_quality` measures selection: each of
    ``fit_contexts`` rounded down to whole pages of ``page_size`` that holds at least two pages
    and fits in the captured ``s`` tokens, and ``s`` itself; ascending."""
    p = page_size
    return sorted({c // p * p for c in fit_contexts if 2 * p <= c // p * p <= s} | {s})


def selection_summary(layers: list[dict], delta: float, lengths: np.ndarray) -> dict:
    """Means over layers of :func:`kernels.sparse_decode.workload.selection_quality`'s numbers,
    with the range of the kept fraction over (layer, kv head) (``density_min`` / ``_max``, and
    every unit's in ``unit_density``), the worst layer's kept mass and error, ``delta_nats`` and
    ``mean_length`` (mean of ``lengths``, tokens)."""
    heads = np.asarray([r["head_density"] for r in layers])  # [layers, K]
    scalar = [key for key in layers[0] if key != "head_density"]
    return {key: float(np.mean([r[key] for r in layers])) for key in scalar} | {
        "delta_nats": delta, "density_min": float(heads.min()), "density_max": float(heads.max()),
        "unit_density": heads.ravel().tolist(), "mean_length": float(np.mean(lengths)),
        "min_kept_mass": min(r["kept_mass"] for r in layers),
        "max_rel_err": max(r["rel_err"] for r in layers)}


def real_quality(graphdef: Any, params: Any, model_config: Any, windows: np.ndarray, *,
                 page_size: int, deltas: dict[str, float], fit_contexts: Sequence[int],
                 queries: int, fit_target: int, seed: int) -> dict:
    """FFD's page selection judged on a real model's attention, at several contexts and deltas.

    The windows' q/k/v are captured per layer (:func:`models.capture.capture_attention_inputs`)
    and laid end to end (:func:`kernels.sparse_decode.workload.stitch_windows`) into one sequence
    of s = n x W tokens. At each context c of :func:`quality_contexts` (the first c tokens: attention
    is causal, so they are what a c-token capture gives), ``queries`` ragged decode positions are
    drawn in [c/2, c) (``np.random.default_rng(seed)``) and
    :func:`kernels.sparse_decode.workload.selection_quality` runs per layer at every delta of
    ``deltas`` and with every page kept (label ``all_pages``: delta = inf, the error of FFD's key
    storage alone), summarised by :func:`selection_summary`.

    Args:
      graphdef, params: the model (``nnx.split``). model_config: its config (RoPE).
      windows: int32 [n, W] token windows. page_size: p, tokens per page.
      deltas: {label: delta in nats}; the first label's numbers are the top level.
      fit_contexts: contexts (tokens) measured besides s. queries: decode positions per context.
      fit_target: the context (tokens) :func:`kept_fraction_fit` extrapolates to.

    Returns:
      the first delta's numbers at s, with ``layers``, ``context`` (s), ``page_size``,
      ``by_delta`` ({label: numbers at s}), ``by_context`` ({str(c): {label: numbers}}) and
      ``fit`` ({label: :func:`kept_fraction_fit` of its kept fraction against context}, empty
      when only one context was measured).
    """
    s = windows.size
    rng = np.random.default_rng(seed)
    captured = capture.capture_attention_inputs(graphdef, params, jnp.asarray(windows))
    stitched = workload.stitch_windows(captured, capture.model_rope(model_config))
    every = dict(deltas) | {"all_pages": float("inf")}
    by_context = {}
    for c in quality_contexts(fit_contexts, page_size, s):
        qpos = np.sort(rng.integers(c // 2, c, queries))
        lengths = jnp.asarray(qpos + 1, jnp.int32)
        by_context[c] = {
            label: selection_summary([workload.selection_quality(
                q[qpos].astype(jnp.float32), k[:, :c], v[:, :c], lengths, page_size,
                delta) for q, k, v in stitched], delta, qpos + 1)
            for label, delta in every.items()}
    by_delta = by_context[s]
    fits = {}
    if len(by_context) >= 2:
        for label in deltas:
            rows = [by_context[c][label] for c in by_context]
            fits[label] = kept_fraction_fit(
                [r["mean_length"] for r in rows], [r["unit_density"] for r in rows],
                fit_target, seed=seed)
    return by_delta[next(iter(deltas))] | {
        "layers": len(stitched), "context": s, "page_size": page_size, "by_delta": by_delta,
        "by_context": {str(c): v for c, v in by_context.items()}, "fit": fits}


def kept_fraction_fit(lengths, unit_density, target: int, draws: int = 2000, level: float = 0.9,
                      seed: int = 0) -> dict:
    """FFD's kept fraction against context, fitted as a power law and extrapolated.

    ``f(n) = a n^b``: least squares of ``log mean_u f_u(n)`` against ``log n`` over the measured
    contexts (u runs over the (layer, kv head) units). The interval resamples the units with
    replacement (``draws`` times) and refits: it covers the spread between heads, not the error
    of the power-law form itself, which an extrapolation far beyond the measured contexts cannot
    bound. A log-linear form ``f = c + d log n`` is fitted beside it (it falls faster, so it gives
    the lower of the two extrapolations). Both are clipped to [0, 1].

    Args:
      lengths: [C] mean query length (tokens) of each measured context, C >= 2 distinct.
      unit_density: [C][U] kept fraction of each unit at each context (same units throughout).
      target: the context (tokens) to extrapolate to.

    Returns:
      ``exponent`` b, ``prefactor`` a, ``at_target`` ``f(target)``, ``lo`` / ``hi`` its
      ``level`` bootstrap interval, ``loglinear_at_target``, ``target``, ``level``, ``draws``,
      ``lengths`` and ``means`` (the fitted points).

    Raises:
      ValueError: fewer than two distinct lengths, or unit rows of unequal size.
    """
    x = np.log(np.asarray(lengths, np.float64))
    u = np.asarray(unit_density, np.float64)
    if x.size < 2 or np.unique(x).size < 2 or u.ndim != 2 or u.shape[0] != x.size:
        raise ValueError(f"kept_fraction_fit: expected >= 2 distinct lengths and a [C, U] array of "
                         f"unit densities, got lengths {list(lengths)} and shape {u.shape}")

    def power(means):
        b, log_a = np.polyfit(x, np.log(np.maximum(means, 1e-12)), 1)
        return b, math.exp(log_a)

    means = u.mean(axis=1)
    b, a = power(means)
    at = lambda a_, b_: float(np.clip(a_ * float(target) ** b_, 0.0, 1.0))  # noqa: E731
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, u.shape[1], (draws, u.shape[1]))
    boot = np.array([at(*power(u[:, i].mean(axis=1))[::-1]) for i in idx])
    d, c0 = np.polyfit(x, means, 1)
    return {"exponent": float(b), "prefactor": a, "at_target": at(a, b),
            "lo": float(np.quantile(boot, (1 - level) / 2)),
            "hi": float(np.quantile(boot, (1 + level) / 2)),
            "loglinear_at_target": float(np.clip(c0 + d * math.log(target), 0.0, 1.0)),
            "target": int(target), "level": level, "draws": draws,
            "lengths": [float(v) for v in lengths], "means": means.tolist()}


def needle_trials(seed: int, trials: int, *, num_heads: int, num_kv_heads: int, context: int,
                  head_dim: int, page_size: int, delta: float, needles: int) -> dict:
    """Means over ``trials`` draws (keys ``jax.random.key(seed + t)``) of
    :func:`kernels.sparse_decode.workload.needle_recall` (``needles`` planted needles in a
    ``context``-token synthetic cache, FFD at ``delta`` nats and Quest at its density), with
    ``needle_context``."""
    rows = [workload.needle_recall(
        jax.random.key(seed + t), num_heads, num_kv_heads, context, head_dim, page_size, delta,
        needles) for t in range(trials)]
    return {key: float(np.mean([r[key] for r in rows])) for key in rows[0]} | {
        "needle_context": context}


def token_codec(tokenizer: Any) -> tuple[Callable[[str], list[int]], Callable[[Any], str]]:
    """(encode: text -> list of ids without special tokens, decode: ids -> text) of a checkpoint's
    ``tokenizer`` (``encode(text, add_special_tokens=False)``, ``decode(ids)``), or of the byte
    tokenizer (:class:`core.data.text.ByteTokenizer`) when it is None."""
    if tokenizer is not None:
        return (lambda text: list(tokenizer.encode(text, add_special_tokens=False)),
                tokenizer.decode)
    from core.data.text import ByteTokenizer

    tok = ByteTokenizer()
    return (lambda text: tok.encode(text).tolist(), tok.decode)


# The passkey task's prompt pieces (Mohtashami & Jaggi 2023, Sec. 4.1: an instruction, a key in a
# long repeated filler, a question); the wording is ours.
PASSKEY_INTRO = ("Somewhere in the long text below there is a pass key. Read it, keep it in mind, "
                 "and answer the question at the end.\n")
PASSKEY_FILLER = "The road goes on. The clouds drift by. The water is still. Nothing happens here. "


def passkey(graphdef: Any, params: Any, *, max_len: int, prefix: Sequence[int], tokenizer: Any,
            context: int, page_size: int, new_tokens: int, depths: Sequence[float],
            deltas: dict[str, float], density: float, seed: int) -> dict:
    """A passkey retrieval task through dense, FFD and Quest caches (Mohtashami & Jaggi 2023,
    "Landmark Attention", Sec. 4.1).

    Per row (one per depth of ``depths``, fractions of the prompt): ``prefix`` (the tokenizer's
    special ids), an opening instruction, then a five-digit key (``np.random.default_rng(seed)``)
    stated once at that depth of a filler made of :data:`PASSKEY_FILLER` repeated, the prompt
    ending in a question whose answer is the key (the task's repeated filler, not held-out text:
    on prose a 135M model continues the prose instead of answering). ``new_tokens`` tokens are
    decoded greedily through the dense cache, FFD at each delta of ``deltas`` (nats) and Quest
    attending ``ceil(density x pages)`` pages (pages of ``page_size``). Prompt plus answer fill
    ``context`` tokens (capped at ``max_len``, in whole pages).

    Args:
      graphdef, params: the model (``nnx.split``). max_len: its longest sequence.
      prefix: ids each prompt starts with. tokenizer: as :func:`token_codec` takes it.

    Returns:
      ``rows``, ``context``, ``quest_top_k``, ``dense_correct`` (fraction of rows whose dense
      answer holds the key), and per backend label ``<label>_correct`` and
      ``<label>_equals_dense`` (fraction of rows whose answer tokens equal dense's), with ``keys``
      and ``answers`` (decoded text per backend); or only ``skipped`` (why) when the window
      leaves fewer than 16 tokens of text around the key and question (e.g. a byte-level lm of 64
      positions).
    """
    p, new = page_size, new_tokens
    n = min(context, max_len) // p * p
    enc, dec = token_codec(tokenizer)
    rng = np.random.default_rng(seed)
    intro = enc(PASSKEY_INTRO)
    question = enc("\nWhat is the pass key? The pass key is")
    filler = enc(PASSKEY_FILLER)
    prompts, keys = [], []
    for depth in depths:
        key = str(rng.integers(10_000, 100_000))
        needle = enc(f"\nThe pass key is {key}. Remember it. {key} is the pass key.\n")
        body = n - new - len(prefix) - len(intro) - len(needle) - len(question)
        if body < 16:
            return {"skipped": f"a window of {n} tokens leaves {body} tokens of filler around the "
                               f"key and question"}
        text = (filler * (body // len(filler) + 1))[:body]
        at = int(depth * body)
        prompts.append([*prefix, *intro, *text[:at], *needle, *text[at:], *question])
        keys.append(key)
    prompt = jnp.asarray(np.asarray(prompts, np.int32))
    backends = {"dense": kvc.get_backend("dense")} | {
        label: kvc.get_backend("ffd", page_size=p, delta=delta)
        for label, delta in deltas.items()} | {
        "quest": kvc.get_backend("quest", page_size=p,
                                 top_k=max(1, math.ceil(density * (n // p))))}
    out: dict = {"rows": len(keys), "context": n, "quest_top_k": backends["quest"].top_k,
                 "keys": keys, "answers": {}}
    tokens = {}
    for label, be in backends.items():
        tokens[label], _ = generate(graphdef, params, prompt, jax.random.key(0),
                                    backend=be, max_new_tokens=new, temperature=0.0)
        tokens[label] = np.asarray(tokens[label])
        answers = [dec(row.tolist()) for row in tokens[label]]
        out["answers"][label] = answers
        out[f"{label}_correct"] = float(np.mean([k in a for k, a in zip(keys, answers)]))
        if label != "dense":
            out[f"{label}_equals_dense"] = float(np.mean(np.all(tokens[label] == tokens["dense"],
                                                                axis=1)))
    return out


def storage_perplexity(graphdef: Any, params: Any, tokens: np.ndarray, page_size: int) -> dict:
    """Perplexity of ``tokens`` (int32 [B, W]) with every key in FFD's storage format (2-bit codes
    plus float8 residual on every full page of ``page_size``, values in the cache's dtype) against
    the dense cache: one prefill through each cache, scored by next-token NLL. FFD's prefill
    attends every page over the refined keys, which is its decode with every page kept (delta =
    inf), except that a query's own full page is read refined here where a decode step reads it
    exact.

    Returns:
      ``dense`` and ``ffd_all_pages`` perplexities (per token), ``tokens`` scored (B (W - 1)).
    """
    from flax import nnx

    from models.losses import next_token_nll

    tokens = jnp.asarray(tokens)
    b, n = tokens.shape

    out = {"tokens": int(b * (n - 1))}
    for label, be in (("dense", kvc.get_backend("dense")),
                      ("ffd_all_pages", kvc.get_backend("ffd", page_size=page_size,
                                                        delta=float("inf")))):
        def run(params, tokens, be=be):
            m = nnx.merge(graphdef, params)
            cache = m.init_cache(b, n, be)
            logits, _ = m.decode(tokens, cache, jnp.zeros((b,), jnp.int32), be)
            return next_token_nll(logits, tokens).mean()

        out[label] = float(math.exp(float(jax.jit(run)(params, tokens))))
    return out


def greedy_match(graphdef: Any, params: Any, prompt: np.ndarray, *, new_tokens: int,
                 page_size: int, max_len: int) -> dict:
    """Greedy decoding of ``new_tokens`` tokens after ``prompt`` (int32 [B, L]) through the FFD
    cache (pages of ``page_size``, delta 50 nats) against the dense cache.

    Returns:
      ``greedy_token_match`` (fraction of the B x new_tokens generated tokens that agree) and
      ``greedy_tokens`` (their count).

    Raises:
      ValueError: L + new_tokens above ``max_len`` or not a multiple of ``page_size`` (the FFD
        cache holds whole pages).
    """
    length = prompt.shape[1]
    n = length + new_tokens
    if n > max_len or n % page_size:
        raise ValueError(f"greedy_match: a prompt of {length} tokens plus new_tokens={new_tokens}: "
                         f"expected a sum <= the model's max_len={max_len} and a multiple of "
                         f"page_size={page_size} (the FFD cache holds whole pages)")
    prompt = jnp.asarray(prompt)
    kw = dict(max_new_tokens=new_tokens, temperature=0.0)
    dense, _ = generate(graphdef, params, prompt, jax.random.key(0),
                        backend=kvc.get_backend("dense"), **kw)
    ffd, _ = generate(graphdef, params, prompt, jax.random.key(0),
                      backend=kvc.get_backend("ffd", page_size=page_size, delta=50.0), **kw)
    return {"greedy_token_match": float(jnp.mean(dense == ffd)), "greedy_tokens": int(dense.size)}
