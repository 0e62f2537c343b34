"""``ckpt_corrupt``: the newest checkpoint of the target group, or of every group, damaged on disk.

Modes: ``truncate`` (a shard cut to half its size) and ``rewrite`` (a block of a shard
rewritten with other bytes, its size and modification time unchanged: bit rot, which no
stat can tell). No process is touched. It is found by reading the step back against its
manifest: by the controller's checkpoint scrub (``checkpoint.scrub_every_s``) while the job
trains, or on the recovery path when a group must load it; the damaged copy is quarantined,
never loaded. Detected and recovered (the MTTR clock stops) when the target's copy is
quarantined; the live replicas never lost the state, and the next save replaces the copy.
"""

from __future__ import annotations

import os
import random
from dataclasses import dataclass
from typing import Any, ClassVar

from chaos.kinds.base import FaultCategory, FaultKind, ModeOptions
from monarch_ft.records.errors import ConfigError
from monarch_ft.records.events import EventKind
from monarch_ft.records.manifest import complete_steps, step_dir
from monarch_ft.records.recovered import Clock, RecoveryRule

# Bytes a rewrite changes (or the whole shard, if smaller).
REWRITE_BYTES = 4096


@dataclass
class CkptCorruptOptions(ModeOptions):
    MODES: ClassVar[tuple[str, ...]] = ("truncate", "rewrite")
    all_groups: bool = False
    """Damage every group's newest checkpoint, not only the target group's."""
    seed: int = 0
    """Draws which shard file is damaged and (``rewrite``) which bytes."""


def damage_step(path: str, mode: str, rng: random.Random) -> dict[str, Any]:
    """Damage one shard file of the step directory ``path``; what was done.

    ``truncate``: cut to half its size. ``rewrite``: REWRITE_BYTES in the middle XORed with
    non-zero random bytes (every byte differs), the file's size and times left as they were.
    """
    shards = sorted(n for n in os.listdir(path) if n.endswith(".distcp"))
    if not shards:
        raise FileNotFoundError(f"{path} has no shard file")
    shard = os.path.join(path, rng.choice(shards))
    stat = os.stat(shard)
    if mode == "truncate":
        os.truncate(shard, stat.st_size // 2)
        return {"file": shard, "mode": mode, "size": stat.st_size, "truncated_to": stat.st_size // 2}
    n = min(REWRITE_BYTES, stat.st_size)
    offset = max(0, stat.st_size // 2 - n // 2)
    with open(shard, "r+b") as f:
        f.seek(offset)
        old = f.read(n)
        f.seek(offset)
        f.write(bytes(b ^ rng.randrange(1, 256) for b in old))
    os.utime(shard, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    return {"file": shard, "mode": mode, "offset": offset, "bytes": n}


class CkptCorrupt(FaultKind):
    name = "ckpt_corrupt"
    category = FaultCategory.SILENT
    options = CkptCorruptOptions
    recovery = RecoveryRule(marker=EventKind.CHECKPOINT_QUARANTINED, clock=Clock.MARKER)
    detected_by = EventKind.CHECKPOINT_QUARANTINED

    def check(self, fault, cfg, traits, where: str) -> None:
        if not cfg.checkpoint.enable:
            raise ConfigError(f"{where}.kind=ckpt_corrupt: needs checkpoint.enable=true")
        if cfg.checkpoint.scrub_every_s <= 0:
            raise ConfigError(
                f"{where}.kind=ckpt_corrupt: a damaged checkpoint is found when it is read back, and a drill waits for that: "
                "set checkpoint.scrub_every_s (e.g. 5)"
            )
        if fault.at_step is not None and fault.at_step < cfg.checkpoint.interval:
            raise ConfigError(f"{where}.at_step={fault.at_step}: no checkpoint exists before step checkpoint.interval={cfg.checkpoint.interval}")

    def inject(self, job, group: int, fault) -> dict[str, Any]:
        rng = random.Random(fault.seed)
        groups = range(job.cfg.ft.replica_groups) if fault.all_groups else [group]
        damaged = []
        for g in groups:
            folder = job.run_layout.checkpoint(g)
            steps = complete_steps(folder)
            if steps:
                damaged.append({"group": g, "step": max(steps), **damage_step(step_dir(folder, max(steps)), fault.mode, rng)})
        return {"damaged": damaged, "all_groups": fault.all_groups}


KIND = CkptCorrupt()
