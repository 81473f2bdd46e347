"""Benchmark the sweeper: ``manage.py bench_expiry --count N [--workers K] [--batch-size B]``."""

import json

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from couponcenter.core.process import sigterm_unwinds
from expiry.bench.sweep import run_bench
from expiry.services import DEFAULT_BATCH_SIZE


class Command(BaseCommand):
    help = (
        "Load N due coupons under a bench coupon, expire them with K sweeper processes, compare "
        "with a bare SQL update loop, delete the bench rows."
    )

    def add_arguments(self, parser):
        parser.add_argument("--count", type=int, required=True)
        parser.add_argument("--workers", type=int, default=2)
        parser.add_argument(
            "--batch-size",
            type=int,
            default=DEFAULT_BATCH_SIZE,
            help=f"rows per batch (default {DEFAULT_BATCH_SIZE}: the sweeper's own default)",
        )
        parser.add_argument(
            "--rounds",
            type=int,
            default=1,
            help="times each side runs, taking turns (ours, bare, bare, ours, ...); each side's "
            "time is the mean of its rounds",
        )
        parser.add_argument(
            "--no-warmup",
            action="store_true",
            help="skip the untimed warm-up phase (the bare loop once) before the timed ones",
        )
        parser.add_argument("--json", action="store_true", help="print one JSON object")
        parser.add_argument("--force", action="store_true", help="run even with DEBUG off")

    def handle(self, *args, count, workers, batch_size, rounds, **options):
        sigterm_unwinds()  # what the run changed is put back, its processes stopped
        if count < 1 or workers < 1 or batch_size < 1:
            raise CommandError("--count, --workers and --batch-size must be at least 1.")
        if not 1 <= rounds <= 10:
            raise CommandError(f"--rounds must be within 1..10, got {rounds}.")
        if not settings.DEBUG and not options["force"]:
            raise CommandError(
                "DEBUG is off: this may be production. Pass --force to bench anyway."
            )
        report = run_bench(
            count=count,
            workers=workers,
            batch_size=batch_size,
            progress=not options["json"],
            rounds=rounds,
            warmup=not options["no_warmup"],
        ).as_dict()
        if options["json"]:
            self.stdout.write(_json_dumps(report))
            return
        self.stdout.write(
            f"{report['count']} coupons expired by {report['workers']} sweepers "
            f"(batch {report['batch_size']}, {report['database']}) in {report['seconds']}s: "
            f"{report['per_s']}/s; bare SQL update loop {report['raw_sql_per_s']}/s "
            f"({report['of_raw']:.0%} of raw)"
        )


def _json_dumps(report: dict) -> str:
    return json.dumps(report, sort_keys=True)
