"""The rank-side guards on plain values and real files: the commit floor, deliberate exit codes
(monarch_ft.records.exits), the save watchdog, the save schedule, the rank_error record."""

from __future__ import annotations

from monarch_ft.rank.components.checkpoint import SaveWatchdog, save_due
from monarch_ft.rank.components.ft import CommitFloor
from monarch_ft.records.exits import LOST_EXIT, RankExit, blamed_exit, describe_exit
from monarch_ft.records.layout import atomic_write


def test_commit_floor_refuses_below_the_job_step(tmp_path):
    floor = CommitFloor(str(tmp_path / "commit_floor"))
    assert floor.allows(0) == (True, 0)  # no file yet: nothing committed
    atomic_write(floor.path, "2510")
    assert floor.allows(2509) == (True, 2510)  # the newest step again (a quorum peer)
    assert floor.allows(2510) == (True, 2510)
    assert floor.allows(0) == (False, 2510) and floor.refusals == 1
    assert floor.allows(0) == (False, 2510) and floor.refusals == 2
    assert floor.allows(2510) == (True, 2510) and floor.refusals == 0  # healed: the count starts over


def test_deliberate_exits_are_named():
    assert describe_exit(int(RankExit.COMMIT_BELOW_FLOOR))["exit_reason"] == "commit_below_floor"
    assert describe_exit(int(RankExit.SAVE_TIMEOUT))["exit_reason"] == "save_timeout"
    assert "exit_reason" not in describe_exit(1) and describe_exit(-9)["signal"] == "SIGKILL"


def test_the_exit_blamed_is_a_signal_then_a_deliberate_exit_then_the_lowest_rank():
    # Rank 1 SIGKILLed, its peer's broken collective exited 1, both seen in one look.
    assert blamed_exit([(0, 1), (1, -9)]) == (1, -9)
    load = int(RankExit.CHECKPOINT_LOAD_FAILED)
    assert blamed_exit([(0, 1), (1, load)]) == (1, load)
    assert blamed_exit([(2, 1), (1, 1)]) == (1, 1)
    assert blamed_exit([(0, LOST_EXIT), (1, LOST_EXIT)]) == (0, LOST_EXIT)
    assert blamed_exit([(3, -6), (1, -9)]) == (1, -9) and blamed_exit([]) is None


# ---------------------------------------------------------------- saves
def test_save_watchdog_reports_and_ends_a_stuck_save(tmp_path):
    reports, exits = [], []
    dog = SaveWatchdog(0.2, lambda name, **kw: reports.append((name, kw)), str(tmp_path / "stacks" / "save.txt"), on_timeout=exits.append)
    with dog.guard(step=10):
        pass
    assert [n for n, _ in reports] == ["checkpoint_save_started", "checkpoint_saved"] and not exits
    reports.clear()
    import time

    with dog.guard(step=20):
        time.sleep(0.6)
    assert exits == [int(RankExit.SAVE_TIMEOUT)]
    names = [n for n, _ in reports]
    assert names[:2] == ["checkpoint_save_started", "checkpoint_save_timeout"]
    timeout = dict(reports)["checkpoint_save_timeout"]
    assert timeout["step"] == 20 and "test_save_watchdog" in open(timeout["stacks"]).read()


def test_save_due_follows_torchtitan():
    assert save_due(10, 10, False) and not save_due(11, 10, False) and save_due(11, 10, True)


def _raised(exc: BaseException) -> BaseException:
    try:
        raise exc
    except BaseException as e:
        return e


def test_a_rank_error_names_its_last_line_and_innermost_frame_and_the_environment():
    from monarch_ft.records.reports import error_record

    def build(n_heads: int) -> None:
        raise ValueError(f"n_heads={n_heads}: does not divide dim 64")

    try:
        build(3)
    except ValueError as e:
        rec = error_record(e)
    assert rec["error"] == "ValueError: n_heads=3: does not divide dim 64"
    assert rec["error_type"] == "ValueError"
    assert rec["frame"].startswith("tests/unit/test_rank_guards.py:") and rec["frame"].endswith(" in build"), rec
    assert rec["environmental"] is False
    assert error_record(_raised(FileNotFoundError(2, "No such file or directory", "/data/tokens.npy")))["environmental"] is False
    assert error_record(_raised(OSError(28, "No space left on device")))["error"] == "OSError: [Errno 28] No space left on device"
    # A connection, a timeout, torch.distributed's network/store/backend errors: not a crash loop.
    assert error_record(_raised(ConnectionRefusedError(111, "Connection refused")))["environmental"] is True
    assert error_record(_raised(TimeoutError("quorum timed out")))["environmental"] is True
    DistNetworkError = type("DistNetworkError", (RuntimeError,), {"__module__": "torch.distributed"})
    rec = error_record(_raised(DistNetworkError("failed to connect")))
    assert rec["environmental"] is True and rec["error_type"] == "torch.distributed.DistNetworkError"
    assert error_record(_raised(RuntimeError("boom")))["environmental"] is False
