"""``monarch-ft COMMAND ...`` (the installed command; ``python -m monarch_ft COMMAND ...`` alike).

    monarch-ft pretrain [OVERRIDES]        fault-tolerant pretraining (Hydra: key=value, -m, --config-dir, --help)
    monarch-ft drill [OVERRIDES]           a job with faults injected; MTTR measured phase by phase
    monarch-ft mttr-bench [OVERRIDES]      recovery modes x fault kinds, one report
    monarch-ft goodput-bench [OVERRIDES]   goodput under a fault rate, three ways to recover
    monarch-ft status RUN_DIR [--json]     a job at a glance
    monarch-ft stacks RUN_DIR [--group G]  every rank's Python stacks now
    monarch-ft stop RUN_DIR                stop a job cleanly
    monarch-ft verify RUN_DIR              every checkpoint on disk against its manifest
    monarch-ft slurm-cluster WORKDIR       a local Slurm cluster (for launcher=slurm), until Ctrl-C

The recipe commands take Hydra's command line exactly as ``recipes/<name>.py`` in a checkout
does; their configs ship in the package (monarch_ft/configs) and run directories default
under the working directory (``outputs/``, ``multirun/``).
"""

from __future__ import annotations

import sys

# Command -> its recipe module (each a Hydra app with a ``main()``), in the order of the help.
RECIPES = {
    "pretrain": "monarch_ft.recipes.pretrain",
    "drill": "monarch_ft.recipes.drill",
    "mttr-bench": "monarch_ft.recipes.mttr_bench",
    "goodput-bench": "monarch_ft.recipes.goodput_bench",
}
# The commands on a run directory (monarch_ft.cli.main).
JOB_COMMANDS = ("status", "stacks", "stop", "verify")
SLURM_CLUSTER = "slurm-cluster"


def _recipe(command: str):
    """The ``main`` of a recipe command (imported only when that command runs: each pulls in Hydra and its schemas)."""
    if command == "pretrain":
        from monarch_ft.recipes.pretrain import main
    elif command == "drill":
        from monarch_ft.recipes.drill import main
    elif command == "mttr-bench":
        from monarch_ft.recipes.mttr_bench import main
    else:
        from monarch_ft.recipes.goodput_bench import main
    return main


def main(argv: list[str] | None = None) -> int:
    """The ``monarch-ft`` command: dispatch to a recipe (Hydra), a run-directory command or the Slurm cluster.

    Args:
        argv: the arguments after the program's name (default: ``sys.argv[1:]``).
    """
    argv = sys.argv[1:] if argv is None else list(argv)
    commands = [*RECIPES, *JOB_COMMANDS, SLURM_CLUSTER]
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(__doc__.replace("``", "").strip())
        return 0 if argv else 2
    command, rest = argv[0], argv[1:]
    if command in RECIPES:
        # Hydra reads sys.argv itself: the program is the command, the rest its command line.
        sys.argv = [f"monarch-ft {command}", *rest]
        _recipe(command)()
        return 0
    if command in JOB_COMMANDS:
        from monarch_ft.cli.main import main as job_main

        return job_main(argv)
    if command == SLURM_CLUSTER:
        from monarch_ft.testing.slurm_cluster import main as cluster_main

        return cluster_main(rest)
    print(f"monarch_ft: error: unknown command {command!r}: choose among {', '.join(commands)} (monarch-ft --help)", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
