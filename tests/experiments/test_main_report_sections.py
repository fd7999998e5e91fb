"""The main job keeps every experiment's section in the workdir: a subset rerun replaces only its
own sections in ``<workdir>/report.md``, each experiment's claim row is printed and its own report
written as soon as it finishes, and the main report is readable after every experiment."""

import types

import matplotlib.pyplot as plt
import pytest
from absl import flags
from absl.testing import flagsaver

from core import files, report
from experiments import common, registry
from experiments import main as main_lib


def _row(name, verdict):
    return {"method": f"method {name}", "claim": f"claim {name}", "ours": f"ours {name}",
            "reproduces": verdict}


def _fake_experiment(name, seen):
    """A stand-in for experiment ``name``: one figure, a claim row 'yes'; records what the main
    report held when it ran."""

    def run(config, workdir):
        main_path = files.join(workdir, "report.md")
        seen[name] = open(main_path).read() if files.exists(main_path) else None
        out = common.experiment_dir(workdir, name)
        fig, ax = plt.subplots()
        ax.plot([0, 1])
        return report.Section(f"{name}: new run", "new body",
                              figures=[report.save_figure(fig, files.join(out, "plot.png"))],
                              headline=_row(name, "yes"))

    return types.SimpleNamespace(run=run)


def _main(*args):
    """``python -m experiments.main <args> --noisolate`` in this process (flags restored after)."""
    with flagsaver.flagsaver():
        flags.FLAGS(["main", *args, "--noisolate"])
        return main_lib.main(["main"])


def test_subset_rerun_keeps_the_other_sections_and_reports_as_it_goes(tmp_path, monkeypatch, capsys):
    names = list(registry.EXPERIMENTS)
    assert len(names) >= 3
    rerun = [names[-1], names[0]]  # given out of registry order on purpose
    workdir = str(tmp_path / "wd")
    for i, name in enumerate(names):  # an earlier full tiny run
        common.save_experiment_report(workdir, name, report.Section(
            f"{name}: earlier run", "old body", headline=_row(name, "no" if i % 2 else "yes"),
            variant="tiny"))
    seen = {}
    real_load = registry.load
    monkeypatch.setattr(main_lib.registry, "load",
                        lambda n: (_fake_experiment(n, seen), real_load(n)[1]))
    assert _main(f"--experiments={','.join(rerun)}", "--variant=smoke", f"--workdir={workdir}") == 0
    text = open(f"{workdir}/report.md").read()
    # every section present, in registry order; the rerun ones replaced, the others kept
    titles = [line[3:] for line in text.splitlines() if line.startswith("## ")]
    assert titles == [f"{n}: {'new' if n in rerun else 'earlier'} run" for n in names]
    assert text.count("old body") == len(names) - 2 and text.count("new body") == 2
    kept = ", ".join(f"{n} (`tiny`)" for n in names if n not in rerun)
    assert f"Kept from earlier runs in this workdir: {kept}." in text
    # a mixed report: the smoke rows judge nothing, the kept tiny rows keep their verdicts
    rows = {r.split("|")[1].strip(): r.split("|")[4].strip() for r in text.splitlines()
            if r.startswith("| method ")}
    for i, n in enumerate(names):
        assert rows[f"method {n}"] == ("n/a (smoke)" if n in rerun else ("no" if i % 2 else "yes"))
    assert "meaningless" not in text.split("## ")[0]
    # each experiment's own report and section record, figure links relative to the report
    for n in rerun:
        own = open(f"{workdir}/{n}/report.md").read()
        assert f"## {n}: new run" in own and "](plot.png)" in own
        assert report.load_section(f"{workdir}/{n}/section.json").variant == "smoke"
    assert f"]({rerun[0]}/plot.png)" in text
    # the claim rows were printed, in the order run
    out = [line for line in capsys.readouterr().out.splitlines() if " | ours: " in line]
    assert out == [f"{n} (smoke): n/a (smoke) | method {n} | paper: claim {n} | ours: ours {n}"
                   for n in rerun]
    # the main report was rebuilt after the first experiment, before the second ran
    assert f"## {rerun[0]}: new run" in seen[rerun[1]]
    assert f"## {rerun[1]}: earlier run" in seen[rerun[1]]


def test_a_failed_experiment_replaces_its_section_and_is_printed(tmp_path, monkeypatch, capsys):
    name, workdir = registry.EXPERIMENTS[0], str(tmp_path / "wd")
    common.save_experiment_report(workdir, name, report.Section(
        f"{name}: earlier run", "old body", headline=_row(name, "yes"), variant="tiny"))

    def boom(config, workdir):
        raise RuntimeError("broken on purpose")

    real_load = registry.load
    monkeypatch.setattr(main_lib.registry, "load",
                        lambda n: (types.SimpleNamespace(run=boom), real_load(n)[1]))
    assert _main(f"--experiments={name}", "--variant=tiny", f"--workdir={workdir}") == 1
    text = open(f"{workdir}/report.md").read()
    assert "earlier run" not in text and f"## {name}: FAILED" in text
    assert f"{name} (tiny): failed | {name} | ours: RuntimeError: broken on purpose" in \
        capsys.readouterr().out


@pytest.mark.parametrize("move", [False, True])
def test_a_section_record_finds_its_figures_after_the_workdir_moved(tmp_path, move):
    out = tmp_path / "wd" / "x"
    fig, ax = plt.subplots()
    ax.plot([0, 1])
    png = report.save_figure(fig, str(out / "a.png"))
    report.save_section(str(out / "section.json"), report.Section("x", figures=[png], variant="tiny"))
    where = tmp_path / "wd"
    if move:
        where = tmp_path / "elsewhere"
        (tmp_path / "wd").rename(where)
    loaded = report.load_section(str(where / "x" / "section.json"))
    assert loaded.figures == [str(where / "x" / "a.png")] and loaded.variant == "tiny"
    (where / "x" / "bad.json").write_text('{"titel": 1}')
    with pytest.raises(ValueError, match="bad.json: not a report section record"):
        report.load_section(str(where / "x" / "bad.json"))


@pytest.fixture
def lm_folder_held(tmp_path):
    """A process (as a direct ``python -m experiments.lm --workdir=<wd>`` run would) holding the
    lock of ``<wd>/lm``; yields ``(workdir, its pid)``."""
    import subprocess
    import sys

    workdir = tmp_path / "wd"
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time\n"
         "from core.checkpoint import run_dir_lock\n"
         f"with run_dir_lock({str(workdir / 'lm')!r}):\n"
         "    print('held', flush=True)\n"
         "    time.sleep(600)\n"], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "held\n"
        yield str(workdir), holder.pid
    finally:
        holder.kill()
        holder.wait()


@pytest.mark.parametrize("name, race", [("lm", False), ("kv_quant", False), ("lm", True)])
def test_a_folder_held_by_a_direct_run_stops_main_with_one_line_and_keeps_the_report(
        lm_folder_held, monkeypatch, capsys, name, race):
    workdir, pid = lm_folder_held
    common.save_experiment_report(workdir, name, report.Section(
        f"{name}: earlier run", "old body", headline=_row(name, "yes"), variant="tiny"))
    main_lib.rebuild_main_report(workdir, "tiny", [name], 1.0)
    before = {p: open(p).read() for p in (f"{workdir}/report.md", f"{workdir}/{name}/report.md")}

    def never(config, workdir):
        raise AssertionError("the experiment ran")

    real_load = registry.load
    monkeypatch.setattr(main_lib.registry, "load",
                        lambda n: (types.SimpleNamespace(run=never), real_load(n)[1]))
    if race:  # the folder is taken after the check: the experiment's own lock finds it
        monkeypatch.setattr(main_lib, "check_folders_free", lambda workdir, names: None)
    capsys.readouterr()
    with pytest.raises(SystemExit) as info:
        _main(f"--experiments={name}", "--variant=tiny", f"--workdir={workdir}")
    err = capsys.readouterr().err
    assert info.value.code == 2
    lines = err.splitlines()
    # the race is found once the experiment has started: after its progress line
    assert lines[:-1] == ([f"[1/1] {name} (tiny) ..."] if race else []), err
    assert lines[-1].startswith("error: main: ") and f"is in use by pid {pid} " in lines[-1], err
    if name == "kv_quant":
        assert lines[-1].startswith("error: main: lm (needed by kv_quant): "), err
    assert {p: open(p).read() for p in before} == before  # the reports are untouched
