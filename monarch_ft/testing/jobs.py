"""Job-test helpers: run real jobs as subprocesses and inspect what they leave behind.

What the tests import (``from monarch_ft.testing.jobs import ...``); the pytest fixtures
built on them (``run_dir``, which checks that a job left nothing running) are in
``tests/conftest.py``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from monarch_ft.paths import REPO_ROOT
from monarch_ft.records.layout import read_jsonl as layout_read_jsonl

REPO = Path(REPO_ROOT)
PRETRAIN = REPO / "recipes" / "pretrain.py"
DRILL = REPO / "recipes" / "drill.py"

# Small and quick: the tiny llama3, short sequences, tight timeouts. The recovery defaults a
# user gets (a warm standby group with launcher=local, warm fork servers) stay on: a test that
# turns one off (NO_STANDBY, NO_WARM_FORK) says why where it does.
FAST = [
    "model=tiny",
    "training.seq_len=64",
    "training.batch_size=2",
    "training.lr=5e-3",
    "ft.hang_timeout_s=20",
]
NO_STANDBY = "ft.standby_groups=0"
NO_WARM_FORK = "ft.warm_fork=false"


def start_job(run_dir: Path, *overrides: str, recipe: Path = PRETRAIN) -> subprocess.Popen:
    argv = [sys.executable, str(recipe), *overrides, f"hydra.run.dir={run_dir}"]
    log = open(run_dir.parent / f"{run_dir.name}.console.log", "wb")
    return subprocess.Popen(argv, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def finish_job(proc: subprocess.Popen, run_dir: Path, timeout: float = 240) -> int:
    """The job's exit code; a job still running after ``timeout`` is stopped (SIGTERM, so
    the supervisor cleans up, then SIGKILL) and the test fails with its console."""
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
        raise AssertionError(f"job did not finish within {timeout}s; console: {console(run_dir)[-3000:]}")


def run_job(run_dir: Path, *overrides: str, timeout: float = 240, recipe: Path = PRETRAIN) -> int:
    return finish_job(start_job(run_dir, *overrides, recipe=recipe), run_dir, timeout)


def run_drill_job(run_dir: Path, *overrides: str, timeout: float = 300) -> dict:
    """Run recipes/drill.py to a clean exit and return its drill.json (with the recovery defaults
    unless the test turns them off: a fault then waits for the warm standby to be built)."""
    code = run_job(run_dir, *overrides, timeout=timeout, recipe=DRILL)
    assert code == 0, console(run_dir)[-4000:]
    return json.loads((run_dir / "drill.json").read_text())


def assert_drill_refused(tmp_path: Path, overrides: list[str], expected: str) -> None:
    """An impossible drill exits 2 with ``expected`` on stderr and launches nothing."""
    res = subprocess.run(
        [sys.executable, str(DRILL), *overrides, f"hydra.run.dir={tmp_path / 'run'}"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 2, res.stdout + res.stderr
    assert expected in res.stderr, res.stderr
    assert not (tmp_path / "run" / "events.jsonl").exists(), "nothing may be launched"


def console(run_dir: Path) -> str:
    path = run_dir.parent / f"{run_dir.name}.console.log"
    return path.read_text(errors="replace") if path.exists() else ""


def read_jsonl(path: Path) -> list[dict]:
    """The records of a JSONL file of a run ([] while it does not exist): records.layout's reader."""
    return layout_read_jsonl(str(path))


def read_tensorboard_run(folder) -> tuple[dict[str, list[tuple[int, float]]], list[tuple[int, str]]]:
    """A TensorBoard run read back the way TensorBoard reads it: {scalar tag: [(step, value)]},
    and the fault markers' text lines [(step, text)]."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(folder))
    acc.Reload()
    scalars = {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}
    texts = [(e.step, e.tensor_proto.string_val[0].decode()) for tag in acc.Tags()["tensors"] if tag.startswith("faults") for e in acc.Tensors(tag)]
    return scalars, texts


def wait_for(predicate, timeout: float, what: str, poll: float = 0.2):
    deadline = time.time() + timeout
    while time.time() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(poll)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def job_processes(run_dir: Path) -> list[psutil.Process]:
    """Every live process whose command line mentions this run (ranks, supervisor)."""
    return processes_matching(str(run_dir))


def processes_matching(needle: str) -> list[psutil.Process]:
    """Every live (non-zombie) process with ``needle`` in a command-line argument, except this
    one (a controller run in the test's own process titles it after its run: monarch_ft.common.proctitle)."""
    found = []
    for p in psutil.process_iter(["cmdline", "status"]):
        try:
            if p.info["status"] == psutil.STATUS_ZOMBIE or p.pid == os.getpid():
                continue
            if any(needle in part for part in (p.info["cmdline"] or [])):
                found.append(p)
        except psutil.Error:
            continue
    return found


def lighthouse_pids(under: Path | None = None) -> set[int]:
    """Lighthouse servers: torchft's script, or its extension run by monarch_ft/controller/_lighthouse_server.py.
    With ``under``, only those whose output goes to a file below it (a job's lighthouse log sits in
    its run directory): a Lighthouse of some other job on the machine is not this test's."""
    pids = set()
    for p in psutil.process_iter(["name", "status", "cmdline"]):
        server = p.info["name"] == "torchft_lighthouse" or any("_lighthouse_server.py" in a for a in p.info["cmdline"] or [])
        if not server or p.info["status"] == psutil.STATUS_ZOMBIE:
            continue
        if under is not None:
            try:
                if not os.readlink(f"/proc/{p.pid}/fd/1").startswith(str(under)):
                    continue
            except OSError:
                continue
        pids.add(p.pid)
    return pids


def events_of(run_dir: Path, kind: str, **match) -> list[dict]:
    """The job's events of ``kind`` whose fields equal ``match``."""
    return [e for e in read_jsonl(run_dir / "events.jsonl") if e["event"] == kind and all(e.get(k) == v for k, v in match.items())]


def assert_weights_agree_after(run_dir: Path, group: int, attempt: int) -> int:
    """Every rank of every group hashed the same state at every step two groups committed in
    one quorum, from the first step ``group``'s ``attempt`` committed (needs
    training.state_hash_every=1). Not across quorums: a step the only group holding it
    committed before it died is trained again by its healing peer in a quorum of its own
    (supervisor: step_redone). Returns how many (step, rank, quorum) were compared."""
    metrics = [m for m in read_jsonl(run_dir / "metrics.jsonl") if m.get("state_hash")]
    back = min(m["step"] for m in metrics if m["group"] == group and m["attempt"] == attempt)
    by_step: dict = {}
    for m in metrics:
        if m["step"] >= back:
            by_step.setdefault((m["step"], m["rank"], m["quorum_id"]), {})[m["group"]] = m["state_hash"]
    shared = [h for h in by_step.values() if len(h) >= 2]
    assert shared and all(len(set(h.values())) == 1 for h in shared), shared[:3]
    return len(shared)


def config_refusal(tmp_path: Path, overrides: str) -> str:
    """The ConfigError the recipes' supervisor raises for ``overrides``, in this process: the
    message ``monarch_ft.cli.run.run_job`` prints as its one ``monarch_ft: error:`` line before
    it exits 2 (that path, end to end through a recipe, is tested by subprocess tests)."""
    from hydra import compose, initialize_config_dir

    from monarch_ft.cli.run import CONFIG_DIR, to_job_config
    from monarch_ft.controller.loop import Supervisor
    from monarch_ft.records.errors import ConfigError

    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3", job_name="refusal"):
        cfg = compose(config_name="pretrain", overrides=overrides.split())
    run = tmp_path / "run"
    with pytest.raises(ConfigError) as e:
        Supervisor(to_job_config(cfg), str(run)).open()
    assert not (run / "events.jsonl").exists() and not (run / "logs").exists(), "nothing may be launched"
    assert "\n" not in str(e.value)
    return str(e.value)


# ---------------------------------------------------------------- simulated hosts (network namespaces)
def netns_refusal() -> str | None:
    """Why real namespaces cannot be made here (None: they can)."""
    if os.geteuid() != 0:
        return "simulated hosts need root (ip netns add)"
    try:
        res = subprocess.run(["ip", "netns", "add", "mftprobe-tst"], capture_output=True, text=True, timeout=10)
    except FileNotFoundError:
        return "iproute2 (`ip`) is not installed"
    subprocess.run(["ip", "netns", "del", "mftprobe-tst"], capture_output=True)
    return None if res.returncode == 0 else f"ip netns add refused: {res.stderr.strip()}"


def need_netns() -> None:
    """Network namespaces are part of what the project runs on (root, iproute2 from
    scripts/install.sh): without them the test fails, it is not skipped."""
    why = netns_refusal()
    if why:
        pytest.fail(f"simulated hosts unavailable: {why}")


def netns_left_behind(run_id: str) -> list[str]:
    """What of simulated hosts run ``run_id`` is still there: namespaces, links, files."""
    names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    left = [line for line in (names + links).splitlines() if f"mft{run_id}" in line]
    left += [p for p in (f"/etc/netns/mft{run_id}-h0", f"/run/monarch_ft/hosts/{run_id}.json") if os.path.exists(p)]
    return left
