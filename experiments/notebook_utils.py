"""Helpers for the Colab notebooks in ``experiments/notebooks/``: runtime detection and
"run an experiment and show its report section".

The variant comes from the ``ICML26_VARIANT`` environment variable when set (the test suite sets
``smoke`` to execute every notebook quickly on the CPU), else ``tiny`` on a CPU runtime and
``tiny`` on an accelerator too unless the notebook asks for ``paper``.
"""

from __future__ import annotations

import os

import jax

from core import report
from experiments import registry


def detect_runtime() -> str:
    """``"tpu"``, ``"gpu"`` or ``"cpu"``: the backend JAX found on this runtime."""
    backend = jax.default_backend()
    return {"cuda": "gpu", "rocm": "gpu"}.get(backend, backend)


def choose_variant(requested: str = "tiny") -> str:
    """The variant to run: ``$ICML26_VARIANT`` if set, else ``requested``; ``paper`` on a CPU
    runtime falls back to ``tiny`` (it is sized for an accelerator)."""
    variant = os.environ.get("ICML26_VARIANT", requested)
    if variant == "paper" and detect_runtime() == "cpu":
        print("paper variant needs an accelerator; running tiny on this CPU runtime")
        return "tiny"
    return variant


def run_and_show(name: str, variant: str = "tiny", workdir: str = "workdir") -> report.Section:
    """Runs experiment ``name`` at ``variant`` and displays its section (markdown and plots)."""
    module, config_module = registry.load(name)
    variant = choose_variant(variant)
    print(f"runtime: {detect_runtime()} ({jax.device_count()} devices); variant: {variant}")
    section = module.run(config_module.get_config(variant), workdir)
    report.write_report(os.path.join(workdir, f"{name}_report.md"), name, [section])
    try:  # inside Jupyter/Colab
        from IPython.display import Image, Markdown, display

        display(Markdown(f"## {section.title}\n\n{section.body}"))
        for fig in section.figures:
            display(Image(filename=fig))
    except ImportError:
        print(section.body)
    return section
