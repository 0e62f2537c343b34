"""monarch_ft.transport over real sockets and real processes (no network mocks): another
process, DTensors, a sender killed mid-transfer, Mooncake, torchft's own transport harness."""

import os
import subprocess
import sys
import textwrap
import threading
import time
from datetime import timedelta

import pytest
import torch

from monarch_ft.testing.jobs import REPO
from monarch_ft.transport import (
    ShardedTransport,
    TransportError,
    rdma_discovery,
)

ROOT = str(REPO)

T = timedelta(seconds=20)


def _env():
    env = dict(os.environ)
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    return env


@pytest.mark.slow
def test_round_trip_from_other_process():
    code = textwrap.dedent(
        """
        import sys, torch
        from datetime import timedelta
        from monarch_ft.transport import ShardedTransport
        t = ShardedTransport(timeout=timedelta(seconds=20), backend="tcp", num_streams=3, chunk_size=1 << 16)
        sd = {"user": {"w": torch.arange(300000, dtype=torch.float32).reshape(300, 1000), "b": torch.ones(5).bfloat16()}, "torchft": {"step": 3}}
        t.send_checkpoint([1], 3, sd, timedelta(seconds=20))
        print(t.metadata(), flush=True)
        sys.stdin.read()
        t.shutdown()
        """
    )
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stdin=subprocess.PIPE, env=_env(), text=True)
    try:
        meta = p.stdout.readline().strip()
        dst = ShardedTransport(timeout=T, backend="tcp", num_streams=3)
        try:
            got = dst.recv_checkpoint(0, meta, 3, T)
        finally:
            dst.shutdown()
        assert torch.equal(got["user"]["w"], torch.arange(300000, dtype=torch.float32).reshape(300, 1000))
        assert got["user"]["b"].dtype == torch.bfloat16 and got["torchft"]["step"] == 3
    finally:
        p.stdin.close()
        # The sender exits once its stdin closes; on a loaded machine its interpreter can
        # take a while to tear torch down, which is not what this test measures.
        p.wait(timeout=60)


DTENSOR_RANK = textwrap.dedent(
    """
    # One rank of a 2-rank replica group: "send" stages its DTensor shards, "recv" pulls
    # them from the same rank of the sending group (TorchFT's pairing) three ways.
    import sys, torch, torch.distributed as dist
    from datetime import timedelta
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor
    from monarch_ft.transport import ShardedTransport

    role, rank, port = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    T = timedelta(seconds=60)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    mesh = init_device_mesh("cpu", (2,), mesh_dim_names=("dp",))
    g = torch.Generator().manual_seed(7)
    full = {"even": torch.randn(8, 6, generator=g), "uneven": torch.randn(7, 3, generator=g),
            "cols": torch.randn(4, 5, generator=g), "rep": torch.randn(5, generator=g)}
    place = {"even": [Shard(0)], "uneven": [Shard(0)], "cols": [Shard(1)], "rep": [Replicate()]}

    def state(fill=None, dtype=None):
        return {k: distribute_tensor(full[k] if fill is None else torch.full_like(full[k], fill, dtype=dtype), mesh, place[k])
                for k in full}

    sent = state()
    if role == "send":
        t = ShardedTransport(timeout=T)  # default construction, as TorchFT builds its transports
        t.send_checkpoint([rank], 5, {"user": sent, "torchft": {"step": 5}}, T)
        print(t.metadata(), flush=True)
        sys.stdin.read()
        t.shutdown()
    else:
        meta = sys.argv[4]
        plain = ShardedTransport(timeout=T)
        got = plain.recv_checkpoint(rank, meta, 5, T)["user"]
        for k in full:  # no template: DTensors with the sender's spec, on a working mesh
            assert isinstance(got[k], DTensor), (k, type(got[k]))
            assert got[k]._spec == sent[k]._spec, (k, got[k]._spec, sent[k]._spec)
            assert got[k].device_mesh == mesh and got[k].placements == tuple(place[k])
            assert got[k].shape == full[k].shape and got[k].stride() == sent[k].stride()
            assert torch.equal(got[k].to_local(), sent[k].to_local()), k
            assert torch.equal(got[k].full_tensor(), full[k]), k  # a collective on the shipped mesh
        tmpl = state(fill=0.0)
        inplace = ShardedTransport(timeout=T, state_dict_template=lambda: {"user": tmpl})
        got = inplace.recv_checkpoint(rank, meta, 5, T)["user"]
        for k in full:  # template of the same layout: received in place
            assert got[k] is tmpl[k], k
            assert torch.equal(tmpl[k].full_tensor(), full[k]), k
        tmpl64 = state(fill=0.0, dtype=torch.float64)
        other = ShardedTransport(timeout=T, state_dict_template=lambda: {"user": tmpl64})
        got = other.recv_checkpoint(rank, meta, 5, T)["user"]
        for k in full:  # template of another dtype: a fresh DTensor on the template's mesh
            assert isinstance(got[k], DTensor) and got[k] is not tmpl64[k], k
            assert got[k].device_mesh is tmpl64[k].device_mesh and got[k].placements == tuple(place[k])
            assert got[k].dtype == torch.float32 and torch.equal(got[k].full_tensor(), full[k]), k
        for t in (plain, inplace, other):
            t.shutdown()
        print(f"DTENSOR_OK rank={rank}", flush=True)
    dist.destroy_process_group()
    """
)


def _group(role, port, metas=("", "")):
    """Starts the two ranks of one replica group running DTENSOR_RANK."""
    return [
        subprocess.Popen(
            [sys.executable, "-c", DTENSOR_RANK, role, str(r), str(port), metas[r]],
            stdout=subprocess.PIPE,
            stdin=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=_env(),
            text=True,
        )
        for r in range(2)
    ]


@pytest.mark.slow
def test_dtensor_round_trip():
    """Sharded (even, uneven, dim 1) and replicated DTensors move between two 2-rank
    replica groups in separate processes, with and without a template."""
    from monarch_ft.common.net import free_port

    senders = _group("send", free_port())
    receivers = []
    try:
        metas = tuple(p.stdout.readline().strip() for p in senders)
        assert all(m.startswith("mft1://") for m in metas), [p.stderr.read()[-2000:] for p in senders if p.poll() is not None]
        receivers = _group("recv", free_port(), metas)
        for r, p in enumerate(receivers):
            out, err = p.communicate(timeout=120)
            assert f"DTENSOR_OK rank={r}" in out, err[-3000:]
    finally:
        for p in senders:
            p.stdin.close()
        for p in senders + receivers:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


SLOW_SENDER = textwrap.dedent(
    """
    import sys, torch
    from datetime import timedelta
    from monarch_ft.transport import ShardedTransport
    t = ShardedTransport(timeout=timedelta(seconds=30), backend="tcp", chunk_size=1 << 16, _fault={"delay_s": 0.05})
    t.send_checkpoint([1], 1, {"user": {"w": torch.randn(1 << 21)}, "torchft": {"step": 1}}, timedelta(seconds=30))
    print(t.metadata(), flush=True)
    sys.stdin.read()
    """
)


@pytest.mark.slow
def test_sender_killed_mid_transfer():
    p = subprocess.Popen([sys.executable, "-c", SLOW_SENDER], stdout=subprocess.PIPE, stdin=subprocess.PIPE, env=_env(), text=True)
    dst = ShardedTransport(timeout=T, backend="tcp")
    try:
        meta = p.stdout.readline().strip()
        threading.Timer(0.4, p.kill).start()  # SIGKILL
        t0 = time.monotonic()
        with pytest.raises(TransportError, match="closed the connection|connection lost|cannot connect"):
            dst.recv_checkpoint(0, meta, 1, T)
        # Fails fast (the error names the lost connection, not a timeout): far from T either way.
        assert time.monotonic() - t0 < T.total_seconds() / 3, "must fail fast, not wait for the timeout"
    finally:
        dst.shutdown()
        p.kill()
        p.wait()


def _need_mooncake():
    try:
        from monarch_ft.transport.mooncake import import_engine

        import_engine()
    except ImportError as e:
        pytest.fail(f"mooncake transfer engine not importable (a dev dependency, see pyproject.toml): {e}")


MOONCAKE_SENDER = textwrap.dedent(
    """
    import sys, torch
    from datetime import timedelta
    from monarch_ft.transport import ShardedTransport
    t = ShardedTransport(timeout=timedelta(seconds=30), backend=sys.argv[1], chunk_size=1 << 18, host="127.0.0.1")
    assert t.backend_name == sys.argv[1], t.backend_name
    g = torch.Generator().manual_seed(1)
    sd = {
        "user": {
            "w": torch.randn(1 << 20, generator=g), "bf": torch.randn(999, generator=g).bfloat16(), "nc": torch.randn(30, 20, generator=g).t(),
            "e": torch.empty(0), "s": "str",
        },
        "torchft": {"step": 8},
    }
    t.send_checkpoint([1], 8, sd, timedelta(seconds=30))
    print(t.metadata(), flush=True)
    sys.stdin.read()
    t.shutdown()
    """
)


def _mooncake_round_trip(backend):
    p = subprocess.Popen([sys.executable, "-c", MOONCAKE_SENDER, backend], stdout=subprocess.PIPE, stdin=subprocess.PIPE, env=_env(), text=True)
    try:
        meta = p.stdout.readline().strip()
        assert meta, "sender failed to start"
        dst = ShardedTransport(timeout=T, backend=backend, host="127.0.0.1")
        try:
            assert dst.backend_name == backend
            got = dst.recv_checkpoint(0, meta, 8, T)
        finally:
            dst.shutdown()
        g = torch.Generator().manual_seed(1)
        assert torch.equal(got["user"]["w"], torch.randn(1 << 20, generator=g))
        assert torch.equal(got["user"]["bf"], torch.randn(999, generator=g).bfloat16())
        nc = torch.randn(30, 20, generator=g).t()
        assert torch.equal(got["user"]["nc"], nc) and got["user"]["nc"].stride() == nc.stride()
        assert got["user"]["e"].numel() == 0 and got["user"]["s"] == "str" and got["torchft"]["step"] == 8
    finally:
        p.stdin.close()
        p.wait(timeout=20)


@pytest.mark.slow
def test_mooncake_tcp_round_trip():
    _need_mooncake()
    _mooncake_round_trip("mooncake-tcp")


@pytest.mark.slow
def test_mooncake_rdma_round_trip():
    found = rdma_discovery.discover()
    if not found.available:
        print(f"skipping rdma: {found.reason}")
        pytest.skip(f"no RDMA NIC: {found.reason}")
    _need_mooncake()
    _mooncake_round_trip("mooncake-rdma")


TORCHFT_HARNESS = textwrap.dedent(
    """
    import sys, unittest, torch
    from datetime import timedelta
    from torchft.checkpointing.transport_test import make_state_dict, run_multi_recovery_test
    from monarch_ft.transport import ShardedTransport

    def make(rank, world):
        if sys.argv[1] == "default":  # as TorchFT builds its own transports
            return ShardedTransport(timeout=timedelta(seconds=10))
        return ShardedTransport(
            timeout=timedelta(seconds=10), backend="tcp",
            state_dict_template=lambda: make_state_dict(torch.device("cpu")),
        )

    class T(unittest.TestCase):
        def test(self):
            run_multi_recovery_test(self, make, torch.device("cpu"))

    r = unittest.TextTestRunner().run(unittest.defaultTestLoader.loadTestsFromTestCase(T))
    print("HARNESS_OK" if r.wasSuccessful() else "HARNESS_FAILED")
    """
)


@pytest.mark.slow
@pytest.mark.parametrize("construction", ["default", "template"])
def test_torchft_transport_harness(construction):
    """Interop: torchft's own multi-recovery conformance test (3 ranks, a DTensor,
    timeouts) passes, built by default like TorchFT's transports and with a template."""
    out = subprocess.run([sys.executable, "-c", TORCHFT_HARNESS, construction], env=_env(), capture_output=True, text=True, timeout=90)
    assert "HARNESS_OK" in out.stdout, (out.stdout + out.stderr)[-4000:]
