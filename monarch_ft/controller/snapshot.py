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
"""

from __future__ import annotations

import dataclasses
import functools
import types
import typing
from enum import Enum
from typing import Any, Callable, Optional, Union

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


# One encoder per annotation, built once (every tick saves the state: walking the type hints
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
        key, val = (_encoder(args[0]), _encoder(args[1])) if args else (_dynamic, _dynamic)
        return lambda v: _dict(v, key, val)
    return _dynamic


def _sorted(items: list) -> list:
    try:
        return sorted(items)
    except TypeError:
        return items


def _dict(value: dict, key: Callable[[Any], Any], val: Callable[[Any], Any]) -> Any:
    """Str keys as an object's; int keys as an object's too, as strings; other keys (tuples,
    None) as [key, value] pairs."""
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
        key, val = args
        pairs = data.items() if isinstance(data, dict) else data
        return {_key_from(key, k): from_record(val, v) for k, v in pairs}
    return data


def _key_from(kind: Any, key: Any) -> Any:
    if kind is int and isinstance(key, str):
        return int(key)
    return from_record(kind, key)


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
