"""Sparse decode attention: the public entry points and the op's implementation table.

Dimensions: B batch, H query heads, K kv heads, G = H / K, T new tokens, D head dim, p page size,
P pages, S = P * p capacity.

* :func:`ffd_decode` -- FFD decode attention of one new token per row (``implementation`` =
  ``"xla"`` (the CPU default, :mod:`kernels.sparse_decode.xla`), ``"reference"``
  (:mod:`kernels.sparse_decode.reference`), ``"pallas_tpu"`` (TPU default), ``"pallas_gpu"`` (GPU
  default)); :data:`TABLE` holds each implementation's function, platforms and ``supports``
  hook, resolved by the shared :func:`kernels.dispatch.resolve`.
* :func:`ffd_select` -- the kept-page mask alone (for density and kept-mass statistics).

The KV-cache backends built on these (:class:`~kernels.sparse_decode.cache.FFDCache`,
:class:`~kernels.sparse_decode.cache.QuestCache`) live in :mod:`kernels.sparse_decode.cache`.

Which pages are attended: the reference rule (:func:`kernels.sparse_decode.reference.ffd_keep`,
paper Sec. 3) is the specification, and :func:`ffd_select` returns its mask. :func:`ffd_decode`
computes that mask once and hands it, or its page list, to the reference and the accelerator
kernels, which attend exactly its pages, except the TPU and GPU paths with the top-delta rule (no
``top_k``, no ``max_pages``; on GPU, the shapes of the fused kernel): their kernels apply the same
rule to their own float32 page estimates (:func:`kernels.sparse_decode.pallas_tpu.ffd_scan_select`,
:func:`kernels.sparse_decode.pallas_gpu.ffd_decode_fused`), which the accelerator may round
differently from :func:`ffd_select` (fused multiply-adds, reduction order). So a page whose estimate
lies within float32 rounding of the threshold may be kept by one and skipped by the other (either
choice obeys the rule to float32 precision); every other page, and the page that sets the
threshold, is decided alike. The XLA (CPU) path scans the cache's
byte-per-code copy (``init_ffd_cache(..., scan_copy=True)``) in float32 and attends the rule's
pages; with ``xla_scan="int8"`` it selects with an int8 scan
(:func:`kernels.sparse_decode.xla.ffd_keep_superset`) whose proven margin makes it keep a superset:
every page of the rule, plus the few pages whose estimate lies within the scan's quantization
margin (a fraction of a nat) of the threshold; with ``top_k``, or without the scan copy, it uses
the rule's mask as is. ``return_keep=True`` returns
the pages actually attended.
"""

from __future__ import annotations

import dataclasses
import numbers
from typing import Any

import jax
import jax.numpy as jnp

from kernels import attention_math, checks, dispatch
from kernels.sparse_decode import cost, pallas_gpu, pallas_tpu, xla
from kernels.sparse_decode import reference as ref

XLA_SCANS = ("float32", "int8")  # the XLA path's page scan (:func:`ffd_decode`'s ``xla_scan``)
DELTA_UNITS = ref.DELTA_UNITS


@dataclasses.dataclass(frozen=True)
class DecodeOptions:
    """The arguments of :func:`ffd_decode` every implementation receives, checked.

    Attributes:
      delta_nats: the top-delta margin in nats (a float, or a traced scalar).
      top_k, max_pages, num_splits, interpret, assumed_kept_fraction, xla_scan, return_keep: as
        :func:`ffd_decode`.
    """

    delta_nats: Any
    top_k: int | None
    max_pages: int | None
    num_splits: int | None
    interpret: bool
    assumed_kept_fraction: float
    xla_scan: str
    return_keep: bool

    def result(self, out: jax.Array, keep: jax.Array):
        """What :func:`ffd_decode` returns: ``out``, or ``(out, keep)`` with ``return_keep``."""
        return (out, keep) if self.return_keep else out

    def keep(self, q: jax.Array, cache: dict[str, Any], lengths: jax.Array) -> jax.Array:
        """bool [B, K, P]: the rule's pages (:func:`kernels.sparse_decode.reference.ffd_keep`)."""
        return ref.ffd_keep(q, cache, lengths, self.delta_nats, self.top_k, self.max_pages)

    def slots(self, num_pages: int) -> int:
        """The page slots a kernel gets: ``max_pages`` capped at P (P without a cap)."""
        return num_pages if self.max_pages is None else min(self.max_pages, num_pages)

    def top_delta(self, num_pages: int) -> bool:
        """True for the top-delta rule the fused kernels apply themselves: no ``top_k``, no cap
        below P, a concrete margin."""
        return (self.top_k is None and self.slots(num_pages) == num_pages
                and isinstance(self.delta_nats, numbers.Real))


# Every implementation: fn(q [B, H, D], cache, lengths int32 [B], options: DecodeOptions) ->
# what ffd_decode returns, after ffd_decode's checks.

def _decode_reference(q, cache, lengths, o: DecodeOptions):
    keep = o.keep(q, cache, lengths)
    return o.result(ref.ffd_decode_reference(q, cache, lengths, keep=keep)[0], keep)


def _decode_xla(q, cache, lengths, o: DecodeOptions):
    if o.xla_scan == "int8" and o.top_k is None and "codes_i8" in cache:
        # the CPU scan: int8 x int8 -> int32 with a proven margin, a superset of the rule's pages
        keep = xla.ffd_keep_superset(q, cache, lengths, o.delta_nats, o.max_pages)
    else:
        keep = o.keep(q, cache, lengths)
    return o.result(xla.ffd_decode_xla(q, cache, lengths, max_pages=o.max_pages, keep=keep)[0],
                    keep)


def _decode_pallas_tpu(q, cache, lengths, o: DecodeOptions):
    b, h, d = q.shape
    kh, n = cache["resid"].shape[1:3]
    if o.top_delta(n):
        # the top-delta rule: scan, selection and page list in one Pallas kernel, then attention
        out, idx, count = pallas_tpu.ffd_decode_tpu(
            q, cache, lengths, delta=float(o.delta_nats), interpret=o.interpret,
            assumed_kept_fraction=o.assumed_kept_fraction)
        return (out, pallas_tpu.list_to_mask(idx, count, n)) if o.return_keep else out
    # top-k or a page cap: the XLA selection, then the TPU attention
    keep = o.keep(q, cache, lengths)
    idx, count = ref.page_list(keep, o.slots(n))
    out = pallas_tpu.ffd_pages_attention(
        attention_math.grouped_query(q, kh), cache["codes"], cache["scale"], cache["resid"],
        cache["v"], cache["tail"], idx, count, lengths, interpret=o.interpret,
        assumed_kept_fraction=o.assumed_kept_fraction)
    return o.result(out.reshape(b, h, d).astype(q.dtype), keep)


def _decode_pallas_gpu(q, cache, lengths, o: DecodeOptions):
    n = cache["resid"].shape[2]
    if o.top_delta(n) and _gpu_fusable(q, cache):
        # the top-delta rule: scan, selection and attention fused in one split-K GPU kernel
        return o.result(*_gpu_fused_decode(q, cache, lengths, float(o.delta_nats), o.interpret,
                                           o.assumed_kept_fraction))
    keep = o.keep(q, cache, lengths)
    return o.result(_gpu_pages_decode(q, cache, lengths, keep, o.slots(n), o.num_splits,
                                      o.interpret, o.assumed_kept_fraction), keep)


def _gpu_supports(shapes: dispatch.Shapes, platform: str | None) -> str | None:
    """The GPU kernel tiles pages of a power-of-two size >= 16 and at most 16 query heads per kv
    head. (Head dims that are multiples of 16, which every FFD cache has, are served by every
    implementation.)"""
    del platform
    page_size, group = shapes["page_size"], shapes["group"]
    if page_size < 16 or page_size & (page_size - 1):
        return ("implementation 'pallas_gpu' tiles pages of a power-of-two size >= 16 (16, 32, "
                f"64, 128, ...), got page size {page_size}; use such a page size or "
                "implementation='xla'")
    if group > 16:
        return (f"implementation 'pallas_gpu' serves at most 16 query heads per kv head, got "
                f"{group}; use implementation='xla' or 'reference'")
    return None


# The op's implementation table: what each calls, where it runs, which shapes it tiles
# (shapes: "group" G, "page_size" p), and what "auto" picks per platform.
TABLE = dispatch.Table(
    op="sparse_decode",
    implementations=(
        dispatch.Implementation("reference", _decode_reference),
        dispatch.Implementation("xla", _decode_xla),
        dispatch.Implementation("pallas_tpu", _decode_pallas_tpu, ("tpu",), interpretable=True),
        dispatch.Implementation("pallas_gpu", _decode_pallas_gpu, ("gpu",), interpretable=True,
                                supports=_gpu_supports),
    ),
    auto={"tpu": ("pallas_tpu",), "gpu": ("pallas_gpu",), "*": ("xla",)},
)
IMPLEMENTATIONS = TABLE.names


def default_implementation() -> str:
    """``pallas_tpu`` on TPU, ``pallas_gpu`` on GPU, ``xla`` otherwise (``TABLE.auto``)."""
    return TABLE.auto_choice(dispatch.current_platform()).name


def resolve_implementation(implementation: str | None, where: str = "ffd_decode") -> str:
    """``"auto"`` (or None): :func:`default_implementation` (dispatch by platform); otherwise
    one of :data:`IMPLEMENTATIONS` (:func:`kernels.dispatch.resolve` without a platform: the name
    only; :func:`ffd_decode` also refuses one that cannot run on the platform of its call or
    cannot tile its shapes).

    Raises:
      ValueError: an unknown name (the message lists the valid ones and their platforms).
    """
    return dispatch.resolve(TABLE, implementation, where).name


def kernel_shapes(q: jax.Array, cache: dict[str, Any]) -> dict[str, int]:
    """The shapes an implementation's ``supports`` hook is asked about: ``group`` G = H / K and
    ``page_size`` p of queries ``q [B, H, D]`` on an FFD cache."""
    kh, _, p = cache["resid"].shape[1:4]
    return {"group": q.shape[1] // kh, "page_size": p}


def check_delta(delta, delta_unit: str, where: str) -> None:
    """Raises ValueError unless ``delta`` is a number >= 0 (``inf`` allowed) and ``delta_unit`` one
    of :data:`DELTA_UNITS`."""
    checks.one_of(delta_unit, "delta_unit", where, DELTA_UNITS)
    checks.number(delta, "delta", where, minimum=0.0, finite=False)  # inf: attend every page


def check_count(value, name: str, where: str) -> None:
    """Raises ValueError unless ``value`` is None or an int >= 1."""
    checks.integer(value, name, where, minimum=1, allow_none=True)


def _check(q: jax.Array, cache: dict[str, Any], delta, delta_unit: str, top_k: int | None,
           max_pages: int | None, where: str) -> None:
    checks.array(q, "q", where, ndim=3, kind="float", nonempty=True)
    ref.check_cache(cache, where)
    b, kh, n, p, d = cache["resid"].shape
    if q.shape[-1] != d:
        raise ValueError(f"{where}: query head dim {q.shape[-1]} != cache head dim {d}")
    if q.shape[0] != b:
        raise ValueError(f"{where}: query batch {q.shape[0]} != cache batch {b}")
    if q.shape[1] % kh:
        raise ValueError(f"{where}: {q.shape[1]} query heads are not a multiple of {kh} kv heads")
    if top_k is None:
        check_delta(delta, delta_unit, where)
    check_count(top_k, "top_k", where)
    check_count(max_pages, "max_pages", where)


def ffd_select(q: jax.Array, cache: dict[str, Any], lengths: jax.Array, *, delta: float = 8.0,
               delta_unit: str = "nats", top_k: int | None = None,
               max_pages: int | None = None) -> jax.Array:
    """bool [B, K, P]: the full pages FFD attends for queries ``q [B, H, D]`` (paper Sec. 3 rule,
    see :func:`kernels.sparse_decode.reference.select_pages`); the mask :func:`ffd_decode` uses,
    arguments and errors as there (the same checks: lengths outside 1..S are refused by both)."""
    _check(q, cache, delta, delta_unit, top_k, max_pages, "ffd_select")
    n, p = cache["resid"].shape[2], cache["resid"].shape[3]
    ref.check_lengths(lengths, n * p, "ffd_select", batch=q.shape[0])
    return ref.ffd_keep(q, cache, jnp.asarray(lengths, jnp.int32),
                        ref.delta_in_nats(delta, delta_unit), top_k, max_pages)


def ffd_decode(q: jax.Array, cache: dict[str, Any], lengths: jax.Array, *, delta: float = 8.0,
               delta_unit: str = "nats", top_k: int | None = None, max_pages: int | None = None,
               num_splits: int | None = None, implementation: str | None = "auto",
               interpret: bool = False, return_keep: bool = False,
               assumed_kept_fraction: float = cost.DEFAULT_KEPT_FRACTION,
               xla_scan: str = "float32"):
    """FFD decode attention: ``q [B, H, D]`` over an FFD cache holding ``lengths [B]`` tokens.

    The pages are chosen once per call, by the rule of :func:`ffd_select` (paper Sec. 3), plus the
    unfinished tail page: the reference and the Pallas kernels attend the rule's pages (the TPU and
    GPU top-delta kernels from their own float32 estimates: pages within float32 rounding of the
    threshold may differ from :func:`ffd_select`, module docstring); the XLA path with
    ``xla_scan="int8"`` may attend a superset (module docstring), so it agrees with them to
    float32 rounding plus the weight of the extra pages, each within the scan's margin of the
    threshold.

    Args:
      q: queries of the new tokens (RoPE applied), any float dtype.
      cache: from :func:`kernels.sparse_decode.reference.init_ffd_cache` / ``update_ffd_cache``.
      lengths: int32 [B] in 1..S, tokens in each row (the new token included).
      delta: top-delta margin (>= 0; ``inf`` attends every page). Skipped pages have estimated
        weights below ``exp(-delta)`` (nats) of the largest estimated weight of the first and last
        full pages.
      delta_unit: ``"nats"`` (natural-log logits, the default) or ``"log2"`` (base-2 logits, the
        unit of the authors' kernel: ``delta_log2 = delta_nats / ln 2``; their defaults 5 and 7
        are 3.47 and 4.85 nats, and our 6 nats is 8.66 there; a value of theirs can be passed as
        is with ``delta_unit="log2"``).
      top_k: if set, the top-k-pages variant: exactly ``min(top_k, full pages)`` pages by score
        (a global pass over the page scores).
      max_pages: attend at most this many of the selected pages per (row, kv head), those with the
        largest estimated page score (ties to the lower page index); the same meaning in every
        implementation (``None``: no cap). It is also the static gather budget of the XLA path and
        the slot count of the Pallas kernels.
      num_splits: the GPU kernel's split-K factor over the page slots (default up to 8); the TPU
        kernel walks each (row, kv head)'s pages in one grid step and ignores it.
      implementation: ``"auto"`` (the default; None means the same: dispatch by platform,
        Pallas on TPU/GPU, XLA on CPU, :func:`default_implementation`) or one of
        :data:`IMPLEMENTATIONS` that runs on the call's platform (a Pallas kernel runs on any
        platform with ``interpret=True``; :func:`kernels.dispatch.resolve`).
      interpret: run Pallas kernels in interpret mode (CPU testing).
      return_keep: also return the attended-page mask (the XLA path's superset where it has one).
      assumed_kept_fraction: Pallas paths: the fraction f in (0, 1] of the pages the kernel's
        declared ``pl.CostEstimate`` assumes attended (:mod:`kernels.sparse_decode.cost`; default
        :data:`~kernels.sparse_decode.cost.DEFAULT_KEPT_FRACTION`); static, it changes only the
        cost XLA sees, never the output.
      xla_scan: the XLA (CPU) path's page scan over the cache's byte-per-code copy:
        ``"float32"`` (the default: the rule's exact pages) or ``"int8"`` (an int8 x int8 -> int32
        product with a proven margin, :func:`kernels.sparse_decode.xla.ffd_keep_superset`: a
        superset). On
        XLA:CPU here the int8 selection measured 2.4x slower than the float32 scan (quantizing the
        query per page costs more than the narrower product saves), hence the default. Ignored by
        the other implementations and on a cache without the scan copy.

    Returns:
      [B, H, D] in ``q``'s dtype; with ``return_keep``, ``(out, keep bool [B, K, P])``. Never NaN
      for finite input (every row attends at least one token). A NaN in a key within a row's
      length, or in a value the row attends, makes that row's output NaN, as dense attention does
      (values of skipped pages are never read).

    Raises:
      ValueError: ``q`` not a non-empty float [B, H, D], ``cache`` not an FFD cache, shape
        mismatch (head dim, batch, heads), ``delta`` not a number >= 0, an unknown ``delta_unit``,
        ``top_k``/``max_pages``/``num_splits`` not an int >= 1, ``lengths`` not int [B] or,
        when concrete, outside 1..S, an unknown implementation or, on concrete arrays, one that
        does not run on this platform (one wording for every op, :func:`kernels.dispatch.resolve`),
        a shape the picked kernel cannot tile (its ``supports`` hook, :func:`kernel_shapes`;
        ``"auto"`` refuses too, never swapping kernels),
        ``assumed_kept_fraction`` not in (0, 1], or ``xla_scan`` not ``"float32"`` / ``"int8"``.
    """
    _check(q, cache, delta, delta_unit, top_k, max_pages, "ffd_decode")
    if xla_scan not in XLA_SCANS:
        raise checks.error("ffd_decode", "xla_scan", f"one of {XLA_SCANS}", repr(xla_scan))
    check_count(num_splits, "num_splits", "ffd_decode")
    cost.check_kept_fraction(assumed_kept_fraction, "ffd_decode")
    impl = dispatch.resolve(TABLE, implementation, "ffd_decode",
                            platform=dispatch.call_platform(q, cache, lengths), interpret=interpret,
                            shapes=kernel_shapes(q, cache))
    b, _, n, p, _ = cache["resid"].shape
    ref.check_lengths(lengths, n * p, "ffd_decode", batch=b)
    return impl.fn(q, cache, jnp.asarray(lengths, jnp.int32), DecodeOptions(
        delta_nats=ref.delta_in_nats(delta, delta_unit), top_k=top_k, max_pages=max_pages,
        num_splits=num_splits, interpret=interpret, assumed_kept_fraction=assumed_kept_fraction,
        xla_scan=xla_scan, return_keep=return_keep))


def _gpu_fusable(q, cache) -> bool:
    """Shapes the fused GPU kernel takes: G <= 16 and W = D / 16 and p powers of two, p >= 16."""
    b, kh, n, p, d = cache["resid"].shape
    w = d // ref.CODES_PER_WORD
    return q.shape[1] // kh <= 16 and p >= 16 and not p & (p - 1) and not w & (w - 1)


def _gpu_fused_decode(q, cache, lengths, delta, interpret, kept_fraction):
    """The fused GPU kernel's partials merged with the tail page: (out [B, H, D], keep)."""
    b, h, d = q.shape
    qg = attention_math.grouped_query(q, cache["resid"].shape[1])
    acc, m, l, keep = pallas_gpu.ffd_decode_fused(
        qg, cache["codes"], cache["scale"], cache["resid"], cache["v"], lengths, delta=delta,
        interpret=interpret, assumed_kept_fraction=kept_fraction)
    acc = jnp.where(jnp.isneginf(m)[..., None], 0.0, acc)  # programs that kept no page
    ta, tm, tl = ref.tail_partial(qg, cache, lengths)
    out = attention_math.merge_partials(jnp.concatenate([acc, ta[:, :, None]], 2),
                             jnp.concatenate([m, tm[:, :, None]], 2),
                             jnp.concatenate([l, tl[:, :, None]], 2), 2)
    return out.reshape(b, h, d).astype(q.dtype), keep


def _gpu_pages_decode(q, cache, lengths, keep, m_slots, num_splits, interpret, kept_fraction):
    """The GPU kernel over the kept pages as a list (slots: a multiple of the splits), its
    partials LSE-merged with the tail page: out [B, H, D] in ``q``'s dtype."""
    b, h, d = q.shape
    qg = attention_math.grouped_query(q, cache["resid"].shape[1])
    splits = num_splits or min(8, m_slots)
    idx, count = ref.page_list(keep, -(-m_slots // splits) * splits)  # slots: a multiple of NS
    acc, m, l = pallas_gpu.ffd_pages_attention(
        qg, cache["codes"], cache["scale"], cache["resid"], cache["v"], idx, count,
        num_splits=splits, interpret=interpret, assumed_kept_fraction=kept_fraction)
    ta, tm, tl = ref.tail_partial(qg, cache, lengths)
    out = attention_math.merge_partials(jnp.concatenate([acc, ta[:, :, None]], 2),
                                        jnp.concatenate([m, tm[:, :, None]], 2),
                                        jnp.concatenate([l, tl[:, :, None]], 2), 2)
    return out.reshape(b, h, d).astype(q.dtype)
