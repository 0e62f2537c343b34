"""``python -m monarch_ft.controller.closeout RUN_DIR REASON``: the end of a job no controller saw end.

A job whose controller is gone ends itself (its ranks' lease, or a ``stop`` nobody
answered: :mod:`monarch_ft.rank.components.lease`), and then nobody writes what a controller
writes at the end. Whoever is last does: the Lighthouse guard (:mod:`monarch_ft.controller.lighthouse_guard`)
outlives every rank and runs this once none is left. It builds the job's supervisor on the
run directory as ``controller.attach=true`` would (the run-dir lock: a controller attached
meanwhile wins, and this does nothing), rebuilds its view from ``controller.json`` and
the ranks' reports (:meth:`monarch_ft.controller.loop.Supervisor.close_out`), and ends it with
the supervisor's own end: ``summary.json`` (status ``lease_expired``, or ``completed``
after a stop; its ``controller`` section names the unsupervised span, how it ended and
the steps committed in it), ``job_finished``, ``controller.json`` marked finished (so
nothing attaches to it any more and ``python -m monarch_ft status`` shows the end).
"""

from __future__ import annotations

import sys
import time


def close_out(run_dir: str, reason: str) -> int:
    from monarch_ft.config.job import JobConfig
    from monarch_ft.controller.loop import Supervisor
    from monarch_ft.controller.takeover import Takeover
    from monarch_ft.records.errors import ConfigError

    cfg = JobConfig()
    cfg.controller.attach = True
    try:
        sup = Supervisor(Takeover.attach_config(cfg, run_dir), run_dir, echo=False)
        sup.open()
    except ConfigError as e:  # a controller attached meanwhile, or the job already has its end
        print(f"monarch_ft: close-out of {run_dir} not needed: {e}", file=sys.stderr, flush=True)
        return 0
    sup.close_out(reason, time.time())
    print(f"[monarch_ft] {run_dir}: the job ended without a controller ({reason}): summary.json written, status {sup.status}", flush=True)
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 3:
        print("usage: python -m monarch_ft.controller.closeout RUN_DIR REASON", file=sys.stderr)
        sys.exit(2)
    sys.exit(close_out(sys.argv[1], sys.argv[2]))
