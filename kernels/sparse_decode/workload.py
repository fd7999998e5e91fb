"""Decode workloads and the statistics that judge a page selection on them.

Dimensions: B batch, H query heads, K kv heads, G = H / K, S slots, D head dim, p page size, P pages,
W window length, n windows.

* :func:`concentrated_workload` -- synthetic queries, keys and values whose softmax mass sits on a
  few pages, as long-context models' attention does (the FFD and Quest papers: a small fraction of
  the pages carries almost all the mass): an attention sink on the first tokens, a recent window,
  and a few "retrieval" pages scattered over the context, on a background of noise keys.
* :func:`planted_needles` -- keys aligned with the query at given depths among noise keys.
* :func:`stitch_windows` -- captured q/k/v of n windows laid end to end with RoPE re-applied at
  the sequence positions (a short-context model's activations standing in for a long context).
* :func:`kept_mass` -- the exact softmax mass on the kept pages plus the tail page.
* :func:`cache_with_lengths` -- an FFD cache whose row b holds exactly ``lengths[b]`` tokens.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np

from kernels import checks
from kernels.rope import apply_rope
from kernels.sparse_decode import api, quest
from kernels.sparse_decode import reference as ref


@dataclasses.dataclass(frozen=True)
class Concentration:
    """Where :func:`concentrated_workload` puts the softmax mass (logits in nats).

    Attributes:
      hot_page_fraction: fraction of the full pages (besides the first and the last two) that hold
        retrieval tokens.
      hot_tokens_per_page: retrieval tokens on each such page.
      sink_tokens: tokens at the start of the sequence aligned with the query (attention sink).
      recent_tokens: the last tokens of the sequence aligned with the query (local window).
      logit_low, logit_high: range of the aligned tokens' logits along the kv group's query
        direction (uniform); the background keys' logits are about N(0, background_std^2).
      background_std: standard deviation of a background key's logit.
      head_spread: weight of the per-head part of a query's direction (0: every query head of a
        kv group has the same direction).
    """

    hot_page_fraction: float = 0.06
    hot_tokens_per_page: int = 8
    sink_tokens: int = 4
    recent_tokens: int = 64
    logit_low: float = 11.0
    logit_high: float = 15.0
    background_std: float = 1.0
    head_spread: float = 0.3

    def __post_init__(self):
        where = "Concentration"
        checks.number(self.hot_page_fraction, "hot_page_fraction", where, minimum=0.0,
                      maximum=1.0)
        for name in ("hot_tokens_per_page", "sink_tokens", "recent_tokens"):
            checks.integer(getattr(self, name), name, where, minimum=0)
        checks.number(self.background_std, "background_std", where, minimum=0.0)
        checks.number(self.head_spread, "head_spread", where, minimum=0.0)
        checks.number(self.logit_low, "logit_low", where)
        if not self.logit_high >= self.logit_low:
            raise checks.error(where, "logit_high", f">= logit_low={self.logit_low}",
                               self.logit_high)


def concentrated_workload(key: jax.Array, batch: int, num_heads: int, num_kv_heads: int,
                          seq_len: int, head_dim: int, page_size: int,
                          concentration: Concentration = Concentration()
                          ) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Queries and a cache whose attention is concentrated on a few pages.

    Construction (per row and kv head): a unit direction u; each query head's direction is
    ``u + head_spread * noise`` normalised, scaled to norm sqrt(D) so that a key's logit
    ``q.k / sqrt(D)`` is its projection on the query's unit direction. Background keys are
    N(0, background_std^2) per channel (logits ~ N(0, background_std^2)); "aligned" tokens add
    ``a * u`` with ``a`` uniform in [logit_low, logit_high]: the first ``sink_tokens``, the last
    ``recent_tokens``, and ``hot_tokens_per_page`` random slots on ``hot_page_fraction`` of the
    other full pages (chosen at random). Values are N(0, 1).

    Args:
      key: PRNG key. batch, num_heads, num_kv_heads, seq_len, head_dim, page_size: ints >= 1
        with num_kv_heads | num_heads and page_size | seq_len.
      concentration: where the mass goes (:class:`Concentration`).

    Returns:
      (q float32 [B, H, D], k float32 [B, K, S, D], v float32 [B, K, S, D]).

    Raises:
      ValueError: a size that is not an int >= 1, num_kv_heads not dividing num_heads, or
        page_size not dividing seq_len.
    """
    where = "concentrated_workload"
    for name, value in (("batch", batch), ("num_heads", num_heads),
                        ("num_kv_heads", num_kv_heads), ("seq_len", seq_len),
                        ("head_dim", head_dim), ("page_size", page_size)):
        checks.integer(value, name, where, minimum=1)
    if num_heads % num_kv_heads:
        raise checks.error(where, "num_heads", f"a multiple of num_kv_heads={num_kv_heads}",
                           num_heads)
    if seq_len % page_size:
        raise checks.error(where, "seq_len", f"a multiple of page_size={page_size}", seq_len)
    c = concentration
    b, h, kh, s, d, p = batch, num_heads, num_kv_heads, seq_len, head_dim, page_size
    n, g = s // p, num_heads // num_kv_heads
    k_dir, k_head, k_bg, k_amp, k_pages, k_slots, k_v = jax.random.split(key, 7)

    def unit(x):
        return x / jnp.linalg.norm(x, axis=-1, keepdims=True)

    u = unit(jax.random.normal(k_dir, (b, kh, 1, d)))
    q = unit(u + c.head_spread * jax.random.normal(k_head, (b, kh, g, d)) / math.sqrt(d))
    q = (q * math.sqrt(d)).reshape(b, h, d)
    k = c.background_std * jax.random.normal(k_bg, (b, kh, s, d))
    pos = jnp.arange(s)
    aligned = (pos < c.sink_tokens) | (pos >= s - c.recent_tokens)  # [S]
    num_hot = round(c.hot_page_fraction * max(n - 3, 0))
    if num_hot and c.hot_tokens_per_page:
        # hot pages among pages 1 .. n-3 (the first and the last two carry the sink and the window)
        order = jax.vmap(lambda kk: jax.random.permutation(kk, jnp.arange(1, n - 2)))(
            jax.random.split(k_pages, b))  # [B, n-3]
        pages = order[:, :num_hot]
        offs = jax.random.randint(k_slots, (b, num_hot, c.hot_tokens_per_page), 0, p)
        hot = (pages[:, :, None] * p + offs).reshape(b, -1)
        aligned = jnp.broadcast_to(aligned, (b, s)).at[jnp.arange(b)[:, None], hot].set(True)
    else:
        aligned = jnp.broadcast_to(aligned, (b, s))
    amp = jax.random.uniform(k_amp, (b, kh, s, 1), minval=c.logit_low, maxval=c.logit_high)
    k = k + jnp.where(aligned[:, None, :, None], amp * u, 0.0)
    v = jax.random.normal(k_v, (b, kh, s, d))
    return q, k, v


def planted_needles(q: jax.Array, k: jax.Array, slots, strength: float = 2.0) -> jax.Array:
    """Keys ``k [B, K, S, D]`` with a needle at each of ``slots`` (ints): the kv group's mean query
    direction times ``strength * sqrt(D)`` (its logit is ~strength * |q| nats above a background
    key's). ``q`` [B, H, D]."""
    b, h, d = q.shape
    kh = k.shape[1]
    qdir = q.reshape(b, kh, h // kh, d).mean(2)
    qdir = qdir / jnp.linalg.norm(qdir, axis=-1, keepdims=True)
    for sl in slots:
        k = k.at[:, :, int(sl)].set(qdir * strength * math.sqrt(d))
    return k


def stitch_windows(per_layer, rope) -> list[tuple[jax.Array, jax.Array, jax.Array]]:
    """Per layer q [S, H, D], k, v [K, S, D] of one sequence of S = n * W positions, from captured
    q [n, H, W, D], k, v [n, K, W, D] (RoPE at 0..W-1) of ``n`` windows of W tokens: with n > 1 the
    windows are laid end to end, each query and key rotated from its position in its window to its
    position in the sequence (``rope``: a float base or the model's RoPE frequencies)."""
    out = []
    for q, k, v in per_layer:
        n, _, w, _ = q.shape
        q, k, v = (a.transpose(0, 2, 1, 3) for a in (q, k, v))  # [n, W, heads, D]
        if n > 1:
            local = jnp.broadcast_to(jnp.arange(w), (n, w))
            glob = jnp.arange(n * w)[None]
            q, k = (apply_rope(apply_rope(a, -local, rope).reshape(
                1, n * w, *a.shape[2:]), glob, rope)[0] for a in (q, k))
        else:
            q, k = q[0], k[0]
        out.append((q, k.transpose(1, 0, 2), v.reshape(n * w, *v.shape[2:]).transpose(1, 0, 2)))
    return out


@jax.jit
def _kept_mass(q, k, keep, lengths):
    b, h, d = q.shape
    kh, s = k.shape[1], k.shape[2]
    p = s // keep.shape[-1]
    qg = q.reshape(b, kh, h // kh, d).astype(jnp.float32) / math.sqrt(d)
    logits = jnp.einsum("bkgd,bksd->bkgs", qg, k.astype(jnp.float32))
    valid = jnp.arange(s)[None, :] < lengths[:, None]
    probs = jax.nn.softmax(jnp.where(valid[:, None, None], logits, -jnp.inf), axis=-1)
    page = jnp.arange(s) // p
    tail = (page[None, :] == (lengths // p)[:, None])[:, None, :]
    on = jnp.take_along_axis(keep, jnp.broadcast_to(page, (b, kh, s)), axis=2) | tail
    return jnp.sum(probs * on[:, :, None], -1)


def kept_mass(q: jax.Array, k: jax.Array, keep: jax.Array, lengths: jax.Array) -> jax.Array:
    """Exact softmax mass on the kept pages plus the unfinished tail page, per query head.

    Args:
      q: [B, H, D] queries; k: [B, K, S, D] exact keys; keep: bool [B, K, P] with S = P * p;
      lengths: int [B], tokens per row.

    Returns:
      float32 [B, K, G] in [0, 1] (1 = nothing of the softmax was skipped).

    Raises:
      ValueError: shapes that do not fit together.
    """
    where = "kept_mass"
    checks.array(q, "q", where, ndim=3, kind="float")
    checks.array(k, "k", where, ndim=4, shape=(q.shape[0], None, None, q.shape[2]))
    checks.array(keep, "keep", where, ndim=3, shape=(q.shape[0], k.shape[1], None))
    if k.shape[2] % keep.shape[2] or q.shape[1] % k.shape[1]:
        raise checks.error(where, "keep", f"[B, K, P] with P dividing the {k.shape[2]} slots and "
                           f"K dividing the {q.shape[1]} query heads", keep.shape)
    return _kept_mass(q, k, keep, jnp.asarray(lengths, jnp.int32))


def cache_with_lengths(k: jax.Array, v: jax.Array, lengths: jax.Array, page_size: int,
                       dtype=jnp.float32, scan_copy: bool = False) -> dict[str, jax.Array]:
    """An FFD cache whose row b holds exactly the first ``lengths[b]`` tokens of ``k, v
    [B, K, S, D]`` (slots beyond are zero; the tail page holds the row's unfinished page), as
    appending the tokens one row at a time with :func:`reference.update_ffd_cache` would build.

    Raises:
      ValueError: as :func:`reference.init_ffd_cache` for the layout.
    """
    b, kh, s, d = k.shape
    p = page_size
    cache = ref.init_ffd_cache(b, s, kh, d, dtype, p, scan_copy=scan_copy)
    mask = (jnp.arange(s)[None, :] < lengths[:, None])[:, None, :, None]
    cache = jax.jit(ref.update_ffd_cache)(cache, jnp.where(mask, k, 0.0), jnp.where(mask, v, 0.0),
                                          jnp.zeros((b,), jnp.int32))
    idx = jnp.minimum(lengths // p, s // p - 1)
    kp = k.reshape(b, kh, -1, p, d)
    tail = jnp.take_along_axis(kp, idx[:, None, None, None, None], axis=2)[:, :, 0]
    ok = (jnp.arange(p)[None, :] < (lengths % p)[:, None])[:, None, :, None]
    return {**cache, "tail": jnp.where(ok, tail, 0.0).astype(cache["tail"].dtype)}


def selection_quality(q: jax.Array, k: jax.Array, v: jax.Array, lengths: jax.Array,
                      page_size: int, delta: float) -> dict[str, float]:
    """FFD's top-delta pages and Quest at the same density, judged against exact attention.

    Row b of the batch decodes query ``q[b]`` over the first ``lengths[b]`` tokens of one shared
    sequence ``k, v [K, S, D]`` (ragged rows: each row's cache holds exactly its tokens).

    Args:
      q: [B, H, D] queries at their own positions. k, v: [K, S, D]. lengths: int [B] in 1..S.
      page_size: p (divides S). delta: top-delta margin in nats.

    Returns:
      ``density`` (kept full pages over full pages), ``head_density`` (the same per kv head, a
      list of K floats), ``kept_mass`` (exact softmax mass on the kept pages and tail, mean over
      rows and heads), ``rel_err`` (relative Frobenius error of the output against dense
      attention over the exact keys), and the same three for Quest with
      ``top_k = round(density * mean full pages)`` (``quest_*``). With ``delta = inf`` every
      page is kept and ``rel_err`` is the error of FFD's key storage alone (codes + float8
      residual).
    """
    lengths = jnp.asarray(lengths, jnp.int32)
    keep, mass, err, kb, vb, exact = _ffd_against_exact(q, k, v, lengths, jnp.float32(delta),
                                                        page_size)
    kh = k.shape[0]
    nfull = np.asarray(lengths) // page_size
    total = float(nfull.sum()) * kh
    keep = np.asarray(keep)
    dens = float(keep.sum()) / total
    head_dens = (keep.sum(axis=(0, 2)).astype(np.float64) / float(nfull.sum())).tolist()
    top_k = max(1, round(dens * float(nfull.mean())))
    qkeep, qmass, qerr = _quest_against_exact(q, kb, vb, lengths, exact, page_size, top_k)
    return {"density": dens, "head_density": head_dens, "kept_mass": float(mass),
            "rel_err": float(err), "quest_density": float(np.asarray(qkeep).sum()) / total,
            "quest_kept_mass": float(qmass), "quest_rel_err": float(qerr)}


@functools.partial(jax.jit, static_argnames=("page_size",))
def _ffd_against_exact(q, k, v, lengths, delta, page_size):
    """:func:`selection_quality`'s FFD part in one program (delta traced: one compile per shape)."""
    nq = q.shape[0]
    k, v = k.astype(jnp.float32), v.astype(jnp.float32)
    kb = jnp.broadcast_to(k[None], (nq, *k.shape))
    vb = jnp.broadcast_to(v[None], (nq, *v.shape))
    cache = cache_with_lengths(kb, vb, lengths, page_size)
    out, keep = ref.ffd_decode_reference(q, cache, lengths, delta=delta)
    exact = ref.dense_decode(q, kb, vb, lengths)
    err = jnp.linalg.norm(out - exact) / jnp.linalg.norm(exact)
    return keep, _kept_mass(q, kb, keep, lengths).mean(), err, kb, vb, exact


@functools.partial(jax.jit, static_argnames=("page_size", "top_k"))
def _quest_against_exact(q, kb, vb, lengths, exact, page_size, top_k):
    """:func:`selection_quality`'s Quest part at ``top_k`` pages in one program."""
    kmin, kmax = quest.quest_metadata(kb, page_size)
    qout, qkeep = quest.quest_decode(q, kb, vb, kmin, kmax, lengths, top_k=top_k,
                                     page_size=page_size)
    err = jnp.linalg.norm(qout - exact) / jnp.linalg.norm(exact)
    return qkeep, _kept_mass(q, kb, qkeep, lengths).mean(), err


def needle_recall(key: jax.Array, num_heads: int, num_kv_heads: int, context: int,
                  head_dim: int, page_size: int, delta: float, num_needles: int,
                  strength: float = 2.0) -> dict[str, float]:
    """Planted needles among structured distractors: does the selection keep their pages?

    Keys are a shared direction per kv head (scale 0.7) plus N(0, 1) noise; ``num_needles``
    needles (:func:`planted_needles`) sit at depths 10%..90% of the context, mid-page. FFD's
    top-delta pages and Quest at FFD's density (``top_k = round(density * P)``) are compared.

    Returns:
      ``needle_recall`` and ``quest_needle_recall`` (fraction of needle pages kept, over kv
      heads), ``needle_density`` (FFD's kept fraction of the pages).
    """
    h, kh, d, p, s = num_heads, num_kv_heads, head_dim, page_size, context
    n = s // p
    k1, k2, k3 = jax.random.split(key, 3)
    mean = jax.random.normal(k1, (1, kh, 1, d)) * 0.7
    k = mean + jax.random.normal(k2, (1, kh, s, d))
    v = jax.random.normal(k3, (1, kh, s, d))
    q = jax.random.normal(jax.random.fold_in(key, 1), (1, h, d))
    depths = np.linspace(0.1, 0.9, num_needles)
    slots = (depths * (n - 2)).astype(int) * p + p // 2 + 1
    k = planted_needles(q, k, slots, strength)
    lengths = jnp.array([s], jnp.int32)
    cache = jax.jit(ref.update_ffd_cache)(ref.init_ffd_cache(1, s, kh, d, jnp.float32, p), k, v,
                                          jnp.zeros((1,), jnp.int32))
    keep = np.asarray(api.ffd_select(q, cache, lengths, delta=delta))
    pages = slots // p
    dens = float(keep.mean())
    kmin, kmax = quest.quest_metadata(k, p)
    _, qkeep = quest.quest_decode(q, k, v, kmin, kmax, lengths, top_k=max(1, round(dens * n)),
                                page_size=p)
    return {"needle_recall": float(keep[0][:, pages].mean()),
            "quest_needle_recall": float(np.asarray(qkeep)[0][:, pages].mean()),
            "needle_density": dens}
