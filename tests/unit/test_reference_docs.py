"""docs/reference/ is what scripts/gen_reference.py writes from the code now, and the rule it reads docs by.

Why: the config and event references are generated so they cannot drift; this test is what
makes a stale checked-in copy fail, with the command that regenerates it.
"""

from __future__ import annotations

import enum
import importlib.util
import sys
from dataclasses import dataclass, field
from pathlib import Path


def _repo() -> Path:
    here = Path(__file__).resolve().parent
    while not (here / "pyproject.toml").exists():
        here = here.parent
    return here


def _generator():
    if "_gen_reference" not in sys.modules:
        spec = importlib.util.spec_from_file_location("_gen_reference", _repo() / "scripts" / "gen_reference.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules["_gen_reference"] = module
        spec.loader.exec_module(module)
    return sys.modules["_gen_reference"]


def test_checked_in_reference_is_current():
    gen = _generator()
    stale = gen.stale()
    assert not stale, f"{', '.join(stale)} differ from what the code says now: run {gen.COMMAND} and commit the result"


def test_reference_names_every_config_key_and_event():
    gen = _generator()
    config = (_repo() / "docs" / "reference" / "config.md").read_text()
    for key in ("ft.max_restarts", "ft.restart_window_s", "controller.lease_s", "checkpoint.save_timeout_s", "launcher.options.slurm_conf", "bench.kinds"):
        assert f"`{key}`" in config, key
    events = (_repo() / "docs" / "reference" / "events.md").read_text()
    for kind in gen.find("EventKind"):
        assert f"- `{kind.value}`" in events, kind


@dataclass
class _Inner:
    depth: int = 1
    """How deep, as a docstring after the field."""


@dataclass
class _Documented:
    """A section."""

    # The comment right above.
    # Two lines of it.
    above: int = 1
    after: str = "x"
    """The string right after wins over any comment.

    On two lines."""
    # Above, with its own line's comment too.
    both: bool = True  # trailing
    bare: float = 0.5

    inner: _Inner = field(default_factory=_Inner)


class _Kinds(str, enum.Enum):
    # Heading-like comment.
    FIRST = "first"  # the first
    SECOND = "second"
    """Second, documented after."""
    THIRD = "third"


def test_member_docs_follow_the_rule():
    gen = _generator()
    docs = gen.member_docs(_Documented)
    assert docs["above"] == "The comment right above. Two lines of it."
    assert docs["after"] == "The string right after wins over any comment. On two lines."
    assert docs["both"] == "Above, with its own line's comment too. Trailing."
    assert docs["bare"] == ""
    assert gen.member_docs(_Kinds) == {"FIRST": "Heading-like comment. The first.", "SECOND": "Second, documented after.", "THIRD": ""}
    lines = gen.field_lines(_Documented, "s.")
    assert lines[0] == "- **`s.above`** (`int`, default `1`): The comment right above. Two lines of it."
    assert lines[3] == "- **`s.bare`** (`float`, default `0.5`)"
    assert lines[4:] == ["- **`s.inner`**", "  - **`s.inner.depth`** (`int`, default `1`): How deep, as a docstring after the field."]
