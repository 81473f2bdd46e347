"""factory_boy factories shared by the tests."""

from datetime import timedelta

import factory
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.utils import timezone
from rest_framework.authtoken.models import Token

from couponcenter.coupons.models import Account, Coupon, UserCoupon
from expiry.models import ExpiryTask


class CouponFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Coupon

    name = factory.Sequence(lambda n: f"Coupon {n}")
    claim_opens_at = factory.LazyFunction(lambda: timezone.now() - timedelta(minutes=1))
    total_stock = 1000
    per_user_limit = 1
    valid_for = timedelta(days=7)


class UserCouponFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = UserCoupon

    coupon = factory.SubFactory(CouponFactory)
    user_id = factory.Sequence(lambda n: 10_000 + n)
    claimed_at = factory.LazyFunction(timezone.now)
    expires_at = factory.LazyAttribute(lambda o: o.claimed_at + timedelta(days=7))


class ExpiryTaskFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = ExpiryTask

    user_coupon = factory.SubFactory(UserCouponFactory)
    expire_at = factory.LazyAttribute(lambda o: o.user_coupon.expires_at)


class UserFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = get_user_model()
        skip_postgeneration_save = True

    username = factory.Sequence(lambda n: f"user{n}")
    password = factory.django.Password("correct-horse-battery")


PROJECT_APPS = ("couponcenter", "reminders", "expiry")


def project_permissions(*, view_only: bool = False) -> list[str]:
    """Every permission of the project's apps ("app_label.codename"), or their view_ ones."""
    found = Permission.objects.filter(content_type__app_label__in=PROJECT_APPS)
    if view_only:
        found = found.filter(codename__startswith="view_")
    return [
        f"{p.content_type.app_label}.{p.codename}" for p in found.select_related("content_type")
    ]


def api_user(*, end_user_id=None, staff=False, perms=(), staff_perms="all") -> tuple:
    """A Django user with a token; returns (user, token key).

    ``staff``: a staff user who also holds ``staff_perms``, since every staff endpoint checks the
    model permission of what it touches: ``"all"`` the permissions of the project's apps (an
    operator who may do everything), ``"view"`` only their view_ ones, or a list (``()``: a bare
    staff user, who may do nothing).
    """
    user = UserFactory(is_staff=staff)
    if end_user_id is not None:
        Account.objects.create(user=user, end_user_id=end_user_id)
    if staff and isinstance(staff_perms, str):
        staff_perms = project_permissions(view_only=staff_perms == "view")
    for codename in (*perms, *(staff_perms if staff else ())):
        app_label, code = codename.split(".")
        user.user_permissions.add(
            Permission.objects.get(content_type__app_label=app_label, codename=code)
        )
    token, _ = Token.objects.get_or_create(user=user)
    return user, token.key
