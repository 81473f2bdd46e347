"""Run only by ``tests/test_ci_strict.py`` (the name keeps it out of normal collection)."""

import pytest


def test_that_skips():
    pytest.skip("a missing browser, say")


def test_that_passes():
    assert 1 + 1 == 2
