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


class Pagination(PageNumberPagination):
    page_size_query_param = "page_size"
    max_page_size = 500


class NewestFirstCursor(CursorPagination):
    """A cursor over the primary key, newest first: stable while rows are added."""

    ordering = "-pk"
    page_size_query_param = "page_size"
    max_page_size = 1000

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
