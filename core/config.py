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


def build(
    arg: str | None,
    schema: type | Callable[[], ml_collections.ConfigDict],
    variants: Mapping[str, Mapping[str, Any]],
) -> ml_collections.ConfigDict:
    """Builds a config: the defaults of ``schema``, then the named variant's fields, then
    ``key=value`` overrides.

    Args:
      arg: ``"variant[,key=value...]"``; ``None`` means ``tiny``.
      schema: the experiment's ``Config`` dataclass, whose field defaults are those shared by all
        variants (:func:`defaults`); or a function returning them as a ``ConfigDict``.
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
    config = (ml_collections.ConfigDict(defaults(schema)) if is_schema(schema) else schema())
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
                         f"{_TYPE_WORDS.get(type(current), type(current).__name__)}") from None


_TYPE_WORDS = {int: "an integer", float: "a number", str: "a string", bool: "True or False",
               tuple: "a tuple"}


def to_dict(config: ml_collections.ConfigDict) -> dict[str, Any]:
    """A JSON-serialisable plain dict of ``config`` (tuples become lists)."""
    return config.to_dict()


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
        except ValueError as e:
            raise _Refused((str(e).strip().splitlines() or [""])[0]) from None
        except Exception:  # noqa: BLE001 - any other failure of the test is a refusal
            return False

    def accepts(self, value: Any) -> bool:
        """Whether ``value`` passes ``test``."""
        try:
            return self.passes(value)
        except _Refused:
            return False

    def refusal(self, value: Any) -> str | None:
        """``None`` if ``value`` passes, else what was expected (with the reason it gave)."""
        try:
            return None if self.passes(value) else self.expected
        except _Refused as e:
            return f"{self.expected} ({e})" if str(e) else self.expected


class _Refused(Exception):
    """A :class:`Rule`'s test refused a value with a reason."""


Count = Annotated[int, Range(1)]
NonNegInt = Annotated[int, Range(0)]
Positive = Annotated[float, Range(0, lo_open=True)]
NonNegative = Annotated[float, Range(0)]
Fraction = Annotated[float, Range(0, 1)]
OpenFraction = Annotated[float, Range(0, 1, lo_open=True, hi_open=True)]
NonEmpty = Annotated[str, Rule(lambda v: bool(v.strip()), "a non-empty string")]
# A file path, or "" for the experiment's default data; existence is checked when it is read.
Path = Annotated[str, Rule(lambda v: v == v.strip() and "\n" not in v,
                           "a file path (a string without surrounding blanks) or '' for the "
                           "default")]
Paths = Annotated[str, Rule(lambda v: v == v.strip() and "\n" not in v,
                            "comma-separated file paths (a string without surrounding blanks) or "
                            "'' for the default")]


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


def _is_int(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _is_real(value: Any) -> bool:
    return (isinstance(value, numbers.Real) and not isinstance(value, bool)
            and math.isfinite(value))


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
    if tp is Any:
        return True
    return {int: _is_int, float: _is_real}.get(tp, lambda v: isinstance(v, tp))(value)


_WORDS = {int: "an integer", float: "a finite number", bool: "True or False", str: "a string"}


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
    the reason a :class:`Rule` gave, e.g. for :func:`variant_of`)."""
    try:
        return None if _accepts(tp, value) else expected(tp)
    except _Refused as e:
        return f"{expected(tp)} ({e})" if str(e) else expected(tp)


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


def is_schema(tp: Any) -> bool:
    """Whether a field of type ``tp`` is a group of fields (a dataclass)."""
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
        if is_schema(tp) and isinstance(value, ml_collections.ConfigDict):
            problems += field_problems(tp, value, path + ".")
        elif is_schema(tp) or isinstance(value, ml_collections.ConfigDict):
            what = f"a group of the fields {', '.join(defaults(tp))}" if is_schema(tp) else \
                expected(tp)
            problems.append(f"config field {path!r} = {_shown(value)}: expected {what}")
        elif (why := refusal(tp, value)) is not None:
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
                       if is_schema(hints[f.name]) else _plain(config[f.name]))
              for f in dataclasses.fields(schema) if f.init}
    try:
        return schema(**values)
    except FieldError as e:
        raise ValueError(e.text(prefix)) from None
    except ValueError as e:
        if not prefix:
            raise
        fields = {n: (prefix + n, v) for n, v in values.items()}
        raise _reworded(e, fields, schema.__name__) from None


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
        schema field the config lacks (the config is not the one the schema was written for); a
        warm-up longer than its training (:func:`check_warmup`); or the first check of a
        ``__post_init__`` that fails (a :class:`FieldError` names the fields by their paths).
    """
    problems = field_problems(schema, config, "")
    if problems:
        raise ValueError("; ".join(problems))
    check_warmup(config)
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
        raise _reworded(e, fields, what, derived) from None


def _reworded(error: ValueError, fields: Mapping[str, tuple[str, Any]], what: str,
              derived: Mapping[str, Sequence[str]] | None = None) -> ValueError:
    reason = (str(error).strip().splitlines() or [""])[0]
    named = [n for n in fields if re.search(rf"\b{re.escape(n)}\s*=", reason)]
    for quantity, sources in (derived or {}).items():
        if re.search(rf"\b{re.escape(quantity)}\s*=", reason):
            named += [n for n in sources if n in fields and n not in named]
    shown = list(dict.fromkeys(f"{fields[n][0]}={_shown(fields[n][1])}"
                               for n in named or fields))  # several names, one field
    return ValueError(f"config field{'s' if len(shown) > 1 else ''} {' and '.join(shown)}: "
                      f"expected values that {what} accepts ({reason})")


def get_field(config: ml_collections.ConfigDict, path: str) -> Any:
    """The value at the dotted field path ``path`` of ``config``."""
    node = config
    for part in path.split("."):
        node = node[part]
    return node


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


# Fields that bound a training run's steps, beside which a ``warmup_steps`` field is checked.
STEP_FIELDS = ("steps", "max_steps")


def check_warmup(config: ml_collections.ConfigDict, prefix: str = "") -> None:
    """A learning-rate warm-up must fit in the training it warms up: in every group of fields
    (the config itself and each nested group) that has ``warmup_steps`` and a step bound
    (:data:`STEP_FIELDS`), ``warmup_steps`` may not exceed it (a longer warm-up never reaches the
    configured learning rate, and its decay never starts). Applied by :func:`validate` to every
    experiment's config.

    Raises:
      ValueError: naming both fields and their values.
    """
    for key, value in config.items():
        if isinstance(value, ml_collections.ConfigDict):
            check_warmup(value, f"{prefix}{key}.")
    if "warmup_steps" not in config:
        return
    warmup = config["warmup_steps"]
    for bound in STEP_FIELDS:
        steps = config.get(bound)
        if _is_int(warmup) and _is_int(steps) and warmup > steps:
            raise ValueError(f"config fields {prefix}warmup_steps={warmup} and {prefix}{bound}="
                             f"{steps}: expected warmup_steps <= {bound} (the warm-up would "
                             "outlast training)")


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
        if not hasattr(module, "Config"):
            return _legacy_validate(config, module.RULES, getattr(module, "CROSS_CHECKS", ()))
        return validate(config, module.Config)
    except ValueError as e:
        raise ValueError(f"{lead}{e}") from None


# ---- legacy rule tables (removed once every config has a schema) ----

# experiment config module) and checked once, after every override, before any work.


def _range_text(lo, hi, lo_open: bool, hi_open: bool) -> str:
    if lo is not None and hi is not None:
        return f" in {'(' if lo_open else '['}{lo:g}, {hi:g}{')' if hi_open else ']'}"
    if lo is not None:
        return f" {'>' if lo_open else '>='} {lo:g}"
    if hi is not None:
        return f" {'<' if hi_open else '<='} {hi:g}"
    return ""


def _in_range(value, lo, hi, lo_open: bool, hi_open: bool) -> bool:
    if lo is not None and (value <= lo if lo_open else value < lo):
        return False
    return not (hi is not None and (value >= hi if hi_open else value > hi))


def integer(lo: int | None = None, hi: int | None = None) -> Rule:
    """An ``int`` (not ``bool``) in ``[lo, hi]`` (either bound optional)."""
    return Rule(lambda v: _is_int(v) and _in_range(v, lo, hi, False, False),
                "an integer" + _range_text(lo, hi, False, False))


def number(lo: float | None = None, hi: float | None = None, lo_open: bool = False,
           hi_open: bool = False) -> Rule:
    """A finite real (``int`` or ``float``, not ``bool``, not nan or inf) between ``lo`` and
    ``hi``; ``lo_open`` / ``hi_open`` exclude the bound itself."""
    return Rule(lambda v: _is_real(v) and _in_range(v, lo, hi, lo_open, hi_open),
                "a finite number" + _range_text(lo, hi, lo_open, hi_open))


def one_of(*choices: Any) -> Rule:
    """One of ``choices`` (compared by type and value: ``1`` does not match ``True`` or ``1.0``)."""
    if not choices:
        raise ValueError("one_of: expected at least one choice, got none")
    return Rule(lambda v: any(type(v) is type(c) and v == c for c in choices),
                "one of " + ", ".join(repr(c) for c in choices))


def boolean() -> Rule:
    """``True`` or ``False`` (not 0 / 1)."""
    return Rule(lambda v: isinstance(v, bool), "True or False")


def string(nonempty: bool = False) -> Rule:
    """A ``str``; with ``nonempty``, not empty or blank."""
    if nonempty:
        return Rule(lambda v: isinstance(v, str) and bool(v.strip()), "a non-empty string")
    return Rule(lambda v: isinstance(v, str), "a string")


def path_or_empty(several: bool = False) -> Rule:
    """A file path, or ``""`` for the experiment's default data; with ``several``, a
    comma-separated list of paths. Existence is checked by the experiment when it reads."""
    what = "comma-separated file paths" if several else "a file path"
    return Rule(lambda v: isinstance(v, str) and v == v.strip() and "\n" not in v,
                f"{what} (a string without surrounding blanks) or '' for the default")


def dataset_names(*names: str, several: bool = False) -> Rule:
    """``""`` (none) or one of the downloadable data sets ``names`` (keys of
    :data:`core.data.download.DATASETS`, any case); with ``several``, comma-separated names."""
    allowed = {n.lower() for n in names}

    def test(value: Any) -> bool:
        if not isinstance(value, str):
            return False
        parts = [p.strip().lower() for p in value.split(",")] if value.strip() else []
        return (several or len(parts) <= 1) and all(p in allowed for p in parts)

    what = "comma-separated names" if several else "a name"
    return Rule(test, f"{what} of {', '.join(names)} or '' for none")


def tuple_of(rule: Rule, min_len: int = 1, max_len: int | None = None) -> Rule:
    """A tuple (or list) of ``min_len`` to ``max_len`` items, each accepted by ``rule``."""
    if max_len == min_len:
        size = f"{min_len} item{'s' if min_len != 1 else ''}"
    elif max_len is None:
        size = f">= {min_len} item{'s' if min_len != 1 else ''}"
    else:
        size = f"{min_len} to {max_len} items"
    return Rule(lambda v: isinstance(v, tuple | list) and len(v) >= min_len
                and (max_len is None or len(v) <= max_len) and all(rule.accepts(x) for x in v),
                f"a tuple of {size}, each {rule.expected}")


def any_of(*rules: Rule) -> Rule:
    """A value that at least one of ``rules`` accepts."""
    return Rule(lambda v: any(r.accepts(v) for r in rules),
                " or ".join(r.expected for r in rules))


def claim_check() -> Rule:
    """A claim check string (grammar: :func:`core.report.parse_check`)."""

    def test(value: Any) -> bool:
        from core.report import parse_check

        parse_check(value)
        return True

    return Rule(lambda v: isinstance(v, str) and test(v),
                "a check '<metric> <op> <number>' or '<metric> <op> [<number> *] <metric> "
                "[+|- <number>]'")


# Rules of the ``claim`` group every experiment's config carries (``core.report.claim_config``);
# applied by :func:`validate` to any config that has the group.
CLAIM_RULES: dict[str, Rule] = {
    "claim.method": string(nonempty=True),
    "claim.statement": string(nonempty=True),
    "claim.checks": tuple_of(claim_check()),
    "claim.ours": string(nonempty=True),
    "claim.resolved": tuple_of(claim_check(), min_len=0),  # optional: older configs lack it
}


def optimizer_rules(prefix: str = "") -> dict[str, Rule]:
    """Rules of the optimizer fields shared by the training configs (``algorithms.lm.training``,
    ``algorithms.diffusion_lm.grid``): ``learning_rate`` > 0, ``warmup_steps`` >= 0,
    ``weight_decay`` >= 0, ``grad_clip`` > 0, each under ``prefix`` (e.g. ``"optim."``)."""
    return {f"{prefix}learning_rate": number(lo=0, lo_open=True),
            f"{prefix}warmup_steps": integer(lo=0),
            f"{prefix}weight_decay": number(lo=0),
            f"{prefix}grad_clip": number(lo=0, lo_open=True)}


def training_rules(prefix: str = "") -> dict[str, Rule]:
    """Rules of a language-model training run's fields (``algorithms.lm.training.train``): the
    :func:`optimizer_rules`, ``seq_len`` >= 2 (a next-token loss needs two positions),
    ``batch_size``, ``steps``, ``log_every`` and ``checkpoint_every`` >= 1, each under
    ``prefix`` (e.g. ``"evaluator."``)."""
    return {f"{prefix}seq_len": integer(lo=2), f"{prefix}batch_size": integer(lo=1),
            f"{prefix}steps": integer(lo=1), **optimizer_rules(prefix),
            f"{prefix}log_every": integer(lo=1), f"{prefix}checkpoint_every": integer(lo=1)}


def _legacy_validate(config: ml_collections.ConfigDict, rules: Mapping[str, Rule],
             cross_checks: Sequence[Callable[[ml_collections.ConfigDict], None]] = ()) -> None:
    """Checks every field of ``config`` against its rule, then the cross-field checks.

    Args:
      config: a built config (after every override).
      rules: dotted field path -> :class:`Rule`, one for every leaf field (groups of fields such
        as ``model`` need none; ``variant``, set by :func:`build`, must be a string; the
        ``claim`` group gets :data:`CLAIM_RULES`).
      cross_checks: functions ``config -> None`` that raise ``ValueError`` (naming the fields)
        when fields that are each valid do not fit together; run only when every field passed.

    Raises:
      ValueError: one line naming every refused field, its value and what was expected
        (``config field 'steps' = 0: expected an integer >= 1``); a leaf field with no rule or a
        rule for a field the config does not have (the config is not the one the rules were
        written for); a warm-up longer than its training (:func:`check_warmup`); or the first
        failing cross-field check.
    """
    paths = field_paths(config)
    if "claim" in paths:
        rules = {**{k: r for k, r in CLAIM_RULES.items() if k != "claim.resolved"
                    or k in paths}, **rules}
    problems = []
    for path in paths:
        value = get_field(config, path)
        if isinstance(value, ml_collections.ConfigDict):
            continue
        rule = rules.get(path)
        if rule is None and path == "variant":
            rule = string(nonempty=True)
        if rule is None:
            problems.append(f"config field {path!r} is not a field of this experiment's config "
                            "(no rule for it)")
        elif (expected := rule.refusal(value)) is not None:
            problems.append(f"config field {path!r} = {_shown(value)}: expected {expected}")
    missing = [p for p in rules if p not in paths]
    if missing:
        problems.append(f"config lacks the field(s) {', '.join(map(repr, missing))} that this "
                        "experiment needs")
    if problems:
        raise ValueError("; ".join(problems))
    check_warmup(config)
    for check in cross_checks:
        check(config)


def variant_of(module: Any) -> Rule:
    """``""`` (the default variant) or an argument of ``module.get_config`` (``"smoke"``,
    ``"tiny,steps=10"``) whose config passes ``module``'s ``RULES`` and ``CROSS_CHECKS``: for a
    field naming the config of another experiment whose output this one reads."""
    name = module.__name__.rsplit(".", 1)[-1]
    variants = ", ".join(repr(v) for v in getattr(module, "VARIANTS", VARIANTS))

    def test(value: Any) -> bool:
        if not isinstance(value, str):
            return False
        if value:
            validate_module_config(module.get_config(value), module)
        return True

    return Rule(test, f"'' or a valid variant of the {name} config ({variants}, optionally "
                      "followed by ,field=value overrides)")
