"""Every command in the README and under docs/ runs as written, checked without running it.

A recipe command (``monarch-ft <recipe> overrides...``, ``recipes/<name>.py overrides...`` in a
checkout) must compose with Hydra's compose API
against the recipe's config (``pretrain``, ``drill``, ``mttr_bench``) and pass the checks its
recipe makes before launching anything: the job's ``validate``, a drill's faults, a sweep's
plan. ``monarch-ft <command> ...`` (``python -m monarch_ft <command> ...``) must name a real
subcommand with arguments it takes; ``python -m <module>`` an importable module; a script a file that exists. The test
command the README gives is the one ``.ci/run`` runs.

Why: the docs are where users copy commands from, and a renamed key (``bench.kind`` for
``bench.kinds``) breaks them silently. Fast: nothing is launched.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import io
import re
import runpy
import shlex
import sys
from pathlib import Path
from unittest import mock

import pytest
from omegaconf import OmegaConf


def _repo() -> Path:
    here = Path(__file__).resolve().parent
    while not (here / "pyproject.toml").exists():
        here = here.parent
    return here


REPO = _repo()
CONFIG_DIR = str(REPO / "monarch_ft" / "configs")
DOCS = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
PYTHONS = {".venv/bin/python", "python", "python3"}
COMMAND = {"monarch-ft", ".venv/bin/monarch-ft"}
# monarch-ft's recipe commands: each runs monarch_ft.recipes.<its name with _ for ->.
RECIPE_COMMANDS = ("pretrain", "drill", "mttr-bench", "goodput-bench")

_FENCE = re.compile(r"^```(\w*)\s*$")
_INLINE = re.compile(r"`((?:\.venv/bin/python|python3?|(?:\.venv/bin/)?monarch-ft) [^`]+)`")


def commands_in(text: str) -> list[tuple[str, bool]]:
    """The shell commands of a Markdown text, each with whether it was inline: each line of a bash/sh
    block (continuations joined, a ``$ `` prompt dropped, ``&&`` chains split), and inline code that
    starts with a Python (a mention: ``python -m monarch_ft status`` names the command without its run directory)."""
    out: list[str] = []
    lang = None
    pending = ""
    for line in text.splitlines():
        fence = _FENCE.match(line.strip())
        if fence:
            lang = fence.group(1) if lang is None else None
            continue
        if lang in ("bash", "sh", "shell"):
            line = pending + line.strip()
            if line.endswith("\\"):
                pending = line[:-1] + " "
                continue
            pending = ""
            line = line[2:] if line.startswith("$ ") else line
            if line and not line.startswith("#"):
                out += [(part.strip(), False) for part in line.split("&&")]
        elif lang is None:
            out += [(m.group(1), True) for m in _INLINE.finditer(line)]
    return out


def _all_commands() -> list[tuple[str, str, bool]]:
    return [(str(path.relative_to(REPO)), cmd, inline) for path in DOCS for cmd, inline in commands_in(path.read_text())]


def _recipe(name: str):
    """The recipe's module, monarch_ft.recipes.<name> (importing it registers its config schemas)."""
    return importlib.import_module(f"monarch_ft.recipes.{name}")


def _sweep_lines(overrides: list[str], multirun: bool) -> list[list[str]]:
    """The override lists a command composes: itself; under ``-m`` each value of each sweep once."""
    if not multirun:
        return [overrides]
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parsed = OverridesParser.create().parse_overrides(overrides)
    base = [o.input_line if not o.is_sweep_override() else f"{o.get_key_element()}={next(o.sweep_string_iterator())}" for o in parsed]
    lines = [base]
    for i, o in enumerate(parsed):
        if o.is_sweep_override():
            lines += [base[:i] + [f"{o.get_key_element()}={v}"] + base[i + 1 :] for v in list(o.sweep_string_iterator())[1:]]
    return lines


def check_recipe(name: str, args: list[str]) -> None:
    """Compose the recipe's config from ``args`` and make the checks the recipe makes before it launches anything."""
    from hydra import compose, initialize_config_dir

    from monarch_ft.controller.preflight import preflight as validate

    recipe = _recipe(name)
    multirun = any(a in ("-m", "--multirun") for a in args)
    overrides = [a for a in args if a not in ("-m", "--multirun")]
    assert not [a for a in overrides if a.startswith("-")], f"flags the docs' recipe commands do not take: {overrides}"
    for line in _sweep_lines(overrides, multirun):
        with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3", job_name="docs_check"):
            cfg = OmegaConf.to_object(compose(config_name=name, overrides=line))
        if name == "drill":
            from chaos.config import validate_chaos
            from chaos.schedule import build_faults

            faults = build_faults(cfg.chaos)
            validate(cfg)
            validate_chaos(cfg, faults)
        elif name == "mttr_bench":
            recipe.plan(cfg)
        else:
            validate(cfg)


class _Parsed(Exception):
    """The command line parsed: stop before the command runs."""


def check_cli(args: list[str]) -> None:
    """``python -m monarch_ft ARGS`` parses: a real subcommand and arguments it takes (parsed, then stopped
    before anything runs)."""
    parse_args = argparse.ArgumentParser.parse_args

    def parse_then_stop(self, *a, **kw):
        parse_args(self, *a, **kw)  # a bad command line exits 2 here, with its one line on stderr
        raise _Parsed

    argv = sys.argv
    sys.argv = ["monarch_ft", *args]
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()) as err:
            with mock.patch.object(argparse.ArgumentParser, "parse_args", parse_then_stop), pytest.raises((_Parsed, SystemExit)) as done:
                runpy.run_module("monarch_ft", run_name="__main__", alter_sys=False)
    finally:
        sys.argv = argv
    assert done.type is _Parsed, f"python -m monarch_ft {' '.join(args)}: {err.getvalue().strip()}"


def check(cmd: str, inline: bool = False) -> None:
    argv = shlex.split(cmd, comments=True)
    if not argv:
        return
    if argv[0] in COMMAND:  # the installed command: what python -m monarch_ft runs
        argv = ["python", "-m", "monarch_ft", *argv[1:]]
    if argv[0] == "bash" and len(argv) > 1 and argv[1].endswith(".sh"):
        argv = argv[1:]
    if argv[0].endswith(".sh"):
        assert (REPO / argv[0]).is_file(), f"{argv[0]}: no such script"
        return
    if argv[0] not in PYTHONS or len(argv) < 2:
        return  # not ours: kill, ps, tensorboard, ruff...
    if argv[1] == "-m":
        module, rest = argv[2], argv[3:]
        if module == "monarch_ft" and rest in (["--help"], ["-h"]):
            return
        if module == "monarch_ft" and rest and rest[0] in RECIPE_COMMANDS:
            if not (inline and len(rest) == 1):  # inline, the command alone is a mention
                check_recipe(rest[0].replace("-", "_"), rest[1:])
        elif module == "monarch_ft":
            check_cli(rest + ["RUN_DIR"] if inline and len(rest) == 1 else rest)
        elif module != "pytest":
            assert importlib.util.find_spec(module) is not None, f"python -m {module}: no such module"
        return
    script = argv[1]
    assert (REPO / script).is_file(), f"{script}: no such file"
    if script.startswith("recipes/"):
        check_recipe(Path(script).stem, argv[2:])
    else:  # a benchmark or a script with argparse: its flags must be ones it declares
        declared = set(re.findall(r"add_argument\(\s*[\"'](--[\w-]+)", (REPO / script).read_text()))
        unknown = [a.split("=")[0] for a in argv[2:] if a.startswith("--") and a.split("=")[0] not in declared]
        assert not unknown, f"{script}: no such option {', '.join(unknown)} (it has {', '.join(sorted(declared))})"


COMMANDS = _all_commands()


def test_docs_have_commands():
    """The extraction finds the README's commands (so an empty parametrization cannot pass unnoticed)."""
    readme = [c for where, c, _ in COMMANDS if where == "README.md"]
    assert any("monarch-ft drill" in c for c in readme) and any("monarch-ft mttr-bench" in c for c in readme), readme
    assert any(c.startswith("bash scripts/install.sh") for c in readme), readme


def simulated_clusters(where: str) -> set[str]:
    """The slurm.conf of every cluster of simulated nodes the page starts
    (``python -m monarch_ft.testing.slurm_cluster --nodes N DIR``): a command run on one may use node
    faults, which the job's check allows only where the cluster's record (written beside its
    slurm.conf when it starts) exists; nothing is started here, so the check takes it as there."""
    out = set()
    for cmd, _ in commands_in((REPO / where).read_text()):
        argv = [a for a in shlex.split(cmd, comments=True) if a != "&"]
        if argv[1:3] == ["-m", "monarch_ft.testing.slurm_cluster"] and "--nodes" in argv:
            out.add(f"{argv[-1]}/etc/slurm.conf")
    return out


@pytest.mark.parametrize("where,cmd,inline", COMMANDS, ids=[f"{w}:{c[:60]}" for w, c, _ in COMMANDS])
def test_command_runs_as_written(where, cmd, inline):
    from monarch_ft.launcher import slurm

    clusters, real = simulated_clusters(where), slurm.read_record
    try:
        with mock.patch.object(slurm, "read_record", lambda conf: ["a simulated node"] if conf in clusters else real(conf)):
            check(cmd, inline)
    except Exception as e:  # a config error, a composition error: say which command
        raise AssertionError(f"{where}: {cmd}\n  {type(e).__name__}: {e}") from None


def test_bench_kind_is_refused():
    """The check does fail on a key that does not compose (the old spelling bench.kind)."""
    with pytest.raises(Exception, match="bench.kind"):
        check("python recipes/mttr_bench.py -m bench.kind=process_kill,node 'bench.modes=[live]'")


def test_unknown_script_option_is_refused():
    with pytest.raises(AssertionError, match="no such option --size-tb"):
        check(".venv/bin/python benchmarks/transport_bench.py --size-tb 1")


def test_unknown_subcommand_is_refused():
    with pytest.raises(AssertionError, match="unknown command 'statu'"):
        check("python -m monarch_ft statu RUN_DIR")
    with pytest.raises(AssertionError, match="unknown command 'pretrian'"):
        check("monarch-ft pretrian training.steps=5")
    with pytest.raises(AssertionError, match="unrecognized arguments"):
        check("python -m monarch_ft stacks RUN_DIR [--group G]")


def test_readme_test_command_is_what_ci_runs():
    """The README's test command and .ci/run agree: .ci/run runs exactly the command lines the README shows."""
    readme = (REPO / "README.md").read_text()
    block = re.search(r"<!-- test command -->\s*```bash\n(.*?)```", readme, re.S)
    assert block, "README.md: the test command is the ```bash block after <!-- test command -->"
    shown = [line.strip() for line in block.group(1).splitlines() if line.strip() and not line.strip().startswith("#")]
    ci = [
        line.strip()
        for line in (REPO / ".ci" / "run").read_text().splitlines()
        if line.strip() and not line.startswith("#") and not re.match(r"(set |cd )", line.strip())
    ]
    assert shown == ci, f"README.md shows {shown} but .ci/run runs {ci}: make them the same"


_LINK = re.compile(r"\]\(([^)\s]+)\)")


def _anchors(path: Path) -> set[str]:
    """GitHub's anchors of a Markdown file's headings."""
    out = set()
    for line in path.read_text().splitlines():
        if line.startswith("#"):
            title = line.lstrip("#").strip().lower()
            out.add(re.sub(r"[^\w\- ]", "", title).replace(" ", "-"))
    return out


def test_docs_links_resolve():
    """Every relative link of the README and docs/ names a file that exists (and a heading it has).
    A drill's own report.md under docs/results/ is kept as the drill wrote it, so it is not judged."""
    broken = []
    for doc in DOCS:
        if doc.name == "report.md" and "results" in doc.parts:
            continue
        for target in _LINK.findall(doc.read_text()):
            if re.match(r"[a-z]+:", target):
                continue  # https:, mailto:
            path, _, anchor = target.partition("#")
            dest = (doc.parent / path).resolve() if path else doc
            if not dest.exists():
                broken.append(f"{doc.relative_to(REPO)}: {target}")
            elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
                broken.append(f"{doc.relative_to(REPO)}: {target} (no such heading)")
    assert not broken, "broken links:\n" + "\n".join(broken)
