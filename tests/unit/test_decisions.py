"""Where a (re)joining group's state comes from (monarch_ft.records.decisions): a live peer, the
newest checkpoint, its initial weights only while nothing was committed, else the job stops."""

from __future__ import annotations

import pytest

from monarch_ft.records.decisions import JobStateLost, StateSource, decide_state_source


# ---------------------------------------------------------------- where a group's state comes from
def test_a_live_peer_heals_the_group():
    assert decide_state_source([1], job_step=2510, checkpoint_step=2500).source is StateSource.PEER


def test_no_live_peer_loads_the_newest_checkpoint_and_counts_what_is_lost():
    d = decide_state_source([], job_step=2510, checkpoint_step=2500)
    assert (d.source, d.step, d.steps_lost) == (StateSource.DISK, 2500, 10)


def test_initial_weights_only_while_nothing_was_committed():
    assert decide_state_source([], job_step=0, checkpoint_step=None).source is StateSource.INIT


def test_no_peer_and_no_checkpoint_stops_the_job_instead_of_starting_over():
    with pytest.raises(JobStateLost, match="checkpoint.enable=true"):
        decide_state_source([], job_step=200, checkpoint_step=None)


def test_a_checkpoint_ahead_of_the_job_is_not_its_state():
    with pytest.raises(ValueError, match="not this job's"):
        decide_state_source([], job_step=20, checkpoint_step=50)
