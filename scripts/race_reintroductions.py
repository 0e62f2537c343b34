"""Check that each race replay of tests/unit/test_tick_races.py fails when its race is brought back.

    .venv/bin/python scripts/race_reintroductions.py

For each of the six decide-layer races this project's history found, it edits the controller back
into the shape the race lived in (the edits below: the reports read after the exits are judged,
the stop's margin of two steps, the integrity judge not condemning a diverged round's attempts at
once, exits read one group at a time with each failure answered at once, no blind window for the
controller's own stall, the quorum's members taken from any commit), runs the replays, prints which failed, and restores the files (also on
an error or Ctrl-C). Exits non-zero unless each race's own replay failed. Run it from the
repository root, on a tree whose replays pass.
"""

import subprocess
import sys

DECIDE = "monarch_ft/controller/decide/__init__.py"
FAILURES = "monarch_ft/controller/decide/failures.py"
RECOVERY = "monarch_ft/controller/decide/recovery.py"
FAILURE_KEPT = "    g.failure = Failure(kind, g.index, startup_failure(g.stepped(), [rs.error for rs in g.ranks if rs.error]), suspects)\n"

# race -> (the replay that must fail, [(file, text, replaced by)]), applied in order.
CASES = {
    "a group that finished after the read": (
        "test_a_group_that_writes_its_last_steps",
        [
            (DECIDE, "    reports.absorb_reports(t)\n", ""),
            (DECIDE, "                hangs[g.index] = hang\n", "                hangs[g.index] = hang\n    reports.absorb_reports(t)\n"),
        ],
    ),
    "the finish read on both sides of a commit": (
        "test_a_stop_asks_for_a_finish_ahead",
        [("monarch_ft/records/lease.py", "    return FINISH_MARGIN + min(FINISH_LEAD_MAX, math.ceil(FINISH_LEAD_S / step_s))", "    return FINISH_MARGIN")],
    ),
    "two verdict rounds in one tick": (
        "test_two_rounds_of_one_divergence",
        [("monarch_ft/controller/integrity.py", "            self.condemn(attempts)\n            return verdict", "            return verdict")],
    ),
    "two exits read in one look": (
        "test_two_groups_dead_in_one_look",
        [
            (RECOVERY, FAILURE_KEPT, FAILURE_KEPT + "    recover(t, g.failure)\n"),
            (DECIDE, "    failures.take_exits(t)\n", ""),
            (
                DECIDE,
                "        if g.active:\n            hang = ",
                "        if g.active:\n            failures.take_exits(t, only=g.index)\n            hang = ",
            ),
            (FAILURES, "def take_exits(t: Tick) -> None:", "def take_exits(t: Tick, only=None) -> None:"),
            (
                FAILURES,
                "        g = t.state.groups[group]\n",
                "        g = t.state.groups[group]\n        if only is not None and group != only:\n            continue\n",
            ),
            ("monarch_ft/controller/state.py", "g.status == GroupStatus.RUNNING and not g.failing())", "g.status == GroupStatus.RUNNING)"),
        ],
    ),
    "a whole-job freeze": (
        "test_a_freeze_of_the_whole_machine",
        [(FAILURES, "    blind = sum(max(0.0, min(end, now) - max(start, since)) for start, end in state.watch.blind)\n", "    blind = 0.0\n")],
    ),
    "a quorum change read group after group": (
        "test_a_quorum_change_read_group_after_group",
        [("monarch_ft/controller/decide/reports.py", "    if rec.step + 1 < t.state.job_step:\n        return\n", "")],
    ),
}


def run_replays() -> tuple[str, list[str]]:
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/unit/test_tick_races.py"], capture_output=True, text=True)
    failed = [line.split("::")[1].split(" ")[0] for line in r.stdout.splitlines() if line.startswith("FAILED")]
    return r.stdout.strip().splitlines()[-1], failed


def main() -> int:
    caught = []
    for race, (replay, edits) in CASES.items():
        saved: dict[str, str] = {}
        try:
            for path, old, new in edits:
                text = open(path).read()
                saved.setdefault(path, text)
                if old not in text:
                    print(f"{race}: the code changed ({path} has no {old.strip()[:60]!r}): update this script", file=sys.stderr)
                    return 2
                open(path, "w").write(text.replace(old, new, 1))
            last, failed = run_replays()
        finally:
            for path, text in saved.items():
                open(path, "w").write(text)
        hit = any(name.startswith(replay) for name in failed)
        caught.append(hit)
        print(f"{race}: {last}; its replay {'failed (caught)' if hit else 'PASSED (not caught)'}; failed: {failed}")
    return 0 if all(caught) else 1


if __name__ == "__main__":
    sys.exit(main())
