"""API accounts: users that call the API with a token only (no usable password), linked to one end
user or granted ``ACCOUNT_PERMISSIONS``. Staff make them through ``/api/accounts/``, operators with
``create_api_account``.

A caller (``granted_by``) hands out only the permissions it holds itself, and gets an existing
account's token back only when it holds everything that token gives: the account's permissions,
and the groups it is in.
"""

from __future__ import annotations

from django.contrib.auth import get_user_model
from django.contrib.auth.models import AbstractBaseUser, Permission
from django.core.exceptions import PermissionDenied
from django.db import transaction

from couponcenter.core.api.authentication import token_issue, token_revoke
from couponcenter.core.errors import BusinessError

from .models import Account

# What an API account may be granted besides its link: (app label, codename).
ACCOUNT_PERMISSIONS = {
    "act_for_any_user": ("couponcenter", "act_for_any_user"),
    "manage_coupons": ("couponcenter", "manage_coupons"),
    "manage_timeouts": ("reminders", "manage_timeouts"),
}


class AccountRefused(BusinessError):
    """Codes: ``not_an_api_account`` (the username is a person's sign-in or staff);
    ``account_exists`` (the username is taken and the caller did not ask to update it)."""


def account_ensure(
    *,
    username: str,
    end_user_id: int | None = None,
    act_for_any_user: bool = False,
    permissions: tuple[str, ...] | None = None,
) -> tuple[AbstractBaseUser, str]:
    """An API caller that signs in by token only (no usable password); returns (user, token).

    Idempotent: an existing account keeps its token (a new one once it expired) and gets the link
    and permission asked for.
    ``permissions``: names from ``ACCOUNT_PERMISSIONS`` the account has afterwards (the others
    are taken away); None leaves all but ``act_for_any_user`` as they are.
    """
    user, token, _ = account_provision(
        username=username,
        end_user_id=end_user_id,
        act_for_any_user=act_for_any_user,
        permissions=permissions,
    )
    return user, token


def account_provision(
    *,
    username: str,
    end_user_id: int | None = None,
    act_for_any_user: bool = False,
    permissions: tuple[str, ...] | None = None,
    api_only: bool = False,
    update: bool = True,
    granted_by: AbstractBaseUser | None = None,
) -> tuple[AbstractBaseUser, str, bool]:
    """``account_ensure``, also saying whether the account is new. ``api_only``: refuse
    (``AccountRefused``) a username that belongs to staff or to a person who signs in with a
    password, so the staff API cannot re-purpose a human's login. ``update=False``: refuse an
    existing username (``account_exists``): its token is handed back and its link and
    permissions replaced only when asked for. ``granted_by``: the caller must hold each
    ``ACCOUNT_PERMISSIONS`` entry the account gets, or has when it is updated (whose token it
    gets back), else ``PermissionDenied``. A refusal changes nothing."""
    wanted = set(permissions or ()) | ({"act_for_any_user"} if act_for_any_user else set())
    unknown = wanted - set(ACCOUNT_PERMISSIONS)
    if unknown:
        raise ValueError(f"unknown account permissions: {sorted(unknown)}")
    managed = set(ACCOUNT_PERMISSIONS) if permissions is not None else {"act_for_any_user"}
    with transaction.atomic():
        user, created = (
            get_user_model().objects.select_for_update().get_or_create(username=username)
        )
        if (
            not created
            and api_only
            and (user.is_staff or user.is_superuser or user.has_usable_password())
        ):
            raise AccountRefused(
                "not_an_api_account",
                f"{username!r} is a person's sign-in or staff, not an API account.",
            )
        if not created and not update:
            raise AccountRefused(
                "account_exists",
                f"{username!r} exists: send update: true to change it and get its token.",
            )
        if granted_by is not None:
            held = set() if created else _account_rights(user, granted_by=granted_by)
            _account_grant_check(granted_by=granted_by, names=wanted | held)
        if created:
            user.set_unusable_password()
            user.save(update_fields=["password"])
        Account.objects.update_or_create(user=user, defaults={"end_user_id": end_user_id})
        for name in managed:
            app_label, codename = ACCOUNT_PERMISSIONS[name]
            permission = Permission.objects.get(
                content_type__app_label=app_label, codename=codename
            )
            if name in wanted:
                user.user_permissions.add(permission)
            else:
                user.user_permissions.remove(permission)
        token = token_issue(user=user)
    return user, token.key, created


def account_token_revoke(*, username: str) -> int:
    """Revokes the token of the user ``username`` (``DoesNotExist`` if there is none); returns
    how many were deleted (0: it had none). An API account gets a new token from
    ``account_provision``, a person by signing in."""
    user = get_user_model().objects.get(username=username)
    return token_revoke(user_id=user.pk)


def _account_rights(user: AbstractBaseUser, *, granted_by: AbstractBaseUser) -> set[str]:
    """What handing ``user``'s token to ``granted_by`` would give: its ``ACCOUNT_PERMISSIONS``,
    directly or through a group; and a group's own rights (the topics it owns), so an account in
    a group its maker is not in is ``PermissionDenied`` outright."""
    outside = set(user.groups.values_list("name", flat=True)) - set(
        granted_by.groups.values_list("name", flat=True)
    )
    if outside and not granted_by.is_superuser:
        raise PermissionDenied(
            f"This account belongs to groups you are not in ({sorted(outside)}): its token would "
            "give you what they may do."
        )
    return {name for name, key in ACCOUNT_PERMISSIONS.items() if user.has_perm(".".join(key))}


def _account_grant_check(*, granted_by: AbstractBaseUser, names: set[str]) -> None:
    # Handing out a token with a permission its maker lacks would be a way to gain it.
    missing = sorted(
        name for name in names if not granted_by.has_perm(".".join(ACCOUNT_PERMISSIONS[name]))
    )
    if missing:
        raise PermissionDenied(
            f"You may only hand out permissions you hold yourself; you lack: {missing}"
        )


def account_permissions(user: AbstractBaseUser) -> list[str]:
    """The ``ACCOUNT_PERMISSIONS`` names ``user`` holds directly."""
    held = set(user.user_permissions.values_list("content_type__app_label", "codename"))
    return sorted(name for name, key in ACCOUNT_PERMISSIONS.items() if key in held)
