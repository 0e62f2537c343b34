"""Fail-slow groups, decided each tick: name the groups slower than their peers
(:mod:`monarch_ft.controller.stragglers`: CPU stragglers from their step times, link stragglers
from probe rounds) and, under ``ft.straggler=evict``, fail one when the planner says evicting it
pays: the failure's own answer then promotes the ready standby on another host. The straggler's
host is left out of later placements: a Slurm node through the node pool (``node_excluded``, as a
node fault's; it returns after ``ft.node_probation_s``), a simulated host as a record
(``state.excluded_hosts``, until its slowness ends: the local launchers never place a group on a
host slot again once it left it)."""

from __future__ import annotations

from monarch_ft.controller.actions import StartProbe
from monarch_ft.controller.decide.base import Tick
from monarch_ft.controller.decide.recovery import fail_group, nodes_of
from monarch_ft.controller.placement import Suspect
from monarch_ft.controller.planner import KeepStraggler
from monarch_ft.controller.state import FailureKind
from monarch_ft.controller.stragglers import (
    SlowKind,
    StragglerLimits,
    back_to_pace,
    collective_loss,
    confirm_link_stragglers,
    cost_so_far,
    cpu_suspects,
    find_link_stragglers,
    find_stragglers,
    probe_due,
)
from monarch_ft.records.events import EventKind, ExclusionReason, GroupStatus

# The least time between two judgements of the step times, per running group (judge_gap_s).
JUDGE_S_PER_GROUP = 0.001


def check_stragglers(t: Tick) -> None:
    """Name, clear, keep or evict stragglers (see the module docstring)."""
    ft, state = t.cfg.ft, t.state
    for host in t.obs.returned_hosts:
        reason = state.excluded_hosts.pop(host, None)
        if reason is not None:
            t.out.emit(EventKind.HOST_RETURNED, host=host, excluded_because=reason)
    if ft.straggler == "off":
        return
    watch = state.stragglers
    limits = StragglerLimits(ft.straggler_factor, ft.straggler_window)
    running = [g.index for g in state.groups if g.status == GroupStatus.RUNNING and not g.train_done]
    # The step-time judgements change only with new steps: worked out again only then (every
    # group every tick is groups x window of work a tick, for the same answer), and at most once
    # per judge_gap_s (a judgement costs groups x window: bounded per tick on average).
    w = state.watch
    w.steps_unjudged = w.steps_unjudged or t.steps_seen
    fresh = w.cpu_stragglers is None or (w.steps_unjudged and judgement_due(t.now - w.stragglers_judged_at, judge_gap_s(len(running)), not t.obs.read_steps()))
    if fresh:
        w.cpu_stragglers = find_stragglers(watch, running, limits)
        w.stragglers_judged_at, w.steps_unjudged = t.now, False
    found = {s.group: s for s in w.cpu_stragglers or () if s.group in running}
    probe_links(t, running, limits, fresh)
    for g, s in watch.link_found.items():
        if g in running and g not in found:
            found[g] = s
    cleared = [i for i in watch.flagged if i not in found and (watch.flagged[i] == SlowKind.LINK or (fresh and back_to_pace(watch, i, running, limits)))]
    for group in cleared:
        watch.flagged.pop(group)
        watch.kept.pop(group, None)
        watch.named_since.pop(group, None)
        t.out.emit(EventKind.STRAGGLER_CLEARED, group=group)
    for s in found.values():
        if s.group not in watch.flagged:
            watch.flagged[s.group] = s.kind.value
            t.out.emit(EventKind.STRAGGLER_DETECTED, attempt=state.groups[s.group].attempt, **s.fields())
        elif ft.straggler != "evict":
            continue
        if s.kind == SlowKind.CPU:
            watch.named_since.setdefault(s.group, s.steps[0])
        # Under evict, decided again every tick while it is slow (a standby may become ready,
        # a CPU straggler's cost so far grows).
        steps_left = max(0, t.cfg.training.steps - state.job_step)
        spent = cost_so_far(s, watch.named_since.get(s.group))
        action = t.rules.planner.on_straggler(state, s, t.now, ft.straggler, state.standby.ready_numbers(), ft.straggler_recovery_s, steps_left, spent_s=spent)
        if isinstance(action, KeepStraggler):
            if ft.straggler == "evict" and watch.kept.get(s.group) != action.why:
                watch.kept[s.group] = action.why
                t.out.emit(EventKind.STRAGGLER_KEPT, group=s.group, because=action.reason, why=action.why)
            continue
        g = state.groups[s.group]
        # A launcher with hosts of its own (simulated hosts) has a host to record as left out.
        host = t.obs.group_hosts.get(g.index)
        evicted = {"slow_kind": s.kind.value, "because": action.reason, "loss_s": action.loss_s, "cost_s": action.cost_s}
        t.out.emit(EventKind.STRAGGLER_EVICTED, group=g.index, attempt=g.attempt, **evicted)
        if host is not None:
            reason = f"group {g.index} was a {s.kind.value} straggler there ({s.ratio:.1f}x its peers)"
            state.excluded_hosts[host] = reason
            t.out.emit(EventKind.HOST_EXCLUDED, host=host, group=g.index, because=reason)
        # A launcher with nodes (Slurm): the nodes it ran on are excluded as a node fault's are.
        nodes = nodes_of(t, g)
        watch.forget(g.index)
        fail_group(
            t, g, FailureKind.STRAGGLER, suspects=tuple(Suspect(n, ExclusionReason.STRAGGLER) for n in nodes), reason="straggler", slow_kind=s.kind.value
        )


def judgement_due(waited_s: float, gap_s: float, quiet: bool) -> bool:
    """Whether the step times are judged again, ``waited_s`` after the last judgement: from one
    gap on, at a ``quiet`` tick (one that read no step record), and at the latest two gaps on.

    Why wait for a quiet tick: a thousand groups' steps arrive together, and a judgement in the
    tick that reads them (24 ms beside about 50) made the longest ticks; the ticks between steps
    read nothing. Where no tick is quiet (steps never pause), a judgement is one gap late at most.
    The takeover's save waits the same way (takeover.progress_save_due); a quiet tick is one
    whose look read no step record (observe.Observations.read_steps), for both.

    Args:
        waited_s: since the last judgement.
        gap_s: :func:`judge_gap_s`.
        quiet: this tick read no step record.
    """
    return waited_s >= 2 * gap_s or (quiet and waited_s >= gap_s)


def judge_gap_s(groups: int) -> float:
    """The least time between two judgements of the groups' step times: :data:`JUDGE_S_PER_GROUP`
    per running group. Below about 50 groups that is under a tick (every tick with new steps is
    judged, as before); at 1,024 groups about once a second, where judging every tick took a
    fifth of the controller's CPU. A straggler is named from a window of
    ``ft.straggler_window`` steps, so a judgement a second late changes little.

    Args:
        groups: the running groups.
    """
    return JUDGE_S_PER_GROUP * groups


def probe_links(t: Tick, running: list[int], limits: StragglerLimits, fresh: bool = True) -> None:
    """Take a finished probe round's verdicts (``link_probed``; ``watch.link_found``) and start a
    round when stragglers.probe_due says one is due (controller.link_probe); ``fresh``: the step
    times were judged this tick (the job's pace is worked out again only then)."""
    state, watch = t.state, t.state.stragglers
    done = t.obs.probe
    if done is not None:
        rise = collective_loss(watch, running)
        skip = cpu_suspects(watch, running, limits, collective_rise_s=rise) | {g for g, kind in watch.flagged.items() if kind == SlowKind.CPU}
        found = find_link_stragglers(done.probes, limits, skip, step=done.step, loss_s=rise)
        named = {g for g, kind in watch.flagged.items() if kind == SlowKind.LINK}
        verdicts, watch.link_suspects = confirm_link_stragglers(found, watch.link_suspects, named)
        probed = {p.group for p in done.probes}
        watch.link_found = {g: s for g, s in watch.link_found.items() if g not in probed and g in running}
        watch.link_found.update({s.group: s for s in verdicts})
        t.out.emit(
            EventKind.LINK_PROBED,
            **done.fields(),
            not_judged=sorted(skip & probed),
            stragglers=[s.group for s in verdicts],
            suspects=sorted(watch.link_suspects),
        )
    reason = probe_due(watch, running, limits, t.now, t.cfg.ft.link_probe_s, pace=fresh)
    if reason is None or t.obs.probe_busy:
        return
    stepping = set(running)
    targets = {(g.index, rs.rank): rs.link_probe for g in state.groups if g.index in stepping for rs in g.ranks if rs.link_probe and rs.exited is None}
    if len({group for group, _ in targets}) >= 2:
        t.out.do(StartProbe(targets, reason, state.job_step))
        watch.last_probe_at = t.now
