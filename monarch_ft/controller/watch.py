"""Each tick's judgement of the groups: a rank that exited, a group that finished, a rank that
hangs (the hang model: :mod:`monarch_ft.controller.hangs`), a job-wide stall; failures go to
:class:`~monarch_ft.controller.recovery.Recovery`.

Silence counts only while this controller was watching: a controller held up itself (no CPU, a
blocked filesystem) records the window (:meth:`GroupWatch.account_own_stall`), or every rank
would look silent for that long at once and be killed on waking; a soak lost its whole job
that way.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Optional

from monarch_ft.common.devices import gpu_device_nodes
from monarch_ft.common.process import process_sample
from monarch_ft.common.stacks import capture_stacks
from monarch_ft.config.ft import hang_timeout_setting
from monarch_ft.config.job import JobConfig
from monarch_ft.controller.hangs import (
    Hang,
    HangLimits,
    RankView,
    asleep_compute_timeout,
    auto_hang_timeout,
    find_hang,
    is_job_stall,
    track_cpu,
    track_os_state,
)
from monarch_ft.launcher.base import Capability
from monarch_ft.controller.planner import FailureKind, KeepStraggler
from monarch_ft.controller.recovery import Recovery
from monarch_ft.controller.relay import ReportRelay
from monarch_ft.controller.state import GroupState, JobState
from monarch_ft.controller.link_probe import LinkProber
from monarch_ft.controller.placement import Suspect
from monarch_ft.controller.stragglers import (
    SlowKind,
    StragglerLimits,
    back_to_pace,
    collective_loss,
    cpu_suspects,
    confirm_link_stragglers,
    find_link_stragglers,
    find_stragglers,
    probe_due,
)
from monarch_ft.records.events import EventKind, EventLog, ExclusionReason, GroupStatus
from monarch_ft.records.exits import RankExit, blamed_exit, describe_exit
from monarch_ft.records.layout import RunLayout

# A watch tick this much later than the previous one means the supervisor itself was held up.
SUPERVISOR_STALL_S = 2.0


class GroupWatch:
    """Judges the groups every tick.

    Args:
        cfg: the job's config.
        layout: the run directory's paths.
        state: the job's state.
        events: the event log.
        relay: reads the ranks' reports (a failed rank's error is read before it is judged).
        recovery: what a failure goes to.
    """

    def __init__(self, cfg: JobConfig, layout: RunLayout, state: JobState, events: EventLog, relay: ReportRelay, recovery: Recovery) -> None:
        self.cfg = cfg
        self.layout = layout
        self.state = state
        self.events = events
        self.relay = relay
        self.recovery = recovery
        # ft.hang_timeout_s: a fixed number, or None for auto (learned from the step times).
        self._hang_timeout_fixed = hang_timeout_setting(cfg.ft.hang_timeout_s)
        # Ranks compute on the CPU (no GPU on this host, or training.device=cpu): see asleep_compute_timeout.
        self._compute_on_cpu = cfg.training.device == "cpu" or (cfg.training.device == "auto" and not gpu_device_nodes())
        # Times each rank's link when a probe round is due (controller.link_probe).
        self.prober = LinkProber()

    # ------------------------------------------------------------ one group
    def reap(self, g: GroupState, now: float) -> None:
        """Take the exit of every rank of ``g`` that ended since the last tick.

        Every group is reaped before any is judged: two groups that die together (every
        rank refusing a commit below the job's step, a node holding both) are both seen
        dead before the first one's recovery asks which peers hold the job's state. Reaped
        and judged one group at a time, the first one's standby was told to heal from the
        second, dead but not yet reaped: it joined a quorum alone at step 0 (CI at c77c81d).
        """
        exited = False
        for rs in g.ranks:
            if rs.exited is None:
                code = rs.proc.poll()
                if code is not None:
                    exited = True
                    rs.exited = code
                    self.events.emit(EventKind.RANK_EXITED, group=g.index, rank=rs.rank, attempt=g.attempt, **describe_exit(code))
        if exited:
            # A rank writes its last records just before it exits (rank_error before failing;
            # its last steps and rank_finished, with the state hashes, before exiting 0), maybe
            # after this tick's read: read them now, before the group is failed or done (a done
            # group's reports are read no more: CI at af7d3de summarised one with no hashes).
            self.relay.consume(g, now)

    def check(self, g: GroupState, now: float) -> Optional[Hang]:
        """A rank that exited non-zero (taken by :meth:`reap`) fails its group at once; a
        silent one is returned as a hang verdict for :meth:`judge`, which looks at every
        group's before acting."""
        failure: Optional[dict] = None
        blamed = blamed_exit([(rs.rank, rs.exited) for rs in g.ranks if rs.exited])
        if blamed is not None:
            failure = {"reason": "exit", "rank": blamed[0], **describe_exit(blamed[1])}
        if failure is not None:
            error = g.error()
            details = {**failure, **({"error": error["error"], "error_rank": error["rank"]} if error else {})}
            # The checkpoint failed, not the group: its relaunch (at the next older step, or
            # healed by a peer) does not count against its restart budget.
            load_failed = failure.get("exit_code") == RankExit.CHECKPOINT_LOAD_FAILED and self.recovery.checkpoint_unloadable(g)
            self.recovery.fail_group(g, now, FailureKind.LOAD_FAILED if load_failed else FailureKind.EXIT, **details)
            return None
        if g.ranks and all(r.exited == 0 for r in g.ranks):
            g.move(GroupStatus.DONE)
            self.events.emit(EventKind.GROUP_FINISHED, group=g.index, attempt=g.attempt, step=g.last_step)
            return None
        live = [rs for rs in g.ranks if rs.exited is None]
        started = all(r.first_step_seen or r.train_done for r in g.ranks)

        # Every tick: a state held for ft.os_stall_s needs every sample in between to see it.
        for rs in live:
            os_state, cpu_s = process_sample(rs.proc.pid)
            rs.os_sample = track_os_state(rs.os_sample, os_state, now, self.cfg.ft.os_stall_s)
            rs.cpu_sample = track_cpu(rs.cpu_sample, cpu_s, now)
        views = [
            RankView(
                rank=rs.rank,
                silent_s=self.watched(rs.last_progress, now),
                started=started,
                phase=rs.phase,
                phase_s=self.watched(rs.phase_seen, now) if rs.phase else 0.0,
                os_state=rs.os_sample.state,
                os_state_s=rs.os_sample.held_s,
                finished=rs.train_done,
                asleep_s=rs.cpu_sample.asleep_s if rs.cpu_sample else None,
            )
            for rs in live
        ]
        limits = self.limits
        # A rank of this group silent and asleep is frozen by itself only while ranks elsewhere beat.
        others_beating = any(
            self.watched(rs.last_progress, now) < limits.suspect_silence_s
            for o in self.state.groups
            if o is not g and o.active
            for rs in o.ranks
            if rs.exited is None
        )
        return find_hang(views, limits, others_beating)

    @property
    def hang_timeout_s(self) -> float:
        """The hang timeout now: ``ft.hang_timeout_s`` if a number, else the learned one
        (max(ft.hang_min_s, ft.hang_step_factor x p99 of recent compute seconds per step))."""
        if self._hang_timeout_fixed is not None:
            return self._hang_timeout_fixed
        ft = self.cfg.ft
        return auto_hang_timeout(list(self.state.step_times.samples), ft.hang_min_s, ft.hang_step_factor, fallback_s=15.0)

    @property
    def limits(self) -> HangLimits:
        """The hang model's bounds, from the config and what was learned: the one place the
        timeouts are composed (a collective's own bound: TorchFT's quorum timeout plus two of
        its op timeouts)."""
        ft = self.cfg.ft
        return HangLimits(
            self.hang_timeout_s,
            ft.startup_timeout_s,
            self.cfg.checkpoint.save_timeout_s,
            ft.quorum_timeout_s + 2 * ft.timeout_s,
            os_stall_s=ft.os_stall_s,
            asleep_s=ft.asleep_s,
            asleep_compute_s=asleep_compute_timeout(self.state.step_times.p99(), ft.asleep_s, self._compute_on_cpu),
        )

    # ------------------------------------------------------------ all groups
    def check_stragglers(self, now: float) -> None:
        """Name the groups slower than their peers (controller.stragglers: CPU stragglers from
        their step times, link stragglers from probe rounds) and, under ``ft.straggler=evict``,
        fail one when the planner says evicting it pays: the failure's own decision then
        promotes the ready standby on another host. The straggler's host is left out of later
        placements: a Slurm node through the node pool (``node_excluded``, as a node fault's;
        it returns after ``ft.node_probation_s``), a simulated host as a record
        (``state.excluded_hosts``, until its slowness ends: the local launchers never place a
        group on a host slot again once it left it)."""
        ft, state = self.cfg.ft, self.state
        if ft.straggler == "off":
            return
        watch = state.stragglers
        limits = StragglerLimits(ft.straggler_factor, ft.straggler_window)
        running = [g.index for g in state.groups if g.status == GroupStatus.RUNNING and not g.train_done]
        found = {s.group: s for s in find_stragglers(watch, running, limits)}
        self.probe_links(now, running, limits)
        for g, s in watch.link_found.items():
            if g in running and g not in found:
                found[g] = s
        for group in [i for i in watch.flagged if i not in found and (watch.flagged[i] == SlowKind.LINK or back_to_pace(watch, i, running, limits))]:
            watch.flagged.pop(group)
            watch.kept.pop(group, None)
            self.events.emit(EventKind.STRAGGLER_CLEARED, group=group)
        for s in found.values():
            if s.group not in watch.flagged:
                watch.flagged[s.group] = s.kind.value
                self.events.emit(EventKind.STRAGGLER_DETECTED, attempt=state.groups[s.group].attempt, **s.fields())
            elif ft.straggler != "evict":
                continue
            # Under evict, decided again every tick while it is slow (a standby may become ready).
            steps_left = max(0, self.cfg.training.steps - state.job_step)
            action = self.recovery.planner.on_straggler(state, s, now, ft.straggler, self.recovery.standby.ready_numbers(), ft.straggler_recovery_s, steps_left)
            if isinstance(action, KeepStraggler):
                if ft.straggler == "evict" and watch.kept.get(s.group) != action.why:
                    watch.kept[s.group] = action.why
                    self.events.emit(EventKind.STRAGGLER_KEPT, group=s.group, because=action.reason, why=action.why)
                continue
            g = state.groups[s.group]
            launcher = self.recovery.starter.launcher
            # A launcher with hosts of its own (simulated hosts) has a host to record as left out.
            host = launcher.group_host(g.index) if Capability.PARTITION in launcher.capabilities else None
            evicted = {"slow_kind": s.kind.value, "because": action.reason, "loss_s": action.loss_s, "cost_s": action.cost_s}
            self.events.emit(EventKind.STRAGGLER_EVICTED, group=g.index, attempt=g.attempt, **evicted)
            if host is not None:
                reason = f"group {g.index} was a {s.kind.value} straggler there ({s.ratio:.1f}x its peers)"
                state.excluded_hosts[host] = reason
                self.events.emit(EventKind.HOST_EXCLUDED, host=host, group=g.index, because=reason)
            # A launcher with nodes (Slurm): the nodes it ran on are excluded as a node fault's are.
            nodes = self.recovery.nodes.nodes_of([rs.proc for rs in g.ranks if rs.proc is not None])
            watch.forget(g.index)
            self.recovery.fail_group(
                g, now, FailureKind.STRAGGLER, suspects=tuple(Suspect(n, ExclusionReason.STRAGGLER) for n in nodes), reason="straggler", slow_kind=s.kind.value
            )

    def probe_links(self, now: float, running: list[int], limits: StragglerLimits) -> None:
        """Take a finished probe round's verdicts (``link_probed``; ``watch.link_found``) and
        start a round when stragglers.probe_due says one is due (controller.link_probe)."""
        state, watch = self.state, self.state.stragglers
        done = self.prober.take()
        if done is not None:
            skip = cpu_suspects(watch, running, limits) | {g for g, kind in watch.flagged.items() if kind == SlowKind.CPU}
            found = find_link_stragglers(done.probes, limits, skip, step=done.step, loss_s=collective_loss(watch, running))
            named = {g for g, kind in watch.flagged.items() if kind == SlowKind.LINK}
            verdicts, watch.link_suspects = confirm_link_stragglers(found, watch.link_suspects, named)
            probed = {p.group for p in done.probes}
            watch.link_found = {g: s for g, s in watch.link_found.items() if g not in probed and g in running}
            watch.link_found.update({s.group: s for s in verdicts})
            self.events.emit(
                EventKind.LINK_PROBED,
                **done.fields(),
                not_judged=sorted(skip & probed),
                stragglers=[s.group for s in verdicts],
                suspects=sorted(watch.link_suspects),
            )
        reason = probe_due(watch, running, limits, now, self.cfg.ft.link_probe_s)
        if reason is None or self.prober.busy:
            return
        targets = {(g.index, rs.rank): rs.link_probe for g in state.groups if g.index in running for rs in g.ranks if rs.link_probe and rs.exited is None}
        if len({group for group, _ in targets}) >= 2 and self.prober.start(targets, reason, state.job_step):
            watch.last_probe_at = now

    def judge(self, hangs: dict[int, Hang], now: float) -> None:
        """Act on this tick's hang verdicts, all groups together.

        - Every stepping group silent and none stuck by itself: one job-wide stall. Capture
          every rank's stacks and wait ``ft.stall_timeout_s``; if it does not clear, resume
          the whole job from the newest checkpoint. The detector never kills the groups that
          hold the job's state one by one.
        - Some culprit stuck by itself (stopped, zombie, ...): fail only those groups; the
          others are most likely blocked on them and step again once they are gone.
        - Otherwise fail each hung group (stacks captured first).
        """
        state = self.state
        stepping = [g.index for g in state.groups if g.status == GroupStatus.RUNNING]
        stalled = is_job_stall(hangs, stepping)
        if state.stall_since is not None and not stalled:
            # Groups come out of a shared stall a beat apart (phases are reported once a
            # second): the rest get one more hang timeout before they count as hung alone.
            self.events.emit(EventKind.JOB_STALL_CLEARED, lasted_s=round(now - state.stall_since, 2))
            state.stall_since = None
            state.stall_grace_until = now + self.hang_timeout_s
        if now < state.stall_grace_until:
            hangs = {i: h for i, h in hangs.items() if h.self_explained}
        if not hangs:
            return
        if stalled:
            if state.stall_since is None:
                state.stall_since = now
                stacks = self.capture_stacks([state.groups[i] for i in sorted(hangs)], "stall")
                self.events.emit(
                    EventKind.JOB_STALL,
                    groups=sorted(hangs),
                    hangs={str(i): dataclasses.asdict(h) for i, h in hangs.items()},
                    stacks=stacks,
                    escalate_after_s=self.cfg.ft.stall_timeout_s,
                )
            elif now - state.stall_since > self.cfg.ft.stall_timeout_s:
                self.events.emit(EventKind.JOB_STALL_ESCALATED, groups=sorted(hangs), lasted_s=round(now - state.stall_since, 2))
                state.stall_since = None
                self.recovery.fail_job_stall(now)
            return
        explained = {i: h for i, h in hangs.items() if h.self_explained}
        for i, h in sorted((explained or hangs).items()):
            g = state.groups[i]
            t0 = time.time()
            # The hung rank's and its group peers' stacks, before the group is killed.
            stacks = self.capture_stacks([g], f"hang-g{i}")
            self.recovery.fail_group(
                g,
                now,
                FailureKind.HUNG,
                time=now,  # the verdict's tick: the stacks were captured after it
                reason="hung",
                rank=h.rank,
                blame=h.reason,
                silent_s=h.silent_s,
                process_status=h.os_state,
                process_status_s=h.os_state_s,
                asleep_s=h.asleep_s,
                rank_status={str(r): st for r, st in h.rank_states.items()},
                phase=h.phase,
                phase_s=h.phase_s,
                hang_timeout_s=round(self.hang_timeout_s, 3),
                stacks=stacks,
                stacks_s=round(time.time() - t0, 3),
            )

    def capture_stacks(self, groups: list[GroupState], tag: str) -> dict[str, str]:
        """Every live rank's Python stacks (py-spy), into stacks/<tag>-<ms>/; label -> file."""
        pids = {f"g{g.index}r{rs.rank}": rs.proc.pid for g in groups for rs in g.ranks if rs.exited is None and rs.proc.pid}
        logs = {f"g{g.index}r{rs.rank}": self.layout.log(g.index, rs.rank, g.attempt) for g in groups for rs in g.ranks}
        return capture_stacks(pids, self.layout.stacks_capture(tag, time.time()), logs=logs)

    # ------------------------------------------------------------ this controller's own stalls
    def account_own_stall(self, now: float) -> None:
        """Record a window in which this controller itself was held up (see :meth:`watched`)."""
        watch = self.state.watch
        gap = now - watch.last_tick if watch.last_tick else 0.0
        if gap > SUPERVISOR_STALL_S:
            watch.blind.append((watch.last_tick, now))
            del watch.blind[:-100]
            self.events.emit(EventKind.SUPERVISOR_STALLED, seconds=round(gap, 3))
        watch.last_tick = now

    def watched(self, since: float, now: float) -> float:
        """Seconds of [since, now] during which this controller was watching: silence and
        phase time count only then."""
        blind = sum(max(0.0, min(end, now) - max(start, since)) for start, end in self.state.watch.blind)
        return max(0.0, now - since - blind)
