"""Runs every benchmark module in ``experiments/bench`` and writes ``BENCHMARKS.md``.

    python -m experiments.bench.run_all --out=BENCHMARKS.md [--only=decode,sparse_decode]

Each module ``experiments.bench.<name>`` has ``run() -> str`` (a markdown section whose numbers are
ratios against a baseline measured in the same run). A failing benchmark is reported and does not
stop the others; the exit code is 1 if any failed.
"""

from __future__ import annotations

import importlib
import os
import pkgutil
import platform
import sys
import time
import traceback

import jax
from absl import app, flags, logging

_OUT = flags.DEFINE_string("out", "BENCHMARKS.md", "output markdown file")
_ONLY = flags.DEFINE_string("only", "", "comma-separated subset of benchmark modules")

_SKIP = {"run_all", "timing"}


def machine_description() -> str:
    """One paragraph: CPU, cores, Python, JAX version and backend devices."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    devices = ", ".join(sorted({d.device_kind for d in jax.devices()}))
    return (f"{cpu}; {os.cpu_count()} logical cores; Python {platform.python_version()}; "
            f"JAX {jax.__version__} on {jax.default_backend()} ({jax.device_count()} x {devices}).")


def discover() -> list[str]:
    import experiments.bench as bench

    return sorted(m.name for m in pkgutil.iter_modules(bench.__path__) if m.name not in _SKIP)


def main(argv):
    del argv
    logging.set_verbosity(logging.WARNING)
    names = discover()
    if _ONLY.value:
        wanted = [n.strip() for n in _ONLY.value.split(",") if n.strip()]
        unknown = sorted(set(wanted) - set(names))
        if unknown:
            print(f"error: unknown benchmarks {unknown}; known: {names}", file=sys.stderr)
            return 2
        names = wanted
    parts = ["# Benchmarks", "", f"Machine: {machine_description()}", "",
             "Regenerate with `make bench` (`python -m experiments.bench.run_all`). Every number is a "
             "ratio against a baseline measured in the same run, or an absolute time with its "
             "baseline beside it.", ""]
    failed = []
    for name in names:
        print(f"bench {name} ...", file=sys.stderr, flush=True)
        t0 = time.perf_counter()
        try:
            section = importlib.import_module(f"experiments.bench.{name}").run()
        except Exception:  # noqa: BLE001 - report and continue
            failed.append(name)
            section = f"## {name}: FAILED\n\n```\n{traceback.format_exc()[-3000:]}\n```\n"
        parts += [section.strip(), "", f"_{name}: {time.perf_counter() - t0:.0f} s._", ""]
    with open(_OUT.value, "w") as f:
        f.write("\n".join(parts))
    print(f"wrote {os.path.abspath(_OUT.value)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    app.run(main)
