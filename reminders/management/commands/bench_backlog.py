import json

from django.core.management.base import BaseCommand, CommandError

from couponcenter.core.process import sigterm_unwinds
from couponcenter.coupons.bench.progress import progress_bars
from reminders.bench import backlog


class Command(BaseCommand):
    help = (
        "Cost as the backlog grows: Redis bytes per pending reminder, and the claim + ack rate of "
        "due reminders with 1M and 10M pending behind them (ratios of the largest to the smallest)."
    )

    def add_arguments(self, parser):
        parser.add_argument(
            "--sizes", default="1000000,10000000", help="backlog sizes, comma-separated"
        )
        parser.add_argument("--sample", type=int, default=200_000, help="due jobs claimed")
        parser.add_argument(
            "--rebuild",
            action="store_true",
            help="also time the rebuild from PostgreSQL at each size (loads that many "
            "subscriptions; needs a database with no scheduled reminders)",
        )
        parser.add_argument("--json", action="store_true", help="print one JSON object")

    def handle(self, *args, sizes: str, sample: int, **options):
        sigterm_unwinds()  # what the run changed is put back, its processes stopped
        try:
            counts = [int(s) for s in sizes.split(",") if s.strip()]
        except ValueError:
            raise CommandError(f"--sizes must be whole numbers, got {sizes!r}") from None
        if not counts or any(not 1_000 <= n <= 50_000_000 for n in counts):
            raise CommandError("each size must be within 1,000..50,000,000")
        if not 1_000 <= sample <= 5_000_000:
            raise CommandError("--sample must be within 1,000..5,000,000")
        with progress_bars(self.stderr._out) as progress:
            result = backlog.run(
                sizes=counts, sample=sample, rebuild=options["rebuild"], progress=progress
            )
        if options["json"]:
            self.stdout.write(json.dumps(result))
            return
        for row in result["sizes"]:
            self.stdout.write(
                f"{row['pending']:>12,} pending: {row['bytes_per_pending']:>6} "
                f"bytes each, claim + settle in parcels "
                f"{row['claim_ack_per_s']:,}/s, claim + ack entry by entry "
                f"{row['claim_ack_per_s_per_entry']:,}/s"
            )
        self.stdout.write(
            f"claim rate, largest / smallest backlog: {result['claim_rate_growth']}"
            f" in parcels, {result['claim_rate_growth_per_entry']} entry by entry"
        )
        for row in result.get("rebuild", ()):
            self.stdout.write(
                f"{row['scheduled']:>12,} scheduled: rebuilt from PostgreSQL in "
                f"{row['rebuild_s']} s, {row['rebuild_per_s']:,}/s"
            )
        if "rebuild_rate_growth" in result:
            self.stdout.write(f"rebuild rate, largest / smallest: {result['rebuild_rate_growth']}")
