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
"""

from __future__ import annotations

import subprocess
import sys
import time

from monarch_ft.common import proctitle
from monarch_ft.common.process import die_with_parent, is_running
from monarch_ft.records.layout import RunLayout
from monarch_ft.records.lease import LeaseWatch

# What writes a job's end once it ended without a controller (a process of its own: it loads
# what a controller does, which this guard must not).
CLOSEOUT_MODULE = "monarch_ft.controller.closeout"


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
    server = subprocess.Popen(argv[4:], stdin=subprocess.DEVNULL, preexec_fn=die_with_parent)
    while True:
        code = server.poll()
        if code is not None:
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
