"""Runs many command lines ``python -m <module> <args>`` for the price of one interpreter start-up.

:func:`run_commands` starts this file as a script. The script imports the entry modules' heavy
dependencies once (JAX, Flax, optax, orbax, absl, matplotlib: about two seconds), then forks once
per command line. Each fork is a process of its own with its own working directory,
``sys.argv``, standard output and error (files) and exit status, and runs the module as
``__main__`` the way ``python -m`` does (``runpy.run_module(..., alter_sys=True)``). The entry
modules themselves are not imported before the fork: each command line defines its flags afresh.

For the command-line test batteries, whose cases stop before JAX starts a backend (forking a
process whose JAX backend is running would not be safe).

Protocol of the script: a JSON list of ``[module, [arg, ...], cwd]`` on standard input; a JSON
list of ``{"returncode": int, "stdout": str, "stderr": str}`` on standard output, in order.
"""

import json
import os
import runpy
import subprocess
import sys
import tempfile
import traceback
from collections.abc import Hashable, Mapping, Sequence

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

MAX_RUNNING = 4


def _exit_status(exc: SystemExit) -> int:
    """The status ``python`` exits with for ``exc``; a non-integer code is printed, as there."""
    if exc.code is None:
        return 0
    if isinstance(exc.code, int):
        return exc.code
    print(exc.code, file=sys.stderr)
    return 1


def _child(module: str, args: list[str], cwd: str, out: str, err: str) -> None:
    """Runs in the fork: ``python -m module *args`` in ``cwd``, output to the files; never returns."""
    status = 1
    try:
        os.chdir(cwd)
        for fd, path in ((1, out), (2, err)):
            os.dup2(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), fd)
        sys.argv = [module, *args]  # argv[0] becomes the module's path, as with `python -m`
        try:
            runpy.run_module(module, run_name="__main__", alter_sys=True)
            status = 0
        except SystemExit as e:
            status = _exit_status(e)
        except BaseException:  # what the interpreter does with an uncaught exception
            traceback.print_exc()
            status = 1
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        os._exit(status)


def run_all(cases: list) -> list[dict]:
    """Runs every ``[module, args, cwd]`` of ``cases`` in its own fork, at most
    :data:`MAX_RUNNING` at a time; returns their results in order."""
    results: list[dict | None] = [None] * len(cases)
    with tempfile.TemporaryDirectory(prefix="forked-cli-") as scratch:
        files = [(os.path.join(scratch, f"{i}.out"), os.path.join(scratch, f"{i}.err"))
                 for i in range(len(cases))]
        running: dict[int, int] = {}

        def reap_one():
            pid, wait_status = os.wait()
            i = running.pop(pid)
            texts = []
            for path in files[i]:
                with open(path, encoding="utf-8", errors="replace") as f:
                    texts.append(f.read())
            results[i] = {"returncode": os.waitstatus_to_exitcode(wait_status),
                          "stdout": texts[0], "stderr": texts[1]}

        for i, (module, args, cwd) in enumerate(cases):
            if len(running) >= MAX_RUNNING:
                reap_one()
            sys.stdout.flush()
            sys.stderr.flush()
            pid = os.fork()
            if pid == 0:
                _child(module, args, cwd, *files[i])
            running[pid] = i
        while running:
            reap_one()
    return results


def run_commands(commands: Mapping[Hashable, Sequence[str]], cwd: str = ROOT,
                 timeout: float = 300) -> dict[Hashable, subprocess.CompletedProcess]:
    """Runs ``{key: [python, "-m", module, *args]}``, each as a fork of one process (module
    docstring), in ``cwd``; returns ``{key: CompletedProcess}`` with text output.

    Raises:
      ValueError: a command that is not ``[sys.executable, "-m", module, ...]``.
      AssertionError: the forking process itself failed (its standard error in the message).
    """
    for cmd in commands.values():
        if list(cmd[:2]) != [sys.executable, "-m"] or len(cmd) < 3:
            raise ValueError(f"run_commands: expected [{sys.executable!r}, '-m', module, ...], "
                             f"got {list(cmd)}")
    cases = [[cmd[2], list(cmd[3:]), cwd] for cmd in commands.values()]
    proc = subprocess.run([sys.executable, os.path.abspath(__file__)], input=json.dumps(cases),
                          cwd=cwd, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return {k: subprocess.CompletedProcess(list(cmd), r["returncode"], r["stdout"], r["stderr"])
            for (k, cmd), r in zip(commands.items(), json.loads(proc.stdout))}


def _preload() -> None:
    """The dependencies every entry module imports; none of them starts a JAX backend."""
    import absl.app  # noqa: F401
    import flax.nnx  # noqa: F401
    import jax.numpy  # noqa: F401
    import matplotlib.pyplot  # noqa: F401
    import ml_collections  # noqa: F401
    import optax  # noqa: F401
    import orbax.checkpoint  # noqa: F401

    import experiments.common  # noqa: F401
    import experiments.registry  # noqa: F401


if __name__ == "__main__":
    _preload()
    json.dump(run_all(json.load(sys.stdin)), sys.stdout)
