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
    """The launcher, a module of ``monarch_ft.launcher``. Select it with ``launcher=<name>`` (which
    also types ``options``), not ``launcher.name=``; ``launcher=local_hosts`` is ``local`` with
    ``options.simulated_hosts=true``."""

    max_ranks_per_core: int = 4
    """Upper bound on ranks per CPU core of this machine (at least 4 ranks are always allowed): a
    job asking for more is refused before launch. Only for launchers whose ranks all run on this
    machine (local); refused with the others, whose ranks run on the cluster's nodes."""

    options: Any = field(default_factory=dict)
    """The launcher's own options (its ``Options`` dataclass, below): one of another launcher is refused."""
