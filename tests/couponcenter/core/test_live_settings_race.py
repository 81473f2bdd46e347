"""The live-settings reader shared by a process's threads: a reader whose marker read began
before another thread stored a newer row must not store its older row under the newer marker
(it did, and every reader then kept the older row until the next change). Real database; the
two reads are interleaved with Django's execute wrapper, not with sleeps."""

from __future__ import annotations

import threading

import pytest
from django.db import connection

from couponcenter.core.live_settings import LiveSettingsReader
from reminders.models import ReminderSettings
from tests.support.settings_rows import reminder_settings_row

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_slow_reader_does_not_put_an_older_row_back_under_a_newer_marker():
    row = reminder_settings_row()
    row.change(push_cap_per_day=3)
    reader = LiveSettingsReader(ReminderSettings, max_age_s=60)
    assert reader.get(max_age_s=0).push_cap_per_day == 3
    row.change(push_cap_per_day=7)  # committed: a new marker

    marker_read, resume = threading.Event(), threading.Event()

    def pause_after_the_marker(execute, sql, params, many, context):
        result = execute(sql, params, many, context)
        if sql == reader._marker_sql:
            marker_read.set()
            assert resume.wait(30)
        return result

    def slow_reader():
        try:
            with connection.execute_wrapper(pause_after_the_marker):
                reader.get(max_age_s=0)
        finally:
            connection.close()

    slow = threading.Thread(target=slow_reader)
    slow.start()
    assert marker_read.wait(30)  # it holds the older row and has read the newer marker
    assert reader.get(max_age_s=0).push_cap_per_day == 7  # another thread loads the new row
    resume.set()
    slow.join(30)
    assert not slow.is_alive()
    assert reader.get(max_age_s=60).push_cap_per_day == 7
