"""A web warning is one log line, not two (Django's own DEBUG console handler on top of the
root's printed each twice). A real process with the project's logging configuration."""

from __future__ import annotations

import os
import subprocess
import sys

from django.conf import settings


def test_a_django_warning_is_logged_once():
    code = ("import logging; logging.getLogger('django.request').warning('only-once-marker'); "
            "logging.getLogger('reminders').info('info-marker')")  # fmt: skip
    env = {**os.environ, "DEBUG": "1", "DJANGO_SETTINGS_MODULE": "couponcenter.settings",
           "LOG_LEVEL": "INFO"}  # fmt: skip
    done = subprocess.run(
        [sys.executable, "manage.py", "shell", "-c", code],
        cwd=settings.BASE_DIR, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    output = done.stdout + done.stderr
    assert output.count("only-once-marker") == 1, output
    assert output.count("info-marker") == 1, output
