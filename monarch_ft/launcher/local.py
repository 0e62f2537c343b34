"""Ranks as local OS processes: the embedded default launcher.

``launcher.options.simulated_hosts: true`` (``launcher=local_hosts``) puts each replica
group on its own simulated host (:mod:`monarch_ft.launcher.hosts`): a network namespace with
its own address on a bridge. The group's ranks run under ``ip netns exec <ns>``
(``ip`` execs the rank, so the pid held is the rank's own python, signals reach it and
``PR_SET_PDEATHSIG`` still applies), with the host's name as their hostname, and bind
and advertise the host's address; the Lighthouse listens on the bridge address.
Network faults (:meth:`LocalLauncher.partition`, :meth:`LocalLauncher.slow_link`) act
on one host's link and undo themselves after ``seconds`` (a timer thread).
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import threading
import time
from dataclasses import dataclass
from typing import Callable, Optional

from monarch_ft.common.cpu_priority import to_background
from monarch_ft.common.process import die_with_parent
from monarch_ft.launcher.hosts import on_host
from monarch_ft.launcher.base import AdoptedProcess, Capability, ForkHost, Launcher, LauncherOptions, LauncherTraits, RankLaunch, RankProcess, restore_later


@dataclass
class Options(LauncherOptions):
    """``launcher=local`` (and ``launcher=local_hosts``, which only sets ``simulated_hosts``)."""

    simulated_hosts: bool = False
    """Each replica group on its own simulated host: a network namespace with its own address on a
    bridge (monarch_ft.launcher.hosts; needs root). Network faults (partition, slow_link) need it."""


def _niced(preexec: Optional[Callable[[], None]], niceness: int) -> Optional[Callable[[], None]]:
    """``preexec`` followed by ``niceness`` (RankLaunch.niceness), applied in the child before
    it execs: every thread the rank later starts inherits it."""
    if not niceness:
        return preexec

    def run() -> None:
        if preexec is not None:
            preexec()
        to_background(niceness)

    return run


class LocalProcess(RankProcess):
    def __init__(self, launch: RankLaunch, proc: subprocess.Popen) -> None:
        self.launch = launch
        self.proc = proc

    @property
    def pid(self) -> Optional[int]:
        return self.proc.pid

    def poll(self) -> Optional[int]:
        return self.proc.poll()

    def send_signal(self, sig: int) -> None:
        if self.proc.poll() is None:
            try:
                os.kill(self.proc.pid, sig)
            except ProcessLookupError:
                pass

    def wait(self, timeout: float) -> Optional[int]:
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None


class LocalLauncher(Launcher):
    name = "local"
    # Its ranks are this machine's processes: a new controller re-adopts them by pid and start
    # time, a fork server can fork them, and a standby costs only local processes.
    traits = LauncherTraits(adoptable=True, forkable=True, ranks_on_this_machine=True, default_standby_groups=1)

    @classmethod
    def traits_for(cls, options: Optional[Options]) -> LauncherTraits:
        return dataclasses.replace(cls.traits, simulated_hosts=bool(options and options.simulated_hosts))

    def __init__(self, simulated_hosts: bool = False) -> None:
        self.hosts = None
        self._timers: dict[int, threading.Timer] = {}
        self._faults: dict[int, dict] = {}
        self._fault_lock = threading.Lock()
        # group -> the host slot its ranks run on, for a group a promoted standby (placed on a
        # host of its own) now serves; other groups run on host slot == group.
        self._placement: dict[int, int] = {}
        if simulated_hosts:
            from monarch_ft.launcher.hosts import SimulatedHosts

            self.hosts = SimulatedHosts()

    @property
    def simulated_hosts(self) -> bool:
        return self.hosts is not None

    @property
    def capabilities(self) -> set:
        return {Capability.PARTITION, Capability.SLOW_LINK} if self.hosts is not None else set()

    # ------------------------------------------------------------------ layout
    def place_group(self, group: int, slot: int) -> None:
        """``group`` now runs on host slot ``slot`` (a promoted standby's). A slot is never
        reused once its group left it (a new standby gets a fresh one), so a host excluded after a
        straggler's eviction (``JobState.excluded_hosts``) needs no placement to read it here."""
        self._placement[group] = slot

    def _slot(self, group: int) -> int:
        return self._placement.get(group, group)

    def group_host(self, group: int) -> str:
        if self.hosts is None:
            return super().group_host(group)
        return self.hosts.host(self._slot(group)).address

    def control_host(self) -> str:
        if self.hosts is None:
            return super().control_host()
        return self.hosts.bridge_address

    def describe(self) -> dict:
        if self.hosts is None:
            return super().describe()
        return {
            "launcher": self.name,
            "hosts": {g: {"netns": h.netns, "address": h.address} for g, h in sorted(self.hosts.hosts.items())},
            "bridge": {"name": self.hosts.bridge, "address": self.hosts.bridge_address},
        }

    # ------------------------------------------------------------------ launch
    def _argv_env(self, r: RankLaunch) -> tuple[list[str], dict[str, str], Optional[Callable[[], None]]]:
        if self.hosts is None:
            return r.argv, r.env, die_with_parent if r.die_with_controller else None
        h = self.hosts.host(self._slot(r.group))
        r.host = h.netns
        env = dict(r.env)
        # ShardedTransport's advertised host (when build_transport passes none).
        env.setdefault("MONARCH_FT_TRANSPORT_HOST", h.address)
        return ["ip", "netns", "exec", h.netns, *r.argv], env, on_host(h.netns, r.die_with_controller)

    def launch_group(self, ranks: list[RankLaunch]) -> list[RankProcess]:
        started: list[RankProcess] = []
        try:
            for r in ranks:
                argv, env, preexec = self._argv_env(r)
                os.makedirs(os.path.dirname(r.log_path), exist_ok=True)
                with open(r.log_path, "ab") as log:
                    proc = subprocess.Popen(
                        argv,
                        env=env,
                        cwd=r.cwd,
                        stdout=log,
                        stderr=subprocess.STDOUT,
                        stdin=subprocess.DEVNULL,
                        # Own session: a Ctrl-C in the terminal reaches the supervisor only,
                        # which then stops the ranks itself. Not tied to the supervisor's
                        # life (no PR_SET_PDEATHSIG): a new controller takes them over
                        # (monarch_ft.controller), or their lease ends them.
                        start_new_session=True,
                        preexec_fn=_niced(preexec, r.niceness),
                    )
                started.append(LocalProcess(r, proc))
        except Exception:
            for p in started:
                p.kill()
            raise
        return started

    def fork_host(self, group: int) -> Optional[ForkHost]:
        """One fork server per host (monarch_ft.controller.fork_pool): for local_hosts in the group's
        namespace, with its host name, so the ranks it forks live there as _argv_env's do.
        The server dies with the controller; the ranks it forks outlive it, as launched ones do."""
        if self.hosts is None:
            return ForkHost("localhost", [], die_with_parent)
        h = self.hosts.host(self._slot(group))
        return ForkHost(h.netns, ["ip", "netns", "exec", h.netns], on_host(h.netns, True), {"MONARCH_FT_TRANSPORT_HOST": h.address}, h.netns, h.netns)

    def handles(self) -> dict:
        """The simulated hosts' run id (a new controller adopts them: they outlive the
        controller whose ranks run in them) and where promoted standbys run."""
        # A new dict, as JSON reads it back (str keys): the takeover state's mirror keeps what it
        # last wrote by identity (the live dict hid every later placement), and its journal
        # names a changed key as it is (an int key came back as another key than the base's).
        placement = {str(g): s for g, s in self._placement.items()}
        if self.hosts is None:
            return {"placement": placement} if placement else {}
        return {"hosts": self.hosts.id, "placement": placement}

    def restore_handles(self, handles: dict) -> None:
        self._placement = {int(g): s for g, s in (handles.get("placement") or {}).items()}
        if self.hosts is None or not handles.get("hosts") or handles["hosts"] == self.hosts.id:
            return
        from monarch_ft.launcher.hosts import SimulatedHosts

        old = SimulatedHosts.adopt(handles["hosts"])
        if old is not None:  # else gone with every rank: lost groups relaunch on this process's own
            self.hosts.close()
            self.hosts = old
            old.heal_links()

    def adopt(self, launch: RankLaunch, identity, report_path: str) -> RankProcess:
        """Re-adopt a rank by pid and start time (monarch_ft.launcher.base.AdoptedProcess)."""
        return AdoptedProcess(launch, identity, report_path)

    # ------------------------------------------------------------------ network faults
    def _need_hosts(self, what: str):
        if self.hosts is None:
            raise RuntimeError(f"{what} needs simulated hosts: use launcher=local_hosts (launcher.options.simulated_hosts=true)")
        return self.hosts

    def _start_fault(self, group: int, kind: str, seconds: float, undo: Callable[[], None], on_restore, details: dict) -> dict:
        with self._fault_lock:
            if group in self._faults:
                raise RuntimeError(f"group {group}'s link already has a {self._faults[group]['kind']} fault")
            started = time.time()
            self._faults[group] = {"kind": kind, "undo": undo, "started": started}

        timer = self._timers[group] = restore_later(seconds, lambda: self.restore_link(group), on_restore)
        timer.start()
        h = self.hosts.hosts[self._slot(group)]
        return {"netns": h.netns, "veth": h.veth, "duration_s": seconds, **details}

    def partition(self, group: int, seconds: float, on_restore: Optional[Callable[[dict], None]] = None) -> dict:
        """Cut ``group``'s host off the network (its veth down) for ``seconds``, then restore it."""
        hosts, slot = self._need_hosts("a partition fault"), self._slot(group)
        hosts.host(slot)
        hosts.set_link(slot, up=False)
        return self._start_fault(group, "partition", seconds, lambda: hosts.set_link(slot, up=True), on_restore, {"action": "link down"})

    def slow_link(
        self, group: int, delay_ms: float = 0.0, rate: Optional[str] = None, seconds: float = 10.0, on_restore: Optional[Callable[[dict], None]] = None
    ) -> dict:
        """Add latency (netem) and/or a rate limit (netem or tbf) to ``group``'s link for ``seconds``."""
        hosts, slot = self._need_hosts("a slow_link fault"), self._slot(group)
        hosts.host(slot)
        shaped = hosts.shape(slot, delay_ms, rate)
        return self._start_fault(group, "slow_link", seconds, lambda: hosts.unshape(slot), on_restore, {"delay_ms": delay_ms, "rate": rate, **shaped})

    def restore_link(self, group: int) -> Optional[dict]:
        """Undo ``group``'s network fault now (also what the timer does); None if there is none."""
        with self._fault_lock:
            fault = self._faults.pop(group, None)
            timer = self._timers.pop(group, None)
        if timer is not None and timer is not threading.current_thread():
            timer.cancel()
        if fault is None:
            return None
        fault["undo"]()
        now = time.time()
        return {"kind": fault["kind"], "restored_at": now, "lasted_s": round(now - fault["started"], 3)}

    def close(self) -> None:
        if self.hosts is None:
            return
        try:
            for g in list(self._faults):
                try:
                    self.restore_link(g)
                except Exception:
                    pass
        finally:
            self.hosts.close()


LAUNCHER = LocalLauncher


def build(cfg, run_dir: str) -> LocalLauncher:
    return LocalLauncher(simulated_hosts=Options.parse(cfg.options, cfg.name).simulated_hosts)
