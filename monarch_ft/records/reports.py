"""The rank report format: one JSON object per line, appended to a file per rank attempt.

A rank appends ``step``, ``event``, ``heartbeat`` and ``liveness`` records
(``monarch_ft.rank.components.metrics.RankReporter``); the controller tails the files
(:class:`ReportTail`). A file per rank means no locking and nothing lost when a rank dies
mid-write: a torn last line is simply skipped by the reader. The exception that ends a
rank is reported in the form :func:`error_record` gives it, which the controller compares
between relaunches to tell a crash loop.
"""

from __future__ import annotations

import json
import os
import traceback
from typing import Any, BinaryIO, Iterable, Iterator, Optional

from monarch_ft.paths import REPO_ROOT
from monarch_ft.records.report_records import ReportRecord, parse_record


class ReportTail:
    """Incrementally reads complete lines appended to a rank's report file.

    The file is opened once (when it exists) and read on from where the last read ended: one
    read a tick for a file that did not grow, where opening it anew each tick cost a thousand
    opens a tick at a thousand ranks. :meth:`close` lets it go (a rank's tail is dropped with
    its rank, which closes it too)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._offset = 0
        self._partial = b""
        self._f: Optional[BinaryIO] = None

    @property
    def position(self) -> int:
        """Byte offset of the first line not returned yet (what a new controller resumes at)."""
        return self._offset - len(self._partial)

    def seek(self, position: int) -> None:
        self._offset, self._partial = position, b""
        if self._f is not None:
            self._f.seek(position)

    def read(self) -> list[dict[str, Any]]:
        return [record for record, _ in self.read_lines()]

    def read_records(self) -> list[ReportRecord]:
        """The new whole lines' records, typed (what the controller's tick observes)."""
        return [parse_record(raw, line) for raw, line in self.read_lines()]

    def read_lines(self) -> list[tuple[dict[str, Any], bytes]]:
        """The new whole lines' records, each with its line as written (no newline): what the
        controller relays to ``metrics.jsonl`` without encoding it again."""
        if self._f is None:
            try:
                self._f = open(self.path, "rb", buffering=0)
            except FileNotFoundError:
                return []
            self._f.seek(self._offset)
        chunk = _read_on(self._f.fileno())
        if not chunk:
            return []
        self._offset += len(chunk)
        data = self._partial + chunk
        lines = data.split(b"\n")
        self._partial = lines.pop()
        return list(parse_lines_kept(lines))

    def close(self) -> None:
        if self._f is not None:
            self._f.close()
            self._f = None


# How much one read asks for (a tail reads on until a read returns less).
READ_CHUNK = 1 << 16


def _read_on(fd: int) -> bytes:
    """Everything from ``fd``'s offset to its end, by plain reads: one read for a file that did
    not grow (a buffered reader's ``read()`` also asks the file's size first: a thousand tails'
    idle reads were a seventh of a quiet tick at 1,024 groups)."""
    chunk = os.read(fd, READ_CHUNK)
    if len(chunk) < READ_CHUNK:
        return chunk
    parts = [chunk]
    while len(chunk) == READ_CHUNK:
        chunk = os.read(fd, READ_CHUNK)
        parts.append(chunk)
    return b"".join(parts)


def parse_lines(lines: Iterable[bytes]) -> Iterator[dict[str, Any]]:
    """The records of whole JSON lines; a line that is not one is skipped: the torn last line
    of a writer that died mid-write (or one still being written, read from its start).

    Args:
        lines: the lines, without or with their newline.
    """
    for record, _ in parse_lines_kept(lines):
        yield record


def parse_lines_kept(lines: Iterable[bytes]) -> Iterator[tuple[dict[str, Any], bytes]]:
    """:func:`parse_lines`, each record with its line (the one place a torn line is skipped).

    Args:
        lines: the lines, without or with their newline (kept as given).
    """
    for line in lines:
        try:
            yield _loads(line), line
        except ValueError:
            continue


# json.loads' own decoder (a JSONDecoder with no options), called without json.loads' checks.
_DECODE = json.JSONDecoder().decode


def _loads(line: bytes) -> Any:
    """``json.loads(line)``, less its per-call work for the lines every writer here writes: a
    line that starts ``{"`` is UTF-8 by json's own detection, so it is decoded and handed to the
    decoder json.loads would use (its argument checks and encoding detection were a third of
    parsing a report line; a thousand lines a tick at 1,024 groups). Any other line: json.loads."""
    if line[:2] == b'{"':
        return _DECODE(line.decode("utf-8", "surrogatepass"))
    return json.loads(line)


def read_records(path: str, start: int = 0, end: Optional[int] = None, having: Optional[bytes] = None) -> Iterator[dict[str, Any]]:
    """The records of a JSON-lines file (a rank's report, ``events.jsonl``, ``metrics.jsonl``),
    read as they are used: every line that starts at ``start`` or after (from mid-line: from
    the next line) and before ``end``. Nothing when the file does not exist. The one reader
    of the project's JSONL files besides :class:`ReportTail`, which reads on as they grow.

    Args:
        path: the file.
        start: a byte offset (0: the first line).
        end: a byte offset; None: to the end.
        having: only lines holding these bytes are parsed (a cheap filter of a long file).
    """
    try:
        f = open(path, "rb")
    except FileNotFoundError:
        return
    with f:
        if start:
            f.seek(start - 1)
            if f.read(1) != b"\n":
                f.readline()  # the rest of the line ``start`` falls in
        while end is None or f.tell() < end:
            line = f.readline()
            if not line:
                return
            if having is None or having in line:
                yield from parse_lines((line,))


def tail_records(path: str, max_bytes: int) -> list[dict[str, Any]]:
    """The records whose lines start in the last ``max_bytes`` of ``path`` ([] when missing):
    what a status read of a long report needs, without reading it all."""
    try:
        size = os.path.getsize(path)
    except OSError:
        return []
    return list(read_records(path, max(0, size - max_bytes)))


def compute_seconds(rec: dict[str, Any]) -> float:
    """A step record's compute seconds: its wall time (``step_time_s``) less its time in the
    quorum and commit vote (``quorum_s``) and in the cross-group collective (``xgroup_s``):
    forward, backward and the optimizer, which every group does on its own (the wall step is
    shared by every group in HSDP). The rank writes it as ``compute_s``; older records are
    derived the same way."""
    if rec.get("compute_s") is not None:
        return float(rec["compute_s"])
    total = float(rec.get("step_time_s") or 0.0)
    return max(0.0, total - float(rec.get("quorum_s") or 0.0) - float(rec.get("xgroup_s") or 0.0))


def report_finished(report_path: str) -> bool:
    """The rank reported ``rank_finished`` (it exits 0 right after)."""
    tail = ReportTail(report_path)
    try:
        return any(r.get("type") == "event" and r.get("event") == "rank_finished" for r in tail.read())
    finally:
        tail.close()


# Errors of the world around a rank, not of its config, data or code: a connection, a store,
# a collective whose peer died, a timeout, and anything raised inside TorchFT (its Lighthouse
# and Manager clients: coordination with other processes). A relaunch may not meet them again
# (a partition heals, a peer comes back), so they never make a crash loop; the restart budget
# bounds them as before. Misjudging one the other way would give up a group that could have
# come back, so the doubtful cases count as environmental.
ENVIRONMENT_ERRORS = (ConnectionError, TimeoutError)
ENVIRONMENT_ERROR_NAMES = {"DistNetworkError", "DistStoreError", "DistBackendError"}  # torch.distributed's, by name: no torch import here
ENVIRONMENT_PACKAGES = ("torchft",)


def short_path(path: str) -> str:
    """A source path as a user reads it: from its package down (``torchtitan/models/...``,
    ``monarch_ft/...``), not the machine's install prefix."""
    for marker in ("site-packages/", "dist-packages/"):
        if marker in path:
            return path.rsplit(marker, 1)[1]
    root = REPO_ROOT + os.sep
    return path[len(root) :] if path.startswith(root) else path


def error_record(exc: BaseException) -> dict[str, Any]:
    """What a rank reports (event ``rank_error``) about the exception that ends it.

    ``error`` is the traceback's own last line (``RuntimeError: shape ...``), ``error_type``
    the exception's qualified name and ``frame`` the innermost frame (``file:line in
    function``): the two the controller compares between relaunches (``monarch_ft.controller.budget.crash_loop``).
    ``environmental``: see :data:`ENVIRONMENT_ERRORS`. The full traceback stays in the rank's log.
    """
    tb = traceback.extract_tb(exc.__traceback__)
    last = tb[-1] if tb else None
    frame = f"{short_path(last.filename)}:{last.lineno} in {last.name}" if last else ""
    kind = type(exc)
    module = "" if kind.__module__ == "builtins" else f"{kind.__module__}."
    names = {c.__name__ for c in kind.__mro__}
    in_package = bool(last) and any(f"/{p}/" in last.filename for p in ENVIRONMENT_PACKAGES)
    line = traceback.format_exception_only(kind, exc)[-1].strip()
    return {
        "error": line[:1000],
        "error_type": module + kind.__qualname__,
        "frame": frame,
        "environmental": isinstance(exc, ENVIRONMENT_ERRORS) or bool(names & ENVIRONMENT_ERROR_NAMES) or in_package,
    }
