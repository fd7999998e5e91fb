"""core.tpu_schedule on fresh compiles for a compile-only v5e (marker ``aot``, .venv-aot).

libtpu reads its dump flags once, when it loads, so the compiles run in a child process with
``LIBTPU_INIT_ARGS`` set (one process, three kernels: about 10 s).
"""

import json
import os
import subprocess
import sys
import textwrap

import pytest

from core import aot

_CHILD = textwrap.dedent("""
    import json, os, sys
    dump = sys.argv[1]
    from core import tpu_schedule as ts
    os.environ["LIBTPU_INIT_ARGS"] = ts.dump_flags(dump)
    import jax, jax.numpy as jnp
    from jax.experimental import pallas as pl
    from core import aot

    def make(work):  # a 16-trip loop over 8 x 128 rows; `work` multiply-adds per row
        def kernel(x_ref, o_ref):
            def body(i, acc):
                v = x_ref[pl.ds(i * 8, 8), :]
                for _ in range(work):
                    v = v * v + 0.5
                return acc + v
            o_ref[...] = jax.lax.fori_loop(0, 16, body, jnp.zeros((8, 128), jnp.float32))
        return lambda x: pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((8, 128), jnp.float32),
                                        name=f"loop_work{work}")(x)

    out = {}
    for work in (2, 8):
        before = set(os.listdir(dump))
        r = aot.compile_for(make(work), (jax.ShapeDtypeStruct((128, 128), jnp.float32),), "tpu-v5e")
        kernels = ts.read_dump(dump, files=sorted(set(os.listdir(dump)) - before))
        (k,) = kernels.values()
        st = ts.static_step(kernels, r.compiled.as_text(), "tpu-v5e")
        out[work] = {"inner": k.inner_loop.bundles, "trips": k.inner_loop.trips,
                     "cycles": k.cycles, "kernel_cycles": st.kernel_cycles, "name": k.name}
    # a grid of 3 steps, each a 16-trip loop: the pipelined grid loop's body region and its runs
    def gridded(x_ref, o_ref):
        def body(i, acc):
            return acc + x_ref[pl.ds(i * 8, 8), :] * 2.0
        o_ref[...] = jax.lax.fori_loop(0, 16, body, jnp.zeros((8, 128), jnp.float32))
    fn = lambda x: pl.pallas_call(  # noqa: E731
        gridded, grid=(3,), in_specs=[pl.BlockSpec((128, 128), lambda g: (g, 0))],
        out_specs=pl.BlockSpec((8, 128), lambda g: (g, 0)),
        out_shape=jax.ShapeDtypeStruct((24, 128), jnp.float32), name="grid3")(x)
    before = set(os.listdir(dump))
    aot.compile_for(fn, (jax.ShapeDtypeStruct((384, 128), jnp.float32),), "tpu-v5e")
    (k,) = ts.read_dump(dump, files=sorted(set(os.listdir(dump)) - before)).values()
    grid = min(k.loops, key=lambda lp: lp.depth)
    inner = k.inner_loop
    out["grid"] = {"trips": grid.trips, "guards": [list(g) for g in grid.guards],
                   "inner": [inner.start, inner.start + inner.bundles, inner.trips]}
    print(json.dumps(out))
""")


@pytest.mark.aot
def test_inner_loop_bundles_grow_with_the_work_in_the_loop(tmp_path):
    if not aot.extras_available("tpu-v5e"):
        pytest.skip("jax[tpu] is not installed here (make aot-env installs it)")
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": root}
    env.pop("LIBTPU_INIT_ARGS", None)
    proc = subprocess.run([sys.executable, "-c", _CHILD, str(tmp_path)], env=env, cwd=root,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = json.loads(proc.stdout.strip().splitlines()[-1])
    small, big = res["2"], res["8"]
    assert small["name"].startswith("loop_work2") and big["name"].startswith("loop_work8")
    assert small["trips"] == big["trips"] == 16
    # six more dependent multiply-adds per iteration: each is a VALU op on the critical path
    assert big["inner"] >= small["inner"] + 6
    assert big["cycles"] - small["cycles"] >= 16 * 6
    assert small["kernel_cycles"] == small["cycles"] and big["kernel_cycles"] == big["cycles"]
    # the grid of 3 runs as 3 + 2 pipelined trips; the kernel body, with the 16-trip loop in it,
    # runs on 3 of them
    grid = res["grid"]
    assert grid["trips"] == 5
    (start, end, runs), = grid["guards"]
    assert runs == 3 and start <= grid["inner"][0] < grid["inner"][1] <= end
    assert grid["inner"][2] == 16
