"""A reminder's member: the subscription id, six characters for ids under 2.18 billion, and the
members of earlier releases still understood."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from reminders.members import legacy_member, member, sub_id_of, try_sub_id_of


@given(st.integers(min_value=0, max_value=2**63 - 1))
def test_a_member_gives_back_its_subscription_id(sub_id):
    text = member(sub_id)
    assert sub_id_of(text) == sub_id
    assert text == text.lower() and (text == "0" or not text.startswith("0"))


def test_members_are_the_ids_in_base_36():
    assert [member(n) for n in (0, 9, 10, 35, 36, 1295, 1296, 700_000_000)] == [
        "0", "9", "a", "z", "10", "zz", "100", "bkrfgg",
    ]  # fmt: skip
    assert member(10_000_000) == "5yc1s"
    # Up to six characters (Redis's 8-byte allocation) for every id under 36 ** 6.
    assert len(member(36**6 - 1)) == 6 and len(member(36**6)) == 7


def test_members_of_earlier_releases_still_parse():
    assert sub_id_of(legacy_member(700_000_000, 9_100_000_000, 42)) == 700_000_000
    assert sub_id_of("12:7:3") == 12


@pytest.mark.parametrize("value", ["", "12:7", "12:x:3", "a:1:2", "-5", "1.5", "ab cd", "é1"])
def test_anything_else_is_refused(value):
    with pytest.raises(ValueError):
        sub_id_of(value)
    assert try_sub_id_of(value) is None


def test_a_negative_id_has_no_member():
    with pytest.raises(ValueError):
        member(-1)
