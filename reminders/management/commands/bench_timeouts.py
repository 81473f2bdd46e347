from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from couponcenter.core.process import sigterm_unwinds
from couponcenter.coupons.bench.progress import progress_bars, result_write
from reminders.bench import timeouts


class Command(BaseCommand):
    help = (
        "Benchmark the timeout center: COUNT http jobs due in the same second fired at a local "
        "keep-alive receiver (beside the receiver's raw rate from a plain client), a fast "
        "topic's lateness while a slow topic is saturated, bulk create and cancel by key "
        "through the API (gunicorn)."
    )

    def add_arguments(self, parser):
        parser.add_argument("--count", type=int, default=200_000, help="jobs in the burst")
        parser.add_argument("--concurrency", type=int, default=16, help="the http topic's")
        parser.add_argument("--raw-count", type=int, default=20_000, help="the raw client's calls")
        parser.add_argument("--steady-rate", type=int, default=200, help="fast topic jobs/s")
        parser.add_argument("--steady-seconds", type=int, default=10)
        parser.add_argument("--bulk-jobs", type=int, default=100_000)
        parser.add_argument("--cancels", type=int, default=5_000)
        parser.add_argument("--json", action="store_true", help="print one JSON object")

    def handle(self, *args, **options):
        sigterm_unwinds()  # what the run changed is put back, its processes stopped
        checks = {
            "--count": (options["count"], 1_000, 2_000_000),
            "--concurrency": (options["concurrency"], 1, 256),
            "--raw-count": (options["raw_count"], 1_000, 1_000_000),
            "--steady-rate": (options["steady_rate"], 1, 10_000),
            "--steady-seconds": (options["steady_seconds"], 1, 600),
            "--bulk-jobs": (options["bulk_jobs"], 10_000, 2_000_000),
            "--cancels": (options["cancels"], 100, 100_000),
        }
        for name, (value, low, high) in checks.items():
            if not low <= value <= high:
                raise CommandError(f"{name} must be within {low:,}..{high:,}, got {value:,}")
        if options["cancels"] > options["bulk_jobs"]:
            raise CommandError("--cancels must not exceed --bulk-jobs (it cancels those jobs)")
        if not settings.DEBUG:
            raise CommandError("bench_timeouts loads and deletes data: run it with DEBUG=1")
        with progress_bars(self.stderr._out) as progress:
            result = timeouts.run(
                count=options["count"],
                raw_count=options["raw_count"],
                concurrency=options["concurrency"],
                steady_rate=options["steady_rate"],
                steady_seconds=options["steady_seconds"],
                bulk_jobs=options["bulk_jobs"],
                cancels=options["cancels"],
                progress=progress,
            )
        result_write(self.stdout.write, result, as_json=options["json"])
