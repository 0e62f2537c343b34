"""Entry point of one rank: ``python -m monarch_ft.rank.worker SPEC.json``.

Any launcher (local processes, Slurm tasks, Monarch actors) only has to run this
with a spec file the supervisor wrote; the exit status is the rank's verdict: 0 done,
1 an exception (named in the rank's report as ``rank_error``, its traceback in the log),
a :class:`~monarch_ft.records.exits.RankExit` code for a deliberate exit.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import traceback

from monarch_ft.common import proctitle
from monarch_ft.common.proctitle import rank_or_standby


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m monarch_ft.rank.worker SPEC.json", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    with open(argv[0]) as f:
        fields = json.load(f)
    # Before the imports (seconds of torch): ps shows which rank this is while it starts.
    proctitle.set_title(fields["run_dir"], rank_or_standby(fields["group"], fields["rank"], fields["attempt"], fields.get("standby", -1)))
    from monarch_ft.rank.trainer import RankSpec, train

    try:
        train(RankSpec(**fields))
    except Exception:
        # train() has written the error to the rank's report (rank_error); the traceback goes
        # to its log, and the rank exits at once: an interpreter shutdown with torch's and
        # torchft's native threads still up took 2-14 s (a loaded machine), time the
        # controller would wait to see the failure.
        traceback.print_exc()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)
    sys.stdout.flush()
    sys.stderr.flush()
    # torchft's native threads may outlive the loop; the rank's work is done and reported.
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
