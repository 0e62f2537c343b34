"""A full-job restart resumes every group from one step (real files, no training)."""

from monarch_ft.components.checkpoint import align_latest_checkpoint, complete_steps


def _save(folder, step, complete=True, payload=b"weights"):
    d = folder / f"step-{step}"
    d.mkdir(parents=True)
    (d / "__0_0.distcp").write_bytes(payload)
    if complete:
        (d / ".metadata").write_bytes(b"meta")


def test_newest_complete_step_is_copied_where_missing(tmp_path):
    a, b, c = tmp_path / "group_0", tmp_path / "group_1", tmp_path / "group_2"
    _save(a, 10), _save(a, 15, payload=b"fifteen")
    _save(b, 10), _save(b, 15, complete=False, payload=b"torn")  # killed mid-save
    # c: its node lost its files; the folder is gone.
    assert align_latest_checkpoint([str(a), str(b), str(c)]) == 15
    for folder in (a, b, c):
        assert max(complete_steps(str(folder))) == 15
        assert (folder / "step-15" / "__0_0.distcp").read_bytes() == b"fifteen"
    assert not any(p.name.startswith(".incoming") for p in b.iterdir())


def test_no_checkpoint_anywhere(tmp_path):
    _save(tmp_path / "group_0", 5, complete=False)
    assert align_latest_checkpoint([str(tmp_path / "group_0"), str(tmp_path / "group_1")]) is None
