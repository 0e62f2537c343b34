"""A full-job restart resumes every group from one step (real files, no training)."""

from types import SimpleNamespace

from monarch_ft.controller.checkpoints import recover_checkpoint
from monarch_ft.rank.components.checkpoint import seal_step
from monarch_ft.records.manifest import complete_steps


def _save(folder, step, complete=True, payload=b"weights"):
    """A step as a save leaves it: its shard and .metadata; sealed by its manifest if it finished."""
    d = folder / f"step-{step}"
    d.mkdir(parents=True)
    (d / "__0_0.distcp").write_bytes(payload)
    (d / ".metadata").write_bytes(b"meta")
    if complete:
        seal_step(str(d), step, SimpleNamespace(storage_data={0: SimpleNamespace(relative_path="__0_0.distcp")}))


def test_newest_complete_step_is_copied_where_missing(tmp_path):
    a, b, c = tmp_path / "group_0", tmp_path / "group_1", tmp_path / "group_2"
    _save(a, 10), _save(a, 15, payload=b"fifteen")
    _save(b, 10), _save(b, 15, complete=False, payload=b"torn")  # killed mid-save: no manifest
    # c: its node lost its files; the folder is gone.
    rec = recover_checkpoint([str(a), str(b), str(c)])
    assert rec.step == 15 and not rec.quarantined and not rec.copy_failures
    for folder in (a, b, c):
        assert max(complete_steps(str(folder))) == 15
        assert (folder / "step-15" / "__0_0.distcp").read_bytes() == b"fifteen"
        assert rec.paths[str(folder)] == str(folder / "step-15")
    assert not any(p.name.startswith(".incoming") for p in b.iterdir())


def test_no_checkpoint_anywhere(tmp_path):
    _save(tmp_path / "group_0", 5, complete=False)
    assert recover_checkpoint([str(tmp_path / "group_0"), str(tmp_path / "group_1")]).step is None
