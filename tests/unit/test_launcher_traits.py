"""Launchers declare what they can do (LauncherTraits); the rest of the code reads that, never a name."""

from __future__ import annotations

import ast
import pathlib

from monarch_ft.config.launcher import LauncherConfig
from monarch_ft.launcher import available_launchers, launcher_class, launcher_traits
from monarch_ft.testing.jobs import REPO


def test_traits_are_read_without_building_a_launcher(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # building a Monarch launcher would create ./monarch here
    t = {name: launcher_traits(LauncherConfig(name=name)) for name in available_launchers()}
    local, slurm, monarch = t["local"], t["slurm"], t["monarch"]
    assert local.adoptable and local.forkable and local.ranks_on_this_machine and local.default_standby_groups == 1
    assert not local.simulated_hosts and local.worker_thread_trainer is None
    hosts = launcher_traits(LauncherConfig(name="local", options={"simulated_hosts": True}))  # launcher=local_hosts
    assert hosts.simulated_hosts and hosts.default_standby_groups == 1 and hosts.adoptable
    assert slurm.adoptable and not slurm.forkable and not slurm.ranks_on_this_machine and slurm.default_standby_groups == 0
    assert not monarch.adoptable and not monarch.forkable and monarch.default_standby_groups == 0
    assert monarch.ranks_on_this_machine and monarch.worker_thread_trainer == "a Monarch actor"
    on_slurm = launcher_traits(LauncherConfig(name="monarch", options={"allocator": "slurm"}))
    assert not on_slurm.ranks_on_this_machine, "allocator=slurm runs each group on its own job's nodes"
    assert launcher_class("local").adoption_problem() is None and launcher_class("slurm").adoption_problem() is None
    assert "proc meshes belong to the controller" in launcher_class("monarch").adoption_problem()
    assert not (tmp_path / "monarch").exists() and not list(tmp_path.iterdir())
    # A forkable launcher places fork servers; the others' relaunches start cold.
    assert launcher_class("local")().fork_host(0) is not None


def _name_checks(path: pathlib.Path, names: set[str]) -> list[str]:
    """Comparisons with a launcher's name, and lists of launcher names, in ``path``."""

    def named(node) -> int:
        if isinstance(node, ast.Constant):
            return int(node.value in names)
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            return sum(named(e) for e in node.elts)
        return 0

    hits = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Compare) and any(named(n) for n in (node.left, *node.comparators)):
            hits.append(f"{path.relative_to(REPO)}:{node.lineno}: {ast.unparse(node)}")
        elif isinstance(node, (ast.Tuple, ast.List, ast.Set)) and named(node) >= 2:
            hits.append(f"{path.relative_to(REPO)}:{node.lineno}: {ast.unparse(node)}")
    return hits


def test_no_launcher_is_checked_by_name_outside_the_launchers():
    """A new launcher touches nothing outside monarch_ft/launcher/: what differs between
    launchers is a trait, not a name compared in config validation, the standby pool or drills."""
    names = set(available_launchers()) | {"local_hosts"}  # local_hosts: launcher=local with simulated hosts
    files = [p for root in ("monarch_ft", "chaos", "recipes") for p in sorted((REPO / root).rglob("*.py")) if "launcher" not in p.relative_to(REPO).parts]
    found = [hit for p in files for hit in _name_checks(p, names)]
    assert not found, found
