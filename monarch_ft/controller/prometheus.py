"""The controller's Prometheus endpoint (``metrics.prometheus_port``): ``/metrics`` for a scraper.

Where the figures come from: counters and histograms from the job's events (the controller's
:class:`~monarch_ft.records.events.EventLog`, which this module listens to; nothing in the watch
loop calls it), gauges from the job's state (:class:`~monarch_ft.controller.state.JobState`),
read when Prometheus scrapes. A controller that takes the job over (``controller.attach``)
replays the job's events before it serves, so its counters go on from where the lost one's
were, on the same port: a scraper sees no reset.

The names (Prometheus's conventions: the ``monarch_ft_`` prefix, ``_total`` counters,
``_seconds`` durations) and what each counts are listed in docs/design/metrics.md.

When the job ends (``job_finished``) the endpoint stays up until one more scrape has read the
final values, at most ``metrics.prometheus_linger_s``; a detaching controller stops serving at
once (the next one serves).
"""

from __future__ import annotations

import time
from typing import Any, Callable, Iterator, Optional

from monarch_ft.config.metrics import MetricsConfig
from monarch_ft.controller.state import JobState
from monarch_ft.controller.throughput import StepRate
from monarch_ft.records.errors import ConfigError
from monarch_ft.records.events import EventKind, EventLog, GroupStatus, JobStatus
from monarch_ft.records.members import members_of

PREFIX = "monarch_ft_"
# Histogram buckets, in seconds: a recovery (a standby's second to a full restart's minute),
# the survivors' stall (tenths of a second up), one checkpoint save.
MTTR_BUCKETS = (0.5, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0)
STALL_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0)
SAVE_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0)
# How often close() looks for the last scrape while it lingers.
_LINGER_POLL_S = 0.05


class PrometheusExporter:
    """The job's metrics for one controller: fed by events, read by scrapes.

    Args:
        state: the job's state (the gauges read it at each scrape).
        steps: ``training.steps`` (the job's target, a gauge beside the committed step).
        linger_s: ``metrics.prometheus_linger_s``.
        clock: the time (a fast test's fake; default ``time.time``).
    """

    def __init__(self, state: JobState, steps: int, linger_s: float, clock: Callable[[], float] = time.time) -> None:
        try:
            from prometheus_client import CollectorRegistry, Counter, Histogram
        except ImportError:
            raise ConfigError("metrics.prometheus_port needs the prometheus-client package: pip install 'monarch_ft[prometheus]'") from None
        self.state = state
        self.steps = steps
        self.linger_s = linger_s
        self.clock = clock
        self.registry = CollectorRegistry(auto_describe=True)
        self._rate = StepRate()
        self._members: Optional[tuple[int, ...]] = None
        self._last_scrape = 0.0
        self._server: Any = None

        def counter(name: str, doc: str, *labels: str):
            return Counter(PREFIX + name, doc, labels, registry=self.registry)

        def histogram(name: str, doc: str, buckets: tuple, *labels: str):
            return Histogram(PREFIX + name, doc, labels, buckets=buckets, registry=self.registry)

        self.restarts = counter("restarts", "Relaunches of a failed group, by recovery path (standby, warm_fork, cold_start...).", "path")
        self.group_failures = counter("group_failures", "Groups failed, by the reason the controller gave.", "reason")
        self.faults = counter("faults_injected", "Faults a drill injected, by kind.", "kind")
        self.recoveries = counter("recoveries", "Injected faults recovered (back in quorum at the job's step), by kind.", "kind")
        self.mttr = histogram("mttr_seconds", "Seconds from a fault to its recovery (the drill's MTTR), by kind.", MTTR_BUCKETS, "kind")
        self.stall = histogram(
            "survivor_stall_seconds",
            "Seconds the surviving groups committed nothing: from a lost group's last commit to the survivors' first without it "
            "(cause group_lost), or the Lighthouse's outage (cause lighthouse_lost).",
            STALL_BUCKETS,
            "cause",
        )
        self.hangs = counter("hang_verdicts", "Groups judged hung, by the hang's blame.", "blame")
        self.job_stalls = counter("job_stalls", "Job-wide stalls (every stepping group silent at once).")
        self.stragglers = counter("stragglers", "Groups named stragglers, by what is slow (cpu, link).", "slow_kind")
        self.evictions = counter("straggler_evictions", "Stragglers failed so that a standby takes their place.")
        self.integrity = counter("integrity_verdicts", "Integrity verdicts: sdc fail_group / rollback, a suspect group, a rank's gradient outlier.", "verdict")
        self.saves = counter("checkpoint_saves", "Checkpoint saves a group finished (its rank 0's).")
        self.save_failures = counter("checkpoint_save_failures", "Checkpoint saves that failed (a rank's), by errno (timeout: the save's watchdog).", "errno")
        self.save_seconds = histogram("checkpoint_save_seconds", "Seconds a group's checkpoint save took (its rank 0's).", SAVE_BUCKETS)
        self.takeovers = counter("controller_takeovers", "Controllers that took the job over.")
        self.registry.register(_StateCollector(self))

    # ------------------------------------------------------------ events
    def replay(self, events: list[dict]) -> None:
        """Count the job's events so far (a takeover: the lost controller's counts go on).

        Args:
            events: the job's events, oldest first.
        """
        for e in events:
            self.on_event(e, replay=True)

    def on_event(self, e: dict, replay: bool = False) -> None:
        """One event (the EventLog's listener).

        Args:
            e: the event's record.
            replay: an event of the past (a takeover's replay): counted, but nothing is read
                from the job's state now, and the endpoint's life is not touched.
        """
        kind = e.get("event")
        if kind == EventKind.RECOVERY_PATH:
            self.restarts.labels(str(e.get("path"))).inc()
        elif kind == EventKind.GROUP_FAILED:
            self.group_failures.labels(str(e.get("reason"))).inc()
            if e.get("reason") == "hung":
                self.hangs.labels(str(e.get("blame"))).inc()
        elif kind == EventKind.FAULT_INJECTED:
            self.faults.labels(str(e.get("kind"))).inc()
        elif kind == EventKind.FAULT_RECOVERED:
            self.recoveries.labels(str(e.get("kind"))).inc()
            if e.get("seconds") is not None:
                self.mttr.labels(str(e.get("kind"))).observe(float(e["seconds"]))
        elif kind == EventKind.QUORUM_CHANGE:
            self._quorum_change(e, replay)
        elif kind == EventKind.LIGHTHOUSE_RECOVERED and e.get("stall_s") is not None:
            self.stall.labels("lighthouse_lost").observe(float(e["stall_s"]))
        elif kind == EventKind.JOB_STALL:
            self.job_stalls.inc()
        elif kind == EventKind.STRAGGLER_DETECTED:
            self.stragglers.labels(str(e.get("slow_kind"))).inc()
        elif kind == EventKind.STRAGGLER_EVICTED:
            self.evictions.inc()
        elif kind == EventKind.SDC_DETECTED:
            self.integrity.labels(f"sdc_{e.get('action')}").inc()
        elif kind == EventKind.GROUP_SUSPECT:
            self.integrity.labels("suspect").inc()
        elif kind == EventKind.GRAD_OUTLIER:
            self.integrity.labels("grad_outlier").inc()
        elif kind == EventKind.CHECKPOINT_SAVED and e.get("rank", 0) == 0:
            self.saves.inc()
            if e.get("seconds") is not None:
                self.save_seconds.observe(float(e["seconds"]))
        elif kind == EventKind.CHECKPOINT_SAVE_FAILED:
            self.save_failures.labels(str(e.get("errno"))).inc()
        elif kind == EventKind.CHECKPOINT_SAVE_TIMEOUT:
            self.save_failures.labels("timeout").inc()
        elif kind == EventKind.CONTROLLER_ATTACHED:
            self.takeovers.inc()
        elif kind == EventKind.JOB_FINISHED and not replay:
            self.close(linger=True)
        elif kind == EventKind.CONTROLLER_DETACHED and not replay:
            self.close(linger=False)

    def _quorum_change(self, e: dict, replay: bool) -> None:
        """The survivors' stall of each group the new quorum left out: from that group's last commit
        to this first commit without it. Both times are the ranks' own records' (the relay has just
        read this commit: it is the seeing group's newest)."""
        members = members_of(e)
        previous, self._members = self._members, members
        if replay or previous is None:
            return
        commits = self.state.last_commit.copy()
        first = commits.get(e.get("seen_by"), {}).get("time")
        for lost in set(previous) - set(members):
            last = commits.get(lost, {}).get("time")
            if first is not None and last is not None:
                self.stall.labels("group_lost").observe(max(0.0, float(first) - float(last)))

    # ------------------------------------------------------------ serving
    def serve(self, addr: str, port: int) -> None:
        """Listen on ``addr:port`` (a thread of its own).

        Args:
            addr: the address (``metrics.prometheus_addr``).
            port: the port (``metrics.prometheus_port``).

        Raises:
            ConfigError: the port cannot be listened on (in use, not allowed).
        """
        from prometheus_client import start_http_server

        try:
            self._server, _thread = start_http_server(port, addr=addr, registry=self.registry)
        except OSError as e:
            raise ConfigError(f"metrics.prometheus_port={port}: cannot listen on {addr}:{port} ({e.strerror or e}): give a free port") from None

    def scraped(self) -> None:
        """A scrape read the metrics now (the state collector says so)."""
        self._last_scrape = self.clock()

    def close(self, linger: bool) -> None:
        """Stop serving; with ``linger``, once a scrape has read the values of now, or after
        ``linger_s`` (a job's end: its last step is seen).

        Args:
            linger: wait for one more scrape first.
        """
        if self._server is None:
            return
        ended = self.clock()
        while linger and self._last_scrape <= ended and self.clock() - ended < self.linger_s:
            time.sleep(_LINGER_POLL_S)
        server, self._server = self._server, None
        server.shutdown()
        server.server_close()


class _StateCollector:
    """The gauges, read from the job's state at each scrape (in the server's thread: what it reads
    is copied or a plain number)."""

    def __init__(self, exporter: PrometheusExporter) -> None:
        self.exporter = exporter

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import GaugeMetricFamily

        x = self.exporter
        state = x.state
        step = state.job_step
        x._rate.observe(x.clock(), step)
        yield GaugeMetricFamily(PREFIX + "committed_step", "The job's committed steps (every group that commits holds these weights).", value=step)
        yield GaugeMetricFamily(PREFIX + "target_steps", "training.steps: the step the job ends at.", value=x.steps)
        rate = x._rate.rate()
        yield GaugeMetricFamily(PREFIX + "steps_per_second", "Committed steps per second over the last 30 s of scrapes.", value=rate or 0.0)
        groups = GaugeMetricFamily(PREFIX + "group_state", "1 for each group's current state (GroupStatus), 0 for the others.", labels=["group", "state"])
        group_step = GaugeMetricFamily(PREFIX + "group_step", "Each group's newest step.", labels=["group"])
        for g in list(state.groups):
            for s in GroupStatus:
                groups.add_metric([str(g.index), s.value], 1.0 if g.status == s else 0.0)
            group_step.add_metric([str(g.index)], max(g.last_step, 0))
        yield groups
        yield group_step
        status = GaugeMetricFamily(PREFIX + "job_status", "1 for the job's current status (JobStatus), 0 for the others.", labels=["status"])
        for s in JobStatus:
            status.add_metric([s.value], 1.0 if state.status == s else 0.0)
        yield status
        quorums = [r.get("quorum_id") for r in state.last_commit.copy().values() if r.get("quorum_id") is not None]
        yield GaugeMetricFamily(PREFIX + "quorum_id", "The Lighthouse's quorum id of the newest commit.", value=max(quorums) if quorums else 0)
        x.scraped()


def start_exporter(cfg: MetricsConfig, events: EventLog, state: JobState, steps: int) -> Optional[PrometheusExporter]:
    """The endpoint, serving, its counters caught up with the job's events so far and listening to
    the next ones; None without ``metrics.prometheus_port``.

    Args:
        cfg: the job's ``metrics`` section.
        events: the job's event log (its events so far: a takeover's).
        state: the job's state.
        steps: ``training.steps``.

    Raises:
        ConfigError: prometheus-client is not installed, or the port cannot be listened on.
    """
    if cfg.prometheus_port is None:
        return None
    exporter = PrometheusExporter(state, steps, cfg.prometheus_linger_s)
    exporter.replay(events.events)
    exporter.serve(cfg.prometheus_addr, cfg.prometheus_port)
    events.add_listener(exporter.on_event)
    return exporter
