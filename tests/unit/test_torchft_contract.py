"""torchft's private surface, checked against the installed (pinned) torchft in seconds.

Every private name monarch_ft.rank.components.torchft_compat touches (its PRIVATE_SURFACE) must
be there with the expected parameters or type. A torchft upgrade that moves one fails here,
naming it. The adapter's functions then run once against a real Manager: an in-process
Lighthouse, a TCPStore, gloo, one replica, LocalSGD and DiLoCo on a tiny model. This also
covers what the adapter does not touch but relies on: the Manager's ``quorum_retries``,
``ProcessGroup.configure``'s positional ``quorum_id``, the names MonarchManager adds not
shadowing torchft's, and the Lighthouse's console-script target the controller starts.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import inspect
from datetime import timedelta

import pytest
import torch

from monarch_ft.config.ft import FTConfig
from monarch_ft.rank.components import torchft_compat as compat
from monarch_ft.rank.components.ft import CrossGroup, MonarchManager, RecordingTransport, _recording, build_manager
from monarch_ft.rank.components.lighthouse_epoch import EPOCH_STRIDE

# torchft's own logger calls the deprecated Logger.warn (no flight recorder on CPU).
pytestmark = pytest.mark.filterwarnings("ignore:The 'warn' method is deprecated:DeprecationWarning")


def _resolve(dotted: str):
    module, _, name = dotted.rpartition(".")
    return getattr(importlib.import_module(module), name)


def test_the_pinned_torchft_is_installed():
    assert importlib.metadata.version("torchft") == "0.2.0", "monarch_ft pins torchft==0.2.0 (pyproject.toml); re-run this file against a new one"


@pytest.fixture(scope="module")
def torchft_job(tmp_path_factory):
    """One real replica: a Lighthouse (torchft.coordination, in process), a TCPStore, a
    MonarchManager built by build_manager (Lighthouse epoch 7), LocalSGD and DiLoCo over it."""
    from torch.distributed import TCPStore
    from torchft.checkpointing.http_transport import HTTPTransport
    from torchft.coordination import LighthouseServer
    from torchft.local_sgd import DiLoCo, LocalSGD
    from torchft.manager import Manager
    from torchft.process_group import ProcessGroupGloo

    lighthouse = LighthouseServer(bind="[::]:0", min_replicas=1, join_timeout_ms=100)
    store = TCPStore("localhost", 0, is_master=True, wait_for_workers=False)
    epoch = tmp_path_factory.mktemp("control") / "lighthouse_epoch"
    epoch.write_text("7")
    timeout = timedelta(seconds=10)
    cross = CrossGroup(_recording(ProcessGroupGloo)(timeout=timeout), RecordingTransport(HTTPTransport(timeout, num_chunks=0), lambda *a, **k: None))
    model = torch.nn.Linear(4, 4)
    parts = build_manager(
        FTConfig(timeout_s=10, quorum_timeout_s=10, connect_timeout_s=10),
        cross,
        group=0,
        rank=0,
        world_size=1,
        store_addr="localhost",
        store_port=store.port,
        lighthouse_addr=lighthouse.address(),
        hostname="localhost",
        state_dict=lambda: {"model": model.state_dict()},
        load_state_dict=lambda sd: model.load_state_dict(sd["model"]),
        use_async_quorum=False,  # DiLoCo's requirement
        lighthouse_epoch_path=str(epoch),
    )
    manager = parts.manager
    localsgd = LocalSGD(manager, model, torch.optim.SGD(model.parameters(), lr=0.1), sync_every=2)
    diloco_model = torch.nn.Linear(4, 4)
    diloco = DiLoCo(
        manager,
        [diloco_model],
        torch.optim.SGD(diloco_model.parameters(), lr=0.1),
        [torch.optim.SGD(diloco_model.parameters(), lr=1.0)],
        sync_every=2,
    )
    # A plain torchft Manager beside it (rank 1 of the same group: no server of its own), for
    # the names its __init__ sets.
    plain = Manager(ProcessGroupGloo(timeout=timeout), None, None, min_replica_size=1, rank=1, world_size=2, store_addr="localhost", store_port=store.port)
    # A configured process group of one rank, for the backend it holds.
    lone_pg = ProcessGroupGloo(timeout=timeout)
    lone_pg.configure(f"localhost:{store.port}/contract_lone_pg", "lone", 0, 1)
    instances = {
        "torchft.process_group.ProcessGroupWrapper": lone_pg,
        "torchft.manager.Manager": plain,  # the Manager as torchft builds it (build_manager wraps _client)
        "torchft.local_sgd.LocalSGD": localsgd,
        "torchft.local_sgd.DiLoCo": diloco,
        "torchft.local_sgd._StreamingDiLoCoFragment": diloco._fragments[0],
    }
    try:
        yield {"parts": parts, "model": model, "diloco_model": diloco_model, "instances": instances, "plain": plain}
    finally:
        plain.shutdown(wait=True)
        manager.shutdown(wait=True)
        lighthouse.shutdown()


@pytest.mark.parametrize("private", compat.PRIVATE_SURFACE, ids=lambda p: f"{p.owner}.{p.name}")
def test_private_name_is_there_as_expected(private, torchft_job):
    owner = _resolve(private.owner)
    if private.params is not None:
        method = getattr(owner, private.name, None)
        assert callable(method), f"torchft {private.owner}.{private.name} is gone: update monarch_ft/rank/components/torchft_compat.py"
        params = tuple(inspect.signature(method).parameters)
        assert params == private.params, f"torchft {private.owner}.{private.name}{params}: expected {private.params} (torchft_compat.py)"
    else:
        instance = torchft_job["instances"][private.owner]
        assert hasattr(instance, private.name), f"torchft {private.owner} instances have no {private.name}: update torchft_compat.py"
        found = type(getattr(instance, private.name)).__name__
        assert found == private.attr_type, f"torchft {private.owner}.{private.name} is a {found}, expected {private.attr_type} (torchft_compat.py)"


def test_what_the_adapter_relies_on_publicly(torchft_job):
    from torchft.manager import Manager
    from torchft.process_group import ProcessGroupGloo, ProcessGroupNCCL

    assert "quorum_retries" in inspect.signature(Manager.__init__).parameters, "lighthouse_epoch.quorum_retries needs Manager(quorum_retries=...)"
    for pg in (ProcessGroupGloo, ProcessGroupNCCL):
        # The Manager calls configure positionally; ft._recording reads the fifth argument as the quorum id.
        assert tuple(inspect.signature(pg.configure).parameters)[:6] == ("self", "store_addr", "replica_id", "rank", "world_size", "quorum_id"), pg
    # MonarchManager's own names must not shadow (or be overwritten by) torchft's.
    overrides = {"start_quorum", "wait_quorum", "should_commit", "load_state_dict", "is_participating", "num_participants", "allreduce"}
    ours = {name for name in vars(MonarchManager) if not name.startswith("__")} - overrides
    # and the names set in MonarchManager.__init__
    ours |= {"before_quorum", "before_commit", "heals", "seconds", "_timing_depth", "closed_after_failure", "close_failed_step", "_cross_pg"}
    ours |= {"quorum", "count_healing", "sync_trace", "vote_timeout"}
    theirs = set(dir(Manager)) | set(vars(torchft_job["plain"]))
    assert not ours & theirs, f"torchft's Manager now has {sorted(ours & theirs)}, which MonarchManager (components/ft.py) uses for its own"


def test_a_rank_waits_for_its_groups_vote_longer_than_a_peer_can_spend_in_the_collective(torchft_job, monkeypatch):
    """should_commit waits FTConfig.vote_timeout_s (2 x ft.timeout_s) for the group's other ranks:
    a peer's collective is bounded by ft.timeout_s from when it started it, and it may start later.
    The controller's sync budget covers the quorum, the collective and that wait."""
    manager = torchft_job["parts"].manager
    cfg = FTConfig(timeout_s=10, quorum_timeout_s=10, connect_timeout_s=10)
    assert manager.vote_timeout == timedelta(seconds=cfg.vote_timeout_s) == timedelta(seconds=20)
    assert cfg.sync_budget_s == cfg.quorum_timeout_s + cfg.timeout_s + cfg.vote_timeout_s
    asked = []
    monkeypatch.setattr("torchft.manager.Manager.should_commit", lambda self, timeout=None: asked.append(timeout) or True)
    assert manager.should_commit() and asked == [timedelta(seconds=20)]
    assert manager.should_commit(timedelta(seconds=3)) and asked[-1] == timedelta(seconds=3)  # a caller's own stands


def test_the_lighthouse_console_script_is_the_extension_the_controller_starts():
    from monarch_ft.controller.lighthouse import lighthouse_argv

    (script,) = [e for e in importlib.metadata.entry_points(group="console_scripts") if e.name == "torchft_lighthouse"]
    assert script.value == "torchft._torchft:lighthouse_main", script.value
    assert callable(_resolve("torchft._torchft.lighthouse_main"))
    argv, env = lighthouse_argv()
    assert argv[-1].endswith("_lighthouse_server.py") and env["MONARCH_FT_TORCHFT_SO"].endswith(".so"), (argv, env)


def test_adapter_against_a_real_manager(torchft_job):
    parts, model, diloco_model = torchft_job["parts"], torchft_job["model"], torchft_job["diloco_model"]
    manager, localsgd, diloco = parts.manager, torchft_job["instances"]["torchft.local_sgd.LocalSGD"], torchft_job["instances"]["torchft.local_sgd.DiLoCo"]
    # offset_quorum_ids: the Lighthouse's first quorum (1) in epoch 7's range, as the process group was configured.
    manager.start_quorum()
    assert parts.quorum_id == 7 * EPOCH_STRIDE + 1, parts.quorum_id
    # watch_quorums: the quorum as the Manager received it (offset id, its one group, at the newest step).
    assert manager.quorum == compat.QuorumView(quorum_id=parts.quorum_id, groups=(0,), max_world_size=1, at_max_step=True, max_step=0)
    assert manager.quorum.all_current and manager.num_participants() == 1 and manager.is_participating()

    # LocalSGD: torchft's counter, then its sync in the quorum already held (the join).
    localsgd._local_step = 1
    assert compat.local_step(localsgd) == 1
    before = [p.detach().clone() for p in model.parameters()]
    compat.localsgd_sync_in_quorum(localsgd)
    assert manager.current_step() == 1 and compat.local_step(localsgd) == 0
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters())), "one replica: its own average"

    # DiLoCo: the global copy follows a load; the sync applies the outer step and commits.
    with torch.no_grad():
        diloco_model.weight.fill_(1.0)
    compat.diloco_save_global(diloco)
    (copy,) = compat.diloco_global_copies(diloco)
    assert set(copy) == {"weight", "bias"} and bool((copy["weight"] == 1.0).all())
    with torch.no_grad():
        diloco_model.weight.fill_(3.0)  # the inner steps' result; the pseudo-gradient is -2
    manager.start_quorum()
    diloco._local_step = 2
    compat.diloco_sync_in_quorum(diloco)
    assert manager.current_step() == 2 and compat.local_step(diloco) == 0
    (copy,) = compat.diloco_global_copies(diloco)
    assert bool((copy["weight"] == 3.0).all()) and bool((diloco_model.weight == 3.0).all()), copy["weight"]


def test_a_quorum_that_trains_nothing_commits_no_step_and_a_sync_trace_sums_the_average(torchft_job):
    """MonarchManager.commit_nothing: the vote runs (and succeeds in a healthy quorum), the step
    stays. sync_trace: the sums sent into an average and got out of it (one replica: equal)."""
    from monarch_ft.rank.components.ft import SyncTrace

    manager = torchft_job["parts"].manager
    manager.start_quorum()
    step, batches = manager.current_step(), manager.batches_committed()
    assert manager.commit_nothing() is True
    assert manager.current_step() == step and manager.batches_committed() == batches
    manager.start_quorum()
    manager.sync_trace = SyncTrace()
    try:
        t = torch.arange(4, dtype=torch.float32)
        manager.allreduce(t).wait()
        assert manager.sync_trace.take() == (6.0, 6.0) and manager.sync_trace.take() is None
    finally:
        manager.sync_trace = None
    assert manager.should_commit() is True and manager.current_step() == step + 1


def test_a_failed_step_closes_the_process_group_and_the_next_quorum_opens_a_new_one(torchft_job):
    """MonarchManager.should_commit closes the cross-group process group of a step that failed
    (ft.close_failed_process_group); what makes that safe is TorchFT's: the step is not
    committed, and the commit failure makes the Lighthouse bump the quorum id, so the next
    quorum configures a new group even though its members are the same."""
    parts = torchft_job["parts"]
    manager, pg = parts.manager, parts.cross.process_group
    manager.close_failed_step = True  # ft.close_failed_collective=true
    manager.start_quorum()
    assert compat.process_group_open(pg)
    step, quorum, closed = manager.current_step(), parts.quorum_id, manager.closed_after_failure
    manager.allreduce(torch.ones(3)).wait()
    manager.report_error(RuntimeError("a peer's collective failed"))
    assert manager.should_commit() is False and manager.current_step() == step
    assert not compat.process_group_open(pg) and manager.closed_after_failure == closed + 1

    manager.start_quorum()
    assert parts.quorum_id > quorum, (parts.quorum_id, quorum)
    assert compat.process_group_open(pg)
    t = torch.full((3,), 2.0)
    manager.allreduce(t).wait()
    assert manager.should_commit() is True and manager.current_step() == step + 1
    assert torch.equal(t, torch.full((3,), 2.0)) and manager.closed_after_failure == closed + 1
