"""The controller's heap and Python's cyclic garbage collector.

A full collection (generation 2) walks every container object the process holds. The
controller of a large job holds millions (a thousand groups' state hashes, straggler windows,
integrity rounds), and a full collection came every few ticks as the state grew: 240-360 ms a
time at 1,024 groups, most of the bench's slowest ticks and of a rank exit's time to be acted
on. :func:`survivors_frozen` moves what survives each full collection into the permanent
generation (``gc.freeze``), so the next full collection walks only what was made since.

What it gives up: a cycle among frozen objects that later becomes garbage is freed at the end
(``gc.unfreeze``), not before. Objects freed by their reference count (almost all of the
controller's: records, dicts of plain data) are freed as always.
"""

from __future__ import annotations

import contextlib
import gc
from typing import Any, Iterator


def _freeze_after_full(phase: str, info: dict[str, Any]) -> None:
    if phase == "stop" and info.get("generation") == 2:
        gc.freeze()


@contextlib.contextmanager
def survivors_frozen() -> Iterator[None]:
    """Within it, what survives a full collection is frozen (see the module docstring); at its
    end, frozen objects go back to the collector."""
    gc.callbacks.append(_freeze_after_full)
    try:
        yield
    finally:
        gc.callbacks.remove(_freeze_after_full)
        gc.unfreeze()
