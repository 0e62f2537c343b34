"""Process titles (monarch_ft.common.proctitle): the format, and what ps shows of a real process."""

from __future__ import annotations

import subprocess
import sys

import psutil

from monarch_ft.common import proctitle
from monarch_ft.common.proctitle import CONTROLLER, FORK_SERVER, LIGHTHOUSE_GUARD, rank_or_standby, rank_role, short_name, standby_role, title
from monarch_ft.testing.jobs import REPO, processes_matching


def test_title_names_the_run_and_what_the_process_is():
    run = "/data/runs/drill2"
    assert title(run, rank_role(1, 0, 2)) == "monarch_ft[/data/runs/drill2] g1r0 a2"
    assert title(run, standby_role(1, 0)) == "monarch_ft[/data/runs/drill2] standby 1 r0"
    assert title(run, CONTROLLER) == "monarch_ft[/data/runs/drill2] controller"
    assert title(run, LIGHTHOUSE_GUARD) == "monarch_ft[/data/runs/drill2] lighthouse_guard"
    assert title(run, FORK_SERVER) == "monarch_ft[/data/runs/drill2] forkserver"
    assert rank_or_standby(group=0, rank=1, attempt=0, standby=3) == standby_role(3, 1)
    assert rank_or_standby(group=2, rank=1, attempt=4, standby=-1) == rank_role(2, 1, 4)


def test_a_title_too_long_keeps_the_role_and_the_end_of_the_run():
    run = "/home/someone/monarch_ft/outputs/2026-12-03/21-05-17"
    full = title(run, CONTROLLER)
    assert title(run, CONTROLLER, room=len(full)) == full
    cut = title(run, CONTROLLER, room=40)
    assert cut == "monarch_ft[...12-03/21-05-17] controller" and len(cut) == 40
    assert title(run, rank_role(1, 0, 2), room=10) == "monarch_ft"  # no room for anything but a prefix


def test_the_kernel_name_fits_its_15_bytes():
    assert short_name(rank_role(1, 0, 2)) == "mft:g1r0.a2"
    assert short_name(standby_role(1, 0)) == "mft:sb1r0"
    assert short_name(LIGHTHOUSE_GUARD) == "mft:lh_guard"
    assert short_name(CONTROLLER) == "mft:controller"
    assert len(short_name(rank_role(123, 45, 678))) == proctitle.COMM_LEN


CHILD = """
import os, sys, time
from monarch_ft.common import proctitle
run = sys.argv[1]
print(proctitle.set_title(run, proctitle.standby_role(1, 0)), flush=True)
print("SPT_NOENV" in os.environ, flush=True)
sys.stdin.readline()
print(proctitle.retitle(proctitle.rank_role(1, 0, 2)), flush=True)
sys.stdin.readline()
with proctitle.titled(run, proctitle.CONTROLLER) as shown:
    print(shown, flush=True)
    sys.stdin.readline()
print("restored", flush=True)
sys.stdin.readline()
"""


def _ps(pid: int) -> tuple[str, str]:
    out = subprocess.run(["ps", "-ww", "-o", "comm=", "-o", "args=", "-p", str(pid)], capture_output=True, text=True, check=True).stdout
    comm, args = out.strip().split(None, 1)
    return comm, args


def test_a_real_process_shows_its_title_in_ps_keeps_its_environment_and_is_found_by_its_run(tmp_path):
    run = str(tmp_path / "run")
    # A command line long enough for the title, and an environment to keep.
    argv = [sys.executable, "-c", CHILD, run, "x" * 40]
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO), "MFT_MARK": "kept"}
    child = subprocess.Popen(argv, cwd=REPO, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == f"monarch_ft[{run}] standby 1 r0"
        assert child.stdout.readline().strip() == "False", "SPT_NOENV is read once and not left to the process's children"
        assert _ps(child.pid) == ("mft:sb1r0", f"monarch_ft[{run}] standby 1 r0")
        proc = psutil.Process(child.pid)
        assert proc.environ().get("MFT_MARK") == "kept", "/proc/PID/environ intact"
        assert [p.pid for p in processes_matching(run)] == [child.pid], "found by a command line mentioning its run"
        # Promoted: a new title in place.
        child.stdin.write("\n")
        child.stdin.flush()
        assert child.stdout.readline().strip() == f"monarch_ft[{run}] g1r0 a2"
        assert _ps(child.pid) == ("mft:g1r0.a2", f"monarch_ft[{run}] g1r0 a2")
        # For a while (the controller of one drill of several), then its own command line again.
        child.stdin.write("\n")
        child.stdin.flush()
        assert child.stdout.readline().strip() == f"monarch_ft[{run}] controller"
        assert _ps(child.pid) == ("mft:controller", f"monarch_ft[{run}] controller")
        child.stdin.write("\n")
        child.stdin.flush()
        assert child.stdout.readline().strip() == "restored"
        assert _ps(child.pid) == ("mft:g1r0.a2", f"monarch_ft[{run}] g1r0 a2")
    finally:
        child.kill()
        child.wait(10)


def test_a_short_command_line_keeps_the_role(tmp_path):
    run = str(tmp_path / ("d" * 150))  # not on the command line: the title is longer than it
    argv = [sys.executable, "-c", "import os; from monarch_ft.common import proctitle as t; print(t.set_title(os.environ['RUN'], t.CONTROLLER))"]
    out = subprocess.run(argv, cwd=REPO, env={"PYTHONPATH": str(REPO), "RUN": run}, capture_output=True, text=True, check=True).stdout.strip()
    room = len(" ".join(argv)) - 1  # the command line and its closing NUL
    assert out.startswith("monarch_ft[...ddd") and out.endswith("ddd] controller") and len(out) == room, (out, room)
