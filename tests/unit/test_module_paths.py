"""Every module the project starts a process by, or loads by name, exists under that name.

The controller and the launchers name the rank's code by module path and never import it
(records.launch, and the import contracts of pyproject.toml), as the Lighthouse names its
guard and the guard the close-out: a path left behind by a move would only fail when a job
starts that process. Checked here in milliseconds instead.
"""

from __future__ import annotations

import ast
import importlib.util

import pytest

from monarch_ft.controller.fork_pool import PRELOAD
from monarch_ft.controller.lighthouse import GUARD_MODULE
from monarch_ft.controller.lighthouse_guard import CLOSEOUT_MODULE
from monarch_ft.launcher.slurm import TASK_MODULE
from monarch_ft.records.launch import RANK_ACTOR, RANK_ENTRY, WORKER_MODULE, ZYGOTE_MODULE


@pytest.mark.parametrize(
    "module", [WORKER_MODULE, ZYGOTE_MODULE, GUARD_MODULE, CLOSEOUT_MODULE, TASK_MODULE, *[m for m in PRELOAD if m.startswith("monarch_ft.")]]
)
def test_a_process_started_by_module_path_finds_its_module(module):
    assert importlib.util.find_spec(module) is not None, module


@pytest.mark.parametrize("path", [RANK_ACTOR, RANK_ENTRY])
def test_what_a_monarch_proc_loads_by_name_is_defined_there(path):
    """``module:name``, read from the source: the module imports Monarch, which the check need not."""
    module, _, name = path.partition(":")
    spec = importlib.util.find_spec(module)
    assert spec is not None and spec.origin, module
    with open(spec.origin) as f:
        defined = {n.name for n in ast.parse(f.read()).body if isinstance(n, (ast.ClassDef, ast.FunctionDef))}
    assert name in defined, path
