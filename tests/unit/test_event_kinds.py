"""Every record kind a process writes is an ``EventKind`` member, and every member is written.

Why: ``events.jsonl`` and the rank reports are read by kind (the controller, the drill's MTTR,
``status``, the reference in docs/reference/events.md); a kind written as a bare string drifts
from its readers and from the docs without any test noticing. Statically, every emitter call in
the code names its kind by a member; dynamically, the event log and the rank reporter refuse an
unknown name under tests (tests/conftest.py sets ``MONARCH_FT_STRICT_EVENTS=1``, which the job
tests' processes inherit).
"""

from __future__ import annotations

import ast
import functools
import json
import sys
from pathlib import Path

import pytest

from monarch_ft.records.events import STRICT_EVENTS_ENV, EventKind, EventLog, event_name

REPO = Path(__file__).resolve().parents[2]
# Everything a process of the project runs.
SOURCES = ("monarch_ft", "chaos", "recipes", "benchmarks", "scripts")
# The calls that write an event: the event log's emit (and the handles that forward to it),
# the rank reporter's event, and the report callbacks rank components are given.
EMITTERS = {"emit", "_emit", "event", "report", "_report"}
# Calls by those names that write no event: a run layout's path of a rank's report file.
NOT_EMITTERS = ("layout.report",)
# Emitters whose kind is a record's own, relayed as read (checked where it was written: the
# reporter refused any unknown name, and event_name flags it again here).
# Where a kind is carried, not named: the ranks' events relayed as they wrote them, and the
# executor writing the events a decision named (each named where it was decided).
RELAYS = {("monarch_ft/controller/decide/reports.py", "_event"), ("monarch_ft/controller/act.py", "_Emit")}


def _emitter_calls() -> tuple:
    """(path, enclosing function, call) for every emitter call in the project's code (parsed
    once per tree for both tests: a second of the fast tier each)."""
    return _calls_in(REPO, SOURCES)


@functools.cache
def _calls_in(repo: Path, sources: tuple) -> tuple:
    out = []
    for root in sources:
        for path in sorted((repo / root).rglob("*.py")):
            rel = path.relative_to(repo).as_posix()
            tree = ast.parse(path.read_text(), rel)
            for func in [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))] + [tree]:
                for node in ast.walk(func):
                    if not isinstance(node, ast.Call) or not node.args:
                        continue
                    callee = node.func.attr if isinstance(node.func, ast.Attribute) else node.func.id if isinstance(node.func, ast.Name) else None
                    if callee not in EMITTERS or ast.unparse(node.func).endswith(NOT_EMITTERS):
                        continue
                    out.append((rel, func, node))
    return tuple(out)


def _kinds_named(arg: ast.expr) -> list[str] | None:
    """The EventKind members ``arg`` names (``EventKind.X``, or either of ``EventKind.X if c else
    EventKind.Y``), or None when it is anything else."""
    if isinstance(arg, ast.IfExp):
        a, b = _kinds_named(arg.body), _kinds_named(arg.orelse)
        return None if a is None or b is None else a + b
    if isinstance(arg, ast.Attribute) and isinstance(arg.value, ast.Name) and arg.value.id == "EventKind":
        return [arg.attr]
    return None


def _forwards_an_event_kind(func: ast.AST, arg: ast.expr) -> bool:
    """``arg`` is a parameter of ``func`` annotated EventKind (a handle forwarding its caller's kind),
    or ``*args`` forwarded whole (the call it forwards is checked where it is made)."""
    if isinstance(arg, ast.Starred):
        return True
    if not isinstance(arg, ast.Name) or not isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return False
    params = func.args.posonlyargs + func.args.args + func.args.kwonlyargs
    return any(p.arg == arg.id and p.annotation is not None and ast.unparse(p.annotation) == "EventKind" for p in params)


def _func_name(func: ast.AST) -> str:
    return getattr(func, "name", "<lambda>" if isinstance(func, ast.Lambda) else "<module>")


def test_every_emitter_names_an_event_kind_member():
    bad, seen = [], set()
    for rel, func, call in _emitter_calls():
        if (rel, call.lineno, call.col_offset) in seen:
            continue  # nested functions are walked from every enclosing one
        seen.add((rel, call.lineno, call.col_offset))
        arg = call.args[0]
        kinds = _kinds_named(arg)
        if kinds is not None:
            bad += [f"{rel}:{call.lineno}: EventKind.{k} is not a member" for k in kinds if k not in EventKind.__members__]
        elif not (_forwards_an_event_kind(func, arg) or (rel, _func_name(func)) in RELAYS):
            bad.append(f"{rel}:{call.lineno}: {ast.unparse(call)[:90]}: name the kind by an EventKind member (add it there, with a doc)")
    assert not bad, "\n".join(bad)


def test_every_event_kind_is_written_somewhere():
    """The reverse: a member no emitter names is a kind no process writes, which the reference would still document."""
    named = {k for _, _, call in _emitter_calls() for k in (_kinds_named(call.args[0]) or [])}
    assert sorted(set(EventKind.__members__) - named) == []


def test_the_check_sees_a_bare_name_and_an_unknown_member(tmp_path, monkeypatch):
    """The static check itself: a string literal, a plain variable and a misspelt member are each caught."""
    bad = tmp_path / "monarch_ft" / "bad.py"
    bad.parent.mkdir()
    bad.write_text(
        "def f(reporter, events, name, kind: EventKind):\n"
        "    reporter.event('rank_started')\n"
        "    events.emit(name)\n"
        "    events.emit(EventKind.NO_SUCH_KIND)\n"
        "    events.emit(kind)\n"
        "    layout.report(1, 2, 3)\n"
    )
    monkeypatch.setattr(sys.modules[__name__], "REPO", tmp_path)
    monkeypatch.setattr(sys.modules[__name__], "SOURCES", ("monarch_ft",))
    with pytest.raises(AssertionError) as e:
        test_every_emitter_names_an_event_kind_member()
    lines = str(e.value).splitlines()
    assert [line.split(":")[1] for line in lines[:3]] == ["2", "3", "4"], lines
    assert "EventKind.NO_SUCH_KIND is not a member" in lines[2]


def test_tests_run_strict():
    import os

    assert os.environ.get(STRICT_EVENTS_ENV) == "1", "tests/conftest.py sets it, so every process a test starts refuses unknown kinds"


def test_unknown_kinds_are_refused_under_tests_and_flagged_otherwise(tmp_path, monkeypatch, capsys):
    from monarch_ft.rank.components.metrics import RankReporter

    assert event_name(EventKind.RANK_STARTED) == "rank_started" and event_name("rank_started") == "rank_started"
    log = EventLog(str(tmp_path / "events.jsonl"))
    reporter = RankReporter(str(tmp_path / "report.jsonl"), 0, 0, 0)
    for write in (lambda: log.emit("made_up_kind", x=1), lambda: reporter.event("made_up_kind", x=1)):
        with pytest.raises(ValueError, match="event kind 'made_up_kind' is not in monarch_ft.records.events.EventKind: add it there"):
            write()
    # Outside tests a record is never dropped (a rank of another version may write a kind this
    # controller does not know): written as is, with one warning per name.
    monkeypatch.delenv(STRICT_EVENTS_ENV)
    log.emit("made_up_kind", x=1)
    log.emit("made_up_kind", x=2)
    reporter.event("other_made_up_kind")
    log.emit(EventKind.JOB_STARTED)
    log.close()
    reporter.close()
    warnings = [line for line in capsys.readouterr().err.splitlines() if "not in EventKind" in line]
    assert warnings == [
        "monarch_ft: warning: event kind 'made_up_kind' is not in EventKind; written as is",
        "monarch_ft: warning: event kind 'other_made_up_kind' is not in EventKind; written as is",
    ]
    assert [json.loads(line)["event"] for line in (tmp_path / "events.jsonl").read_text().splitlines()] == ["made_up_kind", "made_up_kind", "job_started"]
    assert json.loads((tmp_path / "report.jsonl").read_text())["event"] == "other_made_up_kind"


def test_kinds_keep_their_names_on_disk():
    """Reports and events.jsonl keep their format: a member is written as its plain string."""
    assert json.dumps({"event": EventKind.STANDBY_ORPHANED}) == '{"event": "standby_orphaned"}'
    assert {k.value for k in (EventKind.STANDBY_PROMOTED_RANK, EventKind.TRANSPORT_INTERFACE, EventKind.RANK_STARTED)} == {
        "standby_promoted_rank",
        "transport_interface",
        "rank_started",
    }
