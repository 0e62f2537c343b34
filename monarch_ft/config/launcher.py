"""``launcher``: how ranks become processes (:mod:`monarch_ft.launcher`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class LauncherConfig:
    """How ranks become processes: ``local`` (embedded default) or an engine (``monarch``, ``slurm``).

    ``name`` selects the module ``monarch_ft.launcher.<name>``; ``options`` are that
    launcher's own settings, its ``Options`` dataclass (a typed node once ``launcher=<name>``
    is selected: see :func:`register_configs`; a plain dict when built in code).
    """

    name: str = "local"
    # Upper bound on ranks per CPU core the local machine is asked to run.
    max_ranks_per_core: int = 4
    options: Any = field(default_factory=dict)
