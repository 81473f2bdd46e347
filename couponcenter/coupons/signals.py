"""What the coupon domain tells the apps that follow it (reminders), without knowing them.

Both are sent inside the service's transaction, after the coupon row changed; a receiver's writes
join that transaction and its Redis work waits for the commit (``transaction.on_commit``). The
receivers are connected in ``reminders/apps.py``.
"""

from django.dispatch import Signal

# The opening time (or the reminder lead) moved: kwargs ``coupon``.
coupon_rescheduled = Signal()
# The coupon was cancelled: kwargs ``coupon``.
coupon_cancelled = Signal()
# A change left the coupon unclaimable at its opening (``sold_out`` or ``closed``): kwargs
# ``coupon`` and ``reason``.
coupon_unclaimable = Signal()
