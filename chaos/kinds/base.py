"""What a fault kind is: its options, its category, and the contract every kind fulfils.

A kind is one module under ``chaos/kinds/`` named after it, exposing ``KIND``, an instance of
its :class:`FaultKind` subclass. Everything the drill asks of a kind is here: how it is
checked against the job (:meth:`FaultKind.check`), how it is done (:meth:`FaultKind.inject`),
what it costs the restart budget, what the rank must do for it, and when it is recovered
(:attr:`FaultKind.recovery`, applied by :mod:`monarch_ft.records.recovered`). The injector, the
drill's validation, the MTTR analysis and the report read these and never a kind's name.
"""

from __future__ import annotations

import dataclasses
import signal
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Optional

from monarch_ft.records.errors import ConfigError
from monarch_ft.records.events import EventKind, StrEnum
from monarch_ft.records.recovered import RESTARTED, RecoveryRule

if TYPE_CHECKING:
    from chaos.config import DrillConfig
    from monarch_ft.controller.control import JobControl
    from monarch_ft.launcher import LauncherTraits


class FaultCategory(StrEnum):
    """What a fault does to the job, which decides how the MTTR analysis reads its phases."""

    RESTART = "restart"  # a group's processes are gone or killed: a relaunch answers it
    IN_PLACE = "in_place"  # no process is lost: TorchFT carries on, or reconfigures without a restart
    NETWORK = "network"  # a simulated host's link, undone after duration_s (may still end in a restart)
    CONTROL_PLANE = "control_plane"  # the controller or the Lighthouse; no group is touched
    SILENT = "silent"  # nothing crashes: the controller's integrity checks find it (detected_by), and act


@dataclass
class FaultOptions:
    """One entry of ``chaos.faults``: what every kind of fault has.

    A kind with options of its own subclasses this as its :attr:`FaultKind.options`; an
    entry's key that is not a field of its kind's options is refused (:func:`chaos.kinds.parse_fault`).
    """

    kind: str = "process_kill"
    """The fault's kind: a module of chaos/kinds (each below, with its own options)."""

    at_step: Optional[int] = None
    """Fire at the first committed step >= this (give exactly one of ``at_step`` and ``at_s``)."""

    at_s: Optional[float] = None
    """Fire this many seconds after training began (give exactly one of ``at_step`` and ``at_s``)."""

    target: Optional[int] = None
    """The replica group hit; null: drawn among the healthy groups (seeded by ``chaos.seed``)."""

    rank: int = 0
    """The rank hit in the target group."""

    wait_standby: bool = True
    """With warm standby groups (``ft.standby_groups`` > 0): fire only once every standby is ready,
    so the fault measures the standby path; false fires on schedule (e.g. a second fault while the
    standby is still being rebuilt takes the cold path). Without standbys it does nothing."""

    def check(self, where: str) -> None:
        """Refuse a value of this entry that no job could run.

        Args:
            where: how the message names the entry (``chaos.faults[2]``).

        Raises:
            ConfigError: one line naming the field and the fix.
        """


@dataclass
class ModeOptions(FaultOptions):
    """Options of a kind that comes in modes (:attr:`MODES`, the first one the default)."""

    MODES: ClassVar[tuple[str, ...]] = ()
    # The option that holds the mode (a kind may call it otherwise: bitflip's ``bit``).
    MODE_FIELD: ClassVar[str] = "mode"
    mode: Optional[str] = None
    """One of the kind's modes (listed with the kind); null: the first, its default."""

    def __post_init__(self) -> None:
        if self.mode is None:
            self.mode = self.MODES[0]

    def check(self, where: str) -> None:
        if self.mode not in self.MODES:
            raise ConfigError(f"{where}.mode={self.mode!r}: {self.kind} faults are {' or '.join(self.MODES)}")


class FaultKind(ABC):
    """One kind of fault a drill injects: what the rest of the drill needs to know of it.

    Subclasses set the class attributes and implement :meth:`inject`; the defaults suit a kind
    with no options of its own that costs no restart and needs nothing from the rank.
    """

    # The name a drill gives (``kind: process_kill``); also the kind's module name.
    name: ClassVar[str]
    category: ClassVar[FaultCategory]
    # Its entry's options (FaultOptions or a subclass with the kind's own fields).
    options: ClassVar[type[FaultOptions]] = FaultOptions
    # When it is recovered and where its MTTR clock stops (monarch_ft.records.recovered).
    recovery: ClassVar[RecoveryRule]
    # Whether it may cost its target group one restart of ft.max_restarts (a full restart:
    # one of every group); the drill is refused up front when the budget cannot cover it.
    costs_restart: ClassVar[bool] = False
    # What the rank itself must do for it (its fault agent, monarch_ft.rank.components.fault_agent);
    # empty when the fault is done entirely from outside.
    rank_action: ClassVar[str] = ""
    # For a control-plane or silent fault: the event that shows it was seen (the MTTR's "detected").
    detected_by: ClassVar[Optional[EventKind]] = None
    # The field of that event naming the training step it was caught at; None: the job's
    # committed step then (drill.json's detected_step).
    detected_step_field: ClassVar[Optional[str]] = None
    # The rank's event that says when the fault landed (its step: drill.json's hit_step, and
    # the detection latency in steps); None: the injection is when it landed.
    hit_by: ClassVar[Optional[EventKind]] = None
    # Injecting it ends the process the injector runs in (the controller): the injector
    # records it first, and the drill runs under a watchdog that attaches a new controller.
    ends_this_process: ClassVar[bool] = False

    @property
    def modes(self) -> tuple[str, ...]:
        """The kind's modes, the default first; () for a kind without modes."""
        return getattr(self.options, "MODES", ())

    @property
    def mode_option(self) -> str:
        """The name of the option that holds the kind's mode (``mode``, or e.g. bitflip's ``bit``)."""
        return getattr(self.options, "MODE_FIELD", "mode")

    def mode(self, fault: FaultOptions) -> Optional[str]:
        """The fault's mode (its kind's default when not given).

        Args:
            fault: the fault's options.

        Returns:
            The mode, or None for a kind without modes.
        """
        return getattr(fault, self.mode_option, None) if self.modes else None

    def check(self, fault: FaultOptions, cfg: "DrillConfig", traits: "LauncherTraits", where: str) -> None:
        """Refuse a fault this job cannot run, before anything is launched.

        Args:
            fault: the fault's options (already checked on their own: :meth:`FaultOptions.check`).
            cfg: the drill's config.
            traits: what the job's launcher can do.
            where: how the message names the entry (``chaos.faults[2]``).

        Raises:
            ConfigError: one line naming the setting and the fix.
        """

    def announce(self, job: "JobControl", group: int, fault: FaultOptions) -> dict[str, Any]:
        """What the injector records of a fault that ends its own process (:attr:`ends_this_process`),
        before :meth:`inject` runs: after it there is nobody left to record it.

        Args:
            job: the running job.
            group: the target group.
            fault: the fault's options.

        Returns:
            The fields the ``fault_injected`` event carries.
        """
        return {}

    def needs_next(self, fault: FaultOptions) -> bool:
        """Whether this fault is timed from the drill's next fault (see :meth:`after_next`), so
        that a drill ending with it is refused.

        Args:
            fault: the fault's options.
        """
        return False

    def after_next(self, job: "JobControl", fault: FaultOptions, details: dict[str, Any]) -> None:
        """Called once the drill's next fault was injected, for a fault timed from it (node_down's
        ``back_after_next_s``); nothing by default.

        Args:
            job: the running job.
            fault: this fault's options.
            details: what :meth:`inject` returned for it.
        """

    @abstractmethod
    def inject(self, job: "JobControl", group: int, fault: FaultOptions) -> dict[str, Any]:
        """Do the fault. Detection and recovery are the supervisor's and TorchFT's: nothing
        here tells them a fault happened.

        Args:
            job: the running job (the narrow handle hooks get).
            group: the target group.
            fault: the fault's options.

        Returns:
            What was done (pids, signals, files), for the ``fault_injected`` event.
        """


class SignalFault(FaultKind):
    """A signal to one rank of the target group: the plain kind of fault. The defaults are a
    fatal one (its group is relaunched, one restart of the budget); a kind whose signal the
    rank survives overrides :attr:`category`, :attr:`recovery` and :attr:`costs_restart`."""

    category = FaultCategory.RESTART
    recovery = RESTARTED
    costs_restart = True
    signal: ClassVar[signal.Signals]

    def inject(self, job: "JobControl", group: int, fault: FaultOptions) -> dict[str, Any]:
        return job.signal_rank(group, fault.rank, self.signal)


@dataclass
class NetworkOptions(FaultOptions):
    LINK_STAYS: ClassVar[str] = "cut"
    """What the fault does to the link, for messages."""

    duration_s: float = 15.0
    """Seconds the link stays cut (or slow) before the fault undoes itself."""

    def check(self, where: str) -> None:
        if self.duration_s <= 0:
            raise ConfigError(f"{where}.duration_s={self.duration_s}: must be > 0 (how long the link stays {self.LINK_STAYS})")


class NetworkFault(FaultKind):
    """A fault of the target group's host link; needs simulated hosts (one network namespace
    per group). In place (no process is touched), undone after ``duration_s``; recovered at
    the group's first commit with the others after the link is back."""

    category = FaultCategory.NETWORK
    options = NetworkOptions
    recovery = RecoveryRule(marker=EventKind.LINK_RESTORED)

    def check(self, fault: FaultOptions, cfg: "DrillConfig", traits: "LauncherTraits", where: str) -> None:
        if not traits.simulated_hosts:
            raise ConfigError(
                f"{where}.kind={fault.kind}: network faults need simulated hosts (one network namespace per group): "
                "use launcher=local_hosts (launcher.options.simulated_hosts=true)"
            )


class ControlPlaneFault(FaultKind):
    """A fault of the job's control plane (the controller, the Lighthouse): no group is
    touched; the target is only the group whose commits show the recovery."""

    category = FaultCategory.CONTROL_PLANE

    def check(self, fault: FaultOptions, cfg: "DrillConfig", traits: "LauncherTraits", where: str) -> None:
        if cfg.ft.lighthouse_addr:
            raise ConfigError(f"{where}.kind={fault.kind}: needs the Lighthouse the supervisor starts: unset ft.lighthouse_addr")


def option_names(options: type[FaultOptions]) -> list[str]:
    """The keys an entry of a kind with ``options`` may have."""
    return [f.name for f in dataclasses.fields(options)]
