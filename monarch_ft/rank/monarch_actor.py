"""The actor that runs one rank inside a Monarch proc (imported in the proc, not the controller).

The rank side of ``launcher=monarch``: the launcher (``monarch_ft.launcher.monarch``) names it
by module path (``monarch_ft.records.launch.RANK_ACTOR``): the controller loads this module
(light: no torch) only to spawn the actors, and the trainer is imported in the proc, by
``_train``. The trainer runs in a worker thread of the actor's event loop, so the actor keeps
answering ``info``/``signal`` while ``run`` is in flight.
"""

from __future__ import annotations

import asyncio
import importlib
import json
import logging
import os
import socket
import sys
import threading

from monarch.actor import Actor, endpoint

from monarch_ft.common.process import die_with_parent
from monarch_ft.records.launch import RANK_ENTRY


def _train(spec_path: str) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from monarch_ft.rank.trainer import RankSpec, train

    with open(spec_path) as f:
        spec = RankSpec(**json.load(f))
    train(spec)
    sys.stdout.flush()
    sys.stderr.flush()
    return 0


def _exit_now() -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


class RankActor(Actor):
    """One rank of a replica group: ``run(spec_path)`` is ``monarch_ft.rank.worker``'s ``train()`` call."""

    def __init__(self) -> None:
        die_with_parent()  # the proc's recording sh dies -> the rank dies
        self._running = False

    @endpoint
    async def info(self) -> dict:
        return {"pid": os.getpid(), "ppid": os.getppid(), "host": socket.gethostname()}

    @endpoint
    async def run(self, spec_path: str, entry: str = RANK_ENTRY, exit_after_s: float = 1.0) -> int:
        """Calls ``entry(spec_path)`` (``module:function``; train() by default) in a worker thread."""
        module, _, name = entry.partition(":")
        fn = getattr(importlib.import_module(module), name)
        # train() returns once the rank reported rank_finished; what it leaves behind
        # (torchft's native threads) is ended with the proc when the launcher stops the mesh.
        self._running = True
        try:
            code = await asyncio.to_thread(fn, spec_path)
        finally:
            self._running = False
        if exit_after_s > 0:
            # As monarch_ft.rank.worker does after train(): torchft's native threads may outlive
            # the loop, and a graceful ProcMesh.stop() then waits out Monarch's timeouts
            # (0-8 s measured). The reply goes first; the proc then ends itself with 0.
            threading.Timer(exit_after_s, _exit_now).start()
        return code

    @endpoint
    async def signal(self, sig: int) -> None:
        os.kill(os.getpid(), sig)
