"""Snapshot and restore of the controller's state: its dataclasses to JSON and back, by type.

A new controller takes a job over from ``controller.json`` (:mod:`monarch_ft.controller.takeover`).
What it holds used to be listed by hand, field by field, and a field missing from the lists
was silently lost on attach. Here nothing is listed: :func:`to_record` walks the dataclasses of
:class:`~monarch_ft.controller.state.JobState` and :func:`from_record` rebuilds them from their
type annotations (enums, tuples, sets, dicts with int or tuple keys, nested dataclasses and
``Optional`` restored by type), so a field added to the state is carried over by default.

What is not carried over is declared on the field itself, once:

- :func:`live`: a handle on something running (a process, an open report file). A new
  controller rebuilds it from the serialised fields beside it (a rank's launch, identity and
  report offset: :meth:`monarch_ft.controller.takeover.Takeover.adopt`).
- :func:`own`: this controller's own view (its samples of the ranks' CPU, what it printed,
  caches). A new controller starts its own.

Both keep their default on restore, so both need one.

Every dict is written as a JSON object, whatever its keys: str keys as they are, int keys as
their digits, other keys (tuples, ``None``, ...) as their own JSON text (``"[41, 0]"``). So
every value of the record has a path of object keys and list indices, which is what the
takeover journal's operations name (:mod:`monarch_ft.records.journal`). A map from int
tuples to strings, the replicas' state hashes per (group, rank), is written by value: each
hash once, with the runs of keys that hold it (the groups agree, so a step's thousand
entries are one hash and one run).

:class:`RecordMirror` keeps the record last written part by part and gives the operations
that bring it up to date, encoding only the parts that may have changed.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import types
import typing
from enum import Enum
from typing import Any, Callable, Optional, Union

from monarch_ft.records.journal import diff

# Field metadata key: why a field is not serialised (LIVE or OWN); absent: it is.
NOT_SAVED = "monarch_ft.not_saved"
LIVE = "live"
OWN = "own"


def live(default: Any = None, *, default_factory: Any = dataclasses.MISSING) -> Any:
    """A field holding a live handle (a process, an open file): never serialised, rebuilt by takeover."""
    if default_factory is not dataclasses.MISSING:
        return dataclasses.field(default_factory=default_factory, metadata={NOT_SAVED: LIVE}, compare=False, repr=False)
    return dataclasses.field(default=default, metadata={NOT_SAVED: LIVE}, compare=False, repr=False)


def own(default: Any = None, *, default_factory: Any = dataclasses.MISSING) -> Any:
    """A field of this controller's own view: never serialised, a new controller starts afresh."""
    if default_factory is not dataclasses.MISSING:
        return dataclasses.field(default_factory=default_factory, metadata={NOT_SAVED: OWN}, compare=False)
    return dataclasses.field(default=default, metadata={NOT_SAVED: OWN}, compare=False)


def saved_fields(cls_or_obj: Any) -> list[dataclasses.Field]:
    """The fields of a dataclass that a snapshot carries."""
    return [f for f in dataclasses.fields(cls_or_obj) if NOT_SAVED not in f.metadata]


def not_saved(cls_or_obj: Any) -> dict[str, str]:
    """Field name -> LIVE or OWN, for the fields a snapshot does not carry."""
    return {f.name: f.metadata[NOT_SAVED] for f in dataclasses.fields(cls_or_obj) if NOT_SAVED in f.metadata}


# Where a Tracked value keeps the names of the fields set since its record was last written,
# and whom it tells of its first change (RecordMirror's set of changed items, and its position).
CHANGED = "_snapshot_changed"
NOTIFY = "_snapshot_notify"


class Tracked:
    """A dataclass whose field assignments are noted, so that :class:`RecordMirror` visits only
    the items that changed and encodes only the fields that were set, not every item whole.

    Why: a tick of a 1,024-group job changes a few fields of each group that stepped (its step,
    its loss, its ranks' report offsets) and nothing of the others; encoding and diffing every
    group whole each tick was a third of the controller's CPU, whether anything changed or not.

    The rule that makes noting enough: a Tracked value's fields are **replaced, never changed
    in place** (a list or dict field gets a new list or dict; a nested dataclass is frozen).
    A field changed without an assignment (``self.__dict__[name] = ...``) calls
    :func:`note_changed`. Noting starts once the mirror has written the value (a value it did
    not write is encoded whole). The test suites check every save against the whole snapshot
    (``Takeover.verify``), which finds a change the rule missed."""

    def __setattr__(self, name: str, value: Any) -> None:
        object.__setattr__(self, name, value)
        note_changed(self, name)


def note_changed(value: Any, name: str) -> None:
    """Note that ``value``'s field ``name`` changed (a :class:`Tracked` value's field set around
    its ``__setattr__``)."""
    d = value.__dict__
    changed = d.get(CHANGED)
    if changed is not None:
        changed.add(name)
        items, position = d[NOTIFY]
        items.add(position)


@functools.lru_cache(maxsize=None)
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


# ---------------------------------------------------------------- to JSON
def to_record(value: Any, kind: Any = None) -> Any:
    """``value`` (of type ``kind``; default: its own class) as plain JSON data: dataclasses as
    objects of their saved fields, enums as their values, tuples and sets as lists, dicts with
    keys other than str or int as [key, value] pairs. A value annotated as a bare ``dict``,
    ``list`` or ``Any`` (a rank's record, the config) is taken to be JSON data already: written
    as it is."""
    return _encoder(type(value) if kind is None else kind)(value)


# One encoder per annotation, built once (the state is saved many times a second: walking the type hints
# each time would cost more than the rest of the tick). Keyed by identity: typing generics
# are slow to hash; the annotations live as long as the classes (kept in _KEPT).
_ENCODERS: dict[int, Callable[[Any], Any]] = {}
_KEPT: list[Any] = []
_AS_IS = (dict, list, Any, object, int, float, str, bool, type(None))


def _encoder(kind: Any) -> Callable[[Any], Any]:
    enc = _ENCODERS.get(id(kind))
    if enc is None:
        _KEPT.append(kind)
        enc = _ENCODERS[id(kind)] = _make_encoder(kind)
    return enc


def _same(value: Any) -> Any:
    return value


def _make_encoder(kind: Any) -> Callable[[Any], Any]:
    if any(kind is k for k in _AS_IS):
        return _same
    origin, args = typing.get_origin(kind), typing.get_args(kind)
    if origin is Union or (hasattr(types, "UnionType") and isinstance(kind, getattr(types, "UnionType"))):
        options = [a for a in args if a is not type(None)]
        if len(options) != 1:
            return _dynamic
        inner = _encoder(options[0])
        return lambda v: None if v is None else inner(v)
    if isinstance(kind, type) and dataclasses.is_dataclass(kind):
        hints = _hints(kind)
        fields = [(f.name, _encoder(hints[f.name])) for f in saved_fields(kind)]
        return lambda v: {name: enc(getattr(v, name)) for name, enc in fields}
    if isinstance(kind, type) and issubclass(kind, Enum):
        return lambda v: v.value
    if origin is list or origin is typing.List:
        if args and any(args[0] is k for k in _AS_IS):
            return list
        item = _encoder(args[0]) if args else _dynamic
        return lambda v: [item(x) for x in v]
    if origin in (set, frozenset):
        item = _encoder(args[0]) if args else _dynamic
        return lambda v: _sorted([item(x) for x in v])
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            item = _encoder(args[0])
            return lambda v: [item(x) for x in v]
        items = [_encoder(a) for a in args]
        return lambda v: [enc(x) for enc, x in zip(items, v)]
    if origin is dict:
        if not args:
            return lambda v: _dict(v, _dynamic, _dynamic)
        if _by_value(kind):
            return _hashes_to
        key_text, val = _key_text(args[0]), _encoder(args[1])
        return lambda v: {key_text(k): val(x) for k, x in v.items()}
    return _dynamic


def _by_value(kind: Any) -> bool:
    """``dict[tuple[int, ...], str]``: written by value (:func:`_hashes_to`)."""
    args = typing.get_args(kind)
    if typing.get_origin(kind) is not dict or len(args) != 2 or args[1] is not str or typing.get_origin(args[0]) is not tuple:
        return False
    items = typing.get_args(args[0])
    return bool(items) and all(a is int for a in items if a is not Ellipsis)


def _hashes_to(value: dict) -> dict[str, list[list[int]]]:
    """Each value once, with the runs of keys that hold it: ``[first, *rest, count]`` stands for
    the ``count`` keys ``(first + i, *rest)``. Keys sorted by their tail, then their head."""
    by_value: dict[str, list[tuple[int, ...]]] = {}
    for k, v in value.items():
        by_value.setdefault(v, []).append(k)
    out: dict[str, list[list[int]]] = {}
    for v, keys in by_value.items():
        runs: list[list[int]] = []
        for k in sorted(keys, key=lambda k: (k[1:], k[0])):
            last = runs[-1] if runs else None
            if last is not None and tuple(last[1:-1]) == tuple(k[1:]) and last[0] + last[-1] == k[0]:
                last[-1] += 1
            else:
                runs.append([k[0], *k[1:], 1])
        out[v] = runs
    return out


def _hashes_from(data: Any) -> dict[tuple[int, ...], str]:
    if isinstance(data, list):  # [key, value] pairs (an older file)
        return {tuple(k): v for k, v in data}
    out: dict[tuple[int, ...], str] = {}
    for v, runs in data.items():
        for run in runs:
            first, rest, count = run[0], tuple(run[1:-1]), run[-1]
            for i in range(count):
                out[(first + i, *rest)] = v
    return out


def _key_text(kind: Any) -> Callable[[Any], str]:
    """A dict key as an object key: str (and str enums) as they are, int as its digits, any other
    key as the JSON text of its encoding."""
    if kind is str or (isinstance(kind, type) and issubclass(kind, str)):
        return lambda k: k.value if isinstance(k, Enum) else k
    if kind is int:
        return str
    if typing.get_origin(kind) is tuple and all(a is int for a in typing.get_args(kind)):
        return lambda k: "[" + ", ".join(map(str, k)) + "]"  # json.dumps's text, at a fraction of its cost
    enc = _encoder(kind)
    return lambda k: json.dumps(enc(k))


def _sorted(items: list) -> list:
    try:
        return sorted(items)
    except TypeError:
        return items


def _dict(value: dict, key: Callable[[Any], Any], val: Callable[[Any], Any]) -> Any:
    """A dict no annotation types (by its values' own types): str keys as an object's; int keys
    as an object's too, as strings; other keys (tuples, None) as [key, value] pairs."""
    if all(isinstance(k, str) for k in value):
        return {(k.value if isinstance(k, Enum) else k): val(v) for k, v in value.items()}
    if all(isinstance(k, int) and not isinstance(k, bool) for k in value):
        return {str(k): val(v) for k, v in value.items()}
    return [[key(k), val(v)] for k, v in value.items()]


def _dynamic(value: Any) -> Any:
    """By the value's own type, where no annotation says more."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return _encoder(type(value))(value)
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, dict):
        return _dict(value, _dynamic, _dynamic)
    if isinstance(value, (set, frozenset)):
        return _sorted([_dynamic(v) for v in value])
    if isinstance(value, (list, tuple)):
        return [_dynamic(v) for v in value]
    return value


# ---------------------------------------------------------------- from JSON
def from_record(kind: Any, data: Any) -> Any:
    """Rebuild a value of type ``kind`` from :func:`to_record`'s output.

    A dataclass's fields missing from ``data`` keep their defaults (its live and own fields
    always do); a field without a default missing from ``data`` raises ``ValueError``.
    """
    if data is None:
        return None
    origin = typing.get_origin(kind)
    args = typing.get_args(kind)
    if kind is Any or kind is object:
        return data
    if origin is Union or (hasattr(types, "UnionType") and isinstance(kind, getattr(types, "UnionType"))):
        options = [a for a in args if a is not type(None)]
        if len(options) == 1:
            return from_record(options[0], data)
        return data  # a union of several types: stored as is (plain JSON values)
    if isinstance(kind, type) and dataclasses.is_dataclass(kind):
        return _dataclass_from(kind, data)
    if isinstance(kind, type) and issubclass(kind, Enum):
        return kind(data)
    if kind is float:
        return float(data)
    if origin in (list, typing.List) or kind is list:
        return [from_record(args[0], v) for v in data] if args else list(data)
    if origin in (set, frozenset) or kind in (set, frozenset):
        items = {from_record(args[0], v) for v in data} if args else set(data)
        return frozenset(items) if (origin or kind) is frozenset else items
    if origin is tuple or kind is tuple:
        if not args:
            return tuple(data)
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(from_record(args[0], v) for v in data)
        return tuple(from_record(a, v) for a, v in zip(args, data))
    if origin is dict or kind is dict:
        if not args:
            return dict(data)
        if _by_value(kind):
            return _hashes_from(data)
        key, val = args
        if isinstance(data, dict):
            return {_key_from(key, k): from_record(val, v) for k, v in data.items()}
        # [key, value] pairs: how files before keyed objects wrote keys other than str and int.
        return {from_record(key, k): from_record(val, v) for k, v in data}
    return data


def _key_from(kind: Any, key: str) -> Any:
    """An object key back to ``kind`` (:func:`_key_text`'s inverse)."""
    if kind is str or (isinstance(kind, type) and issubclass(kind, str)):
        return from_record(kind, key)
    if kind is int:
        return int(key)
    return from_record(kind, json.loads(key))


def _dataclass_from(cls: type, data: dict) -> Any:
    hints = _hints(cls)
    kwargs = {}
    for f in dataclasses.fields(cls):
        if NOT_SAVED in f.metadata or not f.init:
            continue
        if f.name in data:
            kwargs[f.name] = from_record(hints[f.name], data[f.name])
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise ValueError(f"{cls.__name__}.{f.name} is missing from the snapshot")
    return cls(**kwargs)


# ---------------------------------------------------------------- the record, kept up to date
class _Part(Enum):
    """How :class:`RecordMirror` keeps a field of the record."""

    ITEMS = "items"  # a list of dataclasses: item by item, only those it is told may have changed
    KEYED = "keyed"  # a dict: key by key
    NESTED = "nested"  # a dataclass (not frozen): a mirror of its own, field by field
    WHOLE = "whole"  # anything else: encoded and compared whole (plain data: compared first)


class _Check(Enum):
    """How a dict's value is told unchanged without encoding it."""

    SAME = "same"  # a record (bare dict, list or Any): replaced, never changed in place: by identity
    EQUAL = "equal"  # plain data (no dataclass): == against a copy of what was written
    ENCODED = "encoded"  # holds dataclasses: encoded, then == against what was written


_MISSING = object()


def _is_plain(kind: Any) -> bool:
    """No dataclass anywhere in ``kind``: a value of it compares with ``==`` as its record would."""
    if any(kind is k for k in _AS_IS):
        return True
    if isinstance(kind, type) and issubclass(kind, Enum):
        return True
    if isinstance(kind, type) and dataclasses.is_dataclass(kind):
        return False
    origin = typing.get_origin(kind)
    if origin in (Union, list, set, frozenset, tuple, dict) or (hasattr(types, "UnionType") and isinstance(kind, getattr(types, "UnionType"))):
        return all(_is_plain(a) for a in typing.get_args(kind) if a is not Ellipsis)
    return False


def _copy(value: Any) -> Any:
    """A copy of plain data sharing no container with ``value`` (its scalars are immutable)."""
    if isinstance(value, dict):
        return {k: _copy(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_copy(v) for v in value]
    if isinstance(value, tuple):
        return tuple(_copy(v) for v in value)
    if isinstance(value, (set, frozenset)):
        return type(value)(_copy(v) for v in value)
    return value


def _immutable(kind: Any) -> bool:
    """A value of ``kind`` cannot change in place (scalars, enums, tuples and frozensets of them)."""
    if any(kind is k for k in (int, float, str, bool, type(None))):
        return True
    if isinstance(kind, type) and issubclass(kind, Enum):
        return True
    origin = typing.get_origin(kind)
    if origin in (Union, tuple, frozenset) or (hasattr(types, "UnionType") and isinstance(kind, getattr(types, "UnionType"))):
        return all(_immutable(a) for a in typing.get_args(kind) if a is not Ellipsis)
    return False


def _copier(kind: Any) -> Callable[[Any], Any]:
    """A copy function for plain values of ``kind``, as shallow as the type allows (a dict of
    strings is copied by ``dict``, in C)."""
    if _immutable(kind):
        return _same
    origin, args = typing.get_origin(kind), typing.get_args(kind)
    if origin is dict and args:
        if _immutable(args[1]):
            return dict
        inner = _copier(args[1])
        return lambda v: {k: inner(x) for k, x in v.items()}
    if origin is list and args:
        if _immutable(args[0]):
            return list
        item = _copier(args[0])
        return lambda v: [item(x) for x in v]
    if origin is set and args:
        return set
    return _copy


@dataclasses.dataclass
class _Seen:
    """The value an item's record was last written from, and the same for the items of its
    own lists of :class:`Tracked` values (field -> the list, and one _Seen per item)."""

    value: Any
    lists: dict[str, tuple[list, list["_Seen"]]]


class _Fields:
    """How :class:`RecordMirror` brings the record of a dataclass item up to date.

    A :class:`Tracked` value it wrote before is updated field by field: the fields set since
    (its noted names), and its lists of Tracked values item by item (an item replaced, added or
    gone: the list whole). Any other value (not Tracked, or not the one the record was written
    from) is encoded whole and compared.

    Args:
        kind: the item's dataclass.
    """

    _made: dict[type, "_Fields"] = {}

    @classmethod
    def of(cls, kind: type) -> "_Fields":
        made = cls._made.get(kind)
        if made is None:
            made = cls._made[kind] = cls(kind)
        return made

    def __init__(self, kind: type) -> None:
        hints = _hints(kind)
        self.encode = _encoder(kind)
        self.tracked = issubclass(kind, Tracked)
        self.fields: dict[str, Callable[[Any], Any]] = {}
        self.lists: dict[str, _Fields] = {}
        for f in saved_fields(kind):
            hint = hints[f.name]
            self.fields[f.name] = _encoder(hint)
            args = typing.get_args(hint)
            if typing.get_origin(hint) is list and args and isinstance(args[0], type) and issubclass(args[0], Tracked):
                self.lists[f.name] = _Fields.of(args[0])
        self.names = frozenset(self.fields) - frozenset(self.lists)

    def watch(self, value: Any, notify: tuple[set, int]) -> Optional[_Seen]:
        """Start noting ``value``'s changes (its record was just written whole); its first
        change adds ``notify[1]`` to the set ``notify[0]``."""
        if not self.tracked:
            return None
        value.__dict__[CHANGED] = set()
        value.__dict__[NOTIFY] = notify
        return _Seen(value, {name: (getattr(value, name), [sub.watch(x, notify) for x in getattr(value, name)]) for name, sub in self.lists.items()})

    def update(self, value: Any, seen: Optional[_Seen], old: Any, path: list, ops: list[list], notify: tuple[set, int]) -> tuple[Any, Optional[_Seen]]:
        """``value``'s record now, and what it was written from, given ``old`` (its record last
        written, from ``seen``); the operations that did it appended to ``ops`` (at ``path``)."""
        changed = value.__dict__.get(CHANGED) if self.tracked else None
        if seen is None or seen.value is not value or changed is None or not isinstance(old, dict):
            enc = self.encode(value)
            if type(enc) is not type(old) or enc != old:
                diff(old, enc, path, ops)
            return enc, self.watch(value, notify)
        if changed:
            value.__dict__[CHANGED] = set()
            fields = self.fields
            for name in self.names & changed:
                enc = fields[name](getattr(value, name))
                was = old[name]
                if type(enc) is not type(was) or enc != was:
                    diff(was, enc, path + [name], ops)
                    old[name] = enc
        for name, sub in self.lists.items():
            items = getattr(value, name)
            known, kept = seen.lists[name]
            written = old[name]
            if items is known and len(items) == len(kept) == len(written) and all(k.value is x for k, x in zip(kept, items)):
                for j, x in enumerate(items):
                    if x.__dict__.get(CHANGED):
                        written[j], kept[j] = sub.update(x, kept[j], written[j], path + [name, j], ops, notify)
            else:
                enc = self.fields[name](items)
                if enc != written:
                    diff(written, enc, path + [name], ops)
                    old[name] = enc
                seen.lists[name] = (items, [sub.watch(x, notify) for x in items])
        return old, seen


class RecordMirror:
    """The record of a dataclass value as last written (:func:`to_record`'s output), kept part by
    part, and the operations (:func:`monarch_ft.records.journal.diff`) that bring it up to the
    value's state now.

    Why: encoding a thousand groups' state every tick costs more than the rest of the tick, and
    little of it changed. So only what may have changed is encoded:

    - a field holding a list of dataclasses (the groups): item by item, and :meth:`update` may
      be told which items may have changed (the others are not looked at). Items that are
      :class:`Tracked` are visited only when they noted a change (or were replaced), and then
      only their noted fields are encoded;
    - a field holding a dict: key by key. A value of plain data (no dataclass in its type) is
      compared as it is with a copy of what was written (``==``, in C) and encoded only when
      it differs; a value holding dataclasses is encoded and compared;
    - a field holding a dataclass that is not frozen: the same, field by field (a mirror of its own);
    - any other field: encoded and compared whole (against a copy); plain data is first compared as
      it is with a copy of what was written, and encoded only when it differs.

    A value annotated as a bare ``dict``, ``list`` or ``Any`` (a rank's record, an error) is
    taken to be replaced when it changes, never changed in place: the mirror's record holds it
    by reference, and a dict's such values are compared by identity. The test suites check
    every save's files against the whole snapshot (``Takeover.verify``), which finds a value
    changed in place and a change :meth:`update` was not told of.

    Args:
        cls: the dataclass whose values are mirrored (the job state).
    """

    def __init__(self, cls: type) -> None:
        self.cls = cls
        self.record: dict[str, Any] = {}
        # Per KEYED field: the raw value last written per object key (a copy, or the value
        # itself for SAME), and each raw key's object key (encoding a tuple key costs).
        self._raw: dict[str, dict[str, Any]] = {}
        self._keys: dict[str, dict[Any, str]] = {}
        # Per ITEMS field: which value each item's record was written from (_Seen), and the
        # items that noted a change since (Tracked).
        self._seen: dict[str, list[Optional[_Seen]]] = {}
        self._touched: dict[str, set[int]] = {}
        # Per WHOLE field of plain data: a copy of the value last written (compared before encoding).
        self._whole: dict[str, Any] = {}
        hints = _hints(cls)
        self._plan: list[tuple[str, _Part, Any]] = []
        for f in saved_fields(cls):
            kind = hints[f.name]
            origin, args = typing.get_origin(kind), typing.get_args(kind)
            if origin is list and args and isinstance(args[0], type) and dataclasses.is_dataclass(args[0]):
                self._plan.append((f.name, _Part.ITEMS, _Fields.of(args[0])))
            elif origin is dict and args and not _by_value(kind):
                val = args[1]
                if any(val is k for k in (dict, list, Any, object)):
                    check, copy = _Check.SAME, _same
                elif _is_plain(val):
                    check, copy = _Check.EQUAL, _copier(val)
                else:
                    check, copy = _Check.ENCODED, _same
                self._plan.append((f.name, _Part.KEYED, (_key_text(args[0]), _encoder(val), check, copy)))
            elif isinstance(kind, type) and dataclasses.is_dataclass(kind) and not kind.__dataclass_params__.frozen:  # type: ignore[attr-defined]
                self._plan.append((f.name, _Part.NESTED, RecordMirror(kind)))
            else:
                self._plan.append((f.name, _Part.WHOLE, (_encoder(kind), _copier(kind) if _is_plain(kind) else None)))

    @property
    def names(self) -> list[str]:
        """The record's keys that are the fields'."""
        return [name for name, _, _ in self._plan]

    def update(self, value: Any, items: Optional[Any] = None) -> list[list]:
        """Bring the record up to ``value``; the operations that did it (none the first time: the
        record is then built whole).

        Args:
            value: the dataclass value (of ``cls``).
            items: the indices of the items of the list-of-dataclasses fields that may have
                changed since the last update (None: any may have).
        """
        ops: list[list] = []
        first = not self.record
        rec = self.record
        for name, part, how in self._plan:
            raw = getattr(value, name)
            if part is _Part.ITEMS:
                old = rec.get(name)
                touched = self._touched.setdefault(name, set())
                if old is None or len(old) != len(raw):
                    new = [how.encode(x) for x in raw]
                    if old is not None:
                        ops.append([[name], new])
                    rec[name] = new
                    touched.clear()
                    self._seen[name] = [how.watch(x, (touched, i)) for i, x in enumerate(raw)]
                    continue
                seen = self._seen[name]
                # The items that may have changed: those that noted a change, and any not
                # written from the value in its place now (replaced, or not Tracked).
                due = touched | {i for i, (k, x) in enumerate(zip(seen, raw)) if k is None or k.value is not x}
                if items is not None:
                    due &= set(items)
                touched -= due
                for i in sorted(due):
                    old[i], seen[i] = how.update(raw[i], seen[i], old[i], [name, i], ops, (touched, i))
            elif part is _Part.KEYED:
                self._update_keyed(name, raw, how, ops, first)
            elif part is _Part.NESTED:
                inner = how.update(raw)
                if name not in rec:
                    if not first:
                        ops.append([[name], how.record])
                    rec[name] = how.record  # the child's record, kept up to date by it
                else:
                    ops += [[[name, *op[0]], *op[1:]] for op in inner]
            else:
                encode, copier = how
                if copier is not None and name in rec:
                    # Plain data: compared as it is with a copy of what was written (in C), and
                    # encoded only when it differs (a set of a thousand keys is sorted to encode).
                    kept = self._whole.get(name, _MISSING)
                    if type(kept) is type(raw) and kept == raw:
                        continue
                enc = encode(raw)
                if first or name not in rec:
                    if not first:
                        ops.append([[name], enc])
                    rec[name] = _copy(enc)
                elif not (type(enc) is type(rec[name]) and enc == rec[name]):
                    diff(rec[name], enc, [name], ops)
                    rec[name] = _copy(enc)
                if copier is not None:
                    self._whole[name] = copier(raw)
        return ops

    def _update_keyed(self, name: str, raw: dict, how: tuple, ops: list[list], first: bool) -> None:
        key_text, enc_val, check, copy = how
        shadow = self.record.setdefault(name, {})
        kept = self._raw.setdefault(name, {})
        keys = self._keys.setdefault(name, {})
        before = len(shadow)
        matched = 0
        for k, v in raw.items():
            t = keys.get(k)
            if t is None:
                t = keys[k] = key_text(k)
            prev = kept.get(t, _MISSING)
            if prev is not _MISSING:
                matched += 1
                if check is _Check.SAME and prev is v:
                    continue
                if check is _Check.EQUAL and type(prev) is type(v) and prev == v:
                    continue
            enc = enc_val(v)
            if t in shadow:
                if check is _Check.ENCODED and enc == shadow[t]:
                    continue
                if check is _Check.SAME:
                    # A record replaced (a group's newest commit): set whole, as small as its
                    # diff and without walking it.
                    ops.append([[name, t], enc])
                else:
                    diff(shadow[t], enc, [name, t], ops)
            elif not first:
                ops.append([[name, t], enc])
            shadow[t] = enc
            kept[t] = copy(v) if check is not _Check.ENCODED else True
        if matched < before:  # keys gone
            live = {keys[k] for k in raw}
            for t in [t for t in shadow if t not in live]:
                del shadow[t]
                kept.pop(t, None)
                ops.append([[name, t]])
            if len(keys) > 2 * len(raw) + 16:
                self._keys[name] = {k: keys[k] for k in raw}


# ---------------------------------------------------------------- checks
def unset_fields(value: Any, path: str = "", seen: Optional[set] = None) -> list[str]:
    """Paths of the saved fields of ``value`` (walked through nested dataclasses, lists and
    dicts) that still hold their default: what a test of the round trip fills in first, so a
    field added without a value in that test fails it."""
    out: list[str] = []
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        for f in saved_fields(value):
            v = getattr(value, f.name)
            if f.default is not dataclasses.MISSING:
                default = f.default
            elif f.default_factory is not dataclasses.MISSING:
                default = f.default_factory()
            else:
                default = dataclasses.MISSING
            here = f"{path}.{f.name}" if path else f.name
            if default is not dataclasses.MISSING and v == default:
                out.append(here)
            out += unset_fields(v, here)
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            out += unset_fields(v, f"{path}[{i}]")
    elif isinstance(value, dict):
        for k, v in value.items():
            out += unset_fields(v, f"{path}[{k!r}]")
    return out
