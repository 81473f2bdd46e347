"""A campaign day, compressed, against the production processes: every path alone, then all at
once with a rolling deploy in the middle (couponcenter.ops.bench.day)."""

import functools

from django.core.management.base import BaseCommand, CommandError

from couponcenter.ops.bench import day
from couponcenter.ops.bench.command import run_production_bench
from reminders.bench.nginx import nginx_missing


class Command(BaseCommand):
    help = (
        "Replay a campaign day, compressed (steady reminders, timeouts, claims and API reads; a "
        "pre-staged reminder burst, the claim rush, a burst of order timeouts, an expiry sweep; "
        "a rolling deploy in the middle) against gunicorn, Celery, the reminder worker and the "
        "sweeper; each path in the day beside the same path alone, lost and duplicated "
        "deliveries, the targets met or not."
    )

    def add_arguments(self, parser):
        d = day.Shape()
        parser.add_argument("--minutes", type=float, default=d.seconds / 60, help="the day")
        parser.add_argument(
            "--alone-seconds", type=float, default=d.alone_s, help="each steady path alone"
        )
        parser.add_argument("--burst", type=int, default=d.burst, help="the reminder burst")
        parser.add_argument("--rush-users", type=int, default=d.rush_users)
        parser.add_argument("--timeout-burst", type=int, default=d.timeout_burst)
        parser.add_argument("--expiry", type=int, default=d.expiry, help="coupons swept")
        parser.add_argument("--reminders-rate", type=float, default=d.reminders_rate)
        parser.add_argument("--timeouts-rate", type=float, default=d.timeouts_rate)
        parser.add_argument("--claims-rate", type=float, default=d.claims_rate)
        parser.add_argument("--reads-rate", type=float, default=d.reads_rate)
        parser.add_argument("--json", action="store_true", help="print one JSON object")

    def handle(self, *args, **o):
        shape = day.Shape(
            seconds=o["minutes"] * 60,
            alone_s=o["alone_seconds"],
            reminders_rate=o["reminders_rate"],
            timeouts_rate=o["timeouts_rate"],
            claims_rate=o["claims_rate"],
            reads_rate=o["reads_rate"],
            burst=o["burst"],
            rush_users=o["rush_users"],
            timeout_burst=o["timeout_burst"],
            expiry=o["expiry"],
        )
        check(shape)
        if missing := nginx_missing("bench_day"):
            raise CommandError(missing)
        run_production_bench(
            self,
            name="bench_day",
            needs_postgres="",
            run=functools.partial(day.run, shape),
            report_lines=day.report_lines,
            as_json=o["json"],
        )


def check(shape: day.Shape) -> None:
    """Bad options: a clear error before anything starts."""
    bounds = (
        ("--minutes", shape.seconds / 60, 0.5, 24 * 60),
        ("--alone-seconds", shape.alone_s, 2, 3600),
        ("--burst", shape.burst, 10, 10_000_000),
        ("--rush-users", shape.rush_users, 10, 10_000_000),
        ("--timeout-burst", shape.timeout_burst, 10, 10_000_000),
        ("--expiry", shape.expiry, 10, 100_000_000),
        ("--reminders-rate", shape.reminders_rate, 1, 100_000),
        ("--timeouts-rate", shape.timeouts_rate, 1, 100_000),
        ("--claims-rate", shape.claims_rate, 1, 10_000),
        ("--reads-rate", shape.reads_rate, 1, 10_000),
    )
    for name, value, low, high in bounds:
        if not low <= value <= high:
            raise CommandError(f"{name} must be within {low:,}..{high:,} (got {value:,})")
