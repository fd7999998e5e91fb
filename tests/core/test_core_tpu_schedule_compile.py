"""core.tpu_schedule on fresh compiles for a compile-only v5e (marker ``aot``, .venv-aot).

libtpu reads its dump flags once, when it loads, so the compiles run in a child process with
``LIBTPU_INIT_ARGS`` set (one process, two kernels: about 10 s).
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
