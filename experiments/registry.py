"""The registered experiments, in the order the main job runs them.

Each name ``x`` has a module ``experiments.x`` with ``run(config, workdir) -> core.report.Section``
and a config module ``experiments/configs/x.py`` with ``get_config(arg)``. ``lm`` runs first: the
kv-cache experiments decode with its trained model.
"""

from __future__ import annotations

import importlib.util

EXPERIMENTS: tuple[str, ...] = (
    "lm",
    "diffusion_lm",
    "sparse_decode",
    "kv_quant",
    "rl_scaling",
    "forecasting",
    "spf",
    "judge_btl",
    "benchmark_game",
)


def available() -> tuple[str, ...]:
    """Registered experiments whose module and config are present in this checkout."""
    return tuple(
        n for n in EXPERIMENTS
        if importlib.util.find_spec(f"experiments.{n}") is not None
        and importlib.util.find_spec(f"experiments.configs.{n}") is not None
    )


def resolve(names: str | None) -> tuple[str, ...]:
    """Parses a comma-separated list (``None``/empty/``all`` = every available experiment).

    Raises:
      ValueError: an unknown or unavailable name; the message lists the known ones.
    """
    avail = available()
    if not names or names == "all":
        return avail
    out = tuple(n.strip() for n in names.split(",") if n.strip())
    for n in out:
        if n not in avail:
            raise ValueError(f"unknown experiment {n!r}; known experiments: {', '.join(avail)}")
    return out


def load(name: str):
    """(module, config module) of experiment ``name``."""
    return (importlib.import_module(f"experiments.{name}"),
            importlib.import_module(f"experiments.configs.{name}"))
