"""Django's PostgreSQL backend, with a cheaper per-request health check.

With ``CONN_HEALTH_CHECKS`` Django sends ``SELECT 1`` before the first query of every request on
a persistent connection: a round trip and a statement per claim, about 10 % of its cost. Here a
connection that ran a query less than ``DB_HEALTH_CHECK_IDLE_S`` ago is taken as healthy; one
idle longer is checked as Django does. A connection that broke in between fails the request that
uses it, like one that breaks during a request: that marks it (``errors_occurred``) and Django
closes it when the request ends, so the next request reconnects. So after a database outage each
busy connection costs at most one failed request, and an idle one none.
"""

from __future__ import annotations

import time

from django.conf import settings
from django.db.backends.postgresql import base


class DatabaseWrapper(base.DatabaseWrapper):
    _used_at = -1e9

    def close_if_health_check_failed(self) -> None:
        if (
            self.connection is not None
            and not self.health_check_done
            and not self.errors_occurred
            and time.monotonic() - self._used_at < settings.DB_HEALTH_CHECK_IDLE_S
        ):
            self.health_check_done = True
        super().close_if_health_check_failed()
        self._used_at = time.monotonic()

    def get_new_connection(self, conn_params):
        # Statements prepared on the server (couponcenter.core.db.prepared) die with its session.
        self.prepared_statements: set[str] = set()
        return super().get_new_connection(conn_params)
