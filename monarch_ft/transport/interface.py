"""Which local address a rank's checkpoint transport binds to and advertises.

Why explicit: advertising the host name lets the resolver pick the interface, and
on a host with both Ethernet and InfiniBand it may pick Ethernet; a TorchFT user
measured 948 s from fault to recovery that way (torchft issue #329).  The rule,
in order:

1. ``ft.transport_interface``, when set: an interface name (its address) or an
   address one of this host's interfaces holds.  Anything else is an error.
2. The interface of the RDMA port that discovery found (its IPoIB or RoCE netdev),
   when it has an address: checkpoint bytes then travel over the RDMA fabric.
3. The route to the Lighthouse: the local address the kernel uses to reach the
   Lighthouse host, i.e. the network the job's control traffic already uses, and
   so one that the other hosts of the job reach.
4. Failing all that (no route to the Lighthouse): the host name, on every interface.

:func:`choose` is the rule, a pure function of what the host has; :func:`resolve`
gathers that from the host (its interfaces, RDMA discovery, the kernel's route).
"""

import ipaddress
import socket
from dataclasses import dataclass
from typing import Dict, List, Mapping, Optional, Sequence

from monarch_ft.common.net import host_port, route_to
from monarch_ft.transport import rdma_discovery
from monarch_ft.transport.rdma_discovery import RdmaPort


class InterfaceError(ValueError):
    """The configured interface or address is not on this host; the message lists what is."""


@dataclass(frozen=True)
class Choice:
    """The address to bind and advertise, the interface holding it, and why it was chosen.

    Args:
        address: the IP address to advertise (the host name in the last resort).
        interface: the interface holding ``address`` (None when unknown).
        why: the rule that picked it, for the log and the rank's events.
        bind: the address to listen on ("": every interface).
    """

    address: str
    interface: Optional[str]
    why: str
    bind: str


def usable(addresses: Sequence[str]) -> Optional[str]:
    """The address of an interface to use: IPv4 first, then a global IPv6 (a link-local
    one needs a scope id that a peer cannot be told in ``host:port``)."""
    v6 = [a for a in addresses if ":" in a and not ipaddress.ip_address(a.split("%")[0]).is_link_local]
    v4 = [a for a in addresses if ":" not in a]
    return (v4 or v6 or [None])[0]


def local_interfaces() -> Dict[str, List[str]]:
    """Interface name -> its IP addresses, as this network namespace sees them."""
    import psutil

    return {name: [a.address.split("%")[0] for a in addrs if a.family in (socket.AF_INET, socket.AF_INET6)] for name, addrs in psutil.net_if_addrs().items()}


def describe(interfaces: Mapping[str, Sequence[str]]) -> str:
    return ", ".join(f"{n} {usable(a) or '(no address)'}" for n, a in sorted(interfaces.items())) or "none"


def _holder(address: str, interfaces: Mapping[str, Sequence[str]]) -> Optional[str]:
    ip = ipaddress.ip_address(address)
    for name, addrs in interfaces.items():
        if any(ipaddress.ip_address(a) == ip for a in addrs):
            return name
    return None


def choose(
    setting: Optional[str],
    interfaces: Mapping[str, Sequence[str]],
    rdma_port: Optional["RdmaPort"] = None,
    lighthouse_route: Optional[str] = None,
    lighthouse: str = "the Lighthouse",
) -> Choice:
    """Applies the rule of this module's docstring.

    Args:
        setting: ``ft.transport_interface``: an interface name, an address, or None.
        interfaces: this host's interfaces and their addresses (:func:`local_interfaces`).
        rdma_port: the port RDMA discovery found, if any (its ``netdev`` is used).
        lighthouse_route: the local address the kernel uses to reach the Lighthouse,
            None when there is no route.
        lighthouse: the Lighthouse's host, for the reason text.

    Raises:
        InterfaceError: ``setting`` names no interface with an address, nor an address
            of this host.
    """
    if setting:
        try:
            ipaddress.ip_address(setting)
        except ValueError:
            if setting not in interfaces:
                raise InterfaceError(f"no interface or address {setting!r} here (this host has: {describe(interfaces)})")
            addr = usable(interfaces[setting])
            if addr is None:
                raise InterfaceError(f"interface {setting!r} has no usable address (this host has: {describe(interfaces)})")
            return Choice(addr, setting, f"ft.transport_interface={setting} (configured)", addr)
        holder = _holder(setting, interfaces)
        if holder is None:
            raise InterfaceError(f"no interface here holds the address {setting} (this host has: {describe(interfaces)})")
        return Choice(setting, holder, f"ft.transport_interface={setting} (configured)", setting)
    rdma_note = ""
    if rdma_port is not None:
        label = f"{rdma_port.device}:{rdma_port.port}"
        netdev = getattr(rdma_port, "netdev", None)
        addr = usable(interfaces.get(netdev, [])) if netdev else None
        if addr is not None:
            return Choice(addr, netdev, f"interface of RDMA port {label} ({rdma_port.link_layer}) found by discovery", addr)
        rdma_note = f"; RDMA port {label} has no interface with an address"
    if lighthouse_route is not None:
        holder = _holder(lighthouse_route, interfaces)
        return Choice(lighthouse_route, holder, f"route to the Lighthouse host {lighthouse}{rdma_note}", lighthouse_route)
    name = socket.gethostname()
    return Choice(name, None, f"no route to the Lighthouse host {lighthouse}: the host name, every interface{rdma_note}", "")


def resolve(setting: Optional[str], lighthouse_addr: str) -> Choice:
    """:func:`choose` on this host: its interfaces, RDMA discovery, the route to the Lighthouse.

    Args:
        setting: ``ft.transport_interface``.
        lighthouse_addr: the Lighthouse's address, ``http://host:port`` or ``host:port``.
    """
    interfaces = local_interfaces()
    if setting:
        return choose(setting, interfaces)
    host, port = host_port(lighthouse_addr)
    try:
        route: Optional[str] = route_to(host, port)
    except OSError:
        route = None
    return choose(None, interfaces, rdma_discovery.discover().best, route, host)
