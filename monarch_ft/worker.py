"""Entry point of one rank: ``python -m monarch_ft.worker SPEC.json``.

Any launcher (local processes, Slurm tasks, Monarch actors) only has to run this
with a spec file the supervisor wrote; the exit status is the rank's verdict.
"""

from __future__ import annotations

import json
import logging
import os
import sys

from monarch_ft import proctitle
from monarch_ft.proctitle import rank_or_standby


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m monarch_ft.worker SPEC.json", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    with open(argv[0]) as f:
        fields = json.load(f)
    # Before the imports (seconds of torch): ps shows which rank this is while it starts.
    proctitle.set_title(fields["run_dir"], rank_or_standby(fields["group"], fields["rank"], fields["attempt"], fields.get("standby", -1)))
    from monarch_ft.trainer import RankSpec, train

    train(RankSpec(**fields))
    sys.stdout.flush()
    sys.stderr.flush()
    # torchft's native threads may outlive the loop; the rank's work is done and reported.
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
