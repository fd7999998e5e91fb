"""Run configurations: ml_collections ``ConfigDict`` with named variants, checked against a schema.

Every experiment config module defines ``Config``, a frozen dataclass that is the config's one
schema: each field's default, type and bounds (nested dataclasses for groups of fields), and in
``__post_init__`` the checks of fields that must fit together (often by building the library's own
settings, e.g. ``models.transformer.TransformerConfig``, whose checks then apply). Its module also
defines ``get_config(arg: str | None = None)`` in the style of big_vision: ``arg`` names a variant
(``tiny`` for a CPU in minutes, ``paper`` for an accelerator) optionally followed by
``,key=value`` overrides, e.g. ``tiny,steps=50``. Command-line overrides ``--config.<field>=...``
are applied by absl's ``config_flags`` on top of that.

The entry points call :func:`validate_module_config` once, after every override and before any
work: every field is checked against its type (:func:`refusal`), then ``Config`` is built from the
fields, so bad input is one line naming the field.

The types a field may have: ``int``, ``float`` (finite; an ``int`` value passes), ``bool``, ``str``,
``Literal[...]`` (choices), ``tuple[X, ...]`` (at least one item), ``tuple[X, Y]``, ``X | Y``, and
``Annotated[X, ...]`` with :class:`Range` (bounds of a number), :class:`Items` (length of a tuple)
or :class:`Rule` (any other test, stated in words).
"""

from __future__ import annotations

import ast
import dataclasses
import difflib
import math
import numbers
import os
import re
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from typing import Annotated, Any, Literal

import ml_collections

VARIANTS = ("tiny", "paper")
# Variants that only exercise the code paths at toy sizes: their numbers are meaningless, and a
# report of such a run judges no paper claim.
NO_VERDICT_VARIANTS = ("smoke",)


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
    """Splits on commas outside brackets and quotes, so ``"tiny,ns=(2, 4),b=1"`` keeps the tuple
    whole and ``"tiny,lm_config='smoke,steps=2'"`` the string."""
    parts, depth, current, quote = [], 0, [], ""
    for ch in text:
        if quote:
            quote = "" if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        else:
            depth += ch in "([{"
            depth -= ch in ")]}"
        if ch == "," and depth == 0 and not quote:
            parts.append("".join(current))
            current = []
        else:
            current.append(ch)
    parts.append("".join(current))
    return parts


def build(arg: str | None, schema: type,
          variants: Mapping[str, Mapping[str, Any]]) -> ml_collections.ConfigDict:
    """Builds a config: the defaults of ``schema``, then the named variant's fields, then
    ``key=value`` overrides.

    Args:
      arg: ``"variant[,key=value...]"``; ``None`` means ``tiny``.
      schema: the experiment's ``Config`` dataclass, whose field defaults are those shared by all
        variants (:func:`defaults`).
      variants: variant name -> field updates (dotted keys reach nested dicts).

    Returns:
      The config; ``config.variant`` records the variant name. Unlocked fields cannot be added
      later (the dict is locked), so a misspelt ``--config.<field>`` fails loudly.

    Raises:
      ValueError: unknown variant, unknown field, or a value whose type differs from the field's
        default (``steps=abc``). Ranges and cross-field constraints are checked later, once every
        override is in, by :func:`validate`.
    """
    name, overrides = parse_arg(arg)
    if name not in variants:
        raise ValueError(f"unknown config variant {name!r}{_did_you_mean(name, variants)}; "
                         f"expected one of {sorted(variants)}")
    config = ml_collections.ConfigDict(defaults(schema))
    config.variant = name
    for key, value in {**variants[name], **overrides}.items():
        _set_dotted(config, key, value)
    config.lock()
    return config


def field_paths(config: ml_collections.ConfigDict) -> list[str]:
    """Every dotted field path of ``config``: nested dicts and their leaves (``"model"``,
    ``"model.d_model"``, ...), in insertion order."""
    paths = []
    for key, value in config.items():
        paths.append(key)
        if isinstance(value, ml_collections.ConfigDict):
            paths += [f"{key}.{sub}" for sub in field_paths(value)]
    return paths


def check_field(config: ml_collections.ConfigDict, key: str) -> None:
    """Checks that the dotted field path ``key`` (e.g. ``"model.d_model"``) exists in ``config``.

    Raises:
      ValueError: no such field; the message names ``key`` and the closest existing field paths
        (by ``difflib`` similarity), or the fields at the deepest level that exists.
    """
    node, walked = config, []
    for part in key.split("."):
        if not isinstance(node, ml_collections.ConfigDict) or part not in node:
            # ancestors of ``key`` are no suggestion: they exist, their child does not
            known = [p for p in field_paths(config) if not key.startswith(p + ".")]
            hint = _did_you_mean(key, known)
            if not hint and not isinstance(node, ml_collections.ConfigDict):
                hint = f"; {'.'.join(walked)!r} is a single value, not a group of fields"
            elif not hint:
                where = f" of {'.'.join(walked)!r}" if walked else ""
                hint = f"; fields{where}: {', '.join(sorted(node.keys()))}"
            raise ValueError(f"config has no field {key!r}{hint}")
        node = node[part]
        walked.append(part)


def _did_you_mean(name: str, candidates) -> str:
    close = difflib.get_close_matches(name, list(candidates), n=3, cutoff=0.6)
    return f" (did you mean {' or '.join(repr(c) for c in close)}?)" if close else ""


def _set_dotted(config: ml_collections.ConfigDict, key: str, value: Any) -> None:
    check_field(config, key)
    *parents, leaf = key.split(".")
    node = config
    for p in parents:
        node = node[p]
    current = node[leaf]
    if isinstance(current, tuple) and isinstance(value, list):
        value = tuple(value)
    try:
        node[leaf] = value
    except TypeError:  # ml_collections refuses a value of another type than the default's
        raise ValueError(f"config field {key!r} = {value!r}: expected "
                         f"{expected(type(current))}") from None


# ---------------------------------------------------------------------------------------------
# Schemas: what each field accepts, read from the type hints of the experiment's ``Config``
# dataclass, and the checks of its ``__post_init__``, applied once after every override.


@dataclasses.dataclass(frozen=True)
class Range:
    """Bounds of a number field: ``Annotated[int, Range(1)]`` is an integer >= 1; ``lo_open`` /
    ``hi_open`` exclude the bound itself."""

    lo: float | None = None
    hi: float | None = None
    lo_open: bool = False
    hi_open: bool = False

    def holds(self, value: Any) -> bool:
        if self.lo is not None and (value <= self.lo if self.lo_open else value < self.lo):
            return False
        return not (self.hi is not None and (value >= self.hi if self.hi_open else value > self.hi))

    def __str__(self) -> str:
        lo, hi = self.lo, self.hi
        if lo is not None and hi is not None:
            return (f" in {'(' if self.lo_open else '['}{lo:g}, {hi:g}"
                    f"{')' if self.hi_open else ']'}")
        if lo is not None:
            return f" {'>' if self.lo_open else '>='} {lo:g}"
        return "" if hi is None else f" {'<' if self.hi_open else '<='} {hi:g}"


@dataclasses.dataclass(frozen=True)
class Items:
    """The number of items of a ``tuple[X, ...]`` field (without it: at least one)."""

    lo: int = 1
    hi: int | None = None

    def __str__(self) -> str:
        plural = "s" if self.lo != 1 else ""
        if self.hi == self.lo:
            return f"{self.lo} item{plural}"
        return f">= {self.lo} item{plural}" if self.hi is None else f"{self.lo} to {self.hi} items"


@dataclasses.dataclass(frozen=True)
class Rule:
    """A test that a field's type cannot state: ``Annotated[int, Rule(lambda v: v % 2,
    "a positive odd integer")]``.

    Attributes:
      test: ``value -> bool``, run on values of the annotated type; a ``ValueError`` it raises is
        a refusal whose message's first line says why; any other exception is a refusal.
      expected: the accepted values in words, used in error messages instead of the type's.
    """

    test: Callable[[Any], bool]
    expected: str

    def passes(self, value: Any) -> bool:
        try:
            return bool(self.test(value))
        except ValueError:
            raise
        except Exception:  # noqa: BLE001 - any other failure of the test is a refusal
            return False


Count = Annotated[int, Range(1)]
NonNegInt = Annotated[int, Range(0)]
Positive = Annotated[float, Range(0, lo_open=True)]
NonNegative = Annotated[float, Range(0)]
Fraction = Annotated[float, Range(0, 1)]
OpenFraction = Annotated[float, Range(0, 1, lo_open=True, hi_open=True)]
NonEmpty = Annotated[str, Rule(lambda v: bool(v.strip()), "a non-empty string")]
# A file path (or comma-separated paths), or "" for the experiment's default data; existence is
# checked when it is read.
_PATH = " (a string without surrounding blanks) or '' for the default"
Path = Annotated[str, Rule(lambda v: v == v.strip() and "\n" not in v, "a file path" + _PATH)]
Paths = Annotated[str, Rule(Path.__metadata__[0].test, "comma-separated file paths" + _PATH)]


def datasets(*names: str, several: bool = False) -> Any:
    """The type of a field naming ``""`` (none) or one of the downloadable data sets ``names``
    (keys of :data:`core.data.download.DATASETS`, any case); with ``several``, comma-separated."""
    allowed = {n.lower() for n in names}

    def test(value: str) -> bool:
        parts = [p.strip().lower() for p in value.split(",")] if value.strip() else []
        return (several or len(parts) <= 1) and all(p in allowed for p in parts)

    what = "comma-separated names" if several else "a name"
    return Annotated[str, Rule(test, f"{what} of {', '.join(names)} or '' for none")]


def config_variant(module: Any) -> Any:
    """The type of a field naming the config of another experiment whose output this one reads:
    ``""`` (its default variant) or an argument of ``module.get_config`` (``"smoke"``,
    ``"tiny,steps=10"``) whose config ``module.Config`` accepts."""
    name = module.__name__.rsplit(".", 1)[-1]
    variants = ", ".join(repr(v) for v in getattr(module, "VARIANTS", VARIANTS))

    def test(value: str) -> bool:
        if value:
            validate_module_config(module.get_config(value), module)
        return True

    return Annotated[str, Rule(test, f"'' or a valid variant of the {name} config ({variants}, "
                                     "optionally followed by ,field=value overrides)")]


def _accepts(tp: Any, value: Any, min_items: int = 1) -> bool:
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is Annotated:
        items = [m for m in args[1:] if isinstance(m, Items)]
        if not _accepts(args[0], value, min_items=0 if items else 1):
            return False
        for mark in args[1:]:
            if isinstance(mark, Range) and not mark.holds(value):
                return False
            if isinstance(mark, Items) and not Range(mark.lo, mark.hi).holds(len(value)):
                return False
            if isinstance(mark, Rule) and not mark.passes(value):
                return False
        return True
    if origin is Literal:
        return any(type(value) is type(c) and value == c for c in args)
    if origin in (typing.Union, types.UnionType):
        return any(_accepts(a, value) for a in args)
    if origin is tuple:
        if not isinstance(value, tuple | list):
            return False
        if len(args) == 2 and args[1] is Ellipsis:
            return len(value) >= min_items and all(_accepts(args[0], v) for v in value)
        return len(value) == len(args) and all(_accepts(a, v) for a, v in zip(args, value))
    if tp in (int, float):  # not bool; a float is finite
        return (isinstance(value, numbers.Integral if tp is int else numbers.Real)
                and not isinstance(value, bool) and math.isfinite(value))
    return tp is Any or isinstance(value, tp)


_WORDS = {int: "an integer", float: "a finite number", bool: "True or False", str: "a string",
          tuple: "a tuple"}


def expected(tp: Any) -> str:
    """What a field of type ``tp`` accepts, in words (``"an integer >= 1"``)."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is Annotated:
        rules = [m for m in args[1:] if isinstance(m, Rule)]
        if rules:
            return rules[0].expected
        items = [m for m in args[1:] if isinstance(m, Items)]
        if items:
            return f"a tuple of {items[0]}, each {expected(typing.get_args(args[0])[0])}"
        return expected(args[0]) + "".join(str(m) for m in args[1:] if isinstance(m, Range))
    if origin is Literal:
        return "one of " + ", ".join(repr(c) for c in args)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(expected(a) for a in args)
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            return f"a tuple of {Items()}, each {expected(args[0])}"
        if len(set(args)) == 1:
            return f"a tuple of {Items(len(args), len(args))}, each {expected(args[0])}"
        return f"a tuple ({', '.join(expected(a) for a in args)})"
    return _WORDS.get(tp, getattr(tp, "__name__", str(tp)))


def refusal(tp: Any, value: Any) -> str | None:
    """``None`` if ``value`` is of type ``tp``, else what was expected (:func:`expected`, with
    the reason a :class:`Rule` gave, e.g. for :func:`config_variant`)."""
    try:
        return None if _accepts(tp, value) else expected(tp)
    except ValueError as e:
        reason = (str(e).strip().splitlines() or [""])[0]
        return f"{expected(tp)} ({reason})" if reason else expected(tp)


class FieldError(ValueError):
    """Settings that do not fit together (or a value its type cannot refuse), raised by a
    schema's ``__post_init__``: ``FieldError("expected omega_min <= omega_max", omega_min=2.0,
    omega_max=1.0)``; :func:`validate` names the fields by their paths in the config.

    Args:
      reason: what was expected, in words.
      **fields: the refused fields (names relative to the dataclass that raises; dotted paths,
        e.g. ``**{"model.max_len": 64}``, for fields of its groups) and their values.
    """

    def __init__(self, reason: str, **fields: Any):
        self.reason, self.fields = reason, fields
        super().__init__(self.text())

    def text(self, prefix: str = "") -> str:
        named = [(prefix + k, v) for k, v in self.fields.items()]
        if len(named) == 1:
            return f"config field {named[0][0]!r} = {_shown(named[0][1])}: {self.reason}"
        shown = [f"{k}={_shown(v)}" for k, v in named]
        return f"config fields {', '.join(shown[:-1])} and {shown[-1]}: {self.reason}"


def _is_group(tp: Any) -> bool:  # a field of type tp is a group of fields
    return isinstance(tp, type) and dataclasses.is_dataclass(tp)


def defaults(schema: type) -> dict[str, Any]:
    """The default of every field of the dataclass ``schema``, groups as nested dicts (the
    ``ConfigDict`` that :func:`build` starts from)."""
    out = {}
    for f in dataclasses.fields(schema):
        value = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        out[f.name] = dataclasses.asdict(value) if dataclasses.is_dataclass(value) else value
    return out


def field_problems(schema: type, config: ml_collections.ConfigDict, prefix: str = "") -> list[str]:
    """What is wrong with each field of ``config`` alone (its type in the dataclass ``schema``,
    fields it lacks or does not know), one message each; ``[]`` when every field is of its type.
    ``prefix``: where ``config`` sits in the whole config (``"model."``)."""
    hints = typing.get_type_hints(schema, include_extras=True)
    names = [f.name for f in dataclasses.fields(schema) if f.init]
    problems = []
    for key, value in config.items():
        path = prefix + key
        if path == "variant":  # set by build()
            tp = NonEmpty
        elif key not in names:
            problems.append(f"config field {path!r} is not a field of this experiment's config")
            continue
        else:
            tp = hints[key]
        group = isinstance(value, ml_collections.ConfigDict)
        if _is_group(tp) and group:
            problems += field_problems(tp, value, path + ".")
        elif (why := f"a group of the fields {', '.join(defaults(tp))}" if _is_group(tp) else
              expected(tp) if group else refusal(tp, value)) is not None:
            problems.append(f"config field {path!r} = {_shown(value)}: expected {why}")
    missing = [prefix + n for n in names if n not in config]
    if missing:
        problems.append(f"config lacks the field(s) {', '.join(map(repr, missing))} that this "
                        "experiment needs")
    return problems


def _plain(value: Any) -> Any:
    return tuple(_plain(v) for v in value) if isinstance(value, tuple | list) else value


def _construct(schema: type, config: ml_collections.ConfigDict, prefix: str) -> Any:
    hints = typing.get_type_hints(schema, include_extras=True)
    values = {f.name: (_construct(hints[f.name], config[f.name], f"{prefix}{f.name}.")
                       if _is_group(hints[f.name]) else _plain(config[f.name]))
              for f in dataclasses.fields(schema) if f.init}
    try:
        return schema(**values)
    except FieldError as e:
        raise ValueError(e.text(prefix)) from None


def validate(config: ml_collections.ConfigDict, schema: type) -> Any:
    """Checks every field of ``config`` against its type in the dataclass ``schema``, then builds
    ``schema`` from the fields (groups first), so that its ``__post_init__`` checks apply.

    Args:
      config: a built config (after every override).
      schema: the experiment's ``Config``: one field for each of the config's fields (groups of
        fields are dataclasses; ``variant``, set by :func:`build`, must be a non-empty string).

    Returns:
      The ``schema`` instance.

    Raises:
      ValueError: one line naming every refused field, its value and what was expected
        (``config field 'steps' = 0: expected an integer >= 1``); a field the schema lacks or a
        schema field the config lacks (the config is not the one the schema was written for); or
        the first check of a ``__post_init__`` that fails (a :class:`FieldError` names the fields
        by their paths).
    """
    problems = field_problems(schema, config, "")
    if problems:
        raise ValueError("; ".join(problems))
    return _construct(schema, config, "")


def check_built(build: Callable[[], Any], fields: Mapping[str, tuple[str, Any]], what: str,
                derived: Mapping[str, Sequence[str]] | None = None) -> Any:
    """Builds a library's settings (e.g. ``models.transformer.TransformerConfig``) from config
    fields, so that the library's own checks (its ``__post_init__``) are the ones applied, and
    rewords a refusal with the config's field paths.

    Args:
      build: ``() -> object``; raises ``ValueError`` for settings the library refuses.
      fields: the library's name of each setting taken from the config -> (the config's field
        path, its value), e.g. ``{"num_heads": ("model.num_heads", 4)}``.
      what: the library's name for what is built, for the message (``"TransformerConfig"``).
      derived: quantities the library names that are no config field -> the library names of
        the fields they come from (``{"head_dim": ("d_model", "num_heads")}``).

    Returns:
      What ``build`` returned.

    Raises:
      ValueError: one line naming the config fields that the library's message names as
        ``name=...`` (all of ``fields`` when it names none), their values, and the library's
        reason (its message's first line).
    """
    try:
        return build()
    except ValueError as e:
        reason = (str(e).strip().splitlines() or [""])[0]
        named = [n for n in fields if re.search(rf"\b{re.escape(n)}\s*=", reason)]
        for quantity, sources in (derived or {}).items():
            if re.search(rf"\b{re.escape(quantity)}\s*=", reason):
                named += [n for n in sources if n in fields and n not in named]
        shown = list(dict.fromkeys(f"{fields[n][0]}={_shown(fields[n][1])}"
                                   for n in named or fields))  # several names, one field
        raise ValueError(f"config field{'s' if len(shown) > 1 else ''} {' and '.join(shown)}: "
                         f"expected values that {what} accepts ({reason})") from None


def get_field(config: ml_collections.ConfigDict, path: str) -> Any:
    """The value at the dotted field path ``path`` of ``config``."""
    node = config
    for part in path.split("."):
        node = node[part]
    return node


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def validate_module_config(config: ml_collections.ConfigDict, module: Any,
                           source: str | None = None, experiment: str | None = None) -> Any:
    """:func:`validate` with the ``Config`` schema of an experiment's config module.

    Args:
      config: the config to run, after every override.
      module: the experiment's config module (``experiments/configs/<name>.py``).
      source: the config file the config was loaded from (``path.py`` or ``path.py:arg``), if
        known. A file that is another experiment's config module (a different ``<other>.py``
        beside ``module``'s file) is refused with one line naming both experiments.
      experiment: a name to start the error message with (``"lm: config field ..."``).

    Returns:
      The ``Config`` instance.

    Raises:
      ValueError: see :func:`validate`; or ``source`` is another experiment's config.
    """
    own = os.path.splitext(os.path.basename(module.__file__))[0]
    lead = f"{experiment}: " if experiment else ""
    if source:
        source = source.split(":", 1)[0]  # "path.py:variant" -> "path.py"
        stem = os.path.splitext(os.path.basename(source))[0]
        folder = os.path.dirname(os.path.abspath(module.__file__))
        if stem != own and os.path.isfile(os.path.join(folder, stem + ".py")):
            raise ValueError(f"{lead}config file {source!r} is the config of experiment {stem!r}, "
                             f"not of {own!r}; expected "
                             f"{os.path.join(os.path.dirname(source), own + '.py')!r}")
    try:
        return validate(config, module.Config)
    except ValueError as e:
        raise ValueError(f"{lead}{e}") from None
