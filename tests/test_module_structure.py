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

from kernels import dispatch

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


# -- the kernel ops follow one convention ---------------------------------------------------------

# Every op folder kernels/<op>/ (a folder with an api.py) has these modules: the jnp specification,
# the XLA implementation, the two Pallas kernels, their declared costs, the cache backends, the
# sharded backend, and the public entry points with the op's implementation table.
OP_FILES = frozenset({"__init__.py", "reference.py", "xla.py", "pallas_tpu.py", "pallas_gpu.py",
                      "cost.py", "cache.py", "sharded.py", "api.py"})
# Modules an op has beyond those, each with its reason; any other file fails the check.
OP_EXTRAS = {
    "sparse_decode": {"quest.py": "the Quest baseline (its own method, one XLA implementation)",
                      "workload.py": "selection-quality workloads of the experiment and benchmark",
                      "benchmark.py": "the CPU speed benchmark of the experiment"},
    "kv_quant": {"pallas_common.py": "dequantization and RoPE pieces both Pallas kernels share"},
}


def op_file_problems(files_by_op: dict[str, set[str]]) -> list[str]:
    """Missing convention modules and undeclared extra modules, per op folder."""
    problems = []
    for op, files in sorted(files_by_op.items()):
        problems += [f"kernels/{op}/ lacks {f}" for f in sorted(OP_FILES - files)]
        extras = files - OP_FILES - set(OP_EXTRAS.get(op, {}))
        problems += [f"kernels/{op}/{f} is not a convention module nor in OP_EXTRAS"
                     for f in sorted(extras)]
    return problems


def _op_folders() -> dict[str, set[str]]:
    return {d.name: {p.name for p in d.glob("*.py")}
            for d in sorted((ROOT / "kernels").iterdir()) if (d / "api.py").is_file()}


def test_op_folders_have_the_same_file_set():
    ops = _op_folders()
    assert set(ops) == set(dispatch.OPS), sorted(ops)  # every op folder is registered
    assert not op_file_problems(ops), op_file_problems(ops)


def test_op_file_check_can_fail():
    ops = {"a": set(OP_FILES) - {"xla.py"}, "b": set(OP_FILES) | {"helpers.py"}}
    assert op_file_problems(ops) == ["kernels/a/ lacks xla.py",
                                     "kernels/b/helpers.py is not a convention module nor in "
                                     "OP_EXTRAS"]


def api_dispatch_problems(op: str, source: str) -> list[str]:
    """What keeps an op's api.py from the shared dispatch: it must build ``TABLE =
    dispatch.Table(...)``, call ``dispatch.resolve``, read no platform itself, and import every
    implementation at module level (the table holds functions; no import inside a function)."""
    tree = ast.parse(source)
    calls = {ast.unparse(n.func) for n in ast.walk(tree) if isinstance(n, ast.Call)}
    table = any(isinstance(n, ast.Assign) and [ast.unparse(t) for t in n.targets] == ["TABLE"]
                and isinstance(n.value, ast.Call) and ast.unparse(n.value.func) == "dispatch.Table"
                for n in tree.body)
    problems = [] if table else [f"{op}/api.py: no module-level TABLE = dispatch.Table(...)"]
    if "dispatch.resolve" not in calls:
        problems.append(f"{op}/api.py: never calls dispatch.resolve")
    own = sorted({ast.unparse(n) for n in ast.walk(tree)
                  if isinstance(n, ast.Attribute) and n.attr in ("default_backend", "backends")})
    if own:
        problems.append(f"{op}/api.py: reads the platform itself ({', '.join(own)})")
    nested = sorted({f"{f.name}:{n.lineno}" for f in ast.walk(tree)
                     if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
                     for n in ast.walk(f) if isinstance(n, (ast.Import, ast.ImportFrom))})
    if nested:
        problems.append(f"{op}/api.py: imports inside functions ({', '.join(nested)})")
    return problems


def test_both_apis_use_the_shared_dispatch():
    problems = [p for op in _op_folders()
                for p in api_dispatch_problems(op, (ROOT / "kernels" / op / "api.py").read_text())]
    assert not problems, problems


def test_api_dispatch_check_can_fail():
    own = ("IMPLEMENTATIONS = ('xla',)\n"
           "def resolve(i):\n    return {'tpu': 'pallas_tpu'}.get(jax.default_backend(), 'xla')\n"
           "def call(i):\n    from x import xla\n    return xla.f()\n")
    assert api_dispatch_problems("x", own) == [
        "x/api.py: no module-level TABLE = dispatch.Table(...)",
        "x/api.py: never calls dispatch.resolve",
        "x/api.py: reads the platform itself (jax.default_backend)",
        "x/api.py: imports inside functions (call:5)"]
    shared = ("TABLE = dispatch.Table('x', (), {})\n"
              "def f(i):\n    return dispatch.resolve(TABLE, i, 'f')\n")
    assert api_dispatch_problems("x", shared) == []


# -- every name lives in one module ---------------------------------------------------------------

# Names experiments/*.py still reads through a module that imports them from their home: (reader,
# module, name). Being moved in those files; nothing else may read a name this way.
PASS_THROUGH_READS = {
    ("experiments/sparse_decode.py", "models.kv_cache", "DENSE"),
    ("experiments/generate.py", "models.kv_cache", "KVCacheBackend"),
}
# Modules outside the kernel and model layers that still pass names through, with their reason;
# the check skips them (a package's __init__ is a facade by design and is skipped too).
KNOWN_PASS_THROUGH = {
    "algorithms.forecasting.data": "re-exports core.data.series's table reader to its tests",
    "experiments.spf": "names the SPF training module's public pieces for its own tests",
}


def _module_name(rel: str) -> str:
    parts = pathlib.PurePosixPath(rel).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def reexport_problems(sources: dict[str, str], allowed=frozenset(), skipped=()) -> list[str]:
    """Names read through a module that only imports them (``mod.name`` or ``from mod import
    name``, where ``mod`` binds ``name`` by importing it from another project module rather than
    defining it), and import lines marked ``noqa: F401`` as re-exports.

    A package's ``__init__`` (a facade by design) and the modules in ``skipped`` are not checked;
    names a module imports from third-party packages (``jax``, ``os``) are not project names.

    Args:
      sources: repository-relative path -> source text of every scanned module.
      allowed: (reader path, module, name) triples that are tolerated.
      skipped: module names whose pass-through names are tolerated.
    """
    modules = {_module_name(rel): rel for rel in sources}
    roots = {m.split(".")[0] for m in modules}
    trees = {rel: ast.parse(text, rel) for rel, text in sources.items()}
    imported, defined = {}, {}
    for rel, tree in trees.items():
        imp, dfn = set(), set()
        for node in tree.body:
            if isinstance(node, ast.ImportFrom) and node.module and \
                    node.module.split(".")[0] in roots:
                imp |= {a.asname or a.name for a in node.names
                        if f"{node.module}.{a.name}" not in modules}  # names, not submodules
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                dfn.add(node.name)
            elif isinstance(node, (ast.Assign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                dfn |= {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
        imported[_module_name(rel)], defined[_module_name(rel)] = imp, dfn

    def passes_through(mod, name):
        return (mod in modules and not modules[mod].endswith("__init__.py")
                and mod not in skipped and name in imported[mod] and name not in defined[mod])

    problems = []
    for rel, tree in trees.items():
        aliases = {}  # local name -> project module
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module:
                for a in node.names:
                    full = f"{node.module}.{a.name}"
                    if full in modules:
                        aliases[a.asname or a.name] = full
                    elif passes_through(node.module, a.name) and \
                            (rel, node.module, a.name) not in allowed:
                        problems.append(f"{rel}:{node.lineno} imports {a.name} from "
                                        f"{node.module}, which imports it from elsewhere")
            elif isinstance(node, ast.Import):
                for a in node.names:
                    if a.asname and a.name in modules:
                        aliases[a.asname] = a.name
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
                mod = aliases.get(node.value.id)
                if mod and passes_through(mod, node.attr) and (rel, mod, node.attr) not in allowed:
                    problems.append(f"{rel}:{node.lineno} reads {node.value.id}.{node.attr}, "
                                    f"which {mod} imports from elsewhere")
        if _module_name(rel) not in skipped:
            problems += [f"{rel}:{i} re-exports: {line.strip()}"
                         for i, line in enumerate(sources[rel].splitlines(), 1)
                         if "noqa: F401" in line and "re-export" in line]
    return sorted(set(problems))


def _scanned_sources() -> dict[str, str]:
    """Every module of the packages, and the tests (readers only: this file quotes the marker)."""
    return {str(p.relative_to(ROOT)): p.read_text() for pkg in SCANNED + ("tests",)
            for p in sorted((ROOT / pkg).rglob("*.py")) if p != pathlib.Path(__file__).resolve()}


def test_no_module_reexports_another_modules_names():
    problems = reexport_problems(_scanned_sources(), PASS_THROUGH_READS, KNOWN_PASS_THROUGH)
    assert not problems, "\n".join(problems)


def test_reexport_check_can_fail():
    sources = {
        "pkg/__init__.py": "",
        "pkg/home.py": "def f():\n    return 1\n",
        "pkg/shim.py": "from pkg.home import f  # noqa: F401  (re-exported)\n",
        "pkg/user.py": "from pkg import shim\nfrom pkg.shim import f\n\nshim.f()\n",
        "pkg/fine.py": "from pkg import home\nfrom pkg.home import f\nimport os\n\nhome.f()\n",
        "pkg/reader.py": "from pkg import fine\n\nfine.os.sep\n",  # a third-party module
    }
    assert reexport_problems(sources) == [
        "pkg/shim.py:1 re-exports: from pkg.home import f  # noqa: F401  (re-exported)",
        "pkg/user.py:2 imports f from pkg.shim, which imports it from elsewhere",
        "pkg/user.py:4 reads shim.f, which pkg.shim imports from elsewhere"]
    assert reexport_problems(sources, {("pkg/user.py", "pkg.shim", "f")}) == [
        "pkg/shim.py:1 re-exports: from pkg.home import f  # noqa: F401  (re-exported)"]
    assert reexport_problems(sources, skipped={"pkg.shim"}) == []
