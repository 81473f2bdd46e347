from django.apps import AppConfig
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from couponcenter.core import health
from couponcenter.core import metrics as core_metrics
from couponcenter.core.redis import get_redis
from couponcenter.core.urgency import register_urgent_path
from couponcenter.coupons import signals as coupon_signals
from reminders.engine import connection


class RemindersConfig(AppConfig):
    name = "reminders"
    verbose_name = "Reminders and timeouts"

    def ready(self) -> None:
        from reminders.checks import config_errors

        errors = config_errors()
        if errors:  # refuse to start: outbound calls would be signed with a guessable key
            raise ImproperlyConfigured("; ".join(errors))
        # The engine is plain Python: it gets its connection and key prefix from here (the prefix
        # is read at call time, so each test may have its own).
        connection.install(
            client=get_redis, prefix=lambda: getattr(settings, "REDIS_KEY_PREFIX", "cc")
        )
        # These modules import models, so Django's app loading needs them imported here, once
        # the app registry is ready (the one kind of import kept inside a function).
        from reminders import collector, receivers, urgency
        from reminders import health as reminder_health

        core_metrics.register_state_source("redis", collector.queue_gauges)
        # The reminders' and timeouts' oldest due job, for the background work that yields.
        register_urgent_path("queues", urgency.queue_readings)
        health.register_check("broker", reminder_health.broker_check)
        health.register_check(
            "workers",
            reminder_health.workers_check,
            hard=False,
            needs="redis",
            warning="no live reminder worker, or one whose loop is stalled",
        )
        coupon_signals.coupon_rescheduled.connect(
            receivers.on_coupon_rescheduled, dispatch_uid="reminders.coupon_rescheduled"
        )
        coupon_signals.coupon_cancelled.connect(
            receivers.on_coupon_cancelled, dispatch_uid="reminders.coupon_cancelled"
        )
        coupon_signals.coupon_unclaimable.connect(
            receivers.on_coupon_unclaimable, dispatch_uid="reminders.coupon_unclaimable"
        )
