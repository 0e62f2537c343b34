"""``lighthouse``: SIGKILL the Lighthouse server; the supervisor restarts it on the same address.
Recovered once the target commits with the others after the restart."""

from __future__ import annotations

from typing import Any

from chaos.kinds.base import ControlPlaneFault
from monarch_ft.records.events import EventKind
from monarch_ft.records.recovered import LIGHTHOUSE_BACK


class Lighthouse(ControlPlaneFault):
    name = "lighthouse"
    recovery = LIGHTHOUSE_BACK
    detected_by = EventKind.LIGHTHOUSE_LOST

    def inject(self, job, group: int, fault) -> dict[str, Any]:
        return job.kill_lighthouse()


KIND = Lighthouse()
