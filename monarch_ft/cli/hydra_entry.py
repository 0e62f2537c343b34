"""The recipes' ``main``: Hydra's, with a config that does not compose refused in one line.

Hydra reports a key the schema lacks (``launcher.options.nope=1``), a value of the wrong
type (``ft.replica_groups=two``) or a missing config group option (``model=gpt5``) in
several lines, with a hint about ``HYDRA_FULL_ERROR``, and exits 1, the code of a failed
job. A config error here is one ``monarch_ft: error:`` line that names the key and what
it can be, and exit code 2, before anything is created (not even the run directory),
like every other config error of the project (monarch_ft.config.job.validate).

How: before handing over to ``hydra.main``, the same config is composed once with
Hydra's compose API from the same command line (its own argument parser; in a
multirun, each value of each sweep once); a composition error becomes that line. The
check adds one composition (tens of ms) per launch. ``HYDRA_FULL_ERROR=1`` skips it, for
Hydra's own report.
"""

from __future__ import annotations

import os
import sys
from typing import Callable, Optional

from monarch_ft.cli.run import CONFIG_DIR  # importing cli registers the schemas


def _one_line(text: str) -> str:
    """Hydra's and OmegaConf's multi-line messages as one line: the detail lines (full_key,
    object_type, the config search path) dropped, a list of available options kept, comma-separated
    (without the schema entries the project registers for Hydra's type checks)."""
    parts: list[str] = []
    options: list[str] = []
    for line in text.splitlines():
        if line.startswith("Config search path") or line.startswith("Set the environment variable HYDRA_FULL_ERROR"):
            break
        if line.startswith("\t"):
            name = line.strip()
            if name != "schema" and not name.endswith("_schema"):
                options.append(name)
            continue
        if options:
            parts.append(", ".join(options))
            options = []
        if line.strip() and not line.startswith(" "):
            parts.append(line.strip())
    if options:
        parts.append(", ".join(options))
    return " ".join(parts)


def composition_problem(config_name: str, overrides: list[str], config_dir: Optional[str] = None) -> Optional[str]:
    """Why ``overrides`` do not compose into ``config_name`` (one line), or None when they do.

    Args:
        config_name: the recipe's primary config (or the command line's ``--config-name``).
        overrides: the command line's overrides (one value of each sweep).
        config_dir: the command line's ``--config-dir``, added to the search path as Hydra adds it.
    """
    search = [f"hydra.searchpath=[file://{os.path.abspath(config_dir)}]"] if config_dir else []
    from hydra import compose, initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf import DictConfig, OmegaConf
    from omegaconf.errors import ConfigAttributeError, ConfigKeyError, OmegaConfBaseException

    def attempt(items: list[str]):
        with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3", job_name="monarch_ft_check"):
            return compose(config_name=config_name, overrides=[*items, *search])

    try:
        return _appended_unknown_key(attempt(overrides), overrides)
    except (HydraException, OmegaConfBaseException) as e:
        cause = e.__cause__ if isinstance(e.__cause__, OmegaConfBaseException) else None
        key = getattr(cause, "full_key", None)
        given = next((o for o in overrides if key and o.lstrip("+~").split("=", 1)[0] == key), None)
        if cause is None or not key or given is None:
            return _one_line(str(e))
        if not isinstance(cause, (ConfigAttributeError, ConfigKeyError)):
            # A value of the wrong type: the override, then OmegaConf's reason.
            return f"{given}: {_one_line(str(cause))}"
        # An unknown key: name the ones its section has (composed without the offending override).
        problem = f"{given}: no such key ({_one_line(str(cause))})"
        parent = key.rsplit(".", 1)[0] if "." in key else ""
        try:
            cfg = attempt([o for o in overrides if o is not given])
        except (HydraException, OmegaConfBaseException):
            return problem
        section = OmegaConf.select(cfg, parent) if parent else cfg
        if isinstance(section, DictConfig):
            problem += f"; {parent or 'the config'} has: {', '.join(str(k) for k in section.keys()) or 'no keys'}"
        return problem


def _appended_unknown_key(cfg, overrides: list[str]) -> Optional[str]:
    """A ``+key=value`` that adds a key a structured config does not have (Hydra adds it, and
    ``OmegaConf.to_object`` keeps it as a stray attribute nothing reads: a typo would be
    silently ignored), as one line; None when every appended key is a field of its section."""
    import dataclasses

    from omegaconf import DictConfig, OmegaConf

    for o in overrides:
        if not o.startswith("+") or o.startswith("++") or "=" not in o:
            continue
        key = o[1:].split("=", 1)[0]
        if key.startswith("hydra.") or "/" in key or os.path.isdir(os.path.join(CONFIG_DIR, key)):
            continue  # Hydra's own settings, or a config group appended to the defaults list
        parent, _, leaf = key.rpartition(".")
        section = OmegaConf.select(cfg, parent) if parent else cfg
        schema = OmegaConf.get_type(section) if isinstance(section, DictConfig) else None
        if schema is None or not dataclasses.is_dataclass(schema):
            continue  # a free-form section (a dict of options built in code): its owner checks it
        fields = [f.name for f in dataclasses.fields(schema)]
        if leaf not in fields:
            return f"{o}: no such key (Key '{leaf}' not in '{schema.__name__}'); {parent or 'the config'} has: {', '.join(fields) or 'no keys'}"
    return None


def _check_lines(overrides: list[str], multirun: bool) -> list[list[str]]:
    """The override lists to compose: the command line's; in a multirun each value of each sweep once."""
    if not multirun:
        return [overrides]
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parsed = OverridesParser.create().parse_overrides(overrides)
    base = [o.input_line if not o.is_sweep_override() else f"{o.get_key_element()}={next(o.sweep_string_iterator())}" for o in parsed]
    lines = [base]
    for i, o in enumerate(parsed):
        if o.is_sweep_override():
            for value in list(o.sweep_string_iterator())[1:]:
                lines.append(base[:i] + [f"{o.get_key_element()}={value}"] + base[i + 1 :])
    return lines


def run_dir_problem(overrides: list[str], multirun: bool) -> Optional[str]:
    """Why the run directory a command line names (``hydra.run.dir``; in a multirun
    ``hydra.sweep.dir``; else Hydra's default under ``outputs/``, ``multirun/``) cannot be
    created or written (one line), or None. Hydra creates it before the job's own code runs,
    and a read-only or full file system there would end the launch in Hydra's traceback."""
    key = "hydra.sweep.dir" if multirun else "hydra.run.dir"
    given = next((o.split("=", 1)[1] for o in overrides if o.split("=", 1)[0].lstrip("+") == key and "=" in o), None)
    path = os.path.abspath(given if given and "${" not in given else ("multirun" if multirun else "outputs"))
    probe = path
    while not os.path.exists(probe):
        parent = os.path.dirname(probe)
        if parent == probe:
            return None
        probe = parent
    if os.path.isdir(probe) and os.access(probe, os.W_OK | os.X_OK):
        return None
    import errno as _errno

    why = "not a directory" if not os.path.isdir(probe) else "permission denied"
    try:
        st = os.statvfs(probe)
        if st.f_flag & os.ST_RDONLY:
            why = os.strerror(_errno.EROFS)
    except OSError:
        pass
    named = f"{key}={given}" if given else f"the run directory ({path}, Hydra's default under the working directory)"
    return f"{named}: cannot create or write it ({probe}: {why}): give a writable directory with {key}="


def check_command_line(config_name: str, argv: list[str]) -> None:
    """Exit 2 with one ``monarch_ft: error:`` line if the command line's config does not compose."""
    if os.environ.get("HYDRA_FULL_ERROR") == "1":
        return
    from hydra._internal.utils import get_args_parser  # the parser hydra.main itself uses
    from hydra.errors import HydraException

    args, _ = get_args_parser().parse_known_args(argv)
    if args.help or args.hydra_help or args.info or args.cfg or args.shell_completion or args.config_path or args.experimental_rerun:
        return  # Hydra's own modes: it reports as it does
    if args.config_dir and not os.path.isdir(args.config_dir):
        print(f"monarch_ft: error: --config-dir {args.config_dir}: no such directory: give a directory of your own configs", file=sys.stderr)
        sys.exit(2)
    try:
        lines = _check_lines(args.overrides, args.multirun)
    except HydraException as e:  # an override Hydra cannot parse
        lines, problem = [], _one_line(str(e))
    else:
        problem = None
    for line in lines:
        problem = composition_problem(args.config_name or config_name, line, args.config_dir)
        if problem:
            break
    if not problem:
        problem = run_dir_problem(args.overrides, args.multirun)
    if problem:
        print(f"monarch_ft: error: {problem}", file=sys.stderr)
        sys.exit(2)


def _exit_code(exit: SystemExit) -> int:
    """The code a ``SystemExit`` would end the process with (a message is printed, as Python does)."""
    if exit.code is None:
        return 0
    if isinstance(exit.code, int):
        return exit.code
    print(exit.code, file=sys.stderr)
    return 1


def hydra_main(config_name: str) -> Callable[[Callable], Callable[[], None]]:
    """``@hydra_main("pretrain")``: ``hydra.main`` on the package's configs (CONFIG_DIR), after :func:`check_command_line`.

    The task returns its exit code or ends with ``sys.exit(code)``. A single run exits with it;
    in a sweep (``-m``) each job's code is kept, every job runs, and the sweep ends with a table
    and a code of its own (:mod:`monarch_ft.cli.sweep`)."""
    import hydra

    def wrap(task: Callable) -> Callable[[], None]:
        from monarch_ft.cli.sweep import INTERRUPTED, SweepJob, finish_sweep

        jobs: list[SweepJob] = []
        sweep_dir: list[str] = []

        def job(cfg):
            from hydra.core.hydra_config import HydraConfig
            from hydra.types import RunMode

            hc = HydraConfig.get()
            if hc.mode != RunMode.MULTIRUN:
                code = task(cfg)
                if code:
                    sys.exit(code)
                return code
            try:
                code = int(task(cfg) or 0)
            except SystemExit as e:
                code = _exit_code(e)
            except Exception:  # a bug in one job: told, and the sweep goes on with the next
                import traceback

                traceback.print_exc()
                code = 1
            jobs.append(SweepJob(int(hc.job.num), list(hc.overrides.task), hc.runtime.output_dir, code))
            sweep_dir[:] = [hc.sweep.dir]
            if code in INTERRUPTED:
                raise SystemExit(code)  # the user stopped the sweep, not one job: the table, then exit
            return code

        run = hydra.main(version_base="1.3", config_path=CONFIG_DIR, config_name=config_name)(job)

        def main() -> None:
            check_command_line(config_name, sys.argv[1:])
            try:
                run()
            except SystemExit:
                if not jobs:
                    raise
                finish_sweep(jobs, sweep_dir[0] if sweep_dir else None)
                raise
            if jobs:
                sys.exit(finish_sweep(jobs, sweep_dir[0] if sweep_dir else None))

        return main

    return wrap
