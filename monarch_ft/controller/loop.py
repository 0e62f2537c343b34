"""The single controller: one process that drives the whole fault-tolerant job.

It starts the TorchFT Lighthouse, launches ``ft.replica_groups`` groups of
``ft.ranks_per_group`` ranks through a :class:`~monarch_ft.launcher.Launcher`, and
then watches every rank: exit codes and signals, liveness and run state through
psutil, and step progress read from the ranks' own report files. A group with a
failed or hung rank is stopped as a whole and relaunched (backoff, restart budget);
the relaunched group rejoins the quorum and heals from a live peer through TorchFT
while the surviving groups keep stepping.

Everything it sees goes to ``events.jsonl``; per-step records of every rank go to
``metrics.jsonl``; ``summary.json`` is written at the end, however the job ends.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import shutil
import signal
import sys
import threading
import time
from typing import Any, Optional, Protocol

import psutil

from monarch_ft.common import proctitle
from monarch_ft.common.data import prepare_data
from monarch_ft.common.devices import gpu_device_nodes
from monarch_ft.common.net import free_port
from monarch_ft.common.process import on_python_path
from monarch_ft.common.stacks import capture_stacks
from monarch_ft.config.ft import hang_timeout_setting, integrity_setting
from monarch_ft.config.job import JobConfig
from monarch_ft.controller.budget import crash_loop, crash_loop_line, recent_restarts, restart_backoff, startup_failure
from monarch_ft.controller.checkpoints import CheckpointHealth, CheckpointScrub, folder_write_problem, quarantine_step, recover_checkpoint, save_failure_fix
from monarch_ft.controller.integrity import Corrupt, Diverged, IntegrityJudge, Suspect, Verdict
from monarch_ft.controller.control import JobControl
from monarch_ft.controller.fork_pool import ForkError, WarmForks
from monarch_ft.controller.gates import start_gate_opens
from monarch_ft.controller.hangs import (
    Hang,
    HangLimits,
    RankView,
    StepTimeLearner,
    asleep_compute_timeout,
    auto_hang_timeout,
    find_hang,
    is_job_stall,
    track_cpu,
    track_os_state,
)
from monarch_ft.controller.ledger import CommitLedger, redone_commit
from monarch_ft.controller.lighthouse import Lighthouse
from monarch_ft.controller.preflight import preflight
from monarch_ft.controller.standby_pool import STANDBY_NICENESS, StandbyPool, build_promotion, resolve_standby_groups
from monarch_ft.controller.state import GroupState, RankState
from monarch_ft.controller.summary import job_outcome, rollback_lines
from monarch_ft.controller.takeover import DETACH_SIGNAL, DETACHED_EXIT, Controller
from monarch_ft.launcher import Launcher, RankLaunch, build_launcher, launcher_options
from monarch_ft.records.decisions import JobStateLost, StateSource, decide_state_source, needs_disk
from monarch_ft.records.errors import ConfigError
from monarch_ft.records.events import EventKind, EventLog, GiveUpReason, GroupStatus, JobStatus, RecoveryPath
from monarch_ft.records.exits import RankExit, describe_exit
from monarch_ft.records.launch import worker_argv
from monarch_ft.records.layout import RunLayout, atomic_write, atomic_write_json, read_jsonl
from monarch_ft.records.integrity import INTEGRITY_ROLLBACK
from monarch_ft.records.manifest import complete_steps, step_dir
from monarch_ft.records.reports import ReportTail

log = logging.getLogger("monarch_ft.controller.loop")

# A watch tick this much later than the previous one means the supervisor itself was held up.
SUPERVISOR_STALL_S = 2.0


class SupervisorHook(Protocol):
    """Called on every watch tick with the job's narrow control handle (monarch_ft.controller.control);
    fault injectors and reporters plug in here."""

    def tick(self, job: JobControl, now: float) -> None: ...


class Supervisor:
    def __init__(
        self,
        cfg: JobConfig,
        run_dir: str,
        launcher: Optional[Launcher] = None,
        hooks: Optional[list[SupervisorHook]] = None,
        echo: bool = True,
    ) -> None:
        cfg = Controller.attach_config(cfg, run_dir)  # controller.attach: the job's own config
        preflight(cfg)
        if cfg.checkpoint.enable:
            # Refused before launch: an unwritable folder would fail every save of the job.
            folder = RunLayout(run_dir, cfg.checkpoint.folder).checkpoint_root
            problem = folder_write_problem(folder)
            if problem:
                raise ConfigError(
                    f"checkpoint.folder={cfg.checkpoint.folder}: cannot write in {folder} ({problem}): give a writable directory with checkpoint.folder="
                )
        # The training data, before anything is created or launched: a data.path that cannot
        # be trained on is a config error (one line, exit 2), not a failure of every rank.
        started = time.time()
        self._data = prepare_data(cfg.data, cfg.model.vocab_size, cfg.training.seq_len)
        self._data_seconds = round(time.time() - started, 2)
        self.cfg = cfg
        self.layout = RunLayout(run_dir, cfg.checkpoint.folder)
        self.run_dir = self.layout.run_dir
        os.makedirs(self.run_dir, exist_ok=True)
        # The run directory's lock first: a second controller is refused before it touches anything.
        self.controller = Controller(self)
        self.controller.open()
        if not self.controller.attaching:
            # ranks/ holds this job's live report and spec files: a job resumed in the same
            # run directory must not re-read the previous job's reports.
            shutil.rmtree(self.layout.ranks_dir, ignore_errors=True)
            shutil.rmtree(self.layout.control_dir, ignore_errors=True)
        for d in (self.layout.ranks_dir, self.layout.logs_dir, self.layout.control_dir):
            os.makedirs(d, exist_ok=True)
        try:
            self.launcher = launcher or build_launcher(cfg.launcher, self.run_dir)
            problem = self.launcher.adoption_problem() if self.controller.attaching else None
            if problem:
                raise ConfigError(problem)
        except BaseException:
            self.controller.lock.release()  # this process may build another supervisor on the run
            raise
        self.hooks: list[SupervisorHook] = list(hooks or [])
        self.control = JobControl(self)
        self.events = EventLog(self.layout.events, echo=self._echo if echo else None)
        self._metrics = open(self.layout.metrics, "a", buffering=1)
        self.hold_path = self.layout.hold
        # Launches wait at a start gate (see _gate_path): the first launch's, then one per
        # full restart, so every group starts the step loop together.
        self._full_restarts = 0
        self._gate_since = 0.0
        self.groups = [GroupState(i, start_gate=self._gate_path) for i in range(cfg.ft.replica_groups)]
        # The configured host wins unless it is the loopback default and the launcher's ranks
        # cannot reach loopback (ranks on other hosts or in network namespaces).
        host = cfg.ft.lighthouse_host if cfg.ft.lighthouse_host != "127.0.0.1" else self.launcher.control_host()
        self.lighthouse = Lighthouse(cfg.ft, self.layout.lighthouse_log, host=host, guard=(self.run_dir, cfg.controller.lease_s, cfg.controller.heartbeat_s))
        self._lighthouse_outage: Optional[dict] = None
        self.lighthouse_epoch = 0
        self._stop_reason: Optional[str] = None
        self._membership: Optional[tuple[int, ...]] = None
        self._transport_owner: dict[Any, tuple[int, int]] = {}
        # Latest committed step record of each group's rank 0 (for hooks such as chaos).
        self.last_commit: dict[int, dict] = {}
        # The job's committed steps: the Manager's step after the newest commit any group
        # made (or the step the job resumed from). It never goes back except by an explicit,
        # recorded rollback to a disk checkpoint (every group holding it was lost).
        self.ledger = CommitLedger()
        self._floor_written = -1
        self.rollbacks: list[dict] = []
        self.regressions: list[dict] = []
        # Commits of a step redone by a later quorum (controller.ledger.redone_commit): per (step, rank
        # index), quorum id -> (group, state hash); and what was reported once.
        self.steps_redone: list[dict] = []
        self._commit_hashes: dict[tuple[int, int], dict[int, tuple[int, str]]] = {}
        self._redone_seen: set[tuple[int, int]] = set()
        # Recent committed state hashes: step -> {(group, rank): hash} (see consistent_at).
        self.step_hashes: dict[int, dict[tuple[int, int], str]] = {}
        # Silent data corruption (controller.integrity): the replicas' fingerprints compared,
        # blame by vote; the verdicts of this tick; the kept checkpoints read back in the background.
        self.integrity = IntegrityJudge(
            cfg.ft.ranks_per_group,
            auto=integrity_setting(cfg.ft.integrity_every) is None,
            budget=cfg.ft.integrity_budget,
            suspect_vetoes=cfg.ft.suspect_vetoes,
            manifests_comparable=cfg.ft.mode == "hsdp",
        )
        self._integrity_verdicts: list[Verdict] = []
        self._peers_published: Optional[dict] = None
        self.scrub = CheckpointScrub(cfg.checkpoint.scrub_every_s, lambda: [self.checkpoint_dir(g.index) for g in self.groups], self.integrity.vouch)
        self._stall: Optional[dict] = None
        # ft.hang_timeout_s: a fixed number, or None for auto (learned from the step times).
        self._hang_timeout_fixed = hang_timeout_setting(cfg.ft.hang_timeout_s)
        self.step_times = StepTimeLearner()
        # Ranks compute on the CPU (no GPU on this host, or training.device=cpu): see asleep_compute_timeout.
        self._compute_on_cpu = cfg.training.device == "cpu" or (cfg.training.device == "auto" and not gpu_device_nodes())
        self._fatal: Optional[str] = None
        self._last_tick = 0.0
        self._stall_grace_until = 0.0
        self._blind: list[tuple[float, float]] = []  # windows this supervisor was held up
        self.first_step_time: Optional[float] = None
        self._tokens_path = ""
        self._started = 0.0
        self._last_progress_print = 0.0
        self.status = JobStatus.RUNNING
        # Failed saves and loads, quarantined copies, the newest good checkpoint (from the
        # job's events; a controller taking the job over reads the earlier ones back).
        self.ckpt_health = CheckpointHealth.from_events(read_jsonl(self.layout.events)) if self.controller.attaching else CheckpointHealth()
        self._save_failures_printed: set[str] = set()
        # Steps that failed to load in this job (step -> why): never chosen again, whatever
        # their manifest says.
        self._unloadable: dict[int, str] = {f["step"]: f["error"] for f in self.ckpt_health.load_failures if f.get("step") is not None}
        self._recovered = None  # the last recover_checkpoint result (which copy each group loads)
        self._verified: dict = {}  # recent verifications (records.manifest.verify_step_cached)
        # Warm standby groups (monarch_ft.controller.standby_pool); each on a host/device slot after the groups'.
        self.standby = StandbyPool(
            resolve_standby_groups(cfg.ft.standby_groups, self.launcher.traits_for(launcher_options(cfg.launcher)).default_standby_groups, cfg.ft.recovery),
            cfg.ft.replica_groups,
            self.events.emit,
            self._launch_standby,
            first_number=self.layout.next_standby_number(),
        )
        # Warm fork servers (monarch_ft.controller.fork_pool): a relaunch with no standby ready forks its
        # ranks from one instead of starting fresh interpreters.
        self.warm_forks = WarmForks(
            cfg.ft.warm_fork and cfg.ft.recovery != "full_restart",
            self.launcher,
            self.layout.fork_server_log,
            self._rank_env,
            self.run_dir,
            self.events.emit,
            preload=(f"torchtitan.models.{cfg.model.name}",),
        )

    # ---------------------------------------------------------------- console
    def _echo(self, e: dict) -> None:
        quiet = {
            "rank_launched",
            "model_ready",
            "rank_started",
            "checkpoint_sent",
            "rank_finished",
            "recovery_started",
            "checkpoint_save_started",
            "checkpoint_saved",
            # Its error line goes with group_failed (once per failure, not once per rank).
            "rank_error",
        }
        if e["event"] in quiet:
            return
        rel = e["time"] - self._started if self._started else 0.0
        if e["event"] == EventKind.CHECKPOINT_SAVE_FAILED:
            # One line per kind of failure, with the fix; then a count in the progress line.
            if e.get("errno") not in self._save_failures_printed:
                self._save_failures_printed.add(e.get("errno"))
                print(
                    f"[monarch_ft {rel:7.1f}s] checkpoint save failed: group {e.get('group')} step {e.get('step')}: {e.get('error')} at "
                    f"{e.get('path')}; training goes on (the live replicas hold the state), the partial step is removed, older "
                    f"checkpoints are kept and the save is retried every checkpoint.interval; fix: {save_failure_fix(e.get('errno') or '')} "
                    "(further failures are counted in the progress line)",
                    flush=True,
                )
            return
        if e["event"] == EventKind.CHECKPOINT_LOAD_FAILED and e.get("rank") != 0:
            return  # the group's ranks fail alike (a collective load): rank 0's line says it
        fields = " ".join(f"{k}={v}" for k, v in e.items() if k not in ("time", "event") and v is not None)
        print(f"[monarch_ft {rel:7.1f}s] {e['event']} {fields}", flush=True)

    def _print_progress(self, now: float) -> None:
        if now - self._last_progress_print < 2.0:
            return
        self._last_progress_print = now
        parts = []
        for g in self.groups:
            loss = f" loss {g.losses[-1]:.3f}" if g.losses else ""
            parts.append(f"g{g.index}:{g.status} step {max(g.last_step, 0)}/{self.cfg.training.steps}{loss}")
        health = self.ckpt_health
        if health.save_failures or health.load_failures or health.quarantined:
            parts.append(f"checkpoints: {health.describe(now)}")
        print(f"[monarch_ft {now - self._started:7.1f}s] " + " | ".join(parts), flush=True)

    # ---------------------------------------------------------------- control
    def request_stop(self, reason: str) -> None:
        """Safe from a signal handler: the watch loop stops the job on its next tick."""
        self._stop_reason = reason

    def _install_signal_handlers(self) -> list:
        if threading.current_thread() is not threading.main_thread():
            return []
        previous = []
        for sig in (signal.SIGINT, signal.SIGTERM):
            previous.append((sig, signal.getsignal(sig)))
            signal.signal(sig, lambda s, _f: self.request_stop(signal.Signals(s).name))
        # SIGUSR2: detach (the controller exits, the job keeps training; see monarch_ft.controller).
        previous.append((DETACH_SIGNAL, signal.getsignal(DETACH_SIGNAL)))
        signal.signal(DETACH_SIGNAL, lambda _s, _f: self.controller.request_detach())
        return previous

    # ---------------------------------------------------------------- launch
    def _prepare_data(self) -> None:
        data = self._data  # prepared in __init__
        self._tokens_path = data.tokens_path
        self.events.emit(EventKind.DATA_READY, tokens=data.num_tokens, vocab_size=data.vocab_size, seconds=self._data_seconds, path=self.cfg.data.path)

    def _rank_env(self) -> dict[str, str]:
        env = dict(os.environ)
        threads = str(self.cfg.training.threads_per_rank)
        env.update(OMP_NUM_THREADS=threads, MKL_NUM_THREADS=threads, PYTHONUNBUFFERED="1", RUST_BACKTRACE="1")
        return on_python_path(env)

    def _launch(self, g: GroupState, now: float) -> None:
        g.attempt += 1
        if g.attempt > 0 and not g.start_gate:
            # A live relaunch: whether it heals from a peer or loads the disk checkpoint is
            # decided when it is ready to join (_open_launch_gates), not now: the peers alive
            # at launch may all be gone by then.
            g.start_gate = self.layout.launch_gate(g.index, g.attempt)
        g.gate_decided = False
        g.load_failure = None
        g.loading = None if g.load_step is None else (g.load_step, g.load_path or step_dir(self.checkpoint_dir(g.index), g.load_step))
        store_host = self.launcher.group_host(g.index)
        store_port = free_port(store_host)
        path, why = self.warm_forks.path_for(g.index, self.cfg.ft.recovery, self.cfg.ft.warm_fork) if g.attempt > 0 else (None, None)
        launches = []
        for r in range(self.cfg.ft.ranks_per_group):
            spec = self._rank_spec(g.index, r, g.attempt, store_host, store_port)
            spec.update(
                report_path=self.layout.report(g.index, r, g.attempt),
                load_step=g.load_step,
                load_path=g.load_path,
                start_gate=g.start_gate,
                scratch_dir=self.layout.scratch(g.index, r),
            )
            spec_path = self.layout.spec(g.index, r, g.attempt)
            atomic_write_json(spec_path, spec)
            launches.append(
                RankLaunch(
                    group=g.index,
                    rank=r,
                    attempt=g.attempt,
                    argv=worker_argv(sys.executable, spec_path),
                    env=self._rank_env(),
                    log_path=self.layout.log(g.index, r, g.attempt),
                    cwd=self.run_dir,
                )
            )
        procs = None
        if path is RecoveryPath.WARM_FORK:
            try:
                procs = self.warm_forks.launch_group(launches)
            except ForkError as e:
                path, why = RecoveryPath.COLD_START, str(e)
        if procs is None:
            procs = self.launcher.launch_group(launches)
        if path is not None:
            self.events.emit(EventKind.RECOVERY_PATH, group=g.index, attempt=g.attempt, path=path, **({"cold_because": why} if why else {}))
        g.ranks = [RankState(p, ReportTail(self.layout.report(g.index, p.launch.rank, g.attempt)), last_progress=now) for p in procs]
        g.status, g.launched_at, g.train_done = GroupStatus.STARTING, now, False
        self.events.emit(EventKind.GROUP_LAUNCHED, group=g.index, attempt=g.attempt, launcher=self.launcher.name)
        for p in procs:
            self.events.emit(EventKind.RANK_LAUNCHED, group=g.index, rank=p.launch.rank, attempt=g.attempt, pid=p.pid, host=p.launch.host)
        self.controller.save()  # their pids and start times, before anything else can happen

    def _rank_spec(self, group: int, rank: int, attempt: int, store_host: str, store_port: int) -> dict:
        """The part of a rank's spec (rank.trainer.RankSpec) that a group's rank and a standby's share."""
        from omegaconf import OmegaConf

        # Ranks get the JobConfig part only (recipes may extend the config, e.g. drills).
        config = {f.name: OmegaConf.to_container(OmegaConf.structured(getattr(self.cfg, f.name))) for f in dataclasses.fields(JobConfig)}
        return {
            "config": config,
            "group": group,
            "rank": rank,
            "world_size": self.cfg.ft.ranks_per_group,
            "attempt": attempt,
            "store_host": store_host,
            "store_port": store_port,
            "lighthouse_addr": self.lighthouse.address,
            "advertise_host": store_host,
            "run_dir": self.run_dir,
            "report_path": "",
            "hold_path": self.layout.hold,
            "tokens_path": self._tokens_path,
        }

    # ---------------------------------------------------------------- standby groups
    def _launch_standby(self, number: int, slot: int, now: float) -> list[RankState]:
        """Start standby ``number`` on ``slot`` (its own host and device slot), niced below the
        training ranks; its ranks build everything identity-free and wait (monarch_ft.controller.standby_pool)."""
        store_host = self.launcher.group_host(slot)
        store_port = free_port(store_host)
        launches = []
        for r in range(self.cfg.ft.ranks_per_group):
            spec = self._rank_spec(slot, r, 0, store_host, store_port)
            spec.update(report_path=self.layout.standby_report(number, r), promotion_path=self.layout.promotion(number), standby=number)
            spec_path = self.layout.standby_spec(number, r)
            atomic_write_json(spec_path, spec)
            launches.append(
                RankLaunch(
                    group=slot,
                    rank=r,
                    attempt=0,
                    argv=worker_argv(sys.executable, spec_path),
                    env=self._rank_env(),
                    log_path=self.layout.standby_log(number, r),
                    cwd=self.run_dir,
                    # A waiting standby holds no training state: it dies with this controller
                    # (nothing else would ever promote it) and outlives it once promoted.
                    die_with_controller=True,
                    niceness=STANDBY_NICENESS,
                    standby=number,
                )
            )
        procs = self.launcher.launch_group(launches)
        return [RankState(p, ReportTail(self.layout.standby_report(number, p.launch.rank)), last_progress=now) for p in procs]

    def _promote_standby(self, g: GroupState, now: float, charge: bool = True) -> bool:
        """Put a ready standby in failed group ``g``'s place (live recovery); False when none
        is ready or ``g``'s restart budget is spent (the caller then takes the cold path).
        ``charge``: the restart counts against the budget (see _schedule_restart)."""
        if charge and self._restart_backoff(g, now) is None:
            return False
        sb = self.standby.take(now, process_status)
        if sb is None:
            return False
        try:
            decision = self._resume_point("no_live_peer", tuple(self._live_peers(g)), g.index)
        except JobStateLost as e:
            self.standby.standbys.append(sb)  # stopped with the job
            self._lose_job(str(e))
            return True
        if charge:
            self._count_restart(g, now)
        g.attempt += 1
        self.launcher.place_group(g.index, sb.slot)
        promotion = build_promotion(self.layout, sb.number, g.index, g.attempt, len(sb.ranks), self._decision_record(g, decision), now)
        atomic_write_json(self.layout.promotion(sb.number), dataclasses.asdict(promotion))
        g.ranks = [RankState(rs.proc, ReportTail(self.layout.report(g.index, rs.proc.launch.rank, g.attempt)), last_progress=now) for rs in sb.ranks]
        g.status, g.launched_at, g.train_done = GroupStatus.STARTING, now, False
        g.load_step, g.load_path, g.start_gate, g.gate_decided, g.load_failure = None, None, "", True, None
        self.events.emit(EventKind.RESTART_SCHEDULED, group=g.index, restart=g.restarts, backoff_s=0.0, path=RecoveryPath.STANDBY)
        self.events.emit(EventKind.RECOVERY_PATH, group=g.index, attempt=g.attempt, path=RecoveryPath.STANDBY, standby=sb.number)
        self.events.emit(EventKind.STANDBY_PROMOTED, standby=sb.number, group=g.index, attempt=g.attempt, ready_for_s=round(now - (sb.ready_at or now), 3))
        self.events.emit(EventKind.GROUP_LAUNCHED, group=g.index, attempt=g.attempt, launcher=self.launcher.name, standby=sb.number)
        self.events.emit(EventKind.STATE_SOURCE, group=g.index, attempt=g.attempt, source=decision.source.value, step=decision.step, job_step=self.job_step)
        return True

    def _tick_standbys(self, now: float) -> None:
        finishing = all(g.train_done or g.status in (GroupStatus.DONE, GroupStatus.GIVEN_UP) for g in self.groups)
        self.standby.tick(now, self.first_step_time is not None, finishing)

    # ---------------------------------------------------------------- watch
    def _consume_reports(self, g: GroupState, now: float) -> None:
        for rs in g.ranks:
            for rec in rs.tail.read():
                kind = rec.get("type")
                if kind == "step":
                    rs.last_progress, rs.last_step = now, rec["step"]
                    rs.first_step_seen = True
                    self.step_times.observe(rec)
                    if self.first_step_time is None:
                        self.first_step_time = now
                    self._metrics.write(json.dumps(rec) + "\n")
                    if rec.get("committed"):
                        g.last_step = max(g.last_step, rec["step"] + 1)
                        self._record_commit(g, rec)
                    if rec["rank"] == 0 and rec.get("loss") is not None:
                        g.losses.append(rec["loss"])
                    if rec["rank"] == 0 and rec.get("committed"):
                        self.last_commit[g.index] = rec
                    # Fingerprints and gradient votes; verdicts are acted on once per tick (_integrity_tick).
                    self._integrity_verdicts += self.integrity.observe(g.index, rec)
                    if g.status == GroupStatus.STARTING:
                        g.status = GroupStatus.RUNNING
                        self.events.emit(EventKind.GROUP_STEPPING, group=g.index, attempt=g.attempt, step=rec["step"])
                    self._track_membership(rec)
                elif kind == "heartbeat":
                    rs.last_progress = now
                elif kind == "liveness":
                    rs.last_progress = now
                    if (rec.get("phase"), rec.get("phase_since")) != (rs.phase, rs.phase_since):
                        rs.phase, rs.phase_since = rec.get("phase"), rec.get("phase_since")
                        rs.phase_seen = min(now, rec.get("phase_since") or now)
                elif kind == "event":
                    rs.last_progress = now
                    name = rec.pop("event")
                    if name == "train_done":
                        rs.train_done = True
                    if name == "rank_finished":
                        rs.state_hash = rec.get("state_hash")
                        # A group healed while the others held the job open trained no step
                        # of its own at the end, yet holds the weights of every step.
                        g.last_step = max(g.last_step, rec.get("steps_trained", -1))
                    if name == "model_ready":
                        rs.model_ready = True
                        self._transport_owner[rec.get("transport_metadata")] = (rec["group"], rec["rank"])
                        self.integrity.tensor_names(rec["rank"], rec.pop("fingerprint_names", None))
                    if name in ("weights_recovered", "recovery_started", "recovery_failed"):
                        # Name the peer by group: the Manager only knows its address.
                        rec["src_group"], rec["src_rank"] = self._transport_owner.get(rec.get("src"), (None, None))
                    if name == EventKind.CHECKPOINT_LOAD_FAILED and g.load_failure is None:
                        g.load_failure = dict(rec)
                    rec.pop("type", None)
                    if name == EventKind.RANK_ERROR:
                        rs.error = dict(rec)
                    self.ckpt_health.observe(self.events.emit(name, **rec))
        if g.ranks and all(r.train_done for r in g.ranks) and not g.train_done:
            g.train_done = True
            if g.status == GroupStatus.STARTING:
                g.status = GroupStatus.RUNNING

    def _record_commit(self, g: GroupState, rec: dict) -> None:
        """Advance the job's committed step; a commit that went back (controller.ledger.CommitLedger)
        is a regression, named loudly. Ranks refuse such commits (rank.components.ft.CommitFloor):
        this is the second line."""
        step = rec["step"]
        behind = self.ledger.record(step, rec.get("quorum_id") or 0)
        if behind is not None:
            regression = {"group": g.index, "rank": rec["rank"], "attempt": rec["attempt"], "step": step, "job_committed": behind}
            self.regressions.append(regression)
            self.events.emit(EventKind.STEP_REGRESSION, **regression)
        if rec.get("state_hash"):
            self.step_hashes.setdefault(step, {})[(g.index, rec["rank"])] = rec["state_hash"]
            quorum = rec.get("quorum_id") or 0
            other = redone_commit(self._commit_hashes.setdefault((step, rec["rank"]), {}), quorum, g.index, rec["state_hash"])
            this = {"quorum_id": quorum, "group": g.index}
            earlier, later = sorted((this, other), key=lambda c: c["quorum_id"]) if other is not None else (None, None)
            if later is not None and (step, later["quorum_id"]) not in self._redone_seen:
                self._redone_seen.add((step, later["quorum_id"]))
                redo = {"step": step, "group": later["group"], "quorum_id": later["quorum_id"], "earlier": earlier}
                self.steps_redone.append(redo)
                self.events.emit(EventKind.STEP_REDONE, **redo)
            for old in [s for s in self.step_hashes if s < step - 200]:
                del self.step_hashes[old]
            for key in [k for k in self._commit_hashes if k[0] < step - 200]:
                del self._commit_hashes[key]

    def consistent_at(self, groups: set[int], min_step: int) -> Optional[tuple[int, bool]]:
        """(step, equal) for the first step >= ``min_step`` that every rank of ``groups``
        hashed: whether every rank index holds the same state in each of them; None if no
        such step was reported yet."""
        ranks = range(self.cfg.ft.ranks_per_group)
        for step in sorted(s for s in self.step_hashes if s >= min_step):
            seen = self.step_hashes[step]
            if all((grp, r) in seen for grp in groups for r in ranks):
                return step, all(len({seen[(grp, r)] for grp in groups}) == 1 for r in ranks)
        return None

    # ---------------------------------------------------------------- silent data corruption (controller.integrity)
    def _integrity_tick(self, now: float) -> None:
        """Act on the integrity verdicts of this tick, through the ordinary recovery paths; write
        auto's interval and the transport peers for the ranks; quarantine what the scrub found."""
        verdicts, self._integrity_verdicts = self._integrity_verdicts, []
        for v in verdicts:
            if isinstance(v, Corrupt):
                self._integrity_corrupt(v, now)
            elif isinstance(v, Diverged):
                self._integrity_diverged(v, now)
            elif isinstance(v, Suspect):
                g = self.groups[v.group]
                if g.attempt == v.attempt and g.active:
                    self.events.emit(EventKind.GROUP_SUSPECT, group=v.group, attempt=v.attempt, step=v.step, vetoes=v.vetoes)
                    self.integrity.condemn({v.group: v.attempt})
                    self._fail_group(g, now, reason="suspect", step=v.step, vetoes=v.vetoes)
        decided = self.integrity.interval()
        if decided is not None:
            every, why, cost = decided
            atomic_write(self.layout.integrity_every, str(every))
            self.events.emit(EventKind.INTEGRITY_INTERVAL, every=every, cost_per_step=round(cost, 5), why=why)
        for found in self.scrub.results():
            if found["damaged"]:
                self.events.emit(EventKind.CHECKPOINT_SCRUBBED, steps=found["steps"], seconds=found["seconds"], damaged=len(found["damaged"]))
            for d in found["damaged"]:
                group = next((g.index for g in self.groups if self.checkpoint_dir(g.index) == d["folder"]), None)
                if group is not None and os.path.isdir(step_dir(d["folder"], d["step"])):
                    self._quarantine_copy(group, d["step"], d["problem"], "the checkpoint scrub")
        self._publish_transport_peers()

    def _integrity_corrupt(self, v: Corrupt, now: float) -> None:
        """A minority of replicas disagreed with the majority: each is failed (it heals from a
        majority peer through the normal recovery path), its checkpoints since it last agreed
        set aside."""
        for group, attempt in sorted(v.blamed.items()):
            g = self.groups[group]
            if g.attempt != attempt or not g.active:
                continue
            why = f"saved after group {group} last agreed with its peers (step {v.trusted[group]})"
            # Before the failure too: a full restart (ft.recovery=full_restart) chooses its step in it.
            self._quarantine_newer(group, v.trusted[group], why)
            self.events.emit(
                EventKind.SDC_DETECTED,
                group=group,
                attempt=attempt,
                step=v.record_step,
                state_step=v.step,
                after_veto=v.vetoed,
                ranks=list(v.ranks[group]),
                tensors=list(v.tensors[group]),
                majority=list(v.majority),
                trusted_step=v.trusted[group],
                action="fail_group",
            )
            self._fail_group(g, now, reason="corrupt", step=v.record_step, tensors=list(v.tensors[group]))
            self._quarantine_newer(group, v.trusted[group], why)  # a save that finished meanwhile

    def _integrity_diverged(self, v: Diverged, now: float) -> None:
        """No majority: nobody holds a state known good but the one they last agreed on; roll
        the job back to the newest checkpoint at or before it and set aside every newer one."""
        if any(self.groups[g].attempt != a for g, a in v.attempts.items()):
            return  # already relaunched since (an earlier verdict)
        self.events.emit(
            EventKind.SDC_DETECTED,
            groups=list(v.groups),
            step=v.record_step,
            state_step=v.step,
            after_veto=v.vetoed,
            tensors=list(v.tensors),
            trusted_step=v.trusted_step,
            action="rollback",
        )
        self.integrity.rolled_back(v.trusted_step, dict(v.attempts))
        self._full_restart(None, now, reason=INTEGRITY_ROLLBACK, at_most=v.trusted_step)
        for g in self.groups:
            self._quarantine_newer(g.index, v.trusted_step, f"saved after the replicas last agreed (step {v.trusted_step})")

    def _quarantine_newer(self, group: int, step: int, why: str) -> None:
        """Set aside the group's complete checkpoints newer than ``step``: they may hold corrupt state."""
        folder = self.checkpoint_dir(group)
        for s in sorted(complete_steps(folder)):
            if s > step:
                self._quarantine_copy(group, s, why, "the integrity check")

    def _quarantine_copy(self, group: int, step: int, problem: str, by: str) -> None:
        moved, failed = None, None
        try:
            moved = quarantine_step(step_dir(self.checkpoint_dir(group), step), problem, by=by)
        except OSError as e:
            failed = str(e)
        self._record_quarantine(group, step, moved, problem, failed)

    def _publish_transport_peers(self) -> None:
        """Where each stepping group's ranks serve their state (RunLayout.transport_peers), when it changed."""
        newest: dict[tuple[int, int], str] = {}
        for metadata, owner in self._transport_owner.items():
            if metadata:
                newest[owner] = metadata
        peers = {
            str(g.index): {str(r): newest[(g.index, r)] for r in range(self.cfg.ft.ranks_per_group) if (g.index, r) in newest}
            for g in self.groups
            if g.status == GroupStatus.RUNNING
        }
        if peers != self._peers_published:
            atomic_write_json(self.layout.transport_peers, peers)
            self._peers_published = peers

    @property
    def job_step(self) -> int:
        return self.ledger.job_step

    def _write_floor(self, force: bool = False) -> None:
        """Tell the ranks the job's committed step (control/commit_floor) when it changed."""
        if force or self.job_step != self._floor_written:
            atomic_write(self.layout.commit_floor, str(self.job_step))
            self._floor_written = self.job_step

    def _track_membership(self, rec: dict) -> None:
        members = tuple(rec.get("participating_groups") or ())
        if rec["rank"] != 0 or not rec.get("committed") or members == self._membership:
            return
        self._membership = members
        self.events.emit(
            EventKind.QUORUM_CHANGE,
            participating_groups=list(members),
            quorum_size=rec.get("quorum_size"),
            quorum_id=rec.get("quorum_id"),
            step=rec["step"],
            seen_by=rec["group"],
        )

    def _check_group(self, g: GroupState, now: float) -> Optional[Hang]:
        """A rank that exited non-zero fails its group at once; a silent one is returned
        as a hang verdict for _judge_hangs, which looks at every group's before acting."""
        failure: Optional[dict] = None
        for rs in g.ranks:
            if rs.exited is None:
                code = rs.proc.poll()
                if code is not None:
                    rs.exited = code
                    self.events.emit(EventKind.RANK_EXITED, group=g.index, rank=rs.proc.launch.rank, attempt=g.attempt, **describe_exit(code))
                    if code != 0 and failure is None:
                        failure = {"reason": "exit", "rank": rs.proc.launch.rank, **describe_exit(code)}
        if failure is not None:
            # A rank writes its error (rank_error) before it exits: read it now, not next tick.
            self._consume_reports(g, now)
            error = self._group_error(g)
            details = {**failure, **({"error": error["error"], "error_rank": error["rank"]} if error else {})}
            if failure.get("exit_code") == RankExit.CHECKPOINT_LOAD_FAILED and self._checkpoint_unloadable(g):
                # The checkpoint failed, not the group: its relaunch (at the next older step,
                # or healed by a peer) does not count against its restart budget.
                self._fail_group(g, now, charge=False, **details)
            else:
                self._fail_group(g, now, **details)
            return None
        if g.ranks and all(r.exited == 0 for r in g.ranks):
            g.status = GroupStatus.DONE
            self.events.emit(EventKind.GROUP_FINISHED, group=g.index, attempt=g.attempt, step=g.last_step)
            return None
        live = [rs for rs in g.ranks if rs.exited is None]
        started = all(r.first_step_seen or r.train_done for r in g.ranks)

        # Every tick: a state held for ft.os_stall_s needs every sample in between to see it.
        for rs in live:
            state, cpu_s = process_sample(rs.proc.pid)
            rs.os_sample = track_os_state(rs.os_sample, state, now, self.cfg.ft.os_stall_s)
            rs.cpu_sample = track_cpu(rs.cpu_sample, cpu_s, now)
        views = [
            RankView(
                rank=rs.proc.launch.rank,
                silent_s=self._watched(rs.last_progress, now),
                started=started,
                phase=rs.phase,
                phase_s=self._watched(rs.phase_seen, now) if rs.phase else 0.0,
                os_state=rs.os_sample.state,
                os_state_s=rs.os_sample.held_s,
                finished=rs.train_done,
                asleep_s=rs.cpu_sample.asleep_s if rs.cpu_sample else None,
            )
            for rs in live
        ]
        limits = self._hang_limits
        # A rank of this group silent and asleep is frozen by itself only while ranks elsewhere beat.
        others_beating = any(
            self._watched(rs.last_progress, now) < limits.suspect_silence_s
            for o in self.groups
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
        return auto_hang_timeout(list(self.step_times.samples), ft.hang_min_s, ft.hang_step_factor, fallback_s=15.0)

    @property
    def _hang_limits(self) -> HangLimits:
        ft = self.cfg.ft
        return HangLimits(
            self.hang_timeout_s,
            ft.startup_timeout_s,
            self.cfg.checkpoint.save_timeout_s,
            ft.quorum_timeout_s + 2 * ft.timeout_s,
            os_stall_s=ft.os_stall_s,
            asleep_s=ft.asleep_s,
            asleep_compute_s=asleep_compute_timeout(self.step_times.p99(), ft.asleep_s, self._compute_on_cpu),
        )

    def _judge_hangs(self, hangs: dict[int, Hang], now: float) -> None:
        """Act on this tick's hang verdicts, all groups together.

        - Every stepping group silent and none stuck by itself: one job-wide stall. Capture
          every rank's stacks and wait ``ft.stall_timeout_s``; if it does not clear, resume
          the whole job from the newest checkpoint. The detector never kills the groups that
          hold the job's state one by one.
        - Some culprit stuck by itself (stopped, zombie, ...): fail only those groups; the
          others are most likely blocked on them and step again once they are gone.
        - Otherwise fail each hung group (stacks captured first).
        """
        stepping = [g.index for g in self.groups if g.status == GroupStatus.RUNNING]
        stalled = is_job_stall(hangs, stepping)
        if self._stall is not None and not stalled:
            # Groups come out of a shared stall a beat apart (phases are reported once a
            # second): the rest get one more hang timeout before they count as hung alone.
            self.events.emit(EventKind.JOB_STALL_CLEARED, lasted_s=round(now - self._stall["since"], 2))
            self._stall = None
            self._stall_grace_until = now + self.hang_timeout_s
        if now < self._stall_grace_until:
            hangs = {i: h for i, h in hangs.items() if h.self_explained}
        if not hangs:
            return
        if stalled:
            if self._stall is None:
                self._stall = {"since": now}
                stacks = self._capture_stacks([self.groups[i] for i in sorted(hangs)], "stall")
                self.events.emit(
                    EventKind.JOB_STALL,
                    groups=sorted(hangs),
                    hangs={str(i): dataclasses.asdict(h) for i, h in hangs.items()},
                    stacks=stacks,
                    escalate_after_s=self.cfg.ft.stall_timeout_s,
                )
            elif now - self._stall["since"] > self.cfg.ft.stall_timeout_s:
                self.events.emit(EventKind.JOB_STALL_ESCALATED, groups=sorted(hangs), lasted_s=round(now - self._stall["since"], 2))
                self._stall = None
                self._full_restart(None, now, reason="job_stall")
            return
        explained = {i: h for i, h in hangs.items() if h.self_explained}
        for i, h in sorted((explained or hangs).items()):
            g = self.groups[i]
            t0 = time.time()
            # The hung rank's and its group peers' stacks, before the group is killed.
            stacks = self._capture_stacks([g], f"hang-g{i}")
            self._fail_group(
                g,
                now,
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

    def capture_stacks(self, groups: Optional[list[int]] = None, tag: str = "on-demand") -> dict[str, str]:
        """Every live rank's Python stacks (of ``groups``, default all), written under the run's
        ``stacks/`` folder now; label (``g0r1``) -> file. What hangs and stalls call, and what
        a hook or an operator may call at any time."""
        chosen = [g for g in self.groups if groups is None or g.index in groups]
        return self._capture_stacks(chosen, tag)

    def _capture_stacks(self, groups: list[GroupState], tag: str) -> dict[str, str]:
        """Every live rank's Python stacks (py-spy), into stacks/<tag>-<ms>/; label -> file."""
        pids = {f"g{g.index}r{rs.proc.launch.rank}": rs.proc.pid for g in groups for rs in g.ranks if rs.exited is None and rs.proc.pid}
        logs = {f"g{g.index}r{rs.proc.launch.rank}": self.layout.log(g.index, rs.proc.launch.rank, g.attempt) for g in groups for rs in g.ranks}
        return capture_stacks(pids, self.layout.stacks_capture(tag, time.time()), logs=logs)

    @staticmethod
    def _group_error(g: GroupState) -> Optional[dict]:
        """The earliest error a rank of ``g``'s current attempt reported (the others often
        fail because of that one), or None."""
        errors = [rs.error for rs in g.ranks if rs.error]
        return min(errors, key=lambda e: e.get("time") or 0.0) if errors else None

    def _fail_group(self, g: GroupState, now: float, charge: bool = True, **why: Any) -> None:
        self.events.emit(EventKind.GROUP_FAILED, group=g.index, attempt=g.attempt, **why)
        self._stop_ranks(g, graceful=False)
        self.events.emit(EventKind.GROUP_STOPPED, group=g.index, attempt=g.attempt)
        error = self._group_error(g)
        g.last_error = {k: error.get(k) for k in ("error", "error_type", "frame", "rank", "attempt")} if error else None
        # A crash loop (the same failure at start-up, twice in a row) is given up whatever the
        # budget and the recovery mode: no relaunch, standby or full restart can get past it.
        stepped = any(rs.first_step_seen or rs.train_done for rs in g.ranks)
        previous, g.startup_failure = g.startup_failure, startup_failure(stepped, [rs.error for rs in g.ranks if rs.error])
        if crash_loop(previous, g.startup_failure):
            self._give_up_crash_loop(g)
            return
        if self.cfg.ft.recovery == "full_restart":
            self._full_restart(g, now, charge=charge)
            return
        if self._promote_standby(g, now, charge):
            return
        if self._state_lost_now(g):
            return
        self._schedule_restart(g, now, charge=charge)

    def _restart_backoff(self, g: GroupState, now: float) -> Optional[float]:
        """Seconds before ``g``'s relaunch, from its relaunches within ``ft.restart_window_s``;
        None: ``ft.max_restarts`` of them already (the budget is a rate: controller.budget.recent_restarts)."""
        ft = self.cfg.ft
        return restart_backoff(recent_restarts(g.restart_times, now, ft.restart_window_s), ft.max_restarts, ft.restart_backoff_s, ft.restart_backoff_max_s)

    def _count_restart(self, g: GroupState, now: float) -> None:
        g.restarts += 1
        # Only the window's relaunches matter: controller.json stays small over a long job.
        g.restart_times = [t for t in g.restart_times if now - t < self.cfg.ft.restart_window_s] + [now]

    def _give_up_budget(self, g: GroupState, now: float) -> None:
        ft = self.cfg.ft
        g.status, g.gave_up = GroupStatus.GIVEN_UP, GiveUpReason.RESTART_BUDGET
        self.events.emit(
            EventKind.RESTART_BUDGET_EXHAUSTED,
            group=g.index,
            restarts=g.restarts,
            recent_restarts=recent_restarts(g.restart_times, now, ft.restart_window_s),
            max_restarts=ft.max_restarts,
            restart_window_s=ft.restart_window_s,
            last_error=g.last_error["error"] if g.last_error else None,
        )

    def _give_up_crash_loop(self, g: GroupState) -> None:
        """Stop relaunching ``g``: its last two launches failed the same way at start-up.
        One console line per distinct failure, with the ranks' own error line: a second group
        failing the same way is named by its event, not by the same line again."""
        failure = g.startup_failure or {}
        g.status, g.gave_up = GroupStatus.GIVEN_UP, GiveUpReason.CRASH_LOOP
        first = next((o.index for o in self.groups if o is not g and o.gave_up == GiveUpReason.CRASH_LOOP and crash_loop(o.startup_failure, failure)), None)
        log_path = self.layout.log(g.index, failure.get("rank") or 0, failure.get("attempt", g.attempt))
        self.events.emit(
            EventKind.CRASH_LOOP,
            group=g.index,
            attempt=g.attempt,
            failures=2,
            error_type=failure.get("error_type"),
            frame=failure.get("frame"),
            same_as_group=first,
            log=log_path,
        )
        if first is None:
            print(f"monarch_ft: error: {crash_loop_line(g.index, failure, log_path)}", file=sys.stderr, flush=True)

    def _state_lost_now(self, g: GroupState) -> bool:
        """With no live peer left, the job's state is on disk only: check now that an intact
        checkpoint is left, rather than after a relaunch has built its model (tens of seconds
        for nothing, per group). True when none is: the job stops (_lose_job), naming each
        step tried. The relaunch's own decision at its gate reuses this verification."""
        if not needs_disk(tuple(self._live_peers(g)), self.job_step):
            return False
        try:
            step = self._recover_checkpoint(at_most=self.job_step) if self.cfg.checkpoint.enable else None
            decide_state_source((), self.job_step, step, tried=self._tried())
        except JobStateLost as e:
            self._lose_job(str(e))
            return True
        return False

    def _schedule_restart(
        self, g: GroupState, now: float, load_step: Optional[int] = None, start_gate: str = "", charge: bool = True, load_path: Optional[str] = None
    ) -> None:
        """Relaunch ``g`` after a backoff, within its restart budget. ``charge=False``: a
        relaunch that is not the group's fault (a checkpoint that failed to load, quarantined:
        the next attempt tries another step) neither counts nor backs off further."""
        if charge:
            backoff = self._restart_backoff(g, now)
            if backoff is None:
                self._give_up_budget(g, now)
                return
            self._count_restart(g, now)
        else:
            backoff = self.cfg.ft.restart_backoff_s
        g.status, g.next_launch, g.load_step, g.load_path, g.start_gate = GroupStatus.WAITING, now + backoff, load_step, load_path, start_gate
        self.events.emit(EventKind.RESTART_SCHEDULED, group=g.index, restart=g.restarts, backoff_s=round(backoff, 3), **({} if charge else {"counted": False}))

    def _full_restart(self, failed: Optional[GroupState], now: float, reason: str = "full_restart", charge: bool = True, at_most: Optional[int] = None) -> None:
        """The whole job stops and resumes from one disk checkpoint.

        The baseline policy (``ft.recovery=full_restart``) on every fault, and the escalation
        of a job-wide stall. Every group loads the same step (the newest complete one any
        group wrote; a group without it gets a copy, as from shared storage) and waits at a
        fresh start gate, so the job comes back as one quorum instead of groups healing from
        each other. ``at_most``: no checkpoint newer than this step (the replicas' state after
        it is not trusted: controller.integrity.Diverged).
        """
        for g in self.groups:
            if g is not failed and g.active:
                self._stop_ranks(g, graceful=False)
                # Stopped, not failed: its next start-up failure is not a second one in a row.
                g.startup_failure = None
                self.events.emit(EventKind.GROUP_STOPPED, group=g.index, attempt=g.attempt, reason=reason)
        restarting = [g for g in self.groups if g.status != GroupStatus.GIVEN_UP and (g is failed or g.status != GroupStatus.DONE)]
        try:
            step = self._resume_point(reason, at_most=at_most).step
        except JobStateLost as e:
            self._lose_job(str(e))
            return
        self._full_restarts += 1
        self._gate_since = now
        self.events.emit(EventKind.FULL_RESTART, failed_group=failed.index if failed else None, resume_step=step, reason=reason)
        for g in restarting:
            self._schedule_restart(g, now, load_step=step, start_gate=self._gate_path, charge=charge, load_path=self._load_path(g.index, step))

    def _live_peers(self, g: GroupState) -> list[int]:
        """Groups other than ``g`` that are stepping in the job (they hold its state)."""
        return [o.index for o in self.groups if o is not g and o.status == GroupStatus.RUNNING]

    def _resume_point(self, reason: str, live_peers: tuple[int, ...] = (), group: Optional[int] = None, at_most: Optional[int] = None):
        """Decide where the job's state comes from now; for a disk checkpoint, the newest
        intact one (verified, damaged copies quarantined, copied into every group's folder:
        _recover_checkpoint), and record the rollback. Returns the StateDecision; raises
        JobStateLost, naming every step tried when none was intact. ``at_most``: see _full_restart."""
        ckpt = None
        if self.cfg.checkpoint.enable and needs_disk(live_peers, self.job_step):
            ckpt = self._recover_checkpoint(at_most=self.job_step if at_most is None else min(at_most, self.job_step))
        decision = decide_state_source(live_peers, self.job_step, ckpt, tried=self._tried())
        if decision.source is StateSource.DISK:
            if decision.steps_lost:
                rollback = {"from_step": self.job_step, "to_step": decision.step, "steps_lost": decision.steps_lost, "reason": reason, "group": group}
                self.rollbacks.append(rollback)
                self.events.emit(EventKind.JOB_ROLLBACK, **rollback)
            self.ledger.rollback(decision.step)
            self._write_floor(force=True)
        return decision

    def _resume_job(self) -> None:
        """checkpoint.resume: every group loads the newest intact step any group saved
        (copied where missing), and the job's committed step starts there. Checkpoints on
        disk of which none is intact stop the job (one line naming each), rather than
        training again from the initial weights."""
        step = self._recover_checkpoint(at_most=None) if self.cfg.checkpoint.enable else None
        if step is None and self.ckpt_health.quarantined:
            self._lose_job(
                f"checkpoint.resume=true and no intact disk checkpoint is left: {'; '.join(self._tried())}; each was moved to its "
                "group folder's quarantine/ (nothing deleted; python -m monarch_ft verify RUN_DIR checks what is on disk)"
            )
            return
        for g in self.groups:
            g.load_step, g.load_path = step, self._load_path(g.index, step)
        if step is not None:
            self.ledger.rollback(step)
        self.events.emit(EventKind.JOB_RESUMED, step=step)

    def _recover_checkpoint(self, at_most: Optional[int]) -> Optional[int]:
        """The newest intact checkpoint step (not after ``at_most``), made loadable by every
        group (controller.checkpoints.recover_checkpoint): each damaged copy met on the way is
        quarantined and named in an event, and a copy that cannot be made (a full disk)
        points that group at the intact copy instead. Runs on the recovery path only: it
        reads every byte of the copies it checks."""
        folders = {self.checkpoint_dir(g.index): g.index for g in self.groups}
        rec = recover_checkpoint(list(folders), at_most=at_most, exclude=set(self._unloadable), verified=self._verified, vouch=self.integrity.vouch)
        for q in rec.quarantined:
            self._record_quarantine(folders[q["folder"]], q["step"], q["path"], q["problem"], q.get("error"))
        for c in rec.copy_failures:
            self.events.emit(EventKind.CHECKPOINT_COPY_FAILED, group=folders[c["folder"]], step=c["step"], source=c["source"], error=c["error"])
        self._recovered = rec
        return rec.step

    def _load_path(self, group: int, step: Optional[int]) -> Optional[str]:
        """The step directory ``group`` loads ``step`` from: the copy the last recovery made
        loadable for it (its own, or an intact one elsewhere); None: its own folder's."""
        rec = self._recovered
        if step is None or rec is None or rec.step != step:
            return None
        return rec.paths.get(self.checkpoint_dir(group))

    def _decision_record(self, g: GroupState, decision) -> dict:
        """A StateDecision as a group's gate (or promotion) carries it, with the copy to load."""
        record = {"source": decision.source.value, "step": decision.step}
        if decision.source is StateSource.DISK:
            path = self._load_path(g.index, decision.step) or step_dir(self.checkpoint_dir(g.index), decision.step)
            record["path"] = path
            g.loading, g.load_failure = (decision.step, path), None
        return record

    def _record_quarantine(self, group: int, step: int, path: Optional[str], problem: str, error: Optional[str] = None) -> None:
        entry = {"group": group, "step": step, "path": path, "problem": problem}
        if error:
            entry["quarantine_error"] = error  # it could not be moved aside: excluded all the same
        self.ckpt_health.observe(self.events.emit(EventKind.CHECKPOINT_QUARANTINED, **entry))

    def _tried(self) -> list[str]:
        """Every checkpoint step this job found damaged or could not load, newest first, each
        with why, per group: ``step 150 (group 0: ...; group 1: ...)``."""
        by_step: dict[int, list[str]] = {}
        for q in self.ckpt_health.quarantined:
            by_step.setdefault(q["step"], []).append(f"group {q['group']}: {q['problem']}")
        return [f"step {step} ({'; '.join(why)})" for step, why in sorted(by_step.items(), reverse=True)]

    def _checkpoint_unloadable(self, g: GroupState) -> bool:
        """``g``'s ranks could not load the checkpoint they were told to (RankExit.
        CHECKPOINT_LOAD_FAILED): quarantine that copy and never choose that step again in this
        job (the bytes matched their manifest when chosen, so any copy of it would likely fail
        alike). False when the step is not known (then it is an ordinary failure)."""
        report = g.load_failure or {}
        step = report.get("step", g.loading[0] if g.loading else None)
        path = report.get("path") or (g.loading[1] if g.loading else None)
        if step is None:
            return False
        error = report.get("error") or "the load raised (see the rank logs)"
        self._unloadable[int(step)] = error
        owner = next((o.index for o in self.groups if path and os.path.dirname(os.path.normpath(path)) == self.checkpoint_dir(o.index)), g.index)
        moved, failed = None, None
        if path and os.path.isdir(path):
            try:
                moved = quarantine_step(path, f"failed to load: {error}", by=f"a load by group {g.index} (attempt {g.attempt})")
            except OSError as e:
                failed = str(e)
        self._record_quarantine(owner, int(step), moved, f"failed to load: {error}", failed)
        return True

    def _open_launch_gates(self) -> None:
        """Tell each live-relaunched group, once all its ranks are ready, where its state comes
        from: a live peer (it heals through TorchFT when it joins the quorum), or, with no
        group left holding the job's state, the newest disk checkpoint (never its initial
        weights once the job has committed steps)."""
        for g in self.groups:
            if g.status != GroupStatus.STARTING or g.gate_decided or g.start_gate != self.layout.launch_gate(g.index, g.attempt):
                continue
            if not (g.ranks and all(r.model_ready for r in g.ranks)):
                continue
            try:
                decision = self._resume_point("no_live_peer", tuple(self._live_peers(g)), g.index)
            except JobStateLost as e:
                self._lose_job(str(e))
                return
            atomic_write_json(g.start_gate, self._decision_record(g, decision))
            g.gate_decided = True
            self.events.emit(EventKind.STATE_SOURCE, group=g.index, attempt=g.attempt, source=decision.source.value, step=decision.step, job_step=self.job_step)

    def _lose_job(self, message: str) -> None:
        """The job's state is gone (no live group, no checkpoint): stop with one clear line."""
        self._fatal = message
        self.events.emit(EventKind.JOB_STATE_LOST, job_step=self.job_step, message=message)
        print(f"monarch_ft: error: {message}", file=sys.stderr, flush=True)

    def finish_at(self, step: int) -> None:
        """Ask every group to finish training at ``step`` (before training.steps)."""
        request_finish(self.run_dir, step)
        self.events.emit(EventKind.FINISH_REQUESTED, step=step)

    def scratch_dir(self, group: int) -> str:
        """A group's host-local files (scratch space); a node fault deletes them."""
        return self.layout.scratch(group)

    def checkpoint_dir(self, group: int) -> str:
        return self.layout.checkpoint(group)

    def _stop_ranks(self, g: GroupState, graceful: bool) -> None:
        if graceful:
            for rs in g.ranks:
                if rs.exited is None:
                    rs.proc.send_signal(signal.SIGTERM)
            deadline = time.time() + 5.0
            for rs in g.ranks:
                if rs.exited is None:
                    rs.exited = rs.proc.wait(max(0.0, deadline - time.time()))
        # Every rank signalled before any is waited for: the kernel tears them down together
        # (a rank's exit frees its whole address space: tenths of a second on a loaded machine).
        doomed = [rs for rs in g.ranks if rs.exited is None or rs.proc.poll() is None]
        for rs in doomed:
            rs.proc.kill()  # SIGKILL also ends a SIGSTOPped rank
        for rs in doomed:
            rs.exited = rs.proc.wait(10.0)

    @property
    def _gate_path(self) -> str:
        """The shared gate the current generation of launches waits at."""
        return self.layout.start_gate(self._full_restarts)

    def _open_start_gate(self, now: float) -> None:
        """Let the groups at the current gate train once all of them have built their model
        and loaded their state (or once they waited long enough)."""
        if os.path.exists(self._gate_path):
            return
        waiting = [g for g in self.groups if g.start_gate == self._gate_path and g.status not in (GroupStatus.DONE, GroupStatus.GIVEN_UP)]
        ready = all(g.active and all(r.model_ready for r in g.ranks) for g in waiting)
        if start_gate_opens(ready, now - self._gate_since, self.cfg.ft.startup_timeout_s):
            open(self._gate_path, "w").close()
            self.events.emit(EventKind.TRAINING_STARTED, all_groups_ready=ready, full_restarts=self._full_restarts)

    def _update_hold(self) -> None:
        """Groups that finished wait (serving quorums) while any other group still has work."""
        pending = [g for g in self.groups if g.status not in (GroupStatus.DONE, GroupStatus.GIVEN_UP) and not g.train_done]
        if pending and not os.path.exists(self.hold_path):
            open(self.hold_path, "w").close()
        elif not pending and os.path.exists(self.hold_path):
            os.remove(self.hold_path)

    # ---------------------------------------------------------------- run
    def run(self) -> int:
        # ps/top/py-spy show which run this process controls (monarch_ft.common.proctitle).
        with proctitle.titled(self.run_dir, proctitle.CONTROLLER):
            return self._run()

    def _run(self) -> int:
        previous = self._install_signal_handlers()
        self._started = self._gate_since = time.time()
        exit_code = 1
        try:
            if self.controller.attaching:
                self._take_over(time.time())
                return self._watch()
            self.controller.start_heartbeat()
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
            self._prepare_data()
            if self.cfg.checkpoint.resume:
                self._resume_job()
            open(self.hold_path, "w").close()
            self._write_floor()
            exit_code = self._watch()
        except BaseException as e:
            self.status = JobStatus.FAILED
            self.events.emit(EventKind.SUPERVISOR_ERROR, error=f"{type(e).__name__}: {e}"[:500])
            raise
        finally:
            self._shutdown()
            for sig, handler in previous:
                signal.signal(sig, handler)
        return exit_code

    def _account_own_stall(self, now: float) -> None:
        """Record a window in which this supervisor itself was held up (see _watched)."""
        gap = now - self._last_tick if self._last_tick else 0.0
        if gap > SUPERVISOR_STALL_S:
            self._blind.append((self._last_tick, now))
            del self._blind[:-100]
            self.events.emit(EventKind.SUPERVISOR_STALLED, seconds=round(gap, 3))
        self._last_tick = now

    def _watched(self, since: float, now: float) -> float:
        """Seconds of [since, now] during which this supervisor was watching.

        Silence and phase time count only then. If the supervisor's own loop was held up
        (no CPU, or a filesystem that blocked its reads and writes, as it blocks the ranks'
        report writes and checkpoint saves), every rank would otherwise look silent for that
        long at once and be killed on waking; a soak lost its whole job that way.
        """
        blind = sum(max(0.0, min(end, now) - max(start, since)) for start, end in self._blind)
        return max(0.0, now - since - blind)

    def _watch(self) -> int:
        while True:
            now = time.time()
            self._account_own_stall(now)
            if self._stop_reason:
                self.status = JobStatus.INTERRUPTED
                self.events.emit(EventKind.SUPERVISOR_STOP_REQUESTED, reason=self._stop_reason)
                return 130 if self._stop_reason == "SIGINT" else 143
            if self._fatal:
                self.status = JobStatus.FAILED
                return 1
            if self.controller.detach_requested and self.controller.can_detach():
                self.status = JobStatus.DETACHED
                return DETACHED_EXIT
            if not self.lighthouse.alive():
                self._restart_lighthouse(now)
            for g in self.groups:
                if g.status == GroupStatus.WAITING and now >= g.next_launch:
                    self._launch(g, now)
            self._tick_standbys(now)
            self.warm_forks.tick(g.index for g in self.groups if g.status not in (GroupStatus.DONE, GroupStatus.GIVEN_UP))
            hangs: dict[int, Hang] = {}
            for g in self.groups:
                if g.active:
                    self._consume_reports(g, now)
            for g in self.groups:
                if g.active:
                    hang = self._check_group(g, now)
                    if hang is not None:
                        hangs[g.index] = hang
            self._judge_hangs(hangs, now)
            self._integrity_tick(now)
            self._write_floor()
            self._lighthouse_recovered()
            self._open_launch_gates()
            self._open_start_gate(now)
            self._update_hold()
            for hook in self.hooks:
                hook.tick(self.control, now)
            self.controller.tick(now)
            if all(g.status in (GroupStatus.DONE, GroupStatus.GIVEN_UP) for g in self.groups):
                self.status = job_outcome([g.status for g in self.groups], bool(self.regressions))
                return 0 if self.status == JobStatus.COMPLETED else 1
            self._print_progress(now)
            time.sleep(0.05)

    def _restart_lighthouse(self, now: float) -> None:
        """The Lighthouse died: start it again on the same address. The ranks' Managers
        keep their groups meanwhile (their quorum calls fail and are retried; see docs/design/lighthouse.md,
        "The job outlives its controller"); lighthouse_recovered records the survivors'
        stall, from the last commit before the loss to the first one after it."""
        last = max((r["time"] for r in self.last_commit.values()), default=None)
        self.events.emit(EventKind.LIGHTHOUSE_LOST, pid=self.lighthouse.pid, address=self.lighthouse.address, **describe_exit(self.lighthouse.exit_code))
        # The ranks' quorum ids move to a new range before the new Lighthouse answers their
        # retried quorums (rank.components.lighthouse_epoch).
        self.lighthouse_epoch += 1
        atomic_write(self.layout.lighthouse_epoch, str(self.lighthouse_epoch))
        address = self.lighthouse.restart()
        self.events.emit(EventKind.LIGHTHOUSE_RESTARTED, address=address, pid=self.lighthouse.pid, down_s=round(time.time() - now, 3))
        self._lighthouse_outage = {"lost": now, "last_commit": last, "job_step": self.job_step}

    def _lighthouse_recovered(self) -> None:
        outage = self._lighthouse_outage
        if outage is None:
            return
        after = [r["time"] for r in self.last_commit.values() if r["time"] > outage["lost"]]
        if after:
            first = min(after)
            self.events.emit(
                EventKind.LIGHTHOUSE_RECOVERED,
                stall_s=round(first - (outage["last_commit"] or outage["lost"]), 3),
                job_step_before=outage["job_step"],
                job_step=self.job_step,
            )
            self._lighthouse_outage = None

    # ---------------------------------------------------------------- takeover (monarch_ft.controller.takeover)
    def takeover_record(self) -> dict[str, Any]:
        """The job-wide state a new controller needs, for ``controller.json`` (beside each
        group's, which :class:`~monarch_ft.controller.takeover.Controller` records itself)."""
        lh = self.lighthouse
        return {
            "status": self.status,
            "config": dataclasses.asdict(self.cfg),
            "run_dir": self.run_dir,
            "started": self._started,
            "tokens_path": self._tokens_path,
            "lighthouse": {"address": lh.address, "epoch": self.lighthouse_epoch, **lh.identity()},
            "launcher": self.launcher.describe(),
            "launcher_handles": self.launcher.handles(),
            "job_step": self.ledger.job_step,
            "ledger": {str(q): s for q, s in self.ledger.newest_by_quorum().items()},
            "full_restarts": self._full_restarts,
            "gate_since": self._gate_since,
            "membership": list(self._membership) if self._membership is not None else None,
            "transport_owner": [[k, v] for k, v in self._transport_owner.items()],
            "last_commit": {str(g): r for g, r in self.last_commit.items()},
            "rollbacks": self.rollbacks,
            "steps_redone": self.steps_redone,
            "regressions": self.regressions,
            "step_hashes": {str(s): [[g, r, h] for (g, r), h in v.items()] for s, v in sorted(self.step_hashes.items())[-20:]},
            "first_step_time": self.first_step_time,
        }

    def restore_takeover_record(self, state: dict, now: float) -> None:
        """Take back what :meth:`takeover_record` wrote (a previous controller's ``controller.json``)."""
        self._started = state.get("started") or now
        self._tokens_path = state.get("tokens_path") or ""
        self.ledger.restore(int(state.get("job_step", 0)), {int(q): s for q, s in state.get("ledger", {}).items()})
        self._full_restarts = state.get("full_restarts", 0)
        self._gate_since = state.get("gate_since") or now
        self._membership = tuple(state["membership"]) if state.get("membership") is not None else None
        self._transport_owner = {k: tuple(v) for k, v in state.get("transport_owner", [])}
        self.last_commit = {int(g): r for g, r in state.get("last_commit", {}).items()}
        self.rollbacks, self.regressions = list(state.get("rollbacks", [])), list(state.get("regressions", []))
        self.steps_redone = list(state.get("steps_redone", []))
        self.step_hashes = {int(s): {(g, r): h for g, r, h in v} for s, v in state.get("step_hashes", {}).items()}
        self.first_step_time = state.get("first_step_time")
        self.launcher.restore_handles(state.get("launcher_handles") or {})

    def _take_over(self, now: float) -> None:
        """Take the job over (``controller.attach=true``): re-adopt live groups, fail the lost
        ones, adopt (or restart) the Lighthouse."""
        state, decisions, failed = self.controller.restore(now)
        lost = self.controller.lost(state, now)
        lh = state.get("lighthouse", {})
        self.lighthouse_epoch = int(lh.get("epoch", 0))
        lighthouse = self.lighthouse.adopt(lh.get("address", ""), lh.get("guard_pid"), lh.get("guard_start"), lh.get("server_pid"), lh.get("server_start"))
        self.events.emit(
            EventKind.CONTROLLER_ATTACHED,
            pid=os.getpid(),
            previous_pid=state.get("controller_pid"),
            unsupervised_s=round(now - lost["time"], 3),
            groups=decisions,
            lighthouse=lighthouse,
            job_step=self.job_step,
        )
        self.controller.start_heartbeat()
        if not lighthouse["alive"]:
            self._restart_lighthouse(now)
        for g, ranks in failed:
            # Reports up to now first: what the group did while unsupervised is recorded.
            self._consume_reports(g, now)
            # A rank that reported its error (rank_error) before it died was not lost without
            # a word: it failed, most often because a lost peer broke its collectives (it then
            # exits within a second). Named apart, so ``ranks`` are the ones that vanished.
            errored = [rs.proc.launch.rank for rs in g.ranks if rs.error and rs.proc.launch.rank in ranks]
            lost = [r for r in ranks if r not in errored]
            self._fail_group(g, now, reason="lost_while_unsupervised", ranks=lost, **({"errored_ranks": errored} if errored else {}))
        self.status = JobStatus.RUNNING
        self.controller.save()

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
        try:
            state, _, _ = self.controller.restore(now)
            self.controller.lost(state, now)
            self.controller.ended_by = reason
            # Its address for the record; the guard (this process's caller) is not adopted: nothing to stop.
            self.lighthouse.adopt(state.get("lighthouse", {}).get("address", ""), None, None, None, None)
            for g in self.groups:
                if not g.ranks:
                    continue
                self._consume_reports(g, now)
                for rs in g.ranks:
                    if rs.exited is None:
                        # Gone by now (the guard waited for every rank): 0 if it reported rank_finished.
                        rs.exited = rs.proc.wait(5.0)
                        if rs.exited is not None:
                            self.events.emit(EventKind.RANK_EXITED, group=g.index, rank=rs.proc.launch.rank, attempt=g.attempt, **describe_exit(rs.exited))
                if g.status in (GroupStatus.STARTING, GroupStatus.RUNNING) and all(r.exited == 0 for r in g.ranks):
                    g.status = GroupStatus.DONE
                    self.events.emit(EventKind.GROUP_FINISHED, group=g.index, attempt=g.attempt, step=g.last_step)
            if reason == "lease_expired":
                self.status = JobStatus.LEASE_EXPIRED
            else:  # a stop: as a controller ends it
                self.status = job_outcome([g.status for g in self.groups], regressed=False)
        except BaseException:
            self.status = JobStatus.FAILED
            raise
        finally:
            self._shutdown()

    def _shutdown(self) -> None:
        # Standbys belong to this controller (they die with it, see _launch_standby): a
        # controller that attaches later builds its own.
        self.standby.stop()
        self.scrub.stop()
        if self.status == JobStatus.DETACHED:
            # The job keeps training: leave every rank and the Lighthouse alone. The fork
            # servers are this controller's (their forked ranks live on, adopted by init).
            self.warm_forks.close()
            self.controller.close(finished=False)
            print(
                f"[monarch_ft] detached: the job keeps training; take it over with controller.attach=true hydra.run.dir={self.run_dir} "
                f"(its ranks end themselves after controller.lease_s={self.cfg.controller.lease_s:g}s without a controller)",
                flush=True,
            )
            self.events.close()
            self._metrics.close()
            return
        for g in self.groups:
            if g.ranks and any(r.exited is None for r in g.ranks):
                self._stop_ranks(g, graceful=True)
                if g.status not in (GroupStatus.DONE, GroupStatus.GIVEN_UP):
                    self.events.emit(EventKind.GROUP_STOPPED, group=g.index, attempt=g.attempt, reason=self.status)
        self.warm_forks.close()  # after the ranks: their exit codes come back through it
        self.lighthouse.stop()
        if self.lighthouse.proc is not None:
            self.events.emit(EventKind.LIGHTHOUSE_STOPPED)
        if os.path.exists(self.hold_path):
            os.remove(self.hold_path)
        summary = self.summary()
        atomic_write(self.layout.summary, json.dumps(summary, indent=2))
        for line in rollback_lines(self.rollbacks):
            print(f"[monarch_ft] {line}", flush=True)
        for r in self.steps_redone:
            print(
                f"[monarch_ft] step {r['step']} was trained twice: group {r['earlier']['group']} committed it in quorum "
                f"{r['earlier']['quorum_id']} and died before a peer held it; group {r['group']} trained it again in quorum {r['quorum_id']}",
                flush=True,
            )
        for r in self.regressions:
            print(
                f"monarch_ft: error: group {r['group']} (attempt {r['attempt']}) committed step {r['step']} after the job had "
                f"committed step {r['job_committed']}: it trained on a stale state",
                file=sys.stderr,
                flush=True,
            )
        self.events.emit(EventKind.JOB_FINISHED, status=self.status, seconds=summary["wall_time_s"], job_step=self.job_step, steps_lost=summary["steps_lost"])
        self.controller.close(finished=True)
        self.events.close()
        self._metrics.close()
        self.launcher.close()

    def summary(self) -> dict[str, Any]:
        hashes_by_rank: dict[int, dict[int, Optional[str]]] = {}
        groups = {}
        for g in self.groups:
            for rs in g.ranks:
                hashes_by_rank.setdefault(rs.proc.launch.rank, {})[g.index] = rs.state_hash
            groups[str(g.index)] = {
                "status": g.status,
                "restarts": g.restarts,
                "attempts": g.attempt + 1,
                # Why it was given up (GiveUpReason; None: it was not), and its latest failure's error.
                "gave_up": g.gave_up,
                "last_error": g.last_error,
                "final_step": g.last_step,
                "first_loss": g.losses[0] if g.losses else None,
                "last_loss": g.losses[-1] if g.losses else None,
                "state_hashes": {str(rs.proc.launch.rank): rs.state_hash for rs in g.ranks},
            }
        done = [g.index for g in self.groups if g.status == GroupStatus.DONE]
        consistent = bool(done) and all(len({h.get(i) for i in done}) == 1 and h.get(done[0]) is not None for h in hashes_by_rank.values())
        return {
            "status": self.status,
            "run_dir": self.run_dir,
            "wall_time_s": round(time.time() - self._started, 3) if self._started else 0.0,
            "replica_groups": self.cfg.ft.replica_groups,
            "ranks_per_group": self.cfg.ft.ranks_per_group,
            "steps": self.cfg.training.steps,
            **self.launcher.describe(),
            "transport": self.cfg.ft.transport,
            "lighthouse": self.lighthouse.address,
            "restarts": sum(g.restarts for g in self.groups),
            "weights_consistent": consistent,
            # The job's committed steps at the end; what it gave up going back to a checkpoint
            # when no group held its state (each rollback listed); commits below the job's
            # step (a group that trained on a stale state: status "regressed").
            "job_step": self.job_step,
            "steps_lost": sum(r["steps_lost"] for r in self.rollbacks),
            "rollbacks": self.rollbacks,
            "step_regressions": self.regressions,
            # Steps committed again by a later quorum with other weights (controller.ledger.redone_commit).
            "steps_redone": self.steps_redone,
            "full_restarts": self._full_restarts,
            # Failed saves (by errno), the newest good checkpoint and its age, failed loads and
            # quarantined copies (controller.checkpoints.CheckpointHealth).
            "checkpoint": self.ckpt_health.as_dict(time.time()),
            # Warm standby groups: launched, promoted, lost, and time with none ready.
            "standby": self.standby.summary(time.time()),
            # Its controllers and the spans it ran without one (monarch_ft.controller).
            "controller": self.controller.summary(),
            "groups": groups,
            "config": dataclasses.asdict(self.cfg) if dataclasses.is_dataclass(self.cfg) else None,
        }


def request_finish(run_dir: str, step: int) -> None:
    """Make every group of the job running in ``run_dir`` finish at ``step``.

    The ranks read this file once (see rank.trainer.StopAt), so it is written whole.
    """
    atomic_write(RunLayout(run_dir).stop_at_step, str(step))


def process_sample(pid: Optional[int]) -> tuple[Optional[str], Optional[float]]:
    """A rank's psutil state and its CPU seconds (every thread's user + system), read at once;
    (None, None) without a pid (a rank the launcher does not run here), ("gone", None) once gone."""
    if pid is None:
        return None, None
    try:
        p = psutil.Process(pid)
        with p.oneshot():
            times = p.cpu_times()
            return p.status(), times.user + times.system
    except psutil.Error:
        return "gone", None


def process_status(pid: Optional[int]) -> Optional[str]:
    """psutil's view of a rank: 'running', 'sleeping', 'stopped' (SIGSTOP), 'zombie', ..."""
    return process_sample(pid)[0]
