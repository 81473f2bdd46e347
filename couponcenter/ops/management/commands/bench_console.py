"""Time the console pages over 1,000,000 user coupons and 1,000,000 pending reminders."""

import json

from django.core.management.base import BaseCommand, CommandError
from tqdm import tqdm

from couponcenter.core.process import sigterm_unwinds
from couponcenter.ops.bench.console import ConsoleBench

TARGET_MS = 1000


class Command(BaseCommand):
    help = "Load a big data set, time every console page and admin list, then clean up."

    def add_arguments(self, parser):
        parser.add_argument("--count", type=int, default=1_000_000)
        parser.add_argument("--repeat", type=int, default=3)
        parser.add_argument("--json", action="store_true")
        parser.add_argument("--keep", action="store_true", help="Do not delete the data after.")

    def handle(self, *args, count: int, repeat: int, json: bool, keep: bool, **options):
        sigterm_unwinds()  # what the run changed is put back, its processes stopped
        if count < 1 or repeat < 1:
            raise CommandError("--count and --repeat must be at least 1")

        def bar(total, desc):
            return tqdm(
                total=total, desc=desc, unit="", disable=True if json else None, leave=False
            )

        bench = ConsoleBench(count=count, repeat=repeat, progress=bar)
        try:
            load = bench.load()
            timings = bench.measure()
        finally:
            if not keep:
                bench.cleanup()
        slowest = max(t.median_ms for t in timings)
        if json:
            self.stdout.write(
                _json(
                    {
                        "count": count,
                        "load": load,
                        "target_ms": TARGET_MS,
                        "slowest_median_ms": slowest,
                        "pages": [vars(t) for t in timings],
                    }
                )
            )
            return
        self.stdout.write(
            f"loaded {count:,} user coupons + {count:,} reminders in {load['total_s']:.1f} s"
        )
        self.stdout.write(f"{'page':<72} {'status':>6} {'best':>8} {'median':>8} {'worst':>8}")
        for t in timings:
            flag = "" if t.median_ms < TARGET_MS and t.status in (200, 302) else "  <-- over target"
            self.stdout.write(
                f"{t.page:<72} {t.status:>6} {t.best_ms:>6.0f}ms "
                f"{t.median_ms:>6.0f}ms {t.worst_ms:>6.0f}ms{flag}"
            )
        self.stdout.write(f"slowest median {slowest:.0f} ms (target < {TARGET_MS} ms)")


def _json(data) -> str:
    return json.dumps(data, indent=2, default=str)
