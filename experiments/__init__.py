"""Experiments: configs, one module per experiment, the main job, benchmarks and notebooks."""

import sys

if sys.argv[:1] == ["-m"]:
    # ``python -m experiments.<name>`` imports this package before the entry module, whose imports
    # (JAX, Flax, orbax) take seconds: a Ctrl-C then would print a long import traceback. Say it in
    # one line instead; once running, the entry point handles interrupts itself
    # (``experiments.common.interrupted``). Other exceptions keep the default report.
    def _one_line_interrupt(kind, value, tb, _default=sys.excepthook):
        if issubclass(kind, KeyboardInterrupt):
            import os

            print("interrupted during start-up; nothing was run", file=sys.stderr, flush=True)
            os._exit(130)
        _default(kind, value, tb)

    sys.excepthook = _one_line_interrupt
