"""Every link to a heading (``[text](#anchor)`` or ``[text](FILE.md#anchor)``) in README.md and
docs/*.md names a heading that exists, with the anchor GitHub gives it: the heading's text in lower
case, punctuation other than ``-`` and ``_`` dropped, spaces as ``-``, a repeated anchor suffixed
``-1``, ``-2``, ...; lines inside fenced code blocks are not headings."""

import glob
import os
import re

import pytest

ROOT = os.path.join(os.path.dirname(__file__), "..")
FILES = [os.path.join(ROOT, "README.md")] + sorted(glob.glob(os.path.join(ROOT, "docs", "*.md")))
LINK = re.compile(r"\]\(([^)#\s]*)#([^)\s]+)\)")


def github_anchor(heading: str) -> str:
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(markdown: str) -> set[str]:
    out, seen, fenced = set(), {}, False
    for line in markdown.splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        m = None if fenced else re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if m:
            a = github_anchor(m.group(1))
            n = seen.get(a, 0)
            seen[a] = n + 1
            out.add(a if n == 0 else f"{a}-{n}")
    return out


def test_github_anchor_rule():
    assert github_anchor("judge_btl: judge-aware Bradley-Terry-Luce ranking") == \
        "judge_btl-judge-aware-bradley-terry-luce-ranking"
    assert github_anchor("What fits where, compiled ahead of time ([AOT.md](AOT.md))") == \
        "what-fits-where-compiled-ahead-of-time-aotmdaotmd"
    assert anchors("# A\n```\n# A\n```\n## A\n") == {"a", "a-1"}


@pytest.mark.parametrize("path", FILES, ids=os.path.basename)
def test_every_heading_link_resolves(path):
    text = open(path, encoding="utf-8").read()
    own = anchors(text)
    broken = []
    for m in LINK.finditer(text):
        target, frag = m.group(1), m.group(2)
        if target.startswith(("http://", "https://")):
            continue
        if target:
            other = os.path.normpath(os.path.join(os.path.dirname(path), target))
            names = anchors(open(other, encoding="utf-8").read()) if os.path.exists(other) else set()
        else:
            names = own
        if frag not in names:
            broken.append(f"{target}#{frag}")
    assert not broken, f"{os.path.basename(path)}: links to no heading: {broken}"


def test_readme_links_each_method_section():
    text = open(FILES[0], encoding="utf-8").read()
    links = {frag for target, frag in LINK.findall(text) if not target}
    sections = [a for a in anchors(text) if re.match(r"^[a-z_]+-", a)]
    for name in ("lm", "diffusion_lm", "sparse_decode", "kv_quant", "generate", "rl_scaling",
                 "forecasting", "spf", "judge_btl", "benchmark_game"):
        heading = [a for a in sections if a.startswith(name + "-")]
        assert len(heading) >= 1 and heading[0] in links, name
