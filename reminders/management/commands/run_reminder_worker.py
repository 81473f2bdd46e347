import logging
import os
import sys
import threading

from django.core.management.base import BaseCommand, CommandError

from couponcenter.core.process import stop_on_signals, tune_gc
from reminders.runtime.topic_executor import FIRE_THREAD_PREFIX
from reminders.runtime.worker import build_worker

logger = logging.getLogger(__name__)


class Command(BaseCommand):
    help = "Run the reminder/timeout dispatch loop (all topics, or those named with --topic)."

    def add_arguments(self, parser):
        parser.add_argument("--once", action="store_true", help="drain what is due now and exit")
        parser.add_argument(
            "--topic",
            action="append",
            dest="topics",
            metavar="T",
            help="serve only this topic (repeatable)",
        )

    def handle(self, *args, once: bool, topics: list[str] | None, **options):
        try:
            worker = build_worker(topics, threaded=not once)
        except ValueError as exc:
            raise CommandError(str(exc)) from exc
        if once:
            try:
                report = worker.run_until_idle()
            finally:
                worker.shutdown()  # hand the slots over now, even after an error
            self.stdout.write(
                f"claimed {report.claimed}, acked {report.acked}, dropped {report.dropped}, "
                f"retried {report.retried}, dead {report.dead}, reaped {report.reaped}"
            )
            return
        self.stdout.write(f"reminder worker {worker.worker_id} running; SIGTERM to stop")
        tune_gc()
        stop_on_signals(worker.stop)
        worker.run_forever()
        stuck = [
            t.name
            for t in threading.enumerate()
            if t.name.startswith(FIRE_THREAD_PREFIX) and t.is_alive()
        ]
        if stuck:
            # A job that never returned holds an executor's thread, which the interpreter joins
            # at exit: its entry is in flight in Redis (reaped and fired again), so stop here.
            logger.warning("stopping with %d threads still busy: %s", len(stuck), stuck[:5])
            logging.shutdown()
            sys.stdout.flush()
            os._exit(0)
