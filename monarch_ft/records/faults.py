"""Fault requests a rank acts on: what the chaos injector asks of one rank, and how.

A fault inside a collective, or a slow save, cannot be done from outside the rank: the
injector (through the controller's ``JobControl``) drops a one-shot request file for one
rank (:func:`request_collective_fault`, :func:`request_slow_save`), and the rank's fault
agent (``monarch_ft.rank.components.fault_agent``) acts on it at its next cross-group
allreduce or save; a bit flip (:func:`request_bitflip`) at its next step. A ``hang`` with ``mode: gil`` is a signal the rank answers
(:data:`GIL_HANG_SIGNAL`).
"""

from __future__ import annotations

import signal
import time
from typing import Optional

from monarch_ft.records.layout import RunLayout, atomic_write_json


def request_collective_fault(layout: RunLayout, group: int, rank: int, mode: str, duration_s: float) -> str:
    """Make the rank's next cross-group allreduce fail (``abort``) or stall ``duration_s`` (``hang``)."""
    path = layout.collective_fault(group, rank)
    atomic_write_json(path, {"mode": mode, "duration_s": duration_s, "requested_at": time.time()})
    return path


def request_slow_save(layout: RunLayout, group: int, rank: int, delay_s: float) -> str:
    """Make the rank's next checkpoint save take ``delay_s`` longer (slow storage)."""
    path = layout.slow_save(group, rank)
    atomic_write_json(path, {"delay_s": delay_s, "requested_at": time.time()})
    return path


def request_bitflip(layout: RunLayout, group: int, rank: int, tensor: str, bit: str, seed: int) -> str:
    """Make the rank flip one bit of one element of a tensor of its state at its next step
    (``tensor``: a name pattern, records.integrity names; ``bit``: records.integrity.BIT_CLASSES
    or a bit number; ``seed``: which tensor and element, when the pattern matches several)."""
    path = layout.bitflip(group, rank)
    atomic_write_json(path, {"tensor": tensor, "bit": bit, "seed": seed, "requested_at": time.time()})
    return path


def request_transfer_fault(layout: RunLayout, group: int, rank: int, chunk: int = 0, times: Optional[int] = None) -> str:
    """A test hook: damage chunk ``chunk`` of what the rank sends when TorchFT makes it a
    healing peer's source (its in-flight bytes; the checksum sent with them stays the true one),
    so the receiver must fetch that chunk again from another healthy peer; ``times``: only the
    first that many times (None: every time; then a receiver with no other peer never heals)."""
    path = layout.transfer_fault(group, rank)
    extra = {} if times is None else {"times": times}
    atomic_write_json(path, {"corrupt_chunk": chunk, "sent_only": True, **extra, "requested_at": time.time()})
    return path


# The signal a rank answers by sleeping with the GIL held (chaos ``hang`` ``mode: gil``).
GIL_HANG_SIGNAL = signal.SIGUSR2
