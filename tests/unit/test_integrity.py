"""Silent data corruption, the pure parts: the controller's vote, auto's interval, the rank's
fingerprints, gradient check and bit flips, the veto in the gradient collective, checkpoints
vouched for by the replicas' fingerprints, and the two fault kinds' options and damage."""

from __future__ import annotations

import json
import os
import random
import threading
from types import SimpleNamespace

import pytest
import torch
from torch.distributed import ReduceOp

from chaos.config import FaultConfig
from chaos.kinds import fault_kind
from chaos.kinds.ckpt_corrupt import damage_step
from monarch_ft.controller.checkpoints import CheckpointScrub, recover_checkpoint
from monarch_ft.controller.integrity import Agreed, Corrupt, Diverged, IntegrityJudge, Suspect, choose_interval
from monarch_ft.rank.components.checkpoint import seal_step
from monarch_ft.rank.components.ft import GradSync, Synced
from monarch_ft.rank.components.integrity import GradGuard, IntegrityInterval, fingerprint, flip_bit, named_tensors
from monarch_ft.records.errors import ConfigError
from monarch_ft.records.integrity import bit_to_flip, check_bit, differing_tensors, split_tensors
from monarch_ft.records.manifest import complete_steps, manifest_fingerprint, verify_step
from monarch_ft.testing.jobs import config_refusal

NAMES = ["model.a", "model.b", "optim.a.exp_avg"]


def _state(seed: int = 0) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {"model": {"a": torch.randn(4, 3, generator=g), "b": torch.randn(5, generator=g)}, "optim": {"a": {"exp_avg": torch.randn(4, 3, generator=g)}}}


def _record(group, step, fp, *, quorum=1, members=(0, 1, 2), committed=True, rank=0, attempt=0, vetoed_by=None):
    rec = {"group": group, "rank": rank, "attempt": attempt, "step": step - 1, "committed": committed}
    rec.update(quorum_id=quorum, participating_groups=list(members))
    rec["fingerprint"] = fp.record(step, vetoed=not committed)
    if vetoed_by:
        rec["vetoed_by"] = vetoed_by
    return rec


def test_fingerprints_tell_equal_state_and_name_the_tensor_that_differs():
    a, b = fingerprint(_state()), fingerprint(_state())
    assert a.names == NAMES and a.digest == b.digest and a.record(3)["tensors"] == b.record(3)["tensors"]
    flipped = _state()
    done = flip_bit(named_tensors(flipped), "optim.*", "mantissa", seed=1)
    c = fingerprint(flipped)
    assert c.digest != a.digest
    assert differing_tensors(a.record(3)["tensors"], c.record(3)["tensors"], a.names) == [done["tensor"]] == ["optim.a.exp_avg"]
    assert len(split_tensors(c.record(3)["tensors"])) == 3
    # Unknown names: by index; fields of other layouts: nothing claimed.
    assert differing_tensors(a.record(3)["tensors"], c.record(3)["tensors"], None) == ["#2"]
    assert differing_tensors(a.record(3)["tensors"], c.record(3)["tensors"][:8], NAMES) == []


def test_bit_flips_land_in_the_live_tensor_where_asked():
    state = {"model": {"w": torch.full((8,), 0.75), "n": torch.ones(4)}, "optim": {"step": torch.tensor(3, dtype=torch.int64)}}
    live = state["model"]["w"]
    done = flip_bit(named_tensors(state), "model.w", "mantissa", seed=0)
    # 0.75 = 1.5 x 2^-1; its top mantissa bit set: 1.0 x 2^-1 = 0.5, in the very tensor the model holds.
    assert done["tensor"] == "model.w" and done["bit"] == 22 and float(done["after"]) == 0.5 and live[done["index"]].item() == 0.5
    assert int((live != 0.75).sum()) == 1
    # The exponent's top bit of 1.0 (exponent 127) makes inf; of 0.75, 2^127 x 1.5.
    done = flip_bit(named_tensors(state), "model.n", "exponent", seed=0)
    assert done["bit"] == 30 and float(done["after"]) == float("inf")
    done = flip_bit(named_tensors(state), "model.w", "sign", seed=3)
    assert done["bit"] == 31 and float(done["after"]) == -float(done["before"])
    # Integer tensors are never drawn; a pattern nothing floating matches is refused.
    with pytest.raises(ValueError, match="no floating-point tensor"):
        flip_bit(named_tensors(state), "optim.step", "random", seed=0)
    assert bit_to_flip("exponent", "bfloat16", random.Random(0)) == 14 and bit_to_flip("mantissa", "float16", random.Random(0)) == 9
    assert bit_to_flip("17", "float32", random.Random(0)) == 17 and 0 <= bit_to_flip("random", "float64", random.Random(0)) < 64
    with pytest.raises(ValueError, match="it has 16 bits"):
        bit_to_flip("20", "bfloat16", random.Random(0))
    assert check_bit("exponent") is None and check_bit("63") is None and "mantissa" in check_bit("middle")


def test_the_vote_blames_the_minority_and_names_its_tensors():
    judge = IntegrityJudge(ranks_per_group=1)
    for r, names in enumerate([NAMES]):
        judge.tensor_names(r, names)
    good, bad_state = fingerprint(_state()), _state()
    flip_bit(named_tensors(bad_state), "model.b", "mantissa", seed=0)
    bad = fingerprint(bad_state)
    assert judge.observe(0, _record(0, 4, good)) == [] and judge.observe(1, _record(1, 4, good)) == []
    assert judge.observe(2, _record(2, 4, good)) == [Agreed(4, (0, 1, 2))]
    verdicts = judge.observe(0, _record(0, 8, good)) + judge.observe(1, _record(1, 8, bad)) + judge.observe(2, _record(2, 8, good))
    (v,) = verdicts
    assert isinstance(v, Corrupt) and v.blamed == {1: 0} and v.majority == (0, 2) and v.tensors == {1: ("model.b",)}
    assert v.step == 8 and v.record_step == 7 and v.trusted == {1: 4} and not v.vetoed
    # Its later reports no longer count (it is being failed); its replacement's do.
    assert judge.observe(1, _record(1, 12, bad)) == []
    assert judge.observe(0, _record(0, 12, good)) + judge.observe(2, _record(2, 12, good)) == [Agreed(12, (0, 2))]
    assert judge.observe(1, _record(1, 16, good, attempt=1)) == [] and judge.observe(0, _record(0, 16, good)) == []
    assert judge.observe(2, _record(2, 16, good)) == [Agreed(16, (0, 1, 2))]
    # Checkpoints of agreed steps are vouched for by the rounds; other state, or no round, is named / unknown.
    assert judge.vouch(16, {0: good.digest}) is None and judge.vouch(17, {0: bad.digest}) is None
    assert "not what the replicas agreed on at step 16" in judge.vouch(16, {0: bad.digest})


def test_two_groups_that_disagree_roll_back_to_the_step_they_last_agreed():
    judge = IntegrityJudge(ranks_per_group=2)
    good = fingerprint(_state())
    other_state = _state()
    flip_bit(named_tensors(other_state), "model.a", "exponent", seed=0)
    other = fingerprint(other_state)
    for step, fp1 in ((6, good), (9, other)):
        verdicts = []
        for g in (0, 1):
            for r in (0, 1):
                fp = fp1 if (g, r) == (1, 1) else good
                verdicts += judge.observe(g, _record(g, step, fp, rank=r, members=(0, 1)))
        assert len(verdicts) == 1
    v = verdicts[0]
    # The next round of the same attempts, reported before the controller rolled back: moot
    # (it rolled the job back twice, CI at 2ed5fc3).
    for g in (0, 1):
        for r in (0, 1):
            assert judge.observe(g, _record(g, 10, other if (g, r) == (1, 1) else good, rank=r, members=(0, 1))) == []
    assert isinstance(v, Diverged) and v.groups == (0, 1) and v.trusted_step == 6 and v.tensors == ("#0",)
    judge.rolled_back(6, {0: 0, 1: 0})
    assert judge.observe(0, _record(0, 7, good, members=(0, 1))) == [], "the rolled-back attempts no longer count"


def test_a_vetoed_step_is_compared_at_once_as_a_round_of_its_own():
    """The state after committed step 5 agreed; the exponent flip lands, the corrupt group's
    gradient vetoes step 5 and every group fingerprints the state it still holds: same step, its own round."""
    judge = IntegrityJudge(ranks_per_group=1, suspect_vetoes=3)
    good, bad_state = fingerprint(_state()), _state()
    flip_bit(named_tensors(bad_state), "model.a", "exponent", seed=0)
    bad = fingerprint(bad_state)
    assert judge.observe(0, _record(0, 5, good)) + judge.observe(1, _record(1, 5, good)) + judge.observe(2, _record(2, 5, good)) == [Agreed(5, (0, 1, 2))]
    veto = {"committed": False, "vetoed_by": [2]}
    verdicts = []
    for g, fp in ((0, good), (1, good), (2, bad)):
        verdicts += judge.observe(g, _record(g, 5, fp, **veto))
    (v,) = verdicts
    assert isinstance(v, Corrupt) and v.vetoed and v.blamed == {2: 0} and v.step == 5 and v.trusted == {2: 5}


def test_a_group_that_keeps_voting_steps_down_with_good_state_is_suspect():
    judge = IntegrityJudge(ranks_per_group=1, suspect_vetoes=3)
    plain = lambda g, committed, vetoed: {"group": g, "rank": 0, "attempt": 0, "step": 9, "committed": committed, **({"vetoed_by": [1]} if vetoed else {})}
    assert judge.observe(1, plain(1, False, True)) == [] and judge.observe(1, plain(1, True, False)) == []  # a commit ends the streak
    assert judge.observe(1, plain(1, False, True)) == [] and judge.observe(1, plain(1, False, True)) == []
    assert judge.observe(1, plain(1, False, True)) == [Suspect(1, 0, 9, 3)]
    assert judge.observe(0, plain(0, False, True)) == [], "another group's records show its veto; only its own count"


def test_auto_interval_is_the_smallest_power_of_two_within_the_budget():
    assert choose_interval([0.004, 0.005, 0.006], 0.01)[0] == 1
    every, why = choose_interval([0.021, 0.022, 0.02], 0.01)
    assert every == 4 and "2.10% of a step" in why and "every 4: 0.53%" in why
    judge = IntegrityJudge(ranks_per_group=1, auto=True, budget=0.01)
    fp = fingerprint(_state())
    for step in range(1, 40):
        rec = _record(0, step, fp, members=(0,))
        rec.update(fingerprint_s=0.003, step_time_s=0.1)
        judge.observe(0, rec)
    decided = judge.interval()
    assert decided is not None and decided[0] == 4 and judge.interval() is None, "decided once"


def test_the_rank_reads_auto_s_choice_and_due_steps_follow_it(tmp_path):
    path = tmp_path / "integrity_every"
    auto = IntegrityInterval(None, str(path))
    assert all(auto.due(s) for s in range(1, 5)), "every step until decided"
    path.write_text("4")
    for _ in range(IntegrityInterval.POLL_EVERY):
        auto.every()
    assert [s for s in range(1, 13) if auto.due(s)] == [4, 8, 12]
    assert not IntegrityInterval(0, str(path)).due(4) and IntegrityInterval(2, str(path)).due(6)


def test_grad_guard_votes_against_outliers_and_non_finite_norms_only():
    guard = GradGuard(factor=10.0, history=50)
    assert guard.judge(float("nan"))["reason"] == "non-finite" and guard.judge(float("inf")) is not None
    assert guard.judge(1e9) is None, "no norm judged before 10 commits are known"
    for n in [1.0, 1.2, 0.9, 1.1, 1.3, 0.8, 1.0, 5.0, 1.0, 1.1]:
        guard.accept(n)
    assert guard.judge(9.0) is None and guard.judge(30.0)["reason"] == "outlier"
    guard.accept(float("nan"))
    assert len(guard.norms) == 10, "a non-finite norm never becomes the norm"


class _Allreduce:
    """torchft's allreduce over the participating groups (SUM, or its default AVG), one thread per
    group (as in test_components)."""

    def __init__(self, groups: int) -> None:
        self.barrier, self.buffers, self.groups = threading.Barrier(groups), {}, groups

    def manager(self, group: int):
        fake = self

        class Manager:
            def allreduce(self, tensor, reduce_op=ReduceOp.AVG):
                fake.buffers[group] = tensor.clone()
                fake.barrier.wait()
                total = sum(fake.buffers.values())
                tensor.copy_(total if reduce_op == ReduceOp.SUM else total / fake.groups)
                fake.barrier.wait()
                return SimpleNamespace(wait=lambda: True)

        return Manager()


def test_a_vetoing_group_sends_no_gradient_and_every_group_learns_of_the_veto():
    params = [[torch.nn.Parameter(torch.zeros(6))] for _ in range(3)]
    for g, ps in enumerate(params):
        ps[0].grad = torch.full((6,), float("nan") if g == 1 else float(g + 1))
    fake, out = _Allreduce(3), {}

    def run(g):
        out[g] = GradSync(params[g], num_groups=3, group=g).sync(fake.manager(g), veto=g == 1)

    threads = [threading.Thread(target=run, args=(g,)) for g in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    # Every group names the veto; the vetoing group counts no micro-batch (the step is discarded anyway).
    assert out == dict.fromkeys(range(3), Synced([0, 1, 2], [1], 2))
    for ps in params:
        assert torch.isfinite(ps[0].grad).all() and torch.allclose(ps[0].grad, torch.full((6,), 2.0)), "the NaN never left group 1"


def _sealed(folder, step, digest):
    d = folder / f"step-{step}"
    d.mkdir(parents=True)
    (d / "__0_0.distcp").write_bytes(os.urandom(20000))
    (d / ".metadata").write_bytes(b"dcp metadata")
    seal_step(str(d), step, SimpleNamespace(storage_data={0: SimpleNamespace(relative_path="__0_0.distcp")}), fingerprint=digest)
    return d


def test_a_checkpoint_is_vouched_for_by_the_state_the_replicas_agreed_on(tmp_path):
    judge = IntegrityJudge(ranks_per_group=1)
    good, bad = fingerprint(_state(0)), fingerprint(_state(1))
    for g in (0, 1, 2):
        judge.observe(g, _record(g, 10, good))
    folders = [tmp_path / "group_0", tmp_path / "group_1"]
    _sealed(folders[0], 5, good.digest)
    _sealed(folders[0], 10, bad.digest)  # saved by a corrupt replica: its bytes match its manifest
    _sealed(folders[1], 5, good.digest)
    assert manifest_fingerprint(str(folders[0] / "step-10")) == {0: bad.digest} and verify_step(str(folders[0] / "step-10")) is None
    rec = recover_checkpoint([str(f) for f in folders], at_most=10, vouch=judge.vouch)
    assert rec.step == 5 and [q["step"] for q in rec.quarantined] == [10], rec
    assert "not what the replicas agreed on at step 10" in rec.quarantined[0]["problem"]
    assert complete_steps(str(folders[0])) == {5}


def test_ckpt_corrupt_damages_a_shard_as_the_manifest_and_the_scrub_see_it(tmp_path):
    folder = tmp_path / "group_0"
    rewritten, truncated = _sealed(folder, 5, None), _sealed(folder, 10, None)
    shard = rewritten / "__0_0.distcp"
    before = os.stat(shard)
    done = damage_step(str(rewritten), "rewrite", random.Random(0))
    after = os.stat(shard)
    assert done["bytes"] == 4096 and (after.st_size, after.st_mtime_ns) == (before.st_size, before.st_mtime_ns), "silent: size and time kept"
    assert "does not match its checksum" in verify_step(str(rewritten))
    damage_step(str(truncated), "truncate", random.Random(0))
    assert "its manifest says" in verify_step(str(truncated))
    scrub = CheckpointScrub(0.0, lambda: [str(folder)])
    scrub.RECHECK_S = 0.0
    found = scrub.scrub_once()
    assert found["steps"] == 2 and sorted(d["step"] for d in found["damaged"]) == [5, 10]


def test_the_kinds_options_and_what_a_drill_needs_for_them(tmp_path):
    flip = FaultConfig(kind="bitflip", at_step=5, bit="exponent", tensor="optim.*.exp_avg")
    assert fault_kind("bitflip").mode(flip) == "exponent" and fault_kind("bitflip").mode_option == "bit"
    with pytest.raises(ConfigError, match=r"^fault.bit='middle': choose mantissa, exponent, sign, random or a bit number"):
        FaultConfig(kind="bitflip", at_step=5, bit="middle")
    with pytest.raises(ConfigError, match=r"^fault.tensor='weights': names start with model. or optim."):
        FaultConfig(kind="bitflip", at_step=5, tensor="weights")
    with pytest.raises(ConfigError, match="truncate or rewrite"):
        FaultConfig(kind="ckpt_corrupt", at_step=5, mode="shred")
    base = "ft.replica_groups=3 training.steps=100 checkpoint.interval=10"
    assert "set ft.integrity_every=auto" in _drill_refusal(tmp_path, base + " ft.integrity_every=0", "{kind: bitflip, at_step: 20}")
    assert "needs ft.mode=hsdp" in _drill_refusal(tmp_path, base + " ft.mode=localsgd ft.sync_every=10", "{kind: bitflip, at_step: 20}")
    assert "set checkpoint.scrub_every_s" in _drill_refusal(tmp_path, base + " checkpoint.scrub_every_s=0", "{kind: ckpt_corrupt, at_step: 20}")
    assert "no checkpoint exists before step" in _drill_refusal(tmp_path, base + " checkpoint.scrub_every_s=5", "{kind: ckpt_corrupt, at_step: 5}")
    assert "ft.integrity_every='often'" in config_refusal(tmp_path, "ft.integrity_every=often")


def _drill_refusal(tmp_path, overrides: str, fault: str) -> str:
    from hydra import compose, initialize_config_dir

    from chaos.config import register_drill_configs, validate_chaos
    from chaos.schedule import build_faults
    from monarch_ft.cli.run import CONFIG_DIR
    from omegaconf import OmegaConf

    register_drill_configs()
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3", job_name="refusal"):
        cfg = OmegaConf.to_object(compose(config_name="drill", overrides=[*overrides.split(), f"chaos.faults=[{fault}]"]))
    with pytest.raises(ConfigError) as e:
        validate_chaos(cfg, build_faults(cfg.chaos))
    return str(e.value)


def test_events_name_the_new_kinds():
    from monarch_ft.records.events import EventKind

    assert {"sdc_detected", "grad_outlier", "bitflip_injected", "integrity_interval", "checkpoint_scrubbed"} <= {e.value for e in EventKind}
    assert json.dumps(fingerprint(_state()).record(3))
