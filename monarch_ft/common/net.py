"""Small socket helpers: free ports, port-in-use checks, reachability."""

from __future__ import annotations

import random
import socket
from collections import deque
from urllib.parse import urlparse


# free_port hands out ports from here up to just below the kernel's ephemeral range.
PORT_FLOOR = 10000
# The ports this process handed out lately: one is not handed out twice before it is bound.
_handed: deque[int] = deque(maxlen=1024)


def ephemeral_range(path: str = "/proc/sys/net/ipv4/ip_local_port_range") -> tuple[int, int]:
    """The kernel's ephemeral port range (where port 0 binds and outbound connections land)."""
    try:
        with open(path) as f:
            low, high = (int(x) for x in f.read().split())
        return low, high
    except (OSError, ValueError):
        return 32768, 60999  # Linux's default


def free_port(host: str = "127.0.0.1") -> int:
    """A port free on ``host`` now, for a process that binds it later (a rank's store, seconds
    after its launch, once it has imported torch); for an address this namespace doesn't hold
    (a simulated host's), a port free on loopback: each network namespace has its own port space.

    Why not the kernel's pick (binding port 0): it comes from the ephemeral range, which every
    outbound connection on the host draws from too, and a port is free only until someone takes
    it: a standby that imported for 13 s before binding its store found its port taken (EADDRINUSE:
    the standby was lost and rebuilt, CI at 479016f). A port below that range is only ever taken
    by a bind. The kernel's pick remains where the range leaves no room below it.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family) as s:
        try:
            s.bind((host, 0))
        except OSError:
            host = "127.0.0.1"
            family = socket.AF_INET
    low, _ = ephemeral_range()
    if low - PORT_FLOOR >= 1024:
        for _ in range(100):
            port = random.randrange(PORT_FLOOR, low)
            if port not in _handed and not port_in_use(host, port):
                _handed.append(port)
                return port
    with socket.socket(family) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def port_in_use(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        try:
            s.bind((host, port))
        except OSError:
            return True
    return False


def host_port(url: str) -> tuple[str, int]:
    parsed = urlparse(url if "://" in url else f"http://{url}")
    if not parsed.hostname or not parsed.port:
        raise ValueError(f"{url!r} is not an address of the form http://HOST:PORT")
    return parsed.hostname, parsed.port


def reachable(host: str, port: int, timeout: float = 2.0) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def route_to(host: str, port: int = 9) -> str:
    """The local address the kernel would use to reach ``host``: the source address of
    a connected UDP socket (connect() on UDP picks the route and sends nothing). The
    address a service here must listen on for ``host`` to reach it (the Lighthouse, for
    the nodes of a cluster), and the one a rank there advertises (its checkpoint
    transport, its group's store: :mod:`monarch_ft.transport.interface`).

    Raises:
        OSError: ``host`` does not resolve or no route leads to it.
    """
    family, _, _, _, sockaddr = socket.getaddrinfo(host, port, type=socket.SOCK_DGRAM)[0]
    with socket.socket(family, socket.SOCK_DGRAM) as s:
        s.connect(sockaddr)
        return s.getsockname()[0]
