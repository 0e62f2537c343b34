"""Stacks on demand from outside the job (``python -m monarch_ft stacks``): the ranks the
controller recorded that are still the same process, each one dumped."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from monarch_ft.cli.jobctl import job_stacks
from monarch_ft.common.process import ProcessIdentity
from monarch_ft.records.layout import RunLayout, atomic_write_json

CHILD = (
    "import faulthandler, signal, sys, time\n"
    "faulthandler.register(signal.SIGUSR1, all_threads=True)\n"
    "def waiting_for_a_peer():\n"
    "    time.sleep(60)\n"
    "print('ready', flush=True)\n"
    "waiting_for_a_peer()\n"
)


def test_job_stacks_finds_live_ranks_and_names_their_frames(tmp_path):
    layout = RunLayout(str(tmp_path))
    os.makedirs(layout.logs_dir)
    log_path = layout.log(0, 1, 2)
    log = open(log_path, "w")
    child = subprocess.Popen([sys.executable, "-c", CHILD], stdout=subprocess.PIPE, stderr=log, text=True)
    try:
        assert child.stdout.readline().strip() == "ready"
        me = ProcessIdentity.of(child.pid)
        gone = ProcessIdentity(child.pid, "not-its-start-time")  # a reused pid: never this process
        ranks = [
            {"pid": gone.pid, "start": gone.start, "launch": {"rank": 0}},
            {"pid": me.pid, "start": me.start, "launch": {"rank": 1, "log_path": log_path}},
        ]
        state = {"status": "running", "groups": [{"index": 0, "ranks": ranks}]}
        atomic_write_json(layout.controller_state, state)
        t0 = time.time()
        files = job_stacks(str(tmp_path))
        assert list(files) == ["g0r1"] and os.path.dirname(files["g0r1"]).startswith(os.path.join(layout.stacks_dir, "cli-"))
        # py-spy, or the rank's faulthandler (copied from its log) where py-spy cannot read it.
        assert "waiting_for_a_peer" in open(files["g0r1"]).read(), open(files["g0r1"]).read()
        assert time.time() - t0 < 15
    finally:
        child.kill()
        child.wait()
        log.close()


def test_a_stacks_file_that_cannot_be_written_is_left_out_not_raised(tmp_path, capfd):
    """A full or read-only run directory: the dump is evidence, not a traceback in a thread of
    the controller (a stall's capture on a full disk printed one: test_controller_own_files)."""
    from monarch_ft.common.stacks import capture_stacks

    child = subprocess.Popen([sys.executable, "-c", CHILD], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "ready"
        folder = tmp_path / "stacks"
        (folder / "g0r1.txt").mkdir(parents=True)  # its file cannot be opened for writing
        got = capture_stacks({"g0r0": child.pid, "g0r1": child.pid}, str(folder), timeout_s=5.0)
        assert list(got) == ["g0r0"] and "waiting_for_a_peer" in open(got["g0r0"]).read()
        (tmp_path / "a_file").write_text("")
        assert capture_stacks({"g0r0": child.pid}, str(tmp_path / "a_file" / "stacks"), timeout_s=5.0) == {}
    finally:
        child.kill()
        child.wait()
    assert "Traceback" not in capfd.readouterr().err
