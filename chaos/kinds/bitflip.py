"""``bitflip``: one bit of one element of the target rank's model or optimizer state flipped, at a step.

Nothing crashes and no signal is sent: silent data corruption, as a bad DIMM or a marginal GPU
makes it. The injector drops a request file; the rank's fault agent flips the bit in place at
the top of its next step and reports ``bitflip_injected`` (the tensor, element, bit, the value
before and after). Finding it is the integrity checks' job (monarch_ft.controller.integrity):
the groups' state fingerprints disagree within ``ft.integrity_every`` steps, or (an exponent
flip) the group's own gradient check votes the step down first. With three or more groups
the minority is failed and heals from the majority; with two, the job rolls back to a
verified checkpoint. Recovered when the target, relaunched, commits with the others again
with the same weights; detected at the controller's verdict (``sdc_detected``).

Options: ``tensor`` (a name pattern over the rank's state: ``model.<parameter>``,
``optim.<parameter>.exp_avg`` / ``exp_avg_sq``), ``bit`` (``mantissa``: the mantissa's top bit,
a plausible wrong value; ``exponent``: the exponent's top bit, ~1e38 or inf; ``sign``;
``random``; or a bit number), ``seed`` (which matching tensor and which element).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from chaos.kinds.base import FaultCategory, FaultKind, FaultOptions
from monarch_ft.config.ft import integrity_setting
from monarch_ft.records.errors import ConfigError
from monarch_ft.records.events import EventKind
from monarch_ft.records.integrity import BIT_CLASSES, check_bit
from monarch_ft.records.recovered import RecoveryRule, Scope


@dataclass
class BitflipOptions(FaultOptions):
    MODES: ClassVar[tuple[str, ...]] = BIT_CLASSES
    MODE_FIELD: ClassVar[str] = "bit"
    bit: str = "mantissa"
    """Which bit of the element: ``mantissa``, ``exponent``, ``sign``, ``random`` (one drawn by
    ``seed``), or a bit number (0: the lowest)."""
    tensor: str = "model.*"
    """Which tensors of the rank's state may be hit: an fnmatch pattern over ``model.<name>`` and
    ``optim.<name>.<moment>`` (e.g. ``model.layers.0.*``, ``optim.*.exp_avg``)."""
    seed: int = 0
    """Draws the tensor among those matching, and the element in it."""

    def check(self, where: str) -> None:
        problem = check_bit(self.bit)
        if problem:
            raise ConfigError(f"{where}.bit={self.bit!r}: {problem}")
        if not self.tensor.startswith(("model.", "optim.", "*")):
            raise ConfigError(f"{where}.tensor={self.tensor!r}: names start with model. or optim. (e.g. model.layers.0.*, optim.*.exp_avg)")


class Bitflip(FaultKind):
    name = "bitflip"
    category = FaultCategory.SILENT
    options = BitflipOptions
    # Found by a verdict of the controller's (the job's: a rollback names no one group); over
    # once the target, relaunched, is back with the others' weights.
    recovery = RecoveryRule(new_attempt=True, marker=EventKind.SDC_DETECTED, scope=Scope.JOB)
    costs_restart = True
    rank_action = "flip the bit in its live state at the top of its next step (its fault agent)"
    detected_by = EventKind.SDC_DETECTED
    detected_step_field = "step"
    hit_by = EventKind.BITFLIP_INJECTED

    def check(self, fault, cfg, traits, where: str) -> None:
        if integrity_setting(cfg.ft.integrity_every) == 0:
            raise ConfigError(f"{where}.kind=bitflip: a flipped bit is found by the replicas' state fingerprints: set ft.integrity_every=auto (or a number)")
        if cfg.ft.mode != "hsdp":
            raise ConfigError(
                f"{where}.kind=bitflip: needs ft.mode=hsdp (in {cfg.ft.mode} the groups' weights differ between syncs and a flip is averaged into every group)"
            )
        if cfg.ft.replica_groups < 2:
            raise ConfigError(f"{where}.kind=bitflip: needs ft.replica_groups >= 2 (a replica to compare with)")

    def inject(self, job, group: int, fault) -> dict[str, Any]:
        return job.bitflip(group, fault.rank, fault.tensor, fault.bit, fault.seed)


KIND = Bitflip()
