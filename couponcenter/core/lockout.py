"""Who a run of failed sign-ins locks out (django-axes, ``AXES_HANDLER``).

Three counts over the failures within ``AXES_COOLOFF_TIME``, each with its own limit:

- one username from one client address (``AXES_LOCKOUT_PARAMETERS``, ``AXES_FAILURE_LIMIT``):
  someone who knows the admin's username and guesses from one address locks out that address
  for that username, and the admin still signs in from anywhere else;
- one client address, whatever the usernames (``AXES_ADDRESS_FAILURE_LIMIT``): guessing many
  usernames from one address;
- one username, whatever the addresses (``AXES_USERNAME_FAILURE_LIMIT``, far higher): guessing
  one password from many addresses. Reaching it locks the username out for everyone, so it is
  high enough that one attacker's addresses need many rounds of the pair limit to reach it.

A successful sign-in forgets the failures of its own pair only (django-axes' reset follows
``AXES_LOCKOUT_PARAMETERS``): the admin signing in does not forgive what others tried.
"""

from __future__ import annotations

from axes.attempts import get_cool_off_threshold
from axes.handlers.database import AxesDatabaseHandler
from axes.helpers import get_client_username, get_failure_limit
from axes.models import AccessAttempt
from django.conf import settings
from django.db.models import Max, Q, Sum
from django.utils import timezone

# What the console shows in the column a count does not look at (no username or address has it).
ANY = "(any)"


class TieredLockoutHandler(AxesDatabaseHandler):
    def get_failures(self, request, credentials: dict | None = None) -> int:
        """The pair's failures; at least the pair's limit when the address's or the username's
        own count reached its limit (django-axes compares this number with
        ``AXES_FAILURE_LIMIT`` alone)."""
        pair = super().get_failures(request, credentials)
        limit = get_failure_limit(request, credentials)
        if pair >= limit:
            return pair
        by_address = Q(ip_address=request.axes_ip_address)
        by_username = Q(username=get_client_username(request, credentials))
        counts = AccessAttempt.objects.filter(
            by_address | by_username, attempt_time__gte=get_cool_off_threshold(request)
        ).aggregate(
            address=Sum("failures_since_start", filter=by_address, default=0),
            username=Sum("failures_since_start", filter=by_username, default=0),
        )
        if (
            counts["address"] >= settings.AXES_ADDRESS_FAILURE_LIMIT
            or counts["username"] >= settings.AXES_USERNAME_FAILURE_LIMIT
        ):
            return limit
        return pair


def lockouts_now(*, limit: int = 50) -> list[dict]:
    """Who is locked out now, the latest first: username and address pairs, addresses and
    usernames past their limits (``ANY`` in the column a count does not look at). Keys:
    ``username``, ``ip_address``, ``failures_since_start``, ``attempt_time``."""
    recent = AccessAttempt.objects.filter(
        attempt_time__gte=timezone.now() - settings.AXES_COOLOFF_TIME
    )
    counts = (
        (("username", "ip_address"), settings.AXES_FAILURE_LIMIT),
        (("ip_address",), settings.AXES_ADDRESS_FAILURE_LIMIT),
        (("username",), settings.AXES_USERNAME_FAILURE_LIMIT),
    )
    rows = []
    for fields, at_least in counts:
        found = (
            recent.values(*fields)
            .annotate(failures=Sum("failures_since_start"), last=Max("attempt_time"))
            .filter(failures__gte=at_least)
            .order_by("-last")[:limit]
        )
        rows += [
            {
                "username": row.get("username", ANY),
                "ip_address": row.get("ip_address", ANY),
                "failures_since_start": row["failures"],
                "attempt_time": row["last"],
            }
            for row in found
        ]
    rows.sort(key=lambda row: row["attempt_time"], reverse=True)
    return rows[:limit]
