"""examples/notebook.ipynb in a real Jupyter kernel (nbclient): launch a job, restart the kernel,
attach, inject a fault, stop, the MTTR table and plot; the job outlives the kernel it was launched from."""

from __future__ import annotations

import json

import nbformat
import pytest
from nbclient import NotebookClient
from nbclient.util import run_sync

from monarch_ft.testing.jobs import REPO, processes_matching

pytestmark = pytest.mark.slow


def test_the_notebook_runs_across_a_kernel_restart(tmp_path):
    nb = nbformat.read(REPO / "examples" / "notebook.ipynb", as_version=4)
    client = NotebookClient(nb, timeout=900, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}})
    with client.setup_kernel():
        for index, cell in enumerate(nb.cells):
            if cell.cell_type != "code":
                continue
            client.execute_cell(cell, index)
            if "launch" in cell.metadata.get("tags", []):
                # A new kernel process: nothing of the launching one is left but the job itself.
                run_sync(client.km.restart_kernel)(now=True)
                run_sync(client.kc.wait_for_ready)(timeout=120)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert [c.execution_count for c in code[:2]] == [1, 1], "the attach cell ran in a restarted kernel"

    run = tmp_path / "outputs" / "notebook"
    drill = json.loads((run / "drill.json").read_text())
    (fault,) = drill["faults"]
    assert fault["kind"] == "process_kill" and fault["target"] == 1 and fault["recovered"] and fault["weights_consistent"], fault
    assert json.loads((run / "summary.json").read_text())["status"] == "completed"
    outputs = {tag: c.outputs for c in code for tag in c.metadata.get("tags", [])}
    table = "".join(o.get("data", {}).get("text/markdown", "") for o in outputs["mttr-table"])
    assert f"| 0 | process_kill | 1 | {fault['recovery_path']} | {fault['mttr_s']} |" in table, table
    assert any("image/png" in o.get("data", {}) for o in outputs["mttr-plot"]), "the plot was not drawn"
    assert not processes_matching(str(tmp_path)), "the job left processes running"
