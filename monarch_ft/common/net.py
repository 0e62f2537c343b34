"""Small socket helpers: free ports, port-in-use checks, reachability."""

from __future__ import annotations

import socket
from urllib.parse import urlparse


def free_port(host: str = "127.0.0.1") -> int:
    """A port free on ``host``; for an address this namespace doesn't hold (a simulated
    host's), a port free on loopback: each network namespace has its own port space."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        try:
            s.bind((host, 0))
        except OSError:
            s.bind(("127.0.0.1", 0))
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
