"""Writes docs/reference/config.md and docs/reference/events.md from the code itself.

    .venv/bin/python scripts/gen_reference.py            # rewrite both pages
    .venv/bin/python scripts/gen_reference.py --check    # exit 1 if a checked-in page is stale

Why generated: a reference written by hand drifts from the dataclasses and enums it
describes; this one cannot, since a fast test (tests/unit/test_reference_docs.py) fails when
the checked-in pages differ from what this script writes now.

Where the words come from: every config key is a field of a dataclass and every event a
member of ``EventKind``. A member's doc is the string literal right after it (the style of
TorchTitan's ``job_config.py``; every config field and every event kind has one, which the
test checks) or, failing that, a comment at the end of its own line (the short status enums).
Comment lines above a member are never its doc: in an enum they head the group of members
that follows (``# Chaos drills.``), and the page shows them as such. The classes are found by
import and their source read with ``inspect.getsource`` + ``ast``, so moving a module changes
at most the import candidates below, never the rule.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import importlib
import importlib.util
import inspect
import io
import json
import os
import re
import sys
import textwrap
import tokenize
from enum import Enum
from typing import Any, Callable, Iterable, Optional

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

OUT_DIR = os.path.join(REPO, "docs", "reference")
COMMAND = ".venv/bin/python scripts/gen_reference.py"

# Where each thing lives.
CANDIDATES: dict[str, list[str]] = {
    "JobConfig": ["monarch_ft.config.job"],
    "options_types": ["monarch_ft.launcher"],
    "ChaosConfig": ["chaos.config"],
    "FaultOptions": ["chaos.kinds"],
    "fault_kinds": ["chaos.kinds"],
    "EventKind": ["monarch_ft.records.events"],
    "JobStatus": ["monarch_ft.records.events"],
    "GroupStatus": ["monarch_ft.records.events"],
    "GiveUpReason": ["monarch_ft.records.events"],
    "RecoveryPath": ["monarch_ft.records.events"],
    "RankExit": ["monarch_ft.records.exits"],
}
# The benches' own sections live in their recipes' modules.
BENCH_RECIPE = "monarch_ft.recipes.mttr_bench"
GOODPUT_RECIPE = "monarch_ft.recipes.goodput_bench"


def find(name: str) -> Any:
    """``name`` from the first of its candidate modules that defines it."""
    tried = []
    for module in CANDIDATES[name]:
        try:
            mod = importlib.import_module(module)
        except ModuleNotFoundError as e:
            if not (e.name and (module == e.name or module.startswith(e.name + "."))):
                raise  # the module exists but something it imports is missing: a real error
            tried.append(module)
            continue
        if hasattr(mod, name):
            return getattr(mod, name)
        tried.append(module)
    raise SystemExit(f"gen_reference: error: {name} is in none of {', '.join(tried)}: add its module to CANDIDATES in scripts/gen_reference.py")


def bench_config(module: str = BENCH_RECIPE, name: str = "BenchConfig") -> type:
    """``BenchConfig`` of the MTTR bench's recipe (monarch_ft.recipes.mttr_bench), or another recipe's class."""
    return getattr(importlib.import_module(module), name)


# -- the docs of a class's members ------------------------------------------------------------


def _one_paragraph(text: str) -> str:
    """``text`` on one line, in Markdown: reST roles and double backquotes become plain code spans."""
    text = " ".join(line.strip() for line in text.splitlines() if line.strip())
    return re.sub(r":[a-z]+:`~?([^`]+)`", r"`\1`", text).replace("``", "`")


def _sentence(text: str) -> str:
    """``text`` starting with a capital and ending with a full stop."""
    text = text.strip()
    if not text:
        return text
    return text[0].upper() + text[1:] + ("" if text[-1] in ".!?)" else ".")


def member_docs(cls: type) -> dict[str, str]:
    """Each member (field, enum member) of ``cls`` and its bases -> its doc, by the rule in the module doc."""
    return {name: doc for name, (doc, _) in _members(cls).items()}


def member_headings(cls: type) -> dict[str, str]:
    """Each member of ``cls`` that a comment block right above it heads -> that heading."""
    return {name: heading for name, (_, heading) in _members(cls).items() if heading}


def docstring_missing(cls: type) -> list[str]:
    """The fields (or members) of ``cls`` and its bases without a string literal right after them."""
    found: dict[str, bool] = {}
    for klass in _own_classes(cls):
        found.update({name: has for name, (_, _, has) in _docs_in_class_source(textwrap.dedent(inspect.getsource(klass))).items()})
    names = [f.name for f in dataclasses.fields(cls)] if dataclasses.is_dataclass(cls) else [m.name for m in cls]  # type: ignore[attr-defined]
    return [name for name in names if not found.get(name)]


def _own_classes(cls: type) -> list[type]:
    """``cls`` and its bases whose source is the project's (not object, not the enum machinery), base first."""
    out = []
    for klass in reversed(cls.__mro__):
        if klass is object or klass.__module__ in ("builtins", "enum"):
            continue
        try:
            inspect.getsource(klass)
        except (OSError, TypeError):
            continue
        out.append(klass)
    return out


def _members(cls: type) -> dict[str, tuple[str, str]]:
    out: dict[str, tuple[str, str]] = {}
    for klass in _own_classes(cls):
        out.update({name: (doc, heading) for name, (doc, heading, _) in _docs_in_class_source(textwrap.dedent(inspect.getsource(klass))).items()})
    return out


def _docs_in_class_source(source: str) -> dict[str, tuple[str, str, bool]]:
    """Each member of the class in ``source`` -> (its doc, the heading above it, whether the doc is a docstring)."""
    tree = ast.parse(source)
    cls = next(node for node in tree.body if isinstance(node, ast.ClassDef))
    lines = source.splitlines()
    trailing: dict[int, str] = {}
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT and lines[tok.start[0] - 1][: tok.start[1]].strip():
            trailing[tok.start[0]] = tok.string.lstrip("#").strip()
    docs: dict[str, tuple[str, str, bool]] = {}
    body = cls.body
    for i, stmt in enumerate(body):
        if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
            name = stmt.target.id
        elif isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name):
            name = stmt.targets[0].id
        else:
            continue
        above: list[str] = []
        n = stmt.lineno - 2  # the line above, 0-based
        while n >= 0 and lines[n].strip().startswith("#"):
            above.insert(0, lines[n].strip().lstrip("#").strip())
            n -= 1
        heading = _one_paragraph(" ".join(above)).rstrip(".:")
        after = body[i + 1] if i + 1 < len(body) else None
        if isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant) and isinstance(after.value.value, str):
            docs[name] = (_one_paragraph(inspect.cleandoc(after.value.value)), heading, True)
            continue
        end = [trailing[n] for n in range(stmt.lineno, (stmt.end_lineno or stmt.lineno) + 1) if n in trailing]
        docs[name] = (_one_paragraph(" ".join(_sentence(part) for part in end if part)), heading, False)
    return docs


def class_doc(cls: type) -> str:
    """The class's own docstring (never the signature dataclasses put in ``__doc__``)."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    except (OSError, TypeError):
        return ""
    node = next(n for n in tree.body if isinstance(n, ast.ClassDef))
    return inspect.cleandoc(ast.get_docstring(node) or "")


# -- rendering ----------------------------------------------------------------------------------


def value_text(value: Any) -> str:
    """A default as one would write it on the command line (YAML)."""
    if isinstance(value, Enum):
        value = value.value
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return value if value else '""'
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(value_text(v) for v in value) + "]"
    if isinstance(value, dict):
        return json.dumps(value)
    return repr(value)


def type_text(field: dataclasses.Field) -> str:
    t = field.type
    return t if isinstance(t, str) else getattr(t, "__name__", str(t))


def _default(field: dataclasses.Field) -> Any:
    if field.default is not dataclasses.MISSING:
        return field.default
    if field.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
        return field.default_factory()  # type: ignore[misc]
    return dataclasses.MISSING


def field_lines(cls: type, prefix: str, skip: Iterable[str] = ()) -> list[str]:
    """One bullet per field of ``cls`` (``prefix`` + name, type, default, doc); a field that is
    itself a dataclass gets its own bullets under its name."""
    docs = member_docs(cls)
    out: list[str] = []
    for f in dataclasses.fields(cls):
        if f.name in skip:
            continue
        default = _default(f)
        doc = docs.get(f.name, "")
        if dataclasses.is_dataclass(default):
            about = doc or _one_paragraph(class_doc(type(default)).split("\n\n")[0])
            out.append(f"- **`{prefix}{f.name}`**" + (f": {about}" if about else ""))
            out += ["  " + line for line in field_lines(type(default), f"{prefix}{f.name}.")]
            continue
        shown = "(required)" if default is dataclasses.MISSING else f"`{value_text(default)}`"
        out.append(f"- **`{prefix}{f.name}`** (`{type_text(f)}`, default {shown})" + (f": {doc}" if doc else ""))
    return out


def section(title: str, doc: str, lines: list[str], level: int = 2) -> list[str]:
    out = [f"{'#' * level} {title}", ""]
    if doc:
        out += [_one_paragraph(doc), ""]
    return out + lines + [""]


HEADER = "<!-- Generated by scripts/gen_reference.py from {what}: do not edit; run `{command}`. -->"


def render_config() -> str:
    job_cls = find("JobConfig")
    out = [
        HEADER.format(what="the config dataclasses", command=COMMAND),
        "",
        "# Config reference",
        "",
        "Every key a recipe takes on its command line (`key=value`, Hydra's syntax), with its type, its default and",
        "what it does. `monarch-ft pretrain` takes the job's sections; `monarch-ft drill` adds `chaos`;",
        "`monarch-ft mttr-bench` adds `chaos` and `bench`; `monarch-ft goodput-bench` adds `goodput`. A key that is not here,",
        "or a value of the wrong type, is",
        "refused before anything starts (one `monarch_ft: error:` line, exit 2).",
        "",
        "Sections: "
        + ", ".join(f"[`{f.name}`](#{f.name})" for f in dataclasses.fields(job_cls) if dataclasses.is_dataclass(_default(f)))
        + ", [`chaos`](#chaos) (drills), [`bench`](#bench) (the MTTR bench), [`goodput`](#goodput) (the goodput bench).",
        "",
    ]
    for f in dataclasses.fields(job_cls):
        value = _default(f)
        if not dataclasses.is_dataclass(value):
            continue
        cls = type(value)
        out += section(f.name, class_doc(cls), field_lines(cls, f"{f.name}."))
        if f.name == "launcher":
            for name, options in sorted(find("options_types")().items()):
                out += section(
                    f"`launcher={name}`: `launcher.options`",
                    class_doc(options),
                    field_lines(options, "launcher.options.") or ["(no options)"],
                    level=3,
                )
    chaos_cls = find("ChaosConfig")
    out += section("chaos", class_doc(chaos_cls) or "A drill's faults (`monarch-ft drill`, `monarch-ft mttr-bench`).", field_lines(chaos_cls, "chaos."))
    base = find("FaultOptions")
    out += section("`chaos.faults` entries", class_doc(base), field_lines(base, ""), level=3)
    common = {f.name for f in dataclasses.fields(base)}
    for name, kind in sorted(find("fault_kinds")().items()):
        module_doc = inspect.getmodule(type(kind)).__doc__ or ""
        first = _one_paragraph(module_doc.split("\n\n")[0])
        modes = tuple(getattr(kind, "modes", ()))
        facts = (
            f"Category `{value_text(kind.category)}`"
            + ("; costs a restart of its group" if getattr(kind, "costs_restart", False) else "")
            + (f"; `{getattr(kind, 'mode_option', 'mode')}`: {', '.join(f'`{m}`' for m in modes)} (the first is the default)" if modes else "")
            + "."
        )
        own = field_lines(kind.options, "", skip=common)
        out += section(f"`kind: {name}`", f"{first} {facts}".strip(), own or ["No options of its own."], level=4)
    bench = bench_config()
    out += section("bench", class_doc(bench) or "The MTTR bench's sweep (`monarch-ft mttr-bench` only).", field_lines(bench, "bench."))
    cells = bench_config(GOODPUT_RECIPE, "GoodputConfig")
    out += section("goodput", class_doc(cells), field_lines(cells, "goodput."))
    return "\n".join(out).rstrip() + "\n"


def enum_lines(enum_cls: type, name: Callable[[Any], str] = lambda m: str(m.value)) -> list[str]:
    """One bullet per member; a comment heading a group of members becomes a line of its own above them."""
    docs, headings = member_docs(enum_cls), member_headings(enum_cls)
    out: list[str] = []
    for m in enum_cls:
        if m.name in headings:
            out += ([""] if out else []) + [f"**{headings[m.name]}**", ""]
        out.append(f"- `{name(m)}`" + (f": {docs[m.name]}" if docs.get(m.name) else ""))
    return out


def render_events() -> str:
    kinds = find("EventKind")
    out = [
        HEADER.format(what="EventKind and the status enums", command=COMMAND),
        "",
        "# Events and statuses reference",
        "",
        "`events.jsonl` in a run directory holds one JSON object per line: `time` (wall clock, seconds), `event`",
        "(one of the kinds below) and the event's own fields. The controller writes the job's and the groups'",
        "events; the ranks' records reach it through their report files and are relayed into the same log.",
        "",
    ]
    out += section("Event kinds", class_doc(kinds), enum_lines(kinds))
    for name, title in (
        ("JobStatus", "Job statuses (`summary.json` `status`)"),
        ("GroupStatus", "Group states (`python -m monarch_ft status`)"),
        ("GiveUpReason", "Why a group was given up"),
        ("RecoveryPath", "Recovery paths (`recovery_path` events, `drill.json`)"),
    ):
        cls = find(name)
        out += section(title, class_doc(cls), enum_lines(cls))
    exits = find("RankExit")
    out += section("Rank exit codes", class_doc(exits), enum_lines(exits, lambda m: f"{m.value}` `{m.name.lower()}"))
    return "\n".join(out).rstrip() + "\n"


def pages() -> dict[str, str]:
    """Each reference page's path -> its content as the code says now."""
    return {os.path.join(OUT_DIR, "config.md"): render_config(), os.path.join(OUT_DIR, "events.md"): render_events()}


def stale(pages_now: Optional[dict[str, str]] = None) -> list[str]:
    """The checked-in pages that differ from what the code says now."""
    out = []
    for path, text in (pages_now or pages()).items():
        try:
            with open(path) as f:
                if f.read() == text:
                    continue
        except FileNotFoundError:
            pass
        out.append(os.path.relpath(path, REPO))
    return out


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 if a page is stale")
    args = parser.parse_args(argv)
    now = pages()
    if args.check:
        old = stale(now)
        for path in old:
            print(f"gen_reference: {path} is stale: run {COMMAND}", file=sys.stderr)
        return 1 if old else 0
    os.makedirs(OUT_DIR, exist_ok=True)
    for path, text in now.items():
        with open(path, "w") as f:
            f.write(text)
        print(f"gen_reference: wrote {os.path.relpath(path, REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
