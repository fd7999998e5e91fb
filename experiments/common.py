"""Shared experiment plumbing: the per-experiment absl entry point, flag parsing and output paths."""

from __future__ import annotations

import importlib.util
import io
import math
import os
import re
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NoReturn

import ml_collections

from core import config as cfg_lib
from core import files, report


def experiment_dir(workdir: str, name: str) -> str:
    """``<workdir>/<name>``, created if missing (``workdir`` a local path or a URL such as
    ``gs://bucket/run``; the result is the same kind)."""
    path = files.join(workdir, name)
    files.makedirs(path)
    return path


def check_workdir(workdir: str, names: Sequence[str] = ()) -> str:
    """Checks, before any work, that ``workdir`` can hold the outputs of experiments ``names``.

    ``workdir`` is created if missing; it and any existing ``<workdir>/<name>`` must be writable
    directories (a file is written and removed in each to make sure, since permission bits do
    not tell for every user or file system). For an object-store URL (``gs://bucket/run``) a
    probe object is written, read back and removed under ``workdir``, so that a missing client
    library (``gcsfs``: the ``gcs`` extra), missing credentials or a bucket that does not exist
    are reported here rather than after the first experiment's work.

    Returns:
      ``workdir``.

    Raises:
      ValueError: one line: the path is empty, is (or has in its path) a file, cannot be created,
        or is not writable; the message names the path and the reason.
    """
    if not workdir:
        raise ValueError("--workdir is empty; expected a directory path")
    where = f"--workdir={workdir}"
    if files.scheme(workdir) == "file":
        workdir = files.display(workdir)
    if not files.is_local(workdir):
        _check_remote_workdir(workdir, where)
        return workdir
    if os.path.exists(workdir) and not os.path.isdir(workdir):
        raise ValueError(f"{where}: it is a file, not a directory")
    try:
        os.makedirs(workdir, exist_ok=True)
    except OSError as e:
        raise ValueError(f"{where}: cannot create it ({_os_reason(e)})") from None
    for path in [workdir] + [os.path.join(workdir, n) for n in names]:
        if not os.path.exists(path):
            continue
        if not os.path.isdir(path):
            raise ValueError(f"{where}: {path} is a file, not a directory")
        try:
            fd, probe = tempfile.mkstemp(prefix=".write-check-", dir=path)
            os.close(fd)
            os.remove(probe)
        except OSError as e:
            raise ValueError(f"{where}: cannot write in {path} "
                             f"({e.strerror or type(e).__name__})") from None
    return workdir


def _check_remote_workdir(workdir: str, where: str) -> None:
    probe = files.join(workdir, f".write-check-{os.getpid()}-{time.monotonic_ns()}")
    try:
        files.write_text(probe, "probe\n")
        if files.read_text(probe) != "probe\n":
            raise OSError("a probe object written there read back different")
        files.remove(probe)
    except ImportError as e:
        raise ValueError(f"{where}: {files.missing_client(workdir, e)}") from None
    except Exception as e:  # noqa: BLE001 - any failure of the store: credentials, bucket, network
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ValueError(f"{where}: cannot write there ({type(e).__name__}: {reason})") from None


def _os_reason(error: OSError) -> str:
    reason = error.strerror or type(error).__name__
    return f"{reason}: {error.filename}" if error.filename else reason


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
            usage_error(prog, _flag_error_message(e))

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
    return _load_config_and_module(spec)[0]


def _load_config_and_module(spec: str) -> tuple[ml_collections.ConfigDict, Any]:
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


_ANSI_CODE = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
_BAR_GRAPHIC = re.compile(r"\|[^|]*\|")


class PlainLines(io.TextIOBase):
    """A text stream that passes only whole, plain lines to ``stream`` (a log file or pipe).

    Progress bars (tqdm) redraw one line with carriage returns and move the cursor with escape
    codes; in a log those become one ever-growing line onto which the next error is glued. Here a
    carriage-return update is held back and written as its own line (bar graphic removed) at most
    once per ``interval_s`` for each bar (keyed by its label, so the first update of a label is
    shown at once); escape codes and the newlines that move the cursor between nested bars are dropped;
    any other text is passed through at once, starting on a fresh line.

    Args:
      stream: the underlying text stream.
      interval_s: seconds between two lines of the same bar.
      clock: the time source (monotonic seconds).
    """

    def __init__(self, stream, interval_s: float = 30.0, clock: Callable[[], float] = time.monotonic):
        super().__init__()
        self.stream, self.interval_s, self._clock = stream, interval_s, clock
        self._lock = threading.RLock()
        self._in_status = False  # the last write was a carriage-return update
        self._status, self._shown = "", False
        self._after_status = False  # a bar was drawn since the last line of other text
        self._open = False  # the underlying stream's current line has text but no newline yet
        self._last: dict[str, float] = {}

    # io attributes that callers look for on sys.stdout / sys.stderr
    encoding = property(lambda self: getattr(self.stream, "encoding", "utf-8"))
    errors = property(lambda self: getattr(self.stream, "errors", "strict"))
    buffer = property(lambda self: self.stream.buffer)

    def writable(self) -> bool:
        return True

    def isatty(self) -> bool:
        return False

    def fileno(self) -> int:
        return self.stream.fileno()

    def flush(self) -> None:
        with self._lock:
            self.stream.flush()

    def write(self, text: str) -> int:
        with self._lock:
            clean = _ANSI_CODE.sub("", text)
            if self._in_status and not clean.startswith("\r"):
                self._in_status = False  # that update was shown or skipped at its write
            if clean and not clean.strip("\n") and self._after_status and not self._open:
                return len(text)  # a bar moving the cursor down to its row: no blank line here
            for token in re.split(r"(\r|\n)", clean):
                if token == "\r":
                    if self._in_status and self._status:  # an update made within this write
                        self._show_status()
                    self._in_status, self._status, self._shown = True, "", False
                    self._after_status = True
                elif token == "\n" and self._in_status:
                    self._show_status()
                    self._in_status = False
                elif self._in_status:
                    self._status += token
                elif token:
                    self.stream.write(token)
                    self._open = not token.endswith("\n")
                    self._after_status = self._after_status and not token.strip()
            if self._in_status:  # one update per write: show it if its bar's interval is up
                self._show_status()
                self._status = ""  # considered once, at the write that made it
        return len(text)

    def _show_status(self) -> None:
        """Writes the current bar state as a line, unless already written or the same bar
        (keyed by its label) had a line less than ``interval_s`` ago."""
        line = " ".join(_BAR_GRAPHIC.sub(" ", self._status).split())
        if not line or self._shown:
            return
        key = line.split(":", 1)[0] if ":" in line else ""
        now = self._clock()
        if now - self._last.get(key, -math.inf) < self.interval_s:
            return
        self._last[key], self._shown = now, True
        self.stream.write(("\n" if self._open else "") + line + "\n")
        self._open = False
        self.stream.flush()


def plain_output_if_not_tty(interval_s: float = 30.0) -> None:
    """Wraps ``sys.stdout`` and ``sys.stderr`` in :class:`PlainLines` where they are not a
    terminal (a log file, a pipe to the main job), so that progress bars become periodic plain
    lines there; a terminal keeps its live bars."""
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        if stream is None or isinstance(stream, PlainLines):
            continue
        try:
            tty = stream.isatty()
        except (AttributeError, ValueError):
            tty = False
        if not tty:
            setattr(sys, name, PlainLines(stream, interval_s))


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


def app_main(name: str, run: Callable[[ml_collections.ConfigDict, str], report.Section]) -> None:
    """``python -m experiments.<name> --config=experiments/configs/<name>.py:tiny --workdir=DIR
    [--config.<field>=value ...]``: runs one experiment and writes ``DIR/<name>/report.md``.

    Bad input (unknown config field, unknown variant, a value of the wrong type, an unknown flag,
    a missing data file, a workdir that is a file or cannot be created or written, a workdir that
    another process is using) prints one line ``error: <name>: ...`` to stderr and exits with
    status 2, before any JAX work. Ctrl-C, at any moment, prints one line and exits with status
    130 (a checkpoint being saved is committed first). ``--helpshort`` lists the flags, the
    config's variants and its fields with their defaults, and exits 0. Where stdout/stderr are not
    a terminal, progress bars print plain periodic lines (:class:`PlainLines`).
    """
    end_start_up()
    try:
        _app_main(name, run)
    except KeyboardInterrupt as e:
        interrupted(name, e)


def end_start_up() -> None:
    """From here on Ctrl-C raises ``KeyboardInterrupt`` again (``experiments/__init__.py`` makes
    it leave at once while the entry module's imports run); the entry points catch it and leave
    with :func:`interrupted`."""
    import signal

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, signal.default_int_handler)


def _app_main(name: str, run: Callable[[ml_collections.ConfigDict, str], report.Section]) -> None:
    from absl import app, flags, logging
    from ml_collections import config_flags

    from core.checkpoint import RunDirectoryInUseError
    from core.data.download import DataUnavailableError

    plain_output_if_not_tty()
    default_spec = f"{default_config_path(name)}:tiny"
    # config_flags builds one flag per --config.<field> while parsing and fails on an unknown field
    # with a traceback (when --config is absent, already at definition), so check fields first.
    try:
        argv = flags.FLAGS.read_flags_from_files(sys.argv, force_gnu=False)
        if not any(a in HELP_FLAGS for a in argv[1:]):
            check_config_args(argv, default_spec)
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

    def config_listing(argv: Sequence[str]) -> str:
        spec = _config_args(argv, "config")[0] or default_spec
        config, module = _load_config_and_module(spec)
        path = spec.split(":", 1)[0]
        return config_help(config, variants_of(module), config.get("variant", "tiny"),
                           f"--config={path}:VARIANT[,field=value,...]",
                           "--config.FIELD=VALUE", getattr(module, "FIELD_HELP", None))

    def main(argv):
        if len(argv) > 1:
            usage_error(name, f"unexpected arguments: {argv[1:]} (flags are --name=value)")
        try:
            cfg_lib.validate_module_config(  # every field, after all overrides, before any work
                config_flag.value, importlib.import_module(f"experiments.configs.{name}"),
                config_flags.get_config_filename(flags.FLAGS["config"]))
            workdir = check_workdir(workdir_flag.value, [name])
        except ValueError as e:
            usage_error(name, str(e))
        logging.set_verbosity(logging.WARNING)  # orbax logs every save at INFO
        from core import sharding

        sharding.initialize_distributed(multihost.value)
        try:
            with lock_workdir(files.join(workdir, name)):
                section = run(config_flag.value, workdir)
        except (ValueError, FileNotFoundError, RunDirectoryInUseError, DataUnavailableError) as e:
            # bad input or a data set that cannot be downloaded: one clear line, no traceback
            message = (str(e).strip().splitlines() or [type(e).__name__])[0]
            if message.startswith(f"{name}: "):  # do not repeat the experiment's name
                message = message[len(name) + 2:]
            print(f"error: {name}: {message}", file=sys.stderr)
            return 2
        # <workdir>/<name>/report.md, so runs of several experiments into one workdir coexist;
        # the section is kept for the main job's report (experiments.main)
        section.variant = config_flag.value.get("variant", "")
        path = save_experiment_report(workdir, name, section)
        print(f"report: {files.display(path)}", file=sys.stderr)
        return 0

    app.run(main, flags_parser=parse_flags_or_exit(name, config_listing))


SECTION_FILE = "section.json"


def save_experiment_report(workdir: str, name: str, section: report.Section) -> str:
    """Writes experiment ``name``'s ``<workdir>/<name>/report.md`` (its section alone, under a
    notice if ``section.variant`` judges no claim) and keeps the section in
    ``<workdir>/<name>/section.json``, from which the main job rebuilds ``<workdir>/report.md``.

    Returns:
      The path of ``report.md``.
    """
    variant = cfg_lib.parse_arg(section.variant)[0] if section.variant else ""
    report.save_section(files.join(workdir, name, SECTION_FILE), section)
    return report.write_report(
        files.join(workdir, name, "report.md"), f"Report: {name} ({section.variant or 'variant not recorded'})",
        [section], no_verdict=variant if variant in cfg_lib.NO_VERDICT_VARIANTS else None)


def default_config_path(name: str) -> str:
    """The config file of experiment ``name``: ``experiments/configs/<name>.py`` when run from the
    repository root (as the docs write it), else that file inside the installed package, so that
    an entry point started from another folder still finds its default config."""
    relative = f"experiments/configs/{name}.py"
    if os.path.isfile(relative):
        return relative
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "configs", f"{name}.py")


def lock_workdir(directory: str):
    """A context holding ``core.checkpoint.run_dir_lock(directory)`` on the first JAX process and
    doing nothing on the others (in a multi-host run every host writes into one shared workdir).

    Raises:
      core.checkpoint.RunDirectoryInUseError: another process holds the lock.
    """
    import contextlib

    import jax

    from core.checkpoint import run_dir_lock

    return run_dir_lock(directory) if jax.process_index() == 0 else contextlib.nullcontext()
