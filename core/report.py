"""Markdown reports with PNG plots (matplotlib, Agg backend) and JSON metrics.

Each experiment writes ``<workdir>/<experiment>/metrics.json``, its plots as PNG in the same
folder, and returns a :class:`Section` that ``experiments.main`` assembles into
``<workdir>/report.md``. Every path may be local or an object-store URL (``gs://bucket/run/...``):
all files are written through :mod:`core.files` (``etils.epath``).
"""

from __future__ import annotations

import dataclasses
import io
import json
import math
import os
import posixpath
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Annotated, Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from core import config as cfg_lib  # noqa: E402
from core import files  # noqa: E402


def _jsonable(x: Any) -> Any:
    if isinstance(x, Mapping):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if hasattr(x, "tolist") and callable(x.tolist):  # numpy / jax arrays and scalars
        return _jsonable(x.tolist())
    if isinstance(x, float) and not math.isfinite(x):
        return str(x)  # JSON has no NaN/inf; keep them visible as strings
    return x


def write_json(path: str, obj: Any) -> str:
    """Writes ``obj`` as indented JSON, whole or not at all (:func:`core.files.write_text`: a
    temporary file renamed over ``path``, or one object upload). Returns ``path``."""
    return files.write_text(path, json.dumps(_jsonable(obj), indent=2, sort_keys=True) + "\n")


class JsonLinesWriter:
    """Appends one JSON object per line (metrics streams such as per-step training logs).

    Locally each record is appended to the file. An object store has no append: there the writer
    keeps the file's lines (those already in the object, read at the first write, and its own)
    and uploads the whole object again at each :meth:`write`, so a record costs the size of the
    file so far.

    Args:
      path: the file, a local path or a URL (``gs://...``); its folder is created.
    """

    def __init__(self, path: str):
        self.path = os.fspath(path)
        self._local = files.is_local(self.path)
        files.makedirs(files.as_path(self.path).parent)
        self._lines: list[str] | None = None  # an object store's current content, once read

    def write(self, record: Mapping[str, Any]) -> None:
        line = json.dumps(_jsonable(dict(record)), sort_keys=True) + "\n"
        if self._local:
            with open(files.as_path(self.path), "a") as f:
                f.write(line)
            return
        if self._lines is None:
            try:
                self._lines = files.read_text(self.path).splitlines(keepends=True)
            except FileNotFoundError:
                self._lines = []
        self._lines.append(line)
        files.write_text(self.path, "".join(self._lines))

    def truncate(self, keep: Callable[[dict[str, Any]], bool]) -> int:
        """Rewrites the file (atomically) with only the records for which ``keep`` is true, in
        order, dropping a torn last line; a missing file stays missing. Used on resume, so that
        steps logged after the restored checkpoint are not logged twice.

        Returns:
          How many records (or torn lines) were dropped.

        Raises:
          ValueError: a line other than the last is not JSON (names the file and line).
        """
        try:
            lines = files.read_text(self.path).splitlines()
        except FileNotFoundError:
            return 0
        records = _parse_json_lines(self.path, lines)
        kept = [json.dumps(r, sort_keys=True) + "\n" for r in records if keep(r)]
        files.write_text(self.path, "".join(kept))
        self._lines = None if self._local else kept
        return sum(1 for line in lines if line.strip()) - len(kept)


def _parse_json_lines(path: str, lines: Sequence[str]) -> list[dict[str, Any]]:
    numbered = [(i + 1, line) for i, line in enumerate(lines) if line.strip()]
    records = []
    for k, (number, line) in enumerate(numbered):
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError as e:
            if k == len(numbered) - 1:  # a write cut short by a kill: drop it
                print(f"warning: {path}:{number}: dropped a torn last line ({e.msg})",
                      file=sys.stderr, flush=True)
                break
            raise ValueError(f"{path}:{number}: not a JSON line ({e.msg}): {line[:80]!r}") from None
    return records


def read_json_lines(path: str) -> list[dict[str, Any]]:
    """Reads a JSON-lines file written by :class:`JsonLinesWriter`.

    A torn last line (the writer was killed mid-write) is dropped with a warning on stderr.

    Raises:
      FileNotFoundError: no such file.
      ValueError: a line other than the last is not JSON (the message names the file and line).
    """
    return _parse_json_lines(path, files.read_text(path).splitlines())


def save_figure(fig: plt.Figure, path: str) -> str:
    """Saves ``fig`` as PNG at ``path`` (dpi 120; a local path or a URL), closes it, and returns
    ``path``. The image is cropped to what is drawn, so a legend placed beside the axes
    (:func:`core.figures.legend_outside`, :func:`core.figures.figure_legend`) is kept whole."""
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=120, bbox_inches="tight", pad_inches=0.05)
    plt.close(fig)
    return files.write_bytes(path, buffer.getvalue())


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[Any]], fmt: str = ".4g") -> str:
    """A GitHub-flavoured markdown table; floats are formatted with ``fmt``."""

    def cell(v: Any) -> str:
        if isinstance(v, (float, np.floating)):
            return format(float(v), fmt)
        return str(v)

    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


@dataclasses.dataclass
class Section:
    """One experiment's part of ``report.md``.

    Attributes:
      title: the section heading.
      body: markdown text (tables, numbers, commands).
      figures: PNG paths or URLs, local ones absolute or relative to the current working
        directory (as :func:`save_figure` returns them); local ones are made absolute on
        construction, so that a section sent through JSON from another process still finds them,
        and all are written into the report relative to the report's own folder.
      headline: one row for the report's opening table, keys ``method``, ``claim``, ``ours``,
        ``reproduces`` (one of :data:`VERDICTS`, or ``"failed"``) — optional.
      variant: the config argument the experiment ran with (``"tiny"``, ``"smoke,seed=1"``), or
        ``""`` when not recorded.
    """

    title: str
    body: str = ""
    figures: list[str] = dataclasses.field(default_factory=list)
    headline: dict[str, str] | None = None
    variant: str = ""

    def __post_init__(self):
        self.figures = [files.display(f) for f in self.figures]

    def without_verdict(self, variant: str) -> Section:
        """This section for a variant whose numbers are meaningless (``"smoke"``): its headline's
        "reproduces" cell reads ``n/a (<variant>)`` (a failed experiment stays ``failed``) and the
        body's verdict line (written by :func:`finish`) says the same, so table and section agree."""
        row = self.headline
        if row and row.get("reproduces") == "failed":
            return self
        body = re.sub(r"^\*\*Verdict — .*$",
                      f"**Verdict — n/a ({variant}: the numbers are meaningless; no claim is "
                      "judged).**", self.body, flags=re.M)
        return dataclasses.replace(
            self, body=body, headline=None if row is None else {**row, "reproduces": f"n/a ({variant})"})

    def to_markdown(self, report_dir: str) -> str:
        """The section as markdown; image links are relative to ``report_dir`` (the folder of the
        report file), so they resolve wherever the report and its folder are opened from."""
        parts = [f"## {self.title}", "", self.body.strip(), ""]
        for fig in self.figures:
            parts += [f"![{posixpath.basename(fig.replace(os.sep, '/'))}]"
                      f"({files.relative(fig, report_dir)})", ""]
        return "\n".join(parts)


def save_section(path: str, section: Section) -> str:
    """Writes ``section`` as JSON at ``path`` (whole or not at all), its figures relative to the
    folder of ``path`` so that the record stays valid when the workdir is moved or copied (a
    figure on another file system keeps its full path). Returns ``path``."""
    record = dataclasses.asdict(section)
    record["figures"] = [files.relative(f, files.parent(path)) for f in section.figures]
    return write_json(path, record)


def load_section(path: str) -> Section:
    """The :class:`Section` saved at ``path`` by :func:`save_section`.

    Raises:
      FileNotFoundError: no such file.
      ValueError: the file is not such a record (names the file).
    """
    try:
        record = json.loads(files.read_text(path))
        folder = files.parent(path)
        record["figures"] = [f if (os.path.isabs(f) or not files.is_local(f)) else
                             files.join(folder, f) for f in record.get("figures", [])]
        return Section(**record)
    except (ValueError, TypeError, AttributeError) as e:
        raise ValueError(f"{path}: not a report section record ({e})") from None


def write_report(path: str, title: str, sections: Sequence[Section], preamble: str = "",
                 no_verdict: str | None = None) -> str:
    """Writes ``report.md``: a headline table (method, claim, ours, reproduces), then sections.

    Args:
      path: the report file (a local path or a URL); its folder is created.
      title: the level-1 heading.
      sections: the sections, in order; those with a ``headline`` give the table's rows.
      preamble: markdown placed under the title.
      no_verdict: the name of a variant whose numbers are meaningless (e.g. ``"smoke"``), or
        ``None``. When given, the report opens with a notice saying so, and the table's
        "reproduces" column and each section's verdict line read ``n/a (<no_verdict>)`` instead
        of a verdict (:meth:`Section.without_verdict`), except for experiments that failed.

    Returns:
      ``path``.
    """
    report_dir = files.parent(path)
    if no_verdict:
        sections = [s.without_verdict(no_verdict) for s in sections]
    rows = [[s.headline.get(k, "") for k in ("method", "claim", "ours", "reproduces")]
            for s in sections if s.headline]
    parts = [f"# {title}", ""]
    if no_verdict:
        parts += [f"> **Variant `{no_verdict}`: the numbers in this report are meaningless.** "
                  "It runs every code path at toy sizes to check that the code works; it judges "
                  "no paper claim. Use `tiny` (CPU) or `paper` (accelerator) for results.", ""]
    if preamble:
        parts += [preamble.strip(), ""]
    if rows:
        parts += [markdown_table(["method", "paper's claim", "ours", "reproduces"], rows), ""]
    parts += [s.to_markdown(report_dir) for s in sections]
    return files.write_text(path, "\n".join(parts))


# -- the headline claim: a typed record whose thresholds live in the experiment's config ----------

_OPS: dict[str, Callable[[float, float], bool]] = {
    "<": lambda a, b: a < b, "<=": lambda a, b: a <= b, ">": lambda a, b: a > b,
    ">=": lambda a, b: a >= b, "==": lambda a, b: a == b, "!=": lambda a, b: a != b,
}
_KEY = r"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z0-9_]+)*"
_NUM = r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?"
_CHECK = re.compile(
    rf"^\s*(?P<lhs>{_KEY})\s*(?P<op><=|>=|==|!=|<|>)\s*"
    rf"(?:(?P<num>{_NUM})|(?:(?P<scale>{_NUM})\s*\*\s*)?(?P<rhs>{_KEY})"
    rf"(?:\s*(?P<sign>[-+])\s*(?P<offset>{_NUM}))?)\s*$")


def parse_check(text: str) -> tuple[str, str, float | None, float, str | None, float]:
    """Parses one claim check ``"<metric> <op> <bound>"``.

    ``<metric>`` is a key of the experiment's metrics (dots index nested dicts: ``fits.easy.n``);
    ``<op>`` one of ``< <= > >= == !=``; ``<bound>`` a number, or another metric optionally scaled
    and shifted: ``[<number> *] <metric> [(+|-) <number>]``. Booleans count as 1 and 0.

    Returns:
      (lhs key, op, number or None, scale, rhs key or None, offset).

    Raises:
      ValueError: text that does not follow this grammar (the message quotes it).
    """
    m = _CHECK.match(text)
    if m is None:
        raise ValueError(f"claim check {text!r}: expected '<metric> <op> <number>' or "
                         "'<metric> <op> [<number> *] <metric> [+|- <number>]' with op one of "
                         f"{' '.join(_OPS)}")
    offset = float(m["offset"]) if m["offset"] else 0.0
    return (m["lhs"], m["op"], float(m["num"]) if m["num"] is not None else None,
            float(m["scale"]) if m["scale"] else 1.0, m["rhs"], -offset if m["sign"] == "-" else offset)


def metric_value(metrics: Mapping[str, Any], key: str) -> Any:
    """``metrics[a][b]...`` for ``key = "a.b..."``; ``None`` when a group on the way is ``None``
    (a part of the experiment that did not run: its metrics are not measured).

    Raises:
      KeyError: a missing key (the message names the full key and the keys present there).
    """
    node: Any = metrics
    for i, part in enumerate(key.split(".")):
        if node is None:
            return None
        if not isinstance(node, Mapping) or part not in node:
            where = ".".join(key.split(".")[:i]) or "metrics"
            present = sorted(node) if isinstance(node, Mapping) else type(node).__name__
            raise KeyError(f"claim: metric {key!r} not found; {where} has {present}")
        node = node[part]
    return node


NOT_MEASURED = "not measured here"
NOT_RESOLVED = "not resolved at this size"
VERDICTS = ("yes", "partly", "no", NOT_RESOLVED, NOT_MEASURED)
"""The verdicts a :class:`Claim` gives (its docstring states the rule that picks one)."""


def check_outcome(metrics: Mapping[str, Any], check: str) -> bool | None:
    """Whether ``check`` holds on ``metrics``: ``True``/``False``, or ``None`` when a metric it
    names is ``None`` (the run did not measure it, e.g. a data set that was not in the run).
    A NaN value is a measurement that went wrong and fails the check (``False``).

    Raises:
      KeyError: the check names a metric that ``metrics`` lacks (a misspelt key is an error, not
        an unmeasured metric: an experiment records what it did not measure as ``None``).
      ValueError: a malformed check (see :func:`parse_check`).
    """
    lhs, op, num, scale, rhs, offset = parse_check(check)
    a = metric_value(metrics, lhs)
    b = num if rhs is None else metric_value(metrics, rhs)
    if a is None or b is None:
        return None
    if math.isnan(float(a)) or math.isnan(float(b)):
        return False
    bound = float(b) if rhs is None else scale * float(b) + offset
    return bool(_OPS[op](float(a), bound))


def _shown_outcome(outcome: bool | None) -> bool | str:
    return NOT_MEASURED if outcome is None else outcome


@dataclasses.dataclass(frozen=True)
class Claim:
    """A paper's headline claim and the checks that decide whether our metrics reproduce it.

    Experiments keep it in their config (``config.claim``: this class is the group's schema), so
    that the thresholds sit beside the statement and can be overridden from the command line
    (``--config.claim.checks='("val_bpb < bigram_bpb - 0.2",)'``).

    The verdict is one of :data:`VERDICTS`, decided by this rule (:meth:`rule` writes it out for
    the report, :meth:`reason` says which branch a run took):

    1. A check whose metric is ``None`` (the run did not measure it) is left out and shown as
       "not measured here". If every check is left out: **"not measured here"**.
    2. Else, if any ``resolved`` check fails (a NaN fails; one on a ``None`` metric is left out
       like a check): **"not resolved at this size"** — the measurement is too noisy or too small to decide
       the claim either way, whatever the checks say.
    3. Else, over the measured checks: all hold **"yes"**, some **"partly"**, none **"no"**.

    Attributes:
      method: the method's name in the report's opening table.
      statement: the paper's claim, in words.
      checks: conditions on the metrics (grammar: :func:`parse_check`) that the claim asserts.
      ours: what we measured, a ``str.format`` template over the metrics (nested keys with
        ``{fits[easy][n]}``), e.g. ``"{val_bpb:.3f} vs bigram {bigram_bpb:.3f} bpb"``.
      resolved: conditions (same grammar) that say the measurement is sized to decide the claim,
        e.g. that an interval's width is small enough or that it excludes the claim's
        threshold; empty when any measurement decides.
    """

    method: cfg_lib.NonEmpty
    statement: cfg_lib.NonEmpty
    checks: tuple[str, ...]
    ours: cfg_lib.NonEmpty
    resolved: Annotated[tuple[str, ...], cfg_lib.Items(0)] = ()

    def __post_init__(self):
        if not self.checks:
            raise cfg_lib.FieldError(f"claim {self.method!r} needs at least one check",
                                     checks=self.checks)
        for name in ("checks", "resolved"):
            for c in getattr(self, name):
                try:
                    parse_check(c)
                except ValueError as e:
                    raise cfg_lib.FieldError(str(e), **{name: getattr(self, name)}) from None

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> Claim:
        """The claim of a ``ConfigDict``/dict with fields ``method, statement, checks, ours`` and
        optionally ``resolved``."""
        resolved = config["resolved"] if "resolved" in config else ()
        return cls(method=config["method"], statement=config["statement"],
                   checks=tuple(config["checks"]), ours=config["ours"], resolved=tuple(resolved))

    def outcomes(self, metrics: Mapping[str, Any]) -> list[bool | None]:
        """Whether each check holds on ``metrics``: ``True``, ``False`` (also for a NaN value), or
        ``None`` when a metric it names is ``None`` (not measured by this run).

        Raises:
          KeyError: a check names a metric that ``metrics`` lacks.
        """
        return [check_outcome(metrics, c) for c in self.checks]

    def resolved_outcomes(self, metrics: Mapping[str, Any]) -> list[bool | None]:
        """:meth:`outcomes` of the ``resolved`` checks."""
        return [check_outcome(metrics, c) for c in self.resolved]

    def verdict(self, metrics: Mapping[str, Any]) -> str:
        """One of :data:`VERDICTS`, by the rule in the class docstring."""
        held = [o for o in self.outcomes(metrics) if o is not None]
        if not held:
            return NOT_MEASURED
        if any(o is False for o in self.resolved_outcomes(metrics)):
            return NOT_RESOLVED
        return "yes" if all(held) else ("partly" if any(held) else "no")

    def rule(self) -> str:
        """The verdict rule of this claim in one markdown sentence (for the report), e.g.
        ``"Rule: 'not measured here' if no check's metric was measured; else 'not resolved at
        this size' unless `ci.lo > 0`; else 'yes' if all 2 checks hold, 'partly' if some, 'no'
        if none (a check on an unmeasured metric is left out)."``"""
        parts = [f"Rule: {NOT_MEASURED!r} if no check's metric was measured"]
        if self.resolved:
            needs = " and ".join(f"`{c}`" for c in self.resolved)
            parts.append(f"else {NOT_RESOLVED!r} unless {needs}")
        n = len(self.checks)
        parts.append(f"else 'yes' if all {n} checks hold, 'partly' if some, 'no' if none"
                     if n > 1 else "else 'yes' if the check holds, 'no' if not")
        return "; ".join(parts) + " (a check on an unmeasured metric is left out)."

    def reason(self, metrics: Mapping[str, Any]) -> str:
        """Why :meth:`verdict` gave what it gave on ``metrics``, in one markdown line."""
        outcomes = self.outcomes(metrics)
        unmeasured = [c for c, o in zip(self.checks, outcomes) if o is None]
        verdict = self.verdict(metrics)
        if verdict == NOT_MEASURED:
            return f"{NOT_MEASURED}: no check's metric was measured by this run"
        tail = (f"; not measured here: {', '.join(f'`{c}`' for c in unmeasured)}"
                if unmeasured else "")
        if verdict == NOT_RESOLVED:
            failed = [c for c, o in zip(self.resolved, self.resolved_outcomes(metrics))
                      if o is False]
            return f"{NOT_RESOLVED}: {', '.join(f'`{c}`' for c in failed)} does not hold" + tail
        held = sum(1 for o in outcomes if o is True)
        measured = sum(1 for o in outcomes if o is not None)
        return f"{verdict}: {held} of {measured} measured checks hold" + tail

    def record(self, metrics: Mapping[str, Any]) -> dict[str, Any]:
        """The ``claim`` block of ``metrics.json``: statement, verdict, each check's outcome
        (``true``/``false``/``"not measured here"``), each ``resolved`` check's outcome, the rule
        and the reason."""
        return {"statement": self.statement, "verdict": self.verdict(metrics),
                "checks": {c: _shown_outcome(o) for c, o in zip(self.checks, self.outcomes(metrics))},
                "resolved": {c: _shown_outcome(o)
                             for c, o in zip(self.resolved, self.resolved_outcomes(metrics))},
                "rule": self.rule(), "reason": self.reason(metrics)}

    def headline(self, metrics: Mapping[str, Any]) -> dict[str, str]:
        """The report's opening-table row: method, claim, ours, reproduces."""
        return {"method": self.method, "claim": self.statement,
                "ours": self.ours.format(**metrics), "reproduces": self.verdict(metrics)}


def finish(out_dir: str, *, title: str, metrics: Mapping[str, Any], body: str,
           claim: Claim | Mapping[str, Any] | None = None,
           figures: Mapping[str, plt.Figure] | None = None) -> Section:
    """Writes an experiment's outputs and returns its report section.

    ``<out_dir>/metrics.json`` gets ``metrics`` (plus ``claim``: :meth:`Claim.record`, i.e. the
    statement, each check's outcome, the verdict, its rule and the reason), each figure becomes
    ``<out_dir>/<name>.png`` (and is closed), and the section carries the claim's headline row;
    the body ends with a line giving the verdict, why, and the rule.

    Args:
      out_dir: the experiment's folder (``<workdir>/<experiment>``).
      title: the section heading.
      metrics: JSON-able numbers (numpy and JAX scalars are converted).
      body: the section's markdown.
      claim: a :class:`Claim` or its config; ``None`` for a section without a headline row.
      figures: {file stem: matplotlib figure}.

    Returns:
      The :class:`Section`.

    Raises:
      KeyError: the claim names a metric that ``metrics`` lacks.
    """
    metrics = dict(metrics)
    headline = None
    if claim is not None:
        claim = claim if isinstance(claim, Claim) else Claim.from_config(claim)
        headline = claim.headline(metrics)
        metrics["claim"] = claim.record(metrics)
        body = body.rstrip() + f"\n\n**Verdict — {claim.reason(metrics)}.** {claim.rule()}\n"
    write_json(files.join(out_dir, "metrics.json"), metrics)
    paths = [save_figure(fig, files.join(out_dir, f"{name}.png"))
             for name, fig in (figures or {}).items()]
    return Section(title=title, body=body, figures=paths, headline=headline)
