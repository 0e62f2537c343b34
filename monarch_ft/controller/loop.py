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

Each tick of the watch loop is three stages (docs/design/controller.md):

1. **observe** (:mod:`.observe`): one read of the world, in one fixed order, into one typed
   :class:`~monarch_ft.controller.observe.Observations`;
2. **decide** (:mod:`.decide`): a pure function of the job's state
   (:class:`~monarch_ft.controller.state.JobState`), the observations and the facts handed in,
   returning typed actions (:mod:`.actions`);
3. **act** (:mod:`.act`): the executor applies them in order and writes the events.

A decision that needs the newest intact checkpoint asks for it; the executor finds it after the
pass's other actions and the tick runs a second pass with it (the same observations). Then the
hooks run (fault injectors), and the job's state is saved for a takeover (:mod:`.takeover`).

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
from typing import IO, Any, Callable, Iterable, Optional, Protocol

from monarch_ft.common.heap import survivors_frozen
from monarch_ft.common import proctitle
from monarch_ft.common.clock import SYSTEM_CLOCK, Clock
from monarch_ft.common.data import prepare_data
from monarch_ft.common.devices import gpu_device_nodes
from monarch_ft.common.process import allow_open_files
from monarch_ft.config.ft import hang_timeout_setting, integrity_setting
from monarch_ft.config.job import JobConfig
from monarch_ft.controller import actions as A
from monarch_ft.controller.act import Executor, OwnWriteFailed
from monarch_ft.controller.checkpoints import CheckpointHealth, CheckpointScrub, folder_write_problem
from monarch_ft.controller.console import Console
from monarch_ft.controller.control import JobControl
from monarch_ft.controller.decide import Rules, decide, decide_close_out, decide_pending, decide_resume
from monarch_ft.controller.decide.reports import consistent_at
from monarch_ft.controller.fork_pool import ForkServer, WarmForks
from monarch_ft.controller.integrity import IntegrityJudge
from monarch_ft.controller.launch import RankStarter
from monarch_ft.controller.lighthouse import Lighthouse
from monarch_ft.controller.link_probe import LinkProber
from monarch_ft.controller.observe import Observer
from monarch_ft.controller.planner import DiskFact, RecoveryPlanner, RecoveryPolicy
from monarch_ft.controller.preflight import preflight
from monarch_ft.controller.prometheus import start_exporter
from monarch_ft.controller.standby_pool import STANDBY_NICENESS, resolve_standby_groups
from monarch_ft.controller.state import JobState
from monarch_ft.controller.wandb_run import start_wandb
from monarch_ft.controller.summary import job_outcome, job_summary, rollback_lines
from monarch_ft.controller.takeover import DETACH_SIGNAL, Takeover, progress_only, progress_save_due, relayed_records
from monarch_ft.launcher import Launcher, build_launcher, launcher_options
from monarch_ft.records.errors import ConfigError
from monarch_ft.records.events import EventKind, EventLog, GroupStatus, JobStatus
from monarch_ft.records.exits import describe_exit
from monarch_ft.records.layout import RunLayout, atomic_write, read_jsonl
from monarch_ft.records.lease import lower_finish

# The watch loop's period: a tick starts every TICK_S, or at once (after MIN_PAUSE_S) when the
# last one took longer.
TICK_S = 0.05
MIN_PAUSE_S = 0.002
# A tick's decision passes at most: the first, and the ones that take the facts a pass asked for.
MAX_PASSES = 3


def pause_after(tick_s: float) -> float:
    """How long the watch loop sleeps after a tick that took ``tick_s``: what is left of its
    period (:data:`TICK_S`), and at least :data:`MIN_PAUSE_S` (the helper threads' turn).

    Args:
        tick_s: the tick's duration on the controller's clock.
    """
    return max(MIN_PAUSE_S, TICK_S - tick_s)


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
        journal: when given, each decision pass's (time, actions) is appended to it (the fast
            tests assert on the actions a tick returns).
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
        journal: Optional[list] = None,
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
        self.journal = journal
        self._opened = False
        # When the last whole save was (the clock's time; a tick's own save may wait for a later one).
        self._saved_at = float("-inf")
        # Built by open(): they act on the run directory, the launcher's resources, the console.
        self.events: EventLog
        self.console: Console
        self.lighthouse: Lighthouse
        self.warm_forks: WarmForks
        self.starter: RankStarter
        self.integrity: IntegrityJudge
        self.scrub: CheckpointScrub
        self.prober: LinkProber
        self.observer: Observer
        self.rules: Rules
        self.executor: Executor
        self._metrics: IO[str]
        self._data_seconds = 0.0
        self._data: Any = None
        self._previous: dict = {}
        # A file of the controller's own that could not be written (the job was stopped for it).
        self._write_failed: Optional[OwnWriteFailed] = None

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
        allow_open_files()  # every rank's report file is kept open (records.reports.ReportTail)
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
        forks_enabled = cfg.ft.warm_fork and cfg.ft.recovery != "full_restart"
        # Warm fork servers (monarch_ft.controller.fork_pool): a relaunch with no standby ready forks its
        # ranks from one instead of starting fresh interpreters.
        self.warm_forks = WarmForks(
            forks_enabled,
            launcher,
            layout.fork_server_log,
            lambda: self.starter.rank_env(),
            self.run_dir,
            preload=(f"torchtitan.models.{cfg.model.name}",),
            state=state.forks,
            server=self._fork_server,
            # Once the job trains, a server starting (a new host's, a lost one's) imports below the ranks.
            niceness=lambda: STANDBY_NICENESS if self.state.first_step_time is not None else 0,
        )
        self.starter = RankStarter(cfg, layout, state, launcher, self.warm_forks, lambda: self.lighthouse.address)
        # Warm standby groups (monarch_ft.controller.standby_pool); each on a host/device slot after the groups'.
        pool = state.standby
        pool.wanted = pool.clock.wanted = resolve_standby_groups(cfg.ft.standby_groups, default_standbys, cfg.ft.recovery)
        pool.first_slot = cfg.ft.replica_groups
        pool.first_number = layout.next_standby_number()
        # A cluster's nodes (launcher=slurm): a controller that took the job over keeps the
        # launcher off the nodes still excluded.
        state.nodes.probation_s = cfg.ft.node_probation_s
        if state.nodes.excluded:
            launcher.exclude_nodes(state.nodes.to_exclude(state.nodes.states))
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
        # Times each rank's link when a probe round is due (controller.link_probe).
        self.prober = LinkProber()
        self.observer = Observer(
            state, layout, launcher, self.warm_forks, self.lighthouse, self.prober, self.scrub, self.takeover, returned_hosts=self.control.take_returned_hosts
        )
        self.rules = Rules(
            cfg=cfg,
            planner=self.planner,
            layout=layout,
            judge=self.integrity,
            launcher_name=launcher.name,
            fork_problem=self.warm_forks.problem(),
            forks_enabled=forks_enabled,
            # Ranks compute on the CPU (no GPU on this host, or training.device=cpu): see hangs.asleep_compute_timeout.
            compute_on_cpu=cfg.training.device == "cpu" or (cfg.training.device == "auto" and not gpu_device_nodes()),
            hang_timeout_fixed=hang_timeout_setting(cfg.ft.hang_timeout_s),
            node_health=launcher.node_health,
            adoption_problem=launcher.adoption_problem(),
        )
        self.executor = Executor(
            state,
            layout,
            launcher,
            self.starter,
            self.warm_forks,
            self.lighthouse,
            self.prober,
            self.integrity,
            self.events,
            self._metrics,
            self._save,
            self.clock.time,
            cfg.checkpoint.enable,
            clear_detach=self.takeover.clear_detach,
        )

    def _save(self, groups: Optional[Iterable[int]] = None, progress: bool = False, now: float = 0.0, quiet: bool = False) -> None:
        """Write controller.json (the launcher's and the Lighthouse's handles mirrored first);
        ``groups``: only these groups may have changed since the last save (the rest of this
        pass's changes go with the tick's own save, at its end). ``progress``: the tick only
        took the ranks' records in (takeover.progress_only): its save waits for a later tick
        (takeover.progress_save_due; ``quiet``: this tick read no step record), unless a handle
        changed meanwhile (the launcher's or the Lighthouse's, which change on their own)."""
        state = self.state
        handles = self.launcher.handles()
        lh = self.lighthouse
        ident = lh.identity()
        seen = (lh.address, ident["port"], ident["guard_pid"], ident["guard_start"], ident["server_pid"], ident["server_start"])
        mine = state.lighthouse
        saved = (mine.address, mine.port, mine.guard_pid, mine.guard_start, mine.server_pid, mine.server_start)
        if progress and handles == state.launcher_handles and seen == saved and not progress_save_due(now - self._saved_at, quiet):
            return
        state.launcher_handles = handles
        mine.address, mine.port, mine.guard_pid, mine.guard_start, mine.server_pid, mine.server_start = seen
        try:
            self.takeover.save(state, groups=groups, partial=groups is not None)
        except OSError as e:
            e.filename = e.filename or self.layout.controller_state
            raise OwnWriteFailed(e.filename, e) from None
        if groups is None:
            self._saved_at = now

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
        ``stacks/`` folder now; label (``g0r1``) -> file. What hangs and stalls capture, and what
        a hook or an operator may call at any time."""
        ranks = [rs for g in self.state.groups if groups is None or g.index in groups for rs in g.ranks]
        return self.executor.capture_stacks(ranks, tag)

    def consistent_at(self, groups: set[int], min_step: int) -> Optional[tuple[int, bool]]:
        """(step, equal) for the first step >= ``min_step`` that every rank of ``groups`` hashed
        (monarch_ft.controller.decide.reports.consistent_at)."""
        return consistent_at(self.state, self.cfg.ft.ranks_per_group, groups, min_step)

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
                disk = self.executor.find_disk(at_most=None) if self.cfg.checkpoint.enable else DiskFact(None)
                self.executor.apply(decide_resume(self.rules, state, now, disk).actions)
            state.watch.floor_written = state.job_step
            self.executor.apply([A.SetHold(True), A.WriteFloor(state.job_step)])
            exit_code = self._watch()
        except OwnWriteFailed as e:
            exit_code = self._own_write_failed(e)
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
        with survivors_frozen():
            return self._watch_loop(cost)

    def _watch_loop(self, cost) -> int:
        while True:
            began = self.clock.time()
            code = self.tick(began)
            cost.tick(self.clock.time())
            if code is not None:
                return code
            # A period, not a pause: a pause of TICK_S after every tick let a controller whose
            # ticks take longer (a thousand groups stepping ten times a second) fall behind by
            # its own pause, and an exit waited for the pause, then for a tick that read the
            # steps of the whole pause and more.
            self.clock.sleep(pause_after(self.clock.time() - began))

    def tick(self, now: float) -> Optional[int]:
        """One turn of the watch loop at ``now``: observe, decide, act (then the passes that take
        the facts a decision asked for, the hooks and the save); the job's exit code once it has
        ended, else None."""
        try:
            obs = self.observer.observe(now)
            decision = decide(self.rules, self.state, obs)
            progress = progress_only(decision.actions)
            acted = self._act(now, decision.actions)
            end = acted.end
            passes = 1
            while decision.waiting and end is None and passes < MAX_PASSES:
                decision = decide_pending(self.rules, self.state, obs, acted.facts)
                progress = progress and progress_only(decision.actions)
                acted = self._act(now, decision.actions)
                end = acted.end
                passes += 1
            if end is not None and end.immediate:
                return end.code
            for hook in self.hooks:
                hook.tick(self.control, now)
            self._save(progress=progress and end is None, now=now, quiet=not obs.read_steps())
        except OwnWriteFailed as e:
            return self._own_write_failed(e)
        if end is not None:
            return end.code
        if self._echo:
            self.console.progress(now)
        return None

    def _act(self, now: float, actions: list) -> Any:
        if self.journal is not None:
            self.journal.append((now, list(actions)))
        return self.executor.apply(actions)

    def _own_write_failed(self, e: OwnWriteFailed) -> int:
        """A file of the controller's own could not be written: the job stops (every group
        stopped at the shutdown), with one line naming the path and the error."""
        if self._write_failed is None:
            self._write_failed = e
            print(f"monarch_ft: error: {e.line(self.run_dir)}", file=sys.stderr, flush=True)
        self.state.status = JobStatus.FAILED
        return 1

    # ---------------------------------------------------------------- takeover (monarch_ft.controller.takeover)
    def _take_over(self, now: float) -> None:
        """Take the job over (``controller.attach=true``): re-adopt live groups, adopt the
        Lighthouse; the groups with a rank lost are failed at the first tick, once their
        reports are read (a dead Lighthouse is restarted there too)."""
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
        state.watch.lost_on_attach = {g.index: ranks for g, ranks in failed}
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
            self.executor.apply(decide_close_out(self.rules, state, self.observer.observe(now)).actions)
            for g in state.groups:
                if not g.ranks:
                    continue
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
    def _stop_standbys(self) -> None:
        """End every standby (job end): SIGTERM, then SIGKILL. Standbys belong to this
        controller (they die with it, see RankStarter.standby): one that attaches later builds its own."""
        ranks = [rs for sb in self.state.standby.standbys for rs in sb.ranks]
        for rs in ranks:
            if rs.exited is None:
                rs.proc.send_signal(signal.SIGTERM)
        for rs in ranks:
            if rs.exited is None:
                rs.exited = rs.proc.wait(5.0)
                if rs.exited is None:
                    rs.proc.kill()
                    rs.exited = rs.proc.wait(5.0)

    def _write_own(self, what: Callable[[], None], path: str) -> None:
        """One of the controller's own writes at the job's end: a failure is one console line
        (once), never a traceback over the job's end."""
        try:
            what()
        except (OSError, OwnWriteFailed) as e:
            failure = e if isinstance(e, OwnWriteFailed) else OwnWriteFailed(getattr(e, "filename", None) or path, e)
            if self._write_failed is None:
                self._write_failed = failure
                print(f"monarch_ft: error: {failure.line(self.run_dir)}", file=sys.stderr, flush=True)

    def _shutdown(self) -> None:
        state = self.state
        self._stop_standbys()
        self.scrub.stop()
        self.control.close()  # CPU limits a fault set: lifted, whatever becomes of the job
        if state.status == JobStatus.DETACHED:
            # The job keeps training: leave every rank and the Lighthouse alone. The fork
            # servers are this controller's (their forked ranks live on, adopted by init).
            self.warm_forks.close()
            self._write_own(self._save, self.layout.controller_state)
            self._write_own(lambda: self.takeover.close(state, self.events, finished=False), self.layout.controller_state)
            print(
                f"[monarch_ft] detached: the job keeps training; take it over with controller.attach=true hydra.run.dir={self.run_dir} "
                f"(its ranks end themselves after controller.lease_s={self.cfg.controller.lease_s:g}s without a controller)",
                flush=True,
            )
            self.events.close()
            self._write_own(self._metrics.close, self.layout.metrics)
            return
        for g in state.groups:
            if g.ranks and any(r.exited is None for r in g.ranks):
                self.starter.stop(g.ranks, graceful=True)
                if not g.finished:
                    self.events.emit(EventKind.GROUP_STOPPED, group=g.index, attempt=g.attempt, reason=state.status)
        self.warm_forks.close()  # after the ranks: their exit codes come back through it
        self.lighthouse.stop()
        if self.lighthouse.proc is not None:
            self.events.emit(EventKind.LIGHTHOUSE_STOPPED)
        if os.path.exists(self.layout.hold):
            self._write_own(lambda: os.remove(self.layout.hold), self.layout.hold)
        summary = self.summary()
        self._write_own(lambda: atomic_write(self.layout.summary, json.dumps(summary, indent=2)), self.layout.summary)
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
        self._write_own(self._save, self.layout.controller_state)
        self._write_own(lambda: self.takeover.close(state, self.events, finished=True), self.layout.controller_state)
        self.events.close()
        if self.events.write_error is not None:
            self._write_own(self.executor.check_own_writes, self.layout.events)
        self._write_own(self._metrics.close, self.layout.metrics)
        self.launcher.close()

    def summary(self) -> dict[str, Any]:
        now = self.clock.time()
        return job_summary(
            self.state,
            self.cfg,
            self.launcher.describe(),
            self.lighthouse.address,
            self.state.standby.summary(now),
            self.takeover.summary(self.events.events, self.state.ended_by, now),
            now,
        )


def request_finish(run_dir: str, step: int) -> int:
    """Make every group of the job running in ``run_dir`` finish at ``step``, unless an earlier
    step is already asked for (records.lease.lower_finish); returns the step in force."""
    return lower_finish(RunLayout(run_dir).stop_at_step, step)
