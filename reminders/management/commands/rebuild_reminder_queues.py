from django.core.management.base import BaseCommand
from tqdm import tqdm

from reminders import services


class Command(BaseCommand):
    help = (
        "Rebuild the Redis queues from the database: every pending timeout job and reminder. "
        "Idempotent: entries already in Redis (scheduled, in flight or dead) are left alone."
    )

    def handle(self, *args, **options):
        totals = services.queues_pending_counts()
        bars = {
            name: tqdm(
                total=total, desc=name, unit="job", file=self.stderr._out, leave=True, disable=None
            )
            for name, total in totals.items()
        }
        counts = services.queues_rebuild(progress=lambda name, n: bars[name].update(n))
        for bar in bars.values():
            bar.close()
        for name, added in counts.items():
            self.stdout.write(
                f"{name}: {added} re-indexed ({totals[name]} pending in the database)"
            )
        self.stdout.write(self.style.SUCCESS("rebuild done"))
