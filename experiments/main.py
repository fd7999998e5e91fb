"""The main job: runs registered experiments and writes ``<workdir>/report.md``.

    python -m experiments.main --variant=tiny --workdir=workdir            # the main job
    python -m experiments.main --experiments=lm,judge_btl --workdir=DIR   # a subset

As each experiment finishes, its claim row (paper's claim, ours, verdict) is printed, its section
is kept in ``<workdir>/<name>/section.json`` with its own ``<workdir>/<name>/report.md``, and
``<workdir>/report.md`` is rebuilt from every section present in the workdir, in registry order:
a subset rerun replaces those experiments' sections and keeps the others (the report names the
ones kept from earlier runs and their variants).

A failing experiment is reported as failed in the report's opening table and does not stop the
others; the exit code is 1 if any failed. With several experiments, each runs in its own process
(``--isolate``, the default): one experiment's global JAX state cannot leak into the next, and one
that hangs is stopped and reported as failed. A hang is recognised by a lack of progress, not by
total time: no output line and no file written under ``<workdir>/<experiment>`` or the folder of an
experiment it requires (``kv_quant`` trains ``lm`` there when its checkpoint is missing) for
``--stall_minutes`` (``--timeout_minutes`` adds an optional cap on the total); in an object-store
workdir (``gs://``) only output lines count. Bad flags (unknown name, bad value, unknown experiment
or variant, a workdir that is a file, cannot be created or written, or is used by another main
job) and an experiment folder held by another process (a direct ``python -m experiments.<name>``
run, also of a required experiment) print one line naming it to stderr and exit with status 2
before any experiment runs; such a folder taken while the job runs stops the job with one line,
leaving that experiment's report as it was. Ctrl-C stops the running experiment (its checkpoint being saved is committed
first) and leaves with one line and status 130. A ``--variant=smoke`` report says at the top that
its numbers are meaningless and judges no claim.
"""

from __future__ import annotations

import importlib
import os
import sys
import traceback
from collections.abc import Callable

from absl import app, flags, logging

from core import cli, process_watch, report, terminal, timing
from core import config as cfg_lib
from core import files as paths
from core import workdir as workdir_lib
from experiments import common, registry

_EXPERIMENTS = flags.DEFINE_string(
    "experiments", "all", f"comma-separated subset of: {', '.join(registry.EXPERIMENTS)}; 'all' = "
    f"the main job, every one but {', '.join(n for n in registry.EXPERIMENTS if not registry.in_main_job(n))}")
_VARIANT = flags.DEFINE_string(
    "variant", "tiny", "config variant for every experiment, optionally with field overrides "
    "common to them (`tiny,seed=1`)")
_WORKDIR = flags.DEFINE_string("workdir", "workdir", "output directory")
_MULTIHOST = flags.DEFINE_bool("multihost", False, "call jax.distributed.initialize() first")
_ISOLATE = flags.DEFINE_bool("isolate", True, "run each experiment in its own process")
_STALL = flags.DEFINE_float(
    "stall_minutes", 10.0, "when isolated, stop an experiment as hung after this many minutes "
    "without an output line or a file written in its folder (progress lines come every 30 s)")
_TIMEOUT = flags.DEFINE_float(
    "timeout_minutes", None, "when isolated, an optional cap on each experiment's total time "
    "(default: none; a hang is caught by --stall_minutes)")
_SECTION_OUT = flags.DEFINE_string("section_out", "", "internal: write the section as JSON here")
flags.register_validator("stall_minutes", lambda v: v > 0,
                         message="expected a positive number of minutes")
flags.register_validator("timeout_minutes", lambda v: v is None or v > 0,
                         message="expected a positive number of minutes")


def _failed_section(name: str, message: str, details: str) -> report.Section:
    return report.Section(title=f"{name}: FAILED", body=f"```\n{details[-4000:]}\n```",
                          headline={"method": name, "claim": "", "ours": message[:200],
                                    "reproduces": "failed"})


# Exit status of an isolated child whose experiment folder is held by another process.
IN_USE_EXIT = 75


def with_requirements(names) -> list[str]:
    """``names`` followed by every experiment they require (``REQUIRES`` of their config
    modules, transitively), each once."""
    out = list(names)
    for name in out:  # grows while walked
        out += [r for r in getattr(_config_module(name), "REQUIRES", ()) if r not in out]
    return out


def check_folders_free(workdir: str, names) -> None:
    """Checks, before any experiment runs, that no other process holds the folder of one of
    ``names`` or of an experiment they require (``core.checkpoint.run_dir_lock``: e.g. a direct
    ``python -m experiments.lm`` run on the same workdir). A local folder is locked and released
    at once; one that does not exist yet is free. Folders in an object store are not probed (the
    lock there takes a write and seconds to settle): a conflict is found when the experiment
    takes its folder.

    Raises:
      core.checkpoint.RunDirectoryInUseError: one line naming the folder and its holder.
    """
    from core.checkpoint import RunDirectoryInUseError

    for name in with_requirements(names):
        folder = paths.join(workdir, name)
        if not paths.is_local(folder) or not os.path.isdir(paths.display(folder)):
            continue
        try:
            with workdir_lib.lock_workdir(folder):
                pass
        except RunDirectoryInUseError as e:
            needed = "" if name in names else \
                f" (needed by {', '.join(n for n in names if name in with_requirements([n]))})"
            raise RunDirectoryInUseError(f"{name}{needed}: {e}") from None


def _run_in_process(name: str, variant: str, workdir: str) -> report.Section:
    module, config_module = registry.load(name)
    config = config_module.get_config(variant)
    with workdir_lib.lock_workdir(paths.join(workdir, name)):
        section = module.run(config, workdir)
    section.variant = variant
    return section


def _run_isolated(name: str, variant: str, workdir: str, stall_s: float,
                  timeout_s: float | None = None) -> report.Section:
    """Runs one experiment in a child process (see :func:`core.process_watch.watch`: its output
    and the files in its own folder and those of the experiments it requires are its progress);
    its section comes back as JSON.

    Raises:
      core.checkpoint.RunDirectoryInUseError: another process took one of its folders (the
        child named it on stderr).
    """
    out = paths.join(workdir, name, common.SECTION_FILE)
    paths.makedirs(paths.join(workdir, name))
    paths.remove(out)  # an earlier run's section must not pass for this one's
    cmd = [sys.executable, "-m", "experiments.main", f"--experiments={name}",
           f"--variant={variant}", f"--workdir={workdir}", "--noisolate", f"--section_out={out}"]
    folders = [paths.join(workdir, n) for n in with_requirements([name])]
    outcome, code, silent_s = process_watch.watch(cmd, folders, stall_s, timeout_s)
    if outcome == "exited" and code == IN_USE_EXIT:
        from core.checkpoint import RunDirectoryInUseError

        raise RunDirectoryInUseError(f"{name} stopped: a folder it uses is held by another "
                                     "process (named above); its report is left as it was")
    if outcome == "timed out":
        return _failed_section(name, f"timed out after {timeout_s / 60:g} min",
                               f"{name} did not finish within {timeout_s:.0f} s "
                               "(--timeout_minutes)")
    if outcome == "stalled":
        return _failed_section(
            name, f"no progress for {stall_s / 60:g} min",
            f"{name} printed nothing and wrote nothing under {' or '.join(folders)} for "
            f"{silent_s:.0f} s (--stall_minutes); stopped as hung")
    if code != 0 or not paths.exists(out):
        return _failed_section(name, f"exit code {code}",
                               f"{name} exited with code {code}; its error is in the job's "
                               "standard error")
    return report.load_section(out)


def run_all(names, variant: str, workdir: str, isolate: bool = False,
            stall_s: float = 600.0, timeout_s: float | None = None,
            on_done: Callable[[str, report.Section], None] | None = None
            ) -> tuple[list[report.Section], list[str]]:
    """Runs each experiment; returns (sections, names of failed experiments).

    Raises:
      core.checkpoint.RunDirectoryInUseError: another process holds a folder an experiment needs
        (that experiment is neither reported nor saved; the ones before it are).

    Args:
      names: experiment names, in order.
      variant: the config argument for every experiment (``"tiny"``, ``"smoke,seed=1"``, ...).
      workdir: the output directory (checked beforehand with ``core.workdir.check_workdir``).
      isolate: run each experiment in its own process, stopped after ``stall_s`` seconds
        without progress or ``timeout_s`` seconds in all (see :func:`_run_isolated`).
      on_done: called with each experiment's name and section (its ``variant`` set) as soon as
        it has finished, failed ones included.
    """
    from core.checkpoint import RunDirectoryInUseError

    sections, failed = [], []
    for i, name in enumerate(names):
        print(f"[{i + 1}/{len(names)}] {name} ({variant}) ...", file=sys.stderr, flush=True)
        stopwatch = timing.Stopwatch().start()
        if isolate:
            section = _run_isolated(name, variant, workdir, stall_s, timeout_s)
        else:
            try:
                section = _run_in_process(name, variant, workdir)
            except RunDirectoryInUseError:
                raise  # not this experiment's failure: its earlier report stays
            except Exception as e:  # noqa: BLE001 - one failing experiment must not stop the others
                tb = traceback.format_exc()
                print(tb, file=sys.stderr)
                section = _failed_section(name, f"{type(e).__name__}: {e}", tb)
        if (section.headline or {}).get("reproduces") == "failed":
            failed.append(name)
        seconds = stopwatch.seconds
        section.body += f"\n\n_{name} took {seconds:.0f} s._\n"
        print(f"[{i + 1}/{len(names)}] {name} done in {seconds:.0f} s"
              f"{' (FAILED)' if name in failed else ''}", file=sys.stderr, flush=True)
        section.variant = section.variant or variant
        sections.append(section)
        if on_done is not None:
            on_done(name, section)
    return sections, failed


def claim_line(name: str, section: report.Section) -> str:
    """One line for the terminal: ``<name> (<variant>): <verdict> | <method> | paper: <claim> |
    ours: <measured>``; the verdict reads ``n/a (<variant>)`` for a variant that judges no claim,
    and a section without a headline row says so."""
    variant = section.variant or "?"
    head = section.headline
    if not head:
        return f"{name} ({variant}): no claim row"
    verdict = head.get("reproduces", "")
    kind = cfg_lib.parse_arg(section.variant)[0] if section.variant else ""
    if verdict != "failed" and kind in cfg_lib.NO_VERDICT_VARIANTS:
        verdict = f"n/a ({kind})"
    parts = [f"{name} ({variant}): {verdict}", head.get("method", "")]
    if head.get("claim"):
        parts.append(f"paper: {head['claim']}")
    parts.append(f"ours: {head.get('ours', '')}")
    return " | ".join(parts)


def saved_sections(workdir: str) -> list[tuple[str, report.Section]]:
    """``(name, section)`` of every registered experiment with a ``<workdir>/<name>/section.json``,
    in registry order. A record that cannot be read is left out with a warning on stderr."""
    out = []
    for name in registry.EXPERIMENTS:
        path = paths.join(workdir, name, common.SECTION_FILE)
        try:
            out.append((name, report.load_section(path)))
        except FileNotFoundError:
            continue
        except (ValueError, OSError) as e:
            print(f"warning: {e}; its section is left out of the report", file=sys.stderr)
    return out


def rebuild_main_report(workdir: str, variant: str, names, seconds: float) -> str:
    """Writes ``<workdir>/report.md`` from every section kept in the workdir
    (:func:`saved_sections`); ``names`` are the experiments of this run, the others are named in
    the report as kept from earlier runs. Returns the path."""
    kept = saved_sections(workdir)
    earlier = [(n, s.variant) for n, s in kept if n not in names]
    return write_main_report(workdir, variant, [n for n, _ in kept if n in names],
                             [s for _, s in kept], seconds, earlier=earlier)


def write_main_report(workdir: str, variant: str, names, sections: list[report.Section],
                      seconds: float, earlier=()) -> str:
    """Writes ``<workdir>/report.md`` and returns its path. ``variant`` is the ``--variant`` value
    (``"smoke"``, ``"tiny,steps=3"``, ...), the variant of every section that does not record its
    own; ``earlier`` lists ``(name, variant)`` of sections kept from earlier runs. Where every
    section's variant has meaningless numbers (``core.config.NO_VERDICT_VARIANTS``) the report says
    so at the top; each such section's "reproduces" cell reads ``n/a (<variant>)`` rather than a
    verdict (failed experiments stay ``failed``)."""
    kinds = [cfg_lib.parse_arg(s.variant or variant)[0] for s in sections]
    no_verdict = None
    if kinds and all(k in cfg_lib.NO_VERDICT_VARIANTS for k in kinds) and len(set(kinds)) == 1:
        no_verdict = kinds[0]
    elif not kinds and cfg_lib.parse_arg(variant)[0] in cfg_lib.NO_VERDICT_VARIANTS:
        no_verdict = cfg_lib.parse_arg(variant)[0]
    else:  # a mixed report: only the rows of meaningless variants lose their verdict
        marked = []
        for s, kind in zip(sections, kinds, strict=True):
            marked.append(s.without_verdict(kind) if kind in cfg_lib.NO_VERDICT_VARIANTS else s)
        sections = marked
    preamble = f"Variant `{variant}`, experiments: {', '.join(names)}; total {seconds:.0f} s."
    if earlier:
        preamble += (" Kept from earlier runs in this workdir: "
                     + ", ".join(f"{n} (`{v or 'variant not recorded'}`)" for n, v in earlier) + ".")
    return report.write_report(
        paths.join(workdir, "report.md"), "ICML 2026 methods in JAX: report", sections,
        preamble=preamble, no_verdict=no_verdict)


def _variants_help(argv) -> str:
    """``--helpshort`` text: each variant and the experiments that have it, and the config fields
    (with the defaults of the selected variant) common to the selected experiments, which are the
    ones ``--variant=VARIANT,field=value`` can override."""
    experiments = next((a.split("=", 1)[1] for a in argv if a.startswith("--experiments=")), "all")
    variant = next((a.split("=", 1)[1] for a in argv if a.startswith("--variant=")), "tiny")
    names = registry.resolve(experiments)
    have: dict[str, list[str]] = {}
    for name in names:
        for v in cli.variants_of(_config_module(name)):
            have.setdefault(v, []).append(name)
    lines = ["variants (--variant=VARIANT[,field=value,...]):"]
    lines += [f"  {v}: {'every selected experiment' if len(ns) == len(names) else ', '.join(ns)}"
              for v, ns in have.items()]
    configs = {n: _config_module(n).get_config(variant) for n in names}
    shared = None
    for config in configs.values():
        leaves = {p for p in cfg_lib.field_paths(config) if p != "variant"
                  and not hasattr(_field(config, p), "keys")}
        shared = leaves if shared is None else shared & leaves
    lines.append(f"config fields common to {', '.join(names)} (defaults of `{variant}`; each "
                 "experiment's own: python -m experiments.<name> --helpshort):")
    for path in sorted(shared or ()):
        values = {repr(_field(c, path)) for c in configs.values()}
        lines.append(f"  {path} = {values.pop() if len(values) == 1 else 'differs by experiment'}")
    if not shared:
        lines.append("  (none)")
    return "\n".join(lines)


def _config_module(name: str):
    """The config module of experiment ``name`` (without importing the experiment and JAX)."""
    return importlib.import_module(f"experiments.configs.{name}")


def _field(config, path: str):
    for part in path.split("."):
        config = config[part]
    return config


def main(argv):
    if len(argv) > 1:
        cli.usage_error("main", f"unexpected arguments: {argv[1:]} (flags are --name=value)")
    logging.set_verbosity(logging.WARNING)  # orbax logs every save at INFO
    try:
        names = registry.resolve(_EXPERIMENTS.value)
        for name in names:  # an unknown variant or a bad field fails here, before anything runs
            cfg_lib.validate_module_config(_config_module(name).get_config(_VARIANT.value),
                                           _config_module(name), experiment=name)
        workdir = workdir_lib.check_workdir(_WORKDIR.value, names)
    except ValueError as e:
        cli.usage_error("main", str(e))
    # JAX is imported only once the flags and the workdir are known to be good
    from core import sharding
    from core.checkpoint import RunDirectoryInUseError

    sharding.initialize_distributed(_MULTIHOST.value)
    stopwatch = timing.Stopwatch().start()
    if _SECTION_OUT.value:  # child of an isolated run: one experiment, section as JSON
        if len(names) != 1:
            cli.usage_error("main", "--section_out needs exactly one experiment")
        try:
            section = _run_in_process(names[0], _VARIANT.value, workdir)
        except RunDirectoryInUseError as e:
            print(f"error: main: {str(e).strip().splitlines()[0]}", file=sys.stderr)
            sys.exit(IN_USE_EXIT)
        report.save_section(_SECTION_OUT.value, section)
        return 0
    done: list[str] = []

    def on_done(name: str, section: report.Section) -> None:
        # readable at once: the claim row, the experiment's report, the main report so far
        common.save_experiment_report(workdir, name, section)
        print(claim_line(name, section), flush=True)
        done.append(name)
        rebuild_main_report(workdir, _VARIANT.value, done, stopwatch.seconds)

    try:
        with workdir_lib.lock_workdir(workdir):
            check_folders_free(workdir, names)
            _, failed = run_all(
                names, _VARIANT.value, workdir, isolate=_ISOLATE.value and len(names) > 1,
                stall_s=_STALL.value * 60,
                timeout_s=None if _TIMEOUT.value is None else _TIMEOUT.value * 60,
                on_done=on_done)
            path = rebuild_main_report(workdir, _VARIANT.value, names, stopwatch.seconds)
    except RunDirectoryInUseError as e:
        cli.usage_error("main", str(e))
    print(f"report: {paths.display(path)}", file=sys.stderr)
    if failed:
        print(f"failed experiments: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


def _entry() -> None:
    common.end_start_up()
    terminal.plain_output_if_not_tty()
    try:
        app.run(main, flags_parser=cli.parse_flags_or_exit("main", _variants_help))
    except KeyboardInterrupt as e:
        cli.interrupted("main", e)


if __name__ == "__main__":
    _entry()
