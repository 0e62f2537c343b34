"""Faults asked for while a job runs (``monarch_ft.launch(...).inject``): one JSON file each in the
run directory's ``control/fault_requests/``, read by the drill's controller (chaos.requests).

A request is written atomically as ``<n>.json`` (n: its order, zero-padded); the controller
renames it ``<n>.accepted`` (its fault joins the drill's queue, event ``fault_requested``) or
``<n>.refused`` (event ``fault_request_refused``, with the one-line reason). A controller that
takes the job over rebuilds the queue from the accepted ones, in order.
"""

from __future__ import annotations

import glob
import os
from typing import Any

from monarch_ft.records.layout import RunLayout, atomic_write_json, read_json

PENDING, ACCEPTED, REFUSED = ".json", ".accepted", ".refused"


def requests_dir(run_dir: str) -> str:
    """The run's request folder."""
    return os.path.join(RunLayout(run_dir).control_dir, "fault_requests")


def request_fault(run_dir: str, fault: dict[str, Any]) -> str:
    """Write a request for ``fault`` (its kind and options, as a ``chaos.faults`` entry); returns its name.

    Args:
        run_dir: the job's run directory.
        fault: ``{"kind": ..., "target": ..., option: value, ...}``.
    """
    folder = requests_dir(run_dir)
    os.makedirs(folder, exist_ok=True)
    taken = {os.path.splitext(os.path.basename(p))[0] for p in glob.glob(os.path.join(folder, "*"))}
    name = f"{len(taken):05d}"
    while name in taken:
        name = f"{int(name) + 1:05d}"
    atomic_write_json(os.path.join(folder, name + PENDING), fault)
    return name


def requests(run_dir: str, suffix: str) -> list[tuple[str, dict[str, Any]]]:
    """(name, fault) of the requests with ``suffix`` (PENDING, ACCEPTED, REFUSED), in order.

    Args:
        run_dir: the job's run directory.
        suffix: which ones.
    """
    out = []
    for path in sorted(glob.glob(os.path.join(requests_dir(run_dir), "*" + suffix))):
        out.append((os.path.basename(path)[: -len(suffix)], read_json(path) or {}))
    return out


def settle(run_dir: str, name: str, suffix: str) -> None:
    """Mark a pending request ACCEPTED or REFUSED.

    Args:
        run_dir: the job's run directory.
        name: the request's name.
        suffix: ACCEPTED or REFUSED.
    """
    folder = requests_dir(run_dir)
    os.replace(os.path.join(folder, name + PENDING), os.path.join(folder, name + suffix))
