"""The run directory's paths (monarch_ft.records.layout): each spelt once, control files written whole."""

from __future__ import annotations

import json
import os

import pytest

from monarch_ft.records.layout import RunLayout, atomic_write, read_json


# ---------------------------------------------------------------- the run directory
def test_run_layout_spells_each_path_once(tmp_path):
    layout = RunLayout(str(tmp_path), "ckpt")
    assert layout.report(1, 0, 3).endswith("ranks/g1r0.a3.jsonl")
    assert layout.checkpoint(2) == os.path.join(str(tmp_path), "ckpt", "group_2")
    assert layout.start_gate(0).endswith("control/start") and layout.start_gate(2).endswith("control/start.2")
    assert layout.launch_gate(1, 4).endswith("control/launch.g1.a4")
    os.makedirs(layout.control_dir)
    atomic_write(layout.launch_gate(1, 4), json.dumps({"source": "disk", "step": 20}))
    assert read_json(layout.launch_gate(1, 4)) == {"source": "disk", "step": 20}
    open(layout.start_gate(0), "w").close()
    assert read_json(layout.start_gate(0), {}) == {} and read_json(layout.hold) is None
    assert not [p for p in os.listdir(layout.control_dir) if ".tmp" in p]


def test_a_refused_atomic_write_names_the_file_meant_and_leaves_no_temporary(tmp_path, monkeypatch):
    import errno as errno_

    from monarch_ft.records.layout import atomic_write

    real_replace = os.replace

    def full(src, dst):
        raise OSError(errno_.ENOSPC, "No space left on device", src)

    monkeypatch.setattr(os, "replace", full)
    target = tmp_path / "commit_floor"
    with pytest.raises(OSError) as raised:
        atomic_write(str(target), "12")
    monkeypatch.setattr(os, "replace", real_replace)
    assert raised.value.errno == errno_.ENOSPC and raised.value.filename == str(target)
    assert list(tmp_path.iterdir()) == []
