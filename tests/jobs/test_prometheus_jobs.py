"""The controller's /metrics scraped by a real Prometheus server (Debian's ``prometheus``) through a
drill with a process kill and a controller kill: what Prometheus stored is what the job did. The
same drill writes its W&B run offline (metrics.wandb): one run, resumed by the second controller."""

from __future__ import annotations

import json
import shutil
import subprocess
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from monarch_ft.common.net import free_port
from monarch_ft.testing.jobs import FAST, run_drill_job, wait_for
from monarch_ft.testing.wandb_offline import history, offline_runs, run_id

pytestmark = pytest.mark.slow


def _start_prometheus(folder: Path, target_port: int) -> tuple[subprocess.Popen, str]:
    """A Prometheus scraping ``127.0.0.1:target_port`` every half second; (its process, its URL) once ready."""
    binary = shutil.which("prometheus")
    assert binary, "Debian's prometheus is not installed: apt-get install prometheus (scripts/install.sh does, as root)"
    folder.mkdir()
    config = folder / "prometheus.yml"
    config.write_text(
        "global: {scrape_interval: 500ms, scrape_timeout: 400ms}\n"
        f"scrape_configs: [{{job_name: monarch_ft, static_configs: [{{targets: ['127.0.0.1:{target_port}']}}]}}]\n"
    )
    web = f"127.0.0.1:{free_port()}"
    argv = [binary, f"--config.file={config}", f"--storage.tsdb.path={folder / 'data'}", f"--web.listen-address={web}"]
    proc = subprocess.Popen(argv, stdout=open(folder / "prometheus.log", "wb"), stderr=subprocess.STDOUT)

    def ready() -> bool:
        assert proc.poll() is None, (folder / "prometheus.log").read_text()[-2000:]
        try:
            return urllib.request.urlopen(f"http://{web}/-/ready", timeout=2).status == 200
        except OSError:
            return False

    wait_for(ready, 60, "Prometheus to be ready")
    return proc, f"http://{web}"


def _query(url: str, promql: str) -> float:
    """One instant query's single value (Prometheus's HTTP API)."""
    with urllib.request.urlopen(f"{url}/api/v1/query?{urllib.parse.urlencode({'query': promql})}", timeout=10) as r:
        body = json.loads(r.read())
    assert body["status"] == "success" and len(body["data"]["result"]) == 1, (promql, body)
    return float(body["data"]["result"][0]["value"][1])


def test_prometheus_scrapes_a_drill_across_a_controller_takeover(run_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    port = free_port()
    prometheus, url = _start_prometheus(tmp_path / "prometheus", port)
    try:
        faults = "chaos.faults=[{kind: process_kill, at_step: 8, target: 1}, {kind: controller, at_step: 16, delay_s: 2}]"
        metrics = [f"metrics.prometheus_port={port}", "metrics.wandb=true"]
        drill = run_drill_job(run_dir, *FAST, "ft.replica_groups=2", "ft.ranks_per_group=1", faults, *metrics)
        recovered = sum(1 for f in drill["faults"] if f["recovered"])
        assert recovered == 2, drill["faults"]
        summary = json.loads((run_dir / "summary.json").read_text())

        # The job's last step, as the controller that ended it served it (it lingers for a last scrape).
        assert _query(url, "max_over_time(monarch_ft_committed_step[1h])") == summary["job_step"]
        assert _query(url, "max_over_time(monarch_ft_target_steps[1h])") == summary["steps"]
        # Every recovered fault, counted across the takeover: the new controller replayed the lost one's.
        assert _query(url, "sum(max_over_time(monarch_ft_recoveries_total[1h]))") == recovered
        # Only the controller that took over counts a takeover: the endpoint survived it.
        assert _query(url, "max_over_time(monarch_ft_controller_takeovers_total[1h])") == 1
        assert _query(url, "sum(max_over_time(monarch_ft_mttr_seconds_count[1h]))") == recovered
        assert _query(url, "sum(max_over_time(monarch_ft_restarts_total[1h]))") >= 1

        # W&B, offline: one run for the job (each controller's part of it under the same id), the
        # loss at the job's steps, every recovery counted across the takeover.
        runs = offline_runs(str(run_dir))
        assert len(runs) == 2 and len({run_id(r) for r in runs}) == 1, runs
        rows = [row for r in runs for row in history(r)]
        assert max(row.get("recoveries", 0) for row in rows) == recovered
        steps = [row["_step"] for row in rows if "loss" in row]
        assert steps == sorted(set(steps)) and steps[-1] == summary["job_step"] - 1, steps
    finally:
        prometheus.terminate()
        prometheus.wait(timeout=30)
