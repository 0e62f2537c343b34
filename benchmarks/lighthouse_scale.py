"""torchft's Lighthouse at 16 to 1,024 replicas: quorum time, a dead replica's exit, its CPU and memory.

    python benchmarks/lighthouse_scale.py                             # 16, 128, 512, 1024 replicas
    python benchmarks/lighthouse_scale.py --replicas 16,128,1024 --rounds 20 --out docs/results/lighthouse-scale
    python benchmarks/lighthouse_scale.py --replicas 1024 --interval-ms 50 --timeout-ms 200   # fixed, not the scaled defaults

No training: N replicas are light clients of the real Lighthouse (torchft's server, started as the
controller starts it: ``monarch_ft.controller.lighthouse.lighthouse_argv``, ``RUST_LOG=info`` to a log
file), each with its own ``torchft.coordination.LighthouseClient`` (one gRPC connection, as each
group's Manager has), driven from ``--client-procs`` processes:

- heartbeats: every replica every ``--interval-ms`` (default: ``ft.heartbeat_interval_ms``'s rule for N,
  :func:`monarch_ft.config.ft.heartbeat_for`), from a few threads per process;
- a quorum round: every replica calls ``quorum(step=r)`` at once (one thread each, released together),
  as the Managers do at each step; ``--rounds`` rounds;
- a dead replica: one replica stops heartbeating and leaves; the others ask for a quorum at once. Its
  exit is the time from its last heartbeat to every survivor holding a quorum without it
  (``--kills`` times, a different replica each).

Per N: the quorum round's time, p50 and p99 over rounds, from the last request sent to the last
replica holding the quorum (every member has it; the request skew of N threads on this machine's
cores is left out), with its two parts, the Lighthouse's (last request to the quorum's ``created``
time) and the delivery (``created`` to the last reply parsed); each replica's own request-to-reply
time (p50, p99); the dead replica's exit (p50, max); the Lighthouse process's own CPU (its
``cpu_times``: per round, and per second under heartbeats alone, with the cost of one heartbeat)
and peak RSS; the client processes' CPU beside it (what hosting N replicas on this machine costs,
not the Lighthouse's); replicas missing from a round's quorum (a replica's heartbeats late past the
timeout: the interval too short for the load). A progress line per phase; ``<out>/lighthouse.json``,
``table.md`` and ``lighthouse.png`` written after each N. Ends with one line
``quorum_p50_ms_<N>=… quorum_p99_ms_<N>=… leave_ms_<N>=…`` for the largest N. Printed, never asserted.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import socket
import subprocess
import sys
import threading
import time
from datetime import timedelta
from typing import Any, Optional

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from monarch_ft.records.provenance import git_commit  # noqa: E402


from monarch_ft.records.stats import percentile  # noqa: E402


# ---------------------------------------------------------------- a client process
def client_main(conn, addr: str, ids: list[str], interval_ms: int, hb_threads: int, per_client: int) -> None:
    """One process of light replicas: their heartbeats, and their quorum calls on command.

    Commands on ``conn``: ("round", step, members) -> every replica in ``members`` calls quorum at
    once and the timings come back; ("kill", replica) -> its heartbeats stop, the time of its last
    one comes back; ("stop",)."""
    os.environ.setdefault("TOKIO_WORKER_THREADS", "1")
    os.environ["RUST_LOG"] = "warn"  # the clients' own log: a line per connection otherwise
    from concurrent.futures import ThreadPoolExecutor

    from torchft.coordination import LighthouseClient

    clients: dict[str, Any] = {}
    shared = None
    for i, rid in enumerate(ids):
        if i % per_client == 0:
            shared = LighthouseClient(addr, timedelta(seconds=30))
        clients[rid] = shared
    dead: set[str] = set()
    last_beat: dict[str, float] = {}
    stop = threading.Event()
    late = [0.0]  # the longest gap between two heartbeat sweeps, over the interval
    lock = threading.Lock()

    def beat(mine: list[str]) -> None:
        period = interval_ms / 1000.0
        nxt = time.monotonic()
        prev = None
        while not stop.is_set():
            for rid in mine:
                if rid in dead:
                    continue
                try:
                    clients[rid].heartbeat(rid, timedelta(seconds=5))
                    last_beat[rid] = time.time()
                except Exception:  # noqa: BLE001 - a failed heartbeat is a late one: counted by the Lighthouse
                    pass
            now = time.monotonic()
            if prev is not None:
                with lock:
                    late[0] = max(late[0], now - prev)
            prev = now
            nxt += period
            wait = nxt - time.monotonic()
            if wait > 0:
                stop.wait(wait)
            else:
                nxt = time.monotonic()

    threads = [threading.Thread(target=beat, args=(ids[k::hb_threads],), daemon=True) for k in range(min(hb_threads, len(ids)))]
    for t in threads:
        t.start()
    pool = ThreadPoolExecutor(max_workers=len(ids))

    def ask(rid: str, step: int, go: threading.Event) -> tuple:
        go.wait()
        sent = time.time()
        try:
            q = clients[rid].quorum(rid, timedelta(seconds=60), address=rid, store_address="", step=step, world_size=1)
        except Exception as e:  # noqa: BLE001 - reported as a failed call
            return (rid, sent, time.time(), None, 0, None, str(e)[:200])
        got = time.time()
        created = q.created.seconds + q.created.nanos / 1e9
        members = {m.replica_id for m in q.participants}
        return (rid, sent, got, created, len(members), q.quorum_id, None if rid in members else "not in its own quorum")

    conn.send(("ready", os.getpid()))
    while True:
        cmd = conn.recv()
        if cmd[0] == "stop":
            break
        if cmd[0] == "kill":
            dead.add(cmd[1])
            conn.send(("killed", last_beat.get(cmd[1])))
        elif cmd[0] == "round":
            _, step, members = cmd
            go = threading.Event()
            futures = [pool.submit(ask, rid, step, go) for rid in ids if rid in members and rid not in dead]
            time.sleep(0.05)  # every thread waits at the gate
            go.set()
            conn.send(("round", [f.result() for f in futures]))
        elif cmd[0] == "late":
            with lock:
                conn.send(("late", late[0]))
                late[0] = 0.0
    stop.set()
    pool.shutdown(wait=False, cancel_futures=True)
    conn.send(("bye",))


# ---------------------------------------------------------------- the coordinator
class Replicas:
    """N light replicas in ``procs`` processes, and the Lighthouse they talk to."""

    def __init__(self, n: int, procs: int, addr: str, interval_ms: int, hb_threads: int, per_client: int) -> None:
        self.ids = [f"r{i:05d}" for i in range(n)]
        ctx = mp.get_context("spawn")
        self.parts: list[tuple[Any, Any, list[str]]] = []
        for p in range(procs):
            mine = self.ids[p::procs]
            if not mine:
                continue
            parent, child = ctx.Pipe()
            proc = ctx.Process(target=client_main, args=(child, addr, mine, interval_ms, hb_threads, per_client), daemon=True)
            proc.start()
            self.parts.append((proc, parent, mine))
        self.pids = []
        for proc, conn, _ in self.parts:
            msg = conn.recv()
            self.pids.append(msg[1])
        self.alive = set(self.ids)

    def round(self, step: int) -> list[tuple]:
        for _, conn, mine in self.parts:
            conn.send(("round", step, set(mine) & self.alive))
        out: list[tuple] = []
        for _, conn, _ in self.parts:
            out += conn.recv()[1]
        return out

    def kill(self, rid: str) -> Optional[float]:
        for _, conn, mine in self.parts:
            if rid in mine:
                conn.send(("kill", rid))
                self.alive.discard(rid)
                return conn.recv()[1]
        return None

    def late(self) -> float:
        worst = 0.0
        for _, conn, _ in self.parts:
            conn.send(("late",))
            worst = max(worst, conn.recv()[1])
        return worst

    def close(self) -> None:
        for proc, conn, _ in self.parts:
            try:
                conn.send(("stop",))
                conn.recv()
            except (OSError, EOFError):
                pass
            proc.join(10)
            if proc.is_alive():
                proc.kill()
                proc.join(5)


def start_lighthouse(log_path: str, interval_ms: int, timeout_ms: int, join_timeout_ms: int, tick_ms: int) -> tuple[subprocess.Popen, str]:
    from monarch_ft.controller.lighthouse import lighthouse_argv

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server, env = lighthouse_argv()
    argv = [
        *server,
        "--bind",
        f"127.0.0.1:{port}",
        "--min_replicas",
        "1",
        "--join_timeout_ms",
        str(join_timeout_ms),
        "--quorum_tick_ms",
        str(tick_ms),
        "--heartbeat_timeout_ms",
        str(timeout_ms),
    ]
    log = open(log_path, "ab")
    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "RUST_LOG": "info", **env}, start_new_session=True)
    log.close()
    deadline = time.time() + 30
    while time.time() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return proc, f"http://127.0.0.1:{port}"
        except OSError:
            if proc.poll() is not None:
                raise SystemExit(f"monarch_ft: error: the Lighthouse exited at start: see {log_path}")
            time.sleep(0.1)
    proc.kill()
    raise SystemExit(f"monarch_ft: error: the Lighthouse did not listen within 30 s: see {log_path}")


def cpu_s(pids: list[int]) -> float:
    import psutil

    total = 0.0
    for pid in pids:
        try:
            t = psutil.Process(pid).cpu_times()
            total += t.user + t.system
        except psutil.Error:
            pass
    return total


def rss_mb(pid: int) -> float:
    import psutil

    try:
        return psutil.Process(pid).memory_info().rss / 2**20
    except psutil.Error:
        return 0.0


def run_n(n: int, args: argparse.Namespace, out: str) -> dict[str, Any]:
    """Every measurement at ``n`` replicas (see the module doc)."""
    try:
        from monarch_ft.config.ft import heartbeat_for
    except ImportError:
        heartbeat_for = lambda n: (50, 200)  # noqa: E731

    interval_ms, timeout_ms = heartbeat_for(n)
    interval_ms = args.interval_ms or interval_ms
    timeout_ms = args.timeout_ms or timeout_ms
    procs = max(1, min(args.client_procs, n))
    log_path = os.path.join(out, f"lighthouse_{n}.log")
    if os.path.exists(log_path):
        os.remove(log_path)
    lh, addr = start_lighthouse(log_path, interval_ms, timeout_ms, args.join_timeout_ms, args.quorum_tick_ms)
    peak_rss = rss_mb(lh.pid)
    cell: dict[str, Any] = {"replicas": n, "interval_ms": interval_ms, "timeout_ms": timeout_ms, "client_procs": procs, "load_start": os.getloadavg()[0]}
    started = time.time()
    reps = None
    try:
        reps = Replicas(n, procs, addr, interval_ms, args.hb_threads, args.replicas_per_client)
        up = time.time() - started
        print(f"[lighthouse_scale] {n} replicas: {procs} client processes up in {up:.1f} s, heartbeat {interval_ms}/{timeout_ms} ms", flush=True)
        # Heartbeats alone.
        time.sleep(max(1.0, 4 * timeout_ms / 1000.0))
        reps.late()
        lh0, cl0, t0 = cpu_s([lh.pid]), cpu_s(reps.pids), time.time()
        time.sleep(args.heartbeat_s)
        dt = time.time() - t0
        hb_lh, hb_cl = cpu_s([lh.pid]) - lh0, cpu_s(reps.pids) - cl0
        cell["hb_late_s"] = reps.late()
        cell["heartbeats_per_s"] = n * 1000.0 / interval_ms
        cell["lh_cpu_hb_pct"] = 100.0 * hb_lh / dt
        cell["lh_cpu_per_heartbeat_us"] = 1e6 * hb_lh / (dt * cell["heartbeats_per_s"])
        cell["client_cpu_hb_pct"] = 100.0 * hb_cl / dt
        peak_rss = max(peak_rss, rss_mb(lh.pid))
        print(
            f"[lighthouse_scale] {n}: heartbeats alone: Lighthouse {cell['lh_cpu_hb_pct']:.1f}% CPU "
            f"({cell['lh_cpu_per_heartbeat_us']:.1f} us a heartbeat), clients {cell['client_cpu_hb_pct']:.0f}%, worst sweep {cell['hb_late_s'] * 1000:.0f} ms",
            flush=True,
        )
        # Quorum rounds.
        rounds, per_replica, server, delivery, missing, failures = [], [], [], [], [], []
        lh0, cl0, t0 = cpu_s([lh.pid]), cpu_s(reps.pids), time.time()
        for r in range(args.rounds + 1):
            res = reps.round(r)
            peak_rss = max(peak_rss, rss_mb(lh.pid))
            ok = [x for x in res if x[3] is not None]
            failures += [x[6] for x in res if x[6]]
            if not ok:
                continue
            last_sent = max(x[1] for x in ok)
            last_got = max(x[2] for x in ok)
            created = max(x[3] for x in ok)
            if r == 0:
                continue  # the first quorum: every replica joins anew (not a step's quorum)
            rounds.append(last_got - last_sent)
            server.append(created - last_sent)
            delivery.append(last_got - created)
            per_replica += [x[2] - x[1] for x in ok]
            missing.append(n - min(x[4] for x in ok))
            if r % max(1, args.rounds // 4) == 0:
                print(f"[lighthouse_scale] {n}: round {r}/{args.rounds}: {1000 * rounds[-1]:.0f} ms, {missing[-1]} missing", flush=True)
        dt = time.time() - t0
        lh_rounds, cl_rounds = cpu_s([lh.pid]) - lh0, cpu_s(reps.pids) - cl0
        cell.update(
            quorum_p50_ms=1000 * percentile(rounds, 50),
            quorum_p99_ms=1000 * percentile(rounds, 99),
            server_p50_ms=1000 * percentile(server, 50),
            server_p99_ms=1000 * percentile(server, 99),
            delivery_p50_ms=1000 * percentile(delivery, 50),
            replica_p50_ms=1000 * percentile(per_replica, 50),
            replica_p99_ms=1000 * percentile(per_replica, 99),
            rounds=len(rounds),
            missing_max=max(missing) if missing else None,
            failed_calls=len(failures),
            failure_example=failures[0] if failures else None,
            # The Lighthouse's CPU per round, less its heartbeats' share meanwhile.
            lh_cpu_per_round_ms=1000 * max(0.0, lh_rounds - hb_lh / args.heartbeat_s * dt) / max(1, args.rounds + 1),
            client_cpu_per_round_ms=1000 * cl_rounds / max(1, args.rounds + 1),
        )
        print(
            f"[lighthouse_scale] {n}: quorum p50 {cell['quorum_p50_ms']:.1f} ms p99 {cell['quorum_p99_ms']:.1f} ms "
            f"(Lighthouse {cell['server_p50_ms']:.1f}, delivery {cell['delivery_p50_ms']:.1f}); Lighthouse {cell['lh_cpu_per_round_ms']:.1f} ms CPU a round",
            flush=True,
        )
        # A dead replica's exit.
        leaves = []
        for k in range(args.kills):
            victim = sorted(reps.alive)[(k * 7919) % len(reps.alive)]
            last = reps.kill(victim) or time.time()
            res = reps.round(args.rounds + 1 + k)
            ok = [x for x in res if x[3] is not None and x[4] == len(reps.alive)]
            if len(ok) == len(res) and ok:
                leaves.append(max(x[2] for x in ok) - last)
            peak_rss = max(peak_rss, rss_mb(lh.pid))
        cell["leave_p50_ms"] = 1000 * percentile(leaves, 50) if leaves else None
        cell["leave_max_ms"] = 1000 * max(leaves) if leaves else None
        cell["leaves"] = len(leaves)
        leave = fmt(cell["leave_p50_ms"], "{:.0f}")
        print(f"[lighthouse_scale] {n}: a dead replica leaves the quorum in {leave} ms p50 ({len(leaves)}/{args.kills})", flush=True)
    finally:
        if reps is not None:
            reps.close()
        cell["lh_rss_peak_mb"] = peak_rss
        cell["lh_log_bytes"] = os.path.getsize(log_path) if os.path.exists(log_path) else 0
        lh.kill()
        lh.wait(10)
        cell["load_end"] = os.getloadavg()[0]
        cell["seconds"] = time.time() - started
    return cell


# ---------------------------------------------------------------- outputs
COLUMNS = (
    ("replicas", "replicas", "{}"),
    ("interval_ms", "heartbeat every / timeout (ms)", None),
    ("quorum_p50_ms", "quorum p50 (ms)", "{:.1f}"),
    ("quorum_p99_ms", "quorum p99 (ms)", "{:.1f}"),
    ("server_p50_ms", "of which the Lighthouse, p50 (ms)", "{:.1f}"),
    ("delivery_p50_ms", "delivery p50 (ms)", "{:.1f}"),
    ("replica_p50_ms", "a replica's request to reply p50 / p99 (ms)", None),
    ("leave_p50_ms", "dead replica leaves p50 / max (ms)", None),
    ("lh_cpu_per_round_ms", "Lighthouse CPU a round (ms)", "{:.1f}"),
    ("lh_cpu_hb_pct", "Lighthouse CPU, heartbeats alone (%)", "{:.1f}"),
    ("lh_cpu_per_heartbeat_us", "Lighthouse CPU a heartbeat (us)", "{:.1f}"),
    ("lh_rss_peak_mb", "Lighthouse peak RSS (MB)", "{:.0f}"),
    ("client_cpu_per_round_ms", "clients' CPU a round (ms)", "{:.0f}"),
    ("missing_max", "replicas missing from a quorum (max)", "{}"),
)


def fmt(v: Any, spec: str) -> str:
    return "n/a" if v is None else spec.format(v)


def table(cells: list[dict]) -> str:
    head = "| " + " | ".join(c[1] for c in COLUMNS) + " |"
    lines = [head, "|" + "---|" * len(COLUMNS)]
    for c in cells:
        vals = []
        for key, _, spec in COLUMNS:
            if key == "interval_ms":
                vals.append(f"{c['interval_ms']} / {c['timeout_ms']}")
            elif key == "replica_p50_ms":
                vals.append(f"{fmt(c.get('replica_p50_ms'), '{:.0f}')} / {fmt(c.get('replica_p99_ms'), '{:.0f}')}")
            elif key == "leave_p50_ms":
                vals.append(f"{fmt(c.get('leave_p50_ms'), '{:.0f}')} / {fmt(c.get('leave_max_ms'), '{:.0f}')}")
            else:
                vals.append(fmt(c.get(key), spec))
        lines.append("| " + " | ".join(vals) + " |")
    return "\n".join(lines)


def plot(cells: list[dict], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ns = [c["replicas"] for c in cells]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    ax = axes[0]
    lines = (
        ("quorum_p50_ms", "quorum p50"),
        ("quorum_p99_ms", "quorum p99"),
        ("server_p50_ms", "of which the Lighthouse p50"),
        ("leave_p50_ms", "dead replica leaves p50"),
    )
    for key, label in lines:
        ax.plot(ns, [c.get(key) for c in cells], marker="o", label=label)
    ax.set_ylabel("ms")
    ax.set_title("quorum and exit times")
    ax = axes[1]
    ax.plot(ns, [c.get("lh_cpu_per_round_ms") for c in cells], marker="o", label="Lighthouse CPU a round (ms)")
    ax.plot(ns, [c.get("client_cpu_per_round_ms") for c in cells], marker="o", label="clients' CPU a round (ms)")
    ax.set_title("CPU a quorum round")
    ax = axes[2]
    ax.plot(ns, [c.get("lh_cpu_hb_pct") for c in cells], marker="o", label="Lighthouse CPU, heartbeats alone (%)")
    ax.plot(ns, [c.get("lh_rss_peak_mb") for c in cells], marker="o", label="Lighthouse peak RSS (MB)")
    ax.set_title("the Lighthouse's load")
    for ax in axes:
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("replicas")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--replicas", default="16,128,512,1024", help="comma-separated replica counts (default 16,128,512,1024)")
    ap.add_argument("--rounds", type=int, default=20, help="quorum rounds per count (default 20)")
    ap.add_argument("--kills", type=int, default=3, help="dead replicas per count, one at a time (default 3)")
    ap.add_argument("--heartbeat-s", type=float, default=5.0, help="seconds of heartbeats alone per count (default 5)")
    ap.add_argument("--interval-ms", type=int, default=0, help="heartbeat interval (default: ft.heartbeat_interval_ms's rule for N)")
    ap.add_argument("--timeout-ms", type=int, default=0, help="heartbeat timeout (default: ft.heartbeat_timeout_ms's rule for N)")
    ap.add_argument("--join-timeout-ms", type=int, default=1000, help="the Lighthouse's join timeout (ft.join_timeout_ms's default)")
    ap.add_argument("--quorum-tick-ms", type=int, default=50, help="the Lighthouse's quorum tick (ft.quorum_tick_ms's default)")
    ap.add_argument("--client-procs", type=int, default=2, help="processes hosting the replicas (default 2: this machine's cores)")
    ap.add_argument("--hb-threads", type=int, default=16, help="heartbeat threads per client process (default 16)")
    ap.add_argument("--replicas-per-client", type=int, default=1, help="replicas sharing one LighthouseClient connection (default 1: one each)")
    ap.add_argument("--out", default=None, help="results folder (default outputs/lighthouse_scale/<time>)")
    args = ap.parse_args()
    try:
        counts = [int(x) for x in args.replicas.split(",") if x.strip()]
    except ValueError:
        counts = []
    if not counts or min(counts) < 2 or args.rounds < 1 or args.kills < 0 or args.client_procs < 1 or args.hb_threads < 1 or args.replicas_per_client < 1:
        print("monarch_ft: error: give --replicas as comma-separated integers >= 2 (e.g. 16,128,1024), --rounds >= 1, --client-procs >= 1", file=sys.stderr)
        sys.exit(2)
    if (args.interval_ms or args.timeout_ms) and args.timeout_ms and args.interval_ms and args.timeout_ms < 4 * args.interval_ms:
        print("monarch_ft: error: --timeout-ms must be at least 4 x --interval-ms (as ft.heartbeat_timeout_ms)", file=sys.stderr)
        sys.exit(2)
    out = args.out or os.path.join(REPO, "outputs", "lighthouse_scale", time.strftime("%Y-%m-%d_%H-%M-%S"))
    os.makedirs(out, exist_ok=True)
    meta = {"commit": git_commit(REPO), "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "argv": sys.argv[1:], "cpus": os.cpu_count()}
    cells = []
    for n in counts:
        cells.append(run_n(n, args, out))
        with open(os.path.join(out, "lighthouse.json"), "w") as f:
            json.dump({"meta": meta, "cells": cells}, f, indent=1)
        with open(os.path.join(out, "table.md"), "w") as f:
            f.write(table(cells) + "\n")
        plot(cells, os.path.join(out, "lighthouse.png"))
    print(table(cells))
    last = cells[-1]
    n = last["replicas"]
    p50, p99, leave = fmt(last.get("quorum_p50_ms"), "{:.1f}"), fmt(last.get("quorum_p99_ms"), "{:.1f}"), fmt(last.get("leave_p50_ms"), "{:.0f}")
    print(f"quorum_p50_ms_{n}={p50} quorum_p99_ms_{n}={p99} leave_ms_{n}={leave}")


if __name__ == "__main__":
    main()
