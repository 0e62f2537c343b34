"""The global batch across quorum changes (``ft.global_batch``): which data slots each replica
group trains at a step, and what a step's records say it consumed.

A *slot* is one replica group's share of a step's data in the fault-free run: slot ``s`` of step
``t`` is what group ``s`` reads at ``t`` (``TokenBatches.batch(t, s, rank)`` on each of its ranks,
a pure function of the seed, the step, the slot and the rank). A fault-free step of ``G`` groups
consumes slots ``0 .. G-1``.

``constant``: while only ``G' < G`` groups take part in a step (the others are down, or healing
and sending nothing), the participants also train the absent groups' slots by gradient
accumulation, so every committed step consumes exactly slots ``0 .. G-1`` of that step, the
fault-free run's data and token count. :func:`assign_slots` decides who trains which, from the
participant list alone, which every participant of the step sees identically; the cross-group
sum is divided by the number of micro-batches summed (a slot is one micro-batch of equal tokens
per rank), so the average is per token, also when ``G'`` does not divide ``G`` and the lists
are of unequal length.

``shrink``: each participant trains its own slot only; an absent group's slots of those steps are
never trained (TorchFT's behaviour: the survivors average over fewer groups).
"""

from __future__ import annotations

from typing import Iterable, Mapping, Sequence

from monarch_ft.records.events import StrEnum
from monarch_ft.records.members import members_of


class GlobalBatch(StrEnum):
    """``ft.global_batch`` once resolved for the mode (``auto`` is not one: see resolve)."""

    CONSTANT = "constant"
    SHRINK = "shrink"


AUTO = "auto"
SETTINGS = (AUTO, GlobalBatch.CONSTANT.value, GlobalBatch.SHRINK.value)


def resolve(setting: str, mode: str) -> GlobalBatch:
    """The policy ``setting`` (``ft.global_batch``) stands for under ``mode`` (``ft.mode``).

    ``auto`` is ``constant`` where it is built (hsdp) and ``shrink`` with localsgd and diloco,
    where a window's participants are only known at its end (monarch_ft.config.ft says why).

    Raises:
        ValueError: a setting that is not one of :data:`SETTINGS`.
    """
    if setting == AUTO:
        return GlobalBatch.CONSTANT if mode == "hsdp" else GlobalBatch.SHRINK
    try:
        return GlobalBatch(setting)
    except ValueError:
        raise ValueError(f"ft.global_batch={setting!r}: choose one of {', '.join(SETTINGS)}") from None


def assign_slots(num_slots: int, participants: Iterable[int]) -> dict[int, tuple[int, ...]]:
    """Each participant's slots for one step: its own first, then the absent groups' slots dealt
    round-robin over the participants in ascending order.

    Every slot ``0 .. num_slots-1`` is in exactly one list (the own slots of the participants, and
    each absent slot once), so a step whose participants each train their list consumes every slot
    once. Two participants' lists differ in length by at most one. A pure function of its
    arguments: every participant computes the same assignment from the same participant list.

    Args:
        num_slots: slots per step, the job's replica groups (``ft.replica_groups``).
        participants: the groups whose gradients the step sums (any order, no repeats).

    Raises:
        ValueError: no participants, a repeated one, or one outside ``0 .. num_slots-1``.
    """
    given = list(participants)
    ordered = sorted(set(given))
    if not ordered or len(ordered) != len(given) or ordered[0] < 0 or ordered[-1] >= num_slots:
        raise ValueError(f"participants {given}: need distinct groups in 0..{num_slots - 1}, at least one")
    lists: dict[int, list[int]] = {p: [p] for p in ordered}
    absent = [s for s in range(num_slots) if s not in lists]
    for i, slot in enumerate(absent):
        lists[ordered[i % len(ordered)]].append(slot)
    return {p: tuple(slots) for p, slots in lists.items()}


def step_tokens(micro_batches: int, ranks_per_group: int, batch_size: int, seq_len: int) -> int:
    """Tokens a step trained over every group: ``micro_batches`` slots summed across groups (a
    slot is ``batch_size`` sequences of ``seq_len`` tokens on each of a group's ranks)."""
    return micro_batches * ranks_per_group * batch_size * seq_len


def step_assignment(policy: GlobalBatch, num_slots: int, participants: Iterable[int]) -> dict[int, tuple[int, ...]]:
    """Each participant's slots at a step under ``policy``: :func:`assign_slots` (constant), or each
    its own only (shrink)."""
    if policy is GlobalBatch.CONSTANT:
        return assign_slots(num_slots, participants)
    return {p: (p,) for p in sorted(set(participants))}


def consumed(records: Iterable[Mapping], num_slots: int, policy: GlobalBatch) -> dict[int, list[int]]:
    """The slots each committed step consumed, from its step records: ``{step: sorted slots}``.

    A group's slots at a step are what its committed record names (``slots``; every rank of a
    group names the same ones). A group the step's sum counted (``participating_groups``) but
    that left no committed record of it (killed after the sum, before its record) trained what
    the assignment gave it: the assignment is the only way a group picks its slots, and the
    sum's count of micro-batches (``global_tokens``) says how many it summed. Slots named twice in
    one step are kept twice, so a repeat shows. Records without ``slots`` are skipped.

    Args:
        records: step records (``metrics.jsonl``), any order.
        num_slots: slots per step (``ft.replica_groups``).
        policy: the job's ``ft.global_batch``, resolved.

    Raises:
        ValueError: two committed records of one step name different participants.
    """
    own: dict[int, dict[int, Sequence[int]]] = {}
    members: dict[int, tuple[int, ...]] = {}
    for r in records:
        if not r.get("committed") or r.get("slots") is None:
            continue
        step = int(r["step"])
        own.setdefault(step, {})[int(r["group"])] = r["slots"]
        counted = tuple(sorted(members_of(r)))
        if members.setdefault(step, counted) != counted:
            raise ValueError(f"step {step}: records name different participants, {members[step]} and {counted}")
    out: dict[int, list[int]] = {}
    for step in sorted(own):
        plan = step_assignment(policy, num_slots, members[step]) if members[step] else {}
        slots = [s for g, named in own[step].items() for s in named]
        slots += [s for g, assigned in plan.items() if g not in own[step] for s in assigned]
        out[step] = sorted(slots)
    return out
