"""Token for username + password (throttled), the one API endpoint open to anonymous callers; and
a caller revoking its own token."""

from __future__ import annotations

from django.conf import settings
from drf_spectacular.utils import extend_schema, inline_serializer
from rest_framework import serializers, status
from rest_framework.authtoken.serializers import AuthTokenSerializer
from rest_framework.authtoken.views import ObtainAuthToken
from rest_framework.exceptions import Throttled, ValidationError
from rest_framework.permissions import AllowAny, IsAuthenticated
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.settings import api_settings
from rest_framework.throttling import ScopedRateThrottle
from rest_framework.views import APIView

from couponcenter.core.api.authentication import token_expires_at, token_issue, token_revoke
from couponcenter.core.api.errors import BAD_REQUEST, THROTTLED, error_responses


class TokenApi(ObtainAuthToken):
    # ObtainAuthToken sets its own parsers; the project's (SafeJSONParser) answer every malformed
    # body with a 400, a body nested too deeply included.
    parser_classes = api_settings.DEFAULT_PARSER_CLASSES
    authentication_classes = []
    permission_classes = [AllowAny]
    throttle_classes = [ScopedRateThrottle]
    throttle_scope = "token"

    @extend_schema(
        operation_id="auth_token",
        request=AuthTokenSerializer,
        responses={
            200: inline_serializer(
                "Token",
                fields={
                    "token": serializers.CharField(),
                    "expires_at": serializers.DateTimeField(
                        allow_null=True, help_text="When it stops working (null: never)."
                    ),
                },
            ),
            400: BAD_REQUEST,
            429: THROTTLED,
        },
        auth=[],
        description="Exchange a username and password for the API token "
        "(send it as `Authorization: Token <key>`): the one already handed out, or a new one "
        "when it expired. It stops working when it expires, when the password changes, when the "
        "user is deactivated or when it is revoked.",
    )
    def post(self, request: Request, *args, **kwargs) -> Response:
        serializer = self.get_serializer(data=request.data)
        if not serializer.is_valid():
            # django-axes refused the sign-in (too many failures for this username or address):
            # say so, as the admin's login page does, instead of "wrong credentials".
            if getattr(request, "axes_locked_out", False):
                minutes = int(settings.AXES_COOLOFF_TIME.total_seconds() // 60)
                raise Throttled(
                    detail=f"Too many failed sign-ins: locked out for {minutes} minutes."
                )
            raise ValidationError(serializer.errors)
        token = token_issue(user=serializer.validated_data["user"])
        return Response({"token": token.key, "expires_at": token_expires_at(token)})


class TokenRevokeApi(APIView):
    permission_classes = [IsAuthenticated]

    @extend_schema(
        operation_id="auth_token_revoke",
        request=None,
        responses={204: None, **error_responses()},
        description="Revoke the caller's own token: it gets a 401 from now on (signing in "
        "again hands out a new one).",
    )
    def post(self, request: Request) -> Response:
        token_revoke(user_id=request.user.pk)
        return Response(status=status.HTTP_204_NO_CONTENT)
