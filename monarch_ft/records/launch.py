"""How a rank is started, wherever it runs: ``python -m monarch_ft.rank.worker SPEC.json``.

The controller writes each rank's spec and hands its launcher this command
(:func:`worker_argv`); the local launcher runs it, the Slurm task wrapper runs it as its
child, the fork server's child becomes it (:func:`worker_spec`), and the Monarch launcher
runs the same ``train(spec)`` call in an actor it names by module path
(:data:`RANK_ACTOR`); the fork pool starts the fork server by its path too
(:data:`ZYGOTE_MODULE`). Naming the rank side by module path, never importing it, keeps the
controller and the launchers apart from the rank's code (and from torch).
"""

from __future__ import annotations

from typing import Optional

# The module a rank process runs: one rank, its spec file as argument.
WORKER_MODULE = "monarch_ft.rank.worker"
# The fork server a warm relaunch forks its ranks from (``python -m ZYGOTE_MODULE FD RUN_DIR [MODULE ...]``).
ZYGOTE_MODULE = "monarch_ft.rank.zygote"
# The Monarch actor that runs one rank in a Monarch proc, and the function its ``run``
# endpoint calls by default, as ``module:name`` (imported in the proc, by name).
RANK_ACTOR = "monarch_ft.rank.monarch_actor:RankActor"
RANK_ENTRY = "monarch_ft.rank.monarch_actor:_train"


def worker_argv(python: str, spec_path: str) -> list[str]:
    """The command that runs one rank from its spec file."""
    return [python, "-m", WORKER_MODULE, spec_path]


def worker_spec(argv: list[str]) -> Optional[str]:
    """The spec path of a plain rank launch (``PYTHON -m monarch_ft.rank.worker SPEC``), else None:
    anything else (a ``nice`` prefix, another program) is not what a fork can become."""
    if len(argv) == 4 and argv[1] == "-m" and argv[2] == WORKER_MODULE:
        return argv[3]
    return None
