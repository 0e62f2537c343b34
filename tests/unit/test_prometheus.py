"""The controller's Prometheus endpoint (monarch_ft.controller.prometheus): what each event counts,
the survivors' stall, a takeover's replay, and the real HTTP endpoint read back with
prometheus_client's own parser (the job test scrapes it with a real Prometheus)."""

from __future__ import annotations

import threading
import time
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from monarch_ft.common.net import free_port
from monarch_ft.config.metrics import MetricsConfig
from monarch_ft.controller.prometheus import PrometheusExporter, start_exporter
from monarch_ft.controller.state import JobState
from monarch_ft.records.errors import ConfigError
from monarch_ft.records.events import EventKind, EventLog, GroupStatus

DRILL = [
    {"event": "quorum_change", "participating_groups": [0, 1], "seen_by": 0, "time": 1.0},
    {"event": "fault_injected", "kind": "process_kill", "time": 2.0},
    {"event": "group_failed", "group": 1, "reason": "exit", "time": 2.1},
    {"event": "recovery_path", "group": 1, "path": "standby", "time": 2.2},
    {"event": "quorum_change", "participating_groups": [0], "seen_by": 0, "time": 2.3},
    {"event": "quorum_change", "participating_groups": [0, 1], "seen_by": 1, "time": 3.0},
    {"event": "fault_recovered", "kind": "process_kill", "seconds": 1.25, "time": 3.3},
    {"event": "group_failed", "group": 0, "reason": "hung", "blame": "sigstop", "time": 4.0},
    {"event": "checkpoint_saved", "rank": 0, "seconds": 0.2, "time": 4.1},
    {"event": "checkpoint_saved", "rank": 1, "seconds": 0.2, "time": 4.1},
    {"event": "checkpoint_save_failed", "errno": "ENOSPC", "time": 4.2},
    {"event": "sdc_detected", "action": "fail_group", "time": 4.3},
    {"event": "straggler_detected", "slow_kind": "cpu", "time": 4.4},
]


def _state() -> JobState:
    state = JobState.new(2, "/run", {}, "/run/gate")
    # The relay's view as the survivors' first commit without group 1 is read.
    state.last_commit = {0: {"time": 2.25, "quorum_id": 7, "step": 11}, 1: {"time": 1.9, "quorum_id": 6, "step": 10}}
    return state


def _sample(exporter: PrometheusExporter, name: str, **labels) -> float:
    return exporter.registry.get_sample_value(name, labels) or 0.0


def test_each_event_counts_where_it_belongs():
    x = PrometheusExporter(_state(), 100, linger_s=0)
    for e in DRILL:
        x.on_event(e)
    assert _sample(x, "monarch_ft_recoveries_total", kind="process_kill") == 1
    assert _sample(x, "monarch_ft_mttr_seconds_sum", kind="process_kill") == 1.25
    assert _sample(x, "monarch_ft_restarts_total", path="standby") == 1
    assert _sample(x, "monarch_ft_group_failures_total", reason="hung") == 1
    assert _sample(x, "monarch_ft_hang_verdicts_total", blame="sigstop") == 1
    assert _sample(x, "monarch_ft_checkpoint_saves_total") == 1, "one group's save, not one per rank"
    assert _sample(x, "monarch_ft_checkpoint_save_failures_total", errno="ENOSPC") == 1
    assert _sample(x, "monarch_ft_integrity_verdicts_total", verdict="sdc_fail_group") == 1
    assert _sample(x, "monarch_ft_stragglers_total", slow_kind="cpu") == 1
    # The survivors' stall: group 1's last commit (1.9) to group 0's first without it (2.25).
    assert _sample(x, "monarch_ft_survivor_stall_seconds_count", cause="group_lost") == 1
    assert _sample(x, "monarch_ft_survivor_stall_seconds_sum", cause="group_lost") == pytest.approx(0.35)


def test_a_takeover_replays_the_counts_but_reads_no_stall_from_the_state_of_now():
    x = PrometheusExporter(_state(), 100, linger_s=0)
    x.replay(DRILL)
    assert _sample(x, "monarch_ft_recoveries_total", kind="process_kill") == 1
    assert _sample(x, "monarch_ft_survivor_stall_seconds_count", cause="group_lost") == 0


def test_the_endpoint_serves_gauges_from_the_state_and_lingers_for_a_last_scrape(tmp_path):
    state = _state()
    state.groups[1].move(GroupStatus.STARTING)
    events = EventLog(str(tmp_path / "events.jsonl"))
    events.emit(EventKind.RECOVERY_PATH, group=1, path="cold_start")
    port = free_port()
    assert start_exporter(MetricsConfig(prometheus_port=port, prometheus_addr="127.0.0.1", prometheus_linger_s=30), events, state, 100) is not None
    events.emit(EventKind.FAULT_RECOVERED, kind="node", seconds=2.0)

    def scrape() -> dict:
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
        return {(s.name, tuple(sorted(s.labels.items()))): s.value for f in text_string_to_metric_families(text) for s in f.samples}

    got = scrape()
    assert got[("monarch_ft_restarts_total", (("path", "cold_start"),))] == 1, "the events before the endpoint started count too"
    assert got[("monarch_ft_recoveries_total", (("kind", "node"),))] == 1
    assert got[("monarch_ft_quorum_id", ())] == 7
    assert got[("monarch_ft_group_state", (("group", "1"), ("state", "starting")))] == 1
    assert got[("monarch_ft_group_state", (("group", "1"), ("state", "waiting_restart")))] == 0
    assert got[("monarch_ft_target_steps", ())] == 100
    # The job's end: served until the next scrape reads it (here, one a moment later), not for linger_s.
    scraper = threading.Timer(0.3, scrape)
    scraper.start()
    t0 = time.time()
    events.emit(EventKind.JOB_FINISHED, status="completed")
    assert time.time() - t0 < 10
    scraper.join()
    with pytest.raises(OSError):
        scrape()
    events.close()


@pytest.mark.parametrize(
    "metrics, expected",
    [
        (MetricsConfig(prometheus_port=70000), "metrics.prometheus_port=70000: give a TCP port, 1-65535"),
        (MetricsConfig(prometheus_linger_s=5), "metrics.prometheus_linger_s=5 has no effect without metrics.prometheus_port"),
        (MetricsConfig(wandb_project="x"), "metrics.wandb_project=x has no effect with metrics.wandb=false"),
        (MetricsConfig(wandb=True, wandb_mode="offlin"), "metrics.wandb_mode=offlin: choose online, offline or disabled"),
    ],
)
def test_bad_settings_are_one_line(metrics, expected):
    with pytest.raises(ConfigError, match=expected):
        metrics.check()


def test_a_port_in_use_is_a_config_error(tmp_path):
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(ConfigError, match=f"metrics.prometheus_port={port}: cannot listen on 127.0.0.1:{port}"):
            start_exporter(MetricsConfig(prometheus_port=port, prometheus_addr="127.0.0.1"), EventLog(str(tmp_path / "e.jsonl")), _state(), 10)
