from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from couponcenter.core.process import sigterm_unwinds
from couponcenter.coupons.bench.progress import progress_bars, result_write
from reminders.bench import fanout


class Command(BaseCommand):
    help = (
        "Benchmark webhook fan-out against a fast receiver: nginx answering 204 (started and "
        "stopped by the run), wrk at the same number of connections as the raw limit, then COUNT "
        "http timeout jobs due together fired by one reminder worker, then a BullMQ worker "
        "(Node, fetch) posting the same webhooks. Rates from nginx's access log; each worker's "
        "CPU seconds per thousand webhooks."
    )

    def add_arguments(self, parser):
        parser.add_argument("--count", type=int, default=20_000, help="webhooks per sender")
        parser.add_argument(
            "--concurrency", type=int, default=16, help="connections of every sender"
        )
        parser.add_argument("--wrk-seconds", type=float, default=5, help="wrk's run")
        parser.add_argument("--no-bullmq", action="store_true", help="skip the BullMQ worker")
        parser.add_argument("--json", action="store_true", help="print one JSON object")

    def handle(self, *args, count: int, concurrency: int, wrk_seconds: float, **options):
        sigterm_unwinds()  # what the run changed is put back, its processes stopped
        checks = {
            "--count": (count, 100, 2_000_000),
            "--concurrency": (concurrency, 1, 256),
            "--wrk-seconds": (wrk_seconds, 1, 600),
        }
        for name, (value, low, high) in checks.items():
            if not low <= value <= high:
                raise CommandError(f"{name} must be within {low:,}..{high:,}, got {value:,}")
        if not settings.DEBUG:
            raise CommandError("bench_fanout loads and deletes data: run it with DEBUG=1")
        with progress_bars(self.stderr._out) as progress:
            try:
                result = fanout.run(
                    count=count,
                    concurrency=concurrency,
                    wrk_seconds=wrk_seconds,
                    bullmq=not options["no_bullmq"],
                    progress=progress,
                    say=lambda message: self.stderr.write(message),
                )
            except fanout.ToolMissing as exc:
                raise CommandError(str(exc)) from None
        if "bullmq_skipped" in result:
            self.stderr.write(f"BullMQ skipped: {result['bullmq_skipped']}")
        for line in fanout.verdicts(result):
            self.stderr.write(line)
        result_write(self.stdout.write, result, as_json=options["json"])
