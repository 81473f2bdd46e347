from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from couponcenter.core.process import sigterm_unwinds
from couponcenter.coupons.bench import rush
from couponcenter.coupons.bench.progress import progress_bars, result_write


class Command(BaseCommand):
    help = (
        "Benchmark the rush: a coupon opens at T and USERS distinct users claim it from T - 1 s "
        "through gunicorn (wrk, one connection per thread, a user answered not_open taps "
        "again), once per stock; each beside the same gunicorn answering /healthz/live/, with "
        "the winners and the users over their limit counted in the database."
    )

    def add_arguments(self, parser):
        parser.add_argument("--users", type=int, default=100_000)
        parser.add_argument(
            "--stocks", default="1000,100000", help="comma-separated, one rush each"
        )
        parser.add_argument("--connections", type=int, default=64, help="wrk's, one per thread")
        parser.add_argument("--workers", type=int, default=0, help="default: 2 x cores + 1")
        parser.add_argument("--threads", type=int, default=8, help="threads per gthread worker")
        parser.add_argument("--healthz-seconds", type=float, default=5)
        parser.add_argument("--max-seconds", type=float, default=600, help="per rush")
        parser.add_argument("--json", action="store_true", help="print one JSON object")

    def handle(self, *args, **options):
        sigterm_unwinds()  # what the run changed is put back, its processes stopped
        try:
            stocks = tuple(int(s) for s in options["stocks"].split(",") if s.strip())
        except ValueError:
            raise CommandError(f"--stocks takes numbers: {options['stocks']!r}") from None
        checks = {
            "--users": (options["users"], 1, 10_000_000),
            "--connections": (options["connections"], 1, 1024),
            "--workers": (options["workers"], 0, 64),
            "--threads": (options["threads"], 1, 64),
            "--healthz-seconds": (options["healthz_seconds"], 1, 600),
            "--max-seconds": (options["max_seconds"], 5, 7200),
        }
        for name, (value, low, high) in checks.items():
            if not low <= value <= high:
                raise CommandError(f"{name} must be within {low:,}..{high:,}, got {value:,}")
        if not stocks or min(stocks) < 1:
            raise CommandError("--stocks takes one or more stocks of at least 1")
        if not settings.DEBUG:
            raise CommandError("bench_rush loads and deletes data: run it with DEBUG=1")
        try:
            with progress_bars(self.stderr._out) as progress:
                result = rush.run(
                    users=options["users"],
                    stocks=stocks,
                    connections=options["connections"],
                    workers=options["workers"],
                    threads=options["threads"],
                    healthz_seconds=options["healthz_seconds"],
                    max_seconds=options["max_seconds"],
                    progress=progress,
                    say=lambda message: self.stderr.write(message),
                )
        except rush.WrkMissing as exc:
            raise CommandError(str(exc)) from None
        runs = result["runs"]
        if options["json"]:
            result_write(self.stdout.write, result, as_json=True)
        else:
            result_write(self.stdout.write, {k: v for k, v in result.items() if k != "runs"},
                         as_json=False)  # fmt: skip
            for run in runs:
                self.stdout.write(f"\n--- stock {run['stock']:,}")
                result_write(self.stdout.write, run, as_json=False)
        if not all(run["exact"] for run in runs):
            raise CommandError("NOT EXACT: see winners, users_over_limit, unanswered and the audit")
