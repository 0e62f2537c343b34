"""A step's quorum members as records write them (records.members): a list up to 64 groups, a
range string past that, and one reader for both."""

from __future__ import annotations

import json

from monarch_ft.records.members import LIST_UP_TO, members_field, members_of


def test_a_small_quorum_is_the_plain_sorted_list():
    assert members_field([1, 0]) == [0, 1]
    assert members_field(range(LIST_UP_TO)) == list(range(LIST_UP_TO))
    assert members_of({"participating_groups": [0, 1]}) == (0, 1)
    assert members_of({}) == () and members_of({"participating_groups": None}) == ()


def test_a_large_quorum_is_ranges_and_reads_back_the_same():
    everyone = list(range(1024))
    assert members_field(everyone) == "0-1023"
    holes = [g for g in everyone if g not in (0, 512, 700, 701, 1023)]
    text = members_field(reversed(holes))
    assert text == "1-511,513-699,702-1022"
    assert members_of({"participating_groups": text}) == tuple(holes)
    single = [g for g in range(200) if g % 2 == 0]
    assert members_of({"participating_groups": members_field(single)}) == tuple(single)
    # The record stays small: a few bytes where the list was about 5 KB.
    assert len(json.dumps({"participating_groups": members_field(everyone)})) < 40
    assert len(json.dumps({"participating_groups": everyone})) > 5000
    # Every group's record of a step names the same tuple object (the controller compares them).
    assert members_of({"participating_groups": "0-1023"}) is members_of({"participating_groups": "0-1023"})
