"""A sweeper process of ``bench_days``'s night, spawned (not forked): it imports nothing of
Django's models before ``django.setup()``, as a spawned child must."""

from __future__ import annotations

import os
from datetime import datetime


def sweep(parent: int, now: datetime, ready, start, results) -> None:
    """Ready, then at the start signal the sweeper's code path over what is due at ``now``.
    ``parent``: the run's process id, passed in because the run may be dead before this child
    could read it."""
    from couponcenter.core.process import die_with_parent

    die_with_parent()  # a run killed outright (SIGKILL) takes its sweepers with it
    if os.getppid() != parent:
        return  # it died before the line above
    import django

    django.setup()
    from django.db import connection

    from expiry.services import expiry_settings_get, expiry_sweep_due, next_due_at

    # Warm, as the sweeper's own process is when a pass begins: its connection open and the
    # reads of its loop (``expiry.sweeper``) done, so the round times the pass, not a new
    # server backend loading the partitioned tables' catalog.
    expiry_settings_get()
    next_due_at()
    ready.put(1)
    while not start.wait(1):
        if os.getppid() != parent:
            return  # the run was killed before the night began: nothing to sweep for
    totals = expiry_sweep_due(now=now)
    results.put(totals.expired)
    connection.close()
