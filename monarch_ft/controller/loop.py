"""The single controller: one process that drives the whole fault-tolerant job.

It starts the TorchFT Lighthouse, launches ``ft.replica_groups`` groups of
``ft.ranks_per_group`` ranks through a :class:`~monarch_ft.launcher.Launcher`, and
then watches every rank: exit codes and signals, liveness and run state through
psutil, and step progress read from the ranks' own report files. A group with a
failed or hung rank is stopped as a whole and recovered as the
:class:`~monarch_ft.controller.planner.RecoveryPlanner` decides (a warm standby, a relaunch
warm or cold, a full restart, a rollback to disk; within a restart budget); a relaunched
group rejoins the quorum and heals from a live peer through TorchFT while the surviving
groups keep stepping.

This module is the watch loop and the job's life around it; everything the controller knows
is one :class:`~monarch_ft.controller.state.JobState`, and each concern is its own module:
reading the ranks' reports (:mod:`.relay`), judging exits and hangs (:mod:`.watch`), applying
recovery (:mod:`.recovery`), starting ranks (:mod:`.launch`), takeover (:mod:`.takeover`),
the console (:mod:`.console`), the summary (:mod:`.summary`), the replicas' state compared
(:mod:`.integrity`, its verdicts applied by :mod:`.recovery`).

``Supervisor(...)`` only builds objects; :meth:`Supervisor.open` takes the run directory (its
lock, its folders, the data, the launcher) and :meth:`Supervisor.run` runs the job. The loop
reads and sleeps on a clock, and starts ranks through a launcher, both given: the fast tests
drive it with ``monarch_ft.testing.fakes``.

Everything it sees goes to ``events.jsonl``; per-step records of every rank go to
``metrics.jsonl``; ``summary.json`` is written at the end, however the job ends.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import signal
import sys
import threading
from typing import IO, Any, Callable, Optional, Protocol

from monarch_ft.common import proctitle
from monarch_ft.common.clock import SYSTEM_CLOCK, Clock
from monarch_ft.common.data import prepare_data
from monarch_ft.config.ft import integrity_setting
from monarch_ft.config.job import JobConfig
from monarch_ft.controller.checkpoints import CheckpointHealth, CheckpointScrub, folder_write_problem
from monarch_ft.controller.console import Console
from monarch_ft.controller.control import JobControl
from monarch_ft.controller.fork_pool import ForkServer, WarmForks
from monarch_ft.controller.gates import start_gate_opens
from monarch_ft.controller.hangs import Hang
from monarch_ft.controller.integrity import IntegrityJudge
from monarch_ft.controller.launch import RankStarter
from monarch_ft.controller.lighthouse import Lighthouse
from monarch_ft.controller.node_watch import NodeWatch
from monarch_ft.controller.planner import FailureKind, RecoveryPlanner, RecoveryPolicy
from monarch_ft.controller.preflight import preflight
from monarch_ft.controller.prometheus import start_exporter
from monarch_ft.controller.wandb_run import start_wandb
from monarch_ft.controller.recovery import Recovery
from monarch_ft.controller.relay import ReportRelay
from monarch_ft.controller.standby_pool import STANDBY_NICENESS, StandbyPool, resolve_standby_groups
from monarch_ft.controller.state import JobState, LighthouseOutage
from monarch_ft.controller.summary import job_outcome, job_summary, rollback_lines
from monarch_ft.controller.takeover import DETACH_SIGNAL, DETACHED_EXIT, Takeover, relayed_records
from monarch_ft.controller.watch import GroupWatch
from monarch_ft.launcher import Launcher, build_launcher, launcher_options
from monarch_ft.records.errors import ConfigError
from monarch_ft.records.events import EventKind, EventLog, GroupStatus, JobStatus
from monarch_ft.records.exits import describe_exit
from monarch_ft.records.layout import RunLayout, atomic_write, atomic_write_json, read_jsonl
from monarch_ft.records.lease import lower_finish
from monarch_ft.records.manifest import step_dir

# How long the watch loop sleeps between ticks.
TICK_S = 0.05


class SupervisorHook(Protocol):
    """Called on every watch tick with the job's narrow control handle (monarch_ft.controller.control);
    fault injectors and reporters plug in here."""

    def tick(self, job: JobControl, now: float) -> None: ...


class Supervisor:
    """The controller of one job (see the module docstring).

    Args:
        cfg: the job's config (with ``controller.attach=true``: the job in ``run_dir`` is
            taken over, with the config it was started with).
        run_dir: the run directory.
        launcher: starts the ranks (default: the one ``launcher`` names, built at :meth:`open`).
        hooks: called every tick (fault injectors).
        echo: print events and progress to the console.
        clock: what the loop reads and sleeps on.
        fork_server: what starts a warm fork server (default: a real one).
    """

    def __init__(
        self,
        cfg: JobConfig,
        run_dir: str,
        launcher: Optional[Launcher] = None,
        hooks: Optional[list[SupervisorHook]] = None,
        echo: bool = True,
        clock: Clock = SYSTEM_CLOCK,
        fork_server: Callable[..., Any] = ForkServer,
    ) -> None:
        cfg = Takeover.attach_config(cfg, run_dir)  # controller.attach: the job's own config
        preflight(cfg)
        if cfg.checkpoint.enable:
            # Refused before launch: an unwritable folder would fail every save of the job.
            folder = RunLayout(run_dir, cfg.checkpoint.folder).checkpoint_root
            problem = folder_write_problem(folder)
            if problem:
                raise ConfigError(
                    f"checkpoint.folder={cfg.checkpoint.folder}: cannot write in {folder} ({problem}): give a writable directory with checkpoint.folder="
                )
        self.cfg = cfg
        self.layout = RunLayout(run_dir, cfg.checkpoint.folder)
        self.run_dir = self.layout.run_dir
        self.clock = clock
        self.hooks: list[SupervisorHook] = list(hooks or [])
        self.control = JobControl(self)
        self.planner = RecoveryPlanner(RecoveryPolicy.from_config(cfg))
        self.takeover = Takeover(cfg.controller, self.layout, clock)
        self.state = JobState.new(cfg.ft.replica_groups, self.run_dir, dataclasses.asdict(cfg), self.layout.start_gate(0))
        self.launcher: Optional[Launcher] = launcher
        self._echo = echo
        self._fork_server = fork_server
        self._opened = False
        # Built by open(): they act on the run directory, the launcher's resources, the console.
        self.events: EventLog
        self.console: Console
        self.lighthouse: Lighthouse
        self.standby: StandbyPool
        self.warm_forks: WarmForks
        self.starter: RankStarter
        self.relay: ReportRelay
        self.nodes: NodeWatch
        self.recovery: Recovery
        self.watch: GroupWatch
        self.integrity: IntegrityJudge
        self.scrub: CheckpointScrub
        self._metrics: IO[str]
        self._data_seconds = 0.0
        self._data: Any = None
        self._previous: dict = {}

    # ---------------------------------------------------------------- the run directory
    def open(self) -> None:
        """Take the run directory: prepare the data, take its lock (a second controller is
        refused before it touches anything), read the job's state (a takeover) or clear the
        previous job's live files, build the launcher and what works through it. Called by
        :meth:`run`; a config error here is one line (``ConfigError``), with nothing launched."""
        if self._opened:
            return
        cfg, layout = self.cfg, self.layout
        attaching = self.takeover.attaching
        if not attaching:
            # The training data, before anything is created or launched: a data.path that cannot
            # be trained on is a config error (one line, exit 2), not a failure of every rank.
            started = self.clock.time()
            self._data = prepare_data(cfg.data, cfg.model.vocab_size, cfg.training.seq_len)
            self._data_seconds = round(self.clock.time() - started, 2)
        os.makedirs(self.run_dir, exist_ok=True)
        self.takeover.open()
        try:
            if attaching:
                self.state, self._previous = self.takeover.load()
            else:
                # ranks/ holds this job's live report and spec files: a job resumed in the same
                # run directory must not re-read the previous job's reports.
                shutil.rmtree(layout.ranks_dir, ignore_errors=True)
                shutil.rmtree(layout.control_dir, ignore_errors=True)
            for d in (layout.ranks_dir, layout.logs_dir, layout.control_dir):
                os.makedirs(d, exist_ok=True)
            self.launcher = self.launcher or build_launcher(cfg.launcher, self.run_dir)
            problem = self.launcher.adoption_problem() if attaching else None
            if problem:
                raise ConfigError(problem)
        except BaseException:
            self.takeover.lock.release()  # this process may build another supervisor on the run
            raise
        self._opened = True
        self._build()

    def _build(self) -> None:
        cfg, layout, state, launcher = self.cfg, self.layout, self.state, self.launcher
        self.console = Console(state, cfg.training.steps)
        self.events = EventLog(layout.events, echo=self.console.echo if self._echo else None, clock=self.clock.time)
        if self.takeover.attaching:
            # The job's events so far: the summary's, the checkpoints' health (failed saves and
            # loads, quarantined copies), and the records already relayed (each is relayed once).
            self.events.events = read_jsonl(layout.events)
            state.ckpt_health = CheckpointHealth.from_events(self.events.events)
            state.unloadable.update({f["step"]: f["error"] for f in state.ckpt_health.load_failures if f.get("step") is not None})
        # metrics.prometheus_port: /metrics, fed by the event log (its events so far on a takeover); it ends itself at job_finished.
        self.exporter = start_exporter(cfg.metrics, self.events, state, cfg.training.steps)
        self.wandb = start_wandb(cfg, self.events, layout)  # metrics.wandb: one run per job (controller.wandb_run); ends at job_finished
        self._metrics = open(layout.metrics, "a", buffering=1)
        # The configured host wins unless it is the loopback default and the launcher's ranks
        # cannot reach loopback (ranks on other hosts or in network namespaces).
        host = cfg.ft.lighthouse_host if cfg.ft.lighthouse_host != "127.0.0.1" else launcher.control_host()
        self.lighthouse = Lighthouse(cfg.ft, layout.lighthouse_log, host=host, guard=(self.run_dir, cfg.controller.lease_s, cfg.controller.heartbeat_s))
        default_standbys = launcher.traits_for(launcher_options(cfg.launcher)).default_standby_groups
        # Warm fork servers (monarch_ft.controller.fork_pool): a relaunch with no standby ready forks its
        # ranks from one instead of starting fresh interpreters.
        self.warm_forks = WarmForks(
            cfg.ft.warm_fork and cfg.ft.recovery != "full_restart",
            launcher,
            layout.fork_server_log,
            lambda: self.starter.rank_env(),
            self.run_dir,
            self.events.emit,
            preload=(f"torchtitan.models.{cfg.model.name}",),
            state=state.forks,
            server=self._fork_server,
            # Once the job trains, a server starting (a new host's, a lost one's) imports below the ranks.
            niceness=lambda: STANDBY_NICENESS if self.state.first_step_time is not None else 0,
        )
        self.starter = RankStarter(cfg, layout, state, launcher, self.warm_forks, lambda: self.lighthouse.address)
        # Warm standby groups (monarch_ft.controller.standby_pool); each on a host/device slot after the groups'.
        self.standby = StandbyPool(
            resolve_standby_groups(cfg.ft.standby_groups, default_standbys, cfg.ft.recovery),
            cfg.ft.replica_groups,
            self.events.emit,
            self.starter.standby,
            first_number=layout.next_standby_number(),
            state=state.standby,
        )
        # A cluster's nodes (launcher=slurm): placements, the scheduler's view, exclusions (kept on takeover).
        state.nodes.probation_s = cfg.ft.node_probation_s
        self.nodes = NodeWatch(launcher, self.events.emit, state.nodes)
        self.nodes.resume()
        # Silent data corruption (controller.integrity): the replicas' fingerprints compared,
        # blame by vote (its state is the job's: a takeover goes on with it); the kept
        # checkpoints read back in the background (checkpoint.scrub_every_s).
        self.integrity = IntegrityJudge(
            cfg.ft.ranks_per_group,
            auto=integrity_setting(cfg.ft.integrity_every) is None,
            budget=cfg.ft.integrity_budget,
            suspect_vetoes=cfg.ft.suspect_vetoes,
            manifests_comparable=cfg.ft.mode == "hsdp",
            state=state.integrity,
        )
        self.scrub = CheckpointScrub(cfg.checkpoint.scrub_every_s, lambda: [layout.checkpoint(g.index) for g in state.groups], self.integrity.vouch)
        self.relay = ReportRelay(state, self.events, self._metrics, cfg.ft.ranks_per_group, judge=self.integrity, straggler_window=cfg.ft.straggler_window)
        self.recovery = Recovery(
            cfg, layout, state, self.planner, self.events, self.starter, self.standby, self.warm_forks, self.clock, self._save, self.nodes, judge=self.integrity
        )
        self.watch = GroupWatch(cfg, layout, state, self.events, self.relay, self.recovery)

    def _save(self) -> None:
        """Write controller.json (the launcher's and the Lighthouse's handles mirrored first)."""
        state = self.state
        state.launcher_handles = self.launcher.handles()
        lh = self.lighthouse
        ident = lh.identity()
        state.lighthouse.address, state.lighthouse.port = lh.address, ident["port"]
        state.lighthouse.guard_pid, state.lighthouse.guard_start = ident["guard_pid"], ident["guard_start"]
        state.lighthouse.server_pid, state.lighthouse.server_start = ident["server_pid"], ident["server_start"]
        self.takeover.save(state)

    # ---------------------------------------------------------------- what hooks and operators use
    @property
    def groups(self):
        return self.state.groups

    @property
    def job_step(self) -> int:
        return self.state.job_step

    @property
    def status(self) -> JobStatus:
        return self.state.status

    def request_stop(self, reason: str) -> None:
        """Safe from a signal handler: the watch loop stops the job on its next tick."""
        self.state.watch.stop_reason = reason

    def request_detach(self) -> None:
        """Safe from a signal handler: the controller exits at its next tick, the job keeps training."""
        self.takeover.request_detach()

    def finish_at(self, step: int) -> None:
        """Ask every group to finish training at ``step`` (before training.steps), or at the
        earlier step already asked for."""
        step = request_finish(self.run_dir, step)
        self.events.emit(EventKind.FINISH_REQUESTED, step=step)

    def capture_stacks(self, groups: Optional[list[int]] = None, tag: str = "on-demand") -> dict[str, str]:
        """Every live rank's Python stacks (of ``groups``, default all), written under the run's
        ``stacks/`` folder now; label (``g0r1``) -> file. What hangs and stalls call, and what
        a hook or an operator may call at any time."""
        return self.watch.capture_stacks([g for g in self.state.groups if groups is None or g.index in groups], tag)

    def consistent_at(self, groups: set[int], min_step: int) -> Optional[tuple[int, bool]]:
        """See :meth:`monarch_ft.controller.relay.ReportRelay.consistent_at`."""
        return self.relay.consistent_at(groups, min_step)

    def scratch_dir(self, group: int) -> str:
        """A group's host-local files (scratch space); a node fault deletes them."""
        return self.layout.scratch(group)

    def checkpoint_dir(self, group: int) -> str:
        return self.layout.checkpoint(group)

    def _install_signal_handlers(self) -> list:
        if threading.current_thread() is not threading.main_thread():
            return []
        previous = []
        for sig in (signal.SIGINT, signal.SIGTERM):
            previous.append((sig, signal.getsignal(sig)))
            signal.signal(sig, lambda s, _f: self.request_stop(signal.Signals(s).name))
        # SIGUSR2: detach (the controller exits, the job keeps training; see monarch_ft.controller.takeover).
        previous.append((DETACH_SIGNAL, signal.getsignal(DETACH_SIGNAL)))
        signal.signal(DETACH_SIGNAL, lambda _s, _f: self.request_detach())
        return previous

    # ---------------------------------------------------------------- run
    def run(self) -> int:
        self.open()
        # ps/top/py-spy show which run this process controls (monarch_ft.common.proctitle).
        with proctitle.titled(self.run_dir, proctitle.CONTROLLER):
            return self._run()

    def _run(self) -> int:
        previous = self._install_signal_handlers()
        state = self.state
        now = self.clock.time()
        if not self.takeover.attaching:
            state.started = state.gate_since = now
        exit_code = 1
        try:
            if self.takeover.attaching:
                self._take_over(now)
                return self._watch()
            self.takeover.start_heartbeat()
            self.events.emit(
                EventKind.JOB_STARTED,
                run_dir=self.run_dir,
                replica_groups=self.cfg.ft.replica_groups,
                ranks_per_group=self.cfg.ft.ranks_per_group,
                transport=self.cfg.ft.transport,
                **self.launcher.describe(),
                supervisor_pid=os.getpid(),
            )
            address = self.lighthouse.start()
            self.events.emit(EventKind.LIGHTHOUSE_STARTED, address=address, pid=self.lighthouse.pid)
            state.tokens_path = self._data.tokens_path
            self.events.emit(
                EventKind.DATA_READY,
                tokens=self._data.num_tokens,
                vocab_size=self._data.vocab_size,
                seconds=self._data_seconds,
                path=self.cfg.data.path,
            )
            if self.cfg.checkpoint.resume:
                self.recovery.resume_job()
            open(self.layout.hold, "w").close()
            self.recovery.write_floor()
            exit_code = self._watch()
        except BaseException as e:
            state.status = JobStatus.FAILED
            self.events.emit(EventKind.SUPERVISOR_ERROR, error=f"{type(e).__name__}: {e}"[:500])
            raise
        finally:
            self._shutdown()
            for sig, handler in previous:
                signal.signal(sig, handler)
        return exit_code

    def _watch(self) -> int:
        cost = self.state.watch.cost
        cost.start(self.clock.time())
        while True:
            code = self.tick(self.clock.time())
            cost.tick(self.clock.time())
            if code is not None:
                return code
            self.clock.sleep(TICK_S)

    def tick(self, now: float) -> Optional[int]:
        """One turn of the watch loop at ``now``; the job's exit code once it has ended, else None."""
        state = self.state
        self.watch.account_own_stall(now)
        if state.watch.stop_reason:
            state.status = JobStatus.INTERRUPTED
            self.events.emit(EventKind.SUPERVISOR_STOP_REQUESTED, reason=state.watch.stop_reason)
            return 130 if state.watch.stop_reason == "SIGINT" else 143
        if state.watch.fatal:
            state.status = JobStatus.FAILED
            return 1
        if self.takeover.detach_requested and self.takeover.can_detach(self.launcher):
            state.status = JobStatus.DETACHED
            return DETACHED_EXIT
        if not self.lighthouse.alive():
            self._restart_lighthouse(now)
        self.nodes.tick(now)  # before any launch: exclusions and returns apply to it
        for g in state.groups:
            if g.status == GroupStatus.WAITING and now >= g.next_launch:
                self.recovery.launch(g, now)
        finishing = all(g.train_done or g.finished for g in state.groups)
        self.standby.tick(now, state.first_step_time is not None, finishing)
        self.warm_forks.tick(g.index for g in state.groups if not g.finished)
        hangs: dict[int, Hang] = {}
        for g in state.groups:
            if g.active:
                self.relay.consume(g, now)
        for g in state.groups:
            if g.active:
                self.watch.reap(g, now)
        for g in state.groups:
            if g.active:
                hang = self.watch.check(g, now)
                if hang is not None:
                    hangs[g.index] = hang
        self.watch.judge(hangs, now)
        self._integrity_tick(now)
        self.watch.check_stragglers(now)
        self.recovery.write_floor()
        self._lighthouse_recovered()
        self.recovery.open_launch_gates()
        self._open_start_gate(now)
        self._update_hold()
        for hook in self.hooks:
            hook.tick(self.control, now)
        self.takeover.tick(state, self.events)
        self._save()
        if state.all_finished():
            state.status = job_outcome([g.status for g in state.groups], bool(state.regressions))
            return 0 if state.status == JobStatus.COMPLETED else 1
        if self._echo:
            self.console.progress(now)
        return None

    # ---------------------------------------------------------------- silent data corruption (controller.integrity)
    def _integrity_tick(self, now: float) -> None:
        """Act on the integrity verdicts of this tick (:meth:`Recovery.integrity_verdicts`);
        write auto's interval and the transport peers for the ranks; quarantine what the
        checkpoint scrub found."""
        self.recovery.integrity_verdicts(self.relay.take_verdicts(), now)
        decided = self.integrity.interval()
        if decided is not None:
            every, why, cost = decided
            atomic_write(self.layout.integrity_every, str(every))
            self.events.emit(EventKind.INTEGRITY_INTERVAL, every=every, cost_per_step=round(cost, 5), why=why)
        for found in self.scrub.results():
            if found["damaged"]:
                self.events.emit(EventKind.CHECKPOINT_SCRUBBED, steps=found["steps"], seconds=found["seconds"], damaged=len(found["damaged"]))
            for d in found["damaged"]:
                group = next((g.index for g in self.state.groups if self.layout.checkpoint(g.index) == d["folder"]), None)
                if group is not None and os.path.isdir(step_dir(d["folder"], d["step"])):
                    self.recovery.quarantine_copy(group, d["step"], d["problem"], "the checkpoint scrub")
        self._publish_transport_peers()

    def _publish_transport_peers(self) -> None:
        """Where each stepping group's ranks serve their state (RunLayout.transport_peers), when
        it changed: a healing rank fetches a chunk that failed its checksum again from another."""
        state = self.state
        newest: dict[tuple[int, int], str] = {}
        for metadata, owner in state.transport_owner.items():
            if metadata:
                newest[owner] = metadata
        peers = {
            str(g.index): {str(r): newest[(g.index, r)] for r in range(self.cfg.ft.ranks_per_group) if (g.index, r) in newest}
            for g in state.groups
            if g.status == GroupStatus.RUNNING
        }
        if peers != state.watch.peers_published:
            atomic_write_json(self.layout.transport_peers, peers)
            state.watch.peers_published = peers

    # ---------------------------------------------------------------- gates
    def _open_start_gate(self, now: float) -> None:
        """Let the groups at the current gate train once all of them have built their model
        and loaded their state (or once they waited long enough)."""
        gate = self.recovery.gate_path
        if os.path.exists(gate):
            return
        waiting = [g for g in self.state.groups if g.start_gate == gate and not g.finished]
        ready = all(g.active and all(r.model_ready for r in g.ranks) for g in waiting)
        if start_gate_opens(ready, now - self.state.gate_since, self.cfg.ft.startup_timeout_s):
            open(gate, "w").close()
            self.events.emit(EventKind.TRAINING_STARTED, all_groups_ready=ready, full_restarts=self.state.full_restarts)

    def _update_hold(self) -> None:
        """Groups that finished wait (serving quorums) while any other group still has work."""
        pending = [g for g in self.state.groups if not g.finished and not g.train_done]
        hold = self.layout.hold
        if pending and not os.path.exists(hold):
            open(hold, "w").close()
        elif not pending and os.path.exists(hold):
            os.remove(hold)

    # ---------------------------------------------------------------- the Lighthouse
    def _restart_lighthouse(self, now: float) -> None:
        """The Lighthouse died: start it again on the same address. The ranks' Managers
        keep their groups meanwhile (their quorum calls fail and are retried; see docs/design/lighthouse.md,
        "The job outlives its controller"); lighthouse_recovered records the survivors'
        stall, from the last commit before the loss to the first one after it."""
        state = self.state
        last = max((r["time"] for r in state.last_commit.values()), default=None)
        self.events.emit(EventKind.LIGHTHOUSE_LOST, pid=self.lighthouse.pid, address=self.lighthouse.address, **describe_exit(self.lighthouse.exit_code))
        # The ranks' quorum ids move to a new range before the new Lighthouse answers their
        # retried quorums (rank.components.lighthouse_epoch).
        state.lighthouse.epoch += 1
        atomic_write(self.layout.lighthouse_epoch, str(state.lighthouse.epoch))
        address = self.lighthouse.restart()
        self.events.emit(EventKind.LIGHTHOUSE_RESTARTED, address=address, pid=self.lighthouse.pid, down_s=round(self.clock.time() - now, 3))
        state.lighthouse.outage = LighthouseOutage(now, last, state.job_step)

    def _lighthouse_recovered(self) -> None:
        state = self.state
        outage = state.lighthouse.outage
        if outage is None:
            return
        after = [r["time"] for r in state.last_commit.values() if r["time"] > outage.lost]
        if after:
            first = min(after)
            self.events.emit(
                EventKind.LIGHTHOUSE_RECOVERED,
                stall_s=round(first - (outage.last_commit or outage.lost), 3),
                job_step_before=outage.job_step,
                job_step=state.job_step,
            )
            state.lighthouse.outage = None

    # ---------------------------------------------------------------- takeover (monarch_ft.controller.takeover)
    def _take_over(self, now: float) -> None:
        """Take the job over (``controller.attach=true``): re-adopt live groups, fail the lost
        ones, adopt (or restart) the Lighthouse."""
        state = self.state
        lost = self.takeover.lost(self.events, self._previous.get("controller_pid"), state.job_step, now)
        decisions, failed = self.takeover.adopt(state, self.launcher, relayed_records(self.events.events, self.layout.metrics), now)
        lh = state.lighthouse
        lighthouse = self.lighthouse.adopt(lh.address, lh.guard_pid, lh.guard_start, lh.server_pid, lh.server_start)
        self.events.emit(
            EventKind.CONTROLLER_ATTACHED,
            pid=os.getpid(),
            previous_pid=self._previous.get("controller_pid"),
            unsupervised_s=round(now - lost["time"], 3),
            groups=decisions,
            lighthouse=lighthouse,
            job_step=state.job_step,
        )
        self.takeover.start_heartbeat()
        if not lighthouse["alive"]:
            self._restart_lighthouse(now)
        for g, ranks in failed:
            # Reports up to now first: what the group did while unsupervised is recorded.
            self.relay.consume(g, now)
            # A rank that reported its error (rank_error) before it died was not lost without
            # a word: it failed, most often because a lost peer broke its collectives (it then
            # exits within a second). Named apart, so ``ranks`` are the ones that vanished.
            errored = [rs.rank for rs in g.ranks if rs.error and rs.rank in ranks]
            vanished = [r for r in ranks if r not in errored]
            extra = {"errored_ranks": errored} if errored else {}
            self.recovery.fail_group(g, now, FailureKind.LOST, reason="lost_while_unsupervised", ranks=vanished, **extra)
        state.status = JobStatus.RUNNING
        self._save()

    def close_out(self, reason: str, now: float) -> None:
        """End a job that ended with no controller (its ranks' lease ran out, or a ``stop`` no
        controller answered; :mod:`monarch_ft.controller.closeout` runs this once nothing of
        the job is left): read the ranks' reports to their end as a controller would have,
        record how each rank ended, set the job's status, and end it as this supervisor ends
        a job (:meth:`_shutdown`: summary.json, job_finished, controller.json marked
        finished), so the record covers the whole job, the part nobody supervised included.

        Args:
            reason: why the ranks ended the job (``monarch_ft.records.lease.LeaseWatch.ended``).
            now: the time of the close-out.
        """
        self.open()
        state = self.state
        try:
            self.takeover.lost(self.events, self._previous.get("controller_pid"), state.job_step, now)
            self.takeover.adopt(state, self.launcher, relayed_records(self.events.events, self.layout.metrics), now)
            state.ended_by = reason
            # Its address for the record; the guard (this process's caller) is not adopted: nothing to stop.
            self.lighthouse.adopt(state.lighthouse.address, None, None, None, None)
            for g in state.groups:
                if not g.ranks:
                    continue
                self.relay.consume(g, now)
                for rs in g.ranks:
                    if rs.exited is None:
                        # Gone by now (the guard waited for every rank): 0 if it reported rank_finished.
                        rs.exited = rs.proc.wait(5.0)
                        if rs.exited is not None:
                            self.events.emit(EventKind.RANK_EXITED, group=g.index, rank=rs.rank, attempt=g.attempt, **describe_exit(rs.exited))
                if g.active and all(r.exited == 0 for r in g.ranks):
                    g.move(GroupStatus.DONE)
                    self.events.emit(EventKind.GROUP_FINISHED, group=g.index, attempt=g.attempt, step=g.last_step)
            if reason == "lease_expired":
                state.status = JobStatus.LEASE_EXPIRED
            else:  # a stop: as a controller ends it
                state.status = job_outcome([g.status for g in state.groups], regressed=False)
        except BaseException:
            state.status = JobStatus.FAILED
            raise
        finally:
            self._shutdown()

    # ---------------------------------------------------------------- the end
    def _shutdown(self) -> None:
        state = self.state
        # Standbys belong to this controller (they die with it, see RankStarter.standby): a
        # controller that attaches later builds its own.
        self.standby.stop()
        self.scrub.stop()
        self.control.close()  # CPU limits a fault set: lifted, whatever becomes of the job
        if state.status == JobStatus.DETACHED:
            # The job keeps training: leave every rank and the Lighthouse alone. The fork
            # servers are this controller's (their forked ranks live on, adopted by init).
            self.warm_forks.close()
            self._save()
            self.takeover.close(state, self.events, finished=False)
            print(
                f"[monarch_ft] detached: the job keeps training; take it over with controller.attach=true hydra.run.dir={self.run_dir} "
                f"(its ranks end themselves after controller.lease_s={self.cfg.controller.lease_s:g}s without a controller)",
                flush=True,
            )
            self.events.close()
            self._metrics.close()
            return
        for g in state.groups:
            if g.ranks and any(r.exited is None for r in g.ranks):
                self.starter.stop(g, graceful=True)
                if not g.finished:
                    self.events.emit(EventKind.GROUP_STOPPED, group=g.index, attempt=g.attempt, reason=state.status)
        self.warm_forks.close()  # after the ranks: their exit codes come back through it
        self.lighthouse.stop()
        if self.lighthouse.proc is not None:
            self.events.emit(EventKind.LIGHTHOUSE_STOPPED)
        if os.path.exists(self.layout.hold):
            os.remove(self.layout.hold)
        summary = self.summary()
        atomic_write(self.layout.summary, json.dumps(summary, indent=2))
        for line in rollback_lines(state.rollbacks):
            print(f"[monarch_ft] {line}", flush=True)
        for r in state.steps_redone:
            print(
                f"[monarch_ft] step {r['step']} was trained twice: group {r['earlier']['group']} committed it in quorum "
                f"{r['earlier']['quorum_id']} and died before a peer held it; group {r['group']} trained it again in quorum {r['quorum_id']}",
                flush=True,
            )
        for r in state.regressions:
            print(
                f"monarch_ft: error: group {r['group']} (attempt {r['attempt']}) committed step {r['step']} after the job had "
                f"committed step {r['job_committed']}: it trained on a stale state",
                file=sys.stderr,
                flush=True,
            )
        self.events.emit(EventKind.JOB_FINISHED, status=state.status, seconds=summary["wall_time_s"], job_step=state.job_step, steps_lost=summary["steps_lost"])
        self._save()
        self.takeover.close(state, self.events, finished=True)
        self.events.close()
        self._metrics.close()
        self.launcher.close()

    def summary(self) -> dict[str, Any]:
        now = self.clock.time()
        return job_summary(
            self.state,
            self.cfg,
            self.launcher.describe(),
            self.lighthouse.address,
            self.standby.summary(now),
            self.takeover.summary(self.events.events, self.state.ended_by, now),
            now,
        )


def request_finish(run_dir: str, step: int) -> int:
    """Make every group of the job running in ``run_dir`` finish at ``step``, unless an earlier
    step is already asked for (records.lease.lower_finish); returns the step in force."""
    return lower_finish(RunLayout(run_dir).stop_at_step, step)
