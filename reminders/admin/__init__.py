"""The reminders admin.

- ``domain``: subscriptions, timeout jobs, notifications (built for tens of millions of rows);
- ``config``: the live ``ReminderSettings`` row, with which running workers picked it up;
- ``timeout_topics``: generic timeout topics kept as data;
- ``dead_letters``: the engine's dead queues as an unmanaged model (as django-rq does for queues);
- and the "subscribed" count on a coupon's change page (``register_coupon_count``).

Pages read through ``reminders.selectors`` and write through ``reminders.services``. The
operations console over every app is ``couponcenter.ops``.
"""

from couponcenter.coupons.admin import register_coupon_count
from reminders.selectors import subscription_scheduled_count

from . import config, dead_letters, domain, timeout_topics  # noqa: F401  (registers the admins)

register_coupon_count(
    "subscribed",
    "subscribed (reminders scheduled)",
    lambda coupon_id: subscription_scheduled_count(coupon_id=coupon_id),
)
