"""Alerts to a chat webhook: a failure is logged with the target's scheme and host only (a chat
webhook's path is its secret), and a redirect is a failure, never followed."""

from __future__ import annotations

import json
import logging

import pytest

from reminders.alerts import raise_alert
from tests.couponcenter.core.test_webhooks import Server


@pytest.fixture
def servers():
    made: list[Server] = []
    yield made
    for server in made:
        server.httpd.shutdown()


@pytest.mark.parametrize("status", [500, 307])
def test_a_failing_alert_webhook_is_logged_without_its_secret(settings, servers, caplog, status):
    elsewhere = Server()
    hook = Server(status, redirect_to=f"{elsewhere.origin}/steal")
    servers += [elsewhere, hook]
    settings.ALERT_WEBHOOK_URL = f"{hook.origin}/hooks/T000/B000/SECRETPATH"
    with caplog.at_level(logging.ERROR, logger="reminders.alerts"):
        raise_alert(title="3 reminders dead", details={"topic": "coupon.reminder"})
    failures = [r for r in caplog.records if "alert webhook failed" in r.getMessage()]
    assert len(failures) == 1 and hook.origin in failures[0].getMessage()
    assert str(status) in failures[0].getMessage()
    assert "SECRETPATH" not in caplog.text
    assert len(hook.requests) == 1 and elsewhere.requests == []


def test_the_alert_names_its_topic_and_error_in_the_title(settings, servers, caplog):
    hook = Server(204)
    servers.append(hook)
    settings.ALERT_WEBHOOK_URL = f"{hook.origin}/hooks/T000"
    with caplog.at_level(logging.ERROR, logger="reminders.alerts"):
        raise_alert(title="3 timeout jobs dead", details={"topic": "t.close", "error": "x" * 900})
    [line] = [r.getMessage() for r in caplog.records]
    assert line == f"ALERT 3 timeout jobs dead on t.close: {'x' * 200}"
    [(_, _, body)] = hook.requests
    posted = json.loads(body)
    assert posted["title"] == line.removeprefix("ALERT ")
    assert posted["details"]["error"] == "x" * 900  # the details keep it whole
