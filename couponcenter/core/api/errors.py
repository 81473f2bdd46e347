"""One error shape for the whole API.

- 400 ``{"errors": {field: [messages]}}`` for bad input: DRF and Django validation errors alike, and
  a body that is not valid JSON (under ``non_field_errors``);
- 409 ``{"code": "<reason>", "detail": "..."}`` for business refusals, with what a client needs to
  act on some of them (``opens_at`` for ``not_open``, ``closed_at`` for ``closed``);
- 401/403/404/405/415/429 ``{"detail": "..."}``: DRF's own shape; a quota's 429 adds
  ``{"code": "quota_exceeded", "quota": "<setting>", "limit": n}`` and ``Retry-After`` (seconds);
- 413 ``{"errors": {"non_field_errors": [...]}}`` for a body over ``DATA_UPLOAD_MAX_MEMORY_SIZE``,
  with ``DEBUG`` on or off.
"""

from __future__ import annotations

from typing import Any

from django.core.exceptions import NON_FIELD_ERRORS, RequestDataTooBig
from django.core.exceptions import ValidationError as DjangoValidationError
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.urls import Resolver404, resolve
from django.views import defaults
from django.views.decorators.csrf import csrf_exempt
from drf_spectacular.utils import OpenApiResponse, inline_serializer
from rest_framework import serializers, status
from rest_framework.exceptions import ParseError, ValidationError
from rest_framework.response import Response
from rest_framework.settings import api_settings
from rest_framework.views import exception_handler as drf_exception_handler

from couponcenter.core.errors import BusinessError, QuotaExceeded


def exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    if isinstance(exc, RequestDataTooBig):
        # Answered here, not left to Django: with DEBUG on Django would answer its text/plain
        # debug page instead of ``handler400``, and the API's errors must not depend on DEBUG.
        return Response(_too_big_body(), status=status.HTTP_413_REQUEST_ENTITY_TOO_LARGE)
    if isinstance(exc, BusinessError):
        return Response(business_error_body(exc), status=status.HTTP_409_CONFLICT)
    if isinstance(exc, QuotaExceeded):
        body = {"detail": exc.message, "code": exc.code, "quota": exc.quota, "limit": exc.limit}
        headers = {"Retry-After": str(exc.retry_after_s)}
        return Response(body, status=status.HTTP_429_TOO_MANY_REQUESTS, headers=headers)
    if isinstance(exc, DjangoValidationError):
        exc = ValidationError(_django_errors(exc))
    elif isinstance(exc, ParseError):
        exc = ValidationError({api_settings.NON_FIELD_ERRORS_KEY: [str(exc.detail)]})
    response = drf_exception_handler(exc, context)
    if response is not None and isinstance(exc, ValidationError):
        data = response.data
        if not isinstance(data, dict):
            data = {api_settings.NON_FIELD_ERRORS_KEY: data}
        response.data = {"errors": data}
    return response


def business_error_body(exc: BusinessError) -> dict[str, Any]:
    """The 409 body of a business refusal."""
    return {"code": exc.code, "detail": exc.message, **exc.extra}


def _too_big_body() -> dict[str, dict[str, list[str]]]:
    return {"errors": {api_settings.NON_FIELD_ERRORS_KEY: ["The request body is too large."]}}


def flat_errors(data: dict, prefix: str = "") -> dict[str, list[str]]:
    """Nested serializer errors as one level: ``{"jobs.3.action_time": ["..."]}``, for a view
    whose input nests (a list of objects) to answer the documented ``{field: [messages]}``."""
    flat: dict[str, list[str]] = {}
    for name, value in data.items():
        path = f"{prefix}{name}"
        if isinstance(value, dict):
            flat.update(flat_errors(value, f"{path}."))
        elif isinstance(value, list) and any(isinstance(v, dict | list) for v in value):
            for index, item in enumerate(value):
                if isinstance(item, dict):
                    flat.update(flat_errors(item, f"{path}.{index}."))
                elif isinstance(item, list):
                    flat.update(flat_errors({str(index): item}, f"{path}."))
                elif item:
                    flat.setdefault(path, []).append(str(item))
        else:
            flat[path] = [str(v) for v in value] if isinstance(value, list) else [str(value)]
    return flat


def _django_errors(exc: DjangoValidationError) -> dict[str, list[str]]:
    if not hasattr(exc, "error_dict"):
        return {api_settings.NON_FIELD_ERRORS_KEY: exc.messages}
    errors = exc.message_dict
    if NON_FIELD_ERRORS in errors:
        errors[api_settings.NON_FIELD_ERRORS_KEY] = errors.pop(NON_FIELD_ERRORS)
    return errors


# --- Shapes for the OpenAPI schema ----------------------------------------------------------------


class ValidationErrorSerializer(serializers.Serializer):
    errors = serializers.DictField(
        child=serializers.ListField(child=serializers.CharField()),
        help_text="Messages per input field; `non_field_errors` for the body as a whole.",
    )


class DetailErrorSerializer(serializers.Serializer):
    detail = serializers.CharField()


class QuotaErrorSerializer(serializers.Serializer):
    detail = serializers.CharField()
    code = serializers.ChoiceField(choices=[QuotaExceeded.code])
    quota = serializers.CharField(help_text="The live setting whose limit was reached.")
    limit = serializers.IntegerField()


def conflict_serializer(
    name: str, codes: list[str], **extra: serializers.Field
) -> serializers.Serializer:
    """The 409 body of one operation, with its reason codes as an enum; ``extra``: fields some
    refusals add (not required)."""
    return inline_serializer(
        name=name,
        fields={
            "code": serializers.ChoiceField(choices=codes),
            "detail": serializers.CharField(),
            **extra,
        },
    )


BAD_REQUEST = OpenApiResponse(ValidationErrorSerializer, description="Bad input: field errors.")
UNAUTHENTICATED = OpenApiResponse(DetailErrorSerializer, description="No or invalid token.")
FORBIDDEN = OpenApiResponse(DetailErrorSerializer, description="Not allowed for this caller.")
NOT_FOUND = OpenApiResponse(DetailErrorSerializer, description="No such object (or page).")
THROTTLED = OpenApiResponse(DetailErrorSerializer, description="Too many requests: slow down.")
OVER_QUOTA = OpenApiResponse(
    QuotaErrorSerializer,
    description="Over a quota of the caller: nothing was created; try again after `Retry-After` "
    "seconds.",
)


def error_responses(*codes: int) -> dict[int, OpenApiResponse]:
    """The standard error responses for ``extend_schema(responses=...)``; 401 always."""
    table = {400: BAD_REQUEST, 403: FORBIDDEN, 404: NOT_FOUND, 429: THROTTLED}
    return {401: UNAUTHENTICATED, **{code: table[code] for code in codes}}


def bad_request(request: HttpRequest, exception: Exception) -> HttpResponse:
    """Django's 400 handler (a body Django refused before any view ran): JSON in the API's error
    shape under ``/api/``, with 413 for a body over ``DATA_UPLOAD_MAX_MEMORY_SIZE``."""
    if not request.path.startswith("/api/"):
        return defaults.bad_request(request, exception)
    if isinstance(exception, RequestDataTooBig):
        return JsonResponse(_too_big_body(), status=413)
    message = "Bad request."
    return JsonResponse({"errors": {api_settings.NON_FIELD_ERRORS_KEY: [message]}}, status=400)


@csrf_exempt  # any method, any caller: it only ever answers 404
def not_found(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    """Django's 404 handler, and the last URL pattern under ``/api/`` (so it holds with
    ``DEBUG`` too, whose 404 page lists every URL pattern): JSON in DRF's shape under ``/api/``.
    A path that exists with a trailing slash says so (no redirect: a client's POST would turn
    into a GET)."""
    if not request.path.startswith("/api/"):
        return defaults.page_not_found(request, exception or Http404())
    detail = "Not found."
    if not request.path.endswith("/"):
        try:
            match = resolve(request.path + "/")
        except Resolver404:
            match = None
        if match is not None and match.url_name != "api-not-found":
            detail = f"Not found. Did you mean {request.path}/ (with the trailing slash)?"
    return JsonResponse({"detail": detail}, status=404)


def server_error(request: HttpRequest) -> HttpResponse:
    """Django's 500 handler: JSON under ``/api/``, the HTML page elsewhere."""
    if not request.path.startswith("/api/"):
        return defaults.server_error(request)
    return JsonResponse({"detail": "Internal server error."}, status=500)
