from django.core.management.base import BaseCommand, CommandError

from couponcenter.core.process import sigterm_unwinds
from couponcenter.coupons.bench.progress import progress_bars, result_write
from reminders.bench import end_to_end
from reminders.models.reminder_settings import MAX_PRESTAGE_MS


class Command(BaseCommand):
    help = (
        "Benchmark reminders end to end: COUNT reminders due in the same second through one "
        "reminder worker and one Celery worker (inbox gateway), then a steady rate; beside the "
        "raw limit of a bare Lua pop-and-ack loop measured in the same run; then the same burst "
        "and steady rate pre-staged (burst_p99_ms beside burst_p99_ms_without_prestage)."
    )

    def add_arguments(self, parser):
        parser.add_argument("--count", type=int, default=200_000)
        parser.add_argument("--steady-rate", type=int, default=2000, help="reminders per second")
        parser.add_argument("--steady-seconds", type=int, default=10, help="0 skips the phase")
        parser.add_argument(
            "--prestage-ms",
            type=int,
            default=end_to_end.DEFAULT_PRESTAGE_MS,
            help="the pre-staged burst's window (0 skips that phase)",
        )
        parser.add_argument(
            "--backlog",
            type=int,
            default=0,
            help="then the steady phase again with this many reminders pending a day ahead "
            "(0 skips it)",
        )
        parser.add_argument("--json", action="store_true", help="print one JSON object")

    def handle(
        self, *args, count: int, steady_rate: int, steady_seconds: int, prestage_ms: int, **options
    ):
        sigterm_unwinds()  # what the run changed is put back, its processes stopped
        if count < 1 or count > 5_000_000:
            raise CommandError("--count must be between 1 and 5,000,000")
        if steady_rate < 1 or steady_seconds < 0:
            raise CommandError("--steady-rate must be >= 1 and --steady-seconds >= 0")
        if not 0 <= prestage_ms <= MAX_PRESTAGE_MS:
            raise CommandError(f"--prestage-ms must be between 0 and {MAX_PRESTAGE_MS}")
        backlog = options["backlog"]
        if not 0 <= backlog <= 50_000_000:
            raise CommandError("--backlog must be between 0 and 50,000,000")
        with progress_bars(self.stderr._out) as progress:
            result = end_to_end.run(
                count=count,
                steady_rate=steady_rate,
                steady_seconds=steady_seconds,
                prestage_ms=prestage_ms,
                backlog=backlog,
                progress=progress,
            )
        result_write(self.stdout.write, result, as_json=options["json"])
