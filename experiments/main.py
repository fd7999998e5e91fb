"""The main job: runs registered experiments and writes ``<workdir>/report.md``.

    python -m experiments.main --variant=tiny --workdir=workdir            # every experiment
    python -m experiments.main --experiments=lm,judge_btl --workdir=DIR   # a subset

A failing experiment is reported as failed in the report's opening table and does not stop the
others; the exit code is 1 if any failed. With several experiments, each runs in its own process
(``--isolate``, the default): one experiment's global JAX state cannot leak into the next, and one
that hangs is stopped after ``--timeout_minutes`` and reported as failed. Bad flags (unknown name,
bad value, unknown experiment or variant) print one line to stderr and exit with status 2. A
``--variant=smoke`` report says at the top that its numbers are meaningless and judges no claim.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import time
import traceback

from absl import app, flags, logging

from core import config as cfg_lib
from core import report, sharding
from experiments import common, registry

_EXPERIMENTS = flags.DEFINE_string(
    "experiments", "all", f"comma-separated subset of: {', '.join(registry.EXPERIMENTS)}")
_VARIANT = flags.DEFINE_string("variant", "tiny", "config variant for every experiment")
_WORKDIR = flags.DEFINE_string("workdir", "workdir", "output directory")
_MULTIHOST = flags.DEFINE_bool("multihost", False, "call jax.distributed.initialize() first")
_ISOLATE = flags.DEFINE_bool("isolate", True, "run each experiment in its own process")
_TIMEOUT = flags.DEFINE_float(
    "timeout_minutes", None, "per-experiment limit when isolated; default 12 for `tiny` and "
    "`smoke` (the slowest `tiny` experiment takes about 4 min on 2 cores), none otherwise")
_SECTION_OUT = flags.DEFINE_string("section_out", "", "internal: write the section as JSON here")


def _failed_section(name: str, message: str, details: str) -> report.Section:
    return report.Section(title=f"{name}: FAILED", body=f"```\n{details[-4000:]}\n```",
                          headline={"method": name, "claim": "", "ours": message[:200],
                                    "reproduces": "failed"})


def _run_in_process(name: str, variant: str, workdir: str) -> report.Section:
    module, config_module = registry.load(name)
    return module.run(config_module.get_config(variant), workdir)


def _timeout_s(variant: str) -> float | None:
    """Per-experiment limit in seconds: ``--timeout_minutes``, else 12 min for the CPU-sized
    variants and none for the others."""
    if _TIMEOUT.value is not None:
        return _TIMEOUT.value * 60
    return 12 * 60.0 if variant.split(",")[0] in ("tiny", "smoke") else None


def _run_isolated(name: str, variant: str, workdir: str, timeout_s: float | None
                  ) -> report.Section:
    """Runs one experiment in a child process; its section comes back as JSON."""
    out = os.path.join(workdir, name, "section.json")
    os.makedirs(os.path.dirname(out), exist_ok=True)
    if os.path.exists(out):
        os.remove(out)
    cmd = [sys.executable, "-m", "experiments.main", f"--experiments={name}",
           f"--variant={variant}", f"--workdir={workdir}", "--noisolate", f"--section_out={out}"]
    try:
        proc = subprocess.run(cmd, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired:
        return _failed_section(name, f"timed out after {timeout_s / 60:g} min",
                               f"{name} did not finish within {timeout_s:.0f} s")
    if proc.returncode != 0 or not os.path.exists(out):
        return _failed_section(name, f"exit code {proc.returncode}",
                               f"{name} exited with code {proc.returncode}; its traceback is "
                               "in the job's standard error")
    with open(out) as f:
        return report.Section(**json.load(f))


def run_all(names, variant: str, workdir: str, isolate: bool = False,
            timeout_s: float | None = 1800.0
            ) -> tuple[list[report.Section], list[str]]:
    """Runs each experiment; returns (sections, names of failed experiments)."""
    sections, failed = [], []
    for i, name in enumerate(names):
        print(f"[{i + 1}/{len(names)}] {name} ({variant}) ...", file=sys.stderr, flush=True)
        t0 = time.perf_counter()
        if isolate:
            section = _run_isolated(name, variant, workdir, timeout_s)
        else:
            try:
                section = _run_in_process(name, variant, workdir)
            except Exception as e:  # noqa: BLE001 - one failing experiment must not stop the others
                tb = traceback.format_exc()
                print(tb, file=sys.stderr)
                section = _failed_section(name, f"{type(e).__name__}: {e}", tb)
        if (section.headline or {}).get("reproduces") == "failed":
            failed.append(name)
        seconds = time.perf_counter() - t0
        section.body += f"\n\n_{name} took {seconds:.0f} s._\n"
        print(f"[{i + 1}/{len(names)}] {name} done in {seconds:.0f} s"
              f"{' (FAILED)' if name in failed else ''}", file=sys.stderr, flush=True)
        sections.append(section)
    return sections, failed


def write_main_report(workdir: str, variant: str, names, sections: list[report.Section],
                      seconds: float) -> str:
    """Writes ``<workdir>/report.md`` and returns its path. ``variant`` is the ``--variant`` value
    (``"smoke"``, ``"tiny,steps=3"``, ...); for a variant whose numbers are meaningless
    (``core.config.NO_VERDICT_VARIANTS``) the report says so at the top and its "reproduces"
    column reads ``n/a (<variant>)`` rather than a verdict (failed experiments stay ``failed``)."""
    variant_name = cfg_lib.parse_arg(variant)[0]
    return report.write_report(
        os.path.join(workdir, "report.md"), "ICML 2026 methods in JAX: report", sections,
        preamble=(f"Variant `{variant}`, experiments: {', '.join(names)}; total {seconds:.0f} s."),
        no_verdict=variant_name if variant_name in cfg_lib.NO_VERDICT_VARIANTS else None)


def main(argv):
    if len(argv) > 1:
        common.usage_error("main", f"unexpected arguments: {argv[1:]} (flags are --name=value)")
    logging.set_verbosity(logging.WARNING)  # orbax logs every save at INFO
    sharding.initialize_distributed(_MULTIHOST.value)
    try:
        names = registry.resolve(_EXPERIMENTS.value)
        for name in names:  # an unknown variant fails here, before anything runs
            registry.load(name)[1].get_config(_VARIANT.value)
    except ValueError as e:
        common.usage_error("main", str(e))
    os.makedirs(_WORKDIR.value, exist_ok=True)
    t0 = time.perf_counter()
    if _SECTION_OUT.value:  # child of an isolated run: one experiment, section as JSON
        if len(names) != 1:
            common.usage_error("main", "--section_out needs exactly one experiment")
        section = _run_in_process(names[0], _VARIANT.value, _WORKDIR.value)
        report.write_json(_SECTION_OUT.value, dataclasses.asdict(section))
        return 0
    sections, failed = run_all(names, _VARIANT.value, _WORKDIR.value,
                               isolate=_ISOLATE.value and len(names) > 1,
                               timeout_s=_timeout_s(_VARIANT.value))
    path = write_main_report(_WORKDIR.value, _VARIANT.value, names, sections,
                             time.perf_counter() - t0)
    print(f"report: {os.path.abspath(path)}", file=sys.stderr)
    if failed:
        print(f"failed experiments: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    app.run(main, flags_parser=common.parse_flags_or_exit("main"))
