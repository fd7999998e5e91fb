"""core.aot_table: the AOT table's rows (roofline, fit cells), its text and the rows' store."""

from __future__ import annotations

import pytest

from core import aot_table


def _row(step, topo, need_gib, **extra):
    g = 2 ** 30
    mem = {"argument": int(need_gib * g), "output": 0, "alias": 0, "temp": 0, "generated_code": 0,
           "peak": 0}
    return {"step": step, "topology": topo, "status": "ok", "memory": mem,
            "needed_bytes": int(need_gib * g), "flops": None,
            "bytes_accessed": None, "seconds": 3.0, "shape": "B 2", **extra}


def test_fit_cells():
    # v5e: libtpu's 15.75 GiB available; H100: 0.75 * 80 = 60 GiB
    assert aot_table.fit_cell(_row("s", "v5e:4x4", 6.0)) == "fits 6.0/15.8 GiB"
    over = aot_table.fit_cell(_row("s", "v5e:4x4", 20.0))
    assert "over by 4.25 GiB" in over and "20.0/15.8" in over
    assert aot_table.fit_cell(_row("s", "h100:1x2x8", 60.0)) == "fits 60.0/60.0 GiB"
    assert aot_table.fit_cell(None) == "not run"
    assert aot_table.fit_cell({"status": "error", "reason": "x"}) == "error"
    # libtpu refuses a program that does not fit: the cell reads its numbers
    oom = {"status": "error", "reason": "JaxRuntimeError: RESOURCE_EXHAUSTED: Ran out of memory on "
           "HBM, the total memory required for HLO temporaries (16.85G) exceeds available HBM "
           "(15.75G)."}
    assert aot_table.fit_cell(oom) == "**over by 1.10 GiB** (temporaries 16.9/15.8 GiB)"
    assert aot_table.hbm_exhausted(oom["reason"]) == (16.85 * 2 ** 30, 15.75 * 2 ** 30)
    assert aot_table.hbm_exhausted("(3M) exceeds available HBM (1.5K)") == (3 * 2 ** 20, 1536)
    assert aot_table.hbm_exhausted("RESOURCE_EXHAUSTED: vmem") is None


def test_render_table_failures_and_missing():
    rows = [_row("a", "v5e:4x4", 1.0), _row("a", "h100:1x2x8", 100.0),
            {"step": "b", "topology": "v5e:4x4", "status": "error", "seconds": 1.0,
             "reason": "XlaRuntimeError: RESOURCE_EXHAUSTED | too big"}]
    text = aot_table.render(rows, ["a", "b"], ["v5e:4x4", "h100:1x2x8"], "notes")
    lines = text.splitlines()
    assert "| step | v5e:4x4 | h100:1x2x8 |" in lines
    assert "| a | fits 1.0/15.8 GiB | **over by 40.00 GiB** (100.0/60.0 GiB) |" in lines
    assert "| b | error | not run |" in lines
    assert "| b | v5e:4x4 | XlaRuntimeError: RESOURCE_EXHAUSTED / too big |  |" in lines
    assert "- b on h100:1x2x8" in lines
    # a failure's note is the first whose key is in its reason; steps not registered are listed
    text = aot_table.render(rows, ["a", "b"], ["v5e:4x4"], failure_notes={
        "no such": "never used", "RESOURCE_EXHAUSTED": "what was found"}, not_registered=["c/x"])
    lines = text.splitlines()
    assert "| b | v5e:4x4 | XlaRuntimeError: RESOURCE_EXHAUSTED / too big | what was found |" in lines
    assert "- not registered: c/x" in lines
    assert aot_table.failure_note("anything") == ""


def test_damaged_store_is_a_clear_error(tmp_path):
    p = tmp_path / "AOT.md.json"
    p.write_text("{not json")
    with pytest.raises(ValueError, match="AOT.md.json: not a JSON list"):
        aot_table.load_rows(str(p))


def test_roofline_row_without_model_flops_uses_xla_count_and_has_no_mfu():
    row = {"status": "ok", "chip": "tpu-v6e", "chips": 16, "model_flops": None,
           "flops": 918e12 * 0.25, "bytes_accessed": 1640e9 * 0.5}
    rf = aot_table.add_roofline(row)["roofline"]
    assert rf["step_seconds"] == pytest.approx(0.5, rel=1e-12) and rf["bound"] == "memory"
    assert rf["mfu"] is None and rf["flops_source"] == "xla"
    # with a model count above XLA's (a loop counted once) the model's share is used
    row = {**row, "model_flops": 16 * 918e12}
    rf = aot_table.add_roofline(row)["roofline"]
    assert rf["flops_source"] == "model" and rf["step_seconds"] == pytest.approx(1.0, rel=1e-12)
    assert rf["mfu"] == pytest.approx(1.0, rel=1e-12)


def test_a_step_whose_layers_loop_gets_no_roofline():
    """XLA counts a scanned block once: such a row keeps its memory and has no roofline."""
    row = {"status": "ok", "chip": "tpu-v5e", "chips": 16, "model_flops": 1e15, "flops": 1e12,
           "bytes_accessed": 1e9, "layer_loop": True}
    assert "roofline" not in aot_table.add_roofline(row)


def test_percent_keeps_two_significant_digits():
    assert [aot_table._percent(x) for x in (0.19, 0.084, 0.00031, 1.0)] == [
        "19%", "8.4%", "0.031%", "100%"]


def test_rows_compiled_with_fallback_options_are_marked_and_explained():
    row = {"step": "forecasting/train", "topology": "h100:1x2x8", "chip": "h100", "chips": 16,
           "status": "ok", "seconds": 20.0, "needed_bytes": 2 ** 30, "flops": None,
           "bytes_accessed": None, "shape": "PPM", "model_flops": None,
           "memory": {"argument": 1, "output": 1, "alias": 1, "temp": 2 ** 30, "generated_code": 0},
           "compile_options": {"xla_gpu_enable_triton_gemm": False}, "fallback": "why it fell back",
           "fallback_change": "`xla_gpu_enable_triton_gemm=False`"}
    assert aot_table.fit_cell(row) == "fits 1.0/60.0 GiB (fallback)"
    text = aot_table.render([row], ["forecasting/train"], ["h100:1x2x8"])
    section = text.split("## Compiled with a fallback")[1]
    assert ("| forecasting/train | h100:1x2x8 | `xla_gpu_enable_triton_gemm=False` | "
            "why it fell back |") in section
    plain = {k: v for k, v in row.items()
             if k not in ("compile_options", "fallback", "fallback_change")}
    assert "fallback" not in aot_table.render([plain], ["forecasting/train"], ["h100:1x2x8"])
