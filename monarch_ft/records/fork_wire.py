"""The fork server's wire format: the controller's fork pool and the server (the zygote) speak it.

Newline-delimited JSON over a socketpair inherited by the server (fd in argv), ``op``
naming the message (:class:`ForkOp`):

- server -> controller: ``ready`` (pid, import seconds, threads, the niceness it imported at), ``forked`` (id, pid),
  ``refused`` (id, error), ``exited`` (id, pid, code: negative for a signal, as subprocess);
- controller -> server: ``fork`` (id, argv, env, cwd, log_path, die_with_parent, niceness: the
  launch's CPU niceness, a warm standby's below the training ranks; optional ``netns``: the
  simulated host whose namespaces the child enters before it becomes the rank, where it is
  forked by the server of another host on the same machine).

A fork request carries a plain rank launch (:func:`monarch_ft.records.launch.worker_spec`):
what the server's child becomes.
"""

from __future__ import annotations

import json
from typing import Any

from monarch_ft.records.events import StrEnum

# The environment variable with which the pool asks a server to import at this niceness and
# take priority 0 back once ready (monarch_ft.rank.zygote): its forks train at the ranks' priority.
FORK_NICE_ENV = "MONARCH_FT_FORK_NICE"


class ForkOp(StrEnum):
    """The protocol's messages (``op``)."""

    READY = "ready"  # server -> controller: imports done, waiting for forks
    FORK = "fork"  # controller -> server: start one rank
    FORKED = "forked"  # the rank runs, with this pid
    REFUSED = "refused"  # the fork was not made (unsafe, or it failed): start it cold
    EXITED = "exited"  # a forked rank exited (reaped by the server), with its code


class ProtocolError(ValueError):
    """A line that is not a message of the protocol."""


_FIELDS: dict[ForkOp, tuple[str, ...]] = {
    ForkOp.READY: ("pid", "import_s", "threads", "import_niceness"),
    ForkOp.FORK: ("id", "argv", "env", "cwd", "log_path", "die_with_parent", "niceness"),
    ForkOp.FORKED: ("id", "pid"),
    ForkOp.REFUSED: ("id", "error"),
    ForkOp.EXITED: ("id", "pid", "code"),
}


def encode(op: ForkOp, **fields: Any) -> bytes:
    """One message as a line of JSON."""
    return (json.dumps({"op": op.value, **fields}) + "\n").encode()


def decode(line: bytes) -> dict:
    """One line -> the message (``op`` a :class:`ForkOp`), every field its op needs present.

    Raises:
        ProtocolError: not JSON, not an object, an unknown op or a missing field.
    """
    try:
        msg = json.loads(line)
    except (ValueError, UnicodeDecodeError) as e:
        raise ProtocolError(f"not JSON: {line[:80]!r} ({e})") from None
    if not isinstance(msg, dict):
        raise ProtocolError(f"not an object: {line[:80]!r}")
    try:
        msg["op"] = ForkOp(msg.get("op"))
    except ValueError:
        raise ProtocolError(f"unknown op {msg.get('op')!r}") from None
    missing = [f for f in _FIELDS[msg["op"]] if f not in msg]
    if missing:
        raise ProtocolError(f"{msg['op']} without {', '.join(missing)}")
    return msg
