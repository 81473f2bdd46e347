"""``make run``'s last word: once every process is up (the web server answers, the reminder worker
heartbeats, the Celery worker answers a ping, the expiry sweeper finished a pass), one box with
where to go and how to sign in, after every process's start-up lines. Then it waits (honcho stops
every process when one exits) until it is stopped."""

import signal
import sys
import time
from datetime import datetime

import requests
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError
from django.utils import timezone

from couponcenter.celery import app as celery_app
from couponcenter.coupons.management.commands.ensure_demo_admin import known_password
from expiry.selectors import last_run
from reminders.engine import leases


def _swept_since(moment: datetime) -> bool:
    finished = last_run().get("finished_at")
    return bool(finished) and datetime.fromisoformat(finished) >= moment


def box(lines: list[str]) -> str:
    width = max(len(line) for line in lines)
    rule = "═" * (width + 2)
    return "\n".join([f"╔{rule}╗", *(f"║ {line.ljust(width)} ║" for line in lines), f"╚{rule}╝"])


class Command(BaseCommand):
    help = "Wait until the service answers, print where to go and the admin's sign-in, then wait."

    def add_arguments(self, parser):
        parser.add_argument("--url", default="http://127.0.0.1:8000")
        parser.add_argument("--username", default="admin")
        parser.add_argument("--timeout", type=float, default=120)
        parser.add_argument("--no-wait", action="store_true", help="print, then exit")

    def handle(self, *args, url: str, username: str, timeout: float, no_wait: bool, **opts):
        url = url.rstrip("/")
        started = timezone.now()
        checks = {
            "the web server": lambda: requests.get(f"{url}/healthz/live/", timeout=2).ok,
            "the reminder worker": lambda: bool(leases.list_workers()),
            "the Celery worker": lambda: bool(celery_app.control.ping(timeout=1.0)),
            "the expiry sweeper": lambda: _swept_since(started),
        }
        deadline = time.monotonic() + timeout
        while checks:
            for name, check in list(checks.items()):
                try:
                    if check():
                        del checks[name]
                except Exception:  # noqa: BLE001 - not up yet (Redis may still be starting)
                    pass
            if not checks:
                break
            if time.monotonic() > deadline:
                raise CommandError(f"not up after {timeout:g} s: {', '.join(checks)}")
            time.sleep(0.5)
        user = get_user_model().objects.filter(username=username).first()
        password = (known_password(user) if user else None) or "(run `make admin-password`)"
        self.stdout.write(
            box(
                [
                    "Coupon Center is running.",
                    "",
                    f"Admin and console  {url}/admin/   (console: {url}/admin/console/)",
                    f"Sign in as         {username} / {password}",
                    f"API docs           {url}/api/docs/",
                    f"Landing page       {url}/",
                    "",
                    "Ctrl-C stops everything; `make admin-password` sets a new admin password.",
                ]
            )
        )
        self.stdout.flush()
        if no_wait:
            return
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
        try:
            while True:
                signal.pause()
        except KeyboardInterrupt:
            pass
