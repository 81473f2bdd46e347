"""Block until Redis answers (``make run``: the workers start beside the embedded Redis and
would otherwise log connection errors while it starts)."""

import time

from django.core.management.base import BaseCommand, CommandError

from couponcenter.core.redis import get_redis


class Command(BaseCommand):
    help = "Wait until Redis (REDIS_URL, or the embedded one) answers PING."

    def add_arguments(self, parser):
        parser.add_argument("--timeout", type=float, default=60)

    def handle(self, *args, timeout: float, **options):
        deadline = time.monotonic() + timeout
        while True:
            try:
                get_redis().ping()
                return
            except Exception as exc:  # noqa: BLE001 - not up yet
                if time.monotonic() > deadline:
                    raise CommandError(f"Redis did not answer in {timeout:g} s: {exc}") from exc
            time.sleep(0.2)
