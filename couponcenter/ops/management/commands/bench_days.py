"""D days of a campaign calendar, compressed in time, against the production processes."""

import functools

from django.core.management.base import BaseCommand, CommandError

from couponcenter.ops.bench import days
from couponcenter.ops.bench.command import run_production_bench
from reminders.bench.nginx import nginx_missing


class Command(BaseCommand):
    help = (
        "Replay D days of a campaign calendar (claims and their nightly expiry, a reminder burst, "
        "order timeouts created, cancelled and fired, retention) with autovacuum on; per day the "
        "rates, every table's size and its dead tuples; the last day against the first."
    )

    def add_arguments(self, parser):
        parser.add_argument("--days", type=int, default=12, help="D, at least 3 x the retention")
        parser.add_argument(
            "--retention-days", type=int, default=4, help="every live retention, for the run"
        )
        parser.add_argument(
            "--claims",
            type=int,
            default=300_000,
            help=f"claims a day (the night sweeps them in {days.NIGHT_ROUNDS} rounds)",
        )
        parser.add_argument("--reminders", type=int, default=100_000, help="the day's burst")
        parser.add_argument("--timeouts", type=int, default=25_000, help="order timeouts a day")
        parser.add_argument(
            "--autovacuum-wait",
            type=float,
            default=days.AUTOVACUUM_WAIT_S,
            help="the longest a day's end waits for autovacuum's round, seconds (0..600)",
        )
        parser.add_argument("--json", action="store_true", help="print one JSON object")

    def handle(self, *args, **options):
        shape = days.Shape(
            days=options["days"],
            retention_days=options["retention_days"],
            claims=options["claims"],
            reminders=options["reminders"],
            timeouts=options["timeouts"],
            autovacuum_wait_s=options["autovacuum_wait"],
        )
        _check(shape)
        if missing := nginx_missing("bench_days"):
            raise CommandError(missing)
        run_production_bench(
            self,
            name="bench_days",
            needs_postgres=" (autovacuum, sizes, dead tuples)",
            run=functools.partial(days.run, shape),
            report_lines=days.report_lines,
            as_json=options["json"],
        )


def _check(shape: days.Shape) -> None:
    if not 1 <= shape.retention_days <= 60:
        raise CommandError("--retention-days must be within 1..60")
    if not 3 * shape.retention_days <= shape.days <= 400:
        raise CommandError(
            f"--days must be at least 3 x --retention-days ({3 * shape.retention_days}) "
            "and at most 400"
        )
    if not 0 <= shape.autovacuum_wait_s <= 600:
        raise CommandError("--autovacuum-wait must be within 0..600 seconds")
    for name, value, low in (
        ("claims", shape.claims, 10),
        ("reminders", shape.reminders, 10),
        ("timeouts", shape.timeouts, 5),
    ):
        if not low <= value <= 10_000_000:
            raise CommandError(f"--{name} must be within {low:,}..10,000,000")
