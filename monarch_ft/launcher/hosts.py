"""Simulated hosts on one machine: a network namespace per replica group.

Layout of one run (``<id>``: 6 random hex digits, so parallel runs never collide)::

    root namespace                      namespace mft<id>-h<g>
    bridge mft<id>-br 10.213.X.1/24 --- veth mft<id>-v<g> <==> eth0 10.213.X.<g+2>/24, lo up
    (MAC 02:6d:66:<id>, fixed)

``X`` is drawn among the 10.213.X.0/24 subnets no address of the root namespace
uses, under a lock file so that two runs starting together take different ones.
Nothing routes off the subnet: no default route in the namespaces, no forwarding,
no NAT; the bridge address is where supervisor-side services (the Lighthouse) listen.

Each host also has a name, ``mft<id>-h<g>``: ``/etc/netns/<ns>/hosts`` (which
``ip netns exec`` mounts over ``/etc/hosts``) maps every host name of the run to its
address, and the local launcher gives each rank that name as its hostname (a UTS
namespace), so code that advertises ``socket.gethostname()`` (torchft's
HTTPTransport, gloo's default device) advertises an address the other hosts reach.

Network faults act on the root-side veth of one host: ``partition`` takes it down
(packets to and from the host are dropped silently, as in a real partition; the
ranks inside keep talking to each other), ``shape`` adds a tc qdisc on both ends
(``netem`` delay/rate where the kernel has it, else ``tbf`` rate only).

Everything a run creates is recorded in ``/run/monarch_ft/hosts/<id>.json``;
:meth:`SimulatedHosts.close` removes it all, and a later run removes what a run
killed with SIGKILL left behind (its recorded pid is gone).
"""

from __future__ import annotations

import atexit
import ctypes
import fcntl
import json
import os
import random
import secrets
import shutil
import signal
import subprocess
import threading
import time
from dataclasses import dataclass
from typing import Callable, Optional

from monarch_ft.common.process import die_with_parent, start_ticks
from monarch_ft.records.errors import ConfigError

PREFIX = "10.213"
STATE_DIR = "/run/monarch_ft/hosts"
LOCK_PATH = "/run/monarch_ft/hosts.lock"
MAX_HOSTS = 253  # .2 .. .254 of the /24
_CLONE_NEWUTS = 0x04000000
_CLONE_NEWNS = 0x00020000
_CLONE_NEWNET = 0x40000000
_MS_BIND = 4096
_MS_REC = 16384
_MS_PRIVATE = 1 << 18


class HostSetupError(ConfigError):
    """Simulated hosts could not be made; the message says what to change (one line)."""


@dataclass
class Host:
    group: int
    netns: str
    address: str
    veth: str  # root-namespace end, on the bridge
    ifname: str = "eth0"  # the namespace's end

    def describe(self) -> dict:
        return {"netns": self.netns, "address": self.address, "veth": self.veth, "hostname": self.netns}


def _run(*argv: str, check: bool = True) -> subprocess.CompletedProcess:
    res = subprocess.run(list(argv), capture_output=True, text=True, timeout=30)
    if check and res.returncode != 0:
        raise HostSetupError(f"`{' '.join(argv)}` failed: {(res.stderr or res.stdout).strip()}")
    return res


def _refused(err: str) -> bool:
    return any(s in err for s in ("Operation not permitted", "Permission denied", "must be root", "Read-only file system"))


def on_host(hostname: str, die_with_controller: bool) -> Callable[[], None]:
    """preexec for a process on a simulated host (a rank, a Slurm node's slurmd): take the
    host's name (its own UTS namespace: the machine's hostname is left alone); die with the
    process that starts it only if asked (a waiting standby): the simulated hosts outlive a
    controller whose ranks run in them."""
    name = hostname.encode()

    def preexec() -> None:
        if die_with_controller:
            die_with_parent()
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        if libc.unshare(_CLONE_NEWUTS) == 0:
            libc.sethostname(name, len(name))

    return preexec


def enter_host(netns: str, hostname: str) -> Callable[[], None]:
    """preexec that puts a daemon on a simulated host as ``ip netns exec`` would (the host's
    network namespace, its hosts file over /etc/hosts, its host name in a UTS namespace of
    its own) but keeps this machine's /sys: ``ip netns exec`` mounts a fresh sysfs, without
    the cgroup hierarchies under /sys/fs/cgroup that slurmd needs to start. Its mounts are
    private to it (a mount namespace of its own), as ip netns exec's are."""
    path = f"/run/netns/{netns}"
    hosts = os.path.join("/etc/netns", netns, "hosts").encode()
    name = hostname.encode()

    def preexec() -> None:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        fd = os.open(path, os.O_RDONLY)
        try:
            if libc.setns(fd, _CLONE_NEWNET) != 0:
                raise OSError(ctypes.get_errno(), f"setns({path})")
        finally:
            os.close(fd)
        if libc.unshare(_CLONE_NEWNS | _CLONE_NEWUTS) != 0:
            raise OSError(ctypes.get_errno(), "unshare(mount, uts)")
        libc.mount(b"none", b"/", None, _MS_REC | _MS_PRIVATE, None)
        if os.path.exists(hosts):
            libc.mount(hosts, b"/etc/hosts", None, _MS_BIND, None)
        libc.sethostname(name, len(name))

    return preexec


# The longest set_veth waits for a link brought up to forward.
LINK_SETTLE_S = 3.0
# A bridge port's state that forwards (BR_STATE_FORWARDING).
BR_STATE_FORWARDING = "3"


def set_veth(veth: str, up: bool, settle_s: float = LINK_SETTLE_S) -> None:
    """A host's root-side veth up or down: down, the host is cut off the bridge (packets to
    and from it dropped silently, as in a real partition or a machine that lost power).

    Up returns once the bridge forwards the host's packets again (at most ``settle_s``): the
    kernel takes a carrier change in a little later (its link watch runs up to a second
    behind), and a partition said restored while the bridge still dropped the host's packets
    (a connection tried at once failed, CI) made the recorded restore early."""
    _run("ip", "link", "set", veth, "up" if up else "down")
    if up:
        deadline = time.monotonic() + settle_s
        while not _forwarding(veth) and time.monotonic() < deadline:
            time.sleep(0.01)


def _forwarding(veth: str) -> bool:
    """The veth is up with its carrier and, as a bridge port, forwarding."""
    try:
        with open(f"/sys/class/net/{veth}/operstate") as f:
            if f.read().strip() != "up":
                return False
        with open(f"/sys/class/net/{veth}/brport/state") as f:
            return f.read().strip() == BR_STATE_FORWARDING
    except OSError:
        return True  # not a bridge port (or gone): nothing to wait for


def netns_pids(netns: str) -> list[int]:
    """Every process in network namespace ``netns`` (none once it is gone)."""
    out = _run("ip", "netns", "pids", netns, check=False).stdout
    return [int(p) for p in out.split() if p.isdigit()]


class SimulatedHosts:
    """Bridge + one namespace per group, created on first use, removed by :meth:`close`."""

    def __init__(self, prefix: str = PREFIX) -> None:
        if shutil.which("ip") is None:
            raise HostSetupError("launcher.options.simulated_hosts needs iproute2 (`ip`): install it, or drop launcher.options.simulated_hosts")
        self.id = secrets.token_hex(3)
        self.bridge = f"mft{self.id}-br"
        self.hosts: dict[int, Host] = {}
        self._shaped: set[int] = set()
        self._lock = threading.RLock()
        self._closed = False
        self._state_path = os.path.join(STATE_DIR, f"{self.id}.json")
        try:
            os.makedirs(STATE_DIR, exist_ok=True)
        except OSError as e:
            raise HostSetupError(f"cannot create {STATE_DIR} ({e.strerror}): run as root, or drop launcher.options.simulated_hosts")
        cleanup_stale()
        # Also torn down if the process exits without close() (an error before the job ran),
        # unless its ranks still run in them (a detached controller: see _at_exit).
        atexit.register(self._at_exit)
        with open(LOCK_PATH, "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                self.subnet = f"{prefix}.{self._free_octet(prefix)}"
                self.bridge_address = f"{self.subnet}.1"
                self._save()
                self._create_bridge()
            except BaseException:
                self.close()
                raise
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    # ------------------------------------------------------------------ setup
    @staticmethod
    def _free_octet(prefix: str) -> int:
        used = set()
        out = _run("ip", "-4", "-o", "addr", "show").stdout
        for line in out.splitlines():
            parts = line.split()
            if "inet" in parts:
                addr = parts[parts.index("inet") + 1]
                if addr.startswith(prefix + "."):
                    used.add(int(addr.split(".")[2]))
        for path in _state_files():
            try:
                subnet = json.load(open(path)).get("subnet", "")
                if subnet.startswith(prefix + "."):
                    used.add(int(subnet.split(".")[2]))
            except (OSError, ValueError):
                pass
        free = [x for x in range(1, 255) if x not in used]
        if not free:
            raise HostSetupError(f"no free {prefix}.X.0/24 subnet left for simulated hosts")
        return random.choice(free)

    def _save(self) -> None:
        state = {
            "pid": os.getpid(),
            "start_time": start_ticks(os.getpid()),
            "subnet": self.subnet,
            "bridge": self.bridge,
            "netns": [h.netns for h in self.hosts.values()],
        }
        with open(self._state_path + ".tmp", "w") as f:
            json.dump(state, f)
        os.replace(self._state_path + ".tmp", self._state_path)

    @property
    def bridge_mac(self) -> str:
        """The bridge's own MAC: locally administered (02:), "mf", then the run id's 3 bytes."""
        return ":".join(["02", "6d", "66", self.id[0:2], self.id[2:4], self.id[4:6]])

    def _create_bridge(self) -> None:
        """The bridge, with its MAC fixed at creation, before any port joins.

        Pin what other hosts depend on: every host reaches the bridge address (the Lighthouse,
        the controller's services) through a neighbour (ARP) entry naming the bridge's MAC. A
        bridge whose MAC was never set takes the lowest MAC of its ports, so a host joining
        with a lower veth MAC (a standby, a relaunch on a fresh host), or the host whose MAC
        it took leaving, changes it; the other hosts' frames then go to a MAC the bridge no
        longer takes as its own and are dropped until an ARP from the bridge corrects their
        entry or it expires (measured: 0.4 s for a busy connection, 30-55 s for a host that
        was quiet: quorum calls lost, connects failing by their deadline). A MAC set by hand
        is never recomputed from the ports."""
        res = _run("ip", "link", "add", self.bridge, "address", self.bridge_mac, "type", "bridge", check=False)
        if res.returncode != 0:
            err = res.stderr.strip()
            if _refused(err):
                raise HostSetupError(
                    f"creating network namespaces and bridges was refused ({err}): run as root (CAP_NET_ADMIN), or drop launcher.options.simulated_hosts"
                )
            raise HostSetupError(f"cannot create bridge {self.bridge} ({err}): drop launcher.options.simulated_hosts")
        _run("ip", "addr", "add", f"{self.bridge_address}/24", "dev", self.bridge)
        _run("ip", "link", "set", self.bridge, "up")

    def host(self, group: int) -> Host:
        """The host of ``group``, created (namespace, veth, addresses, hosts file) on first use."""
        with self._lock:
            if self._closed:
                raise HostSetupError("the simulated hosts are closed")
            if group in self.hosts:
                return self.hosts[group]
            if not 0 <= group < MAX_HOSTS:
                raise HostSetupError(f"simulated hosts hold at most {MAX_HOSTS} groups per run (group {group})")
            h = Host(group, f"mft{self.id}-h{group}", f"{self.subnet}.{group + 2}", f"mft{self.id}-v{group}")
            self.hosts[group] = h
            self._save()  # recorded before it exists: a crash mid-way is still cleaned up
            res = _run("ip", "netns", "add", h.netns, check=False)
            if res.returncode != 0:
                err = res.stderr.strip()
                hint = "run as root" if _refused(err) else "check `ip netns list`"
                raise HostSetupError(f"`ip netns add {h.netns}` was refused ({err}): {hint}, or drop launcher.options.simulated_hosts")
            peer = f"mft{self.id}-p{group}"
            _run("ip", "link", "add", h.veth, "type", "veth", "peer", "name", peer)
            _run("ip", "link", "set", peer, "netns", h.netns)
            _run("ip", "link", "set", h.veth, "master", self.bridge)
            _run("ip", "link", "set", h.veth, "up")
            _run("ip", "-n", h.netns, "link", "set", peer, "name", h.ifname)
            _run("ip", "-n", h.netns, "addr", "add", f"{h.address}/24", "dev", h.ifname)
            _run("ip", "-n", h.netns, "link", "set", h.ifname, "up")
            _run("ip", "-n", h.netns, "link", "set", "lo", "up")
            self._write_hosts_file(h)
            return h

    def _write_hosts_file(self, h: Host) -> None:
        """Every possible host name of this run -> its address (no rewrite as groups appear)."""
        d = os.path.join("/etc/netns", h.netns)
        try:
            os.makedirs(d, exist_ok=True)
            lines = ["127.0.0.1 localhost", "::1 localhost ip6-localhost ip6-loopback", f"{self.bridge_address} mft{self.id}-control"]
            lines += [f"{self.subnet}.{g + 2} mft{self.id}-h{g}" for g in range(MAX_HOSTS)]
            with open(os.path.join(d, "hosts"), "w") as f:
                f.write("\n".join(lines) + "\n")
        except OSError:
            # Without it the ranks keep the machine's /etc/hosts: addresses still work,
            # only gethostname()-based advertising (HTTPTransport) does not.
            shutil.rmtree(d, ignore_errors=True)

    # ------------------------------------------------------------------ faults
    def set_link(self, group: int, up: bool) -> None:
        """Partition (down) or reconnect (up) one host: its veth on the bridge."""
        with self._lock:
            set_veth(self.hosts[group].veth, up)

    def link_up(self, group: int) -> bool:
        h = self.hosts[group]
        out = _run("ip", "-o", "link", "show", h.veth, check=False).stdout
        return "state UP" in out or ",UP" in out.split(">")[0]

    def shape(self, group: int, delay_ms: float = 0.0, rate: Optional[str] = None) -> dict:
        """A slow link for one host, both directions: netem delay (and rate), or tbf rate."""
        qdisc = shaping_qdisc(delay_ms, rate)
        with self._lock:
            h = self.hosts[group]
            _run("tc", "qdisc", "replace", "dev", h.veth, "root", *qdisc)
            _run("tc", "-n", h.netns, "qdisc", "replace", "dev", h.ifname, "root", *qdisc)
            self._shaped.add(group)
        return {"qdisc": " ".join(qdisc)}

    def unshape(self, group: int) -> None:
        with self._lock:
            h = self.hosts.get(group)
            if h is None or group not in self._shaped:
                return
            _run("tc", "qdisc", "del", "dev", h.veth, "root", check=False)
            _run("tc", "-n", h.netns, "qdisc", "del", "dev", h.ifname, "root", check=False)
            self._shaped.discard(group)

    def pids(self, group: int) -> list[int]:
        h = self.hosts.get(group)
        return netns_pids(h.netns) if h is not None else []

    # ------------------------------------------------------------------ a job that outlives its controller
    @classmethod
    def adopt(cls, run_id: str) -> Optional["SimulatedHosts"]:
        """The simulated hosts of run ``run_id``, made by a controller that is gone, now this
        process's (controller.attach): its ranks still run in them. None if they are gone
        (every rank ended and some later run's :func:`cleanup_stale` removed them)."""
        path = os.path.join(STATE_DIR, f"{run_id}.json")
        try:
            state = json.load(open(path))
        except (OSError, ValueError):
            return None
        if _run("ip", "link", "show", state.get("bridge", ""), check=False).returncode != 0:
            return None
        self = cls.__new__(cls)
        self.id, self.bridge, self.subnet = run_id, state["bridge"], state["subnet"]
        self.bridge_address = f"{self.subnet}.1"
        # Pinned as it is (_create_bridge says why): its hosts' entries name the address it has
        # now, and a bridge made before MACs were pinned would still follow its ports. Without
        # it the hosts work as before, so a refusal does not stop the adoption.
        try:
            mac = open(f"/sys/class/net/{self.bridge}/address").read().strip()
            _run("ip", "link", "set", "dev", self.bridge, "address", mac, check=False)
        except OSError:
            pass
        self.hosts = {}
        for ns in state.get("netns", []):
            g = int(ns.rsplit("-h", 1)[1])
            self.hosts[g] = Host(g, ns, f"{self.subnet}.{g + 2}", f"mft{run_id}-v{g}")
        self._shaped, self._lock, self._closed, self._state_path = set(), threading.RLock(), False, path
        self._save()  # this process owns them now
        atexit.register(self._at_exit)
        return self

    def heal_links(self) -> None:
        """Every link up and unshaped: a network fault in flight when the controller that
        made it died has no timer left to undo it."""
        with self._lock:
            for h in self.hosts.values():
                _run("ip", "link", "set", h.veth, "up", check=False)
                _run("tc", "qdisc", "del", "dev", h.veth, "root", check=False)
                _run("tc", "-n", h.netns, "qdisc", "del", "dev", h.ifname, "root", check=False)
            self._shaped.clear()

    def in_use(self) -> bool:
        return any(self.pids(g) for g in list(self.hosts))

    def _at_exit(self) -> None:
        """At exit without close(): torn down, unless ranks still run in them (a detached
        controller leaves a job running there, for a new controller to adopt)."""
        if not self._closed and not self.in_use():
            self.close()

    # ------------------------------------------------------------------ teardown
    def close(self) -> None:
        """Remove every namespace, veth, the bridge and the hosts files; safe to call twice."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            teardown(self.bridge, [h.netns for h in self.hosts.values()], [h.veth for h in self.hosts.values()])
            try:
                os.remove(self._state_path)
            except OSError:
                pass


def shaping_qdisc(delay_ms: float, rate: Optional[str]) -> list[str]:
    if delay_ms and delay_ms > 0:
        args = ["netem", "delay", f"{delay_ms:g}ms"]
        if rate:
            args += ["rate", rate]
        return args
    if not rate:
        raise ValueError("a slow link needs delay_ms > 0 or a rate (e.g. 1mbit)")
    return ["tbf", "rate", rate, "burst", "32kbit", "latency", "400ms"]


def qdisc_supported(kind: str) -> bool:
    """Whether this kernel has the tc qdisc ``kind`` (tried on lo of a throw-away namespace)."""
    ns = f"mftprobe{secrets.token_hex(3)}"
    if _run("ip", "netns", "add", ns, check=False).returncode != 0:
        return False
    try:
        args = {"netem": ["netem", "delay", "1ms"], "tbf": ["tbf", "rate", "1mbit", "burst", "32kbit", "latency", "400ms"]}.get(kind, [kind])
        return _run("tc", "-n", ns, "qdisc", "add", "dev", "lo", "root", *args, check=False).returncode == 0
    finally:
        _run("ip", "netns", "del", ns, check=False)


def teardown(bridge: str, netns: list[str], veths: list[str]) -> None:
    for ns in netns:
        # Anything still running in the namespace would keep it (and its veth) alive.
        out = _run("ip", "netns", "pids", ns, check=False).stdout
        for p in out.split():
            try:
                os.kill(int(p), signal.SIGKILL)
            except (ProcessLookupError, ValueError):
                pass
        _run("ip", "netns", "del", ns, check=False)
        shutil.rmtree(os.path.join("/etc/netns", ns), ignore_errors=True)
    for v in veths:  # gone with their namespace's end; only a half-made pair remains
        _run("ip", "link", "del", v, check=False)
    if bridge:
        _run("ip", "link", "del", bridge, check=False)


def _state_files() -> list[str]:
    try:
        return [os.path.join(STATE_DIR, n) for n in os.listdir(STATE_DIR) if n.endswith(".json")]
    except OSError:
        return []


def cleanup_stale() -> list[str]:
    """Remove what runs that died without closing left behind (their pid is gone)."""
    removed = []
    for path in _state_files():
        try:
            state = json.load(open(path))
        except (OSError, ValueError):
            continue
        pid = state.get("pid")
        started = start_ticks(pid) if pid else None
        if started is not None and started == state.get("start_time"):
            continue  # that run is alive
        if any(_run("ip", "netns", "pids", ns, check=False).stdout.split() for ns in state.get("netns", [])):
            continue  # its controller is gone but its job runs on (a new controller may adopt it)
        sid = os.path.basename(path)[: -len(".json")]
        veths = [n.replace("-h", "-v") for n in state.get("netns", [])]
        teardown(state.get("bridge", ""), state.get("netns", []), veths)
        removed.append(sid)
        try:
            os.remove(path)
        except OSError:
            pass
    return removed
