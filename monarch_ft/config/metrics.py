"""``metrics``: what the ranks record besides their report files."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from monarch_ft.config.unused import refuse_unused
from monarch_ft.records.errors import require


@dataclass
class MetricsConfig:
    """What the job reports besides its own files: the ranks' TensorBoard runs, the controller's
    Prometheus endpoint."""

    tensorboard: bool = False
    """Write TensorBoard event files, one run per replica group (``<run>/tensorboard/group_<g>``,
    written by the group's rank 0): loss, lr, tokens/s, step time, quorum size, and a marker at
    every restart, heal, disk load, quorum change, failed commit and fault
    (monarch_ft/rank/components/tensorboard.py). View: ``tensorboard --logdir <run>/tensorboard``."""

    tensorboard_flush_s: float = 1.0
    """Seconds between flushes of the event files: the curve a killed rank can lose (markers are flushed at once)."""

    prometheus_port: Optional[int] = None
    """Serve ``http://<host>:<port>/metrics`` from the controller for Prometheus (needs the
    ``prometheus`` extra: prometheus-client): the committed step and steps/s, each group's state,
    restarts by recovery path, MTTR by fault kind, the survivors' stall, hang, straggler and integrity
    verdicts, checkpoint saves, the quorum id (monarch_ft/controller/prometheus.py; every name in
    docs/design/metrics.md). A controller that takes the job over serves it again on the same port,
    its counters rebuilt from the job's events. null: no endpoint."""

    prometheus_addr: str = "0.0.0.0"
    """The address the endpoint listens on (``0.0.0.0``: every interface, so a Prometheus elsewhere can scrape it)."""

    prometheus_linger_s: float = 15.0
    """When the job ends, keep serving until one more scrape has read the final values, at most this
    many seconds (a job that ends between two scrapes would otherwise never show its last step): set
    it to your scrape interval; 0 stops at once."""

    wandb: bool = False
    """Write one Weights & Biases run per job (needs the ``wandb`` extra), from the controller: the loss,
    tokens/s and steps/s at each job step; restarts, group failures and recoveries with their MTTR as
    they happen (monarch_ft/controller/wandb_run.py). ``WANDB_MODE=offline`` is honoured (the run goes
    to ``<run>/wandb/``, for ``wandb sync``); a controller that takes the job over resumes the run."""

    wandb_project: str = "monarch_ft"
    """The W&B project of the run."""

    wandb_mode: Optional[str] = None
    """``online``, ``offline`` or ``disabled``; null: wandb's own choice (``WANDB_MODE``, else online)."""

    def check(self) -> None:
        """What the types cannot say about this section (one line naming the fix)."""
        require(self.tensorboard_flush_s > 0, f"metrics.tensorboard_flush_s={self.tensorboard_flush_s}: must be > 0")
        if not self.tensorboard:
            refuse_unused(self, "metrics", ("tensorboard_flush_s",), "with metrics.tensorboard=false", "drop it, or set metrics.tensorboard=true")
        if self.prometheus_port is None:
            fix = "drop it, or give metrics.prometheus_port=N"
            refuse_unused(self, "metrics", ("prometheus_addr", "prometheus_linger_s"), "without metrics.prometheus_port", fix)
        else:
            require(0 < self.prometheus_port < 65536, f"metrics.prometheus_port={self.prometheus_port}: give a TCP port, 1-65535")
        if not self.wandb:
            refuse_unused(self, "metrics", ("wandb_project", "wandb_mode"), "with metrics.wandb=false", "drop it, or set metrics.wandb=true")
        require(
            self.wandb_mode in (None, "online", "offline", "disabled"), f"metrics.wandb_mode={self.wandb_mode}: choose online, offline or disabled (or null)"
        )
        require(self.prometheus_linger_s >= 0, f"metrics.prometheus_linger_s={self.prometheus_linger_s}: must be >= 0")
