"""Token authentication that also answers the permission questions of the request, in one query.

Every API call asks who the caller is and whom it may act for: with DRF's ``TokenAuthentication``
and Django's ``has_perm`` that is three queries (token + user, user permissions, group
permissions) plus one for the linked end user, and on the claim endpoint those are most of the
request's cost. Here one query reads the token's user, whether it holds
``couponcenter.act_for_any_user`` (directly or through a group) and its linked end user id; the
answers stay on the user object for ``permissions.can_act_for`` and ``account_end_user_id``.
The SQL is raw because the ORM spends longer compiling that query than the database running it.

The answer is then kept in the process for ``AUTH_TOKEN_CACHE_SECONDS`` (a copy of the user per
request), so a service account claiming thousands of times a second costs one query per process
and interval, not one per claim; a deleted token, a deactivated user or a changed permission takes
effect within that interval (at once in the process that revoked the token: ``token_revoke``
empties its cache).

A token's life: ``token_issue`` hands out the user's token (a new one when it has none or its
one expired); it expires ``API_TOKEN_LIFETIME`` after it was made (None: never), checked on every
request, cached or not; ``token_revoke`` deletes it, and so does a change of the user's password
or its deactivation (``revoke_tokens_on_credential_change``, a ``pre_save`` receiver of the user
model), so a reactivated user or an old password does not bring an old token back. A revoked or
expired token gets a 401.
"""

from __future__ import annotations

from datetime import datetime
from functools import cache
from typing import Any

from django.apps import apps
from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import AbstractBaseUser, Group, Permission
from django.contrib.contenttypes.models import ContentType
from django.db import connection, transaction
from django.utils import timezone
from rest_framework import authentication, exceptions
from rest_framework.authtoken.models import Token

from couponcenter.core.caching import TTLCache
from couponcenter.core.db.times import aware_time

ACT_FOR_ANY_USER = ("couponcenter", "act_for_any_user")
# key -> (user, token); the TTL is read at each lookup so a test or an operator may change it.
_cached: TTLCache[str, tuple[object, Token]] = TTLCache(lambda: settings.AUTH_TOKEN_CACHE_SECONDS)


def account_model():
    """The model linking an API account to its end user (``settings.API_ACCOUNT_MODEL``, as
    Django's ``AUTH_USER_MODEL``): the kernel authenticates callers without importing the domain."""
    return apps.get_model(settings.API_ACCOUNT_MODEL)


def token_cache_clear() -> None:
    _cached.clear()


def token_expires_at(token: Token) -> datetime | None:
    """When ``token`` stops working (None: ``API_TOKEN_LIFETIME`` is off, it never does)."""
    lifetime = settings.API_TOKEN_LIFETIME
    return None if lifetime is None else token.created + lifetime


def token_expired(token: Token, *, now: datetime | None = None) -> bool:
    expires_at = token_expires_at(token)
    return expires_at is not None and expires_at <= (now or timezone.now())


def token_issue(*, user: AbstractBaseUser) -> Token:
    """The token ``user`` signs in with: its current one, or a new one if it has none or its one
    expired (two callers at once get the same new token: the user has one token at most)."""
    token, _ = Token.objects.get_or_create(user=user)
    if not token_expired(token):
        return token
    Token.objects.filter(key=token.key).delete()
    token, _ = Token.objects.get_or_create(user=user)
    return token


def token_revoke(*, user_id: int) -> int:
    """Deletes the tokens of user ``user_id``; returns how many. This process stops trusting its
    cached callers now and again at the commit (a request between the two could cache the row the
    transaction is deleting); the others within ``AUTH_TOKEN_CACHE_SECONDS``."""
    deleted, _ = Token.objects.filter(user_id=user_id).delete()
    token_cache_clear()
    transaction.on_commit(token_cache_clear)
    return deleted


# A save touching none of these cannot change the user's credentials (a sign-in saves only
# ``last_login``): no query for it.
_CREDENTIAL_FIELDS = frozenset({"password", "is_active"})


def token_revoke_on_credential_change(*, user: AbstractBaseUser, fields: Any = None) -> bool:
    """Revokes the tokens of ``user`` (about to be saved; ``fields``: the save's
    ``update_fields``) if its stored password changes or it is deactivated. Any new password
    hash counts, a re-hash at sign-in under a raised hasher cost included: a token too many
    revoked is the safe side. Returns whether it revoked."""
    if user.pk is None or (fields is not None and not _CREDENTIAL_FIELDS & set(fields)):
        return False
    stored = (
        type(user)._default_manager.filter(pk=user.pk).values_list("password", "is_active").first()
    )
    if stored is None:
        return False
    password, active = stored
    if user.password == password and (user.is_active or not active):
        return False
    token_revoke(user_id=user.pk)
    return True


def revoke_tokens_on_credential_change(
    sender: type,
    instance: AbstractBaseUser,
    raw: bool = False,
    update_fields: Any = None,
    **kwargs: Any,
) -> None:
    """``pre_save`` receiver of the user model (connected in ``CouponCenterConfig.ready``)."""
    if not raw:  # a fixture being loaded is no change of credentials
        token_revoke_on_credential_change(user=instance, fields=update_fields)


def _model_copy(instance: Any) -> Any:
    """``copy.copy(instance)`` for a model instance, without the generic copy protocol's
    reduce-and-rebuild (a tenth of a claim request's CPU): its own ``__dict__`` and ``_state``."""
    clone = object.__new__(type(instance))
    clone.__dict__.update(instance.__getstate__())
    return clone


@cache
def _user_sql(vendor: str) -> str:
    q = connection.ops.quote_name
    user = get_user_model()
    name = user._meta.model_name
    user_perms = user.user_permissions.through._meta
    user_groups = user.groups.through._meta
    group_perms = Group.permissions.through._meta

    def col(meta, field: str) -> str:
        return q(meta.get_field(field).column)

    perm_match = (
        f"JOIN {q(Permission._meta.db_table)} p ON p.id = {{link}} "
        f"JOIN {q(ContentType._meta.db_table)} ct ON ct.id = p.content_type_id "
        "WHERE p.codename = %(codename)s AND ct.app_label = %(app_label)s"
    )
    direct = (
        f"SELECT 1 FROM {q(user_perms.db_table)} up "
        + perm_match.format(link=f"up.{col(user_perms, 'permission')}")
        + f" AND up.{col(user_perms, name)} = u.id"
    )
    via_group = (
        f"SELECT 1 FROM {q(user_groups.db_table)} ug JOIN {q(group_perms.db_table)} gp "
        f"ON gp.{col(group_perms, 'group')} = ug.{col(user_groups, 'group')} "
        + perm_match.format(link=f"gp.{col(group_perms, 'permission')}")
        + f" AND ug.{col(user_groups, name)} = u.id"
    )
    account = account_model()._meta
    return (
        f"SELECT u.*, (EXISTS ({direct}) OR EXISTS ({via_group})) AS cc_act_for_any, "
        f"(SELECT a.{col(account, 'end_user_id')} FROM {q(account.db_table)} a "
        f"WHERE a.{col(account, 'user')} = u.id) AS cc_end_user, t.created AS cc_token_created "
        f"FROM {q(user._meta.db_table)} u JOIN {q(Token._meta.db_table)} t "
        f"ON t.{col(Token._meta, 'user')} = u.id WHERE t.{q('key')} = %(key)s"
    )


class TokenAuthentication(authentication.TokenAuthentication):
    def authenticate_credentials(self, key: str):
        user, created = self.caller(key)
        token = Token(key=key, user=user, created=created)
        token._state.adding = False
        return user, token

    def caller(self, key: str) -> tuple[Any, datetime]:
        """The user ``key`` authenticates and when its token was made: what
        ``authenticate_credentials`` answers, without building the ``Token`` (a path that sets
        no ``request.auth``, as the lean claim, needs none). Raises ``AuthenticationFailed``."""
        if settings.AUTH_TOKEN_CACHE_SECONDS <= 0:
            user, token = self._lookup(key)
        else:
            cached_user, token = _cached.get(key, lambda: self._lookup(key))
            # A copy per request: a view may set attributes on request.user.
            user = _model_copy(cached_user)
        if token_expired(token):
            raise exceptions.AuthenticationFailed(
                "Token expired: sign in again (an API account: ask staff) for a new one."
            )
        return user, token.created

    def _lookup(self, key: str):
        params = {"key": key, "app_label": ACT_FOR_ANY_USER[0], "codename": ACT_FOR_ANY_USER[1]}
        users = list(get_user_model().objects.raw(_user_sql(connection.vendor), params))
        if not users:
            raise exceptions.AuthenticationFailed("Invalid token.")
        user = users[0]
        if not user.is_active:
            raise exceptions.AuthenticationFailed("User inactive or deleted.")
        user._act_for_any_user_cache = bool(user.is_superuser or user.cc_act_for_any)
        user._end_user_id_cache = user.cc_end_user
        # Read by the raw column above: SQLite answers a naive time (or its text).
        token = Token(key=key, user=user, created=aware_time(user.cc_token_created))
        token._state.adding = False
        return user, token
