"""The second stage of a tick: decide. A pure function of the job's state, the tick's
observations and the facts handed in, returning the actions in order.

Pure here means: no I/O. :func:`decide` polls no process, reads and writes no file and sends no
signal (it has no handle to do so with: the launcher, the pools' processes and the event log are
the executor's); it updates the job's state (:class:`~monarch_ft.controller.state.JobState`, plain
data it owns) and says what to do (:mod:`monarch_ft.controller.actions`). Given the same state,
observations and facts it decides the same (the fast tests replay recorded observations).

The order of a pass, and why:

1. the controller itself: its own stall (silence while it was held up is not the ranks'), a
   signal to stop, a lost job state, a detach;
2. the Lighthouse, a cluster's nodes (before any launch: exclusions apply to it; an allocation
   still pending is given the exclusions as they are now);
3. every report read (groups, then standbys): the state catches up with the world first; the
   groups a new controller found with a rank gone are failed then (their reports read first);
4. every exit, then each group judged (exit, done, or a hang verdict), then the hang verdicts
   all together (a job-wide stall is one), then the integrity verdicts, then the stragglers.
   Failing a group only stops it (``STOPPED``);
5. every stopped group's recovery, planned once every failure of the pass is known (no answer
   counts a group that failed in the same tick as a live peer);
6. gates and control files: launch gates (where a relaunch's state comes from), the commit
   floor, the start gate, the hold, a ``stop`` command, the transport peers, the integrity
   interval and the checkpoint scrub's findings;
7. the fork servers, then the launches that are due (a first launch forks from its host's
   server), then the standbys missing;
8. the job's end.

A decision that needs the newest intact checkpoint asks for it (``FindDisk``), and the tick runs
a second pass (:func:`decide_pending`) once the executor found it: the same tick, the same
observations, only the decisions that waited.
"""

from __future__ import annotations

from monarch_ft.controller.decide import failures, job, pools, recovery, reports, slow
from monarch_ft.controller.decide.base import Decision, Facts, Rules, Tick
from monarch_ft.controller.hangs import Hang
from monarch_ft.controller.observe import Observations
from monarch_ft.controller.state import JobState

__all__ = ["Decision", "Facts", "Rules", "decide", "decide_close_out", "decide_pending", "decide_resume"]


def decide(rules: Rules, state: JobState, obs: Observations, facts: Facts | None = None) -> Decision:
    """One tick's first pass (see the module docstring for its order)."""
    t = Tick(rules, state, obs, facts or Facts(), Decision())
    # 1. the controller itself
    failures.account_own_stall(t)
    if job.controller_ends(t):
        return t.out
    # 2. the Lighthouse and the nodes
    job.lighthouse(t)
    job.nodes(t)
    job.replan_pending(t)
    # 3. the reports
    reports.absorb_reports(t)
    pools.standby_reports(t)
    recovery.lost_while_unsupervised(t)
    # 4. exits, groups judged, hangs, integrity, stragglers
    failures.take_exits(t)
    hangs: dict[int, Hang] = {}
    limits = failures.hang_limits(t)
    beating = failures.beating_groups(t, limits)
    for g in state.groups:
        if g.active:
            hang = failures.judge_group(t, g, limits, beating)
            if hang is not None:
                hangs[g.index] = hang
    failures.judge_hangs(t, hangs)
    recovery.integrity_verdicts(t)
    slow.check_stragglers(t)
    # 5. recoveries
    recovery.plan_failures(t)
    # 6. gates and control files
    recovery.write_floor(t)
    job.lighthouse_recovered(t)
    recovery.open_launch_gates(t)
    job.open_start_gate(t)
    job.hold(t)
    job.stop_command(t)
    job.transport_peers(t)
    job.integrity_interval(t)
    job.scrubbed(t)
    # 7. fork servers, launches, standbys
    pools.fork_servers(t)
    recovery.launch_due(t)
    pools.launch_standbys(t)
    # 8. the end
    job.job_ended(t)
    return t.out


def decide_pending(rules: Rules, state: JobState, obs: Observations, facts: Facts) -> Decision:
    """A tick's next pass, with the facts its last pass asked for: the recoveries and launch
    gates that waited for them (the same observations: nothing new is read)."""
    t = Tick(rules, state, obs, facts, Decision())
    recovery.plan_failures(t)
    recovery.open_launch_gates(t)
    job.job_ended(t)
    return t.out


def decide_resume(rules: Rules, state: JobState, now: float, disk) -> Decision:
    """The job's start with ``checkpoint.resume``: every group's plan to load the newest intact
    checkpoint (``disk``, found by the executor), or the job stopped when none is left."""
    t = Tick(rules, state, Observations(now), Facts(), Decision())
    recovery.resume_job(t, disk)
    return t.out


def decide_close_out(rules: Rules, state: JobState, obs: Observations) -> Decision:
    """A job that ended with no controller (:mod:`monarch_ft.controller.closeout`): its ranks'
    reports read to their end and their exits taken, as a controller would have."""
    t = Tick(rules, state, obs, Facts(), Decision())
    reports.absorb_reports(t)
    failures.take_exits(t)
    return t.out
