"""core.tpu_schedule: reading libtpu's final VLIW schedules.

The fixtures under ``data/tpu_schedule/`` are real libtpu 0.0.42.1 dumps (the final passes only,
``core.tpu_schedule.dump_flags``) of two small Pallas kernels compiled for a compile-only v5e:
``tiny_loop`` (a 16-trip ``fori_loop`` over 8 x 128 rows, ``sin(v) * v`` each), with the XLA fusion
around it and the compiled HLO (its Mosaic body removed), and ``nested/tiny_grid`` (grid 3, two
nested ``fori_loop``s of 5 and 16 trips), and ``while/``: a ``fori_loop`` of 7 trips that XLA keeps
as a ``while`` loop, its body calling ``tiny_loop`` (16 trips of ``sin(v) * v``) on
``c + x`` and then two fusions (``c / 2 + tile(2 y)``). The compile test (``test_core_tpu_schedule_compile.py``)
checks the reader on fresh compiles.
"""

import pathlib
import re
import shutil

import pytest

from core import tpu_schedule as ts

DATA = pathlib.Path(__file__).parent / "data" / "tpu_schedule"


def _bundle_lines(path):
    return [ln for ln in path.read_text().splitlines()
            if re.match(r"^\s*(0x[0-9a-f]+|\d+)\s+(LB:|PF:|PB:|LH:|LE:|CT:)?\s*:?\s*>*\s*\{", ln)]


def test_reads_the_kernel_and_its_loop_from_a_stored_dump():
    kernels = ts.read_dump(DATA)
    assert list(kernels) == ["tiny_loop.1"]  # the XLA fusion beside it is not a kernel
    k = kernels["tiny_loop.1"]
    bundle_file = next(DATA.glob("*tiny_loop.1-*-final_bundles.txt"))
    assert k.bundles == len(_bundle_lines(bundle_file)) == 84
    (loop,) = k.loops
    # the loop runs from its LB: bundle 0x6 through 0x52 (the branch at 0x4e and its four delay
    # slots), 16 trips as the fori_loop says
    assert (loop.start, loop.depth, loop.bundles, loop.trips) == (6, 1, 0x52 - 0x6 + 1, 16)
    assert k.inner_loop == loop and loop.bound_unit == "VALU"  # sin's range reduction
    assert k.cycles == (k.bundles - loop.bundles) + 16 * loop.bundles
    assert all(0.0 <= u <= 1.0 for u in loop.utilization.values())
    assert set(ts.read_dump(DATA, kernels_only=False)) == {"tiny_loop.1", "multiply_add_fusion"}


def test_nested_loops_multiply_their_trip_counts():
    (k,) = ts.read_dump(DATA / "nested").values()
    grid, mid, inner = k.loops
    assert [lp.depth for lp in k.loops] == [1, 2, 3]
    # grid of 3 runs 3 + 2 pipeline steps (prologue and epilogue); the fori_loops 5 and 16
    assert [lp.trips for lp in k.loops] == [5, 5, 16]
    assert grid.start < mid.start < inner.start
    assert inner.start + inner.bundles <= mid.start + mid.bundles <= grid.start + grid.bundles
    assert k.inner_loop == inner
    # the kernel body: the branch at 0x21 skips 0x26 .. 0x3f (after its four delay slots 0x22 ..
    # 0x25, which issue on every trip: 0x22's ops are predicated on the branch not being taken;
    # up to region 24 at 0x40) unless 1 <= i < 4 (pnand of scmp.ge i, 1 and scmp.lt i, 4): 3 of
    # the grid loop's 5 trips, the grid's 3 steps; the pipeline's copies around it run on all 5
    assert "(!%p108_p1)" in _bundle_lines(next((DATA / "nested").glob("*final_bundles.txt")))[0x22]
    assert grid.guards == ((0x26, 0x40, 3),) and mid.guards == inner.guards == ()
    body = 0x40 - 0x26
    assert mid.start >= 0x26 and mid.start + mid.bundles <= 0x40
    expected = ((k.bundles - grid.bundles) + 5 * (grid.bundles - body)
                + 3 * (body - mid.bundles) + 15 * (mid.bundles - inner.bundles)
                + 15 * 16 * inner.bundles)
    assert k.cycles == expected == 2931


def _spilled_index(text: str, other_store: bool = False) -> str:
    """The nested dump with the guard's comparisons reading the iteration index back from a
    spill slot (as libtpu does under register pressure); with ``other_store`` the slot also
    holds another register's value."""
    spill = "%777 = sst [smem:[#allocation9_spill]] %s480_s9  ;;  "
    if other_store:
        spill += "%778 = sst [smem:[#allocation9_spill]] %s88_s30  ;;  "
    out = text.replace("{ %p574_p12 = pnand",
                       "{ " + spill + "%s999_s1 = sld [smem:[#allocation9_spill]]  ;;  "
                       "%s998_s2 = smov %s999_s1  ;;  %p574_p12 = pnand")
    out = out.replace("scmp.ge.s32.totalorder %s480_s9, 1 ", "scmp.ge.s32.totalorder %s999_s1, 1 ")
    return out.replace("scmp.lt.s32.totalorder %s480_s9, 4", "scmp.lt.s32.totalorder %s998_s2, 4")


def test_the_guard_is_read_through_spills_and_copies():
    """libtpu may spill the grid loop's index and compare a reload (or a copy of it): the body
    still runs on 3 of the 5 trips; a slot that also holds another value is not the index."""
    (src,) = (DATA / "nested").glob("*final_bundles.txt")
    (util,) = (DATA / "nested").glob("*utilization.txt")
    text = src.read_text()
    spilled = _spilled_index(text)
    assert spilled.count("%s999_s1") == 3 and "%s998_s2, 4" in spilled
    k = ts.kernel_schedule("tiny_grid.1", spilled, util.read_text())
    assert k.loops[0].guards == ((0x26, 0x40, 3),) and k.cycles == 2931
    k = ts.kernel_schedule("tiny_grid.1", _spilled_index(text, other_store=True), util.read_text())
    assert k.loops[0].guards == () and k.cycles == 4729


def test_a_guard_on_another_register_or_range_counts_every_trip():
    """The body's branch is counted at its guard's range only for a predicate ``pnand(i >= a,
    i < b)`` of the loop's own iteration index: the same dump with the lower bound read from
    another register, or with a ``por`` in place of the ``pnand``, counts the body on all 5
    trips; a range [0, 9) wider than the loop counts it on all 5."""
    (src,) = (DATA / "nested").glob("*final_bundles.txt")
    (util,) = (DATA / "nested").glob("*utilization.txt")
    text = src.read_text()
    cases = {"other register": text.replace("scmp.ge.s32.totalorder %s480_s9, 1",
                                            "scmp.ge.s32.totalorder %s481_s9, 1"),
             "por": text.replace("%p108_p1 = pnand", "%p108_p1 = por"),
             "wide range": text.replace("scmp.ge.s32.totalorder %s480_s9, 1 ",
                                        "scmp.ge.s32.totalorder %s480_s9, 0 ").replace(
                                 "scmp.lt.s32.totalorder %s480_s9, 4", "scmp.lt.s32.totalorder %s480_s9, 9")}
    for what, changed in cases.items():
        assert changed != text, what
        k = ts.kernel_schedule("tiny_grid.1", changed, util.read_text())
        grid, mid, inner = k.loops
        assert grid.guards in ((), ((0x26, 0x40, 5),)), what
        assert k.cycles == 4729, what  # every grid trip: (80 - 71) + 5 * 71 + ... as before


def test_static_step_adds_the_kernels_to_xla_estimated_cycles():
    hlo = (DATA / "compiled_hlo.txt").read_text()
    assert ts.kernel_calls(hlo) == {"tiny_loop.1": ["tiny_loop.1"]}
    assert ts.xla_estimated_cycles(hlo) == 1832  # the multiply_add fusion after the kernel
    st = ts.static_step(ts.read_dump(DATA), hlo, "tpu-v5e")
    assert st.kernel_cycles == 1239 and st.xla_cycles == 1832
    assert st.clock_hz == pytest.approx(1.503e9, rel=1e-3)
    assert st.seconds == pytest.approx((1239 + 1832) / st.clock_hz, rel=1e-12)
    (row,) = st.kernels
    assert row["calls"] == 1 and row["inner_loop_trips"] == 16 and row["bound_unit"] == "VALU"


def test_clocks_follow_from_the_published_peaks():
    # peak bf16 = 2 x MXU MACs per cycle x clock: v5e 4 x 128^2, v6e 4 x 256^2
    assert ts.CLOCK_HZ["tpu-v5e"] * 2 * 4 * 128 ** 2 == pytest.approx(197e12)
    assert ts.CLOCK_HZ["tpu-v6e"] * 2 * 4 * 256 ** 2 == pytest.approx(918e12)


def test_a_dynamic_loop_needs_an_assumed_trip_count(tmp_path):
    # the same kernel with its exit test's bound replaced by a register: no static trip count
    for f in DATA.glob("*tiny_loop*"):
        text = f.read_text()
        if f.name.endswith("final_bundles.txt"):
            text, n = re.subn(r"(%s\w+), 16 /\* loop exit test \*/", r"\1, %s99_s30 /* loop exit test */", text)
            assert n == 1
        (tmp_path / f.name).write_text(text)
    (k,) = ts.read_dump(tmp_path).values()
    assert k.loops[0].trips is None and k.dynamic and k.cycles is None
    assert k.cycles_at(3) == (k.bundles - k.loops[0].bundles) + 3 * k.loops[0].bundles
    hlo = (DATA / "compiled_hlo.txt").read_text()
    with pytest.raises(ValueError, match="without a static trip count; pass dynamic_trips=.'tiny_loop'"):
        ts.static_step(ts.read_dump(tmp_path), hlo, "tpu-v5e")
    st = ts.static_step(ts.read_dump(tmp_path), hlo, "tpu-v5e", {"tiny_loop": 3})
    assert st.kernel_cycles == k.cycles_at(3) and st.kernels[0]["assumed_trips"] == 3
    with pytest.raises(ValueError, match="dynamic_trips=-1"):
        k.cycles_at(-1)


def test_bad_dumps_are_clear_errors(tmp_path):
    with pytest.raises(ValueError, match="is not a folder"):
        ts.read_dump(tmp_path / "missing")
    bundles = next(DATA.glob("*tiny_loop.1-*-final_bundles.txt"))
    shutil.copy(bundles, tmp_path / bundles.name)
    with pytest.raises(ValueError, match="'tiny_loop.1' has only its \\['final_bundles'\\] file"):
        ts.read_dump(tmp_path)
    util = next(DATA.glob("*tiny_loop.1-*-utilization.txt"))
    (tmp_path / util.name).write_text(util.read_text() + "0 0 0 0 0 0 0 0 0 0\n")
    with pytest.raises(ValueError, match="84 bundles but 85 utilization rows"):
        ts.read_dump(tmp_path)
    with pytest.raises(ValueError, match="no VLIW bundle lines"):
        ts.parse_bundles("nothing here", "x")
    with pytest.raises(ValueError, match="CAPACTIY.*UTILIZATION"):
        ts.parse_utilization("== UTILIZATION:\n0 1\n", "x")
    hlo = (DATA / "compiled_hlo.txt").read_text()
    with pytest.raises(ValueError, match="target 'h100' has no clock"):
        ts.static_step({}, hlo, "h100")
    with pytest.raises(ValueError, match="kernel 'tiny_loop.1' \\(1 calls\\) has no schedule"):
        ts.static_step({}, hlo, "tpu-v5e")
    with pytest.raises(ValueError, match="no instruction carries estimated_cycles"):
        ts.xla_estimated_cycles("HloModule m\n")


def test_dump_flags_name_the_folder(monkeypatch):
    flags = ts.dump_flags("/some/dir")
    monkeypatch.setenv("LIBTPU_INIT_ARGS", "--other=1 " + flags)
    assert ts.dump_enabled() == "/some/dir"
    monkeypatch.setenv("LIBTPU_INIT_ARGS", "--other=1")
    assert ts.dump_enabled() is None


def test_a_while_loop_counts_its_body_once_per_trip():
    hlo = (DATA / "while" / "compiled_hlo.txt").read_text()
    # the fori_loop(0, 7, ...): condition `i < 7`, body `i + 1`, i starting at 0
    assert ts.while_trip_count(hlo, "while") == 7
    runs = ts.instruction_executions(hlo)
    assert runs["tiny_loop.3"] == 7 and runs["lt.0"] == 8 and runs["while"] == 1
    # the body's three estimated instructions, each 7 times; the entry's carry none
    body = {"add.11": 2094, "broadcast_multiply_fusion.2": 1824, "bitcast_add_fusion.2": 1966}
    for name, cycles in body.items():
        assert f'%{name} = ' in hlo and f'"estimated_cycles":"{cycles}"' in hlo
    assert ts.xla_estimated_cycles(hlo) == 7 * sum(body.values())
    kernels = ts.read_dump(DATA / "while")
    st = ts.static_step(kernels, hlo, "tpu-v5e")
    (row,) = st.kernels
    assert row["calls"] == 7 and st.kernel_cycles == 7 * kernels["tiny_loop.3"].cycles
    # the trip count moves the step: the same loop to 12
    hlo12 = hlo.replace("s32[]{:T(128)} constant(7)", "s32[]{:T(128)} constant(12)")
    assert hlo12 != hlo and ts.while_trip_count(hlo12, "while") == 12
    assert ts.static_step(kernels, hlo12, "tpu-v5e").kernel_cycles == 12 * kernels["tiny_loop.3"].cycles
    # XLA's own count wins where it gives one; a bound in a register has none
    known = hlo.replace("body=%wide.region_0.2.sunk,", 'body=%wide.region_0.2.sunk, '
                        'backend_config={"known_trip_count":{"n":"5"}},')
    assert ts.while_trip_count(known, "while") == 5
    dynamic = hlo.replace("compare(%get-tuple-element.15, %constant.11)",
                          "compare(%get-tuple-element.15, %get-tuple-element.15)")
    with pytest.raises(ValueError, match="'while': no static trip count"):
        ts.xla_estimated_cycles(dynamic)
    with pytest.raises(ValueError, match="no while instruction 'w'"):
        ts.while_trip_count(hlo, "w")
