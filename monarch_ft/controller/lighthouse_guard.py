"""``python -m monarch_ft.controller.lighthouse_guard RUN_DIR LEASE_S HEARTBEAT_S -- LIGHTHOUSE ARGV...``

The Lighthouse no longer dies with the supervisor (a new controller takes it over), so
something must end it when nobody ever does: this small parent. It runs the
``torchft_lighthouse`` server as its child (which dies with it: ``PR_SET_PDEATHSIG``)
and exits

- with the server's own exit status when the server dies (the supervisor then restarts
  the Lighthouse on the same address);
- once the job has ended without a controller (the ranks' lease ran out, or a ``stop``
  went unanswered: :mod:`monarch_ft.rank.components.lease`) and no rank recorded in
  ``controller.json`` is still alive (they needed it for their last quorums). Being the
  last of the job, it then writes the job's ``summary.json`` (:mod:`monarch_ft.controller.closeout`).

Killing the guard (the supervisor's ``Lighthouse.stop``) takes the server with it.
Imports stay light (no torch, no Hydra): it starts in well under a second.

The server's output reaches the log through a pipe this guard drains (:func:`relay`), not
the log file itself: torchft's Lighthouse writes each log line while it holds its state lock
(``_quorum_tick`` logs inside it), so a write held up by the disk (a run directory on a
shared filesystem, or behind checkpoints' writeback) held up every heartbeat and quorum request
with it, and on release the first quorum request could find every other replica's heartbeat
older than ``ft.heartbeat_timeout_ms``: a quorum of one, a live group evicted. With the pipe a
slow disk holds up this guard only; the server writes into the pipe's buffer
(:data:`PIPE_BYTES`, thousands of lines) and goes on.
"""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
import threading
import time

from monarch_ft.common import proctitle
from monarch_ft.common.process import die_with_parent, is_running
from monarch_ft.records.layout import RunLayout
from monarch_ft.records.lease import LeaseWatch

# What writes a job's end once it ended without a controller (a process of its own: it loads
# what a controller does, which this guard must not).
CLOSEOUT_MODULE = "monarch_ft.controller.closeout"

# The server's pipe buffer: what it can write while this guard waits on the disk (Linux's
# F_SETPIPE_SZ; the default 64 KiB where it is refused). A quorum's lines are ~200 bytes.
PIPE_BYTES = 1 << 20
_F_SETPIPE_SZ = 1031


def relay(src: int, dst: int) -> None:
    """Copy ``src`` (the server's output pipe) to ``dst`` (this guard's stdout: the log file)
    until the server closes it; a write that fails (a full disk) drops that chunk, never the
    server: its log is for people, its quorums are the job's.

    Args:
        src: the read end of the server's stdout/stderr pipe.
        dst: where its lines go.
    """
    while True:
        try:
            chunk = os.read(src, 65536)
        except OSError:
            return
        if not chunk:
            return
        try:
            os.write(dst, chunk)
        except OSError:
            pass


def live_ranks(layout: RunLayout) -> int:
    """Ranks recorded in the takeover state that are still the same live process."""
    try:
        state = layout.read_controller_state() or {}
    except (OSError, ValueError):
        return 0
    alive = 0
    for g in state.get("groups", []):
        for r in g.get("ranks", []):
            if is_running(r.get("pid"), r.get("start")):
                alive += 1
    return alive


def close_out(run_dir: str, reason: str) -> None:
    """The last of the job: write its summary.json as its controller would have
    (:mod:`monarch_ft.controller.closeout`, a process of its own: it loads what the supervisor does)."""
    try:
        subprocess.run([sys.executable, "-m", CLOSEOUT_MODULE, run_dir, reason], stdin=subprocess.DEVNULL, timeout=300)
    except (OSError, subprocess.TimeoutExpired) as e:
        print(f"[lighthouse_guard] the job's close-out failed: {e}", flush=True)


def main(argv: list[str]) -> int:
    if len(argv) < 5 or argv[3] != "--":
        print("usage: python -m monarch_ft.controller.lighthouse_guard RUN_DIR LEASE_S HEARTBEAT_S -- LIGHTHOUSE ARGV...", file=sys.stderr)
        return 2
    layout = RunLayout(argv[0])
    proctitle.set_title(layout.run_dir, proctitle.LIGHTHOUSE_GUARD)
    lease = LeaseWatch(layout.controller_heartbeat, layout.stop_request, float(argv[1]), float(argv[2]))
    server = subprocess.Popen(argv[4:], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, preexec_fn=die_with_parent)
    try:
        fcntl.fcntl(server.stdout.fileno(), _F_SETPIPE_SZ, PIPE_BYTES)
    except OSError:
        pass  # the default buffer: still off the disk
    drain = threading.Thread(target=relay, args=(server.stdout.fileno(), sys.stdout.fileno()), name="lighthouse-log", daemon=True)
    drain.start()
    while True:
        code = server.poll()
        if code is not None:
            drain.join(5)  # its last lines (why it died) into the log first
            return code if code >= 0 else 128 - code
        if lease.ended() and live_ranks(layout) == 0:
            print(f"[lighthouse_guard] the job ended without a controller ({lease.ended()}): stopping the Lighthouse", flush=True)
            server.terminate()
            server.wait(10)
            close_out(layout.run_dir, lease.ended())
            return 0
        time.sleep(0.5)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
