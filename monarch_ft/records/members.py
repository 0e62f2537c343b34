"""A step's quorum members (``participating_groups``) as written in a record and read back.

Why not always a list: every group's every step record names every member, so at 1,024 groups
a list made each record about 5 KB and ``metrics.jsonl`` grew with groups squared (5 MB a step);
decoding those lists was most of the controller's tick (``benchmarks/scale_bench.py
--controller-only``). Up to :data:`LIST_UP_TO` members the field stays the plain JSON list every
job on one machine writes; past it, ranges in Slurm's hostlist style, ``"0-511,513-1023"``.
Every reader goes through :func:`members_of`, which reads both.
"""

from __future__ import annotations

import functools
from typing import Any, Iterable, Union

# Up to this many members the field is a JSON list of ints; past it, a range string.
LIST_UP_TO = 64

Members = Union[list[int], str, None]


def members_field(groups: Iterable[int]) -> Union[list[int], str]:
    """What a record writes for these members: a sorted list, or past :data:`LIST_UP_TO` of
    them, a range string.

    Args:
        groups: the quorum's groups (any order, no duplicates needed).
    """
    members = sorted(set(int(g) for g in groups))
    if len(members) <= LIST_UP_TO:
        return members
    return _ranges(members)


def _ranges(members: list[int]) -> str:
    parts: list[str] = []
    start = prev = members[0]
    for g in members[1:]:
        if g != prev + 1:
            parts.append(str(start) if start == prev else f"{start}-{prev}")
            start = g
        prev = g
    parts.append(str(start) if start == prev else f"{start}-{prev}")
    return ",".join(parts)


@functools.lru_cache(maxsize=64)
def _parse_ranges(text: str) -> tuple[int, ...]:
    out: list[int] = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        lo, sep, hi = part.partition("-")
        out.extend(range(int(lo), int(hi) + 1) if sep else (int(lo),))
    return tuple(out)


def members_of(record: dict[str, Any]) -> tuple[int, ...]:
    """The members a record names (``participating_groups``, either form; () when absent).
    A range string's tuple is cached: every group's record of a step names the same one, and
    the same tuple object comes back for it.

    Args:
        record: a step record (a rank's report, ``metrics.jsonl``) or an event.
    """
    value = record.get("participating_groups")
    if not value:
        return ()
    if isinstance(value, str):
        return _parse_ranges(value)
    return tuple(value)
