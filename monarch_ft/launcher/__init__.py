"""Launchers: local processes by default; engines (Slurm, Monarch) behind the same interface."""

from monarch_ft.launcher.base import Launcher, RankLaunch, RankProcess, describe_exit
from monarch_ft.launcher.local import LocalLauncher


def build_launcher(name: str) -> Launcher:
    if name == "local":
        return LocalLauncher()
    raise ValueError(f"launcher={name!r} is not available: use local")


__all__ = ["Launcher", "RankLaunch", "RankProcess", "LocalLauncher", "build_launcher", "describe_exit"]
