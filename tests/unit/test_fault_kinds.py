"""The fault-kind registry (chaos/kinds): every kind complete, its own options, refusals in one line."""

from __future__ import annotations

import ast
import dataclasses
import pathlib

import pytest

from chaos.config import ChaosConfig, DrillConfig, FaultConfig, validate_chaos
from chaos.kinds import FaultCategory, FaultOptions, fault_kind, fault_kinds, parse_fault
from chaos.kinds.base import FaultKind
from chaos.schedule import build_faults
from monarch_ft.records.errors import ConfigError
from monarch_ft.records.recovered import RecoveryRule
from monarch_ft.testing.jobs import REPO

# The kinds a drill had before the registry: each must still be there, under its name.
KINDS = ("process_kill", "segfault", "sigterm", "hang", "node", "collective", "partition", "slow_link", "controller", "lighthouse")


def test_every_kind_is_registered_whole():
    kinds = fault_kinds()
    assert set(KINDS) <= set(kinds), sorted(kinds)
    for name, kind in kinds.items():
        assert isinstance(kind, FaultKind) and kind.name == name
        assert (REPO / "chaos" / "kinds" / f"{name}.py").is_file(), "a kind's module is named after it"
        assert isinstance(kind.category, FaultCategory), name
        assert isinstance(kind.recovery, RecoveryRule), name
        assert dataclasses.is_dataclass(kind.options) and issubclass(kind.options, FaultOptions), name
        assert isinstance(kind.costs_restart, bool) and isinstance(kind.rank_action, str), name
        # Its options parse from a plain entry, with its own defaults.
        options = parse_fault({"kind": name, "at_step": 3, **({"delay_ms": 5} if "delay_ms" in vars(kind.options()) else {})})
        assert type(options) is kind.options and options.kind == name and options.at_step == 3
        if kind.modes:
            assert kind.mode(options) == kind.modes[0], "the first mode is the default"
        if kind.category is FaultCategory.CONTROL_PLANE:
            assert kind.detected_by is not None, name
    # What each kind costs the restart budget and when it is back, as the drills always counted.
    assert {n for n, k in kinds.items() if k.costs_restart} >= {"process_kill", "segfault", "sigterm", "hang", "node", "partition"}
    assert not any(kinds[n].costs_restart for n in ("collective", "slow_link", "controller", "lighthouse"))
    assert all(kinds[n].recovery.new_attempt for n in ("process_kill", "segfault", "sigterm", "hang", "node"))
    assert [n for n, k in kinds.items() if k.ends_this_process] == ["controller"]


def test_a_key_of_another_kind_is_refused_in_one_line():
    with pytest.raises(ConfigError) as e:
        parse_fault({"kind": "process_kill", "at_step": 5, "delay_ms": 50}, "chaos.faults[0]")
    assert str(e.value) == "chaos.faults[0].delay_ms=50: process_kill faults have no delay_ms (only slow_link do): drop it"
    with pytest.raises(ConfigError, match=r"^chaos.faults\[1\].nope: no fault has this option; a hang fault's are kind, at_step"):
        parse_fault({"kind": "hang", "at_step": 5, "nope": 1}, "chaos.faults[1]")
    with pytest.raises(ConfigError, match=r"^fault.at_step: Value 'soon' of type 'str' could not be converted to Integer"):
        FaultConfig(kind="hang", at_step="soon")
    with pytest.raises(ConfigError, match=r"^chaos.faults\[0\].kind='meteor': choose one of .*process_kill"):
        parse_fault({"kind": "meteor"}, "chaos.faults[0]")
    with pytest.raises(ConfigError, match=r"delay_s=-1.0: must be >= 0"):
        FaultConfig(kind="controller", at_step=5, delay_s=-1)
    # A null is no key: an entry built with every field (as a sweep does) names only its own.
    assert parse_fault({"kind": "node", "at_step": 5, "mode": None, "delay_ms": None}).kind == "node"
    # The Hydra syntax users type composes into the kinds' own options.
    from omegaconf import OmegaConf

    cfg = OmegaConf.structured(DrillConfig)
    cfg.merge_with_dotlist(["chaos.faults=[{kind: hang, mode: gil, at_step: 100}, {kind: slow_link, at_step: 5, delay_ms: 50, duration_s: 3}]"])
    hang, slow = build_faults(OmegaConf.to_object(cfg.chaos))
    assert (hang.mode, hang.at_step, slow.delay_ms, slow.duration_s, slow.rate) == ("gil", 100, 50.0, 3.0, None)


def test_the_drill_checks_kinds_against_the_job_by_their_launcher_traits(tmp_path, monkeypatch):
    """A controller fault on launcher=monarch is refused from the launcher class's traits: nothing
    is built (building a Monarch launcher creates ./monarch and installs a process-wide hook)."""
    monkeypatch.chdir(tmp_path)
    cfg = DrillConfig()
    cfg.chaos = ChaosConfig()
    cfg.launcher.name = "monarch"
    with pytest.raises(ConfigError, match=r"chaos.faults\[0\].kind=controller: launcher=monarch cannot take over"):
        validate_chaos(cfg, [FaultConfig(kind="controller", at_step=5)])
    with pytest.raises(ConfigError, match="a Monarch actor trains in a worker thread"):
        validate_chaos(cfg, [FaultConfig(kind="hang", mode="gil", at_step=5)])
    assert not (tmp_path / "monarch").exists()
    cfg.launcher.name = "local"
    with pytest.raises(ConfigError, match="use launcher=local_hosts"):
        validate_chaos(cfg, [FaultConfig(kind="partition", at_step=5)])
    validate_chaos(cfg, [FaultConfig(kind="controller", at_step=5), FaultConfig(kind="hang", mode="gil", at_step=6)])
    # The restart budget counts the kinds that cost a restart, and only those.
    cfg.ft.max_restarts = 1
    validate_chaos(cfg, [FaultConfig(kind="process_kill", at_step=5, target=1), FaultConfig(kind="collective", at_step=6, target=1)])
    with pytest.raises(ConfigError, match="raise ft.max_restarts"):
        validate_chaos(cfg, [FaultConfig(kind="process_kill", at_step=5, target=1), FaultConfig(kind="hang", at_step=6, target=1)])


def _kind_literals(path: pathlib.Path, names: set[str]) -> list[str]:
    """String literals equal to a kind's name in ``path`` (docstrings aside)."""
    tree = ast.parse(path.read_text())
    docs = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    return [
        f"{path.relative_to(REPO)}:{node.lineno}: {node.value!r}"
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and node.value in names and id(node) not in docs
    ]


def test_no_kind_is_named_by_a_string_outside_its_module():
    """What a kind does is read off its registry entry: the drill's code outside chaos/kinds
    never branches on a kind's name (as "controller" special cases once did)."""
    names = set(fault_kinds())
    found = [hit for path in sorted((REPO / "chaos").glob("*.py")) for hit in _kind_literals(path, names)]
    assert not found, found
    # Inside the registry, each kind's name is its own module's (base.py names only the default kind).
    for path in sorted((REPO / "chaos" / "kinds").glob("*.py")):
        own = {path.stem} | ({FaultOptions.kind} if path.stem == "base" else set())
        modes = {m for k in fault_kinds().values() for m in k.modes}  # a mode may share a kind's name (collective's hang)
        stray = [hit for hit in _kind_literals(path, names - own - modes)]
        assert not stray, stray


def test_a_kind_is_found_by_name_and_unknown_ones_say_which_there_are():
    assert fault_kind("hang").modes == ("sigstop", "gil")
    with pytest.raises(KeyError, match="no fault kind 'meteor': the kinds are"):
        fault_kind("meteor")
