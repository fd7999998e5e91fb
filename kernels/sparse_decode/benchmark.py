"""Speed and bytes of FFD decode attention against dense decode and Quest, timed in one run.

Dimensions: B batch, H query heads, K kv heads, D head dim, p page size, P pages, S = P * p context.

:func:`time_decode` builds a :func:`~kernels.sparse_decode.workload.concentrated_workload` of one
context and times, in interleaved rounds (:func:`interleaved_seconds`: every method once per round,
the order reversed every other round, so that a method and its baseline see the same background
load): dense decode in float32 and bfloat16, FFD with the paper's top-delta rule on the XLA path
(two programs back to back: the float32 scan with the selection, then the attention over the kept
pages; the two stage times add up to FFD's time in every round), the top-k budget variant of FFD
and Quest at the same page budget. Every time and every ratio is reported as the median and the
range (min, max) over the rounds; a ratio is taken round by round (FFD's call against the dense
call of the same round). Bytes are analytic: :func:`ffd_bytes` in the accelerator format (2-bit
codes) and in the CPU path's own format (one byte per code), :func:`dense_bytes`.
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
from kernels.sparse_decode import quest, workload, xla
from kernels.sparse_decode import reference as ref

SLOT_MULTIPLE = 8  # the XLA path's static slot count is rounded up to this many pages


@dataclasses.dataclass(frozen=True)
class SpeedSetup:
    """Geometry and rules of a timing run (the paper's: 32 query / 8 kv heads, D = 128, p = 128).

    Attributes:
      num_heads, num_kv_heads, head_dim, page_size: decode geometry.
      delta: top-delta margin in nats.
      budget_fraction: page budget of the top-k variant and of Quest, as a fraction of the pages.
      repeats: timed rounds after one warm-up call (medians and ranges over the rounds).
      concentration: where the workload puts the softmax mass.
    """

    num_heads: int = 32
    num_kv_heads: int = 8
    head_dim: int = 128
    page_size: int = 128
    delta: float = 6.0
    budget_fraction: float = 0.08
    repeats: int = 7
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
    code for the scan (the ``codes_i8`` copy) and again for the kept pages' refinement.

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


def interleaved_seconds(fns, repeats: int, warmup: int = 1, clock=timing.now
                        ) -> dict[str, list[float]]:
    """Wall-clock seconds of every call, in interleaved rounds.

    ``fns[name]`` is a zero-argument function (one timed step) or, for a method run as stages, a
    list of them, called in order: each call is timed from before the call (JAX dispatch is
    asynchronous, so a clock started after it would miss the work already done) until its output
    is ready, and a method's stage times are returned under ``"<name>/<i>"`` beside their sum
    under ``name``.
    Every function is called ``warmup`` times first (compilation); then ``repeats`` rounds call each
    once, the order reversed every other round (as :func:`core.timing.best_seconds` does), so that
    round ``r`` of every method saw about the same background load.

    Returns:
      {name: [seconds of round 0, round 1, ...]} (stage entries included).

    Raises:
      ValueError: no functions, ``repeats`` < 1 or ``warmup`` < 0.
    """
    if not fns or repeats < 1 or warmup < 0:
        raise ValueError(f"interleaved_seconds: need functions, repeats >= 1 and warmup >= 0, "
                         f"got {len(fns)} functions, {repeats}, {warmup}")

    def call(name):
        stages = fns[name]
        if not isinstance(stages, (list, tuple)):
            t0 = clock()
            jax.block_until_ready(stages())
            return {name: clock() - t0}
        out = {}
        for i, stage in enumerate(stages):
            t0 = clock()
            jax.block_until_ready(stage())
            out[f"{name}/{i}"] = clock() - t0
        out[name] = sum(out.values())
        return out

    for name in fns:
        for _ in range(warmup):
            call(name)
    samples: dict[str, list[float]] = {}
    names = list(fns)
    for r in range(repeats):
        for name in names if r % 2 == 0 else names[::-1]:
            for key, sec in call(name).items():
                samples.setdefault(key, []).append(sec)
    return samples


def summary(values) -> dict[str, float]:
    """{"median", "min", "max"} of a non-empty sequence of numbers."""
    x = np.asarray(values, np.float64)
    return {"median": float(np.median(x)), "min": float(x.min()), "max": float(x.max())}


def fmt_summary(x: dict, spec: str = ".3g") -> str:
    """``"median (min-max)"`` of a :func:`summary`, e.g. ``"0.31 (0.27-0.44)"``."""
    return f"{x['median']:{spec}} ({x['min']:{spec}}-{x['max']:{spec}})"


def time_decode(key: jax.Array, context: int, batch: int, setup: SpeedSetup,
                bandwidth_gbs: float) -> dict:
    """Times dense, FFD and Quest decode attention at one context (see the module docstring).

    FFD's top-delta rule runs on the XLA path as :func:`kernels.sparse_decode.api.ffd_decode` runs
    it on a CPU (cache with the byte-per-code scan copy, default ``xla_scan="float32"``): stage 1 is
    the float32 scan and the selection (:func:`kernels.sparse_decode.reference.ffd_keep`, the
    rule's pages), stage 2 the attention over the kept pages
    (:func:`kernels.sparse_decode.xla.ffd_decode_xla`) with a static slot count of
    :func:`slot_capacity` pages (checked not to bind). The int8 selection (``xla_scan="int8"``,
    :func:`kernels.sparse_decode.xla.ffd_keep_superset`: every page of the rule plus those
    within the scan's margin) is timed in the same rounds as ``int8_scan``. The budget variant keeps the
    ``ceil(budget_fraction * P)`` pages of largest estimated score (``top_k``); Quest gets the same
    budget.

    Args:
      key: PRNG key of the workload. context: S, a multiple of the page size, >= 2 pages.
      batch: B. setup: :class:`SpeedSetup`. bandwidth_gbs: the machine's measured read bandwidth
        (:func:`core.timing.read_bandwidth_gbs`), for the bandwidth fractions.

    Returns:
      A dict. Times in ms, each a :func:`summary` (median, min, max over ``setup.repeats``
      interleaved rounds): ``dense_f32``, ``dense_bf16``, ``dense`` (the variant with the smaller
      median), ``ffd`` (= ``ffd_scan`` + ``ffd_attend`` in every round), ``ffd_budget``,
      ``quest``, ``int8_scan`` (the int8 selection alone, to set beside ``ffd_scan``);
      ``ffd_median_round``: {"total", "scan", "attend"} ms of the round whose FFD time
      is the (lower) median, whose parts add up to its total. Ratios round by round, each a
      :func:`summary`: ``ffd_over_dense`` (FFD time over dense time), ``speedup`` (dense over
      FFD), ``budget_speedup``, ``quest_speedup``. Scalars: ``dense_variant`` ("f32" or "bf16"),
      ``rounds``, ``rule_kept_fraction`` and ``kept_fraction`` (the rule's pages and the pages
      attended, as fractions of the full pages), ``kept_mass`` (exact softmax mass on the rule's
      pages and the tail, minimum over rows and heads), ``slots``, ``bytes_ratio``
      (dense bf16 bytes over FFD's accelerator-format bytes), ``cpu_bytes_ratio`` (the same over
      the CPU path's own bytes), ``dense_bw_fraction`` / ``ffd_bw_fraction`` (bytes read over the
      median time, as a fraction of ``bandwidth_gbs``).

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
    rule = ref.ffd_keep(q, cache, lengths, s.delta)
    keep = rule
    if bool(jnp.any(rule & ~xla.ffd_keep_superset(q, cache, lengths, s.delta))):
        raise RuntimeError("time_decode: the int8 scan dropped a page of the rule")
    slots = slot_capacity(keep)
    capped = ref.ffd_keep(q, cache, lengths, s.delta, None, slots)
    if not bool(jnp.array_equal(keep, capped)):
        raise RuntimeError("time_decode: the slot capacity changed the selected pages")
    mass = float(workload.kept_mass(q, k, rule, lengths).min())
    budget = max(1, math.ceil(s.budget_fraction * n))
    kmin, kmax = quest.quest_metadata(k, p)
    kb, vb = k.astype(jnp.bfloat16), v.astype(jnp.bfloat16)

    dense = jax.jit(ref.dense_decode)
    select = jax.jit(lambda q, c, l, delta: ref.ffd_keep(q, c, l, delta, None, slots))
    select_int8 = jax.jit(functools.partial(xla.ffd_keep_superset, max_pages=slots))
    attend = jax.jit(lambda q, c, l, kp: xla.ffd_decode_xla(q, c, l, max_pages=slots, keep=kp)[0])
    ffd_budget = jax.jit(lambda q, c, l: xla.ffd_decode_xla(q, c, l, top_k=budget,
                                                            max_pages=budget)[0])
    quest_decode = jax.jit(lambda q, k, v, a, z, l: quest.quest_decode(q, k, v, a, z, l, top_k=budget,
                                                              page_size=p)[0])
    kept = {}

    def scan():
        kept["keep"] = select(q, cache, lengths, s.delta)
        return kept["keep"]

    sec = interleaved_seconds({
        "dense_f32": lambda: dense(q, k, v, lengths),
        "dense_bf16": lambda: dense(q, kb, vb, lengths),
        "ffd": [scan, lambda: attend(q, cache, lengths, kept["keep"])],
        "ffd_budget": lambda: ffd_budget(q, cache, lengths),
        "quest": lambda: quest_decode(q, k, v, kmin, kmax, lengths),
        "int8_scan": lambda: select_int8(q, cache, lengths, s.delta),
    }, repeats=s.repeats)
    ms = {name: np.asarray(x) * 1e3 for name, x in sec.items()}
    ms["ffd_scan"], ms["ffd_attend"] = ms.pop("ffd/0"), ms.pop("ffd/1")
    f32_faster = np.median(ms["dense_f32"]) <= np.median(ms["dense_bf16"])
    ms["dense"] = ms["dense_f32"] if f32_faster else ms["dense_bf16"]
    kept_pages = float(np.asarray(keep).sum(-1).mean())
    accel = ffd_bytes(context, kh, d, p, batch, kept_pages, "accelerator")
    cpu = ffd_bytes(context, kh, d, p, batch, kept_pages, "cpu")
    bf16 = dense_bytes(context, kh, d, batch, 2)
    read = dense_bytes(context, kh, d, batch, 4 if f32_faster else 2)
    out = {name: summary(x) for name, x in ms.items()}
    mid = int(np.argsort(ms["ffd"])[(len(ms["ffd"]) - 1) // 2])  # the (lower) median round
    return out | {
        "ffd_median_round": {"total": float(ms["ffd"][mid]), "scan": float(ms["ffd_scan"][mid]),
                             "attend": float(ms["ffd_attend"][mid])},
        "context": context, "batch": batch, "pages": n, "slots": slots, "budget_pages": budget,
        "rounds": s.repeats, "dense_variant": "f32" if f32_faster else "bf16",
        "rule_kept_fraction": float(np.asarray(rule).sum(-1).mean()) / n,
        "kept_fraction": kept_pages / n, "kept_mass": mass,
        "ffd_over_dense": summary(ms["ffd"] / ms["dense"]),
        "speedup": summary(ms["dense"] / ms["ffd"]),
        "budget_speedup": summary(ms["dense"] / ms["ffd_budget"]),
        "quest_speedup": summary(ms["dense"] / ms["quest"]),
        "bytes_ratio": bf16 / accel, "cpu_bytes_ratio": bf16 / cpu,
        "dense_bw_fraction": read / 1e9 / (out["dense"]["median"] / 1e3) / bandwidth_gbs,
        "ffd_bw_fraction": cpu / 1e9 / (out["ffd"]["median"] / 1e3) / bandwidth_gbs,
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


def fmt_breakdown(row: dict, spec: str = ".3g") -> str:
    """``"scan + attend = total"`` ms of a :func:`time_decode` row's median FFD round."""
    r = row["ffd_median_round"]
    return f"{r['scan']:{spec}} + {r['attend']:{spec}} = {r['total']:{spec}}"
