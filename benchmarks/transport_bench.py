#!/usr/bin/env python3
"""Benchmark of checkpoint transports for torchft recovery (a script, not a test).

Measures, on the same state dicts, with sender and receiver in separate
processes over loopback:
  * ShardedTransport (ours): our TCP, Mooncake tcp, Mooncake rdma (if a NIC is found)
  * torchft HTTPTransport (num_chunks=0 and chunked) and PGTransport (ProcessGroupGloo)
  * the limit: raw socket sends of the same bytes, best of 1, 2, 4, 8 sockets.

State dicts: ``--size-gb`` of float32 in ``--tensor-mb`` tensors (torchft's own
bench shape: 1 GB in 3 MB tensors) and a TorchTitan llama3 debugmodel with
AdamW state.  Ends with ``ratio_vs_http=X.XX ratio_vs_raw=Y.YY`` for the first
(size-gb) case, computed for the backend ``backend="auto"`` picks.

    python benchmarks/transport_bench.py --size-gb 1
"""

import argparse
import gc
import logging
import multiprocessing as mp
import os
import socket
import struct
import sys
import threading
import time
from datetime import timedelta
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

TIMEOUT = timedelta(seconds=300)


# ------------------------------------------------------------------ state dicts


def make_state(kind: str, size_gb: float, tensor_mb: float) -> Any:
    torch.manual_seed(0)
    if kind == "flat":
        n = int(tensor_mb * 1e6) // 4
        count = max(1, int(size_gb * 1e9) // (n * 4))
        return {"user": {f"chunk/{i}": torch.rand(n) for i in range(count)}, "torchft": {"step": 7, "batches_committed": 14}}
    from torchtitan.models.llama3 import Transformer, llama3_args

    args = llama3_args["debugmodel"]
    model = Transformer(args)
    with torch.no_grad():
        model.init_weights()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for p in model.parameters():
        p.grad = torch.randn_like(p)
    opt.step()
    return {"user": {"model": model.state_dict(), "optim": opt.state_dict()}, "torchft": {"step": 7, "batches_committed": 14}}


def tensors_of(sd: Any) -> List[torch.Tensor]:
    from torch.utils._pytree import tree_flatten

    return [t for t in tree_flatten(sd)[0] if isinstance(t, torch.Tensor)]


def digest(sd: Any) -> Tuple[int, float]:
    ts = tensors_of(sd)
    tot = 0.0
    for t in ts:
        if t.numel():
            tot += (
                float(t.detach().reshape(-1).view(torch.uint8).to(torch.int64).sum())
                if t.is_contiguous()
                else float(t.contiguous().view(-1).view(torch.uint8).to(torch.int64).sum())
            )
    return len(ts), tot


def nbytes_of(sd: Any) -> int:
    return sum(t.numel() * t.element_size() for t in tensors_of(sd))


# ------------------------------------------------------------------ sender processes


def _views(sd: Any) -> List[memoryview]:
    from monarch_ft.transport.header import byte_view, memview

    out = []
    for t in tensors_of(sd):
        t = t.detach().contiguous()
        out.append(memview(byte_view(t, t.numel() * t.element_size())))
    return out


def sender_main(case: str, skind: str, size_gb: float, tensor_mb: float, opts: Dict[str, Any], q_out: Any, q_in: Any) -> None:
    logging.basicConfig(level=logging.WARNING)
    from http.server import BaseHTTPRequestHandler

    BaseHTTPRequestHandler.log_message = lambda *a, **k: None  # one line per GET otherwise
    sd = make_state(skind, size_gb, tensor_mb)
    q_out.put(("digest", digest(sd), nbytes_of(sd)))
    if case == "raw":
        views = _views(sd)
        lst = socket.socket()
        lst.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        lst.bind(("127.0.0.1", 0))
        lst.listen(64)
        q_out.put(("meta", lst.getsockname()[1]))

        def serve(c: socket.socket) -> None:
            with c:
                i, s = struct.unpack("!II", c.recv(8, socket.MSG_WAITALL))
                for v in views[i::s]:
                    c.sendall(v)

        lst.settimeout(0.5)
        while q_in.empty():
            try:
                c, _ = lst.accept()
            except socket.timeout:
                continue
            threading.Thread(target=serve, args=(c,), daemon=True).start()
        return
    if case == "pg":
        from torchft.checkpointing.pg_transport import PGTransport
        from torchft.process_group import ProcessGroupGloo

        q_out.put(("meta", "<n/a>"))  # before configure: it blocks until rank 1 joins
        pg = ProcessGroupGloo(timeout=TIMEOUT)
        pg.configure(store_addr=opts["store"], replica_id="0", rank=0, world_size=2)
        tr = PGTransport(pg, timeout=TIMEOUT, device=torch.device("cpu"))
        assert q_in.get() == "go"
        tr.send_checkpoint([1], 7, sd, TIMEOUT)
        q_in.get()
        return
    tr = build(case, opts)
    q_out.put(("meta", tr.metadata()))
    step = 7
    # restage for every timed receive so no run profits from a previous one (e.g. cached checksums)
    while q_in.get() == "stage":
        tr.disallow_checkpoint()
        step += 1
        tr.send_checkpoint([1], step, sd, TIMEOUT)
        q_out.put(("staged", step))
    tr.shutdown()


def build(case: str, opts: Dict[str, Any], template: Optional[Callable[[], Any]] = None) -> Any:
    if case == "http":
        from torchft.checkpointing.http_transport import HTTPTransport

        return HTTPTransport(TIMEOUT, num_chunks=opts.get("num_chunks", 0))
    from monarch_ft.transport import ShardedTransport

    return ShardedTransport(timeout=TIMEOUT, backend=opts["backend"], num_streams=opts.get("streams", 4), state_dict_template=template)


# ------------------------------------------------------------------ receiver side


def raw_recv(port: int, streams: int, sizes: List[int]) -> None:
    bufs = [torch.empty(n, dtype=torch.uint8) for n in sizes]

    def one(i: int) -> None:
        c = socket.create_connection(("127.0.0.1", port))
        with c:
            c.sendall(struct.pack("!II", i, streams))
            for b in bufs[i::streams]:
                mv = memoryview(b.numpy())
                got = 0
                while got < len(mv):
                    r = c.recv_into(mv[got:])
                    if r == 0:
                        raise RuntimeError("raw sender closed early")
                    got += r

    ts = [threading.Thread(target=one, args=(i,)) for i in range(streams)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()


def run_case(case: str, skind: str, a: argparse.Namespace, opts: Dict[str, Any], repeat: int) -> Tuple[float, str]:
    """Spawns the sender, times the receive ``repeat`` times, returns (best seconds, note)."""
    ctx = mp.get_context("spawn")
    q_out, q_in = ctx.Queue(), ctx.Queue()
    store = None
    if case == "pg":
        import torch.distributed as dist

        store = dist.TCPStore("localhost", 0, is_master=True, wait_for_workers=False, timeout=TIMEOUT)
        opts = dict(opts, store=f"localhost:{store.port}/bench")
    p = ctx.Process(target=sender_main, args=(case, skind, a.size_gb, a.tensor_mb, opts, q_out, q_in), daemon=True)
    p.start()
    try:
        _, want, total = q_out.get(timeout=600)
        _, meta = q_out.get(timeout=600)
        best = float("inf")
        note = ""
        if case == "raw":
            probe = make_sizes(skind, a)
            for _ in range(repeat):
                t0 = time.perf_counter()
                raw_recv(meta, opts["streams"], probe)
                best = min(best, time.perf_counter() - t0)
            return best, note
        if case == "pg":
            from torchft.checkpointing.pg_transport import PGTransport
            from torchft.process_group import ProcessGroupGloo

            pg = ProcessGroupGloo(timeout=TIMEOUT)
            pg.configure(store_addr=opts["store"], replica_id="0", rank=1, world_size=2)
            tr = PGTransport(pg, timeout=TIMEOUT, device=torch.device("cpu"))
            q_in.put("go")
            t0 = time.perf_counter()
            got = tr.recv_checkpoint(0, meta, 7, TIMEOUT)
            best = time.perf_counter() - t0
            check(got, want)
            q_in.put("done")
            return best, "1 run (PG send is one-shot)"
        template = None
        if opts.get("inplace"):
            tmpl = make_state(skind, a.size_gb, a.tensor_mb)
            template = lambda: tmpl  # noqa: E731 - the recovering rank's own (stale) state
        tr = build(case, opts, template)
        if case != "http":
            note = tr.backend_name + (" in-place" if template else "")
        for _ in range(repeat):
            q_in.put("stage")
            _, step = q_out.get(timeout=600)
            t0 = time.perf_counter()
            got = tr.recv_checkpoint(0, meta, step, TIMEOUT)
            best = min(best, time.perf_counter() - t0)
            check(got, want)
            del got
            gc.collect()
        tr.shutdown()
        q_in.put("done")
        return best, note
    finally:
        q_in.put("done")
        p.join(timeout=30)
        if p.is_alive():
            p.kill()
        del store


def make_sizes(skind: str, a: argparse.Namespace) -> List[int]:
    sd = make_state(skind, a.size_gb, a.tensor_mb)
    return [t.numel() * t.element_size() for t in tensors_of(sd)]


def check(got: Any, want: Tuple[int, float]) -> None:
    d = digest(got)
    if d != want:
        raise SystemExit(f"data mismatch after transfer: got {d}, want {want}")


# ------------------------------------------------------------------ main


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size-gb", type=float, default=1.0)
    ap.add_argument("--tensor-mb", type=float, default=3.0)
    ap.add_argument("--repeat", type=int, default=5, help="timed runs per case; best is reported")
    ap.add_argument("--streams", type=int, default=4, help="ShardedTransport num_streams")
    ap.add_argument("--no-llama", action="store_true")
    ap.add_argument("--skip", default="", help="comma list of case names to skip (e.g. pg,http-chunked)")
    a = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)

    from monarch_ft.transport import rdma_discovery
    from monarch_ft.transport.mooncake import import_engine

    rdma = rdma_discovery.discover()
    try:
        import_engine()
        mc_ok, mc_why = True, ""
    except ImportError as e:
        mc_ok, mc_why = False, str(e)
    auto = "mooncake-rdma" if (rdma.available and mc_ok) else "tcp"
    print(f"# auto backend -> {auto} ({rdma.reason})", flush=True)

    cases: List[Tuple[str, str, Dict[str, Any]]] = [(f"raw socket x{s}", "raw", {"streams": s}) for s in (1, 2, 4, 8)]
    cases += [
        (f"sharded tcp x{a.streams}", "sharded", {"backend": "tcp", "streams": a.streams}),
        (f"sharded tcp x{a.streams} in-place", "sharded", {"backend": "tcp", "streams": a.streams, "inplace": True}),
        (f"sharded mooncake-tcp x{a.streams}", "sharded", {"backend": "mooncake-tcp", "streams": a.streams}),
        (f"sharded mooncake-rdma x{a.streams}", "sharded", {"backend": "mooncake-rdma", "streams": a.streams}),
        ("http num_chunks=0", "http", {"num_chunks": 0}),
        ("http num_chunks=8", "http", {"num_chunks": 8}),
        ("pg gloo", "pg", {}),
    ]
    skip = set(filter(None, a.skip.split(",")))
    skinds = [("flat", f"{a.size_gb:g} GB in {a.tensor_mb:g} MB tensors")]
    if not a.no_llama:
        skinds.append(("llama", "llama3 debugmodel + AdamW"))

    results: Dict[Tuple[str, str], Tuple[float, float, str]] = {}
    for skind, sdesc in skinds:
        total = sum(make_sizes(skind, a))
        print(f"\n## {sdesc}: {total / 1e9:.3f} GB", flush=True)
        for name, case, opts in cases:
            if name in skip or case in skip:
                continue
            if "mooncake-rdma" in name and not rdma.available:
                print(f"  {name:<28} skipped: {rdma.reason}", flush=True)
                continue
            if "mooncake" in name and not mc_ok:
                print(f"  {name:<28} skipped: {mc_why}", flush=True)
                continue
            print(f"  {name:<28} ...", end="", flush=True)
            try:
                secs, note = run_case(case, skind, a, opts, a.repeat)
            except Exception as e:
                print(f" failed: {type(e).__name__}: {e}", flush=True)
                continue
            results[(skind, name)] = (secs, total / secs / 1e9, note)
            print(f" {total / secs / 1e9:6.2f} GB/s  {secs:7.3f} s  {note}", flush=True)

    print("\n| state dict | transport | GB/s | seconds |\n|---|---|---:|---:|")
    for skind, sdesc in skinds:
        for name, _, _ in cases:
            r = results.get((skind, name))
            if r:
                print(f"| {sdesc} | {name} | {r[1]:.2f} | {r[0]:.3f} |")
    flat = {n: v for (k, n), v in results.items() if k == "flat"}
    ours = flat.get(f"sharded {auto} x{a.streams}")
    http = flat.get("http num_chunks=0")
    raw = max((v[1] for n, v in flat.items() if n.startswith("raw")), default=None)
    if ours and http and raw:
        print(f"ratio_vs_http={ours[1] / http[1]:.2f} ratio_vs_raw={ours[1] / raw:.2f}")
    else:
        print("ratio_vs_http=nan ratio_vs_raw=nan")


if __name__ == "__main__":
    main()
