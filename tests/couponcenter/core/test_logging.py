"""``LOG_JSON=1``: every log line is one JSON object carrying the record's extra fields. Plain text
(the default): one record is one line, whatever the logged values hold."""

from __future__ import annotations

import json
import logging
import logging.config
import os
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest
from django.conf import settings
from django.utils import timezone

from couponcenter.core.logging import JsonFormatter
from tests.support.factories import CouponFactory, api_user

ROOT = Path(__file__).resolve().parents[3]


def test_a_record_with_extras_is_one_json_line():
    record = logging.LogRecord("reminders.handlers.coupon_reminders", logging.WARNING, __file__, 1,
                               "dispatched %d", (3,), None)  # fmt: skip
    record.topic = "coupon.reminder"
    record.batch = {"slot": 4, "ids": [1, 2]}
    line = JsonFormatter().format(record)
    assert "\n" not in line
    entry = json.loads(line)
    assert entry["message"] == "dispatched 3"
    assert entry["level"] == "WARNING" and entry["logger"] == "reminders.handlers.coupon_reminders"
    assert entry["topic"] == "coupon.reminder" and entry["batch"] == {"slot": 4, "ids": [1, 2]}
    assert entry["ts"].endswith("+00:00")


def test_an_exception_travels_inside_the_line():
    try:
        raise ValueError("boom")
    except ValueError:
        record = logging.LogRecord("x", logging.ERROR, __file__, 1, "failed", (), sys.exc_info())
    entry = json.loads(JsonFormatter().format(record))
    assert "ValueError: boom" in entry["exc"]


def test_log_json_configures_the_process():
    script = (
        "import django, logging; django.setup(); "
        "logging.getLogger('couponcenter.test').warning('hello %s', 'world', "
        "extra={'user_id': 42, 'coupon': 'c-1'})"
    )
    env = {**os.environ, "LOG_JSON": "1", "DJANGO_SETTINGS_MODULE": "couponcenter.settings",
           "PYTHONPATH": str(ROOT)}  # fmt: skip
    done = subprocess.run([sys.executable, "-c", script], env=env, cwd=ROOT, capture_output=True,
                          text=True, timeout=60, check=True)  # fmt: skip
    lines = [json.loads(line) for line in done.stderr.splitlines() if line.startswith("{")]
    entry = next(e for e in lines if e["logger"] == "couponcenter.test")
    assert entry["message"] == "hello world"
    assert entry["user_id"] == 42 and entry["coupon"] == "c-1"


# --- one record, one line: control characters escaped in the plain-text log ---------------------

FORGED = "1\n2026-11-26 14:00:00,000 ERROR django.request Internal Server Error: /forged"


def _plain_formatter() -> logging.Formatter:
    """The plain formatter exactly as the project's logging configuration builds it."""
    configurator = logging.config.DictConfigurator(settings.LOGGING)
    return configurator.configure_formatter(dict(settings.LOGGING["formatters"]["plain"]))


def _record(msg: str, args: tuple = (), exc_info=None) -> logging.LogRecord:
    return logging.LogRecord("reminders.handlers.timeout_jobs", logging.INFO, __file__, 1, msg,
                             args, exc_info)  # fmt: skip


def test_a_newline_in_a_logged_value_stays_on_the_record_s_line():
    line = _plain_formatter().format(_record("timeout fired: %s %s:%s", ("t", "order", FORGED)))
    assert "\n" not in line
    assert line.endswith(
        "INFO reminders.handlers.timeout_jobs timeout fired: t order:1\\n2026-11-26 14:00:00,000 "
        "ERROR django.request Internal Server Error: /forged"
    )


@pytest.mark.parametrize(
    "value, shown",
    [("a\rb", "a\\rb"), ("a\tb", "a\\tb"), ("\x1b[31mred", "\\x1b[31mred"), ("a\x00b", "a\\x00b"),
     ("a\x7fb", "a\\x7fb"), ("a\x85b", "a\\x85b"), ("a\u2028b", "a\\u2028b"),
     ("a\u2029b", "a\\u2029b"), ("a\ud800b", "a\\ud800b"),
     ("caf\u00e9 \U0001f600", "caf\u00e9 \U0001f600")],
    ids=["CR", "tab", "ESC", "NUL", "DEL", "NEL", "LS", "PS", "lone surrogate", "printable"],
)  # fmt: skip
def test_every_control_character_is_escaped(value, shown):
    line = _plain_formatter().format(_record("value %s", (value,)))
    assert line.endswith(f" value {shown}")
    assert len(line.splitlines()) == 1
    line.encode()  # a lone surrogate would make the stream's encoder drop the record


def test_a_traceback_travels_on_the_record_s_line():
    try:
        raise ValueError(f"bad biz_id {FORGED}")
    except ValueError:
        record = _record("firing %s failed", ("job 7",), sys.exc_info())
    line = _plain_formatter().format(record)
    assert "\n" not in line
    assert "firing job 7 failed\\nTraceback (most recent call last):\\n" in line
    assert "ValueError: bad biz_id 1\\n2026-11-26" in line


def test_the_json_formatter_keeps_control_characters_inside_the_line():
    record = _record("timeout fired: %s", (FORGED + "\r\u2028\ud800",))
    record.biz_id = FORGED
    line = JsonFormatter().format(record)
    assert len(line.splitlines()) == 1
    line.encode()
    entry = json.loads(line)
    assert entry["message"] == f"timeout fired: {FORGED}\r\u2028\ud800"
    assert entry["biz_id"] == FORGED


def test_a_process_logs_a_forged_line_as_one_record():
    script = (
        "import django, logging; django.setup(); "
        "logging.getLogger('reminders.handlers.timeout_jobs').info("
        f"'timeout fired: %s %s:%s', 't', 'order', {FORGED!r})"
    )
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "couponcenter.settings",
           "PYTHONPATH": str(ROOT), "LOG_LEVEL": "INFO"}  # fmt: skip
    env.pop("LOG_JSON", None)
    done = subprocess.run([sys.executable, "-c", script], env=env, cwd=ROOT, capture_output=True,
                          text=True, timeout=60, check=True)  # fmt: skip
    lines = [line for line in done.stderr.splitlines() if "forged" in line]
    assert len(lines) == 1, done.stderr
    assert " INFO reminders.handlers.timeout_jobs timeout fired: t order:1\\n2026" in lines[0]
    assert not any(
        line.startswith("2026-11-26 14:00:00,000 ERROR") for line in done.stderr.splitlines()
    )


@pytest.mark.django_db
def test_an_expected_409_is_not_a_warning_and_a_404_still_is(client, caplog):
    """A business refusal (here: not open yet) is the answer the client expects; Django's
    ``django.request`` WARNING is kept for the rest (``ExpectedConflict``)."""
    _, token = api_user(end_user_id=5)
    coupon = CouponFactory(claim_opens_at=timezone.now() + timedelta(hours=1))
    auth = {"HTTP_AUTHORIZATION": f"Token {token}"}
    with caplog.at_level(logging.INFO):
        refused = client.post("/api/users/5/coupons/", {"coupon": coupon.pk},
                              content_type="application/json", **auth)  # fmt: skip
        missing = client.get("/api/no-such-thing/", **auth)
    assert (refused.status_code, refused.json()["code"]) == (409, "not_open")
    assert missing.status_code == 404
    logged = [(r.levelname, r.status_code) for r in caplog.records if r.name == "django.request"]
    assert logged == [("WARNING", 404)]


def test_the_development_server_logs_a_409_as_info_and_a_404_as_a_warning(caplog):
    """``make run``'s access log (runserver's ``django.server``) keeps every line, a 409 at INFO."""
    server = logging.getLogger("django.server")
    with caplog.at_level(logging.INFO):
        server.warning('"POST /api/users/5/coupons/ HTTP/1.1" 409 111', extra={"status_code": 409})
        server.warning('"GET /api/nothing/ HTTP/1.1" 404 23', extra={"status_code": 404})
    logged = [(r.levelname, r.status_code) for r in caplog.records]
    assert logged == [("INFO", 409), ("WARNING", 404)]
