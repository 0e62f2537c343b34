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


def _documented_classes() -> list[type]:
    """Every class whose members the reference lists: the config sections (and the dataclasses
    nested in them), the launchers' options, the chaos config and each fault kind's options, the
    MTTR bench's sweep, and the event kinds."""
    import dataclasses

    gen = _generator()
    out: list[type] = []

    def add(cls: type) -> None:
        if cls in out:
            return
        out.append(cls)
        for f in dataclasses.fields(cls):
            default = gen._default(f)
            if dataclasses.is_dataclass(default):
                add(type(default))

    add(gen.find("JobConfig"))
    for options in gen.find("options_types")().values():
        add(options)
    add(gen.find("ChaosConfig"))
    for kind in gen.find("fault_kinds")().values():
        add(kind.options)
    add(gen.bench_config())
    return out


def test_every_config_key_and_event_kind_has_a_docstring():
    """TorchTitan's job_config.py style: a string literal right after each field says what it is,
    its unit, and why its default where there is a reason; a comment is not enough."""
    gen = _generator()
    missing = {cls.__qualname__: gen.docstring_missing(cls) for cls in [*_documented_classes(), gen.find("EventKind")]}
    missing = {name: fields for name, fields in missing.items() if fields}
    assert not missing, f"fields without a docstring (a string literal right after the field): {missing}"


@dataclass
class _Inner:
    depth: int = 1
    """How deep, as a docstring after the field."""


@dataclass
class _Documented:
    """A section."""

    # A comment above is no field's doc.
    above: int = 1
    after: str = "x"
    """The string right after.

    On two lines."""
    both: bool = True  # trailing
    bare: float = 0.5

    inner: _Inner = field(default_factory=_Inner)


class _Kinds(str, enum.Enum):
    # The first group.
    FIRST = "first"
    """The first."""
    SECOND = "second"  # trailing
    # The second group:
    THIRD = "third"


def test_member_docs_follow_the_rule():
    gen = _generator()
    docs = gen.member_docs(_Documented)
    assert docs["above"] == ""
    assert docs["after"] == "The string right after. On two lines."
    assert docs["both"] == "Trailing."
    assert docs["bare"] == ""
    assert gen.docstring_missing(_Documented) == ["above", "both", "bare", "inner"]
    assert gen.member_docs(_Kinds) == {"FIRST": "The first.", "SECOND": "Trailing.", "THIRD": ""}
    assert gen.member_headings(_Kinds) == {"FIRST": "The first group", "THIRD": "The second group"}
    assert gen.enum_lines(_Kinds) == ["**The first group**", "", "- `first`: The first.", "- `second`: Trailing.", "", "**The second group**", "", "- `third`"]
    lines = gen.field_lines(_Documented, "s.")
    assert lines[0] == "- **`s.above`** (`int`, default `1`)"
    assert lines[1] == "- **`s.after`** (`str`, default `x`): The string right after. On two lines."
    assert lines[4:] == ["- **`s.inner`**", "  - **`s.inner.depth`** (`int`, default `1`): How deep, as a docstring after the field."]
