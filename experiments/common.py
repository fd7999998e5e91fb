"""Shared experiment plumbing: the per-experiment absl entry point, flag parsing and output paths."""

from __future__ import annotations

import importlib.util
import os
import re
import sys
from collections.abc import Callable, Sequence
from typing import NoReturn

import ml_collections

from core import config as cfg_lib
from core import report, sharding


def experiment_dir(workdir: str, name: str) -> str:
    """``<workdir>/<name>``, created if missing."""
    path = os.path.join(workdir, name)
    os.makedirs(path, exist_ok=True)
    return path


def check_data_path(path: str | None, what: str) -> str | None:
    """Returns ``path`` unchanged if it is empty or an existing file.

    Raises:
      FileNotFoundError: the file does not exist (the message names it and ``what`` it is).
    """
    if path and not os.path.exists(path):
        raise FileNotFoundError(f"{what}: data file {path!r} does not exist")
    return path or None


def usage_error(prog: str, message: str) -> NoReturn:
    """Prints ``error: <prog>: <message>`` (first line only) to stderr and exits with status 2."""
    lines = str(message).strip().splitlines() or [""]
    print(f"error: {prog}: {lines[0]}", file=sys.stderr)
    sys.exit(2)


def _flag_error_message(error: Exception) -> str:
    """One line for an absl flag-parsing error (absl wraps config-file errors with a traceback)."""
    from absl import flags

    text = str(error).strip()
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if not lines:
        return type(error).__name__
    if "Traceback" in text:  # "flag --config=...: Error whilst parsing config file: <traceback>"
        return lines[-1]
    m = re.match(r"flag --([\w.]+)=(.*?): (.*)", lines[0])
    if m and m.group(1) in flags.FLAGS:  # a bad value: name the type the flag expects
        kind = flags.FLAGS[m.group(1)].flag_type()
        return f"--{m.group(1)}={m.group(2)}: expected {kind} ({m.group(3)})"
    return lines[0]


def parse_flags_or_exit(prog: str) -> Callable[[Sequence[str]], list[str]]:
    """A ``flags_parser`` for ``absl.app.run``: parses ``argv`` into ``FLAGS``; on a bad flag
    (unknown name, bad value) prints one line naming it (see :func:`usage_error`) and exits 2.
    ``--help`` and ``--helpshort`` still print the usage and exit as absl does."""
    from absl import flags

    def parse(argv: Sequence[str]) -> list[str]:
        try:
            return flags.FLAGS(list(argv))
        except (flags.Error, AttributeError, KeyError) as e:
            usage_error(prog, _flag_error_message(e))

    return parse


def _config_args(argv: Sequence[str], flag: str) -> tuple[str | None, list[tuple[str, str]]]:
    """(value of ``--<flag>`` or None, [(field path, the argument)] of ``--<flag>.<path>=...``)."""
    spec, overrides = None, []
    for i, arg in enumerate(argv):
        if arg == "--":
            break
        m = re.match(rf"^--?{flag}(=|$)", arg)
        if m:
            spec = arg[m.end():] if m.group(1) else (argv[i + 1] if i + 1 < len(argv) else None)
            continue
        m = re.match(rf"^--?(?:no)?{flag}\.([^=]+)", arg)
        if m:
            overrides.append((m.group(1), arg))
    return spec, overrides


def _load_config(spec: str) -> ml_collections.ConfigDict:
    """``get_config(arg)`` of the config file in ``"path.py[:arg]"``.

    Raises:
      FileNotFoundError: no such file.
      ValueError: the file has no ``get_config``, or ``get_config`` rejects ``arg``.
    """
    path, *arg = spec.split(":", 1)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"config file {path!r} does not exist")
    module_spec = importlib.util.spec_from_file_location("_checked_experiment_config", path)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    if not hasattr(module, "get_config"):
        raise ValueError(f"{path!r} defines no get_config()")
    return module.get_config(*arg)


def check_config_args(argv: Sequence[str], default_spec: str, flag: str = "config") -> None:
    """Checks ``--config=FILE:VARIANT`` and every ``--config.<field>=...`` of ``argv`` before absl
    parses them (absl reports these with a traceback).

    Args:
      argv: the command line, program name first.
      default_spec: the config used when ``argv`` has no ``--config``.
      flag: the config flag's name.

    Raises:
      FileNotFoundError: the config file does not exist.
      ValueError: unknown variant or bad ``,key=value`` in the spec, or an override names a field
        the config does not have (the message names the closest existing fields).
    """
    spec, overrides = _config_args(argv, flag)
    if not overrides and spec is None:
        return
    try:
        config = _load_config(spec or default_spec)
    except (ValueError, FileNotFoundError) as e:
        raise type(e)(f"--{flag}={spec or default_spec}: {e}") from None
    for path, arg in overrides:
        if "[" in path:  # indexed paths (``a[0]``) are left to ml_collections
            continue
        try:
            cfg_lib.check_field(config, path)
        except ValueError as e:
            raise ValueError(f"{arg}: {e}") from None


def app_main(name: str, run: Callable[[ml_collections.ConfigDict, str], report.Section]) -> None:
    """``python -m experiments.<name> --config=experiments/configs/<name>.py:tiny --workdir=DIR
    [--config.<field>=value ...]``: runs one experiment and writes ``DIR/<name>/report.md``.

    Bad input (unknown config field, unknown variant, a value of the wrong type, an unknown flag,
    a missing data file) prints one line ``error: <name>: ...`` to stderr and exits with status 2.
    """
    from absl import app, flags, logging
    from ml_collections import config_flags

    default_spec = f"experiments/configs/{name}.py:tiny"
    # config_flags builds one flag per --config.<field> while parsing and fails on an unknown field
    # with a traceback (when --config is absent, already at definition), so check fields first.
    try:
        check_config_args(flags.FLAGS.read_flags_from_files(sys.argv, force_gnu=False),
                          default_spec)
    except (ValueError, FileNotFoundError, flags.Error) as e:
        usage_error(name, str(e))
    try:
        config_flag = config_flags.DEFINE_config_file(
            "config", default_spec, "experiment config (file:variant)", lock_config=True)
    except (flags.Error, AttributeError, KeyError, TypeError, ValueError) as e:
        usage_error(name, _flag_error_message(e))
    workdir_flag = flags.DEFINE_string("workdir", "workdir", "output directory")
    multihost = flags.DEFINE_bool("multihost", False, "call jax.distributed.initialize() first")
    # --helpshort lists the key flags of the main module (absl names it by sys.argv[0]); these are
    # defined here, in a module the main module imports.
    for holder in (config_flag, workdir_flag, multihost):
        flags.FLAGS.register_key_flag_for_module(sys.argv[0], flags.FLAGS[holder.name])

    def main(argv):
        if len(argv) > 1:
            usage_error(name, f"unexpected arguments: {argv[1:]} (flags are --name=value)")
        logging.set_verbosity(logging.WARNING)  # orbax logs every save at INFO
        sharding.initialize_distributed(multihost.value)
        try:
            section = run(config_flag.value, workdir_flag.value)
        except (ValueError, FileNotFoundError) as e:  # bad input: one clear line, no traceback
            message = str(e).strip()
            if message.startswith(f"{name}: "):  # do not repeat the experiment's name
                message = message[len(name) + 2:]
            print(f"error: {name}: {message}", file=sys.stderr)
            return 2
        except KeyboardInterrupt:
            # Checkpointed training resumes on a rerun; leave without a traceback, and without the
            # interpreter teardown, which can crash while XLA threads are still running.
            print(f"\n{name}: interrupted; rerun the same command to resume from the last "
                  "checkpoint", file=sys.stderr, flush=True)
            sys.stdout.flush()
            os._exit(130)
        # <workdir>/<name>/report.md, so runs of several experiments into one workdir coexist.
        variant = config_flag.value.get("variant", "")
        path = report.write_report(os.path.join(workdir_flag.value, name, "report.md"),
                                   f"Report: {name} ({variant})", [section],
                                   no_verdict=variant if variant in cfg_lib.NO_VERDICT_VARIANTS
                                   else None)
        print(f"report: {os.path.abspath(path)}", file=sys.stderr)
        return 0

    app.run(main, flags_parser=parse_flags_or_exit(name))
