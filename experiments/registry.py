"""The experiments, discovered from ``experiments/configs/``, in the order the main job runs them.

An experiment ``x`` is a config module ``experiments/configs/x.py`` (``get_config(arg)``, ``Config``)
with a module ``experiments/x.py`` (``run(config, workdir) -> core.report.Section``); nothing else
lists it. A config module that reads another experiment's outputs names it in ``REQUIRES`` (e.g.
``sparse_decode`` decodes with the model ``lm`` trains); the main job runs requirements first and
otherwise goes in alphabetical order. The main job (``all``) runs every experiment whose config
module does not set ``MAIN_JOB = False``; those run when named.
"""

from __future__ import annotations

import importlib
import importlib.util
import pkgutil

from experiments import configs as _configs


def _discover() -> tuple[str, ...]:
    names = sorted(m.name for m in pkgutil.iter_modules(_configs.__path__)
                   if not m.name.startswith("_"))
    requires = {n: tuple(getattr(importlib.import_module(f"experiments.configs.{n}"),
                                 "REQUIRES", ())) for n in names}
    order: list[str] = []

    def visit(name: str, path: tuple[str, ...]) -> None:
        if name in order:
            return
        if name in path:
            raise ValueError(f"experiments/configs: cyclic REQUIRES {' -> '.join(path + (name,))}")
        for req in requires.get(name, ()):
            if req not in requires:
                raise ValueError(f"experiments/configs/{name}.py: REQUIRES names {req!r}, which "
                                 f"has no config; known: {', '.join(names)}")
            visit(req, path + (name,))
        order.append(name)

    for n in names:
        visit(n, ())
    return tuple(order)


EXPERIMENTS: tuple[str, ...] = _discover()


def available() -> tuple[str, ...]:
    """Experiments whose module and config are both present in this checkout."""
    return tuple(n for n in EXPERIMENTS if importlib.util.find_spec(f"experiments.{n}") is not None)


def in_main_job(name: str) -> bool:
    """Whether ``all`` includes experiment ``name`` (its config module's ``MAIN_JOB``, default
    True)."""
    return bool(getattr(importlib.import_module(f"experiments.configs.{name}"), "MAIN_JOB", True))


def resolve(names: str | None) -> tuple[str, ...]:
    """Parses a comma-separated list (``None``/empty/``all`` = every available experiment of the
    main job, :func:`in_main_job`; any available experiment can be named).

    Returns:
      The names, in the order given.

    Raises:
      ValueError: an unknown or unavailable name; the message lists the known ones.
    """
    avail = available()
    if not names or names == "all":
        return tuple(n for n in avail if in_main_job(n))
    out = tuple(n.strip() for n in names.split(",") if n.strip())
    for n in out:
        if n not in avail:
            raise ValueError(f"unknown experiment {n!r}; known experiments: {', '.join(avail)}")
    return out


def load(name: str):
    """(module, config module) of experiment ``name``."""
    return (importlib.import_module(f"experiments.{name}"),
            importlib.import_module(f"experiments.configs.{name}"))
