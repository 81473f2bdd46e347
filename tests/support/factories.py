"""factory_boy factories shared by the tests."""

from datetime import timedelta

import factory
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.utils import timezone
from rest_framework.authtoken.models import Token

from couponcenter.models import Account, Coupon, UserCoupon
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


def api_user(*, end_user_id=None, staff=False, perms=()) -> tuple:
    """A Django user with a token; returns (user, token key)."""
    user = UserFactory(is_staff=staff)
    if end_user_id is not None:
        Account.objects.create(user=user, end_user_id=end_user_id)
    for codename in perms:
        app_label, code = codename.split(".")
        user.user_permissions.add(
            Permission.objects.get(content_type__app_label=app_label, codename=code)
        )
    token, _ = Token.objects.get_or_create(user=user)
    return user, token.key
