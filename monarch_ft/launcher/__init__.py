"""Launchers: local processes by default; engines (Slurm, Monarch) behind the same interface.

A launcher is the module ``monarch_ft.launcher.<name>`` exposing ``build(cfg, run_dir)``
that returns a :class:`Launcher`, ``Options``, the dataclass of its ``launcher.options``
(a :class:`LauncherOptions`), and ``LAUNCHER``, its :class:`Launcher` subclass, whose
:class:`LauncherTraits` (adoptable, forkable, simulated hosts...) the rest of the code reads
instead of its name; adding one touches neither the supervisor nor this file.
"""

from __future__ import annotations

import importlib
import pkgutil

from monarch_ft.launcher.base import Launcher, LauncherOptions, LauncherTraits, RankLaunch, RankProcess

# Modules of this package that are not launchers: the interface, the simulated hosts local runs on,
# and the Slurm nodes that are simulated hosts.
_NOT_LAUNCHERS = {"base", "hosts", "slurm_nodes"}


def available_launchers() -> list[str]:
    import monarch_ft.launcher as pkg

    return sorted(m.name for m in pkgutil.iter_modules(pkg.__path__) if m.name not in _NOT_LAUNCHERS and not m.name.startswith("_"))


def options_types() -> dict[str, type[LauncherOptions]]:
    """Each launcher's options dataclass, by launcher name (registered as Hydra schemas)."""
    return {name: importlib.import_module(f"monarch_ft.launcher.{name}").Options for name in available_launchers()}


def launcher_options(cfg) -> LauncherOptions:
    """``cfg.options`` as launcher ``cfg.name``'s own options, checked (``ConfigError`` otherwise)."""
    return importlib.import_module(f"monarch_ft.launcher.{cfg.name}").Options.parse(cfg.options, cfg.name)


def launcher_class(name: str) -> type[Launcher]:
    """Launcher ``name``'s class (not an instance: nothing is built, allocated or started)."""
    return importlib.import_module(f"monarch_ft.launcher.{name}").LAUNCHER


def launcher_traits(cfg) -> LauncherTraits:
    """What launcher ``cfg.name`` run with ``cfg.options`` can do, without building it
    (``cfg``: a :class:`monarch_ft.config.launcher.LauncherConfig`; bad options: ``ConfigError``)."""
    return launcher_class(cfg.name).traits_for(launcher_options(cfg))


def build_launcher(cfg, run_dir: str) -> Launcher:
    """``cfg`` is a :class:`monarch_ft.config.launcher.LauncherConfig`."""
    if cfg.name not in available_launchers():
        raise ValueError(f"launcher={cfg.name!r} is not available: choose one of {', '.join(available_launchers())}")
    module = importlib.import_module(f"monarch_ft.launcher.{cfg.name}")
    return module.build(cfg, run_dir)


__all__ = [
    "Launcher",
    "LauncherOptions",
    "LauncherTraits",
    "RankLaunch",
    "RankProcess",
    "available_launchers",
    "build_launcher",
    "launcher_class",
    "launcher_options",
    "launcher_traits",
    "options_types",
]
