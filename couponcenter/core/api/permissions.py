"""Who may act for which end user.

- an account linked to a ``user_id`` (``Account.end_user_id``) acts only for that user;
- an account with ``couponcenter.act_for_any_user`` (a service account) acts for anyone;
- staff manage coupons and use the ops endpoints, and may act for anyone.
"""

from django.contrib.auth.models import AbstractBaseUser, AnonymousUser
from rest_framework.permissions import BasePermission
from rest_framework.request import Request
from rest_framework.views import APIView

from couponcenter.core.api.authentication import account_model


def account_end_user_id(*, user: AbstractBaseUser | AnonymousUser) -> int | None:
    """The end user an API caller is linked to (cached on the user object for the request)."""
    if not user.is_authenticated:
        return None
    cached = getattr(user, "_end_user_id_cache", ...)
    if cached is not ...:
        return cached
    end_user_id = (
        account_model()
        .objects.filter(user_id=user.pk)
        .values_list("end_user_id", flat=True)
        .first()
    )
    user._end_user_id_cache = end_user_id
    return end_user_id


def can_act_for(user: AbstractBaseUser | AnonymousUser | None, user_id: int) -> bool:
    if not user or not user.is_authenticated:
        return False
    if user.is_staff:
        return True
    # Answered by the token authentication's query when it ran; else ask the auth backends.
    act_for_any = getattr(user, "_act_for_any_user_cache", None)
    if act_for_any is None:
        act_for_any = user.has_perm("couponcenter.act_for_any_user")
    if act_for_any:
        return True
    return account_end_user_id(user=user) == user_id


class ActsForUser(BasePermission):
    """The URL's ``user_id`` must be one the caller may act for."""

    message = "You may not act for this user."

    def has_permission(self, request: Request, view: APIView) -> bool:
        try:
            user_id = int(view.kwargs["user_id"])
        except (KeyError, TypeError, ValueError):
            return False
        return can_act_for(request.user, user_id)


class CanManageCoupons(BasePermission):
    message = "Managing coupons needs staff or the manage_coupons permission."

    def has_permission(self, request: Request, view: APIView) -> bool:
        user = request.user
        return bool(
            user
            and user.is_authenticated
            and (user.is_staff or user.has_perm("couponcenter.manage_coupons"))
        )


class IsStaff(BasePermission):
    def has_permission(self, request: Request, view: APIView) -> bool:
        return bool(request.user and request.user.is_authenticated and request.user.is_staff)
