"""Run configurations: ml_collections ``ConfigDict`` with named variants.

Every experiment config module defines ``get_config(arg: str | None = None)`` in the style of
big_vision: ``arg`` names a variant (``tiny`` for a CPU in minutes, ``paper`` for an accelerator)
optionally followed by ``,key=value`` overrides, e.g. ``tiny,steps=50``. Command-line overrides
``--config.<field>=...`` are applied by absl's ``config_flags`` on top of that.
"""

from __future__ import annotations

import ast
from collections.abc import Callable, Mapping
from typing import Any

import ml_collections

VARIANTS = ("tiny", "paper")


def parse_arg(arg: str | None, default_variant: str = "tiny") -> tuple[str, dict[str, Any]]:
    """Splits ``"variant,key=value,..."`` into the variant name and a dict of overrides.

    Values are parsed as Python literals when possible (``steps=10`` -> int, ``ns=(2, 4)`` ->
    tuple; commas inside brackets do not split), else kept as strings.

    Raises:
      ValueError: an override without ``=``.
    """
    if not arg:
        return default_variant, {}
    head, *rest = [p.strip() for p in _split_top_level(arg) if p.strip()]
    overrides: dict[str, Any] = {}
    for item in rest:
        if "=" not in item:
            raise ValueError(f"config override {item!r} in {arg!r}: expected key=value")
        key, value = item.split("=", 1)
        try:
            overrides[key] = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            overrides[key] = value
    return head, overrides


def _split_top_level(text: str) -> list[str]:
    """Splits on commas outside brackets, so ``"tiny,ns=(2, 4),b=1"`` keeps the tuple whole."""
    parts, depth, current = [], 0, []
    for ch in text:
        depth += ch in "([{"
        depth -= ch in ")]}"
        if ch == "," and depth == 0:
            parts.append("".join(current))
            current = []
        else:
            current.append(ch)
    parts.append("".join(current))
    return parts


def build(
    arg: str | None,
    base: Callable[[], ml_collections.ConfigDict],
    variants: Mapping[str, Mapping[str, Any]],
) -> ml_collections.ConfigDict:
    """Builds a config: ``base()``, then the named variant's fields, then ``key=value`` overrides.

    Args:
      arg: ``"variant[,key=value...]"``; ``None`` means ``tiny``.
      base: returns the defaults shared by all variants.
      variants: variant name -> field updates (dotted keys reach nested dicts).

    Returns:
      The config; ``config.variant`` records the variant name. Unlocked fields cannot be added
      later (the dict is locked), so a misspelt ``--config.<field>`` fails loudly.

    Raises:
      ValueError: unknown variant or unknown field.
    """
    name, overrides = parse_arg(arg)
    if name not in variants:
        raise ValueError(f"unknown config variant {name!r}; expected one of {sorted(variants)}")
    config = base()
    config.variant = name
    for key, value in {**variants[name], **overrides}.items():
        _set_dotted(config, key, value)
    config.lock()
    return config


def _set_dotted(config: ml_collections.ConfigDict, key: str, value: Any) -> None:
    *parents, leaf = key.split(".")
    node = config
    for p in parents:
        if p not in node:
            raise ValueError(f"config has no field {key!r}")
        node = node[p]
    if leaf not in node:
        raise ValueError(f"config has no field {key!r}; known fields: {sorted(node.keys())}")
    current = node[leaf]
    if isinstance(current, tuple) and isinstance(value, list):
        value = tuple(value)
    node[leaf] = value


def to_dict(config: ml_collections.ConfigDict) -> dict[str, Any]:
    """A JSON-serialisable plain dict of ``config`` (tuples become lists)."""
    return config.to_dict()
