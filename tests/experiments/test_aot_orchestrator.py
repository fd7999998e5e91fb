"""The pod compile orchestrator without libtpu: roofline arithmetic, topology names, the table.

The compiles themselves run in ``make aot`` (.venv-aot); here a tiny step is compiled for the CPU
in place of a pod so that the whole write path runs.
"""

from __future__ import annotations

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from core import aot, aot_steps
from experiments import aot as orchestrator


def test_roofline_compute_bound_hand_computed():
    # v5e: 197 TFLOP/s and 819 GB/s. 197e12 FLOPs -> 1 s; 409.5e9 bytes -> 0.5 s. The pod's useful
    # FLOPs are half of what 16 chips could do in 1 s -> MFU 0.5.
    r = aot_steps.roofline("tpu-v5e", flops_per_chip=197e12, bytes_per_chip=409.5e9,
                           model_flops=0.5 * 197e12 * 16, num_chips=16)
    assert r.compute_seconds == pytest.approx(1.0, rel=1e-12)
    assert r.memory_seconds == pytest.approx(0.5, rel=1e-12)
    assert r.step_seconds == pytest.approx(1.0, rel=1e-12)
    assert r.bound == "compute"
    assert r.mfu == pytest.approx(0.5, rel=1e-12)


def test_roofline_memory_bound_hand_computed():
    # H200: 4.8 TB/s; 9.6e12 bytes -> 2 s against 989e12 FLOPs -> 1 s. 8 chips, model FLOPs
    # 8 * 989e12 -> MFU = 8 * 989e12 / (2 * 989e12 * 8) = 0.5.
    r = aot_steps.roofline("h200", flops_per_chip=989e12, bytes_per_chip=9.6e12,
                           model_flops=8 * 989e12, num_chips=8)
    assert (r.step_seconds, r.bound) == (pytest.approx(2.0, rel=1e-12), "memory")
    assert r.mfu == pytest.approx(0.5, rel=1e-12)


@pytest.mark.parametrize("kwargs, match", [
    ({"chip": "tpu-v4"}, "unknown chip 'tpu-v4'"),
    ({"flops_per_chip": -1.0}, "flops_per_chip=-1.0"),
    ({"bytes_per_chip": float("nan")}, "bytes_per_chip=nan"),
    ({"num_chips": 0}, "num_chips=0"),
    ({"flops_per_chip": 0.0, "bytes_per_chip": 0.0}, "both 0"),
])
def test_roofline_rejects_bad_input(kwargs, match):
    args = {"chip": "tpu-v6e", "flops_per_chip": 1e12, "bytes_per_chip": 1e9,
            "model_flops": 1e12, "num_chips": 4, **kwargs}
    with pytest.raises(ValueError, match=match):
        aot_steps.roofline(args.pop("chip"), **args)


def test_chip_table_matches_published_peaks():
    c = aot_steps.CHIPS
    assert (c["tpu-v5e"].peak_flops, c["tpu-v5e"].hbm_bandwidth) == (197e12, 819e9)
    assert (c["tpu-v6e"].peak_flops, c["tpu-v6e"].hbm_bandwidth) == (918e12, 1640e9)
    assert (c["h100"].peak_flops, c["h100"].hbm_bandwidth) == (989e12, 3.35e12)
    assert (c["h200"].peak_flops, c["h200"].hbm_bandwidth) == (989e12, 4.8e12)
    assert [c[k].hbm_bytes / 2 ** 30 for k in ("tpu-v5e", "tpu-v6e", "h100", "h200")] == [
        16, 32, 80, 141]
    assert [c[k].usable_bytes / 2 ** 30 for k in ("tpu-v5e", "tpu-v6e", "h100", "h200")] == [
        15.75, 31.25, 60, 105.75]
    # every pod's chip is a core.aot target (same device description)
    assert {t.chip for t in aot_steps.POD_TOPOLOGIES.values()} <= set(aot.TARGETS)


@pytest.mark.parametrize("name", ["v5e:3x3", "tpu-v5e", "h100:1x1x8", "", "V5E:4x4"])
def test_unknown_topology_lists_valid_names(name):
    with pytest.raises(ValueError, match=r"unknown pod topology .*expected one of .*'v5e:4x4'"):
        aot_steps.pod_topology(name)
    with pytest.raises(ValueError, match="unknown pod topology"):
        aot_steps.pod_devices(name)


def test_topology_sizes():
    assert aot_steps.pod_topology("v5e:16x16").num_devices == 256
    assert aot_steps.pod_topology("h100:1x2x8").num_devices == 16
    assert aot_steps.pod_topology("h200:1x8x8").num_devices == 64


@pytest.mark.skipif(aot.extras_available("tpu-v5e"), reason="libtpu is installed here")
def test_missing_libtpu_is_one_line_naming_the_install():
    with pytest.raises(aot.CompileExtrasMissing) as e:
        aot_steps.pod_devices("v6e:4x4")
    msg = str(e.value)
    assert "\n" not in msg and "pip install" in msg and "jax[tpu]" in msg and "v6e:4x4" in msg


def test_compile_step_reports_cpu_bytes_and_flops():
    n = 64
    sh = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    x = jax.ShapeDtypeStruct((n, n), jnp.float32, sharding=sh)
    r = aot_steps.compile_step(lambda a, b: a @ b, (x, x))
    assert r.memory["argument"] == 2 * n * n * 4
    assert r.memory["output"] == n * n * 4
    assert r.flops == pytest.approx(2 * n ** 3, rel=1e-6)
    assert r.needed_bytes >= 3 * n * n * 4


def test_compile_step_rejects_leaves_without_sharding():
    with pytest.raises(ValueError, match="argument 0 has a leaf of shape \\(2,\\) without a sharding"):
        aot_steps.compile_step(lambda a: a, (jax.ShapeDtypeStruct((2,), jnp.float32),))
    with pytest.raises(ValueError, match="args must be a tuple"):
        aot_steps.compile_step(lambda a: a, [1])


def test_needed_bytes_counts_aliased_outputs_once():
    r = aot_steps.StepCompile({"argument": 100, "output": 60, "alias": 50, "temp": 7,
                               "generated_code": 3, "peak": 0}, None, None, 0.0)
    assert r.needed_bytes == 100 + 60 - 50 + 7 + 3


def test_one_line():
    e = RuntimeError("\n  first line\nsecond line")
    assert orchestrator.one_line(e) == "RuntimeError: first line"
    assert len(orchestrator.one_line(ValueError("x" * 1000), limit=50)) == 50


def test_parse_list():
    assert orchestrator.parse_list("v5e:4x4, h100:1x2x8", aot_steps.topology_names(),
                                   "topologies") == ["v5e:4x4", "h100:1x2x8"]
    with pytest.raises(ValueError, match=r"--topologies: \['v7:2x2'\] not in"):
        orchestrator.parse_list("v5e:4x4,v7:2x2", aot_steps.topology_names(), "topologies")


def test_run_writes_table_atomically_and_keeps_failures(tmp_path, monkeypatch):
    """A tiny step compiled for the CPU standing in for a v5e pod, and a step whose build fails:
    both end up in the table; the JSON store is merged on the next run."""
    mesh_devices = tuple(jax.devices()[:1])
    monkeypatch.setattr(aot_steps, "pod_devices", lambda name: mesh_devices)
    monkeypatch.setattr(aot_steps.aot, "require_extras", lambda name, what=None: None)
    n = 128

    def tiny(devices):
        sh = jax.sharding.NamedSharding(jax.sharding.Mesh(np.asarray(devices), ("data",)),
                                        jax.sharding.PartitionSpec())
        x = jax.ShapeDtypeStruct((n, n), jnp.float32, sharding=sh)
        return aot_steps.StepSpec(lambda a, b: a @ b, (x, x), (), 2.0 * n ** 3, n * n, "tiny")

    def broken(devices):
        raise ValueError("paper config: seq_len=7\nmore detail")

    monkeypatch.setattr(orchestrator, "STEPS", {"t/tiny": (tiny, ""), "t/broken": (broken, "")})
    out = str(tmp_path / "AOT.md")
    rows = orchestrator.run(out, ["t/tiny", "t/broken"], ["v5e:4x4"], log=lambda s: None)
    ok, bad = rows
    assert ok["status"] == "ok" and bad["status"] == "error"
    assert bad["reason"] == "ValueError: paper config: seq_len=7"
    # roofline on the hand-checkable CPU numbers: the matmul's 2 n^3 FLOPs, v5e peaks
    assert ok["flops"] == pytest.approx(2 * n ** 3, rel=1e-6)
    rf = ok["roofline"]
    expect = max(2 * n ** 3 / 197e12, ok["bytes_accessed"] / 819e9)
    assert rf["step_seconds"] == pytest.approx(expect, rel=1e-12)
    assert rf["mfu"] == pytest.approx(2 * n ** 3 / (expect * 197e12 * 16), rel=1e-12)
    text = open(out).read()
    assert "| t/tiny | fits 0.0/15.8 GiB |" in text
    assert "| t/broken | v5e:4x4 | ValueError: paper config: seq_len=7 |  |" in text
    assert sorted(os.listdir(tmp_path)) == ["AOT.md", "AOT.md.json"]  # no temp file left
    # a second run for another topology keeps the first run's rows
    rows2 = orchestrator.run(out, ["t/tiny"], ["v6e:4x4"], log=lambda s: None)
    assert {(r["step"], r["topology"]) for r in rows2} == {
        ("t/tiny", "v5e:4x4"), ("t/broken", "v5e:4x4"), ("t/tiny", "v6e:4x4")}
    assert len(json.load(open(out + ".json"))) == 3
    assert "- t/broken on v6e:4x4" in open(out).read()
    # a rerun leaves the failed row alone; with retry_failed it builds it again (and it now works)
    calls = []
    monkeypatch.setitem(orchestrator.STEPS, "t/broken", (lambda d: calls.append(1) or tiny(d), ""))
    orchestrator.run(out, ["t/broken"], ["v5e:4x4"], log=lambda s: None)
    assert calls == []
    rows3 = orchestrator.run(out, ["t/broken"], ["v5e:4x4"], retry_failed=True, log=lambda s: None)
    assert calls == [1]
    assert {r["status"] for r in rows3 if r["step"] == "t/broken"} == {"ok"}
    assert len(rows3) == 3
    # --only recompiles exactly the rows it names, even those already compiled, and keeps the rest
    built = []
    monkeypatch.setitem(orchestrator.STEPS, "t/tiny", (lambda d: built.append(1) or tiny(d), ""))
    before = {(r["step"], r["topology"]): r for r in json.load(open(out + ".json"))}
    rows4 = orchestrator.run(out, ["t/tiny", "t/broken"], ["v5e:4x4", "v6e:4x4"],
                             only=["t/tiny@v6e:*"], log=lambda s: None)
    assert built == [1] and len(rows4) == 3
    after = {(r["step"], r["topology"]): r for r in json.load(open(out + ".json"))}
    assert after[("t/tiny", "v5e:4x4")] == before[("t/tiny", "v5e:4x4")]
    assert after[("t/tiny", "v6e:4x4")]["seconds"] != before[("t/tiny", "v6e:4x4")]["seconds"]
    with pytest.raises(ValueError, match=r"--only: 'lm/\*' matches no row"):
        orchestrator.run(out, ["t/tiny"], ["v5e:4x4"], only=["lm/*"], log=lambda s: None)
    assert json.load(open(out + ".json")) == list(after.values()) or len(after) == 3


def test_steps_are_discovered_from_the_experiments_in_registry_order():
    """The table's steps are every registered experiment's ``paper_steps()``, each experiment's in
    its own order, the experiments in the registry's; no list of steps is kept anywhere else."""
    import importlib

    from experiments import registry

    exported = {}
    for name in registry.available():
        paper_steps = getattr(importlib.import_module(f"experiments.{name}"), "paper_steps", None)
        if paper_steps is not None:
            exported[name] = list(paper_steps())
            assert exported[name], f"experiments.{name}.paper_steps() exports no step"
    assert list(orchestrator.STEPS) == [s for steps in exported.values() for s in steps]
    assert {"lm", "diffusion_lm", "sparse_decode", "rl_scaling"} <= set(exported)
    assert orchestrator.STEPS["lm/decode-ffd"][1] == "lm decode step, FFD KV cache"
    assert orchestrator.STEPS["rl_scaling/grpo"][1] == "GRPO step, largest rollouts-per-step group"


def test_a_step_name_exported_twice_is_refused(monkeypatch):
    from experiments import registry

    monkeypatch.setattr(registry, "available", lambda: ("spf", "judge_btl", "spf"))
    with pytest.raises(ValueError, match="'spf/train' is exported by both experiments.spf and "
                                         "experiments.spf"):
        orchestrator.discover_steps()


def test_select_rows_matches_steps_and_rows():
    from experiments import aot as orchestrator

    steps, topos = ["lm/train", "lm/decode-ffd", "diffusion_lm/mdlm@largest"], ["v5e:4x4", "h100:1x2x8"]
    assert orchestrator.select_rows(steps, topos, ["lm/*"]) == [
        ("lm/train", "v5e:4x4"), ("lm/train", "h100:1x2x8"), ("lm/decode-ffd", "v5e:4x4"),
        ("lm/decode-ffd", "h100:1x2x8")]
    assert orchestrator.select_rows(steps, topos, ["*@h100:1x2x8", "lm/train@v5e:4x4"]) == [
        ("lm/train", "v5e:4x4"), ("lm/train", "h100:1x2x8"), ("lm/decode-ffd", "h100:1x2x8"),
        ("diffusion_lm/mdlm@largest", "h100:1x2x8")]
    assert orchestrator.select_rows(steps, topos, ["diffusion_lm/mdlm@largest"]) == [
        ("diffusion_lm/mdlm@largest", "v5e:4x4"), ("diffusion_lm/mdlm@largest", "h100:1x2x8")]


def test_registered_steps_build_from_paper_configs():
    """Every registered step builds its abstract arguments on the local devices (nothing
    allocated, no compile) and its model FLOPs are 3 x forward FLOPs x tokens."""
    from algorithms.lm import training as lm
    from core.data import ByteTokenizer
    from experiments.configs import lm as lm_config
    from models.transformer import forward_flops_per_token

    spec = orchestrator.STEPS["lm/train"][0](jax.devices()[:1])
    c = lm_config.get_config("paper")
    v = ByteTokenizer().vocab_size
    mcfg = lm.model_config(c, v)
    assert spec.model_flops == pytest.approx(
        3 * forward_flops_per_token(mcfg, c.seq_len) * c.batch_size * c.seq_len, rel=1e-12)
    # 6 N T lower bound: the analytic count adds attention on top of 2 N per token (N less the
    # embedding table, which a lookup does not multiply)
    assert spec.model_flops > 6 * (spec.params - v * c.model.d_model) * c.batch_size * c.seq_len
    for leaf in jax.tree.leaves(spec.args):
        assert isinstance(leaf, jax.ShapeDtypeStruct) and leaf.sharding is not None


# one step per builder (the diffusion families share one; lm/train has its own test above)
@pytest.mark.parametrize("name", [s for s in orchestrator.STEPS if s != "lm/train" and (
    not s.startswith("diffusion_lm/") or s == "diffusion_lm/esolm") and (
    not s.startswith("llama3_8b/") or s.endswith("b8") and "all-pages" not in s)])
def test_every_registered_step_builds(name):
    spec = orchestrator.STEPS[name][0](jax.devices()[:1])
    assert spec.model_flops is None or spec.model_flops > 0
    assert spec.params > 0 or name.startswith("benchmark_game/")  # a game has no parameters
    for leaf in jax.tree.leaves(spec.args):
        assert isinstance(leaf, jax.ShapeDtypeStruct) and leaf.sharding is not None
    # a donated argument is one the step returns anew (a train state, a cache): its leaves'
    # shapes and dtypes are among the outputs'
    with jax.enable_x64(spec.x64):
        out = jax.eval_shape(spec.fn, *spec.args)
    outs = [(x.shape, x.dtype) for x in jax.tree.leaves(out)]
    for i in spec.donate_argnums:
        for leaf in jax.tree.leaves(spec.args[i]):
            assert (leaf.shape, leaf.dtype) in outs, (name, i, leaf.shape, leaf.dtype)


def test_the_scanned_lm_step_declares_its_layer_loop():
    """The 1.1B lm step scans its layers (so its row gets no roofline, ``core.aot_table``); the
    paper step does not."""
    spec = orchestrator.STEPS["lm/train@1.1B"][0](jax.devices())
    assert spec.layer_loop and "scanned layers" in spec.shape
    assert not orchestrator.STEPS["lm/train"][0](jax.devices()).layer_loop


def test_llama3_8b_decode_has_the_published_shape_and_shards_its_cache():
    """8.03B parameters (Meta's count for Llama 3.1 8B); on 8 CPU-standing devices the mesh is
    (data 1, model 8) and every cache leaf puts its 8 kv heads on `model`."""
    spec = orchestrator.STEPS["llama3_8b/decode-ffd@128k-b8"][0](jax.devices()[:1])
    assert spec.params == 8_030_261_248
    assert "over 131072 slots" in spec.shape and "8 kv heads x D 128" in spec.shape
    # 2 N per token plus QK and PV over the 128k context in 32 layers x 32 heads x D 128
    assert spec.model_flops == pytest.approx(8 * (2 * spec.params + 4 * 32 * 32 * 128 * 131072))
    cache = spec.args[1]
    assert all(leaf.shape[:2] == (8, 8) for leaf in jax.tree.leaves(cache))


def test_judge_btl_fits_in_float64_except_on_tpu_where_the_fallback_is_stated():
    from experiments.judge_btl import aot_precision

    assert aot_precision("cpu") == (True, None)
    assert aot_precision("gpu") == (True, None)
    x64, (change, why) = aot_precision("tpu")
    assert not x64 and "float32" in change and "float64" in why and "\n" not in why
    spec = orchestrator.STEPS["judge_btl/fit"][0](jax.devices()[:1])  # CPU: the experiment's fit
    assert spec.x64 and spec.fallback is None and "float64 Newton" in spec.shape
    with jax.enable_x64(True):
        assert {leaf.dtype for leaf in jax.tree.leaves(spec.args)} == {np.dtype("int32"), np.dtype("float64")}


def test_missing_compile_extras_stop_the_run_before_anything_is_written(tmp_path, monkeypatch):
    monkeypatch.setattr(aot_steps.aot, "extras_available", lambda name: name.startswith("tpu"))
    out = tmp_path / "AOT.md"
    with pytest.raises(aot_steps.aot.CompileExtrasMissing) as e:
        orchestrator.run(str(out), ["lm/train"], ["v5e:4x4", "h100:1x2x8"], log=lambda s: None)
    msg = str(e.value)
    assert "\n" not in msg and "'h100:1x2x8'" in msg and "jax-cuda12-plugin" in msg
    assert list(tmp_path.iterdir()) == []
    # compile_row does not turn the missing extras into a row either
    with pytest.raises(aot_steps.aot.CompileExtrasMissing):
        orchestrator.compile_row("lm/train", "h100:1x2x8")
    with pytest.raises(ValueError, match="unknown pod topology 'v7:4x4'"):
        orchestrator.run(str(out), ["lm/train"], ["v7:4x4"], log=lambda s: None)
    assert list(tmp_path.iterdir()) == []


def test_ffd_all_pages_row_declares_every_page_kept():
    """The all-pages row is the upper end of FFD's range: its kernels' analytic bytes sit between
    the rule's row (kept fraction 0.0615) and 1.1x dense attention's (codes + scales + every page's
    residuals and values: 4.72 + 55.05 MB against dense's 67.1 MB per layer and sequence)."""
    import re

    def ratio(step):
        shape = orchestrator.STEPS[step][0](jax.devices()[:1]).shape
        return float(re.search(r"= ([0-9.]+)x dense bf16", shape).group(1)), shape

    rule, rule_shape = ratio("llama3_8b/decode-ffd@128k-b1")
    every, every_shape = ratio("llama3_8b/decode-ffd-all-pages@128k-b1")
    assert "kept fraction 0.0615" in rule_shape and "kept fraction 1.0" in every_shape
    assert rule < 0.2 and (4.72 + 55.05) / 67.1 <= every <= 1.1


def test_decode_steps_build_their_caches_through_get_backend(monkeypatch):
    """Every lm decode row's cache backend comes from ``models.kv_cache.get_backend`` with the
    experiments' paper options (FFD: sparse_decode's page size and delta; QVG: the quantizer
    kv_quant runs, ``kernels.kv_quant.reference.quantizer_configs`` of its paper config, at the
    lm model's head dim)."""
    from algorithms.lm import training
    from core.data import ByteTokenizer
    from experiments import sparse_decode
    from experiments.configs import kv_quant as kq_cfg
    from experiments.configs import lm as lm_cfg
    from experiments.configs import sparse_decode as sd_cfg
    from kernels.kv_quant.reference import quantizer_configs
    from models import kv_cache as kvc

    calls = []
    real = kvc.get_backend
    monkeypatch.setattr(kvc, "get_backend",
                        lambda name, **o: calls.append((name, o)) or real(name, **o))
    for backend in ("dense", "ffd", "qvg"):  # the rows' builders at a small cache
        sparse_decode.lm_decode_spec(backend, jax.devices()[:1], context=1024, batch=2)
    assert [c[0] for c in calls] == ["dense", "ffd", "qvg"]
    sd = sd_cfg.get_config("paper")
    assert (calls[1][1]["page_size"], calls[1][1]["delta"]) == (sd.page_size, sd.delta)
    d = training.model_config(lm_cfg.get_config("paper"), ByteTokenizer().vocab_size).dim_per_head
    assert calls[2][1]["config"] == quantizer_configs(kq_cfg.get_config("paper"), d)["qvg"]
