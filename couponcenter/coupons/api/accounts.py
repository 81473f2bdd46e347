"""``/api/accounts/``: staff with ``couponcenter.manage_accounts`` create API accounts and hand
out their tokens.

An end user's app signs in with an account linked to that user (``user_id``); a backend service
uses one with ``act_for_any_user``; a team calling the timeout center needs ``manage_timeouts``.
A caller hands out only the permissions it holds itself, and an existing account is changed (and
its token handed back) only when the request says ``update``.
"""

from __future__ import annotations

from django.contrib.auth import get_user_model
from drf_spectacular.utils import OpenApiExample, extend_schema
from rest_framework import serializers, status
from rest_framework.exceptions import NotFound
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from couponcenter.core.api.errors import conflict_serializer, error_responses
from couponcenter.core.api.permissions import staff_permissions
from couponcenter.coupons import accounts

MAX_USER_ID = 10**18 - 1


class AccountApi(APIView):
    permission_classes = [staff_permissions(POST=("couponcenter.manage_accounts",))]

    class InputSerializer(serializers.Serializer):
        class Meta:
            ref_name = "AccountInput"

        username = serializers.RegexField(
            r"^[\w.@+-]{1,150}$", help_text="Letters, digits and @ . + - _ (at most 150)."
        )
        user_id = serializers.IntegerField(
            required=False,
            allow_null=True,
            min_value=1,
            max_value=MAX_USER_ID,
            help_text="The end user this account acts for (an end user's app).",
        )
        permissions = serializers.ListField(
            child=serializers.ChoiceField(choices=sorted(accounts.ACCOUNT_PERMISSIONS)),
            required=False,
            default=list,
            max_length=len(accounts.ACCOUNT_PERMISSIONS),
            help_text="What else the account may do; the account has exactly these afterwards. "
            "Only permissions the caller holds itself.",
        )
        update = serializers.BooleanField(
            required=False,
            default=False,
            help_text="Change an existing account (link and permissions) and get its token back. "
            "Without it, an existing username is refused (409 account_exists).",
        )

        def validate(self, attrs: dict) -> dict:
            if attrs.get("user_id") and "act_for_any_user" in attrs["permissions"]:
                raise serializers.ValidationError(
                    {"permissions": ["An account linked to one user cannot act for any user."]}
                )
            return attrs

    class OutputSerializer(serializers.Serializer):
        class Meta:
            ref_name = "AccountOutput"

        id = serializers.IntegerField(help_text="The account's id: a timeout topic's `owner_user`.")
        username = serializers.CharField()
        user_id = serializers.IntegerField(allow_null=True)
        permissions = serializers.ListField(child=serializers.CharField())
        token = serializers.CharField(help_text="Send it as `Authorization: Token <token>`.")

    @extend_schema(
        operation_id="accounts_ensure",
        summary="Create an API account (or update one, when asked) and get its token",
        request=InputSerializer,
        responses={
            201: OutputSerializer,
            200: OutputSerializer,
            409: conflict_serializer("AccountConflict", ["not_an_api_account", "account_exists"]),
            **error_responses(400, 403),
        },
        description="Needs staff and the manage_accounts permission; the caller must hold every "
        "permission it asks for (403 otherwise). A username that exists is refused (409 "
        "`account_exists`) unless `update` is true: then the account keeps its token and gets "
        "the link and permissions asked for (200), and the caller must also hold every "
        "permission the account had. A username of staff or of a person who signs in with a "
        "password is refused (409 `not_an_api_account`).",
        examples=[
            OpenApiExample(
                "An end user's app",
                value={"username": "app-4242", "user_id": 4242},
                request_only=True,
            ),
            OpenApiExample(
                "A team's service",
                request_only=True,
                value={"username": "orders-svc", "permissions": ["manage_timeouts"]},
            ),
        ],
    )
    def post(self, request: Request) -> Response:
        body = self.InputSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        v = body.validated_data
        user, token, created = accounts.account_provision(
            username=v["username"],
            end_user_id=v.get("user_id"),
            permissions=tuple(v["permissions"]),
            api_only=True,
            update=v["update"],
            granted_by=request.user,
        )
        out = {
            "id": user.pk,
            "username": user.username,
            "user_id": v.get("user_id"),
            "permissions": accounts.account_permissions(user),
            "token": token,
        }
        code = status.HTTP_201_CREATED if created else status.HTTP_200_OK
        return Response(self.OutputSerializer(out).data, status=code)


class AccountTokenRevokeApi(APIView):
    # Revoking a token needs what handing one out needs.
    permission_classes = AccountApi.permission_classes

    class InputSerializer(serializers.Serializer):
        class Meta:
            ref_name = "AccountTokenRevokeInput"

        username = serializers.CharField(
            max_length=150,
            validators=[get_user_model().username_validator],
            help_text="The user whose token is revoked.",
        )

    @extend_schema(
        operation_id="accounts_token_revoke",
        summary="Revoke a user's API token",
        request=InputSerializer,
        responses={204: None, **error_responses(400, 403, 404)},
        description="The user's token gets a 401 from now on (in every process within "
        "`AUTH_TOKEN_CACHE_SECONDS`). An API account gets a new one from `POST /api/accounts/` "
        "(with `update`), a person by signing in again. A user without a token: 204 all the "
        "same.",
    )
    def post(self, request: Request) -> Response:
        body = self.InputSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        try:
            accounts.account_token_revoke(username=body.validated_data["username"])
        except get_user_model().DoesNotExist:
            raise NotFound("No such user.") from None
        return Response(status=status.HTTP_204_NO_CONTENT)
