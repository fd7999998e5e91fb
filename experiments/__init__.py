"""Experiments: configs, one module per experiment, the main job, benchmarks and notebooks."""

import sys

if sys.argv[:1] == ["-m"]:
    # ``python -m experiments.<name>`` imports this package before the entry module, whose imports
    # (JAX, Flax, orbax) take seconds. A KeyboardInterrupt raised inside them prints a long
    # traceback and can leave a half-initialised extension that hangs or crashes the interpreter
    # on its way out; so until the entry point takes over (``experiments.common.app_main`` and
    # ``experiments.main`` restore the default handler), Ctrl-C leaves at once with one line.
    import os
    import signal

    def _leave_during_start_up(signum, frame):
        del signum, frame
        os.write(2, b"interrupted during start-up; nothing was run\n")
        os._exit(130)

    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        signal.signal(signal.SIGINT, _leave_during_start_up)
