"""Demo data, safe to run again: coupons in each state, claims, reminders, two API accounts.

Accounts get no password (they sign in by token, printed here); the staff login for the admin is
``ensure_demo_admin``'s job. Every write goes through the services.
"""

from __future__ import annotations

from collections import Counter
from datetime import datetime, timedelta
from typing import Any

from django.core.management.base import BaseCommand
from django.utils import timezone

from couponcenter.coupons import accounts, services
from couponcenter.coupons.models import Coupon, UserCoupon
from couponcenter.coupons.rules import ClaimRefused
from reminders.models import ReminderSubscription
from reminders.services import subscription_subscribe

DEMO_USER_ID = 1001
OTHER_CLAIMERS = [1002, 1003]
# The users reminded a minute before "opens in 3 minutes" opens.
REMINDED_USERS = [DEMO_USER_ID, *range(2001, 2021)]
SOON = timedelta(minutes=3)


class Command(BaseCommand):
    help = "Create demo coupons, claims, reminders and API accounts (idempotent); print the tokens."

    def add_arguments(self, parser):
        parser.add_argument(
            "--url", default="http://127.0.0.1:8000", help="the service's base URL, for examples"
        )
        parser.add_argument(
            "--reopen-soon",
            action="store_true",
            help="move 'Demo: opens in 3 minutes' to 3 minutes from now again, once it opened "
            "(its reminders move with it); without it a rerun moves nothing",
        )

    def handle(self, *args: Any, url: str, reopen_soon: bool, **options: Any) -> None:
        self.base_url = url.rstrip("/")
        self.reopen_soon = reopen_soon
        now = timezone.now()
        open_now = self._coupon(
            "Demo: open now",
            claim_opens_at=now - timedelta(hours=1),
            total_stock=100,
            per_user_limit=2,
            valid_for=timedelta(days=7),
        )
        soon = self._soon_coupon(now)
        self._coupon(
            "Demo: opens tomorrow",
            claim_opens_at=now + timedelta(days=1),
            total_stock=1000,
            expires_at=now + timedelta(days=30),
        )
        cancelled = self._coupon(
            "Demo: cancelled",
            claim_opens_at=now + timedelta(hours=2),
            total_stock=10,
            valid_for=timedelta(days=1),
        )
        services.coupon_cancel(coupon=cancelled)
        self._claims(open_now)
        self._reminders(soon, now)
        self._accounts()

    def _coupon(self, name: str, **fields: Any) -> Coupon:
        coupon = Coupon.objects.filter(name=name).order_by("pk").first()
        if coupon is None:
            coupon = services.coupon_create(name=name, **fields)
            self.stdout.write(f"created coupon #{coupon.pk} {name}")
        return coupon

    def _soon_coupon(self, now: datetime) -> Coupon:
        coupon = self._coupon(
            "Demo: opens in 3 minutes",
            claim_opens_at=now + SOON,
            total_stock=500,
            valid_for=timedelta(days=1),
            reminder_priority=Coupon.Priority.HIGH,
        )
        # Only when asked (`make run` runs this on every start, and an operator trying the demo
        # must find the coupon where it was): once it has opened (or its reminder is under way),
        # move it 3 minutes out again; its existing reminders move with it.
        if (
            self.reopen_soon
            and coupon.status == Coupon.Status.ACTIVE
            and coupon.claim_opens_at < now + SOON / 2
        ):
            coupon = services.coupon_update(coupon=coupon, claim_opens_at=now + SOON)
            self.stdout.write(f"moved coupon #{coupon.pk} to open at {coupon.claim_opens_at}")
        return coupon

    def _claims(self, coupon: Coupon) -> None:
        for user_id in [DEMO_USER_ID, *OTHER_CLAIMERS]:
            if UserCoupon.objects.filter(coupon=coupon, user_id=user_id).exists():
                continue
            try:
                services.coupon_claim(coupon_id=coupon.pk, user_id=user_id)
            except ClaimRefused as exc:  # someone cancelled it or used up its stock by hand
                self.stdout.write(f"user {user_id} could not claim coupon #{coupon.pk}: {exc.code}")
            else:
                self.stdout.write(f"user {user_id} claimed coupon #{coupon.pk}")

    def _reminders(self, coupon: Coupon, now: datetime) -> None:
        if coupon.status == Coupon.Status.CANCELLED:
            self.stdout.write(f"coupon #{coupon.pk} was cancelled: no reminders")
            return
        if coupon.claim_opens_at <= now:
            self.stdout.write(
                f"coupon #{coupon.pk} opened at {coupon.claim_opens_at:%H:%M:%S} UTC: no new "
                "reminders (`manage.py seed_demo --reopen-soon` moves it 3 minutes out)"
            )
            return
        created = sum(
            subscription_subscribe(user_id=user_id, coupon=coupon, now=now)[1]
            for user_id in REMINDED_USERS
        )
        # Said as it is: a reminder sent on an earlier run stays sent (exactly once).
        statuses = Counter(
            ReminderSubscription.objects.filter(
                coupon=coupon, user_id__in=REMINDED_USERS
            ).values_list("status", flat=True)
        )
        remind_at = coupon.claim_opens_at - coupon.reminder_lead
        parts = [
            f"{statuses[ReminderSubscription.Status.SCHEDULED]} scheduled for "
            f"{remind_at:%H:%M:%S} UTC"
        ]
        if statuses[ReminderSubscription.Status.SENT]:
            parts.append(f"{statuses[ReminderSubscription.Status.SENT]} sent on an earlier run")
        self.stdout.write(
            f"{len(REMINDED_USERS)} users follow coupon #{coupon.pk} ({created} new): "
            + ", ".join(parts)
        )

    def _accounts(self) -> None:
        _, service_token = accounts.account_ensure(username="demo-service", act_for_any_user=True)
        _, user_token = accounts.account_ensure(
            username=f"demo-user-{DEMO_USER_ID}", end_user_id=DEMO_USER_ID
        )
        self.stdout.write(
            self.style.SUCCESS(f"service account demo-service (any user): Token {service_token}")
        )
        self.stdout.write(
            self.style.SUCCESS(
                f"end-user account demo-user-{DEMO_USER_ID} (user {DEMO_USER_ID}): "
                f"Token {user_token}"
            )
        )
        self.stdout.write(
            f"try: curl -H 'Authorization: Token {user_token}' "
            f"{self.base_url}/api/users/{DEMO_USER_ID}/coupons/"
        )
