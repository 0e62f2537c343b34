"""Finds an RDMA NIC with an active port, through pyverbs (rdma-core's Python API).

Why not ask Mooncake: with protocol ``rdma`` and no device its ``initialize()``
still returns 0 and only ``get_local_topology()`` reveals there is no NIC, so
its return codes cannot be trusted for detection.  pyverbs reads the verbs
devices directly: device -> port -> link state -> GIDs.

pyverbs is part of the default install (scripts/install.sh links the system's
python3-pyverbs, built against the same libibverbs the Mooncake engine loads).
Still, every failure here means "no RDMA", never a crash, because a transport
must come up on any host: pyverbs missing (an install without root or apt-get
has none; one warning line per process says so with the fix: such an install
cannot use RDMA even where a NIC exists), libibverbs listing no device --
``get_device_list()`` raises ``PyverbsRDMAError`` when the kernel
exposes no verbs devices at all, or returns an empty list --, or no ACTIVE port
with a usable GID.  ``discover()`` returns the reason either way so callers
can log which backend they chose and why.
"""

import logging
import os
from dataclasses import dataclass, field
from typing import List, Optional

logger: logging.Logger = logging.getLogger(__name__)

IBV_PORT_ACTIVE = 4
#: How every "the library lists no RDMA device" reason starts.
NO_DEVICE = "no RDMA device"
#: Where the kernel lists verbs devices; libibverbs finds none without it.
SYSFS_VERBS = "/sys/class/infiniband_verbs"
_ZERO_GID = "0000:0000:0000:0000:0000:0000:0000:0000"
#: sysfs root of the RDMA devices, where a port's network interface is named.
SYSFS_IB = "/sys/class/infiniband"


@dataclass
class RdmaPort:
    device: str
    port: int
    link_layer: str  # "InfiniBand" | "Ethernet"
    gids: List[str] = field(default_factory=list)
    netdev: Optional[str] = None  # its network interface (IPoIB / RoCE netdev), if any


@dataclass
class RdmaDiscovery:
    ports: List[RdmaPort]
    reason: str

    @property
    def available(self) -> bool:
        return bool(self.ports)

    @property
    def best(self) -> Optional[RdmaPort]:
        return self.ports[0] if self.ports else None


def _sysfs_note() -> str:
    """Why libibverbs saw nothing, when the reason is that no RDMA driver is loaded."""
    if not os.path.isdir(SYSFS_VERBS):
        return f" ({SYSFS_VERBS} is absent: no RDMA driver loaded)"
    return ""


def _name(dev: object) -> str:
    n = getattr(dev, "name", dev)
    return n.decode() if isinstance(n, (bytes, bytearray)) else str(n)


_warned: set = set()


def _warn_once(message: str) -> None:
    """A process asks more than once (the interface choice, the transport's backend): one line is enough."""
    if message not in _warned:
        _warned.add(message)
        logger.warning(message)


def port_netdev(device: str, port: int, root: str = SYSFS_IB) -> Optional[str]:
    """The network interface of an RDMA port: the netdev of its first GID (RoCE), else
    one of its PCI function's netdevs (IPoIB), from sysfs; None if it has none."""
    ndevs = os.path.join(root, device, "ports", str(port), "gid_attrs", "ndevs")
    try:
        for idx in sorted(os.listdir(ndevs), key=lambda s: int(s) if s.isdigit() else 1 << 30):
            try:
                with open(os.path.join(ndevs, idx)) as f:
                    name = f.read().strip()
            except OSError:  # an unset GID's entry cannot be read
                continue
            if name:
                return name
    except OSError:
        pass
    try:
        nets = sorted(os.listdir(os.path.join(root, device, "device", "net")))
    except OSError:
        return None
    return nets[0] if nets else None


def discover() -> RdmaDiscovery:
    """Lists active RDMA ports; never raises."""
    try:
        import pyverbs.device as d  # type: ignore[import-not-found]
    except Exception as e:  # ImportError, or a broken build raising anything
        _warn_once(
            f"RDMA discovery unavailable: pyverbs not importable ({type(e).__name__}: {e}); the transport uses TCP; "
            "to get it, as root: apt-get install python3-pyverbs && bash scripts/install.sh"
        )
        return RdmaDiscovery([], f"pyverbs not importable ({type(e).__name__}: {e})")
    try:
        devices = d.get_device_list()
    except Exception as e:  # PyverbsRDMAError: libibverbs found no verbs devices at all
        return RdmaDiscovery([], f"{NO_DEVICE}: pyverbs get_device_list() raised {type(e).__name__}: {e}{_sysfs_note()}")
    if not devices:
        return RdmaDiscovery([], f"{NO_DEVICE}: pyverbs get_device_list() returned no devices{_sysfs_note()}")

    ports: List[RdmaPort] = []
    notes: List[str] = []
    for dev in devices:
        name = _name(dev)
        try:
            with d.Context(name=name) as ctx:
                nports = ctx.query_device().phys_port_cnt
                for p in range(1, nports + 1):
                    pa = ctx.query_port(p)
                    if pa.state != IBV_PORT_ACTIVE:
                        notes.append(f"{name}:{p} state={pa.state}")
                        continue
                    gids: List[str] = []
                    for i in range(min(getattr(pa, "gid_tbl_len", 0) or 0, 16)):
                        try:
                            g = str(ctx.query_gid(p, i))
                        except Exception:
                            continue
                        if g and g != _ZERO_GID and set(g) - set("0:"):
                            gids.append(g)
                    ll = "Ethernet" if getattr(pa, "link_layer", 1) == 2 else "InfiniBand"
                    if ll == "Ethernet" and not gids:
                        notes.append(f"{name}:{p} RoCE port without GID")
                        continue
                    ports.append(RdmaPort(name, p, ll, gids, port_netdev(name, p)))
        except Exception as e:
            notes.append(f"{name}: {type(e).__name__}: {e}")
    if ports:
        return RdmaDiscovery(ports, f"active RDMA port {ports[0].device}:{ports[0].port} ({ports[0].link_layer})")
    return RdmaDiscovery([], "no ACTIVE RDMA port (" + "; ".join(notes) + ")")
