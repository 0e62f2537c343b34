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
from dataclasses import dataclass, field
from typing import Any, Optional, Protocol

import psutil

from monarch_ft.components.checkpoint import align_latest_checkpoint
from monarch_ft.components.metrics import ReportTail
from monarch_ft.config import JobConfig, validate
from monarch_ft.events import EventLog
from monarch_ft.launcher import Launcher, RankLaunch, RankProcess, build_launcher, describe_exit
from monarch_ft.lighthouse import Lighthouse
from monarch_ft.net import free_port

log = logging.getLogger("monarch_ft.supervisor")

STARTING, RUNNING, WAITING, DONE, GIVEN_UP = "starting", "running", "waiting_restart", "done", "given_up"


class SupervisorHook(Protocol):
    """Called on every watch tick; fault injectors and reporters plug in here."""

    def tick(self, supervisor: "Supervisor", now: float) -> None: ...


@dataclass
class RankState:
    proc: RankProcess
    tail: ReportTail
    last_progress: float
    last_step: int = -1
    exited: Optional[int] = None
    train_done: bool = False
    state_hash: Optional[str] = None
    first_step_seen: bool = False
    model_ready: bool = False


@dataclass
class GroupState:
    index: int
    status: str = WAITING
    attempt: int = -1
    restarts: int = 0
    next_launch: float = 0.0
    ranks: list[RankState] = field(default_factory=list)
    last_step: int = -1
    train_done: bool = False
    launched_at: float = 0.0
    losses: list[float] = field(default_factory=list)
    # Next launch loads the latest disk checkpoint (job resume, or full-restart recovery).
    resume_from_disk: bool = False
    # The start gate the next launch waits at before its first step ("" for none).
    start_gate: str = ""

    @property
    def active(self) -> bool:
        return self.status in (STARTING, RUNNING)


class Supervisor:
    def __init__(
        self,
        cfg: JobConfig,
        run_dir: str,
        launcher: Optional[Launcher] = None,
        hooks: Optional[list[SupervisorHook]] = None,
        echo: bool = True,
    ) -> None:
        validate(cfg)
        self.cfg = cfg
        self.run_dir = os.path.abspath(run_dir)
        os.makedirs(self.run_dir, exist_ok=True)
        # ranks/ holds this job's live report and spec files: a job resumed in the same
        # run directory must not re-read the previous job's reports.
        shutil.rmtree(os.path.join(self.run_dir, "ranks"), ignore_errors=True)
        shutil.rmtree(os.path.join(self.run_dir, "control"), ignore_errors=True)
        for sub in ("ranks", "logs", "control"):
            os.makedirs(os.path.join(self.run_dir, sub), exist_ok=True)
        self.launcher = launcher or build_launcher(cfg.launcher, self.run_dir)
        self.hooks: list[SupervisorHook] = list(hooks or [])
        self.events = EventLog(os.path.join(self.run_dir, "events.jsonl"), echo=self._echo if echo else None)
        self._metrics = open(os.path.join(self.run_dir, "metrics.jsonl"), "a", buffering=1)
        self.hold_path = os.path.join(self.run_dir, "control", "hold")
        # Launches wait at a start gate (see _gate_path): the first launch's, then one per
        # full restart, so every group starts the step loop together.
        self._full_restarts = 0
        self._gate_since = 0.0
        self.groups = [GroupState(i, resume_from_disk=cfg.checkpoint.resume, start_gate=self._gate_path) for i in range(cfg.ft.replica_groups)]
        # The configured host wins unless it is the loopback default and the launcher's ranks
        # cannot reach loopback (ranks on other hosts or in network namespaces).
        host = cfg.ft.lighthouse_host if cfg.ft.lighthouse_host != "127.0.0.1" else self.launcher.control_host()
        self.lighthouse = Lighthouse(cfg.ft, os.path.join(self.run_dir, "logs", "lighthouse.log"), host=host)
        self._stop_reason: Optional[str] = None
        self._membership: Optional[tuple[int, ...]] = None
        self._transport_owner: dict[Any, tuple[int, int]] = {}
        # Latest committed step record of each group's rank 0 (for hooks such as chaos).
        self.last_commit: dict[int, dict] = {}
        self.first_step_time: Optional[float] = None
        self._tokens_path = ""
        self._started = 0.0
        self._last_progress_print = 0.0
        self.status = "running"

    # ---------------------------------------------------------------- console
    def _echo(self, e: dict) -> None:
        quiet = {"rank_launched", "model_ready", "rank_started", "checkpoint_sent", "rank_finished", "recovery_started"}
        if e["event"] in quiet:
            return
        rel = e["time"] - self._started if self._started else 0.0
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
        return previous

    # ---------------------------------------------------------------- launch
    def _prepare_data(self) -> None:
        from monarch_ft.data import prepare

        t0 = time.time()
        data = prepare(self.cfg.data.cache_dir, self.cfg.model.vocab_size, self.cfg.data.max_corpus_mb)
        self._tokens_path = data.tokens_path
        self.events.emit("data_ready", tokens=data.num_tokens, vocab_size=data.vocab_size, seconds=round(time.time() - t0, 2))

    def _rank_env(self) -> dict[str, str]:
        env = dict(os.environ)
        threads = str(self.cfg.training.threads_per_rank)
        env.update(OMP_NUM_THREADS=threads, MKL_NUM_THREADS=threads, PYTHONUNBUFFERED="1", RUST_BACKTRACE="1")
        repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        env["PYTHONPATH"] = repo + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        return env

    def _launch(self, g: GroupState, now: float) -> None:
        from omegaconf import OmegaConf

        g.attempt += 1
        if g.attempt > 0 and not g.resume_from_disk and self.cfg.checkpoint.enable:
            # Live healing needs a live peer; with none left, fall back to the disk
            # checkpoint rather than starting again from step 0.
            if not any(o.status == RUNNING and o is not g for o in self.groups):
                g.resume_from_disk = True
                self.events.emit("no_live_peer", group=g.index, attempt=g.attempt, resume_from_disk=True)
        store_host = self.launcher.group_host(g.index)
        store_port = free_port(store_host)
        # Ranks get the JobConfig part only (recipes may extend the config, e.g. drills).
        config = {f.name: OmegaConf.to_container(OmegaConf.structured(getattr(self.cfg, f.name))) for f in dataclasses.fields(JobConfig)}
        launches = []
        for r in range(self.cfg.ft.ranks_per_group):
            tag = f"g{g.index}r{r}"
            spec = {
                "config": config,
                "group": g.index,
                "rank": r,
                "world_size": self.cfg.ft.ranks_per_group,
                "attempt": g.attempt,
                "store_host": store_host,
                "store_port": store_port,
                "lighthouse_addr": self.lighthouse.address,
                "advertise_host": store_host,
                "run_dir": self.run_dir,
                "report_path": report_path(self.run_dir, g.index, r, g.attempt),
                "hold_path": self.hold_path,
                "tokens_path": self._tokens_path,
                "resume_from_disk": g.resume_from_disk,
                "start_gate": g.start_gate,
                "scratch_dir": os.path.join(self.scratch_dir(g.index), f"rank_{r}"),
            }
            spec_path = os.path.join(self.run_dir, "ranks", f"{tag}.a{g.attempt}.spec.json")
            with open(spec_path, "w") as f:
                json.dump(spec, f)
            launches.append(
                RankLaunch(
                    group=g.index,
                    rank=r,
                    attempt=g.attempt,
                    argv=[sys.executable, "-m", "monarch_ft.worker", spec_path],
                    env=self._rank_env(),
                    log_path=os.path.join(self.run_dir, "logs", f"{tag}.a{g.attempt}.log"),
                    cwd=self.run_dir,
                )
            )
        procs = self.launcher.launch_group(launches)
        g.ranks = [RankState(p, ReportTail(report_path(self.run_dir, g.index, p.launch.rank, g.attempt)), last_progress=now) for p in procs]
        g.status, g.launched_at, g.train_done = STARTING, now, False
        self.events.emit("group_launched", group=g.index, attempt=g.attempt, launcher=self.launcher.name)
        for p in procs:
            self.events.emit("rank_launched", group=g.index, rank=p.launch.rank, attempt=g.attempt, pid=p.pid, host=p.launch.host)

    # ---------------------------------------------------------------- watch
    def _consume_reports(self, g: GroupState, now: float) -> None:
        for rs in g.ranks:
            for rec in rs.tail.read():
                kind = rec.get("type")
                if kind == "step":
                    rs.last_progress, rs.last_step = now, rec["step"]
                    rs.first_step_seen = True
                    if self.first_step_time is None:
                        self.first_step_time = now
                    self._metrics.write(json.dumps(rec) + "\n")
                    if rec.get("committed"):
                        g.last_step = max(g.last_step, rec["step"] + 1)
                    if rec["rank"] == 0 and rec.get("loss") is not None:
                        g.losses.append(rec["loss"])
                    if rec["rank"] == 0 and rec.get("committed"):
                        self.last_commit[g.index] = rec
                    if g.status == STARTING:
                        g.status = RUNNING
                        self.events.emit("group_stepping", group=g.index, attempt=g.attempt, step=rec["step"])
                    self._track_membership(rec)
                elif kind == "heartbeat":
                    rs.last_progress = now
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
                    if name in ("weights_recovered", "recovery_started", "recovery_failed"):
                        # Name the peer by group: the Manager only knows its address.
                        rec["src_group"], rec["src_rank"] = self._transport_owner.get(rec.get("src"), (None, None))
                    rec.pop("type", None)
                    self.events.emit(name, **rec)
        if g.ranks and all(r.train_done for r in g.ranks) and not g.train_done:
            g.train_done = True
            if g.status == STARTING:
                g.status = RUNNING

    def _track_membership(self, rec: dict) -> None:
        members = tuple(rec.get("participating_groups") or ())
        if rec["rank"] != 0 or not rec.get("committed") or members == self._membership:
            return
        self._membership = members
        self.events.emit(
            "quorum_change",
            participating_groups=list(members),
            quorum_size=rec.get("quorum_size"),
            quorum_id=rec.get("quorum_id"),
            step=rec["step"],
            seen_by=rec["group"],
        )

    def _check_group(self, g: GroupState, now: float) -> None:
        failure: Optional[dict] = None
        for rs in g.ranks:
            if rs.exited is None:
                code = rs.proc.poll()
                if code is not None:
                    rs.exited = code
                    self.events.emit("rank_exited", group=g.index, rank=rs.proc.launch.rank, attempt=g.attempt, **describe_exit(code))
                    if code != 0 and failure is None:
                        failure = {"reason": "exit", "rank": rs.proc.launch.rank, **describe_exit(code)}
        if failure is None:
            limit = self.cfg.ft.hang_timeout_s if all(r.first_step_seen or r.train_done for r in g.ranks) else self.cfg.ft.startup_timeout_s
            silent = [rs for rs in g.ranks if rs.exited is None and now - rs.last_progress > limit]
            if silent:
                # One stuck rank soon silences its group peers too (they block in its
                # collectives): blame a rank whose OS state explains it (stopped,
                # uninterruptible, zombie) over one merely sleeping on a peer.
                status = {rs.proc.launch.rank: process_status(rs.proc.pid) for rs in g.ranks if rs.exited is None}
                culprit = min(silent, key=lambda rs: (status[rs.proc.launch.rank] in ("sleeping", "running"), rs.last_progress))
                failure = {
                    "reason": "hung",
                    "rank": culprit.proc.launch.rank,
                    "silent_s": round(now - culprit.last_progress, 2),
                    "process_status": status[culprit.proc.launch.rank],
                    "rank_status": status,
                }
        if failure is not None:
            self._fail_group(g, now, **failure)
        elif g.ranks and all(r.exited == 0 for r in g.ranks):
            g.status = DONE
            self.events.emit("group_finished", group=g.index, attempt=g.attempt, step=g.last_step)

    def _fail_group(self, g: GroupState, now: float, **why: Any) -> None:
        self.events.emit("group_failed", group=g.index, attempt=g.attempt, **why)
        self._stop_ranks(g, graceful=False)
        self.events.emit("group_stopped", group=g.index, attempt=g.attempt)
        if self.cfg.ft.recovery == "full_restart":
            self._full_restart(g, now)
            return
        self._schedule_restart(g, now)

    def _schedule_restart(self, g: GroupState, now: float, resume_from_disk: bool = False, start_gate: str = "") -> None:
        if g.restarts >= self.cfg.ft.max_restarts:
            g.status = GIVEN_UP
            self.events.emit("restart_budget_exhausted", group=g.index, restarts=g.restarts, max_restarts=self.cfg.ft.max_restarts)
            return
        g.restarts += 1
        backoff = min(self.cfg.ft.restart_backoff_s * 2 ** (g.restarts - 1), self.cfg.ft.restart_backoff_max_s)
        g.status, g.next_launch, g.resume_from_disk, g.start_gate = WAITING, now + backoff, resume_from_disk, start_gate
        self.events.emit("restart_scheduled", group=g.index, restart=g.restarts, backoff_s=round(backoff, 3))

    def _full_restart(self, failed: GroupState, now: float) -> None:
        """Baseline policy: the whole job stops and resumes from one disk checkpoint.

        Every group loads the same step (the newest complete one any group wrote; a group
        without it gets a copy, as from shared storage) and waits at a fresh start gate,
        so the job comes back as one quorum instead of groups healing from each other.
        """
        for g in self.groups:
            if g is not failed and g.active:
                self._stop_ranks(g, graceful=False)
                self.events.emit("group_stopped", group=g.index, attempt=g.attempt, reason="full_restart")
        restarting = [g for g in self.groups if g.status != GIVEN_UP and (g is failed or g.status != DONE)]
        step = None
        if self.cfg.checkpoint.enable:
            step = align_latest_checkpoint([self.checkpoint_dir(g.index) for g in restarting])
        self._full_restarts += 1
        self._gate_since = now
        self.events.emit("full_restart", failed_group=failed.index, resume_step=step)
        for g in restarting:
            self._schedule_restart(g, now, resume_from_disk=True, start_gate=self._gate_path)

    def finish_at(self, step: int) -> None:
        """Ask every group to finish training at ``step`` (before training.steps)."""
        request_finish(self.run_dir, step)
        self.events.emit("finish_requested", step=step)

    def scratch_dir(self, group: int) -> str:
        """A group's host-local files (scratch space); a node fault deletes them."""
        return os.path.join(self.run_dir, "scratch", f"group_{group}")

    def checkpoint_dir(self, group: int) -> str:
        return os.path.join(self.run_dir, self.cfg.checkpoint.folder, f"group_{group}")

    def _stop_ranks(self, g: GroupState, graceful: bool) -> None:
        if graceful:
            for rs in g.ranks:
                if rs.exited is None:
                    rs.proc.send_signal(signal.SIGTERM)
            deadline = time.time() + 5.0
            for rs in g.ranks:
                if rs.exited is None:
                    rs.exited = rs.proc.wait(max(0.0, deadline - time.time()))
        for rs in g.ranks:
            if rs.exited is None or rs.proc.poll() is None:
                rs.proc.kill()  # SIGKILL also ends a SIGSTOPped rank
                rs.exited = rs.proc.wait(10.0)

    @property
    def _gate_path(self) -> str:
        """The gate the current generation of launches waits at."""
        name = f"start.{self._full_restarts}" if self._full_restarts else "start"
        return os.path.join(self.run_dir, "control", name)

    def _open_start_gate(self, now: float) -> None:
        """Let the groups at the current gate train once all of them have built their model
        and loaded their state (or once they waited long enough)."""
        if os.path.exists(self._gate_path):
            return
        waiting = [g for g in self.groups if g.start_gate == self._gate_path and g.status not in (DONE, GIVEN_UP)]
        ready = all(g.active and all(r.model_ready for r in g.ranks) for g in waiting)
        if ready or now - self._gate_since > self.cfg.ft.startup_timeout_s / 2:
            open(self._gate_path, "w").close()
            self.events.emit("training_started", all_groups_ready=ready, full_restarts=self._full_restarts)

    def _update_hold(self) -> None:
        """Groups that finished wait (serving quorums) while any other group still has work."""
        pending = [g for g in self.groups if g.status not in (DONE, GIVEN_UP) and not g.train_done]
        if pending and not os.path.exists(self.hold_path):
            open(self.hold_path, "w").close()
        elif not pending and os.path.exists(self.hold_path):
            os.remove(self.hold_path)

    # ---------------------------------------------------------------- run
    def run(self) -> int:
        previous = self._install_signal_handlers()
        self._started = self._gate_since = time.time()
        exit_code = 1
        try:
            self.events.emit(
                "job_started",
                run_dir=self.run_dir,
                replica_groups=self.cfg.ft.replica_groups,
                ranks_per_group=self.cfg.ft.ranks_per_group,
                transport=self.cfg.ft.transport,
                **self.launcher.describe(),
                supervisor_pid=os.getpid(),
            )
            address = self.lighthouse.start()
            self.events.emit("lighthouse_started", address=address, pid=self.lighthouse.pid)
            self._prepare_data()
            open(self.hold_path, "w").close()
            exit_code = self._watch()
        except BaseException as e:
            self.status = "failed"
            self.events.emit("supervisor_error", error=f"{type(e).__name__}: {e}"[:500])
            raise
        finally:
            self._shutdown()
            for sig, handler in previous:
                signal.signal(sig, handler)
        return exit_code

    def _watch(self) -> int:
        while True:
            now = time.time()
            if self._stop_reason:
                self.status = "interrupted"
                self.events.emit("supervisor_stop_requested", reason=self._stop_reason)
                return 130 if self._stop_reason == "SIGINT" else 143
            if not self.lighthouse.alive():
                self.status = "failed"
                self.events.emit("lighthouse_died", **describe_exit(self.lighthouse.proc.returncode))
                return 1
            for g in self.groups:
                if g.status == WAITING and now >= g.next_launch:
                    self._launch(g, now)
            for g in self.groups:
                if g.active:
                    self._consume_reports(g, now)
                    self._check_group(g, now)
            self._open_start_gate(now)
            self._update_hold()
            for hook in self.hooks:
                hook.tick(self, now)
            if all(g.status in (DONE, GIVEN_UP) for g in self.groups):
                self.status = "completed" if all(g.status == DONE for g in self.groups) else "degraded"
                return 0 if self.status == "completed" else 1
            self._print_progress(now)
            time.sleep(0.05)

    def _shutdown(self) -> None:
        for g in self.groups:
            if g.ranks and any(r.exited is None for r in g.ranks):
                self._stop_ranks(g, graceful=True)
                if g.status not in (DONE, GIVEN_UP):
                    self.events.emit("group_stopped", group=g.index, attempt=g.attempt, reason=self.status)
        self.lighthouse.stop()
        if self.lighthouse.proc is not None:
            self.events.emit("lighthouse_stopped")
        if os.path.exists(self.hold_path):
            os.remove(self.hold_path)
        summary = self.summary()
        with open(os.path.join(self.run_dir, "summary.json"), "w") as f:
            json.dump(summary, f, indent=2)
        self.events.emit("job_finished", status=self.status, seconds=summary["wall_time_s"])
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
                "final_step": g.last_step,
                "first_loss": g.losses[0] if g.losses else None,
                "last_loss": g.losses[-1] if g.losses else None,
                "state_hashes": {str(rs.proc.launch.rank): rs.state_hash for rs in g.ranks},
            }
        done = [g.index for g in self.groups if g.status == DONE]
        consistent = bool(done) and all(
            len({h.get(i) for i in done}) == 1 and h.get(done[0]) is not None for h in hashes_by_rank.values()
        )
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
            "groups": groups,
            "config": dataclasses.asdict(self.cfg) if dataclasses.is_dataclass(self.cfg) else None,
        }


def report_path(run_dir: str, group: int, rank: int, attempt: int) -> str:
    """Where a rank appends its step and event records (one file per rank and attempt)."""
    return os.path.join(run_dir, "ranks", f"g{group}r{rank}.a{attempt}.jsonl")


def request_finish(run_dir: str, step: int) -> None:
    """Make every group of the job running in ``run_dir`` finish at ``step``.

    The ranks read this file once (see trainer.StopAt), so it is written whole.
    """
    path = os.path.join(run_dir, "control", "stop_at_step")
    with open(path + ".tmp", "w") as f:
        f.write(str(step))
    os.replace(path + ".tmp", path)


def process_status(pid: Optional[int]) -> Optional[str]:
    """psutil's view of a rank: 'running', 'sleeping', 'stopped' (SIGSTOP), 'zombie', ..."""
    if pid is None:
        return None
    try:
        return psutil.Process(pid).status()
    except psutil.Error:
        return "gone"
