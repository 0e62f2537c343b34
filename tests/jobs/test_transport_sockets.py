"""monarch_ft.transport over real sockets within one process (no network mocks).
Transfers from other processes, DTensors and Mooncake are in tests/jobs/test_transport_jobs.py."""

import socket
import sys
import threading
import time
from datetime import timedelta

import psutil
import pytest
import torch
from torchft.checkpointing.transport import CheckpointTransport

from monarch_ft.transport import (
    AllPeersFailedError,
    ChecksumMismatchError,
    ShardedTransport,
    StaleCheckpointError,
    TransferTimeoutError,
    TransportError,
    TruncatedTransferError,
    build_checkpoint_transport,
    parse_metadata,
    rdma_discovery,
)

# Real sockets, threads and their timeouts (seconds of waiting): the integration tier, not the fast one.
pytestmark = pytest.mark.slow

T = timedelta(seconds=20)


def mixed_state():
    g = torch.Generator().manual_seed(0)
    user = {
        "f32": torch.randn(257, 33, generator=g),
        "f64": torch.randn(10, generator=g, dtype=torch.float64),
        "f16": torch.randn(40, generator=g).half(),
        "bf16": torch.randn(3, 50, generator=g).bfloat16(),
        "c64": torch.randn(7, generator=g, dtype=torch.complex64),
        "i8": torch.randint(-100, 100, (13,), generator=g, dtype=torch.int8),
        "u8": torch.randint(0, 255, (17,), generator=g, dtype=torch.uint8),
        "i16": torch.randint(-999, 999, (5,), generator=g, dtype=torch.int16),
        "i32": torch.randint(-999, 999, (5,), generator=g, dtype=torch.int32),
        "i64": torch.arange(11),
        "bool": torch.rand(9, generator=g) > 0.5,
        "u16": torch.arange(6).to(torch.uint16),
        "u32": torch.arange(6).to(torch.uint32),
        "f8": torch.randn(8, generator=g).to(torch.float8_e4m3fn),
        "scalar_t": torch.tensor(3.5),
        "transposed": torch.randn(6, 9, generator=g).t(),
        "strided": torch.randn(20, 10, generator=g)[2:15:3, 1::2],
        "expanded": torch.randn(4, 1, generator=g).expand(4, 5),
        "empty": torch.empty(0, 3),
        "param": torch.nn.Parameter(torch.randn(4, 4, generator=g)),
        "int": 42,
        "float": 0.125,
        "str": "hello",
        "none": None,
        "nested": {"list": [1, torch.ones(3), {"deep": torch.zeros(2, 2), "s": "x"}], "tuple": (1, "a")},
    }
    return {"user": user, "torchft": {"step": 12, "batches_committed": 48}}


def assert_same(a, b, path="sd"):
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor), path
        assert a.dtype == b.dtype and a.shape == b.shape, path
        assert a.stride() == b.stride(), f"{path}: strides {a.stride()} != {b.stride()}"
        assert torch.equal(
            a.detach().view(torch.uint8) if a.dtype == torch.float8_e4m3fn else a.detach(),
            b.view(torch.uint8) if b.dtype == torch.float8_e4m3fn else b,
        ), path
    elif isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys(), path
        for k in a:
            assert_same(a[k], b[k], f"{path}.{k}")
    elif isinstance(a, (list, tuple)):
        assert type(a) is type(b) and len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same(x, y, f"{path}[{i}]")
    else:
        assert a == b, path


@pytest.fixture
def transports():
    made = []

    def make(**kw):
        kw.setdefault("backend", "tcp")
        kw.setdefault("chunk_size", 4096)
        t = ShardedTransport(timeout=T, **kw)
        made.append(t)
        return t

    yield make
    for t in made:
        t.shutdown()


def test_is_checkpoint_transport_with_defaults():
    t = ShardedTransport(timeout=timedelta(seconds=60))
    try:
        assert isinstance(t, CheckpointTransport)
        assert t.metadata().startswith("mft1://")
        assert t.backend_name == "tcp"  # no RDMA here: auto falls back to our TCP
    finally:
        t.shutdown()


def test_round_trip_mixed(transports):
    src, dst = transports(), transports()
    sd = mixed_state()
    src.send_checkpoint([1], 12, sd, T)
    got = dst.recv_checkpoint(0, src.metadata(), 12, T)
    assert_same(sd, got)
    assert got["torchft"] == {"step": 12, "batches_committed": 48}
    # a second receive of the same staging works (many chunks, small chunk size)
    assert_same(sd, dst.recv_checkpoint(0, src.metadata(), 12, T))


def test_inplace_template(transports):
    sd = {"user": {"w": torch.randn(64, 64), "t": torch.randn(8, 4).t(), "n": torch.randn(3)}, "torchft": {"step": 1}}
    tmpl = {"user": {"w": torch.zeros(64, 64), "t": torch.zeros(4, 8), "n": torch.zeros(3).double()}}
    src = transports()
    dst = transports(state_dict_template=lambda: tmpl)
    src.send_checkpoint([1], 1, sd, T)
    got = dst.recv_checkpoint(0, src.metadata(), 1, T)
    assert got["user"]["w"] is tmpl["user"]["w"]  # received in place
    assert torch.equal(tmpl["user"]["w"], sd["user"]["w"])
    assert got["user"]["t"] is tmpl["user"]["t"] and torch.equal(tmpl["user"]["t"], sd["user"]["t"])  # copied in
    assert got["user"]["n"].dtype == torch.float32  # dtype mismatch: fresh tensor
    assert torch.equal(got["user"]["n"], sd["user"]["n"])


def test_two_receivers_at_once(transports):
    src = transports(num_streams=2)
    sd = {"user": {f"t{i}": torch.randn(20000) for i in range(10)}, "torchft": {"step": 2}}
    src.send_checkpoint([1, 2], 2, sd, T)
    results, errors = {}, []

    def recv(i):
        try:
            results[i] = transports(num_streams=2).recv_checkpoint(0, src.metadata(), 2, T)
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=recv, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors, errors
    for i in range(2):
        assert_same(sd, results[i])


def test_timeout_peer_never_answers(transports):
    lst = socket.socket()
    lst.bind(("127.0.0.1", 0))
    lst.listen(8)
    try:
        dst = transports()
        t0 = time.monotonic()
        with pytest.raises(TransferTimeoutError, match="timed out"):
            dst.recv_checkpoint(0, f"mft1://127.0.0.1:{lst.getsockname()[1]}", 1, timedelta(seconds=1))
        # Its own 1 s, not the transport's T: far from T (a third), whatever the load.
        assert time.monotonic() - t0 < T.total_seconds() / 3
    finally:
        lst.close()


def test_timeout_nothing_staged(transports):
    src, dst = transports(), transports()
    t0 = time.monotonic()
    with pytest.raises(TransferTimeoutError, match="timed out"):
        dst.recv_checkpoint(0, src.metadata(), 1, timedelta(seconds=1))
    assert time.monotonic() - t0 < T.total_seconds() / 3  # its own 1 s, not the transport's T


def test_receiver_waits_for_late_send(transports):
    src, dst = transports(), transports()
    sd = {"user": {"w": torch.randn(100)}, "torchft": {"step": 4}}
    threading.Timer(0.3, lambda: src.send_checkpoint([1], 4, sd, T)).start()
    assert_same(sd, dst.recv_checkpoint(0, src.metadata(), 4, T))
    # the request may also overtake the sender's move from the previous step to this one
    sd5 = {"user": {"w": torch.randn(100)}, "torchft": {"step": 5}}
    threading.Timer(0.3, lambda: src.send_checkpoint([1], 5, sd5, T)).start()
    assert_same(sd5, dst.recv_checkpoint(0, src.metadata(), 5, T))


@pytest.mark.parametrize(
    "fault,err",
    [({"corrupt_chunk": 2}, ChecksumMismatchError), ({"truncate_chunk": 1}, TruncatedTransferError)],
    ids=["corrupt", "truncated"],
)
def test_bad_chunk_detected_then_retried_from_healthy_peer(transports, fault, err):
    sd = {"user": {"w": torch.randn(10000), "v": torch.randn(3000).bfloat16()}, "torchft": {"step": 9}}
    bad = transports(_fault=fault)
    good = transports()
    bad.send_checkpoint([1], 9, sd, T)
    good.send_checkpoint([1], 9, sd, T)
    with pytest.raises(err, match="chunk"):
        transports().recv_checkpoint(0, bad.metadata(), 9, T)
    got = transports(fallback_metadata=[good.metadata()]).recv_checkpoint(0, bad.metadata(), 9, T)
    assert_same(sd, got)
    # several peers in one metadata string, callable fallback
    got = transports(fallback_metadata=lambda r, s: [bad.metadata()]).recv_checkpoint(0, bad.metadata() + "," + good.metadata(), 9, T)
    assert_same(sd, got)


def test_a_test_fault_armed_for_once_damages_one_chunk_then_serves_clean(transports):
    sd = {"user": {"w": torch.randn(10000)}, "torchft": {"step": 9}}
    once = transports(_fault={"corrupt_chunk": 0, "times": 1})
    once.send_checkpoint([1], 9, sd, T)
    with pytest.raises(ChecksumMismatchError, match="chunk 0"):
        transports().recv_checkpoint(0, once.metadata(), 9, T)
    assert_same(sd, transports().recv_checkpoint(0, once.metadata(), 9, T))  # disarmed: the sole source heals


def test_a_bad_chunk_is_fetched_again_from_a_peer_that_only_offered_its_state(transports):
    """TorchFT stages the state on one source only; another healthy peer that offered the same
    step serves it when asked (staged then), and the receive reports who served which chunks.
    An offer serves only its own step, and is withdrawn at the next disallow_checkpoint."""
    sd = {"user": {"w": torch.randn(20000), "v": torch.randn(3000)}, "torchft": {"step": 9}}
    source = transports(chunk_size=1 << 14)
    source.set_test_fault({"corrupt_chunk": 1, "sent_only": True})
    other = transports(chunk_size=1 << 14)
    source.send_checkpoint([1], 9, sd, T)
    built = []
    other.offer(9, lambda: built.append(1) or sd)
    dst = transports(fallback_metadata=lambda src, step: [other.metadata()])
    assert_same(sd, dst.recv_checkpoint(0, source.metadata(), 9, T))
    report = dst.receive_report()
    assert built == [1], "the offered state is built when a receiver asks, once"
    assert report["refetched"] >= 1 and report["chunks"] == sum(p["chunks"] for p in report["peers"])
    assert [p["peer"] for p in report["peers"]] == [source.metadata(), other.metadata()] and report["peers"][1]["chunks"] == report["refetched"]
    assert "checksum mismatch in chunk 1" in report["failures"][0]
    # The hook damages only what send_checkpoint staged: the offered copy served clean above.
    # An offer serves its own step only, and only a receiver asking it as a fallback peer (the
    # named source, here one already past that step, answers stale); a withdrawn offer nothing.
    newer = transports(chunk_size=1 << 14)
    newer.send_checkpoint([1], 11, sd, T)
    other.disallow_checkpoint()
    other.offer(10, lambda: sd)
    asking = transports(fallback_metadata=[other.metadata()])
    with pytest.raises(TransferTimeoutError):
        asking.recv_checkpoint(0, newer.metadata(), 9, timedelta(seconds=1))
    with pytest.raises(TransferTimeoutError):
        transports().recv_checkpoint(0, other.metadata(), 10, timedelta(seconds=1))
    assert_same(sd, asking.recv_checkpoint(0, newer.metadata(), 10, T))
    other.disallow_checkpoint()
    other.offer(10, lambda: sd)
    other.disallow_checkpoint()
    with pytest.raises(TransferTimeoutError):
        asking.recv_checkpoint(0, newer.metadata(), 10, timedelta(seconds=1))


def test_all_peers_bad_names_each(transports):
    sd = {"user": {"w": torch.randn(10000)}, "torchft": {"step": 9}}
    a, b = transports(_fault={"corrupt_chunk": 0}), transports(_fault={"truncate_chunk": 0})
    a.send_checkpoint([1], 9, sd, T)
    b.send_checkpoint([1], 9, sd, T)
    with pytest.raises(AllPeersFailedError) as ei:
        transports(fallback_metadata=[b.metadata()]).recv_checkpoint(0, a.metadata(), 9, T)
    assert "checksum mismatch" in str(ei.value) and "closed the connection" in str(ei.value)


def test_stale_step_detected(transports):
    src, dst = transports(), transports()
    src.send_checkpoint([1], 5, {"user": {"w": torch.ones(3)}, "torchft": {"step": 5}}, T)
    with pytest.raises(StaleCheckpointError, match="stale step: serving step 5 but step 4"):
        dst.recv_checkpoint(0, src.metadata(), 4, T)
    # a newer step than the one staged is not stale: it is waited for, until the timeout
    t0 = time.monotonic()
    with pytest.raises(TransferTimeoutError, match="timed out.*step 6"):
        dst.recv_checkpoint(0, src.metadata(), 6, timedelta(seconds=1))
    assert time.monotonic() - t0 >= 0.9
    stale = transports(_fault={"stale_chunk": 0})
    stale.send_checkpoint([1], 5, {"user": {"w": torch.ones(3)}, "torchft": {"step": 5}}, T)
    with pytest.raises(StaleCheckpointError, match="stale chunk"):
        dst.recv_checkpoint(0, stale.metadata(), 5, T)


def test_disallow_waits_for_reader_then_stops_serving(transports):
    sd = {"user": {"w": torch.randn(40000)}, "torchft": {"step": 1}}
    src = transports(_fault={"delay_s": 0.01}, num_streams=2)
    src.send_checkpoint([1], 1, sd, T)
    out = {}
    th = threading.Thread(target=lambda: out.setdefault("r", transports().recv_checkpoint(0, src.metadata(), 1, T)))
    th.start()
    time.sleep(0.2)
    src.disallow_checkpoint()  # drains the in-flight reader
    expected = sd["user"]["w"].clone()
    sd["user"]["w"].add_(1.0)  # the optimizer may now mutate it
    th.join(10)
    assert torch.equal(out["r"]["user"]["w"], expected)
    with pytest.raises(TransferTimeoutError):
        transports().recv_checkpoint(0, src.metadata(), 1, timedelta(seconds=0.5))


def test_disallow_cuts_off_slow_reader_detectably(transports):
    sd = {"user": {"w": torch.randn(100000)}, "torchft": {"step": 1}}
    src = transports(_fault={"delay_s": 0.02}, drain_timeout=timedelta(seconds=0.2), num_streams=2)
    src.send_checkpoint([1], 1, sd, T)
    err = {}

    def recv():
        try:
            transports().recv_checkpoint(0, src.metadata(), 1, T)
        except TransportError as e:
            err["e"] = e

    th = threading.Thread(target=recv)
    th.start()
    time.sleep(0.1)
    # Returns at its drain timeout, not when the reader is done: the reader, cut off, fails
    # (below); had disallow waited for it, it would have returned whole.
    src.disallow_checkpoint()
    sd["user"]["w"].zero_()
    th.join(10)
    assert not th.is_alive()
    assert isinstance(err.get("e"), TransportError), "a cut-off reader must fail, never return mixed data"


def _our_sockets(ports):
    conns = psutil.Process().net_connections(kind="tcp")
    return [c for c in conns if (c.laddr and c.laddr.port in ports) or (c.raddr and c.raddr.port in ports)]


def test_shutdown_releases_threads_and_sockets():
    before = {t.ident for t in threading.enumerate()}
    src = ShardedTransport(timeout=T, backend="tcp", chunk_size=4096)
    dst = ShardedTransport(timeout=T, backend="tcp")
    ports = {parse_metadata(x.metadata())[0].port for x in (src, dst)}
    src.send_checkpoint([1], 1, {"user": {"w": torch.randn(50000)}, "torchft": {"step": 1}}, T)
    dst.recv_checkpoint(0, src.metadata(), 1, T)
    assert _our_sockets(ports)
    src.shutdown()
    dst.shutdown()
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        leftover = [t for t in threading.enumerate() if t.ident not in before and t.is_alive()]
        if not leftover:
            break
        time.sleep(0.05)
    assert not leftover, leftover
    socks = [c for c in _our_sockets(ports) if c.status != psutil.CONN_TIME_WAIT]
    assert not socks, socks


def test_metadata_parsing():
    peers = parse_metadata("mft1://a:1,mft1://[::1]:2")
    assert [(p.host, p.port) for p in peers] == [("a", 1), ("::1", 2)]
    with pytest.raises(ValueError, match="not a ShardedTransport address"):
        parse_metadata("http://x:1/checkpoint/")


def test_factory():
    s = build_checkpoint_transport("sharded", timedelta(seconds=5), backend="tcp")
    h = build_checkpoint_transport("http", timedelta(seconds=5))
    try:
        assert isinstance(s, ShardedTransport)
        from torchft.checkpointing.http_transport import HTTPTransport

        assert isinstance(h, HTTPTransport)
    finally:
        s.shutdown()
        h.shutdown()
    with pytest.raises(ValueError, match="PGTransport needs a process group"):
        build_checkpoint_transport("pg", timedelta(seconds=5))
    with pytest.raises(ValueError, match="unknown checkpoint transport"):
        build_checkpoint_transport("carrier-pigeon", timedelta(seconds=5))


def test_rdma_discovery_through_real_pyverbs():
    """Discovery asks the real library; here (no RDMA device) it reports the library's answer."""
    import pyverbs.device  # installed by scripts/install.sh: failing to import is a failure

    try:
        listed, answer = pyverbs.device.get_device_list(), None
    except Exception as e:  # the library's own "no devices": PyverbsRDMAError
        listed, answer = None, f"{type(e).__name__}: {e}"
    found = rdma_discovery.discover()
    print(f"rdma discovery: available={found.available} reason={found.reason}")
    if answer is not None or not listed:
        assert not found.available and found.best is None
        assert found.reason.startswith(rdma_discovery.NO_DEVICE), found.reason
        assert (answer or "returned no devices") in found.reason, found.reason
        t = ShardedTransport(timeout=T, backend="auto")
        try:
            assert t.backend_name == "tcp"  # no RDMA: auto falls back to our TCP
        finally:
            t.shutdown()
        with pytest.raises(TransportError, match="no RDMA: " + rdma_discovery.NO_DEVICE):
            ShardedTransport(timeout=T, backend="mooncake-rdma")
    else:  # a host with devices: every one is either an active port or explained
        names = {d.name.decode() if isinstance(d.name, bytes) else str(d.name) for d in listed}
        assert found.available or all(n in found.reason for n in names), found.reason


def test_rdma_discovery_without_pyverbs_says_so(monkeypatch):
    """A host missing pyverbs gets "no RDMA" with the reason, never a crash."""
    monkeypatch.setitem(sys.modules, "pyverbs.device", None)  # makes the import fail
    found = rdma_discovery.discover()
    assert not found.available and found.reason.startswith("pyverbs not importable"), found.reason


def test_checksum_negotiation_and_windows():
    from monarch_ft.transport import checksum as ck
    from monarch_ft.transport.header import byte_view, memview

    assert ck.pick(["nope", "crc32"]) == "crc32"
    with pytest.raises(ValueError, match="no common checksum"):
        ck.pick(["nope"])
    t = torch.rand((3 << 20) // 4 + 5)
    m = memview(byte_view(t, t.numel() * 4))
    for algo in ck.PREFERRED:  # streamed window by window == one pass
        v = 0
        for w in range(0, len(m), ck.WINDOW):
            v = ck.update(algo, m[w : w + ck.WINDOW], v)
        assert v & 0xFFFFFFFF == ck.checksum(algo, [m])
        flipped = bytearray(m)
        flipped[12345] ^= 1
        assert ck.checksum(algo, [memoryview(flipped)]) != ck.checksum(algo, [m])
