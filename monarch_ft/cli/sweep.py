"""A Hydra sweep (``-m``): every job runs, one after another, and the sweep ends with a table.

Hydra's basic launcher runs a sweep's jobs in this process, one call of the task function
each. A recipe ends a single run with ``sys.exit(code)``; in a sweep that ``SystemExit``
would leave Hydra's launcher (it catches ``Exception`` only) and end the whole sweep after
its first job, with that job's code. So in a sweep the task's exit code is caught and kept
(:class:`SweepJob`), the next job runs, and once Hydra returns, :func:`finish_sweep` prints
one line per job (its number, overrides, status and final loss) and gives the sweep's exit
code: 0 only if every job exited 0.

Each job has its own run directory (``hydra.sweep.dir``/``hydra.sweep.subdir``) and so its
own controller, Lighthouse, ports and processes: a job's controller stops all of them
before it returns, like a single run's.

An interrupted job (Ctrl-C or SIGTERM: the controller exits 130 or 143) ends the sweep:
the user asked the whole command to stop, not that one job.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Optional

# A job's exit code that ends the sweep: the controller was interrupted (SIGINT, SIGTERM).
INTERRUPTED = (130, 143)


@dataclass
class SweepJob:
    """One job of a sweep, as it ended.

    Args:
        num: Hydra's job number (``hydra.job.num``).
        overrides: the job's own overrides (the sweep's values for it).
        run_dir: its run directory.
        exit_code: what the job would have exited with alone.
    """

    num: int
    overrides: list[str]
    run_dir: str
    exit_code: int

    @property
    def summary(self) -> dict:
        """The job's ``summary.json`` (a drill's or a pretraining job's), or {} when it has none."""
        try:
            with open(os.path.join(self.run_dir, "summary.json")) as f:
                return json.load(f)
        except (OSError, ValueError):
            return {}

    @property
    def status(self) -> str:
        """The job's status from its summary (``completed``, ``failed``...), else how it exited."""
        status = self.summary.get("status")
        if self.exit_code == 0:
            return str(status or "ok")
        if self.exit_code == 2:
            return "config error (exit 2)"
        return f"{status or 'failed'} (exit {self.exit_code})"

    @property
    def final_loss(self) -> Optional[float]:
        """The mean over the job's groups of each one's last committed loss (the groups hold the
        same weights and train on different batches), None when no group reported one."""
        losses = [g["last_loss"] for g in (self.summary.get("groups") or {}).values() if g.get("last_loss") is not None]
        return sum(losses) / len(losses) if losses else None


def sweep_table(jobs: list[SweepJob]) -> list[str]:
    """One line per job: number, its own overrides (those not shared by every job), status, final
    loss; a header first.

    Args:
        jobs: the sweep's jobs, in the order they ran.
    """
    # The overrides every job shares say nothing about which job is which: the swept ones are shown.
    shared = set.intersection(*(set(j.overrides) for j in jobs)) if len(jobs) > 1 else set()
    rows = [("job", "overrides", "status", "final loss")]
    for j in jobs:
        loss = f"{j.final_loss:.4f}" if j.final_loss is not None else "-"
        rows.append((str(j.num), " ".join(o for o in j.overrides if o not in shared) or "(none)", j.status, loss))
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    return [f"{r[0]:<{widths[0]}}  {r[1]:<{widths[1]}}  {r[2]:<{widths[2]}}  {r[3]}".rstrip() for r in rows]


def sweep_exit_code(jobs: list[SweepJob]) -> int:
    """0 if every job exited 0; an interrupted job's code if the sweep was interrupted; 2 if every
    failure was a config error; else 1.

    Args:
        jobs: the sweep's jobs.
    """
    codes = [j.exit_code for j in jobs if j.exit_code != 0]
    if not codes:
        return 0
    interrupted = [c for c in codes if c in INTERRUPTED]
    if interrupted:
        return interrupted[-1]
    return 2 if all(c == 2 for c in codes) else 1


def finish_sweep(jobs: list[SweepJob], sweep_dir: Optional[str], echo=print) -> int:
    """Print the sweep's table and return its exit code (:func:`sweep_exit_code`).

    Args:
        jobs: the sweep's jobs, in the order they ran.
        sweep_dir: the sweep's directory (``hydra.sweep.dir``), named in the last line.
        echo: where the lines go.
    """
    failed = sum(1 for j in jobs if j.exit_code != 0)
    echo(f"[monarch_ft sweep] {len(jobs)} job{'s' if len(jobs) != 1 else ''}, {failed} failed{f', in {sweep_dir}' if sweep_dir else ''}:")
    for line in sweep_table(jobs):
        echo(f"[monarch_ft sweep] {line}")
    return sweep_exit_code(jobs)
