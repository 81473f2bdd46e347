"""Production settings pass Django's deployment checks, and refuse to start with the dev key."""

from __future__ import annotations

import os
import secrets
import string
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow


def production_env(**extra: str) -> dict[str, str]:
    alphabet = string.ascii_letters + string.digits + "!@#%^&*(-_=+)"
    env = {k: v for k, v in os.environ.items() if k not in {"DEBUG", "SECRET_KEY"}}
    env.update(
        DJANGO_SETTINGS_MODULE="couponcenter.settings",
        DEBUG="0",
        SECRET_KEY="".join(secrets.choice(alphabet) for _ in range(50)),
        ALLOWED_HOSTS="example.com",
        PYTHONPATH=str(ROOT),
    )
    env.update(extra)
    return env


def manage(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "manage.py", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)  # fmt: skip


def test_check_deploy_is_clean_with_production_settings():
    done = manage("check", "--deploy", "--fail-level", "WARNING", env=production_env())
    assert done.returncode == 0, done.stdout + done.stderr


def test_debug_off_with_the_development_key_refuses_to_start():
    env = production_env()
    del env["SECRET_KEY"]
    done = manage("check", env=env)
    assert done.returncode != 0
    assert "SECRET_KEY must be set" in done.stderr
    assert "DEBUG=1" in done.stderr  # and says what a developer gives instead


def test_secrets_come_from_the_environment():
    """No secret has a non-empty default in the settings: an unset variable means no secret."""
    script = (
        "from django.conf import settings as s; "
        "print(repr((s.METRICS_TOKEN, s.NOTIFY_WEBHOOK_SECRET, s.WEBHOOK_ALLOW_HTTP)))"
    )
    env = production_env()
    for name in ("METRICS_TOKEN", "NOTIFY_WEBHOOK_SECRET", "WEBHOOK_ALLOW_HTTP"):
        env.pop(name, None)
    done = manage("shell", "-c", script, env=env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "('', '', False)"


PRODUCTION_PROBE = """
from django.conf import settings as s
from django.test import Client
from rest_framework.settings import api_settings
c = Client(HTTP_HOST="example.com")
print(repr((
    s.METRICS_ALLOW_LOOPBACK,
    [r.__name__ for r in api_settings.DEFAULT_RENDERER_CLASSES],
    c.get("/api/schema/", secure=True).status_code,
    c.get("/api/docs/", secure=True).status_code,
)))
"""


def test_production_defaults_hide_the_browsable_api_and_the_schema_and_close_metrics():
    done = manage("shell", "-c", PRODUCTION_PROBE, env=production_env())
    assert done.returncode == 0, done.stderr
    loopback, renderers, schema, docs = eval(done.stdout.strip().splitlines()[-1])  # noqa: S307
    assert loopback is False  # /metrics needs METRICS_TOKEN
    assert renderers == ["JSONRenderer"]
    assert schema in (401, 403) and docs in (401, 403)


def test_development_keeps_them_and_an_operator_can_open_them_in_production():
    env = production_env(API_BROWSABLE="1", API_DOCS_PUBLIC="1", METRICS_ALLOW_LOOPBACK="1")
    done = manage("shell", "-c", PRODUCTION_PROBE, env=env)
    assert done.returncode == 0, done.stderr
    loopback, renderers, schema, docs = eval(done.stdout.strip().splitlines()[-1])  # noqa: S307
    assert loopback is True and "BrowsableAPIRenderer" in renderers
    assert schema == 200 and docs == 200


def test_debug_is_off_unless_switched_on():
    env = production_env()
    env.pop("DEBUG")
    done = manage("shell", "-c", "from django.conf import settings; print(settings.DEBUG)", env=env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "False"


def test_the_development_key_is_flagged_by_the_deploy_check():
    env = production_env(DEBUG="1")
    del env["SECRET_KEY"]  # the published development key
    done = manage("check", "--deploy", env=env)
    assert "security.W009" in done.stdout + done.stderr


@pytest.mark.parametrize(
    ("extra", "named"),
    [
        ({"NOTIFY_WEBHOOK_URL": "https://hooks.example.com/n"}, "NOTIFY_WEBHOOK_SECRET is empty"),
        ({"NOTIFY_WEBHOOK_URL": "https://hooks.example.com/n", "NOTIFY_WEBHOOK_SECRET": "x" * 31},
         "NOTIFY_WEBHOOK_SECRET has 31 bytes"),
        ({"NOTIFY_WEBHOOK_URL": "https://hooks.example.com/n", "NOTIFY_WEBHOOK_SECRET": "k" * 32},
         "NOTIFY_WEBHOOK_SECRET is guessable"),
        ({"TIMEOUT_TOPICS_JSON": '{"pay.close": {"type": "http", "url": "https://pay.example.com"}}'},
         "TIMEOUT_TOPICS['pay.close'] secret is empty"),
    ],
)  # fmt: skip
def test_a_short_signing_secret_refuses_to_start(extra, named):
    """An empty, short or guessable key lets anyone forge a signed webhook: no process starts
    with one."""
    for command in (("check", "--deploy"), ("run_reminder_worker", "--once")):
        done = manage(*command, env=production_env(**extra))
        assert done.returncode != 0, command
        assert named in done.stderr, (command, done.stderr[-2000:])


def test_a_random_32_byte_secret_passes_the_deploy_check():
    env = production_env(
        NOTIFY_WEBHOOK_URL="https://hooks.example.com/n",
        NOTIFY_WEBHOOK_SECRET="9c1d92454df7a6654660befabadb36fd",  # secrets.token_hex(16)
        TIMEOUT_TOPICS_JSON='{"pay.close": {"type": "http", "url": "https://pay.example.com", '
        '"secret": "cYNxB7-FCVlfiaLhE7ga5weS3Scq4B-d3xAY1Tlml8Q"}}',
    )
    done = manage("check", "--deploy", "--fail-level", "WARNING", env=env)
    assert done.returncode == 0, done.stdout + done.stderr
