"""Page-number pagination for plain ``APIView``s (set ``pagination_class`` on the view so the
OpenAPI schema shows the paginated shape and the ``page``/``page_size`` parameters)."""

from __future__ import annotations

from django.db.models import QuerySet
from rest_framework.pagination import PageNumberPagination
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.serializers import Serializer
from rest_framework.views import APIView


class Pagination(PageNumberPagination):
    page_size_query_param = "page_size"
    max_page_size = 500


def paginated_response(
    *, queryset: QuerySet, serializer_class: type[Serializer], request: Request, view: APIView
) -> Response:
    paginator = view.pagination_class()
    page = paginator.paginate_queryset(queryset, request, view=view)
    return paginator.get_paginated_response(serializer_class(page, many=True).data)
