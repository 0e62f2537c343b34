"""What makes a checkpoint step trustworthy: its manifest, and verification against it.

A rank seals every step it saves with a manifest (``monarch_ft.rank.components.checkpoint``),
the controller verifies a step before a group loads it (``monarch_ft.controller.checkpoints``),
and ``python -m monarch_ft verify`` checks every step on disk: all three read the format
from here. Inside a group folder (TorchTitan's names, and ours beside them)::

    step-N/                 one DCP save: shard files __<rank>_<k>.distcp, .metadata
    step-N/manifest.json    every file's size and xxh3-128 checksum, and each rank's state
                            fingerprint (records.integrity), written last (complete)
    quarantine/step-N/      a copy that failed verification or failed to load, moved aside
    quarantine/step-N.reason.json   why, when, and by whom

A step is complete only once its manifest exists: DCP's ``.metadata`` says every shard
was written, not that the bytes are still the ones written. ``quarantine`` does not match
TorchTitan's ``step-(\\d+)`` search (its load-step lookup and its keep_latest_k purge list
the group folder only), so a quarantined copy is never loaded, counted or deleted by it.
"""

from __future__ import annotations

import errno as errno_mod
import json
import os
import re
import time
from typing import Any, Optional

from monarch_ft.records.layout import atomic_write, read_json

_STEP_DIR = re.compile(r"^step-(\d+)$")
MANIFEST = "manifest.json"
MANIFEST_FORMAT = 1
QUARANTINE = "quarantine"
# xxh3-128: fast enough to hash a shard as it is read back from the page cache (several
# GB/s), and 128 bits leave no practical chance that other bytes match by accident.
CHECKSUM = "xxh3_128"
_CHUNK = 8 << 20


def step_dir(folder: str, step: int) -> str:
    """TorchTitan's directory of ``step`` in a group folder (``CheckpointManager._create_checkpoint_id``)."""
    return os.path.join(folder, f"step-{step}")


def file_checksum(path: str) -> tuple[int, str]:
    """(size in bytes, xxh3-128 hex digest) of a file, read in chunks."""
    import xxhash

    h = xxhash.xxh3_128()
    size = 0
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
            size += len(chunk)
    return size, h.hexdigest()


def steps_on_disk(folder: str) -> list[int]:
    """Every ``step-N`` directory of ``folder``, finished or not, oldest first."""
    if not os.path.isdir(folder):
        return []
    return sorted(int(m.group(1)) for name in os.listdir(folder) if (m := _STEP_DIR.match(name)))


def complete_steps(folder: str) -> set[int]:
    """Steps of ``folder`` whose save finished: their manifest, written last, exists.

    Completeness only: whether the files still match it is :func:`verify_step`'s question
    (it reads every byte, so it is asked on the recovery path only)."""
    return {step for step in steps_on_disk(folder) if os.path.isfile(os.path.join(step_dir(folder, step), MANIFEST))}


def newest_complete_step(folders: list[str], at_most: Optional[int] = None) -> Optional[int]:
    """The newest step any of ``folders`` holds complete (not after ``at_most``), or None."""
    return max((s for folder in folders for s in complete_steps(folder) if at_most is None or s <= at_most), default=None)


def build_manifest(step: int, files: dict[str, tuple[int, str]], fingerprint: Optional[dict[int, str]] = None) -> dict[str, Any]:
    """``fingerprint``: each rank's digest of the state it saved (records.integrity), when known."""
    manifest = {
        "format": MANIFEST_FORMAT,
        "step": step,
        "checksum": CHECKSUM,
        "time": time.time(),
        "files": {name: {"size": size, CHECKSUM: digest} for name, (size, digest) in sorted(files.items())},
    }
    if fingerprint:
        # What the files hold, not only which bytes: a copy whose bytes match yet whose state is
        # not what the replicas agreed on at this step (saved from a corrupt replica, or its
        # manifest rewritten to match other bytes) is caught by comparing this.
        manifest["fingerprint"] = {str(rank): digest for rank, digest in sorted(fingerprint.items())}
    return manifest


def manifest_fingerprint(path: str) -> dict[int, str]:
    """Each rank's state digest from the manifest of the step in ``path`` ({} when it has none
    or cannot be read: an older manifest, or a damaged one, which verify_step names)."""
    try:
        manifest = read_json(os.path.join(path, MANIFEST)) or {}
        return {int(rank): str(digest) for rank, digest in (manifest.get("fingerprint") or {}).items()}
    except (OSError, ValueError, AttributeError):
        return {}


def write_manifest(path: str, manifest: dict[str, Any]) -> None:
    """Written whole (a temporary file renamed over it): a torn manifest would vouch for nothing."""
    atomic_write(os.path.join(path, MANIFEST), json.dumps(manifest, indent=1))


def verify_step(path: str) -> Optional[str]:
    """What is wrong with the checkpoint in ``path`` against its manifest, or None if intact.

    Every file the manifest names must exist with its size and checksum: a truncated
    shard is caught by its size, a same-size rewrite by its checksum, before DCP reads
    garbage (a truncated pickle raises deep in torch's unpickler; other bytes of the same
    size may even load as wrong weights). One line, naming the first few problems."""
    try:
        manifest = read_json(os.path.join(path, MANIFEST))
    except (OSError, ValueError) as e:
        return f"its {MANIFEST} cannot be read ({type(e).__name__}: {e})"
    if not manifest:
        return f"no {MANIFEST}: a save that did not finish"
    files = manifest.get("files") if isinstance(manifest, dict) else None
    if manifest.get("format") != MANIFEST_FORMAT or not isinstance(files, dict) or manifest.get("checksum") != CHECKSUM:
        return f"its {MANIFEST} is not a format-{MANIFEST_FORMAT} {CHECKSUM} manifest"
    problems = []
    for name, want in sorted(files.items()):
        file = os.path.join(path, name)
        try:
            size = os.path.getsize(file)
            if size != want["size"]:
                problems.append(f"{name} is {size} bytes, its manifest says {want['size']}")
                continue
            if file_checksum(file)[1] != want[CHECKSUM]:
                problems.append(f"{name} does not match its checksum (same size, other bytes)")
        except FileNotFoundError:
            problems.append(f"{name} is missing")
        except OSError as e:
            problems.append(f"{name} cannot be read ({describe_os_error(e)})")
    if not problems:
        return None
    more = f" (and {len(problems) - 3} more)" if len(problems) > 3 else ""
    return "; ".join(problems[:3]) + more


# How long a verification is trusted while no file of the step changed (names, sizes, mtimes).
VERIFIED_FOR_S = 120.0


def _signature(path: str) -> Optional[tuple]:
    try:
        return tuple(sorted((e.name, st.st_size, st.st_mtime_ns) for e in os.scandir(path) for st in (e.stat(),)))
    except OSError:
        return None


def verify_step_cached(path: str, cache: Optional[dict]) -> Optional[str]:
    """:func:`verify_step`, remembered in ``cache`` for :data:`VERIFIED_FOR_S` while no file
    of the step changed. The controller verifies the job's checkpoint when the last group
    holding its state fails and again at the relaunch's gate, seconds apart: reading every
    byte once is enough. A rewrite in between changes a file's mtime (or size) and is read
    again; the time bound keeps a verdict from outliving what a stat can tell."""
    if cache is None:
        return verify_step(path)
    signature, now = _signature(path), time.time()
    hit = cache.get(path)
    if hit is not None and hit[0] == signature and now - hit[1] < VERIFIED_FOR_S:
        return hit[2]
    problem = verify_step(path)
    cache[path] = (signature, now, problem)
    return problem


def errno_name(e: OSError) -> str:
    """``ENOSPC`` for errno 28; ``OSError`` when it carries no errno."""
    return errno_mod.errorcode.get(e.errno, f"errno {e.errno}") if e.errno is not None else type(e).__name__


def describe_os_error(e: OSError) -> str:
    """``No space left on device (ENOSPC)``: the system's words and the errno's name."""
    text = e.strerror or str(e) or type(e).__name__
    return f"{text} ({errno_name(e)})" if e.errno is not None else text
