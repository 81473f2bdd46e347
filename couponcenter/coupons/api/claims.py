"""A user's coupons: claim, list, redeem. The caller must be allowed to act for ``user_id``.

The claim (``POST /api/users/{id}/coupons/``) is the hot endpoint of a sale, so it has a lean
path (``UserCouponListApi.claim_lean``): for the common request (a valid ``Token`` header, a small
``application/json`` body ``{"coupon": <int>}``, ``Accept`` absent, ``*/*`` or JSON, no query
string) it authenticates, checks the permission, throttles and claims without DRF's per-request
machinery (request wrapper, content negotiation, serializers), which cost more CPU than the claim
itself. Every other request, and every request the lean path would refuse before claiming, goes
through DRF, so all error answers (400 / 401 / 403 / 404 / 405 / 415 / 429) are DRF's
own; the lean path itself only answers 201, 404 (unknown coupon) and 409 (and with an
``Idempotency-Key``, 422), built the same way.

Both paths honour an ``Idempotency-Key`` header (``idempotency.py``): a retried claim gets its
first answer again. A request without one makes no Redis call for it.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any

from django.http import HttpRequest, HttpResponse, HttpResponseBase
from django.utils import timezone
from django.utils.cache import patch_vary_headers
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import exceptions, serializers, status
from rest_framework.exceptions import NotFound, ValidationError
from rest_framework.renderers import JSONRenderer
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.throttling import BaseThrottle
from rest_framework.views import APIView

from couponcenter.core.api.authentication import TokenAuthentication
from couponcenter.core.api.errors import (
    business_error_body,
    conflict_serializer,
    error_responses,
    exception_handler,
)
from couponcenter.core.api.pagination import Pagination, paginated_response
from couponcenter.core.api.permissions import ActsForUser, can_act_for
from couponcenter.core.api.schema import USER_COUPON_ID, USER_ID
from couponcenter.core.api.throttling import BatchedFixedWindowScopedThrottle
from couponcenter.core.errors import BusinessError
from couponcenter.coupons import claiming, selectors, services
from couponcenter.coupons.api import idempotency
from couponcenter.coupons.claim_latency import claim_latency
from couponcenter.coupons.models import IDEMPOTENCY_KEY_MAX_LENGTH, Coupon, UserCoupon
from couponcenter.coupons.rules import ClaimRefused

CLAIM_REFUSALS = ["sold_out", "limit_reached", "not_open", "closed", "cancelled"]
IDEMPOTENCY_KEY = OpenApiParameter(
    idempotency.HEADER,
    {
        "type": "string",
        "minLength": 1,
        "maxLength": IDEMPOTENCY_KEY_MAX_LENGTH,
        "pattern": "^[ -~]+$",
    },
    OpenApiParameter.HEADER,
    description="Makes a retry safe: a claim sent again with the same key (same caller and "
    "user) is not claimed again; it gets the first answer (201 or 409) again, with "
    "`Idempotent-Replayed: true` (kept 24 hours by default; a 201 is found again after that "
    "too). The same key with another coupon is a 422. 1 to 255 printable ASCII characters; a "
    "UUID is a good key.",
)
REDEEM_REFUSALS = ["expired", "already_used"]


class UserCouponOutputSerializer(serializers.Serializer):
    # Declared, not a ModelSerializer: building a ModelSerializer's fields from the model costs
    # more than the rest of a claim request.
    id = serializers.IntegerField(read_only=True)
    coupon = serializers.IntegerField(source="coupon_id", read_only=True)
    coupon_name = serializers.CharField(source="coupon.name", read_only=True)
    user_id = serializers.IntegerField(read_only=True)
    status = serializers.ChoiceField(choices=UserCoupon.Status.choices, read_only=True)
    claimed_at = serializers.DateTimeField(read_only=True)
    expires_at = serializers.DateTimeField(read_only=True)
    used_at = serializers.DateTimeField(read_only=True, allow_null=True)


_datetime = serializers.DateTimeField(read_only=True)
_status = serializers.ChoiceField(choices=UserCoupon.Status.choices, read_only=True)


def user_coupon_data(user_coupon: UserCoupon) -> dict[str, Any]:
    """``UserCouponOutputSerializer(user_coupon).data``, without building a serializer's fields
    per call (the serializer deep-copies its declared fields for every instance)."""
    used_at = user_coupon.used_at
    return {
        "id": user_coupon.id,
        "coupon": user_coupon.coupon_id,
        "coupon_name": user_coupon.coupon.name,
        "user_id": user_coupon.user_id,
        "status": _status.to_representation(user_coupon.status),
        "claimed_at": _datetime.to_representation(user_coupon.claimed_at),
        "expires_at": _datetime.to_representation(user_coupon.expires_at),
        "used_at": None if used_at is None else _datetime.to_representation(used_at),
    }


# What the lean claim path takes; anything else goes through DRF.
_LEAN_ACCEPT = {None, "*/*", "application/json"}
_LEAN_MAX_BODY = 1024
_MAX_ID = 2**63 - 1
_json_renderer = JSONRenderer()
_request_log = logging.getLogger("django.request")
_token_authentication = TokenAuthentication()


# A rush answers the same few refusals (sold out; not open, until the same moment) to most of its
# users, so each distinct body is rendered once; bounded, as the bodies of past moments pile up.
_REFUSALS_RENDERED_MAX = 256
_refusals_rendered: dict[tuple, bytes] = {}


def _refusal_rendered(body: dict[str, Any]) -> bytes:
    """``body`` as ``_json_renderer`` renders it, from the cache when it was rendered before."""
    try:
        key = tuple(body.items())
        return _refusals_rendered[key]
    except KeyError:
        pass
    except TypeError:  # a value that is no key (a list): rendered every time
        return _json_renderer.render(body)
    if len(_refusals_rendered) >= _REFUSALS_RENDERED_MAX:
        _refusals_rendered.clear()
    rendered = _refusals_rendered[key] = _json_renderer.render(body)
    return rendered


def _no_constants(name: str) -> None:
    raise ValueError(name)  # NaN / Infinity: DRF's strict JSON parser refuses them too


def _claim(*, coupon_id: int, user_id: int, idempotency_key: str | None) -> Response:
    """The claim itself, for both paths: 201 with the user coupon, or the refusal raised.

    ``idempotency_key`` (as the column stores it): the user coupon an earlier claim with it made
    is answered again, whether the claim's insert ran into it or a ``limit_reached`` refusal
    stands in front of it.
    """
    now = timezone.now()
    try:
        user_coupon = claiming.coupon_claim_gated(
            coupon_id=coupon_id, user_id=user_id, now=now, idempotency_key=idempotency_key
        )
    except Coupon.DoesNotExist:
        raise NotFound(f"No coupon with id {coupon_id}.") from None
    except ClaimRefused as refusal:
        if idempotency_key is None or refusal.code != "limit_reached":
            raise
        user_coupon = selectors.user_coupon_with_idempotency_key(
            coupon_id=coupon_id, user_id=user_id, idempotency_key=idempotency_key
        )
        if user_coupon is None:
            raise
    response = Response(user_coupon_data(user_coupon), status=status.HTTP_201_CREATED)
    return idempotency.replayed(response) if user_coupon.claimed_at != now else response


class UserCouponListApi(APIView):
    permission_classes = [ActsForUser]
    pagination_class = Pagination
    _view_headers_kept: tuple[str | None, dict[str, str]] | None = None  # see _view_headers

    class FilterSerializer(serializers.Serializer):
        status = serializers.ChoiceField(choices=UserCoupon.Status.choices, required=False)

    class ClaimInputSerializer(serializers.Serializer):
        coupon = serializers.IntegerField(min_value=1, max_value=2**63 - 1)

    def get_throttles(self) -> list[BaseThrottle]:
        if self.request.method == "POST":
            self.throttle_scope = "claim"
            return [BatchedFixedWindowScopedThrottle()]
        return super().get_throttles()

    def check_throttles(self, request: Request) -> None:
        # The lean path counted this request already and found it over the rate.
        wait = getattr(request._request, "_claim_throttled_wait", None)
        if wait is not None:
            self.throttled(request, wait if wait >= 0 else None)
        super().check_throttles(request)

    def dispatch(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponseBase:
        if request.method == "POST":
            response = self.claim_lean(request, kwargs["user_id"])
            if response is not None:
                return response
        return super().dispatch(request, *args, **kwargs)

    def claim_lean(self, request: HttpRequest, user_id: int) -> HttpResponse | None:
        """The claim without DRF's request handling; None: not a request it takes (before any
        side effect), DRF answers it."""
        meta = request.META
        if (
            meta.get("CONTENT_TYPE") != "application/json"
            or meta.get("HTTP_ACCEPT") not in _LEAN_ACCEPT
            or meta.get("QUERY_STRING")
            or not meta.get("HTTP_AUTHORIZATION", "").startswith("Token ")
        ):
            return None
        try:
            if not 0 < int(meta.get("CONTENT_LENGTH") or 0) <= _LEAN_MAX_BODY:
                return None
            # As DRF's parser reads it: UTF-8 (a BOM or another encoding fails here, and DRF says
            # why), no NaN or Infinity.
            data = json.loads(request.body.decode(), parse_constant=_no_constants)
            # The header as DRF's TokenAuthentication reads it; any other form DRF answers.
            credentials = meta["HTTP_AUTHORIZATION"].split()
            if len(credentials) != 2 or not credentials[1].isascii():
                return None
            user, _ = _token_authentication.caller(credentials[1])
        except (ValueError, exceptions.APIException):
            return None
        coupon_id = data.get("coupon") if type(data) is dict else None
        if type(coupon_id) is not int or not 1 <= coupon_id <= _MAX_ID:
            return None
        key = meta.get(idempotency.META_NAME)
        if key is not None and not idempotency.key_is_valid(key):
            return None
        request.user = user
        if not user.is_active or not can_act_for(user, user_id):
            return None
        self.request, self.throttle_scope = request, "claim"
        throttle = BatchedFixedWindowScopedThrottle()
        if not throttle.allow_request(request, self):
            wait = throttle.wait()
            request._claim_throttled_wait = -1 if wait is None else wait
            return None
        return self._claim_answer(request, coupon_id=coupon_id, user_id=user_id, key=key, lean=True)

    def _claim_answer(
        self,
        request: HttpRequest | Request,
        *,
        coupon_id: int,
        user_id: int,
        key: str | None,
        lean: bool,
    ) -> HttpResponseBase:
        """The claim's answer, a refusal included; with a key, answered once per key. ``lean``:
        rendered as the lean path renders (``_lean_json``), and a refusal without a key (most
        answers of a rush) straight from its body, without building DRF's ``Response`` first."""
        started = time.perf_counter()
        caller_id = request.user.pk
        column_key = None if key is None else idempotency.column_value(caller_id=caller_id, key=key)

        def claim() -> Response:
            try:
                return _claim(coupon_id=coupon_id, user_id=user_id, idempotency_key=column_key)
            except Exception as exc:  # noqa: BLE001 - answered by the API's handler, or re-raised
                if lean and key is None and isinstance(exc, BusinessError):
                    raise
                response = exception_handler(exc, {"view": self, "request": request})
                if response is None:
                    raise
                return response

        try:
            if key is None:
                try:
                    response = claim()
                except BusinessError as refusal:  # the lean path's, re-raised above
                    body = business_error_body(refusal)
                    return self._lean_json(
                        body, status.HTTP_409_CONFLICT, content=_refusal_rendered(body)
                    )
            else:
                response = idempotency.answer_once(
                    caller_id=caller_id, user_id=user_id, coupon_id=coupon_id, key=key, claim=claim
                )
            return self._lean_response(response) if lean else response
        finally:  # the claims' urgency reading (docs/operations.md)
            claim_latency.observe((time.perf_counter() - started) * 1000)

    def _lean_response(self, response: Response) -> HttpResponse:
        """``response`` as DRF's ``finalize_response`` and ``render`` would leave it: see
        ``_lean_json``. ``data`` is kept on it, as on DRF's."""
        headers = [(k, v) for k, v in response.items() if k != "Content-Type"]
        return self._lean_json(response.data, response.status_code, headers)

    def _lean_json(
        self,
        data: Any,
        status_code: int,
        headers: list[tuple[str, str]] | tuple = (),
        *,
        content: bytes | None = None,
    ) -> HttpResponse:
        """An answer of the lean path as DRF would render it (JSON, the view's ``Allow`` and
        ``Vary`` headers), as a plain ``HttpResponse``: Django's handling of a template response
        costs more than the render itself. ``headers``: the answer's own, set first; ``content``:
        ``data`` rendered already."""
        rendered = HttpResponse(
            _json_renderer.render(data) if content is None else content,
            status=status_code,
            content_type=_json_renderer.media_type,
        )
        rendered.data = data
        for key, value in headers:
            rendered[key] = value
        if status_code == 409 and not _request_log.isEnabledFor(logging.DEBUG):
            # The log line Django would make of an expected refusal (ExpectedConflict moves it to
            # DEBUG) costs a log record per refused claim of a rush, and nothing would print it.
            rendered._has_been_logged = True
        vary, view_headers = self._view_headers()
        if vary is not None:
            patch_vary_headers(rendered, [vary])
        for key, value in view_headers.items():
            rendered[key] = value
        return rendered

    @classmethod
    def _view_headers(cls) -> tuple[str | None, dict[str, str]]:
        """The view's ``Vary`` and its other headers (``Allow``), as DRF's ``finalize_response``
        adds them: the same for every answer, so worked out once, from a view set up as
        ``as_view`` sets each one up (``HEAD`` is allowed where ``GET`` is)."""
        kept = cls._view_headers_kept
        if kept is None:
            view = cls()
            view.setup(HttpRequest())
            headers = view.default_response_headers
            kept = cls._view_headers_kept = (headers.pop("Vary", None), headers)
        return kept

    @extend_schema(
        operation_id="users_coupons_list",
        parameters=[USER_ID, OpenApiParameter("status", str, enum=UserCoupon.Status.values)],
        responses={200: UserCouponOutputSerializer(many=True), **error_responses(400, 403, 404)},
        description="The coupons a user claimed, newest first.",
    )
    def get(self, request: Request, user_id: int) -> Response:
        filters = self.FilterSerializer(data=request.query_params)
        filters.is_valid(raise_exception=True)
        return paginated_response(
            queryset=selectors.user_coupon_list(user_id=user_id, **filters.validated_data),
            serializer_class=UserCouponOutputSerializer,
            request=request,
            view=self,
        )

    @extend_schema(
        operation_id="users_coupons_claim",
        parameters=[USER_ID, IDEMPOTENCY_KEY],
        request=ClaimInputSerializer,
        responses={
            201: UserCouponOutputSerializer,
            409: conflict_serializer(
                "ClaimConflict",
                [*CLAIM_REFUSALS, idempotency.IN_USE],
                opens_at=serializers.DateTimeField(required=False, help_text="With `not_open`."),
                closed_at=serializers.DateTimeField(required=False, help_text="With `closed`."),
            ),
            422: OpenApiResponse(
                conflict_serializer("ClaimKeyReused", [idempotency.REUSED]),
                description="The `Idempotency-Key` was sent before with another coupon.",
            ),
            **error_responses(400, 403, 404, 429),
        },
        description="Claim a coupon for the user. 409 codes: "
        + ", ".join(CLAIM_REFUSALS)
        + f"; `{idempotency.IN_USE}`: a claim with the same `Idempotency-Key` is still running "
        "(retry after `Retry-After`). A replayed answer carries `Idempotent-Replayed: true`.",
    )
    def post(self, request: Request, user_id: int) -> Response:
        data = self.ClaimInputSerializer(data=request.data)
        errors = {} if data.is_valid() else dict(data.errors)
        key = request.META.get(idempotency.META_NAME)
        if key is not None and not idempotency.key_is_valid(key):
            errors[idempotency.HEADER] = [idempotency.KEY_ERROR]
        if errors:
            raise ValidationError(errors)
        return self._claim_answer(
            request, coupon_id=data.validated_data["coupon"], user_id=user_id, key=key, lean=False
        )


class UserCouponRedeemApi(APIView):
    permission_classes = [ActsForUser]

    @extend_schema(
        operation_id="users_coupons_redeem",
        parameters=[USER_ID, USER_COUPON_ID],
        request=None,
        responses={
            200: UserCouponOutputSerializer,
            409: conflict_serializer(
                "RedeemConflict",
                REDEEM_REFUSALS,
                used_at=serializers.DateTimeField(required=False, help_text="With `already_used`."),
                expired_at=serializers.DateTimeField(required=False, help_text="With `expired`."),
            ),
            **error_responses(403, 404),
        },
        description="Use a claimed coupon. 409 codes: " + ", ".join(REDEEM_REFUSALS) + ".",
    )
    def post(self, request: Request, user_id: int, user_coupon_id: int) -> Response:
        try:
            user_coupon = services.coupon_redeem(user_coupon_id=user_coupon_id, user_id=user_id)
        except UserCoupon.DoesNotExist:
            raise NotFound("This user holds no such coupon.") from None
        return Response(UserCouponOutputSerializer(user_coupon).data)
