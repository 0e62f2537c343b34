"""A fake clock and a fake launcher: the real watch loop, driven through a job in milliseconds.

The fast tests (``tests/unit/test_loop_sequences.py``) run the real
:class:`~monarch_ft.controller.loop.Supervisor` (its loop, planner, pools, takeover, files)
with no process started: :class:`FakeLauncher` starts :class:`FakeRank` objects that act out
a rank's life on a :class:`FakeClock` and write real report records into the real report
files the loop reads (``model_ready``, steps, ``train_done``, ``rank_finished``, errors,
checkpoint events), wait at the real start and launch gates, read the real promotion files,
and save checkpoints the controller can verify (a file and its manifest). What a rank does
wrong is scripted per group, attempt and rank (:class:`Script`: exit at a step, hang at a
step, fail at start-up with an error, fail to load a checkpoint, hold corrupt state from a
step on: its state fingerprints differ from its peers'), or done to it from outside
(:meth:`FakeLauncher.kill`), as a fault injector would.

The ranks step together, as a TorchFT quorum does: every stepping rank commits the same step
at each ``step_s``, in a quorum whose id changes when its groups do; a rank that joins from a
live peer joins at the quorum's next step, one that loads a checkpoint starts from it.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
from dataclasses import dataclass
from typing import Iterable, Optional

from monarch_ft.controller.fork_pool import ForkError, ServerState
from monarch_ft.launcher.base import ForkHost, Launcher, LauncherTraits, RankLaunch, RankProcess
from monarch_ft.records.decisions import Promotion, StateDecision, StateSource
from monarch_ft.records.events import EventKind
from monarch_ft.records.exits import LOST_EXIT, RankExit
from monarch_ft.records.launch import worker_spec
from monarch_ft.records.layout import RunLayout, read_json
from monarch_ft.records.manifest import build_manifest, file_checksum, step_dir, write_manifest
from monarch_ft.records.members import members_field


class FakeClock:
    """A clock that moves only when slept on (or advanced): a minute of a job's time costs
    the ticks the loop makes in it, nothing more.

    Args:
        start: its time at first (default: a fixed, realistic epoch time).
    """

    def __init__(self, start: float = 1_800_000_000.0) -> None:
        self.now = start

    def time(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds

    def advance(self, seconds: float) -> None:
        self.now += seconds


@dataclass
class Script:
    """What one rank attempt does (default: trains to the end like any rank).

    Args:
        build_s: seconds from its start to ``model_ready`` (a standby: to ``standby_ready``).
        exit_at_step: exits instead of committing this step (the job's step numbering).
        exit_code: how it exits then (negative: killed by that signal).
        error: the ``rank_error`` it reports before exiting (records.reports.error_record's
            shape: error, error_type, frame, environmental).
        startup_error: fails at start-up (before ``model_ready``; a promoted standby: before its
            first step) reporting this error, exit 1.
        hang_at_step: goes silent instead of committing this step (no record, no exit).
        load_fails: loading a disk checkpoint raises (``checkpoint_load_failed``, then it exits
            ``RankExit.CHECKPOINT_LOAD_FAILED``).
        corrupt_from_step: from this step on, the state fingerprint in its step records
            (records.integrity; with ``ft.integrity_every`` not 0) differs from its peers': a
            silent corruption, which nothing else shows.
        slow_at_step: from this step on its compute takes ``slow_factor`` x as long (a fail-slow
            rank: its records' ``compute_s``; the fake quorum's pace is unchanged).
        slow_until_step: the first step at its own pace again (None: slow to the end): a burst
            of load a few steps long.
    """

    build_s: float = 0.5
    exit_at_step: Optional[int] = None
    exit_code: int = -signal.SIGKILL
    error: Optional[dict] = None
    startup_error: Optional[dict] = None
    hang_at_step: Optional[int] = None
    load_fails: bool = False
    corrupt_from_step: Optional[int] = None
    slow_at_step: Optional[int] = None
    slow_factor: float = 3.0
    slow_until_step: Optional[int] = None

    def slow_at(self, step: int) -> bool:
        """Whether the rank computes ``slow_factor`` x slower at ``step``."""
        return self.slow_at_step is not None and step >= self.slow_at_step and (self.slow_until_step is None or step < self.slow_until_step)


class _Phase:
    STARTUP = "startup"
    GATE = "gate"
    STANDBY = "standby"  # built, waiting for its promotion
    STEPPING = "step"
    HOLDING = "hold"
    HUNG = "hung"
    EXITED = "exited"


class FakeRank(RankProcess):
    """One fake rank: see the module docstring. Its ``pid`` is None (nothing to sample)."""

    def __init__(self, world: "FakeLauncher", launch: RankLaunch) -> None:
        self.launch = launch
        self.world = world
        spec_path = worker_spec(launch.argv)
        self.spec: dict = read_json(spec_path) if spec_path else {}
        self.group, self.rank, self.attempt = launch.group, launch.rank, launch.attempt
        self.standby = launch.standby
        self.report_path = self.spec.get("report_path", "")
        self.code: Optional[int] = None
        self.started = world.clock.time()
        self.phase = _Phase.STANDBY if self.standby is not None else _Phase.STARTUP
        self.ready_reported = False
        self.script = world.script_for(None if self.standby is not None else self.group, self.attempt, self.rank)
        if self.standby is not None:
            self.script = dataclasses.replace(self.script, build_s=world.standby_build_s)
        self.last_beat = self.started
        self.steps_trained = 0
        self.start_step = 0
        self._report = None

    # ------------------------------------------------------------ RankProcess
    @property
    def pid(self) -> Optional[int]:
        return None

    def poll(self) -> Optional[int]:
        self.world.advance()
        return self.code

    def send_signal(self, sig: int) -> None:
        if self.code is None:
            self.code = -int(sig)
            self.phase = _Phase.EXITED

    def wait(self, timeout: float) -> Optional[int]:
        self.world.advance()
        return self.code

    # ------------------------------------------------------------ its life
    def write(self, kind: str, **fields) -> None:
        record = {"type": kind, "group": self.group, "rank": self.rank, "attempt": self.attempt, "pid": None, "time": self.world.clock.time(), **fields}
        if self._report is None or self._report.name != self.report_path:
            if self._report is not None:
                self._report.close()
            self._report = open(self.report_path, "a", buffering=1)
        self._report.write(json.dumps(record) + "\n")

    def event(self, name: EventKind, **fields) -> None:
        self.write("event", event=name.value, **fields)

    def exit(self, code: int, error: Optional[dict] = None) -> None:
        if error:
            self.event(EventKind.RANK_ERROR, **error)
        self.code = code
        self.phase = _Phase.EXITED

    def beat(self, now: float) -> None:
        if now - self.last_beat >= 1.0:
            self.last_beat = now
            self.write("liveness", phase=self.phase, phase_since=self.started)

    def advance(self, now: float) -> None:
        """Act out its life up to ``now`` (all but the quorum's steps: FakeLauncher.advance)."""
        if self.code is not None or self.phase == _Phase.HUNG:
            return
        built = now >= self.started + self.script.build_s
        if self.phase == _Phase.STANDBY:
            if built and not self.ready_reported:
                self.ready_reported = True
                self.event(EventKind.STANDBY_READY, standby=self.standby)
            record = read_json(self.spec["promotion_path"]) if self.ready_reported else None
            if record:
                self._promoted(Promotion.from_record(record), now)
            else:
                self.beat(now)
            return
        if self.phase == _Phase.STARTUP:
            if not built:
                self.beat(now)
                return
            if self.script.startup_error is not None:
                self.exit(1, self.script.startup_error)
                return
            load = self.spec.get("load_step")
            if load is not None and load >= 0:
                if not self._load(load, self.spec.get("load_path")):
                    return
                self.start_step = load
            self.event(EventKind.MODEL_READY, transport_metadata=f"fake://g{self.group}r{self.rank}a{self.attempt}")
            self.phase = _Phase.GATE
        if self.phase == _Phase.GATE:
            gate = self.spec.get("start_gate", "")
            if gate and not os.path.exists(gate):
                self.beat(now)
                return
            self._decided(StateDecision.from_record(read_json(gate, {})) if gate else None)
            return
        if self.phase == _Phase.HOLDING:
            if os.path.exists(self.world.layout.hold):
                self.beat(now)
                return
            self.event(EventKind.RANK_FINISHED, state_hash=self.world.state_hash, steps_trained=self.steps_trained)
            self.code = 0
            self.phase = _Phase.EXITED

    def _load(self, step: int, path: Optional[str]) -> bool:
        """Load checkpoint ``step``; False when the script makes it fail (the rank then exits)."""
        if self.script.load_fails:
            path = path or step_dir(self.world.layout.checkpoint(self.group), step)
            self.event(EventKind.CHECKPOINT_LOAD_FAILED, step=step, path=path, error="RuntimeError: the fake load failed")
            self.exit(int(RankExit.CHECKPOINT_LOAD_FAILED))
            return False
        self.event(EventKind.CHECKPOINT_LOADED, step=step)
        return True

    def _decided(self, decision: Optional[StateDecision]) -> None:
        if decision is not None and decision.source is StateSource.DISK:
            if not self._load(decision.step, decision.path):
                return
            self.start_step = decision.step
        self.phase = _Phase.STEPPING
        self.world.joined(self, peer=decision is not None and decision.source is StateSource.PEER)

    def _promoted(self, promotion: Promotion, now: float) -> None:
        mine = promotion.ranks[str(self.rank)]
        self.group, self.attempt, self.standby = promotion.group, promotion.attempt, None
        self.report_path = mine["report_path"]
        self.script = self.world.script_for(self.group, self.attempt, self.rank)
        self.event(EventKind.RANK_STARTED, promotion_latency_s=round(now - promotion.promoted_at, 3))
        if self.script.startup_error is not None:  # binding the group's identity failed
            self.exit(1, self.script.startup_error)
            return
        self._decided(promotion.decision)

    def commit(self, step: int, quorum_id: int, groups: list[int], now: float) -> None:
        """Commit ``step`` with the quorum (or do what the script says instead)."""
        if self.script.hang_at_step is not None and step >= self.script.hang_at_step:
            self.phase = _Phase.HUNG
            return
        if self.script.exit_at_step is not None and step >= self.script.exit_at_step:
            self.exit(self.script.exit_code, self.script.error)
            return
        self.write(
            "step",
            step=step,
            committed=True,
            quorum_id=quorum_id,
            participating_groups=members_field(groups),
            quorum_size=len(groups),
            loss=round(10.0 / (1 + step), 4),
            step_time_s=self.world.step_s,
            # Half the step computing, the rest in the cross-group collective.
            compute_s=self.world.step_s / 2 * (self.script.slow_factor if self.script.slow_at(step) else 1.0),
            xgroup_s=self.world.step_s / 2,
            state_hash=self.world.state_hash if self.world.hash_steps else None,
            fingerprint=self._fingerprint(step) if self.world.fingerprints else None,
        )
        self.steps_trained += 1
        self.last_beat = now
        interval = self.world.checkpoint_interval
        if interval and self.rank == 0 and (step + 1) % interval == 0:
            self.world.save_checkpoint(self, step + 1)

    def _fingerprint(self, step: int) -> dict:
        """Its state's fingerprint after ``step`` (records.integrity's format): every rank index
        holds the same state in every group, unless its script corrupts it."""
        corrupt = self.script.corrupt_from_step is not None and step >= self.script.corrupt_from_step
        tensors = f"{self.rank:08x}" + ("ffffffff" if corrupt else "00000000")
        return {"step": step + 1, "digest": ("f" if corrupt else "0") * 15 + str(self.rank), "tensors": tensors, "vetoed": False}

    def done(self) -> None:
        self.event(EventKind.TRAIN_DONE)
        self.phase = _Phase.HOLDING


class FakeForkServer:
    """A fork server on the fake host: importing for ``import_s``, then ready; its forks are
    fake ranks (or a :class:`ForkError`, when the launcher says so)."""

    _pids = iter(range(4_000_000, 5_000_000))

    def __init__(self, world: "FakeLauncher", host: ForkHost, log_path: str) -> None:
        self.world = world
        self.host = host
        self.log_path = log_path
        self.started_at = world.clock.time()
        self.pid = next(self._pids)
        self.ready_info = {"pid": self.pid, "import_s": world.fork_import_s, "threads": 1}
        self.gone = False
        self.proc = self  # WarmForks reads proc.poll() of a lost server

    @property
    def state(self) -> ServerState:
        if self.gone:
            return ServerState.GONE
        if self.world.clock.time() < self.started_at + self.world.fork_import_s:
            return ServerState.STARTING
        return ServerState.READY

    def poll(self) -> Optional[int]:
        return -signal.SIGKILL if self.gone else None

    def alive(self) -> bool:
        return not self.gone

    def fork(self, launch: RankLaunch, die_with_parent: bool, report_path: str = "", netns: Optional[str] = None) -> FakeRank:
        if self.state is not ServerState.READY:
            raise ForkError(f"the fork server is {self.state}")
        if self.world.fork_error:
            raise ForkError(self.world.fork_error)
        return self.world.start(launch)

    def close(self) -> None:
        self.gone = True


class FakeLauncher(Launcher):
    """Starts :class:`FakeRank` objects; the world they act in (module docstring).

    Args:
        clock: the job's clock.
        run_dir: the run directory (the layout the ranks write in).
        step_s: seconds per quorum step.
        standby_build_s: seconds a standby takes to build.
        fork_import_s: seconds a fork server takes to import.
        checkpoint_interval: ranks save every this many steps (0: never); set from the job's config
            when the job starts a rank.
    """

    name = "fake"
    traits = LauncherTraits(adoptable=True, forkable=True, default_standby_groups=1)

    def __init__(self, clock: FakeClock, run_dir: str, step_s: float = 0.1, standby_build_s: float = 1.0, fork_import_s: float = 1.0) -> None:
        self.clock = clock
        self.layout = RunLayout(run_dir)
        self.step_s = step_s
        self.standby_build_s = standby_build_s
        self.fork_import_s = fork_import_s
        self.fork_error: Optional[str] = None
        self.ranks: list[FakeRank] = []
        self.scripts: dict[tuple, Script] = {}
        self.servers: list[FakeForkServer] = []
        self.state_hash = "h0"
        self.hash_steps = False
        self.fingerprints = False
        self.checkpoint_interval = 0
        self.steps = 0
        # The quorum: the next step, when it is due, its groups and id.
        self.next_step = 0
        self.next_step_at: Optional[float] = None
        self.quorum_groups: list[int] = []
        self.quorum_id = 0
        self._advanced_to: Optional[float] = None
        # When each step of the quorum was due (a rank scripted to exit at a step dies then).
        self.step_due: dict[int, float] = {}

    # ------------------------------------------------------------ scripting
    def script(self, group: int, attempt: int, script: Script, rank: Optional[int] = None) -> None:
        """What rank ``rank`` (default: every rank) of ``group``'s ``attempt`` does."""
        self.scripts[(group, attempt, rank)] = script

    def script_for(self, group: Optional[int], attempt: int, rank: int) -> Script:
        return self.scripts.get((group, attempt, rank)) or self.scripts.get((group, attempt, None)) or Script()

    def kill(self, group: int, rank: int = 0, sig: int = signal.SIGKILL) -> None:
        """A fault from outside: the group's rank (of its latest attempt) dies of ``sig``."""
        live = [r for r in self.ranks if r.group == group and r.rank == rank and r.standby is None and r.code is None]
        live[-1].send_signal(sig)

    def live(self, group: Optional[int] = None) -> list[FakeRank]:
        return [r for r in self.ranks if r.code is None and (group is None or (r.standby is None and r.group == group))]

    # ------------------------------------------------------------ the world
    def start(self, launch: RankLaunch) -> FakeRank:
        rank = FakeRank(self, launch)
        config = rank.spec.get("config") or {}
        self.steps = config.get("training", {}).get("steps", self.steps)
        self.hash_steps = bool(config.get("training", {}).get("state_hash_every"))
        self.fingerprints = str(config.get("ft", {}).get("integrity_every", "0")) != "0"
        ckpt = config.get("checkpoint", {})
        self.checkpoint_interval = ckpt.get("interval", 0) if ckpt.get("enable") else 0
        self.ranks.append(rank)
        return rank

    def joined(self, rank: FakeRank, peer: bool) -> None:
        """``rank`` is ready to step: at the quorum's next step (healed from a peer), or, with
        no rank stepping, from its own state (its checkpoint, or the start)."""
        if self.next_step_at is None:
            if not peer:
                self.next_step = rank.start_step
            self.next_step_at = self.clock.time() + self.step_s

    def stepping(self) -> list[FakeRank]:
        return [r for r in self.ranks if r.code is None and r.phase == _Phase.STEPPING]

    def advance(self) -> None:
        """Everything up to the clock's time (once per time)."""
        now = self.clock.time()
        if self._advanced_to == now:
            return
        self._advanced_to = now
        for r in list(self.ranks):
            r.advance(now)
        while self.next_step_at is not None and now >= self.next_step_at:
            members = self.stepping()
            if not members:
                self.next_step_at = None
                break
            if self.next_step >= self.steps:
                for r in members:
                    r.done()
                self.next_step_at = None
                break
            groups = sorted({r.group for r in members})
            if groups != self.quorum_groups:
                self.quorum_groups = groups
                self.quorum_id += 1
            self.step_due[self.next_step] = self.next_step_at
            for r in members:
                r.commit(self.next_step, self.quorum_id, groups, now)
            self.next_step += 1
            self.next_step_at += self.step_s
        for r in self.stepping():
            r.beat(now)

    def save_checkpoint(self, rank: FakeRank, step: int) -> None:
        """A checkpoint of ``step`` in ``rank``'s group folder, with its manifest (what the
        controller verifies before it chooses it)."""
        path = step_dir(self.layout.checkpoint(rank.group), step)
        os.makedirs(path, exist_ok=True)
        data = os.path.join(path, "state.bin")
        with open(data, "wb") as f:
            f.write(f"state at step {step}".encode())
        write_manifest(path, build_manifest(step, {"state.bin": file_checksum(data)}))
        rank.event(EventKind.CHECKPOINT_SAVED, step=step, path=path)

    # ------------------------------------------------------------ Launcher
    def launch_group(self, ranks: list[RankLaunch]) -> list[RankProcess]:
        return [self.start(r) for r in ranks]

    def fork_host(self, group: int) -> Optional[ForkHost]:
        return ForkHost("fakehost", [], None)

    def fork_server(self, host: ForkHost, env: dict, log_path: str, cwd: str, preload: Iterable[str] = (), niceness: int = 0) -> FakeForkServer:
        """What WarmForks starts a server with (``Supervisor(fork_server=...)``)."""
        server = FakeForkServer(self, host, log_path)
        server.niceness = niceness
        self.servers.append(server)
        return server

    def adopt(self, launch: RankLaunch, identity, report_path: str) -> RankProcess:
        """A rank a previous controller launched: the same fake, if it is still there."""
        for r in reversed(self.ranks):
            if (r.group, r.rank, r.attempt) == (launch.group, launch.rank, launch.attempt) and r.standby is None:
                return r
        gone = FakeRank(self, launch)
        gone.code = LOST_EXIT
        return gone

    def describe(self) -> dict:
        return {"launcher": self.name, "hosts": "fake"}


# ---------------------------------------------------------------- a job on the fakes
class FakeChaosJob:
    """The chaos injector's view of a running job (``controller.control.JobControl``), for its
    scheduling decisions: every group healthy, live and at step 50 unless a test says otherwise;
    the faults it does are recorded in ``calls``, not done.

    Args:
        run_dir: the run directory (the injector looks for a stop request there).
        groups: the job's replica groups.
    """

    def __init__(self, run_dir: str, groups: int = 2) -> None:
        from types import SimpleNamespace

        self.run_layout = RunLayout(run_dir)
        self.cfg = SimpleNamespace(ft=SimpleNamespace(replica_groups=groups, ranks_per_group=1), training=SimpleNamespace(state_hash_every=0))
        self.first_step_time = 100.0
        self.last_commit = {g: {"step": 50, "participating_groups": list(range(groups)), "time": 101.0} for g in range(groups)}
        self.healthy, self.live = list(range(groups)), list(range(groups))
        self.emitted: list[dict] = []
        self.calls: list[tuple] = []

    @property
    def killed(self) -> list[int]:
        """The groups a rank of which was signalled, in order."""
        return [c[1] for c in self.calls if c[0] == "signal_rank"]

    def healthy_groups(self) -> list[int]:
        return list(self.healthy)

    def live_groups(self) -> list[int]:
        return list(self.live)

    def standby_pending(self) -> bool:
        return False

    def attempt(self, group: int) -> int:
        return 0

    def events_of(self, kind, **match) -> list[dict]:
        return []

    def emit(self, event, **fields) -> dict:
        self.emitted.append({"event": str(event), **fields})
        return self.emitted[-1]

    def signal_rank(self, group: int, rank: int, sig) -> dict:
        self.calls.append(("signal_rank", group, int(sig)))
        return {"signal": int(sig)}

    def kill_host(self, group: int, down_s: Optional[float] = None) -> dict:
        self.calls.append(("kill_host", group, down_s))
        return {"node": f"n{group}", "duration_s": down_s}

    def restore_host_after(self, killed: dict, seconds: float) -> bool:
        self.calls.append(("restore_host_after", killed["node"], seconds))
        return True


def fake_job_config(data_path: str, lighthouse_addr: str, **overrides):
    """A small job's config for the fakes: 2 groups of 1 rank, 30 steps, an external Lighthouse
    at ``lighthouse_addr`` (a listening socket of the test's), the token file ``data_path``;
    ``overrides`` by dotted name (``ft__max_restarts=1`` sets ``ft.max_restarts``)."""
    from monarch_ft.config.job import JobConfig

    cfg = JobConfig()
    cfg.ft.replica_groups, cfg.ft.ranks_per_group = 2, 1
    cfg.training.steps = 30
    cfg.ft.lighthouse_addr = lighthouse_addr
    cfg.data.path = data_path
    for key, value in overrides.items():
        section, name = key.split("__")
        setattr(getattr(cfg, section), name, value)
    return cfg
