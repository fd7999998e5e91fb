"""On-device check of the Pallas GPU kernels -> ``DEVICE.md``: correctness against the jnp
references, FFD against dense decode and JAX's ``decode_attention``, QVG against bf16 dense.

    make device-check                       # on a GPU machine: own venv, --size=paper
    python -m experiments.device_check --size=smoke --out=/tmp/DEVICE.md   # CPU, interpret mode

Checks, on random inputs (fresh keys, never zeros):

* FFD (``kernels.sparse_decode``, Pallas GPU) against its jnp reference over the same kept pages,
  on a concentrated workload (``workload.concentrated_workload``: attention sink, recent window,
  a few retrieval pages; the regime the paper targets), and JAX's own
  ``pallas.ops.gpu.decode_attention`` (the timing baseline) against dense decode.
* QVG (``kernels.kv_quant``, Pallas GPU) against its jnp reference over a cache quantized by the
  backend's own update.
* Times, best of ``reps`` alternating calls (``core.timing.best_seconds``): dense bf16 decode,
  ``decode_attention`` (bf16) and FFD per context and batch: the FFD paper's anchor is 11.6x over
  FlashDecoding at 256k; and QVG's attention (quantized chunks + full-precision window) against
  bf16 dense over the same context: the QVG paper's claim is under 4% end-to-end overhead.

Sizes (:data:`SIZES`): ``paper`` (32 query / 8 kv heads, D = 128, contexts 32k-256k, batch 1 and
8; the sparse_decode and kv_quant paper variants' page, delta and QVG settings), sized for under 8
minutes on one H200; ``smoke`` (one 512-token context, small heads) runs in seconds on a CPU in interpret
mode and is what ``make test`` checks until the script has run on a GPU.
"""

from __future__ import annotations

import dataclasses
import datetime
import functools
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np

from core import timing


@dataclasses.dataclass(frozen=True)
class Size:
    """Shapes and settings of one run (page size, delta and the QVG fields as the sparse_decode
    and kv_quant ``paper`` configs; ``tests/experiments/test_device_check.py`` checks that)."""

    contexts: tuple[int, ...]
    batches: tuple[int, ...]
    num_heads: int = 32
    num_kv_heads: int = 8
    head_dim: int = 128
    page_size: int = 128
    delta: float = 6.0  # nats
    qvg_contexts: tuple[int, ...] = (32768, 131072)
    qvg_chunk: int = 256
    qvg_centroids: int = 16
    qvg_block: int = 64
    qvg_bits: int = 2
    qvg_kmeans_iters: int = 20
    reps: int = 20
    tolerance: float = 2e-3  # max |kernel - reference| / max |reference|


SIZES = {
    "paper": Size(contexts=(32768, 65536, 131072, 262144), batches=(1, 8)),
    "smoke": Size(contexts=(512,), batches=(2,), num_heads=4, num_kv_heads=2, head_dim=64,
                  qvg_contexts=(256,), qvg_chunk=64, qvg_centroids=4, qvg_kmeans_iters=2, reps=1),
}


def _rel_err(got, want) -> float:
    got, want = np.asarray(got, np.float32), np.asarray(want, np.float32)
    return float(np.abs(got - want).max() / max(np.abs(want).max(), 1e-30))


def _ffd_inputs(key, size: Size, batch: int, context: int, dtype):
    from kernels.sparse_decode import workload

    q, k, v = workload.concentrated_workload(key, batch, size.num_heads, size.num_kv_heads,
                                             context, size.head_dim, size.page_size)
    lengths = jnp.full((batch,), context, jnp.int32).at[0].set(context - size.page_size // 2 - 1)
    cache = workload.cache_with_lengths(k, v.astype(jnp.bfloat16), lengths, size.page_size,
                                        jnp.bfloat16)
    return q.astype(dtype), k.astype(dtype), v.astype(dtype), cache, lengths


def _ffd_checks(q, k, v, cache, n, size, ffd, dense, flash) -> list[dict]:
    """FFD's kernel against its reference over the same pages, and decode_attention against
    dense decode; float32 queries (and keys / values for the dense pair) so that the comparison
    is not bf16 output rounding."""
    from kernels.sparse_decode import api

    q32, k32, v32 = (x.astype(jnp.float32) for x in (q, k, v))
    shape = f"B {q.shape[0]}, S {k.shape[2]}"
    keep = api.ffd_select(q32, cache, n, delta=size.delta)
    return [{"kernel": "FFD pallas_gpu", "vs": "jnp reference (same pages)", "shape": shape,
             "rel_err": _rel_err(ffd(q32, cache, n, "pallas_gpu"), ffd(q32, cache, n, "reference")),
             "density": float(keep.mean())},
            {"kernel": "jax decode_attention", "vs": "dense decode", "shape": shape,
             "rel_err": _rel_err(flash(q32, k32, v32, n), dense(q32, k32, v32, n))}]


def check_ffd(key, size: Size, interpret: bool) -> tuple[list[dict], list[dict]]:
    """(correctness rows, timing rows) of FFD, dense and ``decode_attention``."""
    from jax.experimental.pallas.ops.gpu import decode_attention as da

    from kernels.sparse_decode import api
    from kernels.sparse_decode import reference as ref

    ffd = jax.jit(lambda q, c, n, impl: api.ffd_decode(q, c, n, delta=size.delta,
                                                       implementation=impl, interpret=interpret),
                  static_argnums=3)
    dense = jax.jit(ref.dense_decode)
    flash = jax.jit(lambda q, k, v, n: da.gqa(q, k.swapaxes(1, 2), v.swapaxes(1, 2),
                                              kv_seq_len=n, interpret=interpret))
    checks, times = [], []
    for context in size.contexts:
        for batch in size.batches:
            key, sub = jax.random.split(key)
            # timed in bfloat16 on a GPU; float32 in interpret mode (the checks' compiles serve)
            q, k, v, cache, n = _ffd_inputs(sub, size, batch, context,
                                            jnp.float32 if interpret else jnp.bfloat16)
            if context == size.contexts[0] or context == size.contexts[-1] and batch == 1:
                checks += _ffd_checks(q, k, v, cache, n, size, ffd, dense, flash)
            t = timing.best_seconds({
                "dense": lambda a=(q, k, v, n): dense(*a),
                "flash": lambda a=(q, k, v, n): flash(*a),
                "ffd": lambda a=(q, cache, n): ffd(*a, "pallas_gpu")}, size.reps)
            times.append({"context": context, "batch": batch, **{f"{m}_ms": 1e3 * s
                                                                for m, s in t.items()},
                          "vs_dense": t["dense"] / t["ffd"], "vs_flash": t["flash"] / t["ffd"]})
    return checks, times


def check_qvg(key, size: Size, interpret: bool) -> tuple[list[dict], list[dict]]:
    """(correctness rows, timing rows) of QVG's attention against bf16 dense."""
    from kernels.kv_quant import api
    from kernels.kv_quant import reference as ref
    from models import kv_cache as kvc

    cfg = ref.qvg_preset("qvg", bits=size.qvg_bits, block=min(size.qvg_block, size.head_dim),
                         num_centroids=size.qvg_centroids, chunk=size.qvg_chunk,
                         kmeans_iters=size.qvg_kmeans_iters)
    b, h, kh, d = 1, size.num_heads, size.num_kv_heads, size.head_dim
    checks, times = [], []
    for context in size.qvg_contexts:
        kq, kk, kv, key = jax.random.split(key, 4)
        k = jax.random.normal(kk, (b, kh, context, d), jnp.bfloat16)
        v = jax.random.normal(kv, (b, kh, context, d), jnp.bfloat16)
        q = jax.random.normal(kq, (b, h, 1, d), jnp.bfloat16)
        start = jnp.full((b,), context - 1, jnp.int32)
        ref_backend = kvc.get_backend("qvg", config=cfg, implementation="reference")
        c = jax.jit(ref_backend.update)(ref_backend.init(b, context, kh, d, jnp.bfloat16),
                                        k[:, :, :-1], v[:, :, :-1], jnp.zeros((b,), jnp.int32))
        qr = q.reshape(b, kh, h // kh, d)
        nq = (start + 1) // cfg.chunk * cfg.chunk
        attend = jax.jit(lambda qr, c, impl, s=start, m=nq: api.qvg_chunk_attention(
            qr, c["k"], c["v"], cfg, s, m, 1, 10_000.0, impl, interpret), static_argnums=2)
        checks.append({"kernel": "QVG pallas_gpu", "vs": "jnp reference",
                       "shape": f"B {b}, S {context}", "rel_err": _rel_err(
                           attend(qr, c, "pallas_gpu")[0], attend(qr, c, "reference")[0])})
        dense = kvc.get_backend("dense")
        full = dense.update(dense.init(b, context, kh, d, jnp.bfloat16), k, v,
                            jnp.zeros((b,), jnp.int32))
        if interpret:  # the backend's own kernel call is not in interpret mode; time the chunks
            qvg_step = functools.partial(attend, qr, c, "pallas_gpu")
        else:  # the backend's whole attend: quantized chunks, the window, the merge
            backend = kvc.get_backend("qvg", config=cfg, implementation="pallas_gpu")
            qvg_step = functools.partial(jax.jit(backend.attend), c, q, start)
        t = timing.best_seconds({"dense": functools.partial(jax.jit(dense.attend), full, q, start),
                                 "qvg": qvg_step}, size.reps)
        times.append({"context": context, "batch": b, "dense_ms": 1e3 * t["dense"],
                      "qvg_ms": 1e3 * t["qvg"], "overhead": t["qvg"] / t["dense"] - 1.0})
    return checks, times


def render(size_name: str, checks: list[dict], ffd: list[dict], qvg: list[dict],
           tolerance: float) -> str:
    """``DEVICE.md``'s text."""
    device = jax.devices()[0]
    out = ["# On-device check of the Pallas GPU kernels", "",
           f"Device: {device.device_kind} ({jax.default_backend()}), jax {jax.__version__}, "
           f"{datetime.date.today()}, size `{size_name}`. Command: `python -m "
           f"experiments.device_check --size={size_name}` (`make device-check`).", "",
           "## Kernels against their references", "",
           "| kernel | against | shape | max rel. error | pass |", "|---|---|---|---|---|"]
    out += [f"| {c['kernel']} | {c['vs']} | {c['shape']} | {c['rel_err']:.2e} | "
            f"{'yes' if c['rel_err'] <= tolerance else '**no**'} |" for c in checks]
    out += ["", f"Pass: max |kernel - reference| / max |reference| <= {tolerance:g}.", "",
            "## FFD decode attention (paper anchor: 11.6x over FlashDecoding at 256k)", "",
            "| context | batch | dense bf16 ms | decode_attention ms | FFD ms | vs dense | "
            "vs decode_attention |", "|---|---|---|---|---|---|---|"]
    out += [f"| {r['context']} | {r['batch']} | {r['dense_ms']:.3f} | {r['flash_ms']:.3f} | "
            f"{r['ffd_ms']:.3f} | {r['vs_dense']:.2f}x | {r['vs_flash']:.2f}x |" for r in ffd]
    out += ["", "## QVG decode attention against bf16 dense (paper: under 4% overhead)", "",
            "| context | batch | dense bf16 ms | QVG ms | overhead |", "|---|---|---|---|---|"]
    out += [f"| {r['context']} | {r['batch']} | {r['dense_ms']:.3f} | {r['qvg_ms']:.3f} | "
            f"{100 * r['overhead']:+.1f}% |" for r in qvg]
    return "\n".join(out) + "\n"


def run(size_name: str = "paper", out: str = "DEVICE.md", seed: int = 0) -> dict:
    """Runs every check at ``SIZES[size_name]`` and writes ``out`` atomically. Returns the rows.

    Raises:
      ValueError: unknown size, or no GPU for a size other than ``smoke`` (one line).
    """
    if size_name not in SIZES:
        raise ValueError(f"device_check: size {size_name!r} is not one of {sorted(SIZES)}")
    interpret = jax.default_backend() != "gpu"
    if interpret and size_name != "smoke":
        raise ValueError(f"device_check: size {size_name!r} needs a GPU; jax {jax.__version__} sees "
                         f"{jax.default_backend()} only (install jax[cuda12]=={jax.__version__})")
    size = SIZES[size_name]
    k1, k2 = jax.random.split(jax.random.key(seed))
    ffd_checks, ffd = check_ffd(k1, size, interpret)
    qvg_checks, qvg = check_qvg(k2, size, interpret)
    checks = ffd_checks + qvg_checks
    text = render(size_name, checks, ffd, qvg, size.tolerance)
    tmp = f"{out}.tmp-{os.getpid()}"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, out)
    return {"checks": checks, "ffd": ffd, "qvg": qvg,
            "passed": all(c["rel_err"] <= size.tolerance for c in checks)}


def main(argv: list[str]) -> int:
    import argparse

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size", default="paper", choices=sorted(SIZES))
    p.add_argument("--out", default="DEVICE.md")
    args = p.parse_args(argv)
    try:
        result = run(args.size, args.out)
    except ValueError as e:
        print(e, file=sys.stderr)
        return 2
    print(f"wrote {args.out}; kernels {'pass' if result['passed'] else 'FAIL'}")
    return 0 if result["passed"] else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
