"""Every method's Colab notebook is paired with its text form and executes on the CPU.

The notebooks run at the ``smoke`` variant here (``ICML26_VARIANT=smoke``), which executes every
code path of the ``tiny`` run in seconds.
"""

import glob
import os

import jupytext
import nbformat
import pytest
from nbclient import NotebookClient

from experiments import registry

NB_DIR = os.path.join(os.path.dirname(__file__), "..", "..", "experiments", "notebooks")
NOTEBOOKS = sorted(glob.glob(os.path.join(NB_DIR, "*.ipynb")))


def test_every_available_experiment_has_a_notebook():
    names = {os.path.splitext(os.path.basename(p))[0] for p in NOTEBOOKS}
    assert set(registry.available()) <= names


@pytest.mark.parametrize("path", NOTEBOOKS, ids=os.path.basename)
def test_notebook_matches_text_form(path):
    nb = nbformat.read(path, as_version=4)
    text = jupytext.read(path.replace(".ipynb", ".py"))
    code = lambda n: [c.source for c in n.cells if c.cell_type == "code"]  # noqa: E731
    assert code(nb) == code(text), "run `jupytext --sync` on the pair"


@pytest.mark.parametrize(
    "path",
    [p for p in NOTEBOOKS if os.path.splitext(os.path.basename(p))[0] in registry.available()],
    ids=os.path.basename)
def test_notebook_executes(path, tmp_path, monkeypatch):
    monkeypatch.setenv("ICML26_VARIANT", "smoke")
    nb = nbformat.read(path, as_version=4)
    NotebookClient(nb, timeout=600, kernel_name="python3",
                   resources={"metadata": {"path": str(tmp_path)}}).execute()
    outputs = "".join(str(o) for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []))
    assert "variant: smoke" in outputs
    assert os.path.exists(tmp_path / "workdir" / os.path.splitext(os.path.basename(path))[0]
                          / "metrics.json")
