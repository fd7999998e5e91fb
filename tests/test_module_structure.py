"""Module structure of the packages below ``experiments``: no import cycles, no lazy module
attributes.

* Every module of ``core``, ``kernels``, ``models`` and ``algorithms`` is imported first, in a
  fresh interpreter (one subprocess; the project's modules are dropped from ``sys.modules``
  before each import, third-party ones are kept so that the run stays cheap). A cycle between
  two project modules shows as an ``ImportError`` ("partially initialized module") or an
  ``AttributeError`` for whichever of them is imported first, so each must be tried first.
* No module defines a module-level ``__getattr__``: such a shim hides where a name lives and
  lets two modules import each other lazily.
"""

from __future__ import annotations

import ast
import json
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
IMPORTED = ("core", "kernels", "models", "algorithms")  # nothing imports experiments
SCANNED = IMPORTED + ("experiments",)


def _modules(packages) -> list[str]:
    names = []
    for pkg in packages:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            names.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return names


_PROBE = """
import importlib, json, sys, traceback
names, roots = json.loads(sys.argv[1]), tuple(json.loads(sys.argv[2]))
failures = {}
for name in names:
    for loaded in [m for m in sys.modules if m.split(".")[0] in roots]:
        del sys.modules[loaded]
    try:
        importlib.import_module(name)
    except Exception:
        failures[name] = traceback.format_exc(limit=-3)
print(json.dumps(failures))
"""


def test_every_module_imports_first_without_a_cycle():
    names = _modules(IMPORTED)
    assert "kernels.kv_quant.api" in names and "models.kv_cache" in names
    out = subprocess.run([sys.executable, "-c", _PROBE, json.dumps(names), json.dumps(SCANNED)],
                         cwd=ROOT, capture_output=True, text=True, timeout=600,
                         env={"JAX_PLATFORMS": "cpu", "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr[-4000:]
    failures = json.loads(out.stdout.strip().splitlines()[-1])
    assert not failures, "\n".join(f"{k}:\n{v}" for k, v in failures.items())


def test_no_module_defines_a_module_level_getattr():
    offenders = []
    for pkg in SCANNED:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            tree = ast.parse(path.read_text(), str(path))
            offenders += [f"{path.relative_to(ROOT)}:{node.lineno}" for node in tree.body
                          if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
                          and node.name in ("__getattr__", "__dir__")]
    assert not offenders, f"module-level __getattr__/__dir__ in {offenders}"
