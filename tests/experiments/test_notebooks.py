"""Every method's Colab notebook is paired with its text form, installs the project from the
repository URL that ``pyproject.toml`` declares, states the time of its optional full run, and
executes on the CPU.

The notebooks run at the ``smoke`` variant here (``ICML26_VARIANT=smoke``), which executes every
code path of the ``tiny`` run in seconds.
"""

import glob
import os
import re
import tomllib

import jupytext
import nbformat
import pytest
from nbclient import NotebookClient

from experiments import registry

NB_DIR = os.path.join(os.path.dirname(__file__), "..", "..", "experiments", "notebooks")
NOTEBOOKS = sorted(glob.glob(os.path.join(NB_DIR, "*.ipynb")))
PYPROJECT = os.path.join(os.path.dirname(__file__), "..", "..", "pyproject.toml")


def test_every_available_experiment_has_a_notebook():
    names = {os.path.splitext(os.path.basename(p))[0] for p in NOTEBOOKS}
    assert set(registry.available()) <= names


@pytest.mark.parametrize("path", NOTEBOOKS, ids=os.path.basename)
def test_notebook_matches_text_form(path):
    nb = nbformat.read(path, as_version=4)
    text = jupytext.read(path.replace(".ipynb", ".py"))
    cells = lambda n: [(c.cell_type, c.source) for c in n.cells]  # noqa: E731
    assert cells(nb) == cells(text), "run `jupytext --update --to ipynb` on the text form"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=os.path.basename)
def test_first_cell_installs_from_the_declared_repository(path):
    with open(PYPROJECT, "rb") as f:
        url = tomllib.load(f)["project"]["urls"]["Repository"]
    first = next(c.source for c in nbformat.read(path, as_version=4).cells if c.cell_type == "code")
    assert re.search(r'^REPO = "([^"]*)"$', first, re.M).group(1) == url
    assert 'f"git+{REPO}"' in first and "nbu.setup()" in first


@pytest.mark.parametrize("path", NOTEBOOKS, ids=os.path.basename)
def test_optional_full_run_states_its_time_in_intro_and_heading(path):
    nb = nbformat.read(path, as_version=4)
    minutes = r"[\d.]+ to [\d.]+ minutes?"
    intro = nb.cells[0].source
    assert re.search(r"\*Optional: the full experiment\*, runs the `tiny` variant.*adds\s+" + minutes,
                     intro, re.S), intro
    last_md = [c.source for c in nb.cells if c.cell_type == "markdown"][-1]
    assert re.search(r"## Optional: the full experiment \(`tiny`, " + minutes, last_md), last_md
    assert "run_and_show" in nb.cells[-1].source


@pytest.mark.slow
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
