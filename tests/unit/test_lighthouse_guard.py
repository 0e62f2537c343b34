"""The Lighthouse guard's log relay (monarch_ft.controller.lighthouse_guard): torchft's
Lighthouse logs while it holds its state lock, so its own writes must never wait on the log's
disk. A real Lighthouse under a real guard, its log a FIFO nobody reads (a disk that blocks
every write): it still forms a quorum."""

from __future__ import annotations

import fcntl
import os
import threading
from datetime import timedelta

from monarch_ft.common.process import is_running, start_ticks
from monarch_ft.config.ft import FTConfig
from monarch_ft.controller.lighthouse import Lighthouse
from monarch_ft.controller.lighthouse_guard import relay

_F_SETPIPE_SZ, _F_GETPIPE_SZ = 1031, 1032


def test_relay_copies_the_servers_output_until_it_closes(tmp_path):
    r, w = os.pipe()
    out = tmp_path / "log"
    lines = b"".join(b"line %d\n" % i for i in range(5000))
    writer = threading.Thread(target=lambda: (os.write(w, lines), os.close(w)))
    writer.start()
    with open(out, "wb") as f:
        relay(r, f.fileno())
    writer.join()
    os.close(r)
    assert out.read_bytes() == lines


def test_a_lighthouse_whose_log_blocks_still_forms_quorums(tmp_path):
    from torchft.coordination import LighthouseClient

    log = tmp_path / "lighthouse.log"
    os.mkfifo(log)
    # The reader end held open and never read, its buffer full: every write to the log blocks.
    reader = os.open(log, os.O_RDONLY | os.O_NONBLOCK)
    filler = os.open(log, os.O_WRONLY | os.O_NONBLOCK)
    fcntl.fcntl(filler, _F_SETPIPE_SZ, 4096)
    size = fcntl.fcntl(filler, _F_GETPIPE_SZ)
    os.write(filler, b"x" * size)
    try:
        os.write(filler, b"x")
        raise AssertionError("the FIFO should be full")
    except BlockingIOError:
        pass
    cfg = FTConfig(replica_groups=2, min_replica_size=1, join_timeout_ms=100, quorum_tick_ms=20)
    cfg.resolve_heartbeats()
    lh = Lighthouse(cfg, str(log), host="127.0.0.1", guard=(str(tmp_path), 600.0, 1.0))
    try:
        address = lh.start()
        server = lh.pid
        identity = (server, start_ticks(server))
        assert server is not None and server != lh.proc.pid, "the server runs under the guard"
        assert os.readlink(f"/proc/{server}/fd/2").startswith("pipe:"), "the server writes to the guard's pipe, not the log"
        client = LighthouseClient(address, timedelta(seconds=10))
        # Each quorum logs lines (while the Lighthouse holds its state lock); written straight
        # to the blocked log, the first would hold the server and these would time out.
        for step in range(3):
            quorum = client.quorum(replica_id="r0", timeout=timedelta(seconds=10), address="a", store_address="s", step=step, world_size=1)
            assert [p.replica_id for p in quorum.participants] == ["r0"] and quorum.quorum_id == 1
        assert lh.alive()
    finally:
        lh.stop()
        os.close(filler)
        os.close(reader)
    assert not lh.alive() and not is_running(*identity), f"the server {server} outlived its guard"
