"""Run the expiry sweeper: ``manage.py run_expiry_sweeper [--once] [--batch-size N]``."""

from django.core.management.base import BaseCommand, CommandError

from couponcenter.core.process import stop_on_signals
from expiry.sweeper import Sweeper


class Command(BaseCommand):
    help = "Expire due claimed coupons in batches; with --once, drain what is due now and exit."

    def add_arguments(self, parser):
        parser.add_argument("--once", action="store_true", help="one pass, then exit")
        parser.add_argument(
            "--batch-size",
            type=int,
            default=None,
            help="tasks per transaction (default: ExpirySettings.batch_size, live)",
        )

    def handle(self, *args, once: bool = False, batch_size: int | None = None, **options):
        if batch_size is not None and batch_size < 1:
            raise CommandError(f"--batch-size must be at least 1 (got {batch_size}).")
        sweeper = Sweeper(batch_size=batch_size)
        stop_on_signals(sweeper.stop)
        if not once:
            sweeper.run_forever()
            return
        result = sweeper.run_once()
        if not result.ok:
            raise CommandError(f"expiry pass failed: {result.error}")
        totals = result.totals
        self.stdout.write(
            f"expired {totals.expired} coupons, processed {totals.processed} tasks "
            f"in {totals.batches} batches ({totals.seconds:.2f}s), cleaned {result.cleaned}"
        )
