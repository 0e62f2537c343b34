"""Keys that would do nothing in the mode the rest of the config selects are refused, not ignored.

A user who sets ``ft.fragments=4`` under ``ft.mode=hsdp`` expects streaming DiLoCo; silently
training plain HSDP instead would cost them a run to find out. A dataclass cannot tell a key
the user set from one left alone, so a key counts as set when its value differs from its
field's default: setting a key to its default is harmless either way.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Iterable

from monarch_ft.records.errors import ConfigError


def field_default(cls: type, name: str) -> Any:
    """The default of dataclass ``cls``'s field ``name`` (its factory's value for a mutable one)."""
    f = next(f for f in dataclasses.fields(cls) if f.name == name)
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    raise ValueError(f"{cls.__name__}.{name} has no default")


def changed(section: Any, name: str) -> bool:
    """Whether ``section.name`` differs from its default (the user set it): its field's, or the
    one the section worked out from its other keys when left at 0 (``resolved_defaults()``,
    where the section has it: ft's heartbeats, by the job's size)."""
    resolved = section.resolved_defaults() if hasattr(section, "resolved_defaults") else {}
    default = resolved[name] if name in resolved else field_default(type(section), name)
    return getattr(section, name) != default


def shown(value: Any) -> str:
    """A value as it is written on the command line."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    return str(value)


def refuse_unused(section: Any, prefix: str, keys: Iterable[str], because: str, fix: str) -> None:
    """Raise :class:`ConfigError` for the first of ``keys`` of ``section`` that was set although
    it has no effect ``because``: one line, ``<prefix>.<key>=<value> has no effect <because>: <fix>``."""
    for key in keys:
        if changed(section, key):
            raise ConfigError(f"{prefix}.{key}={shown(getattr(section, key))} has no effect {because}: {fix}")
