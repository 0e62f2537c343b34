"""Starting and stopping ranks: the spec each rank reads, a group's launch (cold through the
launcher, or warm, forked from the host's fork server), a standby's launch and its promotion
file, and stopping a group's ranks.

What to start, and how, is decided elsewhere (:mod:`monarch_ft.controller.planner`); this module
only does it, and raises :class:`~monarch_ft.controller.fork_pool.ForkError` when a warm fork
fails, for the planner to decide again.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import sys
import time
from typing import Callable, Optional, Sequence

from monarch_ft.common.net import free_port
from monarch_ft.common.process import on_python_path
from monarch_ft.config.job import JobConfig
from monarch_ft.controller.fork_pool import ForkError, WarmForks
from monarch_ft.controller.standby_pool import STANDBY_NICENESS, Standby, build_promotion
from monarch_ft.controller.state import JobState, RankState
from monarch_ft.launcher import Launcher, RankLaunch, RankProcess
from monarch_ft.records.decisions import StateDecision
from monarch_ft.records.launch import worker_argv
from monarch_ft.records.layout import RunLayout, atomic_write_json
from monarch_ft.records.reports import ReportTail


class RankStarter:
    """Writes rank specs and starts, promotes and stops ranks.

    Args:
        cfg: the job's config.
        layout: the run directory's paths.
        state: the job's state (the data file the ranks read).
        launcher: starts cold ranks.
        forks: the warm fork servers.
        lighthouse_address: the Lighthouse's address now (it may move on a restart).
    """

    def __init__(self, cfg: JobConfig, layout: RunLayout, state: JobState, launcher: Launcher, forks: WarmForks, lighthouse_address: Callable[[], str]) -> None:
        self.cfg = cfg
        self.layout = layout
        self.state = state
        self.launcher = launcher
        self.forks = forks
        self.lighthouse_address = lighthouse_address
        self._config: Optional[dict] = None

    def rank_env(self) -> dict[str, str]:
        env = dict(os.environ)
        threads = str(self.cfg.training.threads_per_rank)
        env.update(OMP_NUM_THREADS=threads, MKL_NUM_THREADS=threads, PYTHONUNBUFFERED="1", RUST_BACKTRACE="1")
        return on_python_path(env)

    def spec(self, group: int, rank: int, attempt: int, store_host: str, store_port: int) -> dict:
        """The part of a rank's spec (rank.trainer.RankSpec) that a group's rank and a standby's share."""
        if self._config is None:
            from omegaconf import OmegaConf

            # Ranks get the JobConfig part only (recipes may extend the config, e.g. drills).
            self._config = {f.name: OmegaConf.to_container(OmegaConf.structured(getattr(self.cfg, f.name))) for f in dataclasses.fields(JobConfig)}
        return {
            "config": self._config,
            "group": group,
            "rank": rank,
            "world_size": self.cfg.ft.ranks_per_group,
            "attempt": attempt,
            "store_host": store_host,
            "store_port": store_port,
            "lighthouse_addr": self.lighthouse_address(),
            "advertise_host": store_host,
            "run_dir": self.layout.run_dir,
            "report_path": "",
            "hold_path": self.layout.hold,
            "tokens_path": self.state.tokens_path,
        }

    def group_launches(self, group: int, attempt: int, load_step: Optional[int], load_path: Optional[str], gate: str) -> list[RankLaunch]:
        """Write the spec of each rank of ``group``'s attempt ``attempt`` (it loads ``load_step``
        from ``load_path`` and waits at ``gate``); what starting them takes."""
        store_host = self.launcher.group_host(group)
        store_port = free_port(store_host)
        launches = []
        for r in range(self.cfg.ft.ranks_per_group):
            spec = self.spec(group, r, attempt, store_host, store_port)
            spec.update(
                report_path=self.layout.report(group, r, attempt),
                load_step=load_step,
                load_path=load_path,
                start_gate=gate,
                scratch_dir=self.layout.scratch(group, r),
            )
            spec_path = self.layout.spec(group, r, attempt)
            atomic_write_json(spec_path, spec)
            launches.append(
                RankLaunch(
                    group=group,
                    rank=r,
                    attempt=attempt,
                    argv=worker_argv(sys.executable, spec_path),
                    env=self.rank_env(),
                    log_path=self.layout.log(group, r, attempt),
                    cwd=self.layout.run_dir,
                )
            )
        return launches

    def start(self, launches: list[RankLaunch], warm: bool, any_host: bool = False) -> list[RankProcess]:
        """Start one group's ranks: forked from the host's fork server (``warm``; with
        ``any_host``, or another simulated host's: ForkPool.launch_group; raises ForkError, with
        nothing left running, when that fails) or through the launcher."""
        if warm:
            return self.forks.launch_group(launches, any_host=any_host)
        return self.launcher.launch_group(launches)

    def standby(self, number: int, slot: int, now: float) -> list[RankState]:
        """Start standby ``number`` on ``slot`` (its own host and device slot), niced below the
        training ranks; its ranks build everything identity-free and wait (monarch_ft.controller.standby_pool)."""
        store_host = self.launcher.group_host(slot)
        store_port = free_port(store_host)
        launches = []
        for r in range(self.cfg.ft.ranks_per_group):
            spec = self.spec(slot, r, 0, store_host, store_port)
            spec.update(report_path=self.layout.standby_report(number, r), promotion_path=self.layout.promotion(number), standby=number)
            spec_path = self.layout.standby_spec(number, r)
            atomic_write_json(spec_path, spec)
            launches.append(
                RankLaunch(
                    group=slot,
                    rank=r,
                    attempt=0,
                    argv=worker_argv(sys.executable, spec_path),
                    env=self.rank_env(),
                    log_path=self.layout.standby_log(number, r),
                    cwd=self.layout.run_dir,
                    # A waiting standby holds no training state: it dies with this controller
                    # (nothing else would ever promote it) and outlives it once promoted.
                    die_with_controller=True,
                    niceness=STANDBY_NICENESS,
                    standby=number,
                )
            )
        procs = None
        if self.forks.can_fork(slot, any_host=True):
            # Forked, its imports skipped: a standby's build takes the training ranks' CPU on a
            # host they share (a steady job ran at 0.80-0.84 of its speed beside two builds
            # here: docs/results/drill-stragglers); what is left is the model build itself.
            # A standby's host is a new one, with no server of its own: on simulated hosts
            # (one machine) another host's server forks it and it enters its own host; niced
            # and cold beside training it took 27-28 s to build (tests/jobs/test_standby_jobs.py).
            try:
                procs = self.start(launches, warm=True, any_host=True)
            except ForkError:
                procs = None  # started cold instead; standby_launched says forked=false
        if procs is None:
            procs = self.launcher.launch_group(launches)
        return [RankState.launched(p, ReportTail(self.layout.standby_report(number, p.launch.rank)), now) for p in procs]

    def promote(self, sb: Standby, group: int, attempt: int, decision: StateDecision, now: float) -> list[RankState]:
        """Write standby ``sb``'s promotion file: it takes ``group``'s identity (attempt
        ``attempt``) and gets its state as ``decision`` says. Returns the group's ranks, read
        from the group's report files from now on."""
        self.launcher.place_group(group, sb.slot)
        promotion = build_promotion(self.layout, sb.number, group, attempt, len(sb.ranks), decision, now)
        atomic_write_json(self.layout.promotion(sb.number), promotion.to_record())
        ranks = []
        for rs in sb.ranks:
            promoted = RankState.launched(rs.proc, ReportTail(self.layout.report(group, rs.rank, attempt)), now)
            # Recorded as the group's rank from now on: a new controller reads on the group's
            # report files (its process, launch command and log stay the standby's).
            promoted.launch = dataclasses.replace(promoted.launch, group=group, attempt=attempt)
            ranks.append(promoted)
        return ranks

    @staticmethod
    def stop(ranks: Sequence[RankState], graceful: bool) -> None:
        """Stop every one of ``ranks`` still running: SIGTERM first when ``graceful`` (5 s), then
        SIGKILL; each one's exit code recorded on it."""
        if graceful:
            for rs in ranks:
                if rs.exited is None:
                    rs.proc.send_signal(signal.SIGTERM)
            deadline = time.time() + 5.0
            for rs in ranks:
                if rs.exited is None:
                    rs.exited = rs.proc.wait(max(0.0, deadline - time.time()))
        # Every rank signalled before any is waited for: the kernel tears them down together
        # (a rank's exit frees its whole address space: tenths of a second on a loaded machine).
        doomed = [rs for rs in ranks if rs.exited is None or rs.proc.poll() is None]
        for rs in doomed:
            rs.proc.kill()  # SIGKILL also ends a SIGSTOPped rank
        for rs in doomed:
            rs.exited = rs.proc.wait(10.0)
