"""The main job: runs registered experiments and writes ``<workdir>/report.md``.

    python -m experiments.main --variant=tiny --workdir=workdir            # every experiment
    python -m experiments.main --experiments=lm,judge_btl --workdir=DIR   # a subset

A failing experiment is reported as failed in the report's opening table and does not stop the
others; the exit code is 1 if any failed.
"""

from __future__ import annotations

import os
import sys
import time
import traceback

from absl import app, flags, logging

from core import report, sharding
from experiments import registry

_EXPERIMENTS = flags.DEFINE_string(
    "experiments", "all", f"comma-separated subset of: {', '.join(registry.EXPERIMENTS)}")
_VARIANT = flags.DEFINE_string("variant", "tiny", "config variant for every experiment")
_WORKDIR = flags.DEFINE_string("workdir", "workdir", "output directory")
_MULTIHOST = flags.DEFINE_bool("multihost", False, "call jax.distributed.initialize() first")


def run_all(names, variant: str, workdir: str) -> tuple[list[report.Section], list[str]]:
    """Runs each experiment; returns (sections, names of failed experiments)."""
    sections, failed = [], []
    for i, name in enumerate(names):
        print(f"[{i + 1}/{len(names)}] {name} ({variant}) ...", file=sys.stderr, flush=True)
        t0 = time.perf_counter()
        try:
            module, config_module = registry.load(name)
            section = module.run(config_module.get_config(variant), workdir)
        except Exception as e:  # noqa: BLE001 - one failing experiment must not stop the others
            failed.append(name)
            tb = traceback.format_exc()
            print(tb, file=sys.stderr)
            section = report.Section(
                title=f"{name}: FAILED",
                body=f"```\n{tb[-4000:]}\n```",
                headline={"method": name, "claim": "", "ours": f"{type(e).__name__}: {e}"[:200],
                          "reproduces": "failed"})
        seconds = time.perf_counter() - t0
        section.body += f"\n\n_{name} took {seconds:.0f} s._\n"
        print(f"[{i + 1}/{len(names)}] {name} done in {seconds:.0f} s"
              f"{' (FAILED)' if name in failed else ''}", file=sys.stderr, flush=True)
        sections.append(section)
    return sections, failed


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    logging.set_verbosity(logging.WARNING)  # orbax logs every save at INFO
    sharding.initialize_distributed(_MULTIHOST.value)
    try:
        names = registry.resolve(_EXPERIMENTS.value)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    os.makedirs(_WORKDIR.value, exist_ok=True)
    t0 = time.perf_counter()
    sections, failed = run_all(names, _VARIANT.value, _WORKDIR.value)
    path = report.write_report(
        os.path.join(_WORKDIR.value, "report.md"), "ICML 2026 methods in JAX: report", sections,
        preamble=(f"Variant `{_VARIANT.value}`, experiments: {', '.join(names)}; total "
                  f"{time.perf_counter() - t0:.0f} s."))
    print(f"report: {os.path.abspath(path)}", file=sys.stderr)
    if failed:
        print(f"failed experiments: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    app.run(main)
