"""Every benchmark in one sitting, each figure beside its raw limit from the same run."""

import json

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from couponcenter.core.process import sigterm_unwinds
from couponcenter.coupons.bench.progress import progress_bars
from couponcenter.ops.bench import report, suite


class Command(BaseCommand):
    help = (
        "Run the whole benchmark suite (reminders burst with and without pre-staging, steady "
        "5,000/s, the bare inbox-write loop, expiry, days of a campaign calendar, claims over "
        "HTTP, the rush of claims at a coupon's opening, the timeout center, webhook fan-out "
        "against nginx beside wrk, and the peers BullMQ and Celery ETA) and write one JSON file "
        "and one Markdown table under var/bench/."
    )

    def add_arguments(self, parser):
        parser.add_argument("--count", type=int, default=200_000, help="the reminder burst")
        parser.add_argument("--expiry-count", type=int, default=1_000_000)
        parser.add_argument("--claims-seconds", type=float, default=20)
        parser.add_argument("--rush-users", type=int, default=20_000, help="bench_rush's users")
        parser.add_argument("--no-peers", action="store_true", help="skip BullMQ and Celery ETA")
        parser.add_argument(
            "--only",
            default=",".join(suite.PARTS),
            help=f"comma-separated, of {', '.join(suite.PARTS)}",
        )
        parser.add_argument("--json", action="store_true", help="print the JSON, not the table")
        parser.add_argument(
            "--report",
            nargs="+",
            metavar="JSON",
            help="run nothing: one table with the median and range of these earlier runs",
        )

    def handle(
        self,
        *args,
        count: int,
        expiry_count: int,
        claims_seconds: float,
        rush_users: int,
        **options,
    ):
        sigterm_unwinds()  # what the run changed is put back, its processes stopped
        if options["report"]:
            self.stdout.write(report.markdown_spread(_load(options["report"])))
            return
        if not 1_000 <= count <= 5_000_000 or not 10_000 <= expiry_count <= 100_000_000:
            raise CommandError("--count must be 1,000..5,000,000, --expiry-count 10,000..1e8")
        if not 1 <= claims_seconds <= 600:
            raise CommandError("--claims-seconds must be within 1..600")
        if not 1_000 <= rush_users <= 10_000_000:
            raise CommandError("--rush-users must be within 1,000..10,000,000")
        parts = tuple(p.strip() for p in options["only"].split(",") if p.strip())
        if not parts or set(parts) - set(suite.PARTS):
            raise CommandError(f"--only takes {', '.join(suite.PARTS)}; got {options['only']!r}")
        if not settings.DEBUG:
            raise CommandError("bench_all loads and deletes data: run it with DEBUG=1")
        with progress_bars(self.stderr._out) as progress:
            result = suite.run(
                count=count,
                expiry_count=expiry_count,
                claims_seconds=claims_seconds,
                rush_users=rush_users,
                peers=not options["no_peers"],
                parts=parts,
                progress=progress,
                say=lambda message: self.stderr.write(message),
            )
        if options["json"]:
            self.stdout.write(json.dumps(result, default=str))
            return
        self.stdout.write(report.markdown(result))
        self.stdout.write(f"written: {result['json_path']}\n         {result['markdown_path']}")


def _load(paths: list[str]) -> list[dict]:
    runs = []
    for path in paths:
        try:
            with open(path) as f:
                runs.append(json.load(f))
        except (OSError, ValueError) as exc:
            raise CommandError(f"{path}: not a bench_all JSON file ({exc})") from None
        if "figures" not in runs[-1]:
            raise CommandError(f"{path}: not a bench_all JSON file (no figures)")
    return runs
