"""What ties the experiments together: the per-experiment absl entry point (:func:`app_main`),
each experiment's output folder ``<workdir>/<name>``, its report and the section kept for the
main job's report, and the default config file of an experiment. The plumbing they use is in
``core``: flags and configs (:mod:`core.cli`), the workdir's checks and lock
(:mod:`core.workdir`), plain output for logs (:mod:`core.terminal`)."""

from __future__ import annotations

import importlib
import os
import sys
import threading
from collections.abc import Callable, Sequence

import ml_collections

from core import cli, files, report, terminal
from core import config as cfg_lib
from core import workdir as workdir_lib


def experiment_dir(workdir: str, name: str) -> str:
    """``<workdir>/<name>``, created if missing (``workdir`` a local path or a URL such as
    ``gs://bucket/run``; the result is the same kind)."""
    path = files.join(workdir, name)
    files.makedirs(path)
    return path


def app_main(name: str, run: Callable[[ml_collections.ConfigDict, str], report.Section]) -> None:
    """``python -m experiments.<name> --config=experiments/configs/<name>.py:tiny --workdir=DIR
    [--config.<field>=value ...]``: runs one experiment and writes ``DIR/<name>/report.md``.

    Bad input (unknown config field, unknown variant, a value of the wrong type, an unknown flag,
    a missing data file, a workdir that is a file or cannot be created or written, a workdir that
    another process is using) prints one line ``error: <name>: ...`` to stderr and exits with
    status 2, before any JAX work. Ctrl-C, at any moment, prints one line and exits with status
    130 (a checkpoint being saved is committed first). ``--helpshort`` lists the flags, the
    config's variants and its fields with their defaults, and exits 0. Where stdout/stderr are not
    a terminal, progress bars print plain periodic lines (:class:`core.terminal.PlainLines`).
    """
    end_start_up()
    try:
        _app_main(name, run)
    except KeyboardInterrupt as e:
        cli.interrupted(name, e)


def end_start_up() -> None:
    """From here on Ctrl-C raises ``KeyboardInterrupt`` again (``experiments/__init__.py`` makes
    it leave at once while the entry module's imports run); the entry points catch it and leave
    with :func:`core.cli.interrupted`."""
    import signal

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, signal.default_int_handler)


def _app_main(name: str, run: Callable[[ml_collections.ConfigDict, str], report.Section]) -> None:
    from absl import app, flags, logging
    from ml_collections import config_flags

    from core.checkpoint import RunDirectoryInUseError
    from core.data.download import DataUnavailableError

    terminal.plain_output_if_not_tty()
    default_spec = f"{default_config_path(name)}:tiny"
    # config_flags builds one flag per --config.<field> while parsing and fails on an unknown field
    # with a traceback (when --config is absent, already at definition), so check fields first.
    try:
        argv = flags.FLAGS.read_flags_from_files(sys.argv, force_gnu=False)
        if not any(a in cli.HELP_FLAGS for a in argv[1:]):
            cli.check_config_args(argv, default_spec)
    except (ValueError, FileNotFoundError, flags.Error) as e:
        cli.usage_error(name, str(e))
    try:
        config_flag = config_flags.DEFINE_config_file(
            "config", default_spec, "experiment config (file:variant)", lock_config=True)
    except (flags.Error, AttributeError, KeyError, TypeError, ValueError) as e:
        cli.usage_error(name, cli.flag_error_message(e))
    workdir_flag = flags.DEFINE_string("workdir", "workdir", "output directory")
    multihost = flags.DEFINE_bool("multihost", False, "call jax.distributed.initialize() first")
    # --helpshort lists the key flags of the main module (absl names it by sys.argv[0]); these are
    # defined here, in a module the main module imports.
    for holder in (config_flag, workdir_flag, multihost):
        flags.FLAGS.register_key_flag_for_module(sys.argv[0], flags.FLAGS[holder.name])

    def config_listing(argv: Sequence[str]) -> str:
        spec = cli.config_args(argv, "config")[0] or default_spec
        config, module = cli.load_config_and_module(spec)
        path = spec.split(":", 1)[0]
        return cli.config_help(config, cli.variants_of(module), config.get("variant", "tiny"),
                               f"--config={path}:VARIANT[,field=value,...]",
                               "--config.FIELD=VALUE", getattr(module, "FIELD_HELP", None))

    def main(argv):
        if len(argv) > 1:
            cli.usage_error(name, f"unexpected arguments: {argv[1:]} (flags are --name=value)")
        try:
            cfg_lib.validate_module_config(  # every field, after all overrides, before any work
                config_flag.value, importlib.import_module(f"experiments.configs.{name}"),
                config_flags.get_config_filename(flags.FLAGS["config"]))
            workdir = workdir_lib.check_workdir(workdir_flag.value, [name])
        except ValueError as e:
            cli.usage_error(name, str(e))
        logging.set_verbosity(logging.WARNING)  # orbax logs every save at INFO
        from core import sharding

        sharding.initialize_distributed(multihost.value)
        try:
            with workdir_lib.lock_workdir(files.join(workdir, name)):
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

    app.run(main, flags_parser=cli.parse_flags_or_exit(name, config_listing))


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
