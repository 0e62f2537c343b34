"""Fault kinds: one module per kind, found by name, as launchers are.

A kind is the module ``chaos/kinds/<name>.py`` exposing ``KIND``, an instance of its
:class:`~chaos.kinds.base.FaultKind` subclass; adding one (say a signal the rank survives)
touches no other file. Its entries in ``chaos.faults`` are parsed into its own options
(:func:`parse_fault`), which refuse the keys of other kinds.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import pkgutil
from typing import Any, Optional

from chaos.kinds.base import FaultCategory, FaultKind, FaultOptions, option_names
from monarch_ft.records.errors import ConfigError

_NOT_KINDS = {"base"}


@functools.lru_cache(maxsize=None)
def fault_kinds() -> dict[str, FaultKind]:
    """Every kind, by name (its module's ``KIND``)."""
    import chaos.kinds as pkg

    kinds: dict[str, FaultKind] = {}
    for module in sorted(m.name for m in pkgutil.iter_modules(pkg.__path__)):
        if module in _NOT_KINDS or module.startswith("_"):
            continue
        kind = importlib.import_module(f"chaos.kinds.{module}").KIND
        if kind.name != module:
            raise RuntimeError(f"chaos/kinds/{module}.py defines the kind {kind.name!r}: a kind's module is named after it")
        kinds[kind.name] = kind
    return kinds


def kind_names() -> list[str]:
    return list(fault_kinds())


def fault_kind(name: str) -> FaultKind:
    """The kind ``name`` (KeyError naming the kinds there are, for one there is not)."""
    kinds = fault_kinds()
    if name not in kinds:
        raise KeyError(f"no fault kind {name!r}: the kinds are {', '.join(kinds)}")
    return kinds[name]


def parse_fault(value: Any, where: str = "fault") -> FaultOptions:
    """One ``chaos.faults`` entry (a dict, an OmegaConf node, or options already parsed) as
    its kind's own options, checked.

    Args:
        value: the entry; its ``kind`` selects the options class (process_kill when absent).
        where: how messages name the entry (``chaos.faults[2]``).

    Raises:
        ConfigError: one line: an unknown kind, a key its kind does not have (a null value
            counts as not given), a value of the wrong type, or one its options refuse.
    """
    from omegaconf import DictConfig, OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    if isinstance(value, FaultOptions):
        kind = fault_kinds().get(value.kind)
        if kind is not None and type(value) is kind.options:
            return value
        value = dataclasses.asdict(value)
    if isinstance(value, DictConfig):
        value = OmegaConf.to_container(value, resolve=True)
    if not isinstance(value, dict):
        raise ConfigError(f"{where}={value!r}: a fault is a mapping, e.g. {{kind: process_kill, at_step: 10}}")
    given = {k: v for k, v in value.items() if v is not None}
    name = given.setdefault("kind", FaultOptions.kind)
    kinds = fault_kinds()
    if name not in kinds:
        raise ConfigError(f"{where}.kind={name!r}: choose one of {', '.join(kinds)}")
    kind = kinds[name]
    known = option_names(kind.options)
    for key in sorted(set(given) - set(known)):
        having = [k.name for k in kinds.values() if key in option_names(k.options)]
        if having:
            raise ConfigError(f"{where}.{key}={given[key]!r}: {name} faults have no {key} (only {', '.join(having)} do): drop it")
        raise ConfigError(f"{where}.{key}: no fault has this option; a {name} fault's are {', '.join(known)}")
    try:
        options = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(kind.options), given))
    except OmegaConfBaseException as e:
        key = getattr(e, "full_key", None)
        raise ConfigError(f"{where}{'.' + key if key else ''}: {str(e).splitlines()[0]}") from None
    options.check(where)
    return options


def fault_mode(fault: FaultOptions) -> Optional[str]:
    """The fault's mode, its kind's default when not given; None for kinds without modes."""
    return fault_kind(fault.kind).mode(fault)


def fault_label(kind: str, mode: Optional[str]) -> str:
    """How reports name a fault kind: ``hang:gil``; a kind's default mode and kinds without
    modes by the kind alone (``hang`` is a SIGSTOP hang, as it always was). A kind this build
    does not have (an older drill's) by its name."""
    found = fault_kinds().get(kind)
    modes = found.modes if found is not None else ()
    return kind if not mode or not modes or mode == modes[0] else f"{kind}:{mode}"


__all__ = [
    "FaultCategory",
    "FaultKind",
    "FaultOptions",
    "fault_kind",
    "fault_kinds",
    "fault_label",
    "fault_mode",
    "kind_names",
    "parse_fault",
]
