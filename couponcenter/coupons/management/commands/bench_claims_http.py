from django.core.management.base import BaseCommand, CommandError

from couponcenter.core.process import sigterm_unwinds
from couponcenter.coupons.bench import http as bench_http
from couponcenter.coupons.bench.progress import result_write


class Command(BaseCommand):
    help = (
        "Benchmark claims over HTTP: gunicorn on a loopback port, a coupon with stock S and one "
        "per user, a distinct user per POST /api/users/{id}/coupons/ for SECONDS, then an "
        "oversell audit; beside the raw limit of the same HTTP stack on /healthz/live/."
    )

    def add_arguments(self, parser):
        parser.add_argument("--seconds", type=float, default=20)
        parser.add_argument("--stock", type=int, default=0, help="default: 1,500 x seconds")
        parser.add_argument("--workers", type=int, default=4, help="gunicorn worker processes")
        parser.add_argument("--worker-class", default="sync", choices=["sync", "gthread"])
        parser.add_argument("--threads", type=int, default=1, help="threads per gthread worker")
        parser.add_argument("--connections", type=int, default=32)
        parser.add_argument("--generator", default="auto", choices=["auto", "wrk", "python"])
        parser.add_argument("--raw-seconds", type=float, default=5)
        parser.add_argument("--json", action="store_true", help="print one JSON object")

    def handle(self, *args, **options):
        sigterm_unwinds()  # what the run changed is put back, its processes stopped
        if not 1 <= options["seconds"] <= 600 or options["stock"] < 0:
            raise CommandError("--seconds must be within 1..600 and --stock >= 0")
        if not 1 <= options["workers"] <= 64 or not 1 <= options["connections"] <= 4096:
            raise CommandError("--workers must be within 1..64 and --connections within 1..4096")
        result = bench_http.run(
            seconds=options["seconds"],
            stock=options["stock"],
            workers=options["workers"],
            worker_class=options["worker_class"],
            threads=options["threads"],
            connections=options["connections"],
            generator=options["generator"],
            raw_seconds=options["raw_seconds"],
            progress=lambda message: self.stderr.write(message),
        )
        result_write(self.stdout.write, result, as_json=options["json"])
        if result["oversell"]:
            raise CommandError("OVERSELL: the audit failed (see above)")
