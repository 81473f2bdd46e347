"""``LOG_JSON=1``: every log line is one JSON object carrying the record's extra fields."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

from couponcenter.core.logging import JsonFormatter

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
