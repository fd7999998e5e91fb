"""Command-line plumbing for absl entry points: flags parsed with one-line usage errors, a
``--help`` that lists the config, ml_collections config arguments checked before absl parses
them, and a one-line exit on Ctrl-C.

A config argument is ``--config=path.py[:arg]`` (the file's ``get_config(arg)``, in the style of
big_vision) with optional overrides ``--config.<field>=value``.
"""

from __future__ import annotations

import importlib.util
import os
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NoReturn

import ml_collections

from core import config as cfg_lib


def check_data_path(path: str | None, what: str) -> str | None:
    """Returns ``path`` unchanged if it is empty or an existing, readable file.

    Raises:
      FileNotFoundError: the file does not exist (the message names it and ``what`` it is).
      ValueError: a directory or an unreadable file (:func:`core.data.check_file`).
    """
    if path:
        from core.data.files import check_file  # noqa: PLC0415 (keeps start-up free of numpy)

        check_file(path, f"{what}: data file")
    return path or None


def usage_error(prog: str, message: str) -> NoReturn:
    """Prints ``error: <prog>: <message>`` (first line only) to stderr and exits with status 2."""
    lines = str(message).strip().splitlines() or [""]
    print(f"error: {prog}: {lines[0]}", file=sys.stderr)
    sys.exit(2)


def flag_error_message(error: Exception) -> str:
    """One line for an absl flag-parsing error (absl wraps config-file errors with a traceback)."""
    from absl import flags

    text = str(error).strip()
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if not lines:
        return type(error).__name__
    if "Traceback" in text:  # "flag --config=...: Error whilst parsing config file: <traceback>"
        return lines[-1]
    m = re.match(r"flag --([\w.]+)=(.*?): (.*)", lines[0])
    if m and m.group(1) in flags.FLAGS:
        flag = flags.FLAGS[m.group(1)]
        try:
            flag.parser.parse(m.group(2))
        except (ValueError, TypeError):  # a value of the wrong type: name the type expected
            return f"--{m.group(1)}={m.group(2)}: expected {flag.flag_type()} ({m.group(3)})"
        return f"--{m.group(1)}={m.group(2)}: {m.group(3)}"  # a validator refused the value
    return lines[0]


HELP_FLAGS = ("--help", "-help", "--helpshort", "-helpshort", "-h", "-?")


def parse_flags_or_exit(prog: str, extra_help: Callable[[Sequence[str]], str] | None = None
                        ) -> Callable[[Sequence[str]], list[str]]:
    """A ``flags_parser`` for ``absl.app.run``: parses ``argv`` into ``FLAGS``; on a bad flag
    (unknown name, bad value) prints one line naming it (see :func:`usage_error`) and exits 2.

    ``--help`` / ``--helpshort`` (absl prints these and exits 1) print the entry point's
    docstring, its flags with their defaults, then ``extra_help(argv)`` (e.g. the config's
    variants and fields), and exit 0. ``--helpfull`` is left to absl.
    """
    from absl import flags

    def parse(argv: Sequence[str]) -> list[str]:
        args = list(argv[1:])
        if "--" in args:
            args = args[:args.index("--")]
        if any(a in HELP_FLAGS for a in args):
            print(_help_text(argv, extra_help))
            sys.stdout.flush()
            sys.exit(0)
        try:
            return flags.FLAGS(list(argv))
        except (flags.Error, AttributeError, KeyError) as e:
            usage_error(prog, flag_error_message(e))

    return parse


def _help_text(argv: Sequence[str], extra_help: Callable[[Sequence[str]], str] | None) -> str:
    from absl import flags

    doc = (getattr(sys.modules.get("__main__"), "__doc__", None) or "").strip()
    parts = [doc, "", "flags:", flags.FLAGS.main_module_help().rstrip()]
    if extra_help is not None:
        try:
            parts += ["", extra_help(argv).rstrip()]
        except (ValueError, FileNotFoundError) as e:
            parts += ["", f"(cannot list the config: {str(e).strip().splitlines()[0]})"]
    return "\n".join(parts).lstrip("\n")


def config_help(config: ml_collections.ConfigDict, variants: Sequence[str], selected: str,
                how_variant: str, how_field: str,
                descriptions: Mapping[str, str] | None = None) -> str:
    """Lines listing the variants and every leaf field of ``config`` with its value (the
    defaults of variant ``selected``), for ``--helpshort``; a field in ``descriptions`` (a config
    module's ``FIELD_HELP``: dotted path -> one line) has its description after a ``#``."""
    lines = [f"variants ({how_variant}): {', '.join(variants)}",
             f"config fields ({how_field}), defaults of `{selected}`:"]
    for path in cfg_lib.field_paths(config):
        node = config
        for part in path.split("."):
            node = node[part]
        if path != "variant" and not isinstance(node, ml_collections.ConfigDict):
            about = (descriptions or {}).get(path)
            lines.append(f"  {path} = {node!r}" + (f"  # {about}" if about else ""))
    return "\n".join(lines)


def variants_of(module: Any) -> list[str]:
    """The variant names a config module offers (its ``VARIANTS`` mapping), in its order."""
    return list(getattr(module, "VARIANTS", None) or cfg_lib.VARIANTS)


def config_args(argv: Sequence[str], flag: str) -> tuple[str | None, list[tuple[str, str]]]:
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


def load_config(spec: str) -> ml_collections.ConfigDict:
    """``get_config(arg)`` of the config file in ``"path.py[:arg]"``.

    Raises:
      FileNotFoundError: no such file.
      ValueError: the file has no ``get_config``, or ``get_config`` rejects ``arg``.
    """
    return load_config_and_module(spec)[0]


def load_config_and_module(spec: str) -> tuple[ml_collections.ConfigDict, Any]:
    """``(get_config(arg), the config module)`` of the config file in ``"path.py[:arg]"``; raises
    as :func:`load_config`."""
    path, *arg = spec.split(":", 1)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"config file {path!r} does not exist")
    module_spec = importlib.util.spec_from_file_location("_checked_experiment_config", path)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    if not hasattr(module, "get_config"):
        raise ValueError(f"{path!r} defines no get_config()")
    return module.get_config(*arg), module


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
    spec, overrides = config_args(argv, flag)
    if not overrides and spec is None:
        return
    try:
        config = load_config(spec or default_spec)
    except (ValueError, FileNotFoundError) as e:
        raise type(e)(f"--{flag}={spec or default_spec}: {e}") from None
    for path, arg in overrides:
        if "[" in path:  # indexed paths (``a[0]``) are left to ml_collections
            continue
        try:
            cfg_lib.check_field(config, path)
        except ValueError as e:
            raise ValueError(f"{arg}: {e}") from None


def interrupted(name: str, error: BaseException) -> NoReturn:
    """Leaves after Ctrl-C with one line on stderr and exit status 130, without the interpreter
    teardown (which can crash while XLA threads still run). A training loop's interrupt names
    its last checkpoint (a checkpoint being saved was committed first); any other interrupt
    names none, since only the training loop keeps checkpoints, and says that a rerun resumes
    from what the workdir holds (an experiment restores its finished and checkpointed training
    runs and cached evaluations, and runs the rest again)."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not break this line
    training = sys.modules.get("core.training")  # not imported: not a training interrupt
    if training is not None and isinstance(error, training.TrainingInterrupted):
        message = str(error)
    else:
        message = (f"{name}: interrupted; rerun the same command to resume: what the workdir "
                   "already holds (finished or checkpointed training, cached results) is reused "
                   "and the rest runs again")
    lead = "\n" if sys.stderr.isatty() else ""  # end a live progress bar's line first
    print(f"{lead}{message}", file=sys.stderr, flush=True)
    sys.stdout.flush()
    os._exit(130)
