"""Who may act for which end user, and who may use the staff endpoints.

- an account linked to a ``user_id`` (``Account.end_user_id``) acts only for that user;
- an account with ``couponcenter.act_for_any_user`` (a service account) acts for anyone;
- a staff endpoint lets in staff holding the Django model permission of what it reads (view_)
  or writes (add_, change_, delete_, or the API's own permission), as the admin does.

Being staff grants nothing by itself; a superuser holds every permission.
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
    message = "Managing coupons needs the manage_coupons permission."

    def has_permission(self, request: Request, view: APIView) -> bool:
        user = request.user
        return bool(user and user.is_authenticated and user.has_perm("couponcenter.manage_coupons"))


def staff_permissions(**by_method: tuple[str, ...]) -> type[BasePermission]:
    """A permission class letting in staff who hold every permission ("app_label.codename")
    named for the request's method, e.g. ``staff_permissions(GET=(view,), PATCH=(view, change))``.
    HEAD and OPTIONS count as GET; a method the view handles but does not name is refused."""
    required = {method.upper(): tuple(perms) for method, perms in by_method.items()}

    class StaffPermissions(BasePermission):
        message = "This needs staff status and the permission for it: " + "; ".join(
            f"{method} {', '.join(perms)}" for method, perms in required.items()
        )

        def has_permission(self, request: Request, view: APIView) -> bool:
            user = request.user
            if not (user and user.is_authenticated and user.is_staff):
                return False
            method = "GET" if request.method in ("HEAD", "OPTIONS") else request.method
            if method not in required:
                # A method the view has no handler for is let through to its 405.
                return not hasattr(view, request.method.lower())
            return user.has_perms(required[method])

    return StaffPermissions
