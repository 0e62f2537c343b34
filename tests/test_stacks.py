"""Stacks on demand from outside the job: the live ranks found in events.jsonl, every one dumped."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

from monarch_ft.run_layout import RunLayout
from monarch_ft.stacks import capture_job_stacks, live_rank_pids

CHILD = (
    "import faulthandler, signal, sys, time\n"
    "faulthandler.register(signal.SIGUSR1, all_threads=True)\n"
    "def waiting_for_a_peer():\n"
    "    time.sleep(60)\n"
    "print('ready', flush=True)\n"
    "waiting_for_a_peer()\n"
)


def test_capture_job_stacks_finds_live_ranks_and_names_their_frames(tmp_path):
    layout = RunLayout(str(tmp_path))
    os.makedirs(layout.logs_dir)
    log = open(layout.log(0, 1, 2), "w")
    child = subprocess.Popen([sys.executable, "-c", CHILD], stdout=subprocess.PIPE, stderr=log, text=True)
    try:
        assert child.stdout.readline().strip() == "ready"
        events = [
            {"event": "rank_launched", "group": 0, "rank": 0, "attempt": 0, "pid": 1, "time": 1.0},  # exited below
            {"event": "rank_exited", "group": 0, "rank": 0, "attempt": 0, "time": 2.0},
            {"event": "rank_launched", "group": 0, "rank": 1, "attempt": 2, "pid": child.pid, "time": 3.0},
        ]
        with open(layout.events, "w") as f:
            f.writelines(json.dumps(e) + "\n" for e in events)
        assert live_rank_pids(str(tmp_path)) == {"g0r1": child.pid}
        t0 = time.time()
        files = capture_job_stacks(str(tmp_path), tag="asked")
        assert list(files) == ["g0r1"] and os.path.dirname(files["g0r1"]).startswith(os.path.join(layout.stacks_dir, "asked-"))
        # py-spy, or the rank's faulthandler (copied from its log) where py-spy cannot read it.
        assert "waiting_for_a_peer" in open(files["g0r1"]).read(), open(files["g0r1"]).read()
        assert time.time() - t0 < 15
    finally:
        child.kill()
        child.wait()
        log.close()
