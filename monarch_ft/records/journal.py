"""The takeover state on disk: a base snapshot plus an append-only journal of what changed.

The controller's whole job state (:class:`~monarch_ft.controller.state.JobState`, as plain
JSON data) used to be rewritten every tick; at a thousand groups that is megabytes a tick,
most of it unchanged. Now, as a database keeps its pages (a checkpoint plus a redo log):

- ``controller.json``, the **base**: the whole record at one instant, gzip-compressed JSON,
  written atomically (a reader sees the old base or the new one, never half). A plain JSON
  base (an older file, a test's fixture) reads as well.
- ``controller.journal``, the **journal**: one JSON line per save that changed something, the
  changes only, as operations on the record's paths (:func:`diff`, :func:`apply`): ``[path,
  value]`` sets the value at ``path`` (a list of object keys and list indices), ``[path]``
  deletes it. The lines go through one gzip stream, flushed to a byte boundary after each
  (one ``write`` per line): the next lines compress against the earlier ones, so a line costs
  a few bytes per value changed. ``zcat controller.journal`` prints them.
- **Compaction**: once the journal outweighs the base (``compact_ratio`` times it, and at
  least ``compact_min_bytes``), the next save writes a new base and empties the journal. So
  the files hold at most about ``1 + compact_ratio`` bases, and the bytes written per save
  are what changed, plus, amortised, ``1 / compact_ratio`` of it again for the compactions.

Each base carries a fresh ``generation`` and each journal line the generation it applies to:
a controller killed between writing a new base and emptying the journal leaves lines of the
old generation, which a reader skips. A controller killed in the middle of appending a line
leaves it torn (the stream cut short: its last line has no newline): a reader ignores a torn
*last* line (the save it belonged to never happened), and a damaged stream, or a damaged line
with good lines after it, is an error (it cannot be a torn write: a writer whose append
failed writes a new base before appending again, and every new writer starts with a new
base).

A write that fails (ENOSPC, EROFS, ...) raises its ``OSError`` to the caller: what to do
when the controller cannot record the job is the controller's decision, not this file's.

Readers of the takeover state (the controller taking a job over, ``status``, the Lighthouse
guard, chaos) read it through :func:`read_state`: the base with the journal applied, the
record as a single file would have held it. Nothing here imports the controller: the
Lighthouse guard and the command line read it with stdlib only.
"""

from __future__ import annotations

import gzip
import json
import os
import uuid
import zlib
from typing import Any, Optional

# Keys of the base that are the files' own (beside the record's fields).
GENERATION = "generation"
# gzip's magic number: a base written here starts with it, a plain JSON one with "{".
GZIP_MAGIC = b"\x1f\x8b"
# A compaction once the journal holds this many times the base's bytes (and at least
# COMPACT_MIN_BYTES): the files stay within about (1 + ratio) bases.
COMPACT_RATIO = 1.0
COMPACT_MIN_BYTES = 64 << 10
# gzip level of the base: level 1 packs the job state (repetitive JSON) about 10-20x at a
# fraction of the default level's cost; the base is rewritten at every compaction.
GZIP_LEVEL = 1

Path = list  # object keys (str) and list indices (int), from the record's root
Op = list  # [path, value]: set; [path]: delete


class JournalDamaged(ValueError):
    """A journal line that is not the last one could not be read: not a torn write."""


# ---------------------------------------------------------------- the operations
def diff(old: Any, new: Any, path: Optional[Path] = None, out: Optional[list[Op]] = None) -> list[Op]:
    """The operations that turn ``old`` into ``new`` (both plain JSON data), appended to ``out``.

    Objects are compared key by key and lists of equal length item by item, down to the
    values that differ; a list whose length changed, or a list of scalars more than half of
    whose items changed, is set whole. Equal subtrees cost one ``==`` (done in C).

    Args:
        old: the value last written.
        new: the value now.
        path: where both sit in the record (default: its root).
        out: the list to append to (default: a new one).
    """
    path = [] if path is None else path
    out = [] if out is None else out
    if type(old) is type(new) and old == new:
        return out
    if isinstance(old, dict) and isinstance(new, dict):
        for k, v in new.items():
            if k in old:
                was = old[k]
                if type(was) is not type(v) or was != v:
                    diff(was, v, path + [k], out)
            else:
                out.append([path + [k], v])
        for k in old:
            if k not in new:
                out.append([path + [k]])
        return out
    if isinstance(old, list) and isinstance(new, list) and len(old) == len(new) and path:
        inner: list[Op] = []
        for i, (a, b) in enumerate(zip(old, new)):
            if type(a) is not type(b) or a != b:
                diff(a, b, path + [i], inner)
        if len(inner) * 2 <= len(new) or isinstance(new[0], (dict, list)):
            out += inner
            return out
    if not path:
        raise ValueError("the record's root is an object: diff two objects")
    out.append([path, new])
    return out


def apply(record: dict, ops: list[Op]) -> dict:
    """Apply ``ops`` (:func:`diff`'s) to ``record`` in place, and return it.

    Raises ValueError for an operation whose path does not lead into the record (a journal
    that does not belong to this base).

    Args:
        record: the base's record (plain JSON data).
        ops: ``[path, value]`` sets, ``[path]`` deletes.
    """
    for op in ops:
        path = op[0]
        if not isinstance(path, list) or not path:
            raise ValueError(f"journal operation {op!r}: its path must be a non-empty list")
        node: Any = record
        try:
            for key in path[:-1]:
                node = node[key]
            last = path[-1]
            if len(op) == 1:
                del node[last]
            elif isinstance(node, list) and last == len(node):
                node.append(op[1])
            else:
                node[last] = op[1]
        except (KeyError, IndexError, TypeError) as e:
            raise ValueError(f"journal operation on {path!r} does not apply to the base ({type(e).__name__}: {e})") from None
    return record


# ---------------------------------------------------------------- reading
def read_base(path: str) -> Optional[dict]:
    """The base's record (its ``generation`` included), or None when there is none.

    Args:
        path: the base file (``RunLayout.controller_state``): gzip-compressed JSON or plain JSON.
    """
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return None
    if data[:2] == GZIP_MAGIC:
        try:
            data = gzip.decompress(data)
        except (OSError, EOFError) as e:
            raise ValueError(f"{path}: not a whole gzip file ({e})") from None
    text = data.decode()
    return json.loads(text) if text.strip() else None


def journal_lines(data: bytes, path: str = "journal") -> list[bytes]:
    """The journal's whole lines (the part after the last newline, a torn write, left out).

    Raises :class:`JournalDamaged` when its compressed stream is not a prefix of a good one.

    Args:
        data: the journal file's bytes: a gzip stream (as written here) or plain JSON lines.
        path: its name, for the error.
    """
    if data[:2] == GZIP_MAGIC:
        inflate = zlib.decompressobj(zlib.MAX_WBITS | 16)
        parts = []
        try:
            for at in range(0, len(data), 1 << 16):
                parts.append(inflate.decompress(data[at : at + (1 << 16)]))
                if inflate.eof:
                    break
        except zlib.error as e:
            raise JournalDamaged(f"{path}: its compressed stream is damaged ({e}), not merely cut short: the takeover state cannot be trusted") from None
        data = b"".join(parts)
    lines = data.split(b"\n")
    lines.pop()
    return lines


def journal_ops(path: str, generation: Any) -> list[list[Op]]:
    """Each good line's operations for ``generation``, in order; a torn last line is left out.

    Raises :class:`JournalDamaged` for a line that cannot be read with good lines after it.

    Args:
        path: the journal file (``RunLayout.controller_journal``).
        generation: the base's generation (lines of another one are skipped).
    """
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return []
    lines = journal_lines(data, path)
    out = []
    for i, line in enumerate(lines):
        try:
            entry = json.loads(line)
            ops = entry["ops"]
            gen = entry[GENERATION]
        except (ValueError, KeyError, TypeError):
            if i == len(lines) - 1:
                break  # torn within a line that happens to end in a newline: the same
            raise JournalDamaged(f"{path}: line {i + 1} of {len(lines)} is damaged (not a torn last line): the takeover state cannot be trusted") from None
        if gen == generation:
            out.append(ops)
    return out


def read_state(base_path: str, journal_path: str) -> Optional[dict]:
    """The takeover state as one record: the base with its journal applied (None: no base).

    Args:
        base_path: ``RunLayout.controller_state``.
        journal_path: ``RunLayout.controller_journal``.
    """
    record = read_base(base_path)
    if record is None:
        return None
    generation = record.pop(GENERATION, None)
    if generation is not None:
        for ops in journal_ops(journal_path, generation):
            apply(record, ops)
    return record


class StateReader:
    """:func:`read_state` again and again, reading only what was appended since the last read.

    The takeover state's verify mode (tests: every save is read back and compared with the
    job's snapshot) re-read the whole base and journal at each save: on a job of a few hundred
    ticks that was most of the controller's own time (a unit test's 7 s tick loop spent 5 s in
    it). The journal is append-only between two bases, so this reader keeps its place: the
    base's identity (inode, size, mtime), the compressed bytes of the journal decoded so far
    and its decompressor, and the record with those lines applied. A new base (a compaction, a
    new writer) or a journal shorter than what was read starts it over; a line it cannot parse
    (a torn one, or a damage) is left to :func:`read_state`, which judges it as a new
    controller would.

    Args:
        base_path: ``RunLayout.controller_state``.
        journal_path: ``RunLayout.controller_journal``.
    """

    def __init__(self, base_path: str, journal_path: str) -> None:
        self.base_path = base_path
        self.journal_path = journal_path
        self._reset(None)

    def _reset(self, base_key: Optional[tuple]) -> None:
        self._base_key = base_key
        self._journal_key: Optional[int] = None
        self._record: Optional[dict] = None
        self._generation: Any = None
        self._fed = 0
        self._inflate: Any = None
        self._partial = b""

    @staticmethod
    def _key(path: str) -> Optional[tuple]:
        try:
            st = os.stat(path)
        except FileNotFoundError:
            return None
        return (st.st_ino, st.st_size, st.st_mtime_ns)

    def read(self) -> Optional[dict]:
        """The takeover state, equal to :func:`read_state`'s (None: no base). The record is
        this reader's own, updated in place by the next read: do not modify it."""
        base_key = self._key(self.base_path)
        if base_key is None:
            self._reset(None)
            return None
        if base_key != self._base_key:
            self._reset(base_key)
            self._record = read_base(self.base_path)
            if self._record is None:
                return None
            self._generation = self._record.pop(GENERATION, None)
        if self._record is None or self._generation is None:
            return self._record
        try:
            with open(self.journal_path, "rb") as f:
                inode = os.fstat(f.fileno()).st_ino
                if inode != self._journal_key or os.fstat(f.fileno()).st_size < self._fed:
                    if self._journal_key is not None:
                        return self._start_over()
                    self._journal_key = inode
                f.seek(self._fed)
                data = f.read()
        except FileNotFoundError:
            return self._record
        if not data:
            return self._record
        if self._fed == 0 and data[:2] == GZIP_MAGIC:
            self._inflate = zlib.decompressobj(zlib.MAX_WBITS | 16)
        self._fed += len(data)
        try:
            text = self._inflate.decompress(data) if self._inflate is not None else data
        except zlib.error:
            return self._start_over()
        lines = (self._partial + text).split(b"\n")
        self._partial = lines.pop()
        for line in lines:
            try:
                entry = json.loads(line)
                ops, gen = entry["ops"], entry[GENERATION]
            except (ValueError, KeyError, TypeError):
                return self._start_over()
            if gen == self._generation:
                apply(self._record, ops)
        return self._record

    def _start_over(self) -> Optional[dict]:
        """What cannot be read incrementally is read whole (and judged) by :func:`read_state`;
        the next read starts from the files again."""
        self._reset(None)
        return read_state(self.base_path, self.journal_path)


# ---------------------------------------------------------------- writing
class StateJournal:
    """The writer of the base and the journal (one live controller at a time: its lock).

    Its first write is always a base (:meth:`write_base`): a journal is only ever appended
    to by the writer that wrote its base, so nothing is appended after another writer's
    torn line.

    Args:
        base_path: ``RunLayout.controller_state``.
        journal_path: ``RunLayout.controller_journal``.
        compact_ratio: compact once the journal holds this many times the base's bytes.
        compact_min_bytes: ... and at least this many bytes.
    """

    def __init__(self, base_path: str, journal_path: str, compact_ratio: float = COMPACT_RATIO, compact_min_bytes: int = COMPACT_MIN_BYTES) -> None:
        self.base_path = base_path
        self.journal_path = journal_path
        self.compact_ratio = compact_ratio
        self.compact_min_bytes = compact_min_bytes
        self.generation: Optional[str] = None
        self.base_bytes = 0
        self.journal_bytes = 0
        # Bytes written in all, and compactions done (what a benchmark reports per save).
        self.written_bytes = 0
        self.compactions = 0
        self._fd: Optional[int] = None
        self._deflate: Any = None

    @property
    def needs_base(self) -> bool:
        """No base written by this writer yet, or the last append failed: the next write is a base."""
        return self._fd is None

    def needs_compaction(self) -> bool:
        """The journal outweighs the base (:data:`COMPACT_RATIO`)."""
        return self.needs_base or self.journal_bytes >= max(self.compact_min_bytes, self.compact_ratio * self.base_bytes)

    def write_base(self, record: dict) -> None:
        """Write ``record`` as the new base (atomically, a new generation) and empty the journal.

        Raises OSError when the base cannot be written (the previous base and journal then
        still hold the state as of the previous write).

        Args:
            record: the whole state, plain JSON data.
        """
        generation = uuid.uuid4().hex[:16]
        data = gzip.compress(json.dumps({**record, GENERATION: generation}, default=str).encode(), GZIP_LEVEL, mtime=0)
        tmp = f"{self.base_path}.tmp.{os.getpid()}"
        try:
            with open(tmp, "wb") as f:
                f.write(data)
            os.replace(tmp, self.base_path)
        except OSError:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise
        self.generation, self.base_bytes = generation, len(data)
        self.written_bytes += len(data)
        self.compactions += 1
        # The old journal's lines are of the old generation from here on: emptied, not trusted.
        self.close(finish=False)
        self._fd = os.open(self.journal_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o644)
        self._deflate = zlib.compressobj(GZIP_LEVEL, zlib.DEFLATED, zlib.MAX_WBITS | 16)
        self.journal_bytes = 0

    def append(self, ops: list[Op]) -> int:
        """Append one line of ``ops`` (one save's changes) to the journal's gzip stream, flushed
        to a byte boundary (a reader decodes every line written so far); the bytes written.

        Raises OSError when it cannot be written whole; the journal is then trimmed back to
        its last whole line where it can be, and the next write must be a base
        (:attr:`needs_base`).

        Args:
            ops: :func:`diff`'s operations (not empty).
        """
        if self._fd is None:
            raise RuntimeError("write a base before appending to its journal")
        line = (json.dumps({GENERATION: self.generation, "ops": ops}, default=str, separators=(",", ":")) + "\n").encode()
        data = self._deflate.compress(line) + self._deflate.flush(zlib.Z_SYNC_FLUSH)
        try:
            # A short write (a disk filling up) is written on: the next write raises the real
            # error (ENOSPC), which the caller names; an OSError without an errno named nothing.
            view, done = memoryview(data), 0
            while done < len(data):
                done += os.write(self._fd, view[done:])
        except OSError as e:
            e.filename = e.filename or self.journal_path
            try:
                os.ftruncate(self._fd, self.journal_bytes)
            except OSError:
                pass
            self.close(finish=False)
            raise
        self.journal_bytes += len(data)
        self.written_bytes += len(data)
        return len(data)

    def close(self, finish: bool = True) -> None:
        """Stop appending (a later write starts with a base).

        Args:
            finish: end the journal's gzip stream (``zcat`` then reads it without a warning);
                a failure to is ignored (every line is in the file already).
        """
        if self._fd is None:
            return
        if finish:
            try:
                os.write(self._fd, self._deflate.flush(zlib.Z_FINISH))
            except OSError:
                pass
        os.close(self._fd)
        self._fd, self._deflate = None, None

    def size(self) -> int:
        """The takeover state's bytes on disk: the base and its journal."""
        return self.base_bytes + self.journal_bytes
