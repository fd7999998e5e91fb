"""Speed and bytes of FFD decode attention against dense decode and Quest, timed in one run.

Dimensions: B batch, H query heads, K kv heads, D head dim, p page size, P pages, S = P * p context.

:func:`time_decode` builds a :func:`~kernels.sparse_decode.workload.concentrated_workload` of one
context and times, alternating calls (:func:`core.timing.best_seconds`): dense decode in float32 and
bfloat16, FFD with the paper's top-delta rule (the pages it keeps), FFD's two stages alone (the
2-bit scan with the selection, and the attention over the kept pages), the top-k budget variant of
FFD and Quest at the same page budget. Bytes are analytic: :func:`ffd_bytes` in the accelerator
format (2-bit codes) and in the CPU path's own format (one byte per code), :func:`dense_bytes`.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np

from core import timing
from kernels import checks
from kernels.sparse_decode import reference as ref
from kernels.sparse_decode import workload

SLOT_MULTIPLE = 8  # the XLA path's static slot count is rounded up to this many pages


@dataclasses.dataclass(frozen=True)
class SpeedSetup:
    """Geometry and rules of a timing run (the paper's: 32 query / 8 kv heads, D = 128, p = 128).

    Attributes:
      num_heads, num_kv_heads, head_dim, page_size: decode geometry.
      delta: top-delta margin in nats.
      budget_fraction: page budget of the top-k variant and of Quest, as a fraction of the pages.
      repeats: timed rounds (best of) after one warm-up call.
      concentration: where the workload puts the softmax mass.
    """

    num_heads: int = 32
    num_kv_heads: int = 8
    head_dim: int = 128
    page_size: int = 128
    delta: float = 6.0
    budget_fraction: float = 0.08
    repeats: int = 3
    concentration: workload.Concentration = workload.Concentration()

    def __post_init__(self):
        for name in ("num_heads", "num_kv_heads", "head_dim", "page_size", "repeats"):
            checks.integer(getattr(self, name), name, "SpeedSetup", minimum=1)
        checks.number(self.delta, "delta", "SpeedSetup", minimum=0.0, finite=False)
        checks.number(self.budget_fraction, "budget_fraction", "SpeedSetup", minimum=0.0,
                      maximum=1.0, open_min=True)


def dense_bytes(context: int, num_kv_heads: int, head_dim: int, batch: int,
                itemsize: int) -> float:
    """Bytes dense decode reads: keys and values of every slot, ``itemsize`` bytes each."""
    return float(batch * num_kv_heads * context * head_dim * 2 * itemsize)


def ffd_bytes(context: int, num_kv_heads: int, head_dim: int, page_size: int, batch: int,
              kept_pages: float, layout: str = "accelerator") -> float:
    """Bytes one FFD decode step reads (analytic), per the layout of its codes.

    ``"accelerator"``: 2-bit codes (D / 4 bytes per key) and float32 scales of every full page,
    float8 residuals and bf16 values of the ``kept_pages`` pages (per row and kv head), the tail
    page's keys (float32) and values (bf16). ``"cpu"``: the XLA path's own reads, one byte per
    code for the scan (the ``codes_u8`` copy) and again for the kept pages' refinement.

    Raises:
      ValueError: an unknown layout.
    """
    checks.one_of(layout, "layout", "ffd_bytes", ("accelerator", "cpu"))
    p, d = page_size, head_dim
    n = context // p
    code = d / 4 if layout == "accelerator" else d
    scan = n * p * code + n * d * 4
    kept = kept_pages * (p * d * (1 + 2) + (0 if layout == "accelerator" else p * code) + d * 4)
    return float(batch * num_kv_heads * (scan + kept + p * d * (4 + 2)))


def slot_capacity(keep: jax.Array) -> int:
    """The smallest multiple of :data:`SLOT_MULTIPLE` pages (at most P) that holds every
    (row, kv head)'s kept pages: a static slot count for the XLA path that does not bind."""
    n = keep.shape[-1]
    most = int(np.asarray(keep).sum(-1).max())
    return int(min(n, max(SLOT_MULTIPLE, -(-most // SLOT_MULTIPLE) * SLOT_MULTIPLE)))


def time_decode(key: jax.Array, context: int, batch: int, setup: SpeedSetup,
                bandwidth_gbs: float) -> dict:
    """Times dense, FFD and Quest decode attention at one context (see the module docstring).

    FFD's top-delta rule runs on the XLA path with a static slot count of :func:`slot_capacity`
    pages: the rule's own pages (checked: the capped selection equals the uncapped one). The
    budget variant keeps the ``ceil(budget_fraction * P)`` pages of largest estimated score
    (``top_k``); Quest gets the same budget.

    Args:
      key: PRNG key of the workload. context: S, a multiple of the page size, >= 2 pages.
      batch: B. setup: :class:`SpeedSetup`. bandwidth_gbs: the machine's measured read bandwidth
        (:func:`core.timing.read_bandwidth_gbs`), for the bandwidth fractions.

    Returns:
      A dict: times in ms (``dense_f32_ms``, ``dense_bf16_ms``, ``dense_ms`` (the faster),
      ``ffd_ms``, ``ffd_scan_ms``, ``ffd_attend_ms``, ``ffd_budget_ms``, ``quest_ms``),
      ``kept_fraction`` and ``kept_mass`` (exact softmax mass on the kept pages and tail, minimum
      over rows and heads) of the rule, ``slots``, speed-ups against the faster dense variant,
      ``bytes_ratio`` (dense bf16 bytes over FFD's accelerator-format bytes), ``cpu_bytes_ratio``
      (the same over the CPU path's own bytes), and ``dense_bw_fraction`` / ``ffd_bw_fraction``
      (bytes read over time, as a fraction of ``bandwidth_gbs``).

    Raises:
      ValueError: a context that is not a multiple of the page size of at least two pages.
    """
    s = setup
    h, kh, d, p = s.num_heads, s.num_kv_heads, s.head_dim, s.page_size
    if context % p or context < 2 * p:
        raise checks.error("time_decode", "context", f"a multiple of page_size={p} of at least "
                           "two pages", context)
    n = context // p
    q, k, v = workload.concentrated_workload(key, batch, h, kh, context, d, p, s.concentration)
    lengths = jnp.full((batch,), context, jnp.int32)
    cache = jax.jit(ref.update_ffd_cache)(
        ref.init_ffd_cache(batch, context, kh, d, jnp.float32, p, scan_copy=True), k, v,
        jnp.zeros((batch,), jnp.int32))
    keep = ref.ffd_keep(q, cache, lengths, s.delta)
    slots = slot_capacity(keep)
    capped = ref.ffd_keep(q, cache, lengths, s.delta, max_pages=slots)
    if not bool(jnp.array_equal(keep, capped)):
        raise RuntimeError("time_decode: the slot capacity changed the rule's pages")
    mass = float(workload.kept_mass(q, k, keep, lengths).min())
    budget = max(1, math.ceil(s.budget_fraction * n))
    kmin, kmax = ref.quest_metadata(k, p)
    kb, vb = k.astype(jnp.bfloat16), v.astype(jnp.bfloat16)

    dense = jax.jit(ref.dense_decode)
    scan = jax.jit(functools.partial(ref.ffd_keep, max_pages=slots))
    attend = jax.jit(lambda q, c, l, kp: ref.ffd_decode_xla(q, c, l, max_pages=slots, keep=kp)[0])
    ffd = jax.jit(lambda q, c, l: ref.ffd_decode_xla(q, c, l, delta=s.delta, max_pages=slots)[0])
    ffd_budget = jax.jit(lambda q, c, l: ref.ffd_decode_xla(q, c, l, top_k=budget,
                                                            max_pages=budget)[0])
    quest = jax.jit(lambda q, k, v, a, z, l: ref.quest_decode(q, k, v, a, z, l, top_k=budget,
                                                              page_size=p)[0])
    t = timing.best_seconds({
        "dense_f32": lambda: dense(q, k, v, lengths),
        "dense_bf16": lambda: dense(q, kb, vb, lengths),
        "ffd": lambda: ffd(q, cache, lengths),
        "ffd_scan": lambda: scan(q, cache, lengths, s.delta),
        "ffd_attend": lambda: attend(q, cache, lengths, keep),
        "ffd_budget": lambda: ffd_budget(q, cache, lengths),
        "quest": lambda: quest(q, k, v, kmin, kmax, lengths),
    }, repeats=s.repeats)
    ms = {name: sec * 1e3 for name, sec in t.items()}
    f32_faster = ms["dense_f32"] <= ms["dense_bf16"]
    dense_ms = min(ms["dense_f32"], ms["dense_bf16"])
    kept_pages = float(np.asarray(keep).sum(-1).mean())
    accel = ffd_bytes(context, kh, d, p, batch, kept_pages, "accelerator")
    cpu = ffd_bytes(context, kh, d, p, batch, kept_pages, "cpu")
    bf16 = dense_bytes(context, kh, d, batch, 2)
    read = dense_bytes(context, kh, d, batch, 4 if f32_faster else 2)
    return {
        "context": context, "batch": batch, "pages": n, "slots": slots, "budget_pages": budget,
        "kept_fraction": kept_pages / n, "kept_mass": mass,
        "dense_f32_ms": ms["dense_f32"], "dense_bf16_ms": ms["dense_bf16"], "dense_ms": dense_ms,
        "ffd_ms": ms["ffd"], "ffd_scan_ms": ms["ffd_scan"], "ffd_attend_ms": ms["ffd_attend"],
        "ffd_budget_ms": ms["ffd_budget"], "quest_ms": ms["quest"],
        "speedup_vs_dense": dense_ms / ms["ffd"],
        "budget_speedup_vs_dense": dense_ms / ms["ffd_budget"],
        "quest_speedup_vs_dense": dense_ms / ms["quest"],
        "bytes_ratio": bf16 / accel, "cpu_bytes_ratio": bf16 / cpu,
        "dense_bw_fraction": read / 1e9 / (dense_ms / 1e3) / bandwidth_gbs,
        "ffd_bw_fraction": cpu / 1e9 / (ms["ffd"] / 1e3) / bandwidth_gbs,
    }


def speed_table(key: jax.Array, contexts, batch_sizes, setup: SpeedSetup,
                bandwidth_gbs: float) -> list[dict]:
    """:func:`time_decode` at every (context, batch), workload keys folded from ``key``."""
    rows = []
    for s in contexts:
        for b in batch_sizes:
            rows.append(time_decode(jax.random.fold_in(key, s * 131 + b), s, b, setup,
                                    bandwidth_gbs))
    return rows
