"""What the controller prints: one line per event worth a user's eye, and a progress line every
two seconds (the job's committed step, steps/s and the time left; each group's status, step and
loss; the checkpoints' health when something failed)."""

from __future__ import annotations

from monarch_ft.controller.checkpoints import save_failure_fix
from monarch_ft.controller.state import JobState
from monarch_ft.controller.throughput import StepRate
from monarch_ft.records.events import EventKind

# Events that say nothing a user acts on, or whose line comes with another event.
QUIET = {
    "rank_launched",
    "model_ready",
    "rank_started",
    "checkpoint_sent",
    "rank_finished",
    "recovery_started",
    "checkpoint_save_started",
    "checkpoint_saved",
    # Its error line goes with group_failed (once per failure, not once per rank).
    "rank_error",
}


class Console:
    """The controller's console.

    Args:
        state: the job's state (its start time, groups, checkpoints' health).
        steps: ``training.steps``.
    """

    def __init__(self, state: JobState, steps: int) -> None:
        self.state = state
        self.steps = steps
        self.rate = StepRate()

    def echo(self, e: dict) -> None:
        """One event's line (the event log's echo)."""
        if e["event"] in QUIET:
            return
        started = self.state.started
        rel = e["time"] - started if started else 0.0
        if e["event"] == EventKind.CHECKPOINT_SAVE_FAILED:
            # One line per kind of failure, with the fix; then a count in the progress line.
            printed = self.state.watch.printed_save_failures
            if e.get("errno") not in printed:
                printed.add(e.get("errno"))
                print(
                    f"[monarch_ft {rel:7.1f}s] checkpoint save failed: group {e.get('group')} step {e.get('step')}: {e.get('error')} at "
                    f"{e.get('path')}; training goes on (the live replicas hold the state), the partial step is removed, older "
                    f"checkpoints are kept and the save is retried every checkpoint.interval; fix: {save_failure_fix(e.get('errno') or '')} "
                    "(further failures are counted in the progress line)",
                    flush=True,
                )
            return
        if e["event"] == EventKind.CHECKPOINT_LOAD_FAILED and e.get("rank") != 0:
            return  # the group's ranks fail alike (a collective load): rank 0's line says it
        fields = " ".join(f"{k}={v}" for k, v in e.items() if k not in ("time", "event") and v is not None)
        print(f"[monarch_ft {rel:7.1f}s] {e['event']} {fields}", flush=True)

    def progress(self, now: float) -> None:
        """The progress line, at most every two seconds."""
        watch = self.state.watch
        self.rate.observe(now, self.state.job_step)
        if now - watch.last_progress_print < 2.0:
            return
        watch.last_progress_print = now
        parts = [job_progress(self.state.job_step, self.steps, self.rate)]
        for g in self.state.groups:
            loss = f" loss {g.last_loss:.3f}" if g.last_loss is not None else ""
            parts.append(f"g{g.index}:{g.status} step {max(g.last_step, 0)}/{self.steps}{loss}")
        health = self.state.ckpt_health
        if health.save_failures or health.load_failures or health.quarantined:
            parts.append(f"checkpoints: {health.describe(now)}")
        print(f"[monarch_ft {now - self.state.started:7.1f}s] " + " | ".join(parts), flush=True)


def job_progress(step: int, steps: int, rate: StepRate) -> str:
    """The job's part of the progress line: ``job 120/300 4.1 steps/s ETA 0m44s`` (the rate over the
    last 30 s; ``ETA -`` before the first commits or while nothing commits).

    Args:
        step: the job's committed steps.
        steps: ``training.steps``.
        rate: the committed steps' rate.
    """
    per_s = rate.rate()
    eta = rate.eta_s(steps - step)
    shown_eta = "-" if eta is None else f"{int(eta // 60)}m{int(eta % 60):02d}s"
    return f"job {step}/{steps} " + (f"{per_s:.1f} steps/s" if per_s is not None else "- steps/s") + f" ETA {shown_eta}"
