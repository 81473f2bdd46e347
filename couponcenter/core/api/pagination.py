"""Pagination for plain ``APIView``s (set ``pagination_class`` on the view so the OpenAPI schema
shows the paginated shape and its parameters): page numbers for small lists, a cursor for tables
that grow without bound (no ``COUNT(*)``, no deep ``OFFSET``)."""

from __future__ import annotations

from django.db.models import QuerySet
from rest_framework.exceptions import NotFound, ValidationError
from rest_framework.pagination import CursorPagination, PageNumberPagination
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.serializers import Serializer
from rest_framework.views import APIView


def _page_size(paginator, request: Request) -> int:
    """``page_size`` from the query: absent is the default, over the maximum is the maximum,
    anything else that is not a positive whole number is bad input (DRF ignores it silently)."""
    raw = request.query_params.get(paginator.page_size_query_param)
    if raw is None or raw == "":
        return paginator.page_size
    try:
        size = int(raw)
    except ValueError:
        size = 0
    if size < 1:
        raise ValidationError({paginator.page_size_query_param: ["Give a whole number from 1."]})
    return min(size, paginator.max_page_size)


class Pagination(PageNumberPagination):
    page_size_query_param = "page_size"
    max_page_size = 500

    def get_page_size(self, request: Request) -> int:
        return _page_size(self, request)


class NewestFirstCursor(CursorPagination):
    """A cursor over the primary key, newest first: stable while rows are added."""

    ordering = "-pk"
    page_size_query_param = "page_size"
    max_page_size = 1000

    def get_page_size(self, request: Request) -> int:
        return _page_size(self, request)

    def decode_cursor(self, request):
        """A cursor the server did not hand out is bad input (400), not a missing page (DRF
        answers 404)."""
        try:
            return super().decode_cursor(request)
        except NotFound:
            raise ValidationError({self.cursor_query_param: ["Invalid cursor."]}) from None


def paginated_response(
    *, queryset: QuerySet, serializer_class: type[Serializer], request: Request, view: APIView
) -> Response:
    paginator = view.pagination_class()
    page = paginator.paginate_queryset(queryset, request, view=view)
    return paginator.get_paginated_response(serializer_class(page, many=True).data)
