from django.core.management.base import BaseCommand, CommandError

from couponcenter.core.process import sigterm_unwinds
from couponcenter.coupons.bench.progress import progress_bars, result_write
from reminders.bench import peers

PEERS = ("bullmq", "celery")


class Command(BaseCommand):
    help = (
        "Benchmark the peers on the same Redis and workload as bench_reminders: BullMQ delayed "
        "jobs (through node, with bullmq installed into var/peers/bullmq; skipped with a reason "
        "when node is missing) and Celery ETA tasks: a COUNT burst due in one second, then steady "
        "rates. Lateness p50/p99/p99.9/max from an HDR histogram."
    )

    def add_arguments(self, parser):
        parser.add_argument("--count", type=int, default=200_000)
        parser.add_argument(
            "--rates", default="2000,5000", help="steady rates per second, comma-separated"
        )
        parser.add_argument("--seconds", type=int, default=10, help="of each steady rate")
        parser.add_argument(
            "--peers", default=",".join(PEERS), help=f"comma-separated, of {', '.join(PEERS)}"
        )
        parser.add_argument("--json", action="store_true", help="print one JSON object")

    def handle(self, *args, count: int, rates: str, seconds: int, **options):
        sigterm_unwinds()  # what the run changed is put back, its processes stopped
        if not 1 <= count <= 5_000_000:
            raise CommandError("--count must be between 1 and 5,000,000")
        try:
            steady = [int(r) for r in rates.split(",") if r.strip()]
        except ValueError:
            raise CommandError(f"--rates must be whole numbers, got {rates!r}") from None
        if any(r < 1 or r > 100_000 for r in steady) or not 1 <= seconds <= 600:
            raise CommandError("each rate must be 1..100000 and --seconds 1..600")
        chosen = [p.strip() for p in options["peers"].split(",") if p.strip()]
        unknown = sorted(set(chosen) - set(PEERS))
        if unknown or not chosen:
            raise CommandError(f"--peers takes {', '.join(PEERS)}; got {options['peers']!r}")
        with progress_bars(self.stderr._out) as progress:
            result = peers.run(
                count=count, rates=steady, seconds=seconds, peers=chosen, progress=progress
            )
        if "bullmq_skipped" in result:
            self.stderr.write(f"BullMQ skipped: {result['bullmq_skipped']}")
        result_write(self.stdout.write, result, as_json=options["json"])
